"""Counterfactual replay of a recorded op-level trace under pacing.

Each recorded step is replayed through its dependency DAG (:mod:`pacectl.backends.dag`) with the
controller's delays inserted before each rank enters the paced collective. Steps are independent
(the trace records each step relative to its own start), so the delay-free part of every step is
evaluated once for all steps at once; only the ops downstream of the paced collective are
re-evaluated per iteration, in the closed loop.

Pacing domains are the DP groups of the pipeline stages: domain ``s`` holds the DP ranks of stage
``s``. Global rank index ``i = s * dp_size + dp_rank``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pacectl.backends.dag import Level, StepDag, compile_dag, estimate_intrinsic, evaluate
from pacectl.checks import Checked, within
from pacectl.errors import BackendError, ConfigError
from pacectl.fabric.base import CommModel, NullComm
from pacectl.fabric.power import ACTUATOR_CHOICES, PowerProfile, check_actuator, power_profile
from pacectl.traces.model import COMPUTE_OPTYPES, OpTrace
from pacectl.types import Action, Backend, Domain, FloatArray, IntArray, Observation, RankCompute

DEFAULT_PACED_OPTYPE = "grads-reduce-scatter"
#: Op types that run on the GPU's compute stream (their time is compute in the energy account).
GPU_COMPUTE_OPTYPES = (*COMPUTE_OPTYPES, "optimizer")


@dataclass(frozen=True)
class Fidelity:
    """How well the zero-delay replay reproduces the recorded step times.

    Attributes:
        step_time_median_abs_err_frac: median over steps of ``|replayed - recorded| / recorded``.
        step_time_p90_abs_err_frac: 90th percentile of the same.
        step_time_max_abs_err_frac: worst step.
        launch_clipped: op instances whose recorded start preceded a modelled dependency's end.
        transfer_clipped: collective instances that ended before their last member started.
        num_op_instances: op instances replayed.
    """

    step_time_median_abs_err_frac: float
    step_time_p90_abs_err_frac: float
    step_time_max_abs_err_frac: float
    launch_clipped: int
    transfer_clipped: int
    num_op_instances: int


@dataclass(kw_only=True)
class ReplayConfig(Checked):
    """``backend=replay``: closed-loop replay of a recorded trace (the ``trace=`` group picks which),
    typed (Hydra's ConfigStore). ``paced_optype``: the collective before which each rank applies
    its pacing delay (the first bucket of the step); ``actuator`` as :class:`~pacectl.backends.sim.SimConfig`'s."""

    section: ClassVar[str] = "backend"
    name: str = "replay"
    paced_optype: str = DEFAULT_PACED_OPTYPE
    actuator: str = within("delay", choices=ACTUATOR_CHOICES)


class ReplayBackend(Backend):
    """Closed-loop replay of a recorded trace (``Backend`` protocol).

    Args:
        trace: a validated :class:`~pacectl.traces.model.OpTrace`.
        paced_optype: op type of the paced collective; the delay goes before its first instance
            (``seq_id`` 0) in each step. Must be a DP-synchronised collective present on every stage.
        comm_model: communication model (default :class:`~pacectl.fabric.base.NullComm`).
        actuator: ``"delay"`` (sleep before the paced collective, then run at full speed) or
            ``"clock"``: run each pipeline's GPU compute before its paced collectives (every compute op
            of the DP rank's stages upstream of them) slower, one clock per DP rank for all its stages
            (a pipeline's stages feed each other: clocking them apart would compound through its p2p
            transfers). The clock is the lowest the GPU type allows at which no stage's arrival moves
            by more than its delay: ``1 / (1 + min_s d_s / A_s)`` of the highest, with ``A_s`` the
            stage's natural arrival (the compute on its path is at most that, and compute-bound time
            scales with ``f_max / f``), snapped up to an allowed clock; each stage then sleeps what is
            left of its delay. One stage (the simulator's case) absorbs the whole delay in its compute.
        power: the power profile whose clocks the clock actuator may set (default
            :data:`~pacectl.fabric.power.DEFAULT_POWER`).

    Raises:
        ConfigError: ``paced_optype`` is not a DP collective of this trace, or an unknown actuator.
        TraceError: the trace does not fit the dependency model (see :func:`compile_dag`).

    Example:
        >>> from pacectl.data import shipped_trace
        >>> from pacectl.traces.bytedance import load_bytedance
        >>> backend = ReplayBackend(load_bytedance(*shipped_trace("ST")))
        >>> backend.reset()
        >>> obs = backend.step([Action.zeros(len(d.ranks)) for d in backend.domains])
        >>> len(obs), obs[0].num_ranks
        (4, 2)
    """

    name = "replay"

    def __init__(
        self,
        trace: OpTrace,
        *,
        paced_optype: str = DEFAULT_PACED_OPTYPE,
        comm_model: CommModel | None = None,
        actuator: str = "delay",
        power: PowerProfile | None = None,
    ) -> None:
        self.actuator = check_actuator(actuator)
        self.power = power if power is not None else power_profile(None)
        self.trace = trace
        self.dag: StepDag = compile_dag(trace)
        self._launch, self._recorded_transfer, self._clip_counts = estimate_intrinsic(self.dag)
        dp, pp = trace.meta.dp_size, trace.meta.pp_size
        self._paced = self._find_paced(paced_optype)
        self._co_paced = self._find_co_paced() if trace.pacing_blocks_compute else self._paced[:0]
        self.paced_optype = paced_optype
        self.domains = tuple(
            Domain(name=f"stage{s}", ranks=tuple(range(s * dp, (s + 1) * dp))) for s in range(pp)
        )
        self.rank_labels: IntArray = self.dag.rank_labels.reshape(-1).astype(np.int64)
        self.step_ids: IntArray = self.dag.steps
        n = self.dag.num_nodes
        self._base_end = np.zeros((n + 1, *self.dag.start_s.shape[1:]))
        self._base_start = np.zeros(self.dag.start_s.shape)
        self._tail = _downstream_levels(self.dag, np.concatenate([self._paced, self._co_paced]))
        self._group_members = [np.flatnonzero(self.dag.group == self.dag.group[p]) for p in self._paced]
        self._paced_mask = np.zeros(n, dtype=bool)
        self._paced_mask[self._paced] = True
        self.use_comm_model(comm_model or NullComm())
        self._k = -1
        self._clock_s = 0.0

    def use_comm_model(self, comm_model: CommModel) -> None:
        """Set the communication model (the constructor's; later, ``comm=fitted``'s, whose fit needs
        this backend first).

        The recorded transfer times stay the reference; the new model's static part
        (``transfer_s``) is applied to them and the baseline re-evaluated.
        """
        self._comm = comm_model
        self.comm_model = comm_model.name
        self.comm_description: str = comm_model.description
        self.comm_timing_dependent: bool = bool(comm_model.timing_dependent)
        self._transfer = comm_model.transfer_s(self._recorded_transfer)
        self._base_end[:] = 0.0
        evaluate(self.dag.levels, self._base_end, self._base_start, self._launch, self._transfer)
        self._split_compute()

    def _split_compute(self) -> None:
        """Each stage's GPU compute ops upstream of the paced collective (the clock actuator slows
        them) and downstream of it, and their durations summed per step and DP rank."""
        dag = self.dag
        compute = np.isin(dag.optype.astype(str), GPU_COMPUTE_OPTYPES)
        downstream = np.zeros(dag.num_nodes, dtype=bool)
        for lv in self._tail:
            downstream[lv.nodes] = True
        pp = self.trace.meta.pp_size
        self._upstream = [np.flatnonzero(compute & ~downstream & (dag.stage == s)) for s in range(pp)]
        after = [np.flatnonzero(compute & downstream & (dag.stage == s)) for s in range(pp)]
        # [steps, pp, dp]: compute seconds before / after the paced collective, at the highest clock
        self._pre_compute_s = np.stack([self._transfer[u].sum(axis=0) for u in self._upstream], axis=1)
        self._post_compute_s = np.stack([self._transfer[a].sum(axis=0) for a in after], axis=1)

    def _find_co_paced(self) -> IntArray:
        """The compute op after the paced collective's launch, per stage (``pacing_blocks_compute``).

        Raises:
            ConfigError: some stage lacks it.
        """
        seq = int(self.dag.seq_id[self._paced[0]]) + 1
        co = self.dag.find("backward-compute", seq)
        if len(co) != len(self._paced):
            raise ConfigError(
                f"a trace paced by a host sleep (pacing_blocks_compute) needs backward-compute {seq} after "
                f"the paced collective on every stage, got {len(co)} of {len(self._paced)} (in {self.trace.source})"
            )
        return co

    def _find_paced(self, optype: str) -> IntArray:
        paced = self.dag.find(optype, 0)
        dp_collectives = sorted({str(t) for t in self.dag.optype[self.dag.group_dp_sync[self.dag.group]]})
        if optype not in dp_collectives or len(paced) != self.trace.meta.pp_size:
            raise ConfigError(
                f"paced_optype must be a DP collective present on every stage, one of {dp_collectives}, "
                f"got {optype!r} (in backend.paced_optype for {self.trace.source})"
            )
        return paced

    @property
    def num_iterations(self) -> int:
        """Iterations in an episode: one per recorded step."""
        return int(self.step_ids.shape[0])

    @property
    def clip_counts(self) -> dict[str, int]:
        """Counts of clipped launch-delay and transfer estimates (see :func:`estimate_intrinsic`)."""
        return dict(self._clip_counts)

    def reset(self, *, seed: int = 0) -> None:
        """Rewind to the first recorded step. ``seed`` is unused: replay is deterministic."""
        del seed
        self._k = 0
        self._clock_s = 0.0

    def step(self, actions: Sequence[Action]) -> list[Observation]:
        """Replay the next recorded step with one pacing action per domain (stage).

        Args:
            actions: one :class:`Action` per domain, ``delay_s`` of shape ``[dp_size]``, seconds.

        Returns:
            One :class:`Observation` per domain.

        Raises:
            BackendError: called before ``reset``, after the last step, or with wrong actions.
        """
        k = self._k
        if k < 0 or k >= self.num_iterations:
            raise BackendError(
                f"step() must be called after reset() and at most {self.num_iterations} times, "
                f"got call {k + 1}"
            )
        delays = self._check_actions(actions)
        end = self._base_end[:, k].copy()
        start = self._base_start[:, k].copy()
        pre = self._pre_compute_s[k]  # [pp, dp]
        clock = np.ones_like(delays)
        slept = delays
        transfer = self._transfer[:, k]
        hook = self._transfer_hook()
        if self.actuator == "clock" and delays.any():
            natural = start[self._paced]  # [pp, dp], unpaced
            with np.errstate(divide="ignore", invalid="ignore"):
                absorb = np.where(natural > 0, delays / natural, 0.0).min(axis=0)  # [dp]
            pipeline_clock = self.power.snap_clock_up(1.0 / (1.0 + absorb))
            clock = np.broadcast_to(pipeline_clock, delays.shape).copy()
            if (pipeline_clock < 1.0).any():
                transfer = transfer.copy()
                for nodes in self._upstream:
                    transfer[nodes] = transfer[nodes] / pipeline_clock
                end[:] = 0.0  # the slower compute moves what depends on it: the whole step, unpaced
                evaluate(self.dag.levels, end, start, self._launch[:, k], transfer, None, hook)
                shift = start[self._paced] - natural
                slept = np.maximum(delays - shift, 0.0)
        pace = np.zeros_like(start)
        pace[self._paced] = slept
        if len(self._co_paced):
            pace[self._co_paced] = slept
        solve_step = getattr(self._comm, "solve_step", None)
        if solve_step is not None:  # a model whose durations depend on the whole step (comm=fitted)
            if self.actuator == "clock":
                raise ConfigError(
                    "backend.actuator=clock is not modelled with comm=fitted (its fixed point solves the "
                    "recorded compute times): use comm=null or comm=contention, or backend.actuator=delay"
                )
            solve_step(self, k, end, start, pace)
        else:
            evaluate(self._tail, end, start, self._launch[:, k], transfer, pace, hook)
        self._k += 1
        iteration_time = float(end[:-1].max())
        self._clock_s += iteration_time
        obs = []
        for s, (p, members) in enumerate(zip(self._paced, self._group_members, strict=True)):
            arrival = start[p]
            last = start[members].max()
            pre_s = pre[s] / clock[s]
            room = np.maximum(iteration_time - end[p], 0.0)  # after the paced collective
            obs.append(
                Observation(
                    iteration=k,
                    domain=s,
                    arrival_s=arrival,
                    applied_delay_s=delays[s],
                    natural_arrival_s=arrival - delays[s],
                    wait_s=last - arrival,
                    iteration_time_s=iteration_time,
                    collective_time_s=float(np.mean(end[p] - last)),
                    compute=RankCompute(
                        compute_s=pre_s + np.minimum(self._post_compute_s[k, s], room),
                        pre_arrival_compute_s=pre_s,
                        clock_frac=clock[s],
                        sleep_s=slept[s],
                        slow_compute_s=pre_s,
                    ),
                )
            )
        return obs

    def _transfer_hook(self):  # type: ignore[no-untyped-def]
        """For a contended comm model: the paced collective's transfer as it runs from its start through
        the cross traffic (a constant slowdown when the model is inert, e.g. cross traffic always on,
        so applied whatever ``timing_dependent``)."""
        contended_s = getattr(self._comm, "contended_s", None)
        if contended_s is None:
            return None
        clock, paced = self._clock_s, self._paced_mask

        def hook(nodes: IntArray, group_start: FloatArray, transfer: FloatArray) -> FloatArray:
            # rows: the level's ops; last axis: DP ranks. A DP-synchronised collective (one start
            # for every rank) is one transfer (ReplayContention); else each rank's runs on its own.
            hit = np.flatnonzero(paced[nodes])
            if len(hit) == 0:
                return transfer
            out = transfer.copy()
            for i in hit:
                starts, recorded = group_start[i], transfer[i]
                if np.all(starts == starts.flat[0]):
                    longest = float(recorded.max())
                    out[i] = recorded + (contended_s(clock + float(starts.flat[0]), longest) - longest)
                    continue
                for j in np.ndindex(recorded.shape):
                    out[(i, *j)] = contended_s(clock + float(starts[j]), float(recorded[j]))
            return out

        return hook

    def _check_actions(self, actions: Sequence[Action]) -> FloatArray:
        dp = self.trace.meta.dp_size
        if len(actions) != len(self.domains):
            raise BackendError(
                f"step() needs one action per domain ({len(self.domains)}), got {len(actions)}"
            )
        delays = np.stack([np.asarray(a.delay_s, dtype=np.float64) for a in actions])
        if delays.shape != (len(self.domains), dp) or not np.isfinite(delays).all() or (delays < 0).any():
            raise BackendError(
                f"actions must hold finite delays >= 0 of shape [{dp}] per domain, got {delays!r}"
            )
        return delays

    def fidelity(self) -> Fidelity:
        """Compare the replay with the recorded step times (the null model's check): the trace's
        ``measured_step_time_s`` where it has them (live records), else the span of its op stamps.

        The replayed times are :meth:`recorded_timeline`'s (with the recording's own pacing delays).
        """
        replayed = self.recorded_timeline()[1].max(axis=(0, 2))
        if self.trace.measured_step_time_s is None:
            recorded = (self.dag.start_s + self.dag.duration_s).max(axis=(0, 2))
        else:  # a live record: its measured iteration times, not the span of its jittery stamps
            recorded = np.asarray(self.trace.measured_step_time_s, dtype=np.float64)
        err = np.abs(replayed - recorded) / recorded
        return Fidelity(
            step_time_median_abs_err_frac=float(np.median(err)),
            step_time_p90_abs_err_frac=float(np.percentile(err, 90)),
            step_time_max_abs_err_frac=float(err.max()),
            launch_clipped=self._clip_counts["launch_clipped"],
            transfer_clipped=self._clip_counts["transfer_clipped"],
            num_op_instances=self._clip_counts["num_op_instances"],
        )

    def recorded_timeline(self) -> tuple[FloatArray, FloatArray]:
        """The recording as the replay reproduces it: replayed with the pacing delays it carries
        (``delay_s`` of the paced ops: zero for ByteDance traces, the controller's delays for a paced
        live or simulated run). ``comm=fitted`` compares a replay's features with this timeline's.

        Returns:
            ``(start_s, end_s)``, each ``float64[N, num_steps, dp_size]``.
        """
        recorded = self.dag.delay_s[self._paced]  # [pp, steps, dp]
        if recorded.any():
            return self.replayed_times(recorded.transpose(1, 0, 2).reshape(self.num_iterations, -1))
        return self._base_start, self._base_end[:-1]

    def _pace_of(self, delays: FloatArray | None) -> FloatArray | None:
        """``float64[N, num_steps, dp_size]``: ``delays`` (``[num_steps, num_ranks]``, global rank
        order) before the paced collective and its co-paced ops; None for None."""
        if delays is None:
            return None
        dp, pp = self.trace.meta.dp_size, self.trace.meta.pp_size
        pace = np.zeros_like(self._base_start)
        pace[self._paced] = np.asarray(delays, dtype=np.float64).reshape(-1, pp, dp).transpose(1, 0, 2)
        if len(self._co_paced):
            pace[self._co_paced] = pace[self._paced]
        return pace

    def replayed_times(
        self,
        delays: FloatArray | None = None,
        *,
        launch_s: FloatArray | None = None,
        transfer_s: FloatArray | None = None,
    ) -> tuple[FloatArray, FloatArray]:
        """Open-loop replay of every step at once (the what-if primitive).

        Args:
            delays: ``float64[num_steps, num_ranks]`` pacing delays, seconds (global rank order), or
                None for zero.
            launch_s: ``float64[N, num_steps, dp_size]`` launch delays to use instead of the recorded
                ones (for example zeros: "no launch delays"), seconds.
            transfer_s: ``float64[N, num_steps, dp_size]`` op durations / collective transfer times
                to use instead of the comm model's, seconds.

        Returns:
            ``(start_s, end_s)``, each ``float64[N, num_steps, dp_size]``.
        """
        pace = self._pace_of(delays)
        end = self._base_end.copy()
        start = self._base_start.copy()
        if launch_s is None and transfer_s is None:
            if pace is not None:  # only ops downstream of the paced collective can move
                evaluate(self._tail, end, start, self._launch, self._transfer, pace)
        else:
            launch = self._launch if launch_s is None else launch_s
            transfer = self._transfer if transfer_s is None else transfer_s
            evaluate(self.dag.levels, end, start, launch, transfer, pace)
        return start, end[:-1]

    @property
    def launch_s(self) -> FloatArray:
        """Estimated launch delays, ``float64[N, num_steps, dp_size]`` seconds (read-only view)."""
        view = self._launch.view()
        view.flags.writeable = False
        return view

    @property
    def transfer_s(self) -> FloatArray:
        """Transfer times in force, ``float64[N, num_steps, dp_size]`` seconds (read-only view)."""
        view = self._transfer.view()
        view.flags.writeable = False
        return view


def _downstream_levels(dag: StepDag, paced: IntArray) -> tuple[Level, ...]:
    """The sub-levels holding every group reachable from the paced ops' groups."""
    n_groups = int(dag.group.max()) + 1
    reach = np.zeros(n_groups, dtype=bool)
    reach[dag.group[paced]] = True
    tail = []
    for lv in dag.levels:
        member_groups = dag.group[lv.nodes]
        # a group is downstream when one of its members depends on a downstream group
        dep_groups = np.where(lv.deps < dag.num_nodes, dag.group[np.minimum(lv.deps, dag.num_nodes - 1)], -1)
        hit = (dep_groups >= 0) & reach[np.maximum(dep_groups, 0)]
        node_hit = hit.any(axis=1) | reach[member_groups]
        for g in np.unique(member_groups[node_hit]):
            reach[g] = True
        keep = reach[member_groups]
        if not keep.any():
            continue
        groups_in_level = member_groups[lv.group_offsets]
        keep_group = reach[groups_in_level]
        tail.append(
            Level.of(lv.nodes[keep], lv.deps[keep], lv.group_sizes[keep_group], lv.dp_sync[keep_group])
        )
    return tuple(tail)
