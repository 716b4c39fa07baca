"""The per-rank entry point: a built-in DDP workload with a straggler injector, paced by :class:`Pacer`.

Started by :func:`pacectl.torchdist.launch.launch_workers` through torch's elastic launcher, one
process per rank, with a plain-dict spec (the keys: :class:`~pacectl.torchdist.core.TorchConfig`).
Every controller run (:class:`LiveRun`) trains from the same seed, data and straggler schedule,
``warmup_iterations`` unpaced and unlogged then ``num_iterations``, the runs interleaved in blocks
(:func:`run_interleaved`), and rank 0 writes ``<record_dir>/<family>.parquet`` (the canonical trace
of every rank, replayable) and ``<record_dir>/<family>.episode.pkl`` (the
:class:`~pacectl.types.Episode` plus measurement extras).

``backend.parallel=fsdp2`` shards the model with FSDP2 instead (:func:`wrap_model`).
``backend.flight_recorder=true`` turns on PyTorch's Flight Recorder and gives each run its own
process group (description ``pacectl-<family>``), so that the dump tells the runs apart; every rank
writes its dump of the run, cut at the marker all-reduce that starts the measured iterations
(:meth:`LiveRun.write_flight_recorder`); ``python -m pacectl.run trace=<that folder>`` replays it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pickle
import signal
import socket
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from pacectl.errors import one_line_warnings
from pacectl.torchdist.core import (
    BUILTIN_DIST_BACKEND,
    FAULT_EXIT_CODE,
    DecisionEngine,
    ProbeSpec,
    StragglerSpec,
    common_periods,
    episode_from_log,
    is_peer_error,
    marks_to_ops,
    probe_schedule,
    rows_to_trace,
    shared_clock_marks,
    straggler_schedule,
)
from pacectl.torchdist.meters import make_meter
from pacectl.torchdist.pacer import Pacer

#: Flight Recorder ring size with ``backend.flight_recorder=true`` (entries; memory is used as filled).
FLIGHT_RECORDER_ENTRIES = 1_000_000
#: Seconds a rank that lost a peer waits before it fails (see :func:`worker_main`).
PEER_ERROR_EXIT_DELAY_S = 1.0


def build_model(workload: dict[str, Any]) -> tuple[nn.Module, torch.Tensor]:
    """The built-in model and one synthetic input batch (seeded by ``torch.manual_seed`` beforehand).

    Args:
        workload: ``model`` (``"mlp"``, ``"transformer"`` or ``"sleep"``), ``width``, ``depth``,
            ``batch_size``, ``seq_len`` (transformer), ``heads`` (transformer). ``"sleep"`` is
            compute emulated by a sleep (``compute_s`` per iteration, slept by :class:`LiveRun`
            before the forward): ``depth`` bias-free ``width x width`` linear layers, whose
            ``depth * width^2`` float32 gradients are the all-reduce, on ``batch_size`` rows (1 keeps
            the real compute negligible), so that a CPU carries little but the network stack.

    Returns:
        ``(model, input)``.
    """
    kind, width, depth = str(workload["model"]), int(workload["width"]), int(workload["depth"])
    batch = int(workload["batch_size"])
    if kind == "sleep":
        linears = [nn.Linear(width, width, bias=False) for _ in range(depth)]
        return nn.Sequential(*linears), torch.randn(batch, width)
    if kind == "mlp":
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers), torch.randn(batch, width)
    if kind == "transformer":
        layer = nn.TransformerEncoderLayer(
            d_model=width, nhead=int(workload.get("heads", 4)), dim_feedforward=4 * width, batch_first=True
        )
        encoder = nn.TransformerEncoder(layer, num_layers=depth, enable_nested_tensor=False)
        return encoder, torch.randn(batch, int(workload.get("seq_len", 32)), width)
    raise ValueError(f"workload.model must be 'mlp', 'transformer' or 'sleep', got {kind!r}")


def inject(duration_s: float, kind: str) -> None:
    """Straggle for ``duration_s``: ``sleep`` idles, ``burn`` spins the CPU."""
    if duration_s <= 0.0:
        return
    if kind == "sleep":
        time.sleep(duration_s)
        return
    deadline = time.perf_counter() + duration_s
    while time.perf_counter() < deadline:
        pass


class LiveRun:
    """One controller's episode on this rank: model, pacer, straggler schedule, and its record (the
    same seed, data and schedule in every run: module docstring).

    Args:
        spec: the worker spec (see :func:`worker_main`).
        family: controller family.
        params: its parameters.
    """

    def __init__(self, spec: dict[str, Any], family: str, params: dict[str, Any]) -> None:
        self.spec, self.family = spec, family
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.seed = int(spec["seed"])
        workload = spec["workload"]
        self.warmup, self.n_iter = int(workload["warmup_iterations"]), int(workload["num_iterations"])
        #: seconds slept per iteration in place of compute (``workload.model: sleep``), else 0
        self.sleep_compute_s = float(workload.get("compute_s", 0.0)) if workload["model"] == "sleep" else 0.0
        torch.manual_seed(self.seed)
        model, x = build_model(workload)
        torch.manual_seed(self.seed * 1009 + self.rank + 1)
        self.x = torch.randn_like(x)
        self.parallel = str(spec.get("parallel", "ddp"))
        self.recorder = bool(spec.get("flight_recorder", False))
        self.group = (
            dist.new_group(ranks=list(range(self.world)), group_desc=f"pacectl-{family}")
            if self.recorder
            else None
        )
        self.ddp = wrap_model(model, self.parallel, float(workload["bucket_cap_mb"]), self.group)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=float(workload.get("lr", 1e-3)))
        self.fr_first_id: int | None = None
        pacing = spec["pacing"]
        self.engine = DecisionEngine(family, params, spec["guard"], num_ranks=self.world, seed=self.seed)
        with warnings.catch_warnings():  # the launching process checked these settings and warned
            warnings.filterwarnings("ignore", message=r"Pacer\.")
            self.pacer = Pacer(
                self.engine,
                group=self.pacing_group(),
                spin_s=float(pacing["spin_s"]),
                gather_every=int(pacing["gather_every"]),
                gather=str(pacing.get("gather", "auto")),
                piggyback_max_bytes=pacing.get("piggyback_max_bytes"),
                # the no-pacing baseline never takes runtime control: it must stay unpaced
                control_path=None if family == "none" else pacing.get("control_path"),
                control_poll_iters=int(pacing["control_poll_iters"]),
            ).attach(self.ddp)
        self.straggler = StragglerSpec(**spec["straggler"])
        self.schedule = straggler_schedule(
            self.straggler, num_iterations=self.total, world_size=self.world, seed=self.seed
        )
        self.probes = probe_schedule(
            ProbeSpec(**dict(spec.get("probe") or {})),
            num_iterations=self.total,
            world_size=self.world,
            seed=self.seed,
            warmup_iterations=self.warmup,
        )
        self.probe_actual_s = np.zeros(self.total)
        self.fault = spec.get("fault") or {}
        # the built-in job runs gloo on CPU: the pacing delay is a sleep on the training thread (it
        # blocks backward too)
        self.host_paced = True
        self.engine.controller.enabled = False
        self.loop_s = np.zeros(self.total)
        # energy per iteration: NVML on a GPU (read-only), else the process's CPU time (the proxy)
        self.meter = make_meter("cpu")
        self.metered = np.zeros(self.total)
        self.k = 0

    def pacing_group(self) -> Any:
        """The process group the model communicates on (its pacing domain): the run's own with the
        Flight Recorder on, FSDP2's mesh group, else the world (None)."""
        if self.parallel == "fsdp2":
            return getattr(self.ddp, "pacectl_mesh").get_group()  # noqa: B009 - set by wrap_model
        return self.group

    @property
    def total(self) -> int:
        """Iterations of the run, warm-up included."""
        return self.warmup + self.n_iter

    def train(self, iterations: int) -> None:
        """Train the next ``iterations`` iterations (fewer at the end of the run)."""
        for k in range(self.k, min(self.k + iterations, self.total)):
            if k == self.warmup and self.recorder:
                # the Flight Recorder's marker: entries from the next one on are this run's measured
                # iterations, and the marker's end starts iteration 0's clock (align restarts it)
                self.pacer.flush()
                self.fr_first_id = last_flight_recorder_id() + 1
                self.pacer.align()
            t0 = time.perf_counter()
            m0 = self.meter.read_j()
            if k == self.warmup:
                self.pacer.flush()  # the warm-up's last figures: decided on (paced off), not logged
                self.pacer.reset_log()
                self.engine.controller.enabled = True
                self.engine.controller.reset(self.world, np.random.default_rng([self.seed, 0, 0]))
            if self.fault.get("rank") == self.rank and self.fault.get("iteration") == k - self.warmup:
                if self.fault.get("kind", "exit") == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)  # simulate a frozen rank (tests)
                os._exit(FAULT_EXIT_CODE)  # simulate a crashed rank (tests)
            self.opt.zero_grad(set_to_none=True)
            inject(float(self.schedule[k, self.rank]), self.straggler.kind)
            if self.sleep_compute_s > 0.0:
                time.sleep(self.sleep_compute_s)  # the emulated forward and backward
            loss = self.ddp(self.x).float().pow(2).mean()
            if self.probes[k, self.rank] > 0.0:
                t_probe = time.perf_counter()
                time.sleep(float(self.probes[k, self.rank]))
                self.probe_actual_s[k] = time.perf_counter() - t_probe
            loss.backward()
            self.opt.step()
            self.loop_s[k] = time.perf_counter() - t0
            self.metered[k] = self.meter.read_j() - m0
            self.k = k + 1

    def finish(self) -> dict[str, Any]:
        """Exchange the last figures and the marks (collectives: every rank), rank 0 writes the record.

        Returns:
            ``loop_s``, ``decisions`` (``float64[num_iterations, world]``, every rank's own copy),
            ``delay_actual_s``, ``gather_s``, ``metered`` (per iteration: GPU joules from NVML, or
            this process's CPU seconds, the proxy on CPU; ``meter_source`` says which) and, on rank 0,
            ``episode_path`` and ``record_path``.
        """
        pacer, family, world = self.pacer, self.family, self.world
        pacer.flush()  # the last figures still in flight (one collective, outside the timed loop)
        out: dict[str, Any] = {
            "loop_s": self.loop_s[self.warmup :],
            "decisions": np.array(pacer.decisions),
            "delay_actual_s": np.array(pacer.delay_actual_s[-self.n_iter :], dtype=np.float64),
            "gather_s": np.array(pacer.gather_s),
            "metered": self.metered[self.warmup :],
            "meter_source": self.meter.source,
        }
        if self.recorder:
            out["flight_recorder_path"] = self.write_flight_recorder()
        marks = pacer.marks
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, (host_clock_id(), marks, self.probe_actual_s[self.warmup :]))
        if self.rank == 0:
            record_dir = Path(self.spec["record_dir"])
            record_dir.mkdir(parents=True, exist_ok=True)
            # One period per iteration for every rank, in the record and the episode alike, so a
            # record replays against the iteration times the run reports (torchdist/__init__.py).
            all_marks = [m for _, m, _ in gathered]
            if len({clock for clock, _, _ in gathered}) == 1:
                all_marks, periods = shared_clock_marks(all_marks)
                clock = "host"
            else:
                periods = common_periods(all_marks)
                clock = "per-rank"
            rows = [
                row
                for r, rank_marks in enumerate(all_marks)
                for k, m in enumerate(rank_marks)
                for row in marks_to_ops(
                    step=k,
                    rank=r,
                    delay_blocks_compute=self.host_paced,
                    **{**m, "sync_exit_s": float(periods[k])},
                )
            ]
            record_path = record_dir / f"{family}.parquet"
            episode = episode_from_log(
                controller=family,
                comm_model=str(self.spec["comm_model"]),
                observations=pacer.observations,
                iteration_time_s=periods,
                diagnostics=pacer.diagnostics,
                decisions_before=[int(m.get("decisions_before", 0)) for m in marks],
                waits=pacer.waits,
            )
            extras = {
                "gather_s": out["gather_s"],
                "delay_actual_s": out["delay_actual_s"],
                "periods_s": periods,
                "clock": clock,
                "controls_applied": pacer.controls_applied,
                "controls_rejected": pacer.controls_rejected,
                # probe delays per measured iteration and rank (backend.probe): scheduled and slept
                "probe_s": self.probes[self.warmup :].copy(),
                "probe_actual_s": np.stack([a for _, _, a in gathered], axis=1),
            }
            try:
                from pacectl.traces.canonical import write_canonical

                trace = rows_to_trace(
                    rows,
                    world_size=world,
                    name=f"{self.spec.get('name', 'live')}-{family}",
                    source=str(Path(self.spec.get("final_record_dir", record_dir)) / f"{family}.parquet"),
                    pacing_blocks_compute=self.host_paced,
                    step_time_s=periods.tolist(),
                )
                write_canonical(trace, record_path)
                out["record_path"] = str(record_path)
            except Exception as err:  # noqa: BLE001 - a record failure must not lose the episode
                extras["record_error"] = f"{type(err).__name__}: {err}"
            episode_path = record_dir / f"{family}.episode.pkl"
            with open(episode_path, "wb") as fh:
                pickle.dump({"episode": episode, **extras}, fh)
            out["episode_path"] = str(episode_path)
        dist.barrier()
        return out

    def write_flight_recorder(self) -> str:
        """This rank's Flight Recorder dump of the run: its group's entries from the marker (the
        :meth:`~pacectl.torchdist.pacer.Pacer.align` after the warm-up, whose end is the record's
        iteration-0 start) on, pickled as ``_dump_fr_trace`` does, in
        ``<record_dir>/flight_recorder/<family>/fr_trace_rank_<rank>``."""
        name = self.pacing_group().group_name
        first = self.fr_first_id if self.fr_first_id is not None else 0
        # gloo marks an entry retired from its worker thread after the work has run, which can be
        # after the training thread saw the future complete (the importer would drop that step as
        # cut by the dump's end): wait, up to 5 s, until every entry of the run is finished.
        deadline = time.monotonic() + 5.0
        while True:
            dump = pickle.loads(c10d._dump_fr_trace(includeStackTraces=False))  # type: ignore[attr-defined]
            entries = [
                e for e in dump["entries"] if e["process_group"][0] == name and e["record_id"] >= first
            ]
            done = all(e.get("retired") or e.get("state") == "completed" for e in entries)
            if done or time.monotonic() > deadline:  # past it, the importer names what is unfinished
                break
            time.sleep(0.01)
        dump["entries"] = entries
        folder = Path(self.spec["record_dir"]) / "flight_recorder" / self.family
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"fr_trace_rank_{self.rank}"
        path.write_bytes(pickle.dumps(dump, protocol=2))
        return str(path)


def last_flight_recorder_id() -> int:
    """The ``record_id`` of the Flight Recorder's newest entry (-1 when it holds none)."""
    dump = pickle.loads(c10d._dump_fr_trace(includeStackTraces=False))  # type: ignore[attr-defined]
    return max((int(e["record_id"]) for e in dump.get("entries", [])), default=-1)


def wrap_model(model: nn.Module, parallel: str, bucket_cap_mb: float, group: Any) -> nn.Module:
    """The built-in model, data-parallel: DDP (``bucket_cap_mb`` buckets) or FSDP2 (``fully_shard``
    per layer, then the root, on a 1-D CPU mesh over ``group``'s ranks, FSDP2's default resharding
    after forward; the mesh is kept as ``model.pacectl_mesh``).

    Args:
        model: the model.
        parallel: ``"ddp"`` or ``"fsdp2"``.
        bucket_cap_mb: DDP's bucket size, MB (DDP only).
        group: the process group (None: the world).
    """
    if parallel == "ddp":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if group is None:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    else:
        mesh = DeviceMesh.from_group(group, "cpu", mesh_dim_names=("dp",))
    # one FSDP2 unit per layer: the transformer's encoder layers (MultiheadAttention uses its
    # out_proj weight without calling the module, so the Linears inside stay in their layer's unit)
    layers: list[nn.Module] = [m for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer)] or [
        m for m in model.modules() if isinstance(m, nn.Linear)
    ]
    # FSDP2's default resharding (every unit but the root reshards after forward): the pacer paces
    # the iteration's first collective, the forward's first all-gather (pacectl/torchdist/pacer.py)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.pacectl_mesh = mesh  # type: ignore[assignment]
    return model


def host_clock_id() -> str:
    """Identifies the clock behind ``time.perf_counter``: ranks with the same id can compare stamps.

    On Linux ``perf_counter`` is ``CLOCK_MONOTONIC``, one clock per kernel boot (containers on one
    host share it): the boot id, else the host name.
    """
    try:
        return "boot:" + Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "host:" + socket.gethostname()


def wait_at_gate(path: str | os.PathLike[str], key: str | None = None, *, timeout_s: float = 300.0) -> float:
    """A start gate: wait until the JSON file ``path`` exists, then until its start time.

    The file holds ``{"start_unix_s": t}`` or ``{"start_unix_s": {key: t, ...}}`` (one start per
    job), ``t`` in seconds of ``time.time()`` (every process on one host, network namespaces
    included, shares that clock). Every rank calls it; each polls the file itself, so no collective
    is needed and two jobs can be started a chosen offset apart (experiments/netns_fabric/two_jobs.py).

    Returns:
        the start time, seconds (``time.time()``).

    Raises:
        TimeoutError: the file did not appear within ``timeout_s``.
    """
    gate = Path(path)
    deadline = time.time() + timeout_s
    while not gate.exists():
        if time.time() > deadline:
            raise TimeoutError(f"start gate {gate} did not open within {timeout_s:g} s")
        time.sleep(0.01)
    start = json.loads(gate.read_text())["start_unix_s"]
    t = float(start[key] if isinstance(start, dict) else start)
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.05))
    return t


def run_interleaved(
    runs: list[LiveRun], block: int, on_progress: Callable[[int], None] | None = None
) -> None:
    """Train every run to its end, ``block`` iterations of each in turn (the order rotates per round).

    Interleaving spreads slow drift of a shared machine over every controller, as the benchmark does;
    ``block <= 0`` trains the runs one after the other. Each block starts with the pacer's
    :meth:`~pacectl.torchdist.pacer.Pacer.align` (one tiny all-reduce), so an iteration's clock never
    counts another run's block. ``on_progress`` gets the iterations done, all runs together, after
    every block (after every run when they are not interleaved): between blocks, so that its file
    write never lands inside a timed iteration (the next block's ``align`` restarts the clock).
    """
    done = on_progress or (lambda _: None)
    if block <= 0 or len(runs) == 1:
        for i, run in enumerate(runs):
            run.train(run.total)
            done(sum(r.total for r in runs[: i + 1]))
        return
    rnd = 0
    while any(run.k < run.total for run in runs):
        shift = rnd % len(runs)
        for run in runs[shift:] + runs[:shift]:
            if run.k < run.total:
                run.pacer.align()
                run.train(block)
                done(sum(r.k for r in runs))
        rnd += 1


def progress_writer(path: str | None) -> Callable[[int], None] | None:
    """Rank 0's progress report: the iterations done, written atomically to ``path`` (the launcher
    polls it for its progress bar); None when there is no path."""
    if not path:
        return None
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")

    def write(done: int) -> None:
        tmp.write_text(str(done))
        os.replace(tmp, target)

    return write


@record
def _exit_on_interrupt(signum: int, frame: Any) -> None:
    os._exit(128 + signum)


def announce_pid(spec: dict[str, Any]) -> None:
    """Write this rank's pid where the agent's frozen-rank watch reads it (``spec["pid_dir"]``)."""
    folder = spec.get("pid_dir")
    if folder:  # on OSError the watch sees nothing of this rank; the job still ends on pg_timeout_s
        with contextlib.suppress(OSError):
            Path(folder, os.environ.get("RANK", "0")).write_text(str(os.getpid()))


def worker_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Entry point of one rank: join the process group, run every requested controller, leave.

    Args:
        spec: plain-dict spec (``runs`` = list of ``[family, params]``, ``workload``,
            ``straggler``, ``guard``, ``pacing``, ``seed``, ``pg_timeout_s``, ``record_dir``,
            ``comm_model``, ``fault``, ``interleave_block``: iterations of each run in turn, 0 for
            one run after the other; ``start_gate``: a file for :func:`wait_at_gate`, or
            ``{"path", "key"}``, waited at before the first run trains).

    Returns:
        ``{family: LiveRun.finish()}`` for this rank.
    """
    # Ctrl-C in a terminal reaches every process of the group: a rank leaves at once and quietly (no
    # traceback from the middle of a collective; ignoring SIGINT would make the agent, which
    # forwards it, wait 30 s before it kills the ranks); the agent reports the interruption.
    signal.signal(signal.SIGINT, _exit_on_interrupt)
    one_line_warnings()
    announce_pid(spec)
    torch.set_num_threads(int(spec.get("threads", 1)))
    if spec.get("flight_recorder"):  # read by init_process_group; lazily filled up to this many entries
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(FLIGHT_RECORDER_ENTRIES))
    dist.init_process_group(
        backend=BUILTIN_DIST_BACKEND, timeout=timedelta(seconds=float(spec["pg_timeout_s"]))
    )
    runs: list[LiveRun] = []
    try:
        runs.extend(LiveRun(spec, str(family), dict(params)) for family, params in spec["runs"])
        report = progress_writer(spec.get("progress_path")) if dist.get_rank() == 0 else None
        gate = spec.get("start_gate")
        if gate:
            wait_at_gate(*(gate if isinstance(gate, str) else (gate["path"], gate.get("key"))))
        run_interleaved(runs, int(spec.get("interleave_block", 0)), report)
        return {run.family: run.finish() for run in runs}
    except Exception as err:
        if is_peer_error(str(err)):
            # A peer died: let the agent notice that rank's exit first (it is the root cause; a
            # fork-started job reports only the first exit it sees), then fail with this error.
            time.sleep(PEER_ERROR_EXIT_DELAY_S)
        # the finished frames of the traceback hold the runs (their DDP models) too: let them go
        # below, before the group (the printed traceback needs no local variables)
        traceback.clear_frames(err.__traceback__)
        raise
    finally:
        # Drop the DDP models before the process group: one still alive when its group is destroyed
        # is torn down at interpreter exit, where gloo's threads can abort the process ("terminate
        # called without an active exception", exit -6) after training has finished.
        runs.clear()
        gc.collect()
        dist.destroy_process_group()
