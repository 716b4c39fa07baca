"""``python -m pacectl.tune``: multi-objective tuning of one controller family on one cluster profile.

Two objectives by default, each the mean over the profile's episodes (its traces, or its sim seeds):
throughput (it/s, up) and the CV of iteration time (down), with Optuna driven directly (no
hydra-optuna-sweeper; NSGA-II by default, `tune.sampler=tpe`), under a cap on the throughput loss
against no pacing (`tune.max_throughput_loss_frac=0.005`, set with `trial.set_constraint`; `null`
disables it). No pacing and the paper's threshold controller (its shipped defaults) run once per
study, before any trial, and are cached in the study. The work is done in :mod:`pacectl.tuning`
(:func:`pacectl.tuning.study.run_tuning` ties its modules together); this module is the command.

**Energy as an objective**: `tune.objectives=[throughput,cv,energy]` (any two or three, in the order
given) adds the modelled energy per iteration (summed over ranks, mean over the episodes;
`pacectl/energy.py` under `cluster.power`), minimized; the front, the choice and the improvement
rule take it in (:mod:`pacectl.tuning.verdict`), `tune.json` names the power profile
(`power_profile`, `energy_note`) and `pareto.png` has one panel per pair of objectives.

```bash
python -m pacectl.tune cluster=st controller=threshold tune.n_trials=100 hydra.run.dir=DIR
python -m pacectl.run controller_file=DIR/controller.yaml trace=st     # load the exported choice
python -m pacectl.tune cluster=ar controller=ewma tune.n_workers=2 tune.sampler=tpe
python -m pacectl.tune cluster=contended controller=pid tune.timeout_s=60        # sim profile
python -m pacectl.tune cluster=st controller=pid tune.storage=sqlite:///tune.db tune.study_name=st-pid
python -m pacectl.tune trace=DIR/records/none.parquet controller=pid            # a live record
python -m pacectl.tune cluster=st controller=threshold controller.units=iteration hydra.run.dir=DIR
```

- **Episodes** (:mod:`pacectl.tuning.scenarios`): a profile's `traces:` list is replayed (`ar`,
  `st`); a profile without traces (`paper_like`, `contended`, `dgx_superpod`, `cost_optimized`) is
  simulated with the scenario in `tune.sim`, which the profile's `tune_sim:` section fills;
  `tune.on=traces|sim` forces one. A trace on the command line (`trace=<file>`, `trace=st`) replaces
  the profile's traces and names the study (`<trace>-<family>`). A `tune.sim.*` override the study
  does not use prints a `warning:` line saying why.
- **Search spaces** (:mod:`pacectl.tuning.space` has the format): `conf/tune/space/<family>.yaml`,
  or `tune.space=FILE`; untuned keys keep the `controller` group's values. A combination a
  constructor rejects is a PRUNED trial (:mod:`pacectl.tuning.workers`). With
  `controller.units=iteration` (:mod:`pacectl.controllers.units`: every `*_s` parameter a fraction
  of the rolling median iteration time, kept in exported `controller.yaml` files) the default is
  `<family>.iteration.yaml`, whose time bounds go up to one iteration, and a `tune.space` with a
  `*_s` bound above 1.0 is refused (:func:`pacectl.tuning.space.check_units` says why).
- **Mistakes stop the command before any trial** (exit 2, one line on stderr, no storage or output
  created): unknown keys of the space file, `low > high`, a range whose middle the controller
  rejects (the line names the file, the key and the bound), YAML syntax errors (with line and
  column), a `tune.space` that is missing or a directory, a command-line `controller.<key>=` on a
  key the space tunes, `controller.units` other than `s` or `iteration`, a non-boolean
  `tune.progress`, unknown `tune.*`, `tune.sim.*`, `guard.*` or top-level keys (the same checks as
  `pacectl.run`).
- **Storage** (:mod:`pacectl.tuning.storage`): by default `DIR/optuna.journal`, a journal that a
  killed process cannot leave locked; `tune.storage=FILE` puts it elsewhere; an RDB URL
  (`sqlite:///tune.db`, `postgresql://user:pw@host/db`) is shared by several machines running the
  same command with the same `tune.study_name`.
- **Resume**: run the same command again (same `hydra.run.dir`, or the same `tune.storage` and
  `tune.study_name`). `tune.n_trials` is the study's total: only the missing trials run, and every
  resume first marks FAIL the trials a killed process on this host left RUNNING
  (:mod:`pacectl.tuning.workers`); those running in live processes are listed and left alone. What
  determines a trial's result is recorded when the study is created and must match
  (:func:`pacectl.tuning.settings.trial_settings` lists it, and what may change); a command that
  differs is refused before any trial, naming each differing setting with its value in the study and
  in the command: restore it, or start a new study (another `tune.study_name`, `hydra.run.dir` or
  `tune.storage`).
- **Ctrl-C** stops every worker (the trial each was running is recorded as FAIL), writes no output
  and prints one line with the number of finished trials kept and the command that resumes (exit
  130).
- **Workers**: `tune.n_workers=N` forks N workers on one study; the `[k/N]` progress count is shared
  by them (finished trials of the study, counting up by one per printed line).
- **Outputs** (run directory, written together: staged, then moved into place): `pareto.json`
  (every Pareto-optimal trial within the cap: `params`, `throughput_it_per_s`, `cv`,
  `energy_per_iteration_j`, `throughput_loss_frac`, `feasible`, `trial`; a parameter set drawn
  again appears once, under its first trial, with the later ones in `duplicate_trials`),
  `pareto.png` (trials, front, no pacing, paper threshold, choice), `controller.yaml` (the choice,
  :data:`pacectl.tuning.verdict.CHOICE_RULE`), `tune.json` (the baselines `baseline_none` and
  `reference_threshold`, choice, rules, recommendation, study, storage, the `optuna-dashboard`
  command the console also ends with), `tune.log` (the console lines with timestamps; a resume
  appends to it), `config.yaml` (the composed config, its first line the command's overrides; Hydra
  itself writes nothing into the folder) and `optuna.journal` (the default storage).
- **When pacing does not help**: a controller *improves on no pacing* by the rule
  :class:`~pacectl.tuning.verdict.ImprovementRule` states (`improvement_rule` in `tune.json`; by
  default a CV 1 % lower within the loss cap, or a throughput 0.5 % higher at a CV no higher). When
  no trial improves, the console prints a `warning:` line, `tune.json` has `improves_on_no_pacing:
  false` and `controller.yaml`, which still holds the best trial found, starts with a `WARNING`
  comment; the recommendation (`recommendation`, `recommendation_command`) is then the paper's
  threshold at its defaults when it meets the rule, else no pacing. With fixed durations
  (`comm=null`, the trace profiles; contention with nothing to vary its rate) a lower CV comes only
  from lengthening the fast iterations and does not count
  (`trials_lowering_cv_by_lengthening_only`). A choice that the paper's threshold at its defaults
  beats on every objective is warned about, and that reference recommended
  (`reference_dominates_chosen`).
- **Trying the choice where it was tuned**: the console's `use it:` line (`recommended:`, then `the
  chosen trial (not recommended):` when they differ), `controller.yaml`'s header and `run_overrides`
  in `tune.json` give the `pacectl.run` command for the tuned episodes
  (:func:`pacectl.tuning.outputs.run_overrides`); it runs the first seed (or trace) only, and the
  line under it gives the chosen trial's figures on that episode (`chosen.per_episode`), which the
  run reproduces exactly (the tuned figures are means over all the episodes).

`experiments/tuning/` tunes every family on every profile and judges the choices on held-out seeds
or traces; its README has the tuner's speed (`experiments/bench/bench_tune.py`) and a units
transfer check.
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
from pacectl.config import CONF_DIR
from pacectl.errors import ConfigError, PacectlError, StorageFullError
from pacectl.tuning.outputs import closing_lines
from pacectl.tuning.settings import override_key, tune_space, validate_tune_config
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
    tune_space(cfg, validate_tune_config(cfg))


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``pacectl-tune``): runs the command line ``argv`` (default: this
    process's) and returns the exit status: 0, 2 for a user mistake, 130 for Ctrl-C."""
    return cli.main("pacectl.tune", CONF_DIR, "tune", tune_job, validate=_check_config, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
