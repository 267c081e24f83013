"""The agent on a sharing node: the MPS supervisor's health file, and the device plugin
the agent starts, following the node's sharing label, fed by the agent's own reads."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agent.deviceplugin.devices import MPS, TIME_SLICING
from agent.fake import FakeBackend
from agent.sharing_node import HEALTH_FILE, read_health, start_device_plugin, write_health
from agent.sync import NodeState
from gpu_scheduler import contract
from tests.unit.test_device_plugin import FakeKubelet, folder  # noqa: F401  (fixture)
from tests.unit.test_mps import fake  # noqa: F401  (fixture)


def test_the_health_file_says_which_gpus_have_no_daemon(tmp_path):
    root = str(tmp_path)
    write_health(root, {"GPU-b": "exit 1: cannot start"}, ["GPU-a", "GPU-b"], now=100.0)
    assert read_health(root, ["GPU-a", "GPU-b"], now=110.0) == {"GPU-b": "exit 1: cannot start"}
    # A GPU the supervisor does not run a daemon for yet, a stale file, no file, junk.
    assert "does not run a daemon" in read_health(root, ["GPU-a", "GPU-c"], 110.0)["GPU-c"]
    assert "silent for over 60s" in read_health(root, ["GPU-a"], 200.0)["GPU-a"]
    (tmp_path / HEALTH_FILE).write_text("{not json")
    assert "no MPS supervisor health" in read_health(root, ["GPU-a"], 110.0)["GPU-a"]
    (tmp_path / HEALTH_FILE).write_text(json.dumps({"at": "x", "gpus": [], "unhealthy": {}}))
    assert set(read_health(root, ["GPU-a"], 110.0)) == {"GPU-a"}
    os.unlink(tmp_path / HEALTH_FILE)
    assert set(read_health(root, ["GPU-a", "GPU-b"], 110.0)) == {"GPU-a", "GPU-b"}
    assert [p for p in os.listdir(root) if p.startswith(".health-")] == []  # no leftovers


class _Agent:
    """What start_device_plugin reads of the agent: its last read and its hook."""

    def __init__(self, fake_file: Path) -> None:
        self.last_inventory = FakeBackend(str(fake_file)).read()
        self.pod_resources = None
        self.on_node = None


def _fake_gpus(path: Path) -> Path:
    gpus = [
        {
            "uuid": f"GPU-{i}",
            "name": "NVIDIA A100-SXM4-80GB",
            "memoryMiB": 81920,
            "computeCapability": "8.0",
        }
        for i in range(2)
    ]
    path.write_text(
        json.dumps({"driverVersion": "550.54.15", "cudaDriverVersion": "12.4", "gpus": gpus})
    )
    return path


def _wait(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_the_agent_serves_the_plugin_while_the_node_is_labelled(folder, tmp_path):  # noqa: F811
    kubelet = FakeKubelet(folder)
    agent = _Agent(_fake_gpus(tmp_path / "gpus.json"))
    args = argparse.Namespace(
        device_plugin="auto", dry_run=False, pod_resources_socket=str(tmp_path / "none.sock"),
        mps_pipe_root=str(tmp_path / "mps"), cdi=False, kubelet_dir=str(folder),
    )  # fmt: skip
    plugin = start_device_plugin(args, agent)
    try:
        assert not plugin.running  # auto: nothing until the label is read
        labelled = NodeState("n1", labels={contract.LABEL_GPU_SHARING: "time-slicing"})
        agent.on_node(labelled)
        assert plugin.running and plugin.state.options.mode == TIME_SLICING
        assert _wait(lambda: sorted(kubelet.resources()) == sorted(
            [contract.RESOURCE_GPU, contract.RESOURCE_GPU_MEMORY]))  # fmt: skip
        agent.on_node(NodeState("n1", labels={contract.LABEL_GPU_SHARING: "mps"}))
        assert plugin.state.options.mode == MPS
        # In MPS mode with no supervisor writing health, every GPU is Unhealthy.
        plugin.notify()
        assert _wait(
            lambda: all(not d.healthy for d in plugin.state.devices(contract.RESOURCE_GPU)[1])
        )
        agent.on_node(NodeState("n1", labels={}))
        assert not plugin.running
        assert not list(folder.glob("gpu-scheduler-*.sock"))  # its sockets removed
    finally:
        plugin.stop()
        kubelet.stop()
    assert (
        start_device_plugin(argparse.Namespace(device_plugin="off", dry_run=False), agent) is None
    )


def test_the_supervisor_runs_a_daemon_per_gpu_and_writes_their_health(fake, tmp_path):  # noqa: F811
    from agent.sharing_node import run_mps_supervisor
    from tests.unit.test_mps import A, B

    gpus = tmp_path / "gpus.json"
    entries = [
        {"uuid": u, "name": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "computeCapability": "8.0"}
        for u in (A, B)
    ]
    inventory = {"driverVersion": "550.54.15", "cudaDriverVersion": "12.4", "gpus": entries}
    gpus.write_text(json.dumps(inventory))
    fake.behave(B, "fail")
    root = fake.root / "pipe"
    args = argparse.Namespace(mps_pipe_root=str(root), mps_control=fake.command[1])
    args.mps_control = fake.command[0]  # python; the script is its first argument
    stop = threading.Event()
    # The stand-in is a script: run it through a one-line wrapper, as the program.
    wrapper = fake.root / "mps-control"
    wrapper.write_text(f'#!/bin/sh\nexec {fake.command[0]} {fake.command[1]} "$@"\n')
    wrapper.chmod(0o755)
    args.mps_control = str(wrapper)
    thread = threading.Thread(
        target=run_mps_supervisor, args=(args, FakeBackend(str(gpus)), stop, 0.05, time.time)
    )
    thread.start()
    try:
        assert _wait(lambda: (root / HEALTH_FILE).exists())
        assert _wait(lambda: set(read_health(str(root), [A, B], time.time())) == {B})
        assert "cannot start" in read_health(str(root), [A, B], time.time())[B]
        pid = fake.pid(A)
        assert pid is not None
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert fake.calls("quit")  # the daemon of A was quit on the way out


# --- issue 49: what the plugin offers is never more than is free -------------------------
def test_the_plugin_offers_nothing_until_podresources_has_answered_once():
    """Item 13: fail closed at start. A GPU holding shares must not be offered whole
    because the kubelet's PodResources did not answer the plugin's first refresh."""
    from agent.deviceplugin.devices import GpuInfo
    from agent.deviceplugin.state import PluginState

    gpu = GpuInfo("GPU-a", 0, 4)
    answer: dict[str, set[str]] | None = None

    def allocated():
        if answer is None:
            raise ConnectionError("no socket")
        return answer

    state = PluginState(lambda: [gpu], allocated, lambda: ())
    state.refresh()
    assert not state.allocated_known
    for resource in (contract.RESOURCE_GPU, contract.RESOURCE_GPU_MEMORY):
        assert all(not d.healthy for d in state.devices(resource)[1]), resource
    answer = {contract.RESOURCE_GPU_MEMORY: {"GPU-a::0"}}  # the kubelet has answered
    state.refresh()
    assert state.allocated_known and state.view().shared == {"GPU-a"}
    assert all(d.healthy for d in state.devices(contract.RESOURCE_GPU_MEMORY)[1])
    answer = None  # down again: the last answer stays, nothing closes
    state.refresh()
    assert all(d.healthy for d in state.devices(contract.RESOURCE_GPU_MEMORY)[1])
    assert state.view().shared == {"GPU-a"}


# The kubelet's device checkpoint as it writes it (1.20+: device IDs per NUMA node).
POD_OLD = "0b8f2c1e-1111-4222-8333-444455556666"
POD_NEW = "9d7e6f5a-aaaa-4bbb-8ccc-ddddeeeeffff"


def _checkpoint(path: Path, *entries: tuple[str, str, str, list[str]]) -> str:
    data = {
        "Data": {
            "PodDeviceEntries": [
                {
                    "PodUID": uid,
                    "ContainerName": container,
                    "ResourceName": resource,
                    "DeviceIDs": {"-1": ids},
                    "AllocResp": "",
                }
                for uid, container, resource, ids in entries
            ],
            "RegisteredDevices": {},
        },
        "Checksum": 1,
    }
    path.write_text(json.dumps(data))
    return str(path)


class _Pods:
    """A PodResources client that answers what the test says."""

    def __init__(self, *pods) -> None:
        from agent import podresources_pb2 as pb

        self.response = pb.ListPodResourcesResponse(pod_resources=list(pods))
        self.ok = True

    def list(self):
        from agent.podresources import Answer

        return Answer(self.response, None if self.ok else "down", 0.0)


def _pb_pod(namespace, name, resource, ids):
    from agent import podresources_pb2 as pb

    devices = [pb.ContainerDevices(resource_name=resource, device_ids=ids)]
    container = pb.ContainerResources(name="main", devices=devices)
    return pb.PodResources(namespace=namespace, name=name, containers=[container])


def test_the_checkpoint_is_read_in_both_of_the_kubelets_formats(tmp_path):
    from agent import kubelet_checkpoint as kc

    path = _checkpoint(tmp_path / kc.FILE, (POD_OLD, "init", contract.RESOURCE_GPU, ["GPU-a"]))
    assert kc.read(path) == (
        kc.Entry(POD_OLD, "init", contract.RESOURCE_GPU, frozenset({"GPU-a"})),
    )
    mine = {"PodUID": "u", "ContainerName": "c", "ResourceName": contract.RESOURCE_GPU_MEMORY}
    other = {"PodUID": "u", "ContainerName": "c", "ResourceName": "other", "DeviceIDs": {}}
    old = {"Data": {"PodDeviceEntries": [{**mine, "DeviceIDs": ["GPU-a::0"]}, other]}}
    assert [e.ids for e in kc.parse(json.dumps(old))] == [frozenset({"GPU-a::0"})]
    assert kc.read(str(tmp_path / "none")) == ()  # nothing allocated yet
    for bad in ("{", "[]", '{"Data": {"PodDeviceEntries": [{"PodUID": 1}]}}'):
        with pytest.raises(kc.CheckpointError):
            kc.parse(bad)
    # An ID under two pods (an inactive pod not dropped yet) names neither.
    entries = [
        kc.Entry("u1", "c", "r", frozenset({"x", "y"})),
        kc.Entry("u2", "c", "r", frozenset({"y"})),
    ]
    assert kc.device_uids(entries) == {"x": "u1"}
    # The pods PodResources reports devices for: the kubelet's active pods.
    assert kc.active_uids(entries, {"r": {"x"}}) == {"u1"}
    assert kc.active_uids(entries, {"other": {"x"}}) == set()


def test_a_plain_init_container_holds_its_gpu_for_as_long_as_its_pod_runs(tmp_path):
    """Item 11: PodResources does not list plain init containers. The kubelet's
    checkpoint does: their IDs count as allocated while PodResources reports the pod
    (past the plugin's 120 s grace). Once the pod is deleted the checkpoint still
    lists it (the kubelet rewrites it only after its next allocation), and the next
    allocation, the one that cleans it, must find its GPUs free."""
    from agent.deviceplugin.devices import GpuInfo
    from agent.deviceplugin.state import PluginState
    from agent.sharing_node import allocated_now

    whole, mem = contract.RESOURCE_GPU, contract.RESOURCE_GPU_MEMORY
    checkpoint = _checkpoint(
        tmp_path / "checkpoint",
        (POD_OLD, "fetch-model", whole, ["GPU-a"]),  # a plain init container: not listed
        (POD_OLD, "main", mem, ["GPU-b::0"]),
        (POD_NEW, "other", mem, ["GPU-b::1"]),  # deleted: PodResources no longer has it
    )
    pods = _Pods(_pb_pod("ml", "infer", mem, ["GPU-b::0"]))
    assert allocated_now(pods, checkpoint) == {whole: {"GPU-a"}, mem: {"GPU-b::0"}}

    now = [0.0]
    state = PluginState(
        lambda: [GpuInfo("GPU-a", 0, 4), GpuInfo("GPU-b", 1, 4)],
        lambda: allocated_now(pods, checkpoint),
        lambda: (),
        grace_s=120.0,
        monotonic=lambda: now[0],
    )
    state.handed_out(whole, ["GPU-a"])
    state.refresh()
    now[0] = 600.0  # long past the grace of a handed-out ID never reported
    state.refresh()
    assert state.view().whole == {"GPU-a"}  # its shares are not offered: it runs
    del pods.response.pod_resources[:]  # the pod was deleted; the checkpoint lags
    state.refresh()
    assert state.view().whole == frozenset() and state.view().shared == frozenset()


def _sharing_agent(tmp_path: Path, mode: str, pods=None, checkpoint=None):
    from agent.loop import Agent, AgentConfig

    config = AgentConfig(
        node_name="n1",
        pod_resources_socket=None,
        kubelet_checkpoint=checkpoint,
        mps_root=str(tmp_path / "mps"),
        gpu_memory_reserve_mib=2048,
    )
    backend = FakeBackend(str(_fake_gpus(tmp_path / "gpus.json")))
    agent = Agent(config, backend, None, pod_resources=pods, monotonic=lambda: 0.0)
    agent.sharing = mode
    return agent, agent.read_inventory()


def test_a_gpu_without_its_mps_daemon_is_unhealthy_in_the_gpus_annotation(tmp_path):
    """Item 12: the supervisor's health reaches ANN_GPUS, so the extender stops
    choosing that GPU for shares (sharing.node_gpus) and for whole GPUs (gpu_health)."""
    from gpu_scheduler import sharing

    (tmp_path / "mps").mkdir()
    agent, inventory = _sharing_agent(tmp_path, "mps")
    write_health(str(tmp_path / "mps"), {"GPU-1": "exit 1: cannot start"}, ["GPU-0", "GPU-1"],
                 agent.clock().timestamp())  # fmt: skip
    value = agent.desired(inventory).annotations[contract.ANN_GPUS]
    assert [healthy for _, _, healthy in sharing.node_gpus(value, None, None)] == [True, False]
    assert "MPS: exit 1: cannot start" in contract.gpu_health(value).unhealthy[0]
    assert contract.gpu_health(value).healthy == 1
    # Time-slicing needs no daemon: the file is not read.
    agent.sharing = "time-slicing"
    value = agent.desired(inventory).annotations[contract.ANN_GPUS]
    assert contract.gpu_health(value).healthy == 2
    # The words do not change from round to round: no Node write for a silent supervisor.
    agent.sharing = "mps"
    os.unlink(tmp_path / "mps" / HEALTH_FILE)
    assert agent.desired(inventory) == agent.desired(inventory)


def test_each_gpu_keeps_a_reserve_and_the_extender_counts_what_the_plugin_offers(
    tmp_path,
    folder,  # noqa: F811
):
    """Item 14: units are (NVML total - reserve) // 1 GiB on both sides: the plugin's
    device IDs and the extender's capacity, from the reserve published in ANN_GPUS."""
    from gpu_scheduler import sharing

    agent, inventory = _sharing_agent(tmp_path, "time-slicing")
    value = agent.desired(inventory).annotations[contract.ANN_GPUS]
    assert [cap for _, cap, _ in sharing.node_gpus(value, None, None)] == [78, 78]  # not 80
    agent.last_inventory = inventory
    agent.on_node = None
    args = argparse.Namespace(
        device_plugin="auto", dry_run=False, pod_resources_socket=str(tmp_path / "none.sock"),
        mps_pipe_root=str(tmp_path / "mps"), cdi=False, kubelet_dir=str(folder),
        gpu_memory_reserve_mib=2048,
    )  # fmt: skip
    plugin = start_device_plugin(args, agent)
    plugin.state.refresh()
    assert [g.units for g in plugin.state.view().gpus] == [78, 78]
    assert sharing.gpu_units(81920, 0) == 80 and sharing.gpu_units(1000, 2048) == 0
    # An agent not upgraded publishes no reserve: the extender counts its 80, as its
    # device plugin does.
    plain = json.loads(value)
    for entry in plain:
        del entry[contract.GPU_RESERVED_MIB]
    assert [c for _, c, _ in sharing.node_gpus(json.dumps(plain), None, None)] == [80, 80]


def test_the_shares_report_names_pods_by_uid_from_the_kubelets_checkpoint(tmp_path):
    """Item 15: a pod recreated under the same name (a StatefulSet's) is another pod:
    the report names what the kubelet gave by the UID of the pod it gave it to."""
    from gpu_scheduler import sharing

    mem = contract.RESOURCE_GPU_MEMORY
    checkpoint = _checkpoint(
        tmp_path / "checkpoint", (POD_OLD, "main", mem, ["GPU-0::0", "GPU-0::1"])
    )
    pods = _Pods(_pb_pod("db", "web-0", mem, ["GPU-0::0", "GPU-0::1"]))
    agent, inventory = _sharing_agent(tmp_path, "time-slicing", pods, checkpoint)
    report = sharing.read_report(agent.desired(inventory).annotations[contract.ANN_GPU_SHARES])
    assert report == {"GPU-0": {POD_OLD: 2}, "GPU-1": {}}
    # A pod whose plain init container holds GPU-1 whole while its app container holds
    # a share: PodResources lists the share only; the report says both (the extender
    # must not take GPU-1 as free for that pod's sake), while the pod is active.
    checkpoint = _checkpoint(
        tmp_path / "checkpoint",
        (POD_OLD, "main", mem, ["GPU-0::0", "GPU-0::1"]),
        (POD_NEW, "fetch", contract.RESOURCE_GPU, ["GPU-1"]),
        (POD_NEW, "serve", mem, ["GPU-0::2"]),
    )
    pods.response.pod_resources.append(_pb_pod("ml", "serve", mem, ["GPU-0::2"]))
    report = sharing.read_report(agent.desired(inventory).annotations[contract.ANN_GPU_SHARES])
    assert report == {"GPU-0": {POD_OLD: 2, POD_NEW: 1}, "GPU-1": {POD_NEW: "whole"}}
    pods.response.pod_resources.pop()  # the pod ended; the checkpoint still lists it
    report = sharing.read_report(agent.desired(inventory).annotations[contract.ANN_GPU_SHARES])
    assert report == {"GPU-0": {POD_OLD: 2}, "GPU-1": {}}
    # No checkpoint to name them by: no report at all (the extender fits every pod).
    agent.config = replace(agent.config, kubelet_checkpoint=str(tmp_path / "bad"))
    (tmp_path / "bad").write_text("{")
    assert contract.ANN_GPU_SHARES not in agent.desired(inventory).annotations
