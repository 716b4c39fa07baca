"""The tuner's typed config: the keys of ``tune`` (:class:`Settings`) and of ``tune.sim``
(:class:`SimSettings`), stored in Hydra's ConfigStore with pacectl.run's by :mod:`pacectl.config`
(``tune_schema``: conf/tune.yaml's first default after config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from omegaconf import DictConfig

from pacectl.checks import Checked, flag, typed, within
from pacectl.errors import ConfigError
from pacectl.fabric.profile import Scenario
from pacectl.tuning.verdict import DEFAULT_OBJECTIVES, OBJECTIVES, ImprovementRule

SAMPLERS = ("nsga2", "tpe", "random")


@dataclass(kw_only=True)
class SimSettings(Scenario):
    """``tune.sim``: the sim scenario (``tune.on=sim``, or a profile without traces); conf/tune.yaml
    takes its defaults from the profile's own ``cluster.tune_sim``."""

    section: ClassVar[str] = "tune.sim"


@dataclass(kw_only=True)
class Settings(Checked):
    """``tune.*``, the tuner's typed config (``tune_schema``; the command line overrides it).

    Attributes:
        n_trials: finished trials the study should have (a resumed study runs the rest).
        timeout_s: stop each worker after this many seconds (null: no limit).
        sampler: nsga2, tpe or random. population_size: NSGA-II's generation size.
        seed: the sampler's seed (each worker and each resume derive their own from it).
        n_workers: worker processes sharing the study (forked, one storage connection each).
        study_name: null: ``<cluster>-<family>``.
        storage: null: ``<run dir>/optuna.journal``; a path: a journal file; or an RDB URL such as
            ``sqlite:///tune.db`` or ``postgresql://user:pw@host/db``.
        space: null: ``conf/tune/space/<family>.yaml`` (``<family>.iteration.yaml`` with
            ``controller.units=iteration``); or a path to a space YAML.
        max_throughput_loss_frac: constraint: throughput loss vs no pacing at most this (null: none).
        min_cv_gain_frac: a controller "improves on no pacing" (and is recommended) only if its CV is
            at least this much lower than no pacing's within the loss cap, ...
        min_throughput_gain_frac: ... or its throughput at least this much higher at a CV no higher;
        min_energy_gain_frac: ... or, with energy among the objectives, its energy per iteration at
            least this much lower. Smaller differences count as noise; the three may change on resume.
        objectives: two or three of throughput (up), cv (down), energy (down: the modelled energy per
            iteration under ``cluster.power``); a study resumes only with the same.
        progress: one line per finished trial.
        on: traces, sim, or auto (the profile's traces if it lists any, else sim).
        sim: the sim scenario (:class:`SimSettings`).
    """

    section: ClassVar[str] = "tune"
    n_trials: int = within(100, ">= 1")
    timeout_s: float | None = within(None, "> 0")
    sampler: str = within("nsga2", choices=SAMPLERS)
    population_size: int = within(20, ">= 2")
    seed: int = within(0, ">= 0")
    n_workers: int = within(1, ">= 1")
    study_name: str | None = None
    storage: str | None = None
    space: str | None = None
    max_throughput_loss_frac: float | None = within(0.005, "[0, 1)")
    min_cv_gain_frac: float = within(0.01, "[0, 1)")
    min_throughput_gain_frac: float = within(0.005, "[0, 1)")
    min_energy_gain_frac: float = within(0.01, "[0, 1)")
    objectives: tuple[str, ...] = within(DEFAULT_OBJECTIVES, choices=tuple(OBJECTIVES))
    progress: Any = flag(True)
    on: str = within("auto", choices=("auto", "traces", "sim"))
    sim: SimSettings = field(default_factory=SimSettings)

    def __post_init__(self) -> None:
        super().__post_init__()
        names = list(self.objectives)
        if not 2 <= len(names) <= 3 or len(set(names)) != len(names):
            raise ConfigError(
                f"tune.objectives must be two or three distinct names of {list(OBJECTIVES)} (throughput up, "
                f"cv and energy down), got {names!r}; for example tune.objectives=[throughput,cv,energy]"
            )
        for key in ("study_name", "storage", "space"):  # an empty value is the default
            if getattr(self, key) == "":
                setattr(self, key, None)
        self.objectives = tuple(names)

    @staticmethod
    def from_cfg(tune: DictConfig) -> Settings:
        """Read and check ``cfg.tune``.

        Raises:
            ConfigError: an unknown key (with a did-you-mean), a wrong type or a value out of range,
                naming the key.
        """
        return typed(Settings, tune)

    @property
    def rule(self) -> ImprovementRule:
        """When a trial improves on no pacing, with these settings."""
        return ImprovementRule(
            self.min_cv_gain_frac,
            self.min_throughput_gain_frac,
            self.max_throughput_loss_frac,
            self.min_energy_gain_frac,
            self.objectives,
        )

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        """The study's Optuna directions, one per objective."""
        return ["maximize" if OBJECTIVES[o][1] > 0 else "minimize" for o in self.objectives]
