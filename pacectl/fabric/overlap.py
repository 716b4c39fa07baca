"""Bucketed backward in the simulator: DDP's gradient all-reduce in buckets, overlapped with the
rest of backward, and the on-device compute/communication contention that overlap brings.

The profile's ``buckets`` section (``conf/cluster/dgx_superpod.yaml``) turns it on; ``count: 1`` (the
default) does not run this module: the single all-reduce model of :mod:`pacectl.backends.sim`
(``tests/test_buckets.py`` checks this engine with one bucket against it, bit for bit).

One iteration of rank ``r`` with ``B`` buckets (all times from the iteration start)::

    c_r          the rank's compute time (W_r plus early-arrival interference, as in the single
                 all-reduce model, with each peer waiting from the end of its compute: W_r + d_r
                 with the host pacer, whose sleep holds backward back; W_r with the device pacer,
                 whose delay sits on the comm stream at bucket 0 while the rank computes on and
                 then spins), split into segments: forward + the backward of bucket 0, then
                 the backward of bucket k for k = 1..B-1 (``forward_frac``, ``compute``)
    p_r,k        when rank r has produced bucket k (the end of segment k)
    a_r,0        p_r,0 + d_r: the pacing delay acts before bucket 0's collective, as the live pacer
                 does (its first-bucket comm hook)
    a_r,k        max(p_r,k, E_k-1) for k >= 1: one communication stream, so bucket k's collective
                 runs after bucket k-1's (NCCL serialises collectives of one communicator)
    S_k          max_r a_r,k: bucket k's all-reduce starts when every rank has produced it
    E_k          S_k + T_k(t_iter + S_k): its duration from the bucket's own comm model (the
                 profile's collective with ``message_bytes`` times the bucket's size; every bucket
                 pays the full latency terms), started at absolute time t_iter + S_k
    iteration    E_B-1: the optimizer step waits for the last bucket (every p_r,k <= S_k)

The rest of backward (segments 1..B-1) overlaps the collectives: it starts at ``p_r,0`` with the
device pacer (``pacer: device``: pacectl's CUDA pacer waits on the communication stream, the host
is not blocked) and at ``p_r,0 + d_r`` with the host pacer (``pacer: host``: pacectl's CPU/gloo
pacer sleeps on the training thread, which holds back the rest of backward: the third way of
:mod:`pacectl.fabric` in which a per-rank delay can change an iteration).

**On-device contention** (``overlap_slowdown``, ``g``): while rank r's collective kernels are
resident on its GPU, its overlapped compute runs ``1 + g`` times longer. They are resident from
the rank's entry into the collective (``a_r,k``: a spinning wait occupies SMs, as NCCL's kernels
do while they wait for their peers) to its end ``E_k``; a rank that waits asleep
(``Action.wait == "sleep"``, ``controller=sleep_wait``) occupies them only from ``S_k``; a pacing
delay occupies nothing (the kernel is not launched until the delay ends). So pacing an early
rank at bucket 0 shortens its own spinning and with it the slowdown of its remaining backward: the
lever the CUDA pacer has. The default, 0.189, is the mean computational slowdown of compute
overlapped with communication that Lee et al. measured ("Characterizing Compute-Communication
Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power Implications",
arXiv 2507.03114, 2025: GPT and LLaMA models on 4 A100, H100, MI250 and MI210; maximum 0.40) on
transferring collectives; applying it to a spinning wait is an assumption (its CTAs occupy the
same SMs, but move no data). It is a compute-side mechanism of ``comm=contention``: with
``comm=null`` or ``alpha_beta`` the factor is 0 and the bucketed model is max-plus (no delay
shortens an iteration; delays within earliness at bucket 0 change nothing with the device pacer:
tested as properties).

**Where the noise lands** (``noise``): ``spread`` (the default) splits each rank's compute time,
noise included, by the segment fractions, so a rank late at bucket 0 is late, in proportion, at
every bucket; ``instant`` splits the nominal part (``min(c_r, compute_s)``) by the fractions and
puts the excess over ``compute_s`` into one segment, drawn at a uniformly random instant of the
compute (a hiccup: a GC pause or page fault happens at one point of the iteration). Both are
scenario choices; the draws of ``instant`` come from their own stream (``default_rng([seed,
23])``), so the compute times are those of the single all-reduce model.

Not modelled: FSDP-style parameter prefetch or pipeline point-to-point traffic sharing the node's
NICs; ``backend.record=true``, ``backend.actuator=clock`` and a node power cap with more than one
bucket are refused. The energy account of a bucketed run treats its states as disjoint (compute,
the wait and the transfer of bucket 0), although backward overlaps the collectives: its energy
figures are approximate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from pacectl.checks import Checked, within
from pacectl.errors import ConfigError

FloatArray = NDArray[np.float64]

PACERS = ("device", "host")
NOISE_PLACEMENTS = ("spread", "instant")
#: the default overlap slowdown (Lee et al., arXiv 2507.03114: module docstring)
SOURCED_OVERLAP_SLOWDOWN = 0.189
#: forward's share of the compute: backward costs about twice forward's FLOPs (Kaplan et al.,
#: "Scaling Laws for Neural Language Models", 2020: 2N forward and 4N backward FLOPs per token)
FORWARD_FRAC = 1.0 / 3.0


_FRACTIONS = "a list of numbers > 0 (fractions summing to 1), or null"


@dataclass(frozen=True)
class BucketedBackward(Checked):
    """The ``cluster.buckets`` section, checked (see the module docstring for the model).

    Args:
        count: gradient buckets, >= 1 (1: one all-reduce after all compute).
        sizes: fractions of the gradient bytes per bucket, bucket 0 first (DDP's reverse order:
            the last layers' gradients, produced first in backward), each > 0, summing to 1;
            None: ``count`` equal buckets.
        compute: fractions of the backward compute per bucket, same rules; None: as ``sizes``
            (backward FLOPs in proportion to the parameters).
        forward_frac: forward's share of the compute time, in [0, 1).
        overlap_slowdown: ``g`` >= 0: overlapped compute runs ``1 + g`` times longer while the
            rank's collective kernels are resident.
        pacer: ``"device"`` or ``"host"``.
        noise: ``"spread"`` or ``"instant"``.

    Raises:
        ConfigError: one line naming the ``cluster.buckets`` key.
    """

    section: ClassVar[str] = "cluster.buckets"
    count: int = within(1, ">= 1")
    sizes: tuple[float, ...] | None = within(None, "> 0", what=_FRACTIONS)
    compute: tuple[float, ...] | None = within(None, "> 0", what=_FRACTIONS)
    forward_frac: float = within(FORWARD_FRAC, "[0, 1)")
    overlap_slowdown: float = within(SOURCED_OVERLAP_SLOWDOWN, ">= 0")
    pacer: str = within("device", choices=PACERS)
    noise: str = within("spread", choices=NOISE_PLACEMENTS)

    def __post_init__(self) -> None:
        super().__post_init__()
        key = self.section
        for name in ("sizes", "compute"):
            value = getattr(self, name)
            if value is None:
                continue
            example = f"'{key}.{name}=[" + ",".join(["0.25"] * 4) + "]'"
            if len(value) != self.count:
                raise ConfigError(
                    f"{key}.{name} must have one fraction per bucket ({key}.count={self.count}), got "
                    f"{len(value)}: {list(value)!r}; set {key}.count={len(value)}, or e.g. {example} with "
                    f"{key}.count=4"
                )
            if abs(math.fsum(value) - 1.0) > 1e-6:
                raise ConfigError(
                    f"{key}.{name} must sum to 1 (fractions of the gradient bytes / backward compute), "
                    f"got {list(value)!r} (sum {math.fsum(value):.6g}); e.g. {example} with {key}.count=4"
                )

    @property
    def size_fractions(self) -> tuple[float, ...]:
        """Each bucket's fraction of the gradient bytes (normalised to sum to 1)."""
        return _normalised(self.sizes if self.sizes is not None else (1.0,) * self.count)

    @property
    def compute_fractions(self) -> tuple[float, ...]:
        """Each bucket's fraction of the backward compute (normalised to sum to 1)."""
        return self.size_fractions if self.compute is None else _normalised(self.compute)

    def produced_fractions(self) -> FloatArray:
        """``q_k``: the fraction of the compute done when bucket k is produced, ``float64[count]``;
        the last is exactly 1 (so one bucket produces at exactly the compute time)."""
        back = np.cumsum(self.compute_fractions)
        q = self.forward_frac + (1.0 - self.forward_frac) * back
        q[-1] = 1.0
        return q


def _normalised(values: Sequence[float]) -> tuple[float, ...]:
    total = math.fsum(values)
    return tuple(float(v) / total for v in values)


class BucketEngine:
    """One bucketed iteration of every rank, vectorised over ranks (the simulator's hook).

    Args:
        spec: the checked ``cluster.buckets`` section.
        comms: one communication model per bucket (``time_s(start_s)``), bucket 0 first.
        nominal_compute_s: ``compute_s`` of the profile (``noise: instant`` moves the excess over it).
        overlap_slowdown: the factor in force (``spec.overlap_slowdown`` with ``comm=contention``,
            0 with a max-plus comm model); None: the spec's.
    """

    def __init__(
        self,
        spec: BucketedBackward,
        comms: Sequence[Any],
        *,
        nominal_compute_s: float,
        overlap_slowdown: float | None = None,
    ) -> None:
        if len(comms) != spec.count:
            raise ValueError(f"BucketEngine needs one comm model per bucket ({spec.count}), got {len(comms)}")
        self.spec = spec
        self.comms = tuple(comms)
        self.count = spec.count
        self.nominal_s = float(nominal_compute_s)
        self.slowdown = float(spec.overlap_slowdown if overlap_slowdown is None else overlap_slowdown)
        self.host_pacer = spec.pacer == "host"
        self._q = spec.produced_fractions()
        self._seg = np.diff(np.concatenate([[0.0], self._q]))  # each segment's share of the compute
        self._rng = np.random.default_rng([0, 23])

    @property
    def timing_dependent(self) -> bool:
        """Whether the overlap slowdown can make durations depend on when ranks run."""
        return self.count > 1 and self.slowdown > 0

    @property
    def description(self) -> str:
        """One line for reports."""
        sizes = ", ".join(f"{s:.3g}" for s in self.spec.size_fractions)
        return (
            f"bucketed backward ({self.count} buckets of {sizes} of the gradient bytes, forward "
            f"{self.spec.forward_frac:.3g} of compute, overlap slowdown {self.slowdown:g}, "
            f"{self.spec.pacer} pacer, noise {self.spec.noise})"
        )

    def reset(self, seed: int) -> None:
        """Restart the ``noise: instant`` draws (their own stream, ``default_rng([seed, 23])``)."""
        self._rng = np.random.default_rng([seed, 23])

    def _produced(self, compute_s: FloatArray) -> FloatArray:
        """``float64[num_ranks, count]``: the end of each segment at full speed, the last exactly
        ``compute_s``."""
        if self.spec.noise == "spread" or self.count == 1:
            produced = compute_s[:, None] * self._q[None, :]
        else:
            excess = np.maximum(compute_s - self.nominal_s, 0.0)
            seg = (compute_s - excess)[:, None] * self._seg[None, :]
            where = np.searchsorted(self._q, self._rng.random(compute_s.shape[0]), side="right")
            where = np.minimum(where, self.count - 1)
            seg[np.arange(compute_s.shape[0]), where] += excess
            produced = np.cumsum(seg, axis=1)
        produced[:, -1] = compute_s
        return produced

    def run(
        self,
        compute_s: FloatArray,
        delay_s: FloatArray,
        *,
        asleep: bool,
        clock_s: float,
        produced: FloatArray | None = None,
    ) -> BucketRun:
        """One iteration.

        Args:
            compute_s: ``float64[num_ranks]`` each rank's compute time at full speed (seconds).
            delay_s: ``float64[num_ranks]`` the pacing delays before bucket 0's collective.
            asleep: whether the ranks wait asleep in the collectives (``Action.wait``).
            clock_s: absolute time of the iteration's start (the comm models' clock).
            produced: ``float64[num_ranks, count]`` the end of each segment at full speed, to set
                the segments directly (tests, other noise placements); None: from ``compute_s``
                and ``noise``.
        """
        if produced is None:
            produced = self._produced(compute_s)
        g = self.slowdown
        first = produced[:, 0]
        arrival = first + delay_s
        first_start = float(arrival.max())
        first_transfer = float(self.comms[0].time_s(clock_s + first_start))
        end = first_start + first_transfer
        if self.count == 1:
            return BucketRun(first, arrival, first_start, first_transfer, end, compute_s)
        # the rest of backward starts at p_r,0, or after the delay with the host pacer
        t = first + delay_s if self.host_pacer else first
        held = delay_s if self.host_pacer else 0.0
        lows: list[FloatArray | float] = [first_start if asleep else arrival]
        highs: list[float] = [end]
        for k in range(1, self.count):
            work = produced[:, k] - produced[:, k - 1]
            if g > 0:
                t = self._through(t, work, lows, highs, g)
            else:
                t = produced[:, k] + held
            ready = float(t.max())
            start = max(ready, end)
            dur = float(self.comms[k].time_s(clock_s + start))
            if g > 0 and k < self.count - 1:
                lows.append(start if asleep else np.maximum(t, end))
                highs.append(start + dur)
            end = start + dur
        compute_run = t - held  # compute as run: the slowdowns included, the host pacer's hold not
        return BucketRun(first, arrival, first_start, first_transfer, end, compute_run)

    @staticmethod
    def _through(
        t: FloatArray, work: FloatArray, lows: list[FloatArray | float], highs: list[float], g: float
    ) -> FloatArray:
        """When each rank finishes ``work`` seconds of full-speed compute started at ``t``, running
        ``1 + g`` times slower inside its occupancy intervals ``[lows[j], highs[j]]`` (disjoint, in
        order)."""
        left = work
        floor = float(t.min())
        for low, high in zip(lows, highs, strict=True):
            if high <= floor:
                continue  # over before any rank resumes
            fast = np.minimum(left, np.maximum(low - t, 0.0))
            t = t + fast
            left = left - fast
            span = np.maximum(high - np.maximum(t, low), 0.0)
            slow = np.minimum(left, span / (1.0 + g))
            t = t + slow * (1.0 + g)
            left = left - slow
        return t + left


@dataclass(frozen=True)
class BucketRun:
    """What one bucketed iteration gives the simulator (all from the iteration start, seconds).

    Attributes:
        natural_s: ``float64[num_ranks]`` when each rank produced bucket 0 (its natural arrival).
        arrival_s: ``float64[num_ranks]`` its arrival at bucket 0's collective (the paced one).
        start_s: when bucket 0's all-reduce started (its last arrival).
        transfer_s: bucket 0's transfer time.
        iteration_s: the end of the last bucket's all-reduce.
        compute_s: ``float64[num_ranks]`` each rank's compute as run (overlap slowdown included).
    """

    natural_s: FloatArray
    arrival_s: FloatArray
    start_s: float
    transfer_s: float
    iteration_s: float
    compute_s: FloatArray
