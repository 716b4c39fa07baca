"""The shipped backend contract (pacectl.testing.backend_contract) on every in-process backend."""

from __future__ import annotations

from pacectl.backends.replay import ReplayBackend
from pacectl.backends.sim import SimBackend
from pacectl.data import shipped_trace
from pacectl.fabric.contention import ContentionComm, CrossTraffic, EarlyArrivalInterference, FixedComm
from pacectl.fabric.noise import ComputeModel, LognormalJitter, ParetoHiccups, SlowRanks
from pacectl.fabric.topology import FatTree
from pacectl.testing.backend_contract import BackendContract
from pacectl.traces.bytedance import load_bytedance

_ST = load_bytedance(*shipped_trace("ST"))
_NOISE = ComputeModel(
    0.2, (LognormalJitter(0.05), ParetoHiccups(0.05, 0.02, 2.5), SlowRanks((1,), factor=1.2))
)


class TestReplayST(BackendContract):
    def make_backend(self) -> ReplayBackend:
        return ReplayBackend(_ST)


class TestReplayParamsAllGather(BackendContract):
    def make_backend(self) -> ReplayBackend:
        return ReplayBackend(_ST, paced_optype="params-all-gather")


class TestSimNull(BackendContract):
    def make_backend(self) -> SimBackend:
        return SimBackend(num_ranks=16, num_iterations=8, compute=_NOISE, comm=FixedComm(0.02))


class TestSimContention(BackendContract):
    def make_backend(self) -> SimBackend:
        comm = ContentionComm(
            FatTree(ranks_per_node=4, nodes_per_leaf=2, oversubscription=2.0),
            32,
            message_bytes=1e8,
            cross_traffic=CrossTraffic(links=("leaf_up:*",), on_s=0.1, off_s=0.2),
        )
        return SimBackend(
            num_ranks=32,
            num_iterations=8,
            compute=_NOISE,
            comm=comm,
            interference=EarlyArrivalInterference(0.05, 4),
        )
