"""The real kube-scheduler placing GPU pods: no extender, a bare echo extender, ours
(filter + prioritize) and ours prioritize-only, in one run on one control plane.

    .venv/bin/python tests/bench/e2e_throughput.py [--pods 1000] [--nodes 500] [--qps 2000]

One control plane, our extender (cluster mode, one worker, as deploy/ runs it) and a
bare echo extender (the same Flask app shape, served by the same gunicorn worker and
settings as ours, orjson both ways: every node passes, every score 0; the protocol's
floor on our server), and ``--nodes`` GPU nodes (8 GPUs each). For each variant the pods
are created first, for a scheduler that is not running yet; then that kube-scheduler
starts and we time the bindings (first to last, so informer start-up is not counted);
then the pods are deleted and our extender's cache is seen empty before the next:
  - without:    deploy/'s gpu-scheduler profile with the extender removed;
  - bare:       the same profile with the bare echo extender (filter + prioritize);
  - ours:       deploy/'s profile as shipped (filter + prioritize);
  - ours-prio:  deploy/'s profile with only the prioritize verb.
kube-scheduler's client rate limit (``clientConnection.qps``/``burst``, 50/100 by
default) caps a scheduler at about 50 bindings a second whatever the extender does, so
it is raised to ``--qps`` in every variant (``--qps 0`` keeps deploy/'s: 300/600).
Prints pods/s per variant and the ratios to bare and to without.
"""

from __future__ import annotations

import argparse
import copy
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpu_scheduler import contract  # noqa: E402
from lab.kubelet_shim import node_object  # noqa: E402
from lab.processes import free_port  # noqa: E402
from lab.stack import bare_stack, scheduler_config  # noqa: E402
from tests.bench.extender_bench import BARE_APP, BARE_ON_OUR_SERVER  # noqa: E402
from tests.bench.trace_runners import NAMESPACE, clear_pods  # noqa: E402
from tests.helpers import running  # noqa: E402

TAINT = {"key": contract.RESOURCE_GPU, "value": "present", "effect": "NoSchedule"}
VARIANTS = ("without", "bare", "ours", "ours-prio")
SIZES = [1, 1, 2, 4, 1, 2, 8, 1]


def gpu_node(name: str) -> dict[str, Any]:
    labels = {
        contract.LABEL_GPU_PRESENT: "true",
        contract.LABEL_GPU_COUNT: "8",
        contract.LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
        contract.LABEL_GPU_MEMORY: "81559",
        contract.LABEL_ZONE: f"zone-{sum(map(ord, name)) % 3}",
    }
    return node_object(name, labels=labels, gpus=8, cpu="192", memory="2Ti", taints=[TAINT])


def gpu_pod(name: str, variant: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": variant}},
        "spec": {
            "schedulerName": f"bench-{variant}",
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


def variant_config(variant: str, ours: str, bare: str, qps: int) -> dict[str, Any]:
    """deploy/'s KubeSchedulerConfiguration for one variant, its profile named
    ``bench-<variant>``, the client rate limit raised to ``qps`` (burst the same)."""
    cfg = scheduler_config(bare if variant == "bare" else ours, profile=f"bench-{variant}")
    if variant == "without":
        cfg.pop("extenders")
    elif variant == "ours-prio":
        for extender in cfg["extenders"]:
            extender.pop("filterVerb")
    if qps:
        cfg["clientConnection"] = {"qps": qps, "burst": qps}
    return copy.deepcopy(cfg)


#: kube-scheduler's own record of a binding (klog at -v=2), with its time of day.
BOUND = re.compile(r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*\"Successfully bound pod to node\"")


def binding_times(log: str) -> list[float]:
    """Seconds since midnight of each binding in a kube-scheduler log, in order."""
    times = []
    for line in log.splitlines():
        found = BOUND.match(line)
        if found:
            hours, minutes, seconds = found.groups()
            times.append(int(hours) * 3600 + int(minutes) * 60 + float(seconds))
    return times


def measure(cluster: Any, variant: str, config: dict[str, Any], pods: int) -> float:
    """Bindings per second, first to last, of ``pods`` pods made for ``variant``, from
    kube-scheduler's own log (its timestamps; no watch of ours to fall behind)."""
    proc = cluster.start_scheduler(f"scheduler-{variant}", config)
    deadline = time.monotonic() + 900
    times: list[float] = []
    while time.monotonic() < deadline:
        times = binding_times(proc.log_path.read_text(errors="replace"))
        if len(times) >= pods:
            break
        time.sleep(0.5)
    cluster.stop_process(proc.name)
    if len(times) < pods:
        raise RuntimeError(f"{variant}: only {len(times)} of {pods} pods bound")
    span = (times[-1] - times[0]) % 86400  # a run across midnight
    return (len(times) - 1) / span


#: The extender's counter of what became of prioritize's prepared answers.
PREPARED = "gpu_scheduler_extender_prepared_answers_total"


def prepared_in(text: str) -> dict[str, float]:
    """The prepared-answer counters in a /metrics text, by outcome (extender/prepared.py)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == PREPARED
    }


def prepared_counts(ops_port: int) -> dict[str, float]:
    """The extender's prepared-answer counters, read from its ops port."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{ops_port}/metrics", timeout=10) as r:
        return prepared_in(r.read().decode())


def wait_answering(url: str, timeout: float) -> None:
    """Until something answers HTTP at ``url`` (any status)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def table(results: dict[str, float], nodes: int, pods: int, qps: int) -> str:
    rows = [
        f"{pods} GPU pods over {nodes} nodes (8 GPUs each), client qps/burst {qps or 'as deploy/'}",
        "",
        "| variant | pods/s | ÷ bare | ÷ without |",
        "|---|---:|---:|---:|",
    ]
    for variant, rate in results.items():
        bare = results.get("bare")
        rows.append(
            f"| {variant} | {rate:.1f} | {rate / bare:.2f} | {rate / results['without']:.2f} |"
            if bare and "without" in results
            else f"| {variant} | {rate:.1f} | | |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--qps", type=int, default=2000, help="kube-scheduler client qps=burst")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--rounds", type=int, default=1, help="run the variants this many times, interleaved"
    )
    opts = parser.parse_args(argv)
    variants = [v for v in opts.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {sorted(unknown)}")

    with bare_stack("e2e-throughput-") as (stack, core):
        cluster, work = stack.cluster, stack.workdir
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: core.create_node(gpu_node(f"n-{i:05d}")), range(opts.nodes)))
        print(f"created {opts.nodes} nodes in {time.monotonic() - started:.0f} s", flush=True)
        stack.start_extender()
        (work / "bare.py").write_text(BARE_APP + BARE_ON_OUR_SERVER)
        bare_port = free_port()
        bare_cmd = [sys.executable, str(work / "bare.py"), str(bare_port), "4"]
        ours = f"http://127.0.0.1:{stack.extender_port}"
        runs: dict[str, list[float]] = {v: [] for v in variants}
        with running(bare_cmd, work / "bare.log", env={"PYTHONPATH": str(ROOT)}):
            wait_answering(f"http://127.0.0.1:{bare_port}/", 30)
            for round_, variant in ((r, v) for r in range(opts.rounds) for v in variants):
                config = variant_config(variant, ours, f"http://127.0.0.1:{bare_port}", opts.qps)
                with ThreadPoolExecutor(16) as pool:
                    list(
                        pool.map(
                            lambda i, v=variant: core.create_namespaced_pod(
                                NAMESPACE, gpu_pod(f"{v}-{i:05d}", v, SIZES[i % len(SIZES)])
                            ),
                            range(opts.pods),
                        )
                    )
                name = f"{variant}-{round_}"
                before = prepared_counts(stack.extender_ops_port)
                runs[variant].append(measure(cluster, name, config, opts.pods))
                after = prepared_counts(stack.extender_ops_port)
                moved = {k: int(v - before.get(k, 0)) for k, v in after.items()}
                moved = {k: v for k, v in moved.items() if v}
                print(
                    f"  {variant} (round {round_ + 1}): {runs[variant][-1]:.1f} pods/s"
                    + (f"; prioritize's prepared answers: {moved}" if moved else ""),
                    flush=True,
                )
                clear_pods(core, stack.extender_port)
    results = {v: statistics.median(rates) for v, rates in runs.items()}
    print()
    print(table(results, opts.nodes, opts.pods, opts.qps))
    if opts.rounds > 1:
        print(
            "\nevery round (pods/s): "
            + "; ".join(f"{v} {', '.join(f'{r:.1f}' for r in rates)}" for v, rates in runs.items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
