"""What GPUs a node has: the inventory, and the two backends that read it.

Backends are chosen explicitly: :class:`NvmlBackend` in production, :class:`FakeBackend`
only when ``--fake-gpus FILE`` is given. A backend that cannot read the GPUs raises
:class:`InventoryError`; it never answers "no GPUs" for "could not look".
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
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


# --- the fake backend: a YAML file ---------------------------------------------------

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
    if not _is_int(index) or index < 0:
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
    if xid is not None and not (_is_int(xid) and 0 < xid < 1 << 16):
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
        index=int(index),
        uuid=uuid,
        name=name,
        memory_mib=memory,
        compute_capability=compute,
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    if not _is_int(value) or value <= 0:
        raise InventoryError(f"{where}{key}: expected a positive integer (MiB), got {value!r}")
    return int(value)


def _flag(data: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise InventoryError(f"{where}{key}: expected true or false, got {value!r}")
    return value


# --- the NVML backend ----------------------------------------------------------------

_NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
_MIB = 1 << 20


class NvmlBackend:
    """The GPUs as the driver reports them, through ``pynvml`` (``nvidia-ml-py``).

    NVML is initialised and shut down around each read, so a driver reload between
    reads is picked up. ``nvml`` may be injected (tests pass a fake module).
    """

    def __init__(self, nvml: Any = None, sysfs: str | Path = "/sys") -> None:
        self._nvml = nvml
        self._sysfs = Path(sysfs)

    def module(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:  # nvidia-ml-py is a dependency; be clear anyway
                raise InventoryError(
                    "the pynvml module (package nvidia-ml-py) is not installed"
                ) from exc
            self._nvml = pynvml
        return self._nvml

    def read(self) -> Inventory:
        nvml = self.module()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise InventoryError(
                f"NVML could not be initialised ({_describe(exc)}): is the NVIDIA driver "
                "loaded, and does the container see it (runtimeClassName: nvidia, or "
                "NVIDIA_VISIBLE_DEVICES/NVIDIA_DRIVER_CAPABILITIES with the nvidia runtime)?"
            ) from exc
        except OSError as exc:  # a broken libnvidia-ml.so
            raise InventoryError(f"NVML could not be loaded: {exc}") from exc
        try:
            return self._read(nvml)
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def _read(self, nvml: Any) -> Inventory:
        try:
            driver = _str(nvml.nvmlSystemGetDriverVersion())
            cuda = cuda_version_text(_cuda_driver_version(nvml))
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise InventoryError(f"NVML failed reading the system: {_describe(exc)}") from exc
        if not DRIVER_VERSION.match(driver):
            raise InventoryError(f"NVML reported an unreadable driver version {driver!r}")
        return Inventory(driver, cuda, tuple(self._gpu(nvml, i) for i in range(count)))

    def _gpu(self, nvml: Any, index: int) -> Gpu:
        """One GPU; any NVML error while describing it makes it an unhealthy GPU
        (still counted, never advertised) rather than failing the whole read."""
        uuid, name, memory, compute = f"unknown-{index}", "unknown", 0, ""
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _str(nvml.nvmlDeviceGetUUID(handle))
            name = _str(nvml.nvmlDeviceGetName(handle))
            memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            compute = f"{int(major)}.{int(minor)}"
            mig_capable, mig_enabled = _mig_mode(nvml, handle)
            mig = _mig_devices(nvml, handle) if mig_enabled else ()
            reason = _health_problem(nvml, handle)
        except nvml.NVMLError as exc:
            return Gpu(
                index=index,
                uuid=uuid,
                name=name,
                memory_mib=memory,
                compute_capability=compute,
                healthy=False,
                reason=f"NVML error: {_describe(exc)}",
            )
        return Gpu(
            index=index,
            uuid=uuid,
            name=name,
            memory_mib=memory,
            compute_capability=compute,
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_devices=mig,
            healthy=not reason,
            reason=reason,
            pci_class=self._pci_class(nvml, handle),
        )

    def _pci_class(self, nvml: Any, handle: Any) -> str:
        try:
            bus_id = _str(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except (nvml.NVMLError, AttributeError):
            return ""  # gpu.mode then says "unknown", as GFD does; nothing else depends on it
        return _pci_class(self._sysfs, bus_id)


def _pci_class(sysfs: Path, bus_id: str) -> str:
    """The GPU's PCI class (``0x030200``) from sysfs, "" when it cannot be read. NVML
    writes the bus id with an 8-digit domain (``00000000:18:00.0``); sysfs with 4."""
    domain, _, rest = bus_id.partition(":")
    try:
        bdf = f"{int(domain, 16):04x}:{rest}".lower()
        text = (sysfs / "bus" / "pci" / "devices" / bdf / "class").read_text().strip()
    except (OSError, ValueError):
        return ""
    return text if re.fullmatch(r"0x[0-9a-f]{6}", text) else ""


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version integer (``12040``) as ``12.4``."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _cuda_driver_version(nvml: Any) -> int:
    getter = getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None)
    if getter is not None:
        try:
            return int(getter())
        except nvml.NVMLError as exc:
            if not _not_supported(exc):
                raise
    return int(nvml.nvmlSystemGetCudaDriverVersion())


def _mig_mode(nvml: Any, handle: Any) -> tuple[bool, bool]:
    """(capable, enabled now). A GPU that does not support MIG is neither."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError as exc:
        if _not_supported(exc):
            return False, False
        raise
    return True, int(current) == 1  # NVML_DEVICE_MIG_ENABLE


def _mig_devices(nvml: Any, handle: Any) -> tuple[MigDevice, ...]:
    devices: list[MigDevice] = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as exc:
            if _code(exc) in (_NOT_SUPPORTED, 6):  # 6: NVML_ERROR_NOT_FOUND (empty slot)
                continue
            raise
        devices.append(
            MigDevice(
                index=slot,
                uuid=_str(nvml.nvmlDeviceGetUUID(mig)),
                name=_str(nvml.nvmlDeviceGetName(mig)),
                memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // _MIB,
            )
        )
    return tuple(devices)


def _health_problem(nvml: Any, handle: Any) -> str:
    """Why the GPU is unhealthy, or "" if it is not: retired pages pending (up to
    Volta/Turing) or row remapping pending/failed (Ampere and later), or uncorrectable
    ECC errors since the driver loaded. Queries the GPU does not support (no ECC on
    consumer boards, no page retirement on newer ones) count as fine."""
    try:
        if int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)):
            return "retired pages pending (reset the GPU)"
    except nvml.NVMLError as exc:
        if not _not_supported(exc):
            raise
    remapped = getattr(nvml, "nvmlDeviceGetRemappedRows", None)  # Ampere and later
    if remapped is not None:
        try:
            _corr, _unc, pending, failed = remapped(handle)
        except nvml.NVMLError as exc:
            if not _not_supported(exc):
                raise
        else:
            if int(failed):
                return "row remapping failed (replace or service the GPU)"
            if int(pending):
                return "row remapping pending (reset the GPU)"
    try:
        errors = int(
            nvml.nvmlDeviceGetTotalEccErrors(
                handle,
                getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                getattr(nvml, "NVML_VOLATILE_ECC", 0),
            )
        )
    except nvml.NVMLError as exc:
        if not _not_supported(exc):
            raise
        errors = 0
    if errors:
        return f"{errors} uncorrectable ECC errors since the driver loaded"
    return ""


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _not_supported(exc: BaseException) -> bool:
    return _code(exc) == _NOT_SUPPORTED


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ itself calls into NVML
        text = type(exc).__name__
    code = _code(exc)
    return f"{text} (code {code})" if code is not None else text


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
