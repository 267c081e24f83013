"""The fuzz sample against the extender in cluster mode, as the e2e stack runs it
(list+watch cache on the real API server)."""

from __future__ import annotations

import pytest

from tests.e2e.kube import core
from tests.fuzz import harness, servers
from tests.fuzz.test_fuzz import COUNT, SEED, check

TAINT = {"key": "e2e.gpu-scheduler.io/fuzz", "value": "only", "effect": "NoSchedule"}


@pytest.fixture
def fuzz_nodes(stack):
    from lab.kubelet_shim import node_object

    api = core(stack)
    for node in servers.base_nodes():
        meta = node["metadata"]
        api.create_node(node_object(meta["name"], labels=meta["labels"], taints=[TAINT]))
    yield
    for name in servers.NODE_NAMES:
        api.delete_node(name)


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
def test_extender_cluster_mode(stack, fuzz_nodes, verb):
    proc = stack.cluster.processes["extender"]
    targets = servers.extender_targets(
        stack.extender_url, proc.popen.pid, proc.log_path, "cluster", stack.extender_client()
    )
    check(harness.run(next(t for t in targets if verb in t.name), SEED, COUNT))
