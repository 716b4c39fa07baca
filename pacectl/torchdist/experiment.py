"""``backend=torch``: run no pacing and the chosen controller(s) on live gloo ranks, record, replay-check.

:class:`TorchExperiment` is an :class:`~pacectl.experiment.Experiment`. It launches the job once and
runs every controller of the experiment in the same worker processes (:mod:`pacectl.torchdist.worker`);
:meth:`~TorchExperiment.describe` adds the replay-vs-live fidelity of every record.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import shutil
import sys
import tempfile
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from pacectl.config import as_dict, controller_families, decision_schedule, user_path
from pacectl.errors import BackendError, ConfigError
from pacectl.experiment import Experiment
from pacectl.files import folder_problem
from pacectl.metrics import interval_blocks
from pacectl.torchdist.core import BUILTIN_DIST_BACKEND, resolve_gather, torch_config
from pacectl.types import Episode


@contextmanager
def _progress_bar(path: Path, total: int, poll_s: float = 0.5) -> Iterator[None]:
    """A terminal progress bar over the live job's iterations (all runs), read from the count rank 0
    writes to ``path`` (:func:`pacectl.torchdist.worker.progress_writer`); shown on a terminal only."""
    from tqdm import tqdm

    stop = threading.Event()
    bar = tqdm(
        total=total,
        unit="iter",
        desc="live iterations (all runs)",
        file=sys.stderr,
        disable=None,
        leave=False,
    )

    def poll() -> None:
        while not stop.wait(poll_s):
            try:
                done = int(path.read_text())
            except (OSError, ValueError):  # not written yet
                continue
            bar.update(max(0, min(done, total) - bar.n))

    thread = threading.Thread(target=poll, name="pacectl-progress", daemon=True)
    if not bar.disable:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        bar.close()
        path.unlink(missing_ok=True)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@contextmanager
def watch_host_load(nproc: int, poll_s: float = 1.0) -> Iterator[None]:
    """Warn after the block if the host's 1-minute load average exceeded its usable cores meanwhile.

    The load average (``os.getloadavg``) counts runnable processes, this job's own ranks among
    them; above the number of usable cores some of them queue for a CPU, so a rank's iteration
    time includes a wait for a core that varies from iteration to iteration and run to run.
    Sampled every ``poll_s`` seconds on a daemon thread, and at the start and the end; not on
    platforms without it.

    Args:
        nproc: this job's ranks (named in the warning: they count in the load too).
        poll_s: sampling period, seconds.
    """
    if not hasattr(os, "getloadavg"):  # pragma: no cover - not Unix
        yield
        return
    peak = [os.getloadavg()[0]]
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(poll_s):
            peak.append(os.getloadavg()[0])

    thread = threading.Thread(target=poll, name="pacectl-load", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    peak.append(os.getloadavg()[0])
    cores = usable_cores()
    if max(peak) > cores:
        warnings.warn(
            f"the host's load average reached {max(peak):.1f} on {cores} usable cores during the live "
            f"run (its {nproc} ranks included): ranks waited for a CPU, so the timing figures (iteration "
            "times, throughput and overhead changes, their intervals) are unreliable; rerun on an idle "
            "host or with fewer ranks",
            UserWarning,
            stacklevel=3,
        )


class TorchExperiment(Experiment):
    """Live torch.distributed experiment (``backend=torch``, its keys: :class:`~pacectl.torchdist.core.TorchConfig`).

    Args:
        cfg: the composed config.

    Raises:
        ConfigError: a wrong or out-of-range ``backend.*`` value.

    Attributes:
        comm_model: ``backend.comm_model`` (default ``"live-gloo"``: the real fabric, timing-dependent).
        gather: the exchange ``backend.pacing.gather`` resolves to (``auto``: async on gloo).
        exchange: that exchange's lag (piggyback 2, async/collective 1) and ``gather_every``, as
            :class:`~pacectl.loop.ExchangeSchedule` (for the summary).
    """

    backend_name = "torch"
    live = True

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.settings = b = torch_config(as_dict(cfg.backend))  # before any rank starts
        self.nproc = b.nproc_per_node
        cpus = os.cpu_count() or 1
        if self.nproc > 2 * cpus:
            warnings.warn(
                f"backend.nproc_per_node={self.nproc} ranks on {cpus} CPUs: each rank gets a small share of "
                "a core, so the run is slow and its timings mostly measure CPU contention",
                UserWarning,
                stacklevel=2,
            )
        self.comm_model = b.comm_model
        self.comm_description = (
            f"{self.comm_model} (real collectives on this machine's fabric: durations depend on timing)"
        )
        self.comm_timing_dependent = True
        #: what sleep_wait changes live (pacectl/controllers/sleep_wait.py); a job-level shift can
        #: meet other traffic on a real fabric, so there is no job_shift_note
        self.sleep_wait_note = (
            "on CPU/gloo a waiting rank already sleeps (gloo's TCP pair blocks on epoll; a thread "
            "waiting on a gloo work blocks on a condition variable), so sleep_wait behaves as no "
            "pacing here: its difference from no pacing is this machine's run-to-run noise"
        )
        # the real exchange, whose lag (pacectl.torchdist.pacer) the summary states
        self.gather = resolve_gather(b.pacing.gather, BUILTIN_DIST_BACKEND)
        self.exchange = decision_schedule(cfg)  # the same schedule a forecast's auto horizon reads
        #: the live runs' interleave blocks as ``(block, offset)`` of
        #: :func:`~pacectl.metrics.paired_change_ci95_frac` (the warm-up opens the first block)
        self.paired_blocks = interval_blocks(b.interleave_block, b.warmup_iterations)
        self.families = controller_families(cfg)
        # Ranks write into a hidden partial folder beside the final one, removed at exit;
        # :meth:`write_outputs` moves the records into place only when the whole run succeeded.
        self.final_record_dir = Path(self._record_dir())
        if self.final_record_dir.exists() and not self.final_record_dir.is_dir():
            raise ConfigError(
                f"backend.record_dir must be a folder, but {self.final_record_dir} is a file; pick another path"
            )
        problem = folder_problem(self.final_record_dir.parent)  # before any rank starts
        if problem:
            raise ConfigError(
                f"backend.record_dir: cannot write the live records under {self.final_record_dir.parent} "
                f"({problem}). Pick a writable folder, e.g. backend.record_dir=/tmp/pacectl-records"
            )
        replaced = sorted(
            path.name
            for f in self.families
            for path in (self.final_record_dir / f"{f}.parquet", self.final_record_dir / f"{f}.episode.pkl")
            if path.exists()
        )
        if replaced:
            warnings.warn(
                f"backend.record_dir={self.final_record_dir} already holds {replaced}: this run replaces "
                "them when it succeeds (pick another backend.record_dir to keep them)",
                UserWarning,
                stacklevel=2,
            )
        self.record_dir = self.final_record_dir.with_name(
            f".{self.final_record_dir.name}.partial-{uuid.uuid4().hex[:8]}"
        )
        atexit.register(shutil.rmtree, self.record_dir, ignore_errors=True)
        self._episodes: dict[str, Episode] = {}
        self._extras: dict[str, dict[str, Any]] = {}
        self._decisions: dict[int, dict[str, Any]] = {}
        #: per run, what each rank measured per iteration (see :meth:`measured_energy`)
        self._metered: dict[str, np.ndarray] = {}
        self.meter_source = "cpu_time_proxy"

    def _record_dir(self) -> str:
        if self.settings.record_dir:
            return user_path(self.settings.record_dir)
        try:
            from hydra.core.hydra_config import HydraConfig

            return str(Path(HydraConfig.get().runtime.output_dir) / "records")
        except ValueError:  # not inside a Hydra app
            return tempfile.mkdtemp(prefix="pacectl-torch-")

    def spec(self, runs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """The plain-dict worker spec for ``runs`` (see :func:`pacectl.torchdist.worker.worker_main`)."""
        b = dataclasses.asdict(self.settings)
        workload = b["workload"] | {k: b[k] for k in ("num_iterations", "warmup_iterations")}
        keys = ("straggler", "probe", "pacing", "pg_timeout_s", "comm_model", "fault", "threads")
        return {
            "runs": [[family, params] for family, params in runs],
            "seed": int(self.cfg.seed),
            "name": f"live-{workload['model']}-w{self.nproc}",
            "workload": workload,
            "guard": OmegaConf.to_container(self.cfg.guard, resolve=True),
            "record_dir": str(self.record_dir),
            "final_record_dir": str(self.final_record_dir),  # where the records end up (their source)
            **{key: b[key] for key in (*keys, "interleave_block", "parallel", "flight_recorder")},
        }

    def _launch(self, runs: list[tuple[str, dict[str, Any]]]) -> None:
        from pacectl.torchdist.launch import launch_workers

        b = self.settings
        spec = self.spec(runs)
        total = len(runs) * (b.num_iterations + b.warmup_iterations)
        progress = self.record_dir.with_name(self.record_dir.name + ".progress")
        # the progress file is removed however the job ends
        with _progress_bar(progress, total), watch_host_load(self.nproc):
            results = launch_workers(
                {**spec, "progress_path": str(progress)},
                nproc_per_node=self.nproc,
                start_method=b.start_method,
                socket_ifname=b.socket_ifname,
            )
        for rank, per_family in results.items():
            self._decisions.setdefault(int(rank), {}).update(per_family)
        for family, _ in runs:  # every rank's meter ([iterations, ranks]) and rank 0's episode
            per_rank = [results[r][family] for r in sorted(results, key=int) if family in results[r]]
            if per_rank and all("metered" in x for x in per_rank):
                self._metered[family] = np.stack(
                    [np.asarray(x["metered"], np.float64) for x in per_rank], axis=1
                )
                self.meter_source = str(per_rank[0].get("meter_source", "cpu_time_proxy"))
            path = self.record_dir / f"{family}.episode.pkl"
            if not path.is_file():
                raise BackendError(f"torch backend: rank 0 wrote no episode for {family!r} (expected {path})")
            with open(path, "rb") as fh:
                data = pickle.load(fh)
            self._episodes[family] = data.pop("episode")
            self._extras[family] = data

    def _ensure(self) -> None:
        todo = [(f, p) for f, p in self.families.items() if f not in self._episodes]
        if todo:
            self._launch(todo)

    def describe(self, on_step: Callable[[], None] | None = None) -> dict[str, Any]:
        """``trace`` (the baseline's record), ``workload``, ``records``, ``fidelity`` and measured costs.

        Launches the job on first use (every controller run happens here, once; its progress is the
        ranks' own, so ``on_step`` is unused).
        """
        self._ensure()
        spec = self.spec(list(self.families.items()))
        out: dict[str, Any] = {
            "trace": {
                "name": spec["name"],
                "path": str(self.final_record_dir / "none.parquet"),
                "format": "torch-live",  # as a replay of the record names it (canonical Parquet)
                "world_size": self.nproc,
                "dp_size": self.nproc,
                "pp_size": 1,
                "tp_size": 1,
                "num_steps": self.settings.num_iterations,
                "time_unit": "s",
            },
            "paced_optype": "grads-reduce-scatter",
            "paced_collective": (
                "FSDP2's first collective of each iteration, the forward's first all-gather (the "
                "Pacer's fsdp2_paced='forward'; recorded under canonical op type grads-reduce-scatter)"
                if spec["parallel"] == "fsdp2"
                else "DDP gradient all-reduce, bucket 0 (canonical op type grads-reduce-scatter)"
            ),
            "workload": {**spec["workload"], "parallel": spec["parallel"]},
            "straggler": spec["straggler"],
            "probe": spec["probe"],
            "pacing": {**spec["pacing"], "gather_resolved": self.gather},
            "records": {f: str(self.final_record_dir / f"{f}.parquet") for f in self.families},
        }
        if spec["flight_recorder"]:  # replay with: python -m pacectl.run trace=<folder>
            out["flight_recorder"] = {
                f: str(self.final_record_dir / "flight_recorder" / f) for f in self.families
            }
        fidelity = {f: fid for f in self.families if (fid := self.fidelity(f)) is not None}
        if "none" in fidelity:
            out["fidelity"] = {**fidelity["none"], "by_run": fidelity}
        out["measured"] = {
            f: {
                "gather_median_s": float(np.median(x["gather_s"])) if len(x["gather_s"]) else float("nan"),
                "delay_error_median_s": _delay_error(x, self._episodes[f]),
                "runtime_controls": list(x.get("controls_applied", [])),
                "runtime_controls_rejected": list(x.get("controls_rejected", [])),
            }
            for f, x in self._extras.items()
        }
        block = self.settings.interleave_block
        interval = (
            "the throughput-change interval is computed on the paired differences' means over the "
            + ("interleave blocks" if block > 1 else "blocks of sqrt(n) iterations")
            + " (batch means, Student's t)"
        )
        how = (
            f"interleaved in blocks of {block} iterations (drift spreads over every run); {interval}"
            if block > 0
            else f"one after the other (backend.interleave_block=0: drift between runs is not covered); {interval}"
        )
        out["note"] = (
            f"live runs: no pacing and each controller are trained in the same job, on the same seed and "
            f"straggler schedule, {how} (on a shared machine plain DDP's per-run medians drift by up to ~10 %)"
        )
        return out

    def fidelity(self, family: str) -> dict[str, Any] | None:
        """Replay-vs-live fidelity of one run's record (plus, for a paced run, the zero-delay counterfactual
        against the live no-pacing run on the same schedule). None if the record is missing."""
        from pacectl.torchdist.core import counterfactual_error, replay_fidelity
        from pacectl.traces.canonical import load_canonical

        path = self.record_dir / f"{family}.parquet"
        if not path.is_file():
            return None
        trace = load_canonical(path)
        kept = np.unique(trace.ops["step"].to_numpy())  # steps of the common bucket layout
        live = self._episodes[family].iteration_time_s if family in self._episodes else None
        clock = self._extras.get(family, {}).get("clock", "per-rank")
        periods = (
            "the common exits of the last gradient bucket, on the host clock the ranks share"
            if clock == "host"
            else "the mean of the ranks' own periods"
        )
        fid: dict[str, Any] = {
            "compares": f"each live record replayed with its recorded pacing delays against the live "
            f"iteration times ({periods})",
            **replay_fidelity(trace, None if live is None else live[kept]),
        }
        if family != "none" and "none" in self._episodes:
            base = self._episodes["none"].iteration_time_s
            fid["counterfactual_vs_live_none"] = counterfactual_error(
                trace, base[kept], None if live is None else live[kept]
            )
        return fid

    def run(
        self, family: str, params: dict[str, Any], *, on_iteration: Callable[[], None] | None = None
    ) -> Episode:
        """The episode of the guarded ``family`` controller (launches the job if not done yet).

        ``on_iteration`` is not called: the ranks run every run interleaved in one job, in their own
        processes; the job's own progress bar follows what rank 0 reports (:func:`_progress_bar`).
        """
        if family not in self._episodes or self.families.get(family) != params:
            self.families[family] = dict(params)
            self._launch([(family, dict(params))])
        return self._episodes[family]

    def record_folder(self, out_dir: Path) -> Path:
        """Where the records are (``backend.record_dir``; by default ``<run dir>/records``)."""
        return self.final_record_dir

    def write_outputs(self, stage: Path) -> None:
        """Move the records into ``final_record_dir`` (called by the run once every output is ready).

        ``stage`` (the run's staging folder) is not used: records live in their own folder.
        """
        if not self.record_dir.is_dir():
            return
        self.final_record_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.record_dir.iterdir()):
            target = self.final_record_dir / path.name
            if path.is_dir() and target.is_dir():  # an earlier run's flight_recorder/ folder
                shutil.rmtree(target)
            os.replace(path, target)
        self.record_dir.rmdir()

    def measured_energy(self) -> tuple[str, dict[str, np.ndarray]]:
        """What the ranks measured per iteration, per run: ``(source, run -> float64[iterations,
        ranks])``, GPU joules (``"nvml"``) or each rank's CPU seconds (``"cpu_time_proxy"``)."""
        self._ensure()
        return self.meter_source, dict(self._metered)

    def decisions(self) -> dict[int, dict[str, Any]]:
        """Per rank, per family: what every rank decided (``decisions``), for the identical-decision check."""
        return self._decisions


def _delay_error(extras: dict[str, Any], ep: Episode) -> float:
    actual = np.asarray(extras.get("delay_actual_s", []), dtype=np.float64)
    requested = ep.applied_delay_s[: len(actual), 0]
    mask = requested > 0
    return float(np.median(actual[mask] - requested[mask])) if mask.any() else float("nan")
