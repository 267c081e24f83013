"""The agent's heartbeat: a coordination.k8s.io/v1 Lease named as its node, in the
install's namespace. Pure: what to send; :mod:`agent.kubeapi` sends it.

- The Lease is owned by the agent's Pod (an ownerReference with the pod's UID, from
  the downward API), so the garbage collector deletes it when the pod goes: a
  DaemonSet whose nodeSelector no longer matches, an uninstall, a node the autoscaler
  removed. A node without a Lease is not agent-managed, and the extender never
  refuses it on heartbeats: no heartbeat can be left behind.
- Each renewal is one server-side apply of the whole Lease as the agent wants it
  (label, owner, holder, duration, renewTime): it creates the Lease when there is
  none, and a pod that replaced its predecessor takes the Lease over with its first
  renewal (the same field manager applies a new owner, so the old one is dropped)
  before the garbage collector would delete it with the old owner. Applied as a
  plain dict: the kubernetes client's typed V1Lease would turn ``renewTime`` into a
  datetime and send it back without the six fractional digits a MicroTime has.
- The Lease never touches the Node: renewing it reaches the extender (the one watcher
  of these Leases) and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_scheduler import contract
from gpu_scheduler.timestamps import rfc3339_micro

LEASE_API_VERSION = "coordination.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """The agent's own Pod (downward API: metadata.namespace, .name, .uid)."""

    namespace: str
    name: str
    uid: str

    @classmethod
    def from_values(
        cls, namespace: str | None, name: str | None, uid: str | None
    ) -> PodIdentity | None:
        """The identity, or None when any part is missing (not running in a pod)."""
        if namespace and name and uid:
            return cls(namespace, name, uid)
        return None


def lease_duration(interval_s: float) -> int:
    """``spec.leaseDurationSeconds``: three renewal intervals, in whole seconds (what a
    reader of the Lease alone would take for "expired"; the extender judges by its own
    ``heartbeatWindow``)."""
    return max(1, math.ceil(3 * interval_s))


def lease_object(node: str, pod: PodIdentity, now: datetime, interval_s: float) -> dict[str, Any]:
    """The node's Lease as the agent applies it at ``now``."""
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": pod.namespace,
            "labels": {contract.LEASE_LABEL: contract.LEASE_LABEL_VALUE},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
            ],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": lease_duration(interval_s),
            "renewTime": rfc3339_micro(now),
        },
    }
