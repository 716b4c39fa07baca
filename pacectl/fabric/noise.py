"""Compute-time models: per-rank, per-iteration compute (forward + backward) time before the collective.

Each model is a component that turns a base compute time into ``float64[num_iterations, num_ranks]``
seconds, drawn from a seeded ``numpy.random.Generator`` (vectorized over iterations and ranks).
:class:`ComputeModel` applies its components in order. Sources for each shape are in the class
docstrings; the parameter values of a scenario are chosen and justified in ``conf/cluster/``.

**Streaming.** :meth:`ComputeModel.sample` draws every iteration at once (``num_iterations x
num_ranks`` values, 0.5 GB at 65,536 ranks x 1,000 iterations). :meth:`ComputeModel.stream` gives
the same values chunk by chunk of iterations (:class:`ComputeStream`), holding O(ranks x chunk):
each block of per-cell draws of ``sample`` (a component's ``rng.lognormal(size=(iterations,
ranks))``, say) gets its own generator, a copy of the model's taken where that block starts in the
one stream (:class:`Draws`), and is then filled row chunk by row chunk. numpy fills an array from
its generator element by element in C order, so consecutive chunks of rows from one generator are
the rows of one whole draw, bit for bit. The model's stream is then moved past the block (exactly,
with ``advance``, for uniform doubles; by drawing the block's bits and dropping them otherwise) for
what ``sample`` draws after it (the next block, a per-rank draw such as the slow ranks' choice).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from pacectl.checks import Checked, within
from pacectl.errors import ConfigError, TraceError

#: (iteration, rank) compute times a simulation draws at once (8 MiB of float64): a chunk of
#: iterations (``pacectl.backends.sim``), so that an episode holds O(ranks) of them whatever its
#: length (all of them when they fit)
DRAW_CELLS = 1 << 20

FloatArray = NDArray[np.float64]


#: a component's streamed form: ``(compute_s rows, first iteration) -> perturbed rows``
Rows = Callable[[FloatArray, int], FloatArray]

#: how a per-cell draw is skipped without being kept: a method that takes the same bits per value
#: (numpy's ``random_lognormal`` is ``exp`` of a standard normal, ``random_pareto`` is ``expm1`` of
#: a standard exponential over ``a``); uniform doubles take one 64-bit word each (``advance``)
_SKIP_AS = {"lognormal": "standard_normal", "normal": "standard_normal", "pareto": "standard_exponential"}


class CellDraws:
    """One per-cell draw of a compute model, ``float64[num_iterations, num_ranks]``, made chunk by
    chunk of rows from its own generator (a copy of the model's where the draw starts).

    Args:
        method: the ``numpy.random.Generator`` method (``"lognormal"``, ``"random"``, ...).
        args: its positional arguments before ``size``.
        num_ranks: the columns.
        state: the bit generator's state where the draw starts.
        bit_generator: the bit generator's class.
    """

    def __init__(
        self,
        method: str,
        args: tuple[Any, ...],
        num_ranks: int,
        state: Mapping[str, Any],
        bit_generator: type,
    ) -> None:
        self.method, self.args, self.num_ranks = method, args, num_ranks
        self._start = state
        self._bit_generator = bit_generator
        self.rewind()

    def rewind(self) -> None:
        """Start again at the draw's first row."""
        bits = self._bit_generator()
        bits.state = self._start
        self._rng = np.random.Generator(bits)

    def take(self, rows: int) -> FloatArray:
        """The next ``rows`` rows of the draw, ``float64[rows, num_ranks]``."""
        out: FloatArray = getattr(self._rng, self.method)(*self.args, size=(rows, self.num_ranks))
        return out


class Draws:
    """A compute model's random stream, handed out in :meth:`ComputeModel.sample`'s order.

    A component asks for its per-cell draws with :meth:`cells` and for anything else (per-rank
    draws, a series) from :meth:`generator`; both move the one stream exactly as the whole draws
    of ``sample`` would.

    Args:
        rng: the model's generator (moved as ``sample`` would move it).
        num_iterations: rows of every per-cell draw.
        num_ranks: its columns.
    """

    def __init__(self, rng: np.random.Generator, num_iterations: int, num_ranks: int) -> None:
        self._rng = rng
        self.num_iterations, self.num_ranks = int(num_iterations), int(num_ranks)
        self._pending: list[str] = []  # per-cell draws handed out that the stream has not passed yet
        self.blocks: list[CellDraws] = []

    def cells(self, method: str, *args: Any) -> CellDraws:
        """The per-cell draw ``rng.<method>(*args, size=(num_iterations, num_ranks))``, streamed."""
        self._catch_up()
        bits = self._rng.bit_generator
        block = CellDraws(method, args, self.num_ranks, bits.state, type(bits))
        self._pending.append(method)
        self.blocks.append(block)
        return block

    def generator(self) -> np.random.Generator:
        """The model's generator, past every per-cell draw handed out so far."""
        self._catch_up()
        return self._rng

    def _catch_up(self) -> None:
        """Move the stream past the pending per-cell draws, as drawing them whole would."""
        cells = self.num_iterations * self.num_ranks
        for method in self._pending:
            bits = self._rng.bit_generator
            if method == "random" and isinstance(bits, (np.random.PCG64, np.random.PCG64DXSM)):
                # default_rng's PCG64: one step per uniform double (53 bits of one 64-bit output);
                # advance also clears the buffered 32-bit half-word, which uniform doubles leave
                before: dict[str, Any] = dict(bits.state)
                bits.advance(cells)
                after: dict[str, Any] = dict(bits.state)
                after.update({k: before[k] for k in ("has_uint32", "uinteger") if k in before})
                setattr(bits, "state", after)  # noqa: B010 (numpy's stubs type the state narrower)
                continue
            skip = getattr(self._rng, _SKIP_AS.get(method, method))
            chunk = max(1, DRAW_CELLS // max(self.num_ranks, 1))
            for start in range(0, self.num_iterations, chunk):
                skip(size=(min(chunk, self.num_iterations - start), self.num_ranks))
        self._pending = []


class NoiseComponent(Protocol):
    """One source of compute-time variation."""

    def apply(self, compute_s: FloatArray, rng: np.random.Generator) -> FloatArray:
        """Return perturbed compute times, same shape ``[num_iterations, num_ranks]``, seconds."""
        ...

    def stream(self, draws: Draws) -> Rows:
        """Make ``apply``'s draws from ``draws`` in its order; return its streamed form (optional: a
        component without it makes :meth:`ComputeModel.stream` draw every iteration at once)."""
        ...


@dataclass(frozen=True)
class LognormalJitter(Checked):
    """i.i.d. multiplicative jitter: ``t * exp(N(-sigma^2/2, sigma^2))`` (mean-preserving).

    Args:
        sigma: log-space standard deviation, >= 0. Kernel-time jitter on a healthy GPU is about 1-2 %
            (Alibaba PAI per-worker mini-batch CV, median of job means 0.05-0.10 including data
            loading: shared/traces alibaba-pai-minibatch, reference figures).
    """

    section: ClassVar[str] = "lognormal"
    sigma: float = within(0.02, ">= 0")

    def apply(self, compute_s: FloatArray, rng: np.random.Generator) -> FloatArray:
        """Multiply by independent lognormal factors with mean 1."""
        factor = rng.lognormal(-0.5 * self.sigma**2, self.sigma, size=compute_s.shape)
        return compute_s * factor

    def stream(self, draws: Draws) -> Rows:
        """``apply`` chunk by chunk of iterations (module docstring)."""
        return partial(self._rows, draws.cells("lognormal", -0.5 * self.sigma**2, self.sigma))

    @staticmethod
    def _rows(factor: CellDraws, compute_s: FloatArray, start: int) -> FloatArray:
        return compute_s * factor.take(len(compute_s))


@dataclass(frozen=True)
class ParetoHiccups(Checked):
    """Rare heavy-tailed pauses (GC, page faults, ECC retries, thermal throttling) added to a rank.

    With probability ``prob`` per rank and iteration, the rank loses ``scale_s * (Pareto(alpha) + 1)``
    seconds (classical Pareto with minimum ``scale_s``). Synchronization amplifies them: with ``p``
    ranks, an iteration is hit with probability ``1 - (1 - prob)^p`` (Dean and Barroso, "The Tail at
    Scale", CACM 2013; Gopalan and Ali's "synchronization amplification").

    Args:
        prob: per-rank, per-iteration probability, in [0, 1].
        scale_s: minimum pause, seconds, > 0.
        alpha: Pareto tail index, > 1 (finite mean); smaller is heavier.
    """

    section: ClassVar[str] = "pareto"
    prob: float = within(0.002, "[0, 1]")
    scale_s: float = within(0.05, "> 0")
    alpha: float = within(2.5, "> 1")

    def apply(self, compute_s: FloatArray, rng: np.random.Generator) -> FloatArray:
        """Add pauses to a random subset of (iteration, rank) cells."""
        hit = rng.random(compute_s.shape) < self.prob
        pause = self.scale_s * (rng.pareto(self.alpha, size=compute_s.shape) + 1.0)
        return compute_s + np.where(hit, pause, 0.0)

    def stream(self, draws: Draws) -> Rows:
        """``apply`` chunk by chunk of iterations (module docstring). The pauses' draw takes the
        bits of ``rng.pareto``'s (numpy's ``random_pareto`` is ``expm1(E / alpha)`` of a standard
        exponential ``E``), and the pause is computed from ``E`` only where a hit needs it: with
        the C library's ``expm1`` (``math.expm1``), as numpy's generator does, not numpy's
        vectorised ``np.expm1``, whose last bit can differ."""
        return partial(self._rows, draws.cells("random"), draws.cells("standard_exponential"))

    def _rows(self, hits: CellDraws, exps: CellDraws, compute_s: FloatArray, start: int) -> FloatArray:
        hit = np.flatnonzero(hits.take(len(compute_s)) < self.prob)
        e = exps.take(len(compute_s)).reshape(-1)[hit].tolist()
        a, scale = float(self.alpha), float(self.scale_s)
        out = np.array(compute_s, dtype=np.float64)  # + 0.0 where no hit: the same values
        out.reshape(-1)[hit] += np.array([scale * (math.expm1(x / a) + 1.0) for x in e], dtype=np.float64)
        return out


@dataclass(frozen=True)
class PeriodicNoise(Checked):
    """OS-style periodic interruptions (daemons, timers): every ``period_iters`` iterations a rank
    loses ``duration_s``, with a per-rank random phase (Petrini et al., "The Case of the Missing
    Supercomputer Performance", SC 2003).

    Args:
        period_iters: period in iterations, >= 1.
        duration_s: lost time per interruption, seconds, >= 0.
    """

    section: ClassVar[str] = "periodic"
    period_iters: int = within(50, ">= 1")
    duration_s: float = within(0.01, ">= 0")

    def apply(self, compute_s: FloatArray, rng: np.random.Generator) -> FloatArray:
        """Add ``duration_s`` on the iterations where ``(k + phase_r) % period == 0``."""
        return self._rows(self._phases(rng, compute_s.shape[1]), compute_s, 0)

    def stream(self, draws: Draws) -> Rows:
        """``apply`` chunk by chunk of iterations (module docstring)."""
        return partial(self._rows, self._phases(draws.generator(), draws.num_ranks))

    def _phases(self, rng: np.random.Generator, num_ranks: int) -> NDArray[np.int64]:
        return np.asarray(rng.integers(0, self.period_iters, size=num_ranks), dtype=np.int64)

    def _rows(self, phase: NDArray[np.int64], compute_s: FloatArray, start: int) -> FloatArray:
        k = np.arange(start, start + len(compute_s))[:, None]
        return compute_s + np.where((k + phase[None, :]) % self.period_iters == 0, self.duration_s, 0.0)


@dataclass(frozen=True)
class SlowRanks(Checked):
    """Persistent locality penalty: some ranks are always slower (PCIe switch sharing, remote NUMA
    node, a NIC on the far socket), the "locality-driven variance" of Gopalan and Ali.

    Args:
        ranks: explicit rank indices that are slow; or
        fraction: share of ranks drawn at random (at reset) to be slow, in [0, 1].
        factor: compute-time multiplier of a slow rank, >= 1. Cross-socket PCIe/NUMA paths cost
            roughly 5-20 % bandwidth on dual-socket hosts (measured by e.g. Li et al., "Evaluating
            Modern GPU Interconnect", IEEE TPDS 2020); ByteDance job AR's injected worker is 2.36x.
    """

    section: ClassVar[str] = "slow_ranks"
    ranks: tuple[int, ...] = within((), ">= 0", what="a list of ranks (integers >= 0)")
    fraction: float = within(0.0, "[0, 1]")
    factor: float = within(1.1, ">= 1")

    def apply(self, compute_s: FloatArray, rng: np.random.Generator) -> FloatArray:
        """Multiply the slow ranks' columns by ``factor``."""
        return compute_s * self._factors(compute_s.shape[1], rng)[None, :]

    def _factors(self, num_ranks: int, rng: np.random.Generator | None) -> FloatArray:
        """``float64[num_ranks]``: ``factor`` on the slow ranks, 1 elsewhere (``rng``: None only
        without ``fraction``, which draws nothing)."""
        slow = np.zeros(num_ranks, dtype=bool)
        for r in self.ranks:
            if not 0 <= int(r) < num_ranks:
                raise ConfigError(f"slow_ranks.ranks entries must be in [0, {num_ranks}), got {r!r}")
            slow[int(r)] = True
        if self.fraction > 0:
            count = max(1, int(round(self.fraction * num_ranks)))
            assert rng is not None
            slow[rng.choice(num_ranks, size=count, replace=False)] = True
        return np.where(slow, self.factor, 1.0)

    def stream(self, draws: Draws) -> Rows:
        """``apply`` chunk by chunk of iterations (module docstring)."""
        rng = draws.generator() if self.fraction > 0 else None  # explicit ranks draw nothing
        return partial(self._rows, self._factors(draws.num_ranks, rng)[None, :])

    @staticmethod
    def _rows(factors: FloatArray, compute_s: FloatArray, start: int) -> FloatArray:
        return compute_s * factors


#: How :class:`EmpiricalSamples` fills the iterations between samples of a sampled series.
FILLS = ("ar1", "hold", "consecutive")


@dataclass(frozen=True)
class EmpiricalSamples:
    """Replay of real per-worker step-time variation from a step-level trace (Alibaba PAI
    ``job_*_norm.csv``: columns ``worker``, ``batch_time_norm``, and ``time`` or ``iteration`` for
    the order; without one, the file's row order), as multiplicative factors.

    Each worker's normalised times (truncated to the shortest worker's series) are divided by the
    job-wide mean; simulated rank ``r`` replays worker ``r mod num_workers`` from a random offset,
    cycling (Alibaba cluster-trace-gpu-v2020, Weng et al., "MLaaS in the Wild", NSDI 2022; CC BY 4.0).

    **Sampling.** The series may be sampled: the Alibaba PAI files record every 10th iteration
    (``time`` = 1, 11, 21, ...). The interval ``k`` is read from the ``time``/``iteration`` column
    (:func:`pacectl.traces.steplevel.sampling_interval`) or given as ``sample_every``, and ``fill``
    says how the ``k - 1`` iterations between two samples are filled:

    - ``ar1`` (default): an AR(1) bridge in log space, per worker: ``x_t = phi x_{t-1} + e_t`` with
      ``phi = rho_k ** (1 / k)``, ``rho_k`` the worker's lag-1 autocorrelation *of the samples* (lag
      ``k`` in iterations, clipped to [0.01, 0.99]) and the variance of its log factors, drawn
      conditionally on the two samples it joins (a Gaussian bridge: it passes through every recorded
      value). Its lag-``k`` autocorrelation therefore matches the data's; its lag-1 is ``phi``. The
      fill is an assumption (the data say nothing between samples), and every output that uses the
      model says so (:meth:`describe`).
    - ``hold``: each sample is held for ``k`` iterations.
    - ``consecutive``: the samples replay as consecutive iterations (the time axis compressed ``k``-fold).

    Args:
        path: CSV file with ``worker`` and ``batch_time_norm`` columns.
        fill: one of :data:`FILLS`.
        sample_every: iterations between samples; None reads it from the file (1 without a
            ``time``/``iteration`` column).

    Raises:
        ConfigError: a missing file or an unknown ``fill``.
        TraceError: the file is not such a CSV.
    """

    path: str = ""
    fill: str = "ar1"
    sample_every: int | None = None
    _factors: FloatArray = field(init=False, repr=False, compare=False)
    _interval: int = field(init=False, repr=False, compare=False, default=1)
    _rho: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        import pandas as pd

        from pacectl.traces.steplevel import sampling_interval

        if self.fill not in FILLS:
            raise ConfigError(f"empirical.fill must be one of {list(FILLS)}, got {self.fill!r}")
        p = Path(self.path)
        if not p.is_file():
            raise ConfigError(f"empirical.path must be an existing CSV file, got {self.path!r}")
        from pacectl.traces.csvstream import columns_excerpt, read_header, read_numeric_columns

        what = "empirical step-time file"
        header = read_header(p, what=what)
        missing = [c for c in ("worker", "batch_time_norm") if c not in header]
        if missing:
            raise TraceError(
                f"empirical step-time file must have columns worker, batch_time_norm; missing {missing}, "
                f"got {columns_excerpt(header)} (in {p})"
            )
        kept = [c for c in header if c in ("worker", "batch_time_norm", "time", "iteration")]
        got = read_numeric_columns(
            p, kept, what=what, header=header, max_bytes=1 << 30, max_rows=10_000_000, cap_hint="cut the file"
        )
        if got.bad_rows.count:
            raise TraceError(
                f"every row of an {what} must have {len(header)} fields like the header, got "
                f"{got.bad_rows.first_fields} in row {got.bad_rows.first_row} (in {p}); repair or drop it"
            )
        if got.num_rows == 0:
            raise TraceError(f"an {what} must hold at least one row, got none (in {p})")
        frame = pd.DataFrame(got.values)
        for col in ("worker", "time", "iteration"):
            if col in frame:
                v = frame[col].to_numpy()
                if not (np.isfinite(v).all() and (v == np.round(v)).all()):
                    raise TraceError(f"{col} must hold integers (in {p}: column {col})")
                frame[col] = v.astype(np.int64)
        values = frame["batch_time_norm"].to_numpy(np.float64)
        if not np.isfinite(values).all() or (values <= 0).any():
            raise TraceError(f"batch_time_norm must be finite and > 0 (in {p}: column batch_time_norm)")
        order = next((c for c in ("time", "iteration") if c in frame.columns), None)
        interval = int(self.sample_every or 1)
        if order is not None:  # each worker's series in recorded order, whatever the file's row order
            frame = frame.sort_values(["worker", order], kind="stable")
            interval = sampling_interval(
                frame[order].to_numpy(np.int64), source=str(p), column=order, sample_every=self.sample_every
            )
        groups = [g["batch_time_norm"].to_numpy(np.float64) for _, g in frame.groupby("worker", sort=True)]
        length = min(len(g) for g in groups)
        factors = np.stack([g[:length] for g in groups], axis=1)
        object.__setattr__(self, "_factors", factors / factors.mean())
        object.__setattr__(self, "_interval", interval)
        logs = np.log(factors)
        rho = np.array(
            [
                np.corrcoef(logs[:-1, w], logs[1:, w])[0, 1] if length > 2 else 0.0
                for w in range(logs.shape[1])
            ]
        )
        object.__setattr__(self, "_rho", np.clip(np.nan_to_num(rho, nan=0.0), 0.01, 0.99))

    @property
    def interval_iters(self) -> int:
        """Iterations between the file's samples."""
        return self._interval

    def describe(self) -> str:
        """One line for outputs: the file, its sampling and how the gaps are filled."""
        length, workers = self._factors.shape
        k = self._interval
        head = f"empirical step times from {Path(self.path).name}: {workers} workers x {length} samples"
        if k == 1:
            return f"{head}, one per iteration (nothing to fill)"
        if self.fill == "ar1":
            phi = self._rho ** (1.0 / k)
            how = (
                f"the {k - 1} iterations between samples filled by an AR(1) bridge in log space per worker "
                f"(phi = rho_{k}^(1/{k}) = {phi.min():.3f}-{phi.max():.3f}, from the samples' lag-{k} "
                f"autocorrelation {self._rho.min():.2f}-{self._rho.max():.2f}, which the fill keeps): an assumption"
            )
        elif self.fill == "hold":
            how = f"each sample held for {k} iterations: an assumption"
        else:
            how = f"samples replayed as consecutive iterations (the series' time axis compressed {k}-fold)"
        return f"{head} every {k} iterations; {how}"

    def _series(self, rng: np.random.Generator) -> FloatArray:
        """``float64[iterations, workers]`` factors at iteration resolution (see ``fill``)."""
        k = self._interval
        if k == 1 or self.fill == "consecutive":
            return self._factors
        if self.fill == "hold":
            return np.repeat(self._factors, k, axis=0)
        logs = np.log(self._factors)  # [L, W]
        mean = logs.mean(axis=0)
        x = logs - mean
        var = x.var(axis=0)
        phi = self._rho ** (1.0 / k)
        gaps, workers = x.shape[0] - 1, x.shape[1]
        out = np.empty((gaps * k + 1, workers))
        out[::k] = x
        prev, target = x[:-1], x[1:]  # [gaps, W]
        for t in range(1, k):
            m = k - t + 1  # steps from the previous point to the target
            # x_t | x_{t-1}, x_target for an AR(1) with stationary variance var (Gaussian bridge)
            w = phi ** (m - 1) * (1 - phi**2) / (1 - phi ** (2 * m))
            mu = phi * prev + w * (target - phi**m * prev)
            v = var * ((1 - phi**2) - phi ** (2 * (m - 1)) * (1 - phi**2) ** 2 / (1 - phi ** (2 * m)))
            prev = mu + np.sqrt(np.maximum(v, 0.0)) * rng.standard_normal((gaps, workers))
            out[t::k][:gaps] = prev
        return np.exp(out + mean)

    def apply(self, compute_s: FloatArray, rng: np.random.Generator) -> FloatArray:
        """Multiply by the recorded per-worker factors (filled between samples as ``fill`` says)."""
        return self._rows(*self._draw(rng, compute_s.shape[1]), compute_s, 0)

    def stream(self, draws: Draws) -> Rows:
        """``apply`` chunk by chunk of iterations (module docstring)."""
        return partial(self._rows, *self._draw(draws.generator(), draws.num_ranks))

    def _draw(self, rng: np.random.Generator, num_ranks: int) -> tuple[FloatArray, NDArray[np.int64]]:
        """The series at iteration resolution (mean 1) and each rank's random offset into it."""
        series = self._series(rng)
        series = series / series.mean()
        offset = np.asarray(rng.integers(0, series.shape[0], size=num_ranks), dtype=np.int64)
        return series, offset

    @staticmethod
    def _rows(series: FloatArray, offset: NDArray[np.int64], compute_s: FloatArray, start: int) -> FloatArray:
        length, workers = series.shape
        rows = (np.arange(start, start + len(compute_s))[:, None] + offset[None, :]) % length
        return compute_s * series[rows, np.arange(compute_s.shape[1])[None, :] % workers]


@dataclass(frozen=True)
class ComputeModel:
    """Base compute time plus noise components, applied in order.

    Args:
        compute_s: mean unperturbed compute (forward + backward) time per iteration, seconds, > 0.
        components: noise components (see this module).
    """

    compute_s: float
    components: tuple[NoiseComponent, ...] = ()

    def __post_init__(self) -> None:
        value = float(self.compute_s)
        if not np.isfinite(value) or value <= 0:
            raise ConfigError(f"compute_s must be > 0 and finite, got {value!r}")

    def sample(self, rng: np.random.Generator, num_iterations: int, num_ranks: int) -> FloatArray:
        """Draw ``float64[num_iterations, num_ranks]`` compute times, seconds."""
        times = np.full((num_iterations, num_ranks), self.compute_s)
        for component in self.components:
            times = component.apply(times, rng)
        return times

    def stream(self, rng: np.random.Generator, num_iterations: int, num_ranks: int) -> ComputeStream:
        """The compute times of :meth:`sample` with the same ``rng``, bit for bit, chunk by chunk of
        iterations (module docstring): memory O(ranks x chunk), not O(ranks x iterations)."""
        if not all(hasattr(c, "stream") for c in self.components):  # a component without a streamed form
            return ComputeStream(self, [], num_ranks, whole=self.sample(rng, num_iterations, num_ranks))
        draws = Draws(rng, num_iterations, num_ranks)
        parts = [c.stream(draws) for c in self.components]
        return ComputeStream(self, parts, num_ranks, blocks=draws.blocks)


class ComputeStream:
    """A compute model's times, ``float64[num_iterations, num_ranks]`` seconds, handed out by
    consecutive chunks of iterations (:meth:`ComputeModel.stream`).

    Args:
        model: the model.
        parts: each component's streamed form, in order.
        num_ranks: the columns.
        blocks: the per-cell draws the parts take from (rewound by :meth:`rewind`).
        whole: every iteration's times, where some component has no streamed form.
    """

    def __init__(
        self,
        model: ComputeModel,
        parts: list[Rows],
        num_ranks: int,
        *,
        blocks: list[CellDraws] | None = None,
        whole: FloatArray | None = None,
    ) -> None:
        self.model, self.parts, self.num_ranks = model, parts, int(num_ranks)
        self._blocks = blocks or []
        self._whole = whole
        self._next = 0

    def rewind(self) -> None:
        """Hand the same times out again from iteration 0 (no draw repeated before it)."""
        for block in self._blocks:
            block.rewind()
        self._next = 0

    def rows(self, start: int, stop: int) -> FloatArray:
        """Iterations ``[start, stop)``, ``float64[stop - start, num_ranks]`` seconds.

        Raises:
            ValueError: ``start`` is not where the last chunk stopped (chunks come in order).
        """
        if start != self._next or stop < start:
            raise ValueError(
                f"ComputeStream.rows must continue at iteration {self._next}, got [{start}, {stop})"
            )
        self._next = stop
        if self._whole is not None:
            return self._whole[start:stop]
        times = np.full((stop - start, self.num_ranks), self.model.compute_s)
        for part in self.parts:
            times = part(times, start)
        return times


NOISE_COMPONENTS = {
    "lognormal": LognormalJitter,
    "pareto": ParetoHiccups,
    "periodic": PeriodicNoise,
    "slow_ranks": SlowRanks,
    "empirical": EmpiricalSamples,
}
