"""Whole GPUs and shares preempt each other on a sharing node: the plugins path, on the
real node with our device plugin (lab.realnode), on the newest minor and the oldest.

kube-scheduler counts ``nvidia.com/gpu`` and ``gpu-scheduler.io/gpu-memory`` apart,
and both fit by its count whenever the node has them allocatable, so on the extender
path it finds no victim and never asks the extender (docs/concepts/sharing.md,
tests/e2e/test_shares.py). On the plugins path DefaultPreemption's what-if runs
GPUScheduler's Filter, which places shares and whole GPUs GPU by GPU, so:

- two low-priority whole-GPU pods hold both GPUs; a high-priority share of 20 GiB
  evicts one of them and the kubelet gives it that GPU through the device plugin;
- a pod of higher priority asking every GPU of the node evicts the share and the
  whole-GPU pod left, and gets both GPUs.

The node, the chart and the fake inventory are test_real_node_sharing's.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from gpu_scheduler import contract
from lab.stack import Stack
from tests.e2e.test_real_node_sharing import (
    NODE,
    UNITS,
    _printed,
    _running,
    _share_pod,
    _story,
    sharing_node,
)
from tests.e2e.test_versions import binary_for
from tests.helpers import wait_for


@pytest.fixture(scope="module", params=["newest", "oldest"])
def shared(request, tmp_path_factory, control_plane_binary, helm_binary):
    binary = binary_for(request.param, control_plane_binary)
    work = tmp_path_factory.mktemp(f"sharing-preemption-{request.param}")
    with sharing_node(work, binary, helm_binary, scheduling="plugins") as (stack, _):
        wait_for(
            lambda: (
                (client.CoreV1Api(stack.api).read_node(NODE).status.allocatable or {}).get(
                    contract.RESOURCE_GPU_MEMORY
                )
                == str(2 * UNITS)
            ),
            180,
            "the device plugin's units in allocatable",
            1,
        )
        scheduling = client.SchedulingV1Api(stack.api)
        for name, value in (("e2e-high", 100000), ("e2e-higher", 200000)):
            scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
        yield stack


def _whole_pod(name: str, gpus: int, priority_class: str | None = None) -> dict[str, Any]:
    """A pod of ``gpus`` whole GPUs that prints the GPUs the device plugin gave it."""
    pod = _share_pod(name, 1)
    (container,) = pod["spec"]["containers"]
    container["command"] = ["sh", "-c", 'echo "$NVIDIA_VISIBLE_DEVICES"; exec sleep infinity']
    container["resources"] = {"limits": {contract.RESOURCE_GPU: str(gpus)}}
    if priority_class:
        pod["spec"]["priorityClassName"] = priority_class
    return pod


def _names(stack: Stack) -> set[str]:
    items = client.CoreV1Api(stack.api).list_namespaced_pod("default").items
    return {p.metadata.name for p in items if p.metadata.deletion_timestamp is None}


def _placed(stack: Stack, name: str) -> list[str]:
    try:
        _running(stack, name)
    except TimeoutError:
        print(_story(stack, name))
        raise
    return _printed(stack, name)


def test_a_high_priority_share_preempts_a_whole_gpu_pod(shared):
    core = client.CoreV1Api(shared.api)
    gpus = {}
    for name in ("whole-a", "whole-b"):
        core.create_namespaced_pod("default", _whole_pod(name, 1))
        gpus[name] = _placed(shared, name)[0]
    assert sorted(gpus.values())[0].startswith("GPU-") and len(set(gpus.values())) == 2
    share = _share_pod("share-urgent", 20)
    share["spec"]["priorityClassName"] = "e2e-high"
    core.create_namespaced_pod("default", share)
    uuid, limit = _placed(shared, "share-urgent")[:2]
    assert limit == "0=20G"
    left = [n for n in gpus if n in _names(shared)]
    assert len(left) == 1, f"one whole-GPU pod evicted, not {2 - len(left)}: {_names(shared)}"
    (kept,) = left
    (evicted,) = set(gpus) - {kept}
    assert uuid == gpus[evicted] != gpus[kept]  # the share took the evicted pod's GPU


def test_a_higher_priority_pod_of_every_gpu_preempts_the_share(shared):
    core = client.CoreV1Api(shared.api)
    before = _names(shared)
    assert "share-urgent" in before, before
    core.create_namespaced_pod("default", _whole_pod("train-all", 2, "e2e-higher"))
    given = _placed(shared, "train-all")[0].split(",")
    assert len(given) == 2 and all(g.startswith("GPU-") for g in given), given
    wait_for(lambda: _names(shared) == {"train-all"}, 60, "the share and the whole pod gone", 1)
