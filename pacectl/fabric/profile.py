"""Cluster profiles (``conf/cluster/*.yaml``) to fabric objects, for the simulator and for replay.

``comm`` picks the communication model: ``null`` (fixed durations, max-plus), ``alpha_beta``
(closed-form collective cost, still max-plus) or ``contention`` (max-min fair fat-tree with cross
traffic, plus early-arrival interference: timing-dependent). The profile gives the parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pacectl.errors import ConfigError
from pacectl.fabric.contention import (
    AlphaBetaComm,
    ContentionComm,
    CrossTraffic,
    EarlyArrivalInterference,
    FixedComm,
)
from pacectl.fabric.noise import NOISE_COMPONENTS, ComputeModel
from pacectl.fabric.topology import FatTree

COMM_NAMES = ("null", "alpha_beta", "contention")
FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def comm_name(value: object) -> str:
    """Normalise the ``comm`` setting (``comm=null`` on the command line arrives as None).

    Raises:
        ConfigError: not one of :data:`COMM_NAMES`.
    """
    name = "null" if value is None else str(value)
    if name not in COMM_NAMES:
        import difflib

        close = difflib.get_close_matches(name, COMM_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"comm must be one of {list(COMM_NAMES)}, got {name!r}{hint}")
    return name


def _section(cluster: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = cluster.get(key) or {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"cluster.{key} must be a mapping, got {value!r} (cluster {cluster.get('name')!r})")
    return dict(value)


def _build(cls: type, section: dict[str, Any], where: str) -> Any:
    try:
        return cls(**section)
    except TypeError as err:
        raise ConfigError(f"{where} has an unknown or missing key: {err}") from err


def topology_from(cluster: Mapping[str, Any]) -> FatTree:
    """The :class:`FatTree` of a profile."""
    return _build(FatTree, _section(cluster, "topology"), "cluster.topology")  # type: ignore[no-any-return]


def compute_from(cluster: Mapping[str, Any]) -> ComputeModel:
    """The simulator's :class:`ComputeModel` of a profile (``compute.compute_s`` and ``compute.noise``)."""
    compute = _section(cluster, "compute")
    components = []
    for i, item in enumerate(compute.get("noise") or []):
        item = dict(item)
        kind = item.pop("kind", None)
        if kind not in NOISE_COMPONENTS:
            raise ConfigError(
                f"cluster.compute.noise[{i}].kind must be one of {sorted(NOISE_COMPONENTS)}, got {kind!r}"
            )
        if kind == "slow_ranks" and "ranks" in item:
            item["ranks"] = tuple(item["ranks"])
        components.append(_build(NOISE_COMPONENTS[kind], item, f"cluster.compute.noise[{i}] ({kind})"))
    if "compute_s" not in compute:
        raise ConfigError("cluster.compute.compute_s must be set (seconds of compute per iteration)")
    return ComputeModel(compute_s=float(compute["compute_s"]), components=tuple(components))


def _collective(cluster: Mapping[str, Any]) -> dict[str, Any]:
    c = _section(cluster, "collective")
    return {
        "algorithm": str(c.get("algorithm", "ring")),
        "message_bytes": float(c.get("message_bytes", 2e9)),
        "alpha_inter_s": float(c.get("alpha_inter_s", 5e-6)),
        "alpha_intra_s": float(c.get("alpha_intra_s", 2e-6)),
    }


def contention_from(cluster: Mapping[str, Any], num_ranks: int) -> ContentionComm:
    """The :class:`ContentionComm` of a profile for ``num_ranks`` ranks."""
    coll = _collective(cluster)
    cross = _section(cluster, "cross_traffic")
    cross["links"] = tuple(cross.get("links") or ())
    return ContentionComm(
        topology_from(cluster),
        num_ranks,
        message_bytes=coll["message_bytes"],
        alpha_inter_s=coll["alpha_inter_s"],
        alpha_intra_s=coll["alpha_intra_s"],
        cross_traffic=_build(CrossTraffic, cross, "cluster.cross_traffic"),
    )


def sim_fabric(
    cluster: Mapping[str, Any], comm: object, num_ranks: int
) -> tuple[FixedComm | AlphaBetaComm | ContentionComm, EarlyArrivalInterference]:
    """Communication model and interference for the simulator.

    ``null`` uses the alpha-beta cost of the profile's collective as its fixed duration, so the
    three models share the same uncontended mean and differ only in timing dependence.
    """
    name = comm_name(comm)
    topology = topology_from(cluster)
    coll = _collective(cluster)
    alpha_beta = AlphaBetaComm(topology, num_ranks, **coll)
    no_interference = EarlyArrivalInterference(kappa=0.0, ranks_per_node=topology.ranks_per_node)
    if name == "null":
        return FixedComm(alpha_beta.free_time_s), no_interference
    if name == "alpha_beta":
        return alpha_beta, no_interference
    kappa = float(_section(cluster, "interference").get("kappa", 0.0))
    return contention_from(cluster, num_ranks), EarlyArrivalInterference(kappa, topology.ranks_per_node)


class ReplayContention:
    """Replay on a contended fabric: the paced DP collective's recorded intrinsic transfer time is
    scaled by ``T_contention(t) / T_free``, the contention model's slowdown when the collective
    starts at absolute replay time ``t`` (steps laid end to end). Other ops keep their recorded
    times. Early-arrival interference is simulator-only.
    """

    name = "contention"
    timing_dependent = True

    def __init__(self, cluster: Mapping[str, Any], num_ranks: int) -> None:
        self.model = contention_from(cluster, num_ranks)
        self.description = self.model.description + "; applied to the paced collective of the replay"

    def transfer_s(self, recorded_transfer_s: FloatArray) -> FloatArray:
        """Static part: the recorded transfer times."""
        return recorded_transfer_s

    def slowdown(self, start_s: float) -> float:
        """Contended / free duration of the all-reduce started at absolute time ``start_s``."""
        free = self.model.free_time_s
        return self.model.time_s(start_s) / free if free > 0 else 1.0
