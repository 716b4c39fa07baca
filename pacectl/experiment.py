"""Experiments: what ``python -m pacectl.run`` runs for each controller family, per backend.

An :class:`Experiment` turns ``(controller family, parameters)`` into an :class:`~pacectl.types.Episode`
and describes itself for ``summary.json``. In-process backends (replay, sim) run the one driver loop,
:func:`pacectl.loop.run_episode`; the torch.distributed backend launches real ranks. Backends are
looked up by ``backend.name`` in :data:`EXPERIMENTS` and imported lazily, so replay, simulation and
tuning never import torch.

Reference for users: what the main job does, and the backends
-------------------------------------------------------------

## What `python -m pacectl.run` does

1. Loads the trace (`trace=ar` by default: ByteDance job AR, world 64 = DP4 x PP4 x TP4, 44 steps,
   with a known straggler at dp_rank 0 of stage 0; `trace=st` is the 8-rank job ST).
2. Builds the step's dependency DAG (compute chain, pipeline send/recv pairs, DP all-gather and
   reduce-scatter buckets, embedding and global grad-norm all-reduces) and estimates each op's launch
   gap and each collective's intrinsic transfer time from the recording (`pacectl/backends/dag.py`
   documents the model and the estimator).
3. Runs the what-if analysis of the trace first, to show what straggling costs: the most any
   controller could win. Its replays are announced with their count (:func:`pacectl.whatif.num_replays`
   gives it and their cost; times in `experiments/bench/README.md`). `analysis.whatif=false` skips
   it (`whatif` is then null).
4. Replays every step in a closed loop: one controller per pacing domain (the DP group of each
   pipeline stage), wrapped in the safety guard; the delay goes before each rank's first
   `grads-reduce-scatter` of the step (`backend.paced_optype`).
5. Prints a table and writes the run folder (`hydra.run.dir=DIR`; a `-m` sweep one folder per job
   under `hydra.sweep.dir`): the files of README.md's "Outputs" table. The fields of `summary.json`
   are :class:`pacectl.report.RunSummary`'s (per run :func:`pacectl.metrics.summarize`'s, `blame`
   and `natural_blame` among them: :func:`pacectl.metrics.blame`), the columns of `iterations.parquet`
   :func:`pacectl.report.episodes_to_frame`'s. Warnings (repaired or dropped trace rows, ranks or
   steps; overrides the chosen backend ignores; a controller file the tuner flagged) are printed on
   one line each and kept in `summary.json` (`warnings`) and `report.md`; the guard's interventions
   are counted per run (`guard_interventions`). A live run's ranks print their own warnings on stderr.

   `iterations.parquet` is built in memory (about 200 B per run, iteration and rank);
   `output.iterations=false` skips it for very large simulations. A progress bar (live runs: as
   rank 0 reports iterations) shows on a terminal. After the first run the job estimates its peak
   memory (`pacectl.run.memory_needed`) and stops with that figure, before the other runs, if it
   exceeds the memory available.

Useful overrides: README.md, "Common tasks"; `--help` lists every group and key. Mistakes, every
job of a `-m` sweep included, are checked before anything is created, and the outputs are staged
(:mod:`pacectl.cli`). Every throughput change is printed with the 95 % half-width of its paired
interval (`-0.07 ±0.04`; batch means, :func:`pacectl.metrics.paired_change_ci95_frac`): a change
inside it is noise, one outside it one run's evidence, to repeat with other `seed=` values before
believing it; with fewer than 5 blocks the run warns that its intervals are wide.

## Backends

| `backend=` | what runs | pacing domains |
| --- | --- | --- |
| `replay` (default) | the recorded DAG of a trace, step by step, with the controller in the loop | the DP group of each pipeline stage |
| `sim` | a synthetic pure-DP cluster, `backend.num_ranks` ranks, seeded, vectorized over ranks (`pacectl/backends/sim.py`) | the world |
| `torch` | a live job: `backend.nproc_per_node` gloo ranks started by torch's elastic launcher, a built-in workload with a seeded straggler injector, pacing through a DDP communication hook (`pacectl/torchdist/`) | the world |

Every backend records its runs in the canonical trace format, one file per controller in
`<run dir>/records/<controller>.parquet` (`backend.record=true` for `sim`; always for `torch`, where
`backend.record_dir` may move the folder; the console's `outputs:` line names it), so
`trace=<file>` (short for `trace=canonical trace.path=<file>`; the format is read from the suffix,
:func:`pacectl.cli.trace_file_format`) replays a simulated or live run like a recorded one. The
summary's `paced_collective` names the collective as the source recorded it (`gloo all_reduce`,
`DDP gradient all-reduce`), stored under the trace schema's one gradient op type, `grads-reduce-scatter`.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import importlib.util
import logging
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from omegaconf import DictConfig

from pacectl.backends.replay import ReplayConfig
from pacectl.backends.sim import SimConfig
from pacectl.checks import typed
from pacectl.config import (
    as_dict,
    controller_factory,
    exchange_schedule,
    load_trace,
    make_comm_model,
    shipped_controller,
)
from pacectl.errors import ConfigError
from pacectl.loop import ExchangeSchedule
from pacectl.traces.model import OpTrace
from pacectl.types import Episode

_Spec = TypeVar("_Spec", ReplayConfig, SimConfig)


class Experiment(abc.ABC):
    """One backend configured for an experiment: its runs, and the facts the summary reports.

    A subclass sets ``backend_name``, ``comm_model``, ``comm_description``,
    ``comm_timing_dependent`` and ``exchange`` (when decisions reach the ranks:
    :class:`~pacectl.loop.ExchangeSchedule`, modelled by replay and sim, the real exchange's lag
    for live runs), and implements :meth:`describe` and :meth:`run`. Every other member has a
    default that means "this backend does not have it".
    """

    backend_name: ClassVar[str]
    #: live ranks on a real machine (their differences from no pacing include its noise)
    live: ClassVar[bool] = False
    comm_model: str
    comm_description: str
    comm_timing_dependent: bool
    exchange: ExchangeSchedule
    #: the pacing actuators each controller runs with (``backend.actuator``; see :meth:`set_actuator`)
    actuators: tuple[str, ...] = ("delay",)
    #: the iterations of one run, for a progress bar by iterations; None: the bar counts whole runs
    iterations_per_run: int | None = None
    #: the ranks each iteration steps, for the size of a run's work (plain progress lines); 0: unknown
    num_ranks: int = 0
    #: ``(block, offset)`` of :func:`~pacectl.metrics.paired_change_ci95_frac` when the runs'
    #: iterations come in blocks of their own (live runs interleaved); ``(None, 0)``: blocks of sqrt(n)
    paired_blocks: tuple[int | None, int] = (None, 0)
    #: units of work :meth:`describe` reports through ``on_step`` (replay: the what-if replays)
    describe_steps: int = 0
    #: why a job-level shift (``phase``) cannot change any duration here; None: it can
    job_shift_note: str | None = None
    #: what waiting asleep (``sleep_wait``) changes here, in words (see :func:`controller_notes`)
    sleep_wait_note: str | None = None
    #: the GPU power profile of the runs' modelled energy (:mod:`pacectl.energy`); None: not modelled
    power: Any = None
    #: stream each run where the backend can (``output.iterations=false``): its per-rank arrays are
    #: reduced as it runs (:func:`pacectl.loop.run_episode`'s ``reduce``) and not kept, so memory
    #: grows with ranks, not ranks x iterations; its episode holds ``totals`` instead
    stream: bool = False
    #: the recorded trace a replay replays (:class:`~pacectl.traces.model.OpTrace`); None: none
    trace: Any = None

    @abc.abstractmethod
    def describe(self, on_step: Callable[[], None] | None = None) -> dict[str, Any]:
        """Summary fields describing the input: at least ``trace`` (``name``, ``path``).

        ``on_step`` is called after each of :attr:`describe_steps` units of work, for a progress bar.
        """

    @abc.abstractmethod
    def run(
        self, family: str, params: dict[str, Any], *, on_iteration: Callable[[], None] | None = None
    ) -> Episode:
        """One episode of the guarded controller ``family`` with ``params``; ``on_iteration`` is called
        after every iteration where the backend can (progress)."""

    def set_actuator(self, actuator: str) -> None:  # noqa: B027 - optional: one actuator by default
        """Apply the next runs' pacing delays with ``actuator``, one of :attr:`actuators`."""

    def record_folder(self, out_dir: Path) -> Path | None:
        """Where the run's canonical records go (written by :meth:`write_outputs`), or None."""
        return None

    def write_outputs(self, stage: Path) -> None:  # noqa: B027 - optional: no extra outputs by default
        """Write extra outputs into the run's staging folder ``stage``, with the others."""

    def measured_energy(self) -> tuple[str, dict[str, Any]] | None:
        """Measured energy of a live run: ``(source, run -> float64[iterations, ranks])``; None when
        the energy is modelled (:attr:`power`) or not known."""
        return None


class _ClosedLoop(Experiment):
    """What replay and simulation share: one seeded closed-loop episode per run on ``self.backend``,
    its energy under ``power`` (``cluster.power``)."""

    backend: Any
    cfg: DictConfig
    cluster_name: str

    def _configure(self, cfg: DictConfig, spec_type: type[_Spec]) -> tuple[dict[str, Any], _Spec]:
        """Keep ``cfg`` and set what every closed loop reads from it: ``cluster_name``, ``power``
        (``cluster.power``) and ``actuators`` (``backend.actuator``: ``both`` is every controller with
        each, delay first).

        Returns:
            ``(cluster profile as a dict, the backend's typed config)``.
        """
        from pacectl.fabric.power import ACTUATORS
        from pacectl.fabric.profile import power_from

        self.cfg = cfg
        cluster = as_dict(cfg.cluster)
        self.cluster_name = str(cluster.get("name", "?"))
        self.power = power_from(cluster)
        spec = typed(spec_type, cfg.backend)
        self.actuators = ACTUATORS if spec.actuator == "both" else (spec.actuator,)
        return cluster, spec

    def set_actuator(self, actuator: str) -> None:
        """Apply the next runs' pacing delays with ``actuator`` (``delay`` or ``clock``)."""
        self.backend.actuator = actuator

    @property
    def iterations_per_run(self) -> int:  # type: ignore[override]
        """Iterations (replayed steps) per run."""
        return int(self.backend.num_iterations)

    @property
    def num_ranks(self) -> int:  # type: ignore[override]
        """Ranks of the backend (a replay: of the trace; several jobs: of the whole fabric)."""
        return int(len(self.backend.rank_labels))

    @property
    def exchange(self) -> ExchangeSchedule:  # type: ignore[override]
        """``exchange.lag_iters`` / ``exchange.every_iters`` of the config.

        Raises:
            ConfigError: ``lag_iters`` at or past the run's length (no decision would ever be
                applied: the run would be no pacing under a controller's name).
        """
        schedule = exchange_schedule(self.cfg)
        n = self.iterations_per_run
        if schedule.lag >= n and schedule.lag > 1:  # the default lag of a 1-iteration run: a warning
            raise ConfigError(
                f"exchange.lag_iters must be < the run's {n} iterations, got {schedule.lag}: no pacing "
                "decision would ever be applied, so every controller would run as no pacing. Lower "
                "exchange.lag_iters or replay more iterations"
            )
        return schedule

    def run(
        self, family: str, params: dict[str, Any], *, on_iteration: Callable[[], None] | None = None
    ) -> Episode:
        """One seeded episode of the guarded ``family`` controller, one per pacing domain (replay: a
        stage's DP group, over every recorded step); every controller sees the same compute times."""
        from pacectl.energy import episode_totals
        from pacectl.loop import run_episode

        return run_episode(
            self.backend,
            controller_factory(family, params, self.cfg.guard),
            seed=int(self.cfg.seed),
            on_iteration=on_iteration,
            exchange=self.exchange,
            # the no-pacing run's reduction also sums the energy's oracle bound (the others need none)
            reduce=partial(episode_totals, profile=self.power, oracle=family == "none")
            if self.stream
            else None,
        )


class ReplayExperiment(_ClosedLoop):
    """Closed-loop replay of a recorded trace (``backend=replay``).

    Also reports the replay's fidelity and the what-if analysis' blocking slowdown (the most any
    controller could win by removing straggling, Lin et al. OSDI 2025).
    """

    backend_name = "replay"

    def __init__(self, cfg: DictConfig) -> None:
        from pacectl.backends.replay import ReplayBackend
        from pacectl.fabric.profile import comm_name

        cluster, spec = self._configure(cfg, ReplayConfig)
        self.trace = load_trace(cfg.trace)
        fitted = comm_name(cfg.get("comm")) == "fitted"
        if fitted:
            from pacectl.fabric.fitted import FittedComm, fit_options

            options = fit_options(cfg.get("fit"))  # checked before the (slow) fit and replay
        comm = None if fitted else make_comm_model(cfg, self.trace.meta.world_size)
        _warn_if_inert(cfg, comm, interference_kappa=None)
        _warn_if_other_trace(cfg)
        if (cluster.get("power_cap") or {}).get("node_w") is not None:
            warnings.warn(
                "cluster.power_cap is modelled by backend=sim only (the replay keeps the recorded compute "
                "times, whose clocks a node cap already set): it is ignored here",
                UserWarning,
                stacklevel=2,
            )
        self.backend = ReplayBackend(
            self.trace,
            paced_optype=spec.paced_optype,
            comm_model=comm,
            actuator=self.actuators[0],
            power=self.power,
        )
        self.comm_fit: dict[str, Any] | None = None
        if fitted:  # comm=fitted: the model is fitted from this backend's recording, then put in force
            model = FittedComm.for_backend(self.backend, **options)
            self.backend.use_comm_model(model)
            comm = model
            self.comm_fit = model.fit.to_dict() if model.fit is not None else None
            verdict = model.fit.verdict if model.fit else model.description
            logging.getLogger("pacectl.run").info(f"comm=fitted: {verdict}")
        assert comm is not None
        self.comm_model = comm.name
        self.comm_description = comm.description
        self.comm_timing_dependent = bool(comm.timing_dependent)
        if comm.timing_dependent:
            self.job_shift_note: str | None = None
        elif comm.name == "null":
            self.job_shift_note = "one recorded job replayed with fixed durations, comm=null"
        else:
            reason = getattr(comm, "inert_reason", None) or "its durations are fixed"
            self.job_shift_note = (
                f"one recorded job, and comm={comm.name} has nothing that varies here: {reason}"
            )
        self.sleep_wait_note = (
            "the replay models no early-arrival interference (max-plus; comm=contention in replay "
            "models link sharing only), so sleep_wait equals no pacing here"
        )
        self.describe_steps = 0
        if cfg.analysis.get("whatif", True):
            from pacectl import whatif

            self.describe_steps = whatif.num_replays(self.backend)

    def describe(self, on_step: Callable[[], None] | None = None) -> dict[str, Any]:
        """``trace``, ``paced_optype``, ``fidelity`` and (unless ``analysis.whatif=false``) ``whatif``
        summary fields; ``on_step`` after each what-if replay."""
        trace, meta, backend = self.trace, self.trace.meta, self.backend
        about: dict[str, Any] = {
            "name": meta.name,
            "path": trace.source,
            "format": trace.fmt,
            "world_size": meta.world_size,
            "dp_size": meta.dp_size,
            "pp_size": meta.pp_size,
            "tp_size": meta.tp_size,
            "dsp_size": meta.dsp_size,
            "num_steps": backend.num_iterations,
            "time_unit": trace.time_unit,
            "sample_every_iters": trace.sample_every_iters,
        }
        if trace.timing:
            about["timing"] = trace.timing
        if trace.sample_every_iters > 1:
            about["sample_note"] = (
                f"each replayed step is one recorded sample, {trace.sample_every_iters} real iterations "
                "after the previous one: lags and autocorrelations counted in replayed iterations are "
                f"{trace.sample_every_iters}x as long in real iterations"
            )
        # why runs[*].num_ranks may differ from world_size
        about["ranks_modelled"] = sum(len(d.ranks) for d in backend.domains)
        if meta.tp_size > 1:
            about["ranks_note"] = (
                "tensor-parallel peers are folded into one representative rank (world_size / tp_size); "
                "each pipeline stage's data-parallel group is one pacing domain"
            )
        return {
            "trace": about,
            "paced_optype": backend.paced_optype,
            # as the source names it, where it has another name than the schema's op type
            "paced_collective": f"{trace.collective} (canonical op type {backend.paced_optype})"
            if trace.collective and backend.paced_optype == "grads-reduce-scatter"
            else backend.paced_optype,
            "fidelity": {
                "comm_model": "null",
                "compares": "the trace replayed with its recorded pacing delays ("
                + ("its own, a paced record" if backend.dag.delay_s.any() else "none recorded")
                + ") against its recorded step times"
                + (" (the measured iteration times it carries)" if trace.measured_step_time_s else ""),
                **dataclasses.asdict(backend.fidelity()),  # its error fractions and clipped counts
            },
            "whatif": self._straggler_cost(on_step) if self.describe_steps else None,
            **({"comm_fit": self.comm_fit} if self.comm_fit is not None else {}),
        }

    def _straggler_cost(self, on_step: Callable[[], None] | None) -> dict[str, Any]:
        """The summary's ``whatif`` fields: what straggling costs on this trace (null model)."""
        from pacectl import whatif

        prize = whatif.analyze(self.backend, on_replay=on_step)
        return {
            "comm_model": "null",
            "blocking_slowdown": prize.blocking_slowdown,
            "launch_slowdown": prize.launch_slowdown,
            "ideal_iteration_time_mean_s": float(prize.step_time_ideal_s.mean()),
            "m_w": prize.m_w.rem,
            "m_s": prize.m_s.rem,
            "note": "what straggling costs: mean step time without launch delays / ideal replay with "
            "stragglers removed (Lin et al., OSDI 2025, null model)",
        }


def _warn_if_other_trace(cfg: DictConfig) -> None:
    """Warn when the ``cluster`` profile stands for traces and the replayed one is not among them.

    ``pacectl.tune`` tunes a trace profile on its ``cluster.traces``; ``pacectl.run`` replays the
    ``trace`` group (AR by default) whatever the profile, so ``cluster=st`` alone replays AR.
    """
    cluster = as_dict(cfg.cluster)
    traces = [t for t in cluster.get("traces") or [] if isinstance(t, dict) and t.get("path")]
    path = cfg.trace.get("path")
    if not traces or path is None:
        return
    replayed = Path(str(path)).expanduser().resolve()
    if all(Path(str(t["path"])).expanduser().resolve() != replayed for t in traces):
        names = ", ".join(str(t.get("name", t["path"])) for t in traces)
        warnings.warn(
            f"cluster={cluster.get('name', '?')} stands for trace(s) {names}, but this run replays {replayed.name} "
            f"(trace=... picks what pacectl.run replays; cluster.traces is what pacectl.tune tunes on): "
            f"add trace=<name> to replay the profile's own",
            UserWarning,
            stacklevel=3,
        )


def _warn_if_inert(cfg: DictConfig, comm: object, *, interference_kappa: float | None) -> None:
    """Warn when ``comm=contention`` has no timing-dependent mechanism on this run (replay: kappa None)."""
    if getattr(comm, "name", None) != "contention":
        return
    from pacectl.fabric.profile import inert_contention_note

    note = inert_contention_note(
        str(cfg.cluster.get("name", "?")),
        getattr(comm, "inert_reason", None),
        interference_kappa=interference_kappa,
    )
    if note:
        warnings.warn(note, UserWarning, stacklevel=3)


class SimExperiment(_ClosedLoop):
    """The synthetic cluster (``backend=sim``): ``backend.num_ranks`` ranks of pure data parallelism,
    compute noise and fabric from the ``cluster`` profile, communication model from ``comm``."""

    backend_name = "sim"

    def __init__(self, cfg: DictConfig) -> None:
        from pacectl.backends.sim import SimBackend
        from pacectl.fabric.profile import bucket_engine, compute_from, power_cap_from, sim_fabric

        cluster, spec = self._configure(cfg, SimConfig)
        num_ranks = spec.num_ranks
        comm, interference = sim_fabric(cluster, cfg.get("comm"), num_ranks)
        _warn_if_inert(
            cfg, comm, interference_kappa=interference.kappa if interference.active(num_ranks) else 0.0
        )
        if cluster.get("traces"):
            warnings.warn(
                f"cluster={self.cluster_name} stands for recorded traces (cluster.traces), which backend=sim "
                "does not use: it simulates the profile's topology, collective, interference and compute "
                "sections (for a trace profile, the cost_optimized ones it inherits). Replay the traces with "
                f"trace=<name> (backend=replay), or simulate a fabric profile (cluster=paper_like)",
                UserWarning,
                stacklevel=2,
            )
        self.backend = SimBackend(
            num_ranks=num_ranks,
            num_iterations=spec.num_iterations,
            compute=compute_from(cluster),
            comm=comm,
            interference=interference,
            record=spec.record,
            actuator=self.actuators[0],
            power=self.power,
            power_cap=power_cap_from(cluster),
            overlap=bucket_engine(cluster, cfg.get("comm"), num_ranks),
        )
        self.comm_model = self.backend.comm_model
        self.comm_description = self.backend.comm_description
        self.comm_timing_dependent = self.backend.comm_timing_dependent
        self.job_shift_note, self.sleep_wait_note = _sim_notes(comm, interference, num_ranks)
        overlap = self.backend.overlap
        if overlap is not None and overlap.timing_dependent:
            self.sleep_wait_note = (
                f"{self.sleep_wait_note}; with {overlap.count} buckets it also removes the spinning part of the "
                f"on-device overlap slowdown ({overlap.slowdown:g}): a waiting rank's kernels then occupy its GPU "
                "only during the transfers"
            ).replace("so sleep_wait equals no pacing here; ", "")
        self.recorded: dict[str, OpTrace] = {}

    def describe(self, on_step: Callable[[], None] | None = None) -> dict[str, Any]:
        """``trace`` (the synthetic scenario) and ``sim`` summary fields (``on_step`` unused)."""
        b = self.backend
        return _sim_describe(
            self,
            comm_free_time_s=float(b.comm.free_time_s),
            # how each noise component draws compute times (a sampled series says how it is filled)
            compute_noise=[
                c.describe() if hasattr(c, "describe") else type(c).__name__ for c in b.compute.components
            ],
            power_cap_node_w=None if b.power_cap is None else b.power_cap.node_w,
            buckets=_buckets_summary(b.overlap),
        )

    def run(
        self, family: str, params: dict[str, Any], *, on_iteration: Callable[[], None] | None = None
    ) -> Episode:
        """One seeded episode (:meth:`_ClosedLoop.run`), recorded with ``backend.record=true``."""
        episode = super().run(family, params, on_iteration=on_iteration)
        if self.backend.record:
            run = (
                family if self.backend.actuator == self.actuators[0] else f"{family}@{self.backend.actuator}"
            )
            self.recorded[run] = self.backend.to_trace(name=f"sim-{self.cluster_name}-{run}")
        return episode

    def record_folder(self, out_dir: Path) -> Path | None:
        """Where :meth:`write_outputs` puts the records (with ``backend.record=true``), else None."""
        return out_dir / "records" if self.backend.record else None

    def write_outputs(self, out_dir: Path) -> None:
        """With ``backend.record=true``: ``records/<family>.parquet`` per run (canonical format, the
        layout of a live run's records: ``trace=<run dir>/records/none.parquet`` replays one)."""
        from pacectl.traces.canonical import write_canonical

        if self.recorded:
            (out_dir / "records").mkdir(exist_ok=True)
        for family, trace in self.recorded.items():
            write_canonical(trace, out_dir / "records" / f"{family}.parquet")


class MultiJobSimExperiment(_ClosedLoop):
    """Several jobs on one fabric (``backend=sim`` with a profile that has ``jobs``,
    :mod:`pacectl.backends.multijob`): ``backend.num_ranks`` is the fabric's size, the profile places
    the jobs on it, each job is a pacing domain with the run's controller (or the one it pins)."""

    backend_name = "sim"

    def __init__(self, cfg: DictConfig) -> None:
        from pacectl.backends.multijob import MultiJobSimBackend
        from pacectl.controllers import CONTROLLERS
        from pacectl.fabric.jobs import parse_jobs
        from pacectl.fabric.profile import cluster_config, comm_name

        cluster, spec = self._configure(cfg, SimConfig)
        profile = cluster_config(cluster)
        comm = comm_name(cfg.get("comm"))
        if comm == "fitted":
            raise ConfigError(
                "comm=fitted is fitted from a recorded trace, so it needs backend=replay, got backend=sim; "
                "the simulator takes comm=null, alpha_beta or contention"
            )
        several = f"with several jobs on one fabric (cluster={self.cluster_name} has cluster.jobs)"
        if spec.record:
            raise ConfigError(
                f"backend.record=true is not supported {several}: no canonical trace of a multi-job run yet; "
                "use backend.record=false"
            )
        if profile.power_cap.node_w is not None:
            raise ConfigError(
                f"cluster.power_cap.node_w must be null {several}: the node power cap is modelled by the "
                "single-job simulator only"
            )
        if profile.buckets.count > 1:
            raise ConfigError(
                f"cluster.buckets.count must be 1 {several}: bucketed backward is modelled by the single-job "
                "simulator only; e.g. cluster.buckets.count=1"
            )
        fabric_ranks, topology, coll = spec.num_ranks, profile.topology, profile.collective
        self.jobs = parse_jobs(
            cluster.get("jobs"),
            fabric_ranks=fabric_ranks,
            topology=topology,
            message_bytes=coll.message_bytes,
            controllers=tuple(CONTROLLERS),
            per_job=cluster.get("per_job"),
            cluster=self.cluster_name,
        )
        self.backend = MultiJobSimBackend(
            self.jobs,
            topology,
            fabric_ranks,
            num_iterations=spec.num_iterations,
            comm=comm,
            interference=profile.interference_model(),
            cross_traffic=profile.cross_traffic,
            alpha_inter_s=coll.alpha_inter_s,
            alpha_intra_s=coll.alpha_intra_s,
            power=self.power,
            actuator=self.actuators[0],
        )
        self.comm_model = self.backend.comm_model
        self.comm_description = self.backend.comm_description
        self.comm_timing_dependent = self.backend.comm_timing_dependent
        self.job_shift_note = self.backend.job_shift_note
        b = self.backend
        if any(b.interference.active(len(j.ranks)) for j in self.jobs):
            self.sleep_wait_note: str = (
                f"it removes exactly the early-arrival interference term (kappa {b.interference.kappa:g}, "
                "spinning waiters only, within each job): the bar a per-rank controller must beat on this run"
            )
        else:
            self.sleep_wait_note = (
                "no early-arrival interference on this run (kappa 0, or comm=null), so sleep_wait equals "
                "no pacing here"
            )
        if comm == "contention" and not b.comm_timing_dependent:
            warnings.warn(
                f"cluster={self.cluster_name} gives comm=contention no timing-dependent mechanism "
                f"({self.job_shift_note}; no early-arrival interference), so durations are fixed here and no "
                "controller can gain; place two jobs whose rings cross one oversubscribed link "
                "(cluster=shared_uplink)",
                UserWarning,
                stacklevel=2,
            )

    def run(
        self, family: str, params: dict[str, Any], *, on_iteration: Callable[[], None] | None = None
    ) -> Episode:
        """One seeded episode: each job a pacing domain under ``family`` or the controller it pins."""
        from pacectl.loop import run_episode

        factories = []
        for job in self.jobs:  # the run's family or the one it pins, with the job's own parameters on top
            name = family if job.controller is None else job.controller
            defaults = params if job.controller is None else shipped_controller(name, self.cfg)
            factories.append(controller_factory(name, job.params_for(name, defaults), self.cfg.guard))
        return run_episode(
            self.backend,
            factories,
            seed=int(self.cfg.seed),
            on_iteration=on_iteration,
            exchange=self.exchange,
        )

    def describe(self, on_step: Callable[[], None] | None = None) -> dict[str, Any]:
        """``trace`` (the synthetic scenario) and ``sim`` summary fields, with every job."""
        from pacectl.fabric.jobs import describe_jobs

        b = self.backend
        return _sim_describe(
            self,
            fabric_ranks=b.fabric_ranks,
            jobs=describe_jobs(self.jobs, b.fabrics, b.topology.ranks_per_node),
            shared_links=[
                {"jobs": [self.jobs[i].name, self.jobs[j].name], "links": links} for i, j, links in b.shared
            ],
            power_cap_node_w=None,
        )


def _sim_describe(experiment: _ClosedLoop, **fields: Any) -> dict[str, Any]:
    """The ``trace`` (the synthetic scenario) and ``sim`` summary fields of a simulated run: what
    every simulation has, then ``fields``, the backend's own."""
    b, cluster = experiment.backend, experiment.cluster_name
    return {
        "trace": {"name": f"sim:{cluster}", "path": None, "format": "sim", "world_size": b.num_ranks},
        "sim": {
            "cluster": cluster,
            "num_ranks": b.num_ranks,
            "num_iterations": b.num_iterations,
            "interference_kappa": b.interference.kappa,
            "interference_kappa_source": b.interference.kappa_source,
            "mechanisms": list(b.mechanisms),
            **fields,
        },
    }


def controller_notes(experiment: Experiment, families: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The run's warnings and notes about what its job-level families (``phase``) and the families
    whose ranks wait asleep (``sleep_wait``) can change on it (their registrations say which).

    Args:
        experiment: the :class:`Experiment` (its ``job_shift_note`` and ``sleep_wait_note``).
        families: the runs (controller family -> parameters).

    Returns:
        ``(warnings, notes)``: a job-level family with no other traffic on its links is a warning (it
        cannot do anything: a silent zero would look like a result); what waiting asleep changes is a note.
    """
    from pacectl.controllers import FAMILIES

    warned, noted = [], []
    why, wait = experiment.job_shift_note, experiment.sleep_wait_note
    for name in families:
        fam = FAMILIES.get(name)
        if fam is not None and fam.job_level and why:
            warned.append(
                f"{name}: no other traffic shares this job's links ({why}); a job-level shift cannot change "
                f"any duration here, so {name} applies no delay (cluster=shared_uplink puts two jobs on one "
                "uplink; cross traffic on the ring's links also gives it something to move against)"
            )
        if fam is not None and fam.waits_asleep and wait:
            noted.append(f"{name}: {wait}")
    return warned, noted


def _buckets_summary(overlap: Any) -> dict[str, Any]:
    """The ``sim.buckets`` summary field: the bucketed backward in force (one bucket: the single
    all-reduce model)."""
    if overlap is None:
        return {"count": 1}
    spec = overlap.spec
    return {
        "count": overlap.count,
        "sizes": list(spec.size_fractions),
        "compute": list(spec.compute_fractions),
        "forward_frac": spec.forward_frac,
        "overlap_slowdown": overlap.slowdown,
        "pacer": spec.pacer,
        "noise": spec.noise,
        "comm_free_time_s": [float(c.free_time_s) for c in overlap.comms],
    }


def _sim_notes(comm: Any, interference: Any, num_ranks: int) -> tuple[str | None, str]:
    """``(job_shift_note, sleep_wait_note)`` of a simulated run of one job (see :class:`Experiment`)."""
    if comm.timing_dependent:
        shift = None  # the square-wave cross traffic: a shift moves the collective against it
    else:
        shift = f"one job and comm={comm.name}" + (
            f" with no cross traffic that varies ({comm.inert_reason})" if comm.name == "contention" else ""
        )
    if interference.active(num_ranks):
        wait = (
            f"it removes exactly the early-arrival interference term (kappa {interference.kappa:g}, "
            "spinning waiters only): the bar a per-rank controller must beat on this run"
        )
    else:
        wait = (
            "no early-arrival interference on this run (kappa 0, a comm model without it, or one rank "
            "per node), so sleep_wait equals no pacing here"
        )
    return shift, wait


#: backend.name -> "module:Class" of its :class:`Experiment` (imported on first use).
EXPERIMENTS: dict[str, str] = {
    "replay": "pacectl.experiment:ReplayExperiment",
    "torch": "pacectl.torchdist.experiment:TorchExperiment",
    "sim": "pacectl.experiment:SimExperiment",
}


def make_experiment(cfg: DictConfig) -> Experiment:
    """Build the :class:`Experiment` for ``cfg.backend.name``.

    Raises:
        ConfigError: unknown backend name.
    """
    name = str(cfg.backend.name)
    if name not in EXPERIMENTS:
        raise ConfigError(f"backend.name must be one of {sorted(EXPERIMENTS)}, got {name!r}")
    module, cls = EXPERIMENTS[name].split(":")
    if name == "torch" and importlib.util.find_spec("torch") is None:
        raise ConfigError(
            "backend=torch needs PyTorch, which is not installed: pip install torch (a CPU build is enough "
            "for the built-in gloo job; the build for your CUDA version from pytorch.org for GPUs), or "
            "pip install 'pacectl[torch]'; replay and sim need no torch"
        )
    if name == "sim" and cfg.get("cluster") is not None and cfg.cluster.get("jobs"):
        cls = "MultiJobSimExperiment"  # several jobs on one fabric (pacectl/backends/multijob.py)
    factory: Callable[[DictConfig], Experiment] = getattr(importlib.import_module(module), cls)
    return factory(cfg)
