"""The real kube-scheduler placing GPU pods, with and without our extender, in one run.

    .venv/bin/python tests/bench/e2e_throughput.py [--pods 1000] [--nodes 500]

One control plane, our extender (cluster mode), and two node sets of ``--nodes`` GPU
nodes each. For each variant the pods are created first, for a scheduler that is not
running yet; then that kube-scheduler starts and we time the bindings (first to last,
so informer start-up is not counted):
  - without: deploy/'s gpu-scheduler profile with the extender removed,
  - with:    deploy/'s gpu-scheduler profile as shipped (extender at 127.0.0.1).
Prints pods/s both ways and the ratio (target: with >= 0.8 x without).
"""

from __future__ import annotations

import argparse
import copy
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpu_scheduler import contract  # noqa: E402
from lab.kubelet_shim import node_object  # noqa: E402
from lab.stack import bare_stack, scheduler_config  # noqa: E402

SET_LABEL = "bench.gpu-scheduler.io/set"
TAINT = {"key": contract.RESOURCE_GPU, "value": "present", "effect": "NoSchedule"}


def gpu_node(name: str, variant: str) -> dict:
    labels = {
        SET_LABEL: variant,
        contract.LABEL_GPU_PRESENT: "true",
        contract.LABEL_GPU_COUNT: "8",
        contract.LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
        contract.LABEL_GPU_MEMORY: "81559",
        contract.LABEL_ZONE: f"zone-{hash(name) % 3}",
    }
    return node_object(name, labels=labels, gpus=8, cpu="192", memory="2Ti", taints=[TAINT])


def gpu_pod(name: str, variant: str, gpus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": f"bench-{variant}",
            "nodeSelector": {SET_LABEL: variant},
            "tolerations": [
                {"key": contract.RESOURCE_GPU, "operator": "Exists", "effect": "NoSchedule"}
            ],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {contract.RESOURCE_GPU: str(gpus)},
                    },
                }
            ],
        },
    }


def measure(core, cluster, variant: str, config: dict, pods: int) -> tuple[float, int]:
    from gpu_scheduler.kube import watch_events

    bound: list[float] = []
    done = threading.Event()

    def watcher() -> None:
        seen = set()
        for _, obj in watch_events(
            lambda **kw: core.list_namespaced_pod("default", **kw),
            timeout_seconds=600,
            field_selector=f"spec.schedulerName=bench-{variant}",
        ):
            if obj["spec"].get("nodeName") and obj["metadata"]["name"] not in seen:
                seen.add(obj["metadata"]["name"])
                bound.append(time.monotonic())
                if len(seen) >= pods:
                    done.set()
                    return

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    time.sleep(1)
    proc = cluster.start_scheduler(f"scheduler-{variant}", config)
    done.wait(600)
    cluster.stop_process(proc.name)
    if len(bound) < 2:
        raise RuntimeError(f"{variant}: only {len(bound)} pods bound")
    return (len(bound) - 1) / (bound[-1] - bound[0]), len(bound)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    opts = parser.parse_args()

    with bare_stack("e2e-throughput-") as (stack, core):
        cluster = stack.cluster
        stack.start_extender()
        variants = ("without", "with")
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda args: core.create_node(gpu_node(*args)),
                    [(f"{v}-{i:04d}", v) for v in variants for i in range(opts.nodes)],
                )
            )
            sizes = [1, 1, 2, 4, 1, 2, 8, 1]
            list(
                pool.map(
                    lambda args: core.create_namespaced_pod("default", gpu_pod(*args)),
                    [
                        (f"{v}-{i:05d}", v, sizes[i % len(sizes)])
                        for v in variants
                        for i in range(opts.pods)
                    ],
                )
            )
        print(f"created {2 * opts.nodes} nodes and {2 * opts.pods} pods", flush=True)
        with_ext = scheduler_config(f"http://127.0.0.1:{stack.extender_port}")
        without_ext = copy.deepcopy(with_ext)
        without_ext.pop("extenders")
        results = {}
        for variant, cfg in (("without", without_ext), ("with", with_ext)):
            cfg = copy.deepcopy(cfg)
            cfg["profiles"][0]["schedulerName"] = f"bench-{variant}"
            results[variant] = measure(core, cluster, variant, cfg, opts.pods)
            print(f"  {variant}: {results[variant][0]:.1f} pods/s", flush=True)

    ratio = results["with"][0] / results["without"][0]
    print()
    print(f"kube-scheduler v1.37.2, {opts.pods} GPU pods over {opts.nodes} nodes (8 GPUs each)")
    print("| variant | pods bound | pods/s |")
    print("|---|---:|---:|")
    for variant, (rate, count) in results.items():
        print(f"| gpu-scheduler profile, {variant} extender | {count} | {rate:.1f} |")
    print(f"| ratio with/without | | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
