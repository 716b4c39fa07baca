"""Live meters without a GPU: the NVML energy reader (read-only, on a fake NVML), the CPU-time proxy,
and the ``torch.cuda._sleep`` cycle clock following SM clock changes (on a fake device clock)."""

from __future__ import annotations

import numpy as np
import pytest

from pacectl.energy import measured_summary
from pacectl.torchdist.meters import CpuTimeMeter, CycleClock, NvmlEnergyMeter


class FakeNvml:
    """The read functions of pynvml that the meter may call; any other call is a test failure."""

    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        self.energy_mj = 5_000_000
        self.clock_mhz = 1980.0
        self.calls: list[str] = []

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802 - pynvml's names
        self.calls.append("handle")
        return f"gpu{index}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:  # noqa: N802
        self.calls.append("energy")
        return self.energy_mj

    def nvmlDeviceGetClockInfo(self, handle: str, which: int) -> float:  # noqa: N802
        assert which == self.NVML_CLOCK_SM
        self.calls.append("clock")
        return self.clock_mhz

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        raise AssertionError(f"the meter called pynvml.{name}: it may only read")


def test_nvml_meter_reads_joules_and_never_sets_anything() -> None:
    nvml = FakeNvml()
    meter = NvmlEnergyMeter(0, nvml=nvml)
    before = meter.read_j()
    nvml.energy_mj += 2_500  # 2.5 J later
    assert meter.read_j() - before == pytest.approx(2.5)
    assert meter.sm_clock_mhz() == 1980.0
    assert set(nvml.calls) <= {"handle", "energy", "clock"}


def test_cpu_time_meter_is_the_process_clock() -> None:
    ticks = iter([1.0, 1.25])
    meter = CpuTimeMeter(lambda: next(ticks))
    assert meter.source == "cpu_time_proxy"
    assert meter.read_j() == 1.0 and meter.read_j() == 1.25


class FakeGpu:
    """A device whose SM clock changes; ``_sleep(cycles)`` spins ``cycles`` SM cycles."""

    def __init__(self, mhz: float) -> None:
        self.mhz = mhz

    def sleep_s(self, cycles: int) -> float:
        return cycles / (self.mhz * 1e6)


@pytest.mark.parametrize("with_reader", [True, False])
def test_cycle_clock_follows_a_clock_change(with_reader: bool) -> None:
    """Calibrated at 1980 MHz; the clock falls to 990 MHz (a power cap, throttling). A fixed count
    would double every wait. Reading the clock fixes the next wait at once; without a reader the
    measured waits recalibrate it within a few."""
    gpu = FakeGpu(1980.0)
    clock = CycleClock(1980e6, read_clock_mhz=(lambda: gpu.mhz) if with_reader else None)
    fixed = int(0.005 * 1980e6)
    assert gpu.sleep_s(clock.cycles(0.005)) == pytest.approx(0.005)
    gpu.mhz = 990.0
    assert gpu.sleep_s(fixed) == pytest.approx(0.010)  # what a once-calibrated count does
    errors = []
    for _ in range(8):
        cycles = clock.cycles(0.005)
        took = gpu.sleep_s(cycles)
        errors.append(abs(took - 0.005) / 0.005)
        clock.observe(cycles, took)
    if with_reader:
        assert max(errors) < 1e-9
    else:
        assert errors[0] == pytest.approx(1.0)  # the first wait after the change is twice as long
        assert errors[-1] < 0.01 and errors == sorted(errors, reverse=True)
    # and back up: the clock rises again
    gpu.mhz = 1980.0
    for _ in range(8):
        cycles = clock.cycles(0.005)
        clock.observe(cycles, gpu.sleep_s(cycles))
    assert abs(gpu.sleep_s(clock.cycles(0.005)) - 0.005) / 0.005 < 0.01


def test_cycle_clock_ignores_short_waits_and_glitches() -> None:
    clock = CycleClock(1e9)
    clock.observe(100_000, 1e-4)  # 0.1 ms: too coarse to learn from
    clock.observe(10_000_000, 1.0)  # 100x slower: a preempted stream, not the clock
    clock.observe(0, 0.01)
    assert clock.cycles_per_s == 1e9 and clock.history == []
    with pytest.raises(ValueError, match="cycles_per_s"):
        CycleClock(0.0)
    assert clock.cycles(0.0) == 0 and clock.cycles(-1.0) == 0


def test_cycle_clock_keeps_its_rate_when_the_clock_read_fails() -> None:
    readings = iter([1980.0, float("nan")])

    def read() -> float:
        try:
            return next(readings)
        except StopIteration:
            raise RuntimeError("NVML gone") from None

    clock = CycleClock(1980e6, read_clock_mhz=read)
    assert clock.cycles(0.001) == int(0.001 * 1980e6)  # NaN: the last conversion
    assert clock.cycles(0.001) == int(0.001 * 1980e6)  # an exception: the same


def test_measured_summary_of_the_cpu_proxy_and_of_nvml() -> None:
    rng = np.random.default_rng(0)
    base = rng.uniform(0.9, 1.1, (20, 2))
    paced = base * 0.95
    per_run, vs, top = measured_summary("cpu_time_proxy", {"none": base, "pid": paced}, block=5)
    assert per_run["none"]["cpu_time_total_s"] == pytest.approx(base.sum())
    assert per_run["pid"]["energy_source"] == "cpu_time_proxy"
    assert vs["pid"]["cpu_time_change_frac"] == pytest.approx(-0.05)
    assert vs["pid"]["cpu_time_change_ci95_frac"] >= 0.0
    assert "proxy" in top["energy_measured"]["what"] and "not joules" in top["energy_measured"]["what"]
    per_run, vs, _ = measured_summary("nvml", {"none": base * 300, "pid": paced * 300})
    assert per_run["pid"]["energy_per_iteration_j"] == pytest.approx((paced * 300).sum(axis=1).mean())
    assert vs["pid"]["energy_change_frac"] == pytest.approx(-0.05)
