"""The same placements over the openb cluster: the node the extender picks for every
pod, in arrival order, for the Go plugins (plugins/test/openb) to pick again.

    .venv/bin/python -m tests.conformance.openb --out /tmp/openb.json \
        [--pods 1200] [--seed 42] [--node-scale 0.15]

The cluster is a sample of the trace's GPU nodes (``--node-scale``, stratified by
model, as tests/bench/decision_digest.py draws it) as their kubelets register them,
without the GPU taint and without sharing (the plugins path places no shares); a fifth
of them, drawn, labelled spot capacity. The pods are ``--pods`` tasks of
``openb_pod_list_gpuspec20.csv`` in arrival order, whole-GPU and CPU-only ones (sharing
tasks are left out), as the API server stores them (a limit is the request), a task's
``gpu_spec`` as its ``gpu-scheduler.io/gpu-products`` annotation, so scarcity matters;
a tenth of the GPU pods, drawn, prefer spot capacity (the others avoid it).

Each pod is decided by the extender's own cache and engine at a clock that does not
move (as tests/conformance/cases.py decides): among the nodes its filters pass, the
highest weighted mean of the scoring policies (``weighted_means``, the default
weights), means within :data:`TIE` of the best being ties broken by node name (the
smallest; a tolerance, so that the last bits of two float sums never pick). The pod is
then bound there (the API server and the watch both say so), so later pods see the
cluster fill. Only the rules the plugins hold decide: kube-scheduler's own filters
(NodeResourcesFit's CPU and memory among them) are not run on either side.

The file holds the nodes and the pods, each with the node picked ("" where none fits),
its mean and how many nodes fit. The same arguments give the same file.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from extender import workload
from extender.config import DEFAULT_WEIGHTS, ExtenderConfig
from extender.engine import filter_nodes, weighted_means
from extender.model import pod_facts
from extender.policies import build_policies
from gpu_scheduler import contract
from tests.bench import trace
from tests.fakeapi import FakeCore, synced_cache

NOW = 1_800_000_000.0
#: Means (0..10) this close to the best tie with it.
TIE = 1e-9
PLACEMENT = "binpack"
HEARTBEAT_WINDOW = 900.0
TRACE_FILE = "gpuspec20"
#: Shares of the nodes labelled spot capacity, and of the GPU pods preferring it (the
#: others avoid it, as a GPU pod does unless it says otherwise).
SPOT_NODES, SPOT_PREFER = 0.2, 0.1
#: The plugins path's profile: the plugins' weights and GPUScheduler's own.
PROFILE = Path(__file__).resolve().parents[2] / "deploy/scheduler/plugins/scheduler-config.yaml"


def profile() -> dict[str, Any]:
    """The weights of deploy/'s plugins profile: each plugin's in kube-scheduler's sum,
    and GPUScheduler's of the scores it adds up."""
    (only,) = yaml.safe_load(PROFILE.read_text())["profiles"]
    enabled = only["plugins"]["multiPoint"]["enabled"]
    plugins = {p["name"]: p["weight"] for p in enabled if "weight" in p}  # the scoring ones
    args = {c["name"]: c.get("args", {}) for c in only["pluginConfig"]}
    return {"plugins": plugins, "gpuScheduler": args["GPUScheduler"]["weights"]}


def world(pods: int, seed: int, node_scale: float) -> tuple[list[dict], list[dict]]:
    """The sampled nodes and the pods to place, in arrival order."""
    folder = trace.find_trace_dir()
    sampled = trace.load_nodes(folder / "openb_node_list_gpu_node.csv")
    sampled = trace.sample(sampled, node_scale, seed, key=lambda n: n.model)
    rng = random.Random(seed)
    nodes = []
    for item in sampled:
        manifest = trace.node_manifest(item)
        manifest["spec"].pop("taints", None)
        if rng.random() < SPOT_NODES:
            manifest["metadata"]["labels"][contract.LABEL_KARPENTER_CAPACITY_TYPE] = "spot"
        nodes.append(manifest)
    tasks = [t for t in trace.load_tasks(folder / f"openb_pod_list_{TRACE_FILE}.csv")]
    tasks = [t for t in tasks if not t.sharing]
    tasks = trace.sample(tasks, pods / len(tasks), seed)[:pods]
    out = []
    for k, task in enumerate(tasks):
        pod = defaulted(trace.pod_manifest(task, contract.SCHEDULER_NAME, ours=True))
        pod["metadata"].update(namespace="default", uid=f"uid-{k:05d}", resourceVersion="1")
        pod["status"] = {"phase": "Pending"}
        if task.gpus and rng.random() < SPOT_PREFER:
            pod["metadata"]["annotations"][contract.ANN_SPOT] = "prefer"
        out.append(pod)
    return nodes, out


def defaulted(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the API server stores it: a container's limit without a request is
    its request too (kube-scheduler reads requests only; the extender also reads a
    limit alone)."""
    for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        resources = container.setdefault("resources", {})
        requests = resources.setdefault("requests", {})
        for key, value in resources.get("limits", {}).items():
            requests.setdefault(key, value)
    return pod


def bound(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def place(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pod's pick, in order, each bound before the next is decided."""
    cfg = ExtenderConfig(default_placement=PLACEMENT, heartbeat_window_seconds=HEARTBEAT_WINDOW)
    policies = build_policies(cfg)
    core = FakeCore(nodes)
    cache = synced_cache(core=core, clock=lambda: NOW)
    names = [n["metadata"]["name"] for n in nodes]
    out = []
    try:
        for pod in pods:
            view = cache.view()
            facts = pod_facts(pod, cfg.default_placement)
            verdict = filter_nodes(facts, names, view.candidates(names), view, policies)
            passed = list(verdict.passed)
            pick, best, chosen = "", None, {}
            if passed:
                parts: dict[str, Any] = {}
                means = weighted_means(facts, view.candidates(passed), view, policies, cfg, parts)
                scored = [0.0] * len(passed) if means is None else [float(m) for m in means]
                best = max(scored)
                pick = min(n for n, m in zip(passed, scored, strict=True) if m >= best - TIE)
                at = passed.index(pick)
                chosen = {name: float(part[at]) for name, part in parts.items()}
                placed = bound(pod, pick)
                core.list_pod_for_all_namespaces.change(placed)
                cache.pod_event("ADDED", placed)
            out.append(
                {"pod": pod, "node": pick, "mean": best, "parts": chosen, "fits": len(passed)}
            )
        return out
    finally:
        cache.stop()


def generate(pods: int = 1200, seed: int = 42, node_scale: float = 0.15) -> dict[str, Any]:
    """The world and the picks: each pod's with the mix worked out afresh for every pod
    (``node``, ``mean``, ``parts``, ``fits``), and with the mix kept as the extender
    keeps it, worked out again once 1% of the pods moved (``kept``, ``keptFits``), each
    sequence bound as it picks."""
    nodes, targets = world(pods, seed, node_scale)
    with mock.patch.object(workload, "REFRESH_SHARE", 0.0):
        fresh = place(nodes, targets)
    for entry, kept in zip(fresh, place(nodes, targets), strict=True):
        entry.update(kept=kept["node"], keptFits=kept["fits"])
    return {
        "now": NOW,
        "tie": TIE,
        "weights": dict(DEFAULT_WEIGHTS),
        "profile": profile(),
        "config": {"defaultPlacement": PLACEMENT, "heartbeatWindowSeconds": HEARTBEAT_WINDOW},
        "nodes": nodes,
        "leases": {},
        "pods": fresh,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pods", type=int, default=1200)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--node-scale", type=float, default=0.15)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    generated = generate(args.pods, args.seed, args.node_scale)
    args.out.write_text(json.dumps(generated))
    picks = [p["node"] for p in generated["pods"]]
    print(
        f"{len(picks)} pods on {len(generated['nodes'])} nodes: {sum(map(bool, picks))} placed "
        f"on {len(set(filter(None, picks)))} nodes, in {time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
