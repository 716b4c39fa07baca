"""Shared fixtures: the shipped real traces, loaded once per session; Hypothesis profiles."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from pacectl.backends.replay import ReplayBackend
from pacectl.data import shipped_trace
from pacectl.traces.bytedance import load_bytedance
from pacectl.traces.model import OpTrace

# The suite is deterministic by default (the same generated examples every run: a CI run cannot
# fail on an example an earlier run never met). PACECTL_HYPOTHESIS=explore draws new examples, to
# look for failures on purpose.
settings.register_profile("default", derandomize=True)
settings.register_profile("explore", derandomize=False, max_examples=500)
settings.load_profile(os.environ.get("PACECTL_HYPOTHESIS", "default"))


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
