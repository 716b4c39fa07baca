"""phase and sleep_wait on the live backend (``backend=torch``).

- phase, the live decision path without processes: every rank builds its observation from the one
  exchanged table (:func:`~pacectl.torchdist.core.observation_from_table`) and decides with its own
  :class:`~pacectl.torchdist.core.DecisionEngine`; the delays are bit-identical on every rank and
  the same for every rank of the job (a job-level shift), the collective time phase judges is the
  table's, and its switch-off (rule 5) happens at the same observation everywhere.
- ``dist``: one 2-rank gloo job on CPU (a few seconds) runs sleep_wait and phase through the pacer:
  sleep_wait applies no delay and records that its ranks wait asleep; phase, given a quiet time
  below any collective's (so every collective looks slowed), applies the same delay on both ranks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pacectl.torchdist.core import COLUMN, NUM_GATHER_FIELDS, DecisionEngine, observation_from_table

_WORLD = 4


def _table(rng: np.random.Generator, collective_s: float, delay_s: np.ndarray) -> np.ndarray:
    """One iteration's exchanged table: each rank's local arrival (its compute plus its delay), its
    time in the collective (its wait for the last rank plus the transfer), its delay, its sync end."""
    arrival = 0.2 + rng.uniform(0.0, 0.01, _WORLD) + delay_s
    table = np.zeros((_WORLD, NUM_GATHER_FIELDS))
    table[:, COLUMN["arrival_local_s"]] = arrival
    table[:, COLUMN["in_collective_s"]] = arrival.max() - arrival + collective_s
    table[:, COLUMN["applied_delay_s"]] = delay_s
    table[:, COLUMN["backward_end_s"]] = arrival.max() + collective_s
    return table


def test_phase_decides_one_delay_for_every_rank_from_the_exchanged_table() -> None:
    n = 120
    # quiet (0.1 s) through the unpaced baseline [0, 30); slowed in [35, 45) and [80, 90) whatever
    # the shifts do (collisions that come back): the judged window [30, 60) costs more than the baseline
    collective = 0.1 + np.random.default_rng(3).normal(0.0, 0.0005, n)
    collective[35:45] += 0.06
    collective[80:90] += 0.06
    params = {"switch_off_iters": 30}
    engines = [
        DecisionEngine("phase", params, {"max_delay_frac": 0.5}, num_ranks=_WORLD, seed=7)
        for _ in range(_WORLD)
    ]
    rng = np.random.default_rng(0)
    delay = np.zeros(_WORLD)
    shifted, switched = [], []
    for k in range(n):
        table = _table(rng, float(collective[k]), delay)
        observations = [observation_from_table(k, table) for _ in engines]  # each rank its own
        assert observations[0].collective_time_s == pytest.approx(collective[k], rel=1e-12)
        actions = [e.decide(o) for e, o in zip(engines, observations, strict=True)]
        for a in actions[1:]:
            np.testing.assert_array_equal(a.delay_s, actions[0].delay_s)  # bit-identical on every rank
        assert np.all(actions[0].delay_s == actions[0].delay_s[0])  # one delay for the whole job
        diags = [e.diagnostics() for e in engines]
        assert all(d == diags[0] for d in diags)
        shifted.append(float(actions[0].delay_s[0]))
        switched.append(diags[0]["switch_offs"])
        delay = actions[0].delay_s
    assert max(shifted[:30]) == 0.0  # the unpaced baseline window (rule 5)
    assert max(shifted) > 0.0  # then it shifts on the slowed collectives, on every rank alike
    # no gain in the judged window: switched off at its end, on every rank, and no shift after it
    assert switched.index(1.0) == 59 and switched[-1] == 1.0 and max(shifted[59:]) == 0.0


# --- live: one 2-rank gloo job ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory):  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from hydra import compose, initialize_config_dir

    from pacectl.config import CONF_DIR
    from pacectl.torchdist.experiment import TorchExperiment

    tmp = tmp_path_factory.mktemp("live")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                "backend=torch",
                "backend.nproc_per_node=2",
                "backend.num_iterations=10",
                "backend.warmup_iterations=2",
                "backend.pg_timeout_s=10",
                "backend.start_method=spawn",
                "backend.workload.width=64",
                "backend.workload.depth=2",
                "backend.workload.batch_size=8",
                "backend.straggler.rank=null",
                f"backend.record_dir={tmp}",
                # every collective looks slowed against this quiet time: phase shifts at every decision
                "controller=phase",
                "controller.quiet_s=1e-6",
                "controller.shift_prob=1.0",
                "controller.switch_off_iters=null",
            ],
        )
    exp = TorchExperiment(cfg)
    exp.families["sleep_wait"] = {}  # one job runs none, phase and sleep_wait
    exp.describe()
    return exp


@pytest.mark.dist
def test_live_sleep_wait_applies_no_delay_and_records_its_ranks_asleep(live) -> None:  # type: ignore[no-untyped-def]
    ep = live.run("sleep_wait", {})
    assert not ep.applied_delay_s.any()
    assert ep.wait_asleep is not None and len(ep.wait_asleep) == len(ep.applied_delay_s)
    assert ep.wait_asleep[1:].all()  # every decision had the ranks wait asleep
    none = live.run("none", {})
    assert none.wait_asleep is None or not none.wait_asleep.any()
    decisions = live.decisions()
    np.testing.assert_array_equal(
        decisions[0]["sleep_wait"]["decisions"], decisions[1]["sleep_wait"]["decisions"]
    )


@pytest.mark.dist
def test_live_phase_applies_the_same_delay_on_both_ranks(live) -> None:  # type: ignore[no-untyped-def]
    params = live.families["phase"]
    ep = live.run("phase", params)
    decisions = live.decisions()
    d0, d1 = decisions[0]["phase"]["decisions"], decisions[1]["phase"]["decisions"]
    np.testing.assert_array_equal(d0, d1)  # the same guarded controller on the same table
    assert (d0[:, 0] == d0[:, 1]).all() and d0.max() > 0.0  # one delay for the job, and it shifts
    applied = ep.applied_delay_s
    assert (applied[:, 0] == applied[:, 1]).all() and applied.max() > 0.0
    assert Path(live.final_record_dir).name  # the run kept its records folder
