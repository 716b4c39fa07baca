"""Fat-tree topology, the flows of a ring all-reduce over it, and max-min fair bandwidth sharing.

Topology (two-level fat-tree / leaf-spine, Al-Fares et al., "A Scalable, Commodity Data Center
Network Architecture", SIGCOMM 2008): ``ranks_per_node`` GPUs per node joined by NVLink; each node
has one NIC (or one per GPU, "rail-optimized", as in NVIDIA's DGX SuperPOD reference architecture);
``nodes_per_leaf`` nodes per leaf switch; each leaf's uplink to the spine carries
``nodes_per_leaf * nic_bandwidth / oversubscription`` (oversubscription 1 = full bisection).

Flows sharing a link get max-min fair shares (Bertsekas and Gallager, "Data Networks", 2nd ed.,
section 6.5.2, progressive filling), which is what long-lived TCP/RoCE flows converge to to first
order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pacectl.errors import ConfigError

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


def max_min_fair(
    capacity_Bps: FloatArray, incidence: BoolArray | FloatArray, demand_Bps: FloatArray | None = None
) -> FloatArray:
    """Max-min fair rates by progressive filling.

    Args:
        capacity_Bps: ``float64[num_links]`` link capacities, bytes/s, > 0.
        incidence: ``bool[num_flows, num_links]``, True where a flow crosses a link; or
            ``float64[num_flows, num_links]`` weights >= 0, a flow of rate ``x`` loading a link by
            ``weight * x``: a group of flows held to one common rate (the lock-step flows of one
            job's ring, :mod:`pacectl.backends.multijob`), weighted by how many of them cross it.
        demand_Bps: optional ``float64[num_flows]`` rate caps (``inf`` for greedy flows).

    Returns:
        ``float64[num_flows]`` rates, bytes/s. Every link carries at most its capacity, and every flow
        is limited either by its demand or by a saturated link on which no flow gets more than it.
        A flow that crosses no link gets its demand (``inf`` if greedy).
    """
    num_flows, _ = incidence.shape
    demand = np.full(num_flows, np.inf) if demand_Bps is None else np.asarray(demand_Bps, dtype=np.float64)
    rate = np.zeros(num_flows)
    remaining = np.asarray(capacity_Bps, dtype=np.float64).copy()
    active = incidence.any(axis=1) & (demand > 0)
    rate[~incidence.any(axis=1)] = demand[~incidence.any(axis=1)]
    inc_f = incidence.astype(np.float64)
    while active.any():
        count = active.astype(np.float64) @ inc_f  # active flows per link
        used = count > 0
        share = np.full_like(remaining, np.inf)
        share[used] = remaining[used] / count[used]
        headroom = demand[active] - rate[active]
        step = min(float(share.min()), float(headroom.min()))
        rate[active] += step
        remaining -= step * count
        saturated = used & (remaining <= 1e-9 * np.maximum(capacity_Bps, 1.0))
        done = (incidence[:, saturated].any(axis=1)) | (rate >= demand - 1e-12)
        active &= ~done
    return rate


@dataclass(frozen=True)
class FatTree:
    """A two-level fat-tree cluster.

    Args:
        ranks_per_node: GPUs per node (8 on DGX H100/H200 nodes).
        nodes_per_leaf: nodes per leaf (top-of-rack) switch.
        oversubscription: leaf downlink / uplink bandwidth ratio, >= 1 (1 = full bisection; 2-4
            common in cost-optimised clusters, Gopalan and Ali).
        nic_bandwidth_Bps: per-NIC bandwidth, bytes/s (400 Gb/s ConnectX-7 = 50e9 B/s, NVIDIA datasheet).
        nvlink_bandwidth_Bps: per-GPU intra-node bandwidth, bytes/s (NVLink 4: 450e9 B/s per direction,
            NVIDIA H100 datasheet).
        rail_optimized: one NIC per GPU, each rail on its own leaf switch (NVIDIA DGX SuperPOD).
    """

    ranks_per_node: int = 8
    nodes_per_leaf: int = 4
    oversubscription: float = 1.0
    nic_bandwidth_Bps: float = 50e9
    nvlink_bandwidth_Bps: float = 450e9
    rail_optimized: bool = False

    def __post_init__(self) -> None:
        if int(self.ranks_per_node) < 1 or int(self.nodes_per_leaf) < 1:
            raise ConfigError(
                f"topology.ranks_per_node and nodes_per_leaf must be >= 1, got {self.ranks_per_node!r}, {self.nodes_per_leaf!r}"
            )
        if not self.oversubscription >= 1.0:
            raise ConfigError(f"topology.oversubscription must be >= 1, got {self.oversubscription!r}")
        if self.nic_bandwidth_Bps <= 0 or self.nvlink_bandwidth_Bps <= 0:
            raise ConfigError("topology bandwidths must be > 0 bytes/s")

    def num_nodes(self, num_ranks: int) -> int:
        """Nodes needed for ``num_ranks`` ranks."""
        return math.ceil(num_ranks / self.ranks_per_node)

    def num_leaves(self, num_ranks: int) -> int:
        """Leaf switches needed (per rail, if rail-optimized)."""
        return math.ceil(self.num_nodes(num_ranks) / self.nodes_per_leaf)

    def rails(self) -> int:
        """Independent network rails (NICs per node)."""
        return self.ranks_per_node if self.rail_optimized else 1

    def links(self, num_ranks: int) -> tuple[list[str], FloatArray]:
        """Link names and capacities (bytes/s): NIC up/down per (node, rail), leaf up/down per (leaf, rail)."""
        nodes, leaves, rails = self.num_nodes(num_ranks), self.num_leaves(num_ranks), self.rails()
        names, caps = [], []
        for kind, count, cap in (
            ("nic_up", nodes, self.nic_bandwidth_Bps),
            ("nic_down", nodes, self.nic_bandwidth_Bps),
            ("leaf_up", leaves, self.nodes_per_leaf * self.nic_bandwidth_Bps / self.oversubscription),
            ("leaf_down", leaves, self.nodes_per_leaf * self.nic_bandwidth_Bps / self.oversubscription),
        ):
            for i in range(count):
                for r in range(rails):
                    names.append(f"{kind}:{i}" + (f":rail{r}" if rails > 1 else ""))
                    caps.append(cap)
        return names, np.array(caps)

    def ring_flows(self, num_ranks: int) -> BoolArray:
        """Incidence ``bool[num_flows, num_links]`` of the inter-node ring (node i -> i+1 on every rail).

        The ring visits nodes in rank order, so it leaves a leaf only at the leaf's last node: the
        ring all-reduce is contention-free on a full-bisection tree and meets oversubscription only
        where cross traffic shares the uplinks it crosses.
        """
        return self.ring_flows_on(range(self.num_nodes(num_ranks)), num_ranks)

    def ring_flows_on(self, nodes: Sequence[int], num_ranks: int) -> BoolArray:
        """Incidence ``bool[num_flows, num_links]`` of a ring over ``nodes``, in that order (node
        ``nodes[i]`` sends to ``nodes[i + 1]``, the last to the first, on every rail), over the links
        of a cluster of ``num_ranks`` ranks: the inter-node ring of a job placed on those nodes.
        One node (or none) makes no inter-node flow.

        Args:
            nodes: node indices, each in ``[0, num_nodes(num_ranks))``, no repeats.
            num_ranks: ranks of the whole cluster (its links).
        """
        names, _ = self.links(num_ranks)
        index = {name: i for i, name in enumerate(names)}
        ring, rails = list(nodes), self.rails()
        if len(ring) <= 1:
            return np.zeros((0, len(names)), dtype=bool)
        flows = []
        for r in range(rails):
            suffix = f":rail{r}" if rails > 1 else ""
            for pos, i in enumerate(ring):
                j = ring[(pos + 1) % len(ring)]
                row = np.zeros(len(names), dtype=bool)
                row[index[f"nic_up:{i}{suffix}"]] = True
                row[index[f"nic_down:{j}{suffix}"]] = True
                if i // self.nodes_per_leaf != j // self.nodes_per_leaf:
                    row[index[f"leaf_up:{i // self.nodes_per_leaf}{suffix}"]] = True
                    row[index[f"leaf_down:{j // self.nodes_per_leaf}{suffix}"]] = True
                flows.append(row)
        return np.array(flows)
