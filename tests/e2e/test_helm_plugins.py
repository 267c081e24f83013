"""`helm install --set scheduler.path=plugins` into the real control plane, on the
newest and the oldest minor: every object accepted, no extender, kube-scheduler's
image the release's for the cluster's minor. The lab's nodes pull no images, so the
chart's kube-scheduler runs here as a process: our kube-scheduler of that minor
(tools/k8s/build.sh plugins), with the configuration and flags the chart installed,
as the chart's ServiceAccount (its RBAC, nothing more), leader election on. It places
a GPU pod by the plugins' rules: binpack would take the node whose agent is silent,
and the heartbeat Leases it may read say no.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from types import SimpleNamespace

import yaml
from kubernetes import client

from lab.controlplane import ROOT, plugins_scheduler
from lab.processes import free_port, wait_url
from lab.stack import NAMESPACE
from tests.e2e import test_helm
from tests.e2e.kube import pod_manifest, put_lease, unique, wait_bound
from tests.e2e.scenarios import gpu_node
from tests.e2e.test_helm import CHART, _key, _run, helm_template
from tests.helpers import required

fresh_cluster = test_helm.fresh_cluster  # a control plane of its own, newest and oldest
IMAGE = "ghcr.io/gpu-scheduler/gpu-scheduler-kube-scheduler"


TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _release(minor: int) -> str:
    done = subprocess.run(
        [str(ROOT / "tools" / "k8s" / "build.sh"), "--version", f"1.{minor}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_helm_install_of_the_plugins_path_places_a_gpu_pod(fresh_cluster, helm_binary):
    cluster = fresh_cluster
    try:
        binary = plugins_scheduler(cluster.minor)
    except FileNotFoundError as exc:
        required("the plugins path's helm test", f"{exc} (or `make test`, which builds it)")
    out = _run(
        helm_binary,
        *("helm", "install", "gpu-scheduler", str(CHART), "-n", NAMESPACE, "--create-namespace"),
        *("--set", "scheduler.path=plugins", f"--kubeconfig={cluster.kubeconfig}"),
    )
    assert "STATUS: deployed" in out and "The plugins path" in out, out
    api = cluster.api_client()
    version = client.VersionApi(api).get_code().git_version
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    apps = client.AppsV1Api(api)
    deployment = apps.read_namespaced_deployment("gpu-scheduler", NAMESPACE)
    (container,) = deployment.spec.template.spec.containers
    assert container.image == f"{IMAGE}:{_release(cluster.minor)}-{chart}"
    names = {d.metadata.name for d in apps.list_namespaced_deployment(NAMESPACE).items}
    assert "gpu-scheduler-extender" not in names
    rendered = helm_template(
        helm_binary, "--kube-version", version, "--set", "scheduler.path=plugins"
    )
    for obj in rendered:
        kind, namespace, name = _key(obj)
        args = ["kubectl", f"--kubeconfig={cluster.kubeconfig}", "get", kind, name, "-o", "name"]
        _run(cluster.binary, *args, *(["-n", namespace] if namespace else []))

    # The chart's kube-scheduler, as a process: its ConfigMap and flags, its identity.
    core = client.CoreV1Api(api)
    config = yaml.safe_load(
        core.read_namespaced_config_map("gpu-scheduler-config", NAMESPACE).data[
            "scheduler-config.yaml"
        ]
    )
    token = core.create_namespaced_service_account_token(
        "gpu-scheduler", NAMESPACE, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config["clientConnection"]["kubeconfig"] = str(
        cluster.kubeconfig_with_token("gpu-scheduler", token)
    )
    assert config["leaderElection"]["leaderElect"] is True
    path = cluster.workdir / "chart-plugins-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = cluster.spawn(
        "chart-plugins-scheduler",
        [
            str(binary),
            f"--config={path}",
            *container.command[2:],  # 1.34: asynchronous preemption off
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--authentication-kubeconfig={cluster.kubeconfig}",
            f"--authorization-kubeconfig={cluster.kubeconfig}",
            "-v=2",
        ],
    )
    try:
        wait_url(f"https://127.0.0.1:{port}/healthz", 60, proc, insecure=True)
        stack = SimpleNamespace(api=api)
        case = "chart-plugins"
        now = dt.datetime.now(dt.UTC)
        silent = gpu_node(stack, case, 2)  # the tightest fit, but its agent is silent
        fresh = gpu_node(stack, case, 8)
        put_lease(stack, silent, now - dt.timedelta(hours=1))
        put_lease(stack, fresh, now)
        name = unique("pod")
        pod = pod_manifest(name, 2, case=case, scheduler="gpu-scheduler", tolerations=TOLERATION)
        # The release namespace: the chart's webhook (not running here) never sees it.
        core.create_namespaced_pod(NAMESPACE, pod)
        assert wait_bound(stack, name, NAMESPACE) == fresh
        lease = client.CoordinationV1Api(api).read_namespaced_lease("gpu-scheduler", NAMESPACE)
        assert lease.spec.holder_identity  # it leads, by the chart's own lease
        log = proc.log_path.read_text()
        assert "forbidden" not in log, log[-3000:]
    finally:
        cluster.stop_process("chart-plugins-scheduler")
        _run(
            helm_binary,
            *("helm", "uninstall", "gpu-scheduler", "-n", NAMESPACE, "--wait"),
            f"--kubeconfig={cluster.kubeconfig}",
        )
