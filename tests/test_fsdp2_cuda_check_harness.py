"""The FSDP2 all-gather stream check (``experiments/fsdp2/cuda_stream_check.py``, a step of
``experiments/gpu_check``) run on CPU, so that its harness's bugs are found before GPU time is spent.

On CPU (a 1-rank gloo group) the pacer's delay is a host sleep and there are no streams: only the
device-agnostic parts are judged here (FSDP2's own ``foreach_all_gather`` through the pacer's
all-gather, one collective paced, its output bit-identical to FSDP2's default all-gather's, the
delay as run). The stream figures exist only on CUDA.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "fsdp2" / "cuda_stream_check.py"


def _on_one_rank(port: int, queue) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    spec = importlib.util.spec_from_file_location("cuda_stream_check", SCRIPT)
    check = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(check)
        queue.put(check.check_fsdp2_delay_on_all_gather_stream(delay_s=0.02, device="cpu"))
    except BaseException as err:  # noqa: BLE001 - report to the parent instead of hanging it
        queue.put(repr(err))


def test_the_all_gather_check_runs_fsdp2s_own_all_gather_through_the_pacer_on_cpu() -> None:
    from pacectl.torchdist.launch import free_port

    ctx = mp.get_context("spawn")  # gloo's threads must not live on in this pytest process
    queue = ctx.Queue()
    proc = ctx.Process(target=_on_one_rank, args=(free_port(), queue), daemon=True)
    proc.start()
    try:
        got = queue.get(timeout=120)
    finally:
        proc.join(timeout=20)
        if proc.is_alive():
            proc.kill()
    assert not isinstance(got, str), got
    assert got["device"] == "cpu", got
    # ("ok" is not judged: on this loaded CPU a 20 ms sleep may overshoot by more than its 10 %)
    assert got["collectives_paced"] == 1  # FSDP2's foreach_all_gather called the pacer's comm once
    assert got["output_bit_identical_to_default_all_gather"]
    assert got["all_gather_output_numel"] == 1024 * 1024 + 1024  # the first Linear's weight and bias
    assert got["delay_actual_s"] >= 0.02
    assert "wait_on_fsdp2_all_gather_stream" not in got  # CUDA only
