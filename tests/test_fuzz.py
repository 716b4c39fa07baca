"""A small derandomised slice of the fuzz campaign (experiments/fuzz/fuzz_importers.py): no crash."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location(
        "fuzz_importers", ROOT / "experiments" / "fuzz" / "fuzz_importers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_importers"] = module
    spec.loader.exec_module(module)
    return module


def test_mutated_real_traces_import_or_fail_cleanly(fuzz, tmp_path: Path) -> None:
    outcomes = []
    for target in fuzz._targets():
        for i in range(6):
            out = fuzz.run_import_case(target, i, 0, tmp_path)
            assert out["outcome"] != "crash", out
            outcomes.append(out["outcome"])
    assert "clean" in outcomes  # the mutations do reach the checks


def test_random_overrides_are_refused_in_one_line(fuzz) -> None:
    keys = fuzz._override_keys()
    for i in range(25):
        out = fuzz.run_override_case(keys, i, 0)
        assert out["outcome"] != "crash", out
