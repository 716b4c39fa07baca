"""Start the ranks through torch's elastic launcher API (``torch.distributed.launcher.api``).

One :func:`launch_workers` call runs one elastic agent (this process) that starts
``nproc_per_node`` worker processes on this node, rendezvous ``c10d`` at ``rdzv_endpoint``
(``127.0.0.1:<free port>`` by default), with no restarts: a rank that dies stops the job, and the
failure comes back as a :class:`~pacectl.errors.BackendError` naming the first failed rank.

Several nodes (one agent per network namespace, as ``experiments/netns_fabric`` does) use
``python -m pacectl.torchdist.launch --spec spec.json --nnodes N --rdzv HOST:PORT --local-addr ADDR``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pacectl.errors import BackendError
from pacectl.torchdist.core import FAULT_EXIT_CODE, is_peer_error


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _proc_state(pid: int) -> str | None:
    """The one-letter scheduler state of ``pid`` (``/proc/<pid>/stat``), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def _announced_ranks(folder: Path) -> dict[int, int]:
    """``{pid: global rank}`` of the workers that wrote their pid into ``folder`` (one file per rank)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return {}
    found: dict[int, int] = {}
    for entry in entries:
        with contextlib.suppress(OSError, ValueError):  # removed, or not written yet
            found[int(entry.read_text())] = int(entry.name)
    return found


class FrozenRankWatch:
    """Ends a job whose rank stopped answering: a worker held in the stopped state (``SIGSTOP``, state
    ``T``) for ``frozen_s`` seconds is killed, and the job's error names it.

    Without it, the peers of a frozen rank wait ``backend.pg_timeout_s`` in their collective, their
    gloo timeout then blames a healthy rank, and the agent waits a further 30 s for the frozen rank to
    answer its SIGTERM (63 s in all at the default 30 s). Killing the frozen rank closes its sockets,
    so the peers fail at once with a lost peer, within ``pg_timeout_s``. Linux only (``/proc``);
    elsewhere it watches nothing.

    Args:
        frozen_s: seconds a rank may stay stopped (default: half of ``pg_timeout_s``).
        pid_dir: the folder where each rank writes its pid (``spec["pid_dir"]``, file named by rank).
        poll_s: seconds between looks.
    """

    def __init__(self, frozen_s: float, pid_dir: Path, poll_s: float = 0.25) -> None:
        self.frozen_s = float(frozen_s)
        self.pid_dir = pid_dir
        self.poll_s = float(poll_s)
        self.frozen: tuple[int, int, float] | None = None  #: (rank, pid, seconds stopped), once found
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pacectl-frozen-rank-watch")

    def __enter__(self) -> FrozenRankWatch:
        if Path("/proc/self/stat").exists():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        since: dict[int, float] = {}
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            ranks = _announced_ranks(self.pid_dir)
            for pid, rank in ranks.items():
                if _proc_state(pid) in ("T", "t"):
                    start = since.setdefault(pid, now)
                    if now - start >= self.frozen_s and self.frozen is None:
                        self.frozen = (rank, pid, now - start)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                else:
                    since.pop(pid, None)

    def message(self) -> str:
        """The error naming the frozen rank (call only when :attr:`frozen` is set)."""
        assert self.frozen is not None
        rank, pid, held = self.frozen
        return (
            f"torch backend: rank {rank} (pid {pid}) stopped answering: it was held stopped (state T, e.g. by "
            f"SIGSTOP or a debugger) for {held:.1f} s, so it was killed and the job was stopped, within "
            "backend.pg_timeout_s; the other ranks only lost their peer. Resume the process (SIGCONT) sooner, "
            "or raise backend.pg_timeout_s if pauses are expected"
        )


def launch_workers(
    spec: dict[str, Any],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    local_addr: str = "127.0.0.1",
    start_method: str = "spawn",
    rdzv_timeout_s: int = 60,
    socket_ifname: str | None = "lo",
    omp_num_threads: int = 1,
    log_dir: str | None = None,
    is_host: bool | None = None,
    node_rank: int | None = None,
    entrypoint: Callable[[dict[str, Any]], Any] | None = None,
    frozen_s: float | None = None,
) -> dict[int, Any]:
    """Run :func:`pacectl.torchdist.worker.worker_main` on every rank via ``elastic_launch``.

    Args:
        spec: the worker spec (plain dict, pickled to every rank).
        nproc_per_node: ranks started by this agent, >= 1.
        nnodes: agents in the rendezvous (one per node or network namespace).
        rdzv_endpoint: ``host:port`` of the c10d rendezvous (default: a free port on 127.0.0.1).
        local_addr: address of this node, used as the master address for the process group.
        start_method: ``"spawn"`` or ``"fork"``.
        rdzv_timeout_s: rendezvous timeout, seconds.
        socket_ifname: ``GLOO_SOCKET_IFNAME`` for the workers (None: leave unset).
        omp_num_threads: ``OMP_NUM_THREADS`` for the workers.
        log_dir: where the workers' stdout/stderr go (default: a temporary directory).
        is_host: whether this agent hosts the rendezvous store (None: torch decides from the
            endpoint's host name; set True on one agent when the endpoint is a namespace address).
        node_rank: use the ``static`` rendezvous (like ``torchrun --node-rank``) with this node's rank:
            deterministic rank placement; node 0 hosts the store at ``rdzv_endpoint``.
        entrypoint: run this function of the spec on every rank instead of ``worker_main``
            (benchmarks; it joins the process group itself; with ``"spawn"`` it must be importable).
        frozen_s: seconds a rank may stay stopped before it is killed and named
            (:class:`FrozenRankWatch`; default half of ``spec["pg_timeout_s"]``, else 15 s).

    Returns:
        ``{global rank: worker return value}`` for the ranks of this agent.

    Raises:
        BackendError: a rank failed (crash, collective error, process-group timeout) or stopped
            answering (held stopped, :class:`FrozenRankWatch`).
        KeyboardInterrupt: the agent got SIGINT or SIGTERM and stopped the ranks.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from pacectl.torchdist.worker import worker_main

    if socket_ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = socket_ifname
    os.environ["OMP_NUM_THREADS"] = str(omp_num_threads)
    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        # every agent of one job must use the same run id: a fixed one for multi-node jobs
        run_id=f"pacectl-{uuid.uuid4().hex[:8]}" if nnodes == 1 else "pacectl-multinode",
        rdzv_backend="c10d" if node_rank is None else "static",
        rdzv_endpoint=rdzv_endpoint or f"127.0.0.1:{free_port()}",
        rdzv_configs={"timeout": rdzv_timeout_s}
        | ({} if is_host is None else {"is_host": is_host})
        | ({} if node_rank is None else {"rank": node_rank}),
        max_restarts=0,
        monitor_interval=0.05,
        start_method=start_method,
        local_addr=local_addr,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )
    # The elastic agent logs every failed rank's traceback (and its shutdown) at ERROR and WARNING
    # level; the BackendError below carries the root cause instead (PACECTL_DEBUG=1 keeps the log).
    quiet = not os.environ.get("PACECTL_DEBUG")
    if quiet:
        logging.disable(logging.ERROR)
    pid_dir = Path(tempfile.mkdtemp(prefix="pacectl-pids-"))
    spec = dict(spec, pid_dir=str(pid_dir))
    watch = FrozenRankWatch(
        frozen_s if frozen_s is not None else float(spec.get("pg_timeout_s", 30.0)) / 2, pid_dir
    )
    try:
        with watch:
            return dict(elastic_launch(config, entrypoint or worker_main)(spec))
    except SignalException as err:  # the agent stopped the ranks on SIGINT/SIGTERM
        raise KeyboardInterrupt(str(err)) from None
    except ChildFailedError as err:
        if watch.frozen is not None:
            raise BackendError(watch.message()) from err
        rank, failure = _root_failure(err.failures)
        message: Any = failure.message
        if isinstance(message, dict):
            message = message.get("message", json.dumps(message))
        detail = str(message)
        if detail.startswith("To enable traceback"):  # torch's placeholder: the rank left no Python error
            detail = ""
        if failure.exitcode == FAULT_EXIT_CODE and not detail:
            detail = "the fault injected by backend.fault (it exits with this code)"
        others = sorted(set(err.failures) - {rank})
        died = not detail.strip() or is_peer_error(detail)
        raise BackendError(
            f"torch backend: rank {rank} failed (exit code {failure.exitcode}, pid {failure.pid}) and the job "
            f"was stopped{'; ranks ' + str(others) + ' failed after it' if others else ''}: "
            f"{detail.strip()[:2000] or 'no error message (killed, or exited without a Python error)'}."
            + (" A dead rank ends the job within backend.pg_timeout_s." if died else "")
        ) from err
    finally:
        shutil.rmtree(pid_dir, ignore_errors=True)
        if quiet:
            logging.disable(logging.NOTSET)


def _root_failure(failures: dict[int, Any]) -> tuple[int, Any]:
    """The failure most likely to be the cause: ``(global rank, ProcessFailure)``.

    torch's ``get_first_failure`` takes the earliest timestamp, but timestamps have a 1 s
    resolution, and a rank that died without a Python error (crash, ``os._exit``, signal) is stamped
    when the agent notices it, after its peers already raised "connection reset by peer". So ranks
    whose error only reports a lost peer or a timeout (or that the agent terminated) come last,
    then the earliest timestamp, then the lowest rank.
    """

    def secondary(failure: Any) -> bool:
        message = failure.message
        text = json.dumps(message) if isinstance(message, dict) else str(message)
        return failure.exitcode == -15 or is_peer_error(text)

    rank = min(failures, key=lambda r: (secondary(failures[r]), failures[r].timestamp, r))
    return rank, failures[rank]


def _main() -> None:
    parser = argparse.ArgumentParser(description="one elastic agent of a multi-node pacectl torch job")
    parser.add_argument("--spec", required=True, help="worker spec JSON file")
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--rdzv", required=True, help="host:port of the c10d rendezvous")
    parser.add_argument("--local-addr", required=True)
    parser.add_argument("--ifname", default=None, help="GLOO_SOCKET_IFNAME")
    parser.add_argument("--is-host", action="store_true", help="this agent hosts the rendezvous store")
    parser.add_argument("--node-rank", type=int, default=None, help="static rendezvous with this node rank")
    args = parser.parse_args()
    with open(args.spec) as fh:
        spec = json.load(fh)
    try:
        launch_workers(
            spec,
            nproc_per_node=args.nproc_per_node,
            nnodes=args.nnodes,
            rdzv_endpoint=args.rdzv,
            local_addr=args.local_addr,
            socket_ifname=args.ifname,
            is_host=True if args.is_host else None,
            node_rank=args.node_rank,
            start_method=str(spec.get("start_method", "spawn")),
        )
    except BackendError as err:
        raise SystemExit(f"pacectl.torchdist.launch: error: {err}") from None


if __name__ == "__main__":
    _main()
