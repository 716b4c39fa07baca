"""The power-coupled straggler: a node power cap shared by the node's GPUs (``cluster.power_cap``).

The GPUs of one node share a power (or thermal) envelope. A node-level manager splits the node's
GPU budget among them: every GPU that is not computing draws its state's power (spinning in a
collective, sleeping in a pacing delay), and the computing GPUs share what is left, each running at
the highest clock its share buys (:meth:`~pacectl.fabric.power.PowerProfile.clock_for_power`),
water-filled: a GPU held to a lower clock by the clock actuator leaves the rest of its share to the
others. A leader that finishes early and spins keeps drawing its spinning power, headroom the
straggler's clock could have used; a leader that sleeps (a pacing delay, a sleeping wait) frees
more of it, so the straggler computes faster and the iteration can be *shorter*. Lit Silicon
(Kurzynski, Aga and Wu, arXiv 2511.09861) reports up to +6 % performance on MI300X nodes from
node-level power management of this coupling.

The model's assumptions: the budget is split at every change of a GPU's state (no controller lag),
equally among the computing GPUs before water-filling, and a GPU held at its lowest clock draws that
clock's power even if the budget is smaller (then the node exceeds its cap; the count is kept).

The mechanism is named ``node_power_cap`` in every result, and switched off (``node_w: null``) the
simulator runs exactly as without it.

Example:
    >>> import numpy as np
    >>> from pacectl.fabric.power import power_profile
    >>> cap = NodePowerCap(node_w=1000.0, ranks_per_node=2, profile=power_profile("h100_sxm"))
    >>> run = cap.run(np.array([1.0, 2.0]), np.zeros(2))
    >>> bool(run.finish_s[1] < 2.0 * (1.0 / cap.profile.clock_for_power(500.0)))  # faster once rank 0 waits
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from pacectl.fabric.power import PowerProfile

FloatArray = NDArray[np.float64]

#: The mechanism's name in results.
MECHANISM = "node_power_cap"


@dataclass(frozen=True)
class CapRun:
    """What one iteration's compute phase did under the cap, per rank (``float64[num_ranks]``).

    Attributes:
        finish_s: when each rank's compute ended, seconds from the iteration start.
        arrival_s: when it entered the collective (after its pacing sleep), seconds.
        compute_s: time computing, seconds (``finish_s``).
        sleep_s: pacing delay slept, seconds.
        compute_energy_j: energy of the compute, joules.
        clock_frac: time-averaged clock of the compute (work over compute time).
        over_cap_s: time the node exceeded its cap (every computing GPU at its lowest clock), per rank
            of that node, seconds.
    """

    finish_s: FloatArray
    arrival_s: FloatArray
    compute_s: FloatArray
    sleep_s: FloatArray
    compute_energy_j: FloatArray
    clock_frac: FloatArray
    over_cap_s: FloatArray


@dataclass(frozen=True)
class NodePowerCap:
    """A GPU power budget per node, shared by its ``ranks_per_node`` GPUs.

    Args:
        node_w: the node's GPU power budget, W (> 0).
        ranks_per_node: GPUs per node (ranks fill nodes in rank order).
        profile: the GPUs' power profile.

    Its values are checked where the config is read (``cluster.power_cap``,
    :class:`pacectl.fabric.profile.PowerCap`; the topology's ``ranks_per_node``).
    """

    node_w: float
    ranks_per_node: int
    profile: PowerProfile
    name: str = MECHANISM

    @property
    def description(self) -> str:
        """One line for reports."""
        return (
            f"{MECHANISM}: {self.node_w:g} W of GPU power per node of {self.ranks_per_node} GPUs "
            f"({self.node_w / self.ranks_per_node:.0f} W each when all compute; profile {self.profile.name})"
        )

    def binding(self) -> bool:
        """Whether the cap can slow a GPU: below the node's power with every GPU computing at full clock."""
        return self.node_w < self.ranks_per_node * float(self.profile.compute_power_w(1.0))

    def _shares(self, computing: NDArray[np.bool_], ceiling_w: FloatArray, budget: FloatArray) -> FloatArray:
        """Water-filled power of each computing GPU, ``[nodes, g]`` (0 where not computing)."""
        g = computing.shape[1]
        left = budget.copy()
        alloc = np.zeros(computing.shape)
        open_ = computing.copy()
        for _ in range(g):
            n_open = open_.sum(axis=1)
            share = np.where(n_open > 0, left / np.maximum(n_open, 1), 0.0)
            capped = open_ & (ceiling_w <= share[:, None])
            if not capped.any():
                alloc = np.where(open_, share[:, None], alloc)
                break
            alloc = np.where(capped, ceiling_w, alloc)
            left = left - np.where(capped, ceiling_w, 0.0).sum(axis=1)
            open_ = open_ & ~capped
        return alloc

    def run(
        self,
        work_s: FloatArray,
        delay_s: FloatArray,
        *,
        clock_ceiling: FloatArray | None = None,
        arrive_at_s: FloatArray | None = None,
        wait_sleeps: bool = False,
    ) -> CapRun:
        """One iteration's compute and pacing phase, event by event within each node.

        Args:
            work_s: ``float64[num_ranks]`` compute of each rank at the highest clock, seconds.
            delay_s: ``float64[num_ranks]`` pacing delays, seconds.
            clock_ceiling: highest clock fraction each rank may run at (the clock actuator's), or
                None (1).
            arrive_at_s: with the clock actuator, when each rank should enter the collective (its
                compute plus its delay as planned): after its compute it sleeps until then; None:
                it sleeps its delay after its compute (the delay actuator).
            wait_sleeps: whether ranks that arrived sleep (``sleep_wait``) rather than spin.

        Returns:
            The :class:`CapRun`.
        """
        prof = self.profile
        n = work_s.shape[0]
        g = int(self.ranks_per_node)
        pad = (-n) % g
        shape = (-1, g)

        def nodes(x: FloatArray, fill: float) -> FloatArray:
            return np.concatenate([np.asarray(x, dtype=np.float64), np.full(pad, fill)]).reshape(shape)

        left = nodes(work_s, 0.0)  # work left, seconds at the highest clock
        ceiling = nodes(np.ones(n) if clock_ceiling is None else clock_ceiling, 1.0)
        ceiling_w = prof.compute_power_w(ceiling)
        sleep_for = nodes(delay_s, 0.0)
        target = None if arrive_at_s is None else nodes(arrive_at_s, 0.0)
        real = nodes(np.ones(n), 0.0) > 0
        t = np.zeros(left.shape[0])
        finish = np.where(real & (left <= 0), 0.0, np.nan)
        arrival = np.full(left.shape, np.nan)
        energy = np.zeros(left.shape)
        slept = np.zeros(left.shape)
        over = np.zeros(left.shape)
        p_wait = float(prof.sleep_w if wait_sleeps else prof.spin_w)
        p_sleep = float(prof.sleep_w)
        min_w = float(prof.compute_power_w(prof.min_clock_frac))
        sleep_end = np.where(np.isnan(finish), np.inf, self._sleep_end(finish, sleep_for, target))
        arrival = np.where(~np.isnan(finish) & (sleep_end <= 0), 0.0, arrival)
        for _ in range(3 * g + 2):
            computing = real & np.isnan(finish)
            sleeping = real & ~np.isnan(finish) & np.isnan(arrival)
            if not (computing.any() or sleeping.any()):
                break
            waiting = real & ~np.isnan(arrival)
            budget = self.node_w - (sleeping * p_sleep + waiting * p_wait).sum(axis=1)
            alloc = self._shares(computing, ceiling_w, budget)
            clock = np.where(
                computing, np.minimum(prof.clock_for_power(np.maximum(alloc, 0.0)), ceiling), 1.0
            )
            power = np.where(computing, prof.compute_power_w(clock), 0.0)
            # the next event per node: a compute ending, or a sleep ending
            with np.errstate(divide="ignore"):
                t_compute = np.where(computing, left / clock, np.inf)
            t_sleep = np.where(sleeping, sleep_end - t[:, None], np.inf)
            dt = np.minimum(t_compute.min(axis=1), t_sleep.min(axis=1))
            dt = np.where(np.isfinite(dt), np.maximum(dt, 0.0), 0.0)
            step = dt[:, None]
            energy += power * step
            slept += np.where(sleeping, step, 0.0)
            over += np.where(computing & (alloc < min_w - 1e-9), step, 0.0)
            left = np.where(computing, left - clock * step, left)
            t = t + dt
            done = computing & (t_compute <= step * (1 + 1e-12))
            left = np.where(done, 0.0, left)
            finish = np.where(done, t[:, None], finish)
            sleep_end = np.where(done, self._sleep_end(finish, sleep_for, target), sleep_end)
            arrived = (
                real & ~np.isnan(finish) & np.isnan(arrival) & (sleep_end <= t[:, None] * (1 + 1e-12) + 1e-15)
            )
            arrival = np.where(arrived, np.maximum(sleep_end, finish), arrival)
        flat = slice(0, n)
        fin = finish.reshape(-1)[flat]
        work = np.asarray(work_s, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            mean_clock = np.where(fin > 0, work / fin, 1.0)
        return CapRun(
            finish_s=fin,
            arrival_s=arrival.reshape(-1)[flat],
            compute_s=fin,
            sleep_s=slept.reshape(-1)[flat],
            compute_energy_j=energy.reshape(-1)[flat],
            clock_frac=mean_clock,
            over_cap_s=over.reshape(-1)[flat],
        )

    @staticmethod
    def _sleep_end(finish: FloatArray, sleep_for: FloatArray, target: FloatArray | None) -> FloatArray:
        """When a rank that finished computing at ``finish`` enters the collective."""
        if target is None:
            return finish + sleep_for
        return np.maximum(finish, target)
