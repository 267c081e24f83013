"""The GPUs DRA drivers publish per node, and which of them claims hold.

Kept by the cluster cache (under its lock) from three watched kinds of
``resource.k8s.io/v1``: DeviceClasses (which class serves ``nvidia.com/gpu``),
ResourceSlices (each node's devices of that class) and ResourceClaims (which devices
are allocated; kube-scheduler's own claims for extended-resource requests and explicit
claims alike). Every change says which nodes it touched, so the cache recomputes only
those.

Only what the policies need is kept: of a slice, its pool's generation and, for each
device of the GPU class, its key, its node and its product and memory (shared between
identical GPUs); of a claim, the keys of its devices. Device attributes are not kept,
so when the class changes the slices must be listed again: :attr:`needs_relist` says so.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.dra_shares import ClaimShares, DraShares
from extender.model import MAX_GPUS, NodeFacts, SharedNode
from extender.records import object_key
from gpu_scheduler import contract, dra, sharing
from gpu_scheduler.contract import GpuHealth
from gpu_scheduler.quantity import mib

log = logging.getLogger(__name__)
_intern = sys.intern


@dataclass(frozen=True, slots=True)
class DraGpu:
    product: str | None  # as GFD would label it
    memory_mib: int | None


_GPUS: dict[tuple[str | None, int | None], DraGpu] = {}


def _gpu(device: dra.Device) -> DraGpu:
    """Product and memory of a device, one shared object per distinct pair."""
    name = device.attribute(dra.ATTR_PRODUCT)
    product = contract.product_label_value(name) if isinstance(name, str) and name else None
    memory = device.capacity_of(dra.CAPACITY_MEMORY)
    size = mib(memory) if memory is not None and memory > 0 else None
    pair = (_intern(product) if product else None, size)
    return _GPUS.setdefault(pair, DraGpu(*pair))


# A slice as kept: driver, pool, generation, and (node, key, gpu, blocking taints,
# allows multiple allocations) per device of the class.
_Slice = tuple[str, str, int, list[tuple[str, dra.DeviceKey, DraGpu, tuple[str, ...], bool]]]


# What a relist hands the index: each object reduced by these (outside the cache's
# lock, one page at a time), never the raw objects.
ParsedSlice = tuple[str, tuple[str, str, int, list[dra.Device]]]
ParsedClaim = tuple[str, frozenset[dra.DeviceKey], str | None, ClaimShares | None]


def parse_class(obj: Mapping[str, Any]) -> dra.DeviceClass | None:
    return dra.device_class(obj)


def parse_slice(obj: Mapping[str, Any]) -> ParsedSlice | None:
    name = object_key(obj)
    parsed = dra.slice_devices(obj)
    return None if name is None or parsed is None else (name, parsed)


def parse_rule(obj: Mapping[str, Any]) -> dra.TaintRule | None:
    return dra.taint_rule(obj)


def parse_claim(obj: Mapping[str, Any]) -> ParsedClaim | None:
    """(key, allocated devices, namespace/name, its share facts) of a claim that holds
    devices or asks memory of one; None for any other."""
    key = object_key(obj)
    devices = dra.claim_devices(obj)
    consumed = {d: mib(q) for d, q in dra.claim_consumed(obj).items()}
    asked = tuple(
        min(-(-mib(q) // sharing.UNIT_MIB), sharing.MAX_UNITS)
        for q in dra.claim_memory_requests(obj)
    )
    if key is None or not (devices or asked):
        return None
    return key, devices, claim_ref(obj), ((consumed, asked) if consumed or asked else None)


class DraIndex:
    def __init__(self, resource: str = contract.RESOURCE_GPU) -> None:
        self.resource = resource
        self._classes: dict[str, dra.DeviceClass] = {}
        self._matcher: dra.ClassMatcher | None = None
        self._slices: dict[str, _Slice] = {}
        #: Slices were read without the class that selects their devices (or with an
        #: older one): list them again (the cache asks the slices' reflector to).
        self.needs_relist = False
        self._node_slices: dict[str, set[str]] = {}
        self._gpus: dict[str, dict[dra.DeviceKey, DraGpu]] = {}
        self._device_node: dict[dra.DeviceKey, str] = {}
        self._claims: dict[str, frozenset[dra.DeviceKey]] = {}
        self._allocated: dict[dra.DeviceKey, int] = {}
        self._used: dict[str, int] = {}
        # Devices with a NoSchedule/NoExecute taint, and their taints: not offered, and
        # not counted in use (they are out of the pool either way).
        self._tainted: dict[dra.DeviceKey, tuple[str, ...]] = {}
        self._rules: dict[str, dra.TaintRule] = {}
        #: Each node's devices that allow multiple allocations; what claims consume.
        self._shareable: dict[str, set[dra.DeviceKey]] = {}
        self.shares = DraShares()
        #: namespace/name of the claims with a prioritized list (dra.claim_prioritized).
        self.prioritized: frozenset[str] = frozenset()

    # --- what the cache reads -------------------------------------------------------
    def gpus(self, node: str) -> Mapping[dra.DeviceKey, DraGpu]:
        """The node's devices of the class serving the resource (empty: none)."""
        return self._gpus.get(node, {})

    def used(self, node: str) -> int:
        """Of those without a blocking taint, how many some claim holds."""
        return self._used.get(node, 0)

    def shared_gpus(self, node: str) -> tuple[sharing.Gpu, ...]:
        """A node with shareable devices: each device as a GPU shares are placed on
        (extender/dra_shares.py), in device-name order; empty otherwise."""
        if node not in self._shareable:
            return ()
        shareable = self._shareable[node]
        devices = sorted(self.gpus(node).items(), key=lambda item: item[0][2])
        return self.shares.gpus(
            [(k, g.memory_mib, k in shareable, k in self._tainted) for k, g in devices],
            self._allocated,
        )

    def tainted(self, node: str) -> dict[dra.DeviceKey, tuple[str, ...]]:
        """The node's devices of the class that carry a blocking taint, and their taints."""
        return {k: self._tainted[k] for k in self.gpus(node) if k in self._tainted}

    @property
    def device_class(self) -> str | None:
        return self._matcher.device_class.name if self._matcher else None

    def counts(self) -> dict[str, int]:
        return {
            "deviceclasses": len(self._classes),
            "resourceslices": len(self._slices),
            "resourceclaims": len(self._claims),
            "devicetaintrules": len(self._rules),
        }

    # --- DeviceClasses --------------------------------------------------------------
    def replace_classes(self, classes: Iterable[dra.DeviceClass]) -> set[str]:
        """All DeviceClasses, as :func:`parse_class` gave them."""
        self._classes = {c.name: c for c in classes}
        return self._choose_class()

    def class_event(self, kind: str, obj: Mapping[str, Any]) -> set[str]:
        parsed = dra.device_class(obj)
        if parsed is None:
            return set()
        if kind == "DELETED":
            self._classes.pop(parsed.name, None)
        else:
            self._classes[parsed.name] = parsed
        return self._choose_class()

    def _choose_class(self) -> set[str]:
        chosen = dra.class_for(self._classes.values(), self.resource)
        current = self._matcher.device_class if self._matcher else None
        if chosen == current:
            return set()
        self._matcher = dra.ClassMatcher(chosen) if chosen is not None else None
        log.info(
            "DeviceClass for the resource",
            extra={"resource": self.resource, "deviceclass": chosen.name if chosen else None},
        )
        if self._slices:
            self.needs_relist = True
        touched = set(self._gpus)
        if self._matcher is None:  # nothing serves the resource any more
            self._slices, self._node_slices = {}, {}
        return self._refresh(touched)

    # --- ResourceSlices -------------------------------------------------------------
    def replace_slices(self, slices: Iterable[ParsedSlice]) -> set[str]:
        """All ResourceSlices, as :func:`parse_slice` gave them."""
        touched = set(self._node_slices) | set(self._gpus)
        self._slices, self._node_slices = {}, {}
        self.needs_relist = False
        for name, parsed in slices:
            touched |= self._put_slice(name, parsed)
        return self._refresh(touched)

    def slice_event(self, kind: str, obj: Mapping[str, Any]) -> set[str]:
        name = object_key(obj)
        if name is None:
            return set()
        touched = self._drop_slice(name)
        parsed = None if kind == "DELETED" else parse_slice(obj)
        if parsed is not None:
            touched |= self._put_slice(*parsed)
        return self._refresh(touched)

    def holds(self, obj: Mapping[str, Any]) -> bool:
        """Whether the index keeps this ResourceSlice as it is: nothing to apply."""
        parsed = parse_slice(obj)
        return parsed is None or self._slices.get(parsed[0]) == self._kept(parsed[1])

    def _kept(self, parsed: tuple[str, str, int, list[dra.Device]]) -> _Slice:
        driver, pool, generation, devices = parsed
        match = self._matcher.matches if self._matcher is not None else lambda _: False
        kept = [(d.node, d.key, _gpu(d), d.taints, d.shareable) for d in devices if match(d)]
        return (_intern(driver), _intern(pool), generation, kept)

    def _put_slice(self, name: str, parsed: tuple[str, str, int, list[dra.Device]]) -> set[str]:
        if self._matcher is None and parsed[3]:
            self.needs_relist = True  # a class may appear and select them
        self._slices[name] = self._kept(parsed)
        kept = self._slices[name][3]
        nodes = {node for node, *_ in kept}
        for node in nodes:
            self._node_slices.setdefault(node, set()).add(name)
        return nodes

    def _drop_slice(self, name: str) -> set[str]:
        old = self._slices.pop(name, None)
        if old is None:
            return set()
        nodes = {node for node, *_ in old[3]}
        for node in nodes:
            names = self._node_slices.get(node)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._node_slices[node]
        return nodes

    def _refresh(self, nodes: set[str]) -> set[str]:
        """Recompute the GPUs of ``nodes``: the newest generation of each pool only,
        devices of the chosen class only."""
        for node in nodes:
            for key in self._gpus.pop(node, {}):
                self._device_node.pop(key, None)
                self._tainted.pop(key, None)
            self._used.pop(node, None)
            self._shareable.pop(node, None)
            if self._matcher is None:
                continue
            newest: dict[tuple[str, str], int] = {}
            slices = [self._slices[n] for n in self._node_slices.get(node, ())]
            for driver, pool, generation, _ in slices:
                newest[(driver, pool)] = max(generation, newest.get((driver, pool), generation))
            found: dict[dra.DeviceKey, DraGpu] = {}
            for driver, pool, generation, devices in slices:
                if generation != newest[(driver, pool)]:
                    continue
                for where, key, gpu, own, shareable in devices:
                    if where == node:
                        found[key] = gpu
                        if shareable:
                            self._shareable.setdefault(node, set()).add(key)
                        taints = self._taints(key, own)
                        if taints:
                            self._tainted[key] = taints
            if found:
                self._gpus[node] = found
                for key in found:
                    self._device_node[key] = node
                used = sum(
                    1 for key in found if self._allocated.get(key) and key not in self._tainted
                )
                if used:
                    self._used[node] = used
        return nodes

    # --- DeviceTaintRules -----------------------------------------------------------
    def replace_rules(self, rules: Iterable[dra.TaintRule]) -> set[str]:
        """All DeviceTaintRules, as :func:`parse_rule` gave them."""
        self._rules = {rule.name: rule for rule in rules if rule.taint}
        return self._refresh(set(self._gpus))

    def rule_event(self, kind: str, obj: Mapping[str, Any]) -> set[str]:
        rule = dra.taint_rule(obj)
        if rule is None:
            return set()
        before = self._rules.pop(rule.name, None)
        if kind != "DELETED" and rule.taint:
            self._rules[rule.name] = rule
        if before == self._rules.get(rule.name):
            return set()
        return self._refresh(set(self._gpus))  # rules are few and rare: every DRA node

    def _taints(self, key: dra.DeviceKey, own: tuple[str, ...]) -> tuple[str, ...]:
        """A device's blocking taints: its own (in the slice) and the rules' on it."""
        if not self._rules:
            return own
        return own + tuple(r.taint for r in self._rules.values() if r.selects(key))

    # --- ResourceClaims -------------------------------------------------------------
    def replace_claims(self, claims: Iterable[ParsedClaim]) -> set[str]:
        """All ResourceClaims, as :func:`parse_claim` gave them."""
        before = set(self._used)
        self._claims, self._allocated = {}, {}
        claims = list(claims)
        self.shares.replace([(key, ref, shares) for key, _, ref, shares in claims if shares])
        for key, devices, _, _ in claims:
            if not devices:
                continue
            self._claims[key] = devices
            for device in devices:
                self._allocated[device] = self._allocated.get(device, 0) + 1
        self._used = {}
        for device in self._allocated:
            node = self._device_node.get(device)
            if node is not None and device not in self._tainted:
                self._used[node] = self._used.get(node, 0) + 1
        return before | set(self._used)

    def _note_prioritized(self, obj: Mapping[str, Any], present: bool) -> bool:
        """Keep :attr:`prioritized` (a new frozenset when it changes); whether it did."""
        ref = claim_ref(obj)
        if ref is None or (present and dra.claim_prioritized(obj)) == (ref in self.prioritized):
            return False
        self.prioritized = self.prioritized ^ {ref}
        return True

    def claim_event(self, kind: str, obj: Mapping[str, Any]) -> set[str]:
        key = object_key(obj)
        if key is None:
            return set()
        prioritized = self._note_prioritized(obj, kind != "DELETED")
        old = self._claims.pop(key, frozenset())
        parsed = None if kind == "DELETED" else parse_claim(obj)
        new = parsed[1] if parsed is not None else frozenset()
        if new:
            self._claims[key] = new
        touched = {""} if prioritized else set()  # "": no node, the view changes
        ref = parsed[2] if parsed is not None else claim_ref(obj)
        for device in self.shares.put(key, ref, parsed[3] if parsed is not None else None):
            # a consumption on a device, or the claim's request (""): the view changes
            touched.add(self._device_node.get(device, ""))
        for device, sign in [*((d, -1) for d in old - new), *((d, 1) for d in new - old)]:
            count = self._allocated.get(device, 0) + sign
            if count > 0:
                self._allocated[device] = count
            else:
                self._allocated.pop(device, None)
            became = (count == 1 and sign == 1) or (count == 0 and sign == -1)
            node = self._device_node.get(device)
            if became and node is not None and device not in self._tainted:
                used = self._used.get(node, 0) + sign
                if used > 0:
                    self._used[node] = used
                else:
                    self._used.pop(node, None)
                touched.add(node)
        return touched


def gpu_facts(base: NodeFacts | None, index: DraIndex, name: str) -> NodeFacts | None:
    """A node's facts from its Node (``base``), unless the Node has no allocatable GPUs
    and a DRA driver publishes devices of the GPU class for it (kube-scheduler makes the
    same choice per node: a device plugin wins): then from those devices, the least of
    them deciding memory and product, their blocking taints its health."""
    gpus = index.gpus(name)
    if base is None or base.error is not None or base.allocatable or not gpus:
        return base
    least = min(gpus.values(), key=lambda g: (g.memory_mib or 0, g.product or ""))
    shared = index.shared_gpus(name)
    tainted = index.tainted(name)
    health = None
    if tainted:  # the driver's own word (a device taint): believed with or without an agent
        words = tuple(
            f"device {key[2]} ({', '.join(taints)})" for key, taints in sorted(tainted.items())
        )
        health = GpuHealth(len(gpus) - len(tainted), len(gpus), words)
    # Everything else the Node says stays (CPU and memory, PreferNoSchedule taints, the
    # heartbeat, zone and domains); the GPU facts are the devices'.
    return dataclasses.replace(
        base,
        allocatable=min(len(gpus), MAX_GPUS),
        labelled_gpu=True,
        memory_mib=least.memory_mib,
        product=least.product,
        replicas=1,
        dra=True,
        health=health,
        shared=SharedNode("dra", tuple((g.uuid, g.capacity, True) for g in shared), None, 0)
        if shared
        else None,
    )


def claim_ref(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    name, namespace = meta.get("name"), meta.get("namespace")
    return f"{namespace}/{name}" if isinstance(name, str) and isinstance(namespace, str) else None
