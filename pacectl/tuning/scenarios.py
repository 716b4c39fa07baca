"""What a tuning trial runs: the episodes of one cluster profile, and their averaged objectives.

A cluster profile (``conf/cluster/<name>.yaml``) stands for a cluster in one of two ways:

- **traces** (``tune.on=traces``): its ``traces:`` list, each item a ``trace`` config node
  (``{format, name, path, meta}``); every trial replays each trace once (``backend=replay``, the
  top-level ``comm`` model, ``comm=null`` by default);
- **sim** (``tune.on=sim``): the profile's fabric and ``compute`` sections on the synthetic cluster,
  with the scenario settings of ``tune.sim`` (``num_ranks``, ``num_iterations``, ``comm``, ``seeds``,
  ``heldout_seeds``). ``conf/tune.yaml`` fills ``tune.sim`` from the profile's own ``tune_sim:``
  section when it has one, else from defaults; the command line overrides either.

``tune.on=auto`` picks traces when the profile lists any, else sim. Each objective is the plain mean
over the episodes (traces, or seeds). Every episode goes through the experiment layer
(:func:`pacectl.experiment.make_experiment`), hence the one driver loop and the safety guard.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pacectl import metrics
from pacectl.checks import typed
from pacectl.config import exchange_schedule, user_path
from pacectl.energy import account
from pacectl.errors import ConfigError
from pacectl.experiment import Experiment, make_experiment
from pacectl.fabric.power import PowerProfile
from pacectl.loop import ExchangeSchedule
from pacectl.tuning.config import SimSettings


@dataclass(frozen=True)
class Evaluation:
    """Objectives of one controller on a scenario set.

    Attributes:
        throughput_it_per_s: mean over episodes of iterations per second.
        cv: mean over episodes of the iteration-time CV (std/mean).
        per_episode: one ``{"label", "throughput_it_per_s", "cv", "energy_per_iteration_j"}`` per episode.
        energy_per_iteration_j: mean over episodes of the modelled energy per iteration, summed over
            ranks (J; :func:`pacectl.energy.account` under the profile's ``cluster.power``); NaN when
            not known (a study cached before energy was recorded).
    """

    throughput_it_per_s: float
    cv: float
    per_episode: list[dict[str, Any]] = field(default_factory=list)
    energy_per_iteration_j: float = math.nan

    def loss_frac(self, throughput_it_per_s: float) -> float:
        """Throughput loss of a run at ``throughput_it_per_s`` against this one (the baseline):
        ``1 - throughput / baseline`` (> 0: slower; what ``tune.max_throughput_loss_frac`` caps)."""
        return 1.0 - throughput_it_per_s / self.throughput_it_per_s

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict: the fields, in order."""
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Evaluation:
        """Inverse of :meth:`to_json`."""
        return Evaluation(
            float(data["throughput_it_per_s"]),
            float(data["cv"]),
            list(data.get("per_episode", [])),
            float(data.get("energy_per_iteration_j", math.nan)),
        )


@dataclass
class ScenarioSet:
    """The episodes one trial runs.

    Attributes:
        kind: ``"traces"`` or ``"sim"``.
        profile: cluster profile name.
        labels: one label per episode (trace name, or ``seed=<s>``).
        experiments: one experiment per episode.
        comm_model: the communication model in force (``"null"`` = fixed durations).
        comm_timing_dependent: whether durations depend on timing (only then can pacing gain).
        descriptor: JSON-ready description of everything that shapes an episode (profile, traces or
            sim cluster, seeds or seed, backend, comm model, guard); its hash is :attr:`fingerprint`.
        trace_from_command_line: the episode is the trace named on the command line (``trace=``),
            not the profile's own traces (see :func:`trace_from_command_line`).
    """

    kind: str
    profile: str
    labels: list[str]
    experiments: list[Experiment]
    comm_model: str
    comm_timing_dependent: bool
    descriptor: dict[str, Any]
    trace_from_command_line: bool = False

    @property
    def default_study_name(self) -> str:
        """``<profile>-<family>`` without the family: the profile, or the command line's trace."""
        return self.labels[0] if self.trace_from_command_line else self.profile

    @property
    def fingerprint(self) -> str:
        """A short hash of :attr:`descriptor`: a study refuses to resume on a different scenario set."""
        text = json.dumps(self.descriptor, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def power(self) -> PowerProfile:
        """The GPU power profile the episodes' energy is modelled with (``cluster.power``)."""
        return self.experiments[0].power  # type: ignore[no-any-return]  # replay and sim have one

    def evaluate(self, family: str, params: dict[str, Any]) -> Evaluation:
        """Run the guarded controller on every episode; average throughput, CV and energy.

        Args:
            family: controller family.
            params: its constructor parameters.

        Returns:
            The :class:`Evaluation`.
        """
        rows: list[dict[str, Any]] = []
        for label, experiment in zip(self.labels, self.experiments, strict=True):
            episode = experiment.run(family, params)
            rows.append(
                {
                    "label": label,
                    "throughput_it_per_s": metrics.throughput_it_per_s(episode),
                    "cv": metrics.cv(episode),
                    "energy_per_iteration_j": float(account(episode, self.power).per_iteration_j.mean()),
                }
            )
        mean = {k: sum(float(r[k]) for r in rows) / len(rows) for k in rows[0] if k != "label"}
        return Evaluation(mean["throughput_it_per_s"], mean["cv"], rows, mean["energy_per_iteration_j"])


def tune_mode(cfg: DictConfig) -> str:
    """``"traces"`` or ``"sim"`` from ``tune.on`` (``auto``: traces if the profile lists any).

    Raises:
        ConfigError: unknown ``tune.on``, or ``traces`` on a profile without traces.
    """
    on = str(cfg.tune.get("on", "auto"))
    traces = cfg.cluster.get("traces") or []
    if on == "auto":
        return "traces" if len(traces) else "sim"
    if on not in ("traces", "sim"):
        raise ConfigError(f"tune.on must be one of ['auto', 'traces', 'sim'], got {on!r}")
    if on == "traces" and not len(traces):
        raise ConfigError(
            f"tune.on=traces needs a cluster profile with a traces: list, got cluster={cfg.cluster.get('name')!r} "
            "with none; use tune.on=sim or a profile such as cluster=ar"
        )
    return on


def ops_digest(ops: Any, meta: Any = None) -> str:
    """SHA-256 (first 16 hex digits) of a trace's op table, row order and values (pandas' own
    row hashes), and of its job layout ``meta`` (a ByteDance meta file edited in place): the same
    content gives the same digest wherever it lies."""
    import pandas as pd

    rows = pd.util.hash_pandas_object(ops, index=False).to_numpy()
    return hashlib.sha256(rows.tobytes() + repr(meta).encode()).hexdigest()[:16]


def trace_from_command_line(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """``cfg`` with the trace the command line names (``trace=...``, ``trace.*=...``) as the profile's
    only trace, or ``cfg`` itself when it names none.

    ``pacectl.tune trace=<file>`` (or ``trace=st``, ``trace=kineto trace.path=...``) tunes on that
    trace, replacing the profile's ``traces:`` list; the profile's fabric sections still shape it
    under ``comm=contention``.

    Args:
        cfg: the composed tune config.
        overrides: the command line's overrides (Hydra's task overrides).

    Raises:
        ConfigError: a trace named together with ``tune.on=sim`` (a simulated study replays none).
    """
    keys = [o.split("=", 1)[0].lstrip("+") for o in overrides if not o.startswith("~")]
    if not any(k == "trace" or k.startswith("trace.") for k in keys):
        return cfg
    if str(cfg.tune.get("on", "auto")) == "sim":
        raise ConfigError(
            "tune.on=sim simulates a cluster and replays no trace, but the command line names one "
            "(trace=...): drop tune.on=sim to tune on that trace, or drop the trace override"
        )
    child = _episode_cfg(cfg)
    child.cluster.traces = [OmegaConf.to_container(cfg.trace, resolve=True)]
    return child


def _episode_cfg(cfg: DictConfig, **changes: Any) -> DictConfig:
    child = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    assert isinstance(child, DictConfig)
    for key, value in changes.items():
        child[key] = value
    return child


def build_scenarios(
    cfg: DictConfig, *, seeds: Sequence[int] | None = None, overrides: Sequence[str] = ()
) -> ScenarioSet:
    """The scenario set of ``cfg.cluster`` (see the module docstring).

    Args:
        cfg: the composed tune config (``conf/tune.yaml``).
        seeds: sim only: seeds to run instead of ``tune.sim.seeds`` (for example the held-out seeds).
        overrides: the command line's overrides: a trace named there replaces the profile's traces
            (:func:`trace_from_command_line`).

    Returns:
        The :class:`ScenarioSet`, every trace loaded and every backend built.

    Raises:
        ConfigError: bad profile or settings.
        TraceError: a trace is missing or malformed.
    """
    given = trace_from_command_line(cfg, overrides)
    from_command_line = given is not cfg
    cfg = given
    mode = tune_mode(cfg)
    profile = str(cfg.cluster.get("name", "?"))
    guard = OmegaConf.to_container(cfg.guard, resolve=True)
    experiments: list[Experiment] = []
    labels: list[str] = []
    if mode == "traces":
        backend = OmegaConf.to_container(cfg.backend, resolve=True)
        if not isinstance(backend, dict) or backend.get("name") != "replay":
            raise ConfigError(
                "tune.on=traces replays traces and needs backend=replay, got backend="
                f"{backend.get('name') if isinstance(backend, dict) else backend!r}"
            )
        items = []
        for i, item in enumerate(cfg.cluster.traces):
            if not isinstance(item, DictConfig):
                raise ConfigError(
                    f"cluster.traces[{i}] must be a trace like {{format: bytedance, name: ST, path: ..., "
                    f"meta: ...}} (see conf/cluster/st.yaml), got {item!r}; to tune on a shipped "
                    "profile's traces pick it with cluster=<name> (conf/cluster/)"
                )
            experiment = make_experiment(_episode_cfg(cfg, trace=item))
            loaded = experiment.trace
            labels.append(str(item.get("name") or (loaded.meta.name if loaded is not None else f"trace{i}")))
            experiments.append(experiment)
            described = OmegaConf.to_container(item, resolve=True)
            assert isinstance(described, dict)
            for key in ("path", "meta"):  # absolute: the "use it" command works from any folder
                value = described.get(key)
                where = f"cluster.traces[{i}].{key}"
                if isinstance(value, list):  # Kineto: one file per rank
                    described[key] = [user_path(str(v), where) for v in value]
                elif value:
                    described[key] = user_path(str(value), where)
            if loaded is not None and (loaded.meta.dp_size < 2 or len(loaded.steps) < 2):
                # as for tune.sim: one rank per domain has no arrival spread, one step no CV
                raise ConfigError(
                    f"a trace to tune on must have >= 2 ranks per pacing domain and >= 2 steps, got "
                    f"{loaded.meta.dp_size} rank(s) per domain (dp_size) and {len(loaded.steps)} step(s) in "
                    f"{loaded.source}: nothing can be paced there. Record more ranks (a Kineto file without rank "
                    "information counts as one rank: give trace.ranks) or more steps"
                )
            if loaded is not None:  # the content, so that a study never resumes on a changed file
                described["ops_sha256"] = ops_digest(loaded.ops, loaded.meta)
            items.append(described)
        descriptor: dict[str, Any] = {
            "kind": mode,
            "profile": profile,
            "traces": items,
            "comm": cfg.get("comm"),
            "backend": backend,
            "seed": cfg.get("seed"),
        }
        if experiments[0].comm_model != "null":  # the profile's fabric shapes every episode
            # (also where contention is inert: cross traffic always on is a constant slowdown)
            fabric = OmegaConf.to_container(cfg.cluster, resolve=True)
            assert isinstance(fabric, dict)
            descriptor["cluster"] = {k: v for k, v in fabric.items() if k not in ("tune_sim", "traces")}
    else:
        sim = typed(SimSettings, cfg.tune.sim)
        run_seeds = [int(s) for s in (sim.seeds if seeds is None else seeds)]
        if not run_seeds:
            raise ConfigError("tune.sim.seeds must list at least one seed, got []")
        backend = {
            "name": "sim",
            "num_ranks": sim.num_ranks,
            "num_iterations": sim.num_iterations,
            "record": False,
        }
        for seed in run_seeds:
            experiments.append(make_experiment(_episode_cfg(cfg, backend=backend, comm=sim.comm, seed=seed)))
            labels.append(f"seed={seed}")
        cluster = OmegaConf.to_container(cfg.cluster, resolve=True)
        assert isinstance(cluster, dict)
        cluster.pop("tune_sim", None)
        descriptor = {
            "kind": mode,
            "profile": profile,
            "cluster": cluster,
            "comm": sim.comm,
            "backend": backend,
            "seeds": run_seeds,
        }
    descriptor["guard"] = guard
    schedule = exchange_schedule(cfg)
    if schedule != ExchangeSchedule():  # absent when default: studies from before it still resume
        descriptor["exchange"] = {"lag_iters": schedule.lag, "every_iters": schedule.every}
    first = experiments[0]
    return ScenarioSet(
        kind=mode,
        profile=profile,
        labels=labels,
        experiments=experiments,
        comm_model=first.comm_model,
        comm_timing_dependent=any(e.comm_timing_dependent for e in experiments),
        descriptor=descriptor,
        trace_from_command_line=from_command_line,
    )
