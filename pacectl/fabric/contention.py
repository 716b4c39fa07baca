"""Timing-dependent fabric models: cross traffic on a max-min fair fat-tree, and early-arrival
interference between co-located ranks.

Both make durations depend on *when* ranks run, which is the only way pacing can change an
iteration's length (see :mod:`pacectl.fabric.base`):

- :class:`ContentionComm`: the data-parallel all-reduce shares leaf uplinks with other jobs' traffic
  that switches on and off; its duration depends on its start time. Pacing moves the start, so it
  can help or hurt, depending on the phase of the cross traffic.
- :class:`EarlyArrivalInterference`: a rank that arrives early waits inside the collective by busy
  polling (NCCL's kernels spin on the GPU and its proxy thread polls the network), and the
  in-flight traffic of its other buckets and prefetches shares the host's PCIe switch and NIC. Both
  steal cycles and I/O bandwidth from a co-located rank that is still computing, so a late rank
  gets later still. A rank that paces instead *sleeps*: no polling, no early traffic; so does a
  rank that waits asleep (``Action.wait``, the ``sleep_wait`` controller). gloo's default TCP pair
  does not poll: it blocks on epoll, so on CPU/gloo a waiting rank already sleeps. CPU-side launch
  delays are a documented straggler cause in production (Lin et al., OSDI 2025, section 6). The
  strength ``kappa`` of the shipped GPU profiles is an assumption of a scenario
  (``interference.kappa_source: assumed``): experiments/interference/README.md records the CPU
  case, and the GPU case is the ``kappa_on_device`` step of experiments/gpu_check. Report a gain
  across a range of ``kappa``, beside ``sleep_wait``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from pacectl.checks import Checked, within
from pacectl.errors import ConfigError
from pacectl.fabric.collectives import allreduce_s, ring_allreduce_s
from pacectl.fabric.topology import FatTree, max_min_fair

FloatArray = NDArray[np.float64]


class SimComm(Protocol):
    """What the simulator needs of a communication model (all classes of this module satisfy it):
    ``name``, ``timing_dependent`` and ``description`` as :class:`~pacectl.fabric.base.CommModel`'s."""

    name: str
    timing_dependent: bool
    description: str

    @property
    def free_time_s(self) -> float:
        """Duration with no cross traffic, seconds."""
        ...

    def time_s(self, start_s: float) -> float:
        """Duration of an all-reduce whose last rank arrives at absolute time ``start_s``, seconds."""
        ...


@dataclass(frozen=True)
class CrossTraffic(Checked):
    """Another job's traffic on chosen links, switching on and off (``cluster.cross_traffic``).

    Args:
        links: link names (see :meth:`FatTree.links`), e.g. ``["leaf_up:0"]``; ``"leaf_up:*"`` means
            every leaf uplink.
        rate_frac: demand of each cross flow as a fraction of its link's capacity, in (0, 1] (a
            greedy bulk transfer is 1).
        on_s: seconds on per period, >= 0. Bursts of other jobs' bulk transfers (checkpoint writes, data
            ingest) last from sub-second to minutes; production shared-fabric measurements in Gopalan
            and Ali motivate on/off cross traffic, the scenario files pick the values.
        off_s: seconds off per period, >= 0 (0 = always on).
        stagger: phase offset between successive links as a fraction of the period, so that links
            do not switch in lockstep.
    """

    section: ClassVar[str] = "cluster.cross_traffic"
    links: tuple[str, ...] = within((), what="a list of link names, e.g. '[leaf_up:*]'")
    rate_frac: float = within(1.0, "(0, 1]")
    on_s: float = within(0.0, ">= 0")
    off_s: float = within(0.0, ">= 0")
    stagger: float = within(0.37, "[0, 1]")

    @property
    def period_s(self) -> float:
        """On plus off time, seconds."""
        return self.on_s + self.off_s

    def state(self, t: float, num_links: int) -> tuple[tuple[bool, ...], float]:
        """Which of ``num_links`` cross flows are on at time ``t`` (link ``i``'s phase offset by
        ``i * stagger`` periods), and the time of the next switch, seconds.

        The state is decided just after ``t`` (a nudge above ``t``'s float resolution) and the next
        switch is strictly after ``t``, so an event loop at a switch always makes progress.
        """
        if num_links == 0 or self.on_s == 0:
            return (False,) * num_links, math.inf
        if self.off_s == 0:
            return (True,) * num_links, math.inf
        period = self.period_s
        nudge = max(1e-9 * period, 4.0 * math.ulp(t))
        phase = (t + nudge + np.arange(num_links) * self.stagger * period) % period
        on = phase < self.on_s
        next_switch = t + nudge + float(np.min(np.where(on, self.on_s, period) - phase))
        return tuple(on.tolist()), max(next_switch, math.nextafter(t, math.inf))


class ContentionComm:
    """All-reduce on a fat-tree with max-min fair sharing and on/off cross traffic (timing-dependent).

    Duration of an all-reduce started at absolute time ``t``: the intra-node phases (NVLink, no
    contention) plus the inter-node ring, whose lock-step steps run at the rate of its slowest flow;
    flow rates are max-min fair shares with the cross flows active at each instant, integrated over
    the on/off switches of the cross traffic.

    Args:
        topology: the cluster.
        num_ranks: ranks in the job (ranks fill nodes in order).
        message_bytes: gradient bytes per rank per iteration (2 bytes per parameter for bf16 gradients:
            2e9 B for a 1B-parameter model).
        alpha_inter_s: network per-message latency, seconds: about 5 us end to end for RDMA through two
            switch hops (NIC plus switch port-to-port latencies of ConnectX-7 / Spectrum class
            datasheets, plus NCCL's protocol overhead as measured by nccl-tests small-message runs).
        alpha_intra_s: NVLink per-message latency, seconds (about 2 us, nccl-tests intra-node).
        cross_traffic: the other jobs' traffic.
    """

    name = "contention"
    timing_dependent = True

    def __init__(
        self,
        topology: FatTree,
        num_ranks: int,
        *,
        message_bytes: float,
        alpha_inter_s: float = 5e-6,
        alpha_intra_s: float = 2e-6,
        cross_traffic: CrossTraffic | None = None,
    ) -> None:
        self.topology = topology
        self.num_ranks = num_ranks
        self.cross = cross_traffic or CrossTraffic()
        names, caps = topology.links(num_ranks)
        self._caps = caps
        self._ring = topology.ring_flows(num_ranks, sparse=True)  # csr: 2 to 4 links per flow
        g = min(topology.ranks_per_node, num_ranks)
        nodes = topology.num_nodes(num_ranks)
        rails = topology.rails()
        # after the intra-node reduce-scatter each GPU holds n/g bytes; the inter-node ring moves
        # 2 (N-1)/N of them per GPU, all g GPUs' share through the node's NIC(s), split over the rails
        self._ring_bytes = 2 * (nodes - 1) / nodes * message_bytes / rails if nodes > 1 else 0.0
        # the fixed part: the NVLink reduce-scatter and all-gather (a ring over the node's g GPUs)
        # and the inter-node ring's latencies
        self._fixed_s = ring_allreduce_s(message_bytes, g, alpha_intra_s, topology.nvlink_bandwidth_Bps)
        self._fixed_s += 2 * (nodes - 1) * alpha_inter_s
        self._cross_links = _expand(self.cross.links, names)
        self._link_offsets = np.arange(len(self._cross_links)) * self.cross.stagger
        self._rate_cache: dict[tuple[bool, ...], float] = {}
        #: why durations cannot vary with timing here (None: they can): then this model is
        #: fixed-duration, as under max-plus, whatever its name says
        self.inert_reason: str | None = self._inert_reason(num_ranks)
        self.timing_dependent = self.inert_reason is None
        self.description = (
            f"contention (max-min fair fat-tree, {topology.ranks_per_node} ranks/node, "
            f"{topology.nodes_per_leaf} nodes/leaf, oversubscription {topology.oversubscription:g}:1"
            f"{', rail-optimized' if topology.rail_optimized else ''}; cross traffic on "
            f"{len(self._cross_links)} link(s), {self.cross.on_s:g} s on / {self.cross.off_s:g} s off)"
        )
        if self.inert_reason:
            self.description += f" [ring duration fixed here: {self.inert_reason}]"

    def _inert_reason(self, num_ranks: int) -> str | None:
        """Why the ring's duration cannot depend on its start time, or None when it can."""
        if not self._cross_links:
            return "no cross-traffic links"
        if not self._ring_bytes:
            return f"{num_ranks} rank(s) fit in one node: no inter-node ring for cross traffic to slow"
        if self.cross.on_s == 0:
            return "cross traffic never on (on_s 0)"
        if self.cross.off_s == 0:
            return "cross traffic always on (off_s 0): a constant slowdown"
        rates: set[float] = set()
        for state in self._states_in_period():
            rates.add(self.ring_rate_Bps(state))
            if len(rates) > 1:
                return None  # the rate changes with the phase: timing-dependent
        # one rate all period: e.g. staggered bursts on many uplinks keep a crossed one always busy
        if rates == {self.ring_rate_Bps((False,) * len(self._cross_links))}:
            return "the cross-traffic links do not slow the ring"
        return (
            "the ring's slowest flow runs at one rate through the whole on/off period (staggered "
            "bursts keep some uplink it crosses busy at every instant): a constant slowdown"
        )

    def _states_in_period(self) -> list[tuple[bool, ...]]:
        """Every combination of cross flows on that occurs during one on/off period, in time order
        (each once)."""
        period = self.cross.period_s
        # link i is on while (t + offset_i * period) mod period < on_s: it switches at these times
        starts = (-self._link_offsets * period) % period
        switches = np.sort(np.concatenate([starts, (starts + self.cross.on_s) % period, [0.0, period]]))
        mids = (switches[:-1] + switches[1:]) / 2
        states: dict[tuple[bool, ...], None] = {}
        for t in mids[np.diff(switches) > 1e-12 * period]:
            phase = (t + self._link_offsets * period) % period
            states.setdefault(tuple((phase < self.cross.on_s).tolist()), None)
        return list(states)

    def ring_rate_Bps(self, cross_on: tuple[bool, ...]) -> float:
        """Rate of the ring's slowest flow when the given cross flows are on, bytes/s."""
        if cross_on not in self._rate_cache:
            import scipy.sparse  # imported by ring_flows(sparse=True) already

            active = [link for link, on in zip(self._cross_links, cross_on, strict=True) if on]
            num_ring = self._ring.shape[0]
            cross = scipy.sparse.csr_array(
                (
                    np.ones(len(active), dtype=bool),
                    (np.arange(len(active)), np.array(active, dtype=np.int64)),
                ),
                shape=(len(active), len(self._caps)),
            )
            incidence = scipy.sparse.vstack([self._ring, cross], format="csr") if len(active) else self._ring
            demand = np.concatenate([np.full(num_ring, np.inf), self.cross.rate_frac * self._caps[active]])
            rates = max_min_fair(self._caps, incidence, demand)
            self._rate_cache[cross_on] = float(rates[:num_ring].min()) if num_ring else math.inf
        return self._rate_cache[cross_on]

    def _state(self, t: float) -> tuple[tuple[bool, ...], float]:
        """The cross flows on at time t and the next switch (:meth:`CrossTraffic.state`)."""
        return self.cross.state(t, len(self._cross_links))

    @property
    def free_time_s(self) -> float:
        """Duration with no cross traffic, seconds."""
        return self._fixed_s + (self._ring_bytes / self._free_rate_Bps if self._ring_bytes else 0.0)

    def time_s(self, start_s: float) -> float:
        """Duration of an all-reduce that starts (last rank arrives) at absolute time ``start_s``, s.

        The ring's bytes are integrated over the cross traffic's switches. The pattern repeats every
        period, so a transfer longer than a period moves the same bytes in each whole period: those
        are skipped in one step, and at most three periods are integrated switch by switch (a burst
        period much shorter than the transfer costs no more than a long one). Always at least
        :attr:`free_time_s`.
        """
        return self._fixed_s + self._transfer_s(float(start_s), self._ring_bytes)

    def scaled_time_s(self, start_s: float, free_s: float) -> float:
        """Duration of a transfer on the ring whose contention-free duration is ``free_s``, started at
        ``start_s``, s: ``free_s`` worth of bytes at the free rate, integrated over the cross traffic
        as in :meth:`time_s` (all of it bandwidth: a recorded time holds no separate latency).

        Used by replay, whose recorded transfers are longer or shorter than this model's own
        message: a long transfer runs into and out of bursts that a short one starting at the same
        time does not see. Equal to ``free_s`` without cross traffic.
        """
        if free_s <= 0 or not self._ring_bytes:
            return free_s
        if self.inert_reason:  # one rate throughout: a plain ratio (exactly free_s without traffic)
            return free_s * (self._free_rate_Bps / self.ring_rate_Bps(self._state(float(start_s))[0]))
        return self._transfer_s(float(start_s), free_s * self._free_rate_Bps)

    @functools.cached_property
    def _free_rate_Bps(self) -> float:
        """Rate of the ring's slowest flow with no cross traffic, bytes/s."""
        return self.ring_rate_Bps(tuple(False for _ in self._cross_links))

    def _transfer_s(self, start: float, total: float) -> float:
        """Time to move ``total`` ring bytes from ``start`` (no fixed latency), s."""
        if not math.isfinite(start):
            raise ValueError(f"start_s must be a finite time in seconds, got {start!r}")
        if total <= 0:
            return 0.0
        if self.inert_reason:  # one rate through the whole transfer
            return total / self.ring_rate_Bps(self._state(start)[0])
        period = self.cross.period_s
        # The pattern repeats every period: integrate on a local axis (start mod period), so that
        # the switch times keep their float resolution however late the transfer starts.
        t0 = start % period
        t, left = self._advance(t0, total, t0 + period)
        skipped = 0.0
        if left > 0:  # longer than a period: skip the whole periods it surely needs
            per_period = total - left
            whole = max(0, math.floor(left / per_period) - 1)
            skipped = whole * period  # t's phase is unchanged by whole periods
            t, left = self._advance(t, left - whole * per_period, math.inf)
        return skipped + (t - t0)

    def _advance(self, t: float, remaining: float, until: float) -> tuple[float, float]:
        """Move ``remaining`` ring bytes from time ``t``, switch by switch, stopping at ``until``.

        Returns:
            ``(time, bytes left)``: the finish time and 0, or ``until`` and the bytes still to move.

        Raises:
            RuntimeError: more switches than the cross traffic can make before ``until`` or the
                finish (a bug, never a silently short transfer).
        """
        for _ in range(8 * len(self._cross_links) + 16):
            if remaining <= 0 or t >= until:
                return t, max(remaining, 0.0)
            state, switch = self._state(t)
            rate = self.ring_rate_Bps(state)
            stop = min(switch, until)
            finish = t + remaining / rate
            if finish <= stop:
                return finish, 0.0
            remaining -= (stop - t) * rate
            t = stop
        raise RuntimeError(f"contention model: no finish after {8 * len(self._cross_links) + 16} switches")


def _expand(patterns: tuple[str, ...], names: list[str]) -> list[int]:
    out: list[int] = []
    for pattern in patterns:
        star = pattern.endswith("*")  # a prefix: "leaf_up:*"
        hits = [i for i, n in enumerate(names) if (n.startswith(pattern[:-1]) if star else n == pattern)]
        if not hits:
            raise ConfigError(
                f"cluster.cross_traffic.links entries must name links of this topology, got {pattern!r}; "
                f"links look like {names[:3] + names[-2:]} ('leaf_up:*': every leaf uplink); "
                "e.g. cluster.cross_traffic.links=[leaf_up:*]"
            )
        out.extend(hits)
    return out


class FixedComm:
    """The null model for simulation: every all-reduce takes ``duration_s`` (max-plus)."""

    name = "null"
    timing_dependent = False

    def __init__(self, duration_s: float) -> None:
        if not (math.isfinite(duration_s) and duration_s >= 0):
            # self.name: AlphaBetaComm passes its closed-form cost through here
            raise ConfigError(
                f"{self.name} comm duration must be a finite number >= 0 seconds, got {duration_s!r}"
            )
        self._time = float(duration_s)
        self.description = "null (fixed durations, max-plus: pacing cannot shorten an iteration)"

    @property
    def free_time_s(self) -> float:
        """The fixed duration, seconds."""
        return self._time

    def time_s(self, start_s: float) -> float:
        """Same at any start time (no timing dependence)."""
        del start_s
        return self._time


class AlphaBetaComm(FixedComm):
    """Closed-form alpha-beta all-reduce cost (ring, tree or hierarchical); timing-independent."""

    name = "alpha_beta"

    def __init__(
        self,
        topology: FatTree,
        num_ranks: int,
        *,
        message_bytes: float,
        algorithm: str = "hierarchical",
        alpha_inter_s: float = 5e-6,
        alpha_intra_s: float = 2e-6,
    ) -> None:
        super().__init__(
            allreduce_s(
                algorithm,
                message_bytes,
                num_ranks,
                topology.ranks_per_node,
                alpha_intra_s=alpha_intra_s,
                bandwidth_intra_Bps=topology.nvlink_bandwidth_Bps,
                alpha_inter_s=alpha_inter_s,
                bandwidth_inter_Bps=topology.nic_bandwidth_Bps * topology.rails(),
            )
        )
        self.description = (
            f"alpha_beta ({algorithm} all-reduce of {message_bytes:.3g} B, closed form; max-plus)"
        )


@dataclass(frozen=True)
class EarlyArrivalInterference:
    """Busy-polling early arrivals slow co-located ranks that are still computing.

    Model: while a peer on the same node waits inside the collective (from its entry until the
    collective starts), a rank that is still computing progresses ``1 + kappa`` times slower per
    waiting peer. To first order in ``kappa`` (peers' entries taken from their unperturbed compute
    times), rank ``s`` finishes at ``W_s + kappa * sum_{r != s on node} max(0, W_s - (W_r + d_r))``,
    where ``W`` is the unperturbed compute time and ``d`` the pacing delay (a pacing rank sleeps and
    does not interfere). Only a peer that *spins* while it waits interferes: a peer that waits
    asleep (:attr:`pacectl.types.Action.wait` ``"sleep"``, the ``sleep_wait`` controller) drops
    out of the sum, so with every rank asleep this term is exactly zero. ``kappa = 0`` is the
    null model. Its values are checked where the config is read (``cluster.interference``,
    :class:`pacectl.fabric.profile.Interference`; the topology's ``ranks_per_node``).

    Args:
        kappa: slowdown per waiting co-located peer, >= 0 (dimensionless).
        ranks_per_node: ranks sharing a host (the interference domain).
        kappa_source: where ``kappa`` comes from: ``"assumed"`` (a scenario choice), or
            ``"measured: <record>"`` naming the measurement's record (e.g.
            ``experiments/interference/results/kappa_cpu.json``); each may carry a note after it.
            Reported beside every simulated result. A command-line override of ``kappa`` should
            set it too (``cluster.interference.kappa_source=assumed``).
    """

    kappa: float = 0.0
    ranks_per_node: int = 8
    kappa_source: str = "assumed"

    def active(self, num_ranks: int) -> bool:
        """Whether it can change any finish time: ``kappa > 0`` and some rank has a peer on its node."""
        return self.kappa > 0.0 and min(self.ranks_per_node, num_ranks) > 1

    def finish_s(
        self, work_s: FloatArray, delay_s: FloatArray, *, spinning: bool | NDArray[np.bool_] = True
    ) -> FloatArray:
        """Compute finish times ``float64[num_ranks]`` given unperturbed work and pacing delays (seconds).

        Args:
            work_s: ``float64[num_ranks]`` unperturbed compute times, seconds.
            delay_s: ``float64[num_ranks]`` pacing delays, seconds.
            spinning: whether each rank busy-polls while it waits in the collective (a bool for
                every rank, or ``bool[num_ranks]``); a sleeping waiter interferes with nobody.
        """
        spin = np.broadcast_to(np.asarray(spinning, dtype=np.bool_), work_s.shape)
        if self.kappa == 0 or self.ranks_per_node == 1 or not spin.any():
            return work_s
        n = work_s.shape[0]
        g = self.ranks_per_node
        pad = (-n) % g
        w = np.concatenate([work_s, np.full(pad, -np.inf)]).reshape(-1, g)
        # a sleeping waiter enters "at infinity": it never waits while a peer computes
        e = np.concatenate([np.where(spin, work_s + delay_s, np.inf), np.full(pad, np.inf)]).reshape(-1, g)
        overlap = w[:, :, None] - e[:, None, :]  # [node, s, r]
        np.maximum(0.0, overlap, out=overlap)
        # a rank is not its own peer: with delays >= 0 that term is already 0 (w - (w + d) <= 0 in
        # floating point too, and a sleeper's is -inf), so only negative delays need it cleared
        if (np.asarray(delay_s) < 0).any():
            idx = np.arange(g)
            overlap[:, idx, idx] = 0.0
        return work_s + self.kappa * overlap.sum(axis=2).reshape(-1)[:n]
