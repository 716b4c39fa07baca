"""The open registry: a controller defined in this file only runs in ``controller=all``, passes the
contract suite and can be tuned, with no other file touched (issue 22, item 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from pacectl.checks import within
from pacectl.config import CONF_DIR
from pacectl.controllers import FAMILIES, all_families, make_controller, register, unregister
from pacectl.controllers.base import BaseController, FloatArray, earliness
from pacectl.errors import ConfigError
from pacectl.testing import ControllerContract
from pacectl.types import Controller, Observation


@dataclass(kw_only=True, eq=False, repr=False)
class Deadband(BaseController):
    """Delay each early rank by ``gain`` x its earliness while the natural spread exceeds ``band_s``.

    Args:
        band_s: natural spread, seconds, above which ranks are paced, >= 0.
        gain: fraction of the earliness to delay, in (0, 1].
    """

    name = "deadband"
    band_s: float = within(0.01, ">= 0")
    gain: float = within(0.5, "(0, 1]")

    def _reset_state(self, num_ranks: int) -> None:
        self._active = False

    def _act(self, obs: Observation, natural_arrival_s: FloatArray) -> FloatArray:
        early = earliness(natural_arrival_s)
        self._active = float(early.max()) > self.band_s
        return self.gain * early if self._active else np.zeros_like(natural_arrival_s)

    def _diagnostics(self) -> dict[str, float]:
        return {"active": float(self._active)}


SPACE = {
    "band_s": {"type": "float", "low": 1e-3, "high": 10.0, "log": True},
    "gain": {"type": "float", "low": 0.05, "high": 1.0},
}


@pytest.fixture(autouse=True, scope="module")
def deadband() -> Iterator[None]:
    """What a plugin module does at import (``@register(space=...)`` on the class); registered for
    this module's tests only, so the other tests see the built-in families alone."""
    register(space=SPACE)(Deadband)
    yield
    unregister("deadband")


class TestDeadbandContract(ControllerContract):
    def make_controller(self) -> Controller:
        return make_controller("deadband")


def _compose(config_name: str, overrides: list[str]) -> object:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides)


def test_it_is_a_config_group_option_with_its_defaults() -> None:
    cfg = _compose("config", ["controller=deadband", "controller.gain=0.25"])
    assert dict(cfg.controller) == {"name": "deadband", "band_s": 0.01, "gain": 0.25, "units": "s"}
    with pytest.raises(
        ConfigError, match="unknown parameter 'gian' for controller 'deadband'; did you mean 'gain'"
    ):
        make_controller("deadband", gian=0.3)


def test_it_runs_in_controller_all(tmp_path: Path) -> None:
    from pacectl.run import run_experiment

    cfg = _compose("config", ["trace=st", "output.plots=false", "output.report=false"])
    summary = run_experiment(cfg, tmp_path)
    runs = list(summary["runs"])  # the registry's order: a new built-in family needs no edit here
    assert runs == ["none", *all_families()] and runs[-1] == "deadband" and "threshold" in runs
    assert json.loads((tmp_path / "summary.json").read_text())["controller_params"]["deadband"] == {
        "band_s": 0.01,
        "gain": 0.5,
        "units": "s",
    }
    # the null model still holds for it: no delay shortens any iteration
    runs = summary["runs"]
    assert runs["deadband"]["iteration_time_mean_s"] >= runs["none"]["iteration_time_mean_s"] - 1e-9


def test_it_can_be_tuned(tmp_path: Path) -> None:
    from pacectl.tuning.study import run_tuning

    cfg = _compose(
        "tune",
        [
            "cluster=st",
            "tune.population_size=4",
            "controller=deadband",
            "tune.n_trials=4",
            "tune.progress=false",
        ],
    )
    result = run_tuning(cfg, tmp_path / "run", echo=lambda line: None)
    assert result.summary["num_trials"]["complete"] == 4
    assert result.summary["space"]["tuned"] == ["band_s", "gain"]
    assert "register space=" in result.summary["space"]["source"]
    with pytest.raises(ConfigError, match="no default search space with units=iteration"):
        run_tuning(
            _compose("tune", ["cluster=st", "controller=deadband", "controller.units=iteration"]),
            tmp_path / "b",
        )


def test_unregistering_removes_it_everywhere() -> None:
    unregister("deadband")
    try:
        assert "deadband" not in FAMILIES
        with pytest.raises(Exception, match="deadband"):
            _compose("config", ["controller=deadband"])
    finally:
        register(space=SPACE)(Deadband)


def test_a_name_must_be_its_own_and_free() -> None:
    class Unnamed(Deadband):
        pass

    with pytest.raises(ConfigError, match="Renamed.name is 'deadband'; they must be the same"):
        register("other")(type("Renamed", (Deadband,), {"name": "deadband"}))
    with pytest.raises(
        ConfigError, match="'threshold' is already registered by pacectl.controllers.threshold"
    ):
        register("threshold")(Unnamed)
    assert "other" not in FAMILIES and FAMILIES["threshold"].cls.__name__ == "ThresholdController"


def test_its_command_line_values_are_checked_like_a_shipped_familys(tmp_path: Path) -> None:
    """``python -m pacectl.run controller=deadband``: a wrong type (OmegaConf, from its typed fields)
    and a value out of its declared range (its ``within``) are one line and exit 2, no folder."""
    from pacectl.run import main
    from pacectl.testing.commands import run_command

    for value in ("abc", "2"):
        out = tmp_path / value
        proc = run_command(
            main,
            ["trace=st", "controller=deadband", f"controller.gain={value}", f"hydra.run.dir={out}"],
            cwd=tmp_path,
        )
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "gain must be " in proc.stderr and "in (0, 1], got " in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and not out.exists()
