"""The Go framework plugins (plugins/) against the Python extender, the reference.

The contract the Go side reads is generated from the Python one and must be current.
For the newest and the oldest supported minor (the two `make test` builds), the Go
tests pass, the conformance suite among them: cases the extender's own cache and
engine decide (tests/conformance/cases.py), replayed through the plugins as
kube-scheduler runs them, with the same verdict, resolvability, words and scores; and
over the openb cluster (tests/conformance/openb.py), every pod, in arrival order, on
the extender's node.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance import cases, openb
from tests.helpers import required

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("gen_contract", ROOT / "tools" / "gen_contract.py")
assert _SPEC is not None and _SPEC.loader is not None
gen_contract = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gen_contract)
BUILD = ROOT / "tools" / "k8s" / "build.sh"
PACKAGES = "github.com/gpu-scheduler/gpu-scheduler/plugins/..."
OPENB = "github.com/gpu-scheduler/gpu-scheduler/plugins/test/openb"


def _minors() -> list[str]:
    """The newest and the oldest supported minor, or GPU_SCHEDULER_PLUGIN_MINORS (e.g.
    ``1.35,1.36``: CI's job for the minors between, which ``make test`` leaves out)."""
    if chosen := os.environ.get("GPU_SCHEDULER_PLUGIN_MINORS"):
        return [minor.strip() for minor in chosen.split(",") if minor.strip()]
    out = subprocess.run([str(BUILD), "--minors"], capture_output=True, text=True, check=True)
    minors = out.stdout.split()
    return [minors[-1], minors[0]]


def test_the_go_contract_is_generated_from_the_python_one():
    assert gen_contract.OUT.read_text() == gen_contract.render(), (
        "plugins/pkg/contract is stale: run .venv/bin/python tools/gen_contract.py"
    )


def test_a_renamed_key_shows_in_the_go_contract(monkeypatch):
    """The check is not vacuous: a key renamed on the Python side changes the Go text."""
    monkeypatch.setattr(gen_contract.contract, "ANN_GPUS", "gpu-scheduler.io/gpus-renamed")
    assert gen_contract.render() != gen_contract.OUT.read_text()


@pytest.fixture(scope="module")
def case_file(tmp_path_factory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("conformance") / "cases.json"
    generated = cases.generate()
    path.write_text(json.dumps(generated))
    return path, len(generated["cases"])


def test_the_cases_are_the_same_in_every_process(case_file, tmp_path):
    """The extender decides each case alike whatever the process's hash order (a pool
    whose devices' names collided once made its answer depend on it), and some
    clusters have DRA GPUs."""
    path, _ = case_file
    for seed in ("1", "2"):
        out = tmp_path / f"cases-{seed}.json"
        subprocess.run(
            [sys.executable, "-m", "tests.conformance.cases", "--out", str(out)],
            cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": seed}, check=True,
            capture_output=True, timeout=300,
        )  # fmt: skip
        assert out.read_bytes() == path.read_bytes(), f"PYTHONHASHSEED={seed} decided otherwise"
    worlds = json.loads(path.read_text())["worlds"]
    assert sum(bool(w["dra"]) for w in worlds) >= len(worlds) // 5


def _go_test(minor: str, packages: str, env: dict[str, str]) -> None:
    """``go test`` of ``packages`` in ``minor``'s build module, with ``env`` added."""
    if shutil.which("go") is None:
        required("the Go plugins' tests", "install Go (https://go.dev/dl/) to run them")
    module = ROOT / "tools" / "k8s"
    if (module / f"v{minor}" / "go.mod").exists():
        module = module / f"v{minor}"
    tags = subprocess.run([str(BUILD), "--tags", minor], capture_output=True, text=True).stdout
    # -trimpath as tools/k8s/build.sh builds: the packages compiled for the control
    # plane are reused, not compiled again for the tests.
    done = subprocess.run(
        ["go", "test", "-count=1", "-trimpath", "-tags", tags.strip(), packages],
        cwd=module, env={**os.environ, **env}, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


@pytest.mark.parametrize("minor", _minors())
def test_the_plugins_decide_as_the_extender(minor, case_file, tmp_path):
    path, count = case_file
    report = tmp_path / "report.json"
    _go_test(minor, PACKAGES, {
        "GPU_SCHEDULER_CONFORMANCE": str(path),
        "GPU_SCHEDULER_CONFORMANCE_REPORT": str(report),
    })  # fmt: skip
    checked = json.loads(report.read_text())
    assert checked["cases"] == count and checked["disagree"] == 0, checked
    assert checked["verdicts"] > 10 * count // 2 and checked["scores"] > count // 2, checked


@pytest.fixture(scope="module")
def openb_file(tmp_path_factory) -> tuple[Path, dict]:
    from tests.bench.trace import TRACE_DIR, find_trace_dir

    try:
        find_trace_dir()
    except FileNotFoundError:
        required("the openb placements", f"the shared openb trace is not at {TRACE_DIR}")
    generated = openb.generate()
    path = tmp_path_factory.mktemp("openb") / "openb.json"
    path.write_text(json.dumps(generated))
    return path, generated


@pytest.mark.parametrize("minor", _minors())
def test_the_plugins_place_the_openb_pods_on_the_extenders_nodes(minor, openb_file, tmp_path):
    """Every pod on the extender's node, with the same scores there, the mix worked out
    afresh for each pod on both sides, and with the mix kept as each side keeps it
    (docs/development/plugins.md)."""
    path, generated = openb_file
    report = tmp_path / "report.json"
    _go_test(minor, OPENB, {
        "GPU_SCHEDULER_OPENB": str(path),
        "GPU_SCHEDULER_OPENB_REPORT": str(report),
    })  # fmt: skip
    checked = json.loads(report.read_text())
    picks = [p["node"] for p in generated["pods"]]
    assert checked["pods"] == len(picks) and checked["placed"] == sum(map(bool, picks)), checked
    assert checked["disagree"] == 0 and checked["scored_otherwise"] == 0, checked
    assert checked["kept_elsewhere"] == 0, checked  # with the mix kept as each side keeps it
    assert checked["mean_diff"] < 1e-6 and checked["used"] == len(set(filter(None, picks))), checked
    # the cluster fills: most nodes take pods, and some pods find no room
    nodes = len(generated["nodes"])
    assert checked["used"] > nodes // 2 and checked["placed"] < len(picks), checked
