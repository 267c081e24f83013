"""Fixtures shared by the unit and end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def openb_trace() -> Path:
    """The shared openb trace folder; without it the test skips (CI: fails, since the
    trace bench's CI guards would otherwise never run)."""
    from tests.bench.trace import TRACE_DIR, find_trace_dir
    from tests.helpers import required

    try:
        return find_trace_dir()
    except FileNotFoundError:
        required("the trace tests", f"the shared openb trace is not at {TRACE_DIR}")
