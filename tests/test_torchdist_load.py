"""The live run's warning about a loaded host (``pacectl.torchdist.experiment.watch_host_load``).

The load is monkeypatched: no job runs, nothing sleeps on the wall clock beyond the block itself.
"""

from __future__ import annotations

import threading
import warnings

import pytest

from pacectl.torchdist import experiment


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(experiment.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


def _loads(monkeypatch: pytest.MonkeyPatch, values: list[float]) -> list[float]:
    """Each ``os.getloadavg()`` call returns the next value (the last one repeats); returns the calls."""
    calls: list[float] = []

    def getloadavg() -> tuple[float, float, float]:
        calls.append(values[min(len(calls), len(values) - 1)])
        return (calls[-1], 0.0, 0.0)

    monkeypatch.setattr(experiment.os, "getloadavg", getloadavg)
    return calls


def test_loaded_host_warns_naming_load_cores_and_why(
    monkeypatch: pytest.MonkeyPatch, two_cores: None
) -> None:
    _loads(monkeypatch, [1.0, 4.69])  # idle at the start, loaded at the end
    with pytest.warns(UserWarning) as caught, experiment.watch_host_load(2, poll_s=60.0):
        pass
    (w,) = caught
    text = str(w.message)
    assert "4.7 on 2 usable cores" in text
    assert "its 2 ranks included" in text
    assert "unreliable" in text and "waited for a CPU" in text


def test_idle_host_is_silent(monkeypatch: pytest.MonkeyPatch, two_cores: None) -> None:
    _loads(monkeypatch, [0.5, 2.0])  # at the core count: not above it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with experiment.watch_host_load(2, poll_s=60.0):
            pass


def test_peak_between_samples_is_seen(monkeypatch: pytest.MonkeyPatch, two_cores: None) -> None:
    calls = _loads(monkeypatch, [0.5, 9.0, 0.5])  # only the polling thread sees the peak
    with pytest.warns(UserWarning, match="reached 9.0"), experiment.watch_host_load(2, poll_s=0.001):
        while len(calls) < 3:  # the start sample, then two polls
            threading.Event().wait(0.001)
