"""The emulated-fabric experiment runs end to end and leaves no namespace behind (``netns`` marker).

Skips cleanly without root or iproute2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "netns_fabric" / "netns_fabric.py"


def _owned_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("pcf-")]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (network namespaces)")
@pytest.mark.skipif(
    shutil.which("ip") is None or shutil.which("tc") is None, reason="needs iproute2 (ip, tc)"
)
def test_netns_fabric_runs_and_cleans_up(tmp_path: Path) -> None:
    try:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "--ranks", "2", "--iters", "6", "--width", "128",
             "--controllers", "threshold", "--out", str(tmp_path), "--timeout-s", "90"],
            capture_output=True, text=True, timeout=150, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads((tmp_path / "netns_results.json").read_text())
        assert set(result["runs"]) == {"none", "threshold"}
        assert result["runs"]["none"]["iteration_time_mean_s"] > 0
        assert result["spec"]["interleave_block"] == 10  # the runs take turns: paired over the blocks
        assert result["vs_baseline"]["threshold"]["throughput_change_ci95_frac"] >= 0
    finally:
        assert _owned_namespaces() == []  # removed even on failure


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (network namespaces)")
@pytest.mark.skipif(
    shutil.which("ip") is None or shutil.which("tc") is None, reason="needs iproute2 (ip, tc)"
)
def test_a_second_job_as_cross_traffic_runs_and_is_stopped(tmp_path: Path) -> None:
    """``--cross-job``: the cross traffic is another DDP job on the same capped link; it is stopped
    with its ranks when the paced job ends (no namespace, and no rank of it, left behind)."""
    try:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "--ranks", "2", "--iters", "6", "--width", "128",
             "--controllers", "threshold", "--cross-job", "--cross-job-lead-s", "3",
             "--out", str(tmp_path), "--timeout-s", "120"],
            capture_output=True, text=True, timeout=200, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads((tmp_path / "netns_results.json").read_text())
        assert set(result["runs"]) == {"none", "threshold"}
        assert "a second 2-rank DDP job" in result["topology"]
        left = subprocess.run(["pgrep", "-f", "cross_spec.json"], capture_output=True, text=True, check=False)
        assert left.stdout.strip() == "", "a rank of the second job outlived the experiment"
    finally:
        assert _owned_namespaces() == []  # removed even on failure
