"""``python -m pacectl.tune``: multi-objective tuning of one controller family on one cluster profile.

Two objectives by default, each the mean over the profile's episodes (its traces, or its sim seeds):
maximize throughput (it/s) and minimize the CV of iteration time; ``tune.objectives`` picks two or
three of ``throughput``, ``cv`` and ``energy`` (the modelled energy per iteration summed over ranks,
under ``cluster.power``; :mod:`pacectl.tuning.verdict`). Optional constraint: the throughput loss
against no pacing at most ``tune.max_throughput_loss_frac`` (``trial.set_constraint``). Optuna is
driven directly (no hydra-optuna-sweeper); NSGA-II by default, ``tune.sampler=tpe`` for TPE.

Outputs in the Hydra run directory:

- ``pareto.json``: every Pareto-optimal trial (of those within the loss cap), a list of
  ``{"trial", "params", "throughput_it_per_s", "cv", "throughput_loss_frac", "feasible",
  "duplicate_trials"}`` (a parameter set drawn again appears once, under its first trial);
- ``pareto.png``: every trial, the front, no pacing, the paper's threshold controller at its
  default parameters, and the chosen trial;
- ``controller.yaml``: the chosen trial (rule: :data:`pacectl.tuning.verdict.CHOICE_RULE`) as a
  controller config: ``python -m pacectl.run controller_file=DIR/controller.yaml``;
- ``tune.json``: baseline, reference, choice, study, storage and the optuna-dashboard command;
- ``optuna.journal``: the study (default storage), resumable after a crash or Ctrl-C;
- ``tune.log``: the console lines with timestamps (a resume appends); ``config.yaml``: the composed
  config, its first line the command's overrides (Hydra itself writes nothing into the folder).

A study resumes only with the settings that determine a trial's result (the controller family and
its fixed parameters, ``units`` included; the search space as sampled; the episodes: profile,
traces or sim scenario, comm model, guard, seed); they are recorded in the study
(:func:`trial_settings`) and a command that differs is refused, naming each difference.

When no trial improves on no pacing by more than noise (:class:`pacectl.tuning.verdict.ImprovementRule`:
``tune.min_cv_gain_frac``, ``tune.min_throughput_gain_frac``), the console, ``tune.json``
(``improves_on_no_pacing: false``, ``recommendation``) and the header of ``controller.yaml`` say so
and recommend the paper's threshold controller at its defaults if it meets the rule, else no pacing;
``controller.yaml`` still holds the best trial. When the chosen trial improves but that reference
beats it on both objectives (few trials), they say so too and recommend the reference. With fixed durations (max-plus: ``comm=null``, or a
contention model with no timing-dependent mechanism) nothing counts as an improvement: no delay
can shorten an iteration, so a lower CV there comes only from lengthening the fast iterations;
the warning says how many trials did that (``trials_lowering_cv_by_lengthening_only``).

Examples::

    python -m pacectl.tune cluster=st controller=threshold tune.n_trials=100
    python -m pacectl.tune cluster=ar controller=ewma tune.n_workers=2 tune.sampler=tpe
    python -m pacectl.tune cluster=contended controller=pid tune.timeout_s=60        # sim profile
    python -m pacectl.tune trace=RUN/records/none.parquet controller=pid              # your own trace
    python -m pacectl.tune cluster=st controller=pid tune.storage=sqlite:///tune.db tune.study_name=st-pid
    python -m pacectl.tune cluster=st controller=threshold hydra.run.dir=DIR         # again: resumes
    python -m pacectl.run controller_file=DIR/controller.yaml trace=st               # use the choice
"""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from pacectl import cli
from pacectl.config import (
    CONF_DIR,
)
from pacectl.errors import ConfigError, PacectlError, StorageFullError
from pacectl.tuning.outputs import closing_lines
from pacectl.tuning.settings import Settings, override_key, tune_space, validate_tune_config
from pacectl.tuning.storage import disk_full_cause, full_disk_error
from pacectl.tuning.study import TuneInterrupted, run_tuning

#: console lines; :func:`pacectl.cli.run_job` also files them in ``tune.log``
log = logging.getLogger("pacectl.tune")


def resume_command(out_dir: Path, storage: str | None) -> str:
    """The command that resumes this study: this command's overrides, plus ``hydra.run.dir=`` when the
    study is the default journal of the run directory and the command did not name one."""
    if not HydraConfig.initialized():
        return "the same run_tuning call (same storage and study name)"
    hc = HydraConfig.get()
    parts = ["python", "-m", "pacectl.tune", *[str(o) for o in hc.overrides.task]]
    parts += [str(o) for o in hc.overrides.hydra if override_key(str(o)) != "hydra.mode"]  # Hydra adds it
    named_dir = any(override_key(str(o)) == "hydra.run.dir" for o in hc.overrides.hydra)
    if storage in (None, "") and not named_dir:
        parts.append(f"hydra.run.dir={out_dir}")
    return " ".join(shlex.quote(p) for p in parts)


def tune_job(cfg: DictConfig, out_dir: Path) -> None:
    """One ``pacectl.tune`` job (see :func:`pacectl.cli.main`): the study of ``cfg``, its outputs
    into ``out_dir`` and its console lines.

    Raises:
        PacectlError: a user mistake (one line and exit status 2 from the entry point).
    """
    try:
        result = run_tuning(cfg, out_dir, echo=log.info, warn=log.warning)
    except MissingMandatoryValue as err:
        raise ConfigError(f"config value {err.full_key} must be set, got '???'") from err
    except OmegaConfBaseException as err:
        raise ConfigError(f"bad config: {err}") from err
    except TuneInterrupted as err:
        _interrupted(
            keep=True,
            message=f"interrupted; the study's {'' if err.finished is None else f'{err.finished} '}finished trial(s) "
            f"are kept in {err.storage.display} (study {err.study_name!r}) and its log (tune.log); no results were written (tune.json, pareto.*, controller.yaml); "
            f"resume with the same command: {resume_command(out_dir, cfg.tune.get('storage'))}",
        )
    except KeyboardInterrupt:
        _interrupted("interrupted before the study was created; nothing was written")
    except (OSError, AssertionError) as err:  # a full disk: Optuna hides ENOSPC behind AssertionError
        full = disk_full_cause(err)
        if full is None:
            raise
        if isinstance(full, StorageFullError):
            raise full from err
        raise PacectlError(str(full_disk_error(full, f"the run folder {out_dir}"))) from err
    for level, line in closing_lines(result, out_dir):
        log.log(level, line)


def _interrupted(message: str, *, keep: bool = False) -> None:
    """Exit 130 with ``message``; with ``keep`` the study's finished trials stay, and the log lines."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not print a traceback
    print(f"pacectl.tune: {message}", file=sys.stderr, flush=True)
    if keep:
        raise cli.Interrupted
    sys.exit(130)


def _check_config(cfg: DictConfig) -> None:
    """What the tuner would refuse at once (keys, guard, settings, search space), checked before Hydra
    creates the run folder; the episodes are built (and checked) by the job."""
    validate_tune_config(cfg)
    tune_space(cfg, Settings.from_cfg(cfg.tune))


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``pacectl-tune``): runs the command line ``argv`` (default: this
    process's) and returns the exit status: 0, 2 for a user mistake, 130 for Ctrl-C."""
    return cli.main("pacectl.tune", CONF_DIR, "tune", tune_job, validate=_check_config, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
