"""The plugins path's GPUPlacement Event says what the extender's says, word for word.

Random decisions (candidates, each policy's 0..10 parts, weights, ties, sick GPUs,
placement-group notes, a chosen node out of the best, names too long for an Event's
name) are decided and worded here by the extender's own builder
(extender/explain.py: ``decision``, ``best``, ``explain``, ``event_name``, in both
voices); the Go package plugins/pkg/explain builds the same decision from the same
parts and must give the same message and Event name, for 1.37 and 1.34.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest

from extender import explain
from extender.engine import rounded
from extender.policies import REGISTRY
from tests.helpers import required
from tests.unit.test_plugins import BUILD, ROOT, _minors

PACKAGE = "github.com/gpu-scheduler/gpu-scheduler/plugins/pkg/explain"
POLICIES = [name for name, entry in REGISTRY.items() if entry.weight is not None]
VOICES = {"extender": explain.EXTENDER, "plugins": explain.PLUGINS}


def _part(rng: random.Random, policy: str, n: int) -> list[float]:
    if policy in ("spot", "group"):  # a plugin's 0..100 score, tenths
        return [rng.choice([0, 10, 25, 33, 50, 67, 75, 100]) / 10 for _ in range(n)]
    return [rng.choice([0.0, 2.5, 5.0, 10.0, round(rng.uniform(0, 10), 3)]) for _ in range(n)]


def case(rng: random.Random) -> dict[str, Any]:
    """One decision's inputs, and the extender's words for it."""
    n = rng.choice([0, 1, 2, 3, 5, 9, 14])
    names = [f"node-{rng.randrange(100)}-{i}" for i in range(n)]
    used = [p for p in POLICIES if p == "gpu" or rng.random() < 0.4] if n else []
    parts = {p: _part(rng, p, n) for p in used}
    weights = {p: rng.choice([1, 5, 8, 15]) for p in POLICIES}
    health = {m: [rng.randrange(4), 4] for m in names if rng.random() < 0.2}
    notes = {m: rng.choice(["2 of its group's 3 placed pods in zone=a", "x" * 1000]) for m in names}
    notes = {m: v for m, v in notes.items() if rng.random() < 0.3}
    name = rng.choice(["train-0", "p" * 260, "pöd-ü"])
    out = {
        "namespace": "default", "name": name, "uid": f"uid-{rng.randrange(10**6)}",
        "gpus": rng.choice([1, 2, 8]), "names": names, "parts": parts, "weights": weights,
        "keep": rng.choice([explain.TOP, 3]), "health": health, "notes": notes,
        "voice": rng.choice(sorted(VOICES)),
    }  # fmt: skip
    chosen, d = decide(out, rng)
    out["chosen"] = chosen
    out["message"] = explain.explain(d, chosen, VOICES[out["voice"]])
    out["event_name"] = explain.event_name(name, out["uid"])
    return out


def decide(c: dict[str, Any], rng: random.Random) -> tuple[str, explain.Decision]:
    """The extender's decision for case ``c``, and a node it was bound to."""
    names = c["names"]
    if not names:
        d = explain.only_fit(c["namespace"], c["name"], c["uid"], c["gpus"], "lone", 1, {})
        return "lone", d
    totals = np.zeros(len(names))
    for policy, part in c["parts"].items():  # as extender/engine.py's weighted_means
        totals = totals + c["weights"][policy] * np.asarray(part)
    scores = rounded(totals * (1.0 / sum(c["weights"][p] for p in c["parts"])))
    d = explain.decision(
        c["namespace"], c["name"], c["uid"], c["gpus"], names, scores, c["parts"], c["weights"],
        keep=c["keep"],
        health=lambda i: tuple(c["health"][names[i]]) if names[i] in c["health"] else None,
        note=lambda i: c["notes"].get(names[i]),
    )  # fmt: skip
    chosen = d.top[0].node if rng.random() < 0.6 else rng.choice(names)
    return chosen, d


def cases(count: int = 400, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [case(rng) for _ in range(count)]


def test_the_cases_reach_every_sentence():
    """The cases are not all alike: each of the message's forms is among them."""
    text = "\n".join(c["message"] for c in cases())
    for words in (
        "extender score", "gpu-scheduler score", "Runner-up", "broke the tie",
        "not among gpu-scheduler's best", "outweighed that", "No other candidate",
        "GPUs there healthy", "with its placement group", "(truncated of",
        "the only node kube-scheduler's filters left",
    ):  # fmt: skip
        assert words in text, words


@pytest.mark.parametrize("minor", _minors())
def test_go_words_the_placement_as_the_extender(minor, tmp_path):
    if shutil.which("go") is None:
        required("the Go plugins' tests", "install Go (https://go.dev/dl/) to run them")
    module = ROOT / "tools" / "k8s"
    if (module / f"v{minor}" / "go.mod").exists():
        module = module / f"v{minor}"
    tags = subprocess.run([str(BUILD), "--tags", minor], capture_output=True, text=True).stdout
    path = tmp_path / "placements.json"
    generated = cases()
    path.write_text(json.dumps(generated))
    env = {**os.environ, "GPU_SCHEDULER_PLACEMENT_CASES": str(path)}
    done = subprocess.run(
        ["go", "test", "-count=1", "-trimpath", "-tags", tags.strip(), "-v",
         "-run", "TestTheExtendersWords", PACKAGE],
        cwd=module, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    checked = re.search(r"(\d+) placement cases worded alike", done.stdout)
    assert checked is not None and int(checked.group(1)) == len(generated), done.stdout[-2000:]
