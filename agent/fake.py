"""The fake GPU backend: an inventory read from a YAML (or JSON) file, for tests and the
demo, chosen only by ``--fake-gpus FILE``. The file can script what a real GPU does
over time: an XID (``xid: N`` on a GPU, reported on every read while listed) and a
driver/library version mismatch (``driverMismatch: true``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.inventory import (
    DRIVER_VERSION,
    MAJOR_MINOR,
    Gpu,
    Inventory,
    InventoryError,
    MigDevice,
    identity,
)
from gpu_scheduler.fields import is_integer

_GPU_KEYS = {
    "index",
    "name",
    "uuid",
    "memoryMiB",
    "computeCapability",
    "migCapable",
    "migEnabled",
    "migDevices",
    "healthy",
    "pciClass",
    "xid",
}
_MIG_KEYS = {"name", "uuid", "memoryMiB"}
_TOP_KEYS = {"driverVersion", "cudaDriverVersion", "gpus", "driverMismatch"}
#: What NVML says when the kernel module and the library in the container differ (a
#: driver upgraded under a running agent); a fake file says it with driverMismatch.
DRIVER_MISMATCH = "Driver/library version mismatch"


class FakeBackend:
    """An inventory read from a YAML (or JSON) file, re-read on every call so a demo
    can edit it while the agent runs. The shape::

        driverVersion: "550.54.15"
        cudaDriverVersion: "12.4"
        gpus:
          - name: "NVIDIA H100 80GB HBM3"
            uuid: "GPU-0b1c..."
            memoryMiB: 81559
            computeCapability: "9.0"
            migEnabled: false        # optional, default false
            migCapable: true         # optional, default: migEnabled
            migDevices: []           # optional: [{name, uuid, memoryMiB}] when migEnabled
            healthy: true            # optional, default true
            index: 0                 # optional, default: position in the list
            pciClass: "0x030200"     # optional, default 0x030200 (a compute GPU)
            xid: 79                  # optional: the GPU reports this XID (on every read
                                     # while listed; remove it and the GPU recovers
                                     # after the agent's quiet period)
        driverMismatch: false        # optional: NVML fails as after a driver upgrade
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> Inventory:
        from gpu_scheduler.configfile import load_yaml_file

        try:
            return load_yaml_file(str(self.path), parse_inventory, InventoryError)
        except InventoryError as exc:
            raise InventoryError(f"fake GPU file {exc}") from exc


def parse_inventory(data: Any) -> Inventory:
    """An :class:`Inventory` from the fake file's shape; :class:`InventoryError` naming
    the offending field otherwise."""
    if not isinstance(data, Mapping):
        raise InventoryError("expected a mapping with driverVersion, cudaDriverVersion, gpus")
    _no_unknown_keys(data, _TOP_KEYS, "")
    if _flag(data, "driverMismatch", "", False):
        raise InventoryError(f"NVML could not be initialised ({DRIVER_MISMATCH}) [fake]")
    driver = _text(data, "driverVersion", "")
    if not DRIVER_VERSION.match(driver):
        raise InventoryError(f"driverVersion: {driver!r} is not like 550.54.15")
    cuda = _text(data, "cudaDriverVersion", "")
    if not MAJOR_MINOR.match(cuda):
        raise InventoryError(f"cudaDriverVersion: {cuda!r} is not like 12.4")
    if "gpus" not in data:
        raise InventoryError("gpus: missing (write `gpus: []` for a node without GPUs)")
    raw_gpus = data["gpus"] if data["gpus"] is not None else []
    if not isinstance(raw_gpus, list):
        raise InventoryError("gpus: expected a list")
    gpus = [_parse_gpu(item, pos) for pos, item in enumerate(raw_gpus)]
    seen_index: set[int] = set()
    seen_uuid: set[str] = set()
    for pos, gpu in enumerate(gpus):
        if gpu.index in seen_index:
            raise InventoryError(f"gpus[{pos}].index: {gpu.index} appears twice")
        if gpu.uuid in seen_uuid:
            raise InventoryError(f"gpus[{pos}].uuid: {gpu.uuid} appears twice")
        seen_index.add(gpu.index)
        seen_uuid.add(gpu.uuid)
    return Inventory(driver, cuda, tuple(sorted(gpus, key=lambda g: g.index)))


def _parse_gpu(item: Any, pos: int) -> Gpu:
    where = f"gpus[{pos}]."
    if not isinstance(item, Mapping):
        raise InventoryError(f"gpus[{pos}]: expected a mapping")
    _no_unknown_keys(item, _GPU_KEYS, where)
    index = item.get("index", pos)
    if not is_integer(index) or index < 0:
        raise InventoryError(f"{where}index: expected an integer >= 0, got {index!r}")
    name = _text(item, "name", where)
    uuid = _text(item, "uuid", where)
    if not name or not uuid:
        raise InventoryError(f"{where}name and uuid must not be empty")
    memory = _positive_int(item, "memoryMiB", where)
    compute = _text(item, "computeCapability", where)
    if not MAJOR_MINOR.match(compute):
        raise InventoryError(f'{where}computeCapability: {compute!r} is not like "9.0"')
    mig_enabled = _flag(item, "migEnabled", where, False)
    mig_capable = _flag(item, "migCapable", where, mig_enabled)
    if mig_enabled and not mig_capable:
        raise InventoryError(f"{where}migEnabled is true but migCapable is false")
    healthy = _flag(item, "healthy", where, True)
    xid = item.get("xid")
    if xid is not None and not (is_integer(xid) and 0 < xid < 1 << 16):
        raise InventoryError(f"{where}xid: expected an XID number (1..65535), got {xid!r}")
    pci_class = str(item.get("pciClass", "0x030200"))
    if not re.fullmatch(r"0x[0-9a-f]{6}", pci_class):
        raise InventoryError(f'{where}pciClass: {pci_class!r} is not like "0x030200"')
    raw_mig = item.get("migDevices") or []
    if not isinstance(raw_mig, list):
        raise InventoryError(f"{where}migDevices: expected a list")
    if raw_mig and not mig_enabled:
        raise InventoryError(f"{where}migDevices given but migEnabled is false")
    mig: list[MigDevice] = []
    for i, dev in enumerate(raw_mig):
        dwhere = f"{where}migDevices[{i}]."
        if not isinstance(dev, Mapping):
            raise InventoryError(f"{where}migDevices[{i}]: expected a mapping")
        _no_unknown_keys(dev, _MIG_KEYS, dwhere)
        mig.append(
            MigDevice(
                index=i,
                uuid=_text(dev, "uuid", dwhere),
                name=_text(dev, "name", dwhere),
                memory_mib=_positive_int(dev, "memoryMiB", dwhere),
            )
        )
    return Gpu(
        **identity(int(index), uuid, name, memory, compute),
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=tuple(mig),
        healthy=healthy,
        reason="" if healthy else "marked unhealthy in the fake GPU file",
        pci_class=pci_class,
        xid=xid,
    )


def _no_unknown_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise InventoryError(
            f"{where or ''}unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    if key not in data or data[key] is None:
        raise InventoryError(f"{where}{key}: missing")
    value = data[key]
    # An unquoted 9.0 or 12.4 reads as a YAML float; accept it as written.
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InventoryError(f"{where}{key}: expected a string, got {value!r}")
    return str(value).strip()


def _positive_int(data: Mapping[str, Any], key: str, where: str) -> int:
    value = data.get(key)
    if not is_integer(value) or value <= 0:
        raise InventoryError(f"{where}{key}: expected a positive integer (MiB), got {value!r}")
    return int(value)


def _flag(data: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InventoryError(f"{where}{key}: expected true or false, got {value!r}")
    return value
