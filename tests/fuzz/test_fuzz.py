"""A bounded fuzz sample against the real servers, in `make test`: a few hundred
generated requests per endpoint, fixed seed (the full campaign: tests/fuzz/campaign.py).
"""

from __future__ import annotations

import pytest

from tests.fuzz import harness, servers

SEED = 20261130
COUNT = 280  # 40 of each of the 7 classes
#: The most CPU one request may cost the server (the least of two tries). The largest
#: bodies (the `huge` class: strings up to 4 MiB) cost 21 ms on one VM and 56-76 ms
#: on a slower one (2026-12-02, the tree before and after that day's changes alike);
#: the faults this guards against cost seconds.
CPU_BOUND_MS = 100


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def check(result: harness.Result) -> None:
    report = harness.table([result])
    assert result.clean, report
    assert result.count == COUNT, report
    assert result.worst_cpu_ms < CPU_BOUND_MS, report
    assert result.statuses["valid"] == {200: COUNT // len(result.statuses)}, report


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
def test_extender(work, verb):
    """The extender as deployed (one worker), its cache listed from a fake API that
    holds the nodes the bodies name."""
    with servers.extender_fake_cluster(work) as (url, pid, log):
        targets = servers.extender_targets(url, pid, log, "fake API")
        check(harness.run(next(t for t in targets if verb in t.name), SEED, COUNT))


def test_webhook_over_tls(work):
    with servers.webhook(work) as (url, pid, log, ca):
        check(harness.run(servers.webhook_target(url, pid, log, ca), SEED, COUNT))
