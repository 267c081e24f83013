"""agent.sync: what to write, from desired and current node state (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from agent.fake import FakeBackend
from agent.heartbeat import PodIdentity, lease_object
from agent.labels import Desired, desired_state
from agent.sync import NodeState, plan_sync
from extender.model import lease_heartbeat, node_facts
from extender.policies.heartbeat import HeartbeatPolicy
from gpu_scheduler import contract
from gpu_scheduler.timestamps import rfc3339_micro, rfc3339_seconds

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"
NOW = datetime(2026, 11, 29, 14, 0, 0, tzinfo=UTC)
BEAT = 300.0


def desired(name: str = "h100x8.yaml", **kw: bool) -> Desired:
    return desired_state(FakeBackend(FIXTURES / name).read(), **kw)


def synced_node(want: Desired, **extra: dict[str, str]) -> NodeState:
    return NodeState(
        name="gpu-1",
        labels={"kubernetes.io/hostname": "gpu-1", **want.labels, **extra.get("labels", {})},
        annotations={**want.annotations, **extra.get("annotations", {})},
        capacity={"cpu": "32", **want.capacity},
        resource_version="42",
    )


def test_nothing_changed_means_no_write() -> None:
    want = desired()
    plan = plan_sync(want, synced_node(want))
    assert plan.empty and plan.changed == ()


def test_capacity_equal_as_a_quantity_is_unchanged() -> None:
    want = desired()
    node = synced_node(want)
    node.capacity[contract.RESOURCE_GPU] = "8000m"  # type: ignore[index]
    assert plan_sync(want, node).empty


def test_first_sync_writes_labels_annotations_and_capacity() -> None:
    want = desired()
    node = NodeState("gpu-1", {"kubernetes.io/hostname": "gpu-1"}, {}, {"cpu": "32"}, "7")
    plan = plan_sync(want, node)
    meta = plan.metadata_patch["metadata"]  # type: ignore[index]
    assert meta["labels"] == want.labels
    assert meta["annotations"] == want.annotations  # no heartbeat: that is a Lease
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
    assert plan_sync(want, changed).status_patch == [
        {"op": "test", "path": "/status/capacity/nvidia.com~1gpu", "value": "7"},
        {"op": "replace", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"},
    ]
    bare = NodeState(node.name, node.labels, node.annotations, None, "42")
    assert plan_sync(want, bare).status_patch == [
        {"op": "add", "path": "/status/capacity", "value": {"nvidia.com/gpu": "8"}}
    ]


def test_no_capacity_flag_never_touches_capacity() -> None:
    want = desired(manage_capacity=False)
    node = synced_node(desired())
    wrong = NodeState(node.name, node.labels, node.annotations, {contract.RESOURCE_GPU: "3"})
    plan = plan_sync(want, wrong, manage_capacity=False)
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
    plan = plan_sync(after, node)
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
    plan = plan_sync(want, node)
    meta = plan.metadata_patch["metadata"]  # type: ignore[index]
    assert meta["labels"] == {contract.LABEL_GPU_MEMORY: "81559"}
    assert "annotations" not in meta
    assert plan.changed == (contract.LABEL_GPU_MEMORY,)
    assert plan.status_patch is None


def test_the_old_heartbeat_annotation_is_removed_once() -> None:
    """After an upgrade from the annotation heartbeat: the first sync removes it (an
    owned key that no longer applies), and then a steady node gets no write at all."""
    want = desired()
    old = {contract.ANN_LEGACY_HEARTBEAT: "2026-11-29T13:58:00Z"}
    node = synced_node(want, annotations=old)
    plan = plan_sync(want, node)
    assert plan.metadata_patch is not None and plan.status_patch is None
    assert plan.metadata_patch["metadata"]["annotations"] == {contract.ANN_LEGACY_HEARTBEAT: None}
    assert plan_sync(want, synced_node(want)).empty


POD = PodIdentity("gpu-scheduler", "gpu-scheduler-agent-x7k2p", "5b0c-uid")


def test_the_heartbeat_lease_round_trips_through_the_extender() -> None:
    """What the agent sends is what the extender reads: name = node, the label the
    extender's watch selects on, renewTime as a MicroTime, the pod as owner."""
    moment = datetime(2026, 11, 29, 14, 0, 0, 123_456, tzinfo=UTC)
    lease = lease_object("gpu-1", POD, moment, BEAT)
    assert lease["metadata"]["name"] == "gpu-1"
    assert lease["metadata"]["namespace"] == "gpu-scheduler"
    assert lease["metadata"]["labels"] == {contract.LEASE_LABEL: contract.LEASE_LABEL_VALUE}
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": POD.name, "uid": POD.uid}
    ]
    assert lease["spec"] == {
        "holderIdentity": "gpu-1",
        "leaseDurationSeconds": 900,
        "renewTime": "2026-11-29T14:00:00.123456Z",
    }
    # Written in another zone, still UTC on the wire.
    assert rfc3339_micro(moment.astimezone(ZoneInfo("Asia/Tokyo"))) == lease["spec"]["renewTime"]
    assert lease_heartbeat(lease) == ("gpu-1", moment.timestamp())
    later = lease_object("gpu-1", POD, moment + timedelta(seconds=300), BEAT)
    assert lease_heartbeat(later) == ("gpu-1", moment.timestamp() + 300)

    want = desired()
    node = synced_node(want)
    facts = node_facts(
        {
            "metadata": {"name": node.name, "labels": node.labels, "annotations": node.annotations},
            "status": {"allocatable": node.capacity},
        }
    )
    assert facts.heartbeat is None  # the Node carries no heartbeat: the Lease does
    facts.heartbeat = rfc3339_seconds(lease["spec"]["renewTime"])
    assert facts.memory_mib == 81559 and facts.product == "NVIDIA-H100-80GB-HBM3"

    from extender.engine import filter_nodes
    from extender.model import PodFacts
    from extender.view import View

    pod = PodFacts("default", "train", gpus=1)
    policy = HeartbeatPolicy(window_seconds=900)
    fresh = View(now=moment.timestamp() + 600)
    assert filter_nodes(pod, [facts.name], [facts], fresh, [policy]).passed == [facts.name]
    stale = View(now=moment.timestamp() + 901)
    failed = filter_nodes(pod, [facts.name], [facts], stale, [policy]).unresolvable
    assert "Lease" in failed[facts.name] and "901s ago" in failed[facts.name]


def test_only_agent_leases_are_heartbeats() -> None:
    lease = lease_object("gpu-1", POD, NOW, BEAT)
    assert lease_heartbeat({**lease, "metadata": {"name": "gpu-1"}}) is None  # no label
    other = {**lease["metadata"], "labels": {contract.LEASE_LABEL: "someone-else"}}
    assert lease_heartbeat({**lease, "metadata": other}) is None
    assert lease_heartbeat({**lease, "spec": {}}) == ("gpu-1", None)  # not renewed yet
    for junk in (None, [], "lease", {"metadata": []}, {"metadata": {"name": 7}}):
        assert lease_heartbeat(junk) is None


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


def test_the_unhealthy_count_label_is_written_even_where_gfd_labels_the_node() -> None:
    """GFD's keys are left to GFD there; the project's own label is not: a change of
    health must be a Node label change, which kube-scheduler's queue retries pods on."""
    fixtures = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"
    sick = desired_state(FakeBackend(fixtures / "h100x8-unhealthy.yaml").read())
    gfd = {contract.LABEL_GFD_TIMESTAMP: "1", contract.LABEL_GPU_PRODUCT: "X"}
    node = NodeState("gpu-1", dict(gfd), {}, None, "7")
    plan = plan_sync(sick, node, manage_capacity=False, write_gfd_labels=False)
    labels = plan.metadata_patch["metadata"]["labels"]
    assert labels == {contract.LABEL_GPUS_UNHEALTHY: sick.labels[contract.LABEL_GPUS_UNHEALTHY]}
    healed = desired_state(FakeBackend(fixtures / "h100x8.yaml").read())
    node = NodeState("gpu-1", {**gfd, contract.LABEL_GPUS_UNHEALTHY: "1"}, {}, None, "8")
    plan = plan_sync(healed, node, manage_capacity=False, write_gfd_labels=False)
    assert plan.metadata_patch["metadata"]["labels"] == {contract.LABEL_GPUS_UNHEALTHY: None}
