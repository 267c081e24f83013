"""The real node's configuration files and the shim's hands-off rule (lab.realnode);
the node itself runs in tests/e2e/test_real_node.py."""

from __future__ import annotations

import json
import tomllib

import yaml

from lab import realnode
from lab.kubelet_shim import REAL_PROVIDER, KubeletShim


def test_containerd_keeps_everything_under_its_home(tmp_path):
    config = tomllib.loads(realnode._containerd_config(tmp_path, "localhost/pause:x").read_text())
    assert config["root"].startswith(str(tmp_path)) and config["state"].startswith(str(tmp_path))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    # Pods' network namespaces under the state dir, runc's state under home: sweep()
    # finds them there.
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["containerd"]["runtimes"]["runc"]["options"]["Root"] == f"{tmp_path}/runc"
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == "localhost/pause:x"
    conflist = json.loads((tmp_path / "cni" / "10-lab.conflist").read_text())
    bridge = conflist["plugins"][0]
    assert conflist["name"] == realnode.NETWORK
    assert bridge["bridge"] == realnode.BRIDGE
    assert bridge["ipam"]["ranges"] == [
        [{"subnet": realnode.POD_CIDR, "gateway": realnode.GATEWAY}]
    ]
    assert bridge["ipam"]["dataDir"].startswith(str(tmp_path))


def test_kubelet_config_runs_on_this_kind_of_machine(tmp_path):
    config = yaml.safe_load(
        realnode._kubelet_config(tmp_path, "n1", tmp_path / "ca.crt").read_text()
    )
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == f"/{realnode.CGROUP_ROOT}"
    assert config["providerID"] == f"{REAL_PROVIDER}n1"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "ca.crt")
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path}/containerd.sock"


class RecordingCore:
    def __init__(self):
        self.patches = []

    def patch_node_status(self, name, ops):
        self.patches.append((name, ops))


def test_shim_leaves_real_nodes_to_their_kubelet():
    shim = KubeletShim.__new__(KubeletShim)
    shim.core = RecordingCore()
    node = {
        "metadata": {"name": "real"},
        "spec": {"providerID": f"{REAL_PROVIDER}real"},
        "status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {}},
    }
    assert shim.sync(node) is False and shim.core.patches == []
    fake = {**node, "metadata": {"name": "fake"}, "spec": {}}
    assert shim.sync(fake) is True
    ((name, ops),) = shim.core.patches  # one patch, allocatable made first
    assert name == "fake"
    assert ops == [
        {"op": "add", "path": "/status/allocatable", "value": {}},
        {"op": "add", "path": "/status/allocatable/nvidia.com~1gpu", "value": "2"},
    ]


def test_the_readme_pod_runs_nvidia_smi_once_in_a_cuda_image():
    """docs/examples/gpu-pod.yaml: one GPU, nvidia-smi, never restarted; the real node
    tags its stand-in under the image the file names, as containerd stores it."""
    pod = yaml.safe_load(realnode.EXAMPLE.read_text())
    (container,) = pod["spec"]["containers"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container["command"] == ["nvidia-smi"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert container["image"] == realnode.EXAMPLE_IMAGE
    assert container["image"].startswith("nvidia/cuda:12.") and "-base-" in container["image"]
    assert realnode.full_reference(realnode.EXAMPLE_IMAGE) == f"docker.io/{container['image']}"
    assert realnode.full_reference("busybox:1.36") == "docker.io/library/busybox:1.36"
    for kept in (realnode.SLEEPER_IMAGE, "localhost/pause:lab-1", "host:5000/a/b:c"):
        assert realnode.full_reference(kept) == kept


def test_the_stand_in_nvidia_smi_says_what_it_is_and_exits_0(tmp_path):
    """What the lab's node runs for the README pod (tools/image/nvidia-smi.c): the line
    the real-node test reads in `kubectl logs gpu-check`, exit 0."""
    import shutil
    import subprocess

    import pytest

    from tests.helpers import ROOT

    if shutil.which("gcc") is None:
        pytest.skip("no gcc (make image needs it too)")
    binary = tmp_path / "nvidia-smi"
    subprocess.run(
        ["gcc", "-Os", "-o", binary, ROOT / "tools" / "image" / "nvidia-smi.c"], check=True
    )
    done = subprocess.run([binary], capture_output=True, text=True, env={}, check=False)
    assert done.returncode == 0
    assert done.stdout.startswith("nvidia-smi: the gpu-scheduler lab's stand-in")
    assert "NVIDIA_VISIBLE_DEVICES=(unset)" in done.stdout
