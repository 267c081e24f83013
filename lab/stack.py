"""The whole product on the local control plane: what `make demo` and the e2e tests run.

On top of :mod:`lab.controlplane` it starts our extender (cluster mode), our
webhook (TLS, certificates from the certs tool, registered with a ``url`` clientConfig
and its caBundle, rules and matchConditions taken from deploy/), two kube-schedulers
(the cluster's default one, and the ``gpu-scheduler`` profile from deploy/'s
KubeSchedulerConfiguration with the extender at 127.0.0.1), and agents on demand.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_scheduler import contract
from lab.controlplane import ROOT, LocalCluster, plugins_scheduler, start_control_plane
from lab.kubelet_shim import KubeletShim
from lab.processes import ControlPlaneError, Process, free_port, wait_url

log = logging.getLogger(__name__)

DEPLOY = ROOT / "deploy"
CLI = [sys.executable, "-m", "gpu_scheduler.cli"]
WEBHOOK_SERVICE = "gpu-scheduler-webhook"
EXTENDER_SERVICE = "gpu-scheduler-extender"
SCHEDULER_ACCOUNT = "gpu-scheduler"
NAMESPACE = "gpu-scheduler"


def deploy_documents(folder: str) -> list[dict[str, Any]]:
    """Every Kubernetes object in ``deploy/<folder>/*.yaml`` (not kustomization or
    component config files, which have no apiVersion/kind)."""
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / folder).glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(
            d
            for d in yaml.safe_load_all(path.read_text())
            if isinstance(d, dict) and "kind" in d and "apiVersion" in d
        )
    return docs


def older_extender_args(tree: Path) -> list[str]:
    """What the extender of a checkout from before 0.2.0 (compared in a bench) needs
    to run as this one does: it read Node objects from each request unless told to
    keep its cluster cache."""
    cli = (tree / "extender" / "cli.py").read_text()
    return ["--node-source=cluster"] if "--node-source" in cli else []


def scheduler_config(
    extender_url: str,
    *,
    profile: str | None = None,
    client_dir: Path | None = None,
) -> dict[str, Any]:
    """deploy/'s KubeSchedulerConfiguration with the extender at ``extender_url`` (and
    optionally the profile renamed).
    ``client_dir``: kube-scheduler's client pair and CA bundle (``tls.crt``,
    ``tls.key``, ``ca.crt``) for an ``https://`` extender, as deploy/ mounts them;
    without it, plain HTTP."""
    cfg = yaml.safe_load((DEPLOY / "scheduler" / "scheduler-config.yaml").read_text())
    for extender in cfg.get("extenders") or []:
        extender["urlPrefix"] = extender_url
        if client_dir is None:
            extender["enableHTTPS"] = False
            extender.pop("tlsConfig", None)
        else:
            extender["enableHTTPS"] = True
            extender["tlsConfig"] = {
                "certFile": str(client_dir / "tls.crt"),
                "keyFile": str(client_dir / "tls.key"),
                "caFile": str(client_dir / "ca.crt"),
            }
    if profile is not None:
        for item in cfg["profiles"]:
            item["schedulerName"] = profile
    return cfg


def plugins_config(profile: str | None = None) -> dict[str, Any]:
    """deploy/'s KubeSchedulerConfiguration of the plugins path (optionally the profile
    renamed)."""
    cfg = yaml.safe_load((DEPLOY / "scheduler" / "plugins" / "scheduler-config.yaml").read_text())
    if profile is not None:
        for item in cfg["profiles"]:
            item["schedulerName"] = profile
    return cfg


def plugins_scheduler_flags(minor: int) -> list[str]:
    """The flags our kube-scheduler of the plugins path takes on this minor. On 1.34,
    asynchronous preemption lets the preemptor back into the queue before its last
    victim is deleted (upstream's prepareCandidateAsync; from 1.35 it is held until
    then, lastVictimsPendingPreemption, read in 1.35.4, 1.36.3 and 1.37.2): the pod,
    still short by that victim, preempts again and evicts one pod too many. The
    extender path hides it (its preempt verb answers with the victims it already
    agreed to); the plugins path turns it off there."""
    return ["--feature-gates=SchedulerAsyncPreemption=false"] if minor <= 34 else []


DEFAULT_SCHEDULER_CONFIG = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [{"schedulerName": contract.DEFAULT_SCHEDULER}],
}


def webhook_configuration(url: str, ca_bundle: str) -> dict[str, Any]:
    """deploy/'s MutatingWebhookConfiguration, pointed at ``url`` instead of the Service."""
    found = [d for d in deploy_documents("webhook") if d["kind"] == "MutatingWebhookConfiguration"]
    if len(found) != 1:
        raise ControlPlaneError("deploy/webhook/ must hold one MutatingWebhookConfiguration")
    config = copy.deepcopy(found[0])
    # A name of its own, so that applying deploy/ to the same cluster never merges
    # a Service clientConfig into this url one.
    config["metadata"] = {"name": config["metadata"]["name"] + "-local"}
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": url, "caBundle": ca_bundle}
        # deploy/ registers Ignore until the certificate controller arms it; the
        # stack's webhook serves from the start, so it is registered armed.
        hook["failurePolicy"] = "Fail"
    return config


@dataclass
class Stack:
    cluster: LocalCluster
    workdir: Path
    extender_port: int = 0
    extender_ops_port: int = 0
    extender_tls: bool = False
    webhook_port: int = 0
    cert_dir: Path = field(default_factory=Path)
    shim: KubeletShim | None = None
    api: Any = None
    #: Which path serves the gpu-scheduler profile: ``extender`` (kube-scheduler and our
    #: extender) or ``plugins`` (our kube-scheduler with the framework plugins).
    scheduling: str = "extender"

    # --- certificates: one CA, as the install's certs tool makes them ----------------
    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    def leaf(self, name: str, service: str, *, client: bool = False) -> Path:
        """A leaf pair (and the trust bundle as its ca.crt) signed by the stack's CA."""
        from certs import build, store

        identity = build.service_identity(service, NAMESPACE, ["127.0.0.1"])
        store.generate(self.pki / name, identity, ca_dir=self.pki / "ca", client=client)
        return self.pki / name

    # --- components ---------------------------------------------------------------
    def start_extender(self, config: dict[str, Any] | None = None, *, tls: bool = False) -> Process:
        """The stack's extender (cluster mode, direct to the API server). ``tls``: as
        deploy/ runs it, HTTPS with client certificates required for the verbs, and
        its ops endpoints in the clear on a second port."""
        self.extender_port = self.extender_port or free_port()
        self.extender_ops_port = self.extender_ops_port or free_port()
        self.extender_tls = tls
        if tls:
            self.leaf("extender", EXTENDER_SERVICE)
            self.leaf("scheduler", SCHEDULER_ACCOUNT, client=True)
        return self.start_extender_replica("extender", self.extender_port, self.extender_ops_port,
                                           config)  # fmt: skip

    def start_extender_replica(
        self, name: str, port: int, ops_port: int, config: dict[str, Any] | None = None
    ) -> Process:
        """An extender on ``port`` as :meth:`start_extender` started the stack's (its
        certificates too): the stack's is one replica, this another, as a Deployment's."""
        extra = [f"--ops-port={ops_port}"]
        if self.extender_tls:
            server = self.pki / "extender"
            extra += [
                f"--tls-cert-dir={server}",
                f"--client-ca={server / 'ca.crt'}",
                "--cert-reload-interval=1s",
            ]
        return self.spawn_extender(name, port, config, extra=extra, ops_port=ops_port)

    @property
    def extender_url(self) -> str:
        return f"{'https' if self.extender_tls else 'http'}://127.0.0.1:{self.extender_port}"

    def extender_client(self) -> dict[str, Any]:
        """``requests`` keyword arguments that reach the stack's extender as
        kube-scheduler does (its client certificate, the trust bundle)."""
        if not self.extender_tls:
            return {}
        client = self.pki / "scheduler"
        return {
            "cert": (str(client / "tls.crt"), str(client / "tls.key")),
            "verify": str(client / "ca.crt"),
        }

    def spawn_extender(
        self,
        name: str,
        port: int,
        config: dict[str, Any] | None = None,
        *,
        kubeconfig: Path | None = None,
        wait: bool = True,
        extra: list[str] | None = None,
        ops_port: int | None = None,
        cli: Sequence[str] = CLI,
        tree: Path = ROOT,
    ) -> Process:
        """An extender process named ``name`` on ``port`` (``kubeconfig``: another way
        to the API server, e.g. through a proxy); waits for /readyz (on ``ops_port``
        when given) unless told not to. ``tree``: run another checkout's extender
        (``cli``: the command that starts it there)."""
        args = [*cli, "extender", "--host=127.0.0.1", f"--port={port}", *(extra or [])]
        args.append(f"--kubeconfig={kubeconfig or self.cluster.kubeconfig}")
        args.append(f"--heartbeat-namespace={NAMESPACE}")
        args += older_extender_args(tree)
        if config is not None:
            path = self.workdir / f"{name}-config.yaml"
            path.write_text(yaml.safe_dump(config))
            args.append(f"--config={path}")
        env = None if tree == ROOT else {"PYTHONPATH": str(tree)}
        proc = self.cluster.spawn(name, args, env=env, cwd=tree)
        if wait:
            wait_url(f"http://127.0.0.1:{ops_port or port}/readyz", 60, proc)
        return proc

    def start_webhook(self) -> Process:
        from certs import store

        self.cert_dir = self.leaf("webhook", WEBHOOK_SERVICE)
        self.webhook_port = self.webhook_port or free_port()
        proc = self.cluster.spawn(
            "webhook",
            [
                *CLI,
                "webhook",
                "--host=127.0.0.1",
                f"--port={self.webhook_port}",
                f"--cert-dir={self.cert_dir}",
                "--workers=1",
                "--cert-reload-interval=1s",
            ],
        )
        wait_url(
            f"https://127.0.0.1:{self.webhook_port}/readyz",
            60,
            proc,
            ca_file=self.cert_dir / store.CA_CERT,
        )
        return proc

    def register_webhook(self) -> dict[str, Any]:
        from kubernetes import client

        from certs import store

        config = webhook_configuration(
            f"https://127.0.0.1:{self.webhook_port}/mutate", store.ca_bundle(self.cert_dir)
        )
        admission = client.AdmissionregistrationV1Api(self.api)
        admission.create_mutating_webhook_configuration(config)
        return config

    def publish_certificates(self) -> bool:
        """What deploy/install-certs.sh does after each step, in the lab: re-issue the
        leaves that need it (kept when good; each leaf's ca.crt refreshed to the trust
        bundle: the files are the lab's Secret volumes), put the bundle into the webhook
        configuration's caBundle, and restart the gpu-scheduler kube-scheduler when its
        files changed (it reads them only at start). Returns whether it restarted."""
        from kubernetes import client

        from certs import store

        def scheduler_files() -> bytes:
            folder = self.pki / "scheduler"
            return b"".join((folder / n).read_bytes() for n in ("tls.crt", "ca.crt"))

        before = scheduler_files() if self.extender_tls else b""
        self.leaf("webhook", WEBHOOK_SERVICE)
        if self.extender_tls:
            self.leaf("extender", EXTENDER_SERVICE)
            self.leaf("scheduler", SCHEDULER_ACCOUNT, client=True)
        admission = client.AdmissionregistrationV1Api(self.api)
        name = webhook_configuration("", "")["metadata"]["name"]
        current = admission.read_mutating_webhook_configuration(name)
        bundle = store.ca_bundle(self.pki / "ca")
        patch = [
            {"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
            for i in range(len(current.webhooks))
        ]
        admission.patch_mutating_webhook_configuration(name, patch)
        if self.extender_tls and scheduler_files() != before:
            self.cluster.restart("gpu-scheduler")
            return True
        return False

    def start_schedulers(self) -> None:
        self.cluster.start_scheduler("default-scheduler", DEFAULT_SCHEDULER_CONFIG)
        if self.scheduling == "plugins":
            binary = plugins_scheduler(self.cluster.minor)
            args = plugins_scheduler_flags(self.cluster.minor)
            self.cluster.start_scheduler("gpu-scheduler", plugins_config(), binary, args)
            return
        client = self.pki / "scheduler" if self.extender_tls else None
        self.cluster.start_scheduler(
            "gpu-scheduler", scheduler_config(self.extender_url, client_dir=client)
        )

    def start_agent(
        self,
        node: str,
        fake_gpus: Path,
        *,
        interval: str = "2s",
        heartbeat_interval: str = "5m",
        extra: list[str] | None = None,
        capacity: bool = True,
        kubeconfig: Path | None = None,
        owner: tuple[str, str] | None = None,
    ) -> Process:
        """An agent for ``node`` (``kubeconfig``: another identity than the admin's,
        e.g. the agent's ServiceAccount through a bound token). The lab's agents are
        processes, not pods: each is given a stand-in Pod bound to its node (or
        ``owner``, the (name, uid) of one the caller made) to own its heartbeat Lease,
        as the DaemonSet's pod does; deleting that pod deletes the Lease."""
        port = free_port()
        name, uid = owner or self.agent_pod(node)
        return self.cluster.spawn(
            f"agent-{node}",
            [
                *CLI,
                "agent",
                f"--node-name={node}",
                f"--fake-gpus={fake_gpus}",
                f"--kubeconfig={kubeconfig or self.cluster.kubeconfig}",
                f"--interval={interval}",
                f"--heartbeat-interval={heartbeat_interval}",
                f"--port={port}",
                f"--pod-namespace={NAMESPACE}",
                f"--pod-name={name}",
                f"--pod-uid={uid}",
                # The lab has no device plugin: the agent advertises the capacity.
                *(["--capacity"] if capacity else []),
                *(extra or []),
            ],
        )

    def agent_pod(self, node: str) -> tuple[str, str]:
        """A stand-in for the agent DaemonSet's pod on ``node`` (pause, never run by
        the lab): (name, uid). Made again if one of that name exists."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(self.cluster.api_client())
        try:
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        except ApiException as exc:
            if exc.status != 409:
                raise
        name = f"gpu-scheduler-agent-{node}"[:63].rstrip("-.")
        body = {
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "lab-agent"}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}],
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 0,
            },
        }
        try:
            pod = core.create_namespaced_pod(NAMESPACE, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            time.sleep(0.5)
            pod = core.create_namespaced_pod(NAMESPACE, body)
        return name, pod.metadata.uid

    def stop(self) -> None:
        if self.shim is not None:
            self.shim.stop()
        self.cluster.stop()


@contextlib.contextmanager
def bare_stack(prefix: str) -> Iterator[tuple[Stack, Any]]:
    """A control plane in a temporary folder, nothing of ours started yet: the
    benchmarks' starting point. Yields the stack and a CoreV1Api; stops everything."""
    from kubernetes import client

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        stack = Stack(start_control_plane(work / "cluster"), work)
        try:
            stack.api = stack.cluster.api_client()
            yield stack, client.CoreV1Api(stack.api)
        finally:
            stack.stop()


def start_stack(
    workdir: Path,
    *,
    extender_config: dict[str, Any] | None = None,
    real_node: bool = False,
    binary: Path | None = None,
    apiserver_args: tuple[str, ...] = (),
    gates: tuple[str, ...] | None = None,
    scheduling: str = "extender",
) -> Stack:
    """Control plane, kubelet shim, extender, webhook (registered) and both schedulers,
    with TLS where the install has it: the webhook's serving certificate, and the
    extender's, whose verbs need kube-scheduler's client certificate. ``binary``: the
    control plane of another minor (:func:`lab.controlplane.find_binary`);
    ``apiserver_args`` and ``gates``: as :func:`lab.controlplane.start_control_plane`;
    ``scheduling``: :attr:`Stack.scheduling`."""
    started = time.monotonic()
    cluster = start_control_plane(
        workdir, binary, real_node=real_node, apiserver_args=apiserver_args, gates=gates
    )
    stack = Stack(cluster, workdir, scheduling=scheduling)
    try:
        stack.api = cluster.api_client()
        stack.shim = KubeletShim(stack.api).start()
        log.info("control plane up", extra={"seconds": round(time.monotonic() - started, 1)})
        stack.start_extender(extender_config, tls=True)
        stack.start_webhook()
        stack.register_webhook()
        stack.start_schedulers()
        log.info("stack up", extra={"seconds": round(time.monotonic() - started, 1)})
    except BaseException:
        stack.stop()
        raise
    return stack
