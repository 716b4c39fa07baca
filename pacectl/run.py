"""``python -m pacectl.run``: replay a trace under no pacing and pacing controllers, side by side.

With no arguments it replays the shipped ByteDance AR trace (64 ranks, a known straggler) under
every controller family and under no pacing, prints a comparison table and writes, into the Hydra
run directory: ``summary.json``, ``iterations.parquet``, ``iteration_time.png``, ``spread.png`` and
``report.md``.

Examples::

    python -m pacectl.run                                   # shipped default, every controller
    python -m pacectl.run controller=pid controller.kp=0.8  # one controller vs no pacing
    python -m pacectl.run trace=st                          # the other shipped trace
    python -m pacectl.run trace=bytedance trace.path=T.parquet trace.meta=M.yaml
    python -m pacectl.run -m controller=threshold,pid       # Hydra multirun sweep
    python -m pacectl.run analysis=whatif                   # what do stragglers cost, who causes it
    python -m pacectl.run --help                            # every config group and key

The communication model is part of every result. Under the null model (``comm=null``) durations
are fixed, so pacing can only keep or lengthen iterations; any gain needs a timing-dependent model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pacectl import files, report
from pacectl.errors import ConfigError, PacectlError, one_line_warning

if TYPE_CHECKING:  # the rest is imported where it is used: the command starts its plot server first
    from omegaconf import DictConfig

    from pacectl import whatif
    from pacectl.experiment import Experiment
    from pacectl.types import Episode

BASELINE = "none"
#: (run, iteration, rank) rows above which writing iterations.parquet is announced with its cost.
LARGE_PARQUET_ROWS = 5_000_000
#: The memory model of a job's peak resident set (:func:`memory_needed`): an upper bound of the peak
#: RSS of whole ``backend=sim comm=contention cluster=paper_like`` commands at 1,024 to 65,536 ranks
#: and 250 to 16,000 iterations, fitted in experiments/bench/README.md (the records it names). The
#: base, bytes: the interpreter and its imports;
BASE_BYTES = 150_000_000
#: per cell of the one chunk of compute draws held at a time (``pacectl.fabric.noise.DRAW_CELLS``
#: cells at most), with its temporaries, bytes;
BYTES_PER_DRAW_CELL = 460
#: per rank (the fabric's, the controllers' and the runs' per-rank state), bytes;
BYTES_PER_RANK = 3_500
#: per (run, iteration, rank) row of ``iterations.parquet`` (the table is built in memory), bytes;
BYTES_PER_ROW = 200
#: per iteration, without ``iterations.parquet``, bytes: the runs stream one at a time, so what grows
#: with iterations is one run's per-iteration figures.
BYTES_PER_STREAMED_ITERATION = 1_000
#: the work (ranks x iterations, over all runs) from which a run whose stderr is no terminal prints
#: plain progress lines: about 5 s at the 5.0e6 rank-iterations per second of the bench record
#: sim_streamed_65536.json. Set by work, not by the clock, so that a small run stays silent.
PLAIN_PROGRESS_MIN_RANK_ITERATIONS = 25_000_000
#: console lines; Hydra's job logging (conf/hydra/job_logging/pacectl.yaml) also files them
log = logging.getLogger("pacectl.run")


def run_experiment(cfg: DictConfig, out_dir: Path, *, notes: Sequence[str] = ()) -> dict[str, Any]:
    """Run the experiment described by ``cfg`` and write its outputs into ``out_dir``.

    Args:
        cfg: the composed config (see ``conf/config.yaml``).
        out_dir: the run directory.
        notes: warnings found before the run (overrides it ignores), kept in ``summary["warnings"]``.

    Returns:
        The summary dict that was written to ``summary.json``
        (:meth:`pacectl.report.RunSummary.to_json`; its ``context`` the run's facts in words).

    Raises:
        PacectlError: bad trace, bad config value.
    """
    from pacectl import energy, metrics
    from pacectl.config import controller_families
    from pacectl.experiment import controller_notes, make_experiment

    t0 = time.perf_counter()
    _validate_once(cfg)
    with_parquet = bool(cfg.output.get("iterations", True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # once per place: a warning in a loop is listed once
        families = controller_families(cfg)
        experiment = make_experiment(cfg)
        # without iterations.parquet nothing needs the per-rank arrays: each run is reduced as it streams
        experiment.stream = not with_parquet
        warned, noted = controller_notes(experiment, families)
        for line in warned:  # phase on a job nothing else shares links with: say so, not a silent zero
            warnings.warn(line, UserWarning, stacklevel=1)
        # the set-up's warnings (a slow configuration, an ignored key) now, not after the runs
        for w in caught:
            log.warning(one_line_warning(w.message, w.category))
        shown = len(caught)
        per_run = experiment.iterations_per_run
        if not per_run:  # live: one job runs them all
            log.info(f"running {len(families)} run(s) ({', '.join(families)}) interleaved in one job")
        runs = run_names(families, experiment.actuators)
        episodes = {}
        # the bar counts the iterations of every run (no pacing, each controller) where the backend
        # reports them, else one step per run
        with (
            _describe(experiment) as describe,  # beside the runs
            _progress_bar(
                len(runs) * (per_run or 1),
                unit="iter" if per_run else "run",
                desc="iterations (all runs)" if per_run else "runs",
            ) as bar,
        ):
            # no terminal, no bar: a long run says how far it is in plain lines instead
            plain = PlainProgress.for_run(
                num_runs=len(runs), iterations_per_run=per_run, num_ranks=experiment.num_ranks
            )
            step = plain.step if bar.disable and plain is not None else bar.update
            for name, (family, actuator) in runs.items():
                bar.set_postfix_str(name)
                if plain is not None:
                    plain.run = name
                if len(runs) > len(families):  # backend.actuator=both
                    experiment.set_actuator(actuator)
                episodes[name] = experiment.run(
                    family, families[family], on_iteration=step if per_run else None
                )
                if not per_run:
                    bar.update()
                if len(episodes) == 1:  # every run has the first one's size: check before the rest
                    first = episodes[name]
                    _check_memory(first.num_ranks, first.num_iterations, len(runs), with_parquet)
                    _warn_if_degenerate(episodes[name])
            described = describe()
    # the outputs are staged from here on; the plots of the episodes start drawing at once, in the
    # background (report.plots_in_background), while the summary is computed and the rest written
    unit = "arbitrary s" if report.normalized_time(described) else "s"  # a normalised trace: no real time
    with files.staged_outputs(out_dir) as stage, report.plots_in_background() as draw:
        drawn = []  # the PNGs the plots write, for report.md's links
        if cfg.output.plots:  # the slowest first
            plots = {"spread": report.plot_spread, "iteration_time": report.plot_iteration_time}
            drawn = [report.PLOT_FILES[k] for k in plots]
            draw(
                *(
                    partial(plot, stage / report.PLOT_FILES[k], episodes, time_unit=unit)
                    for k, plot in plots.items()
                )
            )
        # what the run warned about stays with its results (dropped ranks or steps, guard interventions)
        warned_lines = list(dict.fromkeys([*notes, *(f"{w.category.__name__}: {w.message}" for w in caught)]))
        for w in caught[shown:]:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        summaries = {name: metrics.summarize(ep) for name, ep in episodes.items()}
        # batch means: sqrt(n) blocks, or a live run's interleave blocks (they share the machine's state)
        block, offset = experiment.paired_blocks
        for name, ep in episodes.items():
            if name == BASELINE:
                continue
            summaries[name]["throughput_change_ci95_frac"] = metrics.paired_change_ci95_frac(
                episodes[BASELINE], ep, block=block, offset=offset
            )
            base, jobs = episodes[BASELINE].domain_iteration_time_s, ep.domain_iteration_time_s
            if base is not None and jobs is not None:  # several jobs: each one's
                for d, job in enumerate(ep.domain_names):
                    ci = metrics.paired_jobs_ci95_frac(base[:, d], jobs[:, d], block=block, offset=offset)
                    summaries[name]["jobs"][str(job)]["throughput_change_ci95_frac"] = ci
        energy_top: dict[str, Any] = {}
        energy_vs: dict[str, dict[str, float]] = {}
        per_run_energy: dict[str, Any] = {}
        # modelled energy (replay, sim): every run, the bound, the spin-power range; live: as measured
        if experiment.power is not None:
            per_run_energy, energy_vs, energy_top = energy.energy_summary(
                episodes, experiment.power, baseline=BASELINE, block=block, offset=offset
            )
        elif (measure := experiment.measured_energy()) is not None:
            source, measured = measure
            ran = {n: v for n, v in measured.items() if n in episodes}
            per_run_energy, energy_vs, energy_top = energy.measured_summary(
                source, ran, baseline=BASELINE, block=block, offset=offset
            )
        for name, fields in per_run_energy.items():
            summaries[name].update(fields)
            for key in ("energy_change_ci95_frac", "oracle_bound_reached_frac"):  # for the tables
                if key in energy_vs.get(name, {}):
                    summaries[name][key] = energy_vs[name][key]
        n_iter = episodes[BASELINE].num_iterations
        line = interval_warning(
            n_iter, metrics.num_batches(n_iter, block=block, offset=offset), block, len(episodes)
        )
        if line:
            log.warning(f"warning: {line}")
            warned_lines.append(line)
        for line in noted:
            log.info(f"note: {line}")
        idle = never_paced_line(summaries, families, live=experiment.live)
        if idle:
            log.info(f"note: {idle}")
        records = experiment.record_folder(out_dir)
        summary = report.RunSummary(
            described=described,
            backend=experiment.backend_name,
            comm_model=experiment.comm_model,
            comm_description=experiment.comm_description,
            comm_timing_dependent=experiment.comm_timing_dependent,
            exchange={
                "lag_iters": experiment.exchange.lag,
                "every_iters": experiment.exchange.every,
                "source": "the live exchange, backend.pacing" if experiment.live else "modelled, exchange.*",
            },
            runs=summaries,
            vs_baseline={
                name: {
                    **metrics.compare(summaries[BASELINE], s),
                    "throughput_change_ci95_frac": s["throughput_change_ci95_frac"],
                    **energy_vs.get(name, {}),
                    **_job_changes(summaries[BASELINE], s),
                }
                for name, s in summaries.items()
                if name != BASELINE
            },
            energy=energy_top,
            actuators=experiment.actuators,
            controller_params=families,
            controller_file=cfg.get("controller_file"),
            cluster=cfg.cluster.get("name"),
            seed=int(cfg.seed),
            warnings=warned_lines,
            notes=noted,
            never_paced=idle,
            wall_time_s=time.perf_counter() - t0,
            records_dir=None if records is None else str(records),
            baseline=BASELINE,
        ).to_json()
        rows = sum(ep.arrival_s.size for ep in episodes.values())
        if with_parquet and rows > LARGE_PARQUET_ROWS:
            log.info(f"writing iterations.parquet ({rows:,} rows) and the other outputs ...")
        if cfg.output.plots and "energy_bound" in summary:
            drawn.append(report.PLOT_FILES["energy"])
            bound_j = summary["energy_bound"]["oracle_saving_j"]
            draw(partial(report.plot_energy, stage / drawn[-1], summaries, BASELINE, bound_j=bound_j))
        if with_parquet:
            report.write_iterations_parquet(stage / "iterations.parquet", episodes)
        if cfg.output.report:
            report.write_report_md(
                stage / "report.md",
                title=f"pacectl {experiment.backend_name}: {summary['trace']['name']}",
                summaries=summaries,
                context=summary["context"],
                plots=drawn,
            )
        experiment.write_outputs(stage)
        report.write_summary_json(stage / "summary.json", summary)
    return summary


def run_names(families: Mapping[str, Any], actuators: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """The runs of an experiment: run name -> (controller family, actuator).

    No pacing runs once (no delay, so no actuator matters); every other family once per actuator,
    named ``<family>`` with the first and ``<family>@<actuator>`` with the others
    (``backend.actuator=both``: ``pid`` and ``pid@clock``).
    """
    out: dict[str, tuple[str, str]] = {}
    for family in families:
        for i, actuator in enumerate(actuators[:1] if family == BASELINE else actuators):
            out[family if i == 0 else f"{family}@{actuator}"] = (family, actuator)
    return out


def interval_warning(n_iter: int, batches: int, block: int | None, num_runs: int) -> str:
    """What the throughput intervals rest on, when that is too little to read them ("" otherwise).

    Args:
        n_iter: iterations per run.
        batches: blocks of iterations the paired interval averages over (:func:`metrics.num_batches`).
        block: the live interleave block, or None (blocks of ``floor(sqrt(n))``).
        num_runs: runs compared (the baseline included); one run has no change to bound.
    """
    if num_runs < 2 or n_iter < 2:  # one iteration: _warn_if_degenerate says so
        return ""
    if batches < 2:
        of = f" of {block} (the live interleave block)" if block else ""
        return (
            f"no throughput interval: {n_iter} iterations make {batches} block(s){of}, and an "
            "interval needs 2 or more: the changes below are single samples, indistinguishable "
            "from noise; run more iterations"
        )
    if batches < 5:
        return (
            f"the throughput intervals rest on {batches} blocks of iterations (Student's t with "
            f"{batches - 1} degree(s) of freedom): wide; more iterations narrow them"
        )
    return ""


def never_paced_line(
    summaries: dict[str, dict[str, Any]], params: Mapping[str, Mapping[str, Any]], *, live: bool
) -> str:
    """The controllers that applied no delay at all in their run, and what that means ("" if none).

    Args:
        summaries: :func:`metrics.summarize` per run, the baseline's under :data:`BASELINE`.
        params: each controller's parameters (its ``on_threshold_s``, if positive, is named: the
            likeliest reason it never engaged).
        live: live runs (their differences from no pacing are then the machine's noise; in replay
            and simulation a controller that never paced reproduces no pacing exactly).
    """
    # a run whose ranks waited asleep (sleep_wait) changed how they wait, not when: not "never paced"
    idle = [
        n
        for n, s in summaries.items()
        if n != BASELINE and s["pacing_delay_total_s"] == 0.0 and not s.get("wait_asleep_frac")
    ]
    if not idle:
        return ""
    names = []
    for name in idle:
        on = params.get(name, {}).get("on_threshold_s")
        names.append(f"{name} (on_threshold_s={on})" if isinstance(on, int | float) and on > 0 else name)
    spread = summaries[BASELINE]["spread_median_s"]
    noise = "differences from no pacing are this machine's run-to-run noise"
    same = noise if live else "runs reproduce no pacing"
    line = (
        f"never paced (delay total 0): {', '.join(names)}; median arrival spread without pacing "
        f"{spread:.3g} s. Their {same}"
    )
    if any("on_threshold_s" in n for n in names):
        line += "; a lower on_threshold_s, or controller.units=iteration, lets a thresholded one engage"
    return line


def _warn_if_degenerate(episode: Episode) -> None:
    """Warn when nothing can be paced or measured: a pacing domain of one rank has no arrival spread
    (no controller ever delays it), and one iteration has no CV."""
    import numpy as np

    sizes = np.bincount(episode.domain_of_rank, minlength=len(episode.domain_names))
    if (sizes < 2).all():
        warnings.warn(
            f"every pacing domain has a single rank ({episode.num_ranks} rank(s) in "
            f"{len(episode.domain_names)} domain(s)): there is no arrival spread, so no controller can "
            "pace; a truncated trace, or backend.num_ranks / backend.nproc_per_node of 1?",
            UserWarning,
            stacklevel=2,
        )
    if episode.num_iterations < 2:
        warnings.warn(
            f"only {episode.num_iterations} iteration: its CV is 0 by definition and the throughput "
            "interval is undefined (a truncated trace, or backend.num_iterations too small?)",
            UserWarning,
            stacklevel=2,
        )


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (Linux), else None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_needed(ranks: int, iterations: int, runs: int, with_parquet: bool) -> int:
    """The estimated peak resident set of a job, bytes, by the model of :data:`BASE_BYTES` and the
    constants after it (O(ranks) without ``iterations.parquet``: the runs stream)."""
    from pacectl.fabric.noise import DRAW_CELLS

    grows = (
        runs * iterations * ranks * BYTES_PER_ROW
        if with_parquet
        else iterations * BYTES_PER_STREAMED_ITERATION
    )
    chunk = min(iterations * ranks, DRAW_CELLS) * BYTES_PER_DRAW_CELL
    return BASE_BYTES + chunk + ranks * BYTES_PER_RANK + grows


def resident_bytes() -> int:
    """This process's resident set now (``/proc/self/statm``, Linux), bytes; 0 where unknown."""
    import os

    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _check_memory(
    ranks: int, iterations: int, runs: int, with_parquet: bool, *, announce: bool = True
) -> None:
    """Stop if the whole job (``runs`` runs, no pacing and each controller, of ``ranks`` x
    ``iterations``; ``with_parquet``: with ``iterations.parquet``, a table of every run's rows) would
    not fit in memory: before a simulation starts (its size is in the config), else after the first
    run, before the others.

    Raises:
        ConfigError: the estimate (:func:`memory_needed`), less what this process holds already,
            exceeds the memory available now.
    """
    rows = runs * iterations * ranks
    need = memory_needed(ranks, iterations, runs, with_parquet)
    if announce and with_parquet and rows > LARGE_PARQUET_ROWS:
        log.info(
            f"iterations.parquet will hold {rows:,} rows (about {need / 1e9:.1f} GB in memory while it is "
            "built); output.iterations=false skips it"
        )
    free = available_memory_bytes()
    held = resident_bytes()
    if free is not None and need - held > free:
        without = memory_needed(ranks, iterations, runs, False)
        fix = (
            f"set output.iterations=false (then about {without / 1e9:.1f} GB: the summary, plots and report "
            "only), or "
            if with_parquet and without - held <= free
            else ""
        )
        raise ConfigError(
            f"this job would need about {need / 1e9:.1f} GB of memory ({runs} run(s) x {iterations:,} "
            f"iterations x {ranks:,} ranks), more than the {(free + held) / 1e9:.1f} GB available to it: {fix}"
            "run fewer iterations or ranks"
        )


class PlainProgress:
    """Progress of a long run as plain lines on stderr, where no bar can be drawn (stderr is no
    terminal: a log file, a pipe, CI): ``pacectl.run: 30% of the iterations (3,000 of 10,000; now:
    pid), 24 s``, at every tenth of the iterations of all runs. Printed, not logged,
    so the lines stay out of ``run.log`` and every other output.

    Args:
        total: the iterations of all runs.
        stream: where the lines go (default stderr).
        clock: seconds since an arbitrary origin (default :func:`time.perf_counter`; a test's clock).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> p = PlainProgress(20, stream=out, clock=lambda: 0.0)
        >>> p.run = "none"
        >>> for _ in range(4):
        ...     p.step()
        >>> print(out.getvalue(), end="")
        pacectl.run: 10% of the iterations (2 of 20; now: none), 0 s
        pacectl.run: 20% of the iterations (4 of 20; now: none), 0 s
    """

    def __init__(
        self, total: int, *, stream: Any = None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.total = int(total)
        self.done = 0
        self.run = ""
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._tenths = 0

    @classmethod
    def for_run(
        cls, *, num_runs: int, iterations_per_run: int | None, num_ranks: int
    ) -> PlainProgress | None:
        """A reporter for runs of that size when their work (ranks x iterations, all runs) reaches
        :data:`PLAIN_PROGRESS_MIN_RANK_ITERATIONS`; None for a shorter run (or one without an
        iteration count: live), which says nothing until its table."""
        total = num_runs * (iterations_per_run or 0)
        if not total or total * num_ranks < PLAIN_PROGRESS_MIN_RANK_ITERATIONS:
            return None
        return cls(total)

    def step(self) -> None:
        """One more iteration of the current run; a line when it completes another tenth."""
        self.done += 1
        tenths = 10 * self.done // self.total
        if tenths <= self._tenths:
            return
        self._tenths = tenths
        elapsed = self._clock() - self._start
        stream = sys.stderr if self._stream is None else self._stream
        with contextlib.suppress(OSError, ValueError):  # a closed stderr: the run goes on
            print(
                f"pacectl.run: {10 * tenths}% of the iterations ({self.done:,} of {self.total:,}; now: "
                f"{self.run}), {elapsed:.0f} s",
                file=stream,
                flush=True,
            )


@contextlib.contextmanager
def _progress_bar(total: int, *, unit: str, desc: str) -> Iterator[Any]:
    """A tqdm bar of ``total`` steps on stderr, drawn on a terminal only (tqdm's ``disable=None``);
    log lines while it is up go through ``tqdm.write``, so they do not break the bar."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    with (
        logging_redirect_tqdm(),
        tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, disable=None, leave=False) as bar,
    ):
        yield bar


@contextlib.contextmanager
def _describe(experiment: Experiment) -> Iterator[Callable[[], dict[str, Any]]]:
    """Yield a function that returns ``experiment.describe()``, with a line first when it has work
    to show (replay: the what-if replays of the stragglers' cost).

    That work runs in a forked child beside the runs (on a second core, where there is one) and
    the function waits for its result; the child's result is used only where it neither raised,
    warned nor logged, else this process computes it itself (its warnings then come after the
    runs'). Without a fork (:func:`pacectl.report.can_fork`) it runs here at once, with a progress
    bar on a terminal. The block reaps the child.
    """
    steps = experiment.describe_steps
    if not steps:
        described = dict(experiment.describe())
        yield lambda: described
        return
    log.info(
        f"stragglers' cost first (what-if, null model): {steps} replays of the trace "
        "(analysis.whatif=false skips it)"
    )
    if not report.can_fork():
        with _progress_bar(steps, unit="replay", desc="what-if") as bar:
            described = dict(experiment.describe(on_step=bar.update))
        yield lambda: described
        return
    child = report.Beside(lambda: dict(experiment.describe()))

    def child_or_here() -> dict[str, Any]:
        value = child.result()
        return dict(experiment.describe()) if value is None else value

    try:
        yield child_or_here
    finally:
        child.close()


def run_whatif(cfg: DictConfig, out_dir: Path) -> whatif.WhatIfResult:
    """Run the what-if analysis of ``cfg.trace``; write ``whatif.json``, the heatmap and the timeline.

    Raises:
        PacectlError: bad trace or config value.
    """
    from pacectl import whatif
    from pacectl.backends.replay import ReplayBackend
    from pacectl.config import load_trace

    _validate_once(cfg)
    backend = ReplayBackend(load_trace(cfg.trace), paced_optype=str(cfg.backend.paced_optype))
    step_index = int(cfg.analysis.get("timeline_step_index", 0))
    if not 0 <= step_index < backend.num_iterations:
        raise ConfigError(
            f"analysis.timeline_step_index must be in [0, {backend.num_iterations}), got {step_index}"
        )
    result = whatif.analyze(backend)
    with files.staged_outputs(out_dir) as stage, report.plots_in_background() as draw:
        if cfg.output.plots:  # drawn while the timeline is written
            draw(partial(whatif.plot_heatmap, stage / "whatif_heatmap.png", result))
        whatif.write_timeline(stage / "timeline.json", backend, step_index=step_index)
        files.atomic_write_text(stage / "whatif.json", json.dumps(result.to_json(), indent=2) + "\n")
    return result


def ignored_overrides(overrides: list[str], cfg: DictConfig) -> list[str]:
    """Command-line overrides that the chosen backend or analysis never reads, with the reason.

    Args:
        overrides: Hydra's task overrides (``HydraConfig.get().overrides.task``).
        cfg: the composed config.
    """
    backend = str(cfg.backend.get("name"))
    analysis = str(cfg.analysis.get("name"))
    out = []
    for o in overrides:
        full_key = o.lstrip("+~").split("=", 1)[0]
        key = full_key.split(".", 1)[0]
        if key == "trace" and backend != "replay":
            out.append(f"{o}: backend={backend} does not read a trace (only backend=replay does)")
        elif key in ("comm", "cluster") and backend == "torch":
            out.append(f"{o}: backend=torch runs on this machine's real fabric, not a modelled one")
        elif key in ("comm", "cluster", "controller", "controller_file", "guard") and analysis == "whatif":
            out.append(f"{o}: analysis=whatif replays under the null model with no controller")
        elif full_key == "analysis.whatif" and backend != "replay":
            out.append(f"{o}: backend={backend} has no recorded trace for the what-if analysis")
        elif key == "controller" and cfg.get("controller_file"):
            out.append(f"{o}: controller_file={cfg.controller_file} replaces the controller group")
    return out


def log_summary(summary: dict[str, Any], out_dir: Path) -> None:
    """Log the console lines of a finished run: the table, the run's context lines (those not
    printed as they happened: :data:`pacectl.report.PRINTED_LIVE`) and where the outputs are
    (:func:`pacectl.cli.run_job` also files them in ``run.log``)."""
    log.info(report.format_console_table(summary["runs"], baseline=BASELINE))
    for label, line in summary["context"]:
        if label not in report.PRINTED_LIVE:
            log.info(f"{label}: {line}")
    records = summary.get("records_dir")
    log.info(
        f"outputs: {out_dir}" + (f"; records (replay one with trace=<file>): {records}" if records else "")
    )


def run_job(cfg: DictConfig, out_dir: Path) -> None:
    """One ``pacectl.run`` job (see :func:`pacectl.cli.main`): the experiment (or the what-if
    analysis) of ``cfg``, its outputs into ``out_dir`` and its console lines.

    Raises:
        PacectlError: a user mistake (one line and exit status 2 from the entry point).
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import MissingMandatoryValue

    ignored = [
        f"override ignored: {line}" for line in ignored_overrides(list(HydraConfig.get().overrides.task), cfg)
    ]
    for line in ignored:
        log.warning(f"warning: {line}")
    earlier = [n for n in ("summary.json", "whatif.json") if (out_dir / n).is_file()]
    if earlier:  # a named hydra.run.dir used again
        log.warning(
            f"warning: {out_dir} holds an earlier run's outputs ({', '.join(earlier)}): when this run "
            "succeeds, the files it writes replace theirs of the same name, others stay (run.log is "
            "appended to); pick another hydra.run.dir (hydra.sweep.dir for -m) to keep them apart"
        )
    try:
        if cfg.analysis.name == "whatif":
            result = run_whatif(cfg, out_dir)
            _written.append(out_dir)
            log.info(f"what-if analysis of {result.trace} (comm model: null, {result.num_replays} replays)")
            log.info("\n".join(result.worst_offenders()))
            heatmap = " whatif_heatmap.png," if cfg.output.plots else ""
            log.info(f"outputs: {out_dir} (whatif.json,{heatmap} timeline.json for ui.perfetto.dev)")
            return
        summary = run_experiment(cfg, out_dir, notes=ignored)
    except MissingMandatoryValue as err:
        example = (
            "trace=canonical trace.path=<record.parquet>"
            if cfg.trace.get("format") == "canonical"
            else "trace=bytedance trace.path=<trace.parquet> trace.meta=<meta.yaml>"
        )
        raise ConfigError(f"config value {err.full_key} must be set, got '???'. Example: {example}") from err
    except OSError as err:
        raise PacectlError(f"could not write the outputs into {out_dir}: {err}") from err
    except MemoryError as err:
        raise PacectlError(
            f"out of memory ({err or 'MemoryError'}): run fewer ranks or iterations (backend.num_ranks, "
            "backend.num_iterations), or set output.iterations=false"
        ) from err
    _written.append(out_dir)  # complete from here on: a later Ctrl-C must not look like a failed run
    log_summary(summary, out_dir)


#: Run folders whose outputs are complete (a Ctrl-C after this, in the console summary, leaves them
#: as they are; :func:`main` says so).
_written: list[Path] = []


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``pacectl-run``): runs the command line ``argv`` (default: this
    process's) and returns the exit status: 0, 2 for a user mistake, 130 for Ctrl-C (SIGINT), 143
    for SIGTERM (:class:`_Stop`)."""
    _written.clear()
    commits = len(files.committed)
    args = list(sys.argv[1:] if argv is None else argv)
    stop = _Stop()
    try:
        with stop:
            # the plot server imports matplotlib beside this process's imports and work
            with report.plot_server(enabled=draws_plots(args)):
                from pacectl import cli
                from pacectl.config import CONF_DIR

                return cli.main("pacectl.run", CONF_DIR, "config", run_job, validate=_check_config, argv=argv)
    except KeyboardInterrupt:  # the job's folder is cleaned up; say what was written before
        multirun = any(a in ("-m", "--multirun") for a in args)
        word = "terminated (SIGTERM)" if stop.signum == signal.SIGTERM else "interrupted"
        written = _written or files.committed[commits:]  # a Ctrl-C held back until its outputs were in place
        if _written and multirun:
            said = (
                f"{word}; {len(_written)} sweep job(s) wrote complete outputs (the last: {_written[-1]}); "
                "a job cut short wrote none, and later jobs did not run"
            )
        elif written:
            said = f"{word} after the outputs were written; they are complete: {written[-1]}"
        else:
            said = f"{word}; no outputs were written"
        print(f"pacectl.run: {said}", file=sys.stderr)
        return 128 + (stop.signum or signal.SIGINT)


class _Stop:
    """Within the block, the first SIGINT or SIGTERM raises ``KeyboardInterrupt`` (SIGTERM is a
    Ctrl-C too: the run cleans up, says so in one line and exits 128 + 15); later ones are ignored,
    so that the clean-up they would cut short (the staging folder, the plot processes) runs to its
    end (``timeout -s INT`` signals the process and then its group: two signals at once). The
    handlers before are restored at the end. Outside the main thread it does nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.saved: dict[int, Any] = {}

    def _handler(self, signum: int, _frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            raise KeyboardInterrupt

    def __enter__(self) -> None:
        import threading

        if threading.current_thread() is threading.main_thread():
            self.saved = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *_: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def draws_plots(args: Sequence[str]) -> bool:
    """Whether the command line ``args`` is a plain run that draws plots: no flag (a sweep, ``--help``
    and the like go through Hydra) and no ``output.plots=false``. A guess from the text only: a wrong
    guess costs a plot server started for nothing, or plots forked from this process."""
    off = ("false", "0", "no", "off")
    return not any(
        a.startswith("-")
        or (a.lstrip("+").startswith("output.plots=") and a.partition("=")[2].lower() in off)
        for a in args
    )


def _job_changes(baseline: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``{"jobs": {job: throughput change and its interval}}`` for runs of several jobs on one fabric
    (a gain for one job next to the other job's figure), else ``{}``."""
    if "jobs" not in other or "jobs" not in baseline:
        return {}
    return {
        "jobs": {
            job: {
                "throughput_change_frac": s["throughput_it_per_s"]
                / baseline["jobs"][job]["throughput_it_per_s"]
                - 1.0,
                "throughput_change_ci95_frac": s.get("throughput_change_ci95_frac", float("nan")),
            }
            for job, s in other["jobs"].items()
        }
    }


#: The last config :func:`_check_config` passed (the command line's, checked before the run folder
#: exists): the job does not check the same config again (:func:`_validate_once`).
_checked: list[DictConfig] = []


def _validate_once(cfg: DictConfig) -> None:
    """:func:`pacectl.config.validate_run_config`, unless ``cfg`` equals the config that
    :func:`_check_config` passed for this command line (the checks are pure)."""
    from pacectl.config import validate_run_config

    if not (_checked and cfg == _checked[-1]):
        validate_run_config(cfg)


def _check_config(cfg: DictConfig) -> None:
    """What the job would refuse at once, checked before Hydra creates the run folder."""
    from pacectl.backends.sim import SimConfig
    from pacectl.checks import typed
    from pacectl.config import as_dict, controller_families, validate_run_config

    _checked.clear()
    validate_run_config(cfg)
    runs = len(controller_families(cfg))
    backend = cfg.get("backend")
    name = backend.get("name") if backend is not None else None
    if name == "torch":  # a -m sweep's every job, before the first one runs (torch is not imported)
        from pacectl.torchdist.core import torch_config

        torch_config(as_dict(backend))
    if name == "sim":  # the job's size is known up front
        spec = typed(SimConfig, backend)
        with_parquet = bool(cfg.output.get("iterations", True))
        _check_memory(spec.num_ranks, spec.num_iterations, runs, with_parquet, announce=False)
    _checked.append(cfg)


def exit_now(status: int) -> None:
    """End the process with ``status`` once a command is done, skipping the interpreter's teardown.

    The atexit handlers run (logging's flush among them) and stdout and stderr are flushed, then
    ``os._exit``: what is skipped is freeing every module and object one by one, with nothing left
    to write (every output is written and closed, atomically, before :func:`main` returns). Where
    another non-daemon thread still runs, it exits the usual way (``sys.exit``), which waits for it.
    """
    import atexit
    import os
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more can be said
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
