"""A digest of the extender's answers over the openb cluster: run it in two checkouts,
and equal digests say a change left every decision byte for byte as it was.

    .venv/bin/python tests/bench/decision_digest.py [--pods 1500] [--seed 42] \
        [--file default] [--node-scale 0.1]
    cd /tmp/other-checkout && /work/main/.venv/bin/python \
        /work/main/tests/bench/decision_digest.py

In-process, no control plane: the extender's app in cluster mode over a cache listed
from the explicit fake API (tests/fakeapi.py), which holds a sample of the trace's
GPU nodes (``--node-scale``, stratified by model; sharing, as in the sharing bench),
and a clock that does not move. ``--pods`` tasks drawn from the file (whole GPUs,
shares of one, CPU only), in arrival order, each asked as kube-scheduler asks:

- filter over every node (the filter picks the node where the pod prefers nothing);
- the same pod preferring spot capacity and (by node affinity) any node: filter,
  which then passes every node that fits, and prioritize over them;
- preempt, where nothing fits (the victims it would take on a few nodes);

and each pod that found a node is bound there (the API server and the watch both
say so), so later decisions see the cluster fill, and refuse. Every answer's bytes
go into one SHA-256; ``--show N`` prints the first N pods' answers, to find where two
checkouts part. It imports the checkout it is run in (the working directory).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path.cwd()
sys.path.insert(0, str(ROOT))  # the checkout it runs in, not the one this file is from

from extender.app import create_app  # noqa: E402
from gpu_scheduler import contract  # noqa: E402
from tests.bench import trace  # noqa: E402
from tests.bench.sharing_bench import cluster_models, share_pod_manifest, share_units  # noqa: E402
from tests.fakeapi import FakeCore, synced_cache  # noqa: E402

NOW = 1_800_000_000.0
SCHEDULER = "gpu-scheduler"


def pods_of(tasks: list[trace.Task], models: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for k, task in enumerate(tasks):
        units = share_units(task, models)
        if units is not None:
            pod = share_pod_manifest(task, units, SCHEDULER)
        else:
            pod = trace.pod_manifest(task, SCHEDULER, ours=True)
        pod["metadata"].update(namespace="default", uid=f"uid-{k:05d}")
        out.append(pod)
    return out


def preferring(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod preferring spot capacity and (through node affinity) any node: the
    filter leaves the choice to kube-scheduler's scoring, and prioritize is asked."""
    pod = copy.deepcopy(pod)
    pod["metadata"].setdefault("annotations", {})[contract.ANN_SPOT] = "prefer"
    pod["metadata"]["uid"] += "-prefer"
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}
    affinity = pod["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
        {"weight": 1, "preference": term}
    ]
    return pod


def bound(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    pod["metadata"]["resourceVersion"] = "1"
    return pod


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1500)
    parser.add_argument("--node-scale", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--file", default="default", help="openb_pod_list_FILE.csv")
    parser.add_argument("--show", type=int, default=0, help="print the first N pods' answers")
    opts = parser.parse_args()
    print(json.dumps(digest(opts.pods, opts.seed, opts.file, opts.node_scale, opts.show)))
    return 0


def digest(
    count: int, seed: int, file: str, node_scale: float = 0.1, show: int = 0
) -> dict[str, Any]:
    """Ask, bind and hash as the module says; the digest and what it covered."""
    folder = trace.find_trace_dir()
    nodes = trace.load_nodes(folder / "openb_node_list_gpu_node.csv")
    nodes = trace.sample(nodes, node_scale, seed, key=lambda n: n.model)
    tasks = trace.load_tasks(folder / f"openb_pod_list_{file}.csv")
    tasks = trace.sample(tasks, count / len(tasks), seed)[:count]
    pods = pods_of(tasks, cluster_models(nodes))

    core = FakeCore([trace.node_manifest(n, sharing=True) for n in nodes])
    cache = synced_cache(core=core, clock=lambda: NOW)
    client = create_app(cache=cache).test_client()
    names = sorted(n.name for n in nodes)
    sha = hashlib.sha256()
    placed = 0
    for k, pod in enumerate(pods):
        answers = []
        result = client.post("/filter", json={"Pod": pod, "NodeNames": names})
        answers.append(result.data)
        passed = (result.get_json() or {}).get("NodeNames") or []
        prefer = preferring(pod)
        wide = client.post("/filter", json={"Pod": prefer, "NodeNames": names})
        answers.append(wide.data)
        if len(wide_passed := (wide.get_json() or {}).get("NodeNames") or []) > 1:
            prio = {"Pod": prefer, "NodeNames": wide_passed}
            answers.append(client.post("/prioritize", json=prio).data)
        if not passed:
            victims = {n: {"Pods": [], "NumPDBViolations": 0} for n in names[:8]}
            call = {"Pod": pod, "NodeNameToMetaVictims": victims}
            answers.append(client.post("/preempt", json=call).data)
        if len(passed) == 1:  # the API server and the watch both have it bound
            core.list_pod_for_all_namespaces.change(placed_pod := bound(pod, passed[0]))
            cache.pod_event("ADDED", placed_pod)
            placed += 1
        for answer in answers:
            sha.update(len(answer).to_bytes(8, "big") + answer)
        if k < show:
            print(pod["metadata"]["name"], *(a.decode()[:300] for a in answers), sep="\n  ")
    cache.stop()
    return {"pods": len(pods), "placed": placed, "nodes": len(names), "sha256": sha.hexdigest()}


if __name__ == "__main__":
    sys.exit(main())
