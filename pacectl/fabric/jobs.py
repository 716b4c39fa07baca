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

Each entry is a typed :class:`~pacectl.fabric.profile.JobEntry`: a wrong type or an unknown key is
refused when Hydra composes the profile, and every key is there (``cluster.jobs.1.controller=none``
needs no ``+``).

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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pacectl.checks import typed
from pacectl.errors import ConfigError, did_you_mean, plural, unknown_keys_error
from pacectl.fabric.collectives import ring_allreduce_s
from pacectl.fabric.noise import ComputeModel
from pacectl.fabric.profile import JobEntry
from pacectl.fabric.topology import FatTree

FloatArray = NDArray[np.float64]

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
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
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


def _runs(ranks: Sequence[int]) -> str:
    """The ranks as the entry's syntax, runs of consecutive ranks as ranges: ``[0-7, 16-23]``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return "[" + ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) + "]"


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``base`` with ``extra`` on top, mappings merged key by key (at every level), ``where`` the
    override path of ``extra``. A mapping of indices onto a list sets those entries
    (``+cluster.per_job.b.compute.noise.0.sigma=0.05``: Hydra makes ``noise`` a mapping ``{"0": ...}``).

    Raises:
        ConfigError: an index past the list's end, or indices where the job has no list.
    """
    out = dict(base)
    for key, value in extra.items():
        old, at = out.get(key), f"{where}.{key}"
        indices = isinstance(value, Mapping) and bool(value) and all(str(k).isdigit() for k in value)
        if indices:
            items = list(old) if isinstance(old, list) else []
            for k, item in value.items():
                if int(k) >= len(items):
                    example = "[{kind:lognormal,sigma:0.02}]" if key == "noise" else "[...]"
                    have = (
                        f"has {plural(len(items), 'entry', 'entries')}"
                        if isinstance(old, list)
                        else "is not set"
                        if old is None
                        else f"is {old!r}, not a list"
                    )
                    raise ConfigError(
                        f"{at}.{k}: the job's {key} {have}, so there is no entry {k}; "
                        f"set the whole list, e.g. '+{at}={example}'"
                    )
                both = isinstance(items[int(k)], Mapping) and isinstance(item, Mapping)
                items[int(k)] = _merged(items[int(k)], item, f"{at}.{k}") if both else item
            out[key] = items
        elif isinstance(old, list) and isinstance(value, Mapping):
            raise ConfigError(
                f"{at} is a list, so its keys are indices, got the mapping {dict(value)!r}; set one entry's "
                f"key ('+{at}.0.<key>=...') or the whole list ('+{at}=[...]')"
            )
        elif isinstance(value, Mapping):  # onto a mapping, or onto nothing (a job's compute unset)
            out[key] = _merged(old if isinstance(old, Mapping) else {}, value, at)
        else:
            out[key] = value
    return out


def _named(
    value: Mapping[str, Any], where: str, names: Sequence[str], unknown: str, hint: str, example: str
) -> None:
    """Each key of the mapping at ``where`` one of ``names`` (else ``unknown``, its ``{hint}``
    ``hint`` with the closest name for ``{}``) and each value a mapping, or a ConfigError."""
    for key, entry in value.items():
        if key not in names:
            close = did_you_mean(str(key), names)
            raise ConfigError(
                unknown.replace("{key}", key).replace("{hint}", hint.format(close) if close else "")
            )
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}.{key} must be a mapping, got {entry!r}; e.g. {example}")


def _per_job(per_job: Mapping[str, Any] | None, names: Sequence[str], cluster: str) -> Mapping[str, Any]:
    """The ``cluster.per_job`` mapping, checked: every key a job's name, every value that job's keys
    but its ``name`` (their types: :func:`parse_jobs`)."""
    example = f"+cluster.per_job.{names[0]}.start_s=0.1"
    unknown = (
        f"cluster.per_job.{{key}} names no job of cluster={cluster}: its jobs are {list(names)}.{{hint}} "
        f"Name one of them, e.g. {example}"
    )
    _named(per_job or {}, "cluster.per_job", names, unknown, " Did you mean cluster.per_job.{}?", example)
    keys = [f.name for f in fields(JobEntry) if f.name != "name"]
    for name, extra in (per_job or {}).items():
        if any(k not in keys for k in extra):
            raise unknown_keys_error(f"cluster.per_job.{name}", extra, keys)
    return per_job or {}


def _controller_params(
    value: Mapping[str, Any], where: str, controllers: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """A job's ``controller_params`` (family -> parameters), each family's checked as its config is."""
    from pacectl.controllers import FAMILIES

    example = f"{where}.phase.quiet_s=0.0956"
    unknown = f"{where}.{{key}}: '{{key}}' is not a controller family{{hint}}; the families are {sorted(controllers)}, e.g. {example}"
    _named(value if controllers else {}, where, controllers, unknown, " (did you mean '{}'?)", example)
    for family, params in value.items() if controllers else ():
        cls, known = FAMILIES[family].cls, FAMILIES[family].params
        if any(k not in known for k in params):
            raise unknown_keys_error(f"{where}.{family}", params, known)
        type(cls.__name__, (cls,), {"section": f"{where}.{family}", "owner": None})(**params)  # ranges
    return {family: dict(params) for family, params in value.items()}


def parse_jobs(
    value: object,
    *,
    fabric_ranks: int,
    topology: FatTree,
    message_bytes: float,
    controllers: Sequence[str] = (),
    per_job: Mapping[str, Any] | None = None,
    cluster: str = "?",
) -> tuple[JobSpec, ...]:
    """The jobs of ``cluster.jobs``, checked against the fabric, with ``cluster.per_job`` on top.

    Args:
        value: the ``cluster.jobs`` list (plain containers: each entry a
            :class:`~pacectl.fabric.profile.JobEntry`'s keys).
        fabric_ranks: ranks the fabric holds (``backend.num_ranks``).
        topology: the fabric.
        message_bytes: a job's message size when it sets none (``cluster.collective.message_bytes``).
        controllers: the known controller families (to check a pinned one and ``controller_params``);
            empty: not checked.
        per_job: the ``cluster.per_job`` mapping (a job's name -> its keys to set), or None.
        cluster: the profile's name, for messages.

    Raises:
        ConfigError: one line naming ``cluster.jobs.<i>.<key>`` (or ``cluster.per_job.<job>.<key>``
            for a value set there), what was expected and a fix; among them a wrong type or unknown
            key (:func:`~pacectl.checks.typed`), a job whose ranks do not fit the fabric, a rank
            claimed by two jobs and a ``per_job`` name that is no job's.
    """
    if not value or not isinstance(value, Sequence):  # (its type: when Hydra composes it)
        raise ConfigError(
            f"cluster.jobs must be a non-empty list of jobs, got {value!r}; see conf/cluster/shared_uplink.yaml"
        )
    entries = [typed(JobEntry, raw, f"cluster.jobs.{i}") for i, raw in enumerate(value)]
    names = [f"job{i}" if e.name is None else e.name for i, e in enumerate(entries)]
    overrides = _per_job(per_job, names, cluster)
    jobs: list[JobSpec] = []
    owner: dict[int, str] = {}
    nodes = math.ceil(fabric_ranks / topology.ranks_per_node)
    for i, (name, entry) in enumerate(zip(names, entries, strict=True)):
        extra = overrides.get(name, {})
        if extra:  # its types and keys checked under cluster.per_job.<job> (the entry's already are)
            entry = typed(
                JobEntry, _merged(asdict(entry), extra, f"cluster.per_job.{name}"), f"cluster.per_job.{name}"
            )

        def at(key: str, name: str = name, i: int = i, extra: Mapping[str, Any] = extra) -> str:
            """``key`` where its value was set: in the job's entry, or in ``cluster.per_job.<job>``."""
            return f"cluster.per_job.{name}.{key}" if key in extra else f"cluster.jobs.{i}.{key}"

        if not name.isidentifier():
            raise ConfigError(
                f"{at('name')} must be a name of letters, digits and _, got {name!r}; e.g. {at('name')}=a"
            )
        if any(j.name == name for j in jobs):
            raise ConfigError(
                f"{at('name')} {name!r} is already the name of another job; give each job its own"
            )
        if entry.ranks is None:
            raise ConfigError(
                f"{at('ranks')} must be set (the job's global ranks); e.g. {at('ranks')}=[0-7,16-23]"
            )
        ranks = _ranks(entry.ranks, at("ranks"))
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
                    f"cannot share a rank; give {at('ranks')} ranks no other job lists (now {_runs(ranks)})"
                )
            owner[r] = name
        if entry.compute is None:
            raise ConfigError(
                f"{at('compute')} must be set (compute_s and noise of the job); e.g. {at('compute')}.compute_s=0.3"
            )
        compute = entry.compute.model(at("compute"))
        msg = message_bytes if entry.message_bytes is None else entry.message_bytes
        if entry.controller is not None and controllers and entry.controller not in controllers:
            raise ConfigError(
                f"{at('controller')} must be null (the run's controller) or one of {sorted(controllers)}, "
                f"got {entry.controller!r}; e.g. {at('controller')}=none"
            )
        params = _controller_params(entry.controller_params, at("controller_params"), controllers)
        jobs.append(JobSpec(name, ranks, compute, msg, entry.start_s, entry.controller, params))
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
