"""Fixtures shared by the unit and end-to-end tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def openb_trace() -> Path:
    """The shared openb trace folder; skips the test when it is not beside the checkout."""
    from tests.bench.trace import find_trace_dir

    try:
        return find_trace_dir()
    except FileNotFoundError:
        pytest.skip("the shared openb trace is not beside this checkout")
