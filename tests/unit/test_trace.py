"""The openb trace mapping and the fill-mode bookkeeping (pure parts of the benchmark)."""

from __future__ import annotations

from gpu_scheduler import contract, podspec
from tests.bench.trace import (
    FillResult,
    Task,
    TraceNode,
    fill_should_stop,
    load_nodes,
    load_tasks,
    median_run,
    node_manifest,
    pod_manifest,
    sample,
)


def task(name="t", gpus=1, models=(), created=0):
    return Task(name, 4000, 8192, gpus, tuple(models), created, None)


def test_trace_files_load(openb_trace):
    nodes = load_nodes(openb_trace / "openb_node_list_all_node.csv")
    assert len(nodes) == 1523
    assert sum(n.gpus for n in nodes) == 6212
    tasks = load_tasks(openb_trace / "openb_pod_list_default.csv")
    assert len(tasks) == 8152
    assert [t.created for t in tasks] == sorted(t.created for t in tasks)
    sharing = [t for t in tasks if t.gpus == 1]
    assert sharing  # gpu_milli < 1000 still asks for one whole GPU
    specs = load_tasks(openb_trace / "openb_pod_list_gpuspec20.csv")
    assert any(len(t.models) > 1 for t in specs)
    assert all(len(set(t.models)) == len(t.models) for t in specs)


def test_sample_is_proportional_stratified_and_ordered():
    items = [("a", i) for i in range(100)] + [("b", i) for i in range(10)]
    chosen = sample(items, 0.1, seed=1, key=lambda x: x[0])
    assert sum(1 for k, _ in chosen if k == "a") == 10
    assert sum(1 for k, _ in chosen if k == "b") == 1
    assert chosen == sorted(chosen, key=items.index)
    assert sample(items, 1.0, seed=1) == items


def test_nodes_carry_agent_labels_capacity_and_the_gpu_taint():
    node = node_manifest(TraceNode("n", 96000, 786432, 8, "V100M32"))
    labels = node["metadata"]["labels"]
    assert labels[contract.LABEL_GPU_PRODUCT] == "V100M32"
    assert labels[contract.LABEL_GPU_MEMORY] == "32768"
    assert labels[contract.LABEL_GPU_COUNT] == "8"
    assert node["status"]["allocatable"][contract.RESOURCE_GPU] == "8"
    assert node["status"]["allocatable"]["cpu"] == "96000m"
    assert node["spec"]["taints"][0]["key"] == contract.RESOURCE_GPU
    cpu = node_manifest(TraceNode("c", 32000, 262144, 0, ""))
    assert contract.RESOURCE_GPU not in cpu["status"]["allocatable"]
    assert cpu["spec"]["taints"] == []


def _product_term(pod):
    return pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]


def test_model_constraint_as_the_webhook_admits_it_for_us_and_affinity_for_the_others():
    t = task(gpus=2, models=("V100M16", "V100M32"))
    ours = pod_manifest(t, "trace-gpu-scheduler", ours=True)
    # Ours: the annotation, and the affinity our webhook writes from it (each product
    # and its -SHARED name, or no GPU label at all: left to the scheduler's GPU rule),
    # as in a cluster where the webhook admits the pod.
    assert ours["metadata"]["annotations"][contract.ANN_GPU_PRODUCTS] == "V100M16,V100M32"
    assert _product_term(ours) == [
        {
            "matchExpressions": [
                {
                    "key": contract.LABEL_GPU_PRODUCT,
                    "operator": "In",
                    "values": ["V100M16", "V100M16-SHARED", "V100M32", "V100M32-SHARED"],
                }
            ]
        },
        {
            "matchExpressions": [
                {"key": key, "operator": "DoesNotExist"}
                for key in (
                    contract.LABEL_GPU_PRODUCT,
                    contract.LABEL_GPU_MEMORY,
                    contract.LABEL_GPU_MEMORY_LEGACY,
                )
            ]
        },
    ]
    assert ours["spec"]["schedulerName"] == "trace-gpu-scheduler"
    assert ours["spec"]["tolerations"] == [dict(contract.GPU_TOLERATION)]  # not added twice
    unrestricted = pod_manifest(task(gpus=2), "trace-gpu-scheduler", ours=True)
    assert "affinity" not in unrestricted["spec"]
    theirs = pod_manifest(t, "trace-default", ours=False)
    assert _product_term(theirs) == [
        {
            "matchExpressions": [
                {
                    "key": contract.LABEL_GPU_PRODUCT,
                    "operator": "In",
                    "values": ["V100M16", "V100M32"],
                }
            ]
        }
    ]
    assert podspec.pod_gpu_request(theirs["spec"]) == 2
    cpu = pod_manifest(task(gpus=0), "trace-default", ours=False)
    assert "tolerations" not in cpu["spec"]


def test_fill_result_bookkeeping():
    r = FillResult("x", total_gpus=10)
    r.record(task("a", 4), "T4")
    r.record(task("b", 0), "cpu")
    r.record(task("c", 8), None)  # 6 free: not fragmentation, the cluster is too full
    assert r.first_failure_share == 0.4
    assert r.fragmentation_failures == 0
    r.record(task("d", 2), None)  # 6 free >= 2: a fragmentation failure
    r.record(task("e", 1, models=("P100",)), "T4")
    assert (r.gpu_pods, r.gpu_failed, r.fragmentation_failures) == (4, 2, 1)
    assert r.failed_by_size == {8: 1, 2: 1}
    assert r.constraint_violations == 1
    assert r.final_share == 0.5
    assert r.curve[-1] == (5, 0.5)


def test_fill_stops_after_fifty_gpu_failures_in_a_row():
    assert not fill_should_stop([False] * 49)
    assert fill_should_stop([True] + [False] * 50)
    assert not fill_should_stop([False] * 30 + [True] + [False] * 30)


def test_multigpu20_has_no_times_and_keeps_row_order(openb_trace):
    tasks = load_tasks(openb_trace / "openb_pod_list_multigpu20.csv")
    assert [t.created for t in tasks] == list(range(len(tasks)))
    assert all(t.deleted is None and t.models == () for t in tasks)
    # resampled with more multi-GPU tasks than the default file (247 against 75)
    assert sum(1 for t in tasks if t.gpus >= 2) == 247


def test_median_run_of_repeated_fills():
    runs = []
    for share in (0.9, None, 0.5):
        r = FillResult("x", total_gpus=10)
        r.first_failure_share = share
        runs.append(r)
    assert median_run(runs).first_failure_share == 0.9
    assert median_run(runs[:1]) is runs[0]
    assert median_run(runs[1:]).first_failure_share == 0.5  # lower of two
