"""A real Kubernetes control plane on 127.0.0.1, for the end-to-end tests and the demo.

etcd, kube-apiserver and kube-controller-manager (and the kube-schedulers the tests
start) run from the one binary that ``make controlplane`` builds from the Kubernetes Go
modules (``tools/k8s``). There is no kubelet: nodes are Node objects created through
the API (:mod:`lab.kubelet_shim`). Every process is started here and stopped by its
process group; each one's log stays in the work directory.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import logging
import os
import signal
import subprocess
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.processes import (
    ControlPlaneError,
    Process,
    clean_env,
    free_port,
    wait_port,
    wait_url,
)

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
BINARY_ENV = "GPU_SCHEDULER_K8S_BIN"
ADMIN_TOKEN = "gpu-scheduler-local-admin"  # a throwaway cluster on loopback only
# The apiserver wants a non-loopback address to publish in the `kubernetes` Service's
# endpoints. TEST-NET-1 (RFC 5737) is reserved for documentation: nothing is ever
# sent there, the apiserver only writes it into an Endpoints object.
ADVERTISE_ADDRESS = "192.0.2.10"
CONTROLLERS = (
    "daemonset",
    "replicaset",
    "deployment",
    "namespace",
    "garbagecollector",
    # batch/Job: the pods of the Jobs Kueue admits (lab.kueue).
    "job",
    "serviceaccount",
    "serviceaccount-token",
    # DRA: frees the devices of a finished pod's claims (kube-scheduler allocates them).
    "resourceclaim-controller",
    # PodDisruptionBudgets' status (the disruptions allowed), which preemption weighs.
    "disruption",
)
# With a real node (lab.realnode): pods' kube-root-ca.crt, and the endpoints the API
# server's webhook calls are routed to (--enable-aggregator-routing).
REAL_NODE_CONTROLLERS = ("root-ca-cert-publisher", "endpointslice", "endpoint")


BUILD_SCRIPT = ROOT / "tools" / "k8s" / "build.sh"


def build_path(minor: str | None = None) -> Path | None:
    """Where ``tools/k8s/build.sh`` builds the control plane of ``minor`` (``"1.34"``;
    None: the newest supported), if that build is there. The script is the one place
    that knows the folder's name (version and a hash of the module's files)."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--path", *([minor] if minor else [])],
        capture_output=True,
        text=True,
        check=False,
    )
    path = Path(done.stdout.strip()) if done.returncode == 0 else None
    return path if path is not None and path.is_file() else None


def supported_minors() -> list[str]:
    """The Kubernetes minors the lab builds, oldest first (``tools/k8s/build.sh``)."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--minors"], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def find_binary(minor: str | None = None) -> Path | None:
    """The control-plane binary under test: that of ``minor`` when one is named; else
    $GPU_SCHEDULER_K8S_BIN (``make e2e K8S_MINOR=...`` points it at any supported
    minor), else the newest minor's build, else the newest build in .cache/."""
    if minor is not None:
        return build_path(minor)
    env = os.environ.get(BINARY_ENV)
    if env and Path(env).is_file():
        return Path(env)
    built = build_path()
    if built is not None:
        return built
    builds = sorted(glob.glob(str(ROOT / ".cache" / "k8s" / "*" / "k8s")), key=os.path.getmtime)
    return Path(builds[-1]) if builds else None


def binary_minor(binary: Path) -> int:
    """The Kubernetes minor a control-plane binary was built from (``k8s version``)."""
    done = subprocess.run([str(binary), "version"], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().split(".")[1])


def feature_gates(minor: int) -> tuple[str, ...]:
    """Gates the lab turns on where a minor has them off by default: DRA's mapping of an
    extended resource (``nvidia.com/gpu``) to a DeviceClass, alpha in 1.34 and 1.35 and
    on by default from 1.36; and from 1.37, where it is beta (off by default), the
    Workload / PodGroup API and kube-scheduler's gang scheduling (``GenericWorkload``).
    A cluster that wants either turns it on the same way, in the API server and the
    scheduler (see :func:`runtime_config` for the API version it also serves)."""
    if minor < 36:
        return ("DRAExtendedResource=true",)
    return ("GenericWorkload=true",) if minor >= GANG_MINOR else ()


GANG_MINOR = 37  # the first minor whose gang scheduling (GenericWorkload) the lab runs


def runtime_config(gates: tuple[str, ...]) -> tuple[str, ...]:
    """kube-apiserver API versions the lab serves beyond the defaults: with
    ``GenericWorkload`` on, ``scheduling.k8s.io/v1beta1`` (PodGroup, Workload), a beta
    API and so off unless named, even with its feature gate on."""
    on = "GenericWorkload=true" in gates
    return ("--runtime-config=scheduling.k8s.io/v1beta1=true",) if on else ()


def tools_binary() -> Path | None:
    """The newest minor's build, which alone carries helm (a client, used against a
    control plane of any supported minor)."""
    return build_path() or find_binary()


@dataclass
class LocalCluster:
    """A running control plane. Use :func:`start_control_plane`, then :meth:`stop`."""

    workdir: Path
    binary: Path
    api_port: int
    kubeconfig: Path
    ca_file: Path
    processes: dict[str, Process] = field(default_factory=dict)
    etcd_port: int = 0
    real_node: bool = False
    minor: int = 0  # the Kubernetes minor of ``binary``
    gates: tuple[str, ...] = ()  # --feature-gates of every component (feature_gates())

    def gate_flags(self) -> list[str]:
        return [f"--feature-gates={','.join(self.gates)}"] if self.gates else []

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def spawn(
        self,
        name: str,
        args: list[str],
        env: Mapping[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> Process:
        """Start a process in its own session, logging to ``<workdir>/logs/<name>.log``."""
        if name in self.processes and self.processes[name].alive():
            raise ControlPlaneError(f"{name} is already running")
        log_path = self.workdir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as handle:
            popen = subprocess.Popen(
                args,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**clean_env(), **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        proc = Process(name, popen, log_path, list(args), env)
        self.processes[name] = proc
        log.info("started", extra={"component": name, "pid": popen.pid, "log": str(log_path)})
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process (its whole group) and wait for it to go."""
        proc = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, sig)
        proc.popen.wait(30)

    def respawn(self, name: str) -> Process:
        """Start a stopped process again with the arguments it had."""
        old = self.processes.pop(name)
        if old.alive():
            raise ControlPlaneError(f"{name} is still running")
        proc = self.spawn(name, old.args, old.env)
        if name == "kube-apiserver":
            wait_url(f"{self.server}/readyz", 120, proc, ca_file=self.ca_file, token=ADMIN_TOKEN)
        return proc

    def kubeconfig_via(self, host_port: str) -> Path:
        """A kubeconfig for the same admin, reaching the API server at ``host_port``
        (a proxy on 127.0.0.1: the serving certificate names 127.0.0.1)."""
        path = self.workdir / f"kubeconfig-{host_port.replace(':', '-')}"
        _write_kubeconfig(path, f"https://{host_port}", self.ca_file, ADMIN_TOKEN)
        return path

    def kubeconfig_with_token(self, name: str, token: str) -> Path:
        """A kubeconfig named ``name`` that authenticates with ``token`` (e.g. a
        service-account token from a TokenRequest)."""
        path = self.workdir / f"kubeconfig-{name}"
        _write_kubeconfig(path, self.server, self.ca_file, token)
        return path

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what the API server does
        every five minutes); returns that revision. Watches from before it get 410."""
        import base64
        import json

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.etcd_port}{path}",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())

        key = base64.b64encode(b"/").decode()
        revision = int(post("/v3/kv/range", {"key": key, "limit": 1})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def restart(self, name: str) -> Process:
        """Stop a process (SIGTERM, as a rollout does) and start it with the same
        arguments."""
        old = self.processes[name]
        old.stop()
        del self.processes[name]
        return self.spawn(name, old.args, old.env)

    def stop_process(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop()

    def stop(self) -> None:
        # Reverse start order: our components, schedulers and controllers, then the
        # apiserver, etcd last.
        for name in reversed(list(self.processes)):
            self.stop_process(name)

    def failures(self) -> str:
        """Tails of the logs of every process, for a failed test's report."""
        parts = []
        for proc in self.processes.values():
            state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"--- {proc.name} ({state}) {proc.log_path}\n{proc.tail()}")
        return "\n".join(parts)

    def k8s(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """Run a component of the binary (e.g. ``kubectl``; ``helm`` from the newest
        minor's build) against this cluster."""
        cmd = [str(self.binary), *args]
        if args and args[0] == "kubectl":
            cmd = [str(self.binary), "kubectl", f"--kubeconfig={self.kubeconfig}", *args[1:]]
        elif args and args[0] == "helm":
            cmd = [str(tools_binary() or self.binary), "helm", f"--kubeconfig={self.kubeconfig}"]
            cmd += args[1:]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=ROOT
        )
        if check and done.returncode != 0:
            raise ControlPlaneError(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout + done.stderr

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def start_scheduler(
        self,
        name: str,
        config: Mapping[str, Any],
        binary: Path | None = None,
        args: Sequence[str] = (),
    ) -> Process:
        """A kube-scheduler with this KubeSchedulerConfiguration (v1), leader election off;
        ``binary``: another kube-scheduler of this minor (:func:`plugins_scheduler`);
        ``args``: more flags."""
        cfg = accepted_by(config, self.minor)
        # The lab's kubeconfig; a qps/burst the config sets (benchmarks) is kept.
        connection = {**cfg.get("clientConnection", {}), "kubeconfig": str(self.kubeconfig)}
        cfg["clientConnection"] = connection
        cfg["leaderElection"] = {"leaderElect": False}
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        port = free_port()
        proc = self.spawn(
            name,
            [
                *([str(self.binary), "kube-scheduler"] if binary is None else [str(binary)]),
                f"--config={path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                *self.gate_flags(),
                *args,
                "-v=2",
            ],
        )
        wait_url(f"https://127.0.0.1:{port}/healthz", 60, proc, insecure=True)
        return proc


def plugins_scheduler(minor: int) -> Path:
    """kube-scheduler of 1.``minor`` with gpu-scheduler's framework plugins, as
    ``tools/k8s/build.sh plugins 1.<minor>`` builds it (``make test`` does)."""
    build = ROOT / "tools" / "k8s" / "build.sh"
    done = subprocess.run(
        [str(build), "--path", "plugins", f"1.{minor}"], capture_output=True, text=True, check=True
    )
    path = Path(done.stdout.strip())
    if not path.exists():
        raise FileNotFoundError(f"{path}: run tools/k8s/build.sh plugins 1.{minor}")
    return path


#: The first minor whose KubeSchedulerConfiguration has ``plugins.podGroupPostFilter``.
POD_GROUP_POST_FILTER_MINOR = 37


def accepted_by(config: Mapping[str, Any], minor: int) -> dict[str, Any]:
    """``config`` as this minor's kube-scheduler decodes it (strictly): without the
    extension points it does not know (deploy/'s config is the newest minor's; the
    chart renders them by the scheduler's minor the same way)."""
    cfg = copy.deepcopy(dict(config))
    if minor >= POD_GROUP_POST_FILTER_MINOR:
        return cfg
    for profile in cfg.get("profiles") or []:
        plugins = profile.get("plugins")
        if isinstance(plugins, dict):
            plugins.pop("podGroupPostFilter", None)
            if not plugins:
                del profile["plugins"]
    return cfg


def _write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def start_control_plane(
    workdir: Path,
    binary: Path | None = None,
    *,
    real_node: bool = False,
    apiserver_args: tuple[str, ...] = (),
    gates: tuple[str, ...] | None = None,
) -> LocalCluster:
    """etcd, kube-apiserver and kube-controller-manager, ready to use.

    ``apiserver_args``: more kube-apiserver flags, as a managed cloud sets its own
    (``--runtime-config=resource.k8s.io/v1=false``, an admission configuration file).
    ``gates``: every component's feature gates, instead of :func:`feature_gates`'.

    ``real_node``: ready for :func:`lab.realnode.start_real_node`: the API server also
    listens on the pods' bridge, its certificate names the ``kubernetes`` Service IP,
    and it calls webhooks at their pods' addresses.

    Schedulers are started separately (:meth:`LocalCluster.start_scheduler`), each
    with its own configuration. On failure everything started is stopped again.
    """
    from cryptography.hazmat.primitives import serialization

    from certs import build, store

    binary = binary or find_binary()
    if binary is None:
        raise ControlPlaneError("no control-plane binary: run `make controlplane`")
    workdir.mkdir(parents=True, exist_ok=True)
    pki = workdir / "pki"
    from lab import realnode

    addresses = ["127.0.0.1", *((realnode.SERVICE_IP, realnode.GATEWAY) if real_node else ())]
    store.generate(pki, build.service_identity("kubernetes", "default", addresses))
    if real_node:  # the API server's client certificate for the kubelet (logs, exec)
        kubelet_client = build.service_identity("kube-apiserver", "default")
        store.generate(pki / "kubelet-client", kubelet_client, ca_dir=pki, client=True)
    sa_key = build.new_key()
    store.write_private(pki / "sa.key", build.key_pem(sa_key))
    store.write_public(
        pki / "sa.pub",
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    tokens = workdir / "tokens.csv"
    tokens.write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n')
    tokens.chmod(0o600)
    api_port = free_port()
    cluster = LocalCluster(workdir, binary, api_port, workdir / "kubeconfig", pki / store.CA_CERT)
    cluster.real_node = real_node
    cluster.minor = binary_minor(binary)
    cluster.gates = feature_gates(cluster.minor) if gates is None else gates
    _write_kubeconfig(cluster.kubeconfig, cluster.server, cluster.ca_file, ADMIN_TOKEN)
    try:
        _start_core(cluster, pki, tokens, apiserver_args)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_core(
    cluster: LocalCluster, pki: Path, tokens: Path, apiserver_args: tuple[str, ...]
) -> None:
    binary, workdir = str(cluster.binary), cluster.workdir
    etcd_port, peer_port = free_port(), free_port()
    cluster.etcd_port = etcd_port
    etcd = cluster.spawn(
        "etcd",
        [
            binary,
            "etcd",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )
    wait_port(etcd_port, 60, etcd)
    apiserver = cluster.spawn(
        "kube-apiserver",
        [
            binary,
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            # A real node's pods reach it on the bridge (lab.realnode); else loopback only.
            f"--bind-address={'0.0.0.0' if cluster.real_node else '127.0.0.1'}",
            f"--secure-port={cluster.api_port}",
            f"--enable-aggregator-routing={str(cluster.real_node).lower()}",
            "--kubelet-preferred-address-types=InternalIP",
            *(
                [
                    f"--kubelet-client-certificate={pki / 'kubelet-client' / 'tls.crt'}",
                    f"--kubelet-client-key={pki / 'kubelet-client' / 'tls.key'}",
                ]
                if cluster.real_node
                else []
            ),
            f"--advertise-address={ADVERTISE_ADDRESS}",
            f"--tls-cert-file={pki / 'tls.crt'}",
            f"--tls-private-key-file={pki / 'tls.key'}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            # New nodes would be tainted not-ready until a node-lifecycle controller
            # saw a kubelet's heartbeat; there is no kubelet here, nodes are born Ready.
            "--disable-admission-plugins=TaintNodesByCondition",
            f"--client-ca-file={cluster.ca_file}",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "-v=1",
            *cluster.gate_flags(),
            *runtime_config(cluster.gates),
            *apiserver_args,
        ],
    )
    wait_url(
        f"{cluster.server}/readyz",
        120,
        apiserver,
        ca_file=cluster.ca_file,
        token=ADMIN_TOKEN,
    )
    controllers = CONTROLLERS + (REAL_NODE_CONTROLLERS if cluster.real_node else ())
    cluster.spawn(
        "kube-controller-manager",
        [
            binary,
            "kube-controller-manager",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--authentication-kubeconfig={cluster.kubeconfig}",
            f"--authorization-kubeconfig={cluster.kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={cluster.ca_file}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--concurrent-deployment-syncs=2",
            *cluster.gate_flags(),
            "-v=1",
        ],
    )
