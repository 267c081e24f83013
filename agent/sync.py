"""What to write to the Node, from what it should carry and what it carries now. Pure.

- one JSON merge patch on the Node for labels and annotations: it sets the owned keys
  that differ, sets ``null`` for owned keys that no longer apply, and names no other
  key (so labels and annotations of others are never touched). It carries the Node's
  ``resourceVersion`` as a precondition: a concurrent change answers 409 and the
  agent re-reads and re-plans;
- one JSON patch on ``/status`` for ``capacity["nvidia.com/gpu"]`` (``add`` when the key
  is absent, ``test`` + ``replace`` when present), as Kubernetes' "advertise extended
  resources for a node" task does;
- nothing else: in a steady state the agent writes nothing to the Node at all (its
  heartbeat is a Lease, :mod:`agent.heartbeat`). The old heartbeat annotation is one
  of the owned keys that no longer apply, so the first sync after an upgrade removes
  it.

What the agent may write at all is decided here too (:func:`ownership`): GPU Feature
Discovery's label keys only where GFD does not label the node (``--gfd-labels``), and
``nvidia.com/gpu`` capacity only where advertising it is enabled and nobody else
(a device plugin through the kubelet, a DRA driver) provides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.labels import Desired
from gpu_scheduler import contract
from gpu_scheduler.kube import json_pointer_token
from gpu_scheduler.quantity import QuantityError, parse_quantity

FIELD_MANAGER = "gpu-scheduler-agent"
GFD_MODES = ("auto", "always", "never")


@dataclass(frozen=True, slots=True)
class NodeState:
    """The parts of a Node the agent reads."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] | None = None  # None: the Node has no status.capacity at all
    resource_version: str | None = None
    #: Field managers that own ``status.capacity["nvidia.com/gpu"]`` (managedFields).
    capacity_owners: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, node: Mapping[str, Any]) -> NodeState:
        meta = node.get("metadata") or {}
        status = node.get("status") or {}
        capacity = status.get("capacity")
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            capacity=None if capacity is None else {k: str(v) for k, v in capacity.items()},
            resource_version=meta.get("resourceVersion"),
            capacity_owners=capacity_owners(meta.get("managedFields")),
        )


def capacity_owners(managed_fields: Any) -> frozenset[str]:
    """Who owns ``status.capacity["nvidia.com/gpu"]``, from server-side apply's
    managedFields (the kubelet writes device-plugin capacity as manager "kubelet")."""
    owners = set()
    for entry in managed_fields or ():
        if not isinstance(entry, Mapping):
            continue
        fields = entry.get("fieldsV1")
        status = fields.get("f:status") if isinstance(fields, Mapping) else None
        capacity = status.get("f:capacity") if isinstance(status, Mapping) else None
        if isinstance(capacity, Mapping) and f"f:{contract.RESOURCE_GPU}" in capacity:
            manager = entry.get("manager")
            if isinstance(manager, str):
                owners.add(manager)
    return frozenset(owners)


@dataclass(frozen=True, slots=True)
class Ownership:
    """What the agent writes on this node this round, and why not the rest."""

    gfd_labels: bool
    capacity: bool
    why_not_gfd: str = ""
    why_not_capacity: str = ""


def ownership(
    node: NodeState, gfd_mode: str, advertise_capacity: bool, dra_gpus: int | None
) -> Ownership:
    """``gfd_mode``: ``always`` write GFD's keys, ``never``, or ``auto`` (unless GFD
    labels the node: ``nvidia.com/gfd.timestamp``). Capacity only when advertising is
    enabled and no other writer owns it, nor a DRA driver publishes GPUs for the node
    (``dra_gpus``: devices of the class serving ``nvidia.com/gpu``; None: unknown)."""
    gfd, why_gfd = True, ""
    if gfd_mode == "never":
        gfd, why_gfd = False, "--gfd-labels never"
    elif gfd_mode == "auto" and contract.LABEL_GFD_TIMESTAMP in node.labels:
        gfd = False
        why_gfd = f"GPU Feature Discovery labels this node ({contract.LABEL_GFD_TIMESTAMP})"
    capacity, why_cap = advertise_capacity, "" if advertise_capacity else "capacity off"
    others = node.capacity_owners - {FIELD_MANAGER}
    if capacity and others:
        capacity = False
        why_cap = (
            f"{contract.RESOURCE_GPU} capacity is written by {', '.join(sorted(others))} "
            "(the NVIDIA device plugin, through the kubelet)"
        )
    elif capacity and dra_gpus:
        capacity = False
        why_cap = f"a DRA driver publishes {dra_gpus} GPU devices for this node"
    return Ownership(gfd, capacity, why_gfd, why_cap)


@dataclass(frozen=True, slots=True)
class Plan:
    """At most two writes; both None: nothing to do."""

    metadata_patch: dict[str, Any] | None = None
    status_patch: list[dict[str, Any]] | None = None
    changed: tuple[str, ...] = ()  # the keys that differ (for the log line)

    @property
    def empty(self) -> bool:
        return self.metadata_patch is None and self.status_patch is None


def plan_sync(
    desired: Desired,
    node: NodeState,
    *,
    manage_capacity: bool = True,
    write_gfd_labels: bool = True,
) -> Plan:
    changed: list[str] = []
    labels: dict[str, str | None] = {}
    owned = (*contract.AGENT_LABELS, *contract.AGENT_OWN_LABELS) if write_gfd_labels else ()
    for key in owned or contract.AGENT_OWN_LABELS:
        want = desired.labels.get(key)
        if node.labels.get(key) != want and (want is not None or key in node.labels):
            labels[key] = want
            changed.append(key)
    annotations: dict[str, str | None] = {}
    for key in contract.AGENT_ANNOTATIONS:
        want = desired.annotations.get(key)
        if node.annotations.get(key) != want and (want is not None or key in node.annotations):
            annotations[key] = want
            changed.append(key)
    metadata_patch = None
    if labels or annotations:
        meta: dict[str, Any] = {}
        if annotations:
            meta["annotations"] = annotations
        if labels:
            meta["labels"] = labels
        if node.resource_version:
            meta["resourceVersion"] = node.resource_version
        metadata_patch = {"metadata": meta}

    status_patch = None
    if manage_capacity:
        status_patch = capacity_patch(desired.capacity, node.capacity)
        if status_patch:
            changed.append(f"capacity/{contract.RESOURCE_GPU}")
    return Plan(metadata_patch, status_patch or None, tuple(changed))


def capacity_patch(
    desired: Mapping[str, str], current: Mapping[str, str] | None
) -> list[dict[str, Any]] | None:
    """JSON patch ops bringing ``status.capacity`` to ``desired``, or None if equal."""
    want = desired.get(contract.RESOURCE_GPU)
    if want is None:
        return None
    if current is None:
        return [{"op": "add", "path": "/status/capacity", "value": {contract.RESOURCE_GPU: want}}]
    path = "/status/capacity/" + json_pointer_token(contract.RESOURCE_GPU)
    have = current.get(contract.RESOURCE_GPU)
    if have is None:
        return [{"op": "add", "path": path, "value": want}]
    if _same_quantity(have, want):
        return None
    # test first: if another writer changed it since we read, the patch fails (422)
    # and the agent re-reads instead of overwriting blind.
    return [
        {"op": "test", "path": path, "value": have},
        {"op": "replace", "path": path, "value": want},
    ]


def _same_quantity(a: str, b: str) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except QuantityError:
        return a == b
