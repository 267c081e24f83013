"""deploy/agent/sharing: the sharing agent on labelled nodes only, the plain agent kept
off them, and its pod as the device plugin and MPS need it, with nothing more."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from gpu_scheduler import contract
from gpu_scheduler.cli import build_parser
from tests.helpers import ROOT, required

SHARING = ROOT / "deploy" / "agent" / "sharing"


def _daemonsets() -> tuple[dict[str, Any], dict[str, Any]]:
    """The sharing agent's DaemonSet and the MPS supervisor's."""
    agent, mps = yaml.safe_load_all((SHARING / "daemonset.yaml").read_text())
    return agent, mps


def test_the_sharing_agent_runs_where_the_label_says_and_as_its_jobs_need() -> None:
    agent_set, mps_set = _daemonsets()
    spec = agent_set["spec"]["template"]["spec"]
    mps_spec = mps_set["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {
            "key": contract.LABEL_GPU_SHARING,
            "operator": "In",
            "values": list(contract.SHARING_MODES),
        }
    ]
    (agent,) = spec["containers"]
    (mps,) = mps_spec["containers"]
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert {"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"} <= set(mounts)
    assert mounts["/run/gpu-scheduler/mps"]["readOnly"] is True  # the agent only reads health
    assert not any("cgroup" in path for path in mounts)  # nothing of the host's cgroups
    assert {m["mountPath"] for m in mps["volumeMounts"]} == {
        "/tmp", "/run/gpu-scheduler/mps", "/dev/shm"
    }  # fmt: skip
    for container in (agent, mps):
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert "privileged" not in security
    assert "add" not in agent["securityContext"]["capabilities"]
    # The MPS control daemon starts each server as its clients' user: what that needs,
    # a subset of the runtime's default capabilities, and nothing else.
    assert set(mps["securityContext"]["capabilities"]["add"]) == {
        "CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"
    }  # fmt: skip
    assert "hostIPC" not in spec and mps_spec["hostIPC"] is True
    for pod in (spec, mps_spec):
        assert "hostPID" not in pod and "hostNetwork" not in pod
    # Issue 49 item 16: an agent rollout never stops the MPS servers under running
    # share pods (their own DaemonSet, updated only when its pod is deleted), and the
    # servers' cgroup is sized for them: memory for several, no CPU throttling.
    assert mps_set["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert agent_set["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert mps_spec["automountServiceAccountToken"] is False
    (mps_term,) = mps_spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert mps_term["matchExpressions"][0]["values"] == ["mps"]
    limits = mps["resources"]["limits"]
    assert "cpu" not in limits and limits["memory"] == "4Gi"
    # Each argument is one the CLI knows, and the two containers' roles are apart.
    parser = build_parser()
    for container in (agent, mps):
        parser.parse_args(container["args"])
    assert "--mps-supervisor" in mps["args"] and "--mps-supervisor" not in agent["args"]
    version = yaml.safe_load((ROOT / "charts" / "gpu-scheduler" / "Chart.yaml").read_text())
    assert {c["image"] for c in (agent, mps)} == {
        f"ghcr.io/gpu-scheduler/gpu-scheduler:{version['appVersion']}"
    }


def test_with_the_component_every_gpu_node_has_exactly_one_agent() -> None:
    from lab.controlplane import find_binary
    from tests.nodeaffinity import required_node_affinity_matches

    binary = find_binary()
    if binary is None:
        required("kustomize on the project's kubectl", "no control-plane binary: make controlplane")
    folder = ROOT / ".cache" / "test-sharing-kustomize"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../../deploy"],
                "components": ["../../deploy/agent/sharing"],
            }
        )
    )
    out = subprocess.run(
        [str(binary), "kubectl", "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    sets = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in yaml.safe_load_all(out.stdout)
        if d and d["kind"] == "DaemonSet"
    }
    assert set(sets) == {"gpu-scheduler-agent", "gpu-scheduler-agent-sharing", "gpu-scheduler-mps"}
    sets.pop("gpu-scheduler-mps")  # not an agent: beside the sharing agent on mps nodes
    gpu = {contract.LABEL_GPU_PRESENT: "true"}
    for labels, want in (
        (gpu, "gpu-scheduler-agent"),
        ({**gpu, contract.LABEL_GPU_SHARING: "mps"}, "gpu-scheduler-agent-sharing"),
        ({contract.LABEL_GKE_ACCELERATOR: "nvidia-l4", contract.LABEL_GPU_SHARING: "time-slicing"},
         "gpu-scheduler-agent-sharing"),
    ):  # fmt: skip
        node = {"metadata": {"name": "n", "labels": labels}}
        running = [
            name
            for name, spec in sets.items()
            if required_node_affinity_matches({"spec": spec}, node)
        ]
        assert running == [want], labels
