"""agent.fake and agent.nvml: the fake file's validation and the NVML backend over a
fake pynvml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.fake import FakeBackend
from agent.inventory import InventoryError
from agent.nvml import NvmlBackend, cuda_version_text
from tests.helpers import skip_with_an_nvidia_driver

GOOD = """
driverVersion: "550.54.15"
cudaDriverVersion: "12.4"
gpus:
  - name: "NVIDIA H100 80GB HBM3"
    uuid: "GPU-0b1c"
    memoryMiB: 81559
    computeCapability: "9.0"
    migEnabled: false
    healthy: true
"""


def fake(tmp_path: Path, text: str) -> FakeBackend:
    path = tmp_path / "gpus.yaml"
    path.write_text(text)
    return FakeBackend(path)


def test_fake_backend_reads_the_issue_shape(tmp_path: Path) -> None:
    inventory = fake(tmp_path, GOOD).read()
    assert inventory.driver_version == "550.54.15"
    assert inventory.cuda_driver_version == "12.4"
    (gpu,) = inventory.gpus
    assert (gpu.index, gpu.uuid, gpu.memory_mib, gpu.compute) == (0, "GPU-0b1c", 81559, (9, 0))
    assert gpu.healthy and not gpu.mig_enabled and not gpu.mig_capable


def test_unquoted_numbers_read_as_written(tmp_path: Path) -> None:
    text = GOOD.replace('"12.4"', "12.4").replace('"9.0"', "9.0")
    inventory = fake(tmp_path, text).read()
    assert inventory.cuda_driver_version == "12.4"
    assert inventory.gpus[0].compute_capability == "9.0"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.replace("memoryMiB: 81559", "memoryMiB: -1"), "gpus[0].memoryMiB"),
        (lambda t: t.replace("memoryMiB: 81559", 'memoryMiB: "80Gi"'), "gpus[0].memoryMiB"),
        (lambda t: t.replace('"9.0"', '"hopper"'), "gpus[0].computeCapability"),
        (lambda t: t.replace("healthy: true", "healthy: yes-ish"), "gpus[0].healthy"),
        (lambda t: t.replace("healthy: true", "helthy: true"), "unknown key(s) helthy"),
        (lambda t: t.replace('"550.54.15"', '"latest"'), "driverVersion"),
        (lambda t: t.replace('cudaDriverVersion: "12.4"', ""), "cudaDriverVersion: missing"),
        (lambda t: t.split("gpus:")[0], "gpus: missing"),
        (lambda t: t.replace('uuid: "GPU-0b1c"', ""), "gpus[0].uuid: missing"),
        (lambda t: "gpus: [", "not YAML"),
        (lambda t: "- 1\n- 2\n", "expected a mapping"),
        (
            lambda t: t.replace("migEnabled: false", "migEnabled: false\n    migDevices: [{}]"),
            "migDevices given but migEnabled is false",
        ),
        (lambda t: t + t[t.index("  - name") :], "gpus[1].uuid: GPU-0b1c appears twice"),
    ],
)
def test_fake_backend_says_what_is_wrong(tmp_path: Path, change: Any, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        fake(tmp_path, change(GOOD)).read()
    assert message in str(err.value)
    assert str(tmp_path / "gpus.yaml") in str(err.value)


def test_fake_backend_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="No such file"):
        FakeBackend(tmp_path / "nope.yaml").read()


def test_an_empty_gpu_list_is_a_node_without_gpus(tmp_path: Path) -> None:
    text = GOOD.split("gpus:")[0] + "gpus: []\n"
    assert fake(tmp_path, text).read().gpus == ()


# --- NVML over a fake pynvml -------------------------------------------------------


class FakeNvml:
    """Just the pynvml surface the backend uses, with NVML's error codes."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return {3: "Not Supported", 9: "Driver Not Loaded", 15: "GPU is lost"}.get(
                self.value, "Unknown Error"
            )

    class Memory:
        def __init__(self, mib: int) -> None:
            self.total = mib << 20

    def __init__(self, gpus: list[dict[str, Any]], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = 0
        self.shutdowns = 0
        self.fail_system: int | None = None
        self.has_v2 = True

    def _err(self, code: int) -> Exception:
        return self.NVMLError(code)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self._err(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        if self.fail_system is not None:
            raise self._err(self.fail_system)
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12020

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlSystemGetCudaDriverVersion_v2" and self.has_v2:
            return lambda: 12040
        raise AttributeError(name)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        spec = self.gpus[index]
        if spec.get("lost"):
            raise self._err(15)
        return ("gpu", index)

    def _spec(self, handle: Any) -> dict[str, Any]:
        kind, index, *rest = handle
        spec = self.gpus[index]
        return spec["mig"][rest[0]] if kind == "mig" else spec

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        return self._spec(handle)["uuid"].encode()  # older bindings return bytes

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._spec(handle)["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        spec = self._spec(handle)
        if spec.get("memory_error"):
            raise self._err(spec["memory_error"])
        return self.Memory(spec["mib"])

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._spec(handle)["cc"]

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        spec = self._spec(handle)
        if "mig_mode" not in spec:
            raise self._err(3)
        return [spec["mig_mode"], spec["mig_mode"]]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> Any:
        if slot >= len(self._spec(handle)["mig"]):
            raise self._err(6)  # NOT_FOUND: an empty slot
        return ("mig", handle[1], slot)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        value = self._spec(handle).get("retired", 0)
        if value == "unsupported":
            raise self._err(3)
        return value

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        value = self._spec(handle).get("remap", "unsupported")
        if value == "unsupported":
            raise self._err(3)
        return value

    class PciInfo:
        def __init__(self, bus_id: str) -> None:
            self.busId = bus_id

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        spec = self._spec(handle)
        if "bus" not in spec:
            raise self._err(3)
        return self.PciInfo(spec["bus"])

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)  # uncorrected, volatile
        value = self._spec(handle).get("ecc", 0)
        if value == "unsupported":
            raise self._err(3)
        return value


def h100(**kw: Any) -> dict[str, Any]:
    return {
        "uuid": "GPU-h",
        "name": "NVIDIA H100 80GB HBM3",
        "mib": 81559,
        "cc": (9, 0),
        "mig_mode": 0,
        **kw,
    }


def test_nvml_reads_the_gpus() -> None:
    a100_mig = {
        "uuid": "GPU-a",
        "name": "NVIDIA A100-SXM4-40GB",
        "mib": 40960,
        "cc": (8, 0),
        "mig_mode": 1,
        "mig": [
            {"uuid": "MIG-1", "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "mib": 19968},
            {"uuid": "MIG-2", "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "mib": 19968},
        ],
    }
    l4 = {
        "uuid": "GPU-l",
        "name": "NVIDIA L4",
        "mib": 23034,
        "cc": (8, 9),
        "ecc": "unsupported",
        "retired": "unsupported",
    }
    nvml = FakeNvml([h100(), a100_mig, l4])
    inventory = NvmlBackend(nvml).read()
    assert inventory.driver_version == "550.54.15"
    assert inventory.cuda_driver_version == "12.4"
    h, a, lfour = inventory.gpus
    assert (h.uuid, h.memory_mib, h.compute_capability) == ("GPU-h", 81559, "9.0")
    assert h.mig_capable and not h.mig_enabled and h.healthy
    assert a.mig_enabled and [m.uuid for m in a.mig_devices] == ["MIG-1", "MIG-2"]
    assert a.mig_devices[0].memory_mib == 19968
    # No MIG, no ECC, no page retirement on this board: all "not supported", all fine.
    assert not lfour.mig_capable and lfour.healthy
    assert nvml.shutdowns == nvml.initialised == 1


def test_nvml_pci_class_from_sysfs(tmp_path: Path) -> None:
    """NVML names the bus with an 8-digit domain; sysfs with 4. The class gives
    GFD's gpu.mode; a class that cannot be read leaves it unknown, never unhealthy."""
    device = tmp_path / "bus" / "pci" / "devices" / "0000:18:00.0"
    device.mkdir(parents=True)
    (device / "class").write_text("0x030200\n")
    with_bus = {**h100(), "bus": b"00000000:18:00.0"}
    no_sysfs = {**h100(uuid="GPU-2"), "bus": "00000000:2a:00.0"}
    gpus = NvmlBackend(FakeNvml([with_bus, no_sysfs, h100(uuid="GPU-3")]), tmp_path).read().gpus
    assert [g.pci_class for g in gpus] == ["0x030200", "", ""]
    assert all(g.healthy for g in gpus)


def test_nvml_v1_cuda_version_when_v2_is_missing() -> None:
    nvml = FakeNvml([h100()])
    nvml.has_v2 = False
    assert NvmlBackend(nvml).read().cuda_driver_version == "12.2"


@pytest.mark.parametrize(("value", "text"), [(12040, "12.4"), (11080, "11.8"), (13000, "13.0")])
def test_cuda_version_text(value: int, text: str) -> None:
    assert cuda_version_text(value) == text


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (h100(retired=1), "retired pages"),
        (h100(ecc=2), "2 uncorrectable ECC errors"),
        (h100(remap=(0, 1, 1, 0)), "row remapping pending"),
        (h100(remap=(0, 9, 0, 1)), "row remapping failed"),
        (h100(lost=True), "GPU is lost"),
        (h100(memory_error=15), "GPU is lost"),
    ],
)
def test_nvml_unhealthy_gpus(spec: dict[str, Any], reason: str) -> None:
    inventory = NvmlBackend(FakeNvml([h100(uuid="GPU-ok", remap=(3, 0, 0, 0)), spec])).read()
    ok, bad = inventory.gpus
    assert ok.healthy
    assert not bad.healthy and reason in bad.reason
    assert len(inventory.gpus) == 2 and len(inventory.healthy) == 1


def test_nvml_not_loadable_is_an_error_not_no_gpus() -> None:
    nvml = FakeNvml([h100()], init_error=9)
    with pytest.raises(InventoryError, match=r"NVML could not be initialised.*Driver Not Loaded"):
        NvmlBackend(nvml).read()


def test_nvml_failing_on_the_system_query_is_an_error_and_shuts_down() -> None:
    nvml = FakeNvml([h100()])
    nvml.fail_system = 999
    with pytest.raises(InventoryError, match="NVML failed reading the system"):
        NvmlBackend(nvml).read()
    assert nvml.shutdowns == 1


def test_no_pynvml_module_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(InventoryError, match="nvidia-ml-py"):
        NvmlBackend().read()


def test_real_pynvml_without_a_driver_is_an_inventory_error() -> None:
    """On this (GPU-less) test machine the real binding cannot load libnvidia-ml."""
    skip_with_an_nvidia_driver()
    with pytest.raises(InventoryError, match="NVML could not be initialised"):
        NvmlBackend().read()


class LibraryMissingNvml(FakeNvml):
    """pynvml where ``CDLL("libnvidia-ml.so.1")`` fails: NVML_ERROR_LIBRARY_NOT_FOUND
    until a library is given to it as ``nvmlLib``."""

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        super().__init__(gpus)
        self.nvmlLib: Any = None

    def nvmlInit(self) -> None:
        if self.nvmlLib is None:
            raise self._err(12)


def test_nvml_is_found_where_gke_mounts_the_driver(tmp_path) -> None:
    """GKE's drivers: libnvidia-ml.so.1 in /usr/local/nvidia/lib64 (the host's
    /home/kubernetes/bin/nvidia), not on the loader's path: opened from there."""
    lib64 = tmp_path / "lib64"
    lib64.mkdir()
    (lib64 / "libnvidia-ml.so.1").write_bytes(b"")
    opened: list[str] = []

    def loader(path: str) -> str:
        opened.append(path)
        return "lib"

    nvml = LibraryMissingNvml([h100()])
    backend = NvmlBackend(nvml, library_dirs=[tmp_path / "lib", lib64], loader=loader)
    assert len(backend.read().gpus) == 1
    assert opened == [str(lib64 / "libnvidia-ml.so.1")] and nvml.nvmlLib == "lib"
    backend.read()
    assert len(opened) == 1  # loaded once


def test_nvml_missing_everywhere_is_an_error(tmp_path) -> None:
    backend = NvmlBackend(LibraryMissingNvml([h100()]), library_dirs=[tmp_path])
    with pytest.raises(InventoryError, match=r"code 12.*agent.platform"):
        backend.read()
