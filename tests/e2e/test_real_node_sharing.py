"""GPU sharing on the real node (lab.realnode: containerd, runc, CNI and the kubelet).

The chart installed with ``agent.sharing.enabled``, the node labelled
``gpu-scheduler.io/gpu-sharing=mps``: the sharing agent's pod serves the kubelet's
device plugin for ``gpu-scheduler.io/gpu-memory`` and ``nvidia.com/gpu`` from a fake
inventory of two 80 GB GPUs, and its MPS supervisor runs a stand-in of
``nvidia-cuda-mps-control`` (the one thing faked: there is no GPU). Then:

- the plugin registers with the kubelet, and allocatable shows the units;
- two pods of 20 GiB go to the same GPU (best fit): both containers print its UUID and
  the MPS limits the plugin gave them; a pod of 50 GiB goes to the other GPU;
- a pod of 60 GiB fits the node's total free memory but no single GPU: it waits, and
  kube-scheduler's reason names the largest free piece;
- the agent publishes what each GPU gave out (``gpu-scheduler.io/gpu-shares``) from
  the kubelet's PodResources;
- a kubelet restart keeps what was allocated: the pods keep running, the plugin
  registers again, the report stays.

On the newest minor only (the device-plugin API is the same v1beta1 on every one).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpu_scheduler import contract, sharing
from lab import realnode
from lab.controlplane import ROOT, binary_minor, plugins_scheduler, start_control_plane
from lab.stack import NAMESPACE, Stack
from tests.e2e.test_agent_daemonset import h100_inventory
from tests.helpers import required, wait_for
from tests.unit.test_mps import FAKE

NODE = "gpu-share-0"
LAB = Path("/etc/gpu-scheduler-lab-sharing")
MPS_ROOT = realnode.HOST_DIR / "mps"  # swept with the node
#: The kubelet's device-plugin directory is a constant of the kubelet, not under its
#: --root-dir; its PodResources directory is under the root dir.
PLUGINS = realnode.DEVICE_PLUGINS
POD_RESOURCES = realnode.HOST_DIR / "kubelet" / "pod-resources"
CHART = ROOT / "charts" / "gpu-scheduler"
#: 77 per GPU: (81,559 MiB - the agent's default reserve of 2,048) // 1,024.
UNITS = sharing.gpu_units(h100_inventory(1)["gpus"][0]["memoryMiB"], 2048)


def _lab_files() -> None:
    """The fake inventory, and the MPS stand-in with a one-line wrapper as the program."""
    shutil.rmtree(LAB, ignore_errors=True)
    LAB.mkdir(parents=True)
    (LAB / "gpus.yaml").write_text(yaml.safe_dump(h100_inventory(2)))
    (LAB / "fake-mps-control.py").write_text(FAKE.format(state=str(MPS_ROOT / "fake-state")))
    wrapper = LAB / "nvidia-cuda-mps-control"
    wrapper.write_text(f'#!/bin/sh\nexec python3 {LAB}/fake-mps-control.py "$@"\n')
    wrapper.chmod(0o755)


def _values(work: Path) -> Path:
    name, tag = realnode.images()["GPU_SCHEDULER_IMAGE"].rsplit(":", 1)
    values = {
        "image": {"repository": name, "tag": tag, "pullPolicy": "IfNotPresent"},
        "scheduler": {"replicas": 0},  # the lab runs these two from the host
        "extender": {"replicas": 0},
        "certificates": {"controller": {"settle": "15s"}},
        "agent": {
            "platform": "eks",
            "interval": "5s",  # the shares report is written at the next round
            "extraArgs": [
                "--fake-gpus",
                str(LAB / "gpus.yaml"),
                "--mps-control",
                str(LAB / "nvidia-cuda-mps-control"),
                "--resync-interval",
                "10s",
            ],
            "extraVolumes": [{"name": "lab", "hostPath": {"path": str(LAB), "type": "Directory"}}],
            "extraVolumeMounts": [{"name": "lab", "mountPath": str(LAB), "readOnly": True}],
            "sharing": {
                "enabled": True,
                "devicePluginDir": str(PLUGINS),
                "podResourcesDir": str(POD_RESOURCES),
                "mpsRoot": str(MPS_ROOT),
            },
        },
    }
    path = work / "values-sharing.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@contextlib.contextmanager
def sharing_node(
    work: Path, binary: Path, helm_binary: Path, scheduling: str = "extender"
) -> Iterator[tuple[Stack, realnode.RealNode]]:
    """A control plane of ``binary`` with the real node labelled for sharing, the
    gpu-scheduler profile on ``scheduling``'s path, and the chart with the sharing agent;
    everything gone from the host after."""
    reason = realnode.missing()
    if reason:
        required("the real node", reason)
    if scheduling == "plugins":
        try:
            plugins_scheduler(binary_minor(binary))
        except FileNotFoundError as exc:
            required("the plugins path on the real node", f"{exc} (or `make test`)")
    cluster = start_control_plane(work / "cluster", binary, real_node=True)
    stack = Stack(cluster, work, scheduling=scheduling)
    stack.helm = helm_binary
    node = None
    try:
        stack.api = cluster.api_client()
        _lab_files()
        labels = {contract.LABEL_GPU_PRESENT: "true", contract.LABEL_GPU_SHARING: "mps"}
        node = realnode.start_real_node(cluster, NODE, labels)
        (MPS_ROOT / "fake-state").mkdir(parents=True)  # the MPS stand-in's own notes
        if scheduling == "extender":
            stack.start_extender()
        stack.start_schedulers()
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        done = subprocess.run(
            [str(helm_binary), "helm", "install", "gpu-scheduler", str(CHART), "-n", NAMESPACE,
             "--create-namespace", "--wait", "--timeout", "6m", "-f", str(_values(work))],
            env=env, capture_output=True, text=True, timeout=420,
        )  # fmt: skip
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        yield stack, node
    except BaseException:
        print(cluster.failures())
        if node is not None:
            print(node.logs())
        raise
    finally:
        cluster.stop()
        if node is not None:
            node.stop()
        shutil.rmtree(LAB, ignore_errors=True)
        left = realnode.leftovers()  # node.stop() swept the kubelet's device checkpoint too
    assert left == [], f"the real node left things on the host: {left}"


@pytest.fixture(scope="module")
def shared(tmp_path_factory, control_plane_binary, helm_binary):
    work = tmp_path_factory.mktemp("realnode-sharing")
    with sharing_node(work, control_plane_binary, helm_binary) as (stack, node):
        yield stack, node


def _node(stack: Stack) -> Any:
    return client.CoreV1Api(stack.api).read_node(NODE)


def _share_pod(name: str, units: int) -> dict[str, Any]:
    """docs/examples/gpu-share.yaml as a user applies it, with its name and size set,
    and the lab's image for the CUDA one (no registry here; both have sh)."""
    pod = yaml.safe_load((ROOT / "docs" / "examples" / "gpu-share.yaml").read_text())
    pod["metadata"]["name"] = name
    (container,) = pod["spec"]["containers"]
    container["image"] = realnode.images()["GPU_SCHEDULER_IMAGE"]
    container["imagePullPolicy"] = "IfNotPresent"
    container["resources"]["limits"][contract.RESOURCE_GPU_MEMORY] = str(units)
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


def _running(stack: Stack, name: str) -> Any:
    core = client.CoreV1Api(stack.api)
    wait_for(
        lambda: core.read_namespaced_pod(name, "default").status.phase == "Running",
        120,
        f"pod {name} running",
        1,
    )
    return core.read_namespaced_pod(name, "default")


def _printed(stack: Stack, name: str) -> list[str]:
    core = client.CoreV1Api(stack.api)
    wait_for(lambda: core.read_namespaced_pod_log(name, "default").strip(), 60, f"{name}'s log", 1)
    return core.read_namespaced_pod_log(name, "default").split()


def test_the_plugin_registers_and_allocatable_shows_the_units(shared):
    shared, _ = shared

    def allocatable() -> dict[str, str]:
        return _node(shared).status.allocatable or {}

    wait_for(
        lambda: allocatable().get(contract.RESOURCE_GPU_MEMORY) == str(2 * UNITS),
        180,
        "the device plugin's units in allocatable",
        1,
    )
    assert allocatable()[contract.RESOURCE_GPU] == "2"  # whole GPUs, by the same plugin
    # The sharing agent runs there, the plain one does not.
    core = client.CoreV1Api(shared.api)
    names = {
        p.metadata.labels["app.kubernetes.io/name"]
        for p in core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={NODE}").items
    }
    assert "gpu-scheduler-agent-sharing" in names and "gpu-scheduler-agent" not in names


def test_two_shares_land_on_one_gpu_with_their_mps_limits(shared):
    shared, _ = shared
    core = client.CoreV1Api(shared.api)
    for name, units in (("share-a", 20), ("share-b", 20), ("share-c", 50)):
        core.create_namespaced_pod("default", _share_pod(name, units))
        _running(shared, name)  # one at a time: each placed on what the last left
    a, b, c = (_printed(shared, n) for n in ("share-a", "share-b", "share-c"))
    assert a[0] == b[0] and a[0].startswith("GPU-"), (a, b)
    assert c[0] != a[0]  # 50 GiB does not fit the 39 left next to the two
    assert a[1:] == ["0=20G", str(-(-100 * 20 // UNITS)), str(MPS_ROOT)]
    assert c[1] == "0=50G"


def test_a_pod_that_fits_the_total_but_no_single_gpu_waits_with_its_reason(shared):
    shared, _ = shared
    core = client.CoreV1Api(shared.api)
    core.create_namespaced_pod("default", _share_pod("share-big", 60))

    def reason() -> str:
        pod = core.read_namespaced_pod("share-big", "default")
        found = [c.message or "" for c in pod.status.conditions or [] if c.type == "PodScheduled"]
        return found[0] if found else ""

    try:
        wait_for(lambda: "no single GPU" in reason(), 60, "the pod's unschedulable reason", 1)
    except TimeoutError:
        pod = core.read_namespaced_pod("share-big", "default")
        raise AssertionError(f"{pod.spec.node_name} {pod.status}") from None
    free = 2 * UNITS - 90
    report = (_node(shared).metadata.annotations or {}).get(contract.ANN_GPU_SHARES)
    assert f"the largest free piece is {UNITS - 40} GiB" in reason(), (reason(), report)
    assert f"{free} GiB free on 2 GPUs" in reason()


def test_the_agent_reports_what_each_gpu_gave_out(shared):
    shared, _ = shared
    core = client.CoreV1Api(shared.api)
    names = {  # the report names pods by UID
        core.read_namespaced_pod(n, "default").metadata.uid: f"default/{n}"
        for n in ("share-a", "share-b", "share-c")
    }

    def report() -> dict[str, Any]:
        annotations = _node(shared).metadata.annotations or {}
        by_uid = json.loads(annotations.get(contract.ANN_GPU_SHARES, "{}"))
        return {g: {names.get(p, p): u for p, u in pods.items()} for g, pods in by_uid.items()}

    def held() -> dict[str, Any]:
        return {pod: units for pods in report().values() for pod, units in pods.items()}

    wait_for(
        lambda: held() == {"default/share-a": 20, "default/share-b": 20, "default/share-c": 50},
        90,
        "the gpu-shares report",
        1,
    )
    by_gpu = {uuid: sorted(pods) for uuid, pods in report().items() if pods}
    assert sorted(by_gpu.values()) == [["default/share-a", "default/share-b"], ["default/share-c"]]


def test_a_kubelet_restart_keeps_what_was_allocated(shared):
    shared, node = shared
    core = client.CoreV1Api(shared.api)
    before = {n: core.read_namespaced_pod(n, "default") for n in ("share-a", "share-c")}
    report = (_node(shared).metadata.annotations or {})[contract.ANN_GPU_SHARES]
    socket = PLUGINS / "gpu-scheduler-gpu-memory.sock"

    def identity() -> tuple[int, int] | None:
        try:
            status = socket.stat()
        except FileNotFoundError:
            return None
        return status.st_ino, status.st_ctime_ns  # a new file may reuse the inode

    first = identity()
    node.kubelet = shared.cluster.restart(f"kubelet-{NODE}")
    # The kubelet removes the plugin sockets when it starts; the plugin serves anew.
    wait_for(lambda: identity() not in (None, first), 120, "a fresh plugin socket", 1)
    wait_for(
        lambda: (
            (_node(shared).status.allocatable or {}).get(contract.RESOURCE_GPU_MEMORY)
            == str(2 * UNITS)
        ),
        120,
        "allocatable after the restart",
        1,
    )
    time.sleep(5)  # a few of the agent's PodResources reads
    for name, pod in before.items():
        now = core.read_namespaced_pod(name, "default")
        assert now.status.phase == "Running"
        assert now.status.container_statuses[0].restart_count == 0
        assert now.status.container_statuses[0].container_id == (
            pod.status.container_statuses[0].container_id
        )
    assert (_node(shared).metadata.annotations or {})[contract.ANN_GPU_SHARES] == report
    # And the kubelet still refuses what no GPU holds: the big pod still waits.
    assert core.read_namespaced_pod("share-big", "default").spec.node_name is None


def test_a_high_priority_share_preempts_shares_on_the_real_node(shared):
    """GPU A holds share-a and share-b (20 + 20), GPU B share-c (50); share-big (60, the
    same low priority) waits. A high-priority 66 GiB share: the node's 64 free GiB are
    short, so kube-scheduler evicts by its count (the last it can put back: share-c),
    the extender agrees (GPU B then holds 66), and the kubelet gives the pod GPU B
    through the device plugin. share-big, which would now fit GPU B, is kept off the
    preemptor's room while it waits there."""
    shared, _ = shared
    core = client.CoreV1Api(shared.api)
    scheduling = client.SchedulingV1Api(shared.api)
    scheduling.create_priority_class({"metadata": {"name": "e2e-share-high"}, "value": 100000})
    gpu_b = _printed(shared, "share-c")[0]
    pod = _share_pod("share-urgent", 66)
    pod["spec"]["priorityClassName"] = "e2e-share-high"
    core.create_namespaced_pod("default", pod)
    try:
        _running(shared, "share-urgent")
    except TimeoutError:
        print(_story(shared, "share-urgent"))
        raise
    assert _printed(shared, "share-urgent")[:2] == [gpu_b, "0=66G"]
    left = {p.metadata.name for p in core.list_namespaced_pod("default").items}
    assert {"share-a", "share-b", "share-urgent"} <= left and "share-c" not in left, left
    assert core.read_namespaced_pod("share-big", "default").spec.node_name is None


def _story(stack: Stack, name: str) -> str:
    """What a pod that did not run went through: its status, its Events, and the
    sharing agent's last log lines."""
    core = client.CoreV1Api(stack.api)
    pod = core.read_namespaced_pod(name, "default")
    lines = [f"{name}: node={pod.spec.node_name} phase={pod.status.phase}"]
    lines += [f"  {c.type}={c.status} {c.reason}: {c.message}" for c in pod.status.conditions or []]
    selector = f"involvedObject.name={name}"
    for event in core.list_namespaced_event("default", field_selector=selector).items:
        lines.append(f"  event {event.reason}: {event.message}")
    for agent in core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={NODE}").items:
        for container in agent.spec.containers:
            log = core.read_namespaced_pod_log(
                agent.metadata.name, NAMESPACE, container=container.name, tail_lines=30
            )
            lines.append(f"--- {agent.metadata.name}/{container.name}\n{log}")
    return "\n".join(lines)
