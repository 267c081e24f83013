"""The differential digest (tests/bench/decision_digest.py): the same checkout gives
the same digest, and a changed decision changes it."""

from __future__ import annotations

from tests.bench.decision_digest import digest


def test_the_digest_is_the_same_each_run_and_moves_with_a_decision(monkeypatch):
    first = digest(400, 42, "default", node_scale=0.02)
    assert first["placed"] < first["pods"]  # the cluster filled: refusals were asked too
    assert digest(400, 42, "default", node_scale=0.02) == first

    from extender.policies.gpu import GpuPolicy

    def spread(self, state, nodes, view):  # binpack turned around
        return -original(self, state, nodes, view)

    original = GpuPolicy.score_all
    monkeypatch.setattr(GpuPolicy, "score_all", spread)
    assert digest(400, 42, "default", node_scale=0.02)["sha256"] != first["sha256"]
