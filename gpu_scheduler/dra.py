"""Dynamic Resource Allocation (``resource.k8s.io/v1``), as far as GPUs go.

Kubernetes 1.37 (``DRAExtendedResource``, GA) lets a pod that asks for
``nvidia.com/gpu: 2`` be served by a DRA driver: a DeviceClass names the extended
resource (``spec.extendedResourceName``), kube-scheduler allocates devices of that
class from the node's ResourceSlices through a ResourceClaim it creates, and the node
advertises no ``nvidia.com/gpu`` allocatable at all. This module reads those objects
into what the extender and the agent need, and nothing more:

- :func:`device_class`: a DeviceClass's extended-resource name and CEL selectors;
  :func:`class_for` picks the class serving a resource name with upstream's tie-break
  (the newest wins; at equal times, the name that sorts first);
- :func:`slice_devices`: the node-local devices a ResourceSlice publishes (driver,
  pool, name, node, attributes, capacity);
- :func:`claim_devices`: the devices a ResourceClaim has been allocated;
- :class:`ClassMatcher`: whether a device belongs to a class, by evaluating the
  class's CEL selectors with ``cel-python``. Evaluation is memoised on the parts of
  the device the expressions name, so the thousands of identical GPUs of a cluster
  cost a handful of evaluations. Selectors using functions ``cel-python`` lacks
  (Kubernetes' ``semver``, ``quantity``) do not match, and say so once in the log.

The attribute names are the NVIDIA DRA driver's (kubernetes-sigs/dra-driver-nvidia-gpu,
driver ``gpu.nvidia.com``): ``productName`` (string) and capacity ``memory`` (bytes).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpu_scheduler.quantity import QuantityError, parse_quantity

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSION = "v1"
#: The annotation kube-scheduler puts on the claims it creates for extended resources.
ANN_EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
#: The NVIDIA DRA driver's name (and its attribute domain).
NVIDIA_DRIVER = "gpu.nvidia.com"
ATTR_PRODUCT = "productName"
CAPACITY_MEMORY = "memory"

DeviceKey = tuple[str, str, str]  # (driver, pool, device): what a claim names


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    extended_resource_name: str | None
    selectors: tuple[str, ...]
    created: str  # RFC 3339; compares as text


@dataclass(frozen=True, slots=True)
class Device:
    driver: str
    pool: str
    name: str
    node: str
    #: domain -> attribute name -> value (str, int, bool; a version as its string)
    attributes: Mapping[str, Mapping[str, Any]]
    #: domain -> capacity name -> value (a quantity, exact)
    capacity: Mapping[str, Mapping[str, Decimal]]
    #: Its taints that keep new pods off it (KEP-5055: effect NoSchedule or NoExecute),
    #: as ``key=value:Effect``; a pod asking for the extended resource tolerates none.
    taints: tuple[str, ...] = ()
    #: ``allowMultipleAllocations`` (consumable capacity, KEP-5075): claims share it,
    #: each consuming some of its capacity.
    shareable: bool = False

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    def attribute(self, name: str) -> Any:
        """An attribute of the driver's own domain."""
        return self.attributes.get(self.driver, {}).get(name)

    def capacity_of(self, name: str) -> Decimal | None:
        return self.capacity.get(self.driver, {}).get(name)


def _name_and_spec(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """The name and spec of a cluster-scoped object (None: either is missing or not
    of its type)."""
    meta, spec = obj.get("metadata"), obj.get("spec")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name or not isinstance(spec, Mapping):
        return None
    return name, spec


def device_class(obj: Mapping[str, Any]) -> DeviceClass | None:
    """A DeviceClass in its JSON form (None when it is unreadable)."""
    named = _name_and_spec(obj)
    if named is None:
        return None
    name, spec = named
    resource = spec.get("extendedResourceName")
    selectors = []
    for item in spec.get("selectors") or ():
        cel = item.get("cel") if isinstance(item, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str):
            selectors.append(expression)
    created = obj["metadata"].get("creationTimestamp")
    return DeviceClass(
        name,
        resource if isinstance(resource, str) and resource else None,
        tuple(selectors),
        created if isinstance(created, str) else "",
    )


def class_for(classes: Iterable[DeviceClass], resource: str) -> DeviceClass | None:
    """The class that serves ``resource``: upstream's rule for two classes naming the
    same extended resource is that the one created later wins, and at equal times the
    name that sorts first (k8s.io/dynamic-resource-allocation, extendedresourcecache)."""
    best: DeviceClass | None = None
    for item in classes:
        if item.extended_resource_name != resource:
            continue
        if best is None or (item.created, _desc(item.name)) > (best.created, _desc(best.name)):
            best = item
    return best


def _desc(name: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in name)  # sorts names backwards: the first name wins


def _values(raw: Any, driver: str, kind: str) -> dict[str, dict[str, Any]]:
    """``{"type": {"string": "gpu"}, "d/x": {...}}`` -> ``{driver: {"type": "gpu"}, "d": ...}``."""
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(raw, Mapping):
        return out
    for qualified, wrapped in raw.items():
        if not isinstance(qualified, str) or not isinstance(wrapped, Mapping):
            continue
        domain, _, short = qualified.rpartition("/")
        domain = domain or driver
        if kind == "attributes":
            value = next(
                (wrapped[k] for k in ("string", "int", "bool", "version") if k in wrapped), None
            )
        else:
            try:
                value = parse_quantity(wrapped.get("value"))
            except QuantityError:
                continue
        if value is not None:
            out.setdefault(domain, {})[short] = value
    return out


def slice_devices(obj: Mapping[str, Any]) -> tuple[str, str, int, list[Device]] | None:
    """(driver, pool, generation, node-local devices) of a ResourceSlice; None when
    the slice is unreadable. Devices of slices that are not node-local (a node
    selector, all nodes) are left out: they are not a node's GPUs."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    driver = spec.get("driver")
    pool = spec.get("pool")
    if not isinstance(driver, str) or not isinstance(pool, Mapping):
        return None
    pool_name = pool.get("name")
    generation = pool.get("generation", 0)
    if not isinstance(pool_name, str) or not isinstance(generation, int):
        return None
    node = spec.get("nodeName")
    per_device = spec.get("perDeviceNodeSelection") is True
    devices = []
    for raw in spec.get("devices") or ():
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            continue
        where = raw.get("nodeName") if per_device else node
        if not isinstance(where, str) or not where:
            continue
        devices.append(
            Device(
                driver,
                pool_name,
                sys.intern(raw["name"]),
                sys.intern(where),
                _values(raw.get("attributes"), driver, "attributes"),
                _values(raw.get("capacity"), driver, "capacity"),
                device_taints(raw.get("taints")),
                raw.get("allowMultipleAllocations") is True,
            )
        )
    return driver, pool_name, generation, devices


#: Device taint effects that keep a pod off a device it does not tolerate.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
#: A device carries at most this many taints the API accepts; more is garbage.
MAX_TAINTS = 16


def device_taints(raw: Any) -> tuple[str, ...]:
    """A device's blocking taints (ResourceSlice ``devices[].taints``, or what a
    DeviceTaintRule adds), as ``key=value:Effect``; the rest are left out."""
    out = []
    for taint in raw if isinstance(raw, list) else ():
        if not isinstance(taint, Mapping) or taint.get("effect") not in BLOCKING_EFFECTS:
            continue
        key, value = taint.get("key"), taint.get("value")
        if not isinstance(key, str) or not key:
            continue
        text = key[:253] + (f"={value[:63]}" if isinstance(value, str) and value else "")
        out.append(f"{text}:{taint['effect']}")
        if len(out) >= MAX_TAINTS:
            break
    return tuple(out)


@dataclass(frozen=True, slots=True)
class TaintRule:
    """A DeviceTaintRule (``resource.k8s.io/v1``): the devices its selector picks
    (each field None: any) get its taint, when the taint blocks (see
    :data:`BLOCKING_EFFECTS`)."""

    name: str
    driver: str | None
    pool: str | None
    device: str | None
    taint: str  # key=value:Effect; "" when the effect does not block

    def selects(self, key: DeviceKey) -> bool:
        driver, pool, device = key
        return (
            (self.driver is None or self.driver == driver)
            and (self.pool is None or self.pool == pool)
            and (self.device is None or self.device == device)
        )


def taint_rule(obj: Mapping[str, Any]) -> TaintRule | None:
    """A DeviceTaintRule in its JSON form (None when it is unreadable)."""
    named = _name_and_spec(obj)
    if named is None:
        return None
    name, spec = named
    selector = spec.get("deviceSelector")
    selector = selector if isinstance(selector, Mapping) else {}

    def field(key: str) -> str | None:
        value = selector.get(key)
        return value if isinstance(value, str) and value else None

    taints = device_taints([spec.get("taint")])
    return TaintRule(name, field("driver"), field("pool"), field("device"), "".join(taints[:1]))


def claim_devices(obj: Mapping[str, Any]) -> frozenset[DeviceKey]:
    """The devices a ResourceClaim has been allocated (empty: none yet)."""
    status = obj.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    out = set()
    for result in results or ():
        if not isinstance(result, Mapping):
            continue
        key = (result.get("driver"), result.get("pool"), result.get("device"))
        if all(isinstance(part, str) for part in key):
            out.add(key)
    return frozenset(out)  # type: ignore[arg-type]


def _memory(capacities: Mapping[Any, Any]) -> Decimal:
    """The memory in a map of capacity names to quantities (``memory``, or
    ``<domain>/memory``; several are summed), 0 when none is readable and positive."""
    total = Decimal(0)
    for name, value in capacities.items():
        if isinstance(name, str) and name.rpartition("/")[2] == CAPACITY_MEMORY:
            try:
                amount = parse_quantity(value)
            except QuantityError:
                continue
            total += max(amount, Decimal(0))
    return total


def claim_consumed(obj: Mapping[str, Any]) -> dict[DeviceKey, Decimal]:
    """Memory each allocated device gives this claim (``consumedCapacity``: set only on
    devices that allow multiple allocations), summed over the claim's results."""
    status = obj.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    out: dict[DeviceKey, Decimal] = {}
    for result in results if isinstance(results, list) else ():
        consumed = result.get("consumedCapacity") if isinstance(result, Mapping) else None
        if not isinstance(consumed, Mapping):
            continue
        key = (result.get("driver"), result.get("pool"), result.get("device"))
        if not all(isinstance(part, str) for part in key):
            continue
        amount = _memory(consumed)
        if amount > 0:
            out[key] = out.get(key, Decimal(0)) + amount  # type: ignore[index]
    return out  # type: ignore[return-value]


#: A claim lists at most this many requests (the API's DeviceRequestsMaxSize).
MAX_REQUESTS = 32


def claim_memory_requests(obj: Mapping[str, Any]) -> tuple[Decimal, ...]:
    """The memory a claim's requests ask of one device each (``exactly.capacity.requests``
    naming ``memory``, times its ``count``), in order; empty when none asks memory."""
    spec = obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out: list[Decimal] = []
    for request in (requests if isinstance(requests, list) else ())[:MAX_REQUESTS]:
        exactly = request.get("exactly") if isinstance(request, Mapping) else None
        capacity = exactly.get("capacity") if isinstance(exactly, Mapping) else None
        asked = capacity.get("requests") if isinstance(capacity, Mapping) else None
        if not isinstance(asked, Mapping):
            continue
        count = exactly.get("count", 1)
        count = count if type(count) is int and 0 < count <= MAX_REQUESTS else 1
        amount = _memory(asked)
        if amount > 0:
            out += [amount] * count
    return tuple(out[:MAX_REQUESTS])


def claim_prioritized(obj: Mapping[str, Any]) -> bool:
    """Whether a claim has a request with a prioritized list of two or more
    subrequests (``firstAvailable``, DRAPrioritizedList: beta from 1.34, GA in 1.36):
    kube-scheduler's DynamicResources plugin scores the nodes by which subrequest it
    can allocate there (since 1.35), so the choice of node is its to make."""
    spec = obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    for request in (requests if isinstance(requests, list) else ())[:MAX_REQUESTS]:
        first = request.get("firstAvailable") if isinstance(request, Mapping) else None
        if isinstance(first, list) and len(first) > 1:
            return True
    return False


_WHOLE_MAP = re.compile(r"\.(size|exists|exists_one|all|map|filter)\s*\(|\bin\s+device\.")


class ClassMatcher:
    """Whether devices belong to a DeviceClass (all its selectors are true)."""

    def __init__(self, device_class: DeviceClass) -> None:
        import celpy

        self.device_class = device_class
        self._env = celpy.Environment()
        self._programs = []
        self._broken: str | None = None
        for expression in device_class.selectors:
            try:
                self._programs.append(self._env.program(self._env.compile(expression)))
            except Exception as exc:  # celpy raises its own types for syntax errors
                self._broken = f"selector {expression!r} does not compile: {exc}"
        text = " ".join(device_class.selectors)
        self._whole = bool(_WHOLE_MAP.search(text))
        self._text = text
        self._memo: dict[Any, bool] = {}
        self._lock = threading.Lock()
        self._warned = False

    def matches(self, device: Device) -> bool:
        if self._broken is not None:
            self._warn(self._broken)
            return False
        key = self._memo_key(device)
        with self._lock:
            hit = self._memo.get(key)
        if hit is not None:
            return hit
        result = self._evaluate(device)
        with self._lock:
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[key] = result
        return result

    def _memo_key(self, device: Device) -> Any:
        """What the selectors can see of the device. An attribute or capacity whose
        name the expressions never spell cannot change their result, unless they walk
        a whole map (``size()``, ``exists``, ``in device.…``): then all of it counts."""

        def seen(values: Mapping[str, Mapping[str, Any]]) -> tuple[Any, ...]:
            return tuple(
                sorted(
                    (domain, name, str(value))
                    for domain, entries in values.items()
                    for name, value in entries.items()
                    if self._whole or name in self._text
                )
            )

        return (device.driver, seen(device.attributes), seen(device.capacity))

    def _evaluate(self, device: Device) -> bool:
        import celpy

        activation = {
            "device": celpy.json_to_cel(
                {
                    "driver": device.driver,
                    "attributes": {d: dict(v) for d, v in device.attributes.items()},
                    "capacity": {
                        d: {k: int(q) for k, q in v.items()} for d, v in device.capacity.items()
                    },
                }
            )
        }
        for program in self._programs:
            try:
                result = program.evaluate(activation)
            except Exception as exc:  # CELEvalError and friends: the device does not match
                if "no such member" not in str(exc):
                    self._warn(f"selector could not be evaluated: {exc}")
                return False
            if result is not True and not (isinstance(result, celpy.celtypes.BoolType) and result):
                return False
        return True

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "DeviceClass selector problem: its devices are not counted",
                extra={"deviceclass": self.device_class.name, "problem": message},
            )
