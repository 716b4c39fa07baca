"""A CPU dry run of the GPU check's overhead comparison, so device time is not spent on its bugs.

The CUDA checks themselves need a GPU (``experiments/gpu_check``); the overhead function runs the
same code on a 1-rank gloo group here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "gpu_check" / "gpu_check.py"


def test_overhead_comparison_runs_on_cpu(monkeypatch) -> None:
    import torch.distributed as dist

    from pacectl.torchdist.launch import free_port

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        result = gpu_check.overhead(torch.device("cpu"), rounds=2, block=1, width=32)
    finally:
        dist.destroy_process_group()
    assert set(result["variants"]) == set(gpu_check.OVERHEAD_VARIANTS) - {"plain"}
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
