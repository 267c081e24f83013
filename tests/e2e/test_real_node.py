"""The install on a real node: containerd, runc, CNI and a kubelet (lab.realnode).

The README's install commands run as written, on a control plane with nothing
installed. First this checkout is released to a real OCI registry on loopback (the CNCF
distribution registry, TLS with its own CA) by the release's steps: the image
(``make image``'s) and the chart (``tools/release/chart.sh``, as the release workflow
runs it). Then `helm install oci://<registry>/gpu-scheduler/charts/gpu-scheduler
--version X ... --wait`, the README's line with only ghcr.io replaced by the registry's
address, plus the lab's values: the agent's fake GPU inventory and capacity, since the
node has neither GPUs nor a device plugin, and kube-scheduler and extender Deployments
at 0 replicas, since the lab has no Service proxy nor cluster DNS and runs those two
from the host. The node's containerd pulls the image from the registry. Then, with our
images running as pods:

- the certificate controller's pod makes the CA and the pairs inside the cluster,
  injects the webhook's caBundle (no tool runs on the host) and arms the webhook
  (failurePolicy Fail) once a webhook pod is Ready;
- the agent DaemonSet's pod runs on the node and publishes its labels, annotations,
  heartbeat and capacity with its in-cluster token (through the confinement policy);
- the webhook Deployment's pods serve admission through their Service;
- the README's GPU pod is placed on the node by our profile and runs, and a job pod
  runs, succeeds, and the extender counts its GPU free again;
- `helm uninstall` leaves nothing that refuses a pod;
- the previous release (0.1.0, tests/fixtures/charts/, certificates from
  deploy/install-certs.sh as its notes said) upgraded to this chart: every GPU pod
  created meanwhile is admitted and mutated, through the certificate controller's
  adoption of the old CA.

On the newest minor and on the oldest (1.34). Where the machine cannot run a real
node the module says exactly what is missing and skips (CI: fails).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpu_scheduler import contract
from lab import realnode
from lab.controlplane import ROOT, start_control_plane
from lab.registry import HOW_TO_GET_IT as HOW_TO_GET_REGISTRY
from lab.registry import push_image, registry_binary, start_registry
from lab.stack import NAMESPACE, Stack
from tests.e2e.kube import ensure_namespace, read_lease, unique
from tests.e2e.test_agent_daemonset import h100_inventory
from tests.helpers import required, wait_for

NODE = "gpu-real-0"
#: The longest a fresh install may leave GPU pods unmutated once its certificates exist.
WINDOW_AFTER_CERTIFICATES_S = 60
GPUS = 2
FAKE_GPUS = Path("/etc/gpu-scheduler-lab/gpus.yaml")
CHART = ROOT / "charts" / "gpu-scheduler"
PREVIOUS_CHART = ROOT / "tests" / "fixtures" / "charts" / "gpu-scheduler-0.1.0.tgz"
#: How the README names the chart: the e2e's registry stands in for ghcr.io.
README_CHART = "oci://ghcr.io/gpu-scheduler/charts/gpu-scheduler"
README_REGISTRY = "ghcr.io"


@pytest.fixture(scope="module", params=["newest", "oldest"])
def real(request, tmp_path_factory, control_plane_binary, helm_binary):
    reason = realnode.missing()
    if reason:
        required("the real node", reason)
    from tests.e2e.test_versions import binary_for

    binary = binary_for(request.param, control_plane_binary)
    work = tmp_path_factory.mktemp(f"realnode-{request.param}")
    cluster = start_control_plane(work / "cluster", binary, real_node=True)
    stack = Stack(cluster, work)
    stack.helm = helm_binary
    registry_bin = registry_binary()
    if registry_bin is None:
        required("the README's install from a registry", HOW_TO_GET_REGISTRY)
    node = None
    try:
        stack.api = cluster.api_client()
        node = realnode.start_real_node(cluster, NODE, {contract.LABEL_GPU_PRESENT: "true"})
        publish(stack, node, registry_bin)
        stack.start_extender()
        stack.start_schedulers()
        install(stack, work)
        yield stack
    except BaseException:
        print(cluster.failures())
        raise
    finally:
        cluster.stop()
        if node is not None:
            node.stop()
        FAKE_GPUS.unlink(missing_ok=True)
        left = realnode.leftovers()
    assert left == [], f"the real node left things on the host: {left}"


def publish(stack: Stack, node: realnode.RealNode, binary: Path) -> None:
    """A release of this checkout to a registry of the lab's own, by the release's
    steps: the image (``make image``'s, from the repo's Dockerfile) pushed where the
    release's build-push step puts it, ghcr.io's path under the registry's address; the
    chart by ``tools/release/chart.sh``, the script the release workflow runs. The real
    node's containerd trusts the registry's CA, and so does helm (``SSL_CERT_FILE``).

    Every pod of the module then runs that released reference, never the lab's local
    name of the same image: the kubelet (1.33+, KEP-2535) checks that a pod may use an
    image it pulled, by the name it pulled it under, and pulls again for another name
    of the same image, which the lab's local name has no registry for."""
    import subprocess

    registry = stack.registry = start_registry(stack.cluster, binary)
    node.trust_registry(registry.address, registry.ca_file)
    owner = README_CHART.removeprefix(f"oci://{README_REGISTRY}/").split("/")[0]
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    stack.release_image = f"{registry.address}/{owner}/gpu-scheduler:{version}"
    push_image(registry, realnode.images()["GPU_SCHEDULER_IMAGE"], stack.release_image)
    tools = helm_on_path(stack, stack.workdir / "bin")
    env = {**registry.env(), "PATH": f"{tools}:{os.environ['PATH']}", "DIST": str(tools)}
    done = subprocess.run(
        ["tools/release/chart.sh", registry.address, owner, version],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def helm_on_path(stack: Stack, tools: Path, values: Path | None = None) -> Path:
    """A folder holding ``helm``: the lab's, adding ``-f values`` to an install."""
    tools.mkdir(parents=True, exist_ok=True)
    add = f'[ "$1" = install ] && set -- "$@" -f "{values}"\n' if values else ""
    (tools / "helm").write_text(f'#!/bin/sh\n{add}exec "{stack.helm}" helm "$@"\n')
    (tools / "helm").chmod(0o755)
    return tools


def lab_values(work: Path, chart_version: str = "current", image: str | None = None) -> Path:
    """What the lab adds to the README's command, as an admin's values file would
    (``image``: the image to run, where the chart is not the registry's: the released
    one, :attr:`Stack.release_image`)."""
    FAKE_GPUS.parent.mkdir(parents=True, exist_ok=True)
    FAKE_GPUS.write_text(yaml.safe_dump(h100_inventory(GPUS)))
    values: dict[str, Any] = {
        # The lab runs these two from the host (no Service proxy, no cluster DNS).
        "scheduler": {"replicas": 0},
        "extender": {"replicas": 0},
    }
    if image:
        name, tag = image.rsplit(":", 1)
        values["image"] = {"repository": name, "tag": tag, "pullPolicy": "IfNotPresent"}
    if chart_version == "current":
        values["agent"] = {
            "capacity": True,
            "platform": "eks",  # no RuntimeClass: the node runs plain runc
            "extraArgs": ["--fake-gpus", str(FAKE_GPUS)],
            "extraVolumes": [
                {
                    "name": "lab-gpus",
                    "hostPath": {"path": str(FAKE_GPUS.parent), "type": "Directory"},
                }
            ],
            "extraVolumeMounts": [
                {"name": "lab-gpus", "mountPath": str(FAKE_GPUS.parent), "readOnly": True}
            ],
        }
        # The kubelet here refreshes Secret volumes within seconds (syncFrequency 5s).
        values["certificates"] = {"controller": {"settle": "15s"}}
    else:  # 0.1.0: its agent cannot read a fake inventory; keep it off the node
        values["agent"] = {"nodeSelector": {"gpu-scheduler.io/lab": "no-agent-here"}}
        values["certificates"] = {"mode": "tool"}
    path = work / f"values-{chart_version}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def readme_commands() -> list[list[str]]:
    """The README's install block, one argv per command (continuation lines joined)."""
    import shlex

    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- install:start -->", 1)[1].split("<!-- install:end -->", 1)[0]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in body.replace("\\\n", " ").splitlines() if line]


def run_readme_command(stack: Stack, argv: list[str]) -> str:
    """One README command against the lab: helm and kubectl are the lab's binaries,
    the README's chart the one published to the lab's registry (:func:`publish`), at the
    version the README names, only the registry's address put for ghcr.io."""
    import subprocess

    tool, *args = argv
    assert tool in ("helm", "kubectl"), argv
    if tool == "helm":
        at = args.index(README_CHART)
        version = args[args.index("--version") + 1]
        chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
        assert version == chart["version"], f"README installs {version}, the chart is {chart}"
        args[at] = README_CHART.replace(README_REGISTRY, stack.registry.address, 1)
        args += ["-f", str(lab_values(stack.workdir)), "--timeout", "6m"]
        binary = stack.helm
    else:
        binary = stack.cluster.binary
    env = {**stack.registry.env(), "KUBECONFIG": str(stack.cluster.kubeconfig)}
    done = subprocess.run(
        [str(binary), tool, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@dataclass
class AdmissionProbe:
    """A GPU pod created (dry run) every ``every`` s, from a moment on, until ``stop``
    (or, ``until_mutated``, until our webhook pod mutates one): how long GPU pods are
    refused by a fresh install, and what they are told meanwhile; or whether any is
    refused or left unmutated during an upgrade."""

    api: Any
    every: float = 0.25
    until_mutated: bool = True
    started: float = field(default_factory=time.monotonic)
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, text)
    marks: dict[str, float] = field(default_factory=dict)
    thread: threading.Thread | None = None

    def mark(self, what: str) -> None:
        self.marks[what] = time.monotonic() - self.started

    def start(self) -> AdmissionProbe:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self.stop.is_set() and time.monotonic() - self.started < 600:
            at = time.monotonic() - self.started
            try:
                pod = core.create_namespaced_pod("default", _gpu_pod_body("probe"), dry_run="All")
            except ApiException as exc:
                self.outcomes.append((at, "refused", str(exc.body)[:300]))
            else:
                mutated = pod.spec.scheduler_name == contract.SCHEDULER_NAME
                self.outcomes.append((at, "mutated" if mutated else "unmutated", ""))
                if mutated and self.until_mutated:
                    return
            self.stop.wait(self.every)

    def first(self, kind: str) -> tuple[float, str] | None:
        return next(((t, text) for t, k, text in self.outcomes if k == kind), None)

    def finish(self) -> list[tuple[float, str, str]]:
        """Stops it; what was not admitted and mutated."""
        self.stop.set()
        assert self.thread is not None
        self.thread.join(10)
        return [o for o in self.outcomes if o[1] != "mutated"]


PROBE: dict[str, AdmissionProbe] = {}


def install(stack: Stack, work: Path) -> None:
    """The README's first command (helm install --wait), timed, from nothing."""
    probe = PROBE["install"] = AdmissionProbe(stack.api).start()
    helm, *proof = readme_commands()
    started = time.monotonic()
    out = run_readme_command(stack, helm)
    PROBE["install"].mark("applied")
    assert "STATUS: deployed" in out, out
    stack.install_s = time.monotonic() - started
    stack.proof = proof
    admission = client.AdmissionregistrationV1Api(stack.api)
    config = admission.read_mutating_webhook_configuration("gpu-scheduler-webhook")
    assert all(hook.client_config.ca_bundle for hook in config.webhooks)
    probe.mark("certificates")  # --wait returned: the controller was Ready, so injected
    # Registered with Ignore; armed by the controller once a webhook pod is Ready.
    wait_for(lambda: armed(stack), 30, "the webhook armed: failurePolicy Fail", 0.5)
    probe.mark("armed")


def armed(stack: Stack) -> bool:
    """The webhook's failurePolicy is Fail: the certificate controller armed it."""
    admission = client.AdmissionregistrationV1Api(stack.api)
    config = admission.read_mutating_webhook_configuration("gpu-scheduler-webhook")
    return [hook.failure_policy for hook in config.webhooks] == ["Fail"]


def pods(stack: Stack, selector: str) -> list[Any]:
    return client.CoreV1Api(stack.api).list_namespaced_pod(NAMESPACE, label_selector=selector).items


def namespace_gone(stack: Stack) -> None:
    core = client.CoreV1Api(stack.api)
    names = lambda: [n.metadata.name for n in core.list_namespace().items]  # noqa: E731
    wait_for(lambda: NAMESPACE not in names(), 120, "the namespace gone", 1)


def webhook_pods_ready(stack: Stack, what: str) -> None:
    def ready() -> int:
        return sum(
            running_ready(p) for p in pods(stack, "app.kubernetes.io/name=gpu-scheduler-webhook")
        )

    wait_for(lambda: ready() == 2, 180, what, 1)


def running_ready(pod: Any) -> bool:
    ready = [c.status for c in pod.status.conditions or [] if c.type == "Ready"]
    return pod.status.phase == "Running" and ready == ["True"]


def test_the_certificate_controller_runs_as_a_pod_and_keeps_the_ca_inside(real):
    """The install's certificates come from its own pod: a CA in the Secret
    gpu-scheduler-internal-ca, the leaves it signs, the pod Ready; nothing was made on the host."""
    import base64

    core = client.CoreV1Api(real.api)
    (pod,) = pods(real, "app.kubernetes.io/name=gpu-scheduler-certs")
    wait_for(
        lambda: running_ready(core.read_namespaced_pod(pod.metadata.name, NAMESPACE)),
        120,
        "the certificate controller's pod Ready",
        1,
    )
    ca = core.read_namespaced_secret("gpu-scheduler-internal-ca", NAMESPACE).data
    for name in ("webhook", "extender", "scheduler"):
        leaf = core.read_namespaced_secret(f"gpu-scheduler-{name}-tls", NAMESPACE).data
        assert base64.b64decode(leaf["ca.crt"]) == base64.b64decode(ca["ca.crt"])
    log = core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)
    assert "wrote Secret gpu-scheduler-internal-ca" in log, log[-2000:]


def test_agent_pod_runs_on_the_real_node_and_publishes(real):
    core = client.CoreV1Api(real.api)

    def agent_ready() -> bool:
        found = pods(real, "app.kubernetes.io/name=gpu-scheduler-agent")
        return len(found) == 1 and found[0].spec.node_name == NODE and running_ready(found[0])

    wait_for(agent_ready, 180, "the agent DaemonSet's pod Running and Ready on the real node", 1)

    def published() -> bool:
        node = core.read_node(NODE)
        annotations = node.metadata.annotations or {}
        return (
            node.metadata.labels.get(contract.LABEL_GPU_COUNT) == str(GPUS)
            and contract.ANN_GPUS in annotations
            and node.status.capacity.get(contract.RESOURCE_GPU) == str(GPUS)
            and read_lease(real, NODE) is not None
        )

    wait_for(published, 60, "the agent's labels, annotations, capacity and Lease", 1)
    node = core.read_node(NODE)
    assert node.metadata.labels[contract.LABEL_GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert contract.ANN_LEGACY_HEARTBEAT not in (node.metadata.annotations or {})
    # Written by the pod, with the pod's own token: the kubelet is the only other
    # writer of this Node, and it writes none of these.
    (agent,) = pods(real, "app.kubernetes.io/name=gpu-scheduler-agent")
    # Its heartbeat: the Lease named as the node, owned by the pod (through the
    # admission policy, which checks the owner against the token's pod claim).
    lease = read_lease(real, NODE)
    assert lease.metadata.labels == {contract.LEASE_LABEL: contract.LEASE_LABEL_VALUE}
    assert [(o.kind, o.uid) for o in lease.metadata.owner_references] == [
        ("Pod", agent.metadata.uid)
    ]
    assert lease.spec.holder_identity == NODE and lease.spec.renew_time is not None
    assert agent.spec.service_account_name == "gpu-scheduler-agent"
    # The image the chart from the registry names: pulled from there by the node.
    assert agent.spec.containers[0].image == real.release_image


def test_first_minutes_of_an_install(real):
    """From `helm install` until the webhook's pods serve: no GPU pod is refused (the
    webhook is registered with failurePolicy Ignore, armed only once a pod of it is
    Ready), those created meanwhile go unmutated, and the first mutated one comes soon
    after the certificates are published."""
    probe = PROBE["install"]
    assert probe.thread is not None
    probe.thread.join(240)
    mutated = probe.first("mutated")
    refused = probe.first("refused")
    assert mutated is not None, probe.outcomes[-3:]
    after_certs = mutated[0] - probe.marks["certificates"]
    print(
        f"\nfirst minutes: applied at {probe.marks['applied']:.1f} s, certificates at "
        f"{probe.marks['certificates']:.1f} s, armed at {probe.marks['armed']:.1f} s, "
        f"first GPU pod mutated at {mutated[0]:.1f} s ({after_certs:.1f} s after the "
        f"certificates); {sum(k == 'unmutated' for _, k, _ in probe.outcomes)} created "
        "unmutated before"
    )
    assert refused is None, refused
    assert after_certs < WINDOW_AFTER_CERTIFICATES_S


def test_gpu_pod_mutated_by_the_webhook_pod_placed_run_and_released(real):
    core = client.CoreV1Api(real.api)
    webhook_pods_ready(real, "both webhook pods Running and Ready")
    wait_for(
        lambda: core.read_node(NODE).status.allocatable.get(contract.RESOURCE_GPU) == str(GPUS),
        120,
        "the real node's GPUs allocatable",
        1,
    )
    namespace = "real-node"
    ensure_namespace(real, namespace)
    name = unique("runs")
    image = real.release_image
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "job",
                    "image": image,
                    "command": ["python3", "-c", "import time; time.sleep(6); print('done')"],
                    "resources": {"limits": {contract.RESOURCE_GPU: "1"}},
                }
            ],
        },
    }
    # The only webhook is the MutatingWebhookConfiguration from deploy/, whose client
    # config names the Service; nothing of ours serves admission from the host here.
    pod = core.create_namespaced_pod(namespace, manifest)
    assert pod.spec.scheduler_name == "gpu-scheduler"
    assert any(t.key == contract.RESOURCE_GPU for t in pod.spec.tolerations or [])

    def phase() -> str:
        return core.read_namespaced_pod(name, namespace).status.phase

    wait_for(lambda: phase() == "Running", 120, "the GPU pod Running on the real node", 0.5)
    assert core.read_namespaced_pod(name, namespace).spec.node_name == NODE
    two = {**manifest, "metadata": {"name": "probe", "namespace": namespace}}
    two["spec"] = {**manifest["spec"], "schedulerName": "gpu-scheduler"}
    two["spec"]["containers"] = [
        {
            **manifest["spec"]["containers"][0],
            "resources": {"limits": {contract.RESOURCE_GPU: str(GPUS)}},
        }
    ]

    def extender_filter() -> dict[str, Any]:
        body = {"Pod": two, "NodeNames": [NODE]}
        return requests.post(real.extender_url + "/filter", json=body, timeout=5).json()

    refused = extender_filter()
    assert refused["NodeNames"] == [], refused
    assert f"1 of {GPUS} GPUs free" in str(refused), refused
    wait_for(lambda: phase() == "Succeeded", 120, "the GPU pod Succeeded", 0.5)
    # The pod still exists (Succeeded), but its GPU is free again in the extender's view.
    wait_for(
        lambda: extender_filter()["NodeNames"] == [NODE], 30, "the extender to free the GPU", 0.5
    )
    assert core.read_namespaced_pod_log(name, namespace).strip() == "done"


def test_the_readme_pod_proves_the_install(real):
    """The README's commands after the install, as written: its GPU pod (the CUDA image,
    here the lab's stand-in nvidia-smi under its name) runs nvidia-smi on the node and
    exits 0, its Events say why that node, and its log is nvidia-smi's."""
    apply, get_pod, get_events, logs = real.proof
    core = client.CoreV1Api(real.api)
    out = run_readme_command(real, apply)
    assert "pod/gpu-check created" in out, out
    try:
        wait_for(
            lambda: core.read_namespaced_pod("gpu-check", "default").status.phase == "Succeeded",
            120,
            "the README's GPU pod Succeeded (nvidia-smi exited 0)",
            0.5,
        )
        pod = core.read_namespaced_pod("gpu-check", "default")
        assert pod.spec.containers[0].image == realnode.EXAMPLE_IMAGE
        assert pod.spec.scheduler_name == contract.SCHEDULER_NAME
        out = run_readme_command(real, get_pod)
        assert "Completed" in out and NODE in out, out
        out = run_readme_command(real, logs)
        assert out.startswith("nvidia-smi: the gpu-scheduler lab's stand-in"), out
        wait_for(
            lambda: "gpu-check" in run_readme_command(real, get_events),
            30,
            "the README pod's GPUPlacement Event",
            1,
        )
    finally:
        core.delete_namespaced_pod("gpu-check", "default", grace_period_seconds=0)
    print(f"\nhelm install --wait from nothing: {real.install_s:.1f} s")


def test_nothing_a_node_needs_waits_on_the_webhook(real):
    """The webhook's pods down (no endpoint; a GPU pod is refused): a GPU-requesting
    DaemonSet in the GPU Operator's namespace, and a pod with spec.nodeName, are
    created and run on the node all the same."""
    apps, core = client.AppsV1Api(real.api), client.CoreV1Api(real.api)
    scale = {"spec": {"replicas": 0}}
    apps.patch_namespaced_deployment_scale("gpu-scheduler-webhook", NAMESPACE, scale)
    namespace = "gpu-operator"
    ensure_namespace(real, namespace)
    container = {
        "name": "validator",
        "image": realnode.SLEEPER_IMAGE,
        "resources": {"limits": {contract.RESOURCE_GPU: "1"}},
    }
    labels = {"app": "lab-validator"}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "lab-validator"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "tolerations": [{"operator": "Exists"}],
                },
            },
        },
    }
    pinned = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pinned"},
        "spec": {"nodeName": NODE, "containers": [{**container, "name": "pinned"}]},
    }
    try:
        wait_for(
            lambda: not [p for p in pods(real, "app.kubernetes.io/name=gpu-scheduler-webhook")],
            60,
            "the webhook's pods gone",
            0.5,
        )
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod("default", _gpu_pod_body("refused"), dry_run="All")
        assert "gpu-scheduler-webhook" in str(refused.value.body)
        started = time.monotonic()
        apps.create_namespaced_daemon_set(namespace, daemonset)
        core.create_namespaced_pod("default", pinned)

        def running(namespace: str, selector: str = "", name: str = "") -> bool:
            found = (
                [core.read_namespaced_pod(name, namespace)]
                if name
                else core.list_namespaced_pod(namespace, label_selector=selector).items
            )
            return len(found) == 1 and found[0].status.phase == "Running"

        wait_for(lambda: running(namespace, "app=lab-validator"), 120, "the DaemonSet's pod", 0.5)
        daemon_s = time.monotonic() - started
        wait_for(lambda: running("default", name="pinned"), 120, "the spec.nodeName pod", 0.5)
        print(f"\nwebhook down: the GPU DaemonSet's pod Running {daemon_s:.1f} s after it was made")
    finally:
        apps.delete_namespaced_daemon_set("lab-validator", namespace)
        core.delete_namespaced_pod("pinned", "default", grace_period_seconds=0)
        scale = {"spec": {"replicas": 2}}
        apps.patch_namespaced_deployment_scale("gpu-scheduler-webhook", NAMESPACE, scale)
        webhook_pods_ready(real, "the webhook's pods back")


def admitted_by_no_webhook(core: client.CoreV1Api, after: str) -> None:
    """GPU pods are admitted, and soon by no webhook. The apiserver reads webhook
    configurations through an informer, so it may call a (terminating) webhook for a
    moment after its configuration is deleted; none may be refused meanwhile."""
    refused: list[ApiException] = []

    def unmutated() -> bool:
        try:
            pod = core.create_namespaced_pod("default", _gpu_pod_body("after"), dry_run="All")
        except ApiException as exc:
            refused.append(exc)
            return True
        return pod.spec.scheduler_name != contract.SCHEDULER_NAME

    wait_for(unmutated, 15, f"a GPU pod admitted by no webhook after {after}", 0.2)
    assert not refused, f"a GPU pod refused after {after}: {refused[0]}"


def _gpu_pod_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": realnode.SLEEPER_IMAGE,
                    "resources": {"limits": {contract.RESOURCE_GPU: "1"}},
                }
            ],
        },
    }


FROM_SOURCE = ROOT / "docs" / "install" / "from-source.md"
#: What the page's commands stand for in the lab: the clone is this checkout, `docker
#: build` is make image's build of the same Dockerfile (tagged), `docker push` buildah's.
LAB_SHELL = """
git() { [ "$1" = clone ] || { echo "git $1: not in the lab" >&2; return 2; }; }
docker() {
  case "$1 $2" in
    "build -t") buildah tag "$LAB_IMAGE" "$3" ;;
    "push "*) buildah push --quiet --cert-dir "$REGISTRY_CERTS" "$2" "docker://$2" ;;
    *) echo "docker $*: not in the lab" >&2; return 2 ;;
  esac
}
"""


def page_block(page: Path, name: str) -> str:
    text = page.read_text()
    block = text.split(f"<!-- {name}:start -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]
    return block.split("```sh\n", 1)[1].split("```", 1)[0]


def run_page(stack: Stack, script: str, work: Path) -> str:
    """Shell lines of a docs page, as written but for registry.example.com (the lab's
    registry), in a folder where ``gpu-scheduler`` is this checkout; helm is the lab's,
    with the lab's values added to an install."""
    import subprocess

    work.mkdir(exist_ok=True)
    clone = work / "gpu-scheduler"
    if not clone.exists():
        clone.symlink_to(ROOT)
    tools = helm_on_path(stack, work / "bin", lab_values(stack.workdir))
    env = {
        **stack.registry.env(),
        "PATH": f"{tools}:{os.environ['PATH']}",
        "KUBECONFIG": str(stack.cluster.kubeconfig),
        "LAB_IMAGE": realnode.images()["GPU_SCHEDULER_IMAGE"],
        "REGISTRY_CERTS": str(stack.registry.cert_dir),
        "STORAGE_DRIVER": "vfs",
        "DIST": str(work / "dist"),
    }
    script = LAB_SHELL + script.replace("registry.example.com", stack.registry.address)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env, cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def installed_from(stack: Stack, image: str) -> None:
    """The release deployed, its agent running ``image`` Ready on the node, its webhook
    pods Ready."""

    def agent_ready() -> bool:
        found = pods(stack, "app.kubernetes.io/name=gpu-scheduler-agent")
        return (
            len(found) == 1
            and found[0].spec.containers[0].image == image
            and running_ready(found[0])
        )

    wait_for(agent_ready, 180, f"the agent Ready on {image}", 1)
    webhook_pods_ready(stack, "both webhook pods Ready")


def uninstall(stack: Stack) -> None:
    """helm uninstall, then the namespace (the other way round would leave the
    release's cluster-wide objects, its webhook configuration among them, behind)."""
    import subprocess

    helm = [str(stack.helm), "helm", f"--kubeconfig={stack.cluster.kubeconfig}", "-n", NAMESPACE]
    subprocess.run([*helm, "uninstall", "gpu-scheduler", "--wait"], timeout=180, check=True)
    stack.cluster.k8s("kubectl", "delete", "--wait=false", "namespace", NAMESPACE)
    namespace_gone(stack)


def test_the_from_source_page_installs_through_a_registry_and_from_the_folder(real):
    """docs/install/from-source.md as written (registry.example.com: the lab's
    registry): the image built and pushed, the chart released by the release's script
    and installed from the registry; then, uninstalled, the chart installed from the
    folder with the pushed image. Each time the node pulls the image from the registry
    and the install serves."""
    first = page_block(FROM_SOURCE, "from-source")
    assert "registry.example.com" in first and "docker push" in first
    uninstall(real)
    out = run_page(real, first, real.workdir / "from-source")
    assert "STATUS: deployed" in out, out
    image = f"{real.registry.address}/platform/gpu-scheduler:0.2.0"
    installed_from(real, image)
    uninstall(real)
    settings = next(line for line in first.splitlines() if line.startswith("REGISTRY="))
    out = run_page(real, f"cd gpu-scheduler\n{settings}\n{page_block(FROM_SOURCE, 'from-folder')}",
                   real.workdir / "from-source")  # fmt: skip
    assert "STATUS: deployed" in out, out
    installed_from(real, image)


def test_upgrade_from_the_previous_release_keeps_gpu_pods_placeable(real, tmp_path):
    """Uninstall leaves nothing that refuses a pod; then the previous release (0.1.0,
    its certificates from deploy/install-certs.sh), upgraded to this chart while GPU
    pods are created: every one admitted and mutated, through the certificate
    controller's adoption of the old CA to its end, and a GPU pod placed after it."""
    from tests.e2e.kube import install_certs

    core = client.CoreV1Api(real.api)
    helm = [str(real.helm), "helm", f"--kubeconfig={real.cluster.kubeconfig}", "-n", NAMESPACE]

    def run(*args: str, timeout: float = 420) -> str:
        import subprocess

        done = subprocess.run([*helm, *args], capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    run("uninstall", "gpu-scheduler", "--wait")
    admission = client.AdmissionregistrationV1Api(real.api)
    names = [c.metadata.name for c in admission.list_mutating_webhook_configuration().items]
    assert "gpu-scheduler-webhook" not in names
    admitted_by_no_webhook(core, "helm uninstall")
    # The controller's Secrets are not the release's: an admin deletes the namespace.
    core.delete_namespace(NAMESPACE)
    namespace_gone(real)
    run("install", "gpu-scheduler", str(PREVIOUS_CHART), "--create-namespace",
        "-f", str(lab_values(real.workdir, "0.1.0", real.release_image)))  # fmt: skip
    done = install_certs(real.cluster, tmp_path / "certs-out", tmp_path / "bin")
    assert done.returncode == 0, done.stdout + done.stderr
    webhook_pods_ready(real, "0.1.0's webhook pods Ready")
    probe = AdmissionProbe(real.api, every=0.2, until_mutated=False)
    wait_for(
        lambda: (
            core.create_namespaced_pod(
                "default", _gpu_pod_body("v1"), dry_run="All"
            ).spec.scheduler_name
            == contract.SCHEDULER_NAME
        ),
        60,
        "0.1.0 admitting GPU pods",
        0.5,
    )
    probe.started = started = time.monotonic()
    probe.start()
    run("upgrade", "gpu-scheduler", str(CHART), "--wait", "--timeout", "6m",
        "-f", str(lab_values(real.workdir, image=real.release_image)))  # fmt: skip
    upgraded = time.monotonic() - started

    def adopted() -> bool:
        ca = core.read_namespaced_secret("gpu-scheduler-internal-ca", NAMESPACE).data or {}
        return "ca.key" in ca and "ca-previous.crt" not in ca

    wait_for(adopted, 180, "the controller's adoption of the old CA to finish", 1)
    time.sleep(10)  # the webhook pods read the last bundle's leaves
    bad = probe.finish()
    total = len(probe.outcomes)
    print(f"\nupgrade 0.1.0 -> this chart: helm upgrade --wait {upgraded:.1f} s; adoption done "
          f"{time.monotonic() - started:.1f} s after it began; {total} GPU pods created, "
          f"{len(bad)} not admitted and mutated: {bad[:3]}")  # fmt: skip
    assert total > 50 and bad == []
    name = unique("after-upgrade")
    core.create_namespaced_pod("default", _gpu_pod_body(name))
    try:
        wait_for(
            lambda: core.read_namespaced_pod(name, "default").status.phase == "Running",
            120,
            "a GPU pod Running after the upgrade",
            0.5,
        )
        assert core.read_namespaced_pod(name, "default").spec.node_name == NODE
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def kustomize_overlay(work: Path, image: str) -> Path:
    """deploy/ plus the lab's settings, as an admin's overlay would add them: the same
    as lab_values() gives the chart, ``image`` the one to run."""
    name, tag = image.rsplit(":", 1)
    folder = work / "overlay"
    folder.mkdir(exist_ok=True)
    lab_values(work)  # writes the fake inventory
    agent = [
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--fake-gpus"},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": str(FAKE_GPUS)},
        {
            "op": "add",
            "path": "/spec/template/spec/volumes/-",
            "value": {
                "name": "lab-gpus",
                "hostPath": {"path": str(FAKE_GPUS.parent), "type": "Directory"},
            },
        },
        {
            "op": "add",
            "path": "/spec/template/spec/containers/0/volumeMounts/-",
            "value": {"name": "lab-gpus", "mountPath": str(FAKE_GPUS.parent), "readOnly": True},
        },
    ]
    not_here = [{"op": "replace", "path": "/spec/replicas", "value": 0}]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy", folder)],
        # kustomize reads sortOptions only where it builds: an overlay copies the base's
        "sortOptions": yaml.safe_load((ROOT / "deploy" / "kustomization.yaml").read_text())[
            "sortOptions"
        ],
        "components": [os.path.relpath(ROOT / "deploy" / "agent" / "capacity", folder)],
        "images": [{"name": "ghcr.io/gpu-scheduler/gpu-scheduler", "newName": name, "newTag": tag}],
        "patches": [
            {
                "target": {"kind": "DaemonSet", "name": "gpu-scheduler-agent"},
                "patch": yaml.safe_dump(agent),
            },
            *(
                {"target": {"kind": "Deployment", "name": n}, "patch": yaml.safe_dump(not_here)}
                for n in ("gpu-scheduler", "gpu-scheduler-extender")
            ),
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return folder


def test_kubectl_apply_k_installs_the_same_with_nothing_on_the_host(real):
    """`kubectl apply -k` from nothing: the certificate controller's pod makes the
    certificates, the webhook's pods serve, a GPU pod is placed and runs; then
    `kubectl delete -k` leaves nothing that refuses a pod."""
    core = client.CoreV1Api(real.api)
    subprocess_run = real.cluster.k8s
    uninstall(real)
    overlay = kustomize_overlay(real.workdir, real.release_image)
    started = time.monotonic()
    subprocess_run("kubectl", "apply", "--server-side", "-k", str(overlay))
    wanted = {"gpu-scheduler-webhook": 2, "gpu-scheduler-certs": 1, "gpu-scheduler-agent": 1}

    def ready() -> bool:
        return all(
            sum(running_ready(p) for p in pods(real, f"app.kubernetes.io/name={name}")) == count
            for name, count in wanted.items()
        )

    wait_for(ready, 240, "every pod of the kustomize install Ready", 1)
    print(f"\nkubectl apply -k until every pod Ready: {time.monotonic() - started:.1f} s")
    wait_for(lambda: armed(real), 30, "the kustomize install armed", 0.5)
    # Applied again (an upgrade's way): Ignore again, without a conflict with the
    # controller's write; armed again at the controller's next pass (every minute).
    subprocess_run("kubectl", "apply", "--server-side", "-k", str(overlay))
    reapplied = time.monotonic()
    wait_for(lambda: armed(real), 90, "armed again after a re-apply", 0.5)
    print(f"re-applied: armed again {time.monotonic() - reapplied:.1f} s later")
    name = unique("kustomize")
    pod = core.create_namespaced_pod("default", _gpu_pod_body(name))
    assert pod.spec.scheduler_name == contract.SCHEDULER_NAME
    try:
        wait_for(
            lambda: core.read_namespaced_pod(name, "default").status.phase == "Running",
            120,
            "a GPU pod Running after kubectl apply -k",
            0.5,
        )
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    subprocess_run("kubectl", "delete", "--wait=false", "-k", str(overlay))
    admitted_by_no_webhook(core, "kubectl delete -k")
