"""DRA consumable capacity (KEP-5075, beta and on by default from Kubernetes 1.36): a
GPU whose ResourceSlice entry allows multiple allocations is shared by claims, each
consuming some of its memory (``consumedCapacity``). kube-scheduler's DRA plugin
allocates them; the extender scores a pod whose claim asks ``capacity.requests.memory``
by the GPUs' state as the claims left them, with the fit rule and the measure it uses
for device-plugin shares (:mod:`gpu_scheduler.sharing`).

Kept by :class:`~extender.dra_index.DraIndex` (under the cache's lock): per claim, the
memory each of its devices gives it and the memory its requests ask (units of
``gpu-scheduler.io/gpu-memory``, 1 GiB, rounded up).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpu_scheduler import sharing
from gpu_scheduler.dra import DeviceKey

#: A claim's parsed share facts: memory (MiB) per allocated device, and units asked.
ClaimShares = tuple[dict[DeviceKey, int], tuple[int, ...]]


def units_of(mib: int) -> int:
    """GiB units a consumption of ``mib`` MiB takes, rounded up."""
    return -(-mib // sharing.UNIT_MIB)


class DraShares:
    def __init__(self) -> None:
        self._by_claim: dict[str, dict[DeviceKey, int]] = {}
        #: Memory (MiB) the claims consume on each shared device.
        self.consumed: dict[DeviceKey, int] = {}
        #: namespace/name of a claim -> units its requests ask (claims asking memory only).
        self.requests: dict[str, tuple[int, ...]] = {}

    def replace(self, claims: Sequence[tuple[str, str | None, ClaimShares]]) -> None:
        self._by_claim, self.consumed, self.requests = {}, {}, {}
        for key, ref, shares in claims:
            self.put(key, ref, shares)

    def put(self, key: str, ref: str | None, shares: ClaimShares | None) -> set[DeviceKey]:
        """Set (``shares`` None: drop) one claim's facts; the devices whose consumption
        changed, plus whether its request changed (as the key ``("", "", "")``)."""
        changed: set[DeviceKey] = set()
        old = self._by_claim.pop(key, {})
        new, asked = shares if shares is not None else ({}, ())
        for device in set(old) | set(new):
            delta = new.get(device, 0) - old.get(device, 0)
            if delta:
                left = self.consumed.get(device, 0) + delta
                if left > 0:
                    self.consumed[device] = left
                else:
                    self.consumed.pop(device, None)
                changed.add(device)
        if new:
            self._by_claim[key] = dict(new)
        if ref is not None and self.requests.get(ref, ()) != asked:
            if asked:
                self.requests[ref] = asked
            else:
                self.requests.pop(ref, None)
            changed.add(("", "", ""))
        return changed

    def gpus(
        self,
        devices: Sequence[tuple[DeviceKey, int | None, bool, bool]],
        allocated: Mapping[DeviceKey, int],
    ) -> tuple[sharing.Gpu, ...]:
        """A node's GPUs as shares see them, from its devices as (key, memory MiB,
        allows multiple allocations, blocked by a taint), in order: a shared device
        offers its memory less what claims consume; one that does not allow multiple
        allocations offers none; either is wholly free only while no claim holds it."""
        out = []
        for key, memory, shareable, tainted in devices:
            cap = sharing.gpu_units(memory)
            held = bool(allocated.get(key))
            free = 0
            if shareable and not tainted:
                free = max(cap - units_of(self.consumed.get(key, 0)), 0)
            out.append(sharing.Gpu(key[2], cap, free, not held and not tainted and cap > 0))
        return tuple(out)
