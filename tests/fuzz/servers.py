"""The real servers a campaign runs against, and the valid bodies it starts from."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import requests

from gpu_scheduler import contract
from tests import fake_extender
from tests.factories import admission_review, make_node, make_pod
from tests.fuzz.harness import Target
from tests.helpers import free_port, running, tail, wait_for, webhook_command

H100 = dict(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
NODE_NAMES = ("fuzz-a", "fuzz-b", "fuzz-c")


def base_pod() -> dict[str, Any]:
    """A GPU pod that exercises every field the extender and the webhook read."""
    pod = make_pod(
        "fuzz",
        2,
        namespace="ml",
        annotations={
            contract.ANN_MIN_GPU_MEMORY: "40Gi",
            contract.ANN_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3,NVIDIA-A100-SXM4-80GB",
            contract.ANN_PLACEMENT: "binpack",
            contract.ANN_SPOT: "prefer",
            contract.ANN_GROUP: "job",
        },
    )
    spec = pod["spec"]
    spec["initContainers"] = [
        {
            "name": "side",
            "restartPolicy": "Always",
            "resources": {"limits": {contract.RESOURCE_GPU: "1"}},
        }
    ]
    # A second container asks a share of one GPU: the share fields are fuzzed too.
    spec["containers"].append(
        {"name": "infer", "resources": {"limits": {contract.RESOURCE_GPU_MEMORY: "20"}}}
    )
    spec["overhead"] = {"cpu": "100m", contract.RESOURCE_GPU: "0"}
    spec["tolerations"] = [{"key": "example.com/pool", "operator": "Exists"}]
    del spec["schedulerName"]
    return pod


def base_nodes() -> list[dict[str, Any]]:
    nodes = [
        make_node(NODE_NAMES[0], 8, zone="z1", capacity_type="SPOT", **H100),
        make_node(NODE_NAMES[1], 4, zone="z2", **H100),
        make_node(NODE_NAMES[2], 4, zone="z1", karpenter="on-demand", **H100),
    ]
    # The last shares its GPUs: the sharing label, gpu-memory allocatable, the agent's
    # per-GPU annotation and its shares report, each fuzzed like the rest.
    shared = nodes[2]
    shared["metadata"]["labels"][contract.LABEL_GPU_SHARING] = "mps"
    shared["status"]["allocatable"][contract.RESOURCE_GPU_MEMORY] = "316"
    gpus = [
        {"uuid": f"GPU-f{i}", contract.GPU_MEMORY_MIB: H100["memory_mib"], "healthy": True}
        for i in range(4)
    ]
    shared["metadata"]["annotations"][contract.ANN_GPUS] = json.dumps(gpus)
    report = {"GPU-f0": {"ml/other": 20, "ml/whole": "whole"}}
    shared["metadata"]["annotations"][contract.ANN_GPU_SHARES] = json.dumps(report)
    return nodes


def names_body() -> dict[str, Any]:
    return {"Pod": base_pod(), "Nodes": None, "NodeNames": list(NODE_NAMES)}


def preempt_body() -> dict[str, Any]:
    """kube-scheduler's preempt call (``nodeCacheCapable``): a victim on each node, by
    UID."""
    victims = {
        name: {"Pods": [{"UID": f"uid-{name}"}], "NumPDBViolations": 0} for name in NODE_NAMES
    }
    return {"Pod": base_pod(), "NodeNameToMetaVictims": victims}


def review_body() -> dict[str, Any]:
    return admission_review(base_pod(), uid="b7bb6a4f-0000-4000-8000-000000000001", namespace="ml")


@contextlib.contextmanager
def extender_fake_cluster(
    workdir: Path,
    workers: int = 1,
    *extra: str,
    nodes: Sequence[dict[str, Any]] | None = None,
    pods: Sequence[dict[str, Any]] = (),
) -> Iterator[tuple[str, int, Path]]:
    """``gpu-scheduler extender`` whose cache lists ``nodes`` (default:
    :func:`base_nodes`) and ``pods`` from a fake API (tests/fake_extender.py): (url,
    master pid, log). The process must still be running when the block ends."""
    port = free_port()
    log = workdir / f"extender-{port}.log"
    cluster = workdir / f"cluster-{port}.json"
    nodes = base_nodes() if nodes is None else nodes
    cluster.write_text(json.dumps({"nodes": nodes, "pods": pods}))
    cmd = [
        sys.executable,
        "-m",
        "tests.fake_extender",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--workers={workers}",
        *extra,
    ]
    tls = any(arg.startswith("--tls-cert-dir") for arg in extra)
    with running(cmd, log, env={fake_extender.ENV: str(cluster)}) as proc:
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        _wait_up(url + "/healthz", log, not tls)
        yield url, proc.pid, log
        assert proc.poll() is None, tail(log)


@contextlib.contextmanager
def webhook(workdir: Path, workers: int = 2) -> Iterator[tuple[str, int, Path, str]]:
    """``gpu-scheduler webhook`` over TLS: (url, master pid, log, CA file)."""
    from certs import build, store

    cert_dir = workdir / "webhook-certs"
    store.generate(
        cert_dir, build.service_identity("gpu-scheduler-webhook", "gpu-scheduler", ["127.0.0.1"])
    )
    port = free_port()
    log = workdir / "webhook.log"
    ca = str(cert_dir / store.CA_CERT)
    with running(webhook_command(port, cert_dir, f"--workers={workers}"), log) as proc:
        url = f"https://127.0.0.1:{port}"
        _wait_up(url + "/readyz", log, ca)
        yield url, proc.pid, log, ca


def _wait_up(url: str, log: Path, verify: str | bool) -> None:
    try:
        wait_for(lambda: requests.get(url, timeout=1, verify=verify).ok, 40, url, interval=0.2)
    except TimeoutError:
        raise AssertionError(tail(log)) from None


def extender_targets(
    url: str, pid: int, log: Path, where: str, client: dict[str, Any] | None = None
) -> list[Target]:
    """The extender's verbs, named for ``where`` its cache lists from (``cluster``, a
    control plane; ``fake API``). ``client``: ``requests`` TLS arguments (``cert``,
    ``verify``) for an HTTPS extender."""
    tls = client or {}
    return [
        Target(
            f"/{verb} ({where})",
            f"{url}/{verb}",
            preempt_body() if verb == "preempt" else names_body(),
            pid,
            log,
            verify=tls.get("verify", True),
            cert=tls.get("cert"),
        )
        for verb in ("filter", "prioritize", "preempt")
    ]


def webhook_target(url: str, pid: int, log: Path, ca: str) -> Target:
    return Target("/mutate", f"{url}/mutate", review_body(), pid, log, verify=ca)
