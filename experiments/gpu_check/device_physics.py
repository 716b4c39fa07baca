"""The GPU check's measurements of the physics behind the simulator's parameters (issue 21, item 4).

Three steps of :mod:`gpu_check` (each also runs with ``--cpu``, a dry run of its harness whose
figures mean nothing for a GPU):

- :func:`sleep_calibration`: ``torch.cuda._sleep`` (the device-side pacing wait, a 1-CTA spinning
  kernel counting SM cycles) calibrated on an idle GPU and while a GEMM stream keeps it busy, with
  the SM clock (NVML, read-only) and the error of a 5 ms wait converted at the idle calibration.
  If the clock moves under load, a fixed cycle count stretches or shrinks: what
  :class:`pacectl.torchdist.meters.CycleClock` corrects. ``--cpu``: the precision of
  ``time.sleep`` (the CPU pacer's wait).
- :func:`kappa_on_device`: the slowdown of a backward-like GEMM stream (bf16 8192^3 matmuls on the
  compute stream) while spinning kernels of ``n`` CTAs (512 threads each, polling a flag in global
  memory, as NCCL's kernels wait for a peer's data) occupy the same GPU, against the 1-CTA
  ``torch.cuda._sleep`` the pacer uses, paired rounds in random order. Spinners are Triton kernels
  when Triton is importable, else ``n`` concurrent ``torch.cuda._sleep`` kernels on ``n`` streams
  (1 thread each: a lighter footprint; the record names which). This is the on-device part of
  early-arrival interference: a spinning waiter on the *same* GPU (a rank's own earlier bucket's
  collective waiting for a late peer, or ranks sharing one GPU). Waiters on the *other* GPUs of a
  node reach a computing GPU only through the host (NCCL's proxy threads: the CPU measurement,
  experiments/interference) and shared PCIe; neither is measured here. ``--cpu``: a float32
  matmul stream against spinning vs sleeping threads.
- :func:`power_states`: mean GPU power (the NVML energy counter, read-only) in each state the
  energy model distinguishes (``pacectl/fabric/power.py``): idle, GEMM compute, an ``n``-CTA
  spinning wait and the 1-CTA ``_sleep`` pacing wait, with the SM clock and temperature.
  ``--cpu``: CPU-seconds per second of the process (the CPU-time proxy) in the same states.

Nothing here changes a device setting: NVML is only read.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: spinning CTAs per kernel in :func:`kappa_on_device` (NCCL uses 1 CTA per channel, up to 32 on H100/H200)
SPIN_CTAS = (1, 4, 16, 32)
SPIN_THREADS = 512


def _interval(values: Any) -> dict[str, Any]:
    from scipy import stats

    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if x.size < 2:
        return {"mean": m, "ci95": [float("nan"), float("nan")]}
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return {"mean": m, "ci95": [m - half, m + half]}


# --- spinners -------------------------------------------------------------------------------------


class _CpuSpinners:
    """``--cpu`` stand-in: threads that busy-poll an event (spin) or block on it (sleep)."""

    kind = "python threads (dry run)"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, n: int, *, spin: bool) -> None:
        self._stop.clear()

        def spin_loop() -> None:
            while not self._stop.is_set():
                pass

        target = spin_loop if spin else self._stop.wait
        self._threads = [threading.Thread(target=target, daemon=True) for _ in range(n)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []


class _CudaSpinners:
    """``n``-CTA spinning kernels on a side stream, released by a flag written after the GEMMs."""

    def __init__(self, dev: Any, sleep_cycles_per_s: float) -> None:
        import torch

        self.torch = torch
        self.dev = dev
        self.stream = torch.cuda.Stream(device=dev)
        self.release = torch.cuda.Stream(device=dev)
        self.flag = torch.zeros(1, dtype=torch.int32, device=dev)
        self.sink = torch.zeros(max(SPIN_CTAS) * SPIN_THREADS, dtype=torch.int32, device=dev)
        self.cycles_per_s = sleep_cycles_per_s
        self._side_streams = [torch.cuda.Stream(device=dev) for _ in range(max(SPIN_CTAS))]
        self._kernel: Any = None
        try:
            self._kernel = _triton_spin_kernel()
            self.flag.fill_(1)  # compile and run once, released from the start
            self._kernel[(1,)](self.flag, self.sink, 16, BLOCK=SPIN_THREADS, num_warps=SPIN_THREADS // 32)
            torch.cuda.synchronize(dev)
            self.kind = f"triton: {SPIN_THREADS} threads per CTA polling a flag in global memory"
        except Exception as err:  # noqa: BLE001 - no Triton: the torch fallback, named in the record
            self.kind = (
                "torch.cuda._sleep on n streams (1 thread per CTA; Triton unavailable: "
                f"{type(err).__name__}: {err})"
            )

    def start(self, n: int, *, hold_s: float) -> None:
        """Queue ``n`` spinning CTAs (they run until :meth:`stop`'s flag, at most ~``hold_s``)."""
        torch = self.torch
        self.flag.zero_()
        self.stream.wait_stream(torch.cuda.current_stream(self.dev))
        if self._kernel is not None:
            with torch.cuda.stream(self.stream):
                self._kernel[(n,)](
                    self.flag, self.sink, 1 << 26, BLOCK=SPIN_THREADS, num_warps=SPIN_THREADS // 32
                )
        else:
            cycles = int(hold_s * self.cycles_per_s)
            for s in self._side_streams[:n]:
                s.wait_stream(torch.cuda.current_stream(self.dev))
                with torch.cuda.stream(s):
                    torch.cuda._sleep(cycles)

    def stop(self, after: Any) -> None:
        """Release the spinners once the event ``after`` has completed."""
        self.release.wait_event(after)
        with self.torch.cuda.stream(self.release):
            self.flag.fill_(1)


def _triton_spin_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def spin(flag_ptr, sink_ptr, max_iters, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        count = tl.zeros([BLOCK], dtype=tl.int32)
        i = 0
        seen = tl.load(flag_ptr, volatile=True)
        while (seen == 0) & (i < max_iters):
            seen = tl.load(flag_ptr, volatile=True)
            count += 1
            i += 1
        tl.store(sink_ptr + pid * BLOCK + offs, count)

    return spin


# --- sleep calibration ----------------------------------------------------------------------------


def sleep_calibration(dev: Any, *, quick: bool = False) -> dict[str, Any]:
    """``torch.cuda._sleep`` rate and SM clock idle vs under a GEMM stream; CPU: ``time.sleep`` error."""
    if dev.type == "cpu":
        out: dict[str, Any] = {"what": "time.sleep error (the CPU pacer's wait), seconds"}
        for req in (1e-4, 1e-3, 5e-3):
            errs = []
            for _ in range(5 if quick else 50):
                t0 = time.perf_counter()
                time.sleep(req)
                errs.append(time.perf_counter() - t0 - req)
            out[f"{req * 1e3:g}ms"] = {
                "median_error_s": float(np.median(errs)),
                "p99_error_s": float(np.percentile(errs, 99)),
            }
        return out
    import torch

    from pacectl.torchdist.pacer import DeviceDelay

    dd = DeviceDelay(dev)
    idle_rates = list(dd.calibration_rates)
    idle_rate = float(np.median(idle_rates))
    idle_clocks = list(dd.calibration_clocks_mhz)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    gemm = torch.cuda.Stream(device=dev)

    def busy(seconds: float) -> None:
        with torch.cuda.stream(gemm):
            t_end = time.perf_counter() + seconds
            while time.perf_counter() < t_end:
                for _ in range(4):
                    x @ x
                gemm.synchronize()

    def wait_error(rate: float, req: float = 5e-3) -> list[float]:
        errs = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(dd.stream):
                a.record(dd.stream)
                torch.cuda._sleep(int(req * rate))
                b.record(dd.stream)
            b.synchronize()
            errs.append(a.elapsed_time(b) / 1e3 - req)
        return errs

    idle_err = wait_error(idle_rate)
    # under load: a GEMM stream runs on its own stream while the sleep is calibrated and timed
    done = threading.Event()

    def load() -> None:
        while not done.is_set():
            busy(0.05)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)  # the clock settles under load
        busy_rate = dd.calibrate()
        busy_clocks = list(dd.calibration_clocks_mhz)
        busy_err = wait_error(idle_rate)
    finally:
        done.set()
        thread.join(timeout=10)
    torch.cuda.synchronize()
    return {
        "what": "torch.cuda._sleep cycles per second and SM clock (NVML, MHz), idle and under a bf16 8192^3 GEMM stream",
        "idle": {"cycles_per_s": idle_rate, "rates": idle_rates, "sm_clock_mhz": idle_clocks},
        "under_gemm": {
            "cycles_per_s": float(busy_rate),
            "rates": list(dd.calibration_rates),
            "sm_clock_mhz": busy_clocks,
        },
        "rate_change_frac": float(busy_rate) / idle_rate - 1.0,
        "error_of_5ms_at_idle_calibration_s": {
            "idle_median": float(np.median(idle_err)),
            "under_gemm_median": float(np.median(busy_err)),
        },
    }


# --- interference on the device ---------------------------------------------------------------------


def kappa_on_device(dev: Any, *, rounds: int = 10, reps: int = 24, quick: bool = False) -> dict[str, Any]:
    """GEMM-stream slowdown with ``n``-CTA spinners vs the 1-CTA pacing sleep, paired rounds."""
    import torch

    rng = random.Random(0)
    if dev.type == "cpu":
        size, dtype = (128 if quick else 384), torch.float32
        spinners: Any = _CpuSpinners()
        conditions = ["alone", "sleep_1", "spin_1", "spin_2"]
    else:
        size, dtype = 8192, torch.bfloat16
        from pacectl.torchdist.pacer import DeviceDelay

        dd = DeviceDelay(dev)
        spinners = _CudaSpinners(dev, dd.cycles_per_s)
        conditions = ["alone", "sleep_1"] + [f"spin_{n}" for n in SPIN_CTAS]
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)

    def gemms() -> float:
        if dev.type == "cpu":
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            return time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            a @ b
        end.record()
        return start, end  # type: ignore[return-value]

    def trial(cond: str, hold_s: float) -> float:
        if dev.type == "cpu":
            if cond != "alone":
                spinners.start(int(cond.split("_")[1]), spin=cond.startswith("spin"))
            try:
                return float(gemms())
            finally:
                spinners.stop()
        cur = torch.cuda.current_stream(dev)
        if cond == "sleep_1":
            with torch.cuda.stream(spinners.stream):
                spinners.stream.wait_stream(cur)
                torch.cuda._sleep(int(hold_s * dd.cycles_per_s))
        elif cond.startswith("spin"):
            spinners.start(int(cond.split("_")[1]), hold_s=hold_s)
        torch.cuda._sleep(int(2e-4 * dd.cycles_per_s))  # the waiters are resident before the start event
        start, end = gemms()  # type: ignore[misc]
        if cond.startswith("spin"):
            spinners.stop(end)
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    alone = [trial("alone", 0.0) for _ in range(3)]  # warm-up (kernel selection, Triton compile below)
    hold_s = 1.5 * max(alone)
    for cond in conditions[1:]:
        trial(cond, hold_s)
    times: dict[str, list[float]] = {c: [] for c in conditions}
    for _ in range(rounds):
        order = list(conditions)
        rng.shuffle(order)
        for cond in order:
            times[cond].append(trial(cond, hold_s))
    base = np.array(times["alone"])
    result: dict[str, Any] = {
        "what": "slowdown of a GEMM stream (time over the same round's alone) while waiters occupy the device",
        "gemm": f"{reps} x {size}^3 {str(dtype).replace('torch.', '')} matmuls",
        "device": str(dev),
        "spinner": getattr(spinners, "kind", ""),
        "rounds": rounds,
        "alone_median_s": float(np.median(base)),
        "slowdown": {c: _interval(np.array(times[c]) / base) for c in conditions[1:]},
        "times_s": times,
    }
    if dev.type == "cuda":
        result["num_sms"] = torch.cuda.get_device_properties(dev).multi_processor_count
    return result


# --- power in each state ----------------------------------------------------------------------------


def power_states(dev: Any, *, seconds: float = 2.0, spin_ctas: int = 16) -> dict[str, Any]:
    """Mean power per state (NVML energy counter), or CPU-seconds per second with ``--cpu``."""
    import torch

    from pacectl.torchdist.meters import CpuTimeMeter, NvmlEnergyMeter, nvml_sm_clock_reader

    states: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {}
    stop = threading.Event()
    worker: list[threading.Thread] = []

    def compute_on(x: Any, side: Any = None) -> None:
        stop.clear()

        def loop() -> None:
            while not stop.is_set():
                if side is None:
                    x @ x
                else:
                    with torch.cuda.stream(side):
                        for _ in range(4):
                            x @ x
                    side.synchronize()

        worker[:] = [threading.Thread(target=loop, daemon=True)]
        worker[0].start()

    def compute_off() -> None:
        stop.set()
        for t in worker:
            t.join(timeout=10)

    if dev.type == "cpu":
        meter: Any = CpuTimeMeter()
        spinners: Any = _CpuSpinners()
        x = torch.randn(256, 256)
        states = {
            "idle": (lambda: None, lambda: None),
            "compute": (lambda: compute_on(x), compute_off),
            "spin_wait": (lambda: spinners.start(1, spin=True), spinners.stop),
            "sleep_wait": (lambda: spinners.start(1, spin=False), spinners.stop),
        }
        unit, read_clock, temp = "cpu_s_per_s", None, None
    else:
        try:
            meter = NvmlEnergyMeter(dev.index or 0)
        except RuntimeError as err:
            return {"error": f"NVML unavailable: {err}"}
        read_clock = nvml_sm_clock_reader(dev.index or 0)
        temp = _nvml_temperature(dev.index or 0)
        from pacectl.torchdist.pacer import DeviceDelay

        dd = DeviceDelay(dev)
        spinners = _CudaSpinners(dev, dd.cycles_per_s)
        x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        side = torch.cuda.Stream(device=dev)
        done = torch.cuda.Event()

        def spin_on() -> None:
            spinners.start(spin_ctas, hold_s=seconds + 1.0)

        def spin_off() -> None:
            done.record()
            spinners.stop(done)
            torch.cuda.synchronize()

        def sleep_on() -> None:
            with torch.cuda.stream(side):
                torch.cuda._sleep(int((seconds + 0.5) * dd.cycles_per_s))

        states = {
            "idle": (lambda: None, lambda: None),
            "compute": (lambda: compute_on(x, side), compute_off),
            f"spin_wait_{spin_ctas}cta": (spin_on, spin_off),
            "sleep_wait_1cta": (sleep_on, torch.cuda.synchronize),
        }
        unit = "W"
    out: dict[str, Any] = {"unit": unit, "seconds_per_state": seconds, "states": {}}
    for name, (on, off) in states.items():
        on()
        time.sleep(0.3)  # ramp
        e0, t0 = meter.read_j(), time.perf_counter()
        clocks = []
        while time.perf_counter() - t0 < seconds:
            time.sleep(0.1)
            if read_clock is not None:
                clocks.append(read_clock())
        e1, t1 = meter.read_j(), time.perf_counter()
        state: dict[str, Any] = {"mean": (e1 - e0) / (t1 - t0)}
        if clocks:
            state["sm_clock_mhz_median"] = float(np.median(clocks))
        if temp is not None:
            state["temperature_c"] = temp()
        off()
        out["states"][name] = state
    if dev.type == "cuda":
        out["spinner"] = spinners.kind
    return out


def _nvml_temperature(index: int) -> Callable[[], float] | None:
    from pacectl.torchdist.meters import _pynvml

    nvml = _pynvml()
    if nvml is None:
        return None
    handle = nvml.nvmlDeviceGetHandleByIndex(int(index))
    return lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
