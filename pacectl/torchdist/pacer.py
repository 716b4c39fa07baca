"""The pacing layer: a DDP communication hook, FSDP2's custom collectives and a thin ``all_reduce``
wrapper. Model code is unchanged.

Per iteration, on every rank:

1. Before the iteration's first collective (DDP: gradient bucket 0; DDP rebuilds its buckets after
   iteration 0, so bucket 0 of iteration 0 differs from later ones), apply this rank's delay:
   - CPU/gloo: a sleep on the calling thread, finished by a short spin for precision (for DDP on
     CPU the hook runs on the training thread, so the backward pass after bucket 0 waits too);
   - CUDA/NCCL: ``torch.cuda._sleep(cycles)`` on a side "pacing" stream that the collective is
     issued on (:class:`DeviceDelay`); the host and the compute stream are not blocked.
   Then record ``enter``; the future's completion records ``exit``. On CUDA both are device events
   timed from an event marking the iteration start, so the arrival includes the device-side delay
   as it includes the host delay on CPU.
2. Exchange the per-rank figures :data:`~pacectl.torchdist.core.GATHER_FIELDS` as one-hot rows
   (:func:`~pacectl.torchdist.core.one_hot_row`): a sum all-reduce of them is an exact all-gather,
   so every rank gets the bit-identical table. Three modes (``gather=``; ``"auto"`` is ``"async"``
   on gloo and ``"piggyback"`` on NCCL, :func:`~pacectl.torchdist.core.resolve_gather` says why;
   their costs: ``experiments/bench/README.md``):

   - ``"async"``: at the end of the gradient sync of iteration ``k`` (an autograd-engine callback
     queued by the hook, before DDP's own finalisation) one tiny sum all-reduce of the rows is
     issued *without waiting for it*. Every rank has just left the last bucket, so nobody waits in
     it: it completes during the optimizer step and the forward pass of ``k + 1`` (on CPU its
     completion callback decodes and decides on the communication thread), and bucket 0 of
     ``k + 1`` only checks that it is done. Decisions one iteration stale; no gradient bytes copied.
   - ``"piggyback"``: the rows ride on the *carrier*, the smallest bucket (in bytes) of the
     previous iteration's layout, the same on every rank (bucket 0 in iteration 1; bucket 0 often
     holds an output layer, a language model's largest tensor): its hook in ``k + 1`` all-reduces
     ``cat([bucket * (1 / world), rows of k])`` and returns a view of the gradient part. On CPU the
     completion callback decodes and decides while the backward pass goes on; on CUDA the rows are
     staged to the host without a sync and decoded at the first bucket of ``k + 2``
     (``cuda_resolve``). No extra collective, one copy of the carrier (with ``piggyback_max_bytes``
     a larger carrier is not copied: the rows go in a tiny all-reduce issued beside it). Decisions
     two iterations stale: the observation of ``k`` is decided on during ``k + 1`` and paces
     ``k + 2``. Float32 buckets carry each float64 figure as a (hi, lo) float32 pair
     (:func:`encode_rows`), float64 buckets as is; other dtypes (fp16/bf16) fall back to
     ``"collective"`` with a warning, on every rank at the same iteration.
   - ``"collective"``: the tiny all-reduce of ``"async"``, blocking, decided on at once on the
     training thread: one round trip on the critical path. Decisions one iteration stale.

   Every rank then builds the same :class:`~pacectl.types.Observation` and runs the same guarded
   controller (:class:`~pacectl.torchdist.core.DecisionEngine`): identical decisions, nobody waits
   for one. ``gather_every = k`` exchanges k iterations at once. Rows not yet exchanged at the end
   of an episode are exchanged by :meth:`Pacer.flush` (a collective: every rank calls it).
3. Runtime control (switch off, retune) without restart: rank 0 polls a JSON file every
   ``control_poll_iters`` iterations (or takes :meth:`Pacer.request_control`) and publishes a version
   number in its row; when the exchanged version grows, every rank (same iteration, same table) takes
   part in one ``broadcast_object_list`` of the new messages and applies them on the training thread
   (collectives are issued from it only, in the same order on every rank). The message:
   :func:`~pacectl.torchdist.core.validate_control`.

FSDP2 (``fully_shard``): :meth:`Pacer.attach` installs :class:`PacedReduceScatter` and
:class:`PacedAllGather` on every sharded module. Every collective is a sync point in FSDP2, and the
early rank waits in the first one after a straggle, so where to pace is a choice (``fsdp2_paced``):
``"forward"`` (default), the forward's first all-gather (FSDP2 reshards after backward, so every
forward begins with one), where a straggle before forward (data loading) shows; ``"backward"``, the
backward's first collective (with FSDP2's default ``reshard_after_forward`` an all-gather, else the
first gradient reduce-scatter), where a straggle between forward and backward shows. Asynchronous
all-gathers (``unshard_async_op``) and forwards under ``no_grad`` pass through unpaced and
unrecorded; every other collective is one slot of the iteration's marks, the paced one first
(``tests/test_torchdist_groups.py`` checks both choices and both resharding settings). The backward
ends the iteration; the pacer's group must be the one FSDP2 shards on. On CUDA the delay goes on the
stream the paced collective is issued on; that path has not run on a GPU yet.

A dead rank makes the next collective fail (gloo: closed connection) or time out after the process
group timeout; the exception leaves ``backward()`` and the launcher stops the job with that error.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist

from pacectl.controllers import PacingGuardWarning
from pacectl.errors import ConfigError
from pacectl.torchdist.core import (
    COLUMN,
    NUM_GATHER_FIELDS,
    ControlWatcher,
    DecisionEngine,
    PacingConfig,
    check_pacing,
    exchange_lag,
    gather_row,
    observation_from_table,
    one_hot_row,
    resolve_gather,
)
from pacectl.types import Observation

now = time.perf_counter
_VERSION = COLUMN["control_version"]


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
    coarse = delay_s - max(spin_s, 0.0)
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
        from pacectl.torchdist.meters import CycleClock, nvml_sm_clock_reader

        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        #: an event on the pacing stream just before the last non-zero wait queued (else None)
        self.last_sleep_start: Any = None
        #: the cycles of that wait (for :meth:`observe`)
        self.last_cycles = 0
        #: cycles per second of each calibration repeat (their spread shows clock drift)
        self.calibration_rates: list[float] = []
        #: the SM clock read (NVML, read-only) while each calibration repeat ran, MHz
        self.calibration_clocks_mhz: list[float] = []
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._read_clock = nvml_sm_clock_reader(int(index))
        rate = self.calibrate()
        reference = float(np.median(self.calibration_clocks_mhz)) if self.calibration_clocks_mhz else None
        #: seconds to cycles at the clock in force (read before each wait, recalibrated from each
        #: measured wait: ``_sleep`` counts SM cycles, so a clock change would stretch a fixed count)
        self.clock = CycleClock(rate, read_clock_mhz=self._read_clock, reference_mhz=reference)

    @property
    def cycles_per_s(self) -> float:
        """``_sleep`` cycles per second at the clock last read (the calibration's until then)."""
        return self.clock.cycles_per_s

    def calibrate(self, cycles: int = 20_000_000, repeats: int = 5) -> float:
        """Clock cycles per second of ``torch.cuda._sleep``: the median of ``repeats`` CUDA-event timings.

        ``_sleep`` counts SM clock cycles, so a first, untimed sleep of the same length lets the
        clock leave its idle state before anything is timed (about 10 ms per sleep on an H200).
        While each timed sleep runs, the SM clock is read through NVML when it can be (read-only).
        """
        rates, clocks = [], []
        with torch.cuda.device(self.device):
            torch.cuda._sleep(cycles)  # warm-up: the SM clock ramps up from idle
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(cycles)
                end.record()
                if self._read_clock is not None:
                    try:
                        clocks.append(float(self._read_clock()))  # the sleep runs: its clock
                    except Exception:  # noqa: BLE001 - no reading: the feedback alone follows the clock
                        pass
                end.synchronize()
                rates.append(cycles / (start.elapsed_time(end) / 1e3))
        self.calibration_rates = rates
        self.calibration_clocks_mhz = clocks
        return float(np.median(rates))

    def sleep_on(self, stream: torch.cuda.Stream, delay_s: float) -> Any:
        """Queue a device-side wait of ``delay_s`` on ``stream`` (FSDP2's reduce-scatter stream).

        Returns:
            An event recorded on ``stream`` just before the wait (None when ``delay_s <= 0``).
        """
        if delay_s <= 0.0:
            return None
        with torch.cuda.stream(stream):
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(stream)
            torch.cuda._sleep(int(delay_s * self.cycles_per_s))
        return ev

    def paced_stream(self, delay_s: float) -> torch.cuda.Stream:
        """The pacing stream, ordered after the current stream, with a device wait of ``delay_s`` queued."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        self.last_sleep_start = None
        self.last_cycles = 0
        if delay_s > 0.0:
            with torch.cuda.stream(self.stream):
                self.last_sleep_start = torch.cuda.Event(enable_timing=True)
                self.last_sleep_start.record(self.stream)
                self.last_cycles = self.clock.cycles(delay_s)
                torch.cuda._sleep(self.last_cycles)
        return self.stream

    def observe(self, cycles: int, measured_s: float) -> None:
        """Recalibrate from a wait of ``cycles`` cycles measured at ``measured_s`` seconds (CUDA events)."""
        self.clock.observe(cycles, measured_s)


_PIGGYBACK_DTYPES = (torch.float32, torch.float64)
#: Where an FSDP2 model is paced (see :class:`Pacer`).
FSDP2_PACED = ("forward", "backward")
#: When a CUDA iteration's device times are read and its figures exchanged (see :class:`Pacer`).
CUDA_RESOLVE = ("next_iteration", "iteration_end")


@dataclass(kw_only=True)
class _PacerSettings(PacingConfig):
    """A :class:`Pacer`'s keyword arguments, checked as ``backend.pacing`` is; errors name ``Pacer.<key>``."""

    section: ClassVar[str] = "Pacer"


def _rows_to(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor of exchange rows on ``device``. On CUDA through pinned memory, non-blocking: a
    copy from pageable memory synchronizes the host with the current stream (here: with the
    backward pass queued so far)."""
    if device.type != "cuda":
        return rows
    return rows.pin_memory().to(device, non_blocking=True)


@dataclass
class _ClosedIteration:
    """One iteration's stamps, taken when its gradient sync ended on the host (:meth:`Pacer._end_iteration`).

    Host times are ``perf_counter`` seconds. On CUDA ``enter``/``exit`` hold host placeholders until
    :meth:`Pacer._complete` resolves ``cuda_events`` (device times from ``start_ev``), and
    ``end_ev`` marks the end of the gradient sync on the device (also the next iteration's start).
    """

    k: int
    start: float
    start_ev: Any
    forward_end: float
    hook_call: list[float]
    hook_return: list[float]
    enter: list[float]
    exit: list[float]
    cuda_events: list[tuple[Any, Any]]
    end_ev: Any
    sizes: list[int]
    applied: float
    decided_before: int
    t_end: float
    #: CUDA: an event just before the device-side wait of a non-zero delay (its length: to enter 0)
    sleep_ev: Any = None
    #: CUDA: the ``_sleep`` cycles of that wait
    sleep_cycles: int = 0
    #: host time the next iteration started, when the completion was left for later
    t_exit: float | None = None


def encode_rows(rows: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Float64 one-hot rows as a tensor of the bucket's dtype, exact under a sum with zeros.

    Args:
        rows: ``float64[n]`` (concatenated :func:`~pacectl.torchdist.core.one_hot_row` buffers).
        dtype: ``torch.float64`` (carried as is) or ``torch.float32`` (each value as a ``(hi, lo)``
            pair, ``hi = float32(x)``, ``lo = float32(x - hi)``: about 48 significant bits).

    Returns:
        A CPU tensor: ``n`` values for float64, ``2 n`` for float32 (all hi, then all lo).
    """
    rows = np.asarray(rows, dtype=np.float64)
    if dtype == torch.float64:
        return torch.from_numpy(rows.copy())
    with np.errstate(invalid="ignore", over="ignore"):
        hi = rows.astype(np.float32)
        lo = (rows - hi.astype(np.float64)).astype(np.float32)
    return torch.from_numpy(np.concatenate([hi, lo]))


def decode_rows(values: torch.Tensor) -> np.ndarray:
    """Inverse of :func:`encode_rows` (after the sum all-reduce): ``float64[n]``."""
    arr = values.detach().cpu().numpy()
    if arr.dtype == np.float64:
        return arr.astype(np.float64, copy=True)
    half = arr.size // 2
    with np.errstate(invalid="ignore"):
        return arr[:half].astype(np.float64) + arr[half:].astype(np.float64)


def _gradient_part(combined: torch.Tensor, buf: torch.Tensor, in_place: bool) -> torch.Tensor:
    """The gradients of a piggybacked all-reduce: a view of ``combined``, or copied into ``buf``."""
    grads = combined[: buf.numel()].view(buf.shape)
    if in_place:
        buf.copy_(grads)
        return buf
    return grads


class Pacer:
    """Pace the first gradient collective of every iteration and measure arrival skew (see module doc).

    Args:
        engine: the decision engine (guarded controller), identical on every rank.
        group: process group (default: the world, one pacing domain for pure DP).
        spin_s: busy-wait tail of the host delay, seconds.
        gather_every: exchange the per-rank figures every this many iterations, >= 1.
        gather: ``"auto"`` (default), ``"piggyback"``, ``"async"`` or ``"collective"`` (see the module
            doc); :attr:`gather` holds the resolved mode.
        control_path: JSON file rank 0 watches for runtime control, or None.
        control_poll_iters: poll the file every this many iterations.
        device_delay: ``"auto"`` (device-side on CUDA tensors, host sleep otherwise), ``"host"``.
        piggyback_max_bytes: on CPU, a carrier bucket larger than this (bytes) is not copied: the rows
            go in a tiny all-reduce beside it (module doc). None (default): always append. CUDA always
            appends (the copy is a few microseconds of device memory traffic).
        cuda_resolve: on CUDA in piggyback mode, where the host waits for an iteration's device times
            and decides on the carried figures: ``"next_iteration"`` (default: at the next iteration's
            first bucket, before its delay is applied, so the device runs the optimizer step and the
            next forward meanwhile) or ``"iteration_end"`` (at the end of the gradient sync: the device
            idles while the host decides). Same figures, decisions and lag (a control requested between
            iterations rides one iteration earlier); the async and collective modes always resolve at
            the iteration's end (:meth:`_defers`). Ignored on CPU. The same on every rank (it decides
            where a control's broadcast is issued).
        fsdp2_paced: for an FSDP2 model, the paced collective: ``"forward"`` (default) or ``"backward"``
            (module doc). One delay per iteration absorbs the straggle at one of them only: pacing at
            the other moves the wait, it does not remove it.

    Raises:
        ConfigError: a bad setting (:class:`~pacectl.torchdist.core.PacingConfig`: an unknown
            ``gather`` mode, ``gather_every`` or ``control_poll_iters`` below 1, a negative
            ``spin_s``, ...), or an engine built for another number of ranks than the group's.

    Example:
        >>> # ddp = DistributedDataParallel(model); engine = DecisionEngine("threshold", {}, {}, ...)
        >>> # pacer = Pacer(engine).attach(ddp)   # training loop unchanged
        >>> # ...; pacer.flush()                  # end of training: decide on the last figures
    """

    def __init__(
        self,
        engine: DecisionEngine,
        *,
        group: Any = None,
        spin_s: float = 2e-4,
        gather_every: int = 1,
        gather: str = "auto",
        control_path: str | Path | None = None,
        control_poll_iters: int = 10,
        device_delay: str = "auto",
        piggyback_max_bytes: int | None = None,
        cuda_resolve: str = "next_iteration",
        fsdp2_paced: str = "forward",
    ) -> None:
        if cuda_resolve not in CUDA_RESOLVE:
            raise ConfigError(f"Pacer cuda_resolve={cuda_resolve!r}: expected one of {CUDA_RESOLVE}")
        if fsdp2_paced not in FSDP2_PACED:
            raise ConfigError(f"Pacer fsdp2_paced={fsdp2_paced!r}: expected one of {FSDP2_PACED}")
        self.fsdp2_paced = fsdp2_paced
        settings = check_pacing(
            _PacerSettings(
                spin_s=spin_s,
                gather=gather,
                gather_every=gather_every,
                piggyback_max_bytes=piggyback_max_bytes,
                control_path=control_path,  # type: ignore[arg-type]
                control_poll_iters=control_poll_iters,
            ),
            dist_backend=dist.get_backend(group),
            warn=dist.get_rank(group) == 0,
        )
        self.engine = engine
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        # Averaging multiplies by the reciprocal, as DDP does without a hook: the gradients stay
        # bit-identical to plain DDP's (torch's ``allreduce_hook`` divides: the last bit differs for
        # world sizes that are not powers of two).
        self._inv_world = 1.0 / self.world_size
        if engine.num_ranks != self.world_size:
            raise ConfigError(
                f"DecisionEngine num_ranks={engine.num_ranks} must equal the process group's world size "
                f"{self.world_size}: build it with num_ranks=dist.get_world_size()"
            )
        self.spin_s = settings.spin_s
        self.gather_every = settings.gather_every
        self._gather_requested = settings.gather
        self.gather = resolve_gather(self._gather_requested, dist.get_backend(group))
        engine.set_schedule(exchange_lag(self.gather), self.gather_every)  # what a parameter "auto" means
        self.piggyback_max_bytes: int | None = settings.piggyback_max_bytes
        control = settings.control_path
        self.watcher = (
            ControlWatcher(control, family=self._published_family) if control and self.rank == 0 else None
        )
        self.control_poll_iters = settings.control_poll_iters
        self.device_delay_mode = device_delay
        self.cuda_resolve = cuda_resolve
        # cuda_resolve="next_iteration": the iteration closed on the host, completed at the next one
        self._closed: _ClosedIteration | None = None
        self._inflight_ready: Any = None  # CUDA: event after the carried rows' copy to the host
        self._device_delay: DeviceDelay | None = None
        self._controls: dict[int, dict[str, Any]] = {}
        self._published = 0
        self._pending_rows: list[list[float]] = []
        self._pending_first = 0
        # piggyback: (first iteration, number of rows, all-reduced tensor, offset of the rows in it)
        self._inflight: tuple[int, int, torch.Tensor, int] | None = None
        self._pack_s = 0.0
        self._combined: torch.Tensor | None = None
        # piggyback tables decoded on the communication thread but left to the training thread
        self._undecided: tuple[int, np.ndarray] | None = None
        # piggyback: the collective (launch position in the iteration) that carries the rows
        self._carrier = 0
        # async mode: (first iteration, rows, tensor, work, completion future or None on CUDA)
        self._async: tuple[int, int, torch.Tensor, Any, Any] | None = None
        self.reset_log()
        self._next_delay = 0.0
        self._k = 0
        self._forward_end = float("nan")
        self._clear_iteration()
        self._iter_start = now()
        self._start_ev: Any = None
        self._fsdp2_open = False  # FSDP2: this iteration's first collective was seen
        self._fsdp2_end_queued = False  # FSDP2: the end-of-backward callback is queued
        self._grad_forward = False  # FSDP2: in a forward under grad mode (a backward will follow)

    # ----------------------------------------------------------------------------------- set-up
    def attach(self, model: torch.nn.Module) -> Pacer:
        """Pace a DDP model (a comm hook) or an FSDP2 model (``set_custom_reduce_scatter`` and
        ``set_custom_all_gather``); align the iteration clock.

        Args:
            model: a ``DistributedDataParallel`` module, or a module whose submodules (or itself)
                were sharded by ``fully_shard`` (FSDP2). For FSDP2 the pacer's group must be the
                group FSDP2 reduce-scatters on (the ``dp``/shard dimension of its mesh), and the
                exchange cannot ride on a gradient bucket (``gather="piggyback"``): ``"auto"``
                becomes ``"async"`` there.

        Returns:
            self.

        Raises:
            ConfigError: another kind of module; an FSDP2 model whose reduce-scatter group is not
                the pacer's; ``gather="piggyback"`` asked for an FSDP2 model.
        """
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            # Unannotated lambda: DDP checks annotations, which are strings under ``from __future__``.
            model.register_comm_hook(state=None, hook=lambda state, bucket: self._comm_hook(state, bucket))
            model.register_forward_hook(self._on_forward_end)
            self.align()
            return self
        fsdp = fsdp2_modules(model)
        if not fsdp:
            raise ConfigError(
                f"Pacer.attach needs a DistributedDataParallel model or an FSDP2 model (fully_shard), got "
                f"{type(model).__name__}; for a loop that calls all_reduce itself use PacedAllReduce"
            )
        return self._attach_fsdp2(model, fsdp)

    def _attach_fsdp2(self, model: torch.nn.Module, fsdp: list[Any]) -> Pacer:
        """FSDP2: every sharded module reduce-scatters through :class:`PacedReduceScatter` and
        all-gathers through :class:`PacedAllGather`."""
        self._without_piggyback("FSDP2 reduce-scatters its gradients (every rank keeps a different shard)")
        mine = sorted(dist.get_process_group_ranks(self.group or dist.group.WORLD))
        for m in fsdp:
            for param_group in m._get_fsdp_state()._fsdp_param_groups:
                pg = getattr(param_group.mesh_info, "shard_process_group", None)
                if pg is None:  # replicate only (no reduce-scatter)
                    continue
                theirs = sorted(dist.get_process_group_ranks(pg))
                if theirs != mine:
                    raise ConfigError(
                        f"Pacer's group (ranks {mine[:8]}) must be the group FSDP2 reduce-scatters on, got "
                        f"ranks {theirs[:8]} for {type(m).__name__}: build the Pacer with "
                        "group=mesh['dp'].get_group() (the shard dimension of the model's mesh)"
                    )
        reduce_scatter, all_gather = PacedReduceScatter(self), PacedAllGather(self)
        for m in fsdp:
            m.set_custom_reduce_scatter(reduce_scatter)
            if m._get_fsdp_state()._fsdp_param_groups:  # a module without parameters all-gathers nothing
                m.set_custom_all_gather(all_gather)
        self._fsdp2_open = self._fsdp2_end_queued = False
        # before FSDP2's own pre-forward hook, which all-gathers the root's parameters
        model.register_forward_pre_hook(self._on_forward_start, prepend=True)
        model.register_forward_hook(self._on_forward_end)
        self.align()
        return self

    def _without_piggyback(self, why: str) -> None:
        """For a model whose collectives the pacer does not issue itself (FSDP2, framework adapters):
        ``gather="auto"`` becomes ``"async"``; ``"piggyback"`` asked for is refused.

        Raises:
            ConfigError: ``gather="piggyback"`` was asked for (``why`` says why it cannot be).
        """
        if self.gather != "piggyback":
            return
        if self._gather_requested == "piggyback":
            raise ConfigError(
                f"Pacer gather='piggyback' rides on a gradient all-reduce the pacer issues, and {why}: use "
                "gather='async' or 'collective'"
            )
        self.gather = "async"
        self.engine.set_schedule(exchange_lag(self.gather), self.gather_every)

    def align(self) -> None:
        """One tiny all-reduce: every rank leaves it together; its exit starts iteration 0's clock.

        On CUDA the host waits for the device to leave it before reading its clock, so the host
        anchor of the device marks is the same instant on every rank (up to the host's wake-up).
        Later iterations chain device times from it (:meth:`_device_clock_start`), so over a long
        run the marks drift from the host clock by the two clocks' rate difference.
        """
        buf = torch.zeros(1, dtype=torch.float64, device=self._device())
        dist.all_reduce(buf, group=self.group)
        self._start_ev = self._device_clock_start(buf.device)
        if self._start_ev is not None:
            self._start_ev.synchronize()
        self._iter_start = now()

    @staticmethod
    def _device_clock_start(device: torch.device) -> Any:
        """CUDA: an event on the current stream marking the iteration start in device time (else None).

        On CUDA the host runs ahead of the device, so a host timestamp at the hook call is not when
        the device reached the collective. The marks of an iteration are this event's elapsed times
        to the enter, exit and end events, placed on the host clock at the iteration start. The
        first start is :meth:`align`'s (its host time and this event, recorded together); every
        later one is the previous iteration's end event, placed at the previous start plus its
        device time, so the device marks form one chain on device time from ``align``.
        """
        if device.type != "cuda":
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(device))
        return ev

    def reset_log(self) -> None:
        """Start a new episode's log (observations, decisions, marks); the engine is kept.

        Figures not exchanged yet stay pending (call :meth:`flush` first to log them in this episode).
        On CUDA an iteration left for its next one (``cuda_resolve``) is completed into the old log
        first; that may take a broadcast when a runtime control is due, so call it on every rank.
        """
        self._complete_closed()
        self.observations: list[Observation] = []
        self.decisions: list[np.ndarray] = []
        #: how each decision had the ranks wait in the collective (``Action.wait``): recorded, not
        #: enacted (:mod:`pacectl.controllers.sleep_wait` says why)
        self.waits: list[str] = []
        self.diagnostics: list[dict[str, float]] = []
        self._raw_marks: list[tuple[Any, ...]] = []
        #: runtime controls received: ``observation`` (index in :attr:`observations` of the first
        #: decision taken under it), ``version``, ``control`` (the message), ``applied``. Controls
        #: received before this log started are kept, as in force from observation 0 (``carried``).
        self.controls_applied: list[dict[str, Any]] = [
            {**c, "observation": 0, "carried": True} for c in getattr(self, "controls_applied", [])
        ]
        #: rank 0: control file versions ignored as invalid: ``error``, ``iteration`` (in this log);
        #: those seen before this log started are kept at iteration 0 (``carried``), as the controls are.
        self.controls_rejected: list[dict[str, Any]] = [
            {**c, "iteration": 0, "carried": True} for c in getattr(self, "controls_rejected", [])
        ]
        #: host time of each exchange (encode, pack, decode; the wait for it on CUDA and collective), s
        self.gather_s: list[float] = []
        #: host time of each iteration's completion (device times read, carried rows decoded,
        #: decision, this iteration's figures exchanged), s; on CUDA it includes the wait for the device
        self.complete_s: list[float] = []
        #: the measured length of each delay applied (one per iteration), s: on CPU the host delay;
        #: on CUDA the device-side wait, from an event queued just before it to the enter event.
        self.delay_actual_s: list[float] = []

    @property
    def marks(self) -> list[dict[str, Any]]:
        """Per-iteration marks of this rank (local clock, seconds from the iteration start): the input
        of :func:`~pacectl.torchdist.core.marks_to_ops`.

        Keys: ``forward_end_s`` (the forward's end; the first hook call if the forward hook did not
        fire), ``hook_call_s``, ``hook_return_s``, ``enter_s``, ``exit_s`` (one per collective),
        ``backward_end_s`` (every collective done), ``sync_exit_s`` (exchange and decision done: the
        next iteration's start; on CUDA equal to ``backward_end_s``), ``applied_delay_s``,
        ``decisions_before`` (decisions logged before this iteration's delay was applied),
        ``start_clock_s`` (the iteration's start on ``time.perf_counter``, system-wide on Linux:
        comparable across the ranks of one host, :func:`~pacectl.torchdist.core.shared_clock_marks`)
        and ``restarted`` (the clock was started by :meth:`align`, not by the previous exit). On CUDA
        ``enter_s``, ``exit_s``, ``backward_end_s`` and ``sync_exit_s`` are device times, one chain
        from :meth:`align` (:meth:`_device_clock_start`); the hook marks are the host's, which may
        run up to an iteration ahead.
        """
        out = []
        prev_exit = float("nan")
        for start, fwd_end, calls, returns, enters, exits, t_end, t_exit, applied, before in self._raw_marks:
            fwd = fwd_end if math.isfinite(fwd_end) else (calls or [t_end])[0]
            restarted = start != prev_exit
            prev_exit = t_exit
            out.append(
                {
                    "start_clock_s": start,
                    "restarted": restarted,
                    "forward_end_s": max(fwd - start, 0.0),
                    "hook_call_s": [t - start for t in calls],
                    "hook_return_s": [t - start for t in returns],
                    "enter_s": [t - start for t in enters],
                    "exit_s": [t - start for t in exits],
                    "backward_end_s": t_end - start,
                    "sync_exit_s": t_exit - start,
                    "applied_delay_s": applied,
                    "decisions_before": before,
                }
            )
        return out

    def flush(self) -> None:
        """Exchange the figures still pending (one collective) and decide on them. Every rank calls it.

        Use it between iterations, at the end of training or of an episode, so that every iteration
        has its observation and decision (piggyback mode always leaves the last iteration's figures
        pending, ``gather_every > 1`` up to ``gather_every - 1``; on CUDA an iteration left for its
        next one, ``cuda_resolve``, is logged only then). No-op when nothing is pending.
        """
        self._complete_closed()
        self._settle_exchange()
        if self._pending_rows:
            self._gather_and_decide()

    def request_control(self, control: dict[str, Any]) -> None:
        """Rank 0: publish a runtime control message (applied by every rank at the next exchange)."""
        if self.rank == 0:
            self._published += 1
            self._controls[self._published] = dict(control)

    def _published_family(self) -> str:
        """The controller family in force once every published control is applied: what a control
        without ``name`` retunes (a switch may be published but not yet applied)."""
        for version in range(self._published, self.engine.version, -1):
            name = self._controls[version].get("controller", {}).get("name")
            if name is not None:
                return str(name)
        return self.engine.family

    def _device(self) -> torch.device:
        backend = dist.get_backend(self.group)
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def _begin_iteration(self) -> None:
        """Before an iteration's first collective (both entry points): complete the previous iteration
        if it was left for now (CUDA piggyback, ``cuda_resolve``), settle the async exchange, so that
        every rank applies the decision on the same figures, then start a fresh iteration log."""
        self._complete_closed()
        self._settle_exchange()
        self._clear_iteration()

    def _clear_iteration(self) -> None:
        self._hook_call: list[float] = []
        self._hook_return: list[float] = []
        self._enter: list[float] = []
        self._exit: list[float] = []
        self._futures: list[torch.futures.Future[Any]] = []
        self._applied = 0.0
        self._cuda_events: list[tuple[Any, Any]] = []
        self._sleep_ev: Any = None
        self._sleep_cycles = 0
        self._sizes: list[int] = []  # bytes of each collective of this iteration, in launch order
        # decisions logged before this iteration's delay was applied: the last of them chose it
        self._decided_before = len(self.decisions)

    # ------------------------------------------------------------------------------- the hooks
    def _on_forward_start(self, module: Any, inputs: Any) -> None:
        self._grad_forward = torch.is_grad_enabled()  # FSDP2 all-gathers under no_grad: read it here

    def _on_forward_end(self, module: Any, inputs: Any, output: Any) -> None:
        self._grad_forward = False
        if not self._fsdp2_open:  # FSDP2 paced in forward: the first collective's call is the mark
            self._forward_end = now()

    def _comm_hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        t_call = now()
        buf = bucket.buffer()
        first = bucket.index() == 0
        if first:
            self._begin_iteration()
            torch.autograd.Variable._execution_engine.queue_callback(self._end_iteration)
        return self._launch(buf, t_call, first=first)

    def _take_piggyback(self, buf: torch.Tensor, slot: int) -> torch.Tensor | None:
        """The pending rows, encoded for ``buf``'s dtype, if ``slot`` is the carrier (else None)."""
        if self.gather != "piggyback" or slot != self._carrier or len(self._pending_rows) < self.gather_every:
            return None
        if buf.dtype not in _PIGGYBACK_DTYPES:
            # Every rank has the same bucket dtype, so every rank switches at the same iteration.
            warnings.warn(
                f"pacing gather 'piggyback' needs float32/float64 buckets, got {buf.dtype}: "
                "using 'collective' from now on",
                PacingGuardWarning,
                stacklevel=3,  # _take_piggyback <- _launch <- the hook
            )
            self.gather = "collective"
            return None
        assert self._inflight is None, "the previous carried rows were never decoded"
        t0 = now()
        first_iteration, num_rows, flat = self._take_pending()
        extra = _rows_to(encode_rows(flat, buf.dtype), buf.device)
        self._inflight = (first_iteration, num_rows, extra, -1)
        self._pack_s = now() - t0
        return extra

    def _take_pending(self) -> tuple[int, int, np.ndarray]:
        """The pending rows, taken: ``(first iteration, number of rows, this rank's one-hot rows)``."""
        rows, self._pending_rows = self._pending_rows, []
        flat = np.concatenate([one_hot_row(self.rank, self.world_size, r) for r in rows])
        return self._pending_first, len(rows), flat

    def _pack(self, buf: torch.Tensor, extra: torch.Tensor, average: bool) -> torch.Tensor:
        """``[buf * (1 / world) (or buf), extra]`` in one reused buffer: what the piggybacked all-reduce sums."""
        t0 = now()
        n = buf.numel()
        size = n + extra.numel()
        combined = self._combined
        layout = (size, buf.dtype, buf.device)
        if combined is None or (combined.numel(), combined.dtype, combined.device) != layout:
            # Kept across iterations: DDP has copied the previous result into the gradients by the
            # end of that iteration's backward, and the rows were decoded before.
            combined = torch.empty(size, dtype=buf.dtype, device=buf.device)
            self._combined = combined
        grad_part = combined[:n].view(buf.shape)
        if average:
            torch.mul(buf, self._inv_world, out=grad_part)
        else:
            grad_part.copy_(buf)
        combined[n:].copy_(extra)
        assert self._inflight is not None
        self._inflight = (*self._inflight[:2], combined, n)
        self._pack_s += now() - t0
        return combined

    def _record_call(self, buf: torch.Tensor, t_call: float) -> int:
        """Log a collective's call (time, size; its exit stamp to come); returns its slot in the iteration."""
        slot = len(self._enter)
        self._hook_call.append(t_call)
        self._exit.append(float("nan"))
        self._sizes.append(buf.numel() * buf.element_size())
        return slot

    def _target(self, buf: torch.Tensor, rows: torch.Tensor | None, average: bool) -> torch.Tensor:
        """The tensor to all-reduce: ``buf`` (averaged in place), or with ``rows`` a packed copy of both."""
        if rows is not None:
            return self._pack(buf, rows, average)
        if average:
            buf.mul_(self._inv_world)
        return buf

    def _launch(
        self, buf: torch.Tensor, t_call: float, *, first: bool, average: bool = True, in_place: bool = False
    ) -> torch.futures.Future[torch.Tensor]:
        """Apply the delay (first collective only), issue the all-reduce, timestamp enter and exit.

        The carrier's future returns the gradient part of ``cat([buf (averaged), rows])`` (module
        doc), or with ``in_place`` copies it back into ``buf`` and returns ``buf``.
        """
        if buf.is_cuda and self.device_delay_mode == "auto":
            return self._launch_cuda(buf, t_call, first=first, average=average, in_place=in_place)
        slot = self._record_call(buf, t_call)
        extra = self._take_piggyback(buf, slot)
        if first:
            self._applied = self._next_delay
            self.delay_actual_s.append(host_delay(self._applied, spin_s=self.spin_s))
        # a carrier over piggyback_max_bytes is not copied: the rows go beside it
        limit = self.piggyback_max_bytes
        beside = extra is not None and limit is not None and self._sizes[-1] > limit
        target = self._target(buf, None if beside else extra, average)
        self._enter.append(now())
        fut = dist.all_reduce(target, group=self.group, async_op=True).get_future()
        if extra is None:
            chained = fut.then(functools.partial(self._on_exit, slot))
        elif beside:
            assert self._inflight is not None
            self._inflight = (*self._inflight[:2], extra, 0)
            rows = dist.all_reduce(extra, group=self.group, async_op=True).get_future()
            bucket = fut.then(functools.partial(self._on_exit, slot))
            chained = torch.futures.collect_all([bucket, rows]).then(self._on_rows_beside_exit)
        else:
            chained = fut.then(functools.partial(self._on_piggyback_exit, slot, buf, in_place))
        self._futures.append(chained)
        self._hook_return.append(now())
        return chained

    def _on_exit(self, slot: int, fut: torch.futures.Future[Any]) -> torch.Tensor:
        """Completion callback of a plain bucket: timestamp the exit, return the all-reduced bucket."""
        self._exit[slot] = now()
        return fut.value()[0]

    def _on_piggyback_exit(
        self, slot: int, buf: torch.Tensor, in_place: bool, fut: torch.futures.Future[Any]
    ) -> torch.Tensor:
        """Completion callback of the carrier bucket (CPU): timestamp, decide (off the training thread,
        while the backward pass computes the next buckets), return the gradients."""
        self._exit[slot] = now()
        self._decide_off_thread(*self._decode_inflight())
        return _gradient_part(fut.value()[0], buf, in_place)

    def _on_rows_beside_exit(self, fut: torch.futures.Future[Any]) -> torch.Tensor:
        """Completion of a large carrier and the tiny all-reduce of the rows issued beside it (CPU):
        decide, return the bucket (its exit was stamped by its own callback)."""
        bucket, _ = fut.value()
        self._decide_off_thread(*self._decode_inflight())
        return bucket.value()

    def _decide_off_thread(self, first_iteration: int, tables: np.ndarray) -> None:
        """Decide in a completion callback, unless a runtime-control version is due.

        Applying a control takes a collective (a broadcast), which must be issued from the training
        thread in the same order on every rank: such tables wait for :meth:`_settle_exchange`.
        """
        if tables[:, 0, _VERSION].max() > self.engine.version:
            self._undecided = (first_iteration, tables)
        else:
            self._decide(first_iteration, tables)

    def _launch_cuda(
        self, buf: torch.Tensor, t_call: float, *, first: bool, average: bool, in_place: bool
    ) -> torch.futures.Future[torch.Tensor]:
        """CUDA/NCCL: the delay is a device-side wait on the pacing stream; times come from CUDA events.

        The piggybacked rows are staged to the host by :meth:`_close_iteration` and decoded in
        :meth:`_complete` (after the events resolve).
        """
        delay = self._next_delay if first else 0.0
        slot = self._record_call(buf, t_call)
        extra = self._take_piggyback(buf, slot)
        if self._device_delay is None:
            self._device_delay = DeviceDelay(buf.device)
        stream = self._device_delay.paced_stream(delay)
        if first:
            self._sleep_ev = self._device_delay.last_sleep_start
            self._sleep_cycles = self._device_delay.last_cycles
        enter_ev = torch.cuda.Event(enable_timing=True)
        exit_ev = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            enter_ev.record(stream)
            buf.record_stream(stream)
            if extra is not None:
                extra.record_stream(stream)  # made on the current stream, read on this one
            target = self._target(buf, extra, average)
            work = dist.all_reduce(target, group=self.group, async_op=True)
        self._enter.append(now())
        if first:
            self._applied = delay
        self._cuda_events.append((enter_ev, exit_ev))

        def done_cuda(f: torch.futures.Future[Any]) -> torch.Tensor:
            exit_ev.record()
            f.wait()
            return buf if target is buf else _gradient_part(target, buf, in_place)

        fut = work.get_future().then(done_cuda)
        self._futures.append(fut)
        self._hook_return.append(now())
        return fut

    def _fsdp2_collective(self, run: Callable[[], Any], inp: torch.Tensor, *, in_backward: bool) -> None:
        """An FSDP2 collective of the iteration (:class:`PacedReduceScatter`, :class:`PacedAllGather`):
        pace the first, stamp each. ``run()`` issues it synchronously.

        The first call begins the iteration (with ``fsdp2_paced="forward"`` its call time is also the
        ``forward_end`` mark: the record's forward compute is what comes before it). The first call
        in backward queues the iteration's end (an autograd-engine callback, after FSDP2's own final
        callback, which every pre-backward hook queues before it unshards: the last reduce-scatters
        are in).
        """
        t_call = now()
        first = not self._fsdp2_open
        if first:
            self._fsdp2_open = True
            self._begin_iteration()
            if self.fsdp2_paced == "forward":
                self._forward_end = t_call
        if in_backward and not self._fsdp2_end_queued:
            self._fsdp2_end_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_fsdp2_backward)
        self._paced_collective(run, inp, t_call=t_call, first=first)

    def _paced_collective(
        self,
        run: Callable[[], Any],
        inp: torch.Tensor,
        *,
        t_call: float,
        first: bool,
        stamp_exit: bool = True,
    ) -> int:
        """One collective of the iteration that ``run()`` issues (FSDP2's, a framework adapter's,
        :mod:`pacectl.torchdist.adapters`): delay it if it is the first, stamp its call and enter.

        ``run()`` must block until the collective is done (on CUDA: until the current stream waits
        for it), unless ``stamp_exit`` is False: then the caller stamps ``_exit[slot]`` (a
        completion callback) and the collective is CPU-only.

        Returns:
            The collective's slot (position in the iteration).
        """
        slot = self._record_call(inp, t_call)
        if inp.is_cuda and self.device_delay_mode == "auto":
            self._fsdp2_collective_cuda(run, inp, first=first)
            return slot
        if first:
            self._applied = self._next_delay
            self.delay_actual_s.append(host_delay(self._applied, spin_s=self.spin_s))
        self._enter.append(now())
        run()
        if stamp_exit:
            self._exit[slot] = now()
        self._hook_return.append(now())
        return slot

    def _fsdp2_collective_cuda(self, run: Callable[[], Any], inp: torch.Tensor, *, first: bool) -> None:
        """CUDA: the delay on the stream FSDP2 issues the collective on (the current one), events around it."""
        if self._device_delay is None:
            self._device_delay = DeviceDelay(inp.device)
        stream = torch.cuda.current_stream(inp.device)
        delay = self._next_delay if first else 0.0
        sleep_ev = self._device_delay.sleep_on(stream, delay)
        if first:
            self._sleep_ev = sleep_ev
            self._applied = delay
        enter_ev = torch.cuda.Event(enable_timing=True)
        exit_ev = torch.cuda.Event(enable_timing=True)
        enter_ev.record(stream)
        # synchronous: the current stream waits for the collective, so exit_ev follows its end
        run()
        exit_ev.record(stream)
        self._enter.append(now())
        self._cuda_events.append((enter_ev, exit_ev))
        self._hook_return.append(now())

    def _end_fsdp2_backward(self) -> None:
        self._fsdp2_open = self._fsdp2_end_queued = False
        self._end_iteration()

    # ---------------------------------------------------------------------- end of the iteration
    def _end_iteration(self) -> None:
        """End of the gradient sync: close the iteration's log, then exchange the figures and decide
        the next delay, identically on every rank. When :meth:`_defers`, that second part waits for
        the next iteration's first bucket (:meth:`_begin_iteration`) or :meth:`flush`."""
        self._complete_closed()  # (none pending: every iteration begins in _begin_iteration)
        for fut in self._futures:
            fut.wait()  # CPU: blocks; CUDA: orders the current stream after the collectives
        closed = self._close_iteration()
        if self._defers(closed):
            closed.t_exit = now()
            self._closed = closed
            self._start_next(closed, closed.t_exit)
        else:
            self._start_next(closed, self._complete(closed))

    def _defers(self, closed: _ClosedIteration) -> bool:
        """Whether ``closed`` is completed at the next iteration's first bucket: on CUDA, with
        ``cuda_resolve="next_iteration"``, in piggyback mode. The async and collective modes issue
        an all-reduce of their own when they exchange: at the next iteration's first bucket it would
        line the ranks up just before the paced collective and hide the arrival skew it measures, so
        they exchange at the end of the gradient sync, where the ranks leave together anyway."""
        return (
            self.gather == "piggyback" and self.cuda_resolve == "next_iteration" and self._on_device(closed)
        )

    @staticmethod
    def _on_device(closed: _ClosedIteration) -> bool:
        """Whether the iteration's collectives ran on CUDA (tests patch it to check the deferred
        bookkeeping on CPU)."""
        return bool(closed.cuda_events)

    def _close_iteration(self) -> _ClosedIteration:
        """The iteration's stamps; on CUDA, an end event and a non-blocking copy of the carried rows."""
        end_ev = None
        if self._cuda_events and self._device_delay is not None:
            end_ev = self._device_clock_start(self._device_delay.device)
            self._stage_inflight()
        return _ClosedIteration(
            k=self._k,
            start=self._iter_start,
            start_ev=self._start_ev,
            forward_end=self._forward_end,
            hook_call=self._hook_call,
            hook_return=self._hook_return,
            enter=self._enter,
            exit=self._exit,
            cuda_events=self._cuda_events,
            end_ev=end_ev,
            sizes=self._sizes,
            applied=self._applied,
            decided_before=self._decided_before,
            t_end=now(),
            sleep_ev=self._sleep_ev,
            sleep_cycles=self._sleep_cycles,
        )

    def _stage_inflight(self) -> None:
        """CUDA piggyback: copy the carried rows to pinned host memory on the current stream (after
        the collectives), not blocking; :meth:`_decode_inflight` waits for this copy alone."""
        if self._inflight is None or not self._inflight[2].is_cuda:
            return
        first_iteration, num_rows, combined, offset = self._inflight
        host = torch.empty(combined.numel() - offset, dtype=combined.dtype, pin_memory=True)
        host.copy_(combined[offset:], non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(combined.device))
        self._inflight = (first_iteration, num_rows, host, 0)
        self._inflight_ready = ready

    def _start_next(self, closed: _ClosedIteration, t_exit: float) -> None:
        """The next iteration's clock starts at ``t_exit`` (host) and, on CUDA, at ``closed.end_ev``."""
        self._forward_end = float("nan")
        self._iter_start = t_exit
        if closed.end_ev is not None:
            self._start_ev = closed.end_ev
        self._k = closed.k + 1

    def _complete_closed(self) -> None:
        """Finish a closed iteration left for later (``cuda_resolve="next_iteration"``), if any."""
        if self._closed is not None:
            closed, self._closed = self._closed, None
            self._complete(closed)

    def _complete(self, c: _ClosedIteration) -> float:
        """Resolve the device times, decide on the carried rows, exchange this iteration's figures.

        Returns:
            The host time it ended: the iteration's ``sync_exit_s`` mark.
        """
        t_complete = now()
        if c.cuda_events:
            # Device times (one host sync per iteration). Each exit event is recorded on the stream
            # its future's callback ran on, so every one is synchronized, not only the last.
            for _, exit_ev in c.cuda_events:
                exit_ev.synchronize()
            c.end_ev.synchronize()
            # enter events follow the device-side delay, so arrival includes it, as on CPU
            ref, ref_ev = c.start, c.start_ev
            if ref_ev is None:  # attached without align(): anchor at the first enter, host clock
                ref, ref_ev = c.enter[0], c.cuda_events[0][0]
            for j, (enter_ev, exit_ev) in enumerate(c.cuda_events):
                c.exit[j] = ref + ref_ev.elapsed_time(exit_ev) / 1e3
                c.enter[j] = ref + ref_ev.elapsed_time(enter_ev) / 1e3
            c.t_end = ref + ref_ev.elapsed_time(c.end_ev) / 1e3  # the device's end of the sync
            # The next iteration starts at end_ev on the device: its host anchor is this end, so
            # the device marks stay one chain (the host may be up to an iteration ahead). If
            # align() restarted the clock since, its own anchor stays.
            if c.t_exit is not None and self._iter_start == c.t_exit:
                self._iter_start = c.t_end
            c.t_exit = c.t_end
            # the device-side wait's length as run: _sleep counts SM cycles, calibrated at one clock
            waited = c.sleep_ev.elapsed_time(c.cuda_events[0][0]) / 1e3 if c.sleep_ev is not None else 0.0
            self.delay_actual_s.append(waited)
            if c.sleep_ev is not None and self._device_delay is not None:  # follow the SM clock
                self._device_delay.observe(c.sleep_cycles, waited)
        k = c.k
        if self._inflight is not None:  # CUDA: decoded here, after the events resolved
            self._decide(*self._decode_inflight())
        if self._undecided is not None:  # a runtime-control version: decided on this thread
            self._settle_exchange()
        if self.watcher is not None and k % self.control_poll_iters == 0:
            seen = len(self.watcher.rejected)
            control = self.watcher.poll()
            if control is not None:
                self.request_control(control)
            for bad in self.watcher.rejected[seen:]:
                self.controls_rejected.append({**bad, "iteration": len(self._raw_marks)})
        if k >= 1 and c.sizes:
            # the carrier of the next rows (module doc): the smallest bucket of this iteration's
            # layout, the same on every rank, final after iteration 0 (DDP rebuilds its buckets)
            self._carrier = int(np.argmin(c.sizes))
        enter0 = c.enter[0] if c.enter else float("nan")
        exit0 = c.exit[0] if c.exit else float("nan")
        row = gather_row(
            arrival_local_s=enter0 - c.start,
            in_collective_s=exit0 - enter0,
            applied_delay_s=c.applied,
            backward_end_s=c.t_end - c.start,
            control_version=self._published,
        )
        if not self._pending_rows:
            self._pending_first = k
        self._pending_rows.append(row)
        if len(self._pending_rows) >= self.gather_every:
            if self.gather == "collective":
                self._gather_and_decide()
            elif self.gather == "async":
                self._exchange_async()
        t_exit = now() if c.t_exit is None else c.t_exit
        # Raw local-clock stamps only (cheap on the critical path); :attr:`marks` converts on demand.
        self._raw_marks.append(
            (
                c.start,
                c.forward_end,
                c.hook_call,
                c.hook_return,
                c.enter,
                c.exit,
                c.t_end,
                t_exit,
                c.applied,
                c.decided_before,
            )
        )
        self.complete_s.append(now() - t_complete)
        return t_exit

    def _tables(self, flat: np.ndarray, num_rows: int, t0: float, pack_s: float = 0.0) -> np.ndarray:
        """An exchanged buffer as ``float64[num_rows, world_size, NUM_GATHER_FIELDS]`` tables; logs the
        exchange's host time (``pack_s``, the encode and pack, plus the time since ``t0``)."""
        tables = flat.reshape(num_rows, self.world_size, NUM_GATHER_FIELDS)
        self.gather_s.append(pack_s + now() - t0)
        return tables

    def _decode_inflight(self) -> tuple[int, np.ndarray]:
        """The rows that rode on this iteration's carrier: ``(first iteration, float64[n, world, fields])``."""
        assert self._inflight is not None
        first_iteration, num_rows, combined, offset = self._inflight
        self._inflight = None
        t0 = now()
        if self._inflight_ready is not None:  # CUDA: the staged copy to the host
            self._inflight_ready.synchronize()
            self._inflight_ready = None
        return first_iteration, self._tables(decode_rows(combined[offset:]), num_rows, t0, self._pack_s)

    def _exchange_async(self) -> None:
        """Async mode (module doc): issue the tiny sum all-reduce of the pending rows and return at once.

        On CPU its completion callback decodes and decides on the communication thread; on CUDA (and
        for a runtime-control version) :meth:`_settle_exchange` does, on the training thread, before
        the next iteration's delay is applied.
        """
        assert self._async is None, "the previous async exchange was never settled"
        t0 = now()
        first, num_rows, flat = self._take_pending()
        tensor = _rows_to(torch.from_numpy(flat), self._device())
        work = dist.all_reduce(tensor, group=self.group, async_op=True)
        fut = None
        if not tensor.is_cuda:
            fut = work.get_future().then(functools.partial(self._on_async_exchange, first, num_rows))
        self._async = (first, num_rows, tensor, work, fut)
        self._pack_s = now() - t0

    def _on_async_exchange(self, first_iteration: int, num_rows: int, fut: torch.futures.Future[Any]) -> None:
        """Completion callback of the async exchange (CPU): decode, then decide unless a control is due."""
        t0 = now()
        tables = self._tables(fut.value()[0].numpy(), num_rows, t0, self._pack_s)
        self._decide_off_thread(first_iteration, tables)

    def _settle_exchange(self) -> None:
        """Training thread, before a delay is applied: finish the async exchange and any pending decision."""
        if self._async is not None:
            first_iteration, num_rows, tensor, work, fut = self._async
            self._async = None
            if fut is not None:
                fut.wait()  # normally long complete: it ran during the optimizer step and forward
            else:
                t0 = now()
                work.wait()
                tables = self._tables(tensor.cpu().numpy(), num_rows, t0, self._pack_s)
                self._undecided = (first_iteration, tables)
        if self._undecided is not None:
            undecided, self._undecided = self._undecided, None
            self._decide(*undecided)

    def _gather_and_decide(self) -> None:
        """Collective mode (and :meth:`flush`): one tiny sum all-reduce of the pending rows, then decide."""
        first_iteration, num_rows, flat = self._take_pending()
        tensor = _rows_to(torch.from_numpy(flat), self._device())
        t0 = now()
        dist.all_reduce(tensor, group=self.group)
        # on CUDA the all-reduce returns once queued: the wait is in the copy to the host
        self._decide(first_iteration, self._tables(tensor.cpu().numpy(), num_rows, t0))

    def _decide(self, first_iteration: int, tables: np.ndarray) -> None:
        """Run the engine on each exchanged table (bit-identical on every rank); set the next delay."""
        action = None
        for i, table in enumerate(tables):
            version = int(table[0, _VERSION])  # rank 0's published version
            if version > self.engine.version:
                observation = len(self.observations)  # the first decision taken under these controls
                for v, control, applied in self._apply_controls(version):
                    self.controls_applied.append(
                        {"observation": observation, "version": v, "control": control, "applied": applied}
                    )
            obs = observation_from_table(first_iteration + i, table)
            action = self.engine.decide(obs)
            self.observations.append(obs)
            self.decisions.append(action.delay_s.copy())
            self.waits.append(action.wait)
            self.diagnostics.append(self.engine.diagnostics())
        if action is not None:
            self._next_delay = float(action.delay_s[self.rank])

    def _apply_controls(self, version: int) -> list[tuple[int, dict[str, Any], bool]]:
        """Every rank, same iteration: receive rank 0's control messages up to ``version`` and apply them.

        Returns:
            ``(version, message, applied)`` per message.
        """
        payload: list[Any] = [
            [(v, self._controls[v]) for v in range(self.engine.version + 1, version + 1)]
            if self.rank == 0
            else None
        ]
        # group rank 0 (a global src would name a rank outside a sub-group, e.g. a second DP group)
        dist.broadcast_object_list(payload, group=self.group, group_src=0)
        return [(v, control, self.engine.apply_control(control, v)) for v, control in payload[0]]


try:  # FSDP2's comm interfaces (torch >= 2.8); the pacer only needs their call signatures
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:  # pragma: no cover - an older torch: FSDP2 then has no custom comms
    _AllGatherBase = _ReduceScatterBase = object  # type: ignore[assignment,misc]


class _PacedComm:
    """What FSDP2's two custom comms share: the pacer they report to, and a plain output buffer."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A plain buffer, as FSDP2's default comms allocate one."""
        return torch.empty(*size, dtype=dtype, device=device)


class PacedReduceScatter(_PacedComm, _ReduceScatterBase):  # type: ignore[misc,valid-type]
    """FSDP2's reduce-scatter, paced: ``fsdp_module.set_custom_reduce_scatter(PacedReduceScatter(pacer))``.

    :meth:`Pacer.attach` installs it on every sharded module. FSDP2 (torch 2.13,
    ``_fsdp_collectives.foreach_reduce``) calls it with keyword arguments, on its reduce-scatter
    stream, synchronously; the signature is the interface's (``_fsdp_api.ReduceScatter``). Gradient
    scaling stays FSDP2's (``op`` and its pre/post-divide factors): gradients are bit-identical.

    Args:
        pacer: the :class:`Pacer` that paces and measures.
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        """Reduce-scatter ``input_tensor`` into ``output_tensor`` on ``group`` (paced, timed).

        Raises:
            ConfigError: ``async_op=True`` (FSDP2 never asks for it; the wait is what is measured).
        """
        if async_op:
            raise ConfigError("PacedReduceScatter runs synchronously, as FSDP2 calls it: got async_op=True")
        run = functools.partial(dist.reduce_scatter_single, output_tensor, input_tensor, op=op, group=group)
        self.pacer._fsdp2_collective(run, input_tensor, in_backward=True)
        return None


class PacedAllGather(_PacedComm, _AllGatherBase):  # type: ignore[misc,valid-type]
    """FSDP2's all-gather, paced: ``fsdp_module.set_custom_all_gather(PacedAllGather(pacer))``.

    :meth:`Pacer.attach` installs it on every sharded module that has parameters. FSDP2 (torch 2.13,
    ``_fsdp_collectives.foreach_all_gather``) calls it with keyword arguments, on its all-gather
    stream. A synchronous call in backward (pre-backward unshards and their prefetches, an
    activation checkpoint's recomputation) or, with ``fsdp2_paced="forward"``, in a forward under
    grad mode is one of the iteration's collectives (:meth:`Pacer._fsdp2_collective`); other
    all-gathers run as FSDP2's default does (``all_gather_single``), unpaced and unrecorded.

    Args:
        pacer: the :class:`Pacer` that paces and measures.
    """

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> Any:
        """All-gather ``input_tensor`` into ``output_tensor`` on ``group``: in backward paced and timed.

        Returns:
            The collective's work when ``async_op`` (not paced), else None.
        """
        in_backward = torch._C._current_graph_task_id() != -1  # what FSDP2's own ``is_bw`` reads
        # a forward's all-gathers count when the pacer paces there and a backward follows (grad mode)
        in_forward = self.pacer.fsdp2_paced == "forward" and self.pacer._grad_forward and not in_backward
        if async_op or not (in_backward or in_forward):
            return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
        run = functools.partial(dist.all_gather_single, output_tensor, input_tensor, group=group)
        self.pacer._fsdp2_collective(run, input_tensor, in_backward=in_backward)
        return None


def fsdp2_modules(model: torch.nn.Module) -> list[Any]:
    """The FSDP2 (``fully_shard``) modules in ``model``, itself included; [] when there is none."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


class PacedAllReduce:
    """A thin wrapper for loops that call ``torch.distributed.all_reduce`` themselves (no DDP).

    The first call of an iteration is paced (and, in piggyback mode, carries the previous
    iteration's figures if its tensor is float32/float64); after ``collectives_per_iteration`` calls
    the iteration ends (exchange, decide). Calls block like ``all_reduce(..., async_op=False)``.
    Call ``pacer.flush()`` on every rank at the end to decide on the last figures.

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
        """All-reduce ``tensor`` in place (sum; ``average=True`` multiplies by 1 / world size first, as DDP does)."""
        pacer = self.pacer
        t_call = now()
        first = self._count == 0
        if first:
            pacer._begin_iteration()
        pacer._launch(tensor, t_call, first=first, average=average, in_place=True).wait()
        self._count += 1
        if self._count == self.collectives_per_iteration:
            self._count = 0
            pacer._end_iteration()
