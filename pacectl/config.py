"""From a composed Hydra config to pacectl objects: traces, backends and guarded controllers.

The configs live in the top-level ``conf/`` of a checkout; a wheel ships the same files as
``pacectl/conf/``. :data:`CONF_DIR` is whichever exists. The resolver ``${pacectl_data:<rel>}``
points at the traces shipped inside the package (``pacectl/data/<rel>``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pacectl.controllers import SafetyGuard, make_controller
from pacectl.data import DATA_DIR
from pacectl.errors import ConfigError
from pacectl.fabric.base import COMM_MODELS, CommModel
from pacectl.traces.bytedance import load_bytedance
from pacectl.traces.model import OpTrace
from pacectl.types import Controller

_PKG_DIR = Path(__file__).resolve().parent
#: The Hydra config directory: ``pacectl/conf`` in a wheel, ``<checkout>/conf`` in a checkout.
CONF_DIR = _PKG_DIR / "conf" if (_PKG_DIR / "conf").is_dir() else _PKG_DIR.parent / "conf"

if not OmegaConf.has_resolver("pacectl_data"):
    OmegaConf.register_new_resolver("pacectl_data", lambda rel: str(DATA_DIR / rel))


def _abs_path(value: str) -> str:
    """Resolve a user path against the directory the command was started from."""
    try:
        from hydra.utils import to_absolute_path

        return to_absolute_path(value)
    except ValueError:  # not inside a Hydra app
        return str(Path(value).expanduser().resolve())


def _load_bytedance(trace_cfg: DictConfig) -> OpTrace:
    return load_bytedance(_abs_path(str(trace_cfg.path)), _abs_path(str(trace_cfg.meta)))


def _load_canonical(trace_cfg: DictConfig) -> OpTrace:
    from pacectl.traces.canonical import load_canonical

    return load_canonical(_abs_path(str(trace_cfg.path)))


#: trace.format -> loader of a ``trace`` config node. Importers register here.
TRACE_LOADERS: dict[str, Callable[[DictConfig], OpTrace]] = {
    "bytedance": _load_bytedance,
    "canonical": _load_canonical,
}


def load_trace(trace_cfg: DictConfig) -> OpTrace:
    """Load the trace named by the ``trace`` config group (``trace.format`` picks the importer).

    Raises:
        ConfigError: unknown ``trace.format``.
        TraceError: the file is missing or malformed.
    """
    fmt = trace_cfg.get("format")
    if fmt not in TRACE_LOADERS:
        raise ConfigError(f"trace.format must be one of {sorted(TRACE_LOADERS)}, got {fmt!r}")
    trace = TRACE_LOADERS[fmt](trace_cfg)
    if trace_cfg.get("name"):
        object.__setattr__(trace.meta, "name", str(trace_cfg.name))
    return trace


def make_comm_model(cfg: DictConfig) -> CommModel:
    """The communication model named by the ``comm`` config group.

    Raises:
        ConfigError: unknown ``comm.name``.
    """
    comm_name = str(cfg.comm.name)
    if comm_name not in COMM_MODELS:
        raise ConfigError(f"comm.name must be one of {sorted(COMM_MODELS)}, got {comm_name!r}")
    return COMM_MODELS[comm_name]()


def controller_params(controller_cfg: DictConfig | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split a controller config into its family name and constructor parameters."""
    raw = (
        OmegaConf.to_container(controller_cfg, resolve=True)
        if isinstance(controller_cfg, DictConfig)
        else controller_cfg
    )
    if not isinstance(raw, dict):
        raise ConfigError(f"controller config must be a mapping, got {raw!r}")
    params: dict[str, Any] = {str(k): v for k, v in raw.items()}
    name = params.pop("name", None)
    if not isinstance(name, str):
        raise ConfigError(f"controller.name must be a controller family name, got {name!r}")
    return name, params


def controller_families(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """The runs of an experiment: ``none`` first, then the selected controller(s).

    ``controller=all`` expands to every family listed in ``conf/controller/all.yaml`` with the
    parameters of its own ``conf/controller/<family>.yaml``.
    """
    name, params = controller_params(cfg.controller)
    runs: dict[str, dict[str, Any]] = {"none": {}}
    if name == "all":
        for family in params.get("families", []):
            path = CONF_DIR / "controller" / f"{family}.yaml"
            if not path.is_file():
                raise ConfigError(
                    f"controller.families entries must have a conf/controller/*.yaml, got {family!r}"
                )
            fam_name, fam_params = controller_params(OmegaConf.load(path))  # type: ignore[arg-type]
            runs[fam_name] = fam_params
    elif name != "none":
        runs[name] = params
    for family, family_params in runs.items():
        make_controller(family, **family_params)  # validate every config before any run starts
    return runs


def controller_factory(
    family: str, params: dict[str, Any], guard_cfg: DictConfig
) -> Callable[[], Controller]:
    """A factory of guarded controllers (one is built per pacing domain)."""
    guard = OmegaConf.to_container(guard_cfg, resolve=True)
    assert isinstance(guard, dict)

    def build() -> Controller:
        return SafetyGuard(make_controller(family, **params), **guard)  # type: ignore[arg-type]

    return build
