"""experiments/netns_fabric/two_jobs.py (issue 21 item 5): its analysis and the pieces it adds to the
live worker (the ``sleep`` workload, the start gate) here; the run itself as root (``netns``, slow).
Figures are records in experiments/netns_fabric/results/, never asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "netns_fabric" / "two_jobs.py"


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("two_jobs", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_job_and_the_sum_get_a_mean_an_interval_and_a_change_against_none() -> None:
    mod = _module()
    rows = [
        {"arm": arm, "a": a, "b": b, "sum": a + b}
        for arm, a, b in [("none", 2.0, 1.0), ("none", 2.2, 1.2), ("phase", 2.4, 1.1), ("phase", 2.6, 1.3)]
    ]
    out = mod.analyse(rows)
    assert out["none"]["sum"]["mean_it_per_s"] == pytest.approx(3.2)
    assert "change_frac" not in out["none"]["a"]
    assert out["phase"]["a"]["change_frac"] == pytest.approx(2.5 / 2.1 - 1)
    lo, hi = out["phase"]["sum"]["change_ci95_frac"]
    assert lo < out["phase"]["sum"]["change_frac"] < hi
    assert out["phase"]["b"]["n"] == 2


def test_the_start_gate_waits_for_its_file_and_its_time(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from pacectl.torchdist.worker import wait_at_gate

    gate = tmp_path / "gate.json"
    start = time.time() + 0.2
    gate.write_text(json.dumps({"start_unix_s": {"a": start - 1.0, "b": start}}))
    assert wait_at_gate(gate, "b") == start and time.time() >= start
    with pytest.raises(TimeoutError, match="did not open"):
        wait_at_gate(tmp_path / "never.json", timeout_s=0.05)


def test_the_sleep_workload_is_a_bias_free_linear_stack_and_validates() -> None:
    pytest.importorskip("torch")
    from pacectl.errors import ConfigError
    from pacectl.torchdist.core import TorchConfig, torch_config
    from pacectl.torchdist.worker import build_model

    model, x = build_model({"model": "sleep", "width": 16, "depth": 2, "batch_size": 1})
    assert sum(p.numel() for p in model.parameters()) == 2 * 16 * 16 and tuple(x.shape) == (1, 16)
    import dataclasses

    b = dataclasses.asdict(TorchConfig())
    b["workload"].update(model="sleep", compute_s=0.1)
    torch_config(b)
    b["workload"]["compute_s"] = -1
    with pytest.raises(ConfigError, match="workload.compute_s must be >= 0, got -1.0"):
        torch_config(b)


def test_without_root_it_skips_with_exit_77(tmp_path: Path) -> None:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("root: the run itself is the netns test below")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 77 and "two_jobs: skipped: needs root" in proc.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (network namespaces)")
@pytest.mark.skipif(
    shutil.which("ip") is None or shutil.which("tc") is None, reason="needs iproute2 (ip, tc)"
)
def test_two_jobs_run_and_clean_up(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "two_jobs.json"
    try:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "--replicates", "2", "--arms", "none,phase", "--iters", "6",
             "--warmup", "2", "--settle", "1", "--compute-s", "0.05", "--width", "128", "--out", str(out)],
            capture_output=True, text=True, timeout=400, check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
        record = json.loads(out.read_text())
        assert set(record["arms"]) == {"none", "phase"}
        assert all(
            record["arms"][arm][key]["n"] == 2 for arm in ("none", "phase") for key in ("a", "b", "sum")
        )
        assert len(record["runs"]) == 4 and len({r["offset_s"] for r in record["runs"]}) == 4
        assert "change_frac" in record["arms"]["phase"]["sum"]
    finally:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
        assert not [line for line in listed.splitlines() if line.startswith("pcf-")]
