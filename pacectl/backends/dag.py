"""The dependency model of a recorded training step, and its vectorized max-plus evaluator.

A step of a DP x PP job is a DAG of ops. Every (step, dp_rank) block has the same DAG over the ops
of all pipeline stages (the *template*), so one template serves every block and the evaluator runs
all blocks at once, vectorized over ``[num_steps, dp_size]``.

Dependency model (after Lin et al., OSDI 2025, section 4, rewritten for pacectl):

- compute stream: forward/backward compute ops of a stage run in their recorded order;
- p2p: ``forward-send k`` follows ``forward-compute k``, ``backward-send k`` follows
  ``backward-compute k``; ``forward-recv k`` precedes ``forward-compute k`` (likewise backward) and
  is posted after the compute op that ended last before it in the recorded order; each p2p type is
  its own stream; ``forward-send k`` on stage s pairs with ``forward-recv k`` on stage s+1 and
  ``backward-send k`` on s with ``backward-recv k`` on s-1;
- DP stream: ``params-all-gather`` ops run in order and the first forward compute of a model chunk
  waits for its last all-gather;
- after the last compute: ``gc -> layernorm-grads-all-reduce -> embedding-grads-all-reduce
  (first and last stage) -> grads-reduce-scatter... -> optimizer-clip-main-grad -> optimizer``;
  gradient buckets recorded while compute was still running (DDP-style overlap) are instead posted
  after the compute op that ended last before them in every recorded step; a bucket waits for the
  previous one only if every recorded step shows them one after the other (NCCL's single stream),
  not when they overlap (gloo's worker threads); what follows waits for every bucket.

Synchronisation groups: a p2p pair; ``embedding-grads-all-reduce`` of the first and last stage;
``params-all-gather`` and ``grads-reduce-scatter`` across the DP ranks of a stage (``dp_sync``);
``optimizer-clip-main-grad`` across every rank (all stages, ``dp_sync``). Other ops are local.

Timing rule (the null, max-plus model): an op starts at ``max(end of its deps) + launch_delay``
(plus the pacing delay on the paced op); a group ends at ``max(start of members) + transfer``
per member. ``launch_delay`` and ``transfer`` are estimated from the recording so that replaying
with zero pacing reproduces every recorded timestamp (see :func:`estimate_intrinsic`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pacectl.errors import TraceError
from pacectl.traces.model import COMPUTE_OPTYPES, OpTrace, text_codes

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
_EPS_S = 5e-5  # tolerance when ordering recorded timestamps (float32 rounding of seconds)


@dataclass(frozen=True)
class Level:
    """One wavefront of the DAG: groups whose deps are all in earlier levels.

    Attributes:
        nodes: ``int64[k]`` template nodes, members of one group contiguous.
        deps: ``int64[k, max_deps]`` dep nodes, padded with the sentinel node (end time 0).
        group_offsets: ``int64[g]`` start of each group within ``nodes`` (for ``np.maximum.reduceat``).
        group_sizes: ``int64[g]`` members per group.
        dp_sync: ``bool[g]`` whether the group also synchronises across DP ranks.
    """

    nodes: IntArray
    deps: IntArray
    group_offsets: IntArray
    group_sizes: IntArray
    dp_sync: NDArray[np.bool_]

    def group_max(self, values: FloatArray) -> FloatArray:
        """Max of ``values`` (``[k, ...]``, rows in ``nodes`` order) over each group, ``[g, ...]``.

        Groups of one size are a reshape and a max (singletons: ``values`` itself), else
        ``np.maximum.reduceat``; the maxima are the same either way (a max is exact).
        """
        sizes = self.group_sizes
        m = int(sizes[0])
        if (sizes == m).all():
            if m == 1:
                return values
            return values.reshape(len(sizes), m, *values.shape[1:]).max(axis=1)
        return np.maximum.reduceat(values, self.group_offsets, axis=0)

    def spread(self, per_group: FloatArray) -> FloatArray:
        """Each group's value repeated for its members, ``[k, ...]`` (inverse of :meth:`group_max`)."""
        sizes = self.group_sizes
        if (sizes == 1).all():
            return per_group
        return np.repeat(per_group, sizes, axis=0)

    def group_start(self, start: FloatArray, dp_axis: int = -1) -> FloatArray:
        """Each op's group start, ``[k, ...]``: the max of ``start`` over its group and, for a
        ``dp_sync`` group, over the DP ranks (axis ``dp_axis``). May write into ``start`` (singleton
        groups: :meth:`group_max` returns it)."""
        g = self.group_max(start)
        if self.dp_sync.any():
            g[self.dp_sync] = g[self.dp_sync].max(axis=dp_axis, keepdims=True)
        return self.spread(g)

    @classmethod
    def of(cls, nodes: IntArray, deps: IntArray, sizes: IntArray, dp_sync: NDArray[np.bool_]) -> Level:
        """A level of ``nodes`` in groups of ``sizes`` members (contiguous, in order)."""
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        return cls(nodes=nodes, deps=deps, group_offsets=offsets, group_sizes=sizes, dp_sync=dp_sync)


@dataclass(frozen=True)
class StepDag:
    """The compiled template plus the recorded times of every block.

    Attributes:
        stage: ``int64[N]`` stage of each template node.
        optype: ``object[N]`` op type of each node.
        seq_id: ``int64[N]`` sequence id of each node.
        group: ``int64[N]`` synchronisation group of each node.
        levels: wavefronts in topological order.
        deps: per node, its dep nodes.
        start_s, duration_s: ``float64[N, num_steps, dp_size]`` recorded times.
        delay_s: ``float64[N, num_steps, dp_size]`` pacing delay recorded before each op (0 if none).
        steps: ``int64[num_steps]`` step ids.
        rank_labels: ``int64[pp_size, dp_size]`` global rank of each (stage, dp_rank).
    """

    stage: IntArray
    optype: NDArray[np.object_]
    seq_id: IntArray
    group: IntArray
    group_dp_sync: NDArray[np.bool_]
    levels: tuple[Level, ...]
    deps: tuple[tuple[int, ...], ...]
    start_s: FloatArray
    duration_s: FloatArray
    delay_s: FloatArray
    steps: IntArray
    rank_labels: IntArray

    @property
    def num_nodes(self) -> int:
        """Template nodes (ops of one dp_rank across all stages in one step)."""
        return int(self.stage.shape[0])

    def find(self, optype: str, seq_id: int = 0) -> IntArray:
        """Nodes of ``optype`` with ``seq_id``, one per stage that has it, ordered by stage."""
        idx = np.flatnonzero((self.optype == optype) & (self.seq_id == seq_id))
        return idx[np.argsort(self.stage[idx], kind="stable")]


def compile_dag(trace: OpTrace) -> StepDag:
    """Build the template DAG and the recorded time arrays of a validated trace.

    Args:
        trace: a validated op trace (every step holds every rank).

    Returns:
        The compiled :class:`StepDag`.

    Raises:
        TraceError: blocks differ in structure (an op missing on some rank or step), p2p ops cannot
            be paired, or the dependency model has a cycle.
    """
    ops = trace.ops
    dp, pp = trace.meta.dp_size, trace.meta.pp_size
    steps = np.unique(ops["step"].to_numpy())
    n_blocks = len(steps) * dp
    if len(ops) % n_blocks:
        raise TraceError(_structure_msg(trace))
    n = len(ops) // n_blocks

    def blocks(column: str) -> NDArray[Any]:
        """``ops[column]`` as ``[steps, dp, N]`` (ops are sorted by step, dp_rank, stage, optype, seq_id)."""
        return ops[column].to_numpy().reshape(len(steps), dp, n)

    def times(column: str) -> FloatArray:
        """``ops[column]`` as ``float64[N, steps, dp]``."""
        return blocks(column).transpose(2, 0, 1).copy()

    coded = text_codes(ops["optype"])  # no Python string per op
    if coded is None:  # (validate_ops refuses it first; an OpTrace made by hand may not be validated)
        raise TraceError(
            f"every op must have an op type, got a missing one (in {trace.source}: column optype)"
        )
    codes, values = coded
    stage, optype, seq = blocks("stage"), codes.reshape(len(steps), dp, n), blocks("seq_id")
    if not (
        (stage == stage[:1, :1]).all() and (optype == optype[:1, :1]).all() and (seq == seq[:1, :1]).all()
    ):
        raise TraceError(_structure_msg(trace))
    t_stage, t_optype, t_seq = stage[0, 0], np.asarray(values.take(optype[0, 0]), dtype=object), seq[0, 0]
    start, duration = times("start_ts"), times("duration")
    delay = times("delay_s") if "delay_s" in ops.columns else np.zeros(start.shape)  # zero pages: untouched
    mc = blocks("mc")[0, 0]
    first_of_stage = [np.flatnonzero(t_stage == s)[0] for s in range(pp)]
    rank_labels = np.ascontiguousarray(blocks("rank")[0][:, first_of_stage].T, dtype=np.int64)  # [pp, dp]

    deps, group_members, group_dp_sync = _dependency_model(
        t_stage, t_optype, t_seq, mc, start, duration, pp, trace.source
    )
    group = np.empty(n, dtype=np.int64)
    for g, members in enumerate(group_members):
        group[members] = g
    levels = _levelize(deps, group, group_members, np.asarray(group_dp_sync), trace.source)
    return StepDag(
        stage=t_stage.astype(np.int64),
        optype=t_optype,
        seq_id=t_seq.astype(np.int64),
        group=group,
        group_dp_sync=np.asarray(group_dp_sync, dtype=bool),
        levels=levels,
        deps=tuple(tuple(d) for d in deps),
        start_s=start,
        duration_s=duration,
        delay_s=delay,
        steps=steps.astype(np.int64),
        rank_labels=rank_labels,
    )


def _structure_msg(trace: OpTrace) -> str:
    counts = trace.ops.groupby(["step", "dp_rank", "stage", "optype"]).size().unstack("optype", fill_value=0)
    ref = counts.groupby(level="stage").transform("median")
    diff = (counts != ref).any(axis=1)
    where = counts.index[diff.to_numpy()][0] if diff.any() else counts.index[0]
    return (
        "every step and DP rank must record the same ops per stage (same op types and counts), "
        f"got a different set at (step, dp_rank, stage) = {tuple(int(x) for x in where)} "
        f"(in {trace.source}). Drop incomplete steps before replay."
    )


def _dependency_model(
    stage: IntArray,
    optype: NDArray[np.object_],
    seq: IntArray,
    mc: IntArray,
    start: FloatArray,
    duration: FloatArray,
    pp: int,
    source: str,
) -> tuple[list[list[int]], list[list[int]], list[bool]]:
    """Deps per node and synchronisation groups (the module docstring's rules).

    ``start`` and ``duration`` are ``float64[N, num_steps, dp_size]``. The template block (step 0,
    DP rank 0) orders the ops, except for the overlapped gradient buckets, whose rules must hold in
    *every* block (a bucket that queued behind the previous one starts later than it was posted, and
    in the template alone would wait for compute it never waited for).
    """
    n = len(stage)
    block_start, block_end = start, start + duration
    start, end = block_start[:, 0, 0], block_end[:, 0, 0]
    deps: list[list[int]] = [[] for _ in range(n)]
    groups: list[list[int]] = []
    dp_sync: list[bool] = []
    in_group = np.zeros(n, dtype=bool)

    def nodes(s: int, t: str) -> IntArray:
        idx = np.flatnonzero((stage == s) & (optype == t))
        return idx[np.argsort(seq[idx], kind="stable")]

    def after_last(v: int, before: IntArray) -> None:
        """``v`` is posted after the op of ``before`` (compute ops) that ended last, if any."""
        if len(before):
            deps[int(v)].append(int(before[np.argmax(end[before])]))

    def chain(seq_nodes: list[int] | IntArray, first_deps: list[int] | None = None) -> None:
        prev = list(first_deps or [])
        for v in seq_nodes:
            deps[int(v)].extend(prev)
            prev = [int(v)]

    def add_group(members: list[int], sync: bool) -> None:
        groups.append(members)
        dp_sync.append(sync)
        in_group[members] = True

    for s in range(pp):
        comp = np.flatnonzero((stage == s) & np.isin(optype, COMPUTE_OPTYPES))
        comp = comp[np.lexsort((seq[comp], start[comp]))]
        chain(comp)
        for t in ("forward", "backward"):
            compute_t = nodes(s, f"{t}-compute")
            for kind in ("send", "recv"):
                p2p = nodes(s, f"{t}-{kind}")
                if len(p2p) == 0:
                    continue
                if len(p2p) != len(compute_t):
                    raise TraceError(
                        f"{t}-{kind} ops on stage {s} must match its {len(compute_t)} {t}-compute ops "
                        f"one to one, got {len(p2p)} (in {source}). Traces with p2p no-op records or "
                        "interleaved (virtual) pipelines are not supported yet."
                    )
                chain(p2p)
                for k, v in enumerate(p2p):
                    if kind == "send":
                        deps[int(v)].append(int(compute_t[k]))
                    else:
                        deps[int(compute_t[k])].append(int(v))
                        after_last(v, comp[end[comp] <= start[v] + _EPS_S])
        # DP stream: all-gathers in order; the first forward of each model chunk waits for them.
        gathers = nodes(s, "params-all-gather")
        chain(gathers)
        fwd = nodes(s, "forward-compute")
        for chunk in np.unique(mc[gathers]):
            first = fwd[mc[fwd] == chunk]
            if len(first):
                deps[int(first[0])].append(int(gathers[mc[gathers] == chunk][-1]))
        # After the last compute: gc -> layernorm -> embedding -> grads RS -> clip -> optimizer, but
        # for the overlapped buckets (the docstring's rule).
        last = [int(comp[np.argmax(end[comp])])] if len(comp) else []  # the compute op that ends last
        last_end = end[last[0]] if last else -np.inf
        last_start = start[last[0]] if last else -np.inf
        buckets = nodes(s, "grads-reduce-scatter")
        # (also one that started before the last compute op did: posted before it, however short)
        overlapped = buckets[(start[buckets] + _EPS_S < last_end) | (start[buckets] < last_start)]
        for prev, v in zip(overlapped[:-1], overlapped[1:], strict=True):
            if (block_start[v] + _EPS_S >= block_end[prev]).all():  # one after the other: a serial stream
                deps[int(v)].append(int(prev))  # (else concurrent, e.g. gloo's worker threads)
        for v in overlapped:
            after_last(v, comp[(block_end[comp] <= block_start[v] + _EPS_S).all(axis=(1, 2))])
        tail: list[int] = []
        for t in ("gc", "layernorm-grads-all-reduce", "embedding-grads-all-reduce"):
            tail.extend(int(v) for v in nodes(s, t))
        tail.extend(int(v) for v in np.setdiff1d(buckets, overlapped, assume_unique=True))
        for t in ("optimizer-clip-main-grad", "optimizer"):
            tail.extend(int(v) for v in nodes(s, t))
        last.extend(int(v) for v in overlapped)  # the clip all-reduce waits for every bucket
        chain(tail, last)
        for t in ("params-all-gather", "grads-reduce-scatter"):
            for v in nodes(s, t):
                add_group([int(v)], True)
    # p2p pairs across neighbouring stages
    for s in range(pp):
        for send, recv, peer in (
            ("forward-send", "forward-recv", s + 1),
            ("backward-send", "backward-recv", s - 1),
        ):
            sends = nodes(s, send)
            if len(sends) == 0:
                continue
            recvs = nodes(peer, recv) if 0 <= peer < pp else np.empty(0, dtype=np.int64)
            if len(recvs) != len(sends):
                raise TraceError(
                    f"each {send} on stage {s} must pair with a {recv} on stage {peer}, got "
                    f"{len(sends)} sends and {len(recvs)} receives (in {source})"
                )
            for a, b in zip(sends, recvs, strict=True):
                add_group([int(a), int(b)], False)
    emb = [int(v) for s in sorted({0, pp - 1}) for v in nodes(s, "embedding-grads-all-reduce")[:1]]
    if emb:
        add_group(emb, False)
    clip = [int(v) for s in range(pp) for v in nodes(s, "optimizer-clip-main-grad")[:1]]
    if clip:
        add_group(clip, True)
    for v in np.flatnonzero(~in_group):
        add_group([int(v)], False)
    return [sorted(set(d)) for d in deps], groups, dp_sync


def _levelize(
    deps: list[list[int]], group: IntArray, members: list[list[int]], dp_sync: NDArray[np.bool_], source: str
) -> tuple[Level, ...]:
    """Kahn's algorithm on the group-contracted DAG; one :class:`Level` per wavefront."""
    n_groups = len(members)
    preds = [sorted({int(group[d]) for v in m for d in deps[v]} - {g}) for g, m in enumerate(members)]
    succs: list[list[int]] = [[] for _ in range(n_groups)]
    indeg = np.zeros(n_groups, dtype=np.int64)
    for g, ps in enumerate(preds):
        indeg[g] = len(ps)
        for p in ps:
            succs[p].append(g)
    frontier = [g for g in range(n_groups) if indeg[g] == 0]
    sentinel = len(group)
    levels: list[Level] = []
    done = 0
    while frontier:
        nodes = [v for g in frontier for v in members[g]]
        width = max(1, max(len(deps[v]) for v in nodes))
        dep_idx = np.full((len(nodes), width), sentinel, dtype=np.int64)
        for i, v in enumerate(nodes):
            dep_idx[i, : len(deps[v])] = deps[v]
        sizes = np.array([len(members[g]) for g in frontier], dtype=np.int64)
        levels.append(Level.of(np.array(nodes, dtype=np.int64), dep_idx, sizes, dp_sync[frontier]))
        done += len(frontier)
        nxt = []
        for g in frontier:
            for h in succs[g]:
                indeg[h] -= 1
                if indeg[h] == 0:
                    nxt.append(h)
        frontier = nxt
    if done != n_groups:
        raise TraceError(
            f"the dependency model of this trace has a cycle ({n_groups - done} op groups unreachable) "
            f"(in {source}); its op order does not fit the DP x PP schedule the replay assumes"
        )
    return tuple(levels)


def evaluate(
    levels: tuple[Level, ...],
    end: FloatArray,
    start: FloatArray | None,
    launch_s: FloatArray | None,
    transfer_s: FloatArray,
    pace_s: FloatArray | None = None,
    transfer_hook: Callable[[IntArray, FloatArray, FloatArray], FloatArray] | None = None,
    *,
    dp_axis: int = -1,
) -> None:
    """Evaluate the max-plus recursion level by level, in place.

    Args:
        levels: wavefronts to evaluate (all of them, or the tail downstream of the paced ops).
        end: ``float64[N + 1, ...]`` op end times, seconds; row ``N`` is the sentinel (step start, 0).
            Rows of earlier levels must already hold their values.
        start: ``float64[N, ...]`` op start times, written for the evaluated levels; None where
            only the end times are wanted (the what-if's step times).
        launch_s: ``float64[N, ...]`` launch delay of each op (gap after its deps are done), or None
            for no launch delays (the same times as zeros: every time is >= +0.0, so adding 0 is exact).
        transfer_s: ``float64[N, ...]`` time from the group's last arrival to this op's end.
        pace_s: optional ``float64[N, ...]`` pacing delay added before each op starts.
        transfer_hook: optional timing-dependent communication model:
            ``hook(nodes, group_start_s, transfer_s) -> transfer_s`` for the ops of one level, given
            when their group starts (for example contention with cross traffic at that moment).
            Without it the recursion is max-plus: no pacing delay can make anything end earlier.
        dp_axis: the axis of the DP ranks, over which DP synchronisation reduces (default the last;
            the what-if's scenario batches put a scenario axis after it).

    Formula: ``start = max(end[deps]) + launch (+ pace)``;
    ``end = max(start over the group [and DP ranks]) + transfer``.
    """
    for lv in levels:
        s = end[lv.deps].max(axis=1)
        if launch_s is not None:
            s += launch_s[lv.nodes]
        if pace_s is not None:
            s += pace_s[lv.nodes]
        if start is not None:
            start[lv.nodes] = s
        group_start = lv.group_start(s, dp_axis)  # may write into s: it is stored already
        transfer = transfer_s[lv.nodes]
        if transfer_hook is not None:
            transfer = transfer_hook(lv.nodes, group_start, transfer)
        end[lv.nodes] = group_start + transfer


def estimate_intrinsic(dag: StepDag) -> tuple[FloatArray, FloatArray, dict[str, int]]:
    """Estimate launch delays and intrinsic transfer times from the recorded times.

    Estimator (per op, per step and DP rank, from the recording alone):

    - ``launch = recorded_start - recorded pacing delay - max(recorded end of deps)``, clipped at 0
      (for ops with no deps the offset from the step start); a paced live recording thus replays
      as its unpaced counterfactual under no pacing;
    - ``transfer = recorded_end - max(recorded start over the op's sync group [and DP ranks])``,
      clipped at 0. For a local op this is its duration; for a collective it is the recorded duration
      minus the time the op spent waiting for the last member to arrive.

    With zero pacing the replay then reproduces every recorded timestamp, except where a clip was
    needed (a recorded op that started before a modelled dependency ended, or a collective that ended
    before its last member started: clock skew or a dependency the model gets wrong).

    Returns:
        ``(launch_s, transfer_s, counts)``, both ``float64[N, num_steps, dp_size]``; ``counts`` gives
        ``launch_clipped`` and ``transfer_clipped`` (number of clipped values).
    """
    n = dag.num_nodes
    end = np.empty((n + 1, *dag.start_s.shape[1:]))  # the recorded end times and the sentinel row, 0
    rec_end = np.add(dag.start_s, dag.duration_s, out=end[:n])
    end[n] = 0.0
    launch = np.empty_like(dag.start_s)
    transfer = np.empty_like(dag.start_s)
    for lv in dag.levels:
        ready = end[lv.deps].max(axis=1)
        launch[lv.nodes] = dag.start_s[lv.nodes] - dag.delay_s[lv.nodes] - ready
        # (fancy indexing gives a fresh array: group_start may write into it)
        transfer[lv.nodes] = rec_end[lv.nodes] - lv.group_start(dag.start_s[lv.nodes])
    counts = {
        "launch_clipped": int((launch < -_EPS_S).sum()),
        "transfer_clipped": int((transfer < -_EPS_S).sum()),
        "num_op_instances": int(n * dag.start_s.shape[1] * dag.start_s.shape[2]),
    }
    return np.maximum(launch, 0.0, out=launch), np.maximum(transfer, 0.0, out=transfer), counts
