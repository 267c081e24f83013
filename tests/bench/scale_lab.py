"""A big lab, quickly: thousands of GPU nodes and tens of thousands of pods already
bound to them, on the local control plane, for the memory and relist benches.

    .venv/bin/python tests/bench/scale_lab.py [--nodes 5000] [--pods 50000] [--keep]

Nodes are the GPU nodes of :mod:`tests.bench.e2e_throughput` (8 GPUs, tainted). Pods
are created with ``spec.nodeName`` set (bulk binding: no scheduler runs) and are of
realistic content, as a Deployment's pod in a busy cluster: three containers (an init
container, the app, a sidecar), env vars, volumes and mounts, a probe, labels and
annotations (no owner reference: the lab's garbage collector would delete pods whose
owner does not exist); about 1/3 of them limit ``nvidia.com/gpu``, the rest are CPU
pods. As the API server lists them (``managedFields`` included, defaults and
the service-account token volume added) each is about :data:`POD_BYTES` of JSON.

Creation is raw HTTP POSTs of compact JSON from a thread pool, one keep-alive
connection per thread (the kubernetes client adds nothing but Python overhead here),
spread over a few namespaces; 429s and 5xx are retried. The lab's API server runs
without priority and fairness, so the only server-side cap is its
--max-mutating-requests-inflight (200), far above the pool.

5,000 nodes and 50,000 pods took 756 s to create (nodes 29 s, pods 727 s: 69 pods/s)
on the 2-core development machine shared with other jobs (load ~11); quieter, the
same machine made ~300 pods/s. The rate was the same with 4, 16 or 64 threads and no
request was refused: the CPU of the API server and etcd bounds it, not max-in-flight.

``--keep`` leaves the control plane running (its kubeconfig is printed) until Ctrl-C or
SIGTERM: ``relist_memory.py --kubeconfig`` can then measure against it again and again.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpu_scheduler import contract  # noqa: E402

#: What one pod weighs as the API server lists it (JSON, managedFields included):
#: :func:`pod_object`'s pods measured 9,381 bytes each on the lab's 1.37 control plane
#: (:func:`listed_pod_bytes`), of which ~4.1 KB are managedFields.
POD_BYTES = 9381
NAMESPACES = 4
#: Every GPU_EVERY-th pod limits nvidia.com/gpu; the others are CPU pods.
GPU_EVERY = 3
GPU_SIZES = (1, 1, 2, 4, 1, 2, 8, 1)
NODE_PREFIX = "scale-node-"
POD_PREFIX = "scale-pod-"
NAMESPACE_PREFIX = "scale-"
APPS = ("trainer", "inference", "ingest", "feature-store", "notebook", "etl", "ranker")
TEAMS = ("search", "ads", "vision", "speech", "platform")


def namespace_name(index: int) -> str:
    return f"{NAMESPACE_PREFIX}{index % NAMESPACES}"


def node_name(index: int) -> str:
    return f"{NODE_PREFIX}{index:05d}"


def pod_name(index: int) -> str:
    return f"{POD_PREFIX}{index:06d}"


def pod_gpus(index: int) -> int:
    """GPUs pod ``index`` limits: 0 for CPU pods, else one of :data:`GPU_SIZES`."""
    if index % GPU_EVERY:
        return 0
    return GPU_SIZES[(index // GPU_EVERY) % len(GPU_SIZES)]


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def pod_object(index: int, node: str, namespace: str | None = None) -> dict[str, Any]:
    """Pod ``index`` bound to ``node``: deterministic, about :data:`POD_BYTES` once
    the API server has added its defaults and managedFields."""
    namespace = namespace or namespace_name(index)
    app = APPS[index % len(APPS)]
    team = TEAMS[index % len(TEAMS)]
    gpus = pod_gpus(index)
    template_hash = _digest(app, team)[:10]
    config_map = f"{app}-{team}-config"
    env = [
        {"name": "APP_NAME", "value": app},
        {"name": "TEAM", "value": team},
        {"name": "LOG_LEVEL", "value": "info"},
        {
            "name": "OTEL_EXPORTER_OTLP_ENDPOINT",
            "value": "http://otel-collector.observability:4317",
        },
        {"name": "MODEL_BUCKET", "value": f"s3://ml-models-{team}/{app}/current"},
        {"name": "WORKERS", "value": str(2 + index % 7)},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {
            "name": "DB_PASSWORD",
            "valueFrom": {"secretKeyRef": {"name": f"{app}-db", "key": "password"}},
        },
    ]
    mounts = [
        {"name": "config", "mountPath": "/etc/app", "readOnly": True},
        {"name": "cache", "mountPath": "/var/cache/app"},
        {"name": "tls", "mountPath": "/etc/tls", "readOnly": True},
    ]
    resources: dict[str, Any] = {
        "requests": {"cpu": f"{1 + index % 8}", "memory": f"{4 + index % 28}Gi"},
        "limits": {"cpu": f"{2 + index % 8}", "memory": f"{8 + index % 28}Gi"},
    }
    if gpus:
        resources["limits"][contract.RESOURCE_GPU] = str(gpus)
    probe = {
        "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
        "initialDelaySeconds": 10,
        "periodSeconds": 10,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
    }
    main = {
        "name": app,
        "image": f"registry.example.com/{team}/{app}:v{1 + index % 5}.{index % 13}.0",
        "command": ["/usr/local/bin/entrypoint"],
        "args": ["--config=/etc/app/config.yaml", "--port=8080", "--metrics-port=9090"],
        "ports": [
            {"name": "http", "containerPort": 8080, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
        ],
        "env": env,
        "envFrom": [{"configMapRef": {"name": config_map}}],
        "resources": resources,
        "volumeMounts": mounts,
        "livenessProbe": probe,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    sidecar = {
        "name": "log-shipper",
        "image": "registry.example.com/platform/log-shipper:2.4.1",
        "args": ["--input=/var/log/app", "--output=otlp://otel-collector.observability:4317"],
        "env": [{"name": "SHIPPER_TAGS", "value": f"team={team},app={app}"}],
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        },
        "volumeMounts": [{"name": "cache", "mountPath": "/var/log/app", "subPath": "logs"}],
    }
    init = {
        "name": "fetch-model",
        "image": "registry.example.com/platform/fetcher:1.9.0",
        "args": ["--from=$(MODEL_BUCKET)", "--to=/var/cache/app/model"],
        "env": [{"name": "MODEL_BUCKET", "value": f"s3://ml-models-{team}/{app}/current"}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": [{"name": "cache", "mountPath": "/var/cache/app"}],
    }
    tolerations = [
        {"key": "dedicated", "operator": "Equal", "value": team, "effect": "NoSchedule"},
    ]
    if gpus:
        tolerations.append(
            {"key": contract.RESOURCE_GPU, "operator": "Exists", "effect": "NoSchedule"}
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(index),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": app,
                "app.kubernetes.io/instance": f"{app}-{team}",
                "app.kubernetes.io/part-of": f"{team}-platform",
                "app.kubernetes.io/managed-by": "helm",
                "team": team,
                "pod-template-hash": template_hash,
                "workload-class": "gpu" if gpus else "cpu",
            },
            "annotations": {
                "checksum/config": _digest("config", app, team),
                "checksum/secrets": _digest("secrets", app, team),
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
                "prometheus.io/path": "/metrics",
                "kubectl.kubernetes.io/default-container": app,
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
            },
            # No ownerReferences: the lab's garbage collector would delete pods whose
            # owner does not exist.
        },
        "spec": {
            "nodeName": node,
            "priorityClassName": "",
            "terminationGracePeriodSeconds": 30,
            "serviceAccountName": "default",
            "securityContext": {"fsGroup": 2000, "runAsUser": 1000, "runAsGroup": 3000},
            "initContainers": [init],
            "containers": [main, sidecar],
            "volumes": [
                {"name": "config", "configMap": {"name": config_map, "defaultMode": 420}},
                {"name": "cache", "emptyDir": {"sizeLimit": "20Gi"}},
                {"name": "tls", "secret": {"secretName": f"{app}-tls", "defaultMode": 256}},
            ],
            "tolerations": tolerations,
        },
    }


def gpu_node(index: int) -> dict[str, Any]:
    from tests.bench.e2e_throughput import gpu_node as throughput_node

    return throughput_node(node_name(index))


def pod_body(pod: dict[str, Any]) -> bytes:
    """``pod_object`` without the empty fields the API server would drop."""
    if not pod["spec"].get("priorityClassName"):
        pod["spec"].pop("priorityClassName", None)
    return json.dumps(pod, separators=(",", ":")).encode()


# --- HTTP ---------------------------------------------------------------------------
@dataclass
class Target:
    """Where and how to reach the API server (taken from a kubernetes ApiClient)."""

    host: str
    port: int
    headers: dict[str, str]
    context: ssl.SSLContext

    @classmethod
    def from_core(cls, core: Any) -> Target:
        cfg = core.api_client.configuration
        url = urllib.parse.urlsplit(cfg.host)
        context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "scale-lab",
        }
        token = cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix(
            "BearerToken"
        )
        if token:
            headers["Authorization"] = token
        return cls(url.hostname or "127.0.0.1", url.port or 443, headers, context)


class Poster:
    """POSTs from a thread pool, one keep-alive connection per thread; retries 429 and
    5xx (and a dropped connection) a few times, 409 AlreadyExists counts as done."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._local = threading.local()
        self.retries = 0

    def _connection(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(
                self.target.host, self.target.port, context=self.target.context, timeout=60
            )
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        for attempt in range(8):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=self.target.headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                self.retries += 1
                time.sleep(0.2 * (attempt + 1))
                continue
            if response.status == 429 or response.status >= 500:
                self.retries += 1
                time.sleep(float(response.getheader("Retry-After") or 0.2 * (attempt + 1)))
                continue
            return response.status, data
        raise RuntimeError(f"{method} {path}: gave up after 8 attempts")

    def create(self, path: str, body: bytes) -> None:
        status, data = self.request("POST", path, body)
        if status not in (200, 201, 409):
            raise RuntimeError(f"POST {path}: {status} {data[:300]!r}")


def _run(pool: ThreadPoolExecutor, poster: Poster, jobs: Iterable[tuple[str, bytes]]) -> int:
    done = 0
    for _ in pool.map(lambda job: poster.create(*job), jobs):
        done += 1
    return done


def _pod_jobs(pods: int, nodes: int) -> Iterator[tuple[str, bytes]]:
    for i in range(pods):
        namespace = namespace_name(i)
        body = pod_body(pod_object(i, node_name(i % nodes), namespace))
        yield f"/api/v1/namespaces/{namespace}/pods", body


def wait_service_accounts(poster: Poster, timeout: float = 60) -> None:
    """The ServiceAccount admission plugin refuses pods until the namespace's
    ``default`` ServiceAccount exists (the controller-manager makes it)."""
    deadline = time.monotonic() + timeout
    for index in range(NAMESPACES):
        path = f"/api/v1/namespaces/{namespace_name(index)}/serviceaccounts/default"
        while poster.request("GET", path)[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no default ServiceAccount in {namespace_name(index)}")
            time.sleep(0.2)


@dataclass
class Built:
    nodes: int
    pods: int
    node_seconds: float
    pod_seconds: float
    threads: int
    retries: int

    @property
    def seconds(self) -> float:
        return self.node_seconds + self.pod_seconds

    def summary(self) -> str:
        return (
            f"created {self.nodes} nodes in {self.node_seconds:.1f}s and {self.pods} pods in "
            f"{self.pod_seconds:.1f}s ({self.pods / max(self.pod_seconds, 1e-9):.0f} pods/s, "
            f"{self.threads} threads, {self.retries} retries): {self.seconds:.1f}s in all"
        )


def build(core: Any, nodes: int, pods: int, *, threads: int = 16, progress: bool = True) -> Built:
    """Create ``nodes`` GPU nodes and ``pods`` pods bound round-robin to them, spread
    over :data:`NAMESPACES` namespaces. ``core``: a CoreV1Api (its host, CA and token
    are used for raw POSTs). Objects that already exist are left as they are."""
    poster = Poster(Target.from_core(core))
    for index in range(NAMESPACES):
        namespace = {"apiVersion": "v1", "kind": "Namespace"}
        namespace["metadata"] = {"name": namespace_name(index)}
        poster.create("/api/v1/namespaces", json.dumps(namespace).encode())
    with ThreadPoolExecutor(threads) as pool:
        started = time.monotonic()
        _run(
            pool,
            poster,
            (
                (
                    "/api/v1/nodes",
                    json.dumps(gpu_node(i), separators=(",", ":")).encode(),
                )
                for i in range(nodes)
            ),
        )
        node_seconds = time.monotonic() - started
        if progress:
            print(f"  {nodes} nodes in {node_seconds:.1f}s", flush=True)
        wait_service_accounts(poster)
        started = time.monotonic()
        done, step = 0, max(pods // 10, 1)
        jobs = _pod_jobs(pods, nodes)
        while done < pods:
            chunk = [job for _, job in zip(range(step), jobs, strict=False)]
            done += _run(pool, poster, chunk)
            if progress:
                elapsed = time.monotonic() - started
                print(f"  {done} pods in {elapsed:.1f}s ({done / elapsed:.0f}/s)", flush=True)
        pod_seconds = time.monotonic() - started
    return Built(nodes, pods, node_seconds, pod_seconds, threads, poster.retries)


def listed_pod_bytes(core: Any, limit: int = 500) -> tuple[int, int]:
    """(bytes, count) of one page of pods as the API server lists them to a client."""
    poster = Poster(Target.from_core(core))
    status, data = poster.request("GET", f"/api/v1/pods?limit={limit}")
    if status != 200:
        raise RuntimeError(f"list pods: {status}")
    return len(data), len(json.loads(data)["items"])


def main() -> int:
    from lab.stack import bare_stack

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--keep", action="store_true", help="keep the lab up until Ctrl-C")
    opts = parser.parse_args()
    with bare_stack("scale-lab-") as (stack, core):
        built = build(core, opts.nodes, opts.pods, threads=opts.threads)
        print(built.summary())
        size, count = listed_pod_bytes(core)
        print(f"pod size as listed: {size / max(count, 1):.0f} bytes ({count} pods, {size} bytes)")
        if opts.keep:
            keep(stack.cluster.kubeconfig)
    return 0


def keep(kubeconfig: Path) -> None:
    """Wait for Ctrl-C or SIGTERM (then the caller's context stops the lab)."""
    import signal

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"kubeconfig: {kubeconfig} (Ctrl-C or SIGTERM to stop)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
