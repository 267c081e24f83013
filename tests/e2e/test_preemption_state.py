"""Preemption state the extender must agree with kube-scheduler on, on the real
control plane (issue 49):

- a budget-protected pod is kept while a sick GPU needs a victim kube-scheduler did
  not count: the extender adds an unprotected one, as DefaultPreemption would;
- a pod nominated to a node that lacks CPU (a CPU-only pod took it) still gets
  placed: the extender no longer drops every node as "kube-scheduler is behind";
- a preemptor waiting on its nominated node keeps its room against a lower-priority
  pod, though kube-scheduler, counting the sick GPU as free, would let that pod in;
- a pod the extender picked a node for, deleted while pending, frees that node's GPUs
  at once in the extender's count.

The nominated pod of the last two is made as kube-scheduler would leave it (pending,
``status.nominatedNodeName`` set) by patching its status while a scheduling gate holds
it: the race that leads there on a busy cluster (a nomination made, then the node
changes before the next attempt) is milliseconds wide in the lab.

The scenarios take a stack, so tests/e2e/test_versions.py runs them on the oldest
supported minor too.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from kubernetes import client

from tests.e2e.kube import (
    core,
    create_node,
    create_pod,
    gpu_labels,
    pod_manifest,
    read_lease,
    unique,
    wait_bound,
)
from tests.e2e.scenarios import GPU_TAINT
from tests.e2e.test_agent_daemonset import h100_inventory
from tests.e2e.test_preemption import H100, HIGH, LOW, alive, priority_classes, running
from tests.helpers import wait_for

HOLD = "gpu-scheduler.io/e2e-hold"


def sick_node(stack, case: str, tmp_path: Path, prefix: str):
    """An 8-GPU node whose GPU 3 has an XID 79, as its agent reports it: kube-scheduler
    counts 8 GPUs, the extender 7. Returns (node, agent process)."""
    labels = gpu_labels(8, *H100)
    node = create_node(stack, unique(prefix), case=case, gpus=8, labels=labels, taints=GPU_TAINT)
    inventory = tmp_path / f"{node}.yaml"
    gpus = h100_inventory(8)
    gpus["gpus"][3]["xid"] = 79
    inventory.write_text(yaml.safe_dump(gpus))
    agent = stack.start_agent(node, inventory, interval="1s", capacity=False)
    wait_for(lambda: read_lease(stack, node) is not None, 30, "the agent's Lease")
    wait_for(lambda: '"xid":79' in _gpus(stack, node), 30, "the XID published")
    return node, agent


def _gpus(stack, node: str) -> str:
    return (core(stack).read_node(node).metadata.annotations or {}).get("gpu-scheduler.io/gpus", "")


def plain_node(stack, case: str, prefix: str, cpu: str = "32") -> str:
    labels = gpu_labels(8, *H100)
    return create_node(
        stack, unique(prefix), case=case, gpus=8, labels=labels, taints=GPU_TAINT, cpu=cpu
    )


def held_nominated(stack, case: str, gpus: int, node: str, cpu: str = "100m") -> str:
    """A HIGH-priority GPU pod, pending with ``status.nominatedNodeName: node`` (as a
    preemptor waiting for its victims), still held by a scheduling gate."""
    name = unique("nominated")
    manifest = pod_manifest(name, gpus, case=case)
    manifest["spec"]["priorityClassName"] = HIGH
    manifest["spec"]["schedulingGates"] = [{"name": HOLD}]
    manifest["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    create_pod(stack, manifest)
    core(stack).patch_namespaced_pod_status(
        name, "default", {"status": {"nominatedNodeName": node}}
    )
    return name


def release(stack, name: str) -> None:
    core(stack).patch_namespaced_pod(name, "default", {"spec": {"schedulingGates": None}})


def budget_kept_on_a_sick_gpu(stack, tmp_path: Path) -> None:
    priority_classes(stack)
    case = unique("pre-budget")
    node, agent = sick_node(stack, case, tmp_path, "budget")
    try:
        training = [running(stack, node, 1) for _ in range(7)]
        protected = training[-1]  # the newest: the one a newest-first rule would take
        label = {"app": unique("db")}
        core(stack).patch_namespaced_pod(protected, "default", {"metadata": {"labels": label}})
        budget = {
            "metadata": {"name": unique("pdb")},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": label}},
        }
        policy = client.PolicyV1Api(stack.api)
        policy.create_namespaced_pod_disruption_budget("default", budget)
        wait_for(
            lambda: _expected(policy, budget["metadata"]["name"]) == 1, 30, "the budget's status"
        )
        name = unique("infer")
        manifest = pod_manifest(name, 4, case=case)
        manifest["spec"]["priorityClassName"] = HIGH
        create_pod(stack, manifest)
        assert wait_bound(stack, name, timeout=60) == node
        left = alive(stack, training)
        assert protected in left, "the budget-protected pod was evicted"
        assert len(left) == 3, f"four evicted, none for nothing: {left}"
    finally:
        stack.cluster.stop_process(agent.name)


def _expected(policy, name: str) -> int | None:
    status = policy.read_namespaced_pod_disruption_budget(name, "default").status
    return None if status is None else status.expected_pods


def nominated_node_short_of_cpu_still_places(stack) -> None:
    """The pod is nominated to ``short``, whose GPUs are free but whose CPU a CPU-only
    pod of the same priority took; kube-scheduler proposes GPU pods there as victims
    (they free CPU) and on ``full``. By the extender's count the pod fits ``short``
    as it is (it counts no CPU-only pod): before, it answered that kube-scheduler was
    behind and dropped every node, and the pod stayed Pending for good."""
    priority_classes(stack)
    case = unique("pre-cpu")
    short = plain_node(stack, case, "short", cpu="4")
    full = plain_node(stack, case, "full")
    hog = pod_manifest(unique("cpu-hog"), 0, node_name=short)
    hog["spec"]["priorityClassName"] = HIGH
    hog["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3500m"
    create_pod(stack, hog)
    near = [running(stack, short, 1) for _ in range(4)]
    far = [running(stack, full, 1) for _ in range(8)]
    name = held_nominated(stack, case, 4, short, cpu="500m")
    release(stack, name)
    placed = wait_bound(stack, name, timeout=60)
    assert placed in (short, full)
    assert len(alive(stack, near + far)) == 8, "four evicted where it was placed"


def nominated_preemptor_keeps_its_room(stack, tmp_path: Path) -> None:
    """A 4-GPU preemptor waits on ``sick`` (3 of its 7 usable GPUs in use: 4 left,
    all its own). A lower-priority 1-GPU pod comes: binpacking would put it there
    (the fuller node), and kube-scheduler, counting 8 GPUs, lets it; the extender
    counts the nominated pod and sends it to the emptier node."""
    priority_classes(stack)
    case = unique("pre-room")
    node, agent = sick_node(stack, case, tmp_path, "room")
    try:
        other = plain_node(stack, case, "other")
        [running(stack, node, 1) for _ in range(3)]
        running(stack, other, 1)
        preemptor = held_nominated(stack, case, 4, node)
        wait_for(lambda: _nominated(stack, preemptor) == node, 30, "the nomination")
        name = unique("small")
        manifest = pod_manifest(name, 1, case=case)
        manifest["spec"]["priorityClassName"] = LOW
        create_pod(stack, manifest)
        assert wait_bound(stack, name, timeout=60) == other
        core(stack).delete_namespaced_pod(preemptor, "default", grace_period_seconds=0)
    finally:
        stack.cluster.stop_process(agent.name)


def a_deleted_pending_pick_frees_its_gpus(stack) -> None:
    """The extender counts a pod it answered one node for as placed there until the
    watch shows it bound (a pick); one deleted while still pending (a gang turned
    away, a user's delete, a failed binding followed by a delete) stops counting at
    once, not at the pick's 30 s: the next pod asking those GPUs passes within
    seconds. The two pods are held by a scheduling gate, so only the extender's filter
    (called as kube-scheduler calls it) decides; no binding ever comes."""
    import requests

    case = unique("pick-gone")
    node = plain_node(stack, case, "pick")
    bodies = []
    for _ in range(2):
        manifest = pod_manifest(unique("picked"), 8, case=case)
        manifest["spec"]["schedulingGates"] = [{"name": HOLD}]
        bodies.append(create_pod(stack, manifest))
    first, second = bodies

    def answer(body: dict) -> list[str]:
        call = {"Pod": body, "NodeNames": [node]}
        done = requests.post(
            f"{stack.extender_url}/filter", json=call, timeout=10, **stack.extender_client()
        )
        return done.json()["NodeNames"] or []

    assert answer(first) == [node]
    assert answer(second) == [], "the first pod's pick holds the node's 8 GPUs"
    core(stack).delete_namespaced_pod(first["metadata"]["name"], "default")
    started = time.monotonic()
    wait_for(lambda: answer(second) == [node], 10, "the deleted pod's GPUs free", 0.1)
    took = time.monotonic() - started
    print(f"a deleted pending pick: its GPUs free {took:.2f} s after the delete")
    core(stack).delete_namespaced_pod(second["metadata"]["name"], "default")


def _nominated(stack, name: str) -> str | None:
    return core(stack).read_namespaced_pod(name, "default").status.nominated_node_name


# --- the tests on the lab's newest minor ----------------------------------------------
def test_a_budget_protected_pod_is_kept_while_a_sick_gpu_needs_an_extra_victim(stack, tmp_path):
    budget_kept_on_a_sick_gpu(stack, tmp_path)


def test_a_pod_whose_nominated_node_lacks_cpu_still_gets_placed(stack):
    nominated_node_short_of_cpu_still_places(stack)


def test_a_nominated_preemptor_keeps_its_room_against_a_lower_priority_pod(stack, tmp_path):
    nominated_preemptor_keeps_its_room(stack, tmp_path)


def test_a_pending_pick_deleted_frees_its_gpus_at_once(stack):
    a_deleted_pending_pick_frees_its_gpus(stack)
