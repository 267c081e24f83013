"""What GPUs a node has: the inventory, and what a backend that reads it must do.

Backends are chosen explicitly: :class:`agent.nvml.NvmlBackend` in production,
:class:`agent.fake.FakeBackend` only when ``--fake-gpus FILE`` is given. A backend that
cannot read the GPUs raises :class:`InventoryError`; it never answers "no GPUs" for
"could not look".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

#: A driver version as NVML reports it: ``550.54.15`` (two or three dotted numbers).
DRIVER_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")
#: ``major.minor``: CUDA driver API versions and compute capabilities.
MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)$")


class InventoryError(Exception):
    """The GPUs could not be read (no driver, NVML failing, a malformed fake file)."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance of a MIG-enabled GPU."""

    index: int
    uuid: str
    name: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int  # total memory; 0 when NVML could not tell (an unhealthy GPU)
    compute_capability: str  # "9.0"; "" when unknown
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    healthy: bool = True
    reason: str = ""  # why the GPU is unhealthy
    pci_class: str = ""  # "0x030200" (3D controller: compute), "0x030000" (VGA); "" unknown
    #: The XID that made it unhealthy (agent.health); in a fake file's read, an XID the
    #: GPU reports now (it happens again on every read while the file lists it).
    xid: int | None = None
    since: str = ""  # RFC 3339: unhealthy since (agent.health)

    @property
    def compute(self) -> tuple[int, int] | None:
        match = MAJOR_MINOR.match(self.compute_capability)
        return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True, slots=True)
class Inventory:
    driver_version: str  # "550.54.15"
    cuda_driver_version: str  # "12.4": the newest CUDA the driver supports
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)

    @property
    def healthy(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if g.healthy)


class Backend(Protocol):
    def read(self) -> Inventory:
        """The inventory now. Raises :class:`InventoryError` if it cannot be read."""
        ...


def identity(index: int, uuid: str, name: str, memory_mib: int, compute: str) -> dict[str, Any]:
    """What names a GPU (the :class:`Gpu` fields every backend reads first), as keyword
    arguments for :class:`Gpu`."""
    return {
        "index": index,
        "uuid": uuid,
        "name": name,
        "memory_mib": memory_mib,
        "compute_capability": compute,
    }
