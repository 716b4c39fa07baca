"""What-if analysis: how much do stragglers cost, and which rank, stage or op type causes it?

Method and definitions follow Lin et al., "Understanding Stragglers in Large Model Training Using
What-if Analysis" (OSDI 2025, section 4 and the artifact github.com/ByteDance-Seed/StragglerAnalysis),
re-implemented on pacectl's vectorized replay (:mod:`pacectl.backends.dag`):

- **original** (``t_ori``): the replay with every launch delay removed (recorded durations and
  intrinsic transfer times, no host-side gaps);
- **ideal** (``t_ideal``): the same replay with the straggling removed. Every compute-like op
  (``forward-compute``, ``backward-compute``, ``gc``, ``optimizer``) takes the **mean** duration of its
  op type over all DP ranks, stages and steps; every communication op (p2p send/recv, DP all-gather
  and reduce-scatter, the layernorm, embedding and grad-norm all-reduces) takes the **median**
  intrinsic transfer time of its op type over the same population;
- **blocking slowdown** ``S = mean step time of the original / mean step time of the ideal``
  (and ``launch slowdown = mean recorded step time / t_ori``);
- **attribution**: for each DP rank, each PP stage and each op type (p2p merged into
  ``forward-pp-comm`` / ``backward-pp-comm``), the ideal replay with only that subset's recorded
  durations put back; its slowdown ``mean(step time) / t_ideal`` is what that subset alone causes.
  Per-step versions divide step by step. pacectl adds the same for each (DP rank, stage) cell;
- **M_S** (stage imbalance): ``(t_ori - t_rem) / (t_ori - t_ideal)`` where ``t_rem`` is the original
  with the last stage's ops set to ideal; undefined (NaN, ``null`` in JSON) with one pipeline stage;
- **M_W** (worker issue): the same with the top 3 % of ranks (at least one) set to ideal, ranks
  scored by ``min(slowdown of their DP rank, slowdown of their stage)``. ``add`` variants put the
  subset's recorded durations back into the ideal instead: ``(t_add - t_ideal) / (t_ori - t_ideal)``.

Every number here comes from the null (max-plus) model: fixed durations.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from pacectl.files import atomic_write_text, jsonable
from pacectl.report import format_value, save_figure

if TYPE_CHECKING:  # the replay (and pandas under it) is imported where a replay runs: a process
    # that only draws the heatmap (pacectl.report.plot_server) or unpickles a result needs neither
    from pacectl.backends.dag import StepDag
    from pacectl.backends.replay import ReplayBackend

COMPUTE_LIKE = ("forward-compute", "backward-compute", "gc", "optimizer")
P2P_GROUP = {
    "forward-send": "forward-pp-comm",
    "forward-recv": "forward-pp-comm",
    "backward-send": "backward-pp-comm",
    "backward-recv": "backward-pp-comm",
}
MW_TOP_FRAC = 0.03  # share of ranks M_W sets to ideal (the artifact's RATIO = 3 %)
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Explained:
    """Effect of one subset on the gap between original and ideal (artifact's ``explain_slowdown``).

    Attributes:
        t_ori, t_ideal: mean step time of the original and the ideal replay, seconds.
        t_rem: mean step time of the original with the subset set to ideal, seconds.
        t_add: mean step time of the ideal with the subset's recorded durations, seconds.
        rem: ``(t_ori - t_rem) / (t_ori - t_ideal)``; the M_W / M_S value.
        add: ``(t_add - t_ideal) / (t_ori - t_ideal)``.
        subset: what was replaced, in words.
    """

    t_ori: float
    t_ideal: float
    t_rem: float
    t_add: float
    rem: float
    add: float
    subset: str


@dataclass(frozen=True)
class WhatIfResult:
    """Outcome of :func:`analyze`. See the module docstring for every definition.

    Attributes:
        trace: trace name.
        steps: ``int64[num_steps]`` step ids.
        step_time_recorded_s, step_time_original_s, step_time_ideal_s: ``float64[num_steps]`` seconds.
        blocking_slowdown: ``mean(original) / mean(ideal)``.
        launch_slowdown: ``mean(recorded) / mean(original)``.
        by_dp_rank, by_stage, by_optype: subset -> slowdown it alone causes.
        by_rank: ``float64[dp_size, pp_size]`` slowdown of each (DP rank, stage) cell alone.
        rank_labels: ``int64[pp_size, dp_size]`` global rank of each cell.
        per_step: ``{"by_dp_rank" | "by_stage" | "by_optype": {step: {subset: slowdown}}}``.
        m_w, m_s: the characterisation metrics with their components.
        num_replays: replays run.
    """

    trace: str
    steps: NDArray[np.int64]
    step_time_recorded_s: FloatArray
    step_time_original_s: FloatArray
    step_time_ideal_s: FloatArray
    blocking_slowdown: float
    launch_slowdown: float
    by_dp_rank: dict[str, float]
    by_stage: dict[str, float]
    by_optype: dict[str, float]
    by_rank: FloatArray
    rank_labels: NDArray[np.int64]
    per_step: dict[str, dict[str, dict[str, float]]]
    m_w: Explained
    m_s: Explained
    num_replays: int = field(default=0)

    def to_json(self) -> dict[str, Any]:
        """The ``whatif.json`` payload (plain JSON types)."""

        def explained(e: Explained) -> dict[str, Any]:
            return {k: getattr(e, k) for k in ("rem", "add", "t_ori", "t_ideal", "t_rem", "t_add", "subset")}

        return jsonable(
            {
                "trace": self.trace,
                "comm_model": "null",
                "definitions": "Lin et al., OSDI 2025: compute ops ideal = mean per op type, comm ops ideal = "
                "median per op type, over all DP ranks, stages and steps; launch delays removed",
                "blocking_slowdown": self.blocking_slowdown,
                "launch_slowdown": self.launch_slowdown,
                "by_dp_rank": _sorted(self.by_dp_rank),
                "by_stage": _sorted(self.by_stage),
                "by_optype": _sorted(self.by_optype),
                "by_rank": {
                    str(int(self.rank_labels[s, d])): {
                        "dp_rank": d,
                        "stage": s,
                        "slowdown": float(self.by_rank[d, s]),
                    }
                    for s in range(self.by_rank.shape[1])
                    for d in range(self.by_rank.shape[0])
                },
                "m_w": self.m_w.rem,
                "m_s": self.m_s.rem,
                "m_w_detail": explained(self.m_w),
                "m_s_detail": explained(self.m_s),
                "per_step": self.per_step,
                "step_time_s": {
                    str(int(s)): {"recorded": r, "original": o, "ideal": i}
                    for s, r, o, i in zip(
                        self.steps,
                        self.step_time_recorded_s,
                        self.step_time_original_s,
                        self.step_time_ideal_s,
                        strict=True,
                    )
                },
                "num_replays": self.num_replays,
            }
        )

    def worst_offenders(self, top: int = 3) -> list[str]:
        """Human-readable lines naming the subsets that cost the most, worst first."""
        lines = [
            f"blocking slowdown S = {self.blocking_slowdown:.3f} (stragglers cost "
            f"{(1 - 1 / self.blocking_slowdown) * 100:.1f} % of step time); "
            f"M_W = {format_value(self.m_w.rem, '.3f')}, M_S = {format_value(self.m_s.rem, '.3f')}"
        ]
        d, s = np.unravel_index(int(np.argmax(self.by_rank)), self.by_rank.shape)
        lines.append(
            f"worst rank: global rank {int(self.rank_labels[s, d])} (dp_rank {d}, stage {s}) alone: "
            f"{self.by_rank[d, s]:.3f}x"
        )
        for label, table in (
            ("DP rank", self.by_dp_rank),
            ("stage", self.by_stage),
            ("op type", self.by_optype),
        ):
            items = list(_sorted(table).items())[:top]
            lines.append(f"worst {label}: " + ", ".join(f"{k} {v:.3f}x" for k, v in items))
        return lines


def _sorted(table: dict[str, float]) -> dict[str, float]:
    return dict(sorted(table.items(), key=lambda kv: -kv[1]))


class _Replayer:
    """Runs no-launch-delay replays of a backend with modified transfer times; counts them.

    Two ways to evaluate a scenario, with bit-identical step times:

    - :meth:`step_times`: one full replay of every op of every (step, DP rank) block;
    - :meth:`column_step_times`: a batch of scenarios that each change only ``k`` DP columns of the
      ideal durations (the rest ideal). Every other column then carries the same inputs, so it
      evaluates to the same times, and the DP synchronisation (a max over the columns) sees the
      same values whether it takes the max over one representative ideal column or over all of
      them: each scenario is evaluated on its ``k`` columns plus one ideal column, and a batch of
      them as one max-plus evaluation over a scenario axis (``[N, num_steps, scenarios, k + 1]``).
    """

    def __init__(
        self,
        backend: ReplayBackend,
        on_replay: Callable[[], None] | None = None,
        *,
        chunk_elements: int = 1 << 22,
        legacy: bool = False,
    ) -> None:
        self.backend = backend
        self.legacy = legacy
        self.count = 0
        self.on_replay = on_replay
        self.chunk_elements = chunk_elements
        # The full replays' end times and scenario durations, made once and reused: at 30 M ops a
        # fresh 240 MB array per replay cost more in the kernel's first touch of its pages than the
        # replay itself (experiments/bench/README.md, the what-if section).
        self._end: FloatArray | None = None
        self._scenario: FloatArray | None = None

    def _tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.count += 1
            if self.on_replay is not None:
                self.on_replay()

    def step_times(self, transfer_s: FloatArray) -> FloatArray:
        """Step times of one full replay with no launch delays, ``float64[num_steps]`` seconds."""
        dag = self.backend.dag
        if self.legacy:  # method="full": the backend's own replay, the reference
            zero = np.zeros_like(self.backend.launch_s)
            _, ended = self.backend.replayed_times(launch_s=zero, transfer_s=transfer_s)
            self._tick()
            return ended.max(axis=(0, 2))
        from pacectl.backends.dag import evaluate

        if self._end is None or self._end.shape[1:] != transfer_s.shape[1:]:
            self._end = np.zeros((dag.num_nodes + 1, *transfer_s.shape[1:]))  # row N: the sentinel, 0
        evaluate(dag.levels, self._end, None, None, transfer_s)  # writes every other row
        self._tick()
        return self._end[:-1].max(axis=(0, 2))

    def scenario(self, base: FloatArray, kept: FloatArray, mask: NDArray[np.bool_]) -> FloatArray:
        """``np.where(mask, kept, base)``, ``float64[N, num_steps, dp_size]`` seconds, written into
        one buffer reused by every call (valid until the next); ``mask`` broadcasts to ``base``."""
        if self._scenario is None or self._scenario.shape != base.shape:
            self._scenario = np.empty_like(base)
        np.copyto(self._scenario, base)
        np.copyto(self._scenario, kept, where=mask)
        return self._scenario

    def column_step_times(
        self,
        num_scenarios: int,
        num_columns: int,
        columns: Callable[[int, int, FloatArray], None],
        ideal_column: FloatArray,
    ) -> FloatArray:
        """Step times of scenarios that differ from the ideal in ``num_columns`` DP columns each.

        Args:
            num_scenarios: scenarios to evaluate.
            num_columns: columns each scenario changes (``k``, at most ``dp_size``).
            columns: ``columns(b0, b1, out)`` writes the changed columns' durations of scenarios
                ``b0..b1-1`` into ``out``, ``float64[N, num_steps, k, b1 - b0]`` seconds
                (scenarios last; a view of the batch's reused buffer).
            ideal_column: ``float64[N, num_steps]`` the ideal durations of any DP column.

        Returns:
            ``float64[num_scenarios, num_steps]`` seconds, as :meth:`step_times` of each scenario
            (bit-identical: the same sums and maxima of the same values).
        """
        from pacectl.backends.dag import evaluate

        dag = self.backend.dag
        n, num_steps = dag.num_nodes, dag.start_s.shape[1]
        dp = dag.rank_labels.shape[1]
        width = num_columns + 1 if num_columns < dp else num_columns
        chunk = max(1, self.chunk_elements // ((n + 1) * num_steps * width))
        out = np.empty((num_scenarios, num_steps))
        size = min(chunk, num_scenarios)  # one chunk's buffers, reused (the last chunk: a view)
        transfer_buf = np.empty((n, num_steps, width, size))
        end_buf = np.zeros((n + 1, num_steps, width, size))  # row n: the sentinel, 0
        for b0 in range(0, num_scenarios, chunk):
            b1 = min(num_scenarios, b0 + chunk)
            transfer, end = transfer_buf[..., : b1 - b0], end_buf[..., : b1 - b0]
            columns(b0, b1, transfer[:, :, :num_columns])
            if width > num_columns:
                transfer[:, :, num_columns] = ideal_column[:, :, None]
            evaluate(dag.levels, end, None, None, transfer, dp_axis=-2)
            out[b0:b1] = end[:-1].max(axis=(0, 2)).T
            self._tick(b1 - b0)
        return out


def _optype_groups(dag: StepDag) -> NDArray[np.str_]:
    """Each op's attribution group: its op type, pipeline send and receive folded into one."""
    return np.array([P2P_GROUP.get(str(t), str(t)) for t in dag.optype])


def num_replays(backend: ReplayBackend) -> int:
    """How many replays :func:`analyze` runs on ``backend``: 2 (recorded, ideal) + one per DP rank,
    stage, op group and (DP rank, stage) cell + 2 for M_W + 2 for M_S (with more than one stage).
    The count grows as dp x pp, the cost only as dp: a by-DP-rank or by-cell scenario is evaluated
    on two DP columns (see :func:`analyze`), so all of them together cost about ``2 (pp + 1)``
    full replays."""
    dag = backend.dag
    dp, pp = dag.rank_labels.shape[1], dag.rank_labels.shape[0]
    groups = len(np.unique(_optype_groups(dag)))
    return 2 + dp + pp + groups + dp * pp + 2 + (2 if pp > 1 else 0)


def ideal_transfer_s(backend: ReplayBackend) -> FloatArray:
    """Ideal durations: per op type, mean (compute-like) or median (communication) over all instances.

    Returns:
        ``float64[N, num_steps, dp_size]`` seconds.
    """
    recorded = np.asarray(backend.transfer_s)
    ideal = np.empty_like(recorded)
    optype = backend.dag.optype
    for t in np.unique(optype):
        nodes = optype == t
        values = recorded[nodes]
        ideal[nodes] = values.mean() if t in COMPUTE_LIKE else np.median(values)
    return ideal


def analyze(
    backend: ReplayBackend, *, on_replay: Callable[[], None] | None = None, method: str = "columns"
) -> WhatIfResult:
    """Run the full what-if analysis on a replay backend (null model).

    Args:
        backend: a :class:`~pacectl.backends.replay.ReplayBackend` of the trace.
        on_replay: called after each of the :func:`num_replays` replays (a progress bar).
        method: ``"columns"`` (default) evaluates each by-DP-rank, by-cell and M_W-add scenario on
            only the DP columns it changes plus one representative ideal column, batched over a
            scenario axis, and reuses the original replay where a scenario's durations equal it
            (one pipeline stage: the by-stage and by-cell replays); ``"full"`` runs one full replay
            per scenario (the artifact's way). Both give bit-identical results (tested).

    Returns:
        The :class:`WhatIfResult`.

    Raises:
        ValueError: ``method`` is neither ``"columns"`` nor ``"full"``.

    Example:
        >>> from pacectl.backends.replay import ReplayBackend
        >>> from pacectl.data import shipped_trace
        >>> from pacectl.traces.bytedance import load_bytedance
        >>> result = analyze(ReplayBackend(load_bytedance(*shipped_trace("ST"))))
        >>> round(result.blocking_slowdown, 2)
        1.18
    """
    if method not in ("columns", "full"):
        raise ValueError(f"method must be 'columns' or 'full', got {method!r}")
    dag = backend.dag
    rep = _Replayer(backend, on_replay, legacy=method == "full")
    recorded_t = np.asarray(backend.transfer_s)
    ideal_t = ideal_transfer_s(backend)
    step_recorded = (dag.start_s + dag.duration_s).max(axis=(0, 2))
    step_ori = rep.step_times(recorded_t)
    step_ideal = rep.step_times(ideal_t)
    t_ori, t_ideal = float(step_ori.mean()), float(step_ideal.mean())
    dp, pp = dag.rank_labels.shape[1], dag.rank_labels.shape[0]
    steps = [str(int(s)) for s in dag.steps]
    ideal_col = ideal_t[:, :, 0]
    # the column method rests on every DP column of the ideal being the same
    columns = method == "columns" and bool((ideal_t == ideal_col[:, :, None]).all())
    # nodes whose recorded durations are their ideal ones in every step and DP rank
    as_ideal = (recorded_t == ideal_t).all(axis=(1, 2)) if columns else np.zeros(dag.num_nodes, dtype=bool)

    def keep(node_mask: NDArray[np.bool_], dp_mask: NDArray[np.bool_] | None = None) -> FloatArray:
        """Ideal everywhere except the selected (node, dp) cells, which keep their recorded values;
        where that is the original's or the ideal's durations, their step times."""
        if dp_mask is None and (as_ideal[~node_mask].all() or as_ideal[node_mask].all()):
            rep._tick()
            return step_ori if as_ideal[~node_mask].all() else step_ideal
        mask = node_mask[:, None, None]
        if dp_mask is not None:
            mask = mask & dp_mask[None, None, :]
        return rep.step_times(rep.scenario(ideal_t, recorded_t, mask))

    def keep_cells(dp_index: NDArray[np.int64], stage_index: NDArray[np.int64] | None) -> FloatArray:
        """Step times, ``[len(dp_index), num_steps]``, of keeping DP column ``dp_index[b]``'s recorded
        durations (only on stage ``stage_index[b]``'s ops, if given), ideal elsewhere."""
        if not columns:
            every = np.ones(dag.num_nodes, dtype=bool)
            rows = []
            for b, d in enumerate(dp_index):
                on = every if stage_index is None else dag.stage == stage_index[b]
                rows.append(keep(on, np.arange(dp) == d))
            return np.array(rows)

        def changed(b0: int, b1: int, out: FloatArray) -> None:
            column = out[:, :, 0, :]  # [N, num_steps, b1 - b0]
            if stage_index is None:
                np.take(recorded_t, dp_index[b0:b1], axis=2, out=column)
                return
            column[...] = ideal_col[:, :, None]  # then the stage's rows of each scenario's column
            rows, cols = np.nonzero(dag.stage[:, None] == stage_index[None, b0:b1])
            column[rows, :, cols] = recorded_t[rows, :, dp_index[b0 + cols]]

        return rep.column_step_times(len(dp_index), 1, changed, ideal_col)

    per_step: dict[str, dict[str, dict[str, float]]] = {}

    def record(name: str, keys: list[str], times: FloatArray) -> dict[str, float]:
        overall: dict[str, float] = {}
        by_step: dict[str, dict[str, float]] = {s: {} for s in steps}
        for key, row in zip(keys, times, strict=True):
            overall[key] = float(row.mean() / t_ideal)
            for s, ratio in zip(steps, row / step_ideal, strict=True):
                by_step[s][key] = float(ratio)
        per_step[name] = {s: _sorted(v) for s, v in by_step.items()}
        return overall

    dp_range = np.arange(dp, dtype=np.int64)
    dp_times = keep_cells(dp_range, None)
    by_dp = record("by_dp_rank", [str(d) for d in range(dp)], dp_times)
    by_stage = record(
        "by_stage", [str(s) for s in range(pp)], np.array([keep(dag.stage == s) for s in range(pp)])
    )
    groups = _optype_groups(dag)
    names = [str(g) for g in np.unique(groups)]
    by_optype = record("by_optype", names, np.array([keep(groups == g) for g in names]))
    if columns and pp == 1:  # the cell (d, 0) is the whole DP column d: the by-DP-rank replay
        rep._tick(dp)
        cell_times = dp_times
    else:
        cell_times = keep_cells(np.repeat(dp_range, pp), np.tile(np.arange(pp, dtype=np.int64), dp))
    by_rank = np.array([float(row.mean() / t_ideal) for row in cell_times]).reshape(dp, pp)

    def explained(t_rem: float, t_add: float, subset: str) -> Explained:
        gap = t_ori - t_ideal
        return Explained(
            t_ori=t_ori,
            t_ideal=t_ideal,
            t_rem=t_rem,
            t_add=t_add,
            rem=(t_ori - t_rem) / gap if gap > 0 else math.nan,
            add=(t_add - t_ideal) / gap if gap > 0 else math.nan,
            subset=subset,
        )

    def explain(mask: NDArray[np.bool_], subset: str) -> Explained:
        t_rem = float(rep.step_times(rep.scenario(recorded_t, ideal_t, mask)).mean())
        t_add = float(rep.step_times(rep.scenario(ideal_t, recorded_t, mask)).mean())
        return explained(t_rem, t_add, subset)

    if pp > 1:
        last = np.broadcast_to((dag.stage == pp - 1)[:, None, None], recorded_t.shape)
        m_s = explain(last, f"every op of the last stage ({pp - 1})")
    else:  # the "last stage" would be the whole job: M_S = 1 would read as all stage imbalance
        m_s = explained(math.nan, math.nan, "undefined: one pipeline stage, no stage imbalance")
    score = np.minimum(
        np.array([by_dp[str(d)] for d in range(dp)])[:, None],
        np.array([by_stage[str(s)] for s in range(pp)])[None, :],
    )
    n_top = max(1, math.ceil(dp * pp * MW_TOP_FRAC))
    order = np.lexsort((np.arange(dp * pp), -score.reshape(-1)))[:n_top]  # ties: lower dp_rank first
    cells = [(int(i // pp), int(i % pp)) for i in order]
    subset = f"top {n_top} rank(s) by min(DP-rank, stage) slowdown: " + ", ".join(
        f"rank {int(dag.rank_labels[s, d])} (dp {d}, stage {s})" for d, s in cells
    )
    mw_mask = np.zeros(recorded_t.shape, dtype=bool)
    for d, s in cells:
        mw_mask[dag.stage == s, :, d] = True
    if columns:
        t_rem = float(rep.step_times(rep.scenario(recorded_t, ideal_t, mw_mask)).mean())
        mw_cols = np.array(sorted({d for d, _ in cells}), dtype=np.int64)
        on = mw_mask[:, 0, :][:, mw_cols]  # [N, k]: which of the columns' ops keep their recording
        kept = np.where(on[:, None, :], recorded_t[:, :, mw_cols], ideal_col[:, :, None])[..., None]

        def mw_columns(b0: int, b1: int, out: FloatArray) -> None:
            out[...] = kept

        t_add = float(rep.column_step_times(1, len(mw_cols), mw_columns, ideal_col)[0].mean())
        m_w = explained(t_rem, t_add, subset)
    else:
        m_w = explain(mw_mask, subset)
    return WhatIfResult(
        trace=backend.trace.meta.name,
        steps=dag.steps,
        step_time_recorded_s=step_recorded,
        step_time_original_s=step_ori,
        step_time_ideal_s=step_ideal,
        blocking_slowdown=t_ori / t_ideal,
        launch_slowdown=float(step_recorded.mean() / t_ori),
        by_dp_rank=by_dp,
        by_stage=by_stage,
        by_optype=by_optype,
        by_rank=by_rank,
        rank_labels=dag.rank_labels,
        per_step=per_step,
        m_w=m_w,
        m_s=m_s,
        num_replays=rep.count,
    )


def plot_heatmap(path: str | Path, result: WhatIfResult) -> None:
    """PNG heatmap of the slowdown each (DP rank, stage) cell causes alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dp, pp = result.by_rank.shape
    fig = Figure(figsize=(1.2 * pp + 3, 0.8 * dp + 2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    im = ax.imshow(result.by_rank, cmap="Reds", vmin=1.0, vmax=max(1.0 + 1e-6, float(result.by_rank.max())))
    mid = 0.5 * (1.0 + float(result.by_rank.max()))
    for d in range(dp):
        for s in range(pp):
            value = result.by_rank[d, s]
            ax.text(
                s,
                d,
                f"{value:.3f}\nrank {int(result.rank_labels[s, d])}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if value > mid else "black",
            )
    ax.set_xticks(range(pp), [str(s) for s in range(pp)])
    ax.set_yticks(range(dp), [str(d) for d in range(dp)])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("DP rank")
    ax.set_title(
        f"{result.trace}: slowdown caused by each rank alone\n(S = {result.blocking_slowdown:.3f}; "
        "comm model: null)"
    )
    fig.colorbar(im, ax=ax, label="mean step time / ideal")
    save_figure(fig, path)


def write_timeline(path: str | Path, backend: ReplayBackend, *, step_index: int = 0) -> None:
    """Chrome-trace JSON (opens in Perfetto / chrome://tracing) of one step: recorded vs ideal replay.

    Two processes, ``recorded`` and ``ideal (what-if)``, one thread per global rank; ``ts``/``dur`` in µs.
    """
    dag = backend.dag
    start_ideal, end_ideal = backend.replayed_times(
        launch_s=np.zeros_like(backend.launch_s), transfer_s=ideal_transfer_s(backend)
    )
    events: list[dict[str, Any]] = []
    for pid, label, start, end in (
        (1, "recorded", dag.start_s, dag.start_s + dag.duration_s),
        (2, "ideal (what-if)", start_ideal, end_ideal),
    ):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        for d in range(dag.rank_labels.shape[1]):
            for s in range(dag.rank_labels.shape[0]):
                rank = int(dag.rank_labels[s, d])
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": rank,
                        "args": {"name": f"rank {rank} (dp {d}, stage {s})"},
                    }
                )
            for v in range(dag.num_nodes):
                rank = int(dag.rank_labels[dag.stage[v], d])
                events.append(
                    {
                        "ph": "X",
                        "pid": pid,
                        "tid": rank,
                        "name": str(dag.optype[v]),
                        "ts": float(start[v, step_index, d]) * 1e6,
                        "dur": float(end[v, step_index, d] - start[v, step_index, d]) * 1e6,
                        "args": {"seq_id": int(dag.seq_id[v]), "step": int(dag.steps[step_index])},
                    }
                )
    atomic_write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
