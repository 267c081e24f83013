"""agent.labels: inventory → labels, annotations and capacity (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.fake import FakeBackend
from agent.inventory import Gpu, Inventory, MigDevice
from agent.labels import (
    desired_state,
    family,
    label_value,
    least_gpu,
)
from gpu_scheduler import contract
from gpu_scheduler.contract import is_label_value

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"


def load(name: str) -> Inventory:
    return FakeBackend(FIXTURES / name).read()


def gpu(index: int, name: str, memory: int, cc: str, **kw: object) -> Gpu:
    return Gpu(index, f"GPU-{index:04d}", name, memory, cc, **kw)  # type: ignore[arg-type]


def test_h100x8() -> None:
    desired = desired_state(load("h100x8.yaml"))
    assert desired.labels == {
        contract.LABEL_GPU_PRESENT: "true",
        contract.LABEL_GPU_COUNT: "8",
        contract.LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
        contract.LABEL_GPU_MEMORY: "81559",
        contract.LABEL_GPU_FAMILY: "hopper",
        contract.LABEL_GPU_COMPUTE_MAJOR: "9",
        contract.LABEL_GPU_COMPUTE_MINOR: "0",
        contract.LABEL_DRIVER_MAJOR: "550",
        contract.LABEL_DRIVER_MINOR: "54",
        contract.LABEL_DRIVER_REVISION: "15",
        contract.LABEL_DRIVER_FULL: "550.54.15",
        contract.LABEL_RUNTIME_MAJOR: "12",
        contract.LABEL_RUNTIME_MINOR: "4",
        contract.LABEL_RUNTIME_FULL: "12.4",
        contract.LABEL_MIG_CAPABLE: "true",
        contract.LABEL_GPU_REPLICAS: "1",
        contract.LABEL_GPU_SHARING_STRATEGY: "none",
        contract.LABEL_GPU_MODE: "compute",
        contract.LABEL_MPS_CAPABLE: "false",
    }
    assert desired.capacity == {contract.RESOURCE_GPU: "8"}
    detail = json.loads(desired.annotations[contract.ANN_GPUS])
    assert [g["index"] for g in detail] == list(range(8))
    assert all(g["memoryMiB"] == 81559 and g["healthy"] for g in detail)
    assert set(desired.annotations) == {contract.ANN_GPUS}  # the heartbeat is the sync's
    assert set(desired.labels) <= set(contract.AGENT_LABELS)


def test_a100x4_with_mig_enabled() -> None:
    inventory = load("a100x4-mig.yaml")
    desired = desired_state(inventory)
    labels = desired.labels
    assert labels[contract.LABEL_GPU_COUNT] == "4"
    assert labels[contract.LABEL_GPU_PRODUCT] == "NVIDIA-A100-SXM4-40GB"
    assert labels[contract.LABEL_GPU_MEMORY] == "40960"
    assert labels[contract.LABEL_GPU_FAMILY] == "ampere"
    assert labels[contract.LABEL_MIG_CAPABLE] == "true"
    assert labels[contract.LABEL_DRIVER_REVISION] == "08"  # kept as the driver writes it
    # GPUs 0 and 1 are in MIG mode: they run work only in their MIG instances.
    assert desired.capacity == {contract.RESOURCE_GPU: "2"}
    detail = json.loads(desired.annotations[contract.ANN_GPUS])
    assert detail[0]["migEnabled"] is True
    assert [m["name"] for m in detail[0]["migDevices"]] == ["NVIDIA A100-SXM4-40GB MIG 3g.20gb"] * 2
    assert "migDevices" not in detail[2]


def mig_a100s(count: int) -> tuple[Gpu, ...]:
    """``count`` A100s in MIG mode, one 7g.40gb instance each."""
    mig = (MigDevice(0, "MIG-1", "NVIDIA A100-SXM4-40GB MIG 7g.40gb", 40192),)
    return tuple(
        gpu(
            i,
            "NVIDIA A100-SXM4-40GB",
            40960,
            "8.0",
            mig_capable=True,
            mig_enabled=True,
            mig_devices=mig,
        )
        for i in range(count)
    )


def test_all_gpus_in_mig_mode_advertise_no_whole_gpu() -> None:
    gpus = mig_a100s(4)
    desired = desired_state(Inventory("535.161.08", "12.2", gpus))
    assert desired.capacity == {contract.RESOURCE_GPU: "0"}
    assert desired.labels[contract.LABEL_GPU_COUNT] == "4"


def test_mixed_models_describe_the_least_gpu() -> None:
    inventory = load("mixed.yaml")
    labels = desired_state(inventory).labels
    assert labels[contract.LABEL_GPU_COUNT] == "4"
    assert labels[contract.LABEL_GPU_MEMORY] == "23034"  # the L4s, not the A100s
    assert labels[contract.LABEL_GPU_PRODUCT] == "NVIDIA-L4"
    # The lowest compute capability of any GPU: the A100s' 8.0, not the L4s' 8.9.
    assert labels[contract.LABEL_GPU_COMPUTE_MAJOR] == "8"
    assert labels[contract.LABEL_GPU_COMPUTE_MINOR] == "0"
    assert labels[contract.LABEL_GPU_FAMILY] == "ampere"
    assert labels[contract.LABEL_MIG_CAPABLE] == "true"  # any GPU capable


def test_mixed_product_ties_go_to_the_majority_model() -> None:
    gpus = (
        gpu(0, "NVIDIA A10G", 23028, "8.6"),
        gpu(1, "NVIDIA L4", 23028, "8.6"),
        gpu(2, "NVIDIA L4", 23028, "8.6"),
    )
    assert least_gpu(gpus).name == "NVIDIA L4"


_models = st.sampled_from(
    [
        ("NVIDIA H100 80GB HBM3", 81559, "9.0"),
        ("NVIDIA A100-SXM4-40GB", 40960, "8.0"),
        ("NVIDIA L4", 23034, "8.9"),
        ("Tesla T4", 15360, "7.5"),
        ("NVIDIA B200", 183359, "10.0"),
    ]
)


@given(st.lists(_models, min_size=1, max_size=8), st.lists(st.booleans(), min_size=8, max_size=8))
def test_labels_never_promise_more_than_any_gpu(models: list, health: list[bool]) -> None:
    gpus = tuple(
        gpu(i, name, mem, cc, healthy=health[i]) for i, (name, mem, cc) in enumerate(models)
    )
    desired = desired_state(Inventory("550.54.15", "12.4", gpus))
    labels = desired.labels
    assert int(labels[contract.LABEL_GPU_MEMORY]) == min(g.memory_mib for g in gpus)
    compute = (
        int(labels[contract.LABEL_GPU_COMPUTE_MAJOR]),
        int(labels[contract.LABEL_GPU_COMPUTE_MINOR]),
    )
    assert all(compute <= g.compute for g in gpus if g.compute)
    product_gpus = [g for g in gpus if label_value(g.name) == labels[contract.LABEL_GPU_PRODUCT]]
    assert product_gpus and all(
        g.memory_mib == min(x.memory_mib for x in gpus) for g in product_gpus
    )
    assert labels[contract.LABEL_GPU_COUNT] == str(len(gpus))
    assert desired.capacity[contract.RESOURCE_GPU] == str(sum(g.healthy for g in gpus))
    assert all(is_label_value(v) for v in labels.values())


def test_an_unhealthy_gpu_is_counted_but_not_advertised() -> None:
    desired = desired_state(load("h100x8-unhealthy.yaml"))
    assert desired.labels[contract.LABEL_GPU_COUNT] == "8"
    assert desired.capacity == {contract.RESOURCE_GPU: "7"}
    detail = json.loads(desired.annotations[contract.ANN_GPUS])
    assert [g["index"] for g in detail if not g["healthy"]] == [3]
    assert detail[3]["reason"]


def test_a_gpu_nvml_could_not_describe_does_not_shape_the_labels() -> None:
    gpus = (
        gpu(0, "NVIDIA L4", 23034, "8.9"),
        Gpu(1, "unknown-1", "unknown", 0, "", healthy=False, reason="NVML error: GPU is lost"),
    )
    desired = desired_state(Inventory("550.54.15", "12.4", gpus))
    assert desired.labels[contract.LABEL_GPU_MEMORY] == "23034"
    assert desired.labels[contract.LABEL_GPU_PRODUCT] == "NVIDIA-L4"
    assert desired.labels[contract.LABEL_GPU_COUNT] == "2"
    assert desired.capacity == {contract.RESOURCE_GPU: "1"}


def test_no_gpus() -> None:
    desired = desired_state(load("cpu-none.yaml"))
    assert desired.labels == {contract.LABEL_GPU_PRESENT: "false"}
    assert desired.capacity == {contract.RESOURCE_GPU: "0"}
    assert desired.annotations == {contract.ANN_GPUS: "[]"}


def test_no_capacity_flag_leaves_capacity_out() -> None:
    assert desired_state(load("l4x2.yaml"), manage_capacity=False).capacity == {}


def test_l4x2_and_a_two_part_driver_version() -> None:
    labels = desired_state(load("l4x2.yaml")).labels
    assert labels[contract.LABEL_GPU_FAMILY] == "ada-lovelace"
    assert labels[contract.LABEL_MIG_CAPABLE] == "false"
    inventory = Inventory("550.54", "12.4", (gpu(0, "NVIDIA L4", 23034, "8.9"),))
    labels = desired_state(inventory).labels
    assert labels[contract.LABEL_DRIVER_MAJOR] == "550"
    assert labels[contract.LABEL_DRIVER_MINOR] == "54"
    assert contract.LABEL_DRIVER_REVISION not in labels


@pytest.mark.parametrize(
    ("cc", "expected"),
    [
        ((6, 0), "pascal"),
        ((6, 1), "pascal"),
        ((7, 0), "volta"),
        ((7, 2), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 7), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((12, 0), "blackwell"),
        ((5, 2), "maxwell"),
        ((3, 7), "kepler"),
        ((4, 0), "undefined"),
        ((13, 0), "undefined"),
    ],
)
def test_family(cc: tuple[int, int], expected: str) -> None:
    assert family(*cc) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("  Tesla  V100-SXM2-16GB ", "Tesla-V100-SXM2-16GB"),
        # GFD deletes what is not A-Za-z0-9 - _ . space (TestSanitise, internal/lm)
        ("NVIDIA GeForce RTX 4090 (Laptop)", "NVIDIA-GeForce-RTX-4090-Laptop"),
        ("NVIDIA TITAN X (Pascal)", "NVIDIA-TITAN-X-Pascal"),
        ("some [ / thing / ]else", "some-thing-else"),
        ("Quadro RTX 6000/8000", "Quadro-RTX-60008000"),
        ("some-thing.else_new", "some-thing.else_new"),
        ("  input  with multiple   spaces  ", "input-with-multiple-spaces"),
        ("NVIDIA RTX 6000 Ada Generation/+", "NVIDIA-RTX-6000-Ada-Generation"),
        ("x" * 70, "x" * 63),
    ],
)
def test_label_value(name: str, expected: str) -> None:
    assert label_value(name) == expected
    assert is_label_value(expected)


@given(st.text(max_size=120))
def test_label_value_is_always_valid(text: str) -> None:
    assert is_label_value(label_value(text))


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_fixture_gives_valid_labels(path: Path) -> None:
    desired = desired_state(FakeBackend(path).read())
    assert set(desired.labels) <= {*contract.AGENT_LABELS, *contract.AGENT_OWN_LABELS}
    assert all(is_label_value(v) for v in desired.labels.values())
    assert desired.capacity[contract.RESOURCE_GPU].isdigit()
    sick = sum(1 for g in FakeBackend(path).read().gpus if not g.healthy)
    assert desired.labels.get(contract.LABEL_GPUS_UNHEALTHY) == (str(sick) if sick else None)


# --- parity with GPU Feature Discovery ----------------------------------------------
# GFD's outputs for real GPUs: its README (T4: Tesla-T4, 15360, turing 7.5, mode compute,
# driver 550.107.02 -> revision "02", runtime 12.5), GPU Operator node dumps (L4:
# NVIDIA-L4, 23034, ada-lovelace; H100: NVIDIA-H100-80GB-HBM3, hopper 9.0), and, for
# MIG-enabled A100s, what GFD writes for full GPUs in MIG mode (replicas 0).
GFD_OUTPUTS = {
    "t4x1.yaml": {
        "gpu.product": "Tesla-T4",
        "gpu.memory": "15360",
        "gpu.family": "turing",
        "gpu.compute.major": "7",
        "gpu.compute.minor": "5",
        "gpu.count": "1",
        "gpu.replicas": "1",
        "gpu.sharing-strategy": "none",
        "gpu.mode": "compute",
        "mps.capable": "false",
        "mig.capable": "false",
        "cuda.driver-version.major": "550",
        "cuda.driver-version.minor": "107",
        "cuda.driver-version.revision": "02",
        "cuda.driver-version.full": "550.107.02",
        "cuda.runtime-version.major": "12",
        "cuda.runtime-version.minor": "5",
        "cuda.runtime-version.full": "12.5",
    },
    "l4x2.yaml": {
        "gpu.product": "NVIDIA-L4",
        "gpu.memory": "23034",
        "gpu.family": "ada-lovelace",
        "gpu.compute.major": "8",
        "gpu.compute.minor": "9",
        "gpu.count": "2",
        "gpu.replicas": "1",
        "gpu.mode": "compute",
        "mig.capable": "false",
    },
    "h100x8.yaml": {
        "gpu.product": "NVIDIA-H100-80GB-HBM3",
        "gpu.memory": "81559",
        "gpu.family": "hopper",
        "gpu.compute.major": "9",
        "gpu.compute.minor": "0",
        "gpu.count": "8",
        "mig.capable": "true",
    },
    "a100x4-mig.yaml": {
        "gpu.product": "NVIDIA-A100-SXM4-40GB",
        "gpu.memory": "40960",
        "gpu.family": "ampere",
        "gpu.count": "4",
        "gpu.replicas": "1",  # two of the four are not in MIG mode
        "mig.capable": "true",
        "cuda.driver-version.revision": "08",
    },
}


@pytest.mark.parametrize("fixture", sorted(GFD_OUTPUTS))
def test_labels_are_what_gfd_writes_for_the_same_gpus(fixture: str) -> None:
    labels = desired_state(load(fixture)).labels
    for key, value in GFD_OUTPUTS[fixture].items():
        assert labels["nvidia.com/" + key] == value, key


def test_every_gpu_in_mig_mode_has_replicas_zero_as_gfd_writes() -> None:
    gpus = mig_a100s(2)
    labels = desired_state(Inventory("550.54.15", "12.4", gpus)).labels
    assert labels[contract.LABEL_GPU_REPLICAS] == "0"


def test_gpu_mode_follows_the_pci_class() -> None:
    vga = (gpu(0, "NVIDIA RTX 4000 Ada Generation", 20475, "8.9", pci_class="0x030000"),)
    assert (
        desired_state(Inventory("550.54.15", "12.4", vga)).labels[contract.LABEL_GPU_MODE]
        == "graphics"
    )
    mixed = (*vga, gpu(1, "NVIDIA L4", 23034, "8.9", pci_class="0x030200"))
    unknown = desired_state(Inventory("550.54.15", "12.4", mixed)).labels
    assert unknown[contract.LABEL_GPU_MODE] == "unknown"
