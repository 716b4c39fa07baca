"""`python -m pacectl.traces`: the info/validate/convert contract (exit codes, no tracebacks)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pacectl.data import DATA_DIR
from pacectl.testing.commands import run_command
from pacectl.traces.__main__ import build_parser, main
from pacectl.traces.canonical import load_canonical

H200 = DATA_DIR / "h200-capture"
PAIR = DATA_DIR / "hta" / "trace_filter"
SINGLE = DATA_DIR / "hta" / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
JOB1 = DATA_DIR / "alibaba-pai" / "job_1_norm.csv"
ST = DATA_DIR / "bytedance" / "trace-ST.parquet"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pacectl.traces ARGS``, in this process."""
    return run_command(main, args, cwd=Path.cwd())


def test_info_h200_subprocess() -> None:
    """The module runs as a program (a fresh interpreter, once); the other tests call main(argv)."""
    r = subprocess.run(
        [sys.executable, "-m", "pacectl.traces", "info", str(H200)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    for key in (
        "ranks     4",
        "steps     4",
        "collectives per step per rank (gloo all_reduce): 3",
        "arrival spread",
        "clock alignment",
        "residual",
    ):
        assert key in r.stdout


def test_info_json_is_stdout_alone() -> None:
    """--json: stdout parses as JSON (the text summary goes to stderr)."""
    r = _run("info", str(H200), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["ranks"] == [0, 1, 2, 3] and info["world_size"] == 4
    assert info["collectives_per_step_per_rank"] == 3  # what the text says, as numbers
    assert 0.0 < info["step_time_s"]["median"] < info["step_time_s"]["max"] and info["step_time_cv"] > 0
    assert info["arrival_spread_first_bucket_s"]["median"] > 0
    assert "ranks     4" in r.stderr


@pytest.mark.parametrize("path", [PAIR, SINGLE, JOB1])
def test_info_and_validate_usable(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(path)]) == 0
    assert "ranks" in capsys.readouterr().out
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.startswith(("ok:", "warning:"))


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    text = gzip.decompress(SINGLE.read_bytes()).decode()
    bad = text.replace('"dur": 173209.713', '"dur": -1').replace('"dur": 180293.695', '"dur": NaN')
    (tmp_path / "rank-34.json").write_text(bad)
    r = _run("validate", str(tmp_path / "rank-34.json"))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and all(":event #" in e and ": dur:" in e for e in errors)
    assert r.stderr.splitlines()[-1] == "invalid: 2 problems"  # one form, in the right number
    from pacectl.traces.kineto import Problem, TraceProblems

    two = [Problem("f.json", f"event #{i}", "dur", "dur must be >= 0, got -1") for i in range(2)]
    assert str(TraceProblems(two)).endswith(
        "; 1 more problem, list them all with `python -m pacectl.traces validate`"
    )


def test_the_messages_a_fresh_user_met_read_right(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # random bytes as JSON: "must be valid JSON, got a trace must start with ..., got '\ufffd'"; a NaN
    # in a CSV: "(and not absurd)", "1 rows are bad"; a glob of traces: named trace.path (pacectl.run's
    # key); validate: "1 problem" here, "1 problem(s)" there
    (tmp_path / "random.json").write_bytes(b"\x8f\x01binary")
    assert main(["info", str(tmp_path / "random.json")]) == 2
    err = capsys.readouterr().err
    assert "got '\\x8f'" in err and "\ufffd" not in err and "got a trace" not in err, err
    assert err.startswith("pacectl.traces: error: trace file must be valid JSON; at character 0 "), err
    (tmp_path / "nan.csv").write_text("worker,time,batch_time_norm\n0,1,1.0\n1,1,nan\n0,2,1.0\n1,2,1.0\n")
    assert main(["validate", str(tmp_path / "nan.csv")]) == 2
    err = capsys.readouterr().err
    assert "batch_time_norm must be a finite number in [0, " in err and "absurd" not in err, err
    assert "1 row is bad. Drop or repair it." in err and err.splitlines()[-1] == "invalid: 1 problem", err
    assert main(["info", str(tmp_path / "nomatch" / "*")]) == 2
    err = capsys.readouterr().err
    assert "trace.path" not in err and "the glob given as PATH must match at least one file" in err, err


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"{not json", "trace file must"),
        (b"", "must not be empty"),
        (gzip.compress(b'{"traceEvents": [{"ph": "X"}', mtime=0)[:-12], "ends early"),
    ],
    # ids, not bytes: xdist's workers must collect the same names
    ids=["malformed-json", "empty", "truncated-gzip"],
)
def test_unusable_exits_nonzero_without_traceback(
    tmp_path: Path, content: bytes, match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "rank0.json"
    p.write_bytes(content)
    for cmd in ("info", "validate"):
        assert main([cmd, str(p)]) == 2  # an uncaught exception would propagate (a traceback)
        assert match in capsys.readouterr().err


def test_empty_directory_and_bad_args(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path)]) == 2
    assert "empty directory" in capsys.readouterr().err
    for argv, match in (
        (["info"], "required: PATH"),
        (["convrt", "x"], "invalid choice: 'convrt'"),
        (["convert", "x"], "required: -o/--output"),
        (["info", "x", "--max-mb", "abc"], "--max-mb: invalid float value"),
        (["info", "x", "--max-mb", "nan"], "--max-mb: must be a finite number > 0, got 'nan'"),
        (["validate", "x", "--collective-s", "-1"], "--collective-s: must be a finite number > 0"),
        (["info", "x", "--world-size", "0"], "--world-size: must be an integer >= 1, got '0'"),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err and "--help" in err, err  # one line, no usage block


def test_convert_writes_canonical_atomically(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "h200.parquet"
    assert main(["convert", str(H200), "-o", str(out)]) == 0
    back = load_canonical(out)
    assert back.meta.dp_size == 4 and back.fmt == "kineto"
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    out2 = tmp_path / "never.parquet"
    assert main(["convert", str(bad), "-o", str(out2)]) == 2
    assert not out2.exists() and not list(tmp_path.glob(".never*"))


@pytest.mark.slow
def test_run_accepts_kineto_and_steplevel(tmp_path: Path) -> None:
    for trace, extra in (("kineto", f"trace.path={PAIR}"), ("steplevel", f"trace.path={JOB1}")):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pacectl.run",
                f"trace={trace}",
                extra,
                "controller=threshold",
                "output.plots=false",
                f"hydra.run.dir={tmp_path / trace}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert (tmp_path / trace / "summary.json").is_file()


def test_info_marks_normalised_steplevel_times(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(JOB1)]) == 0
    out = capsys.readouterr().out
    assert "NORMALISED units, not real time" in out
    step_line = next(line for line in out.splitlines() if line.startswith("step time"))
    assert "units" in step_line and " ms" not in step_line
    assert "collectives per step per rank (one modelled per step: the file records none): 1" in out
    assert main(["validate", str(JOB1)]) == 0
    assert "times in normalised units" in capsys.readouterr().out


def test_info_and_validate_print_steplevel_repairs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = JOB1.read_text().splitlines(keepends=True)
    (tmp_path / "job.csv").write_text("".join(lines[:100] + lines[101:]))  # one row lost
    for cmd in ("info", "validate"):
        assert main([cmd, str(tmp_path / "job.csv")]) == 0
        out = capsys.readouterr().out
        assert "warning: " in out and "dropped 1 of 300 steps (9 rows): not recorded by all 10 workers" in out


@pytest.mark.parametrize("where", ["dir", "under_file", "proc"])
def test_convert_unwritable_output_is_a_write_error(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if where == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    (tmp_path / "afile").write_text("x")
    out = {
        "dir": tmp_path,
        "under_file": tmp_path / "afile" / "y.parquet",
        "proc": Path("/proc/x/y.parquet"),
    }[where]
    before = sorted(tmp_path.rglob("*"))
    assert main(["convert", str(JOB1), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pacectl.traces: error: could not write {out}: ") and "could not read" not in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(tmp_path.rglob("*")) == before  # nothing half-written


def test_convert_output_must_be_a_parquet_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.csv"
    assert main(["convert", str(JOB1), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "its name must end in .parquet (e.g. " in err and str(out.with_suffix(".parquet")) in err
    assert not out.exists()


def test_a_whole_file_problem_names_the_file_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes((H200 / "gloo4_rank0.json.gz").read_bytes()[:3000])
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "ends early" in err and err.count(str(bad)) == 1, err


def test_folder_with_two_jobs_names_a_glob(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for r in range(4):
        (tmp_path / f"gloo4_rank{r}.json.gz").write_bytes((H200 / f"gloo4_rank{r}.json.gz").read_bytes())
    (tmp_path / "nccl1_rank0.json.gz").write_bytes(SINGLE.read_bytes())  # another job (world_size 300)
    assert main(["info", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "files of 2 jobs" in err and f"'{tmp_path / 'gloo4_rank*.json.gz'}'" in err


def test_validate_says_a_truncated_file_is_usable_with_a_warning_unless_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # half a Kineto file printed 'ok:' and exited 0, the truncation only a warning line above, while
    # validate's help said 'exit 2 if any': the README's rule (read up to the last whole event, with a
    # warning; strict refuses it) holds, and the help and the ok line now say so
    text = gzip.decompress((H200 / "gloo4_rank0.json.gz").read_bytes())
    cut = tmp_path / "trunc.json"
    cut.write_bytes(text[: len(text) // 2])
    assert main(["validate", str(cut)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"warning: {cut}: truncated"), out
    assert out[-1].startswith(f"ok: {cut} (kineto, 1 rank, ") and "usable with 2 warnings above" in out[-1]
    assert "--strict makes truncation and missing ranks problems" in out[-1]
    assert main(["validate", "--strict", str(cut)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "invalid: 1 problem"
    assert "truncation: a warning, see --strict" in " ".join(build_parser().format_help().split())


def test_validate_names_a_truncated_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for r in (0, 2, 3):
        (tmp_path / f"gloo4_rank{r}.json.gz").write_bytes((H200 / f"gloo4_rank{r}.json.gz").read_bytes())
    text = gzip.decompress((H200 / "gloo4_rank1.json.gz").read_bytes())
    (tmp_path / "gloo4_rank1.json").write_bytes(text[:1_500_000])
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'gloo4_rank1.json'}: ") and "looks truncated" in err


def test_errors_use_this_commands_options_not_pacectl_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "garbage.parquet"
    bad.write_bytes(b"garbage")
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pacectl.traces: error: the trace file must be a Parquet file")
    assert "--format bytedance, kineto or steplevel" in err and "trace=" not in err


def test_a_bytedance_trace_finds_its_meta_file_beside_it(capsys, tmp_path) -> None:
    """The shipped layout (trace-AR.parquet next to meta-AR.yaml) needs no --meta; elsewhere a
    missing --meta is a command-line mistake (exit 2) that says what to add."""
    from pacectl.data import DATA_DIR

    assert main(["info", str(DATA_DIR / "bytedance" / "trace-ST.parquet")]) == 0
    captured = capsys.readouterr()
    assert "as a ByteDance trace with" in captured.err and "meta-ST.yaml" in captured.err
    assert "job 'ST'" in captured.out
    lone = tmp_path / "trace-ST.parquet"
    lone.write_bytes((DATA_DIR / "bytedance" / "trace-ST.parquet").read_bytes())
    assert main(["info", "--format", "bytedance", str(lone)]) == 2
    assert "got no --meta; add --meta <meta.yaml>" in capsys.readouterr().err


def test_a_folder_of_other_traces_names_its_files(capsys) -> None:
    from pacectl.data import DATA_DIR

    assert main(["info", str(DATA_DIR / "alibaba-pai")]) == 2
    err = capsys.readouterr().err
    assert "read as a folder of Kineto JSON files" in err and "it also holds job_1_norm.csv" in err
    assert len(err.strip().splitlines()) == 1


def test_a_parquet_file_read_as_kineto_is_named_as_parquet() -> None:
    r = _run("info", str(ST), "--format", "kineto")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "It looks like a Parquet file" in r.stderr and "leave out --format" in r.stderr
    r = _run("info", str(JOB1), "--format", "kineto")
    assert r.returncode == 2 and "It looks like a steplevel trace by its name" in r.stderr


def test_info_says_which_ranks_a_bytedance_trace_records(capsys: pytest.CaptureFixture[str]) -> None:
    ar = DATA_DIR / "bytedance"
    assert main(["info", str(ar / "trace-AR.parquet"), "--meta", str(ar / "meta-AR.yaml")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ranks"))
    assert line.startswith("ranks     16 of world_size 64 recorded = one per (dp, pp) cell, its tp x dsp"), (
        line
    )
    assert main(["info", str(ST), "--meta", str(ar / "meta-ST.yaml")]) == 0  # tp 1: every rank recorded
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ranks"))
    assert line.startswith("ranks     8 of world_size 8 recorded [0, 1,"), line
