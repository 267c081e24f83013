"""agent.sync: what to write, from desired and current node state (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import jsonpatch

from agent.inventory import FakeBackend
from agent.labels import Desired, desired_state
from agent.sync import NodeState, heartbeat_due, plan_sync
from extender.model import node_facts
from extender.policies.heartbeat import HeartbeatPolicy
from gpu_scheduler import contract
from gpu_scheduler.timestamps import rfc3339, rfc3339_seconds

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"
NOW = datetime(2026, 11, 29, 14, 0, 0, tzinfo=UTC)
BEAT = 300.0


def desired(name: str = "h100x8.yaml", **kw: bool) -> Desired:
    return desired_state(FakeBackend(FIXTURES / name).read(), **kw)


def synced_node(want: Desired, beat: datetime = NOW, **extra: dict[str, str]) -> NodeState:
    return NodeState(
        name="gpu-1",
        labels={"kubernetes.io/hostname": "gpu-1", **want.labels, **extra.get("labels", {})},
        annotations={
            **want.annotations,
            contract.ANN_HEARTBEAT: rfc3339(beat),
            **extra.get("annotations", {}),
        },
        capacity={"cpu": "32", **want.capacity},
        resource_version="42",
    )


def test_nothing_changed_means_no_write() -> None:
    want = desired()
    plan = plan_sync(want, synced_node(want), NOW + timedelta(seconds=BEAT - 1), BEAT)
    assert plan.empty and plan.changed == ()


def test_capacity_equal_as_a_quantity_is_unchanged() -> None:
    want = desired()
    node = synced_node(want)
    node.capacity[contract.RESOURCE_GPU] = "8000m"  # type: ignore[index]
    assert plan_sync(want, node, NOW, BEAT).empty


def test_first_sync_writes_labels_annotations_heartbeat_and_capacity() -> None:
    want = desired()
    node = NodeState("gpu-1", {"kubernetes.io/hostname": "gpu-1"}, {}, {"cpu": "32"}, "7")
    plan = plan_sync(want, node, NOW, BEAT)
    meta = plan.metadata_patch["metadata"]  # type: ignore[index]
    assert meta["labels"] == want.labels
    assert meta["annotations"] == {
        **want.annotations,
        contract.ANN_HEARTBEAT: "2026-11-29T14:00:00Z",
    }
    assert meta["resourceVersion"] == "7"  # precondition: a concurrent change answers 409
    assert plan.status_patch == [
        {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}
    ]


def test_capacity_add_replace_and_missing_capacity_map() -> None:
    want = desired()
    node = synced_node(want)
    changed = NodeState(
        node.name, node.labels, node.annotations, {"cpu": "32", contract.RESOURCE_GPU: "7"}, "42"
    )
    assert plan_sync(want, changed, NOW, BEAT).status_patch == [
        {"op": "test", "path": "/status/capacity/nvidia.com~1gpu", "value": "7"},
        {"op": "replace", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"},
    ]
    bare = NodeState(node.name, node.labels, node.annotations, None, "42")
    assert plan_sync(want, bare, NOW, BEAT).status_patch == [
        {"op": "add", "path": "/status/capacity", "value": {"nvidia.com/gpu": "8"}}
    ]


def test_no_capacity_flag_never_touches_capacity() -> None:
    want = desired(manage_capacity=False)
    node = synced_node(desired())
    wrong = NodeState(node.name, node.labels, node.annotations, {contract.RESOURCE_GPU: "3"})
    plan = plan_sync(want, wrong, NOW, BEAT, manage_capacity=False)
    assert plan.status_patch is None and plan.metadata_patch is None


def test_owned_labels_that_no_longer_apply_are_removed_and_foreign_keys_untouched() -> None:
    before = desired()
    foreign_labels = {
        "nvidia.com/gpu.machine": "DGX-1",  # GFD's, not ours
        "nvidia.com/gpu.deploy.driver": "true",
        contract.LABEL_ZONE: "us-east-1a",
    }
    foreign_annotations = {"node.alpha.kubernetes.io/ttl": "0", "gpu-scheduler.io/other": "x"}
    node = synced_node(before, labels=foreign_labels, annotations=foreign_annotations)
    after = desired("cpu-none.yaml")
    plan = plan_sync(after, node, NOW, BEAT)
    meta = plan.metadata_patch["metadata"]  # type: ignore[index]
    removed = {k for k, v in meta["labels"].items() if v is None}
    assert removed == set(before.labels) - {contract.LABEL_GPU_PRESENT}
    assert meta["labels"][contract.LABEL_GPU_PRESENT] == "false"
    assert set(meta["labels"]) <= set(contract.AGENT_LABELS)
    assert set(meta["annotations"]) <= set(contract.AGENT_ANNOTATIONS)
    assert meta["annotations"][contract.ANN_GPUS] == "[]"
    assert plan.status_patch == [
        {"op": "test", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"},
        {"op": "replace", "path": "/status/capacity/nvidia.com~1gpu", "value": "0"},
    ]
    # Applied as the API server would: foreign keys survive unchanged.
    merged = _merge({"labels": dict(node.labels), "annotations": dict(node.annotations)}, meta)
    for key, value in foreign_labels.items():
        assert merged["labels"][key] == value
    for key, value in foreign_annotations.items():
        assert merged["annotations"][key] == value
    assert {k: v for k, v in merged["labels"].items() if k in contract.AGENT_LABELS} == after.labels


def test_one_changed_label_patches_only_that_label() -> None:
    want = desired()
    node = synced_node(want, labels={contract.LABEL_GPU_MEMORY: "40960"})
    plan = plan_sync(want, node, NOW + timedelta(seconds=10), BEAT)
    meta = plan.metadata_patch["metadata"]  # type: ignore[index]
    assert meta["labels"] == {contract.LABEL_GPU_MEMORY: "81559"}
    assert meta["annotations"] == {contract.ANN_HEARTBEAT: "2026-11-29T14:00:10Z"}
    assert plan.changed == (contract.LABEL_GPU_MEMORY,)
    assert plan.status_patch is None


def test_heartbeat_cadence_with_an_injected_clock() -> None:
    """A node in a steady state, synced every 60 s for an hour: one write per 5 minutes."""
    want = desired()
    node = {
        "metadata": {"name": "gpu-1", "labels": {}, "annotations": {}, "resourceVersion": "1"},
        "status": {"capacity": {"cpu": "32"}},
    }
    writes: list[tuple[int, str]] = []
    for second in range(0, 3600, 60):
        now = NOW + timedelta(seconds=second)
        plan = plan_sync(want, NodeState.from_json(node), now, BEAT)
        if plan.metadata_patch:
            node["metadata"] = _merge(node["metadata"], plan.metadata_patch["metadata"])
            writes.append((second, "metadata"))
        if plan.status_patch:
            node = jsonpatch.apply_patch(node, plan.status_patch)
            writes.append((second, "status"))
    assert writes[:2] == [(0, "metadata"), (0, "status")]
    assert [s for s, kind in writes if kind == "metadata"] == list(range(0, 3600, 300))
    assert [s for s, kind in writes if kind == "status"] == [0]


def test_heartbeat_due() -> None:
    beat = rfc3339(NOW)
    assert heartbeat_due(None, NOW, BEAT)
    assert heartbeat_due("yesterday", NOW, BEAT)
    assert heartbeat_due("2026-11-29T14:00:00", NOW, BEAT)  # no zone: unreadable
    assert not heartbeat_due(beat, NOW + timedelta(seconds=BEAT - 1), BEAT)
    assert heartbeat_due(beat, NOW + timedelta(seconds=BEAT), BEAT)
    assert not heartbeat_due(beat, NOW - timedelta(seconds=10), BEAT)  # small skew
    assert heartbeat_due(beat, NOW - timedelta(hours=1), BEAT)  # clock jumped back


def test_heartbeat_round_trips_through_the_extender() -> None:
    moment = datetime(2026, 11, 29, 14, 0, 0, 999_000, tzinfo=UTC)
    text = rfc3339(moment)
    assert text == "2026-11-29T14:00:00Z"
    assert rfc3339_seconds(text) == NOW.timestamp()
    # Written in another zone, still UTC on the wire.
    assert rfc3339(NOW.astimezone(ZoneInfo("Asia/Tokyo"))) == text

    want = desired()
    node = synced_node(want)
    facts = node_facts(
        {
            "metadata": {"name": node.name, "labels": node.labels, "annotations": node.annotations},
            "status": {"allocatable": node.capacity},
        }
    )
    assert facts.heartbeat == NOW.timestamp()
    assert facts.memory_mib == 81559 and facts.product == "NVIDIA-H100-80GB-HBM3"
    assert facts.allocatable == 8

    from extender.model import PodFacts
    from extender.view import View

    pod = PodFacts("default", "train", gpus=1)
    policy = HeartbeatPolicy(window_seconds=900)
    fresh = View(now=NOW.timestamp() + 600)
    assert policy.filter(policy.pre_filter(pod, fresh), facts, fresh) is None  # type: ignore[arg-type]
    stale = View(now=NOW.timestamp() + 901)
    failure = policy.filter(policy.pre_filter(pod, stale), facts, stale)  # type: ignore[arg-type]
    assert failure is not None and contract.ANN_HEARTBEAT in failure.reason


def _merge(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch, as the API server applies it."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = _merge(out.get(key) or {}, value)
        else:
            out[key] = value
    return out
