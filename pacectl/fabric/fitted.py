"""``comm=fitted``: a communication-timing model fitted from the trace itself, and the check of max-plus.

Replay's null model (:mod:`pacectl.backends.dag`) assumes max-plus: each collective or p2p transfer
takes its recorded *intrinsic* time (its end minus its last member's start) whatever else runs beside
it. This module measures whether the recording agrees, and replays with what it finds.

**The model.** For every communication op instance ``i`` (p2p sends/receives and the collectives of
the schema, :data:`COMM_OPTYPES`) with intrinsic time ``tau_i > 0``::

    log tau_i = a[template(i), dp_rank(i)] + b[block(i)]
                + sum_c 1[class(i) = c] * (beta_c,comm * comm_i + beta_c,compute * compute_i) + e_i

- ``comm_i``: the mean number of *other* communication transfers running on the same node while
  ``i`` transfers (the overlap of their ``[last start, end]`` intervals with ``i``'s, divided by
  ``tau_i``; the other members of ``i``'s own collective or p2p pair are the same transfer and are left
  out); ``compute_i``: the same count for the node's forward/backward compute ops;
- ``class``: ``p2p`` (every send and receive) or the collective's op type;
- fixed effects: ``a`` per op template (one node of the step DAG: stage, op type, sequence id) and
  DP rank, so a slope is identified only by how one op of one rank varies across steps (a rank whose
  op is structurally slower *and* more overlapped is not read as an effect); ``b`` per block of
  ``block_steps`` consecutive steps (drift across the recording). ``a`` is absorbed by demeaning
  within (template, DP rank), ``b`` enters as dummies, and the slopes are estimated by least squares
  (statsmodels OLS; by the Frisch-Waugh-Lovell theorem the same estimate as the full dummy regression).
- standard errors are cluster-robust, by step and by (template, DP rank) where there are enough
  clusters, else heteroskedasticity-robust (:func:`_ols`), as the fit says.

Under max-plus every ``beta`` is 0. The fit reports each with its 95 % interval, a joint Wald test,
and three checks:

- **held out**: fitted on the first half of the steps, the slopes predict the second half's
  within-(template, DP rank) variation of ``log tau``; ``heldout_r2`` is the share of it they explain
  (0 or below: nothing real);
- **placebo**: the same fit with each op's features taken from another (permuted) step of the same
  template and DP rank: any slope it finds is spurious, so its joint test should not reject;
- **arrival response**: for every class, the slope of the op's completion (its end, seconds from the
  step start) on its last member's arrival, with the same fixed effects. Max-plus predicts 1.0: a
  transfer that can start later ends later by as much.

**Node placement** is an assumption the traces do not record: ``ranks_per_node`` consecutive global
ranks share a node, and a (DP rank, stage) representative's global rank follows Megatron-LM's default
order (tensor-parallel fastest, then data-parallel, then pipeline: ``rank = tp * (dp_rank + dp_size *
stage)``; ``rank_order="megatron"``), or the trace's own ``rank`` column (``rank_order="trace"``).
ByteDance's traces record exactly Megatron's order, so the two agree there.

**Replay** (:class:`FittedComm`, ``comm=fitted``): every communication op's transfer time becomes its
recorded one times ``exp(beta . (x_replayed - x_recorded))``, with ``x`` its two features in the
replayed timeline and ``x_recorded`` those of the recording as replayed with its own pacing delays
(:meth:`~pacectl.backends.replay.ReplayBackend.recorded_timeline`). A replay with the recorded
timing therefore reproduces the recording exactly (as the null model does), and only a change in
what overlaps what changes a duration. The features depend on the durations they set, so each step
is solved as a fixed point (:func:`fixed_point`, to a relative ``1e-6``): ops that overlap within
one level of the DAG (node-mates' concurrent transfers) and ops of later levels that overlap an
earlier one (compute under a transfer) settle together.

**Verdict** (:attr:`CommFit.verdict`): a delay within a rank's earliness moves no transfer's start,
so it cannot change any duration keyed on what runs during a transfer (DESIGN.md, fact 2): the
counterfactual that can tell the models apart moves transfers. Every communication op instance is
delayed by an independent uniform draw in ``[0, d_c]`` (:func:`probe_pace`), and every step is
replayed under max-plus and under the fitted model; ``bound_frac`` is the largest difference in
mean step time between the two (fitted minus max-plus, a fraction of the zero-delay mean step time)
over the point estimate and the far end of its 95 % interval (delta method: one replay per
identified slope gives the gradient in the slopes, their covariance its standard error). The
verdict is "consistent with max-plus within +-x % of step time" when that bound is under
``tolerance_frac``, no dependence is *validated* (joint Wald test below :data:`SIGNIFICANCE`,
held-out R^2 at least :data:`MIN_HELDOUT_R2`, and a placebo that does not also reject), and no
class's arrival response departs from 1.0 (by more than ``arrival_tolerance``, its interval
excluding 1.0, and enough to move completions by ``tolerance_frac`` of the step time at the
arrivals' own spread); else "timing-dependent: ..." naming what departs.

Source of the method: a fixed-effects regression of intrinsic times on concurrent communication
and compute, with the standard panel-data tools (within transformation, cluster-robust covariance:
Cameron and Miller, "A Practitioner's Guide to Cluster-Robust Inference", J. Human Resources 50(2),
2015).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from pacectl.checks import Checked, typed, within
from pacectl.errors import ConfigError, TraceError
from pacectl.traces.model import COMPUTE_OPTYPES, DP_COLLECTIVES, OTHER_COLLECTIVES, P2P_OPTYPES

if TYPE_CHECKING:
    from pacectl.backends.dag import StepDag
    from pacectl.backends.replay import ReplayBackend

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Op types whose recorded time is a transfer (the fit's subjects).
COMM_OPTYPES = P2P_OPTYPES + DP_COLLECTIVES + OTHER_COLLECTIVES
#: The two features, in coefficient order.
FEATURES = ("comm", "compute")
#: Intrinsic times at or below this are not transfers the fit can take a log of (clipped estimates), s.
MIN_TAU_S = 1e-6
#: Fewer steps than this: heteroskedasticity-robust standard errors instead of clustering by step.
MIN_CLUSTERS = 10
#: Instances of a class with a non-zero feature below which its slope is reported as not identified.
MIN_VARYING = 20
#: The verdict's significance level for the joint tests (fit and placebo).
SIGNIFICANCE = 0.01
#: Held-out share of variance the slopes must explain for a significant fit to count as a dependence.
MIN_HELDOUT_R2 = 0.05
#: Within-(template, block) standard deviation of a feature below which its slope is not identified:
#: a slope per concurrent op read off variation of a few hundredths of one op is an extrapolation.
MIN_FEATURE_SD = 0.05
RANK_ORDERS = ("megatron", "trace")


@dataclass(frozen=True, kw_only=True)
class Placement(Checked):
    """Which node each modelled rank sits on: an assumption, stated in every output of the fit.

    Attributes:
        ranks_per_node: consecutive global ranks per node (8: one DGX/HGX node's GPUs).
        rank_order: ``"megatron"``: a (dp_rank, stage) representative is global rank
            ``tp_size * (dp_rank + dp_size * stage)`` (Megatron-LM's default order, TP fastest, then
            DP, then PP); ``"trace"``: the trace's ``rank`` column.

    Raises:
        ConfigError: ``ranks_per_node`` < 1 or an unknown ``rank_order``.
    """

    section: ClassVar[str] = "fit"
    ranks_per_node: int = within(8, ">= 1")
    rank_order: str = within("megatron", choices=RANK_ORDERS)

    def nodes(self, *, dp_size: int, pp_size: int, tp_size: int, trace_ranks: IntArray) -> IntArray:
        """``int64[pp_size, dp_size]``: node id of each (stage, dp_rank).

        Args:
            trace_ranks: ``int64[pp_size, dp_size]``, the trace's global rank of each (stage, dp_rank)
                (used with ``rank_order="trace"``).
        """
        if self.rank_order == "trace":
            ranks = np.asarray(trace_ranks, dtype=np.int64)
        else:
            dp = np.arange(dp_size)[None, :]
            stage = np.arange(pp_size)[:, None]
            ranks = tp_size * (dp + dp_size * stage)
        return (ranks // self.ranks_per_node).astype(np.int64)

    def describe(self) -> str:
        """One line for outputs."""
        order = (
            "Megatron order (rank = tp * (dp_rank + dp_size * stage))"
            if self.rank_order == "megatron"
            else "the trace's rank column"
        )
        return f"assumed placement: {self.ranks_per_node} consecutive global ranks per node, ranks in {order}"


# ---------------------------------------------------------------------------------------------
# Features of a timeline


@dataclass(frozen=True)
class _Layout:
    """What the features need of a compiled DAG, computed once."""

    comm_nodes: IntArray  # template nodes that are communication ops
    compute_nodes: IntArray
    node_of: IntArray  # [N, dp]: physical node of each template node's instance per DP rank
    num_phys: int
    group: IntArray  # [N]
    group_dp_sync: NDArray[np.bool_]
    mate_groups: tuple[tuple[IntArray, bool], ...]  # comm groups with mates: (members, dp_sync)
    op_class: NDArray[np.object_]  # [N]: class name of comm nodes, "" elsewhere
    classes: tuple[str, ...]
    comm_class: IntArray  # [len(comm_nodes)]: index into classes


def _layout(dag: StepDag, placement: Placement, *, dp_size: int, pp_size: int, tp_size: int) -> _Layout:
    optype = dag.optype
    is_comm = np.isin(optype, COMM_OPTYPES)
    comm = np.flatnonzero(is_comm)
    compute = np.flatnonzero(np.isin(optype, COMPUTE_OPTYPES))
    phys = placement.nodes(dp_size=dp_size, pp_size=pp_size, tp_size=tp_size, trace_ranks=dag.rank_labels)
    _, phys = np.unique(phys, return_inverse=True)
    phys = phys.reshape(pp_size, dp_size)
    node_of = phys[dag.stage]  # [N, dp]
    op_class = np.full(dag.num_nodes, "", dtype=object)
    op_class[comm] = ["p2p" if t in P2P_OPTYPES else str(t) for t in optype[comm]]
    mates = []
    for g in np.unique(dag.group[comm]):
        members = np.flatnonzero((dag.group == g) & is_comm)
        sync = bool(dag.group_dp_sync[g])
        if len(members) > 1 or (sync and dp_size > 1):
            mates.append((members.astype(np.int64), sync))
    classes = tuple(sorted({str(c) for c in op_class[comm]}, key=lambda c: (c != "p2p", c)))
    return _Layout(
        comm_nodes=comm.astype(np.int64),
        compute_nodes=compute.astype(np.int64),
        node_of=node_of.astype(np.int64),
        num_phys=int(phys.max()) + 1,
        group=dag.group,
        group_dp_sync=dag.group_dp_sync,
        mate_groups=tuple(mates),
        op_class=op_class,
        classes=classes,
        comm_class=np.array([classes.index(str(k)) for k in op_class[comm]], dtype=np.int64),
    )


def group_start_s(dag: StepDag, start_s: FloatArray) -> FloatArray:
    """The start of each op's synchronisation group (its last member's start), ``float64[N, ...]``.

    Args:
        start_s: ``float64[N, ..., dp_size]`` op start times, seconds.
    """
    n_groups = int(dag.group.max()) + 1
    g = np.full((n_groups, *start_s.shape[1:]), -np.inf)
    np.maximum.at(g, dag.group, start_s)
    if dag.group_dp_sync.any():
        g[dag.group_dp_sync] = g[dag.group_dp_sync].max(axis=-1, keepdims=True)
    return g[dag.group]


def _overlap_sums(
    keys: IntArray, lo: FloatArray, hi: FloatArray, q_keys: IntArray, q_lo: FloatArray, q_hi: FloatArray
) -> FloatArray:
    """For each query interval, the summed overlap with every interval of the same key.

    Uses ``F(t) = sum_j (min(t, hi_j) - min(t, lo_j))`` (the integral of the number of intervals
    active before ``t``), so the overlap of ``[a, b]`` with all of them is ``F(b) - F(a)``, and
    ``sum_j min(t, x_j) = sum_{x_j < t} x_j + t * #{x_j >= t}`` from sorted values and prefix sums.
    The sums run within each key (prefix sums restart at the key's first value), so the result is
    as precise as the times of one step and node.
    """
    if len(keys) == 0 or len(q_keys) == 0:
        return np.zeros(len(q_keys))
    t_min = min(float(lo.min()), float(q_lo.min()))
    span = max(float(hi.max()), float(q_hi.max())) - t_min + 1.0
    num_keys = int(max(keys.max(), q_keys.max())) + 1
    result = np.zeros(len(q_keys))
    for values, sign in ((hi, 1.0), (lo, -1.0)):
        order = np.lexsort((values, keys))
        k_sorted, x = keys[order], values[order]
        shifted = (x - t_min) + k_sorted * span  # only for searching
        csum = np.concatenate(([0.0], np.cumsum(x)))
        first = np.searchsorted(k_sorted, np.arange(num_keys), side="left")  # each key's first row
        last = np.searchsorted(k_sorted, np.arange(num_keys), side="right")
        for q, qsign in ((q_hi, 1.0), (q_lo, -1.0)):
            i = np.searchsorted(shifted, (q - t_min) + q_keys * span, side="left")
            i = np.clip(i, first[q_keys], last[q_keys])
            below = csum[i] - csum[first[q_keys]]
            g = below + q * (last[q_keys] - i)
            result += sign * qsign * g
    return result


def timeline_features(
    layout: _Layout, dag: StepDag, start_s: FloatArray, end_s: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Intrinsic time and the two features of every communication op instance of a timeline.

    Args:
        start_s, end_s: ``float64[N, num_steps, dp_size]`` op start and end times, seconds from each
            step's start.

    Returns:
        ``(tau_s, comm, compute)``, each ``float64[len(comm_nodes), num_steps, dp_size]``; the
        features are NaN where ``tau_s <= MIN_TAU_S``.
    """
    c, p = layout.comm_nodes, layout.compute_nodes
    num_steps, dp = start_s.shape[1], start_s.shape[2]
    gstart = group_start_s(dag, start_s)[c]
    cend = end_s[c]
    tau = cend - gstart
    step_ix = np.arange(num_steps)[None, :, None]
    key_c = (step_ix * layout.num_phys + layout.node_of[c][:, None, :]).ravel()
    key_p = (step_ix * layout.num_phys + layout.node_of[p][:, None, :]).ravel()
    lo_c, hi_c = gstart.ravel(), np.maximum(cend, gstart).ravel()
    comm = _overlap_sums(key_c, lo_c, hi_c, key_c, lo_c, hi_c).reshape(tau.shape)
    comm -= np.maximum(tau, 0.0)  # the op's own interval
    row = np.full(dag.num_nodes, -1, dtype=np.int64)
    row[c] = np.arange(len(c))
    for members, sync in layout.mate_groups:
        r = row[members]
        e = cend[r]  # [m, steps, dp]
        g0 = gstart[r]
        nodes = layout.node_of[members]  # [m, dp]
        if sync:  # every (member, dp rank) is one party of the same transfer
            e2 = e.transpose(1, 0, 2).reshape(num_steps, -1)  # [steps, m*dp]
            g2 = g0.transpose(1, 0, 2).reshape(num_steps, -1)
            n2 = nodes.reshape(-1)
            same = (n2[:, None] == n2[None, :]) & ~np.eye(len(n2), dtype=bool)
            ov = np.clip(np.minimum(e2[:, :, None], e2[:, None, :]) - g2[:, :, None], 0.0, None)
            sub = (ov * same[None]).sum(axis=2).reshape(num_steps, len(members), dp).transpose(1, 0, 2)
        else:  # parties within one DP rank (a p2p pair, the embedding all-reduce's stages)
            same = (nodes[:, None, :] == nodes[None, :, :]) & ~np.eye(len(members), dtype=bool)[:, :, None]
            ov = np.clip(np.minimum(e[:, None], e[None, :]) - g0[:, None], 0.0, None)  # [m, m, steps, dp]
            sub = (ov * same[:, :, None, :]).sum(axis=1)
        comm[r] -= sub
    lo_p, hi_p = start_s[p].ravel(), np.maximum(end_s[p], start_s[p]).ravel()
    compute = _overlap_sums(key_p, lo_p, hi_p, key_c, lo_c, hi_c).reshape(tau.shape)
    ok = tau > MIN_TAU_S
    with np.errstate(invalid="ignore", divide="ignore"):
        comm = np.where(ok, np.maximum(comm, 0.0) / np.where(ok, tau, 1.0), np.nan)
        compute = np.where(ok, np.maximum(compute, 0.0) / np.where(ok, tau, 1.0), np.nan)
    return tau, comm, compute


# ---------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True)
class Coefficient:
    """One slope of the fit: log-intrinsic-time change per unit of a feature (or completion per arrival).

    Attributes:
        op_class: ``p2p`` or a collective's op type.
        feature: ``comm``, ``compute`` or ``arrival``.
        estimate, std_err: the slope and its standard error.
        ci95_low, ci95_high: its 95 % interval.
        p_value: two-sided test of 0 (of 1.0 for ``arrival``).
        num_obs: op instances of the class in the fit.
        num_varying: instances where the feature is non-zero (0 for ``arrival``).
        identified: False when too few instances vary for a slope (then estimate, interval are NaN).
        regressor_sd: standard deviation of the regressor after the fixed effects (concurrent ops,
            or seconds of last arrival for ``arrival``).
    """

    op_class: str
    feature: str
    estimate: float
    std_err: float
    ci95_low: float
    ci95_high: float
    p_value: float
    num_obs: int
    num_varying: int
    identified: bool
    regressor_sd: float = float("nan")


@dataclass(frozen=True)
class RegressionResult:
    """The slopes of one regression plus its joint test (features only).

    Attributes:
        coefficients: every (class, feature) slope.
        wald_p_value: joint test that every identified slope is 0 (NaN when none is identified).
        covariance: ``"cluster(step)"`` or ``"HC1"``.
        num_obs: instances in the fit.
    """

    coefficients: tuple[Coefficient, ...]
    wald_p_value: float
    covariance: str
    num_obs: int
    beta: FloatArray = field(repr=False)  # [num_classes, 2], 0 where not identified
    cov: FloatArray = field(repr=False)  # covariance of the identified slopes, in `index` order
    index: tuple[tuple[int, int], ...] = field(repr=False)  # (class, feature) of each identified slope


@dataclass(frozen=True)
class CommFit:
    """A communication-timing model fitted from a trace, with its checks and verdict.

    Attributes:
        source: the trace.
        placement: the node placement assumed.
        block_steps: steps per fixed-effect block.
        classes: op classes fitted, in coefficient order.
        fit: the log-linear fit on every step.
        placebo: the same fit with features from permuted steps.
        heldout_r2: the held-out check's share of variance explained (module docstring; NaN with
            fewer than 4 steps).
        arrival: per class, the arrival response (max-plus: 1.0).
        overlap_residuals: per class, the median FE-only log residual of instances fully overlapped by
            a node-mate's transfer (another rank's, over >= 99 % of the op's transfer) and of those
            no node-mate's transfer overlaps, and their counts.
        bound_frac: the verdict's bound on the fitted model's change of mean step time against
            max-plus under :func:`probe_pace` (module docstring, **Verdict**), fraction.
        effect_frac: the point estimate's difference (signed).
        tolerance_frac, arrival_tolerance: the verdict's thresholds.
        verdict: one line.
        mean_step_time_s: mean step time of the zero-delay replay, s.
        effect_se_frac: standard error of ``effect_frac`` (delta method).
    """

    source: str
    placement: Placement
    block_steps: int
    classes: tuple[str, ...]
    fit: RegressionResult
    placebo: RegressionResult
    heldout_r2: float
    arrival: tuple[Coefficient, ...]
    overlap_residuals: dict[str, dict[str, float]]
    bound_frac: float
    effect_frac: float
    tolerance_frac: float
    arrival_tolerance: float
    verdict: str
    consistent_with_max_plus: bool
    mean_step_time_s: float
    effect_se_frac: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (``summary.json``'s ``comm_fit``, ``fit --json``)."""

        def reg(r: RegressionResult) -> dict[str, Any]:
            return {
                "covariance": r.covariance,
                "num_obs": r.num_obs,
                "wald_p_value": _num(r.wald_p_value),
                "coefficients": [_coef_dict(c) for c in r.coefficients],
            }

        return {
            "source": self.source,
            "model": "log tau = FE[template, dp_rank] + FE[step block] + beta_class . (comm, compute)",
            "placement": {**asdict(self.placement), "note": self.placement.describe()},
            "block_steps": self.block_steps,
            "fit": reg(self.fit),
            "placebo": reg(self.placebo),
            "heldout_r2": _num(self.heldout_r2),
            "arrival_response": [_coef_dict(c) for c in self.arrival],
            "overlap_residuals": self.overlap_residuals,
            "bound_frac": _num(self.bound_frac),
            "effect_frac": _num(self.effect_frac),
            "tolerance_frac": self.tolerance_frac,
            "arrival_tolerance": self.arrival_tolerance,
            "effect_se_frac": _num(self.effect_se_frac),
            "mean_step_time_s": self.mean_step_time_s,
            "consistent_with_max_plus": self.consistent_with_max_plus,
            "verdict": self.verdict,
        }


def _num(x: float) -> float | None:
    return None if not math.isfinite(x) else float(x)


def _coef_dict(c: Coefficient) -> dict[str, Any]:
    return {k: (_num(v) if isinstance(v, float) else v) for k, v in asdict(c).items()}


def _demean(values: FloatArray, cells: IntArray) -> FloatArray:
    """``values`` (``[n]`` or ``[n, k]``) minus their mean within each cell."""
    if values.ndim == 2:
        return np.column_stack([_demean(values[:, j], cells) for j in range(values.shape[1])])
    counts = np.bincount(cells).astype(np.float64)
    counts[counts == 0] = 1.0
    return values - (np.bincount(cells, weights=values) / counts)[cells]


def _ols(
    y: FloatArray, x: FloatArray, steps: IntArray, cells: IntArray
) -> tuple[FloatArray, FloatArray, str]:
    """Slopes and covariance of an OLS on demeaned data (statsmodels).

    The covariance is clustered two ways, by step (ops of one step share its disturbances) and by
    (template, DP rank) (one op's disturbances persist across steps), when both have at least
    :data:`MIN_CLUSTERS` groups; by whichever has enough otherwise; else heteroskedasticity-robust
    (HC1). Cameron, Gelbach and Miller, "Robust Inference With Multiway Clustering", JBES 29(2), 2011.
    """
    import warnings

    import statsmodels.api as sm

    model = sm.OLS(y, x)
    by_step, by_cell = len(np.unique(steps)) >= MIN_CLUSTERS, len(np.unique(cells)) >= MIN_CLUSTERS
    res = None
    if by_step and by_cell:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # not PSD: checked below
            res = model.fit(cov_type="cluster", cov_kwds={"groups": np.column_stack([steps, cells])})
        kind = "cluster(step, template x dp_rank)"
        # the two-way estimate is a difference of covariances and can lose positivity: by step then
        if not np.all(np.diag(np.asarray(res.cov_params())) > 0):
            res, by_cell = None, False
    if res is None and (by_step or by_cell):
        res = model.fit(cov_type="cluster", cov_kwds={"groups": steps if by_step else cells})
        kind = "cluster(step)" if by_step else "cluster(template x dp_rank)"
    elif res is None:
        res, kind = model.fit(cov_type="HC1"), "HC1"
    return np.asarray(res.params, dtype=np.float64), np.asarray(res.cov_params(), dtype=np.float64), kind


@dataclass(frozen=True)
class _Panel:
    """The op instances of the fit, flattened (one entry per comm op instance with tau > MIN_TAU_S)."""

    y: FloatArray  # log tau
    comm: FloatArray
    compute: FloatArray
    mates_comm: FloatArray  # the part of comm from other ranks' transfers (node-mates)
    cls: IntArray  # index into classes
    cell: IntArray  # (template, dp rank) id
    dp: IntArray
    step: IntArray
    block: IntArray
    row: IntArray  # row in layout.comm_nodes
    end_s: FloatArray
    gstart_s: FloatArray


def _panel(layout: _Layout, dag: StepDag, start_s: FloatArray, end_s: FloatArray, block_steps: int) -> _Panel:
    tau, comm, compute = timeline_features(layout, dag, start_s, end_s)
    c = layout.comm_nodes
    gstart = group_start_s(dag, start_s)[c]
    own = _own_rank_comm(layout, dag, gstart, end_s, tau)
    shape = tau.shape
    row, step, dp = np.indices(shape)
    block = step // block_steps
    ok = np.isfinite(comm).ravel()
    return _Panel(
        y=np.log(np.where(tau > MIN_TAU_S, tau, 1.0)).ravel()[ok],
        comm=comm.ravel()[ok],
        compute=compute.ravel()[ok],
        mates_comm=np.maximum(comm - own, 0.0).ravel()[ok],
        cls=layout.comm_class[row.ravel()][ok],
        cell=(row * shape[2] + dp).ravel()[ok],
        dp=dp.ravel()[ok],
        step=step.ravel()[ok],
        block=block.ravel()[ok],
        row=row.ravel()[ok],
        end_s=end_s[c].ravel()[ok],
        gstart_s=gstart.ravel()[ok],
    )


def _own_rank_comm(
    layout: _Layout, dag: StepDag, gstart: FloatArray, end_s: FloatArray, tau: FloatArray
) -> FloatArray:
    """The part of the ``comm`` feature that comes from the op's own rank's other transfers
    (``gstart``: the comm ops' group starts, ``[len(comm_nodes), num_steps, dp_size]``)."""
    c = layout.comm_nodes
    num_steps, dp = gstart.shape[1], gstart.shape[2]
    cend = np.maximum(end_s[c], gstart)
    rank_of = dag.stage[c][:, None] * dp + np.arange(dp)[None, :]  # [len(c), dp]
    key = (np.arange(num_steps)[None, :, None] * (dag.stage.max() + 1) * dp + rank_of[:, None, :]).ravel()
    lo, hi = gstart.ravel(), cend.ravel()
    own = _overlap_sums(key, lo, hi, key, lo, hi).reshape(tau.shape) - np.maximum(tau, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tau > MIN_TAU_S, np.maximum(own, 0.0) / np.where(tau > MIN_TAU_S, tau, 1.0), 0.0)


def _design(panel: _Panel, num_classes: int, comm: FloatArray, compute: FloatArray) -> FloatArray:
    """Feature columns per class (``[n, 2 * num_classes]``) then step-block dummies."""
    num_blocks = int(panel.block.max()) + 1
    cols = np.zeros((len(panel.y), 2 * num_classes + num_blocks - 1))
    for k in range(num_classes):
        hit = panel.cls == k
        cols[hit, 2 * k] = comm[hit]
        cols[hit, 2 * k + 1] = compute[hit]
    for blk in range(1, num_blocks):
        cols[:, 2 * num_classes + blk - 1] = panel.block == blk
    return cols


def _regress(
    panel: _Panel,
    classes: tuple[str, ...],
    comm: FloatArray,
    compute: FloatArray,
    mask: NDArray[np.bool_] | None = None,
) -> RegressionResult:
    """The log-linear fit with (template, DP rank) absorbed and step-block dummies."""
    from scipy import stats

    sel = np.ones(len(panel.y), dtype=bool) if mask is None else mask
    num_classes = len(classes)
    x_all = _design(panel, num_classes, comm, compute)[sel]
    cells = np.unique(panel.cell[sel], return_inverse=True)[1]
    y = _demean(panel.y[sel], cells)
    x = _demean(x_all, cells)
    cls = panel.cls[sel]
    # instances of each (class, feature) with a non-zero raw feature, in column order
    varying = [int((x_all[cls == j // 2, j] > 1e-9).sum()) for j in range(2 * num_classes)]
    keep = [
        j
        for j in range(2 * num_classes)
        if varying[j] >= MIN_VARYING and float(np.std(x[cls == j // 2, j])) >= MIN_FEATURE_SD
    ]
    keep += [j for j in range(2 * num_classes, x.shape[1]) if np.ptp(x[:, j]) > 1e-12]
    steps = np.unique(panel.step[sel], return_inverse=True)[1]
    beta = np.zeros((num_classes, 2))
    coefs = []
    index: list[tuple[int, int]] = []
    if keep:
        params, cov, kind = _ols(y, x[:, keep], steps, cells)
    else:
        params, cov, kind = np.zeros(0), np.zeros((0, 0)), "none"
    pos = {j: i for i, j in enumerate(keep)}
    z = float(stats.norm.ppf(0.975))
    for k, name in enumerate(classes):
        n_k = int((cls == k).sum())
        for f, feat in enumerate(FEATURES):
            j = 2 * k + f
            if j not in pos:
                nan = float("nan")
                coefs.append(Coefficient(name, feat, nan, nan, nan, nan, nan, n_k, varying[j], False))
                continue
            i = pos[j]
            est, se = float(params[i]), float(math.sqrt(max(cov[i, i], 0.0)))
            p = float(2 * stats.norm.sf(abs(est) / se)) if se > 0 else float("nan")
            beta[k, f] = est
            index.append((k, f))
            sd = float(np.std(x[cls == k, j]))
            coefs.append(
                Coefficient(name, feat, est, se, est - z * se, est + z * se, p, n_k, varying[j], True, sd)
            )
    idx = [pos[2 * k + f] for k, f in index]
    sub = cov[np.ix_(idx, idx)] if idx else np.zeros((0, 0))
    wald = float("nan")
    if idx:
        b = params[idx]
        try:
            wald = float(stats.chi2.sf(float(b @ np.linalg.solve(sub, b)), df=len(idx)))
        except np.linalg.LinAlgError:
            pass
    return RegressionResult(tuple(coefs), wald, kind, int(sel.sum()), beta, sub, tuple(index))


def _arrival(panel: _Panel, classes: tuple[str, ...]) -> tuple[Coefficient, ...]:
    """Per class, the slope of completion (end) on last arrival (group start), same fixed effects."""
    from scipy import stats

    out = []
    z = float(stats.norm.ppf(0.975))
    num_blocks = int(panel.block.max()) + 1
    nan = float("nan")
    for k, name in enumerate(classes):
        sel = panel.cls == k
        n = int(sel.sum())
        cells = np.unique(panel.cell[sel], return_inverse=True)[1]
        g = _demean(panel.gstart_s[sel], cells)
        if n < MIN_VARYING or np.ptp(g) <= 1e-12:
            out.append(Coefficient(name, "arrival", nan, nan, nan, nan, nan, n, 0, False))
            continue
        e = _demean(panel.end_s[sel], cells)
        cols = [g] + [
            _demean((panel.block[sel] == b).astype(np.float64), cells) for b in range(1, num_blocks)
        ]
        x = np.column_stack(cols)
        keep = [0] + [j for j in range(1, x.shape[1]) if np.ptp(x[:, j]) > 1e-12]
        steps = np.unique(panel.step[sel], return_inverse=True)[1]
        params, cov, _ = _ols(e, x[:, keep], steps, cells)
        est, se = float(params[0]), float(math.sqrt(max(cov[0, 0], 0.0)))
        p = float(2 * stats.norm.sf(abs(est - 1.0) / se)) if se > 0 else nan
        out.append(
            Coefficient(name, "arrival", est, se, est - z * se, est + z * se, p, n, 0, True, float(np.std(g)))
        )
    return tuple(out)


def _overlap_residuals(panel: _Panel, classes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``CommFit.overlap_residuals``: medians of the log residual after the fixed effects alone."""
    cells = np.unique(panel.cell, return_inverse=True)[1]
    num_blocks = int(panel.block.max()) + 1
    y = _demean(panel.y, cells)
    if num_blocks > 1:
        xd = _demean(
            np.column_stack([(panel.block == b).astype(np.float64) for b in range(1, num_blocks)]), cells
        )
        coef, *_ = np.linalg.lstsq(xd, y, rcond=None)
        y = y - xd @ coef
    out: dict[str, dict[str, Any]] = {}
    for k, name in enumerate(classes):
        sel = panel.cls == k
        full = sel & (panel.mates_comm >= 0.99)
        none = sel & (panel.mates_comm <= 1e-9)
        out[name] = {
            "median_log_residual_mate_overlap": _num(float(np.median(y[full]))) if full.any() else None,
            "num_mate_overlap": int(full.sum()),
            "median_log_residual_no_overlap": _num(float(np.median(y[none]))) if none.any() else None,
            "num_no_overlap": int(none.sum()),
        }
    return out


def _permuted(panel: _Panel, feature: FloatArray, num_steps: int, rng: np.random.Generator) -> FloatArray:
    """``feature`` with each op's value taken from the same (row, dp rank) in a permuted step."""
    perm = rng.permutation(num_steps)
    if num_steps > 1:  # no step keeps its own features
        while np.any(perm == np.arange(num_steps)):
            perm = rng.permutation(num_steps)
    num_dp = int(panel.dp.max()) + 1
    key = (panel.row * num_steps + panel.step) * num_dp + panel.dp
    order = np.argsort(key)
    want = (panel.row * num_steps + perm[panel.step]) * num_dp + panel.dp
    pos = np.searchsorted(key[order], want)
    pos = np.minimum(pos, len(key) - 1)
    found = key[order][pos] == want
    return np.where(found, feature[order][pos], feature)


def fit_backend(
    backend: ReplayBackend,
    *,
    placement: Placement | None = None,
    block_steps: int = 8,
    tolerance_frac: float = 0.01,
    arrival_tolerance: float = 0.1,
    seed: int = 0,
) -> CommFit:
    """Fit the communication-timing model to a replay backend's recording and judge max-plus.

    Args:
        backend: a :class:`~pacectl.backends.replay.ReplayBackend` (its recorded timeline is fitted).
        placement: node placement (default :class:`Placement`'s).
        block_steps: consecutive steps per fixed-effect block, >= 1.
        tolerance_frac: the verdict's bound on the counterfactual step-time change, fraction.
        arrival_tolerance: the verdict's bound on ``|arrival slope - 1|``.
        seed: seed of the placebo permutation and of the probe delays.

    Returns:
        The :class:`CommFit`.

    Raises:
        TraceError: the trace has no communication op with a positive intrinsic time.
        ConfigError: a bad argument.
    """
    if block_steps < 1:
        raise ConfigError(f"fit.block_steps must be an integer >= 1, got {block_steps!r}")
    placement = placement or Placement()
    trace, dag = backend.trace, backend.dag
    meta = trace.meta
    layout = _layout(dag, placement, dp_size=meta.dp_size, pp_size=meta.pp_size, tp_size=meta.tp_size)
    start = dag.start_s
    end = dag.start_s + dag.duration_s
    panel = _panel(layout, dag, start, end, block_steps)
    if len(panel.y) == 0:
        raise TraceError(
            f"the trace must hold communication ops ({', '.join(COMM_OPTYPES)}) with a positive intrinsic "
            f"time to fit a communication model, got none (in {trace.source})"
        )
    classes = layout.classes
    fit = _regress(panel, classes, panel.comm, panel.compute)
    rng = np.random.default_rng(seed)
    num_steps = int(dag.steps.shape[0])
    placebo = _regress(
        panel,
        classes,
        _permuted(panel, panel.comm, num_steps, rng),
        _permuted(panel, panel.compute, num_steps, rng),
    )
    heldout = _heldout_r2(panel, classes)
    arrival = _arrival(panel, classes)
    residuals = _overlap_residuals(panel, classes)
    model = FittedComm(layout, fit.beta, placement=placement, source=trace.source)
    base_mean = float(backend.replayed_times()[1].max(axis=(0, 2)).mean())
    pace = probe_pace(backend, layout, rng)
    max_plus_mean = _mean_step(backend, None, pace, model.beta)
    effect = (_mean_step(backend, model, pace, model.beta) - max_plus_mean) / base_mean
    # the interval of the difference by the delta method: f(beta) is ~linear in beta (f(0) = 0),
    # so its gradient from one replay per identified slope (a step of one standard error) and the
    # slopes' covariance give its standard error
    grad = np.zeros(len(fit.index))
    for i, (k, f) in enumerate(fit.index):
        h = float(math.sqrt(fit.cov[i, i])) or 1e-3
        beta = np.zeros_like(fit.beta)
        beta[k, f] = h
        grad[i] = (_mean_step(backend, model, pace, beta) - max_plus_mean) / base_mean / h
    b_hat = np.array([fit.beta[k, f] for k, f in fit.index])
    linear = float(grad @ b_hat) if len(grad) else 0.0
    se = float(math.sqrt(max(float(grad @ fit.cov @ grad), 0.0))) if len(grad) else 0.0
    bound = float(max(abs(effect), abs(linear) + 1.96 * se))
    verdict, ok = _verdict(
        bound, effect, fit, placebo, heldout, arrival, tolerance_frac, arrival_tolerance, base_mean
    )
    return CommFit(
        source=trace.source,
        placement=placement,
        block_steps=block_steps,
        classes=classes,
        fit=fit,
        placebo=placebo,
        heldout_r2=heldout,
        arrival=arrival,
        overlap_residuals=residuals,
        bound_frac=bound,
        effect_frac=effect,
        tolerance_frac=tolerance_frac,
        arrival_tolerance=arrival_tolerance,
        verdict=verdict,
        consistent_with_max_plus=ok,
        mean_step_time_s=base_mean,
        effect_se_frac=se,
    )


def _heldout_r2(panel: _Panel, classes: tuple[str, ...]) -> float:
    """``CommFit.heldout_r2``, the step-block effects removed from the held-out half."""
    num_steps = int(panel.step.max()) + 1
    train = panel.step < num_steps // 2
    test = ~train
    if num_steps < 4 or not train.any() or not test.any():
        return float("nan")
    res = _regress(panel, classes, panel.comm, panel.compute, mask=train)
    num_classes = len(classes)
    x_all = _design(panel, num_classes, panel.comm, panel.compute)[test]
    cells = np.unique(panel.cell[test], return_inverse=True)[1]
    y = _demean(panel.y[test], cells)
    x = _demean(x_all, cells)
    feats, blocks = x[:, : 2 * num_classes], x[:, 2 * num_classes :]
    blocks = blocks[:, np.ptp(blocks, axis=0) > 1e-12] if blocks.shape[1] else blocks
    if blocks.shape[1]:  # block effects are nuisance: removed from the test data by least squares
        y = y - blocks @ np.linalg.lstsq(blocks, y, rcond=None)[0]
        feats = feats - blocks @ np.linalg.lstsq(blocks, feats, rcond=None)[0]
    pred = feats @ res.beta.reshape(-1)
    ss = float(np.sum(y**2))
    if ss <= 0:
        return float("nan")
    return 1.0 - float(np.sum((y - pred) ** 2)) / ss


def _verdict(
    bound: float,
    effect: float,
    fit: RegressionResult,
    placebo: RegressionResult,
    heldout_r2: float,
    arrival: tuple[Coefficient, ...],
    tolerance: float,
    arrival_tolerance: float,
    mean_step_time_s: float,
) -> tuple[str, bool]:
    # departures of the arrival response (module docstring; a slope read off microseconds of
    # arrival variation moves no completion by `tolerance` of the step time, so is none)
    off = [
        c
        for c in arrival
        if c.identified
        and abs(c.estimate - 1.0) > arrival_tolerance
        and not (c.ci95_low <= 1.0 <= c.ci95_high)
        and abs(c.estimate - 1.0) * c.regressor_sd >= tolerance * mean_step_time_s
    ]
    reasons = []
    strongest = max(
        (c for c in fit.coefficients if c.identified),
        key=lambda c: abs(c.estimate) / c.std_err if c.std_err > 0 else 0.0,
        default=None,
    )
    # a dependence that is significant, predicts held-out steps, and that the placebo does not also find
    validated = (
        strongest is not None
        and fit.wald_p_value < SIGNIFICANCE
        and heldout_r2 >= MIN_HELDOUT_R2
        and not (placebo.wald_p_value < SIGNIFICANCE)
    )
    if validated and bound < tolerance:
        assert strongest is not None
        reasons.append(
            f"{strongest.op_class}'s log transfer time moves {strongest.estimate:+.3g} "
            f"[{strongest.ci95_low:+.3g}, {strongest.ci95_high:+.3g}] per concurrent {strongest.feature} op "
            f"(joint p = {fit.wald_p_value:.2g}, held out R^2 = {heldout_r2:.2f}, placebo p = "
            f"{placebo.wald_p_value:.2g}), though random delays before every transfer change mean step time by "
            f"only {effect * 100:+.3f} % (up to {bound * 100:.3f} %) against max-plus"
        )
    if bound >= tolerance:
        what = (
            f"; strongest slope {strongest.op_class}/{strongest.feature} {strongest.estimate:+.3g} "
            f"[{strongest.ci95_low:+.3g}, {strongest.ci95_high:+.3g}] per concurrent op"
            if strongest
            else ""
        )
        reasons.append(
            f"under random delays before every transfer the fitted model's mean step time differs from "
            f"max-plus's by {effect * 100:+.2f} % (up to {bound * 100:.2f} %){what}"
        )
    for c in off:
        reasons.append(
            f"{c.op_class}'s completion moves {c.estimate:.2f} [{c.ci95_low:.2f}, {c.ci95_high:.2f}] s per s of "
            "its last arrival where max-plus predicts 1.0"
        )
    if reasons:
        return "timing-dependent: " + "; ".join(reasons), False
    return f"consistent with max-plus within +-{bound * 100:.3g} % of step time", True


def probe_pace(backend: ReplayBackend, layout: _Layout, rng: np.random.Generator) -> FloatArray:
    """Independent uniform delays in ``[0, d_c]`` before every communication op instance.

    ``d_c`` is the larger of the median earliness (group start minus own start) and the median
    transfer time of the op's class in the zero-delay replay: delays large enough to move what
    overlaps each transfer (a p2p op's earliness is often a microsecond).

    Returns:
        ``float64[N, num_steps, dp_size]`` seconds, 0 for ops that are not communication.
    """
    dag = backend.dag
    start, end = backend.replayed_times()
    c = layout.comm_nodes
    gstart = group_start_s(dag, start)
    early, tau = (gstart - start)[c], (end - gstart)[c]
    pace = np.zeros_like(start)
    for name in layout.classes:
        rows = np.flatnonzero(layout.op_class[c] == name)
        d = max(float(np.median(early[rows])), float(np.median(tau[rows])))
        pace[c[rows]] = rng.uniform(0.0, d, size=(len(rows), *start.shape[1:]))
    return pace


def _mean_step(backend: ReplayBackend, model: FittedComm | None, pace: FloatArray, beta: FloatArray) -> float:
    """Mean step time of an open-loop replay with ``pace`` before each op: max-plus (``model`` None)
    or the fitted model with slopes ``beta``."""
    from pacectl.backends.dag import evaluate

    end, start = backend._base_end.copy(), backend._base_start.copy()
    if model is None:
        evaluate(backend.dag.levels, end, start, backend._launch, backend._transfer, pace)
        return float(end[:-1].max(axis=(0, 2)).mean())
    _, e = fixed_point(model, backend, end, start, pace, steps=slice(None), beta=beta)
    return float(e.max(axis=(0, 2)).mean())


# ---------------------------------------------------------------------------------------------
# The replay model


class FittedComm:
    """``comm=fitted``: transfer times that respond to concurrent communication and compute as fitted.

    A replay's communication op keeps its recorded transfer time times
    ``exp(beta_class . (x_replayed - x_recorded))`` (see the module docstring); the step is solved by
    :func:`fixed_point`. Build it with :meth:`for_backend` (fit and model in one), or from a
    layout and slopes.

    Attributes:
        name: ``"fitted"``.
        timing_dependent: True when some slope is non-zero.
        description: one line naming the fit and the placement.
        fit: the :class:`CommFit` behind it (None when built from a bare regression).
    """

    name = "fitted"

    def __init__(
        self,
        layout: _Layout,
        beta: FloatArray,
        *,
        placement: Placement,
        source: str,
        rtol: float = 1e-6,
        max_passes: int = 100,
        fit: CommFit | None = None,
    ) -> None:
        self.layout = layout
        self.beta = np.asarray(beta, dtype=np.float64)
        self.placement = placement
        self.source = source
        self.rtol = rtol
        self.max_passes = max_passes
        self.timing_dependent = bool(np.any(self.beta != 0))
        self.fit = fit
        self.description = self._describe()
        self._recorded: tuple[FloatArray, FloatArray] | None = None
        self.unconverged = 0

    @classmethod
    def for_backend(cls, backend: ReplayBackend, **fit_kwargs: Any) -> FittedComm:
        """Fit ``backend``'s recording (:func:`fit_backend`) and return its model, ``fit`` attached."""
        fit = fit_backend(backend, **fit_kwargs)
        meta = backend.trace.meta
        layout = _layout(
            backend.dag, fit.placement, dp_size=meta.dp_size, pp_size=meta.pp_size, tp_size=meta.tp_size
        )
        return cls(layout, fit.fit.beta, placement=fit.placement, source=backend.trace.source, fit=fit)

    def _describe(self) -> str:
        parts = []
        for k, name in enumerate(self.layout.classes):
            for f, feat in enumerate(FEATURES):
                if self.beta[k, f] != 0:
                    parts.append(f"{name}/{feat} {self.beta[k, f]:+.3g}")
        slopes = ", ".join(parts) if parts else "no slope identified (max-plus)"
        verdict = f"; {self.fit.verdict}" if self.fit is not None else ""
        return (
            f"fitted (log transfer time on concurrent comm and compute per node, from {self.source}: "
            f"{slopes}; {self.placement.describe()}{verdict})"
        )

    def transfer_s(self, recorded_transfer_s: FloatArray) -> FloatArray:
        """Static part: the recorded transfer times (the fitted part is applied in the fixed point)."""
        return recorded_transfer_s

    def reference_features(
        self, dag: StepDag, start_s: FloatArray, end_s: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """The features of the recording as replayed (``ReplayBackend.recorded_timeline``), computed
        once: the reference a replayed op's features are compared with, so replaying the recording's
        own timing gives its recorded times exactly, as the null model does.

        Args:
            start_s, end_s: ``float64[N, num_steps, dp_size]``, the backend's zero-delay timeline.
        """
        if self._recorded is None:
            _, comm, compute = timeline_features(self.layout, dag, start_s, end_s)
            self._recorded = (comm, compute)
        return self._recorded

    def solve_step(
        self, backend: ReplayBackend, k: int, end: FloatArray, start: FloatArray, pace: FloatArray
    ) -> None:
        """Solve replayed step ``k`` in place (``ReplayBackend.step`` calls it instead of max-plus).

        Args:
            end: ``float64[N + 1, dp_size]``, the step's zero-delay end times on entry, the solution
                on return; start: ``float64[N, dp_size]`` likewise; pace: the pacing delays.
        """
        fixed_point(self, backend, end, start, pace, steps=k, beta=self.beta)

    def replay(
        self, backend: ReplayBackend, delays: FloatArray | None = None, *, beta: FloatArray | None = None
    ) -> tuple[FloatArray, FloatArray]:
        """Open-loop replay of every step with this model (the fitted counterpart of ``replayed_times``).

        Args:
            backend: the backend whose recording the model was fitted on.
            delays: ``float64[num_steps, num_ranks]`` pacing delays, seconds, or None.
            beta: slopes to use instead of the fitted ones (``float64[num_classes, 2]``).

        Returns:
            ``(start_s, end_s)``, each ``float64[N, num_steps, dp_size]``.
        """
        return fixed_point(
            self,
            backend,
            backend._base_end.copy(),
            backend._base_start.copy(),
            backend._pace_of(delays),
            steps=slice(None),
            beta=self.beta if beta is None else beta,
        )


def fixed_point(
    model: FittedComm,
    backend: ReplayBackend,
    end: FloatArray,
    start: FloatArray,
    pace_s: FloatArray | None,
    *,
    steps: slice | int,
    beta: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Solve a replayed step (or every step) under the fitted model, in place.

    The unknowns are the communication ops' transfer times ``t``; one pass evaluates the backend's
    DAG with its launch delays and ``t``, recomputes every communication op's features ``x(t)`` from
    the evaluated timeline and returns ``t_recorded * exp(beta . (x(t) - x_reference))``
    (``x_reference``: the features of ``backend.recorded_timeline()``). The fixed point
    ``t = pass(t)`` is found by ``scipy.optimize.fixed_point`` (Steffensen's method with Aitken's
    acceleration) to the relative tolerance ``model.rtol`` within ``model.max_passes`` iterations;
    one that does not converge keeps its last pass and is counted in ``model.unconverged``. Slopes
    of 0 need no pass.

    Args:
        end: ``float64[N + 1, (num_steps,) dp_size]``, the baseline end times (sentinel row last).
        start: ``float64[N, (num_steps,) dp_size]``.
        pace_s: the pacing delays, the shape of ``start``, or None.
        steps: ``slice(None)`` when the arrays hold every step, else the one step's index.

    Returns:
        ``(start, end[:-1])``.
    """
    from pacectl.backends.dag import evaluate

    dag, levels = backend.dag, backend.dag.levels
    launch_s, transfer_s = backend._launch[:, steps], backend._transfer[:, steps]
    rec_comm, rec_compute = model.reference_features(dag, *backend.recorded_timeline())
    rec_comm, rec_compute = rec_comm[:, steps], rec_compute[:, steps]
    c, cls = model.layout.comm_nodes, model.layout.comm_class
    b_comm = beta[cls, 0].reshape(-1, *([1] * (start.ndim - 1)))
    b_compute = beta[cls, 1].reshape(-1, *([1] * (start.ndim - 1)))
    transfer = transfer_s.copy()
    base_transfer = transfer_s[c]
    one_step = start.ndim == 2
    base_end, base_start = end.copy(), start.copy()

    def solve(comm_transfer: FloatArray) -> None:
        end[:] = base_end
        start[:] = base_start
        transfer[c] = comm_transfer
        evaluate(levels, end, start, launch_s, transfer, pace_s)

    def update(comm_transfer: FloatArray) -> FloatArray:
        solve(comm_transfer)
        s3 = start[:, None] if one_step else start
        e3 = end[:-1, None] if one_step else end[:-1]
        _, comm, compute = timeline_features(model.layout, dag, s3, e3)
        if one_step:
            comm, compute = comm[:, 0], compute[:, 0]
        d_comm = np.where(np.isfinite(comm) & np.isfinite(rec_comm), comm - rec_comm, 0.0)
        d_compute = np.where(np.isfinite(compute) & np.isfinite(rec_compute), compute - rec_compute, 0.0)
        return base_transfer * np.exp(b_comm * d_comm + b_compute * d_compute)

    if not np.any(beta):
        solve(base_transfer)
    else:
        from scipy.optimize import fixed_point as scipy_fixed_point

        try:
            solution = scipy_fixed_point(update, base_transfer, xtol=model.rtol, maxiter=model.max_passes)
        except RuntimeError:  # not converged in max_passes: keep the last plain iterate, and count it
            model.unconverged += 1
            solution = update(transfer[c].copy())
        solve(np.maximum(np.asarray(solution, dtype=np.float64), 0.0))
    return start, end[:-1]


@dataclass(frozen=True, kw_only=True)
class FitConfig(Placement):
    """The ``fit`` config section (``conf/config.yaml``) and the ``fit`` command's options: the
    :class:`Placement` and the other keyword arguments of :func:`fit_backend`, with their defaults."""

    block_steps: int = within(8, ">= 1", example=8)
    tolerance_frac: float = within(0.01, "> 0", example=0.01)
    arrival_tolerance: float = within(0.1, "> 0")
    seed: int = within(0, ">= 0", example=0)


def fit_options(section: Any) -> dict[str, Any]:
    """The keyword arguments of :func:`fit_backend` from the ``fit`` config section (None: defaults).

    Raises:
        ConfigError: an unknown key or a bad value, naming ``fit.<key>``.
    """
    opts = vars(typed(FitConfig, section))
    placement = Placement(ranks_per_node=opts.pop("ranks_per_node"), rank_order=opts.pop("rank_order"))
    return {"placement": placement, **opts}
