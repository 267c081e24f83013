"""Scenarios on a control plane of a test module's own: an extender (optionally behind
the fault proxy) and a kube-scheduler profile of its own, so pods pick
the scenario by ``schedulerName``. Used by the fault-injection and GPU-stack tests.
Also what the e2e tests share of GPU nodes and pods: the GPU taint, a GPU node, a pod
placed through the webhook, DRA slices and class."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from kubernetes import client

from gpu_scheduler import contract, dra
from lab.controlplane import start_control_plane
from lab.processes import Process, free_port
from lab.stack import Stack, scheduler_config
from tests.e2e.faults import Proxy
from tests.e2e.kube import create_node, create_pod, gpu_labels, pod_manifest, unique

H100 = ("NVIDIA-H100-80GB-HBM3", 81559)
TOLERATE_GPU = [dict(contract.GPU_TOLERATION)]
GPU_TAINT = [{"key": contract.RESOURCE_GPU, "value": "present", "effect": "NoSchedule"}]


# --- GPU nodes and pods on the lab's stack -------------------------------------------
def gpu_node(
    stack: Stack, case: str, gpus: int, model: tuple[str, int] = H100, **labels: str
) -> str:
    """A tainted node of ``gpus`` GPUs of ``model`` (product, MiB), labelled as GFD
    would (``labels``: more of them) and marked as the case's; its name."""
    return create_node(
        stack,
        unique(case),
        case=case,
        gpus=gpus,
        labels=gpu_labels(gpus, *model, **labels),
        taints=GPU_TAINT,
    )


def place(stack: Stack, case: str, gpus: int = 1, annotations: dict[str, str] | None = None) -> str:
    """Create a pod of the case asking for ``gpus`` GPUs; its name (the webhook must have
    routed it to our scheduler)."""
    name = unique("pod")
    pod = create_pod(stack, pod_manifest(name, gpus, case=case, annotations=annotations))
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    return name


# --- DRA: GPUs as the NVIDIA DRA driver publishes them ------------------------------
def device(i: int, product: str, mib: int) -> dict[str, Any]:
    """A GPU as the NVIDIA DRA driver publishes it (kubernetes-sigs/dra-driver-nvidia-gpu)."""
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{product[-4:]}-{i:04d}"},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper" if "H100" in product else "Ada Lovelace"},
            "cudaComputeCapability": {"version": "9.0.0" if "H100" in product else "8.9.0"},
            "driverVersion": {"version": "550.54.15"},
            "cudaDriverVersion": {"version": "12.4.0"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{16 + i:02x}:00.0"},
        },
        "capacity": {"memory": {"value": f"{mib}Mi"}},
    }


def publish_slice(
    stack: Stack,
    node: str,
    product: str,
    mib: int,
    count: int,
    taints: dict[int, list[dict[str, str]]] | None = None,
    shareable: bool = False,
) -> None:
    """A node's ResourceSlice of ``count`` GPUs; ``taints``: device index -> its device
    taints (KEP-5055: {key, value, effect}); ``shareable``: each allows multiple
    allocations (consumable capacity, KEP-5075)."""
    devices = [device(i, product, mib) for i in range(count)]
    for one in devices if shareable else ():
        one["allowMultipleAllocations"] = True
    for index, listed in (taints or {}).items():
        devices[index]["taints"] = listed
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-gpu.nvidia.com-"},
        "spec": {
            "driver": dra.NVIDIA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
    client.ResourceV1Api(stack.api).create_resource_slice(body)


def create_gpu_device_class(stack: Stack) -> None:
    """The NVIDIA DRA driver's DeviceClass, mapped to ``nvidia.com/gpu`` pods."""
    client.ResourceV1Api(stack.api).create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": "device.driver == 'gpu.nvidia.com' && "
                            "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                        }
                    }
                ],
                "extendedResourceName": contract.RESOURCE_GPU,
            },
        }
    )


def own_stack(workdir: Path, binary: Path) -> Stack:
    stack = Stack(start_control_plane(workdir / "cluster", binary), workdir)
    stack.api = stack.cluster.api_client()
    return stack


@dataclass
class Scenario:
    stack: Stack
    name: str
    profile: str
    port: int
    extender: Process
    proxy: Proxy | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> int:
        try:
            return requests.get(self.url + "/readyz", timeout=2).status_code
        except requests.RequestException:
            return 0

    def filter(self, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
        body = {"Pod": pod, "NodeNames": names}
        return requests.post(self.url + "/filter", json=body, timeout=5).json()

    def metric(self, line_start: str) -> float:
        for line in requests.get(self.url + "/metrics", timeout=5).text.splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def pod(self, gpus: int, case: str, **kw: Any) -> str:
        name = unique(self.name)
        manifest = pod_manifest(
            name, gpus, case=case, scheduler=self.profile, tolerations=TOLERATE_GPU, **kw
        )
        create_pod(self.stack, manifest)
        return name

    def node(
        self, case: str, gpus: int | None = 8, model: tuple[str, int] = H100, **annotations: str
    ) -> str:
        """A GPU node (``gpus`` None: no allocatable, as on a DRA node)."""
        labels = gpu_labels(gpus, *model) if gpus else {}
        return create_node(
            self.stack,
            unique(case),
            case=case,
            gpus=gpus,
            labels=labels,
            annotations=annotations,
            taints=GPU_TAINT,
        )


@contextlib.contextmanager
def scenario(
    stack: Stack, name: str, *, proxied: bool = True, hold: bool = False
) -> Iterator[Scenario]:
    cluster = stack.cluster
    proxy = Proxy(cluster.api_port).start() if proxied else None
    if proxy is not None and hold:
        proxy.hold()
    port = free_port()
    extender = stack.spawn_extender(
        f"extender-{name}",
        port,
        kubeconfig=cluster.kubeconfig_via(proxy.address) if proxy else None,
        wait=not hold,
    )
    profile = f"gpu-{name}"
    config = scheduler_config(f"http://127.0.0.1:{port}", profile=profile)
    cluster.start_scheduler(f"scheduler-{name}", config)
    try:
        yield Scenario(stack, name, profile, port, extender, proxy)
    finally:
        cluster.stop_process(f"scheduler-{name}")
        cluster.stop_process(f"extender-{name}")
        if proxy is not None:
            proxy.stop()
