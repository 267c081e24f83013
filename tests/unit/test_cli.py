"""The one console script."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT


def test_building_the_parser_loads_nothing_heavy():
    """Servers with several workers must point prometheus_client at a multiprocess
    directory before it is imported; the parser imports every subcommand's module,
    so none of them may import it (or the kubernetes client) at the top."""
    code = (
        "import sys; from gpu_scheduler.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('prometheus_client', 'kubernetes', 'flask') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
