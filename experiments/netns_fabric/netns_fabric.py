"""An emulated fabric: one network namespace per rank, a bridge, a capped uplink, cross traffic.

Run as root (needs iproute2 and ``tc``; ``netem`` is not needed)::

    python experiments/netns_fabric/netns_fabric.py --ranks 4 --iters 60 --rate-mbit 200

Topology (every address lives inside namespaces this script creates, and removes at the end even on
failure or Ctrl-C):

- ``pcf-hub``: a bridge ``pcbr`` (no address);
- ``pcf-r<i>`` (one per rank): ``pceth`` = 10.77.0.<10+i>/24, a veth to the bridge;
- ``pcf-x``: the cross-traffic sender, 10.77.0.200/24, also on the bridge;
- the "uplink" of rank 0 is capped with ``tc tbf`` in both directions (its veth's egress inside
  ``pcf-r0``, and the bridge port's egress in ``pcf-hub``): an oversubscribed link / slow NIC;
- cross traffic: a bounded TCP blaster from ``pcf-x`` to a sink in ``pcf-r0`` (on/off bursts,
  seeded), through the same capped link, during the whole job; or, with ``--cross-job``, a second
  DDP job of the same workload (no pacing, no straggler), one rank in each rank namespace, so that
  its collectives contend with the paced job's on rank 0's capped link (the simulator's
  contention mechanism, with real flows).

Each rank is one elastic agent (``python -m pacectl.torchdist.launch``, one process per namespace,
c10d rendezvous on 10.77.0.10). No pacing and every controller of ``--controllers`` run in the same
job, on the same seed and straggler schedule, interleaved in blocks of ``--block`` iterations (each
run in turn, the order rotating), so that drift in the machine and the cross traffic over the job
reaches every run alike; ``--block 0`` runs them one after the other (records before 2026-12-01).
Results (``metrics.summarize`` per run, ``vs_baseline`` with the paired 95 % half-width of the
throughput change over the blocks, batch means) go to ``--out`` (default ``results/``) as
``netns_results.json`` (or to ``--out`` itself when it names a ``.json`` file).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PREFIX = "pcf-"
SUBNET = "10.77.0"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one command (no shell), return its result."""
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=30)


def preflight() -> str | None:
    """Why this machine cannot run the fabric, or None if it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs iproute2 ({tool} not found)"
    return None


def namespaces() -> list[str]:
    """Namespaces this script owns (by prefix) that exist now."""
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def cleanup() -> None:
    """Delete every namespace this script created (their veths and bridge go with them)."""
    for ns in namespaces():
        sh("ip", "netns", "del", ns, check=False)


def build(num_ranks: int, rate_mbit: float) -> None:
    """Create the namespaces, the bridge, the veths, addresses and the tbf caps."""
    hub = f"{PREFIX}hub"
    sh("ip", "netns", "add", hub)
    sh("ip", "-n", hub, "link", "add", "pcbr", "type", "bridge")
    sh("ip", "-n", hub, "link", "set", "pcbr", "up")
    sh("ip", "-n", hub, "link", "set", "lo", "up")
    members = [(f"{PREFIX}r{i}", f"{SUBNET}.{10 + i}", f"pcp{i}") for i in range(num_ranks)]
    members.append((f"{PREFIX}x", f"{SUBNET}.200", "pcpx"))
    for ns, addr, port in members:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # create the pair inside the member namespace, then move the bridge end to the hub
        sh("ip", "-n", ns, "link", "add", "pceth", "type", "veth", "peer", "name", port)
        sh("ip", "-n", ns, "link", "set", port, "netns", hub)
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "pceth")
        sh("ip", "-n", ns, "link", "set", "pceth", "up")
        sh("ip", "-n", hub, "link", "set", port, "master", "pcbr")
        sh("ip", "-n", hub, "link", "set", port, "up")
    rate = f"{rate_mbit:g}mbit"
    for ns, dev in ((f"{PREFIX}r0", "pceth"), (hub, "pcp0")):
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
           "rate", rate, "burst", "64kb", "latency", "50ms")  # fmt: skip


SINK = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1); s.settimeout(float(sys.argv[2]))
deadline = time.time() + float(sys.argv[2])
try:
    c, _ = s.accept(); c.settimeout(1.0)
    while time.time() < deadline:
        try:
            if not c.recv(1 << 16): break
        except socket.timeout: pass
except OSError: pass
"""

BLASTER = r"""
import random, socket, sys, time
host, duration, on_s, off_s, max_bytes, seed = sys.argv[1], *map(float, sys.argv[2:7])
rng = random.Random(int(seed)); chunk = b"x" * (1 << 16); sent = 0
deadline = time.time() + duration
for _ in range(50):
    try: c = socket.create_connection((host, 5201), timeout=2); break
    except OSError: time.sleep(0.1)
else: sys.exit(0)
try:
    while time.time() < deadline and sent < max_bytes:
        burst_end = time.time() + rng.uniform(0.5, 1.5) * on_s
        while time.time() < min(burst_end, deadline) and sent < max_bytes:
            sent += c.send(chunk)
        time.sleep(rng.uniform(0.5, 1.5) * off_s)
except OSError: pass  # the sink went away first (the job ended): nothing to report
c.close()
"""


def _start_cross_job(
    args: argparse.Namespace, spec: dict[str, Any], work: Path, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    """``--cross-job``: a second DDP job, unpaced and without a straggler, one rank per rank
    namespace (its own rendezvous port), running until it is stopped. Each agent gets its own
    session, so that stopping it stops its ranks too."""
    cross = {
        **spec,
        "runs": [["none", {}]],
        "name": spec["name"] + "-cross-job",
        "workload": {**spec["workload"], "num_iterations": 100_000},
        "straggler": {**spec["straggler"], "prob": 0.0},
        "record_dir": str(work / "cross_records"),
        "interleave_block": 0,
        "seed": args.seed + 1000,
    }
    path = work / "cross_spec.json"
    path.write_text(json.dumps(cross))
    return [
        _start_agent(path, i, args.ranks, 29511, env, work / f"cross_agent{i}.log", own_session=True)
        for i in range(args.ranks)
    ]


def _start_agent(
    spec_path: Path,
    rank: int,
    num_ranks: int,
    port: int,
    env: dict[str, str],
    log_path: Path,
    *,
    own_session: bool,
) -> subprocess.Popen[bytes]:
    """One elastic agent in rank ``rank``'s namespace (static rendezvous on rank 0's address)."""
    cmd = ["ip", "netns", "exec", f"{PREFIX}r{rank}", sys.executable, "-m", "pacectl.torchdist.launch",
           "--spec", str(spec_path), "--nnodes", str(num_ranks), "--rdzv", f"{SUBNET}.10:{port}",
           "--local-addr", f"{SUBNET}.{10 + rank}", "--ifname", "pceth", "--node-rank", str(rank)]  # fmt: skip
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=own_session)


def _stop(agents: list[subprocess.Popen[bytes]]) -> None:
    """Stop agents started in their own sessions, ranks included: SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for a in agents:
            if a.poll() is None:
                try:
                    os.killpg(a.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        while time.time() < deadline and any(a.poll() is None for a in agents):
            time.sleep(0.2)
    for a in agents:
        if a.poll() is None:
            a.wait(timeout=10)


def run_job(
    args: argparse.Namespace, controllers: list[tuple[str, dict[str, Any]]], work: Path
) -> dict[str, Any]:
    """Start one agent per rank namespace (and the cross traffic), wait, collect the episodes."""
    import dataclasses

    from pacectl import metrics
    from pacectl.torchdist.core import TorchConfig

    record_dir = work / "records"
    torch_cfg = dataclasses.asdict(TorchConfig())  # backend=torch's defaults
    workload = {**torch_cfg["workload"], "num_iterations": args.iters, "warmup_iterations": 5}
    workload["width"] = args.width
    spec = {
        "runs": [[f, p] for f, p in controllers],
        "seed": args.seed,
        "name": f"netns-{args.ranks}r-{args.rate_mbit:g}mbit",
        "workload": workload,
        "straggler": {**torch_cfg["straggler"], "prob": args.straggler_prob},
        "guard": {"max_delay_frac": 0.5, "window_iters": 32, "max_delay_s": None},
        "pacing": {**torch_cfg["pacing"]},
        "pg_timeout_s": 60.0,
        "record_dir": str(record_dir),
        "comm_model": f"live-gloo-netns-tbf{args.rate_mbit:g}mbit",
        "threads": 1,
        "start_method": "spawn",
        "interleave_block": args.block,
    }
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    budget_s = args.timeout_s
    background: list[subprocess.Popen[bytes]] = []  # --cross-job's agents (own sessions)
    try:
        if args.cross_job:
            background = _start_cross_job(args, spec, work, env)
            time.sleep(args.cross_job_lead_s)  # its ranks up and all-reducing before the paced job
        if args.cross_on_s > 0:
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}r0", sys.executable, "-c", SINK, f"{SUBNET}.10", str(budget_s)]))  # fmt: skip
            time.sleep(0.3)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}x", sys.executable, "-c", BLASTER, f"{SUBNET}.10", str(budget_s),
                 str(args.cross_on_s), str(args.cross_off_s), str(20e9), str(args.seed)]))  # fmt: skip
        agents = [
            _start_agent(spec_path, i, args.ranks, 29500, env, work / f"agent{i}.log", own_session=False)
            for i in range(args.ranks)
        ]
        procs += agents
        deadline = time.time() + budget_s
        try:
            for a in agents:
                a.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
        codes = [a.poll() for a in agents]
        if any(c != 0 for c in codes):
            tails = "\n".join(
                (work / f"agent{i}.log").read_text(errors="replace")[-1500:] for i in range(args.ranks)
            )
            raise RuntimeError(f"agents exited with {codes}:\n{tails}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        _stop(background)
    runs, vs, episodes = {}, {}, {}
    for family, _ in controllers:
        with open(record_dir / f"{family}.episode.pkl", "rb") as fh:
            data = pickle.load(fh)
        episodes[family] = data["episode"]
        runs[family] = metrics.summarize(data["episode"])
        runs[family]["gather_median_s"] = float(sorted(data["gather_s"])[len(data["gather_s"]) // 2])
    # batch means over the interleave blocks (the warm-up opens the first one), as a live run does
    blocks = metrics.interval_blocks(args.block, workload["warmup_iterations"])
    for family in runs:
        if family != "none":
            vs[family] = metrics.compare(runs["none"], runs[family])
            vs[family]["throughput_change_ci95_frac"] = metrics.paired_change_ci95_frac(
                episodes["none"], episodes[family], block=blocks[0], offset=blocks[1]
            )
    return {"spec": spec, "runs": runs, "vs_baseline": vs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0]
        + " Needs root and iproute2; removes what it creates. About 3 minutes with the defaults on 2 cores.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--ranks", type=int, default=4, help="gloo ranks, one network namespace each")
    parser.add_argument("--iters", type=int, default=60, help="measured iterations per run")
    parser.add_argument("--width", type=int, default=512, help="MLP width of the built-in workload")
    parser.add_argument(
        "--rate-mbit", type=float, default=200.0, help="tc tbf cap of rank 0's uplink, Mbit/s"
    )
    parser.add_argument(
        "--cross-on-s",
        type=float,
        default=0.3,
        help="mean burst length of the cross traffic (TCP, as fast as the capped link allows), s "
        "(0: no cross traffic)",
    )
    # the old, misleading spelling, still accepted
    parser.add_argument("--cross-mbit-on-s", dest="cross_on_s", type=float, help=argparse.SUPPRESS)
    parser.add_argument(
        "--cross-job",
        action="store_true",
        help="cross traffic from a second DDP job (same workload, no pacing) sharing rank 0's capped "
        "link, instead of the TCP blaster",
    )
    parser.add_argument(
        "--cross-job-lead-s",
        type=float,
        default=20.0,
        help="seconds the second job runs before the paced job starts",
    )
    parser.add_argument(
        "--cross-off-s", type=float, default=0.3, help="mean pause between cross-traffic bursts, s"
    )
    parser.add_argument(
        "--straggler-prob",
        type=float,
        default=0.3,
        help="per-iteration probability that rank 1 sleeps (20 ms +-50 %%, the built-in injector's default)",
    )
    parser.add_argument(
        "--controllers", default="threshold,pid,ewma,quantile,forecast", help="comma-separated families"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload, straggler and cross-traffic seed")
    parser.add_argument(
        "--block",
        type=int,
        default=10,
        help="interleave the runs in blocks of this many iterations (0: one run after the other)",
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up on the job after this long")
    parser.add_argument(
        "--out",
        default=str(HERE / "results"),
        help="results folder (written as netns_results.json) or a .json file; the default is the committed record",
    )
    args = parser.parse_args(argv)
    if args.cross_job:
        args.cross_on_s = 0.0  # the second job is the cross traffic
    if args.block < 0:
        parser.error(f"--block must be an integer >= 0 (0: one run after the other), got {args.block}")
    reason = preflight()
    if reason:
        print(f"netns_fabric: skipped: {reason}", file=sys.stderr)
        return 77
    sys.path.insert(0, str(REPO))
    from omegaconf import OmegaConf

    from pacectl.config import shipped_controller

    # the job runs the live default exchange (gather=auto: async on gloo), which auto horizons follow
    live = OmegaConf.create({"backend": {"name": "torch", "pacing": {"gather": "auto", "gather_every": 1}}})
    controllers: list[tuple[str, dict[str, Any]]] = [("none", {})]
    for fam in [c for c in args.controllers.split(",") if c and c != "none"]:
        controllers.append((fam, shipped_controller(fam, live)))

    def on_signal(signum: int, frame: Any) -> None:
        cleanup()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cleanup()  # leftovers of an earlier crash
    t0 = time.time()
    try:
        build(args.ranks, args.rate_mbit)
        with tempfile.TemporaryDirectory(prefix="pcf-") as tmp:
            result = run_job(args, controllers, Path(tmp))
    finally:
        cleanup()
    result["wall_time_s"] = time.time() - t0
    result["command"] = " ".join(
        ["python", "experiments/netns_fabric/netns_fabric.py", *(argv or sys.argv[1:])]
    )
    if args.cross_job:
        cross = (
            f"cross traffic: a second {args.ranks}-rank DDP job of the same workload (no pacing, no "
            "straggler), one rank in each rank namespace, its collectives on the same capped link"
        )
    elif args.cross_on_s > 0:
        cross = (
            f"cross traffic TCP bursts (~{args.cross_on_s}s on / ~{args.cross_off_s}s off) from a fifth "
            "namespace to a sink in rank 0's namespace"
        )
    else:
        cross = "no cross traffic: the job's own flows alone on the capped link"
    result["topology"] = (
        f"{args.ranks} ranks, one netns each, on a bridge; rank-0 link capped at {args.rate_mbit:g} Mbit/s "
        f"(tc tbf both ways); {cross}"
    )
    out = Path(args.out)
    path = out if out.suffix == ".json" else out / "netns_results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=2, default=float) + "\n")
    partial.replace(path)  # never a half-written record
    print(f"results: {path}")
    for fam, s in result["runs"].items():
        vs = result["vs_baseline"].get(fam)
        change = (
            f" throughput {100 * vs['throughput_change_frac']:+.1f} ±{100 * vs['throughput_change_ci95_frac']:.1f} %"
            if vs
            else ""
        )
        print(f"{fam:10s} mean {s['iteration_time_mean_s']:.4f}s p99 {s['iteration_time_p99_s']:.4f}s "
              f"cv {s['cv']:.3f} spread p50 {s['spread_median_s']:.4f}s delay {s['pacing_delay_total_s']:.3f}s{change}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
