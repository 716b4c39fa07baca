"""Synthetic Flight Recorder dumps and NCCL Inspector logs with a known ground truth.

Written from the documented formats (see :mod:`pacectl.traces.flight_recorder` and
:mod:`pacectl.traces.nccl_inspector`) for what torch 2.13 on CPU cannot produce: NCCL entries with
``duration_ms`` and ``completed`` states, older format versions (2.4 to 2.9), Megatron-LM group
descriptions with TP and PP, hang snapshots of a timeout, and large sets (the import benchmark).

The job: ``dp x pp x tp`` ranks in Megatron's order (``rank = (pp * dp + d) * tp + t``). Each step,
every rank computes for ``compute_s`` (plus ``straggler_s[rank]`` and a little seeded noise), then
issues ``buckets`` gradient collectives on its DP group ``bucket_gap_s`` apart; each ends
``transfer_s`` after its last member arrives (max-plus), and the next step starts at the last one's
end. :class:`SynthTruth` holds the device arrival times the importers must recover. A Flight
Recorder entry's ``time_created_ns`` is the host's enqueue time: ``host_lead_s`` plus up to
``host_jitter_s`` (uniform, seeded) before the device arrives (NCCL's host runs ahead).

Point-to-point ops on the pipeline groups (``pp > 1``) are numbered as ProcessGroupNCCL numbers
them: ``p2p_seq_id`` is the group's ``seqP2P_`` on that rank, bumped before each p2p op is recorded
(so the first is 1) and carried unbumped by collectives; a p2p entry carries the group's current
``collective_seq_id`` unbumped; ``profiling_name`` is ``nccl:send <src>-><dst>`` /
``nccl:recv <dst><-<src>`` in group-local ranks. With ``microbatches = 0`` each step holds one
``send`` from the group's first rank and one ``recv`` on the others (a marker only); with
``microbatches = M`` each step runs a GPipe schedule on every pipeline group: M forward
activations sent stage to stage, then M gradients sent back, spread over the step's compute.
``p2p_in_flight`` adds, on the first stage of every pipeline group, the next step's first forward
send, posted but not yet received when the dumps were taken (its recv is in no dump).
"""

from __future__ import annotations

import json
import pickle
import zlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: Flight Recorder versions and what their dumps differ in (the fields pacectl reads are common).
_THREAD_FIELDS_FROM = (2, 10)
_COMM_LIB_KEY_FROM = (2, 10)
_NCCL_VERSION_KEY_FROM = (2, 7)


@dataclass(frozen=True)
class SynthJob:
    """The synthetic job (module docstring). Times in seconds."""

    dp: int = 4
    pp: int = 1
    tp: int = 1
    steps: int = 6
    buckets: int = 2
    compute_s: float = 0.05
    bucket_gap_s: float = 0.004
    transfer_s: float = 0.002
    straggler_s: dict[int, float] = field(default_factory=dict)
    noise_s: float = 2e-4
    host_lead_s: float = 0.0
    host_jitter_s: float = 0.0
    numel: tuple[int, ...] = ()
    seed: int = 0
    microbatches: int = 0
    p2p_in_flight: bool = False

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    def rank(self, stage: int, dp_rank: int, tp_rank: int = 0) -> int:
        return (stage * self.dp + dp_rank) * self.tp + tp_rank


@dataclass(frozen=True)
class SynthTruth:
    """What happened: ``arrival_s[step, rank, bucket]`` (device), ``end_s[step, rank, bucket]``."""

    arrival_s: NDArray[np.float64]
    end_s: NDArray[np.float64]


def simulate(job: SynthJob) -> SynthTruth:
    """The ground-truth timeline of ``job`` (max-plus, per DP group)."""
    rng = np.random.default_rng(job.seed)
    W, S, K = job.world, job.steps, job.buckets
    arrival = np.zeros((S, W, K))
    end = np.zeros((S, W, K))
    start = np.zeros(W)
    extra = np.array([job.straggler_s.get(r, 0.0) for r in range(W)])
    for s in range(S):
        comp = job.compute_s + extra + rng.normal(0.0, job.noise_s, W).clip(-job.compute_s / 2, None)
        for k in range(K):
            arrival[s, :, k] = start + comp + k * job.bucket_gap_s
        for st in range(job.pp):
            for t in range(job.tp):
                members = [job.rank(st, d, t) for d in range(job.dp)]
                for k in range(K):
                    e = arrival[s, members, k].max() + job.transfer_s
                    if k:
                        e = max(e, end[s, members[0], k - 1] + job.transfer_s)
                    end[s, members, k] = e
        start = end[s, :, K - 1].copy()
    return SynthTruth(arrival, end)


def _groups(job: SynthJob) -> list[tuple[str, str, list[int], str]]:
    """``(name, desc, ranks, role)`` of every group, Megatron's descriptions."""
    out = [("0", "default_pg", list(range(job.world)), "world")]

    def add(desc: str, ranks: list[int], role: str) -> None:
        out.append((str(len(out)), desc, ranks, role))  # groups are numbered in creation order

    for st in range(job.pp):
        for t in range(job.tp):
            add("DATA_PARALLEL_GROUP", [job.rank(st, d, t) for d in range(job.dp)], "dp")
    if job.tp > 1:
        for st in range(job.pp):
            for d in range(job.dp):
                add("TENSOR_MODEL_PARALLEL_GROUP", [job.rank(st, d, t) for t in range(job.tp)], "tp")
    if job.pp > 1:
        for d in range(job.dp):
            for t in range(job.tp):
                add("PIPELINE_MODEL_PARALLEL_GROUP", [job.rank(st, d, t) for st in range(job.pp)], "pp")
    return out


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


class _Entries:
    """One rank's growing entry list, as the recorder fills it."""

    def __init__(
        self, seqs: dict[str, int], *, backend: str, timing: bool, all_scheduled: bool, threads: bool,
        frames: list[dict[str, Any]],
    ) -> None:  # fmt: skip
        self.seqs = seqs
        self.p2p_seqs = dict.fromkeys(seqs, 0)
        self.entries: list[dict[str, Any]] = []
        self.op_id = 0
        self.backend, self.timing, self.all_scheduled = backend, timing, all_scheduled
        self.threads, self.frames = threads, frames

    def add(
        self,
        g: tuple[str, str, list[int], str],
        op: str,
        created_s: float,
        dur_s: float | None,
        sizes: list[list[int]],
        *,
        p2p: bool = False,
        finished: bool = True,
    ) -> None:
        self.op_id += 1
        if p2p:
            self.p2p_seqs[g[0]] += 1
        else:
            self.seqs[g[0]] += 1
        backend = self.backend
        e: dict[str, Any] = {
            "record_id": len(self.entries),
            "pg_id": int(g[0]),
            "process_group": (g[0], g[1]),
            "collective_seq_id": self.seqs[g[0]],
            "p2p_seq_id": self.p2p_seqs[g[0]],
            "op_id": self.op_id,
            "profiling_name": f"{backend}:{op}",
            "time_created_ns": int(round(1.7e18 + created_s * 1e9)),
            "input_sizes": sizes,
            "input_dtypes": ["Float"] * len(sizes),
            "output_sizes": sizes,
            "output_dtypes": ["Float"] * len(sizes),
            "state": "completed" if finished and backend != "gloo" else "scheduled",
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None,
            "retired": finished,
            "timeout_ms": 600000,
            "is_p2p": p2p,
        }
        if dur_s is not None and self.timing and finished and not self.all_scheduled:
            e["duration_ms"] = float(dur_s) * 1e3
        if self.threads:
            e["thread_id"] = "140000000000000"
            e["thread_name"] = "pt_main_thread"
        if self.frames:
            e["frames"] = self.frames
        if self.all_scheduled:
            e["state"], e["retired"] = "scheduled", False
        self.entries.append(e)


def flight_recorder_dumps(
    job: SynthJob,
    *,
    version: str = "2.10",
    backend: str = "nccl",
    timing: bool = True,
    kind: str = "_reduce_scatter_base",
    hang_rank: int | None = None,
    all_scheduled: bool = False,
    frames: int = 0,
    truth: SynthTruth | None = None,
    ranks: range | list[int] | None = None,
) -> dict[int, dict[str, Any]]:
    """One Flight Recorder dump (the recorder's dict) per rank of ``job``.

    Args:
        job: the job.
        version: the format version written (``"2.4"`` ... ``"2.10"``).
        backend: ``profiling_name`` prefix (``nccl``: states ``completed``; ``gloo``: ``scheduled``
            and retired, as ProcessGroupGloo leaves them).
        timing: write ``duration_ms`` (``TORCH_NCCL_ENABLE_TIMING``).
        kind: the gradient collective's op name (``_reduce_scatter_base``, ``all_reduce``).
        hang_rank: this rank never enqueues the last step's last gradient collective, which the others
            wait in (unfinished).
        all_scheduled: every entry ``scheduled``, not retired, no duration (a dump taken on a timeout).
        frames: stack frames per entry (for file size; the importer ignores them).
        truth: the timeline (default: :func:`simulate`).
        ranks: build these ranks' dumps only (default: all; a large set is written in chunks).

    Returns:
        rank -> dump dict (plain values only).
    """
    truth = truth or simulate(job)
    vt = _version_tuple(version)
    groups = _groups(job)
    numel = job.numel or tuple(4096 * (k + 1) for k in range(job.buckets))
    lead_rng = np.random.default_rng(job.seed + 1)
    leads = job.host_lead_s + lead_rng.uniform(0.0, job.host_jitter_s, (job.world, job.steps + 2))
    dumps = {}
    frame_list = [{"name": f"f{i}", "filename": "train.py", "line": i} for i in range(frames)]
    for r in range(job.world) if ranks is None else ranks:
        mine = [g for g in groups if r in g[2]]
        dp_group = next(g for g in mine if g[3] == "dp")
        lead = 0.0
        tp_group = next((g for g in mine if g[3] == "tp"), None)
        pp_group = next((g for g in mine if g[3] == "pp"), None)
        w = _Entries(
            {g[0]: 0 for g in mine}, backend=backend, timing=timing, all_scheduled=all_scheduled,
            threads=vt >= _THREAD_FIELDS_FROM, frames=frame_list,
        )  # fmt: skip
        entry = w.add
        seqs, entries = w.seqs, w.entries
        entry(dp_group, "broadcast", -0.5, 0.001, [[1024]])  # set-up, before the pattern
        for s in range(job.steps):
            lead = float(leads[r, s])
            if tp_group is not None:
                entry(tp_group, "all_reduce", truth.arrival_s[s, r, 0] - 0.01 - lead, 0.0005, [[256]])
            if pp_group is not None and job.microbatches:  # during the step's compute, before its gradients
                begin = truth.end_s[s - 1, r, -1] if s else truth.arrival_s[s, r, 0] - job.compute_s
                _pipeline_p2p(w, pp_group, r, job.microbatches, begin, truth.arrival_s[s, r, 0], lead)
            for k in range(job.buckets):
                last = s == job.steps - 1 and k == job.buckets - 1
                if last and hang_rank is not None and r == hang_rank:
                    continue
                a, hung = truth.arrival_s[s, r, k], last and hang_rank is not None
                entry(dp_group, kind, a - lead, truth.end_s[s, r, k] - a, [[numel[k]]], finished=not hung)
            if pp_group is not None and not job.microbatches:
                op = "send 0->1" if r == pp_group[2][0] else "recv 1<-0"
                entry(pp_group, op, truth.end_s[s, r, -1] - lead, None, [[128]], p2p=True)
        if pp_group is not None and job.microbatches and job.p2p_in_flight and r == pp_group[2][0]:
            posted_s = truth.end_s[-1, r, -1] + 0.01 - lead  # the next step's first send, never received
            entry(pp_group, "send 0->1", posted_s, None, [[128]], p2p=True, finished=False)
        cfg = {g[0]: {"name": g[0], "desc": g[1], "ranks": str(g[2])} for g in mine}
        status = {
            g[0]: {
                "last_enqueued_collective": seqs[g[0]],
                "last_started_collective": seqs[g[0]],
                "last_completed_collective": seqs[g[0]]
                - (1 if hang_rank is not None and g is dp_group and r != hang_rank else 0),
            }
            for g in mine
        }
        dump: dict[str, Any] = {"version": version, "pg_config": cfg, "pg_status": status, "entries": entries}
        if vt >= _COMM_LIB_KEY_FROM:
            dump["comm_lib_version"] = "2.27.5"
        elif vt >= _NCCL_VERSION_KEY_FROM:
            dump["nccl_version"] = "2.21.5"
        dumps[r] = dump
    return dumps


def _pipeline_p2p(
    w: _Entries, g: tuple[str, str, list[int], str], r: int, m: int, begin_s: float, end_s: float, lead: float
) -> None:
    """One rank's p2p ops of one GPipe step on its pipeline group: M activations forward, then M
    gradients back, evenly spread over ``[begin_s, end_s]`` (host times ``lead`` earlier)."""
    i, n = g[2].index(r), len(g[2])
    ops = []
    for _ in range(m):  # forward: receive from the previous stage, send to the next
        if i > 0:
            ops.append(f"recv {i}<-{i - 1}")
        if i < n - 1:
            ops.append(f"send {i}->{i + 1}")
    for _ in range(m):  # backward: gradients from the next stage, to the previous
        if i < n - 1:
            ops.append(f"recv {i}<-{i + 1}")
        if i > 0:
            ops.append(f"send {i}->{i - 1}")
    for j, op in enumerate(ops):
        t = begin_s + (j + 1) / (len(ops) + 1) * (end_s - begin_s)
        w.add(g, op, t - lead, None, [[128]], p2p=True)


def write_flight_recorder(
    dumps: dict[int, dict[str, Any]],
    folder: str | Path,
    *,
    fmt: str = "pickle",
    prefix: str = "nccl_trace_rank_",
) -> list[Path]:
    """Write dumps as torch's writer names them (``<prefix><rank>``; ``.json`` added for JSON).

    JSON is written as ``_dump_fr_trace_json`` does: keys sorted, ``process_group`` a list, the
    ``time_discovered_*`` of an unfinished entry 0.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r, d in sorted(dumps.items()):
        if fmt == "pickle":
            p = out / f"{prefix}{r}"
            p.write_bytes(pickle.dumps(d, protocol=2))
        else:
            p = out / f"{prefix}{r}.json"
            clean = {
                **d,
                "entries": [
                    {
                        **e,
                        "process_group": list(e["process_group"]),
                        "time_discovered_started_ns": e["time_discovered_started_ns"] or 0,
                        "time_discovered_completed_ns": e["time_discovered_completed_ns"] or 0,
                    }
                    for e in d["entries"]
                ],
            }
            p.write_text(json.dumps(clean, sort_keys=True, separators=(",", ":")))
        paths.append(p)
    return paths


def _inspector_line(
    r: int, pid: int, host: str, verbose: bool, g: tuple[str, str, list[int], str], cid: str,
    coll: str, sn: int, size: int, start: float, stop: float,
) -> str:  # fmt: skip
    """One Inspector record (a JSON line) of rank ``r`` in communicator ``g`` (id ``cid``)."""
    perf: dict[str, Any] = {
        "coll": coll,
        "coll_sn": sn,
        "coll_msg_size_bytes": size,
        "coll_exec_time_us": int(round((stop - start) * 1e6)),
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": 100.0,
        "coll_busbw_gbs": 150.0,
    }
    if verbose:
        t0 = int(round(1.7e15 + start * 1e6))
        t1 = int(round(1.7e15 + stop * 1e6))
        perf["event_trace_sn"] = {
            "coll_start_sn": 1,
            "coll_stop_sn": 2,
            "kernel_events": [
                {"channel_id": 0, "kernel_start_sn": 3, "kernel_stop_sn": 4, "kernel_record_sn": 4}
            ],
        }
        perf["event_trace_ts"] = {
            "coll_start_ts": t0 - 5,
            "coll_stop_ts": t0 - 1,
            "kernel_events": [
                {"channel_id": 0, "kernel_start_ts": t0, "kernel_stop_ts": t1, "kernel_record_ts": t1}
            ],
        }
    return json.dumps(
        {
            "header": {
                "id": cid,
                "comm_name": g[1] if g[3] != "world" else "WORLD",
                "rank": g[2].index(r),
                "n_ranks": len(g[2]),
                "nnodes": 1,
            },
            "metadata": {
                "inspector_output_format_version": "v4.0",
                "git_rev": "",
                "rec_mechanism": "nccl_profiler_interface",
                "dump_timestamp_us": int(1.7e15),
                "hostname": host,
                "pid": pid,
            },
            "coll_perf": perf,
        }
    )


def nccl_inspector_logs(
    job: SynthJob,
    folder: str | Path,
    *,
    verbose: bool = True,
    truth: SynthTruth | None = None,
    host: str = "node0",
) -> list[Path]:
    """Write one Inspector log per rank (``<host>-pid<pid>.log``) for ``job``'s DP and world
    communicators, as the plugin's JSON output documents it (format version ``v4.0``)."""
    truth = truth or simulate(job)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    groups = _groups(job)
    numel = job.numel or tuple(4096 * (k + 1) for k in range(job.buckets))
    paths = []
    for r in range(job.world):
        pid = 4000 + r
        world = groups[0]
        dp_group = next(g for g in groups if g[3] == "dp" and r in g[2])
        comm_ids = {g[0]: f"0x{zlib.crc32(repr((g[1], g[2])).encode()):08x}" for g in (world, dp_group)}
        line = partial(_inspector_line, r, pid, host, verbose)
        lines = [line(world, comm_ids[world[0]], "AllReduce", 1, 8192, -0.5, -0.499)]  # a set-up call
        for s in range(job.steps):
            for k in range(job.buckets):
                sn, start, stop = s * job.buckets + k + 1, truth.arrival_s[s, r, k], truth.end_s[s, r, k]
                lines.append(
                    line(dp_group, comm_ids[dp_group[0]], "ReduceScatter", sn, numel[k] * 4, start, stop)
                )
        p = out / f"{host}-pid{pid}.log"
        p.write_text("\n".join(lines) + "\n")
        paths.append(p)
    return paths
