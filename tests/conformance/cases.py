"""Conformance cases for the Go framework plugins, decided by the Python extender.

Each case is a small cluster (Nodes, the pods bound there, the agents' heartbeat
Leases) and a pod to place. The extender's own cache and engine decide it: per node,
whether the pod fits, whether a refusal is unresolvable and its words; over the nodes
that fit, each scoring policy's 0..10 score. The Go suite
(plugins/test/conformance) builds NodeInfo from the same objects, runs the plugins as
kube-scheduler would, and must give the same answers.

    .venv/bin/python -m tests.conformance.cases --out /tmp/cases.json [--clusters 60]

The clusters are random but seeded: the same arguments give the same file. Some
nodes share their GPUs (the agent's annotations, its report of what each pod holds)
and some pods ask shares. In some clusters a DRA driver publishes the GPUs of some
nodes (DeviceClasses, ResourceSlices, ResourceClaims, some consuming memory of shareable
devices), and some pods to place hold a claim asking such memory: the extender lists
them from the fake API, the Go suite serves them as kube-scheduler's DRA state.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from extender.config import ExtenderConfig
from extender.engine import filter_nodes, weighted_means
from extender.model import pod_facts
from extender.policies import build_policies
from gpu_scheduler import contract
from gpu_scheduler.timestamps import rfc3339_micro
from tests.factories import (
    GPU_SELECTOR,
    claim,
    device_class,
    gpu_device,
    hold_claim,
    make_lease,
    resource_slice,
    share_claim,
)
from tests.fakeapi import FakeListWatch, synced_cache

NOW = 1_800_000_000.0
#: The policies the plugins hold: filters (gpu, spot, heartbeat) and scores (gpu,
#: scarcity and fragmentation in GPUScheduler, spot, group).
SCORED = ("gpu", "scarcity", "fragmentation", "spot", "group")
NAMESPACE = "gpu-scheduler"


def lease(node: str, renewed: float | None) -> dict[str, Any]:
    """The node's agent heartbeat Lease, last renewed at ``renewed`` (seconds)."""
    when = None if renewed is None else rfc3339_micro(datetime.fromtimestamp(renewed, UTC))
    return make_lease(node, when, NAMESPACE)


PRODUCTS = (
    "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "Tesla-T4", "NVIDIA-L40S",
    "NVIDIA-A100-SXM4-40GB-SHARED", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
)  # fmt: skip
MEMORY = {"NVIDIA-H100-80GB-HBM3": 81559, "NVIDIA-A100-SXM4-40GB": 40960, "Tesla-T4": 15360,
          "NVIDIA-L40S": 46068}  # fmt: skip
ZONES = ("zone-a", "zone-b", "zone-c")
#: What pods ask beside their GPUs (the fragmentation score's shapes).
CPU = ("1", "1", "4", "8", "500m", "12", "17", "1500m")
RAM = ("1Gi", "1Gi", "16Gi", "64Gi", "100Gi", "3000Mi")
#: Values a pod's annotations take: good ones, and ones the extender refuses to read.
MIN_MEMORY = ("40Gi", "81920", "80G", "16000Mi", "20000", " 24Gi ", "lots", "-5Gi", "1e999999")
SPOT = ("prefer", "avoid", "require", "forbid", "sometimes")
PLACEMENT = ("binpack", "spread", "tight")
#: What a hostile or careless writer puts there: odd quantities, case, whitespace,
#: other scripts, sizes past every limit.
ODD_MEMORY = (
    ".", "-", "1.", "+40Gi", "40gi", "0.5Gi", "1e3", "1e4294967296", "9Ei", "12E", "0x10",
    "\u0663", "40Gi\n", "", "x" * 2000, "9" * 19, "1.5e-9", "-0", "1E3",
)  # fmt: skip
ODD_WORDS = ("Prefer", " spread", "BINPACK", "", "forbid ", "\u00e9", "x" * 300)
ODD_PRODUCTS = (",,,", "NVIDIA-A100-SXM4-40GB,NVIDIA-A100-SXM4-40GB-SHARED", "T" * 64,
                ",".join(f"p{k}" for k in range(65)), " Tesla-T4 ")  # fmt: skip
#: Entries of the agent's per-GPU annotation with fields of the wrong type.
ODD_GPUS = (
    {"uuid": 5, "healthy": False}, {"uuid": "GPU-x", "healthy": "false"},
    {"uuid": "GPU-y", "healthy": False, "xid": 79.0},
    {"uuid": "GPU-z", "healthy": False, "xid": True},
    {"uuid": "", "healthy": False, "reason": 42, "since": 0}, {"healthy": None},
    {"uuid": "GPU-w", "healthy": False, "reason": "r" * 300, "since": "s" * 100},
    {"uuid": "GPU-v", "healthy": False, "xid": -3, "reason": "XID -3 seen"},
    {"uuid": "GPU-m", "migEnabled": True, "migDevices": "none", "healthy": False},
)  # fmt: skip


def _health(rng: random.Random, count: int, mig: bool, memory: int | None = None) -> str:
    gpus = []
    for i in range(count):
        gpu: dict[str, Any] = {"index": i, "uuid": f"GPU-{rng.randrange(16**8):08x}"}
        if memory is not None:  # a sharing node's GPUs: their memory, some held back
            gpu[contract.GPU_MEMORY_MIB] = rng.choice((memory, memory, 16384, "lots", 81920.0))
            if rng.random() < 0.3:
                gpu[contract.GPU_RESERVED_MIB] = rng.choice((1024, 2048, -5, "x"))
        if mig:
            gpu["migEnabled"] = True
            gpu["migDevices"] = [{"uuid": f"MIG-{i}-{k}"} for k in range(rng.choice((2, 3, 7)))]
        if rng.random() < 0.25:
            gpu["healthy"] = False
            if rng.random() < 0.7:
                gpu["xid"] = rng.choice((48, 79, 94))
            gpu["reason"] = rng.choice(("", "XID 79: fell off the bus", "ECC errors", "lost"))
            if rng.random() < 0.5:
                gpu["since"] = "2026-12-01T10:00:00Z"
        else:
            gpu["healthy"] = True
        if rng.random() < 0.1:
            gpu = dict(rng.choice(ODD_GPUS))
        gpus.append(gpu)
    if rng.random() < 0.05:
        return rng.choice(('{"a": 1}', "[1, 2]", "[", "null", "[" * 5000 + "]" * 5000))
    return json.dumps(gpus, separators=(",", ":"))


def node(rng: random.Random, name: str) -> dict[str, Any]:
    labels: dict[str, str] = {"kubernetes.io/hostname": name}
    annotations: dict[str, str] = {}
    gpus = rng.choice((0, 0, 1, 2, 4, 8, 8))
    labelled = gpus > 0 or rng.random() < 0.15
    sharing = False
    if labelled:
        labels[contract.LABEL_GPU_PRESENT] = "true"
        product = rng.choice((*PRODUCTS, None))
        if product:
            labels[contract.LABEL_GPU_PRODUCT] = product
        memory = MEMORY.get(contract.base_product(product or ""), 40960)
        key = rng.choice(
            (contract.LABEL_GPU_MEMORY,) * 4 + (contract.LABEL_GPU_MEMORY_LEGACY, None)
        )
        if key:
            labels[key] = str(memory) if rng.random() < 0.9 else "lots"
        if rng.random() < 0.15:
            labels[contract.LABEL_GPU_REPLICAS] = rng.choice(("2", "4", "x"))
        sharing = gpus > 0 and rng.random() < 0.3
        if sharing:  # the agent's device plugin shares these GPUs
            labels.pop(contract.LABEL_GPU_REPLICAS, None)
            if rng.random() < 0.8:
                labels[contract.LABEL_GPU_SHARING] = rng.choice(contract.SHARING_MODES)
            labels[contract.LABEL_GPU_COUNT] = str(gpus)
        if (rng.random() < 0.5 or (sharing and rng.random() < 0.8)) and gpus:
            count = max(
                1, gpus // int(labels.get(contract.LABEL_GPU_REPLICAS, "1").strip("x") or 1)
            )
            mig = bool(product and contract.MIG_PART in product)
            annotations[contract.ANN_GPUS] = _health(rng, count, mig, memory if sharing else None)
    if rng.random() < 0.5:
        key, spot = rng.choice(contract.SPOT_LABELS)
        labels[key] = spot if rng.random() < 0.5 else "on-demand"
    if rng.random() < 0.8:
        labels[contract.LABEL_ZONE] = rng.choice(ZONES)
    for level in contract.TOPOLOGY_LEVELS[:6]:
        if rng.random() < 0.2:
            labels[level] = f"{level.rsplit('/', 1)[-1]}-{rng.randrange(3)}"
    allocatable = {"cpu": rng.choice(("32", "32", "16", "96")), "pods": "110",
                   "memory": rng.choice(("256Gi", "256Gi", "64Gi", "1Ti"))}  # fmt: skip
    if rng.random() < 0.05:
        del allocatable["cpu"]
    if gpus and rng.random() < 0.95:
        allocatable[contract.RESOURCE_GPU] = str(gpus)
    if labelled and gpus and sharing and rng.random() < 0.9:
        allocatable[contract.RESOURCE_GPU_MEMORY] = str(gpus * 40)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }  # fmt: skip


def pod(rng: random.Random, name: str, *, on: str | None = None, group: str | None = None):
    gpus = rng.choice((0, 1, 1, 2, 4, 8)) if on is None else rng.choice((0, 1, 1, 2, 4))
    annotations: dict[str, str] = {}
    if on is None:
        if rng.random() < 0.25:
            odd = rng.random() < 0.3
            annotations[contract.ANN_MIN_GPU_MEMORY] = rng.choice(
                ODD_MEMORY if odd else MIN_MEMORY[:6] * 3 + MIN_MEMORY
            )
        if rng.random() < 0.25:
            picked = rng.sample(PRODUCTS, rng.randrange(1, 3))
            annotations[contract.ANN_GPU_PRODUCTS] = (
                ",".join(picked) if rng.random() < 0.9 else rng.choice(ODD_PRODUCTS)
            )
        if rng.random() < 0.4:
            annotations[contract.ANN_SPOT] = rng.choice(SPOT[:4] * 8 + SPOT[4:] + ODD_WORDS)
        if rng.random() < 0.3:
            annotations[contract.ANN_PLACEMENT] = rng.choice(
                PLACEMENT[:2] * 8 + PLACEMENT[2:] + ODD_WORDS
            )
    elif gpus and rng.random() < 0.3:  # placed pods restricted to products: pressure
        picked = rng.sample(PRODUCTS[:4], rng.randrange(1, 3))
        annotations[contract.ANN_GPU_PRODUCTS] = ",".join(picked)
    if group:
        annotations[contract.ANN_GROUP] = group
    cpu, memory = rng.choice(CPU), rng.choice(RAM)
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["requests"][contract.RESOURCE_GPU] = str(gpus)
        resources["limits"] = {contract.RESOURCE_GPU: str(gpus)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": resources}]}
    if rng.random() < (0.3 if on is None else 0.25):
        _ask_shares(rng, spec, gpus)
    if rng.random() < 0.15:
        init_gpus = rng.choice((1, 2, 8))
        spec["initContainers"] = [{"name": "init", "image": "x", "resources": {
            "requests": {contract.RESOURCE_GPU: str(init_gpus)},
            "limits": {contract.RESOURCE_GPU: str(init_gpus)}}}]  # fmt: skip
    spec["schedulerName"] = contract.SCHEDULER_NAME
    status: dict[str, Any] = {"phase": "Pending"}
    if on is not None:
        spec["nodeName"] = on
        status = {"phase": "Running"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "resourceVersion": "1", "annotations": annotations},
        "spec": spec,
        "status": status,
    }  # fmt: skip


#: Shares a container asks (units of 1 GiB), and ones no GPU can ever meet.
SHARES = (1, 2, 4, 5, 10, 20, 38, 40, 60)
ODD_SHARES = ("0", "1025", "17179869184", "1.5")


def _ask_shares(rng: random.Random, spec: dict[str, Any], gpus: int) -> None:
    """Make the pod ask a share of a GPU in its main container (whole GPUs move to a
    container of their own), maybe one more share in a sidecar, or an odd request."""
    main = spec["containers"][0]
    resources = main["resources"]
    for kind in ("requests", "limits"):
        resources.get(kind, {}).pop(contract.RESOURCE_GPU, None)
    share = str(rng.choice(SHARES)) if rng.random() < 0.95 else rng.choice(ODD_SHARES)
    _asks(main, contract.RESOURCE_GPU_MEMORY, share)
    if gpus and rng.random() < 0.3:  # whole GPUs too, in a later container
        spec["containers"].append(_asks({"name": "whole", "image": "x"}, contract.RESOURCE_GPU,
                                        str(min(gpus, 2))))  # fmt: skip
    if rng.random() < 0.2:
        sidecar = _asks({"name": "side", "image": "x"}, contract.RESOURCE_GPU_MEMORY,
                        str(rng.choice(SHARES)))  # fmt: skip
        if rng.random() < 0.85:
            sidecar["restartPolicy"] = "Always"
        spec["initContainers"] = [sidecar]
    if rng.random() < 0.03:  # both in one container
        _asks(main, contract.RESOURCE_GPU, "1")


def _asks(container: dict[str, Any], resource: str, amount: str) -> dict[str, Any]:
    """The container asks ``amount`` of an extended resource, in its limits and its
    requests (the API server defaults the request to the limit)."""
    resources = container.setdefault("resources", {})
    for kind in ("requests", "limits"):
        resources.setdefault(kind, {})[resource] = amount
    return container


def _report(rng: random.Random, node: dict[str, Any], pods: list[dict[str, Any]]) -> None:
    """The agent's report of what the pods on a sharing node hold (some of them)."""
    try:
        gpus = json.loads(node["metadata"]["annotations"].get(contract.ANN_GPUS, ""))
    except (ValueError, RecursionError):
        return
    if not isinstance(gpus, list):
        return
    uuids = [g.get("uuid") for g in gpus if isinstance(g, dict) and isinstance(g.get("uuid"), str)]
    if not uuids or rng.random() < 0.3:
        return
    report: dict[str, dict[str, Any]] = {}
    for pod in pods:
        if rng.random() < 0.6:
            held = report.setdefault(rng.choice(uuids), {})
            asks = pod["spec"]["containers"][0]["resources"].get("limits", {})
            units = asks.get(contract.RESOURCE_GPU_MEMORY)
            held[pod["metadata"]["uid"]] = int(units) if units and units.isdigit() else "whole"
    if rng.random() < 0.1:  # an older agent's report, keyed by namespace/name
        report = {uuids[0]: {"default/old": 4}}
    node["metadata"]["annotations"][contract.ANN_GPU_SHARES] = json.dumps(report)


#: What a DRA driver's GPUs are: product name as the driver writes it, memory in MiB.
DRA_PRODUCTS = (("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA L4", 23034),
                ("NVIDIA A100-SXM4-40GB", 40960))  # fmt: skip
DEVICE_TAINTS = (
    {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
    {"key": "example.com/drain", "value": "soon", "effect": "NoExecute"},
)


def dra(rng: random.Random, index: int, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """A DRA driver's GPUs on some of ``nodes`` (changed in place: most no longer
    advertise nvidia.com/gpu, so their devices decide): devices of other types, sick
    ones (device taints), odd memory, a pool republished (an older generation still
    listed), a pool over two nodes (whole, or being republished), a node's pool over two
    slices (one maybe not listed yet), claims holding some devices or ones that do not
    exist, or consuming memory of shareable ones; and the class that maps
    nvidia.com/gpu, sometimes none, a broken selector, or a newer class selecting other
    devices."""
    chosen = rng.sample(nodes, rng.randrange(1, min(4, len(nodes)) + 1))
    # A pool over the first two nodes, one slice each: at one generation, or being
    # republished (the second node's slice a generation behind).
    shared_pool = f"rack-{index}" if len(chosen) > 1 and rng.random() < 0.5 else None
    shared_generation = rng.choice((1, 2))
    lagging = shared_generation == 2 and rng.random() < 0.6
    slices: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for k, node in enumerate(chosen):
        name = node["metadata"]["name"]
        pool = shared_pool if shared_pool and k < 2 else name
        # else a device plugin's node with slices too: its own wins
        if rng.random() < 0.9 or pool != name:
            for table in (node["status"]["allocatable"], node["status"]["capacity"]):
                table.pop(contract.RESOURCE_GPU, None)
                table.pop(contract.RESOURCE_GPU_MEMORY, None)
        if rng.random() < 0.7:
            node["metadata"]["annotations"].pop(contract.ANN_GPUS, None)
            node["metadata"]["annotations"].pop(contract.ANN_GPU_SHARES, None)
        product, mib = rng.choice(DRA_PRODUCTS)
        # A device's name is unique in its pool (the API's rule): a pool over nodes
        # names them by node.
        prefix = f"{name}-" if pool != name else ""
        shareable = rng.random() < 0.3  # consumable capacity: claims share the devices
        devices = []
        for i in range(rng.choice((1, 2, 4, 8, 8))):
            device = gpu_device(i, product, mib if rng.random() < 0.9 else 16384)
            device["name"] = prefix + device["name"]
            if shareable and rng.random() < 0.9:
                device["allowMultipleAllocations"] = True
            if rng.random() < 0.1:
                device["attributes"]["type"] = {"string": "mig"}
            if rng.random() < 0.12:
                device["taints"] = [rng.choice(DEVICE_TAINTS)]
            if rng.random() < 0.05:
                del device["capacity"]
            devices.append(device)
        # (generation, the pool's slice count then, this node's slices' devices)
        if pool != name:
            generation = shared_generation - (1 if lagging and k == 1 else 0)
            published = [(generation, 2, [devices])]
        else:  # the node's own pool: one slice, or its devices over two
            generation = rng.choice((1, 1, 2))
            half = len(devices) // 2
            parts = [devices[:half], devices[half:]] if half and rng.random() < 0.25 else [devices]
            count = len(parts)
            if count == 2 and rng.random() < 0.3:
                parts = parts[:1]  # the second slice not listed yet: incomplete
            published = [(generation, count, parts)]
            if generation == 2 and rng.random() < 0.5:  # the older one, on its way out
                older = [gpu_device(i, product, mib) for i in range(rng.choice((1, 8)))]
                published.append((1, 1, [older]))  # its own pool: no prefix to add
        for gen, count, parts in published:
            for j, listed in enumerate(parts):
                obj = resource_slice(name, listed, gen)
                obj["metadata"]["name"] = f"{name}-{pool}-{gen}-{j}"
                obj["spec"]["pool"].update(name=pool, resourceSliceCount=count)
                slices.append(obj)
        claims += _claims_on(rng, f"c{index}-{k}", name, pool, devices, prefix)
    classes = [device_class()]
    odd = rng.random()
    if odd < 0.05:
        classes = [device_class(resource=None)]
    elif odd < 0.1:
        classes = [device_class(selector="device.driver ==")]
    elif odd < 0.15:
        newer = GPU_SELECTOR.replace("'gpu'", "'mig'")
        classes.append(device_class("b.example", created="2026-12-01T00:00:00Z", selector=newer))
    return {"classes": classes, "slices": slices, "claims": claims}


def _claims_on(
    rng: random.Random,
    whole: str,
    node: str,
    pool: str,
    devices: list[dict[str, Any]],
    prefix: str,
) -> list[dict[str, Any]]:
    """Allocated claims on a node's devices: those that allow it shared by claims, each
    consuming some of its memory (never more than it has, as the allocator keeps it);
    the others held whole by one claim (``whole``), sometimes with a device that does
    not exist."""
    out: list[dict[str, Any]] = []
    held = []
    for device in devices:
        if rng.random() >= 0.3:
            continue
        memory = device.get("capacity", {}).get("memory")
        if not device.get("allowMultipleAllocations") or memory is None:
            held.append(device["name"])
            continue
        left = int(memory["value"].removesuffix("Mi"))
        for j in range(rng.choice((1, 1, 2))):
            used = min(left, int(left * rng.choice((0.1, 0.25, 0.5, 1.0))) or 1)
            left -= used
            consumed = {device["name"]: f"{used}Mi"}
            out.append(share_claim(f"s-{node}-{device['name']}-{j}", node, consumed, pool=pool))
    if rng.random() < 0.05:
        held.append(f"{prefix}gpu-99")
    if held:
        extended = rng.random() < 0.7
        out.append(claim(whole, node, held, extended=extended, pool=pool))
    return out


def asks_claim(rng: random.Random, pod: dict[str, Any], claims: list[dict[str, Any]]) -> None:
    """The pod holds a claim of its own, made from its ResourceClaimTemplate and not yet
    allocated, asking memory of a shareable GPU (added to ``claims``)."""
    name = f"{pod['metadata']['name']}-gpu"
    asks = rng.choice(("10Gi", "20Gi", "40Gi", "1Gi", "100Gi", "512Mi"))
    made = share_claim(name, None, {}, asks=asks)
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
         "uid": pod["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    claims.append(made)
    hold_claim(pod, name)


def cluster(rng: random.Random, index: int) -> dict[str, Any]:
    names = [f"n{index}-{k}" for k in range(rng.randrange(3, 11))]
    nodes = [node(rng, name) for name in names]
    driver = dra(rng, index, nodes) if rng.random() < 0.3 else None
    groups = [f"job-{index}-{k}" for k in range(2)]
    bound = []
    for k in range(rng.randrange(0, 14)):
        group = rng.choice([*groups, None, None])
        bound.append(pod(rng, f"b{index}-{k}", on=rng.choice(names), group=group))
    for n in nodes:
        if contract.LABEL_GPU_COUNT in n["metadata"]["labels"] and n["metadata"]["annotations"]:
            on = [p for p in bound if p["spec"]["nodeName"] == n["metadata"]["name"]]
            _report(rng, n, on)
    leases = {}
    for name in names:
        if rng.random() < 0.5:
            age = rng.choice((None, 10.0, 60.0, 899.0, 901.0, 3600.0))
            leases[name] = None if age is None else NOW - age
    placement = rng.choice(("binpack", "spread"))
    return {"nodes": nodes, "pods": bound, "leases": leases, "groups": groups, "dra": driver,
            "config": {"defaultPlacement": placement, "heartbeatWindowSeconds": 900.0}}  # fmt: skip


def decide(world: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The extender's answers for each pod placed into ``world``: its own cache (listed
    from the explicit fake API) and engine, at a clock that does not move."""
    cfg = ExtenderConfig(default_placement=world["config"]["defaultPlacement"])
    policies = build_policies(cfg)
    cache = synced_cache(world["nodes"], world["pods"], resource=_served(world), clock=lambda: NOW)
    try:
        cache.replace_leases([lease(n, r) for n, r in world["leases"].items()])
        view = cache.view()
        names = [n["metadata"]["name"] for n in world["nodes"]]
        out = []
        for target in pods:
            facts = pod_facts(target, cfg.default_placement)
            verdict = filter_nodes(facts, names, view.candidates(names), view, policies)
            want = {n: {"fit": True} for n in verdict.passed}
            for table, unresolvable in ((verdict.failed, False), (verdict.unresolvable, True)):
                for n, reason in table.items():
                    want[n] = {"fit": False, "unresolvable": unresolvable, "reason": reason}
            parts: dict[str, Any] = {}
            passed = verdict.passed
            if passed:
                weighted_means(facts, view.candidates(passed), view, policies, cfg, parts)
            scores = {
                name: dict(zip(passed, (float(x) for x in parts[name][: len(passed)]), strict=True))
                for name in SCORED
                if name in parts
            }
            out.append({"pod": target, "want": want, "scores": scores})
        return out
    finally:
        cache.stop()


class _DraApi:
    """The resource.k8s.io lists the extender's cache reads, from a world's objects."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.list_device_class = FakeListWatch(objects["classes"])
        self.list_resource_slice = FakeListWatch(objects["slices"])
        self.list_resource_claim_for_all_namespaces = FakeListWatch(objects["claims"])
        self.list_device_taint_rule = FakeListWatch()


def _served(world: dict[str, Any]) -> _DraApi | None:
    return _DraApi(world["dra"]) if world.get("dra") else None


def generate(clusters: int = 60, pods_per_cluster: int = 40, seed: int = 1) -> dict[str, Any]:
    """``clusters`` worlds with ``pods_per_cluster`` pods to place in each."""
    rng = random.Random(seed)
    worlds, cases = [], []
    for index in range(clusters):
        world = cluster(rng, index)
        targets = [
            pod(rng, f"p{index}-{k}", group=rng.choice(world["groups"] + [None, None]))
            for k in range(pods_per_cluster)
        ]
        if world["dra"]:
            for target in targets:
                if rng.random() < 0.3:
                    asks_claim(rng, target, world["dra"]["claims"])
        for k, answer in enumerate(decide(world, targets)):
            cases.append({"name": f"cluster{index}/pod{k}", "world": index, **answer})
        worlds.append(world)
    return {"now": NOW, "namespace": NAMESPACE, "worlds": worlds, "cases": cases}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clusters", type=int, default=60)
    parser.add_argument("--pods", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(generate(args.clusters, args.pods, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
