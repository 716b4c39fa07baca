"""GPU power profiles: the power one GPU draws in each state of a training iteration.

A profile (``cluster.power=<name>``, :data:`POWER_PROFILES`) gives the power of one GPU, in watts:

- **compute**, as a function of the SM clock ``f``: a table over the clocks the GPU type allows
  (``clocks_mhz``, ascending), interpolated linearly between them. The shipped tables follow the
  CMOS dynamic-power law ``P(f) = P_static + P_dyn * (f / f_max) * (V(f) / V_max)^2``
  (:func:`dvfs_table`), anchored at the datasheet board power at the maximum clock; compute-bound
  time scales with ``f_max / f`` (the clock actuator, :mod:`pacectl.energy`);
- **transfer**: inside a collective while data moves (after the last rank arrived);
- **spin**: waiting inside a collective while spinning (NCCL's kernels and proxy thread busy-poll);
- **sleep**: a pacing delay (a device-side ``torch.cuda._sleep`` kernel or a host sleep with no
  work queued), and a collective wait in ``sleep_wait`` mode;
- **idle**: nothing running (the GPU's floor with its context alive).

Every number carries its source in :attr:`PowerProfile.sources`: a datasheet, a published
measurement, or ``assumed: ...`` with the reason. The assumed ones (the spinning, sleeping and
transfer powers above all; the voltage curve's shape) are the parameters an energy result depends
on: :mod:`pacectl.energy` reports the time spent in each state beside the energy, so a result can be
recomputed at any other power, and ``experiments/energy/`` reports the savings across a range of
the spinning power. The GPU check (``experiments/gpu_check/``) measures the H200's power computing,
spinning, sleeping and idle; its record replaces the assumed H200 entries once a device is lent.

Example:
    >>> p = power_profile("h100_sxm")
    >>> round(float(p.compute_power_w(1.0)))
    700
    >>> p.spin_w >= p.sleep_w
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pacectl.errors import ConfigError, did_you_mean

FloatArray = NDArray[np.float64]

#: The states a GPU's time is attributed to, in report order (:mod:`pacectl.energy`).
STATES = ("compute", "transfer", "spin_wait", "sleep_wait", "pacing_sleep", "other")


@dataclass(frozen=True)
class PowerProfile:
    """The power one GPU draws in each state (watts), with the source of every number.

    Args:
        name: the profile's name (``cluster.power=<name>``).
        gpu: the GPU type, as its datasheet names it.
        clocks_mhz: the SM clocks the GPU allows, ascending, MHz (the clock actuator's choices).
        compute_w: power while computing at each of ``clocks_mhz``, W (non-decreasing).
        transfer_w, spin_w, sleep_w, idle_w: the power of each state of the module docstring, W.
        other_w: power for the rest of an iteration (not computing, outside the paced collective:
            other communication, pipeline bubbles, host gaps), W. ``None`` means ``spin_w``: ranks
            blocked in p2p or other collectives spin as in the paced one.
        sources: field name -> where its number comes from (``"assumed: ..."`` for assumptions).

    Raises:
        ConfigError: an empty or unsorted clock table, a table of another length, a power that is
            negative or not finite, or a compute power that falls as the clock rises.
    """

    name: str
    gpu: str
    clocks_mhz: tuple[float, ...]
    compute_w: tuple[float, ...]
    transfer_w: float
    spin_w: float
    sleep_w: float
    idle_w: float
    other_w: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clocks = np.asarray(self.clocks_mhz, dtype=np.float64)
        power = np.asarray(self.compute_w, dtype=np.float64)
        where = f"power profile {self.name!r}"
        if clocks.ndim != 1 or len(clocks) < 1 or not np.all(np.isfinite(clocks)) or (clocks <= 0).any():
            raise ConfigError(
                f"{where}: clocks_mhz must be a non-empty list of clocks > 0 MHz, got {self.clocks_mhz!r}"
            )
        if (np.diff(clocks) <= 0).any():
            raise ConfigError(f"{where}: clocks_mhz must be strictly ascending, got {self.clocks_mhz!r}")
        if power.shape != clocks.shape:
            raise ConfigError(
                f"{where}: compute_w must give one power per clock ({len(clocks)}), got {len(power)}"
            )
        if (np.diff(power) < 0).any():
            raise ConfigError(f"{where}: compute_w must not fall as the clock rises, got {self.compute_w!r}")
        for key in ("transfer_w", "spin_w", "sleep_w", "idle_w"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{where}: {key} must be a finite power >= 0 W, got {value!r}")
        if not (np.all(np.isfinite(power)) and (power >= 0).all()):
            raise ConfigError(f"{where}: compute_w must be finite powers >= 0 W, got {self.compute_w!r}")

    # --- clocks --------------------------------------------------------------------------------

    @property
    def max_clock_mhz(self) -> float:
        """The highest SM clock the GPU allows, MHz (clock fraction 1)."""
        return float(self.clocks_mhz[-1])

    @property
    def min_clock_frac(self) -> float:
        """The lowest allowed clock as a fraction of the highest (the clock actuator's floor)."""
        return float(self.clocks_mhz[0]) / self.max_clock_mhz

    @property
    def clock_fracs(self) -> FloatArray:
        """``float64[num_clocks]``: the allowed clocks as fractions of the highest, ascending."""
        return np.asarray(self.clocks_mhz, dtype=np.float64) / self.max_clock_mhz

    def compute_power_w(self, clock_frac: ArrayLike) -> FloatArray:
        """Power computing at ``clock_frac`` of the highest clock (linear between the table's clocks,
        clamped to the table's ends), W, the shape of ``clock_frac``."""
        return np.interp(
            np.asarray(clock_frac, dtype=np.float64), self.clock_fracs, np.asarray(self.compute_w)
        )

    def clock_for_power(self, power_w: ArrayLike) -> FloatArray:
        """The highest clock fraction whose compute power is at most ``power_w`` (the inverse of
        :meth:`compute_power_w`, clamped to the allowed clocks), the shape of ``power_w``.

        Used by the node power cap (:class:`pacectl.fabric.powercap.NodePowerCap`): a GPU given a
        share of the node's power runs at the clock that share buys.
        """
        power = np.asarray(self.compute_w, dtype=np.float64)
        fracs = self.clock_fracs
        if len(power) == 1 or power[-1] == power[0]:
            return np.full(np.shape(power_w), fracs[-1])
        # a flat stretch of the table maps to its highest clock
        keep = np.concatenate([np.diff(power) > 0, [True]])
        return np.interp(np.asarray(power_w, dtype=np.float64), power[keep], fracs[keep])

    def snap_clock_up(self, clock_frac: ArrayLike) -> FloatArray:
        """The lowest allowed clock at or above each ``clock_frac`` (the highest where none is),
        the shape of ``clock_frac``: the clock actuator sets a clock the GPU type has, never a
        slower one than the delay asks for (the rest of the delay is slept)."""
        fracs = self.clock_fracs
        c = np.asarray(clock_frac, dtype=np.float64)
        idx = np.searchsorted(fracs, c - 1e-12, side="left")
        return fracs[np.minimum(idx, len(fracs) - 1)]

    # --- states --------------------------------------------------------------------------------

    @property
    def other_power_w(self) -> float:
        """Power of the ``other`` state (``other_w``, or ``spin_w`` when unset), W."""
        return float(self.spin_w if self.other_w is None else self.other_w)

    def state_power_w(self) -> dict[str, float]:
        """Power of every non-compute state of :data:`STATES` (compute at the highest clock), W."""
        return {
            "compute": float(self.compute_w[-1]),
            "transfer": float(self.transfer_w),
            "spin_wait": float(self.spin_w),
            "sleep_wait": float(self.sleep_w),
            "pacing_sleep": float(self.sleep_w),
            "other": self.other_power_w,
        }

    def with_powers(self, **watts: float) -> PowerProfile:
        """A copy with some state powers replaced (``spin_w=...``); their sources say so."""
        sources = dict(self.sources)
        for key, value in watts.items():
            sources[key] = f"set to {value:g} W for this analysis"
        return replace(self, sources=sources, **watts)  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        """JSON-ready: the name, GPU, the powers of every state, the clock range and the sources."""
        return {
            "name": self.name,
            "gpu": self.gpu,
            "compute_w_at_max_clock": float(self.compute_w[-1]),
            "compute_w_at_min_clock": float(self.compute_w[0]),
            "max_clock_mhz": self.max_clock_mhz,
            "min_clock_mhz": float(self.clocks_mhz[0]),
            "transfer_w": float(self.transfer_w),
            "spin_w": float(self.spin_w),
            "sleep_w": float(self.sleep_w),
            "idle_w": float(self.idle_w),
            "other_w": self.other_power_w,
            "sources": dict(self.sources),
        }


def uniform_profile(
    watts: float, *, name: str = "uniform", clocks_mhz: tuple[float, ...] = (500.0, 1000.0)
) -> PowerProfile:
    """Every state at ``watts`` (compute at every clock too): the null profile, under which energy is
    power times time, so any run's energy is no pacing's times its time ratio."""
    return PowerProfile(
        name=name,
        gpu="none (all states equal)",
        clocks_mhz=clocks_mhz,
        compute_w=tuple(float(watts) for _ in clocks_mhz),
        transfer_w=watts,
        spin_w=watts,
        sleep_w=watts,
        idle_w=watts,
        sources={"all": f"every state at {watts:g} W (the null profile)"},
    )


def dvfs_table(
    clocks_mhz: ArrayLike, *, static_w: float, max_w: float, v_min_frac: float, knee_frac: float
) -> tuple[float, ...]:
    """Compute power at each clock from the CMOS dynamic-power law, W.

    ``P(f) = static_w + (max_w - static_w) * (f / f_max) * (V(f) / V_max)^2``, where the voltage is
    at its floor ``v_min_frac * V_max`` up to ``knee_frac * f_max`` and rises linearly to ``V_max``
    at ``f_max`` (dynamic power ``C V^2 f``: Weste and Harris, "CMOS VLSI Design", 4th ed., sec.
    5.1; GPU DVFS keeps a voltage floor below a knee clock, as the measured power-frequency curves
    of Zeus (You et al., NSDI'23) and Perseus (Chung et al., SOSP'24) flatten at low clocks).

    Args:
        clocks_mhz: ascending clocks, MHz; the last is ``f_max``.
        static_w: power at a clock near 0 (leakage, memory, board), W.
        max_w: power at ``f_max``, W.
        v_min_frac: voltage floor as a fraction of the voltage at ``f_max``, in (0, 1].
        knee_frac: clock fraction up to which the voltage stays at its floor, in [0, 1).

    Returns:
        One power per clock, W, non-decreasing.
    """
    f = np.asarray(clocks_mhz, dtype=np.float64)
    c = f / f[-1]
    v = np.where(
        c <= knee_frac, v_min_frac, v_min_frac + (1.0 - v_min_frac) * (c - knee_frac) / (1.0 - knee_frac)
    )
    p = static_w + (max_w - static_w) * c * v**2
    return tuple(float(x) for x in p)


def _clocks(low: float, high: float, step: float) -> tuple[float, ...]:
    n = round((high - low) / step)
    return tuple(float(low + i * step) for i in range(n + 1))


# Shape of the voltage curve (shared by the shipped profiles): assumed, see dvfs_table.
_V_MIN_FRAC = 0.7
_KNEE_FRAC = 0.5
_CURVE = (
    "dvfs_table: the CMOS law P = P_static + P_dyn (f/f_max) (V/V_max)^2 anchored at the datasheet board "
    f"power at the maximum clock and at idle_w near 0; voltage floor {_V_MIN_FRAC} V_max below "
    f"{_KNEE_FRAC} f_max (assumed shape, until the GPU check measures a GEMM at several clocks)"
)

_H100_CLOCKS = _clocks(345.0, 1980.0, 15.0)
_A100_CLOCKS = _clocks(210.0, 1410.0, 15.0)

#: The shipped profiles, by name (``cluster.power=<name>``).
POWER_PROFILES: dict[str, PowerProfile] = {
    "h100_sxm": PowerProfile(
        name="h100_sxm",
        gpu="NVIDIA H100 SXM5 80GB",
        clocks_mhz=_H100_CLOCKS,
        compute_w=dvfs_table(
            _H100_CLOCKS, static_w=70.0, max_w=700.0, v_min_frac=_V_MIN_FRAC, knee_frac=_KNEE_FRAC
        ),
        transfer_w=200.0,
        spin_w=120.0,
        sleep_w=80.0,
        idle_w=70.0,
        sources={
            "compute_w": "700 W at 1980 MHz: the board power (TDP, 'up to 700 W') of the NVIDIA H100 Tensor Core "
            "GPU datasheet, assumed reached by compute-bound training kernels at the maximum clock; "
            + _CURVE,
            "clocks_mhz": "1980 MHz maximum boost clock (NVIDIA H100 SXM5); 345-1980 MHz in 15 MHz steps as "
            "nvidia-smi -q -d SUPPORTED_CLOCKS lists them for H100 SXM5 (not read on a device here)",
            "idle_w": "assumed: 70 W, a typical idle reading of an H100 SXM5 with its context alive (P0); "
            "the GPU check measures it on H200",
            "spin_w": "assumed: 120 W, the busy-wait of a stalled collective measured on MI250X in the RCCL "
            "discussions (120-130 W, the one published figure); the GPU check measures an NCCL-like busy-wait",
            "sleep_w": "assumed: idle + 10 W (a one-block torch.cuda._sleep kernel, or a host sleep with nothing "
            "queued); the GPU check measures _sleep",
            "transfer_w": "assumed: 200 W, NCCL's copy and reduction kernels on a few SMs plus NVLink and NIC "
            "traffic; equal in every run of a fixed-duration model, so it moves no comparison there",
            "other_w": "= spin_w: ranks blocked in p2p or other collectives spin as in the paced one (assumed)",
        },
    ),
    "h200_sxm": PowerProfile(
        name="h200_sxm",
        gpu="NVIDIA H200 SXM 141GB",
        clocks_mhz=_H100_CLOCKS,
        compute_w=dvfs_table(
            _H100_CLOCKS, static_w=75.0, max_w=700.0, v_min_frac=_V_MIN_FRAC, knee_frac=_KNEE_FRAC
        ),
        transfer_w=200.0,
        spin_w=120.0,
        sleep_w=85.0,
        idle_w=75.0,
        sources={
            "compute_w": "700 W at 1980 MHz: the maximum thermal design power ('up to 700 W', configurable) of "
            "the NVIDIA H200 Tensor Core GPU datasheet, assumed reached by compute-bound training kernels at "
            "the maximum clock; " + _CURVE,
            "clocks_mhz": "the H100 SXM5's (same GH100 die, 1980 MHz maximum boost), not read on a device here",
            "idle_w": "assumed: 75 W (the H100's idle plus its larger HBM3e); to be replaced by the GPU check's "
            "measured idle power (experiments/gpu_check, waiting for a device)",
            "spin_w": "assumed: 120 W as h100_sxm (RCCL MI250X busy-wait 120-130 W); to be replaced by the GPU "
            "check's measured NCCL-like busy-wait",
            "sleep_w": "assumed: idle + 10 W; to be replaced by the GPU check's measured torch.cuda._sleep power",
            "transfer_w": "assumed: 200 W as h100_sxm",
            "other_w": "= spin_w (assumed)",
        },
    ),
    "a100_sxm": PowerProfile(
        name="a100_sxm",
        gpu="NVIDIA A100 SXM4 80GB",
        clocks_mhz=_A100_CLOCKS,
        compute_w=dvfs_table(
            _A100_CLOCKS, static_w=62.0, max_w=400.0, v_min_frac=_V_MIN_FRAC, knee_frac=_KNEE_FRAC
        ),
        transfer_w=150.0,
        spin_w=90.0,
        sleep_w=70.0,
        idle_w=62.0,
        sources={
            "compute_w": "400 W at 1410 MHz: the maximum TDP of the NVIDIA A100 80GB SXM4 datasheet, assumed "
            "reached by compute-bound training kernels at the maximum clock (Zeus, NSDI'23, trains at the "
            "A100's 400 W limit by default); " + _CURVE,
            "clocks_mhz": "1410 MHz boost clock (NVIDIA A100 architecture whitepaper); 210-1410 MHz in 15 MHz "
            "steps as nvidia-smi -q -d SUPPORTED_CLOCKS lists them for A100 SXM4 (not read on a device here)",
            "idle_w": "62 W: a published idle measurement of a DGX A100 80GB GPU (github.com/chuyishang/"
            "inference-energy, results_paste.md: 'Idle power: 62.12 W')",
            "spin_w": "assumed: 90 W (idle plus a busy-polling kernel's share, scaled from the MI250X 120-130 W)",
            "sleep_w": "assumed: idle + 8 W",
            "transfer_w": "assumed: 150 W",
            "other_w": "= spin_w (assumed)",
        },
    ),
}

#: How a pacing delay is applied (``backend.actuator``).
ACTUATORS = ("delay", "clock")
#: ``backend.actuator``: an actuator, or ``both`` (every controller with each, delay first)
ACTUATOR_CHOICES = (*ACTUATORS, "both")


def check_actuator(value: object) -> str:
    """``backend.actuator`` as given, or a ConfigError naming the choices."""
    if value not in ACTUATORS:
        raise ConfigError(
            f"backend.actuator must be one of {list(ACTUATORS)}, got {value!r}; e.g. backend.actuator=clock "
            "(run the early rank's compute slower instead of sleeping)"
        )
    return str(value)


def clock_for_delay(
    compute_s: FloatArray, delay_s: FloatArray, power: PowerProfile
) -> tuple[FloatArray, FloatArray]:
    """The clock actuator: the clock at which ``compute_s`` absorbs ``delay_s``, and what is left to sleep.

    Compute-bound time scales with ``f_max / f``, so running ``W`` seconds of compute (at the highest
    clock) at clock fraction ``c`` takes ``W / c``: the delay ``d`` is absorbed at ``c = W / (W + d)``.
    The clock is the lowest the GPU type allows at or above that (:meth:`PowerProfile.snap_clock_up`,
    so the compute never ends later than the delay asks), and the rest ``d - W (1 / c - 1)`` is slept.

    Args:
        compute_s: compute to slow, seconds at the highest clock (any shape, >= 0).
        delay_s: pacing delays, seconds (the same shape, >= 0).
        power: the profile whose clocks are allowed.

    Returns:
        ``(clock_frac, sleep_s)``, each the shape of the inputs; clock 1 and the whole delay slept
        where there is no compute or no delay.
    """
    w = np.asarray(compute_s, dtype=np.float64)
    d = np.asarray(delay_s, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        target = np.where((w > 0) & (d > 0), w / (w + d), 1.0)
    clock = power.snap_clock_up(target)
    stretch = np.where(w > 0, w / clock - w, 0.0)
    return clock, np.maximum(d - stretch, 0.0)


#: The profile of a cluster that names none (the default dgx_superpod profile's DGX H100 nodes).
DEFAULT_POWER = "h100_sxm"


def power_profile(name: object, *, key: str = "cluster.power") -> PowerProfile:
    """The shipped profile called ``name`` (None: :data:`DEFAULT_POWER`).

    Raises:
        ConfigError: an unknown name, with the known ones and a "did you mean".
    """
    if name is None:
        name = DEFAULT_POWER
    if isinstance(name, PowerProfile):
        return name
    if not isinstance(name, str) or name not in POWER_PROFILES:
        close = did_you_mean(str(name), sorted(POWER_PROFILES))
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ConfigError(
            f"{key} must be one of {sorted(POWER_PROFILES)}, got {name!r}{hint}; e.g. {key}={DEFAULT_POWER}"
        )
    return POWER_PROFILES[name]
