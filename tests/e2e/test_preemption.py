"""Priority and preemption through the gpu-scheduler profile, on the real control plane:
kube-scheduler's DefaultPreemption picks victims by its own count of GPUs, and our
extender's preempt verb (extender/preemption.py) recounts by the filter's.

- An inference pod (high priority) preempts training pods (low): exactly as many
  victims as it needs, then it is bound on the node it was nominated for.
- A sick GPU the device plugin still advertises: kube-scheduler alone evicts one pod
  too few for a node our filter then refuses, and the pod stays Pending; the
  extender adds the victim, and no pod is evicted for nothing.
- ``preemptionPolicy: Never`` evicts nothing; a PodDisruptionBudget steers the
  preemptor to the node whose victims it does not protect, as upstream does.
- A gang (``gpu-scheduler.io/group``) loses all its members or none.

The scenarios take a stack, so tests/e2e/test_versions.py runs them on the oldest
supported minor too.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from gpu_scheduler import contract
from tests.e2e.kube import (
    core,
    create_node,
    create_pod,
    events,
    gpu_labels,
    pod_manifest,
    read_lease,
    unique,
    wait_bound,
    wait_event,
)
from tests.e2e.scenarios import GPU_TAINT
from tests.e2e.test_agent_daemonset import h100_inventory
from tests.helpers import wait_for

LOW, HIGH, NEVER = "e2e-training", "e2e-inference", "e2e-inference-never"
H100 = ("NVIDIA-H100-80GB-HBM3", 81559)


def priority_classes(stack) -> None:
    api = client.SchedulingV1Api(stack.api)
    for name, value, policy in (
        (LOW, 10, "PreemptLowerPriority"),
        (HIGH, 100000, "PreemptLowerPriority"),
        (NEVER, 100000, "Never"),
    ):
        body = {"metadata": {"name": name}, "value": value, "preemptionPolicy": policy}
        try:
            api.create_priority_class(body)
        except ApiException as exc:
            if exc.status != 409:
                raise


def gpu_node(stack, case: str, prefix: str = "pre") -> str:
    labels = gpu_labels(8, *H100)
    return create_node(stack, unique(prefix), case=case, gpus=8, labels=labels, taints=GPU_TAINT)


def running(stack, node: str, gpus: int, *, priority: str = LOW, **kw: Any) -> str:
    """A training pod already bound to ``node`` (as if placed earlier)."""
    name = unique("train")
    manifest = pod_manifest(name, gpus, node_name=node, **kw)
    manifest["spec"]["priorityClassName"] = priority
    create_pod(stack, manifest)
    return name


def preemptor(stack, case: str, gpus: int, priority: str = HIGH) -> str:
    name = unique("infer")
    manifest = pod_manifest(name, gpus, case=case)
    manifest["spec"]["priorityClassName"] = priority
    create_pod(stack, manifest)
    return name


def alive(stack, names: list[str]) -> list[str]:
    """Those of ``names`` that still exist and are not being deleted."""
    left = []
    for name in names:
        try:
            pod = core(stack).read_namespaced_pod(name, "default")
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        if pod.metadata.deletion_timestamp is None:
            left.append(name)
    return left


class Nominations:
    """The nominated node a pod is given, seen on its watch (it lasts only until the
    victims are gone and the pod is bound)."""

    def __init__(self, stack, name: str) -> None:
        self.seen: list[str] = []
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(stack, name), daemon=True)
        self._thread.start()

    def _run(self, stack, name: str) -> None:
        stream = self._watch.stream(
            core(stack).list_namespaced_pod,
            "default",
            field_selector=f"metadata.name={name}",
            timeout_seconds=120,
        )
        try:
            for event in stream:
                nominated = event["object"].status.nominated_node_name
                if nominated and nominated not in self.seen:
                    self.seen.append(nominated)
        except Exception:  # stopped: the connection is closed under the stream
            return

    def stop(self) -> None:
        self._watch.stop()


def inference_preempts_training(stack) -> None:
    priority_classes(stack)
    case = unique("preempt")
    node = gpu_node(stack, case)
    training = [running(stack, node, 1) for _ in range(8)]
    name = unique("infer")
    nominations = Nominations(stack, name)
    time.sleep(0.5)  # the watch is open before the pod exists
    manifest = pod_manifest(name, 4, case=case)
    manifest["spec"]["priorityClassName"] = HIGH
    create_pod(stack, manifest)
    try:
        assert wait_bound(stack, name, timeout=60) == node
    finally:
        nominations.stop()
    assert len(alive(stack, training)) == 4, "exactly four evicted"
    assert nominations.seen == [node], nominations.seen


def sick_gpu_gets_enough_victims(stack, tmp_path: Path) -> None:
    priority_classes(stack)
    case = unique("preempt-sick")
    node = gpu_node(stack, case, "sick")
    inventory = tmp_path / f"{node}.yaml"
    sick = h100_inventory(8)
    sick["gpus"][3]["xid"] = 79
    inventory.write_text(yaml.safe_dump(sick))
    agent = stack.start_agent(node, inventory, interval="1s", capacity=False)
    try:
        wait_for(lambda: read_lease(stack, node) is not None, 30, "the agent's Lease")
        wait_for(lambda: '"xid":79' in _annotation(stack, node), 30, "the XID published")
        training = [running(stack, node, 1) for _ in range(7)]
        name = preemptor(stack, case, 4)
        assert wait_bound(stack, name, timeout=60) == node
        assert len(alive(stack, training)) == 3, "four evicted, none for nothing"
    finally:
        stack.cluster.stop_process(agent.name)


def never_preempts(stack) -> None:
    priority_classes(stack)
    case = unique("preempt-never")
    node = gpu_node(stack, case)
    training = [running(stack, node, 1) for _ in range(8)]
    name = preemptor(stack, case, 4, NEVER)  # the class says Never: admission copies it
    wait_event(stack, name, "preemptionPolicy=Never")
    time.sleep(2)
    assert alive(stack, training) == training
    assert core(stack).read_namespaced_pod(name, "default").spec.node_name is None


def _annotation(stack, node: str) -> str:
    return (core(stack).read_node(node).metadata.annotations or {}).get(contract.ANN_GPUS, "")


# --- the tests on the lab's newest minor ----------------------------------------------
def test_an_inference_pod_preempts_just_enough_training_pods(stack):
    inference_preempts_training(stack)


def test_a_sick_gpu_gets_the_victim_kube_scheduler_did_not_count(stack, tmp_path):
    sick_gpu_gets_enough_victims(stack, tmp_path)


def test_preemption_policy_never_evicts_nothing(stack):
    never_preempts(stack)


def test_a_disruption_budget_sends_the_preemptor_to_the_unprotected_node(stack):
    budget_steers_the_preemptor(stack)


def budget_steers_the_preemptor(stack) -> None:
    priority_classes(stack)
    case = unique("preempt-pdb")
    guarded, free = gpu_node(stack, case, "guarded"), gpu_node(stack, case, "free")
    label = {"app": unique("budget")}
    kept = [running(stack, guarded, 1) for _ in range(8)]
    for name in kept:
        core(stack).patch_namespaced_pod(name, "default", {"metadata": {"labels": label}})
    budget = {
        "metadata": {"name": unique("pdb")},
        "spec": {"minAvailable": 8, "selector": {"matchLabels": label}},
    }
    client.PolicyV1Api(stack.api).create_namespaced_pod_disruption_budget("default", budget)
    others = [running(stack, free, 1) for _ in range(8)]
    wait_for(lambda: _budget_settled(stack, budget["metadata"]["name"]), 30, "the budget's status")
    name = preemptor(stack, case, 4)
    assert wait_bound(stack, name, timeout=60) == free
    assert alive(stack, kept) == kept
    assert len(alive(stack, others)) == 4


def _budget_settled(stack, name: str) -> bool:
    status = client.PolicyV1Api(stack.api).read_namespaced_pod_disruption_budget(name, "default")
    return status.status is not None and status.status.expected_pods == 8


def test_a_gang_loses_all_its_members_or_none(stack):
    gang_whole_or_none(stack)


def gang_whole_or_none(stack) -> None:
    """Gang ``train`` runs one 4-GPU member on each of two nodes, beside a lone 4-GPU
    pod of lower priority on each. An 8-GPU preemptor would have to take a member and
    leave its sibling holding four GPUs: it takes nothing. A 4-GPU preemptor takes a
    lone pod (kube-scheduler spares the higher-priority members first)."""
    priority_classes(stack)
    api = client.SchedulingV1Api(stack.api)
    lowest = unique("e2e-lowest")
    api.create_priority_class({"metadata": {"name": lowest}, "value": 5})
    case = unique("preempt-gang")
    nodes = [gpu_node(stack, case, "gang"), gpu_node(stack, case, "gang")]
    group = {contract.ANN_GROUP: unique("train")}
    members = [running(stack, n, 4, annotations=group) for n in nodes]
    lone = [running(stack, n, 4, priority=lowest) for n in nodes]
    big = preemptor(stack, case, 8)
    wait_for(
        lambda: any("gang" in e for e in events(stack, big)) or _failed(stack, big),
        60,
        "the 8-GPU preemptor refused",
    )
    time.sleep(3)
    assert alive(stack, members) == members and alive(stack, lone) == lone
    assert core(stack).read_namespaced_pod(big, "default").spec.node_name is None
    core(stack).delete_namespaced_pod(big, "default", grace_period_seconds=0)
    small = preemptor(stack, case, 4)
    wait_bound(stack, small, timeout=60)
    assert alive(stack, members) == members
    assert len(alive(stack, lone)) == 1


def _failed(stack, name: str) -> bool:
    return any(e.startswith("FailedScheduling") for e in events(stack, name))
