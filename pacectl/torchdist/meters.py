"""What a live rank measures beside its timings: energy (NVML, read-only) or CPU time, and the
clock behind ``torch.cuda._sleep``. No torch import here: the logic is tested on CPU.

- :class:`NvmlEnergyMeter`: the GPU's energy counter, ``nvmlDeviceGetTotalEnergyConsumption``
  (millijoules since the driver loaded; Volta and later), through ``nvidia-ml-py`` (``pynvml``).
  It only reads: it never sets clocks, application clocks or power limits (a shared machine's
  settings are not ours to change).
- :class:`CpuTimeMeter`: on CPU/gloo there is no energy counter. The closest proxy is the CPU time
  of each rank's process (every thread: compute, gloo's pair threads, the pacer's spin tail) per
  iteration: a busy-polling wait costs CPU time and a blocking or sleeping one does not, so the
  difference between runs is what their waits and the pacer cost in CPU time. It is reported as a
  proxy (``energy_source: cpu_time_proxy``).
- :class:`CycleClock`: seconds to ``_sleep`` cycles at the SM clock in force (``_sleep`` counts SM
  cycles, so a delay calibrated once stretches when the clock falls and shrinks when it rises).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any


def _pynvml() -> Any | None:
    """The ``pynvml`` module (nvidia-ml-py), initialised, or None when it or a driver is missing."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no package, no driver, no device: no NVML
        return None
    return pynvml


class NvmlEnergyMeter:
    """Read-only energy counter of one GPU, joules (``nvmlDeviceGetTotalEnergyConsumption``).

    Args:
        device_index: the GPU's index as NVML numbers it (``torch.cuda.current_device()`` under the
            usual ``CUDA_VISIBLE_DEVICES``-free setup).
        nvml: the ``pynvml`` module (tests pass a fake); None loads the real one.

    Raises:
        RuntimeError: NVML is unavailable or the GPU has no energy counter (pre-Volta).
    """

    source = "nvml"

    def __init__(self, device_index: int = 0, *, nvml: Any | None = None) -> None:
        loaded = nvml if nvml is not None else _pynvml()
        if loaded is None:
            raise RuntimeError("NVML is not available (pip install nvidia-ml-py, and an NVIDIA driver)")
        self._nvml: Any = loaded
        self._handle = self._nvml.nvmlDeviceGetHandleByIndex(int(device_index))
        self.read_j()  # fails here on a GPU without the counter

    def read_j(self) -> float:
        """The counter now, joules (it counts from the driver's load: use differences)."""
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3

    def sm_clock_mhz(self) -> float:
        """The SM clock now, MHz (read-only)."""
        return float(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))


class CpuTimeMeter:
    """CPU time of this process (every thread), seconds: the energy proxy on CPU/gloo."""

    source = "cpu_time_proxy"

    def __init__(self, clock: Callable[[], float] = time.process_time) -> None:
        self._clock = clock

    def read_j(self) -> float:
        """The process's CPU time now, seconds (named ``read_j`` for one interface with the NVML meter;
        the unit is CPU-seconds, not joules)."""
        return float(self._clock())


def nvml_sm_clock_reader(device_index: int = 0) -> Callable[[], float] | None:
    """A function reading the SM clock of GPU ``device_index`` (MHz, read-only), or None without NVML."""
    nvml = _pynvml()
    if nvml is None:
        return None
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(int(device_index))
    except Exception:  # noqa: BLE001 - no such device
        return None
    return lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))


def make_meter(device_type: str, device_index: int = 0) -> NvmlEnergyMeter | CpuTimeMeter:
    """NVML on a CUDA device when it can be read, else the CPU-time proxy."""
    if device_type == "cuda":
        with contextlib.suppress(RuntimeError):  # no NVML, or no energy counter
            return NvmlEnergyMeter(device_index)
    return CpuTimeMeter()


class CycleClock:
    """Seconds to ``torch.cuda._sleep`` cycles at the SM clock in force (power or thermal throttling,
    a node power cap change it).

    ``cycles_per_s`` is calibrated once (CUDA events around a long ``_sleep``). With
    ``read_clock_mhz`` (NVML's SM clock) the conversion scales it by the clock now over the clock at
    calibration. Every measured wait (:meth:`observe`: the cycles asked for and the seconds the wait
    took, from CUDA events) recalibrates it: the rate it implies, relative to the clock read then, is
    blended in with weight ``gain``, so a clock change that NVML does not show (or no NVML) is
    followed within a few waits. Waits shorter than ``min_observe_s`` are too coarse to learn from,
    and a single rate more than ``max_jump`` times off is ignored as a glitch (a preempted stream).

    Args:
        cycles_per_s: the calibrated rate, cycles per second (> 0).
        read_clock_mhz: reads the SM clock now, MHz, or None.
        gain: weight of each measured wait, in (0, 1].
        min_observe_s: shortest wait that recalibrates, seconds.
        max_jump: largest factor between a measured rate and the current one that is believed.
        reference_mhz: the SM clock at calibration, MHz (read while the calibration ran); None reads
            it now.

    Example:
        >>> clock = CycleClock(1.0e9)
        >>> clock.cycles(0.002)
        2000000
        >>> clock.observe(2_000_000, 0.004)  # the wait took twice as long: the clock halved
        >>> clock.cycles(0.002) < 2_000_000
        True
    """

    def __init__(
        self,
        cycles_per_s: float,
        *,
        read_clock_mhz: Callable[[], float] | None = None,
        gain: float = 0.5,
        min_observe_s: float = 1e-3,
        max_jump: float = 4.0,
        reference_mhz: float | None = None,
    ) -> None:
        if not (math.isfinite(cycles_per_s) and cycles_per_s > 0):
            raise ValueError(f"cycles_per_s must be a finite rate > 0, got {cycles_per_s!r}")
        if not 0.0 < gain <= 1.0:
            raise ValueError(f"gain must be in (0, 1], got {gain!r}")
        self._read = read_clock_mhz
        self.gain, self.min_observe_s, self.max_jump = float(gain), float(min_observe_s), float(max_jump)
        self.reference_mhz = float(reference_mhz) if reference_mhz else self._clock()
        #: cycles per second per MHz of SM clock (or per "unit clock" without a reader)
        self.rate_per_mhz = float(cycles_per_s) / self.reference_mhz
        self._asked_mhz = self.reference_mhz
        #: every recalibration: (measured cycles per second, the rate in force after it)
        self.history: list[tuple[float, float]] = []

    def _clock(self) -> float:
        if self._read is None:
            return 1.0
        try:
            mhz = float(self._read())
        except Exception:  # noqa: BLE001 - a failed read keeps the last conversion
            return getattr(self, "_asked_mhz", 1.0)
        return mhz if math.isfinite(mhz) and mhz > 0 else getattr(self, "_asked_mhz", 1.0)

    @property
    def cycles_per_s(self) -> float:
        """The rate in force at the clock last read, cycles per second."""
        return self.rate_per_mhz * self._asked_mhz

    def cycles(self, delay_s: float) -> int:
        """``_sleep`` cycles for a wait of ``delay_s`` seconds at the clock now (0 for no wait)."""
        if delay_s <= 0.0:
            return 0
        self._asked_mhz = self._clock()
        return int(delay_s * self.cycles_per_s)

    def observe(self, cycles: int, measured_s: float) -> None:
        """Recalibrate from one wait of ``cycles`` cycles that took ``measured_s`` seconds."""
        if cycles <= 0 or not (math.isfinite(measured_s) and measured_s >= self.min_observe_s):
            return
        rate = cycles / measured_s
        current = self.cycles_per_s
        if not (current / self.max_jump <= rate <= current * self.max_jump):
            return
        blended = (1.0 - self.gain) * current + self.gain * rate
        self.rate_per_mhz = blended / self._asked_mhz
        self.history.append((rate, blended))
