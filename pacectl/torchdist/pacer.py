"""The pacing layer: a DDP communication hook and a thin ``all_reduce`` wrapper. Model code is unchanged.

Per iteration, on every rank:

1. Before the first gradient bucket's collective (bucket index 0; DDP rebuilds its buckets after
   iteration 0, so bucket 0 of iteration 0 differs from later ones), apply this rank's pacing delay:
   - CPU/gloo: a sleep on the calling thread (for DDP on CPU the hook runs on the training thread,
     so the backward pass after bucket 0 waits too), finished by a short spin for precision;
   - CUDA/NCCL: a device-side wait, ``torch.cuda._sleep(cycles)`` on a side "pacing" stream that the
     collective is issued on; the host and the compute stream are not blocked.
   Then record ``enter``; the future's completion records ``exit``.
2. At the end of the gradient sync (an autograd-engine callback queued by the hook, before DDP's own
   finalisation), gather the per-rank figures :data:`~pacectl.torchdist.core.GATHER_FIELDS` with one
   tiny sum all-reduce of one-hot rows (an exact all-gather: every rank gets the bit-identical table).
   The ranks have just left the last bucket together, so this adds its latency but no waiting. Every
   rank then builds the same :class:`~pacectl.types.Observation` and runs the same guarded controller
   (:class:`~pacectl.torchdist.core.DecisionEngine`): identical decisions, nobody waits for one.
   ``gather_every = k`` gathers k iterations at once (cheaper, decisions k iterations stale).
3. Runtime control (switch off, retune) without restart: rank 0 polls a JSON file every
   ``control_poll_iters`` iterations (or takes :meth:`Pacer.request_control`) and publishes a version
   number in its gathered row; when the gathered version grows, every rank (same iteration) takes
   part in one ``broadcast_object_list`` of the new messages and applies them. See
   :func:`~pacectl.torchdist.core.validate_control` for the message.

A dead rank makes the next collective fail (gloo: closed connection) or time out after the process
group timeout; the exception leaves ``backward()`` and the launcher stops the job with that error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pacectl.torchdist.core import (
    NUM_GATHER_FIELDS,
    ControlWatcher,
    DecisionEngine,
    observation_from_table,
    one_hot_row,
)
from pacectl.types import Observation

now = time.perf_counter


def host_delay(delay_s: float, *, spin_s: float = 2e-4) -> float:
    """Block the calling thread for ``delay_s``: ``time.sleep`` then a spin over the last ``spin_s``.

    Args:
        delay_s: requested delay, seconds (<= 0: return at once).
        spin_s: final busy-wait, seconds (0: sleep only, which overshoots by the timer slack, ~0.06 ms).

    Returns:
        The delay actually spent, seconds (``perf_counter``).
    """
    t0 = now()
    if delay_s <= 0.0:
        return 0.0
    deadline = t0 + delay_s
    coarse = delay_s - spin_s
    if coarse > 0.0:
        time.sleep(coarse)
    while now() < deadline:
        pass
    return now() - t0


class DeviceDelay:
    """Device-side pacing on CUDA: ``torch.cuda._sleep`` on a side stream, calibrated to seconds.

    Usage: ``stream = dd.paced_stream(delay_s)``; issue the collective under
    ``torch.cuda.stream(stream)``. The stream first waits for the current stream (so the bucket's
    gradients are ready), then spins ``delay_s`` on the device. The host returns immediately.

    Args:
        device: the CUDA device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.cycles_per_s = self.calibrate()

    def calibrate(self, cycles: int = 20_000_000) -> float:
        """Clock cycles per second of ``torch.cuda._sleep``, measured with CUDA events."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(self.device):
            torch.cuda._sleep(1000)  # warm-up
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)

    def paced_stream(self, delay_s: float) -> torch.cuda.Stream:
        """The pacing stream, ordered after the current stream, with a device wait of ``delay_s`` queued."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        if delay_s > 0.0:
            with torch.cuda.stream(self.stream):
                torch.cuda._sleep(int(delay_s * self.cycles_per_s))
        return self.stream


class Pacer:
    """Pace the first gradient collective of every iteration and measure arrival skew (see module doc).

    Args:
        engine: the decision engine (guarded controller), identical on every rank.
        group: process group (default: the world, one pacing domain for pure DP).
        spin_s: busy-wait tail of the host delay, seconds.
        gather_every: gather the per-rank figures every this many iterations, >= 1.
        control_path: JSON file rank 0 watches for runtime control, or None.
        control_poll_iters: poll the file every this many iterations.
        device_delay: ``"auto"`` (device-side on CUDA tensors, host sleep otherwise), ``"host"``.

    Example:
        >>> # ddp = DistributedDataParallel(model); engine = DecisionEngine("threshold", {}, {}, ...)
        >>> # pacer = Pacer(engine).attach(ddp)   # training loop unchanged
    """

    def __init__(
        self,
        engine: DecisionEngine,
        *,
        group: Any = None,
        spin_s: float = 2e-4,
        gather_every: int = 1,
        control_path: str | Path | None = None,
        control_poll_iters: int = 10,
        device_delay: str = "auto",
    ) -> None:
        self.engine = engine
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.spin_s = float(spin_s)
        self.gather_every = max(1, int(gather_every))
        self.watcher = ControlWatcher(control_path) if control_path and self.rank == 0 else None
        self.control_poll_iters = max(1, int(control_poll_iters))
        self.device_delay_mode = device_delay
        self._device_delay: DeviceDelay | None = None
        self._controls: dict[int, dict[str, Any]] = {}
        self._published = 0
        self._pending_rows: list[list[float]] = []
        self.reset_log()
        self._next_delay = 0.0
        self._k = 0
        self._forward_end = float("nan")
        self._clear_iteration()
        self._iter_start = now()

    # ----------------------------------------------------------------------------------- set-up
    def attach(self, ddp: torch.nn.parallel.DistributedDataParallel) -> Pacer:
        """Register the comm hook and forward hook on a DDP model; align the iteration clock.

        Returns:
            self.
        """
        # Unannotated lambda: DDP checks annotations, which are strings under ``from __future__``.
        ddp.register_comm_hook(state=None, hook=lambda state, bucket: self._comm_hook(state, bucket))
        ddp.register_forward_hook(self._on_forward_end)
        self.align()
        return self

    def align(self) -> None:
        """One tiny all-reduce: every rank leaves it together; its exit starts iteration 0's clock."""
        buf = torch.zeros(1, dtype=torch.float64, device=self._device())
        dist.all_reduce(buf, group=self.group)
        self._iter_start = now()

    def reset_log(self) -> None:
        """Start a new episode's log (observations, decisions, marks); the engine is kept."""
        self.observations: list[Observation] = []
        self.decisions: list[np.ndarray] = []
        self.diagnostics: list[dict[str, float]] = []
        self.marks: list[dict[str, Any]] = []
        self.gather_s: list[float] = []
        self.delay_actual_s: list[float] = []

    def request_control(self, control: dict[str, Any]) -> None:
        """Rank 0: publish a runtime control message (applied by every rank at the next gather)."""
        if self.rank == 0:
            self._published += 1
            self._controls[self._published] = dict(control)

    def _device(self) -> torch.device:
        backend = dist.get_backend(self.group)
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def _clear_iteration(self) -> None:
        self._hook_call: list[float] = []
        self._hook_return: list[float] = []
        self._enter: list[float] = []
        self._exit: list[float] = []
        self._futures: list[torch.futures.Future[Any]] = []
        self._applied = 0.0
        self._cuda_events: list[tuple[Any, Any]] = []

    # ------------------------------------------------------------------------------- the hooks
    def _on_forward_end(self, module: Any, inputs: Any, output: Any) -> None:
        self._forward_end = now()

    def _comm_hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        t_call = now()
        buf = bucket.buffer()
        first = bucket.index() == 0
        if first:
            self._clear_iteration()
            torch.autograd.Variable._execution_engine.queue_callback(self._end_iteration)
        fut = self._launch(buf, t_call, first=first)
        return fut

    def _launch(
        self, buf: torch.Tensor, t_call: float, *, first: bool, average: bool = True
    ) -> torch.futures.Future[torch.Tensor]:
        """Apply the delay (first collective only), issue the all-reduce, timestamp enter and exit."""
        delay = self._next_delay if first else 0.0
        slot = len(self._enter)
        self._exit.append(float("nan"))
        if average:
            buf.div_(self.world_size)
        if buf.is_cuda and self.device_delay_mode == "auto":
            if self._device_delay is None:
                self._device_delay = DeviceDelay(buf.device)
            stream = self._device_delay.paced_stream(delay)
            enter_ev = torch.cuda.Event(enable_timing=True)
            exit_ev = torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                enter_ev.record(stream)
                buf.record_stream(stream)
                work = dist.all_reduce(buf, group=self.group, async_op=True)
            t_enter = now()
            if first:
                self._applied = delay
            self._cuda_events.append((enter_ev, exit_ev))

            def done_cuda(f: torch.futures.Future[Any]) -> torch.Tensor:
                exit_ev.record()
                return f.value()[0]

            fut = work.get_future().then(done_cuda)
        else:
            if first:
                self._applied = delay
                self.delay_actual_s.append(host_delay(delay, spin_s=self.spin_s))
            t_enter = now()
            work = dist.all_reduce(buf, group=self.group, async_op=True)

            def done(f: torch.futures.Future[Any]) -> torch.Tensor:
                self._exit[slot] = now()
                return f.value()[0]

            fut = work.get_future().then(done)
        self._hook_call.append(t_call)
        self._enter.append(t_enter)
        self._futures.append(fut)
        self._hook_return.append(now())
        return fut

    # ---------------------------------------------------------------------- end of the iteration
    def _end_iteration(self) -> None:
        """Wait for the buckets, gather the figures, decide the next delay (identically on every rank)."""
        for fut in self._futures:
            fut.wait()
        if self._cuda_events:
            # Device times: resolve the events (one host sync per iteration, at the gradient sync end).
            self._cuda_events[-1][1].synchronize()
            ref = self._enter[0]
            enter0_ev = self._cuda_events[0][0]
            for j, (enter_ev, exit_ev) in enumerate(self._cuda_events):
                self._exit[j] = ref + enter0_ev.elapsed_time(exit_ev) / 1e3
                self._enter[j] = ref + enter0_ev.elapsed_time(enter_ev) / 1e3
        t_end = now()
        start = self._iter_start
        k = self._k
        if self.watcher is not None and k % self.control_poll_iters == 0:
            control = self.watcher.poll()
            if control is not None:
                self.request_control(control)
        enter0 = self._enter[0] if self._enter else float("nan")
        exit0 = self._exit[0] if self._exit else float("nan")
        row = [enter0 - start, exit0 - enter0, self._applied, t_end - start, float(self._published)]
        self._pending_rows.append(row)
        if len(self._pending_rows) >= self.gather_every:
            self._gather_and_decide(k + 1 - len(self._pending_rows))
        t_exit = now()
        fwd = (
            self._forward_end - start
            if np.isfinite(self._forward_end)
            else (self._hook_call or [t_end])[0] - start
        )
        self.marks.append(
            {
                "forward_end_s": max(fwd, 0.0),
                "hook_call_s": [t - start for t in self._hook_call],
                "hook_return_s": [t - start for t in self._hook_return],
                "enter_s": [t - start for t in self._enter],
                "exit_s": [t - start for t in self._exit],
                "backward_end_s": t_end - start,
                "sync_exit_s": t_exit - start,
                "applied_delay_s": self._applied,
            }
        )
        self._forward_end = float("nan")
        self._iter_start = t_exit
        self._k += 1

    def _gather_and_decide(self, first_iteration: int) -> None:
        rows = self._pending_rows
        self._pending_rows = []
        buf = np.concatenate([one_hot_row(self.rank, self.world_size, r) for r in rows])
        tensor = torch.from_numpy(buf).to(self._device())
        t0 = now()
        dist.all_reduce(tensor, group=self.group)
        self.gather_s.append(now() - t0)
        tables = tensor.cpu().numpy().reshape(len(rows), self.world_size, NUM_GATHER_FIELDS)
        action = None
        for i, table in enumerate(tables):
            version = int(table[0, 4])
            if version > self.engine.version:
                self._apply_controls(version)
            obs = observation_from_table(first_iteration + i, table)
            action = self.engine.decide(obs)
            self.observations.append(obs)
            self.decisions.append(action.delay_s.copy())
            self.diagnostics.append(self.engine.diagnostics())
        if action is not None:
            self._next_delay = float(action.delay_s[self.rank])

    def _apply_controls(self, version: int) -> None:
        """Every rank, same iteration: receive rank 0's control messages up to ``version`` and apply them."""
        payload: list[Any] = [
            [(v, self._controls[v]) for v in range(self.engine.version + 1, version + 1)]
            if self.rank == 0
            else None
        ]
        dist.broadcast_object_list(payload, src=0, group=self.group)
        for v, control in payload[0]:
            self.engine.apply_control(control, v)


class PacedAllReduce:
    """A thin wrapper for loops that call ``torch.distributed.all_reduce`` themselves (no DDP).

    The first call of an iteration is paced; after ``collectives_per_iteration`` calls the iteration
    ends (gather, decide). Calls block like ``all_reduce(..., async_op=False)``.

    Args:
        pacer: the :class:`Pacer` (not attached to a DDP model).
        collectives_per_iteration: number of calls that make one iteration, >= 1.

    Example:
        >>> # all_reduce = PacedAllReduce(Pacer(engine))
        >>> # all_reduce(grad)          # instead of dist.all_reduce(grad)
    """

    def __init__(self, pacer: Pacer, *, collectives_per_iteration: int = 1) -> None:
        self.pacer = pacer
        self.collectives_per_iteration = max(1, int(collectives_per_iteration))
        self._count = 0
        pacer.align()

    def __call__(self, tensor: torch.Tensor, average: bool = False) -> None:
        """All-reduce ``tensor`` in place (sum; ``average=True`` divides by the world size first)."""
        pacer = self.pacer
        t_call = now()
        first = self._count == 0
        if first:
            pacer._clear_iteration()
        pacer._launch(tensor, t_call, first=first, average=average).wait()
        self._count += 1
        if self._count == self.collectives_per_iteration:
            self._count = 0
            pacer._end_iteration()


def make_pacer_factory(**kwargs: Any) -> Callable[[DecisionEngine], Pacer]:
    """A factory of :class:`Pacer` objects sharing ``kwargs``."""

    def build(engine: DecisionEngine) -> Pacer:
        return Pacer(engine, **kwargs)

    return build
