"""``python -m pacectl.run`` end to end: outputs, the summary contract, overrides and user errors."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pacectl.config import CONF_DIR
from pacectl.controllers import all_families
from pacectl.data import DATA_DIR, shipped_trace
from pacectl.run import main
from pacectl.testing.commands import run_command

RUN_KEYS = {
    "throughput_it_per_s",
    "iteration_time_mean_s",
    "iteration_time_p99_s",
    "cv",
    "spread_median_s",
    "pacing_delay_total_s",
}


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m pacectl.run ARGS`` in ``cwd``, run in this process (:func:`run_command`)."""
    return run_command(main, args, cwd=cwd)


@pytest.mark.slow
def test_default_run_writes_the_contract(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _run(f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace"]["name"] == "AR" and summary["trace"]["path"].endswith("trace-AR.parquet")
    # 64 GPUs, TP 4: 16 ranks modelled, and the summary says why
    assert summary["trace"]["world_size"] == 64 and summary["trace"]["ranks_modelled"] == 16
    assert "tensor-parallel peers are folded" in summary["trace"]["ranks_note"]
    assert summary["comm_model"] == "null"
    assert set(summary["fidelity"]) >= {"step_time_median_abs_err_frac", "step_time_p90_abs_err_frac"}
    assert set(summary["runs"]) == {"none", *all_families()}  # controller=all: the registry's
    for run in summary["runs"].values():
        assert RUN_KEYS <= set(run)
        # the null model: no controller beats no pacing
        assert run["iteration_time_mean_s"] >= summary["runs"]["none"]["iteration_time_mean_s"] - 1e-9
    for name in ("iterations.parquet", "iteration_time.png", "spread.png", "report.md"):
        assert (out / name).stat().st_size > 0
    assert "comm model: null" in proc.stdout and "threshold" in proc.stdout
    # the job log keeps the console lines (plain on the console, timestamped in the file)
    log = (out / "run.log").read_text()
    assert "[pacectl.run][INFO] - outputs:" in log and "threshold" in log
    assert not proc.stdout.startswith("[")


def test_one_controller_with_override_on_another_trace(tmp_path: Path) -> None:
    path, meta = shipped_trace("ST")
    out = tmp_path / "run"
    proc = _run(
        "controller=pid",
        "controller.kp=0.8",
        "trace=bytedance",
        f"trace.path={path}",
        f"trace.meta={meta}",
        f"hydra.run.dir={out}",
        "output.plots=false",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"none", "pid"}
    assert summary["controller_params"]["pid"]["kp"] == 0.8
    assert summary["trace"]["name"] == "ST"
    assert summary["paced_collective"] == "grads-reduce-scatter"  # Megatron's own: the op type is its name


def _readme_examples() -> list[list[str]]:
    """The arguments of the README's "Useful overrides" commands that name no placeholder file."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text.split("Useful overrides", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    examples = []
    for line in block.splitlines():
        command = line.split("  #", 1)[0].strip()
        if not command.startswith("python -m pacectl.run"):
            continue
        args = shlex.split(command)[3:]
        if not any(re.search(r"\bDIR\b|RUN_DIR|my-|profiles/", a) for a in args):
            examples.append(args)
    return examples


def test_the_readme_lists_runnable_examples() -> None:
    assert len(_readme_examples()) >= 5, _readme_examples()


@pytest.mark.parametrize("args", _readme_examples(), ids=" ".join)
def test_a_readme_example_runs(tmp_path: Path, args: list[str]) -> None:
    """Each README example runs as written (outputs that cost time turned off): a replay under
    comm=contention crashed on every trace for a day before this test."""
    out = tmp_path / "run"
    quick = ("output.plots=false", "output.report=false", "output.iterations=false")
    where = f"hydra.sweep.dir={out}" if "-m" in args else f"hydra.run.dir={out}"
    proc = _run(*args, *quick, where, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(out.rglob("summary.json")), sorted(p.name for p in out.rglob("*"))


def test_the_stragglers_cost_comes_first_and_can_be_skipped(tmp_path: Path) -> None:
    """A replay first runs the what-if analysis for the summary (announced with its replay count:
    on large traces it takes minutes); analysis.whatif=false skips it."""
    common = ("trace=st", "controller=threshold", "output.plots=false", "output.report=false")
    proc = _run(*common, f"hydra.run.dir={tmp_path / 'with'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "stragglers' cost first (what-if, null model): 31 replays of the trace" in proc.stdout
    summary = json.loads((tmp_path / "with" / "summary.json").read_text())
    assert summary["whatif"]["blocking_slowdown"] == pytest.approx(1.18, abs=0.005)
    proc = _run(*common, "analysis.whatif=false", f"hydra.run.dir={tmp_path / 'without'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "stragglers' cost" not in proc.stdout
    summary = json.loads((tmp_path / "without" / "summary.json").read_text())
    assert summary["whatif"] is None and set(summary["runs"]) == {"none", "threshold"}


def test_a_controller_that_never_paced_is_named(tmp_path: Path) -> None:
    """A threshold above every spread applies no delay: the run says so (in a replay or simulation
    it then reproduces no pacing exactly), in the console, summary.json and report.md."""
    from pacectl.run import never_paced_line

    out = tmp_path / "run"
    proc = _run(
        "backend=sim",
        "backend.num_ranks=8",
        "backend.num_iterations=30",
        "controller=threshold",
        "controller.on_threshold_s=100",
        "controller.off_threshold_s=50",
        "output.plots=false",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "note: never paced (delay total 0): threshold (on_threshold_s=100" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert "Their runs reproduce no pacing" in summary["never_paced"]
    assert (
        summary["runs"]["threshold"]["iteration_time_mean_s"]
        == summary["runs"]["none"]["iteration_time_mean_s"]
    )
    assert "never paced" in (out / "report.md").read_text()
    paced = {
        "none": {"pacing_delay_total_s": 0.0, "spread_median_s": 0.005},
        "pid": {"pacing_delay_total_s": 0.1},
    }
    assert never_paced_line(paced, {}, live=True) == ""
    paced["forecast"] = {"pacing_delay_total_s": 0.0}
    line = never_paced_line(paced, {"forecast": {"on_threshold_s": 0.0}}, live=True)
    # no threshold to blame: no advice to lower one
    assert line.startswith("never paced (delay total 0): forecast;") and "run-to-run noise" in line
    assert "0.005 s" in line and "lower on_threshold_s" not in line


def test_multirun_sweep(tmp_path: Path) -> None:
    proc = _run(
        "-m",
        "trace=st",
        "controller=threshold,ewma",
        "output.plots=false",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    summaries = sorted((tmp_path / "sweep").glob("*/summary.json"))
    assert len(summaries) == 2


HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _torch_case(args: list[str], message: str) -> Any:
    """A backend=torch case: its own check runs only where torch is installed."""
    return pytest.param(
        args, message, marks=pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (backend=torch checks)")
    )


def test_a_trace_file_replays_by_its_path(tmp_path: Path) -> None:
    """``trace=<file>`` (the issue's promise for live records and converted traces) names its
    format from the suffix, and the summary names the collective as the source recorded it."""
    from pacectl.traces.canonical import write_canonical
    from pacectl.traces.kineto import load_kineto

    path = tmp_path / "h200.parquet"
    write_canonical(load_kineto(DATA_DIR / "h200-capture"), path)
    out = tmp_path / "run"
    proc = _run(
        f"trace={path}", "controller=none", "output.plots=false", f"hydra.run.dir={out}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert f"trace={path} read as trace=canonical trace.path={path}" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace"]["path"] == str(path) and summary["trace"]["world_size"] == 4
    assert summary["paced_collective"] == "gloo all_reduce (canonical op type grads-reduce-scatter)"
    assert "- **paced collective**: gloo all_reduce" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    "args,message",
    [
        (["controller=pidd"], "controller=pidd: no such option of controller"),
        (["controller=pid", "controller.kpp=1"], "kpp"),
        (["controller=pid", "controller.kp=-1"], "kp must be"),
        (["trace=bytedance"], "trace.path must be set"),
        (
            ["trace=bytedance", "trace.path=/nonexistent.parquet", "trace.meta=/nonexistent.yaml"],
            "must be an existing file",
        ),
        (["backend.paced_optype=optimizer"], "paced_optype must be a DP collective"),
        # keys nothing reads (typos, + additions) and combinations that cannot run
        (["+guard.foo=1"], "guard has unknown key(s) ['foo']"),
        (["+backend.num_ranks=8"], "backend has unknown key(s) ['num_ranks']"),
        (["+trace.bogus=1"], "trace has unknown key(s) ['bogus']"),
        (["backend=sim", "+backend.bogus=2"], "backend has unknown key(s) ['bogus']"),
        (["analysis=whatif", "backend=sim"], "analysis=whatif analyses a recorded trace"),
        (["guard.window_iters=0"], "(override: guard.window_iters=<value>)"),
        ([f"controller_file={CONF_DIR / 'cluster' / 'st.yaml'}"], "st.yaml': controller must be one of"),
        _torch_case(
            ["backend=torch", "backend.nproc_per_node=1"], "or backend.straggler.rank=null for no straggler"
        ),
        # backend=torch: checked before any rank starts
        _torch_case(["backend=torch", "backend.pacing.gather=bogus"], "backend.pacing.gather must be one of"),
        _torch_case(
            ["backend=torch", "backend.nproc_per_node=abc"], "backend.nproc_per_node must be an integer"
        ),
        _torch_case(
            ["backend=torch", "backend.pacing.spin_s=-1"], "backend.pacing.spin_s must be >= 0, got -1.0"
        ),
        _torch_case(["backend=torch", "backend.workload.model=cnn"], "backend.workload.model must be one of"),
        _torch_case(
            ["backend=torch", "backend.straggler.prob=2"], "backend.straggler.prob must be in [0, 1]"
        ),
        _torch_case(
            ["backend=torch", "backend.record_dir=/proc/nope"],
            "backend.record_dir: cannot write the live records",
        ),
        _torch_case(
            ["backend=torch", f"backend.record_dir={__file__}"], "backend.record_dir must be a folder"
        ),
        _torch_case(
            ["backend=torch", f"backend.pacing.control_path={Path(__file__).parent}"],
            "is a folder: it names the JSON file rank 0 watches",
        ),
        ([f"hydra.run.dir={__file__}"], "hydra.run.dir must be a folder (new or existing)"),
        # Hydra only warns about a missing search-path folder, and its presets then look missing
        (
            ["hydra.searchpath=[file:///nonexistent/conf]", "cluster=mine"],
            "file:///nonexistent/conf is not a folder",
        ),
        (  # a sweep of search paths: each job's checked
            ["-m", "hydra.searchpath=[file:///nonexistent/conf],[file:///tmp]", "cluster=mine"],
            "file:///nonexistent/conf is not a folder",
        ),
        # Hydra's composition errors, in one line with a did-you-mean (checked before Hydra runs)
        (["controler=threshold"], "no such config key. Did you mean controller=threshold?"),
        (["backend=sim", "backend.num_rank=8"], "Did you mean backend.num_ranks=8?"),
        (["controller=thresh"], "no such option of controller (available: all, "),
        (["controller.gain=0.3"], "controller=all (the default) runs every family"),
        (["controller=pid", "controller.kp=0.5,0.6"], "add --multirun"),
        (["~guard"], "removing config keys is not supported"),
        (["trace=st", "trace.path="], "trace.path must name a file, got an empty value"),
        (["analysis.whatif=maybe"], "analysis.whatif must be true or false, got 'maybe'"),
        (["guard.max_delay_frac=nan"], "max_delay_frac must be a finite number > 0, got nan"),
        # a simulation too large for memory stops before it allocates anything
        (["backend=sim", "backend.num_ranks=100000000", "backend.num_iterations=100000"], "GB of memory"),
        # without torch, the live backend says so before anything else
        pytest.param(
            ["backend=torch"],
            "backend=torch needs PyTorch, which is not installed",
            marks=pytest.mark.skipif(
                HAVE_TORCH, reason="torch is installed: the live backend's own checks run"
            ),
        ),
    ],
)
def test_user_errors_are_clear_and_leave_no_output(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "run"
    trace = [] if any(a.startswith("trace") for a in args) else ["trace=st"]
    proc = _run(*trace, *args, f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("warning:")]
    assert len(errors) == 1, proc.stderr  # one line (beside warnings about ignored overrides)
    assert not out.exists(), sorted(p.name for p in out.iterdir())  # no folder at all: Hydra writes nothing


def test_a_failed_run_leaves_no_dated_folders(tmp_path: Path) -> None:
    """Hydra's default run folder is outputs/<date>/<time>: a failed job removes all three again."""
    bad = tmp_path / "short.parquet"
    bad.write_bytes(shipped_trace("ST")[0].read_bytes()[:3000])  # passes every check before the read
    proc = _run("trace=canonical", f"trace.path={bad}", cwd=tmp_path)
    assert proc.returncode == 2 and "truncated" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.parquet"]


def test_a_failed_rerun_keeps_the_earlier_run_folder_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "run"
    good = _run(
        "trace=st", "controller=threshold", "output.plots=false", f"hydra.run.dir={out}", cwd=tmp_path
    )
    assert good.returncode == 0, good.stderr
    assert (out / "config.yaml").is_file() and (out / "run.log").is_file()  # staged with the outputs
    assert not (out / ".hydra").exists()  # Hydra writes nothing into the run folder
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    bad = tmp_path / "short.parquet"
    bad.write_bytes(shipped_trace("ST")[0].read_bytes()[:3000])
    proc = _run("trace=canonical", f"trace.path={bad}", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2 and "truncated" in proc.stderr
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # the failed rerun staged its config.yaml and run.log, and published nothing
    assert f"warning: {out} holds an earlier run's outputs (summary.json)" in proc.stderr  # said first


def test_corrupt_trace_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not really parquet")
    _, meta = shipped_trace("ST")
    out = tmp_path / "run"
    proc = _run(
        "trace=bytedance", f"trace.path={bad}", f"trace.meta={meta}", f"hydra.run.dir={out}", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "must be a Parquet file" in proc.stderr and "bad.parquet" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_whatif_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "wi"
    proc = _run("analysis=whatif", "trace=st", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads((out / "whatif.json").read_text())
    assert {"blocking_slowdown", "by_dp_rank", "by_stage", "by_optype", "m_w", "m_s"} <= set(payload)
    assert (out / "whatif_heatmap.png").stat().st_size > 0
    assert json.loads((out / "timeline.json").read_text())["traceEvents"]
    assert "worst rank" in proc.stdout and "blocking slowdown" in proc.stdout
    assert "(whatif.json, whatif_heatmap.png, timeline.json" in proc.stdout


def test_whatif_without_plots_lists_what_it_wrote(tmp_path: Path) -> None:
    out = tmp_path / "wi"
    proc = _run("analysis=whatif", "trace=st", "output.plots=false", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (out / "whatif_heatmap.png").exists() and (out / "whatif.json").is_file()
    assert "(whatif.json, timeline.json for ui.perfetto.dev)" in proc.stdout


def test_whatif_bad_timeline_step(tmp_path: Path) -> None:
    out = tmp_path / "wi"
    proc = _run(
        "analysis=whatif", "trace=st", "analysis.timeline_step_index=99", f"hydra.run.dir={out}", cwd=tmp_path
    )
    assert proc.returncode == 2 and "timeline_step_index must be in [0, 32)" in proc.stderr
    assert not (out / "whatif.json").exists()


def test_the_console_and_report_md_word_each_fact_once(tmp_path: Path) -> None:
    """summary.json's context lines are what both the console and report.md show, word for word
    (the console leaves out those it printed as they happened)."""
    from pacectl.report import PRINTED_LIVE

    out = tmp_path / "run"
    proc = _run(
        "trace=st", "controller=threshold", "output.plots=false", f"hydra.run.dir={out}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    context = json.loads((out / "summary.json").read_text())["context"]
    labels = [label for label, _ in context]
    assert {"input", "comm model", "replay fidelity (null model)", "energy", "note"} <= set(labels), labels
    report_md = (out / "report.md").read_text()
    for label, line in context:
        assert f"- **{label}**: {line}" in report_md
        assert (f"{label}: {line}" in proc.stdout) == (label not in PRINTED_LIVE), label


def test_warnings_are_one_line_and_kept_with_the_results(tmp_path: Path) -> None:
    """A replay of 3 of the 4 recorded ranks warns: on one line, in summary.json, report.md, run.log."""
    out = tmp_path / "run"
    ranks = DATA_DIR / "h200-capture" / "gloo4_rank[012].json.gz"
    proc = _run(
        "trace=kineto", f"trace.path='{ranks}'", "controller=threshold", f"hydra.run.dir={out}", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    line = "warning (KinetoWarning): the number of rank files must equal world_size=4, got 3"
    assert (
        line in proc.stderr and line not in proc.stdout and "kineto.py" not in proc.stdout + proc.stderr
    )  # no source lines
    summary = json.loads((out / "summary.json").read_text())
    assert [w for w in summary["warnings"] if w.startswith("KinetoWarning: the number of rank files")]
    assert "KinetoWarning" in (out / "report.md").read_text()
    assert line in (out / "run.log").read_text()


def test_overrides_the_backend_never_reads_are_reported(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _run(
        "backend=sim",
        "backend.num_iterations=20",
        "trace=st",
        "controller=none",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "override ignored: trace=st: backend=sim does not read a trace" in proc.stderr


def test_normalised_trace_times_are_flagged(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _run("trace=alibaba", "controller=none", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace"]["time_unit"] == "normalized" and "not real time" in summary["time_unit_note"]
    assert "time unit: this trace's times are normalised" in proc.stdout
    st = tmp_path / "st"
    assert _run("trace=st", "controller=none", f"hydra.run.dir={st}", cwd=tmp_path).returncode == 0
    other = json.loads((st / "summary.json").read_text())
    assert other["trace"]["time_unit"] == "s" and "time_unit_note" not in other


def test_output_iterations_false_skips_the_per_rank_parquet(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _run(
        "backend=sim",
        "backend.num_ranks=8",
        "backend.num_iterations=30",
        "controller=threshold",
        "output.iterations=false",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "summary.json").is_file() and not (out / "iterations.parquet").exists()
    bad = _run("backend=sim", "output.iterations=maybe", f"hydra.run.dir={tmp_path / 'bad'}", cwd=tmp_path)
    assert bad.returncode == 2 and "output.iterations must be true or false" in bad.stderr


def test_controller_overrides_beside_a_controller_file_are_reported(tmp_path: Path) -> None:
    """controller_file replaces the controller group; a file pacectl.tune flagged says so when run."""
    ctl = tmp_path / "controller.yaml"
    ctl.write_text(
        "# Tuned by pacectl.tune\n"
        "# WARNING: no trial improves on no pacing on these episodes (tune.json: improvement_rule):\n"
        "# this is the best trial found, not an improvement; recommended: no pacing (controller=none).\n"
        "# Use: python -m pacectl.run controller_file=<this file>\n"
        "name: threshold\non_threshold_s: 0.5\noff_threshold_s: 0.1\n"
    )
    out = tmp_path / "run"
    proc = _run("trace=st", f"controller_file={ctl}", "controller=pid", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "override ignored: controller=pid: controller_file=" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"none", "threshold"}
    assert any(w.startswith("override ignored: controller=pid") for w in summary["warnings"])
    flagged = [w for w in summary["warnings"] if "WARNING: no trial improves on no pacing" in w]
    assert len(flagged) == 1 and flagged[0].endswith("recommended: no pacing (controller=none).")
    assert proc.stderr.count("no trial improves") == 1  # once, from the job (not also from the pre-check)


def test_a_controller_file_tuned_for_another_trace_says_so(tmp_path: Path) -> None:
    ctl = tmp_path / "controller.yaml"
    ctl.write_text(
        "# Tuned by pacectl.tune: study 'st-threshold'\n"
        "# Use: python -m pacectl.run controller_file=<this file> trace=st\n"
        "name: threshold\non_threshold_s: 0.5\noff_threshold_s: 0.1\n"
    )
    there = _run("trace=ar", f"controller_file={ctl}", f"hydra.run.dir={tmp_path / 'ar'}", cwd=tmp_path)
    assert there.returncode == 0, there.stderr
    assert "was tuned for trace=st, and this run has trace=ar" in there.stderr
    here = _run("trace=st", f"controller_file={ctl}", f"hydra.run.dir={tmp_path / 'st'}", cwd=tmp_path)
    assert here.returncode == 0 and "was tuned for" not in here.stderr, here.stderr
    sim = _run(
        "backend=sim",
        "backend.num_ranks=8",
        "backend.num_iterations=20",
        f"controller_file={ctl}",
        f"hydra.run.dir={tmp_path / 'sim'}",
        cwd=tmp_path,
    )
    assert sim.returncode == 0, sim.stderr
    assert "was tuned for backend=replay, and this run has backend=sim:" in sim.stderr  # no trace compared


def test_a_tuned_file_is_compared_only_on_what_the_run_reads() -> None:
    from pacectl.config import use_line_differences

    use = "# Use: python -m pacectl.run controller_file=<this file> trace=st"
    assert use_line_differences(use, {"backend": "replay", "trace": "ar"}) == (["trace=st"], ["trace=ar"])
    assert use_line_differences(use, {"backend": "replay", "trace": "st"}) is None
    # a live run reads no trace (the default trace=ar is still composed) and has its own fabric
    live = use_line_differences(
        use, {"backend": "torch", "trace": "ar", "cluster": "dgx_superpod", "comm": "null"}
    )
    assert live == (["backend=replay"], ["backend=torch"])
    sim_use = "# Use: python -m pacectl.run controller_file=<this file> backend=sim cluster=contended comm=contention"
    assert (
        use_line_differences(sim_use, {"backend": "sim", "cluster": "contended", "comm": "contention"})
        is None
    )
    assert use_line_differences(
        sim_use, {"backend": "sim", "cluster": "dgx_superpod", "comm": "contention"}
    ) == (
        ["cluster=contended"],
        ["cluster=dgx_superpod"],
    )


def test_a_trace_profile_without_its_trace_says_what_is_replayed(tmp_path: Path) -> None:
    proc = _run("cluster=st", "controller=none", f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "cluster=st stands for trace(s) ST, but this run replays trace-AR.parquet" in proc.stderr
    ok = _run("cluster=st", "trace=st", "controller=none", f"hydra.run.dir={tmp_path / 'b'}", cwd=tmp_path)
    assert ok.returncode == 0 and "stands for trace(s)" not in ok.stderr, ok.stderr


@pytest.mark.parametrize("with_parquet", [True, False])
def test_a_job_too_large_for_memory_stops_after_its_first_run(
    tmp_path: Path, monkeypatch, with_parquet
) -> None:
    from hydra import compose, initialize_config_dir

    from pacectl import run
    from pacectl.errors import ConfigError

    overrides = ["backend=sim", "backend.num_ranks=8", "backend.num_iterations=50", "output.plots=false"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=[*overrides, f"output.iterations={str(with_parquet).lower()}"]
        )
    # none and five families, 50 iterations, 8 ranks; without the parquet the runs stream, one at a time
    need = run.memory_needed(8, 50, 6, with_parquet)
    assert need == run.BASE_BYTES + 8 * 50 * run.BYTES_PER_DRAW_CELL + 8 * run.BYTES_PER_RANK + (
        6 * 50 * 8 * run.BYTES_PER_ROW if with_parquet else 50 * run.BYTES_PER_STREAMED_ITERATION
    )
    monkeypatch.setattr(run, "resident_bytes", lambda: 0)
    monkeypatch.setattr(run, "available_memory_bytes", lambda: need - 1)
    calls = []
    from pacectl import experiment

    original = experiment.make_experiment

    def counting(cfg):  # type: ignore[no-untyped-def]
        exp = original(cfg)
        inner = exp.run
        exp.run = lambda *a, **k: calls.append(a[0]) or inner(*a, **k)
        return exp

    monkeypatch.setattr(experiment, "make_experiment", counting)  # run_experiment imports it when run
    with pytest.raises(ConfigError, match="would need about .* GB of memory") as err:
        run.run_experiment(cfg, tmp_path)
    assert ("output.iterations=false" in str(err.value)) == with_parquet
    assert calls == ["none"] and not any(tmp_path.iterdir())
    monkeypatch.setattr(run, "available_memory_bytes", lambda: need)
    run.run_experiment(cfg, tmp_path)  # exactly enough: runs
    assert (tmp_path / "summary.json").exists()


def test_fidelity_line_names_clipped_estimates() -> None:
    from pacectl.report import fidelity_figures

    f = {"step_time_median_abs_err_frac": 0.0, "step_time_p90_abs_err_frac": 0.169}
    assert fidelity_figures(f) == "median 0 %, p90 16.9 % abs. rel. error"
    f.update(launch_clipped=15, transfer_clipped=2, num_op_instances=1240)
    assert fidelity_figures(f).endswith("(17 of 1240 op timing estimates clipped)")


def test_memory_refusal_suggests_skipping_the_parquet_only_when_that_fits(monkeypatch) -> None:
    from pacectl import run
    from pacectl.errors import ConfigError

    ranks, iterations, runs = 10_000, 1_000, 6
    streamed = run.memory_needed(ranks, iterations, runs, False)
    assert run.memory_needed(ranks, iterations, runs, True) > streamed
    monkeypatch.setattr(run, "resident_bytes", lambda: 0)
    monkeypatch.setattr(run, "available_memory_bytes", lambda: streamed)
    with pytest.raises(ConfigError, match=rf"output\.iterations=false \(then about {streamed / 1e9:.1f} GB"):
        run._check_memory(ranks, iterations, runs, True, announce=False)
    run._check_memory(ranks, iterations, runs, False, announce=False)  # streamed: fits
    monkeypatch.setattr(run, "available_memory_bytes", lambda: streamed - 1)
    with pytest.raises(ConfigError) as err:
        run._check_memory(ranks, iterations, runs, True, announce=False)
    assert "output.iterations=false" not in str(err.value) and "run fewer iterations or ranks" in str(
        err.value
    )
    # what this process holds already is part of the estimate, not needed again
    monkeypatch.setattr(run, "resident_bytes", lambda: 1)
    run._check_memory(ranks, iterations, runs, False, announce=False)


def test_the_streamed_memory_estimate_grows_with_ranks_not_with_ranks_times_iterations() -> None:
    """Without iterations.parquet the runs stream: memory O(ranks), plus a little per iteration
    (the figures in experiments/bench/README.md), not per (iteration, rank) row."""
    from pacectl import run

    small = run.memory_needed(65_536, 1_000, 6, False)
    assert run.memory_needed(65_536, 10_000, 6, False) - small == 9_000 * run.BYTES_PER_STREAMED_ITERATION
    assert run.memory_needed(65_536, 1_000, 1, False) == small  # one run at a time
    assert run.memory_needed(131_072, 1_000, 6, False) - small == 65_536 * run.BYTES_PER_RANK


def test_the_streamed_memory_estimate_bounds_every_recorded_peak_closely() -> None:
    """The model's constants against the peaks they were fitted to (whole commands' peak RSS,
    experiments/bench/results): never below a recorded peak, and at most 100 MB above it, small
    jobs (a quarter chunk of draws) included."""
    from pacectl import run

    seen = 0
    for name in ("sim_memory.json", "sim_memory_long.json", "sim_streamed.json", "sim_streamed_65536.json"):
        record = json.loads(
            (Path(__file__).resolve().parents[1] / "experiments" / "bench" / "results" / name).read_text()
        )
        for r in record["results"]:
            if r["checkout"] != "this":
                continue
            peak = r["peak_rss_mb"] * 2**20  # ru_maxrss in KiB / 1024
            need = run.memory_needed(r["ranks"], r["iterations"], 6, False)
            assert peak <= need <= peak + 100e6, (name, r["ranks"], r["iterations"], peak / 1e6, need / 1e6)
            seen += 1
    assert seen >= 12


@pytest.mark.parametrize(
    ("cluster", "timing_dependent"),
    [
        ("dgx_superpod", False),
        ("cost_optimized", False),
        ("contended", True),
        # interference without co-located ranks (and no cross traffic): max-plus in all but name
        ("contended cluster.topology.ranks_per_node=1", False),
    ],
)
def test_inert_contention_is_reported_as_fixed_durations(tmp_path: Path, cluster, timing_dependent) -> None:
    """comm=contention on a quiet profile is max-plus in all but name: the summary, its note and the
    report header say fixed durations, and the run warns; on a contended profile they do not."""
    from hydra import compose, initialize_config_dir

    from pacectl import run

    overrides = ["backend=sim", "backend.num_ranks=16", "backend.num_iterations=20", "comm=contention"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=[*overrides, *f"cluster={cluster}".split(), "output.plots=false"]
        )
    summary = run.run_experiment(cfg, tmp_path)
    warned = any("no timing-dependent mechanism" in w for w in summary["warnings"])
    assert warned == (not timing_dependent)
    assert summary["comm_model"] == "contention"
    assert summary["comm_model_timing_dependent"] is timing_dependent
    assert {r["comm_timing_dependent"] for r in summary["runs"].values()} == {timing_dependent}
    assert ("note" in summary) == (not timing_dependent)
    header = (tmp_path / "report.md").read_text().splitlines()[2]
    assert ("pacing cannot shorten" in header) == (not timing_dependent), header


def test_a_controller_file_that_is_not_yaml_gets_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "controller.yaml"
    bad.write_text("name: threshold\ngain: [0.5\n")
    proc = _run(f"controller_file={bad}", f"hydra.run.dir={tmp_path / 'out'}", cwd=tmp_path)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "must be valid YAML" in lines[0] and "at line 3, column 1" in lines[0], (
        proc.stderr
    )


def test_ctrl_c_after_the_outputs_are_written_says_they_are_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C while the console summary prints (or Hydra tears down) comes after every output is
    in place: the run says so instead of exiting 130 silently (log_summary replaced by one that is
    interrupted)."""
    import pacectl.run as run

    def interrupted(summary: Any, out_dir: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "log_summary", interrupted)
    out = tmp_path / "run"
    proc = _run("trace=st", "controller=none", "output.plots=false", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert f"interrupted after the outputs were written; they are complete: {out}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (out / "summary.json").is_file() and (out / "report.md").is_file()


def test_ctrl_c_inside_a_job_says_what_earlier_jobs_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted inside the second job of a sweep: the first job's outputs are complete, the
    interrupted job leaves no folder behind, and the message says both."""
    import pacectl.run as run

    real = run.run_experiment

    def second_interrupted(cfg: Any, out_dir: Path, **kw: Any) -> dict[str, Any]:
        if int(cfg.seed) == 2:
            raise KeyboardInterrupt
        return real(cfg, out_dir, **kw)

    monkeypatch.setattr(run, "run_experiment", second_interrupted)
    sweep = tmp_path / "sweep"
    args = ["-m", "seed=1,2", "trace=st", "controller=none", "output.plots=false", f"hydra.sweep.dir={sweep}"]
    proc = _run(*args, cwd=tmp_path)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted; 1 sweep job(s) wrote complete outputs (the last:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (sweep / "0" / "summary.json").is_file() and not (sweep / "1").exists()


def test_plots_drawn_in_the_background_are_written_and_linked(tmp_path: Path) -> None:
    """The plots, drawn in child processes while the other outputs are written, are in the run
    folder when the run returns, and report.md links each of them."""
    from hydra import compose, initialize_config_dir

    from pacectl import run

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=["trace=st", "controller=none", "analysis.whatif=false"]
        )
    run.run_experiment(cfg, tmp_path)
    text = (tmp_path / "report.md").read_text()
    for name in ("iteration_time.png", "spread.png", "energy.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"({name})" in text


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trace=steplevel trace.unit_s=fast", "trace.unit_s must be a finite number > 0"),
        (
            "trace=steplevel trace.collective_frac=abc",
            "trace.collective_frac must be a finite number in (0, 1)",
        ),
        ("trace=steplevel trace.collective_frac=1.5", "trace.collective_frac must be in (0, 1), got 1.5"),
        ("trace=steplevel trace.collective_s=-1", "trace.collective_s must be > 0, got -1.0"),
        ("trace=kineto trace.world_size=abc", "trace.world_size must be an integer >= 1 or null"),
        ("trace=kineto trace.ranks=abc", "trace.ranks must be a list of ranks"),
        ("trace=kineto trace.strict=maybe", "trace.strict must be true or false, got 'maybe'"),
        ("trace=kineto trace.strict=no", "trace.strict must be true or false, got 'no'"),
        ("trace=kineto trace.drop_unmatched=2", "trace.drop_unmatched must be true or false"),
        ("trace=kineto trace.align=bogus", "trace.align must be one of auto, end, none, got 'bogus'"),
        ("trace=flight_recorder trace.collective_s=fast", "trace.collective_s must be a finite number > 0"),
        ("trace=flight_recorder trace.ranks=[0,-1]", "trace.ranks must be a list of ranks"),
    ],
)
def test_a_trace_key_of_the_wrong_type_is_one_line(tmp_path: Path, override: str, expected: str) -> None:
    """Values that once ended in tracebacks (or, for booleans, were read as Python truthiness: "no"
    switched strict mode on) are one line naming the key, with an example, and exit 2."""
    out = tmp_path / "run"
    proc = _run(*override.split(), f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_a_flight_recorder_hang_snapshot_is_refused_in_one_line(tmp_path: Path) -> None:
    """Issue 24's contract: ``pacectl.run trace=DIR`` on a hang snapshot exits non-zero with one
    line (after the line saying how the folder was read), no traceback and no outputs."""
    out = tmp_path / "run"
    proc = _run(f"trace={DATA_DIR / 'flight-recorder' / 'hang2'}", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    read_as, error = proc.stderr.strip().splitlines()
    assert "read as trace=flight_recorder" in read_as
    assert error.startswith("pacectl.run: error: ") and "hang snapshot" in error
    assert "ranks [1] never entered all_reduce #5" in error and "TORCH_NCCL_ENABLE_TIMING" in error


def test_a_flight_recorder_replay_states_its_arrival_timing(tmp_path: Path) -> None:
    """Every output of a replayed dump set names the timing estimate (the clock-free durations here)."""
    out = tmp_path / "run"
    trace = DATA_DIR / "flight-recorder" / "synth_megatron_nccl"
    proc = _run(f"trace={trace}", "controller=threshold", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    timing = json.loads((out / "summary.json").read_text())["trace"]["timing"]
    assert timing.startswith("duration: clock-free: earliness = duration - shortest duration"), timing
    assert f"**arrival timing**: {timing}" in (out / "report.md").read_text()


@pytest.mark.parametrize("log", ["plain", "verbose"])
def test_an_nccl_inspector_replay_states_its_arrival_timing(tmp_path: Path, log: str) -> None:
    """The Inspector's logs go through the same assembly: summary.json and report.md name the
    clock-free estimate from coll_exec_time_us."""
    out = tmp_path / "run"
    proc = _run(f"trace={DATA_DIR / 'nccl-inspector' / log}", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    timing = json.loads((out / "summary.json").read_text())["trace"]["timing"]
    assert timing.startswith("duration: clock-free") and "coll_exec_time_us" in timing, timing
    assert f"**arrival timing**: {timing}" in (out / "report.md").read_text()


def test_an_experiment_needs_only_describe_and_run(tmp_path: Path) -> None:
    """Experiment is an abstract base: what a backend does not have is a default, not a probe."""
    from pacectl.experiment import Experiment

    with pytest.raises(TypeError, match="abstract"):
        Experiment()  # type: ignore[abstract]

    class Bare(Experiment):
        backend_name = "bare"

        def describe(self, on_step: Any = None) -> dict[str, Any]:
            return {"trace": {"name": "bare"}}

        def run(self, family: str, params: dict[str, Any], *, on_iteration: Any = None) -> Any:
            raise NotImplementedError

    bare = Bare()
    assert bare.actuators == ("delay",) and bare.iterations_per_run is None and not bare.live
    assert bare.paired_blocks == (None, 0) and bare.describe_steps == 0 and bare.power is None
    assert bare.record_folder(tmp_path) is None and bare.measured_energy() is None
    assert bare.job_shift_note is None and bare.sleep_wait_note is None
    bare.set_actuator("delay")
    bare.write_outputs(tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("args", [("trace=st", "controller=pid"), ("analysis=whatif", "trace=st")])
def test_plots_drawn_by_the_plot_server_leave_every_output_as_drawn_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    """The command's plot server (its plots pickled to a process that imported matplotlib while the
    command computed, and drawn beside the rest) leaves every output as drawn inline
    (``PACECTL_PLOTS_INLINE=1``), byte for byte: the PNGs, ``iterations.parquet``, ``report.md``,
    ``whatif.json``, ``timeline.json``, ``config.yaml`` and ``summary.json`` but its wall time."""
    import os

    from pacectl import report

    # forked also after another test imported torch (a command forks its server before that)
    monkeypatch.setattr(report, "can_fork", lambda: os.environ.get("PACECTL_PLOTS_INLINE") != "1")
    sent: list[int] = []
    submit = report._PlotServer.submit
    monkeypatch.setattr(report._PlotServer, "submit", lambda self, m: sent.append(len(m)) or submit(self, m))
    for mode in ("server", "inline"):
        if mode == "inline":
            monkeypatch.setenv("PACECTL_PLOTS_INLINE", "1")
        proc = _run(*args, f"hydra.run.dir={tmp_path / mode}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert bool(sent) == (mode == "server")  # the plots went to the server, or none did
        sent.clear()
    names = sorted(p.name for p in (tmp_path / "server").iterdir() if p.name != "run.log")
    assert names == sorted(p.name for p in (tmp_path / "inline").iterdir() if p.name != "run.log")
    assert any(n.endswith(".png") for n in names)
    for name in names:
        a, b = (tmp_path / "server" / name).read_bytes(), (tmp_path / "inline" / name).read_bytes()
        if name == "summary.json":
            x, y = json.loads(a), json.loads(b)
            assert x.pop("wall_time_s") >= 0 and y.pop("wall_time_s") >= 0
            assert x == y
        else:
            assert a == b, name


# ``python -m pacectl.run`` in a fresh process: its fast exit (``run.exit_now``: ``os._exit`` once the
# outputs are written) and its console into a closed pipe, which an in-process run does not show.
ROOT = Path(__file__).resolve().parents[1]
SMALL_SIM = ["backend=sim", "backend.num_ranks=8", "backend.num_iterations=30", "controller=pid"]


def _subprocess(*args: str, cwd: Path, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PACECTL_PLOTS_INLINE", None)  # the command's own plot server, as a user's run has
    return subprocess.run(
        [sys.executable, "-m", "pacectl.run", *args],
        cwd=cwd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=600,
    )  # fmt: skip


def _complete_png(path: Path) -> bool:
    """A whole PNG file: its signature first and its IEND chunk (and CRC) last."""
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and data[-12:-4] == b"\x00\x00\x00\x00IEND"


def _assert_complete_outputs(out: Path, *, plots: bool) -> None:
    import pyarrow.parquet as pq

    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["runs"]) == {"none", "pid"}
    report_md = (out / "report.md").read_text()
    assert report_md.endswith("\n") and "pid" in report_md
    assert pq.read_table(out / "iterations.parquet").num_rows == 2 * 30 * 8  # (run, iteration, rank)
    assert (out / "config.yaml").read_text().startswith("# python -m pacectl.run ")
    assert "outputs:" in (out / "run.log").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert bool(pngs) == plots
    for name in pngs:  # each plot drawn whole by the plot server before the process ended
        assert _complete_png(out / name), name
        assert f"({name})" in report_md
    expected = {"summary.json", "report.md", "iterations.parquet", "config.yaml", "run.log", *pngs}
    assert {p.name for p in out.iterdir()} == expected  # nothing staged left behind, no lock file


def test_the_command_in_a_fresh_process_leaves_every_output_complete(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _subprocess(*SMALL_SIM, f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and f"outputs: {out}" in proc.stdout
    _assert_complete_outputs(out, plots=True)
    assert {p.name for p in out.glob("*.png")} >= {"iteration_time.png", "spread.png"}


def test_a_user_mistake_in_a_fresh_process_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _subprocess(*SMALL_SIM, "controller.gian=0.3", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "gian" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_console_piped_to_a_reader_that_has_gone_is_dropped_quietly(tmp_path: Path) -> None:
    """``python -m pacectl.run | head -1``: the reader's end of the pipe is closed before the command
    writes a byte (so every console line meets a ``BrokenPipeError``, no timing involved). No
    traceback and no ``--- Logging error ---``; the job runs to its end and its outputs are complete."""
    import os

    read, write = os.pipe()
    os.close(read)
    out = tmp_path / "run"
    try:
        proc = _subprocess(
            *SMALL_SIM, "output.plots=false", f"hydra.run.dir={out}", cwd=tmp_path, stdout=write
        )
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Logging error" not in proc.stderr, proc.stderr
    assert "BrokenPipeError" not in proc.stderr
    _assert_complete_outputs(out, plots=False)


def test_a_long_run_without_a_terminal_says_how_far_it_is_in_plain_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 65,536-rank simulation printed nothing for over a minute where stderr was no terminal (no
    bar there): a run of that much work now prints a line at every tenth of its iterations, on
    stderr only (not in run.log, not on stdout); a small run stays silent, by its work, not the clock."""
    from pacectl import run as run_module

    assert run_module.PlainProgress.for_run(num_runs=6, iterations_per_run=1000, num_ranks=64) is None
    assert run_module.PlainProgress.for_run(num_runs=6, iterations_per_run=1000, num_ranks=65536) is not None
    assert run_module.PlainProgress.for_run(num_runs=1, iterations_per_run=None, num_ranks=65536) is None
    quiet = _run(*SMALL_SIM, "output.plots=false", f"hydra.run.dir={tmp_path / 'quiet'}", cwd=tmp_path)
    assert quiet.returncode == 0 and "of the iterations" not in quiet.stderr + quiet.stdout, quiet.stderr
    monkeypatch.setattr(run_module, "PLAIN_PROGRESS_MIN_RANK_ITERATIONS", 1)  # as if it were long
    out = tmp_path / "long"
    proc = _run(*SMALL_SIM, "output.plots=false", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "of the iterations" in line]
    assert [line.split("%")[0] for line in lines] == [f"pacectl.run: {p}" for p in range(10, 101, 10)]
    assert lines[-1].startswith("pacectl.run: 100% of the iterations (60 of 60; now: pid), ")
    assert "of the iterations" not in proc.stdout + (out / "run.log").read_text()
