"""What the cluster cache lists and watches, and from where: one
:class:`~extender.reflector.Reflector` per kind, wired to the cache's ``replace_*``
(a list) and ``*_event`` (a watch event) methods.

Nodes, bound Pods and pending Pods always. With a ``resource_api`` (ResourceV1Api), the DRA kinds:
DeviceClasses, ResourceSlices (listed after the classes, which say which devices are
GPUs), ResourceClaims and DeviceTaintRules. With a ``coordination_api``
(CoordinationV1Api) and a namespace, the agents' heartbeat Leases there. The DRA kinds
and the Leases are optional: a cluster that does not serve them (or forbids reading
them) has none, and says so; without heartbeats the heartbeat policy holds nothing
against any node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from extender.cache_pending import PENDING_FIELD_SELECTOR
from extender.reflector import Reflector
from gpu_scheduler import contract

# Bound and not finished: the pods that hold GPUs (field selectors keep the rest away,
# and a pod that finishes or is deleted arrives as DELETED).
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
POD_FIELD_SELECTOR = f"spec.nodeName!=,{LIVE_PODS}"
#: Kinds that need not wait for the DeviceClasses' first list.
_NOT_AFTER_CLASSES = (
    "nodes",
    "pods",
    "pending",
    "leases",
    "deviceclasses",
    "resourceclaims",
    "devicetaintrules",
)

# kind -> (list function, its parameters, the cache's replace, its event, optional)
Source = tuple[Any, dict[str, Any], Callable[..., None], Callable[..., None], bool]


def sources(
    cache: Any, core_api: Any, resource_api: Any, coordination_api: Any, namespace: str | None
) -> dict[str, Source]:
    found: dict[str, Source] = {
        "nodes": (core_api.list_node, {}, cache.replace_nodes, cache.node_event, False),
        "pods": (
            core_api.list_pod_for_all_namespaces,
            {"field_selector": POD_FIELD_SELECTOR},
            cache.replace_pods,
            cache.pod_event,
            False,
        ),
        # Pending pods: picks that will not bind, and nominated preemptors
        # (extender/cache_pending.py).
        "pending": (
            core_api.list_pod_for_all_namespaces,
            {"field_selector": PENDING_FIELD_SELECTOR},
            cache.replace_pending,
            cache.pending_event,
            False,
        ),
    }
    if resource_api is not None:
        found |= {
            "deviceclasses": (
                resource_api.list_device_class,
                {},
                cache.replace_device_classes,
                cache.device_class_event,
                True,
            ),
            "resourceslices": (
                resource_api.list_resource_slice,
                {},
                cache.replace_slices,
                cache.slice_event,
                True,
            ),
            "resourceclaims": (
                resource_api.list_resource_claim_for_all_namespaces,
                {},
                cache.replace_claims,
                cache.claim_event,
                True,
            ),
            # KEP-5055's rules that taint devices (GA in 1.37; absent before)
            "devicetaintrules": (
                resource_api.list_device_taint_rule,
                {},
                cache.replace_taint_rules,
                cache.taint_rule_event,
                True,
            ),
        }
    if coordination_api is not None and namespace:
        found["leases"] = (
            coordination_api.list_namespaced_lease,
            {"namespace": namespace, "label_selector": contract.LEASE_SELECTOR},
            cache.replace_leases,
            cache.lease_event,
            True,
        )
    return found


def reflectors(
    cache: Any,
    core_api: Any,
    resource_api: Any,
    coordination_api: Any,
    namespace: str | None,
    stop: threading.Event,
    clock: Callable[[], float],
) -> dict[str, Reflector]:
    """One Reflector per kind (not started), sharing ``stop`` and a connection reset."""
    from gpu_scheduler.kube import reset_connections

    def reset() -> None:
        reset_connections(core_api.api_client)

    out: dict[str, Reflector] = {}
    # The slices wait for the classes' first list: which devices are GPUs depends on it.
    for kind, (func, params, replace, apply, optional) in sources(
        cache, core_api, resource_api, coordination_api, namespace
    ).items():
        classes = out.get("deviceclasses")
        out[kind] = Reflector(
            kind,
            func,
            params,
            replace,
            apply,
            stop=stop,
            reset_connections=reset,
            clock=clock,
            optional=optional,
            after=classes.synced
            if classes is not None and kind not in _NOT_AFTER_CLASSES
            else None,
        )
    return out
