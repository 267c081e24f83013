"""The trace bench's sharing ways (tests/bench/sharing_bench.py, sharing_runs.py): what a
sharing task asks, accounting in GPUs of work, draws by work, the per-GPU bookkeeping
the extender's fit rule makes, FGD on partial GPUs, and the sharing cluster's nodes."""

from __future__ import annotations

import pytest

from gpu_scheduler import contract, sharing
from tests.bench.sampling import NodeState, draw, fragmentation, task_classes
from tests.bench.sharing_bench import (
    DEFAULT_WAYS,
    WAYS,
    NodeGpus,
    WorkResult,
    cluster_models,
    draw_by_work,
    gpu_book,
    model_units,
    parse_ways,
    share_classes,
    share_fragmentation,
    share_pod_manifest,
    share_units,
    work_milli,
)
from tests.bench.trace import Task, TraceNode, load_nodes, load_tasks, node_manifest

OPENB_MODELS = ("A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32")


def task(name="t", gpus=1, milli=-1, models=(), cpu=1000, mem=1024):
    return Task(name, cpu, mem, gpus, tuple(models), 0, None, milli)


def test_tasks_keep_gpu_milli_and_the_default_file_has_the_readmes_work(openb_trace):
    tasks = load_tasks(openb_trace / "openb_pod_list_default.csv")
    sharing_tasks = [t for t in tasks if t.sharing]
    assert len(sharing_tasks) == 3078
    assert all(t.gpus == 1 and 0 < t.milli < 1000 for t in sharing_tasks)
    assert all(t.milli == 1000 * t.gpus for t in tasks if not t.sharing)
    assert sum(map(work_milli, sharing_tasks)) / 1000 == pytest.approx(1732, abs=1)
    assert sum(map(work_milli, tasks)) / 1000 == pytest.approx(6087, abs=1)
    # A task made without the column is a whole-GPU task.
    assert task(gpus=2).milli == 2000 and not task(gpus=2).sharing
    assert task(gpus=0).milli == 0 and not task(gpus=0).sharing


def test_a_share_is_its_fraction_of_the_smallest_gpu_it_accepts(openb_trace):
    nodes = load_nodes(openb_trace / "openb_node_list_all_node.csv")
    models = cluster_models(nodes)
    assert models == OPENB_MODELS
    # Unrestricted: sized on the T4 (15,360 MiB = 15 units), rounded up.
    assert share_units(task(milli=500), models) == 8
    assert share_units(task(milli=460), models) == 7  # 6.9
    assert share_units(task(milli=10), models) == 1  # never 0
    assert share_units(task(milli=999), models) == 15
    # Restricted: the smallest of the models it accepts.
    assert share_units(task(milli=500, models=("V100M32",)), models) == 16
    assert share_units(task(milli=500, models=("V100M16", "V100M32")), models) == 8
    assert share_units(task(milli=500, models=("A10",)), models) == 11  # 22 units
    # Whole-GPU and CPU tasks ask no share.
    assert share_units(task(gpus=1), models) is None
    assert share_units(task(gpus=4), models) is None
    assert share_units(task(gpus=0, milli=0), models) is None
    # The share never exceeds a GPU it may land on.
    for t in load_tasks(openb_trace / "openb_pod_list_gpuspec20.csv"):
        units = share_units(t, models)
        if units is not None:
            assert all(units <= model_units(m) for m in t.models or models), t


def _node(model, gpus=1, name="n"):
    return TraceNode(name, 96000, 393216, gpus, model)


def test_work_counts_a_share_by_its_milli_in_every_way():
    result = WorkResult("x", 42, total_gpus=4)
    result.record(task(milli=500), "G2")  # 0.5
    result.record(task(gpus=2), "G2")  # 2.5
    result.record(task(milli=250, models=("T4",)), "G2")  # 2.75, a violation
    result.record(task(gpus=0), "cpu")  # nothing
    result.record(task(gpus=1), None)  # fails: arrived 3.75
    result.record(task(milli=500), None)  # fails: arrived 4.25
    assert result.curve == [
        (0.125, 0.125),
        (0.625, 0.625),
        (0.6875, 0.6875),
        (0.9375, 0.6875),
        (1.0625, 0.6875),
    ]
    assert result.arrived == pytest.approx(4.25) and result.allocated == pytest.approx(2.75)
    assert result.at_level(0.5) == 0.625 and result.at_level(1.0) == 0.6875
    assert result.unallocated_at(1.0) == pytest.approx(1.25)
    assert result.unallocated_at(1.5) is None
    assert result.first_failure == 0.6875
    assert result.failed_by_size == {1: 1, 0: 1}  # 0: sharing tasks
    assert result.constraint_violations == 1 and result.gpu_pods == 5


def test_draws_stop_at_the_share_of_work_and_are_the_same_for_every_way():
    pool = [task("half", milli=500), task("two", gpus=2), task("cpu", gpus=0, milli=0)]
    drawn = draw_by_work(pool, total_gpus=10, share=1.3, seed=42)
    assert drawn == draw_by_work(pool, 10, 1.3, 42)
    work = [work_milli(t) for t in drawn]
    assert sum(work) >= 13000 and sum(work[:-1]) < 13000
    # By whole GPUs asked, a share counted one GPU: the draw stopped earlier.
    by_gpus = draw(pool, 10, 1.3, 42)
    assert len(by_gpus) < len(drawn) and drawn[: len(by_gpus)] == by_gpus


def test_the_bookkeeping_places_shares_by_best_fit_and_whole_gpus_on_free_ones():
    (node,) = gpu_book([_node("G2", gpus=2)]).values()  # 2 GPUs of 16 units
    assert [(g.uuid, g.free, g.whole_free) for g in node.gpus] == [
        ("gpu-0", 16, True),
        ("gpu-1", 16, True),
    ]
    assert node.take(task(milli=500, cpu=2000, mem=100), 10)  # gpu-0: 6 left
    assert node.take(task(milli=300), 5)  # best fit: gpu-0 (6), not gpu-1 (16)
    assert [g.free for g in node.gpus] == [1, 16]
    assert node.take(task(milli=300), 5)  # only gpu-1 holds it now
    assert [g.free for g in node.gpus] == [1, 11]
    assert not node.take(task(gpus=1), None)  # no GPU wholly free
    assert node.cpu_milli == 96000 - 2000 - 3 * 1000 and node.memory_mib == 393216 - 100 - 3072
    (other,) = gpu_book([_node("T4", gpus=4)]).values()
    assert other.take(task(gpus=2), None) and other.take(task(milli=500), 8)
    assert [(g.free, g.whole_free) for g in other.gpus] == [
        (0, False),
        (0, False),
        (7, False),
        (15, True),
    ]
    assert not other.take(task(gpus=2), None)


def test_the_bookkeeping_is_the_extenders_usage_of_the_bound_pods():
    """The extender fits a node's bound pods in the order it saw them (no agent
    report): the bench's replay of each binding must end where it does."""
    pods = [(0, (9,)), (1, ()), (0, (4,)), (0, (12,)), (0, (3,)), (2, ()), (0, (7,))]
    gpus = tuple((f"gpu-{i}", 16, True) for i in range(6))
    node = NodeGpus("G2", 96000, 393216, sharing.node_state(gpus))
    for whole, shares in pods:
        bound_task = task(gpus=whole or 1, milli=-1 if whole else 500)
        assert node.take(bound_task, shares[0] if shares else None)
    bound = [sharing.BoundPod(f"default/p{i}", w, s) for i, (w, s) in enumerate(pods)]
    state, misfits = sharing.usage(gpus, None, bound)
    assert misfits == 0 and state == node.gpus


def test_share_fragmentation_on_partial_gpus():
    classes = share_classes(
        [task(milli=500)] * 2 + [task(gpus=2)] + [task(milli=500, models=("T4",))], ("G2", "T4")
    )
    assert classes == [
        (("share", 8, 1000, 1024, ()), 0.5),
        (("whole", 2, 1000, 1024, ()), 0.25),
        (("share", 8, 1000, 1024, ("T4",)), 0.25),
    ]
    gpus = sharing.node_state((("gpu-0", 16, True), ("gpu-1", 16, True), ("gpu-2", 16, True)))
    node = NodeGpus("G2", 96000, 393216, gpus)
    assert share_fragmentation([node], classes) == (0.75, 0.25)  # the T4 class: all 3 free
    node.take(task(milli=700), 12)  # gpu-0: 4 of 16 left
    # share 8: gpu-0's 4/16 too small (0.5 x 0.25); whole 2: gpu-0 partial (0.25 x
    # 0.25); T4-only: 2.25 (0.25 x 2.25)
    amount, share = share_fragmentation([node], classes)
    assert amount == pytest.approx(0.125 + 0.0625 + 0.5625)
    assert share == pytest.approx(amount / 2.25)
    starved = NodeGpus("G2", 500, 393216, sharing.node_state((("gpu-0", 16, True),)))
    assert share_fragmentation([starved], classes) == (1.0, 1.0)  # no CPU for any class


def test_on_whole_gpus_it_is_the_whole_gpu_measure():
    tasks = [task(milli=500)] * 3 + [task(gpus=8, cpu=4000)] + [task(gpus=2, models=("T4",))]
    shapes = [(6, 96000, "G2"), (3, 96000, "T4"), (2, 2000, "G2"), (0, 0, "G2"), (8, 96000, "T4")]
    book, states = [], []
    for free, cpu, model in shapes:
        node = NodeGpus(model, cpu, 393216, sharing.node_state(
            tuple((f"gpu-{i}", 16, i < free) for i in range(8))
        ))  # fmt: skip
        book.append(node)
        states.append(NodeState(model, free, cpu, 393216))
    whole = fragmentation(states, task_classes(tasks))
    shared = share_fragmentation(book, share_classes(tasks, ("G2", "T4")))
    assert shared == pytest.approx(whole)


def test_sharing_nodes_carry_the_label_and_gpu_memory_capacity():
    node = node_manifest(_node("T4", gpus=4), sharing=True)
    assert node["metadata"]["labels"][contract.LABEL_GPU_SHARING] == "mps"
    for key in ("capacity", "allocatable"):
        assert node["status"][key][contract.RESOURCE_GPU_MEMORY] == "60"  # 4 x 15
        assert node["status"][key][contract.RESOURCE_GPU] == "4"
    plain = node_manifest(_node("T4", gpus=4))
    assert contract.LABEL_GPU_SHARING not in plain["metadata"]["labels"]
    assert contract.RESOURCE_GPU_MEMORY not in plain["status"]["allocatable"]
    cpu = node_manifest(TraceNode("c", 32000, 262144, 0, ""), sharing=True)
    assert contract.LABEL_GPU_SHARING not in cpu["metadata"]["labels"]
    assert contract.RESOURCE_GPU_MEMORY not in cpu["status"]["allocatable"]


def test_a_share_pod_asks_gpu_memory_and_is_admitted_by_our_webhook():
    pod = share_pod_manifest(task("s", milli=500, models=("T4", "P100")), 8, "trace-gpu-scheduler")
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {contract.RESOURCE_GPU_MEMORY: "8"}
    assert contract.RESOURCE_GPU not in container["resources"]["limits"]
    assert sharing.pod_shares(pod["spec"]).units == (8,)
    assert pod["spec"]["schedulerName"] == "trace-gpu-scheduler"
    assert pod["metadata"]["annotations"][contract.ANN_GPU_PRODUCTS] == "T4,P100"
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    values = {v for t in terms for e in t["matchExpressions"] for v in e.get("values", ())}
    assert {"T4", "P100"} <= values
    assert any(t.get("key") == contract.RESOURCE_GPU for t in pod["spec"]["tolerations"])


def test_the_ways_and_their_scheduler_configurations():
    import copy

    from tests.bench.sharing_runs import way_config
    from tests.bench.trace_runners import scheduler_configs

    assert [w.name for w in parse_ways(",".join(DEFAULT_WAYS))] == list(DEFAULT_WAYS)
    with pytest.raises(ValueError):
        parse_ways("whole,halves")
    with pytest.raises(ValueError):
        parse_ways("")
    assert WAYS["bestfit"].extender == {"weights": {"fragmentation": 0}}
    assert WAYS["full"].extender is None and WAYS["full"].shares and not WAYS["whole"].shares
    # The split ways: FGD for one kind of pod, the other kind on a second profile.
    shares_only, whole_only = WAYS["fgd-shares"], WAYS["fgd-whole"]
    assert shares_only.split and shares_only.extender is None
    assert shares_only.whole_extender == {"weights": {"fragmentation": 0}}
    assert whole_only.split and whole_only.whole_extender is None
    assert whole_only.extender == {"weights": {"fragmentation": 0}}
    custom, whole = parse_ways("share[fragmentation=16,gpu=0],whole[scarcity=0]")
    assert custom.shares and custom.extender == {"weights": {"fragmentation": 16, "gpu": 0}}
    assert custom.label == "gpu-scheduler[share,fragmentation=16,gpu=0]"
    assert not whole.shares and whole.extender == {"weights": {"scarcity": 0}}
    assert whole.scheduler == custom.scheduler == "gpu-scheduler"
    configs = scheduler_configs("http://127.0.0.1:1")
    # An extender that lists managedResources is sent only the pods asking one of them:
    # a share way adds gpu-memory to such a list (deploy/ had one until 7b8fb31).
    listed = copy.deepcopy(configs)
    listed["gpu-scheduler"]["extenders"][0]["managedResources"] = [
        {"name": contract.RESOURCE_GPU, "ignoredByScheduler": False}
    ]

    def managed(way, cfgs):
        config = way_config(cfgs, WAYS[way])
        return [
            m["name"] for e in config.get("extenders") or [] for m in e.get("managedResources", [])
        ]

    both = [contract.RESOURCE_GPU, contract.RESOURCE_GPU_MEMORY]
    assert managed("full", listed) == managed("bestfit", listed) == both
    assert managed("whole", listed) == managed("full-deployed", listed) == [contract.RESOURCE_GPU]
    assert listed["gpu-scheduler"]["extenders"][0]["managedResources"] == [
        {"name": contract.RESOURCE_GPU, "ignoredByScheduler": False}
    ]  # the shared configs are left as they were
    # Without a list (every pod of the profile is sent), nothing is added.
    assert managed("full", configs) == managed("whole", configs) == []
    assert way_config(configs, WAYS["full"]) == configs["gpu-scheduler"]
    assert managed("default", configs) == managed("mostallocated", configs) == []


def test_failure_reasons_are_kept_by_kind_without_counts():
    from tests.bench.sharing_bench import failure_reason

    message = (
        "0/153 nodes are available: 3 Insufficient cpu, 20 no single GPU has 8 GiB free: "
        "the largest free piece is 3 GiB on gpu-0 (3 GiB free on 8 GPUs); pod asks 8 GiB, "
        "1 no single GPU has 8 GiB free: the largest free piece is 7 GiB on gpu-2 (9 GiB "
        "free on 8 GPUs); pod asks 8 GiB, 5 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/153 nodes are available: 153 Preemption is not helpful for scheduling."
    )
    assert failure_reason(message) == (
        "Insufficient cpu; no single GPU has N GiB free; "
        "node(s) didn't match Pod's node affinity/selector"
    )
    assert failure_reason("") == "(no message: timed out)"
    result = WorkResult("x", 42, total_gpus=4)
    result.record(task(gpus=2), "G2")
    result.refused(task(milli=500, models=("T4",)), message)
    result.refused(task(milli=300), message)
    assert result.reasons == {f"share: {failure_reason(message)}": 2}
    assert result.failures[0][:3] == (0.5, "share", "T4")
