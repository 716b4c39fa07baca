"""Energy as a tuning objective (``tune.objectives=[throughput, cv, energy]``, issue 27 item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from hypothesis import given, settings
from hypothesis import strategies as st

from pacectl.testing.commands import run_command
from pacectl.tuning.scenarios import Evaluation
from pacectl.tuning.storage import StorageSpec
from pacectl.tuning.verdict import (
    ImprovementRule,
    TrialPoint,
    beats_no_pacing,
    choose,
    dominates,
    judge,
    pareto_front,
    pareto_mask,
)

ALL = ("throughput", "cv", "energy")
ENERGY = [
    "cluster=st",
    "tune.population_size=4",
    "controller=threshold",
    "tune.objectives=[throughput,cv,energy]",
]


def _tune(*args: str, cwd: Path):  # noqa: ANN202
    from pacectl.tune import main

    return run_command(main, args, cwd=cwd)


def test_an_energy_study_gives_a_front_non_dominated_in_all_objectives(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _tune(*ENERGY, "tune.sampler=random", "tune.n_trials=10", f"hydra.run.dir={out}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert " J/it (" in proc.stdout  # the progress lines show the energy objective
    summary = json.loads((out / "tune.json").read_text())
    assert list(summary["objectives"]) == ["throughput_it_per_s", "cv", "energy_per_iteration_j"]
    assert summary["power_profile"]["name"] == "h100_sxm" and "spinning waits" in summary["energy_note"]
    assert summary["baseline_none"]["energy_per_iteration_j"] > 0
    assert "energy per iteration" in summary["improvement_rule"] and summary["min_energy_gain_frac"] == 0.01
    study = optuna.load_study(
        study_name="st-threshold", storage=StorageSpec("journal", str(out / "optuna.journal")).open()
    )
    assert [d.name.lower() for d in study.directions] == ["maximize", "minimize", "minimize"]
    trials = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    front = json.loads((out / "pareto.json").read_text())
    assert front and all(item["energy_per_iteration_j"] > 0 for item in front)
    points = [
        TrialPoint(t.number, {}, *t.values[:2], 0.0, True, energy_per_iteration_j=t.values[2]) for t in trials
    ]
    members = [
        TrialPoint(
            f["trial"],
            {},
            f["throughput_it_per_s"],
            f["cv"],
            0.0,
            True,
            energy_per_iteration_j=f["energy_per_iteration_j"],
        )
        for f in front
    ]
    numbers = {p.number for p in points}
    for m in members:  # a completed trial, and no completed trial dominates it on the three objectives
        assert m.number in numbers and not any(dominates(p, m, ALL) for p in points)
    header = (out / "controller.yaml").read_text()
    assert "J per iteration summed over ranks" in header and "power profile h100_sxm" in header
    assert (out / "pareto.png").stat().st_size > 0


def test_a_wrong_objective_name_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "run"
    for value, expected in [
        ("[throughput,energie]", "did you mean 'energy' for 'energie'?"),
        ("[energy]", "got ['energy']"),
        ("[cv,cv]", "got ['cv', 'cv']"),
    ]:
        proc = _tune("cluster=st", f"tune.objectives={value}", f"hydra.run.dir={out}", cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert lines[0].startswith("pacectl.tune: error: tune.objectives must be ")
        assert expected in lines[0] and "tune.objectives=" in lines[0]
        assert not out.exists()


def test_a_resume_refuses_a_changed_objective_list(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _tune(*ENERGY, "tune.n_trials=2", f"hydra.run.dir={out}", cwd=tmp_path).returncode == 0
    before = (out / "tune.json").read_text()
    proc = _tune(
        *ENERGY[:-1],
        "tune.objectives=[throughput,energy]",
        "tune.n_trials=3",
        f"hydra.run.dir={out}",
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert (
        "tune.objectives: ['throughput', 'cv', 'energy'] in the study, ['throughput', 'energy'] in this command"
        in proc.stderr
    )
    proc = _tune(*ENERGY, "cluster.power=a100_sxm", "tune.n_trials=3", f"hydra.run.dir={out}", cwd=tmp_path)
    assert (
        proc.returncode == 2
        and "episodes: power: 'h100_sxm' in the study, 'a100_sxm' in this command" in proc.stderr
    )
    assert (out / "tune.json").read_text() == before
    assert (
        _tune(*ENERGY, "tune.n_trials=3", f"hydra.run.dir={out}", cwd=tmp_path).returncode == 0
    )  # the same: resumes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(*[st.sampled_from([0.0, 0.5, 1.0, 2.0])] * 3), min_size=1, max_size=12))
def test_the_three_objective_front_is_the_points_nothing_dominates(
    values: list[tuple[float, float, float]],
) -> None:
    points = [
        TrialPoint(i, {}, t, c, 0.0, True, energy_per_iteration_j=e) for i, (t, c, e) in enumerate(values)
    ]
    mask = pareto_mask(*zip(*values, strict=True), objectives=ALL)
    assert mask == [not any(dominates(q, p, ALL) for q in points) for p in points]
    front = pareto_front(points, ALL)
    assert {p.number for p in front} | {d for p in front for d in p.duplicates} == {
        p.number for p, keep in zip(points, mask, strict=True) if keep
    }


def test_an_energy_gain_counts_under_fixed_durations_and_decides_the_choice() -> None:
    """Max-plus: no delay shortens an iteration, so a CV gain is lengthening only; a lower energy
    (waits asleep instead of spinning) is a gain there, and with energy the first minimized
    objective after cv, the choice among improving trials is the lowest CV, then the lowest energy."""
    base = Evaluation(1.0, 0.2, energy_per_iteration_j=100.0)
    saver = TrialPoint(0, {}, 0.999, 0.2, 0.001, True, energy_per_iteration_j=95.0)
    smoother = TrialPoint(1, {}, 0.999, 0.1, 0.001, True, energy_per_iteration_j=100.0)
    default = ImprovementRule(0.01, 0.005, 0.005)
    energy = ImprovementRule(0.01, 0.005, 0.005, 0.01, ALL)
    assert not beats_no_pacing(saver, base, default) and beats_no_pacing(
        saver, base, energy, energy_only=True
    )
    assert not beats_no_pacing(smoother, base, energy, energy_only=True)
    reference = Evaluation(1.0, 0.2, energy_per_iteration_j=100.0)
    verdict = judge([saver, smoother], [saver, smoother], base, reference, energy, timing_dependent=False)
    assert verdict.improves and verdict.chosen.number == 0 and verdict.lengthening_only == [1]
    assert not judge([saver, smoother], [saver, smoother], base, reference, default, False).improves
    ties = [saver, TrialPoint(2, {}, 0.999, 0.2, 0.001, True, energy_per_iteration_j=90.0)]
    assert choose(ties, [0, 2], ALL).number == 2  # same CV: the lower energy
    assert choose(ties, [0, 2], ("throughput", "energy", "cv")).number == 2
