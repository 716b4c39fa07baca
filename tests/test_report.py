"""Tests of pacectl.report: atomic writers, JSON, Parquet, PNG plots and tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from pacectl import metrics, report
from pacectl.testing.episodes import make_episode

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def episodes():
    rng = np.random.default_rng(0)
    arrival = rng.uniform(0.0, 0.2, size=(20, 4))
    delay = np.where(arrival < 0.1, 0.05, 0.0)
    active = np.zeros((20, 2), bool)
    active[5:12, 0] = True
    return {
        "none": make_episode(arrival, domain_of_rank=[0, 0, 1, 1], rank_labels=[4, 5, 6, 7]),
        "threshold": make_episode(
            arrival + delay,
            applied_delay_s=delay,
            domain_of_rank=[0, 0, 1, 1],
            rank_labels=[4, 5, 6, 7],
            pacing_active=active,
            controller="threshold",
        ),
    }


def _leftovers(directory):
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


# --- jsonable and summary.json --------------------------------------------------------------------


def test_jsonable_converts_numpy_and_non_finite():
    obj = {
        "a": np.float64(1.5),
        "b": np.int64(3),
        "c": float("nan"),
        "d": np.array([1.0, np.nan, np.inf]),
        "e": (np.bool_(True), -math.inf),
        7: {"nested": np.float32(0.25)},
    }
    out = report.jsonable(obj)
    assert out == {
        "a": 1.5,
        "b": 3,
        "c": None,
        "d": [1.0, None, None],
        "e": [True, None],
        "7": {"nested": 0.25},
    }
    assert type(out["a"]) is float and type(out["b"]) is int and type(out["e"][0]) is bool
    json.dumps(out, allow_nan=False)


def test_write_summary_json_round_trip(tmp_path, episodes):
    summaries = {run: metrics.summarize(ep) for run, ep in episodes.items()}
    summaries["none"]["extra"] = float("nan")
    path = tmp_path / "summary.json"
    report.write_summary_json(path, summaries)
    text = path.read_text()
    loaded = json.loads(text)
    assert loaded["none"]["extra"] is None
    assert loaded["threshold"]["controller"] == "threshold"
    assert text == json.dumps(loaded, sort_keys=True, indent=2) + "\n"
    assert _leftovers(tmp_path) == []


def test_write_summary_json_unencodable_leaves_nothing(tmp_path):
    path = tmp_path / "summary.json"
    with pytest.raises(TypeError):
        report.write_summary_json(path, {"x": object()})
    assert list(tmp_path.iterdir()) == []


# --- iterations.parquet ---------------------------------------------------------------------------


def test_episodes_to_frame_layout(episodes):
    frame = report.episodes_to_frame(episodes)
    assert tuple(frame.columns) == report.FRAME_COLUMNS
    assert len(frame) == 2 * 20 * 4
    ep = episodes["threshold"]
    sub = frame[frame["run"] == "threshold"]
    np.testing.assert_array_equal(sub["arrival_s"].to_numpy().reshape(20, 4), ep.arrival_s)
    np.testing.assert_array_equal(sub["iteration"].to_numpy().reshape(20, 4)[:, 0], np.arange(20))
    np.testing.assert_array_equal(sub["rank"].to_numpy().reshape(20, 4)[3], [4, 5, 6, 7])
    np.testing.assert_array_equal(sub["iteration_time_s"].to_numpy()[::4], ep.iteration_time_s)
    active = sub["pacing_active"].to_numpy().reshape(20, 4)
    np.testing.assert_array_equal(active[:, :2], ep.pacing_active[:, [0, 0]])
    assert not active[:, 2:].any()


def test_episodes_to_frame_empty_mapping():
    frame = report.episodes_to_frame({})
    assert tuple(frame.columns) == report.FRAME_COLUMNS and len(frame) == 0


def test_parquet_round_trip(tmp_path, episodes):
    path = tmp_path / "iterations.parquet"
    report.write_iterations_parquet(path, episodes)
    loaded = pd.read_parquet(path)
    assert tuple(loaded.columns) == report.FRAME_COLUMNS
    assert len(loaded) == sum(ep.num_iterations * ep.num_ranks for ep in episodes.values())
    assert set(loaded["run"]) == {"none", "threshold"}
    np.testing.assert_array_equal(loaded["wait_s"].to_numpy(), report.episodes_to_frame(episodes)["wait_s"])
    assert _leftovers(tmp_path) == []


# --- plots ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("plot", [report.plot_iteration_time, report.plot_spread])
def test_plots_write_png(tmp_path, episodes, plot):
    path = tmp_path / "plot.png"
    plot(path, episodes)
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("plot", [report.plot_iteration_time, report.plot_spread])
def test_plots_of_a_normalised_trace_do_not_claim_seconds(tmp_path, episodes, plot):
    real = plot(tmp_path / "real.png", episodes)
    assert real.axes[0].get_ylabel().endswith("(s)")
    fig = plot(tmp_path / "norm.png", episodes, time_unit="arbitrary s")
    assert all(ax.get_ylabel().endswith("(arbitrary s)") for ax in fig.axes if ax.get_ylabel())
    title = fig.axes[0].get_title() + (fig._suptitle.get_text() if fig._suptitle else "")
    assert "not real time" in title


def test_plots_do_not_touch_pyplot_state(tmp_path, episodes):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    report.plot_spread(tmp_path / "s.png", episodes)
    report.plot_iteration_time(tmp_path / "i.png", episodes)
    assert plt.get_fignums() == before


def test_comm_model_note():
    assert report.comm_model_note("null") == (
        "comm model: null (fixed durations: pacing cannot shorten an iteration)"
    )
    assert report.comm_model_note("alpha_beta") == (
        "comm model: alpha_beta (fixed durations: pacing cannot shorten an iteration)"
    )
    assert report.comm_model_note("contention") == (
        "comm model: contention (timing-dependent durations: pacing can shorten or lengthen an iteration)"
    )


# --- tables and report.md -------------------------------------------------------------------------


def test_console_table(episodes):
    summaries = {run: metrics.summarize(ep) for run, ep in episodes.items()}
    table = report.format_console_table(summaries)
    lines = table.splitlines()
    assert lines[0] == report.comm_model_note("null")
    assert len(lines) == 3 + len(summaries)
    assert lines[3].startswith("none") and lines[4].startswith("threshold")
    assert "baseline" in lines[3]
    expected = 100.0 * metrics.compare(summaries["none"], summaries["threshold"])["throughput_change_frac"]
    assert f"{expected:+.2f}" in lines[4]
    assert len({len(line) for line in lines[1:3]}) == 1  # header and rule align


def test_console_table_missing_baseline_and_nan():
    summaries = {"pid": {"throughput_it_per_s": 1.0, "cv": float("nan"), "comm_model": "alpha_beta"}}
    table = report.format_console_table(summaries, baseline="none")
    assert "comm model: alpha_beta" in table and "pid" in table and "n/a" in table


def test_write_report_md(tmp_path, episodes):
    summaries = {run: metrics.summarize(ep) for run, ep in episodes.items()}
    path = tmp_path / "report.md"
    report.write_report_md(
        path, title="Replay of trace X", summaries=summaries, context={"trace": "x.parquet", "fidelity": 0.5}
    )
    text = path.read_text()
    assert text.startswith("# Replay of trace X\n")
    assert "pacing cannot shorten an iteration" in text
    assert "- **trace**: x.parquet" in text and "- **fidelity**: 0.5" in text
    table_lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table_lines) == 2 + len(summaries)
    assert "| none |" in text and "| threshold |" in text
    assert _leftovers(tmp_path) == []
    assert "![" not in text  # no plots beside it: no links to them
    (tmp_path / "spread.png").write_bytes(b"png")  # written before the report, as pacectl.run does
    report.write_report_md(path, title="Replay of trace X", summaries=summaries, context={})
    assert "![spread](spread.png)" in path.read_text() and "iteration_time" not in path.read_text()


def test_a_tiny_change_keeps_its_sign_and_other_cells_no_negative_zero() -> None:
    """A loss too small for two decimals still reads as a loss (under the null model a replay can
    only lose throughput), an exact tie has no sign; an unsigned cell that rounds to -0.00 prints 0.00."""
    runs = {
        "none": {"throughput_it_per_s": 2.0, "comm_model": "null"},
        "pid": {"throughput_it_per_s": 1.99999, "comm_model": "null", "throughput_change_ci95_frac": 1e-4},
        "ewma": {"throughput_it_per_s": 2.0, "comm_model": "null", "throughput_change_ci95_frac": 0.0},
    }
    table = report.format_console_table(runs)
    assert "-0.00 ±0.01" in table and " 0.00 ±0.00" in table and "+0.00" not in table  # a tie: no sign
    assert report.format_value(-1e-9, ".2f") == "0.00" and report.format_value(-1e-9, "+.2f") == "-0.00"
    assert report.format_value(0.0, "+.2f") == "0.00" and report.format_value(1e-9, "+.2f") == "+0.00"


def test_the_plot_server_draws_the_bytes_drawn_inline(tmp_path, episodes, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """report.plot_server: plots sent to the warm server (pickled partials) are the PNG files drawn
    inline, byte for byte; its batches report failures; a lambda, which does not pickle, and jobs
    over SERVER_MAX_BYTES are forked from the calling process instead; the server ends with its block."""
    import functools
    import os

    def jobs(folder):  # type: ignore[no-untyped-def]
        folder.mkdir()
        return [
            functools.partial(report.plot_spread, folder / "spread.png", episodes),
            functools.partial(report.plot_iteration_time, folder / "iteration_time.png", episodes),
        ]

    for job in jobs(tmp_path / "inline"):
        job()
    monkeypatch.setattr(report, "can_fork", lambda: True)  # also after another test imported torch
    with report.plot_server():
        server = report._server
        assert server is not None and server.pid != os.getpid()
        sent = []
        submit = server.submit
        monkeypatch.setattr(server, "submit", lambda m: sent.append(len(m)) or submit(m))
        with report.plots_in_background() as draw:
            draw(*jobs(tmp_path / "server"))
            draw(functools.partial(report.plot_spread, tmp_path / "server" / "again.png", episodes))
        assert len(sent) == 2  # both batches went to the server
        wait = report.draw_in_background([functools.partial(_fails, "no such axis")])
        with pytest.raises(RuntimeError, match="no such axis"):
            wait()
        (tmp_path / "lambda").mkdir()
        report.draw_in_background([lambda: (tmp_path / "lambda" / "a").write_text("a")])()
        monkeypatch.setattr(report, "SERVER_MAX_BYTES", 10)
        report.draw_in_background(jobs(tmp_path / "large")[:1])()
        assert len(sent) == 3 and (tmp_path / "lambda" / "a").read_text() == "a"
    assert report._server is None
    with pytest.raises(ChildProcessError):  # waited for: gone
        os.waitpid(server.pid, os.WNOHANG)
    for name in ("spread.png", "iteration_time.png"):
        assert (tmp_path / "server" / name).read_bytes() == (tmp_path / "inline" / name).read_bytes()
    assert (tmp_path / "server" / "again.png").read_bytes() == (
        tmp_path / "inline" / "spread.png"
    ).read_bytes()
    assert (tmp_path / "large" / "spread.png").read_bytes() == (
        tmp_path / "inline" / "spread.png"
    ).read_bytes()


def _fails(message: str) -> None:
    raise ValueError(message)


def test_a_failing_block_waits_for_its_plots_and_raises_its_own_error(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """plots_in_background: a block that raises still waits for the plots it started (none may
    write into a staging folder being removed) and raises its own error, not theirs."""
    import functools

    monkeypatch.setattr(report, "can_fork", lambda: True)  # also after another test imported torch

    with report.plot_server(), pytest.raises(KeyError, match="the block's"):
        with report.plots_in_background() as draw:
            draw(functools.partial(_fails, "the plot's"))
            draw(functools.partial(_write_done_later, tmp_path / "done.txt"))
            raise KeyError("the block's")
    assert (tmp_path / "done.txt").read_text() == "done"


def _write_done_later(path) -> None:  # type: ignore[no-untyped-def]
    import time

    time.sleep(0.2)  # still drawing when the block raises (a wait, not a timing assertion)
    path.write_text("done")


def _warns() -> int:
    import warnings

    warnings.warn("careful", UserWarning, stacklevel=1)
    return 1


def _logs() -> int:
    import logging

    logging.getLogger("pacectl.run").warning("a line")
    return 2


def test_beside_returns_the_childs_value_or_none_where_it_raised_warned_or_logged() -> None:
    """report.Beside: the value computed in the child, pickled back; None (the caller computes it
    itself) where the child raised, warned or logged, or the value does not pickle; close() reaps
    a child whose result was never asked for."""
    import os

    value = {"m_w": np.arange(3.0), "note": "ideal"}
    got = report.Beside(lambda: value).result()
    assert got.keys() == value.keys() and np.array_equal(got["m_w"], value["m_w"])
    assert report.Beside(_warns).result() is None and report.Beside(_logs).result() is None
    assert report.Beside(lambda: 1 / 0).result() is None
    assert report.Beside(lambda: lambda: None).result() is None  # a lambda does not pickle
    child = report.Beside(lambda: __import__("time").sleep(60))
    pid = child.pid
    child.close()
    with pytest.raises(ChildProcessError):  # reaped
        os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize(
    ("modules", "absent"),
    [
        # the command's own import: its plot server starts before any of these
        (
            ["pacectl.run"],
            ["matplotlib", "torch", "pandas", "pyarrow", "scipy", "optuna", "hydra", "omegaconf"],
        ),
        # what the plot server imports besides matplotlib (report.PLOT_MODULES): no pandas, no replay
        (["pacectl.metrics", "pacectl.energy", "pacectl.whatif"], ["torch", "pandas", "pyarrow", "scipy"]),
        # replay, simulation and tuning never import torch
        (["pacectl.backends.replay", "pacectl.backends.sim", "pacectl.tuning.study"], ["torch"]),
    ],
)
def test_imports_leave_the_heavy_libraries_unimported(modules: list[str], absent: list[str]) -> None:
    """Each library is imported where it is used; checked in a fresh interpreter's sys.modules."""
    import subprocess
    import sys

    code = (
        f"import sys; [__import__(m) for m in {modules!r}]; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({absent!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_plots_drawn_in_background_write_the_same_files_and_report_failures(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """draw_in_background: each job in a forked child gives the file the job writes inline; a failed
    job raises on wait() with its error."""
    from pacectl.report import draw_in_background

    def write(name: str) -> None:
        (tmp_path / name).write_text(name * 3)

    wait = draw_in_background([lambda: write("a"), lambda: write("b")], fork=True)
    wait()
    assert (tmp_path / "a").read_text() == "aaa" and (tmp_path / "b").read_text() == "bbb"

    def broken() -> None:
        raise ValueError("no such axis")

    wait = draw_in_background([broken], fork=True)
    with pytest.raises(RuntimeError, match="no such axis"):
        wait()
    monkeypatch.setenv("PACECTL_PLOTS_INLINE", "1")
    with pytest.raises(ValueError, match="no such axis"):  # inline: the job's own error, at once
        draw_in_background([broken])


@pytest.mark.parametrize("num_runs", [1, 12])
@pytest.mark.parametrize("scale_s", [1.7e-4, 1e5])
def test_the_run_plots_keep_every_label_inside_the_figure(tmp_path, num_runs, scale_s):
    """spread.png and iteration_time.png set their side margins from the drawn labels: long tick
    labels (tiny or huge times), long run names in the legend and 1 or 12 panels stay inside."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rng = np.random.default_rng(1)
    names = ["none", "sleep_wait@clock", "phase_no_switch_off"] + [f"run{i}" for i in range(num_runs)]
    active = np.zeros((30, 1), bool)
    active[3:9] = True
    episodes = {
        name: make_episode(
            rng.uniform(0.0, scale_s, size=(30, 4)), pacing_active=active, collective_time_s=scale_s / 10
        )
        for name in names[:num_runs]
    }
    for plot in (report.plot_spread, report.plot_iteration_time):
        fig = plot(tmp_path / f"{plot.__name__}.png", episodes)
        box = fig.get_tightbbox(FigureCanvasAgg(fig).get_renderer())  # inches
        width, height = fig.get_size_inches()
        assert box.x0 >= 0.0 and box.x1 <= width, (plot.__name__, box, width)
        assert box.y0 >= 0.0 and box.y1 <= height, (plot.__name__, box, height)


@pytest.mark.parametrize("num_runs", [2, 12])
def test_the_energy_plot_keeps_every_label_inside_the_figure(tmp_path, num_runs):
    """energy.png places its two panels from the drawn labels: long run names (the y tick labels),
    the legend below the bars and the one right of the scatter stay inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rng = np.random.default_rng(2)
    names = ["none", "sleep_wait@clock", "phase_no_switch_off"] + [f"run{i}" for i in range(num_runs)]
    states = ("compute", "transfer", "spin_wait", "pacing_sleep", "sleep_wait", "other")
    summaries = {
        name: {
            "energy_by_state_j": {k: float(rng.uniform(1e5, 1e7)) for k in states},
            "num_iterations": 40,
            "energy_total_j": float(rng.uniform(1e7, 2e7)),
            "throughput_it_per_s": float(rng.uniform(0.9, 1.1)),
            "throughput_change_ci95_frac": 0.01,
            "energy_change_ci95_frac": 0.02,
            "power_profile": "h100_sxm",
            "comm_model": "null",
        }
        for name in names[:num_runs]
    }
    fig = report.plot_energy(tmp_path / "energy.png", summaries, bound_j=1e6)
    box = fig.get_tightbbox(FigureCanvasAgg(fig).get_renderer())  # inches
    width, height = fig.get_size_inches()
    assert box.x0 >= 0.0 and box.x1 <= width and box.y0 >= 0.0 and box.y1 <= height, (box, width, height)
    assert (tmp_path / "energy.png").read_bytes().startswith(PNG_MAGIC)
