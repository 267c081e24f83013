"""What the kubelet's device manager wrote down: which pod (by UID) and which container
holds each device ID, read from its checkpoint beside ``kubelet.sock`` in the
device-plugin directory (``kubelet_internal_checkpoint``, JSON, rewritten after every
allocation). Two things PodResources does not say:

- **the pod's UID.** PodResources names a pod ``namespace/name``; a StatefulSet pod
  recreated under the same name is another pod. The kubelet gives a device ID to one
  container at a time, so a device ID reported by PodResources names its pod's UID
  here (:func:`device_uids`).
- **plain init containers' devices.** PodResources lists app containers (and
  sidecars) only; the kubelet keeps an init container's devices allocated while its
  pod is active, and so must the device plugin (:func:`init_held`), or it offers the
  GPU's other resource while the init container runs.

The kubelet drops an inactive pod's entries from the checkpoint only when it next
writes it (after its next allocation), so an entry PodResources does not report may
be a deleted pod's: the next pod's allocation, the one that cleans it, would find its
device still held. A plain init container's entry counts only while its pod is active
by the kubelet's own word: PodResources reports devices of the pod's other containers
(:func:`active_uids`). An init container of a pod whose app containers take no device
is not counted (its GPU may be offered while it runs).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpu_scheduler import contract

FILE = "kubelet_internal_checkpoint"
#: A checkpoint larger than this is not read (every allocation of a big node is ~1 MiB).
MAX_BYTES = 16 << 20
RESOURCES = (contract.RESOURCE_GPU_MEMORY, contract.RESOURCE_GPU)


class CheckpointError(ValueError):
    """The checkpoint could not be read or is not what the kubelet writes."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One container's devices of one resource."""

    uid: str
    container: str
    resource: str
    ids: frozenset[str]


def parse(text: str, resources: Collection[str] = RESOURCES) -> tuple[Entry, ...]:
    """The entries of ``resources`` in a checkpoint's text (device IDs per NUMA node
    since Kubernetes 1.20, a plain list before). Raises :class:`CheckpointError`."""
    try:
        data = json.loads(text)
        entries = data["Data"]["PodDeviceEntries"] or []
        if not isinstance(entries, list):
            raise TypeError("PodDeviceEntries is not a list")
        out = []
        for entry in entries:
            resource = entry["ResourceName"]
            if resource not in resources:
                continue
            uid, container = entry["PodUID"], entry["ContainerName"]
            if not isinstance(uid, str) or not isinstance(container, str) or not uid:
                raise TypeError("PodUID or ContainerName is not a string")
            out.append(Entry(uid, container, resource, frozenset(_ids(entry["DeviceIDs"]))))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CheckpointError(f"not a kubelet device checkpoint: {exc}") from None
    return tuple(out)


def _ids(value: object) -> Iterable[str]:
    lists = value.values() if isinstance(value, dict) else [value]
    for ids in lists:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise TypeError("DeviceIDs is not a list of strings")
        yield from ids


def read(path: str, resources: Collection[str] = RESOURCES) -> tuple[Entry, ...]:
    """The entries of the checkpoint at ``path``; none when there is no file (the
    kubelet has allocated nothing yet). Raises :class:`CheckpointError`."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    if len(raw) > MAX_BYTES:
        raise CheckpointError(f"{path} is over {MAX_BYTES} bytes")
    return parse(raw.decode("utf-8", "replace"), resources)


def device_uids(entries: Iterable[Entry]) -> dict[str, str]:
    """Device ID -> the UID of the pod holding it. An ID listed under two pods (an
    inactive pod's entry the kubelet has not dropped yet) names neither."""
    out: dict[str, str] = {}
    doubtful: set[str] = set()
    for entry in entries:
        for device in entry.ids:
            if out.setdefault(device, entry.uid) != entry.uid:
                doubtful.add(device)
    for device in doubtful:
        del out[device]
    return out


def init_entries(entries: Iterable[Entry], reported: Mapping[str, Collection[str]]) -> list[Entry]:
    """The entries of containers PodResources does not report (a plain init
    container: none of the entry's IDs is in ``reported``, per resource) of pods
    PodResources reports as active (:func:`active_uids`)."""
    entries = list(entries)
    active = active_uids(entries, reported)
    return [
        entry
        for entry in entries
        if entry.uid in active
        and entry.ids
        and entry.ids.isdisjoint(reported.get(entry.resource, ()))
    ]


def init_held(
    entries: Iterable[Entry], reported: Mapping[str, Collection[str]]
) -> dict[str, set[str]]:
    """Per resource, the IDs of :func:`init_entries`."""
    out: dict[str, set[str]] = {}
    for entry in init_entries(entries, reported):
        out.setdefault(entry.resource, set()).update(entry.ids)
    return out


def active_uids(entries: Iterable[Entry], reported: Mapping[str, Collection[str]]) -> set[str]:
    """The UIDs of the pods PodResources reports devices for now (the kubelet's active
    pods): an entry holding a reported ID, per resource."""
    return {
        entry.uid for entry in entries if not entry.ids.isdisjoint(reported.get(entry.resource, ()))
    }
