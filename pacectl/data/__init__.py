"""Real traces shipped with pacectl (see ``bytedance/ATTRIBUTION.md`` for source and license)."""

from __future__ import annotations

from pathlib import Path

from pacectl.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent
SHIPPED_TRACES = ("AR", "ST")


def shipped_trace(name: str) -> tuple[Path, Path]:
    """Paths of a shipped ByteDance trace and its meta YAML.

    Args:
        name: ``"AR"`` (64 ranks, injected straggler) or ``"ST"`` (8 ranks, stage imbalance).

    Returns:
        ``(parquet_path, meta_yaml_path)``.

    Raises:
        ConfigError: unknown name.
    """
    if name not in SHIPPED_TRACES:
        raise ConfigError(f"shipped trace must be one of {list(SHIPPED_TRACES)}, got {name!r}")
    folder = DATA_DIR / "bytedance"
    return folder / f"trace-{name}.parquet", folder / f"meta-{name}.yaml"
