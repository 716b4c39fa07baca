"""The entry points' command line (pacectl/cli.py): run folders that cannot be written, and
composition errors turned into one line. End-to-end cases (a failed job leaves no folder) are in
test_run_cli.py and test_tune.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pacectl import cli
from pacectl.config import CONF_DIR
from pacectl.errors import ConfigError


def _check(capsys, args: list[str], config_name: str = "config") -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.check_command_line("pacectl.run", CONF_DIR, config_name, argv=args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_an_empty_group_choice_lists_every_option(capsys) -> None:
    from pacectl.controllers import FAMILIES

    err = _check(capsys, ["controller="])
    options = ", ".join(sorted(["all", *FAMILIES]))  # controller=all and every registered family
    assert f"controller= needs an option of the controller group: one of {options}" in err
    assert "sleep_wait, threshold" in err


def test_composition_errors_are_one_line_with_a_did_you_mean(capsys) -> None:
    err = _check(capsys, ["controller=pid", "controller.kq=0.5"])
    assert "controller.kq=0.5: no such config key" in err and "Did you mean controller.kp=0.5?" in err
    err = _check(capsys, ["cluster=paper_lik"], "tune")
    assert "Did you mean cluster=paper_like?" in err and "available: alibaba_pai, ar, base, contended," in err
    err = _check(capsys, ["trace=st", "seed"])
    assert "missing EQUAL" in err


def test_a_folder_without_traces_is_named_as_such(capsys, tmp_path: Path) -> None:
    """An existing folder that holds no trace gets its own message, not "no such option"."""
    err = _check(capsys, [f"trace={tmp_path}"])
    assert f"trace={tmp_path}: the folder holds no trace" in err and "no such option" not in err


def test_the_composed_config_goes_through_the_entry_points_check(capsys) -> None:
    seen = []
    cli.check_command_line("p", CONF_DIR, "config", validate=seen.append, argv=["controller=pid"])
    assert seen[0].controller.name == "pid"
    cli.check_command_line("p", CONF_DIR, "config", validate=seen.append, argv=["--help"])  # Hydra's
    assert len(seen) == 1


def test_a_sweep_is_checked_job_by_job_before_the_first_runs(capsys) -> None:
    assert cli.sweep_jobs(["controller=threshold,pid", "seed=range(0,2)", "+x=1"]) == [
        ["controller=threshold", "seed=0", "+x=1"],
        ["controller=threshold", "seed=1", "+x=1"],
        ["controller=pid", "seed=0", "+x=1"],
        ["controller=pid", "seed=1", "+x=1"],
    ]
    seen = []
    cli.check_command_line("p", CONF_DIR, "config", validate=seen.append, argv=["-m", "controller=pid,ewma"])
    assert [c.controller.name for c in seen] == ["pid", "ewma"]
    from pacectl.run import _check_config

    with pytest.raises(SystemExit):
        cli.check_command_line(
            "pacectl.run",
            CONF_DIR,
            "config",
            _check_config,
            argv=["-m", "controller=pid", "controller.kp=0.5,-1"],
        )
    err = capsys.readouterr().err
    assert err.startswith("pacectl.run: error: sweep job (controller=pid controller.kp=-1): kp must be")


def test_a_sweep_setting_a_key_only_the_swept_options_have(capsys) -> None:
    """Hydra composes a sweep once without its swept values (controller=all), where controller.gain
    does not exist, although each job (threshold, pid) has it: caught, with the ++ fix."""
    argv = ["-m", "controller=threshold,pid", "controller.gain=0.25"]
    with pytest.raises(SystemExit) as info:
        cli.check_command_line("p", CONF_DIR, "config", argv=argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "controller at its default" in err and "write ++controller.gain=0.25" in err, err
    assert err.count("\n") == 1
    cli.check_command_line(
        "p", CONF_DIR, "config", argv=["-m", "controller=threshold,pid", "++controller.gain=0.25"]
    )
    assert cli.multirun_base_error(CONF_DIR, "config", ["controller=pid", "controller.gain=0.25"]) is None


def test_removing_keys_and_inspection_flags(capsys) -> None:
    err = _check(capsys, ["~trace"])
    assert "~trace: removing config keys is not supported" in err
    err = _check(capsys, ["controller=pidd", "--help"])  # Hydra's help would end in a traceback
    assert "Did you mean controller=pid?" in err
    err = _check(capsys, ["--cfg", "job", "controler=pid"])
    assert "Did you mean controller=pid?" in err
    seen = []
    cli.check_command_line(
        "p", CONF_DIR, "config", validate=seen.append, argv=["--cfg", "job", "controller=pid"]
    )
    assert seen == []  # inspecting the config is not running it: no value checks
    cli.check_command_line("p", CONF_DIR, "config", validate=seen.append, argv=["--info", "controller=pidd"])
    assert seen == []  # a flag the check does not know: left to Hydra


def test_a_large_sweep_checks_every_value_once() -> None:
    jobs = cli.sweep_jobs(["controller.kp=0.1,0.2,-1", "seed=range(0,33)", "trace=st"])
    assert len(jobs) == 33  # not 99
    assert {j[0] for j in jobs} == {"controller.kp=0.1", "controller.kp=0.2", "controller.kp=-1"}
    assert {j[1] for j in jobs} == {f"seed={i}" for i in range(33)} and all(j[2] == "trace=st" for j in jobs)
    assert cli.sweep_jobs(["controller=glob(p*)"]) is None  # Hydra expands (and reports) those


def test_a_key_of_another_option_names_it(capsys) -> None:
    err = _check(capsys, ["backend.num_ranks=8"])
    assert "It is a key of backend=sim: select one, e.g. backend=sim backend.num_ranks=8" in err
    err = _check(capsys, ["controller.kpp=1"])
    assert "controller=all (the default)" in err and "e.g. controller=pid controller.kp=1" in err
    assert "Did you mean controller.kp? It is a key of controller=pid" in err  # kpp is nobody's key
    assert "Did you mean" not in _check(capsys, ["backend.num_ranks=8"])  # the exact key elsewhere
    # nested: a key of a section another option has (not a hint to add it with +)
    err = _check(capsys, ["backend.pacing.piggyback_max_bytes=1048576"])
    assert (
        "It is a key of backend=torch: select one, e.g. backend=torch backend.pacing.piggyback_max_bytes=1048576"
        in err
    )
    assert "leading +" not in err
    err = _check(capsys, ["backend=sim", "backend.workload.width=256"])
    assert "e.g. backend=torch backend.workload.width=256" in err


def _dir_error(args: list[str]) -> str | None:
    """The run folder's problem for a command line, as the entry points check it (None for a flag
    that prints and exits: no folder)."""
    cfg = cli.check_command_line("p", CONF_DIR, "config", argv=args)
    return None if cfg is None else cli.run_dir_error(cfg)


def test_an_empty_run_dir_is_refused() -> None:
    assert "got an empty value" in _dir_error(["hydra.run.dir="])


@pytest.mark.parametrize(
    "value, fmt",
    [
        ("ar", None),  # option names stay options
        ("my-trace_2", None),  # a plain name that is no folder here
        ("canonical", None),
        ("runs/live/records/none.parquet", "canonical"),
        ("'/abs/path/H.PARQUET'", "canonical"),
        ("profiles/rank0.json", "kineto"),
        ("profiles/rank*.json.gz", "kineto"),
        ("profiles/rank[0-3]*", "kineto"),
        ("job_1_norm.csv", "steplevel"),
        ("job_1_norm.csv.gz", None),  # only .json.gz is read compressed
        ("notes.txt", None),
    ],
)
def test_trace_file_shorthand_names_the_format_by_suffix(value: str, fmt: str | None) -> None:
    assert cli.trace_file_format(value, ["ar", "canonical"])[0] == fmt


def test_trace_file_shorthand_expands_in_place(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "rank0.json").write_text("{}")  # a folder of Kineto files
    args, notes = cli.expand_trace_file(["controller=pid", f"trace={tmp_path}", "seed=1", "trace.x=a.csv"])
    assert args == ["controller=pid", "trace=kineto", f"trace.path={tmp_path}", "seed=1", "trace.x=a.csv"]
    assert notes == [f"trace={tmp_path} read as trace=kineto trace.path={tmp_path}"]
    assert cli.expand_trace_file(["trace=st", "+trace=a.parquet"], ["st"]) == (
        ["trace=st", "+trace=a.parquet"],
        [],
    )
    # a folder with a plain name is a path unless it is an option
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "rank0.json").write_text("{}")
    (tmp_path / "st").mkdir()
    assert cli.expand_trace_file(["trace=profiles"], ["st"])[0] == ["trace=kineto", "trace.path=profiles"]
    assert cli.expand_trace_file(["trace=st"], ["st"])[0] == ["trace=st"]


def test_trace_file_shorthand_composes_with_hydra(tmp_path: Path) -> None:
    """Sweeps of one format, the shipped ByteDance layout, and values the grammar needs quoted."""
    from hydra import compose, initialize_config_dir

    from pacectl.data import DATA_DIR

    st = DATA_DIR / "bytedance" / "trace-ST.parquet"
    args, _ = cli.expand_trace_file([f"trace={st}"])
    assert args == ["trace=bytedance", f"trace.path={st}", f"trace.meta={st.with_name('meta-ST.yaml')}"]
    sweep, _ = cli.expand_trace_file(["-m", "trace=a.parquet,b.parquet"])
    assert sweep == ["-m", "trace=canonical", "trace.path=a.parquet,b.parquet"]
    with pytest.raises(
        ConfigError, match=r"must be of one format, got a.parquet \(canonical\), b.csv \(steplevel\)"
    ):
        cli.expand_trace_file(
            ["-m", "trace=a.parquet,b.csv"]
        )  # mixed: one line, not Hydra's "no such option"
    assert cli.expand_trace_file(["trace=a.parquet,b.parquet"])[0] == ["trace=a.parquet,b.parquet"]  # no -m
    values = (
        "/x/rank[0-3]*.json",
        "/tmp/with space/a.parquet",
        "/tmp/it's.parquet",
        "2024/a.csv",
        "données/é.json",
    )
    for value in values:
        args, _ = cli.expand_trace_file([f"trace={value}"])
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            assert compose("config", overrides=args).trace.path == value
    args, _ = cli.expand_trace_file(["trace=~/a.parquet"])  # the shell left ~ unexpanded: we do it
    assert args[1] == f"trace.path={Path('~/a.parquet').expanduser()}"
    assert cli.trace_file_format("run[1]/job.csv")[0] == "steplevel"  # the ending decides first
    for text in ("2024", "true", "1e3", "null", "a\\'b", "C:\\x\\"):  # no number, bool, or broken quote
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=["trace=canonical", f"trace.path={cli.hydra_value(text)}"])
        assert cfg.trace.path == text


def test_a_trace_file_of_unknown_kind_says_which_files_the_shorthand_takes(capsys) -> None:
    err = _check(capsys, ["trace=notes.txt"])
    assert "trace=notes.txt: no such option of trace" in err
    assert ".parquet (canonical)" in err and ".json.gz (kineto)" in err
    assert "trace=bytedance trace.path=<file> trace.meta=<meta.yaml>" in err


def test_an_unwritable_run_folder_is_one_line_before_hydra_starts(tmp_path: Path, monkeypatch) -> None:
    """Hydra would fail with a PermissionError traceback. (Checked through os.access, so that the
    test also runs as root, for whom every folder is writable.)"""
    locked = tmp_path / "ro"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and real_access(p, mode))
    problem = _dir_error([f"hydra.run.dir={locked}/x/y"])
    assert (
        problem
        == f"hydra.run.dir={locked}/x/y: {locked} is not writable (permission denied); pick a folder you can write to"
    )
    assert _dir_error([f"hydra.run.dir={tmp_path}/ok"]) is None
    monkeypatch.chdir(locked)
    problem = _dir_error(["trace=st"])
    assert (
        problem is not None and problem.startswith("the default run folder") and "hydra.run.dir=" in problem
    )
    assert _dir_error(["--help"]) is None  # prints and exits: no folder
    assert _dir_error(["--cfg", "job"]) is None
    assert _dir_error(["--cfg", "job", f"hydra.run.dir={locked}/x"]) is None
    monkeypatch.setenv("SCRATCH", str(tmp_path))
    assert _dir_error(["hydra.run.dir=${oc.env:SCRATCH}/x"]) is None  # resolved as Hydra does
    monkeypatch.delenv("SCRATCH")
    assert "hydra.run.dir must resolve to a folder" in _dir_error(["hydra.run.dir=${oc.env:SCRATCH}/x"])
    # with -m the job writes to hydra.sweep.dir (or multirun/ here): hydra.run.dir does not count
    assert _dir_error(["-m", f"hydra.run.dir={tmp_path}/ok", "seed=0,1"]) is not None
    assert _dir_error(["-m", f"hydra.sweep.dir={tmp_path}/ok", "seed=0,1"]) is None
    monkeypatch.chdir(tmp_path)
    assert _dir_error(["trace=st"]) is None


def test_a_controller_key_beside_a_controller_file_points_at_the_file(capsys) -> None:
    err = _check(capsys, ["controller_file=/tmp/c.yaml", "controller.gain=0.2"])
    assert "controller.gain=0.2: controller_file=/tmp/c.yaml sets the controller" in err
    assert "change gain in that file" in err and "controller=all" not in err


def test_a_folder_of_records_is_no_trace_but_says_which_file_to_name(capsys, tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    (records / "none.parquet").write_bytes(b"")
    assert cli.trace_file_format(str(records))[0] is None
    err = _check(capsys, [f"trace={records}"])
    assert f"It is a folder of none.parquet: name one, e.g. trace={records / 'none.parquet'}" in err


def test_a_key_of_another_option_beats_a_close_spelling_here(capsys) -> None:
    err = _check(capsys, ["backend=sim", "backend.record_dir=/tmp/x"])
    assert "It is a key of backend=torch" in err and "Did you mean backend.record=" not in err
    err = _check(capsys, ["controller=pid", "controller.kpp=0.5"])  # a typo stays a typo
    assert "Did you mean controller.kp=0.5?" in err


def test_a_file_where_the_default_run_folder_goes_is_named(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").write_text("not a folder")
    problem = _dir_error(["trace=st"])
    assert problem is not None and "outputs is a file, not a folder" in problem
    assert _dir_error(["-m", "seed=0,1"]) is None  # a sweep goes to multirun/


def test_a_misspelt_key_gets_the_fix_not_a_plus_override(capsys) -> None:
    """Unknown keys are refused whatever their form, so the message offers the spelling fix, never
    'add it with +key=...'."""
    err = _check(capsys, ["seeed=3"])
    assert "Did you mean seed=3?" in err and "+seeed" not in err
    assert "top-level keys: [" in _check(capsys, ["bogus=3"])  # nothing near: the keys there are
    err = _check(capsys, ["outptu.plots=false"])  # a section that does not exist
    assert "Did you mean output.plots=false?" in err and "+outptu" not in err
    err = _check(capsys, ["controller=pid", "controller.kpp=1"])
    assert "Did you mean controller.kp=1?" in err and "+controller" not in err
