"""From per-rank collective logs without step markers to a canonical :class:`OpTrace`.

Shared by the Flight Recorder (:mod:`pacectl.traces.flight_recorder`) and NCCL Inspector
(:mod:`pacectl.traces.nccl_inspector`) importers, whose sources record each rank's collectives
(group, sequence number, kind, size, times) but no step boundaries and no compute.

**Layout.** The data-parallel (DP) groups are the process groups whose description (or name) names
data parallelism (``DATA_PARALLEL_GROUP*`` in Megatron-LM, ``mesh_dp*`` for a torchtitan
``DeviceMesh`` dimension ``dp``/``dp_shard``/``dp_replicate``, ``DP Group 0``, ...) and that carry
gradient collectives (all-reduce, reduce-scatter); when none does, the groups with the most
gradient collectives (the world group of a pure DP job). Tensor-parallel peers (groups naming
``TENSOR_MODEL_PARALLEL`` / ``tp``) fold into their lowest rank, as the ByteDance traces do; the
pipeline stage of a DP group is the position of its ranks in their pipeline group
(``PIPELINE_MODEL_PARALLEL_GROUP`` / ``pp``), else the order of the DP groups. A group is identified
by its name plus its rank set (names are reused after ``split_group``). :class:`LayoutOverrides`
give the layout when it cannot be inferred.

**Matching and steps.** Collectives are matched across the ranks of a group by sequence number.
Steps are inferred from the DP gradient collectives' pattern (there are no step markers): the
shortest period of their (kind, size) sequence, with the step boundary placed before the
collective that follows the longest host-side gap (the forward pass and optimizer step happen
there). Entries before the repeating pattern (set-up broadcasts, DDP's first iteration before it
rebuilds its buckets) and an incomplete last period are dropped, with a warning. Other collectives
(all-gathers of FSDP parameters, broadcasts, barriers) and point-to-point ops fold into compute:
the op table has no pipeline send/recv (``forward-send`` ...), so with several stages each
stage's DP group replays on its own within a step, without stage-to-stage dependencies (the
step lasts as long as its slowest stage). The Flight Recorder importer reports its matched p2p
ops (:func:`pacectl.traces.flight_recorder.match_p2p`), never feeding them to this assembly.

**Compute is the gap between a rank's collectives.** Per step and rank: ``forward-compute`` runs
from the step start (the end of the previous step's last gradient collective: the first inferred
step is only the anchor and is not replayed) to the first gradient collective;
``backward-compute k`` from gradient collective ``k - 1``'s arrival to ``k``'s; each
``grads-reduce-scatter k`` from its arrival (serialised after the previous one,
:func:`serialise_buckets`) to its common end; ``optimizer`` is empty (it lies inside the
next step's first segment).

**Timing.** Two estimates; every output names the one used (:attr:`AssemblyReport.timing`):

- ``duration`` (clock-free): every matched gradient collective carries its duration (Flight
  Recorder ``duration_ms`` with ``TORCH_NCCL_ENABLE_TIMING``, device events; NCCL Inspector
  ``coll_exec_time_us``). All ranks leave a collective together, so rank i's earliness is its
  duration minus the shortest in the collective: the quantity the live pacer measures. Arrival =
  common end - duration; the common end is placed at the median over ranks of enqueue + duration.
- ``created``: host enqueue times (``time_created_ns``, NCCL Inspector ``coll_start_ts``), assumed
  to share one clock (one host, or synchronised clocks). Where durations are present too, each
  rank's clock offset is estimated from the collectives' common completion (enqueue + duration)
  and removed when it exceeds 1 ms and twice the residual (:func:`clock_offsets`).
  The dumps record no end time then, so a collective's transfer is modelled:
  ``collective_s``, or ``collective_frac`` of the median step period (the step-level importer's
  rule); arrival spreads are unaffected by it.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pacectl.errors import TraceError
from pacectl.traces.model import (
    MAX_DURATION_S,
    OPTYPES,
    JobMeta,
    OpTrace,
    TraceWarning,
    quantile_stats,
    validate_ops,
)

#: Collective kinds that reduce gradients: the sync points of data parallelism.
GRAD_KINDS = ("all_reduce", "reduce_scatter")
TIMINGS = ("auto", "duration", "created")
_AUTO_ALIGN_S = 1e-3
_MAX_PERIOD = 1024
#: a step boundary's gaps must be this many times the other gaps (lower quartile over median)
_CLEAR_GAP = 1.5
_KIND_PATTERNS = (
    ("reduce_scatter", re.compile(r"reduce_?scatter|reducescatter", re.I)),
    ("all_reduce", re.compile(r"all_?reduce", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    ("all_to_all", re.compile(r"all_?to_?all", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
    ("send", re.compile(r"^send", re.I)),
    ("recv", re.compile(r"^recv", re.I)),
    ("coalesced", re.compile(r"coalesced", re.I)),
    ("reduce", re.compile(r"^_?reduce", re.I)),
    ("gather", re.compile(r"^_?gather", re.I)),
    ("scatter", re.compile(r"^_?scatter", re.I)),
)
_ROLE_PATTERNS = (
    ("ep", re.compile(r"expert|(^|[^a-z])ep($|[^a-z])")),
    ("other", re.compile(r"tensor_and|_and_data|_and_context")),
    ("pp", re.compile(r"pipe|(^|[^a-z])pp($|[^a-z])")),
    ("tp", re.compile(r"tensor|(^|[^a-z])tp($|[^a-z])")),
    ("dp", re.compile(r"data|(^|[^a-z])(dp|fsdp|hsdp)($|[^a-z])|dp_|_dp|shard|replicate")),
    ("cp", re.compile(r"context|(^|[^a-z])cp($|[^a-z])")),
    ("world", re.compile(r"^(default_pg|world)$")),
)


@functools.lru_cache(maxsize=4096)
def kind_of(op: str) -> str:
    """The collective kind of an op name (``all_reduce``, ``_reduce_scatter_base``, ``AllReduce``,
    ``send 0->1``, ...): one of ``reduce_scatter``, ``all_reduce``, ``all_gather``, ...; else the
    lower-cased name."""
    head = op.split(" ")[0]
    for kind, pattern in _KIND_PATTERNS:
        if pattern.search(head):
            return kind
    return head.lower() or "unknown"


def role_of(name: str, desc: str) -> str:
    """The parallelism a process group serves, from its description (else its name): ``dp``,
    ``tp``, ``pp``, ``cp``, ``ep``, ``world`` or ``other`` (see the module docstring)."""
    for text in (desc, name):
        low = text.lower()
        if not low or low == "undefined":
            continue
        for role, pattern in _ROLE_PATTERNS:
            if pattern.search(low):
                return role
    return "other"


@dataclass(frozen=True)
class Group:
    """One process group (or NCCL communicator), identified by name plus rank set.

    Attributes:
        key: index in the set's group list.
        name: the group's name (torch's ``group_name``; an Inspector communicator's ``id``).
        desc: its description (torch's ``group_desc``; an Inspector ``comm_name``).
        ranks: its global ranks, sorted.
        ranks_from: ``"pg_config"`` (declared by the dump) or ``"dumps"`` (the ranks whose dumps
            hold its entries).
    """

    key: int
    name: str
    desc: str
    ranks: tuple[int, ...]
    ranks_from: str = "pg_config"

    @property
    def role(self) -> str:
        """See :func:`role_of`."""
        return role_of(self.name, self.desc)

    @property
    def label(self) -> str:
        """``'3' (mesh_dp)`` as messages name a group."""
        return f"{self.name!r} ({self.desc})" if self.desc else repr(self.name)

    def summary(self) -> dict[str, Any]:
        """Plain values for JSON outputs."""
        return {
            "name": self.name,
            "desc": self.desc,
            "ranks": list(self.ranks),
            "role": self.role,
            "ranks_from": self.ranks_from,
        }


@dataclass(frozen=True)
class LayoutOverrides:
    """A layout given by the user (``trace.dp_size`` etc.) where the dumps do not tell it.

    With any of the sizes set, rank ``r = (pp * dp_size + dp) * tp_size + tp`` (TP fastest, then
    DP, then PP: Megatron-LM's default order and torchtitan's mesh ``("pp", "dp", "tp")``); the
    sizes not given follow from the world size. ``dp_group`` names the DP groups by description or
    name instead.
    """

    dp_size: int | None = None
    tp_size: int | None = None
    pp_size: int | None = None
    dp_group: str | None = None
    collectives_per_step: int | None = None

    def __post_init__(self) -> None:
        for key in ("dp_size", "tp_size", "pp_size", "collectives_per_step"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise TraceError(f"trace.{key} must be an integer >= 1 or null, got {value!r}")

    @classmethod
    def of(cls, source: Any) -> LayoutOverrides:
        """The overrides in ``source``'s attributes of these names (a trace config, parsed arguments)."""
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls)})

    @property
    def sizes_given(self) -> bool:
        return any(v is not None for v in (self.dp_size, self.tp_size, self.pp_size))


@dataclass(frozen=True)
class CollectiveSet:
    """Every rank's recorded collectives (no point-to-point ops), one row each.

    Attributes:
        table: columns ``rank``, ``group`` (a :attr:`Group.key`), ``kind`` (:func:`kind_of`),
            ``backend``, ``seq`` (sequence number within the group), ``numel`` (elements, or
            bytes for the Inspector), ``created_ns`` (host enqueue time, int64 ns; -1: none),
            ``duration_s`` (NaN: none), ``end_ns`` (-1: none), ``finished`` (bool).
        ranks: the ranks that contributed a log.
    """

    table: pd.DataFrame
    ranks: tuple[int, ...]


@dataclass
class Layout:
    """The inferred layout: one DP group per (folded) pipeline stage.

    Attributes:
        dp_groups: the DP group of each stage, in stage order.
        dp_size, pp_size, tp_size: the degrees.
        world_size: ranks in the job.
        how: how it was found, in words.
    """

    dp_groups: list[Group]
    dp_size: int
    pp_size: int
    tp_size: int
    world_size: int
    how: str


@dataclass
class AssemblyReport:
    """How a collective log became a trace.

    Times are seconds. ``timing`` is ``"duration"`` or ``"created"`` (module docstring), with
    ``timing_note`` saying what was measured and ``transfer_note`` how collective ends were found.
    """

    layout: Layout
    timing: str
    timing_note: str
    transfer_note: str
    collectives_per_step: list[int]
    steps: int
    dropped: list[str]
    folded_per_step: dict[str, float]
    clock_offsets_s: dict[int, float]
    spread_first_s: NDArray[np.float64] = field(repr=False)
    step_time_s: NDArray[np.float64] = field(repr=False)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Plain values for JSON outputs."""
        lay = self.layout
        return {
            "layout": {
                "dp_size": lay.dp_size,
                "pp_size": lay.pp_size,
                "tp_size": lay.tp_size,
                "world_size": lay.world_size,
                "dp_groups": [g.summary() for g in lay.dp_groups],
                "how": lay.how,
            },
            "timing": self.timing,
            "timing_note": self.timing_note,
            "transfer_note": self.transfer_note,
            "collectives_per_step": self.collectives_per_step,
            "steps": self.steps,
            "dropped": self.dropped,
            "folded_per_step": self.folded_per_step,
            "clock_offsets_s": {str(k): v for k, v in self.clock_offsets_s.items()},
            "arrival_spread_first_s": quantile_stats(self.spread_first_s),
            "step_time_s": quantile_stats(self.step_time_s),
            "warnings": self.warnings,
        }


# ------------------------------------------------------------------------------------------ layout
def infer_layout(
    coll: CollectiveSet,
    groups: list[Group],
    overrides: LayoutOverrides,
    grad_kinds: tuple[str, ...],
    source: str,
) -> Layout:
    """The DP groups, stages and degrees of the job (see the module docstring).

    Raises:
        TraceError: no group carries gradient collectives; the chosen DP groups overlap or differ
            in size; an override does not match the recorded groups.
    """
    t = coll.table
    counts = t[t["kind"].isin(grad_kinds) & t["finished"]].groupby("group").size()  # finished gradient ones
    world = max(coll.ranks) + 1
    carrying = [g for g in groups if counts.get(g.key, 0) > 0]
    if not carrying:
        kinds = sorted(t["kind"].astype(str).unique())
        raise TraceError(
            f"a trace must hold gradient collectives ({', '.join(grad_kinds)}) that finished on their "
            f"ranks, got none: only {kinds} (in {source}). Dump after a few training steps."
        )
    tp_groups = [g for g in groups if g.role == "tp" and len(g.ranks) > 1]
    pp_groups = [g for g in groups if g.role == "pp" and len(g.ranks) > 1]
    if overrides.sizes_given:
        return _layout_from_sizes(groups, counts, overrides, world, source)
    if overrides.dp_group is not None:
        chosen = [g for g in carrying if overrides.dp_group in (g.desc, g.name)]
        if not chosen:
            names = sorted({g.desc or g.name for g in carrying})
            raise TraceError(
                f"trace.dp_group must name a group (description or name) that carries gradient "
                f"collectives, got {overrides.dp_group!r}; those are {names} (in {source})"
            )
        how = f"DP groups named {overrides.dp_group!r} (trace.dp_group)"
    else:
        dp = [g for g in carrying if g.role == "dp"]
        pool = dp or [g for g in carrying if g.role not in ("tp", "pp", "ep")] or carrying
        by_desc: dict[str, int] = {}
        for g in pool:
            by_desc[g.desc or g.name] = by_desc.get(g.desc or g.name, 0) + int(counts[g.key])
        best = max(by_desc, key=lambda d: (by_desc[d], -len(d)))
        chosen = [g for g in pool if (g.desc or g.name) == best]
        why = "its description names data parallelism" if dp else "it carries the most gradient collectives"
        how = f"DP groups: process groups described {best!r} ({why})"
    # fold TP peers into their lowest rank
    rep: dict[int, int] = {}
    for g in tp_groups:
        for r in g.ranks:
            rep[r] = min(rep.get(r, r), g.ranks[0])
    tp_size = max((len(g.ranks) for g in tp_groups), default=1)
    kept = [g for g in chosen if all(rep.get(r, r) == r for r in g.ranks)]
    if tp_groups and len(kept) < len(chosen):
        how += f"; tensor-parallel peers (groups of {tp_size}) folded into their lowest rank"
    if not kept:
        raise TraceError(f"the DP groups {[g.label for g in chosen]} hold no TP representative (in {source})")
    seen: set[int] = set()
    for g in kept:
        if seen & set(g.ranks):
            raise TraceError(
                f"DP groups must not share ranks, got {[g.label for g in kept if set(g.ranks) & seen][:2]} "
                f"sharing {sorted(seen & set(g.ranks))[:8]} (in {source}); name them with trace.dp_group "
                "or give the layout (trace.dp_size, trace.tp_size, trace.pp_size)"
            )
        seen |= set(g.ranks)
    sizes = sorted({len(g.ranks) for g in kept})
    if len(sizes) > 1:
        raise TraceError(
            f"every DP group must have the same size, got sizes {sizes} for {[g.label for g in kept][:4]} "
            f"(in {source}); give the layout with trace.dp_size / trace.tp_size / trace.pp_size"
        )
    stage_of = _stages(kept, pp_groups)
    if stage_of is not None:
        kept = [g for _, g in sorted(zip(stage_of, kept, strict=True), key=lambda x: (x[0], x[1].ranks))]
        how += "; stages from the pipeline groups"
    else:
        kept = sorted(kept, key=lambda g: g.ranks)
        if len(kept) > 1:
            how += "; no pipeline group recorded: each DP group is a stage of its own, in rank order"
    return Layout(kept, sizes[0], len(kept), tp_size, world, how)


def _stages(dp_groups: list[Group], pp_groups: list[Group]) -> list[int] | None:
    """Each DP group's stage: the position of its ranks in their pipeline group (None: unknown)."""
    pos = {r: i for g in pp_groups for i, r in enumerate(g.ranks)}
    out = []
    for g in dp_groups:
        stages = {pos.get(r) for r in g.ranks}
        if len(stages) != 1 or None in stages:
            return None
        out.append(int(next(iter(stages))))  # type: ignore[arg-type]
    return out if len(set(out)) == len(out) else None


def _layout_from_sizes(
    groups: list[Group], counts: pd.Series, o: LayoutOverrides, world: int, source: str
) -> Layout:
    tp = o.tp_size or 1  # the sizes not given follow from the world size
    dp = o.dp_size or world // (tp * (o.pp_size or 1))
    pp = o.pp_size or world // (tp * dp)
    if dp * tp * pp != world:
        raise TraceError(
            f"trace.dp_size x tp_size x pp_size must equal the world size {world}, got {dp} x {tp} x {pp}"
        )
    out = []
    for s in range(pp):
        ranks = tuple((s * dp + d) * tp for d in range(dp))
        cands = [g for g in groups if g.ranks == ranks and counts.get(g.key, 0) > 0]
        if not cands:
            raise TraceError(
                f"the layout dp {dp} x tp {tp} x pp {pp} puts stage {s}'s DP ranks at {list(ranks)[:8]}, but no "
                f"recorded group with those ranks carries gradient collectives (in {source}); check trace.dp_size, "
                "trace.tp_size and trace.pp_size (rank order: TP fastest, then DP, then PP)"
            )
        out.append(max(cands, key=lambda g: int(counts[g.key])))
    how = f"given: dp {dp} x tp {tp} x pp {pp} (trace.*_size; TP fastest, then DP, then PP)"
    return Layout(out, dp, pp, tp, world, how)


# ------------------------------------------------------------------------------------------- steps
@dataclass
class _GroupSteps:
    """One DP group's matched gradient collectives, cut into steps."""

    group: Group
    seqs: NDArray[np.int64]  # [S, K] sequence numbers of each step's gradient collectives
    anchors: NDArray[np.int64]  # [S] the group's collective just before each step (its end starts it)
    dropped: list[str]


def _period(sig: NDArray[np.int64]) -> tuple[int, int, int]:
    """``(period, start, length)``: the shortest period of the longest repeating run in ``sig``."""
    m = len(sig)
    best: list[tuple[int, int, int]] = []
    for p in range(1, min(m // 2, _MAX_PERIOD) + 1):
        eq = sig[:-p] == sig[p:]
        if not eq.any():
            continue
        padded = np.concatenate([[False], eq, [False]])
        edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
        starts, ends = edges[::2], edges[1::2]
        i = int(np.argmax(ends - starts))
        if ends[i] - starts[i] >= p:  # at least two whole repetitions
            best.append((p, int(starts[i]), int(ends[i] - starts[i]) + p))
    if not best:
        return m, 0, m
    longest = max(b[2] for b in best)
    for p, start, length in best:  # smallest period whose run covers nearly the longest one
        if length >= 0.9 * longest:
            return p, start, length
    return m, 0, m


def _gap_score(gaps: NDArray[np.float64], bounds: NDArray[np.int64], region: NDArray[np.int64]) -> float:
    """How clearly the gaps before ``bounds`` exceed the other gaps of ``region``: the lower quartile
    of the boundary gaps over the median of the others (host time; higher is clearer)."""
    inside = np.setdiff1d(region, bounds)
    if not len(bounds) or not len(inside):
        return -np.inf
    other = float(np.median(gaps[inside]))
    return float(np.quantile(gaps[bounds], 0.25)) / max(other, 1e-9)


def _steps_of_group(
    coll: CollectiveSet,
    g: Group,
    grad_kinds: tuple[str, ...],
    fixed_k: int | None,
    source: str,
    sync_kinds: tuple[str, ...] = (),
) -> _GroupSteps:
    """Match the group's collectives across its ranks and cut them into steps (module docstring).

    The step period is the shortest period of the (kind, size) sequence of every collective of the
    group (with ``fixed_k``, its shortest multiple with that many gradient collectives). A step ends
    with the pattern's longest run of gradient collectives (the end of the backward pass: FSDP2's last
    reduce-scatters follow its last all-gather) and, among such boundaries (DDP: every collective is
    one), before the longest host-side gap. The step's collectives are its gradient ones and those of
    ``sync_kinds``.
    """
    t = coll.table
    mine = t[t["group"] == g.key]
    present = set(coll.ranks)
    members = [r for r in g.ranks if r in present]
    dropped: list[str] = []
    unfinished = mine.loc[~mine["finished"], "seq"]
    if len(unfinished):
        first_open = int(unfinished.min())
        n_open = int((mine["seq"].drop_duplicates() >= first_open).sum())
        dropped.append(
            f"group {g.label}: {n_open} collective(s) from #{first_open} on had not finished on every rank"
        )
        mine = mine[mine["seq"] < first_open]
    per = mine.groupby("seq")["rank"].nunique()
    common = np.sort(per.index[per.to_numpy() == len(members)].to_numpy())
    lost = len(per) - len(common)
    if lost:
        dropped.append(
            f"group {g.label}: {lost} collective(s) not in every rank's dump (ring buffer wrapped)"
        )
    sub = mine[mine["seq"].isin(common)]
    sig = sub.groupby("seq")[["kind", "numel"]].nunique()
    bad = sig[(sig["kind"] > 1) | (sig["numel"] > 1)]
    if len(bad):
        s = int(bad.index[0])
        rows = sub[sub["seq"] == s][["rank", "kind", "numel"]].astype(str).to_dict("records")
        raise TraceError(
            f"a collective must be the same op on every rank of its group, got {rows[:4]} for group {g.label} "
            f"collective #{s} (in {source}): the ranks issued different collectives (a desync; "
            "torch.distributed.flight_recorder's fr_trace analyses it)"
        )
    first = sub.drop_duplicates("seq").set_index("seq").reindex(common)
    is_grad = first["kind"].astype(str).isin(grad_kinds).to_numpy()
    is_step = is_grad | first["kind"].astype(str).isin(sync_kinds).to_numpy()
    if not is_grad.any():
        raise TraceError(
            f"the DP group {g.label} must share at least one finished gradient collective across its ranks "
            f"{list(g.ranks)[:8]}, got none (in {source}); are these dumps of one job, taken at one time?"
        )
    codes = pd.factorize(first["kind"].astype(str) + ":" + first["numel"].astype(str))[0].astype(np.int64)
    created = (
        sub.pivot_table(index="seq", columns="rank", values="created_ns", aggfunc="first")
        .reindex(index=common, columns=members)
        .to_numpy(dtype=np.float64)
    )
    m = len(common)
    p0, start, length = _period(codes)
    gaps = np.full(m, np.nan)
    timed = bool((created >= 0).all()) and m > 1
    if timed:
        gaps[1:] = np.median(np.diff(created, axis=0), axis=1)
    region = np.arange(max(start, 1), start + length)
    period = p0
    if fixed_k is not None:  # the shortest multiple of the pattern with that many gradient collectives
        periods = [
            p
            for p in range(p0, max(p0, min(length // 2, _MAX_PERIOD)) + 1, p0)
            if int(is_grad[start : start + p].sum()) == fixed_k
        ]
        if not periods:
            raise TraceError(
                f"trace.collectives_per_step={fixed_k} must be a multiple of the gradient collectives in the "
                f"repeating pattern of DP group {g.label} ({int(is_grad[start : start + p0].sum())} per "
                f"{p0} collectives), got none that fits (in {source})"
            )
        period = periods[0]
    scores = []  # (phase, score): a step ends with a gradient collective
    for phase in range(period):
        begin = start + phase
        if begin + period > m or not is_grad[begin + period - 1]:
            continue
        num = (start + length - begin) // period
        bounds = np.arange(begin, begin + num * period, period)
        scores.append((phase, _gap_score(gaps, bounds[bounds >= 1], region) if timed else 0.0))
    if not scores:
        raise TraceError(
            f"the collectives of DP group {g.label} must repeat step after step, got no whole step in "
            f"{m} matched collectives (in {source}); give trace.collectives_per_step (gradient collectives per step)"
        )
    pattern = is_grad[start : start + period]

    def run_before(phase: int) -> int:
        n = 0
        while n < period and pattern[(phase - 1 - n) % period]:
            n += 1
        return n

    longest = max(run_before(ph) for ph, _ in scores)
    scores = [(ph, sc) for ph, sc in scores if run_before(ph) == longest]
    phase, best = max(scores, key=lambda x: (x[1], -x[0]))
    if len(scores) > 1 and timed and not best >= _CLEAR_GAP:
        dropped.append(
            f"group {g.label}: no host-side gap marks the step boundary clearly (gaps before it "
            f"{best:.1f} x the others); the boundary may fall inside a step"
        )
    # every occurrence of the step's pattern is a step, wherever it falls (a collective outside the
    # pattern, such as set-up, DDP's first iteration or a marker between blocks, only separates them)
    pattern = codes[start + phase : start + phase + period]
    starts: list[int] = []
    i = 0
    while i + period <= m:
        if codes[i] == pattern[0] and np.array_equal(codes[i : i + period], pattern):
            starts.append(i)
            i += period
        else:
            i += 1
    covered = len(starts) * period
    if m - covered:
        dropped.append(
            f"group {g.label}: {m - covered} collective(s) outside the repeating step pattern "
            "(set-up, a first iteration that differs, steps cut by the dump's start or end)"
        )
    if starts and starts[0] == 0:
        starts = starts[1:]  # no collective before it: its start is not recorded
        dropped.append(f"group {g.label}: the first step (nothing before it gives its start)")
    if not starts:
        raise TraceError(
            f"the DP group {g.label} must record at least one whole step after another collective (whose end "
            f"starts it), got none in {m} matched collectives (in {source}). Dump later (more steps), raise "
            "TORCH_FR_BUFFER_SIZE, or give trace.collectives_per_step"
        )
    idx = np.asarray(starts)[:, None] + np.arange(period)[None, :]
    grads = idx[:, is_step[start + phase : start + phase + period]]
    return _GroupSteps(g, common[grads], common[np.asarray(starts) - 1], dropped)


# -------------------------------------------------------------------------------------- op table
def _stage_times(
    coll: CollectiveSet, gs: _GroupSteps, members: list[int]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """created (ns, float), duration (s) and end (ns) arrays ``[S, n, 1 + K]`` of a stage's steps:
    index 0 is each step's anchor (the collective before it), 1.. its gradient collectives."""
    t = coll.table
    seqs = np.concatenate([gs.anchors[:, None], gs.seqs], axis=1)
    sub = t[(t["group"] == gs.group.key) & t["seq"].isin(seqs.ravel())]
    S, K1 = seqs.shape
    out = []
    for col in ("created_ns", "duration_s", "end_ns"):
        m = sub.pivot_table(index="seq", columns="rank", values=col, aggfunc="first").reindex(
            index=seqs.ravel(), columns=members
        )
        arr = m.to_numpy(dtype=np.float64).reshape(S, K1, len(members)).transpose(0, 2, 1)
        if col != "duration_s":
            arr = np.where(arr < 0, np.nan, arr)
        out.append(arr)
    return out[0], out[1], out[2]


def clock_offsets(
    done: NDArray[np.float64], min_offset: float, *, force: bool = False
) -> NDArray[np.float64]:
    """Each rank's clock offset against the first rank, where it is worth removing.

    All ranks leave a collective together, so the median difference of their completion times to
    the first rank's estimates each offset; it is removed only when it exceeds both ``min_offset``
    and twice the median residual left after removing it (ranks on one host share a clock, and
    there the small estimates are exit skew, not clock offsets).

    Args:
        done: ``[S, n, K]`` each collective's completion (its end, or enqueue + duration; NaN: none).
        min_offset: the smallest offset worth removing, in the unit of ``done``.
        force: return the estimates whatever their size.

    Returns:
        ``[n]`` the offsets in the unit of ``done`` (zeros: not worth removing, or one rank).
    """
    n = done.shape[1]
    if n < 2 or not np.isfinite(done).any():
        return np.zeros(n)
    diff = (done - done[:, :1, :]).transpose(1, 0, 2).reshape(n, -1)
    est = np.nanmedian(diff, axis=1)
    est = np.where(np.isfinite(est), est, 0.0)
    after = done - est[None, :, None]
    resid = float(np.nanmedian(np.nanmax(after, axis=1) - np.nanmin(after, axis=1)))
    return est if force or float(np.max(np.abs(est))) > max(min_offset, 2.0 * resid) else np.zeros(n)


def check_transfer(collective_s: float | None, collective_frac: float) -> None:
    """Refuse a modelled transfer time (``trace.collective_s``, s) outside [0, MAX_DURATION_S] and a
    ``trace.collective_frac`` outside [0, 1] (the Python API takes any number)."""
    if collective_s is not None and not (np.isfinite(collective_s) and 0 <= collective_s <= MAX_DURATION_S):
        raise TraceError(
            f"collective_s (trace.collective_s) must be in [0, {MAX_DURATION_S:.0f}] s or null, got {collective_s!r}"
        )
    if not (0.0 <= collective_frac <= 1.0):
        raise TraceError(
            f"collective_frac (trace.collective_frac) must be in [0, 1], got {collective_frac!r}"
        )


def assemble(
    coll: CollectiveSet,
    groups: list[Group],
    *,
    source: str,
    fmt: str,
    name: str,
    layout: LayoutOverrides | None = None,
    timing: str = "auto",
    collective_s: float | None = None,
    collective_frac: float = 0.01,
    sync_kinds: tuple[str, ...] = (),
    warning: type[Warning] = TraceWarning,
    duration_field: str = "duration_ms",
    max_ops: int | None = None,
) -> tuple[OpTrace, AssemblyReport]:
    """Build the canonical trace of a collective log (see the module docstring).

    Args:
        coll: the collectives of every rank.
        groups: their process groups.
        source: where they came from (messages, ``OpTrace.source``).
        fmt: the importer's name (``OpTrace.fmt``).
        name: job name.
        layout: overrides of the inferred layout.
        timing: one of :data:`TIMINGS`.
        collective_s: modelled transfer time when no duration is recorded, s (None: the fraction).
        collective_frac: modelled transfer as a fraction of the median step period, in [0, 1].
        sync_kinds: other kinds that, on the DP groups, are step collectives like the gradient ones
            (:data:`GRAD_KINDS`; FSDP's parameter all-gathers, where the early ranks wait for a
            straggler before forward); the layout is still inferred from the gradient ones alone.
        warning: the warning class for what was dropped.
        duration_field: the source's name for a collective's duration (for the timing note).
        max_ops: cap on the trace's ops (``trace.max_ops``), checked before the op table is built
            (None: no cap).

    Returns:
        ``(trace, report)``.

    Raises:
        TraceError: bad settings; no DP group, or fewer than two steps, can be found; ``timing``
            ``"duration"`` but some gradient collective has no duration; the trace would hold more
            than ``max_ops`` ops.
    """
    if timing not in TIMINGS:
        raise TraceError(f"trace.timing must be one of {list(TIMINGS)}, got {timing!r}")
    check_transfer(collective_s, collective_frac)
    overrides = layout or LayoutOverrides()
    lay = infer_layout(coll, groups, overrides, GRAD_KINDS, source)
    steps = [
        _steps_of_group(coll, g, GRAD_KINDS, overrides.collectives_per_step, source, sync_kinds)
        for g in lay.dp_groups
    ]
    grad_kinds = GRAD_KINDS + tuple(k for k in sync_kinds if k not in GRAD_KINDS)  # the steps' collectives
    num = min(len(s.seqs) for s in steps)
    dropped = [d for s in steps for d in s.dropped]
    if any(len(s.seqs) > num for s in steps):
        dropped.append(
            f"stages aligned on their last {num} steps (their dumps hold different numbers of steps)"
        )
    for s in steps:
        s.seqs, s.anchors = s.seqs[-num:], s.anchors[-num:]
    members = [list(g.ranks) for g in lay.dp_groups]
    arrays = [_stage_times(coll, s, m) for s, m in zip(steps, members, strict=True)]
    # per step and rank: forward, optimizer, and a compute gap and a collective per gradient collective
    num_ops = sum(S * n * (2 + 2 * (K1 - 1)) for S, n, K1 in (c.shape for c, _, _ in arrays))
    if max_ops is not None and num_ops > max_ops:
        raise TraceError(
            f"a trace must hold <= {max_ops} ops (trace.max_ops), got {num_ops} ({num} steps x "
            f"{sum(len(m) for m in members)} DP ranks x ops per step) (in {source}); the op table takes about "
            "0.4 kB per op. Raise the cap (trace.max_ops / --max-ops) if the machine has the memory, or "
            "import fewer ranks or steps"
        )
    have_dur = all(np.isfinite(d[..., 1:]).all() for _, d, _ in arrays)
    have_created = all(np.isfinite(c).all() for c, _, _ in arrays)
    have_end = all(np.isfinite(e).all() for _, _, e in arrays)
    if timing == "duration" and not have_dur:
        raise TraceError(
            f"trace.timing=duration needs every gradient collective's duration, got some without (in {source}); "
            "record with TORCH_NCCL_ENABLE_TIMING=1, or use trace.timing=auto"
        )
    if timing == "created" and not have_created:
        raise TraceError(
            f"trace.timing=created needs enqueue times on every collective, got some without (in {source})"
        )
    mode = "duration" if (timing == "duration" or (timing == "auto" and have_dur)) else "created"
    if mode == "created" and not have_created:  # timing auto: neither durations nor enqueue times
        raise TraceError(
            f"a trace needs enqueue times or durations of its collectives, got neither (in {source})"
        )
    base_ns = min(float(np.nanmin(c)) for c, _, _ in arrays) if have_created else 0.0
    offsets_all: dict[int, float] = {}
    periods: list[float] = []
    per_stage = []
    for (created_ns, dur, end_ns), mem in zip(arrays, members, strict=True):
        created = (created_ns - base_ns) * 1e-9 if have_created else np.zeros_like(dur)
        offsets = np.zeros(len(mem))
        if have_created and np.isfinite(dur).any():
            offsets = clock_offsets(created + dur, _AUTO_ALIGN_S)
        offsets_all.update({r: float(o) for r, o in zip(mem, offsets, strict=True)})
        created = created - offsets[None, :, None]
        end_s = (end_ns - base_ns) * 1e-9 - offsets[None, :, None]
        per_stage.append((created, dur, end_s))
        if mode == "created":
            periods.extend(np.diff(created[:, :, 1].mean(axis=1)).tolist())
    if mode == "created":
        median_period = float(np.median(periods)) if periods else 0.0
        transfer = float(collective_s) if collective_s is not None else collective_frac * median_period
        timing_note = "arrival = host enqueue time (time_created_ns), the ranks' clocks assumed to agree"
        if any(offsets_all.values()):
            timing_note += "; clock offsets removed on the collectives' common completion"
        fixed = collective_s is not None
        basis = "trace.collective_s" if fixed else f"{collective_frac:g} of the median step period"
        transfer_note = (
            f"modelled: the dumps record no collective's end; each ends {transfer * 1e3:.3f} ms after its last "
            f"arrival ({basis})"
        )
    else:
        transfer = 0.0
        timing_note = (
            f"clock-free: earliness = duration - shortest duration in the collective ({duration_field}, device "
            "timing); arrival = common end - duration"
        )
        transfer_note = "recorded: each collective's shortest duration (its last arriver waited for no one)"
    per_stage_ops = []  # (ops, spread, step time) of each stage
    for stage, ((created, dur, end_s), mem) in enumerate(zip(per_stage, members, strict=True)):
        if mode == "duration":
            if have_end:
                end = np.nanmedian(end_s, axis=1)  # [S, 1 + K]
            elif have_created:
                end = np.nanmedian(created + dur, axis=1)
                missing = ~np.isfinite(end)  # an anchor without a duration (a set-up collective)
                end[missing] = np.nanmax(created, axis=1)[missing]
            else:  # durations only: each step's collectives back to back, steps one after the other
                longest = np.nanmax(np.nan_to_num(dur, nan=0.0), axis=1)  # [S, 1 + K]
                longest[:, 0] = 0.0
                end = np.cumsum(longest.ravel()).reshape(longest.shape)
            arrival = end[:, None, :] - np.nan_to_num(dur, nan=0.0)
        else:
            arrival = created
            end = arrival.max(axis=1) + transfer
        coll_end = np.broadcast_to(end[:, None, :], arrival.shape)
        per_stage_ops.append(
            step_ops(
                arrival[..., 1:],
                coll_end[..., 1:],
                np.broadcast_to(end[:, :1], arrival.shape[:2]),
                steps=np.arange(len(end), dtype=np.int64),
                ranks=mem,
                stage=stage,
            )
        )
    stage_ops, spreads, step_times = zip(*per_stage_ops, strict=True)
    table = pd.concat(stage_ops, ignore_index=True)
    meta = JobMeta(
        name=name, dp_size=lay.dp_size, pp_size=lay.pp_size, tp_size=lay.tp_size, world_size=lay.world_size
    )
    ops_valid = validate_ops(table, meta, source=source)
    t = coll.table
    dp_keys = {g.key for g in lay.dp_groups}
    kinds = sorted(t.loc[t["group"].isin(dp_keys) & t["kind"].isin(grad_kinds), "kind"].astype(str).unique())
    backends = sorted(b for b in t["backend"].astype(str).unique() if b)
    label = " ".join(x for x in (",".join(backends), ",".join(kinds)) if x)
    trace = OpTrace(
        ops=ops_valid, meta=meta, source=source, fmt=fmt, collective=label, timing=f"{mode}: {timing_note}"
    )
    folded = _folded(coll, lay, steps, grad_kinds)
    for note in dropped:
        warnings.warn(f"{source}: dropped {note}", warning, stacklevel=3)
    report = AssemblyReport(
        layout=lay,
        timing=mode,
        timing_note=timing_note,
        transfer_note=transfer_note,
        collectives_per_step=[int(s.seqs.shape[1]) for s in steps],
        steps=int(num),
        dropped=dropped,
        folded_per_step=folded,
        clock_offsets_s=offsets_all,
        spread_first_s=np.concatenate([s[:, 0] for s in spreads]),
        step_time_s=np.max(np.stack(step_times), axis=0),
        warnings=[f"dropped {d}" for d in dropped],
    )
    return trace, report


def _folded(
    coll: CollectiveSet, lay: Layout, steps: list[_GroupSteps], grad_kinds: tuple[str, ...]
) -> dict[str, float]:
    """Mean count per rank and step of the DP group's collectives folded into compute, by kind
    (those between each step's anchor and its last gradient collective)."""
    t = coll.table
    out: dict[str, float] = {}
    total = 0
    for g, st in zip(lay.dp_groups, steps, strict=True):
        mine = t[(t["group"] == g.key) & (t["rank"] == g.ranks[0]) & ~t["kind"].isin(grad_kinds)]
        total += len(st.seqs)
        for kind, seq in mine.groupby("kind", observed=True)["seq"]:
            ordered = np.sort(seq.to_numpy())
            inside = np.searchsorted(ordered, st.seqs[:, -1], side="right") - np.searchsorted(
                ordered, st.anchors, side="right"
            )
            out[str(kind)] = out.get(str(kind), 0.0) + float(inside.sum())
    return {k: v / max(total, 1) for k, v in sorted(out.items()) if v > 0}


#: ``(optype, seq_id, mc, start_ts, duration)``: one op per step and DP rank, times ``[S, n]`` (s)
OpBlock = tuple[str, int, int, NDArray[np.float64], NDArray[np.float64]]


def serialise_buckets(
    arrival: NDArray[np.float64], end: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Bucket ops' starts and ends ``[..., K]`` as the replay's dependency model runs them.

    ``pacectl/backends/dag.py`` runs a step's gradient buckets one after another, so bucket ``k``
    starts at ``max(its arrival, bucket k - 1's end)``, that end as serialised itself (a bucket pushed
    later pushes the next one too); bucket 0 (the one pacing delays) is never shifted. The true
    arrivals still give the arrival spreads.
    """
    starts, end = arrival.copy(), end.copy()
    for k in range(1, arrival.shape[-1]):
        starts[..., k] = np.maximum(arrival[..., k], end[..., k - 1])
        end[..., k] = np.maximum(end[..., k], starts[..., k])
    return starts, end


def op_frame(
    steps: NDArray[np.int64],
    ranks: list[int],
    stage: int,
    blocks: list[OpBlock],
) -> pd.DataFrame:
    """The canonical op table of one stage from its blocks of ops, one op per step and DP rank each.

    Args:
        steps: ``int64[S]`` the step ids.
        ranks: the global rank of each DP rank (``dp_rank`` is the position).
        stage: the pipeline stage.
        blocks: the ops (:data:`OpBlock`; times may broadcast to ``[S, n]``).

    Returns:
        The table (:data:`~pacectl.traces.model.CANONICAL_COLUMNS`, block after block), ``optype``
        a categorical over :data:`~pacectl.traces.model.OPTYPES` that
        :func:`~pacectl.traces.model.validate_ops` turns into text.
    """
    S, n = len(steps), len(ranks)
    per_block = S * n
    codes = np.repeat(np.array([OPTYPES.index(b[0]) for b in blocks], dtype=np.int8), per_block)
    return pd.DataFrame(
        {
            "step": np.tile(np.repeat(steps, n), len(blocks)),
            "dp_rank": np.tile(np.arange(n), S * len(blocks)),
            "stage": np.full(per_block * len(blocks), stage, dtype=np.int64),
            "rank": np.tile(np.asarray(ranks, dtype=np.int64), S * len(blocks)),
            # one category set for every stage, so a concat of stages stays categorical (codes, not text)
            "optype": pd.Categorical.from_codes(codes, categories=OPTYPES),
            "seq_id": np.repeat(np.array([b[1] for b in blocks], dtype=np.int64), per_block),
            "mc": np.repeat(np.array([b[2] for b in blocks], dtype=np.int64), per_block),
            "start_ts": np.concatenate([np.broadcast_to(b[3], (S, n)).ravel() for b in blocks]),
            "duration": np.concatenate([np.broadcast_to(b[4], (S, n)).ravel() for b in blocks]),
        },
        copy=False,
    )


def step_ops(
    arrival: NDArray[np.float64],
    end: NDArray[np.float64],
    step_start: NDArray[np.float64],
    *,
    steps: NDArray[np.int64],
    ranks: list[int],
    stage: int = 0,
    fwd_end: NDArray[np.float64] | None = None,
    step_end: NDArray[np.float64] | None = None,
    scale: float = 1.0,
) -> tuple[pd.DataFrame, NDArray[np.float64], NDArray[np.float64]]:
    """The op table of one stage from its recorded times (the mapping of the module docstring).

    Args:
        arrival: ``[S, n, K]`` each gradient collective's arrival, clamped into its step here.
        end: ``[S, n, K]`` its end.
        step_start: ``[S, n]`` each step's start on each rank.
        steps: ``int64[S]`` the step ids.
        ranks: the global rank of each DP rank (``dp_rank`` is the position).
        stage: the pipeline stage.
        fwd_end: ``[S, n]`` the recorded forward end (NaN: not recorded), clipped into [step start,
            first arrival]; None: the first arrival.
        step_end: ``[S, n]`` the recorded step end (NaN: none); a step ends at the latest of it and
            the rank's last bucket end. None: the last bucket end over all ranks.
        scale: seconds per unit of the times (``1e-6`` for µs).

    Returns:
        ``(ops, spread, step_time)``: the op table (times in seconds from each step's earliest start
        over ranks), the arrival spread ``[S, K]`` and the step times ``[S]`` (s).
    """
    A = np.maximum(arrival, step_start[..., None])
    A_sorted = np.sort(A, axis=2)
    fe = A_sorted[..., 0]
    if fwd_end is not None:
        fe = np.clip(np.where(np.isnan(fwd_end), fe, fwd_end), step_start, fe)
    starts_b, E = serialise_buckets(A, np.maximum(end, A))
    last_end = E.max(axis=2)
    if step_end is None:
        step_end = np.broadcast_to(last_end.max(axis=1, keepdims=True), last_end.shape)
    else:
        step_end = np.fmax(step_end, last_end)
    bounds = np.concatenate([fe[..., None], A_sorted], axis=2)
    t0 = step_start.min(axis=1)[:, None]

    def block(optype: str, seq: int, lo: NDArray[np.float64], hi: NDArray[np.float64], mc: int) -> OpBlock:
        return optype, seq, mc, (lo - t0) * scale, np.maximum(hi - lo, 0.0) * scale

    blocks = [block("forward-compute", 0, step_start, fe, 0)]
    for k in range(A.shape[2]):
        blocks.append(block("backward-compute", k, bounds[..., k], bounds[..., k + 1], 0))
        blocks.append(block("grads-reduce-scatter", k, starts_b[..., k], E[..., k], -1))
    blocks.append(block("optimizer", 0, last_end, step_end, -1))
    spread = (A.max(axis=1) - A.min(axis=1)) * scale
    return op_frame(steps, ranks, stage, blocks), spread, (step_end.max(axis=1) - t0[:, 0]) * scale
