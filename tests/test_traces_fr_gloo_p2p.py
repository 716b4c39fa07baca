"""What ProcessGroupGloo's Flight Recorder records of point-to-point ops (gloo, CPU, ``dist`` marker).

``pacectl/data/flight-recorder/README.md`` and :func:`pacectl.traces.flight_recorder.match_p2p`
say that gloo records no send or recv in torch 2.13, which is why the shipped p2p fixture is
synthesised. This test checks that claim on the installed torch, so it fails (and the docs need
updating, and a real fixture can be recorded) the day gloo starts recording them.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from test_torchdist_groups import _spawn  # noqa: E402 - after the torch skip

pytestmark = pytest.mark.dist


def _p2p_rank(rank: int, world: int, port: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="2000")
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        peer = 1 - rank
        t = torch.ones(4)
        pp = dist.new_group([0, 1], group_desc="PIPELINE_MODEL_PARALLEL_GROUP")
        for group in (None, pp):
            for _ in range(2):  # blocking send/recv both ways
                if rank == 0:
                    dist.send(t, peer, group=group)
                    dist.recv(t, peer, group=group)
                else:
                    dist.recv(t, peer, group=group)
                    dist.send(t, peer, group=group)
            (dist.isend(t, peer, group=group) if rank == 0 else dist.irecv(t, peer, group=group)).wait()
            ops = [
                dist.P2POp(dist.isend, t, peer, group),
                dist.P2POp(dist.irecv, torch.zeros(4), peer, group),
            ]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        dist.all_reduce(t)  # a collective, to show the recorder was on
        dump = pickle.loads(c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False))
        names = [e["profiling_name"] for e in dump["entries"]]
        queue.put((rank, {"names": names, "p2p": [e for e in dump["entries"] if e["is_p2p"]]}))
    except Exception as err:  # reported to the parent, which fails the test
        queue.put((rank, {"error": repr(err)}))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_gloo_records_no_send_or_recv_in_the_flight_recorder() -> None:
    ranks = _spawn(_p2p_rank, 2, 300)
    for r, res in ranks.items():
        assert "gloo:all_reduce" in res["names"], (r, res["names"])  # the recorder was on
        assert res["p2p"] == [], (r, res["p2p"])
        assert not any(n.split(":")[-1].startswith(("send", "recv")) for n in res["names"]), res["names"]
