"""experiments/interference/measure_kappa.py: its estimator on known data, and a tiny end-to-end run
(the figures themselves are records in experiments/interference/results/, never asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "measure_kappa", ROOT / "experiments/interference/measure_kappa.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["measure_kappa"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_kappa_is_the_slope_per_waiting_peer_and_sleep_is_the_null() -> None:
    mod = _module()
    rows = []
    for block in range(4):
        jitter = 1.0 + 0.01 * block  # a block-wide load factor cancels in the paired ratios
        for k in range(4):
            rows.append(
                {"block": block, "arm": "spin", "k": k, "wall_s": 0.1 * jitter * (1 + 0.3 * k), "cpu_s": 0.1}
            )
            rows.append({"block": block, "arm": "sleep", "k": k, "wall_s": 0.1 * jitter, "cpu_s": 0.1})
    out = mod.analyse(rows, ("spin", "sleep"))
    assert out["spin"]["kappa"] == pytest.approx(0.3)
    assert out["spin"]["per_k"]["2"]["slowdown"] == pytest.approx(1.6)
    assert out["sleep"]["kappa"] == pytest.approx(0.0)
    assert out["spin"]["kappa_minus_sleep"] == pytest.approx(0.3)
    assert out["sleep"]["kappa_minus_sleep"] == pytest.approx(0.0)


@pytest.mark.slow
def test_a_tiny_run_writes_its_record(tmp_path: Path) -> None:
    import os
    import subprocess

    script = ROOT / "experiments/interference/measure_kappa.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(script), "--blocks", "2", "--work-ms", "3", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "kappa_cpu.json").read_text())
    assert set(record["arms"]) == {"spin", "sleep", "pacer_sleep"}
    assert len(record["trials"]) == 2 * 3 * 4
    assert (tmp_path / "kappa_cpu.md").read_text().startswith("# CPU early-arrival interference")


def test_bad_arguments_exit_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    mod = _module()
    assert mod.main(["--blocks", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--blocks must be >= 2" in err
