"""The NVML backend: the GPUs as the driver reports them, through ``pynvml``
(``nvidia-ml-py``). NVML's event loop is :mod:`agent.events`."""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.inventory import (
    DRIVER_VERSION,
    Gpu,
    Inventory,
    InventoryError,
    MigDevice,
    identity,
)
from gpu_scheduler.quantity import mib

_NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
_LIBRARY_NOT_FOUND = 12  # NVML_ERROR_LIBRARY_NOT_FOUND
LIBRARY = "libnvidia-ml.so.1"
#: Where the driver's library is mounted when no NVIDIA container runtime puts it on the
#: loader's path: GKE's drivers (the host's /home/kubernetes/bin/nvidia at
#: /usr/local/nvidia, as GKE's device plugin and the agent's gke platform mount it).
#: LD_LIBRARY_PATH=/usr/local/nvidia/lib64 finds it first; these are the fallback.
LIBRARY_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")


class NvmlBackend:
    """The GPUs as the driver reports them, through ``pynvml`` (``nvidia-ml-py``).

    NVML is initialised and shut down around each read, so a driver reload between
    reads is picked up. ``nvml`` may be injected (tests pass a fake module), and so may
    the ``library_dirs`` tried when the loader's path has no ``libnvidia-ml.so.1``
    and the ``loader`` that opens one there (``ctypes.CDLL``).
    """

    def __init__(
        self,
        nvml: Any = None,
        sysfs: str | Path = "/sys",
        library_dirs: Sequence[str | Path] = LIBRARY_DIRS,
        loader: Callable[[str], Any] = ctypes.CDLL,
    ) -> None:
        self._nvml = nvml
        self._sysfs = Path(sysfs)
        self._library_dirs = tuple(Path(d) for d in library_dirs)
        self._loader = loader

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
            self._init(nvml)
        except nvml.NVMLError as exc:
            raise InventoryError(
                f"NVML could not be initialised ({describe_error(exc)}): is the NVIDIA driver "
                "loaded, and does the container see it (runtimeClassName: nvidia, or "
                "NVIDIA_VISIBLE_DEVICES/NVIDIA_DRIVER_CAPABILITIES with the nvidia runtime; "
                "on GKE's drivers, the host's /home/kubernetes/bin/nvidia at "
                "/usr/local/nvidia: the chart's agent.platform)?"
            ) from exc
        except OSError as exc:  # a broken libnvidia-ml.so
            raise InventoryError(f"NVML could not be loaded: {exc}") from exc
        try:
            return self._read(nvml)
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def _init(self, nvml: Any) -> None:
        """``nvmlInit``; when the loader's path has no libnvidia-ml.so.1, the library is
        opened from the first of the library dirs that has it (pynvml then uses it:
        its ``nvmlLib``) and NVML initialised again."""
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            if _code(exc) != _LIBRARY_NOT_FOUND:
                raise
            found = [d / LIBRARY for d in self._library_dirs if (d / LIBRARY).is_file()]
            if not found or getattr(nvml, "nvmlLib", None) is not None:
                raise
            nvml.nvmlLib = self._loader(str(found[0]))
            nvml.nvmlInit()

    def _read(self, nvml: Any) -> Inventory:
        try:
            driver = text(nvml.nvmlSystemGetDriverVersion())
            cuda = cuda_version_text(_cuda_driver_version(nvml))
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise InventoryError(f"NVML failed reading the system: {describe_error(exc)}") from exc
        if not DRIVER_VERSION.match(driver):
            raise InventoryError(f"NVML reported an unreadable driver version {driver!r}")
        return Inventory(driver, cuda, tuple(self._gpu(nvml, i) for i in range(count)))

    def _gpu(self, nvml: Any, index: int) -> Gpu:
        """One GPU; any NVML error while describing it makes it an unhealthy GPU
        (still counted, never advertised) rather than failing the whole read."""
        uuid, name, memory, compute = f"unknown-{index}", "unknown", 0, ""
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = text(nvml.nvmlDeviceGetUUID(handle))
            name = text(nvml.nvmlDeviceGetName(handle))
            memory = mib(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            compute = f"{int(major)}.{int(minor)}"
            mig_capable, mig_enabled = _mig_mode(nvml, handle)
            mig = _mig_devices(nvml, handle) if mig_enabled else ()
            reason = _health_problem(nvml, handle)
        except nvml.NVMLError as exc:
            return Gpu(
                **identity(index, uuid, name, memory, compute),
                healthy=False,
                reason=f"NVML error: {describe_error(exc)}",
            )
        return Gpu(
            **identity(index, uuid, name, memory, compute),
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_devices=mig,
            healthy=not reason,
            reason=reason,
            pci_class=self._pci_class(nvml, handle),
        )

    def _pci_class(self, nvml: Any, handle: Any) -> str:
        try:
            bus_id = text(nvml.nvmlDeviceGetPciInfo(handle).busId)
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
                uuid=text(nvml.nvmlDeviceGetUUID(mig)),
                name=text(nvml.nvmlDeviceGetName(mig)),
                memory_mib=mib(nvml.nvmlDeviceGetMemoryInfo(mig).total),
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


def describe_error(exc: BaseException) -> str:
    """An NVML error in words, with its code (never raising: pynvml's ``__str__``
    itself calls into NVML)."""
    try:
        words = str(exc)
    except Exception:  # pynvml's __str__ itself calls into NVML
        words = type(exc).__name__
    code = _code(exc)
    return f"{words} (code {code})" if code is not None else words


def text(value: Any) -> str:
    """An NVML string (bytes from older bindings) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
