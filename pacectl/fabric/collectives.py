"""Alpha-beta (latency-bandwidth) costs of all-reduce algorithms: closed forms, no timing dependence.

Model (Hockney 1994): sending ``n`` bytes over one link costs ``alpha + n / bandwidth``. The
all-reduce costs below are the standard ones of Thakur, Rabenseifner and Gropp, "Optimization of
Collective Communication Operations in MPICH" (IJHPCA 2005) and Patarasuk and Yuan, "Bandwidth
optimal all-reduce algorithms for clusters of workstations" (JPDC 2009). They ignore the reduction
arithmetic, which overlaps with transfer on GPUs.
"""

from __future__ import annotations

import math

from pacectl.errors import ConfigError

ALGORITHMS = ("ring", "tree", "hierarchical")


def _check(n_bytes: float, p: int, alpha_s: float, bandwidth_Bps: float) -> None:
    if p < 1:
        raise ConfigError(f"number of ranks must be >= 1, got {p!r}")
    if n_bytes < 0 or alpha_s < 0 or bandwidth_Bps <= 0:
        raise ConfigError(
            f"message bytes and alpha must be >= 0 and bandwidth > 0, got {n_bytes!r}, {alpha_s!r}, {bandwidth_Bps!r}"
        )


def ring_allreduce_s(n_bytes: float, p: int, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring all-reduce (reduce-scatter + all-gather): ``2(p-1) alpha + 2 (p-1)/p * n / B`` seconds.

    Args:
        n_bytes: message size per rank, bytes.
        p: ranks in the ring.
        alpha_s: per-message latency, seconds.
        bandwidth_Bps: per-link bandwidth, bytes/s.
    """
    _check(n_bytes, p, alpha_s, bandwidth_Bps)
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * n_bytes / bandwidth_Bps


def tree_allreduce_s(n_bytes: float, p: int, alpha_s: float, bandwidth_Bps: float) -> float:
    """Pipelined (double binary) tree all-reduce: ``2 ceil(log2 p) alpha + 2 n / B`` seconds.

    Reduce up and broadcast down a tree of depth ``ceil(log2 p)``, pipelined so that the bandwidth
    term does not grow with depth (Sanders, Speck and Traeff, "Two-tree algorithms for full bandwidth
    broadcast, reduction and scan", Parallel Computing 2009; NCCL 2.4's double binary trees).
    """
    _check(n_bytes, p, alpha_s, bandwidth_Bps)
    if p == 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha_s + 2 * n_bytes / bandwidth_Bps


def hierarchical_allreduce_s(
    n_bytes: float,
    ranks_per_node: int,
    num_nodes: int,
    *,
    alpha_intra_s: float,
    bandwidth_intra_Bps: float,
    alpha_inter_s: float,
    bandwidth_inter_Bps: float,
) -> float:
    """Hierarchical all-reduce: intra-node reduce-scatter, inter-node ring all-reduce of ``n / g``
    bytes per rank, intra-node all-gather (Goyal et al., "Accurate, Large Minibatch SGD", 2017,
    section 4; NCCL's NVLink + network rings).

    The g ranks of a node run their inter-node rings at once, so they share the node's network
    bandwidth ``B_e`` (every NIC of the node): each ring gets ``B_e / g``. Cost:
    ``2 (g-1) alpha_i + 2 (g-1)/g * n / B_i + ring_allreduce(n / g, N, alpha_e, B_e / g)``, whose
    network term is ``2 (N-1) alpha_e + 2 (N-1)/N * n / B_e``: all ``n`` bytes of the node cross its
    NICs, as in :class:`pacectl.fabric.contention.ContentionComm`, whose quiet duration it equals as
    long as the leaf uplinks do not limit the ring (oversubscription <= nodes per leaf: an uplink
    carries at least one NIC's bandwidth); beyond that the contention model's ring is uplink-bound
    and slower, which no closed form here models.

    Args:
        n_bytes: bytes per rank to all-reduce.
        ranks_per_node: g, ranks per node.
        num_nodes: N.
        alpha_intra_s / bandwidth_intra_Bps: NVLink latency (s) and bandwidth per rank (bytes/s).
        alpha_inter_s / bandwidth_inter_Bps: network latency (s) and the node's network bandwidth,
            all its NICs together (bytes/s).

    Returns:
        Seconds.
    """
    g = ranks_per_node
    intra = ring_allreduce_s(n_bytes, g, alpha_intra_s, bandwidth_intra_Bps)  # the two NVLink phases
    return intra + ring_allreduce_s(n_bytes / g, num_nodes, alpha_inter_s, bandwidth_inter_Bps / g)


def allreduce_s(
    algorithm: str,
    n_bytes: float,
    num_ranks: int,
    ranks_per_node: int,
    *,
    alpha_intra_s: float,
    bandwidth_intra_Bps: float,
    alpha_inter_s: float,
    bandwidth_inter_Bps: float,
) -> float:
    """Cost of one all-reduce of ``n_bytes`` over ``num_ranks`` ranks with the named algorithm.

    ``ring`` and ``tree`` run over the network links (the slowest hop, inter-node, when the job spans
    more than one node; NVLink otherwise); ``hierarchical`` combines both.

    Raises:
        ConfigError: unknown algorithm or bad sizes.
    """
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"collective.algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
    g = min(ranks_per_node, num_ranks)
    nodes = math.ceil(num_ranks / g)
    alpha = alpha_intra_s if nodes == 1 else alpha_inter_s
    bandwidth = bandwidth_intra_Bps if nodes == 1 else bandwidth_inter_Bps
    if algorithm == "ring":
        return ring_allreduce_s(n_bytes, num_ranks, alpha, bandwidth)
    if algorithm == "tree":
        return tree_allreduce_s(n_bytes, num_ranks, alpha, bandwidth)
    return hierarchical_allreduce_s(
        n_bytes,
        g,
        nodes,
        alpha_intra_s=alpha_intra_s,
        bandwidth_intra_Bps=bandwidth_intra_Bps,
        alpha_inter_s=alpha_inter_s,
        bandwidth_inter_Bps=bandwidth_inter_Bps,
    )
