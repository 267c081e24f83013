"""What a pod spec asks for, read as kube-scheduler reads it: per-container and
effective pod requests of a resource (sidecars and overhead counted), whole GPUs, CPU
and memory, the PodGroup it joins, and the preferences it asks kube-scheduler's scoring
to weigh. JSON forms in; :class:`FieldError` names the
field that is malformed."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpu_scheduler.contract import (
    ANN_GROUP,
    ANN_KUEUE_WORKLOAD,
    LABEL_KUEUE_POD_GROUP,
    LABEL_KUEUE_PODSET,
    POD_GROUP_FIELD,
    RESOURCE_GPU,
)
from gpu_scheduler.fields import (
    FieldError,
    expect_object,
    key_path,
    list_at,
    object_at,
    string_at,
)
from gpu_scheduler.quantity import QuantityError, mib, millis, parse_quantity
from gpu_scheduler.textclip import clip

_ZERO = Decimal(0)


def container_request(container: Mapping[str, Any], resource: str, path: str) -> Decimal:
    """A container's request for ``resource``; a limit implies the request.

    The API server defaults a missing request to the limit, and extended resources
    cannot be overcommitted, so ``limits`` alone counts exactly like ``requests``.
    Raises :class:`FieldError` naming the field for a wrong type or a value that is
    not a non-negative quantity.
    """
    resources = object_at(container, "resources", f"{path}.resources")
    for kind in ("requests", "limits"):
        where = f"{path}.resources.{kind}"
        value = object_at(resources, kind, where).get(resource)
        if value is not None:
            return _quantity(value, key_path(where, resource))
    return _ZERO


def pod_request(spec: Mapping[str, Any], resource: str) -> Decimal:
    """A pod's effective request for one resource, as kube-scheduler computes it.

    ``max(sum(containers) + sum(sidecars), max over init containers of (own request +
    sidecars started before it))`` plus ``overhead``, following
    ``k8s.io/component-helpers/resource.PodRequests``: restartable (sidecar) init
    containers keep running beside the app containers, so they add to the sum; a plain
    init container runs alone, beside only the sidecars started before it.
    Raises :class:`FieldError` naming the first malformed field.
    """
    total = _ZERO
    for i, container in enumerate(list_at(spec, "containers", "spec.containers")):
        where = f"spec.containers[{i}]"
        total += container_request(expect_object(container, where), resource, where)
    sidecars = _ZERO
    init_peak = _ZERO
    for i, init in enumerate(list_at(spec, "initContainers", "spec.initContainers")):
        where = f"spec.initContainers[{i}]"
        init = expect_object(init, where)
        own = container_request(init, resource, where)
        if init.get("restartPolicy") == "Always":
            total += own
            sidecars += own
            during = sidecars
        else:
            during = own + sidecars
        init_peak = max(init_peak, during)
    total = max(total, init_peak)
    overhead = object_at(spec, "overhead", "spec.overhead").get(resource)
    if overhead is not None:
        total += _quantity(overhead, key_path("spec.overhead", resource))
    return total


def pod_gpu_request(spec: Any) -> int:
    """How many whole GPUs (``nvidia.com/gpu``) a pod spec requests.

    ``spec`` is the pod's ``spec`` in its JSON form. Raises :class:`FieldError` for a
    malformed field, or a negative or fractional quantity (the API server rejects
    those too).
    """
    if spec is None:
        return 0
    value = pod_request(expect_object(spec, "spec"), RESOURCE_GPU)
    if value != value.to_integral_value():
        raise FieldError(
            f"{RESOURCE_GPU} request", f"must be a whole number, got {value}", wrong_type=False
        )
    return int(value)


def pod_group_name(spec: Mapping[str, Any]) -> str | None:
    """The PodGroup a pod spec (JSON form) joins (``spec.schedulingGroup.podGroupName``),
    or None. Raises :class:`FieldError` for a field of the wrong type."""
    outer, inner = POD_GROUP_FIELD
    group = object_at(spec, outer, f"spec.{outer}")
    return string_at(group, inner, f"spec.{outer}.{inner}") or None


def pod_gang(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """The gang a pod belongs to, as a key (``kind/namespace/name``), or None: a
    PodGroup it joins, its ``gpu-scheduler.io/group``, its Kueue plain-pod group, or
    the Kueue workload it is a pod of (the Workload it names, else its controlling
    owner). Never raises: a field of the wrong type counts as absent."""
    namespace = meta.get("namespace")
    namespace = namespace if isinstance(namespace, str) else "default"
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    try:
        group = pod_group_name(spec)
    except FieldError:
        group = None
    found = [
        ("podgroup", group),
        ("group", annotations.get(ANN_GROUP)),
        ("kueue-pods", labels.get(LABEL_KUEUE_POD_GROUP)),
    ]
    if LABEL_KUEUE_PODSET in labels:
        found.append(("kueue", annotations.get(ANN_KUEUE_WORKLOAD) or _controller(meta)))
    for kind, name in found:
        if isinstance(name, str) and name:
            return f"{kind}/{namespace[:253]}/{name[:253]}"
    return None


def _controller(meta: Mapping[str, Any]) -> str | None:
    """The UID of the object that controls a pod (its Job, its JobSet's Job...)."""
    owners = meta.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if isinstance(owner, Mapping) and owner.get("controller") is True:
            uid = owner.get("uid")
            return uid if isinstance(uid, str) else None
    return None


def pod_priority(spec: Mapping[str, Any]) -> int:
    """``spec.priority``, which admission sets from the PriorityClass (0 when absent
    or not an integer)."""
    value = spec.get("priority")
    if type(value) is not int:
        return 0
    return max(min(value, 2**31 - 1), -(2**31))


#: Affinity kinds whose ``preferredDuringSchedulingIgnoredDuringExecution`` terms
#: kube-scheduler's NodeAffinity and InterPodAffinity scores weigh.
PREFERRED_AFFINITIES = (
    ("nodeAffinity", "preferred node affinity"),
    ("podAffinity", "preferred pod affinity"),
    ("podAntiAffinity", "preferred pod anti-affinity"),
)
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def pod_preference(spec: Mapping[str, Any]) -> str | None:
    """What in a pod spec asks kube-scheduler's own scoring to weigh nodes, in words
    (the first found), or None: preferred node affinity, preferred pod affinity or
    anti-affinity, or a topology spread constraint with ``whenUnsatisfiable:
    ScheduleAnyway``. Raises :class:`FieldError` for a field of the wrong type."""
    affinity = object_at(spec, "affinity", "spec.affinity")
    for kind, words in PREFERRED_AFFINITIES:
        terms = object_at(affinity, kind, f"spec.affinity.{kind}")
        if list_at(terms, PREFERRED, f"spec.affinity.{kind}.{PREFERRED}"):
            return words
    for i, constraint in enumerate(
        list_at(spec, "topologySpreadConstraints", "spec.topologySpreadConstraints")
    ):
        path = f"spec.topologySpreadConstraints[{i}]"
        constraint = expect_object(constraint, path)
        when = string_at(constraint, "whenUnsatisfiable", f"{path}.whenUnsatisfiable")
        if when == "ScheduleAnyway":
            return "a ScheduleAnyway topology spread constraint"
    return None


def pod_cpu_memory(spec: Any) -> tuple[int, int]:
    """A pod's CPU (millicores) and memory (MiB) requests, as kube-scheduler sums them;
    (0, 0) parts for a spec it cannot read (for preferences only: never raises)."""
    values = []
    for resource, unit in (("cpu", millis), ("memory", mib)):
        try:
            amount = pod_request(expect_object(spec, "spec"), resource) if spec else _ZERO
        except FieldError:
            amount = _ZERO
        values.append(min(unit(amount), 1 << 40))
    return values[0], values[1]


def _quantity(value: Any, path: str) -> Decimal:
    try:
        quantity = parse_quantity(value)
    except QuantityError as exc:
        wrong_type = not isinstance(value, str | int | float) or isinstance(value, bool)
        raise FieldError(path, str(exc), wrong_type=wrong_type) from None
    if quantity < 0:
        raise FieldError(path, f"must not be negative, got {clip(value)}", wrong_type=False)
    return quantity
