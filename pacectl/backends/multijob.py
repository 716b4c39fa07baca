"""Several jobs on one fabric (``backend=sim`` with a profile that has ``jobs``): each job its own
ranks, compute and noise models, message size, clock and controller; their collectives' flows share
links through the max-min fair model, so each job's communication slows the others' and each job's
pacing moves what the others meet.

Each job is one pacing domain and runs on its own clock (``independent_clocks``;
:func:`pacectl.loop.run_episode` drives it). One iteration of job ``j``, started at ``t``::

    W_r      compute time of rank r (the job's ComputeModel, drawn up front)
    c_r      W_r plus early-arrival interference from the job's own co-located spinning waiters
    a_r      c_r + d_r (d_r: the pacing delay of the job's action)
    S        t + max_r a_r: the all-reduce starts when the job's last rank arrives
    ring     the job's ring moves ring_bytes per flow at its max-min fair rate, which changes
             whenever another job's ring (or the cross traffic) starts or stops on a shared link
    E        end of the ring transfer + the fixed part (NVLink phases, latencies; no network link)
    iteration time = E - t; the next iteration starts at E

The simulation is event-driven: between events (a job's all-reduce starting, a ring finishing, a
cross-traffic switch) every rate is constant, so it is exact up to float rounding. The
competitor is therefore a periodic, reacting job: a job slowed by another stretches its own
period, which moves its next collective. The open-loop alternative, a square wave that never
reacts, is ``cluster.cross_traffic`` (on/off greedy flows on the named links), as in the
single-job simulator; the two can be combined.

What a delay can do here (:mod:`pacectl.fabric`): a per-rank delay within earliness leaves ``S``
where it was, so it meets the same traffic; a delay of every rank of a job (``controller=phase``)
moves ``S`` and can interleave the job's ring with another's.

``comm=null`` (and ``alpha_beta``): every job's all-reduce takes its quiet-fabric time, the jobs
share nothing, and no delay can shorten an iteration (max-plus per job).

Limits (refused with a clear message, or stated): no ``backend.record`` traces, no node power cap,
the delay actuator only; a job that runs past its drawn compute times (3 x ``num_iterations``:
it outpaces the slowest job by more than 3x) reuses them from the start.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from pacectl.errors import BackendError, ConfigError, plural
from pacectl.fabric.contention import CrossTraffic, EarlyArrivalInterference, _expand
from pacectl.fabric.jobs import JobFabric, JobSpec, job_fabric, shared_links
from pacectl.fabric.power import PowerProfile, check_actuator, power_profile
from pacectl.fabric.topology import FatTree, max_min_fair
from pacectl.types import Action, Backend, Domain, IntArray, Observation, RankCompute

#: The comm models the multi-job simulator takes.
MULTIJOB_COMMS = ("null", "alpha_beta", "contention")


class MultiJobSimBackend(Backend):
    """Several jobs sharing one fat-tree (``Backend`` protocol, ``independent_clocks``).

    Args:
        jobs: the jobs (:func:`pacectl.fabric.jobs.parse_jobs`).
        topology: the fabric.
        fabric_ranks: ranks the fabric holds (its links: :meth:`FatTree.links`).
        num_iterations: iterations each job records, >= 1.
        comm: ``"contention"`` (shared links, max-min fair) or ``"null"`` / ``"alpha_beta"``
            (each job's quiet-fabric time, fixed).
        interference: early-arrival interference within each job's nodes (contention only).
        cross_traffic: open-loop on/off traffic on named links (contention only), or None.
        alpha_inter_s, alpha_intra_s: latencies of the all-reduce, seconds.
        power: the GPUs' power profile (energy accounting).
        actuator: ``"delay"`` only.

    Example:
        >>> from pacectl.fabric.jobs import JobSpec
        >>> from pacectl.fabric.noise import ComputeModel
        >>> topo = FatTree(ranks_per_node=2, nodes_per_leaf=2, oversubscription=2.0)
        >>> a = JobSpec("a", (0, 1, 4, 5), ComputeModel(0.3), 5e9)
        >>> b = JobSpec("b", (2, 3, 6, 7), ComputeModel(0.3), 5e9, start_s=0.05)
        >>> sim = MultiJobSimBackend([a, b], topo, 8, num_iterations=5)
        >>> sim.reset(seed=0)
        >>> [o.domain for o in sim.step([Action.zeros(4), Action.zeros(4)])]
        [0]
    """

    name = "sim"
    independent_clocks = True

    def __init__(
        self,
        jobs: Sequence[JobSpec],
        topology: FatTree,
        fabric_ranks: int,
        *,
        num_iterations: int,
        comm: str = "contention",
        interference: EarlyArrivalInterference | None = None,
        cross_traffic: CrossTraffic | None = None,
        alpha_inter_s: float = 5e-6,
        alpha_intra_s: float = 2e-6,
        power: PowerProfile | None = None,
        actuator: str = "delay",
    ) -> None:
        if (
            isinstance(num_iterations, bool)
            or not isinstance(num_iterations, (int, np.integer))
            or num_iterations < 1
        ):
            raise ConfigError(f"backend.num_iterations must be an integer >= 1, got {num_iterations!r}")
        if comm not in MULTIJOB_COMMS:
            raise ConfigError(f"comm must be one of {list(MULTIJOB_COMMS)} with several jobs, got {comm!r}")
        if check_actuator(actuator) != "delay":
            raise ConfigError(
                "backend.actuator must be delay with several jobs on one fabric (cluster.jobs), got "
                f"{actuator!r}; the clock actuator is modelled by the single-job simulator only"
            )
        self.jobs = tuple(jobs)
        self.topology = topology
        self.fabric_ranks = int(fabric_ranks)
        self._num_iterations = int(num_iterations)
        self.contended = comm == "contention"
        self.comm_model = comm
        self.actuator = "delay"
        self.record = False
        self.power = power if power is not None else power_profile(None)
        self.power_cap = None
        self.interference = (
            (interference or EarlyArrivalInterference(0.0))
            if self.contended
            else EarlyArrivalInterference(0.0, topology.ranks_per_node)
        )
        names, self._caps = topology.links(self.fabric_ranks)
        self.link_names = names
        self.fabrics: tuple[JobFabric, ...] = tuple(
            job_fabric(
                topology, j, self.fabric_ranks, alpha_inter_s=alpha_inter_s, alpha_intra_s=alpha_intra_s
            )
            for j in self.jobs
        )
        self.cross = (cross_traffic or CrossTraffic()) if self.contended else CrossTraffic()
        self._cross_links = _expand(self.cross.links, names) if self.cross.links else []
        self._cross_on = bool(self._cross_links) and self.cross.on_s > 0
        self.shared = shared_links(topology, self.fabrics, self.fabric_ranks) if self.contended else []
        # domains: each job's ranks, in job order, as columns 0..n-1
        domains: list[Domain] = []
        labels: list[int] = []
        start = 0
        for job in self.jobs:
            domains.append(Domain(name=job.name, ranks=tuple(range(start, start + len(job.ranks)))))
            labels.extend(job.ranks)
            start += len(job.ranks)
        self.domains: tuple[Domain, ...] = tuple(domains)
        self.rank_labels: IntArray = np.asarray(labels, dtype=np.int64)
        self.num_ranks = len(labels)
        self.step_ids: IntArray = np.arange(self._num_iterations, dtype=np.int64)
        interfering = self.contended and any(self.interference.active(len(j.ranks)) for j in self.jobs)
        crossing = self._cross_on and any(
            f.weights[self._cross_links].any() for f in self.fabrics if f.ring_bytes > 0
        )
        self.mechanisms: tuple[str, ...] = tuple(
            name
            for name, on in (
                ("shared_links", bool(self.shared)),
                ("cross_traffic", crossing),
                ("early_arrival_interference", interfering),
            )
            if on
        )
        self.comm_timing_dependent = bool(self.mechanisms)
        self.comm_description = self._description()
        # compute times drawn per job: 3 x num_iterations (+8), whatever the other jobs, so a job
        # draws the same times alone and among others; a job that outpaces the slowest by more than
        # that (its draws exhausted while the slowest still records) reuses them from the start
        self._draws = [3 * self._num_iterations + 8] * len(self.jobs)
        self._rate_cache: dict[tuple[tuple[int, ...], tuple[bool, ...]], np.ndarray] = {}
        self._started = False

    def _description(self) -> str:
        t = self.topology

        def settings(j: JobSpec) -> str:
            """What else the job's entry (or ``cluster.per_job``) set: its start, pinned controller
            and own controller parameters."""
            return (
                (f", starts at {j.start_s:g} s" if j.start_s else "")
                + (f", controller pinned to {j.controller}" if j.controller else "")
                + "".join(f", its {family} {dict(p)}" for family, p in j.controller_params.items())
            )

        jobs = " | ".join(
            f"job {j.name}: {len(j.ranks)} ranks on nodes {list(j.nodes(t.ranks_per_node))}, compute "
            f"{j.compute.compute_s:g} s ({plural(len(j.compute.components), 'noise component')}), "
            f"{j.message_bytes:.3g} B all-reduced, quiet all-reduce {1e3 * f.quiet_s:.3g} ms{settings(j)}"
            for j, f in zip(self.jobs, self.fabrics, strict=True)
        )
        if not self.contended:
            return (
                f"{self.comm_model} with {len(self.jobs)} jobs ({jobs}): every all-reduce takes its quiet-fabric "
                "time, the jobs share nothing (max-plus per job: pacing cannot shorten an iteration)"
            )
        text = (
            f"contention, {len(self.jobs)} jobs on one max-min fair fat-tree ({t.ranks_per_node} ranks/node, "
            f"{t.nodes_per_leaf} nodes/leaf, oversubscription {t.oversubscription:g}:1) running {jobs}"
        )
        if self.shared:
            text += "; shared links: " + "; ".join(
                f"{self.jobs[i].name}+{self.jobs[j].name} on {', '.join(links)}"
                for i, j, links in self.shared
            )
        else:
            text += "; no two jobs' rings slow each other"
        if self._cross_on:
            text += f"; open-loop cross traffic on {len(self._cross_links)} link(s), {self.cross.on_s:g} s on / {self.cross.off_s:g} s off"
        if any(self.interference.active(len(j.ranks)) for j in self.jobs):
            text += f" + early-arrival interference (kappa {self.interference.kappa:g})"
        return text

    @property
    def num_iterations(self) -> int:
        """Iterations each job records per episode."""
        return self._num_iterations

    @property
    def job_shift_note(self) -> str | None:
        """Why a job-level shift cannot change any duration here, or None when it can."""
        if not self.contended:
            return f"comm={self.comm_model}: fixed durations, the jobs' collectives share nothing"
        if self.shared or (self._cross_on and "cross_traffic" in self.mechanisms):
            return None
        if len(self.jobs) == 1:
            return "one job on the fabric and no cross traffic on its ring's links"
        return "no two jobs' rings share a link that slows them, and no cross traffic on their links"

    # ---- the episode ------------------------------------------------------------------------

    def reset(self, *, seed: int = 0) -> None:
        """Draw each job's compute times (``default_rng([seed, 17, crc32(job name)])``: a job draws the
        same times whichever other jobs share the fabric, so a job alone pairs with it among others)
        and rewind every clock."""
        self._work = [
            job.compute.sample(
                np.random.default_rng([seed, 17, zlib.crc32(job.name.encode())]),
                self._draws[j],
                len(job.ranks),
            )
            for j, job in enumerate(self.jobs)
        ]
        n = len(self.jobs)
        self._t = 0.0
        self._count = [0] * n
        self._iter_start = np.array([j.start_s for j in self.jobs], dtype=np.float64)
        self._comm_start = np.full(n, np.inf)  # S: when the ring starts (known once actions are in)
        self._left = np.zeros(n)  # ring bytes still to move
        self._end = np.full(n, np.inf)  # E
        self._phase = ["idle"] * n  # idle (before its start) | compute | ring | tail
        self._pending: list[dict[str, np.ndarray] | None] = [None] * n
        self._ready = list(range(n))
        self._started = True

    def step(self, actions: Sequence[Action]) -> list[Observation]:
        """Pace the next iteration of the jobs returned last (every job on the first call), then run
        until some job ends an iteration; return the observations of the jobs that ended one then.

        Raises:
            BackendError: before ``reset``, or with a bad action.
        """
        if not self._started:
            raise BackendError("step() must be called after reset()")
        if len(actions) != len(self.jobs):
            raise BackendError(f"step() needs one action per job ({len(self.jobs)}), got {len(actions)}")
        for j in self._ready:
            self._begin(j, actions[j])
        self._ready = []
        done = self._advance()
        out = []
        for j in done:
            rec = self._pending[j]
            assert rec is not None
            start, end = self._iter_start[j], self._end[j]
            last = self._comm_start[j] - start
            out.append(
                Observation(
                    iteration=self._count[j],
                    domain=j,
                    arrival_s=rec["arrival"],
                    applied_delay_s=rec["delay"],
                    natural_arrival_s=rec["finish"],
                    wait_s=last - rec["arrival"],
                    iteration_time_s=float(end - start),
                    collective_time_s=float(end - self._comm_start[j]),
                    compute=RankCompute(
                        compute_s=rec["finish"],
                        pre_arrival_compute_s=rec["finish"],
                        clock_frac=np.ones_like(rec["finish"]),
                        sleep_s=rec["delay"],
                    ),
                )
            )
            self._count[j] += 1
            self._iter_start[j] = end
            self._phase[j] = "idle"
            self._ready.append(j)
        return out

    def _begin(self, j: int, action: Action) -> None:
        job = self.jobs[j]
        n = len(job.ranks)
        delay = np.asarray(action.delay_s, dtype=np.float64)
        if delay.shape != (n,) or not np.isfinite(delay).all() or (delay < 0).any():
            raise BackendError(
                f"job {job.name}'s action must hold {n} finite delays >= 0, got shape {delay.shape}"
            )
        work = self._work[j][self._count[j] % self._draws[j]]
        finish = self.interference.finish_s(work, delay, spinning=action.wait != "sleep")
        arrival = finish + delay
        self._pending[j] = {"finish": finish, "delay": delay.copy(), "arrival": arrival}
        self._comm_start[j] = self._iter_start[j] + float(arrival.max())
        self._phase[j] = "compute"
        self._end[j] = np.inf

    def _rates(self, ring: tuple[int, ...], cross: tuple[bool, ...]) -> np.ndarray:
        """Ring rate (bytes/s per flow) of each job in ``ring`` with the cross flows ``cross`` on."""
        key = (ring, cross)
        if key not in self._rate_cache:
            rows = [self.fabrics[j].weights for j in ring]
            demand = [math.inf] * len(ring)
            for on, link in zip(cross, self._cross_links, strict=True):
                if on:
                    row = np.zeros(len(self._caps))
                    row[link] = 1.0
                    rows.append(row)
                    demand.append(self.cross.rate_frac * float(self._caps[link]))
            rates = max_min_fair(self._caps, np.vstack(rows), np.asarray(demand))
            self._rate_cache[key] = rates[: len(ring)]
        return self._rate_cache[key]

    def _advance(self) -> list[int]:
        """Run events until at least one job ends an iteration; return those jobs (in job order)."""
        n = len(self.jobs)
        for _ in range(1_000_000):
            t = self._t
            # phase changes due now: start rings, end tails
            for j in range(n):
                if self._phase[j] == "compute" and self._comm_start[j] <= t:
                    fab = self.fabrics[j]
                    if self.contended and fab.ring_bytes > 0:
                        self._phase[j], self._left[j] = "ring", fab.ring_bytes
                    else:
                        # null: the whole quiet-fabric time; contention within a node: the fixed part
                        self._phase[j] = "tail"
                        self._end[j] = self._comm_start[j] + (fab.fixed_s if self.contended else fab.quiet_s)
            finished = [j for j in range(n) if self._phase[j] == "tail" and self._end[j] <= t]
            if finished:
                return finished
            ring = tuple(j for j in range(n) if self._phase[j] == "ring")
            cross, switch = self.cross.state(t, len(self._cross_links)) if ring else ((), math.inf)
            rates = self._rates(ring, cross) if ring else np.zeros(0)
            # the next event
            nxt = switch
            for j in range(n):
                if self._phase[j] == "compute":
                    nxt = min(nxt, self._comm_start[j])
                elif self._phase[j] == "tail":
                    nxt = min(nxt, self._end[j])
            ring_done = [t + self._left[j] / r for j, r in zip(ring, rates, strict=True)]
            if ring_done:
                nxt = min(nxt, min(ring_done))
            if not math.isfinite(nxt):
                raise BackendError("multi-job simulation has no next event (a bug: no job is running)")
            nxt = max(nxt, t)
            for j, r, fin in zip(ring, rates, ring_done, strict=True):
                if fin <= nxt:
                    self._left[j] = 0.0
                    self._phase[j] = "tail"
                    self._end[j] = fin + self.fabrics[j].fixed_s
                else:
                    self._left[j] -= r * (nxt - t)
            self._t = nxt
        raise BackendError("multi-job simulation: no iteration ended after 1,000,000 events (a bug)")
