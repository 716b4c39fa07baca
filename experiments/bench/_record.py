"""Shared by the benchmark scripts: write a results record with the machine it was measured on."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from pacectl.report import atomic_write_text


def write_record(path: Path, rows: list[dict[str, Any]], **extra: Any) -> None:
    """Write ``{"machine", "python", **extra, "results": rows}`` as JSON, atomically, and say where."""
    record = {"machine": platform.platform(), "python": platform.python_version(), **extra, "results": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    print(f"written: {path}")
