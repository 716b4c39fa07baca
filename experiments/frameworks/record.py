"""Run the Megatron-core and DeepSpeed adapter cases (2 gloo ranks on CPU) and record their figures.

The cases are the tests' (``tests/test_torchdist_adapters.py``: same seeded model, plain and paced,
rank 1 straggling 30 ms before backward). Needs a Python with megatron-core and/or deepspeed
installed beside torch (see README.md); a framework that is not importable is recorded as skipped.

    DS_ACCELERATOR=cpu PYTHONPATH=$PWD /work/venvs/fw/bin/python experiments/frameworks/record.py
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import test_torchdist_adapters as cases  # noqa: E402
from test_torchdist_groups import _spawn  # noqa: E402

from pacectl.files import atomic_write_text  # noqa: E402


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _summary(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for case, r0 in ranks[0].items():
        if not isinstance(r0, dict) or "decisions" not in r0:
            continue
        plain = case.replace("paced=True", "paced=False")
        late = r0["natural"][1:, 1] - r0["natural"][1:, 0]
        out[case] = {
            # parameters, and Megatron's gradient buffers (shards, with use_distributed_optimizer)
            "bit_identical_to_plain": all(
                bool(np.array_equal(ranks[r][case][k], ranks[r][plain][k]))
                for r in (0, 1)
                for k in ("params", "grads")
                if k in ranks[r][plain]
            ),
            "decisions_identical_across_ranks": bool(
                np.array_equal(r0["decisions"], ranks[1][case]["decisions"])
            ),
            "iterations": len(r0["decisions"]),
            "collectives_per_iteration": sorted(set(r0["collectives"])),
            "rank1_natural_lateness_median_ms": round(float(np.median(late)) * 1e3, 2),
            "rank0_applied_delay_median_ms": round(float(np.median(r0["applied"][2:, 0])) * 1e3, 2),
            "rank1_applied_delay_max_ms": round(float(np.max(r0["applied"][:, 1])) * 1e3, 2),
        }
    return out


def main() -> None:
    versions = {d: _version(d) for d in ("torch", "megatron-core", "deepspeed")}
    record: dict[str, Any] = {
        "versions": versions,
        "setup": "2 gloo ranks on CPU (one shared 2-core host, loaded by other work: timings are rough)",
    }
    runs = (("megatron", cases._megatron_rank, 300), ("deepspeed", cases._deepspeed_rank, 600))
    for name, target, timeout_s in runs:
        dist = "megatron-core" if name == "megatron" else "deepspeed"
        record[name] = _summary(_spawn(target, 2, timeout_s)) if versions[dist] else "skipped: not installed"
    path = Path(__file__).with_name("results.json")
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
