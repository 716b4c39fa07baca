"""A CPU dry run of the GPU check's overhead comparison, so device time is not spent on its bugs.

The CUDA checks themselves need a GPU (``experiments/gpu_check``); the overhead function runs the
same code on a 1-rank gloo group here.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "gpu_check" / "gpu_check.py"


def _overhead_on_one_rank(port: int, queue) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        result = gpu_check.overhead(torch.device("cpu"), rounds=2, block=1, width=32)
        queue.put((result, sorted(gpu_check.OVERHEAD_VARIANTS)))
    except BaseException as err:  # noqa: BLE001 - report to the parent instead of hanging it
        queue.put(repr(err))
    finally:
        dist.destroy_process_group()


def test_overhead_comparison_runs_on_cpu() -> None:
    from pacectl.torchdist.launch import free_port

    # In a spawned child: gloo's threads must not live on in this pytest process, whose later
    # tests fork (a fork of a process holding them can deadlock).
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_overhead_on_one_rank, args=(free_port(), queue), daemon=True)
    proc.start()
    try:
        got = queue.get(timeout=120)
    finally:
        proc.join(timeout=20)
        if proc.is_alive():
            proc.kill()
    assert not isinstance(got, str), got
    result, variants = got
    assert set(result["variants"]) == set(variants) - {"plain"}
    assert result["plain_iteration_median_s"] > 0
    for v in result["variants"].values():
        assert v["overhead_frac"] == pytest.approx(
            v["minus_plain_median_s"] / result["plain_iteration_median_s"]
        )


def test_without_cuda_it_skips_with_exit_77(tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check would run for real")
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.main(["--out", str(tmp_path)]) == 77
    assert not any(tmp_path.iterdir())  # no record of a check that did not run
