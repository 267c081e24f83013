"""The agent on a sharing node: the MPS supervisor's health file, and the device plugin
the agent starts, following the node's sharing label, fed by the agent's own reads."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

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
    assert "silent for 100s" in read_health(root, ["GPU-a"], 200.0)["GPU-a"]
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
