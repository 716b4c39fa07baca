"""Synthetic data-parallel cluster (``backend=sim``): seeded, vectorized over ranks.

One iteration of pure data parallelism (one pacing domain: the whole world)::

    W_r      compute time of rank r, drawn from the seed's stream a chunk of iterations at a time
             (pacectl.fabric.noise.ComputeModel.stream: the values of drawing them all at once)
    c_r      compute finish = W_r plus early-arrival interference from co-located peers that wait
             spinning (none when the action's ranks wait asleep: Action.wait, controller=sleep_wait)
    a_r      arrival at the all-reduce = c_r + d_r (d_r: the pacing delay, a sleep; with
             backend.actuator=clock the compute runs slower instead and only the rest is slept)
    A        max_r a_r: the collective starts when the last rank arrives
    T(t)     all-reduce duration from the comm model, started at absolute time t (null: constant)
    iteration time = A + T(t_iter + A); every rank leaves together and starts the next iteration

With the null comm model and no interference this is max-plus: no delay can shorten an iteration.
With a node power cap (``cluster.power_cap``, :mod:`pacectl.fabric.powercap`), ``c_r`` instead
follows from the clock each GPU's share of its node's power buys while its peers compute, sleep or
spin: then a sleeping wait or a pacing delay can shorten an iteration. Switched off (the default),
the simulator is exactly the one above.
With ``cluster.buckets.count > 1`` the backward runs in buckets whose all-reduces overlap the rest of
backward (:mod:`pacectl.fabric.overlap`, the ``overlap`` hook): the paced collective is bucket 0's,
and the iteration ends with the last bucket's. One bucket (the default) is exactly the model above.
The run is recorded in the canonical trace format (``to_trace``), so a simulated run replays like a
recorded one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from pacectl.checks import Checked, flag, within
from pacectl.errors import BackendError, ConfigError
from pacectl.fabric.contention import EarlyArrivalInterference, SimComm
from pacectl.fabric.noise import DRAW_CELLS, ComputeModel, ComputeStream
from pacectl.fabric.overlap import BucketEngine
from pacectl.fabric.power import (
    ACTUATOR_CHOICES,
    PowerProfile,
    check_actuator,
    clock_for_delay,
    power_profile,
)
from pacectl.fabric.powercap import NodePowerCap
from pacectl.traces.model import JobMeta, OpTrace, validate_ops
from pacectl.types import Action, Backend, Domain, IntArray, Observation, RankCompute


@dataclass(kw_only=True)
class SimConfig(Checked):
    """``backend=sim``: the synthetic data-parallel cluster's typed config (Hydra's ConfigStore). The
    ``cluster=`` profile gives its topology, communication and compute noise; ``comm=`` picks the
    communication model. ``record``: also write each run as a canonical trace,
    ``<run dir>/records/<controller>.parquet``, as a live run does. ``actuator``: how a pacing delay
    is applied: ``delay`` (sleep, then full speed), ``clock`` (run the early rank's compute slower,
    at the clocks ``cluster.power`` allows; sleep the rest) or ``both`` (every controller twice:
    ``<family>`` with delay, ``<family>@clock``)."""

    section: ClassVar[str] = "backend"
    name: str = "sim"
    num_ranks: int = within(64, ">= 1")
    num_iterations: int = within(500, ">= 1")
    record: Any = flag(False)
    actuator: str = within("delay", choices=ACTUATOR_CHOICES)


class SimBackend(Backend):
    """The synthetic cluster (``Backend`` protocol).

    Args:
        num_ranks: world size, >= 1.
        num_iterations: iterations per episode, >= 1.
        compute: compute-time model.
        comm: communication model (:class:`~pacectl.fabric.contention.SimComm`).
        interference: early-arrival interference (``kappa = 0`` disables it).
        record: keep per-iteration records for :meth:`to_trace`; a bool (``backend.record``:
            true or false, a string such as "maybe" is a ConfigError).
        actuator: ``"delay"`` (sleep, then compute at full speed) or ``"clock"`` (compute slower so
            that the rank arrives when the delay says, :func:`~pacectl.fabric.power.clock_for_delay`;
            without a power cap the timing is the delay actuator's, only the energy differs).
        power: the GPUs' power profile (the clock actuator's clocks; the power cap's powers).
        power_cap: a node power cap shared by the node's GPUs, or None (off).
        overlap: bucketed backward (:class:`~pacectl.fabric.overlap.BucketEngine`), or None: one
            all-reduce after all compute (the model above). With more than one bucket, ``record``,
            ``actuator="clock"`` and a power cap are refused (not modelled yet).

    Example:
        >>> from pacectl.fabric.contention import FixedComm
        >>> sim = SimBackend(num_ranks=4, num_iterations=3, compute=ComputeModel(0.1), comm=FixedComm(0.01))
        >>> sim.reset(seed=0)
        >>> round(sim.step([Action.zeros(4)])[0].iteration_time_s, 3)
        0.11
    """

    name = "sim"

    def __init__(
        self,
        *,
        num_ranks: int,
        num_iterations: int,
        compute: ComputeModel,
        comm: SimComm,
        interference: EarlyArrivalInterference | None = None,
        record: bool = False,
        actuator: str = "delay",
        power: PowerProfile | None = None,
        power_cap: NodePowerCap | None = None,
        overlap: BucketEngine | None = None,
    ) -> None:
        for key, value in (("num_ranks", num_ranks), ("num_iterations", num_iterations)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(
                    f"backend.{key} must be an integer >= 1, got {value!r}; e.g. backend.{key}=64"
                )
        if not isinstance(record, (bool, np.bool_)):
            raise ConfigError(
                f"backend.record must be true or false, got {record!r}; e.g. backend.record=true"
            )
        self.num_ranks = int(num_ranks)
        self._num_iterations = int(num_iterations)
        self.compute = compute
        self.comm = comm
        self.interference = interference or EarlyArrivalInterference(kappa=0.0)
        self.record = bool(record)
        self.actuator = check_actuator(actuator)
        self.power = power if power is not None else (power_cap.profile if power_cap else power_profile(None))
        self.power_cap = power_cap
        self.overlap = overlap
        if overlap is not None and overlap.count > 1:
            for on, what in (
                (self.record, "backend.record=true (a bucketed run has no canonical trace form yet)"),
                (
                    self.actuator != "delay",
                    f"backend.actuator={self.actuator} (only the delay actuator is modelled)",
                ),
                (power_cap is not None, "cluster.power_cap.node_w (the power cap runs one compute span)"),
            ):
                if on:
                    raise ConfigError(
                        f"cluster.buckets.count={overlap.count} does not combine with {what}; "
                        "use cluster.buckets.count=1 for it"
                    )
        self.domains: tuple[Domain, ...] = (Domain(name="world", ranks=tuple(range(self.num_ranks))),)
        self.rank_labels: IntArray = np.arange(self.num_ranks, dtype=np.int64)
        self.step_ids: IntArray = np.arange(self._num_iterations, dtype=np.int64)
        interfering = self.interference.active(self.num_ranks)
        self.comm_model: str = str(comm.name)
        capped = power_cap is not None and power_cap.binding()
        overlapped = overlap is not None and overlap.timing_dependent
        self.comm_timing_dependent = bool(comm.timing_dependent) or interfering or capped or overlapped
        self.comm_description = str(comm.description)
        if interfering:
            self.comm_description += (
                f" + early-arrival interference (kappa {self.interference.kappa:g}, "
                f"{self.interference.kappa_source.split(':')[0].strip()})"
            )
        if power_cap is not None:
            self.comm_description += f" + {power_cap.description}"
        if overlap is not None:
            self.comm_description += f" + {overlap.description}"
        #: timing-dependent mechanisms in force, by name
        self.mechanisms: tuple[str, ...] = tuple(
            name
            for name, on in (
                ("contention", bool(comm.timing_dependent)),
                ("early_arrival_interference", interfering),
                ("node_power_cap", capped),
                ("on_device_overlap_contention", overlapped),
            )
            if on
        )
        self._k = -1
        self._draws: tuple[int, ComputeStream] | None = None  # (seed, its compute-time stream)

    @property
    def num_iterations(self) -> int:
        """Iterations per episode."""
        return self._num_iterations

    def reset(self, *, seed: int = 0) -> None:
        """Rewind the clock and the compute times to iteration 0 of ``default_rng(seed)``'s draws.

        The times are :meth:`ComputeModel.sample`'s with that generator, handed out
        :data:`DRAW_CELLS` cells at a time (:meth:`ComputeModel.stream`); a reset with the seed of
        the last one rewinds its stream (every controller's run sees the same draws, and the
        stream's positions are found once).
        """
        if self._draws is None or self._draws[0] != seed or self._draws[1].model is not self.compute:
            rng = np.random.default_rng(seed)
            self._draws = (seed, self.compute.stream(rng, self._num_iterations, self.num_ranks))
        else:
            self._draws[1].rewind()
        self._chunk = max(1, min(self._num_iterations, DRAW_CELLS // self.num_ranks))
        self._work = np.empty((0, self.num_ranks))
        self._work_from = 0
        self._clock_s = 0.0
        self._k = 0
        self.over_cap_s = 0.0
        if self.overlap is not None:
            self.overlap.reset(seed)
        if self.record:
            shape = (self._num_iterations, self.num_ranks)
            self._rec_finish = np.zeros(shape)
            self._rec_delay = np.zeros(shape)
            self._rec_start = np.zeros(self._num_iterations)
            self._rec_comm = np.zeros(self._num_iterations)

    def step(self, actions: Sequence[Action]) -> list[Observation]:
        """Run one iteration with the world domain's pacing delays.

        Raises:
            BackendError: before ``reset``, past the last iteration, or with a bad action.
        """
        k = self._k
        if k < 0 or k >= self._num_iterations:
            raise BackendError(
                f"step() must be called after reset() and at most {self._num_iterations} times, got call {k + 1}"
            )
        if len(actions) != 1:
            raise BackendError(f"step() needs one action (one domain: the world), got {len(actions)}")
        delay = np.asarray(actions[0].delay_s, dtype=np.float64)
        if delay.shape != (self.num_ranks,) or not np.isfinite(delay).all() or (delay < 0).any():
            raise BackendError(
                f"action must hold {self.num_ranks} finite delays >= 0, got shape {delay.shape}"
            )
        asleep = actions[0].wait == "sleep"
        work = self._work_of(k)
        if self.overlap is not None:
            # what the delay holds back of the compute (pacectl.fabric.overlap's c_r): nothing with
            # buckets and the device pacer
            held = delay if self.overlap.count == 1 or self.overlap.host_pacer else np.zeros_like(delay)
            finish = self.interference.finish_s(work, held, spinning=not asleep)
            return self._step_overlap(k, finish, delay, asleep)
        finish = self.interference.finish_s(work, delay, spinning=not asleep)
        compute = self._compute(finish, delay, wait_sleeps=asleep)
        if self.power_cap is None:
            natural = finish  # the clock actuator arrives when the delay actuator would
            arrival = finish + delay
        else:
            arrival = self._cap_arrival
            natural = self._cap_finish if self.actuator == "delay" else arrival - delay
        last = float(arrival.max())
        comm_s = float(self.comm.time_s(self._clock_s + last))
        return self._end_iteration(k, natural, delay, arrival, last, comm_s, last + comm_s, compute)

    def _end_iteration(
        self,
        k: int,
        natural: np.ndarray,
        delay: np.ndarray,
        arrival: np.ndarray,
        start_s: float,
        transfer_s: float,
        iteration_s: float,
        compute: RankCompute | None,
    ) -> list[Observation]:
        """Record iteration ``k`` (``record``: the paced all-reduce's), move the clock past it and
        return its observation; ``start_s`` is the all-reduce's start (its last arrival)."""
        if self.record:
            self._rec_finish[k] = natural
            self._rec_delay[k] = delay
            self._rec_start[k] = start_s
            self._rec_comm[k] = transfer_s
        self._clock_s += iteration_s
        self._k += 1
        return [
            Observation(
                iteration=k,
                domain=0,
                arrival_s=arrival,
                applied_delay_s=delay,
                natural_arrival_s=natural,
                wait_s=start_s - arrival,
                iteration_time_s=iteration_s,
                collective_time_s=transfer_s,
                compute=compute,
            )
        ]

    def _work_of(self, k: int) -> np.ndarray:
        """Iteration ``k``'s unperturbed compute times, ``float64[num_ranks]`` (the next chunk
        drawn when ``k`` is past the one held)."""
        row = k - self._work_from
        if row >= len(self._work):
            assert self._draws is not None
            self._work_from = k
            self._work = self._draws[1].rows(k, min(self._num_iterations, k + self._chunk))
            row = 0
        return self._work[row]

    def _step_overlap(self, k: int, finish: np.ndarray, delay: np.ndarray, asleep: bool) -> list[Observation]:
        """One bucketed iteration (:mod:`pacectl.fabric.overlap`): the paced collective is bucket 0's."""
        assert self.overlap is not None
        run = self.overlap.run(finish, delay, asleep=asleep, clock_s=self._clock_s)
        compute = RankCompute(
            compute_s=run.compute_s,
            pre_arrival_compute_s=run.natural_s,
            clock_frac=np.ones_like(run.compute_s),
            sleep_s=delay,
        )
        # (recorded with one bucket only: more are refused)
        return self._end_iteration(
            k, run.natural_s, delay, run.arrival_s, run.start_s, run.transfer_s, run.iteration_s, compute
        )

    def _compute(
        self, work: np.ndarray, delay: np.ndarray, *, wait_sleeps: bool = False
    ) -> RankCompute | None:
        """What each GPU computed (and at which clock) and slept, for the energy account; with a power
        cap also when each rank finished and arrived (``_cap_finish``, ``_cap_arrival``)."""
        if self.power_cap is None:
            if self.actuator == "delay":
                return RankCompute(
                    compute_s=work, pre_arrival_compute_s=work, clock_frac=np.ones_like(work), sleep_s=delay
                )
            clock, slept = clock_for_delay(work, delay, self.power)
            stretched = np.where(work > 0, work / clock, 0.0)
            return RankCompute(
                compute_s=stretched,
                pre_arrival_compute_s=stretched,
                clock_frac=clock,
                sleep_s=slept,
                slow_compute_s=stretched,
            )
        if self.actuator == "clock":
            clock, _ = clock_for_delay(work, delay, self.power)
            run = self.power_cap.run(
                work, delay, clock_ceiling=clock, arrive_at_s=work + delay, wait_sleeps=wait_sleeps
            )
        else:
            run = self.power_cap.run(work, delay, wait_sleeps=wait_sleeps)
        self._cap_finish, self._cap_arrival = run.finish_s, run.arrival_s
        self.over_cap_s += float(run.over_cap_s.sum())
        return RankCompute(
            compute_s=run.compute_s,
            pre_arrival_compute_s=run.compute_s,
            clock_frac=run.clock_frac,
            sleep_s=run.sleep_s,
            compute_energy_j=run.compute_energy_j,
        )

    def to_trace(self, name: str = "sim") -> OpTrace:
        """The iterations run so far as a canonical trace (``forward-compute`` then one DP
        ``grads-reduce-scatter`` per rank and iteration, ``delay_s`` = the pacing delay).

        Raises:
            BackendError: the backend was built with ``record=False`` or has not run.
        """
        if not self.record or self._k <= 0:
            raise BackendError("to_trace() needs record=True and at least one step() since reset()")
        k, n = self._k, self.num_ranks
        finish, delay = self._rec_finish[:k], self._rec_delay[:k]
        arrival = finish + delay
        end = (self._rec_start[:k] + self._rec_comm[:k])[:, None]
        ranks = np.tile(np.arange(n), k)
        cell = {"step": np.repeat(np.arange(k), n), "dp_rank": ranks, "stage": 0, "rank": ranks}
        compute = pd.DataFrame(
            {
                **cell,
                "optype": "forward-compute",
                "seq_id": 0,
                "mc": 0,
                "start_ts": 0.0,
                "duration": finish.reshape(-1),
                "delay_s": 0.0,
            }
        )
        collective = pd.DataFrame(
            {
                **cell,
                "optype": "grads-reduce-scatter",
                "seq_id": 0,
                "mc": -1,
                "start_ts": arrival.reshape(-1),
                "duration": (end - arrival).reshape(-1),
                "delay_s": delay.reshape(-1),
            }
        )
        meta = JobMeta(name=name, dp_size=n, pp_size=1)
        ops = validate_ops(pd.concat([compute, collective], ignore_index=True), meta, source=f"sim:{name}")
        return OpTrace(ops=ops, meta=meta, source=f"sim:{name}", fmt="sim")
