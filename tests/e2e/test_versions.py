"""The product on the oldest supported Kubernetes minor (1.34), and what the version
rules prevent. `make test` runs this smoke test beside the whole suite on the newest
minor; `make e2e K8S_MINOR=1.NN` runs the whole suite on any supported minor.

- A smoke test on a 1.34 control plane built from the 1.34.4 modules: the webhook
  mutates, the gpu-scheduler profile (kube-scheduler 1.34) with our extender places
  pods, the agent labels its node, a DRA node takes a GPU pod (helm install on 1.34
  is in test_helm.py).
- The skew the chart's image rule prevents: a newer kube-scheduler against the 1.34
  API server never places a pod.
- DRA turned off in the API server: the extender and the agent treat the kinds as
  empty, with one log line each; nothing hangs and /readyz turns 200.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import requests
import yaml

from gpu_scheduler import contract
from lab.controlplane import ROOT, find_binary, supported_minors, tools_binary
from lab.stack import scheduler_config, start_stack
from tests.e2e.kube import (
    core,
    create_node,
    create_pod,
    pod_manifest,
    unique,
    wait_bound,
)
from tests.e2e.scenarios import GPU_TAINT, create_gpu_device_class, gpu_node, publish_slice
from tests.e2e.test_preemption import (
    budget_steers_the_preemptor,
    gang_whole_or_none,
    inference_preempts_training,
    never_preempts,
    sick_gpu_gets_enough_victims,
)
from tests.e2e.test_preemption_state import (
    a_deleted_pending_pick_frees_its_gpus,
    budget_kept_on_a_sick_gpu,
    nominated_node_short_of_cpu_still_places,
    nominated_preemptor_keeps_its_room,
)
from tests.helpers import required, wait_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"
OLDEST = supported_minors()[0]
L4 = ("NVIDIA-L4", 23034)
A100 = ("NVIDIA-A100-SXM4-80GB", 81920)


def oldest_binary() -> Path:
    binary = find_binary(OLDEST)
    if binary is None:
        how = f"`make controlplane-{OLDEST}` (or `make test`, which builds it)"
        required(f"the {OLDEST} smoke test", f"there is no {OLDEST} control plane: {how}")
    return binary


def binary_for(which: str, under_test: Path) -> Path:
    """The control plane of a module run on the ``newest`` minor (the one under test)
    and the ``oldest``; the oldest run skips where it is the minor under test."""
    if which == "newest":
        return under_test
    binary = oldest_binary()
    if binary == under_test:
        pytest.skip("the minor under test is the oldest")
    return binary


@pytest.fixture(scope="module")
def old(tmp_path_factory, control_plane_binary):
    stack = start_stack(tmp_path_factory.mktemp(f"k8s-{OLDEST}"), binary=oldest_binary())
    yield stack
    stack.stop()


def test_the_control_plane_is_the_oldest_minor(old):
    from kubernetes import client

    version = client.VersionApi(old.api).get_code()
    assert f"{version.major}.{version.minor}" == OLDEST
    assert old.cluster.minor == int(OLDEST.split(".")[1])


def test_smoke_webhook_profile_and_extender_place_pods(old):
    case = unique("smoke")
    l4 = gpu_node(old, case, 2, L4)
    a100 = gpu_node(old, case, 8, A100)
    # The webhook routes it; only the extender knows the product rule.
    name = unique("only-l4")
    pod = create_pod(
        old,
        pod_manifest(name, 1, case=case, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}),
    )
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    assert contract.GPU_TOLERATION in [
        {k: t.get(k) for k in ("key", "operator", "effect")} for t in pod["spec"]["tolerations"]
    ]
    assert wait_bound(old, name) == l4
    # Binpack: a 2-GPU pod fills the L4 node (1 free) no more; the A100 takes it.
    two = unique("two")
    create_pod(old, pod_manifest(two, 2, case=case))
    assert wait_bound(old, two) == a100


def test_smoke_agent_labels_its_node(old):
    case = unique("agent")
    node = create_node(old, unique("agent-node"), case=case)
    agent = old.start_agent(node, FIXTURES / "l4x2.yaml", capacity=False)
    try:

        def labelled() -> bool:
            labels = core(old).read_node(node).metadata.labels or {}
            return labels.get(contract.LABEL_GPU_PRODUCT) == "NVIDIA-L4"

        wait_for(labelled, 60, f"the agent's labels on {node}")
        labels = core(old).read_node(node).metadata.labels
        assert labels[contract.LABEL_GPU_COUNT] == "2"
        assert labels[contract.LABEL_GPU_MEMORY] == "23034"
    finally:
        old.cluster.stop_process(agent.name)


def test_preemption_on_the_oldest_minor(old, tmp_path):
    """The preempt verb on kube-scheduler 1.34, the scenarios of
    tests/e2e/test_preemption.py: just enough victims, also where a sick GPU makes
    kube-scheduler's own count one short; none under preemptionPolicy Never; the node a
    PodDisruptionBudget does not protect; a gang whole or not at all."""
    inference_preempts_training(old)
    sick_gpu_gets_enough_victims(old, tmp_path)
    never_preempts(old)
    budget_steers_the_preemptor(old)
    gang_whole_or_none(old)


def test_preemption_state_on_the_oldest_minor(old, tmp_path):
    """tests/e2e/test_preemption_state.py on kube-scheduler 1.34: a budget-protected pod
    kept while a sick GPU needs a victim more; a pod nominated to a node short of CPU
    still placed; a nominated preemptor keeping its room; a pending pick deleted."""
    budget_kept_on_a_sick_gpu(old, tmp_path)
    nominated_node_short_of_cpu_still_places(old)
    nominated_preemptor_keeps_its_room(old, tmp_path)
    a_deleted_pending_pick_frees_its_gpus(old)


def test_smoke_a_dra_node_takes_a_gpu_pod(old):
    """On 1.34 DRA serves ``nvidia.com/gpu`` pods only with the DRAExtendedResource
    gate (alpha there), which the lab turns on as such a cluster would."""
    assert "DRAExtendedResource=true" in old.cluster.gates
    case = unique("dra")
    create_gpu_device_class(old)
    # The labels GFD or our agent write on a DRA node too: the webhook's node affinity
    # for gpu-products reads them (README, "Autoscalers and other schedulers").
    labels = {contract.LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3"}
    node = create_node(old, unique("dra-h100"), case=case, taints=GPU_TAINT, labels=labels)
    publish_slice(old, node, "NVIDIA H100 80GB HBM3", 81559, 4)
    wait_for(
        lambda: (
            "with DRA GPUs"
            in requests.get(f"http://127.0.0.1:{old.extender_ops_port}/readyz", timeout=2).text
        ),
        30,
        "the extender sees the DRA node",
    )
    name = unique("on-dra")
    create_pod(
        old,
        pod_manifest(
            name, 4, case=case, annotations={contract.ANN_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3"}
        ),
    )
    assert wait_bound(old, name) == node
    status = core(old).read_namespaced_pod(name, "default").status
    assert status.extended_resource_claim_status is not None


def test_a_newer_scheduler_never_places_a_pod_on_the_oldest_api_server(old, tmp_path):
    """What the chart's rule (kube-scheduler's image from the cluster's version)
    prevents: the newest kube-scheduler lists kinds this API server does not serve
    (DeviceTaintRule), waits for those caches forever, and schedules nothing."""
    newest = tools_binary()
    assert newest is not None and newest != old.cluster.binary
    profile = "gpu-skewed"
    config = scheduler_config(old.extender_url, profile=profile, client_dir=old.pki / "scheduler")
    config["clientConnection"] = {"kubeconfig": str(old.cluster.kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    path = tmp_path / "skewed.yaml"
    path.write_text(json.dumps(config))
    log_path = tmp_path / "skewed.log"
    import subprocess

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(newest), "kube-scheduler", f"--config={path}", "--secure-port=0", "-v=2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        case = unique("skew")
        node = gpu_node(old, case, 8, A100)
        name = unique("skewed")
        create_pod(old, pod_manifest(name, 1, case=case, scheduler=profile))
        time.sleep(30)
        assert core(old).read_namespaced_pod(name, "default").spec.node_name is None
        text = log_path.read_text(errors="replace")
        assert "the server could not find the requested resource" in text
        assert "DeviceTaintRule" in text
        # the same pod on the matching scheduler's profile is placed at once
        placed = unique("matched")
        create_pod(old, pod_manifest(placed, 1, case=case))
        assert wait_bound(old, placed) == node
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(10)


def test_dra_off_leaves_extender_and_agent_working(tmp_path_factory, control_plane_binary):
    """``--runtime-config=resource.k8s.io/v1=false`` on 1.34 (and the scheduler's DRA
    gate off, as such a cluster runs it): the extender is ready, logs each missing DRA
    kind once, and places GPU pods; the agent labels its node."""
    stack = start_stack(
        tmp_path_factory.mktemp("dra-off"),
        binary=oldest_binary(),
        apiserver_args=("--runtime-config=resource.k8s.io/v1=false",),
        gates=("DynamicResourceAllocation=false",),
    )
    try:
        ready = requests.get(f"http://127.0.0.1:{stack.extender_ops_port}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        case = unique("nodra")
        node = gpu_node(stack, case, 8, A100)
        name = unique("gpu")
        create_pod(stack, pod_manifest(name, 2, case=case))
        assert wait_bound(stack, name) == node
        agent_node = create_node(stack, unique("agent"), case=case)
        agent = stack.start_agent(agent_node, FIXTURES / "l4x2.yaml", capacity=False)
        wait_for(
            lambda: (
                (core(stack).read_node(agent_node).metadata.labels or {}).get(
                    contract.LABEL_GPU_COUNT
                )
                == "2"
            ),
            60,
            "the agent's labels",
        )
        assert agent.alive()
        lines = stack.cluster.processes["extender"].log_path.read_text().splitlines()
        absent = [line for line in lines if "optional kind unavailable" in line]
        kinds = [json.loads(line).get("kind") for line in absent]
        assert len(kinds) == len(set(kinds)) >= 3, absent  # one line per kind, not a loop
    finally:
        stack.stop()


def test_kustomize_with_the_oldest_minors_component_gives_a_config_it_decodes(
    tmp_path, control_plane_binary
):
    """deploy/ with deploy/scheduler/minors/v1.NN (the oldest supported minor): the
    KubeSchedulerConfiguration that minor's kube-scheduler decodes (it decodes strictly:
    an unknown field stops it at start); the base's, 1.37's, it refuses."""
    import os
    import subprocess

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    component = ROOT / "deploy" / "scheduler" / "minors" / f"v{OLDEST}"
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(ROOT / "deploy", overlay)],
                "components": [os.path.relpath(component, overlay)],
            }
        )
    )
    rendered = subprocess.run(
        [str(control_plane_binary), "kubectl", "kustomize", str(overlay)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    (config,) = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("gpu-scheduler-conf")
    ]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "current-context": "c",
            }
        )
    )

    def start(text: str) -> str:
        cfg = yaml.safe_load(text)
        cfg["clientConnection"] = {"kubeconfig": str(kubeconfig)}
        path = tmp_path / "scheduler-config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        try:
            done = subprocess.run(
                [str(oldest_binary()), "kube-scheduler", f"--config={path}", "--secure-port=0"],
                capture_output=True, text=True, timeout=20,
            )  # fmt: skip
            return done.stderr
        except subprocess.TimeoutExpired as exc:  # decoded, and running: fine
            return (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else ""

    assert "strict decoding error" not in start(config["data"]["scheduler-config.yaml"])
    base = (ROOT / "deploy" / "scheduler" / "scheduler-config.yaml").read_text()
    assert "strict decoding error" in start(base)
