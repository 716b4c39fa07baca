"""Cluster profiles (``conf/cluster/*.yaml``) to fabric objects, for the simulator and for replay.

``comm`` picks the communication model: ``null`` (fixed durations, max-plus), ``alpha_beta``
(closed-form collective cost, still max-plus), ``contention`` (max-min fair fat-tree with cross
traffic, plus early-arrival interference: timing-dependent) or, for replay only, ``fitted``
(fitted from the trace itself, :mod:`pacectl.fabric.fitted`). The profile gives the parameters.

:class:`ClusterConfig` is a profile's typed config (one dataclass per section, each field's range
beside its default, :mod:`pacectl.checks`), stored in Hydra's ConfigStore as ``cluster=base``; every
builder here takes it (or a mapping, checked through it), so the simulator (:func:`sim_fabric`,
:func:`compute_from`) and the contended replay (:class:`ReplayContention`) share one set of checks
and messages.

Reference for users
-------------------

`comm=` picks the model; `cluster=` (`conf/cluster/*.yaml`) gives its parameters, each with a unit
and a source (`pacectl/fabric/`):

| `comm=` | durations | pacing can gain? |
| --- | --- | --- |
| `null` (default) | fixed: recorded (replay) or the alpha-beta cost (sim; `cluster.collective.algorithm`, hierarchical by default: then exactly `contention`'s duration on a quiet fabric, while oversubscription <= nodes per leaf) | no (max-plus) |
| `alpha_beta` | closed-form hierarchical / ring / tree all-reduce cost (sim only) | no (max-plus) |
| `contention` | max-min fair shares on a fat-tree (ranks per node, nodes per leaf, oversubscription, rail-optimized variant) with on/off cross traffic on chosen links; in the simulator also **early-arrival interference** (a rank waiting in the collective busy-polls and slows co-located ranks that are still computing; a pacing rank sleeps instead) | yes, or lose: timing-dependent |

`comm=contention` is timing-dependent only where something varies the ring's rate: cross traffic
that switches on and off on links the inter-node ring crosses, or (simulator) interference
(`kappa > 0` with ranks sharing a node). On a profile without either (`dgx_superpod`, `cost_optimized`, the trace profiles; a job inside one node;
cross traffic always on, or staggered bursts on so many uplinks the ring crosses that one of them is
busy at every instant: a constant slowdown) its durations are fixed, as under max-plus: the run
warns, and `summary.json` (`comm_model_timing_dependent`, per run `comm_timing_dependent`), the plot
titles, the console table and `report.md` say fixed durations.

The simulator's compute-time models (`cluster.compute.noise`): i.i.d. lognormal jitter,
heavy-tailed Pareto hiccups, periodic OS-style noise, persistent slow ranks (locality), and replay of
real per-worker step-time samples (Alibaba PAI). Profiles (each `conf/cluster/<name>.yaml` states
what it stands for and the source of every value): `dgx_superpod` (the default: NVIDIA's DGX H100
SuperPOD reference architecture), `cost_optimized`, `paper_like` (the paper's no-pacing CV of 0.22
at 64 ranks with `comm=contention`, over long runs), `contended`, `alibaba_pai` and `h200_gloo4`
(real step times on the paper_like fabric) and `ar` / `st` (the shipped traces).

A profile is checked as a whole before any run, whichever model reads it: a wrong type or unknown
key when Hydra composes it, a value out of range (`cluster.topology.ranks_per_node=0`) by its
dataclass, in one line naming the override key, with a "did you mean" for a misspelt key or choice.
`cluster.cross_traffic.stagger` (default 0.37, in [0, 1]) shifts the on/off phase of successive
links by that fraction of the period (0: all links switch together).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray
from omegaconf import MISSING, DictConfig

from pacectl.checks import Checked, typed, within
from pacectl.errors import ConfigError, did_you_mean
from pacectl.fabric.collectives import ALGORITHMS
from pacectl.fabric.contention import (
    AlphaBetaComm,
    ContentionComm,
    CrossTraffic,
    EarlyArrivalInterference,
    FixedComm,
)
from pacectl.fabric.noise import (
    FILLS,
    ComputeModel,
    EmpiricalSamples,
    LognormalJitter,
    NoiseComponent,
    ParetoHiccups,
    PeriodicNoise,
    SlowRanks,
)
from pacectl.fabric.overlap import BucketedBackward, BucketEngine
from pacectl.fabric.power import PowerProfile, power_profile
from pacectl.fabric.powercap import NodePowerCap
from pacectl.fabric.topology import FatTree

COMM_NAMES = ("null", "alpha_beta", "contention", "fitted")
FloatArray = NDArray[np.float64]


def inert_contention_note(
    cluster_name: str, inert_reason: str | None, *, interference_kappa: float | None = None
) -> str | None:
    """Why ``comm=contention`` has nothing timing-dependent to model on this run (neither cross
    traffic that varies the ring's rate nor, in the simulator, interference: module docstring), or None.

    Args:
        cluster_name: the profile's name, for the message.
        inert_reason: the contention model's ``inert_reason`` (None: timing-dependent).
        interference_kappa: the simulator's effective interference strength (0 when no rank has a
            co-located peer, :meth:`EarlyArrivalInterference.active`); None for a replay.
    """
    simulated = interference_kappa is not None
    if inert_reason is None or (simulated and float(interference_kappa or 0.0) > 0.0):
        return None
    missing = f"{inert_reason}; no early-arrival interference" if simulated else inert_reason
    if "one node" in inert_reason:
        fix = "run more ranks than one node holds"
    else:
        others = [
            p for p in (("paper_like", "contended") if simulated else ("paper_like",)) if p != cluster_name
        ]
        fix = "give the profile bursty cross traffic on links the ring crosses (cluster.cross_traffic: links, on_s > 0, off_s > 0)"
        fix += " or interference (cluster.interference.kappa > 0, ranks sharing a node)" if simulated else ""
        fix += f", or pick {' or '.join(f'cluster={p}' for p in others)}" if others else ""
    return (
        f"cluster={cluster_name} gives comm=contention no timing-dependent mechanism ({missing}), so "
        f"durations are fixed here, as under max-plus, and no controller can gain; to model contention, {fix}"
    )


def comm_name(value: object) -> str:
    """Normalise the ``comm`` setting (``comm=null`` on the command line arrives as None).

    Raises:
        ConfigError: not one of :data:`COMM_NAMES`.
    """
    name = "null" if value is None else str(value)
    if name not in COMM_NAMES:
        close = did_you_mean(name, COMM_NAMES)
        hint = f"; did you mean {close!r}?" if close else ""
        raise ConfigError(f"comm must be one of {list(COMM_NAMES)}, got {name!r}{hint}")
    return name


# ---------------------------------------------------------------------------------------------
# The typed config of a profile (module docstring): each field's default is the model's own, so a
# key a profile leaves out keeps it; conf/cluster/dgx_superpod.yaml builds on ``cluster=base``.


@dataclass(kw_only=True)
class Collective(Checked):
    """``cluster.collective``: the all-reduce (:class:`~pacectl.fabric.contention.AlphaBetaComm`)."""

    section: ClassVar[str] = "cluster.collective"
    algorithm: str = within("hierarchical", choices=ALGORITHMS)
    message_bytes: float = within(2e9, ">= 0")
    alpha_inter_s: float = within(5e-6, ">= 0")
    alpha_intra_s: float = within(2e-6, ">= 0")


@dataclass(kw_only=True)
class Interference(Checked):
    """``cluster.interference`` (:class:`~pacectl.fabric.contention.EarlyArrivalInterference`; its
    ranks per node are the topology's)."""

    section: ClassVar[str] = "cluster.interference"
    kappa: float = within(0.0, ">= 0")
    kappa_source: str = "assumed"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.kappa_source.startswith(("assumed", "measured")):
            name, where = self.where("kappa_source")
            raise ConfigError(
                f"{name} must be a string starting with 'assumed' or 'measured: <record>', got "
                f"{self.kappa_source!r}{where}"
            )


@dataclass(kw_only=True)
class PowerCap(Checked):
    """``cluster.power_cap``: the node power cap (:class:`~pacectl.fabric.powercap.NodePowerCap`)."""

    section: ClassVar[str] = "cluster.power_cap"
    node_w: float | None = within(None, "> 0", what="a finite power > 0 W, or null (off)")


@dataclass(kw_only=True)
class Empirical(Checked):
    """A ``kind: empirical`` noise item (:class:`~pacectl.fabric.noise.EmpiricalSamples`, which
    loads its file when built)."""

    path: str = MISSING
    fill: str = within("ar1", choices=FILLS)
    sample_every: int | None = within(None, ">= 1")

    def model(self) -> EmpiricalSamples:
        return EmpiricalSamples(**vars(self))


#: ``cluster.compute.noise`` item kind -> its typed config (the component class itself, but for
#: ``empirical``, whose component reads a file).
NOISE_CONFIGS: dict[str, type[Checked]] = {
    "lognormal": LognormalJitter,
    "pareto": ParetoHiccups,
    "periodic": PeriodicNoise,
    "slow_ranks": SlowRanks,
    "empirical": Empirical,
}


def noise_component(item: object, where: str) -> NoiseComponent:
    """One noise item at override path ``where`` (``cluster.compute.noise.0``) as its component.

    Raises:
        ConfigError: not a mapping, an unknown ``kind`` (with a did-you-mean), or a bad field.
    """
    if not isinstance(item, Mapping | DictConfig):
        raise ConfigError(
            f"{where} must be a noise component such as {{kind: lognormal, sigma: 0.02}}, got {item!r}; "
            f"e.g. '{where}={{kind:lognormal,sigma:0.02}}'"
        )
    kind = item.get("kind")
    if kind not in NOISE_CONFIGS:
        close = did_you_mean(str(kind), NOISE_CONFIGS)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ConfigError(
            f"{where}.kind must be one of {list(NOISE_CONFIGS)}, got {kind!r}{hint}; e.g. {where}.kind=lognormal"
        )
    cls = NOISE_CONFIGS[str(kind)]
    try:
        spec = typed(cls, {k: v for k, v in item.items() if k != "kind"}, where)
    except ConfigError as err:
        if set(item) - {"kind"} <= {f.name for f in fields(cls)}:
            raise
        plus = "+" if where.startswith("cluster.per_job.") else ""  # (a key of another kind)
        raise ConfigError(
            f"{err} ({where} is a {kind!r} item; another kind needs the whole item, "
            f"e.g. '{plus}{where}={{kind:lognormal,sigma:0.02}}')"
        ) from None
    return spec.model() if isinstance(spec, Empirical) else spec  # type: ignore[return-value]


@dataclass(kw_only=True)
class Compute(Checked):
    """``cluster.compute`` (or a job's, ``cluster.jobs.<i>.compute``): the simulator's compute
    model (:class:`~pacectl.fabric.noise.ComputeModel`), ``noise`` a list of components by ``kind``."""

    section: ClassVar[str] = "cluster.compute"
    compute_s: float = within(MISSING, "> 0")
    noise: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.noise = [noise_component(item, f"{self.section}.noise.{i}") for i, item in enumerate(self.noise)]

    def model(self) -> ComputeModel:
        return ComputeModel(compute_s=self.compute_s, components=tuple(self.noise))


@dataclass(kw_only=True)
class JobCompute:
    """A job's ``compute``, typed as :class:`Compute`, whose checks
    :func:`~pacectl.fabric.jobs.parse_jobs` runs on it (where the job's key is known)."""

    compute_s: float = within(MISSING, "> 0")
    noise: list[Any] = field(default_factory=list)

    def model(self, where: str) -> ComputeModel:
        """The compute model, checked as ``cluster.compute`` is, its keys named under ``where``."""
        return typed(Compute, vars(self), where).model()


@dataclass(kw_only=True)
class JobEntry(Checked):
    """One entry of ``cluster.jobs`` (:mod:`pacectl.fabric.jobs`), which
    :func:`~pacectl.fabric.jobs.parse_jobs` checks further. None:
    ``name`` ``job<i>``, ``message_bytes`` ``cluster.collective.message_bytes``, ``controller``
    the run's; ``ranks`` and ``compute`` unset (``cluster.per_job`` may set them)."""

    section: ClassVar[str] = "cluster.jobs.<i>"
    name: str | None = within(None, example="a")
    ranks: Any = None  # a list of ranks (ints) and "first-last" ranges, or one of them
    compute: JobCompute | None = within(None, example="{compute_s:0.3}")
    message_bytes: float | None = within(None, ">= 0", what="a finite number >= 0 (bytes)", example="5.0e9")
    start_s: float = within(0.0, ">= 0", what="a finite number >= 0 (seconds)", example=0.1)
    controller: str | None = within(None, example="none")
    controller_params: dict[str, Any] = within({}, example="{phase:{quiet_s:0.0956}}")  # family -> parameters


@dataclass(kw_only=True)
class Scenario(Checked):
    """``cluster.tune_sim``: the sim scenario ``pacectl.tune`` runs on this profile (the defaults of
    ``tune.sim``; :mod:`pacectl.tuning.scenarios`). One rank has no arrival spread and one
    iteration no CV: both need at least 2."""

    section: ClassVar[str] = "cluster.tune_sim"
    num_ranks: int = within(32, ">= 2")
    num_iterations: int = within(150, ">= 2")
    comm: str = within("contention", choices=COMM_NAMES[:3])
    seeds: list[int] = within([0, 1, 2], ">= 0", what="a non-empty list of integer seeds such as [0,1,2]")
    heldout_seeds: list[int] = within(
        [100, 101, 102], ">= 0", what="a non-empty list of integer seeds such as [100,101,102]"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("seeds", "heldout_seeds"):
            if not getattr(self, key):
                name, where = self.where(key)
                raise ConfigError(f"{name} must be a non-empty list of integer seeds, got []{where}")


@dataclass(kw_only=True)
class ClusterConfig(Checked):
    """A cluster profile (``cluster=<name>``, ``conf/cluster/*.yaml``): the fabric sections, the
    compute model, the GPUs' power profile (``power``, :mod:`pacectl.fabric.power`), the traces it
    stands for (``traces``: trace configs, checked when tuning loads them), several jobs on one
    fabric (``jobs``: :class:`~pacectl.fabric.jobs.JobEntry` each) and the tuner's sim
    scenario (``tune_sim``). ``cluster=base`` is this with the models' defaults (a quiet fabric)."""

    section: ClassVar[str] = "cluster"
    name: str = "base"
    description: str = "the fabric models' defaults: a quiet fat-tree"
    power: str | None = None
    topology: FatTree = field(default_factory=FatTree)
    collective: Collective = field(default_factory=Collective)
    cross_traffic: CrossTraffic = field(default_factory=CrossTraffic)
    interference: Interference = field(default_factory=Interference)
    power_cap: PowerCap = field(default_factory=PowerCap)
    buckets: BucketedBackward = field(default_factory=BucketedBackward)
    compute: Compute = field(default_factory=lambda: Compute(compute_s=0.5))
    traces: list[Any] = field(default_factory=list)
    jobs: list[JobEntry] | None = None
    #: a job's keys set by its name (``+cluster.per_job.<job>.<key>``): parse_jobs checks them
    per_job: dict[str, Any] = field(default_factory=dict)
    tune_sim: Scenario = field(default_factory=Scenario)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.per_job and not self.jobs:
            raise ConfigError(
                f"cluster.per_job sets keys of named jobs, but cluster={self.name} places no jobs "
                "(no cluster.jobs): use a profile with several jobs (cluster=shared_uplink) or remove cluster.per_job"
            )
        power_profile(self.power, key="cluster.power")  # the name, with a did-you-mean

    def interference_model(self) -> EarlyArrivalInterference:
        return EarlyArrivalInterference(
            self.interference.kappa, self.topology.ranks_per_node, self.interference.kappa_source
        )


def cluster_config(cluster: Mapping[str, Any] | DictConfig | ClusterConfig) -> ClusterConfig:
    """A profile (the composed ``cluster`` node, or a plain mapping) as its checked typed config:
    the whole profile, whichever model reads it (module docstring; ``pacectl.run`` checks it before
    any run, :func:`pacectl.config.validate_run_config`).

    Raises:
        ConfigError: one line naming the override key, what it must be and how to set it.
    """
    return cluster if isinstance(cluster, ClusterConfig) else typed(ClusterConfig, cluster)


def _overflow(what: str) -> ConfigError:
    """Every value is finite and in range, yet the all-reduce's duration overflows to inf."""
    return ConfigError(
        f"the {what} all-reduce of this profile would take inf s: cluster.collective.message_bytes "
        "is too large for cluster.topology.nic_bandwidth_Bps / nvlink_bandwidth_Bps; "
        "e.g. cluster.collective.message_bytes=2.0e9"
    )


# ---------------------------------------------------------------------------------------------
# Builders (each takes a profile as a mapping or as its typed config)

Profile = Mapping[str, Any] | DictConfig | ClusterConfig


def compute_from(cluster: Profile) -> ComputeModel:
    """The simulator's :class:`ComputeModel` of a profile (``compute.compute_s`` and ``compute.noise``)."""
    return cluster_config(cluster).compute.model()


def power_from(cluster: Profile) -> PowerProfile:
    """The GPU power profile ``cluster.power`` names (:mod:`pacectl.fabric.power`; absent: the default).

    Raises:
        ConfigError: an unknown profile name.
    """
    return power_profile(cluster_config(cluster).power, key="cluster.power")


def power_cap_from(cluster: Profile) -> NodePowerCap | None:
    """The node power cap of a profile (``cluster.power_cap.node_w``), or None when it is off."""
    profile = cluster_config(cluster)
    if profile.power_cap.node_w is None:
        return None
    return NodePowerCap(
        node_w=profile.power_cap.node_w,
        ranks_per_node=profile.topology.ranks_per_node,
        profile=power_from(profile),
    )


def contention_from(cluster: Profile, num_ranks: int) -> ContentionComm:
    """The :class:`ContentionComm` of a profile for ``num_ranks`` ranks."""
    profile = cluster_config(cluster)
    coll = profile.collective
    model = ContentionComm(
        profile.topology,
        num_ranks,
        message_bytes=coll.message_bytes,
        alpha_inter_s=coll.alpha_inter_s,
        alpha_intra_s=coll.alpha_intra_s,
        cross_traffic=profile.cross_traffic,
    )
    if not math.isfinite(model.free_time_s):
        raise _overflow("contention")
    return model


def sim_fabric(
    cluster: Profile, comm: object, num_ranks: int
) -> tuple[FixedComm | AlphaBetaComm | ContentionComm, EarlyArrivalInterference]:
    """Communication model and interference for the simulator.

    ``null`` uses the alpha-beta cost of the profile's collective as its fixed duration: with the
    default ``hierarchical`` algorithm, ``contention``'s quiet-fabric duration where
    :func:`~pacectl.fabric.collectives.hierarchical_allreduce_s` says they agree, so the three models
    share the uncontended duration and differ only in timing dependence.
    """
    name = comm_name(comm)
    if name == "fitted":
        raise ConfigError(
            "comm=fitted is fitted from a recorded trace, so it needs backend=replay, got backend=sim; "
            "the simulator takes comm=null, alpha_beta or contention"
        )
    profile = cluster_config(cluster)
    topology = profile.topology
    try:
        alpha_beta = AlphaBetaComm(topology, num_ranks, **vars(profile.collective))
    except ConfigError as err:  # every input is validated: only an overflow to inf is left
        raise _overflow(profile.collective.algorithm) from err
    no_interference = EarlyArrivalInterference(kappa=0.0, ranks_per_node=topology.ranks_per_node)
    if name == "null":
        return FixedComm(alpha_beta.free_time_s), no_interference
    if name == "alpha_beta":
        return alpha_beta, no_interference
    return contention_from(profile, num_ranks), profile.interference_model()


class ReplayContention:
    """Replay on a contended fabric: the paced DP collective's recorded intrinsic transfer time
    becomes the time the same transfer takes on the contention model's ring when it starts at
    absolute replay time ``t`` (steps laid end to end): the recorded time's worth of bytes at the
    free rate, integrated over the cross traffic's bursts
    (:meth:`~pacectl.fabric.contention.ContentionComm.scaled_time_s`), so a long transfer runs into
    and out of bursts as its own length says. The DP ranks of one collective leave it together: its
    longest recorded instance is the one run through the model, and every rank's instance takes the
    same extra time (``ReplayBackend._transfer_hook``). Other ops keep their recorded times.
    Early-arrival interference is simulator-only.

    An approximation to keep in mind: the model is the all-reduce ring of all ``num_ranks`` ranks
    (the trace's world size, filling nodes in rank order), so whether the bursts reach it is decided
    by the world's placement on the fat-tree. A trace's paced collective is often that of a smaller
    group (the DP group of one pipeline stage: 4 ranks of AR's 64), whose real placement the traces
    do not record; the bursts a transfer meets are the world ring's.

    Args:
        cluster: the cluster profile (``conf/cluster/*.yaml``), validated here.
        num_ranks: ranks of the modelled ring (the replay passes the trace's world size).

    Raises:
        ConfigError: a bad profile value.
    """

    name = "contention"
    timing_dependent = True

    def __init__(self, cluster: Profile, num_ranks: int) -> None:
        self.model = contention_from(cluster, num_ranks)
        self.inert_reason = self.model.inert_reason
        self.timing_dependent = self.model.timing_dependent
        self.description = self.model.description + "; applied to the paced collective of the replay"

    def transfer_s(self, recorded_transfer_s: FloatArray) -> FloatArray:
        """Static part: the recorded transfer times."""
        return recorded_transfer_s

    def contended_s(self, start_s: float, recorded_s: float) -> float:
        """Duration of a recorded transfer of ``recorded_s`` seconds started at absolute time ``start_s``."""
        return self.model.scaled_time_s(start_s, recorded_s)


def buckets_spec(cluster: Profile) -> BucketedBackward:
    """The checked ``cluster.buckets`` section of a profile (absent: one bucket).

    Raises:
        ConfigError: one line naming the key.
    """
    return cluster_config(cluster).buckets


def bucket_engine(cluster: Profile, comm: object, num_ranks: int) -> BucketEngine | None:
    """The simulator's bucketed backward for a profile, or None with one bucket (the single
    all-reduce model runs unchanged).

    Each bucket's comm model is :func:`sim_fabric`'s for the profile with
    ``collective.message_bytes`` scaled by the bucket's size; the overlap slowdown is in force only
    with ``comm=contention`` (the compute-side mechanisms are that model's; null and alpha_beta stay
    max-plus).

    Raises:
        ConfigError: a bad ``cluster.buckets`` value.
    """
    profile = cluster_config(cluster)
    spec = profile.buckets
    if spec.count == 1:
        return None
    message = profile.collective.message_bytes
    comms = []
    for fraction in spec.size_fractions:
        collective = dataclasses.replace(profile.collective, message_bytes=message * fraction)
        comms.append(sim_fabric(dataclasses.replace(profile, collective=collective), comm, num_ranks)[0])
    slowdown = spec.overlap_slowdown if comm_name(comm) == "contention" else 0.0
    return BucketEngine(spec, comms, nominal_compute_s=profile.compute.compute_s, overlap_slowdown=slowdown)
