"""Several jobs on one fabric: where each job's ranks sit on the fat-tree, and what its all-reduce
moves over which links (the simulator's :class:`~pacectl.backends.multijob.MultiJobSimBackend`).

A cluster profile places jobs with a ``jobs`` list (``conf/cluster/shared_uplink.yaml``)::

    jobs:
      - name: a
        ranks: ["0-7", "16-23"]      # global ranks of the fabric: ints or "first-last" ranges
        compute: {compute_s: 0.3, noise: [{kind: lognormal, sigma: 0.03}]}
        message_bytes: 5.0e9         # optional: the profile's collective.message_bytes
        start_s: 0.0                 # optional: when the job's first iteration starts, seconds
        controller: null             # optional: a family pinned for this job (default: the run's)
        controller_params:           # optional: parameters of a family for this job only, replacing
          phase: {quiet_s: 0.0956}   #   the run's (used in the runs where the job runs that family)

Any of a job's keys but its name can also be set by the job's name, on the command line or in a
profile, with ``cluster.per_job.<job>.<key>`` (a Hydra ``+`` override: the shipped profiles set no
``per_job``)::

    python -m pacectl.run backend=sim cluster=shared_uplink comm=contention controller=phase \
        +cluster.per_job.a.controller_params.phase.quiet_s=0.0956 \
        +cluster.per_job.b.controller_params.phase.quiet_s=0.191 +cluster.per_job.b.start_s=0.2

Mappings merge into the job's own (``per_job.b.compute.compute_s`` keeps b's noise); a name that is
no job's is one line that lists the jobs.

The fabric holds ``backend.num_ranks`` ranks (``ranks_per_node`` per node, ``nodes_per_leaf`` per
leaf); every job's ranks must lie in it, and no rank may belong to two jobs. A job's inter-node
ring visits its nodes in the order its ranks first name them (:meth:`FatTree.ring_flows_on`); its
all-reduce is the hierarchical one of :class:`~pacectl.fabric.contention.ContentionComm` (NVLink
within a node, a ring over nodes), so one job alone on the fabric takes exactly the time that model
gives it on a quiet fabric.

Approximations, stated: a node shared by two jobs shares its NIC through the max-min model, but the
early-arrival interference acts only among a job's own ranks; the fixed (NVLink and latency) part
of an all-reduce runs after its ring transfer, using no network link.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pacectl.errors import ConfigError, did_you_mean, unknown_keys_error
from pacectl.fabric.collectives import ring_allreduce_s
from pacectl.fabric.noise import ComputeModel
from pacectl.fabric.topology import FatTree

FloatArray = NDArray[np.float64]

#: Keys of one ``cluster.jobs`` entry.
JOB_KEYS = ("name", "ranks", "compute", "message_bytes", "start_s", "controller", "controller_params")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


@dataclass(frozen=True)
class JobSpec:
    """One job placed on the fabric.

    Attributes:
        name: the job's name (its pacing domain's and its summary entry's).
        ranks: global ranks of the fabric the job runs on, in the job's rank order.
        compute: its compute-time model.
        message_bytes: gradient bytes per rank per iteration.
        start_s: when its first iteration starts, seconds from the episode's start.
        controller: a controller family pinned for this job, or None (the run's controller).
        controller_params: family -> parameters that replace the run's for this job, in the runs
            where the job runs that family (``phase``: its own ``quiet_s``).
    """

    name: str
    ranks: tuple[int, ...]
    compute: ComputeModel
    message_bytes: float
    start_s: float = 0.0
    controller: str | None = None
    controller_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def params_for(self, family: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` of ``family`` with this job's own (``controller_params``) on top."""
        return {**params, **self.controller_params.get(family, {})}

    def nodes(self, ranks_per_node: int) -> tuple[int, ...]:
        """The job's nodes, in the order its ranks first name them."""
        return tuple(dict.fromkeys(r // ranks_per_node for r in self.ranks))


@dataclass(frozen=True)
class JobFabric:
    """What one job's all-reduce asks of the fabric.

    Attributes:
        weights: ``float64[num_links]``, how many of the job's lock-step ring flows cross each link
            (the ring moves at its slowest flow's rate ``x``, loading a link by ``weight * x``).
        ring_bytes: bytes each ring flow moves per all-reduce (0 within one node).
        fixed_s: the all-reduce's time outside the network ring (NVLink phases, latencies), seconds.
        quiet_s: its duration alone on the fabric, seconds.
    """

    weights: FloatArray
    ring_bytes: float
    fixed_s: float
    quiet_s: float


def _ranks(value: object, key: str) -> tuple[int, ...]:
    example = f"{key}=[0-7,16-23]"
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ConfigError(
            f"{key} must be a non-empty list of ranks (integers >= 0 or 'first-last' ranges), got {value!r}; "
            f"e.g. {example}"
        )
    out: list[int] = []
    for item in value:
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool) and item >= 0:
            out.append(int(item))
            continue
        match = _RANGE.match(item) if isinstance(item, str) else None
        if match is None or int(match.group(1)) > int(match.group(2)):
            raise ConfigError(
                f"{key} entries must be integers >= 0 or 'first-last' ranges with first <= last, got {item!r}; "
                f"e.g. {example}"
            )
        out.extend(range(int(match.group(1)), int(match.group(2)) + 1))
    if len(set(out)) != len(out):
        twice = sorted({r for r in out if out.count(r) > 1})
        raise ConfigError(
            f"{key} names rank(s) {twice[:5]} more than once; list each rank once, e.g. {example}"
        )
    return tuple(out)


def _at_least_0(value: object, key: str, unit: str, example: str) -> float:
    """``value`` as a float, checked finite and >= 0 (``unit`` and ``example`` for the message)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ConfigError(f"{key} must be a finite number >= 0 {unit}, got {value!r}; e.g. {key}={example}")
    return float(value)


def _span(ranks: Sequence[int]) -> str:
    return f"{min(ranks)}-{max(ranks)}" if len(ranks) > 1 else str(ranks[0])


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` on top, mappings merged key by key (at every level)."""
    out = dict(base)
    for key, value in extra.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(old, Mapping) and isinstance(value, Mapping) else value
    return out


def _named_mappings(
    value: Mapping[Any, Any],
    where: str,
    names: Sequence[str] | None,
    example: str,
    unknown: tuple[str, str],
    holds: str,
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The items of the mapping ``value`` at ``where``: each key one of ``names`` (None: any) and each
    value a mapping (of ``holds``, ``{}`` standing for the key). A key not among ``names`` is the
    error ``unknown[0]``, its ``{key}`` the key and its ``{hint}`` ``unknown[1]`` with the closest
    name in its ``{}`` (nothing when none is close): ``cluster.per_job`` and a job's ``controller_params``.

    Raises:
        ConfigError: the first key that is not among ``names``, or the first value that is not a mapping.
    """
    for key, entry in value.items():
        if names is not None and key not in names:
            close = did_you_mean(str(key), names)
            hint = unknown[1].replace("{}", close) if close else ""
            raise ConfigError(unknown[0].replace("{key}", str(key)).replace("{hint}", hint))
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"{where}.{key} must be a mapping of {holds.replace('{}', str(key))}, got {entry!r}; e.g. {example}"
            )
        yield str(key), entry


def _per_job(per_job: object, names: Sequence[str], cluster: str) -> Mapping[str, Mapping[str, Any]]:
    """The ``cluster.per_job`` mapping, checked: every key a job's name, every value a job's keys."""
    if per_job is None:
        return {}
    example = f"+cluster.per_job.{names[0]}.start_s=0.1" if names else "+cluster.per_job.a.start_s=0.1"
    if not isinstance(per_job, Mapping):
        raise ConfigError(
            f"cluster.per_job must be a mapping from a job's name to its keys, got {per_job!r}; e.g. {example}"
        )
    unknown = (  # {key}: the name given, {hint}: its did-you-mean
        f"cluster.per_job.{{key}} names no job of cluster={cluster}: its jobs are {list(names)}.{{hint}} "
        f"Name one of them, e.g. {example}"
    )
    for name, keys in _named_mappings(
        per_job,
        "cluster.per_job",
        names,
        example,
        (unknown, " Did you mean cluster.per_job.{}?"),
        "job {}'s keys",
    ):
        if any(k not in JOB_KEYS or k == "name" for k in keys):
            raise unknown_keys_error(f"cluster.per_job.{name}", keys, [k for k in JOB_KEYS if k != "name"])
    return per_job


def _controller_params(value: object, where: str, controllers: Sequence[str]) -> dict[str, dict[str, Any]]:
    """A job's ``controller_params`` (family -> parameters), each family's checked as its config is."""
    example = f"{where}.phase.quiet_s=0.0956"
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where} must be a mapping from a controller family to its parameters for this job, "
            f"got {value!r}; e.g. {example}"
        )
    unknown = (  # {key}: the family given, {hint}: its did-you-mean
        f"{where}.{{key}}: '{{key}}' is not a controller family{{hint}}; the families are {sorted(controllers)}, "
        f"e.g. {example}"
    )
    out: dict[str, dict[str, Any]] = {}
    for family, params in _named_mappings(
        value, where, controllers or None, example, (unknown, " (did you mean '{}'?)"), "{}'s parameters"
    ):
        if controllers:
            from pacectl.controllers import FAMILIES

            cls = FAMILIES[str(family)].cls
            known = FAMILIES[str(family)].params
            if any(k not in known for k in params):
                raise unknown_keys_error(f"{where}.{family}", params, known)
            type(cls.__name__, (cls,), {"section": f"{where}.{family}", "owner": None})(
                **params
            )  # types, ranges
        out[str(family)] = dict(params)
    return out


def parse_jobs(
    value: object,
    *,
    fabric_ranks: int,
    topology: FatTree,
    message_bytes: float,
    controllers: Sequence[str] = (),
    per_job: object = None,
    cluster: str = "?",
) -> tuple[JobSpec, ...]:
    """The jobs of ``cluster.jobs``, checked against the fabric, with ``cluster.per_job`` on top.

    Args:
        value: the ``cluster.jobs`` list (plain containers).
        fabric_ranks: ranks the fabric holds (``backend.num_ranks``).
        topology: the fabric.
        message_bytes: a job's message size when it sets none (``cluster.collective.message_bytes``).
        controllers: the known controller families (to check a pinned one and ``controller_params``);
            empty: not checked.
        per_job: the ``cluster.per_job`` mapping (a job's name -> its keys to set), or None.
        cluster: the profile's name, for messages.

    Raises:
        ConfigError: one line naming ``cluster.jobs.<i>.<key>`` (or ``cluster.per_job.<job>.<key>``
            for a value set there), what was expected and a fix; among them a job whose ranks do not
            fit the fabric, a rank claimed by two jobs and a ``per_job`` name that is no job's.
    """
    from pacectl.fabric.profile import compute_section

    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ConfigError(
            f"cluster.jobs must be a non-empty list of jobs (name, ranks, compute), got {value!r}; "
            "see conf/cluster/shared_uplink.yaml"
        )
    jobs: list[JobSpec] = []
    owner: dict[int, str] = {}
    nodes = math.ceil(fabric_ranks / topology.ranks_per_node)
    names = [str(r.get("name", f"job{i}")) if isinstance(r, Mapping) else "" for i, r in enumerate(value)]
    overrides = _per_job(per_job, names, cluster)
    for i, raw in enumerate(value):
        if not isinstance(raw, Mapping):
            raise ConfigError(f"cluster.jobs.{i} must be a mapping with name, ranks and compute, got {raw!r}")
        if any(k not in JOB_KEYS for k in raw):
            raise unknown_keys_error(f"cluster.jobs.{i}", raw, JOB_KEYS)
        extra = overrides.get(str(raw.get("name", f"job{i}")), {})
        raw = _merged(raw, extra)
        name = raw.get("name", f"job{i}")

        def at(key: str, name: object = name, i: int = i, extra: Mapping[str, Any] = extra) -> str:
            """``key`` where its value was set: in the job's entry, or in ``cluster.per_job.<job>``."""
            return f"cluster.per_job.{name}.{key}" if key in extra else f"cluster.jobs.{i}.{key}"

        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(
                f"{at('name')} must be a name of letters, digits and _, got {name!r}; e.g. {at('name')}=a"
            )
        if any(j.name == name for j in jobs):
            raise ConfigError(
                f"{at('name')} {name!r} is already the name of another job; give each job its own"
            )
        if "ranks" not in raw:
            raise ConfigError(
                f"{at('ranks')} must be set (the job's global ranks); e.g. {at('ranks')}=[0-7,16-23]"
            )
        ranks = _ranks(raw["ranks"], at("ranks"))
        outside = [r for r in ranks if r >= fabric_ranks]
        if outside:
            raise ConfigError(
                f"{at('ranks').rsplit('.', 1)[0]} ({name}) claims ranks up to {max(outside)}, which do not fit the fabric of "
                f"{fabric_ranks} ranks (backend.num_ranks={fabric_ranks}: {nodes} node(s) of "
                f"{topology.ranks_per_node}); place the job on ranks below {fabric_ranks} or raise backend.num_ranks"
            )
        for r in ranks:
            if r in owner:
                raise ConfigError(
                    f"{at('ranks').rsplit('.', 1)[0]} ({name}) claims rank {r}, which job {owner[r]!r} already runs on: two jobs "
                    f"cannot share a rank; give {at('ranks')} ranks no other job lists (now {_span(ranks)})"
                )
            owner[r] = name
        if "compute" not in raw:
            raise ConfigError(
                f"{at('compute')} must be set (compute_s and noise of the job); e.g. {at('compute')}.compute_s=0.3"
            )
        compute = compute_section(raw["compute"], at("compute"))
        msg = _at_least_0(raw.get("message_bytes", message_bytes), at("message_bytes"), "bytes", "5.0e9")
        start = _at_least_0(raw.get("start_s", 0.0), at("start_s"), "seconds", "0.1")
        pinned = raw.get("controller")
        if pinned is not None and (
            not isinstance(pinned, str) or (controllers and pinned not in controllers)
        ):
            raise ConfigError(
                f"{at('controller')} must be null (the run's controller) or one of {sorted(controllers)}, "
                f"got {pinned!r}; e.g. {at('controller')}=none"
            )
        params = _controller_params(raw.get("controller_params"), at("controller_params"), controllers)
        jobs.append(JobSpec(str(name), ranks, compute, msg, start, pinned, params))
    return tuple(jobs)


def job_fabric(
    topology: FatTree, job: JobSpec, fabric_ranks: int, *, alpha_inter_s: float, alpha_intra_s: float
) -> JobFabric:
    """The links, bytes and fixed time of ``job``'s hierarchical all-reduce (as
    :class:`~pacectl.fabric.contention.ContentionComm` computes them for a job filling nodes in order)."""
    from pacectl.fabric.topology import max_min_fair

    names, caps = topology.links(fabric_ranks)
    nodes = job.nodes(topology.ranks_per_node)
    flows = topology.ring_flows_on(nodes, fabric_ranks)
    weights = flows.sum(axis=0).astype(np.float64) if len(flows) else np.zeros(len(names))
    per_node = max(sum(1 for r in job.ranks if r // topology.ranks_per_node == n) for n in nodes)
    count, m = len(nodes), job.message_bytes
    ring_bytes = 2 * (count - 1) / count * m / topology.rails() if count > 1 else 0.0
    fixed = ring_allreduce_s(m, per_node, alpha_intra_s, topology.nvlink_bandwidth_Bps)
    fixed += 2 * (count - 1) * alpha_inter_s
    if ring_bytes > 0:
        rate = float(max_min_fair(caps, weights[None, :])[0])
        quiet = fixed + ring_bytes / rate
    else:
        quiet = fixed
    return JobFabric(weights=weights, ring_bytes=ring_bytes, fixed_s=fixed, quiet_s=quiet)


def shared_links(
    topology: FatTree, fabrics: Sequence[JobFabric], fabric_ranks: int
) -> list[tuple[int, int, list[str]]]:
    """Pairs of jobs ``(i, j, links)`` whose rings slow each other: the links both cross, for every
    pair in which running both at once lowers either ring's rate below its rate alone."""
    from pacectl.fabric.topology import max_min_fair

    names, caps = topology.links(fabric_ranks)
    out = []
    for i in range(len(fabrics)):
        for j in range(i + 1, len(fabrics)):
            a, b = fabrics[i], fabrics[j]
            if not (a.ring_bytes > 0 and b.ring_bytes > 0):
                continue
            both = (a.weights > 0) & (b.weights > 0)
            if not both.any():
                continue
            alone = [float(max_min_fair(caps, f.weights[None, :])[0]) for f in (a, b)]
            together = max_min_fair(caps, np.vstack([a.weights, b.weights]))
            if together[0] < alone[0] * (1 - 1e-9) or together[1] < alone[1] * (1 - 1e-9):
                out.append((i, j, [names[k] for k in np.flatnonzero(both)]))
    return out


def describe_jobs(
    jobs: Sequence[JobSpec], fabrics: Sequence[JobFabric], ranks_per_node: int
) -> list[dict[str, Any]]:
    """Summary fields of each job: name, ranks (as spans), nodes, message, quiet collective, compute."""
    return [
        {
            "name": job.name,
            "num_ranks": len(job.ranks),
            "nodes": list(job.nodes(ranks_per_node)),
            "message_bytes": job.message_bytes,
            "compute_s": job.compute.compute_s,
            "quiet_collective_s": fab.quiet_s,
            "quiet_comm_duty": fab.quiet_s / (job.compute.compute_s + fab.quiet_s),
            "start_s": job.start_s,
            "controller": job.controller,
            "controller_params": {f: dict(p) for f, p in job.controller_params.items()},
        }
        for job, fab in zip(jobs, fabrics, strict=True)
    ]
