"""Shared fixtures: the shipped real traces, loaded once per session."""

from __future__ import annotations

import pytest

from pacectl.backends.replay import ReplayBackend
from pacectl.data import shipped_trace
from pacectl.traces.bytedance import load_bytedance
from pacectl.traces.model import OpTrace


@pytest.fixture(scope="session")
def st_trace() -> OpTrace:
    return load_bytedance(*shipped_trace("ST"))


@pytest.fixture(scope="session")
def ar_trace() -> OpTrace:
    return load_bytedance(*shipped_trace("AR"))


@pytest.fixture(scope="session")
def st_backend(st_trace: OpTrace) -> ReplayBackend:
    return ReplayBackend(st_trace)


@pytest.fixture(scope="session")
def ar_backend(ar_trace: OpTrace) -> ReplayBackend:
    return ReplayBackend(ar_trace)
