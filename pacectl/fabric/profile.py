"""Cluster profiles (``conf/cluster/*.yaml``) to fabric objects, for the simulator and for replay.

``comm`` picks the communication model: ``null`` (fixed durations, max-plus), ``alpha_beta``
(closed-form collective cost, still max-plus), ``contention`` (max-min fair fat-tree with cross
traffic, plus early-arrival interference: timing-dependent) or, for replay only, ``fitted``
(fitted from the trace itself, :mod:`pacectl.fabric.fitted`). The profile gives the parameters.

:func:`validate_cluster` checks a whole profile (known keys at every level, types, finiteness,
ranges, enums) and returns its values converted; every builder here goes through it, so the
simulator (:func:`sim_fabric`, :func:`compute_from`) and the contended replay
(:class:`ReplayContention`) share one set of checks and messages.

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
real per-worker step-time samples (Alibaba PAI). Profiles: `dgx_superpod` (the default: NVIDIA's DGX H100 SuperPOD reference
architecture, 8 rail-optimised 400 Gb/s NICs per node, 32-node leaves, non-blocking), `cost_optimized`
(one NIC flow per node, 4-node leaves: the default before), `paper_like` (calibrated to the
paper's no-pacing CV of 0.22 at 64 ranks with `comm=contention`, averaged over long runs: the study
uses 3 seeds x 1,500 iterations; heavy-tailed hiccups make one short run's CV noisy), `contended`,
`alibaba_pai` and `h200_gloo4` (the paper_like fabric with each rank replaying real step times: one
Alibaba PAI worker, or one rank of the shipped H200 capture) and `ar` / `st` (the shipped traces).

A profile is checked as a whole wherever a model reads it: always with `backend=sim` (even `comm=null`
takes its fixed duration from `cluster.collective` and its compute times from `cluster.compute`), and
with `backend=replay comm=contention`. Unknown keys, at any level, are refused with the known ones and
a "did you mean"; so are values a model cannot use (`cluster.topology.ranks_per_node=abc`, a bandwidth
of `inf`, `cluster.collective.message_bytes=nan`, `cluster.collective.algorithm=foo`): one line that
names the override key, what it must be and an example (`pacectl.fabric.profile.validate_cluster`).
Replay with `comm=null` (the default) never reads the profile, so it is not checked there. Besides the
keys of `dgx_superpod.yaml`, `cluster.cross_traffic.stagger` (default 0.37, in [0, 1]) shifts the on/off
phase of successive links by that fraction of the period (`+cluster.cross_traffic.stagger=0`: all
links switch together).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pacectl.errors import ConfigError, did_you_mean, unknown_keys_error
from pacectl.fabric.collectives import ALGORITHMS
from pacectl.fabric.contention import (
    AlphaBetaComm,
    ContentionComm,
    CrossTraffic,
    EarlyArrivalInterference,
    FixedComm,
)
from pacectl.fabric.noise import NOISE_COMPONENTS, ComputeModel
from pacectl.fabric.overlap import NOISE_PLACEMENTS, PACERS, BucketedBackward, BucketEngine
from pacectl.fabric.power import PowerProfile, power_profile
from pacectl.fabric.powercap import NodePowerCap
from pacectl.fabric.topology import FatTree

COMM_NAMES = ("null", "alpha_beta", "contention", "fitted")
FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def inert_contention_note(
    cluster_name: str, inert_reason: str | None, *, interference_kappa: float | None = None
) -> str | None:
    """Why ``comm=contention`` has nothing timing-dependent to model on this run, or None.

    The contention model's durations depend on timing only through cross traffic that switches on
    and off on links the inter-node ring uses (:attr:`ContentionComm.inert_reason` says why not)
    and, in the simulator, early-arrival interference between co-located ranks (the replay does not
    model it). Without either (``dgx_superpod``, the trace profiles, a job inside one node) durations are
    fixed, as under max-plus: no controller can gain there, whatever the model's name says.

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
# Validation of a profile. Each field is (checker, example value for the hint); a checker takes the
# value and its override key and returns the converted value or raises a ConfigError naming the key.

_Check = Callable[[object, str], Any]


def _fail(key: str, expected: str, value: object, example: str, hint: str = "") -> ConfigError:
    return ConfigError(f"{key} must be {expected}, got {value!r}{hint}; e.g. {key}={example}")


def _integer(low: int, example: str) -> tuple[_Check, str]:
    def check(value: object, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise _fail(key, f"an integer >= {low}", value, example)
        return int(value)

    return check, example


def _number(
    example: str, *, low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False
) -> tuple[_Check, str]:
    """A finite real number in the interval given by ``low``/``high`` (open or closed ends)."""
    lo = f"> {low:g}" if low_open else f">= {low:g}"
    hi = "" if high == math.inf else (f" and < {high:g}" if high_open else f" and <= {high:g}")
    expected = f"a finite number {lo}{hi}"

    def check(value: object, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise _fail(key, expected, value, example)
        x = float(value)
        ok = (
            math.isfinite(x)
            and (x > low if low_open else x >= low)
            and (x < high if high_open else x <= high)
        )
        if not ok:
            raise _fail(key, expected, value, example)
        return x

    return check, example


def _boolean(example: str) -> tuple[_Check, str]:
    def check(value: object, key: str) -> bool:
        if not isinstance(value, bool):
            raise _fail(key, "true or false", value, example)
        return value

    return check, example


def _choice(choices: tuple[str, ...], example: str) -> tuple[_Check, str]:
    def check(value: object, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            close = did_you_mean(str(value), choices)
            hint = f" (did you mean {close!r}?)" if close else ""
            raise _fail(key, f"one of {list(choices)}", value, example, hint)
        return value

    return check, example


def _text(example: str) -> tuple[_Check, str]:
    def check(value: object, key: str) -> str:
        if not isinstance(value, str) or not value:
            raise _fail(key, "a non-empty string", value, example)
        return value

    return check, example


def _source(example: str) -> tuple[_Check, str]:
    """Where a parameter's value comes from: ``assumed...`` or ``measured...`` (with a note after it)."""

    def check(value: object, key: str) -> str:
        if not isinstance(value, str) or not value.startswith(("assumed", "measured")):
            raise _fail(key, "a string starting with 'assumed' or 'measured: <record>'", value, example)
        return value

    return check, example


def _strings(example: str) -> tuple[_Check, str]:
    def check(value: object, key: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise _fail(key, "a list of strings", value, example)
        for item in value:
            if not isinstance(item, str) or not item:
                raise _fail(key, "a list of non-empty strings", value, example)
        return tuple(value)

    return check, example


def _optional_power(example: str) -> tuple[_Check, str]:
    """A finite power > 0 W, or None (the mechanism off)."""
    inner, _ = _number(example, low=0.0, low_open=True)

    def check(value: object, key: str) -> float | None:
        if value is None:
            return None
        try:
            return float(inner(value, key))
        except ConfigError:
            raise _fail(key, "a finite power > 0 W, or null (off)", value, example) from None

    return check, example


def _fractions(example: str) -> tuple[_Check, str]:
    """A list of finite numbers > 0 (a split into parts; that it sums to 1 is checked by its model), or None."""

    def check(value: object, key: str) -> tuple[float, ...] | None:
        if value is None:
            return None
        expected = "a list of finite numbers > 0 (fractions summing to 1), or null"
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
            raise _fail(key, expected, value, example)
        for item in value:
            if isinstance(item, bool) or not isinstance(item, (int, float, np.integer, np.floating)):
                raise _fail(key, expected, value, example)
            if not (math.isfinite(float(item)) and float(item) > 0):
                raise _fail(key, expected, value, example)
        return tuple(float(item) for item in value)

    return check, example


def _indices(example: str) -> tuple[_Check, str]:
    def check(value: object, key: str) -> tuple[int, ...]:
        if value is None:
            return ()
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise _fail(key, "a list of integers >= 0", value, example)
        for item in value:
            if isinstance(item, bool) or not isinstance(item, (int, np.integer)) or item < 0:
                raise _fail(key, "a list of integers >= 0", value, example)
        return tuple(int(item) for item in value)

    return check, example


#: The fabric sections of a profile and their fields (each example is a valid value, shown in the hint
#: of a bad one). tests/test_fabric.py checks that every key of every shipped profile is here
#: and that each field is a parameter of the class it configures.
FABRIC_SCHEMA: dict[str, dict[str, tuple[_Check, str]]] = {
    "topology": {  # FatTree
        "ranks_per_node": _integer(1, "8"),
        "nodes_per_leaf": _integer(1, "4"),
        "oversubscription": _number("2.0", low=1.0),
        "nic_bandwidth_Bps": _number("5.0e10", low=0.0, low_open=True),
        "nvlink_bandwidth_Bps": _number("4.5e11", low=0.0, low_open=True),
        "rail_optimized": _boolean("false"),
    },
    "collective": {  # AlphaBetaComm / ContentionComm
        "algorithm": _choice(ALGORITHMS, "hierarchical"),
        "message_bytes": _number("2.0e9", low=0.0),
        "alpha_inter_s": _number("5.0e-6", low=0.0),
        "alpha_intra_s": _number("2.0e-6", low=0.0),
    },
    "cross_traffic": {  # CrossTraffic
        "links": _strings("[leaf_up:*]"),
        "rate_frac": _number("1.0", low=0.0, high=1.0, low_open=True),
        "on_s": _number("0.4", low=0.0),
        "off_s": _number("1.2", low=0.0),
        "stagger": _number("0.37", low=0.0, high=1.0),
    },
    "interference": {  # EarlyArrivalInterference (ranks_per_node comes from the topology)
        "kappa": _number("0.05", low=0.0),
        "kappa_source": _source("assumed"),
    },
    "power_cap": {  # NodePowerCap (ranks_per_node from the topology, the profile from cluster.power)
        "node_w": _optional_power("4000"),
    },
    "buckets": {  # BucketedBackward (pacectl/fabric/overlap.py); the cross-field checks are its own
        "count": _integer(1, "4"),
        "sizes": _fractions("'[0.25,0.25,0.25,0.25]'"),
        "compute": _fractions("'[0.25,0.25,0.25,0.25]'"),
        "forward_frac": _number("0.3333", low=0.0, high=1.0, high_open=True),
        "overlap_slowdown": _number("0.189", low=0.0),
        "pacer": _choice(PACERS, "device"),
        "noise": _choice(NOISE_PLACEMENTS, "spread"),
    },
    "compute": {  # ComputeModel; noise items below
        "compute_s": _number("0.5", low=0.0, low_open=True),
        "noise": (lambda value, key: value, "[{kind:lognormal,sigma:0.02}]"),  # checked item by item
    },
}

#: Fields of each ``cluster.compute.noise`` item kind (besides ``kind``), as in :data:`NOISE_COMPONENTS`.
NOISE_SCHEMA: dict[str, dict[str, tuple[_Check, str]]] = {
    "lognormal": {"sigma": _number("0.02", low=0.0)},
    "pareto": {
        "prob": _number("0.0045", low=0.0, high=1.0),
        "scale_s": _number("0.2", low=0.0, low_open=True),
        "alpha": _number("3.0", low=1.0, low_open=True),
    },
    "periodic": {"period_iters": _integer(1, "50"), "duration_s": _number("0.01", low=0.0)},
    "slow_ranks": {
        "ranks": _indices("[0,5]"),
        "fraction": _number("0.05", low=0.0, high=1.0),
        "factor": _number("1.15", low=1.0),
    },
    "empirical": {
        "path": _text("job_norm.csv"),
        "fill": _choice(("ar1", "hold", "consecutive"), "ar1"),
        "sample_every": (
            lambda value, key: None if value is None else _integer(1, "10")[0](value, key),
            "10",
        ),
    },
}


#: The top-level keys of a profile besides the fabric sections (:data:`FABRIC_SCHEMA`): a key with
#: None is not descended into (``name``, ``description``, ``power``; ``traces``, whose items are trace
#: configs checked when tuning loads them), else the keys its mapping may have (``tune_sim``: read by
#: pacectl.tune, see :mod:`pacectl.tuning.scenarios`). A physics model never reads the conf folder:
#: tests/test_fabric.py checks every shipped profile against this.
PROFILE_KEYS: dict[str, frozenset[str] | None] = {
    "name": None,
    "description": None,
    "traces": None,
    "power": None,
    "jobs": None,  # several jobs on one fabric: checked by pacectl.fabric.jobs.parse_jobs
    "tune_sim": frozenset({"comm", "heldout_seeds", "num_iterations", "num_ranks", "seeds"}),
}


def _mapping(value: object, key: str, example: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping, got {value!r}; e.g. {example}")
    return value


def _check_fields(
    section: Mapping[str, Any], schema: dict[str, tuple[_Check, str]], where: str
) -> dict[str, Any]:
    if any(k not in schema for k in section):
        raise unknown_keys_error(where, section, sorted(schema))
    return {str(k): schema[k][0](v, f"{where}.{k}") for k, v in section.items()}


def _noise_items(value: object, where: str = "cluster.compute.noise") -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, (str, Mapping)) or not isinstance(value, (list, tuple)):
        raise ConfigError(
            f"{where} must be a list of noise components, got {value!r}; "
            f"e.g. '{where}=[{{kind:lognormal,sigma:0.02}}]'"
        )
    items = []
    for i, raw in enumerate(value):
        key = f"{where}.{i}"
        item = dict(_mapping(raw, key, f"'{where}=[{{kind:lognormal,sigma:0.02}}]'"))
        kind = item.pop("kind", None)
        if kind not in NOISE_SCHEMA:
            close = did_you_mean(str(kind), sorted(NOISE_SCHEMA))
            hint = f" (did you mean {close!r}?)" if close else ""
            raise _fail(f"{key}.kind", f"one of {sorted(NOISE_SCHEMA)}", kind, "lognormal", hint)
        items.append({"kind": kind, **_check_fields(item, NOISE_SCHEMA[kind], f"{key}")})
    return items


def validate_cluster(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """Check a cluster profile and return it with its fabric values converted.

    Checks every key at every level against the schema (:data:`PROFILE_KEYS`,
    :data:`FABRIC_SCHEMA`, :data:`NOISE_SCHEMA`, with a "did you mean" for typos), and every value a
    model converts: integers, finite numbers in range, booleans, ``collective.algorithm`` and the
    noise kinds. Keys left out keep the model's defaults (every shipped profile sets them all).

    The whole profile is checked, not only the sections the chosen model reads: a profile describes
    one cluster, and a bad value in it is a mistake whichever model runs. It is called wherever a
    profile is read: always in the simulator (even ``comm=null`` takes its fixed duration from the
    profile's collective and its compute model from ``compute``), and in replay with
    ``comm=contention``. Replay with ``comm=null`` (the default run) never reads the profile, so it
    is not checked there: the ``cluster`` group is composed into every run, its values cannot change
    such a run's result (the summary does not record them), and the replay's comm model is built in
    pacectl/config.py (``make_comm_model``), which could call this function if that is ever wanted.

    Args:
        cluster: the ``cluster`` config node as a plain mapping, interpolations resolved.

    Returns:
        A new dict: the fabric sections (``topology``, ``collective``, ``cross_traffic``,
        ``interference``, ``compute``) with converted values (``compute.noise`` a list of dicts with
        ``kind``), the other keys as given.

    Raises:
        ConfigError: one line naming the override key, what was expected and an example.
    """
    shipped = PROFILE_KEYS
    known = sorted(set(shipped) | set(FABRIC_SCHEMA))
    if any(k not in known for k in cluster):
        raise unknown_keys_error("cluster", cluster, known)
    out: dict[str, Any] = dict(cluster)
    for name, schema in FABRIC_SCHEMA.items():
        where = f"cluster.{name}"
        example = f"{where}.{next(iter(schema))}={next(iter(schema.values()))[1]}"
        section = dict(_mapping(cluster.get(name), where, example))
        out[name] = _check_fields(section, schema, where)
    out["compute"]["noise"] = _noise_items(out["compute"].get("noise"))
    power_from(cluster)  # the name is checked here too
    for name, sub_known in shipped.items():
        if sub_known is None or name in FABRIC_SCHEMA or cluster.get(name) is None:
            continue
        other = _mapping(cluster.get(name), f"cluster.{name}", f"+cluster.{name}.{min(sub_known)}=...")
        if any(k not in sub_known for k in other):
            raise unknown_keys_error(f"cluster.{name}", other, sorted(sub_known))
    return out


def _overflow(what: str) -> ConfigError:
    """Every value is finite and in range, yet the all-reduce's duration overflows to inf."""
    return ConfigError(
        f"the {what} all-reduce of this profile would take inf s: cluster.collective.message_bytes "
        "is too large for cluster.topology.nic_bandwidth_Bps / nvlink_bandwidth_Bps; "
        "e.g. cluster.collective.message_bytes=2.0e9"
    )


# ---------------------------------------------------------------------------------------------
# Builders. Each validates the profile it is given (cheap) so that it can also be called alone.


def compute_from(cluster: Mapping[str, Any]) -> ComputeModel:
    """The simulator's :class:`ComputeModel` of a profile (``compute.compute_s`` and ``compute.noise``)."""
    return _compute_model(validate_cluster(cluster)["compute"], "cluster.compute")


def compute_section(section: Mapping[str, Any], where: str) -> ComputeModel:
    """A :class:`ComputeModel` from a compute section (``compute_s``, ``noise``) found at override path
    ``where`` (a job's own, ``cluster.jobs.0.compute``), checked as ``cluster.compute`` is.

    Raises:
        ConfigError: one line naming the key under ``where``.
    """
    compute = _check_fields(
        dict(_mapping(section, where, f"{where}.compute_s=0.5")), FABRIC_SCHEMA["compute"], where
    )
    compute["noise"] = _noise_items(compute.get("noise"), f"{where}.noise")
    return _compute_model(compute, where)


def _compute_model(compute: Mapping[str, Any], where: str) -> ComputeModel:
    components = []
    for item in compute["noise"]:
        params = {k: v for k, v in item.items() if k != "kind"}
        components.append(NOISE_COMPONENTS[item["kind"]](**params))
    if "compute_s" not in compute:
        raise ConfigError(
            f"{where}.compute_s must be set (seconds of compute per iteration); e.g. {where}.compute_s=0.5"
        )
    return ComputeModel(compute_s=compute["compute_s"], components=tuple(components))


def power_from(cluster: Mapping[str, Any]) -> PowerProfile:
    """The GPU power profile ``cluster.power`` names (:mod:`pacectl.fabric.power`; absent: the default).

    Raises:
        ConfigError: an unknown profile name.
    """
    return power_profile(cluster.get("power"), key="cluster.power")


def power_cap_from(cluster: Mapping[str, Any]) -> NodePowerCap | None:
    """The node power cap of a profile (``cluster.power_cap.node_w``), or None when it is off."""
    profile = validate_cluster(cluster)
    node_w = profile.get("power_cap", {}).get("node_w")
    if node_w is None:
        return None
    return NodePowerCap(
        node_w=float(node_w),
        ranks_per_node=int(profile["topology"].get("ranks_per_node", 8)),
        profile=power_from(cluster),
    )


def _collective(profile: Mapping[str, Any]) -> dict[str, Any]:
    c = profile["collective"]
    return {
        "algorithm": c.get("algorithm", "hierarchical"),
        "message_bytes": c.get("message_bytes", 2e9),
        "alpha_inter_s": c.get("alpha_inter_s", 5e-6),
        "alpha_intra_s": c.get("alpha_intra_s", 2e-6),
    }


def _contention(profile: Mapping[str, Any], num_ranks: int) -> ContentionComm:
    coll = _collective(profile)
    model = ContentionComm(
        FatTree(**profile["topology"]),
        num_ranks,
        message_bytes=coll["message_bytes"],
        alpha_inter_s=coll["alpha_inter_s"],
        alpha_intra_s=coll["alpha_intra_s"],
        cross_traffic=CrossTraffic(**profile["cross_traffic"]),
    )
    if not math.isfinite(model.free_time_s):
        raise _overflow("contention")
    return model


def contention_from(cluster: Mapping[str, Any], num_ranks: int) -> ContentionComm:
    """The :class:`ContentionComm` of a profile for ``num_ranks`` ranks."""
    return _contention(validate_cluster(cluster), num_ranks)


def sim_fabric(
    cluster: Mapping[str, Any], comm: object, num_ranks: int
) -> tuple[FixedComm | AlphaBetaComm | ContentionComm, EarlyArrivalInterference]:
    """Communication model and interference for the simulator.

    ``null`` uses the alpha-beta cost of the profile's collective as its fixed duration. With the
    default ``collective.algorithm: hierarchical`` that is exactly ``contention``'s duration on a
    quiet fabric (the all-reduce the contention model runs) while the leaf uplinks do not limit the
    ring (oversubscription <= nodes per leaf), so the three models share the uncontended duration
    and differ only in timing dependence; with ``ring`` or ``tree``, or uplinks oversubscribed past
    that, the fixed duration differs from ``contention``'s.
    """
    name = comm_name(comm)
    if name == "fitted":
        raise ConfigError(
            "comm=fitted is fitted from a recorded trace, so it needs backend=replay, got backend=sim; "
            "the simulator takes comm=null, alpha_beta or contention"
        )
    profile = validate_cluster(cluster)
    topology = FatTree(**profile["topology"])
    coll = _collective(profile)
    try:
        alpha_beta = AlphaBetaComm(topology, num_ranks, **coll)
    except ConfigError as err:  # every input is validated: only an overflow to inf is left
        raise _overflow(coll["algorithm"]) from err
    no_interference = EarlyArrivalInterference(kappa=0.0, ranks_per_node=topology.ranks_per_node)
    if name == "null":
        return FixedComm(alpha_beta.free_time_s), no_interference
    if name == "alpha_beta":
        return alpha_beta, no_interference
    section = profile["interference"]
    interference = EarlyArrivalInterference(
        section.get("kappa", 0.0), topology.ranks_per_node, section.get("kappa_source", "assumed")
    )
    return _contention(profile, num_ranks), interference


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

    def __init__(self, cluster: Mapping[str, Any], num_ranks: int) -> None:
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


def buckets_spec(cluster: Mapping[str, Any]) -> BucketedBackward:
    """The checked ``cluster.buckets`` section of a profile (absent: one bucket).

    Raises:
        ConfigError: one line naming the key.
    """
    section = dict(validate_cluster(cluster).get("buckets") or {})
    for name in ("sizes", "compute"):
        if section.get(name) is not None:
            section[name] = tuple(section[name])
    return BucketedBackward(**section)


def bucket_engine(
    cluster: Mapping[str, Any], comm: object, num_ranks: int, *, base_comm: Any | None = None
) -> BucketEngine | None:
    """The simulator's bucketed backward for a profile, or None with one bucket (the single
    all-reduce model runs unchanged).

    Each bucket's comm model is :func:`sim_fabric`'s for the profile with
    ``collective.message_bytes`` scaled by the bucket's size; the overlap slowdown is in force only
    with ``comm=contention`` (the compute-side mechanisms are that model's; null and alpha_beta stay
    max-plus).

    Raises:
        ConfigError: a bad ``cluster.buckets`` value.
    """
    spec = buckets_spec(cluster)
    if spec.count == 1:
        return None
    profile = validate_cluster(cluster)
    message = float(profile["collective"].get("message_bytes", 2e9))
    comms = []
    for fraction in spec.size_fractions:
        scaled = dict(cluster)
        scaled["collective"] = {**dict(cluster.get("collective") or {}), "message_bytes": message * fraction}
        comms.append(sim_fabric(scaled, comm, num_ranks)[0])
    slowdown = spec.overlap_slowdown if comm_name(comm) == "contention" else 0.0
    compute_s = float(profile["compute"].get("compute_s", 0.5))
    return BucketEngine(spec, comms, nominal_compute_s=compute_s, overlap_slowdown=slowdown)
