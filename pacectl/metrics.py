"""Metrics of one :class:`~pacectl.types.Episode`: pure functions, no I/O.

Every function takes an episode (columnar, ``num_iterations`` x ``num_ranks``) and returns plain
floats or ``float64`` arrays; :func:`summarize` gathers them into one JSON-ready dict and
:func:`compare` turns two summaries into relative changes. The per-rank arrays enter only through
:class:`~pacectl.types.EpisodeTotals` (their reductions over ranks), which a streamed episode
carries instead of them (``Episode.totals``). Definitions follow the reference paper (Gopalan and
Ali, "When Scaling Fails"): iteration time is the slowest rank's, ``cv`` is std/mean of iteration
time, ``spread_s`` is the latest minus the earliest arrival at the paced collective of one pacing
domain.

Errors, for every function here that takes one episode (the docstrings below do not repeat them):
an episode with no iterations or ranks, a total time that is not positive, or a pacing domain that
owns no rank raises :class:`~pacectl.errors.PacectlError` naming what is wrong.
:func:`paired_change_ci95_frac` returns NaN instead when there are too few samples, and
:func:`compare` takes two :func:`summarize` dicts. Percentiles interpolate linearly between order
statistics (numpy's default).

Example:
    >>> from pacectl.testing.episodes import make_episode
    >>> ep = make_episode([[0.0, 0.2], [0.1, 0.1]], iteration_time_s=[1.0, 1.0])
    >>> throughput_it_per_s(ep)
    1.0
    >>> spread_s(ep)[:, 0].tolist()
    [0.2, 0.0]
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pacectl.errors import PacectlError
from pacectl.fabric.base import is_timing_dependent
from pacectl.types import Episode, EpisodeTotals


def _require_data(ep: Episode) -> None:
    """Raise :class:`PacectlError` if ``ep`` has no iterations, no ranks or an empty domain."""
    if ep.num_iterations == 0:
        raise PacectlError(
            f"episode must have at least one iteration, got 0 (controller {ep.controller!r}, "
            f"backend {ep.backend!r}); run the backend for at least one step before computing metrics"
        )
    if ep.num_ranks == 0:
        raise PacectlError(f"episode must have at least one rank, got 0 (controller {ep.controller!r})")
    dom = np.asarray(ep.domain_of_rank)
    if dom.shape != (ep.num_ranks,) or dom.min() < 0 or dom.max() >= ep.num_domains:
        raise PacectlError(
            f"domain_of_rank must be int[{ep.num_ranks}] with values in [0, {ep.num_domains}), "
            f"got {dom.tolist()!r} (domains {ep.domain_names!r})"
        )
    counts = np.bincount(dom, minlength=ep.num_domains)
    if np.any(counts == 0):
        raise PacectlError(
            f"every domain must own at least one rank, got ranks per domain {counts.tolist()!r} "
            f"(domains {ep.domain_names!r})"
        )


def _total_time_s(ep: Episode) -> float:
    _require_data(ep)
    total = float(np.sum(ep.iteration_time_s))
    if not total > 0.0:
        raise PacectlError(
            f"sum of iteration_time_s must be > 0, got {total!r} (controller {ep.controller!r})"
        )
    return total


# --- iteration time -------------------------------------------------------------------------------


def throughput_it_per_s(ep: Episode) -> float:
    """Iterations per second over the whole episode, ``num_iterations / sum(iteration_time_s)``.

    For an episode whose domains keep their own clocks (several jobs on one fabric,
    ``domain_iteration_time_s`` set): the sum over jobs of each job's own throughput
    (:func:`job_summaries`).
    """
    total = _total_time_s(ep)
    if ep.domain_iteration_time_s is not None:
        return float(sum(s["throughput_it_per_s"] for s in job_summaries(ep).values()))
    return ep.num_iterations / total


def job_summaries(ep: Episode) -> dict[str, dict[str, float]]:
    """Each job's own figures, for an episode whose domains keep their own clocks (several jobs on
    one fabric): job name -> ``throughput_it_per_s``, ``iteration_time_mean_s``,
    ``iteration_time_p99_s``, ``cv``, ``collective_time_mean_s``, ``pacing_delay_total_s`` (each
    over the job's own first ``num_iterations`` iterations); empty for a lockstep episode.
    """
    _require_data(ep)
    if ep.domain_iteration_time_s is None:
        return {}
    times = np.asarray(ep.domain_iteration_time_s, dtype=np.float64)
    delay = totals_of(ep).delay_s
    out: dict[str, dict[str, float]] = {}
    for d, name in enumerate(ep.domain_names):
        t = times[:, d]
        total = float(t.sum())
        if not total > 0.0:
            raise PacectlError(f"job {name!r}: sum of its iteration times must be > 0, got {total!r}")
        out[str(name)] = {
            "throughput_it_per_s": t.size / total,
            "iteration_time_mean_s": float(t.mean()),
            "iteration_time_p99_s": float(np.percentile(t, 99.0)),
            "cv": float(t.std(ddof=0) / t.mean()),
            "collective_time_mean_s": float(np.mean(ep.collective_time_s[:, d])),
            "pacing_delay_total_s": float(np.sum(delay[:, d])),
        }
    return out


def iteration_time_mean_s(ep: Episode) -> float:
    """Mean iteration time, seconds."""
    _require_data(ep)
    return float(np.mean(ep.iteration_time_s))


def iteration_time_p50_s(ep: Episode) -> float:
    """Median iteration time, seconds."""
    _require_data(ep)
    return float(np.percentile(ep.iteration_time_s, 50.0))


def iteration_time_p99_s(ep: Episode) -> float:
    """99th percentile of iteration time, seconds."""
    _require_data(ep)
    return float(np.percentile(ep.iteration_time_s, 99.0))


def cv(ep: Episode) -> float:
    """Coefficient of variation of iteration time, ``std(iteration_time_s, ddof=0) / mean``,
    dimensionless; 0.0 for a single iteration.

    The population standard deviation (``ddof=0``), as the reference paper's CV figures
    (0.22 -> 0.09 at 64 nodes) describe the observed run, not an estimate for a larger population.
    """
    _total_time_s(ep)
    return float(np.std(ep.iteration_time_s, ddof=0) / np.mean(ep.iteration_time_s))


# --- the per-rank arrays' reductions ---------------------------------------------------------------


def episode_totals(ep: Episode) -> EpisodeTotals:
    """Reduce the per-rank arrays of ``ep`` (or of one block of its iterations) to
    :class:`~pacectl.types.EpisodeTotals` (vectorised; loops over domains), without the energy
    (:func:`pacectl.energy.episode_totals` adds it). A streamed episode, which has no per-rank arrays
    left, raises :class:`~pacectl.errors.PacectlError` too.
    """
    _require_data(ep)
    if ep.totals is not None:
        raise PacectlError(
            f"episode_totals needs the per-rank arrays, but the {ep.controller!r} episode was streamed "
            "(its totals are ep.totals); keep them with run_episode(reduce=None)"
        )
    latest = _domain_reduce(ep, ep.arrival_s, np.max)
    natural_latest = _domain_reduce(ep, ep.natural_arrival_s, np.max)
    # each rank's domain's latest arrival: one domain's column broadcasts (no gathered copy)
    of_rank = (lambda x: x[:, :1]) if ep.num_domains == 1 else (lambda x: x[:, ep.domain_of_rank])
    return EpisodeTotals(
        spread_s=latest - _domain_reduce(ep, ep.arrival_s, np.min),
        natural_spread_s=natural_latest - _domain_reduce(ep, ep.natural_arrival_s, np.min),
        delay_s=_domain_reduce(ep, ep.applied_delay_s, np.sum),
        wait_s=np.sum(ep.wait_s, axis=1),
        last_iters=np.count_nonzero(ep.arrival_s == of_rank(latest), axis=0).astype(np.int64, copy=False),
        natural_last_iters=np.count_nonzero(ep.natural_arrival_s == of_rank(natural_latest), axis=0).astype(
            np.int64, copy=False
        ),
    )


def totals_of(ep: Episode) -> EpisodeTotals:
    """``ep.totals`` where the episode was streamed, else :func:`episode_totals` of its arrays."""
    _require_data(ep)
    return ep.totals if ep.totals is not None else episode_totals(ep)


def _domain_reduce(ep: Episode, values: NDArray[np.float64], reduce: Any) -> NDArray[np.float64]:
    """Reduce ``float64[num_iterations, num_ranks]`` over the ranks of each domain.

    Returns ``float64[num_iterations, num_domains]``. Loops over domains only.
    """
    out = np.empty((values.shape[0], ep.num_domains), dtype=np.float64)
    if ep.num_domains == 1:
        out[:, 0] = reduce(values, axis=1)
        return out
    for d in range(ep.num_domains):
        out[:, d] = reduce(values[:, ep.domain_of_rank == d], axis=1)
    return out


# --- arrival spread -------------------------------------------------------------------------------


def spread_s(ep: Episode) -> NDArray[np.float64]:
    """Arrival spread per iteration and domain, latest minus earliest ``arrival_s`` in the domain:
    ``float64[num_iterations, num_domains]``, seconds, every entry >= 0."""
    return totals_of(ep).spread_s


def natural_spread_s(ep: Episode) -> NDArray[np.float64]:
    """:func:`spread_s` of the unpaced arrivals (``natural_arrival_s``): what pacing tries to absorb."""
    return totals_of(ep).natural_spread_s


def spread_median_s(ep: Episode) -> float:
    """Median of :func:`spread_s` over all iteration x domain cells, seconds."""
    return float(np.median(spread_s(ep)))


def natural_spread_median_s(ep: Episode) -> float:
    """Median of :func:`natural_spread_s` over all iteration x domain cells, seconds."""
    return float(np.median(natural_spread_s(ep)))


# --- cost of pacing -------------------------------------------------------------------------------


def pacing_delay_total_s(ep: Episode) -> float:
    """Total pacing delay applied, summed over iterations and ranks, rank-seconds."""
    return float(np.sum(totals_of(ep).delay_s))


def wait_fraction(ep: Episode) -> float:
    """Fraction of rank-time spent blocked in the paced collective.

    ``sum(wait_s) / (num_ranks * sum(iteration_time_s))``: the numerator is the rank-seconds spent
    waiting for the last rank of the domain, the denominator the rank-seconds the episode lasted.
    It lies in [0, 1] whenever every ``wait_s`` is at most its iteration's time. Pacing moves
    waiting out of the collective into ``applied_delay_s``, so read it next to
    :func:`pacing_delay_total_s`.
    """
    return float(np.sum(totals_of(ep).wait_s)) / (ep.num_ranks * _total_time_s(ep))


def pacing_active_frac(ep: Episode) -> float:
    """Mean of ``pacing_active`` over all iteration x domain cells, in [0, 1]."""
    _require_data(ep)
    return float(np.mean(ep.pacing_active)) if ep.pacing_active.size else 0.0


def wait_asleep_frac(ep: Episode) -> float:
    """Share of iteration x domain cells whose ranks waited asleep in the collective, in [0, 1]
    (``Action.wait`` ``"sleep"``, the ``sleep_wait`` controller); 0 when the episode records none."""
    _require_data(ep)
    return float(np.mean(ep.wait_asleep)) if ep.wait_asleep is not None and np.size(ep.wait_asleep) else 0.0


# --- blame ----------------------------------------------------------------------------------------


def blame(ep: Episode) -> NDArray[np.float64]:
    """Fraction of iterations in which each rank arrived last in its domain (by ``arrival_s``).

    Ties are exact float equality, and every tied-latest rank counts as last, so within one domain
    the fractions sum to at least 1 (exactly 1 when there are no ties).

    Returns:
        ``float64[num_ranks]`` in [0, 1], in rank index order (labels in ``ep.rank_labels``).
    """
    return totals_of(ep).last_iters / ep.num_iterations


def natural_blame(ep: Episode) -> NDArray[np.float64]:
    """:func:`blame` by ``natural_arrival_s``: who would be last without pacing."""
    return totals_of(ep).natural_last_iters / ep.num_iterations


def _blame_dict(ep: Episode, fractions: NDArray[np.float64]) -> dict[str, float]:
    """Global rank label (str) -> fraction, ranks with fraction > 0 only, largest first."""
    order = np.lexsort((ep.rank_labels, -fractions))
    return {str(int(ep.rank_labels[i])): float(fractions[i]) for i in order if fractions[i] > 0.0}


# --- summaries ------------------------------------------------------------------------------------


def summarize(ep: Episode) -> dict[str, Any]:
    """All headline metrics of one episode as a JSON-ready dict (Python floats, ints and strings).

    Returns:
        A dict with keys ``throughput_it_per_s``, ``iteration_time_mean_s``, ``iteration_time_p50_s``,
        ``iteration_time_p99_s``, ``cv``, ``spread_median_s``, ``spread_p99_s``,
        ``natural_spread_median_s``, ``natural_spread_p99_s``, ``pacing_delay_total_s``,
        ``wait_fraction``, ``pacing_active_frac``, ``wait_asleep_frac``, ``guard_interventions``, ``num_iterations``,
        ``num_ranks``, ``num_domains``, ``comm_model``, ``comm_timing_dependent`` (only then can pacing
        gain), ``controller``, ``backend``, and ``blame`` /
        ``natural_blame``: global rank label (as ``str``) -> fraction of iterations that rank arrived
        last in its domain, listing only ranks with a fraction > 0, largest first (ties by label);
        and ``jobs`` (:func:`job_summaries`) where the domains keep their own clocks.
        Note that :func:`pacectl.report.write_summary_json` sorts keys, so the file lists them by label.

    Example:
        >>> from pacectl.testing.episodes import make_episode
        >>> summarize(make_episode([[0.0, 0.5]], iteration_time_s=[2.0]))["blame"]
        {'1': 1.0}
    """
    _total_time_s(ep)
    t = totals_of(ep)
    return {
        "throughput_it_per_s": throughput_it_per_s(ep),
        "iteration_time_mean_s": iteration_time_mean_s(ep),
        "iteration_time_p50_s": iteration_time_p50_s(ep),
        "iteration_time_p99_s": iteration_time_p99_s(ep),
        "cv": cv(ep),
        "spread_median_s": float(np.median(t.spread_s)),
        "spread_p99_s": float(np.percentile(t.spread_s, 99.0)),
        "natural_spread_median_s": float(np.median(t.natural_spread_s)),
        "natural_spread_p99_s": float(np.percentile(t.natural_spread_s, 99.0)),
        "pacing_delay_total_s": float(np.sum(t.delay_s)),
        "wait_fraction": float(np.sum(t.wait_s)) / (ep.num_ranks * _total_time_s(ep)),
        "pacing_active_frac": pacing_active_frac(ep),
        "wait_asleep_frac": wait_asleep_frac(ep),
        "guard_interventions": int(ep.guard_interventions),
        "num_iterations": ep.num_iterations,
        "num_ranks": ep.num_ranks,
        "num_domains": ep.num_domains,
        "blame": _blame_dict(ep, t.last_iters / ep.num_iterations),
        "natural_blame": _blame_dict(ep, t.natural_last_iters / ep.num_iterations),
        "comm_model": str(ep.comm_model),
        "comm_timing_dependent": is_timing_dependent(str(ep.comm_model), ep.comm_timing_dependent),
        "controller": str(ep.controller),
        "backend": str(ep.backend),
        **({"jobs": job_summaries(ep)} if ep.domain_iteration_time_s is not None else {}),
    }


def _change_frac(baseline: float, other: float) -> float:
    return float(other) / float(baseline) - 1.0 if float(baseline) != 0.0 else float("nan")


def compare(baseline: dict[str, Any], other: dict[str, Any]) -> dict[str, float]:
    """Relative change of ``other`` against ``baseline`` (both from :func:`summarize`).

    Args:
        baseline: summary of the reference run (usually no pacing).
        other: summary of the run to judge.

    Returns:
        ``throughput_change_frac`` (``other / baseline - 1``; > 0 is faster),
        ``iteration_time_mean_change_frac`` and ``iteration_time_p99_change_frac`` (same form; < 0 is
        faster), ``cv_change`` (absolute difference ``other - baseline``; < 0 is steadier). A fraction
        whose baseline value is 0 is NaN.

    Raises:
        KeyError: if a summary lacks one of the keys above.
    """
    changes = {
        "throughput_change_frac": "throughput_it_per_s",
        "iteration_time_mean_change_frac": "iteration_time_mean_s",
        "iteration_time_p99_change_frac": "iteration_time_p99_s",
    }
    return {
        **{change: _change_frac(baseline[key], other[key]) for change, key in changes.items()},
        "cv_change": float(other["cv"]) - float(baseline["cv"]),
    }


def interval_blocks(interleave_block: int, warmup_iterations: int) -> tuple[int | None, int]:
    """``(block, offset)`` of :func:`paired_change_ci95_frac` for live runs interleaved in blocks of
    ``interleave_block`` iterations after ``warmup_iterations`` unlogged ones (the warm-up opens the
    first block). Runs one after the other (0) or interleaved iteration by iteration (1) share no
    block of the machine's state: blocks of sqrt(n) then, as offline."""
    return (interleave_block, warmup_iterations) if interleave_block > 1 else (None, 0)


def _batch_ids(n: int, block: int | None, offset: int) -> NDArray[np.int64]:
    """Block index of each of ``n`` iterations (see :func:`paired_change_ci95_frac`), from 0.

    Blocks of ``floor(sqrt(n))`` iterations (``block=None``) or ``block``, from iteration
    ``-offset``; the first and the last block may be partial and count as whole batches (Flegal and
    Jones fold a leftover into equal batches instead: the interval here is slightly wider, the
    conservative side).
    """
    size = max(1, math.isqrt(n)) if block is None else max(1, int(block))
    ids = (np.arange(n) + int(offset)) // size
    return ids - ids[0]  # consecutive blocks from 0 (the first may be partial)


def num_batches(n: int, *, block: int | None = None, offset: int = 0) -> int:
    """How many blocks :func:`paired_change_ci95_frac` averages over for ``n`` iterations."""
    return int(_batch_ids(n, block, offset)[-1]) + 1 if n > 0 else 0


def paired_change_ci95_frac(
    baseline: Episode, other: Episode, *, block: int | None = None, offset: int = 0
) -> float:
    """Half-width of the 95 % confidence interval of the mean iteration-time change, as a fraction.

    Both runs see the same iterations (same trace steps, seed or straggler schedule), so the test is
    paired on ``d_k = t_other[k] - t_base[k]``. Successive ``d_k`` are not independent: a closed-loop
    controller carries state from one iteration to the next, compute noise is correlated in time
    (real step times: lag-1 autocorrelation 0.3-0.9), and live runs train in interleaved blocks that
    share the machine's state. So the interval is computed by the method of batch means: the mean of
    ``d`` over each of ``m`` consecutive blocks, half-width ``t_{0.975, m-1} * std(means, ddof=1) /
    sqrt(m)``, divided by the baseline mean. Without a ``block``, blocks of ``floor(sqrt(n))``
    iterations (the batch size of Flegal and Jones, "Batch means and spectral variance estimators in
    Markov chain Monte Carlo", Ann. Statist. 38(2), 2010). A change smaller than this is
    indistinguishable from run-to-run noise. It bounds the throughput change to first order too.
    Coverage on AR(1) differences (phi 0.6): 94.5 % at 400 iterations (``tests/test_metrics.py``).

    For episodes whose domains keep their own clocks (several jobs on one fabric), the quantity is
    the throughput summed over jobs (:func:`throughput_it_per_s`): in each block, each job's
    throughput over its own iterations of the block, summed over jobs; the interval is that of the
    mean paired change of those sums, over the baseline's sum.

    Args:
        baseline: the reference run (no pacing).
        other: the run to judge.
        block: iterations per block; None: ``floor(sqrt(n))``; 1: every iteration its own sample
            (right only for independent iterations); a live run's interleave block.
        offset: iterations of the first block that are not in the episodes (unlogged warm-up):
            iteration ``k`` is in block ``(k + offset) // block``.

    Returns:
        The half-width (>= 0), or NaN when the runs differ in length or there are fewer than 2 blocks.
    """
    if baseline.domain_iteration_time_s is not None and other.domain_iteration_time_s is not None:
        return paired_jobs_ci95_frac(
            baseline.domain_iteration_time_s, other.domain_iteration_time_s, block=block, offset=offset
        )
    return paired_ci95_frac(baseline.iteration_time_s, other.iteration_time_s, block=block, offset=offset)


def paired_jobs_ci95_frac(
    baseline_s: NDArray[np.float64],
    other_s: NDArray[np.float64],
    *,
    block: int | None = None,
    offset: int = 0,
) -> float:
    """Half-width of the 95 % batch-means interval of the change of the throughput summed over jobs,
    as a fraction of the baseline's sum.

    Args:
        baseline_s, other_s: ``float64[num_iterations, num_jobs]`` each job's iteration times, seconds
            (a single column gives one job's throughput change).
        block, offset: as :func:`paired_change_ci95_frac`.

    Returns:
        The half-width (>= 0), or NaN when the shapes differ or there are fewer than 2 blocks.
    """
    base = np.asarray(baseline_s, dtype=np.float64)
    oth = np.asarray(other_s, dtype=np.float64)
    if base.ndim == 1:
        base, oth = base[:, None], oth[:, None]
    n = base.shape[0]
    if base.shape != oth.shape or n < 2:
        return math.nan
    ids = _batch_ids(n, block, offset)
    m = int(ids[-1]) + 1
    if m < 2:
        return math.nan
    counts = np.bincount(ids, minlength=m)[:, None]

    def sums(t: NDArray[np.float64]) -> NDArray[np.float64]:
        per_block = np.stack(
            [np.bincount(ids, weights=t[:, j], minlength=m) for j in range(t.shape[1])], axis=1
        )
        return (counts / per_block).sum(axis=1)  # sum over jobs of each block's throughput

    scale = float((n / base.sum(axis=0)).sum())
    if not scale > 0.0:
        return math.nan
    return _half_width(sums(oth) - sums(base), scale)


def _half_width(means: NDArray[np.float64], scale: float) -> float:
    """The half-width of :func:`paired_change_ci95_frac` from ``m >= 2`` batch means."""
    m = means.size
    return float(_t975(m - 1) * means.std(ddof=1) / math.sqrt(m) / scale)


@functools.cache
def _t975_table_current() -> bool:
    """Whether the installed scipy is the one that wrote :data:`pacectl._t975.T975` (package metadata:
    no scipy import)."""
    from importlib.metadata import version

    from pacectl._t975 import SCIPY_VERSION

    return version("scipy") == SCIPY_VERSION


def _t975(dof: int) -> float:
    """Student's t 97.5 % quantile with ``dof`` degrees of freedom (``scipy.stats.t.ppf(0.975, dof)``,
    bit for bit: both are ``scipy.special.stdtrit``). Up to 2,048 degrees of freedom (4 M iterations
    in blocks of their square root) it is read from :data:`pacectl._t975.T975`, scipy's own values,
    without importing scipy (scipy.special parses docstrings at import, on a command's critical
    path: ``experiments/bench/README.md``); beyond, from scipy."""
    from pacectl._t975 import T975

    if 1 <= dof <= len(T975) and _t975_table_current():
        return T975[dof - 1]
    from scipy.special import stdtrit

    return float(stdtrit(dof, 0.975))


def paired_ci95_frac(
    baseline: NDArray[np.float64], other: NDArray[np.float64], *, block: int | None = None, offset: int = 0
) -> float:
    """The batch-means interval of :func:`paired_change_ci95_frac` for any per-iteration quantity
    (iteration time, energy per iteration): half-width of the 95 % interval of the mean of
    ``other - baseline``, over the baseline's mean.

    Args:
        baseline, other: ``float64[num_iterations]`` each.
        block, offset: as :func:`paired_change_ci95_frac`.

    Returns:
        The half-width (>= 0), or NaN when the lengths differ, there are fewer than 2 blocks or the
        baseline's mean is 0.
    """
    base = np.asarray(baseline, dtype=np.float64)
    oth = np.asarray(other, dtype=np.float64)
    n = base.shape[0]
    if n != oth.shape[0] or n < 2:
        return math.nan
    d = oth - base
    scale = float(base.mean())
    if scale == 0.0:
        return math.nan
    ids = _batch_ids(n, block, offset)
    means = np.bincount(ids, weights=d) / np.bincount(ids)
    return _half_width(means, scale) if means.size >= 2 else math.nan
