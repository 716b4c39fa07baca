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
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from pacectl.checks import Checked, flag, within

if TYPE_CHECKING:  # scipy.sparse costs ~0.3 s to import: only where a sparse matrix is built
    import scipy.sparse

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]


def max_min_fair(
    capacity_Bps: FloatArray,
    incidence: BoolArray | FloatArray | scipy.sparse.sparray | scipy.sparse.spmatrix,
    demand_Bps: FloatArray | None = None,
) -> FloatArray:
    """Max-min fair rates by progressive filling.

    Args:
        capacity_Bps: ``float64[num_links]`` link capacities, bytes/s, > 0.
        incidence: ``bool[num_flows, num_links]``, True where a flow crosses a link; or
            ``float64[num_flows, num_links]`` weights >= 0, a flow of rate ``x`` loading a link by
            ``weight * x``: a group of flows held to one common rate (the lock-step flows of one
            job's ring, :mod:`pacectl.backends.multijob`), weighted by how many of them cross it.
            Either may be a ``scipy.sparse`` matrix (each flow crosses a few links: the cost is then
            linear in the flows, not flows x links); with 0/1 or integer weights the rates are
            bit-identical to the dense ones (every per-link count is an exact integer sum).
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
    sp = sys.modules.get("scipy.sparse")  # a sparse input means scipy.sparse is imported already
    if sp is not None and sp.issparse(incidence):
        inc_f = sp.csr_array(incidence, dtype=np.float64)
        inc_f.eliminate_zeros()
        by_link = inc_f.T.tocsr()
        crosses = np.diff(inc_f.indptr) > 0

        def per_link(flow_mask: NDArray[np.bool_]) -> FloatArray:
            return np.asarray(by_link @ flow_mask.astype(np.float64))

        def touches(link_mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
            return np.asarray(inc_f @ link_mask.astype(np.float64)) > 0

    else:
        dense = np.asarray(incidence)
        inc_d = dense.astype(np.float64)
        crosses = dense.any(axis=1)

        def per_link(flow_mask: NDArray[np.bool_]) -> FloatArray:
            return flow_mask.astype(np.float64) @ inc_d

        def touches(link_mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
            return np.asarray(dense[:, link_mask].any(axis=1), dtype=np.bool_)

    active = crosses & (demand > 0)
    rate[~crosses] = demand[~crosses]
    while active.any():
        count = per_link(active)  # active flows per link
        used = count > 0
        share = np.full_like(remaining, np.inf)
        share[used] = remaining[used] / count[used]
        headroom = demand[active] - rate[active]
        step = min(float(share.min()), float(headroom.min()))
        rate[active] += step
        remaining -= step * count
        saturated = used & (remaining <= 1e-9 * np.maximum(capacity_Bps, 1.0))
        done = touches(saturated) | (rate >= demand - 1e-12)
        active &= ~done
    return rate


@dataclass(frozen=True)
class FatTree(Checked):
    """A two-level fat-tree cluster (``cluster.topology``, a typed config).

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

    section: ClassVar[str] = "cluster.topology"
    ranks_per_node: int = within(8, ">= 1")
    nodes_per_leaf: int = within(4, ">= 1")
    oversubscription: float = within(1.0, ">= 1")
    nic_bandwidth_Bps: float = within(50e9, "> 0")
    nvlink_bandwidth_Bps: float = within(450e9, "> 0")
    rail_optimized: Any = flag(False)

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

    def link_index(self, kind: str, index: IntArray | int, rail: IntArray | int, num_ranks: int) -> IntArray:
        """Position in :meth:`links` of link ``kind:index[:rail]`` (vectorised), for a cluster of
        ``num_ranks`` ranks. ``kind`` is ``nic_up``, ``nic_down``, ``leaf_up`` or ``leaf_down``."""
        nodes, leaves, rails = self.num_nodes(num_ranks), self.num_leaves(num_ranks), self.rails()
        offset = {
            "nic_up": 0,
            "nic_down": nodes * rails,
            "leaf_up": 2 * nodes * rails,
            "leaf_down": 2 * nodes * rails + leaves * rails,
        }[kind]
        return offset + np.asarray(index, dtype=np.int64) * rails + np.asarray(rail, dtype=np.int64)

    def ring_flows(self, num_ranks: int, *, sparse: bool = False) -> BoolArray | scipy.sparse.csr_array:
        """Incidence ``bool[num_flows, num_links]`` of the inter-node ring (node i -> i+1 on every rail).

        The ring visits nodes in rank order, so it leaves a leaf only at the leaf's last node: the
        ring all-reduce is contention-free on a full-bisection tree and meets oversubscription only
        where cross traffic shares the uplinks it crosses. ``sparse=True`` gives it as a
        ``scipy.sparse.csr_array`` (2 to 4 links per flow).
        """
        return self.ring_flows_on(range(self.num_nodes(num_ranks)), num_ranks, sparse=sparse)

    def ring_flows_on(
        self, nodes: Sequence[int], num_ranks: int, *, sparse: bool = False
    ) -> BoolArray | scipy.sparse.csr_array:
        """Incidence ``bool[num_flows, num_links]`` of a ring over ``nodes``, in that order (node
        ``nodes[i]`` sends to ``nodes[i + 1]``, the last to the first, on every rail), over the links
        of a cluster of ``num_ranks`` ranks: the inter-node ring of a job placed on those nodes.
        One node (or none) makes no inter-node flow.

        Args:
            nodes: node indices, each in ``[0, num_nodes(num_ranks))``, no repeats.
            num_ranks: ranks of the whole cluster (its links).
            sparse: return a ``scipy.sparse.csr_array`` (bool) instead of a dense array.
        """
        num_links = 2 * self.rails() * (self.num_nodes(num_ranks) + self.num_leaves(num_ranks))
        ring, rails = np.asarray(list(nodes), dtype=np.int64), self.rails()
        if sparse:
            import scipy.sparse
        if len(ring) <= 1:
            return (
                scipy.sparse.csr_array((0, num_links), dtype=bool)
                if sparse
                else np.zeros((0, num_links), dtype=bool)
            )
        # flows in order: rail by rail, position by position (node ring[pos] -> ring[pos + 1])
        src = np.tile(ring, rails)
        dst = np.tile(np.roll(ring, -1), rails)
        rail = np.repeat(np.arange(rails, dtype=np.int64), len(ring))
        src_leaf, dst_leaf = src // self.nodes_per_leaf, dst // self.nodes_per_leaf
        cross = src_leaf != dst_leaf
        cols = np.stack(
            [
                self.link_index("nic_up", src, rail, num_ranks),
                self.link_index("nic_down", dst, rail, num_ranks),
                np.where(cross, self.link_index("leaf_up", src_leaf, rail, num_ranks), -1),
                np.where(cross, self.link_index("leaf_down", dst_leaf, rail, num_ranks), -1),
            ],
            axis=1,
        )
        num_flows = len(src)
        rows = np.repeat(np.arange(num_flows), 4).reshape(num_flows, 4)
        keep = cols >= 0
        if not sparse:
            dense = np.zeros((num_flows, num_links), dtype=bool)
            dense[rows[keep], cols[keep]] = True
            return dense
        incidence = scipy.sparse.csr_array(
            (np.ones(int(keep.sum()), dtype=bool), (rows[keep], cols[keep])), shape=(num_flows, num_links)
        )
        incidence.sort_indices()
        return incidence
