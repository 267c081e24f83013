"""The device plugin's decisions, without gRPC (agent/deviceplugin/devices.py): device
lists, overlap, preferred allocations (sharing.fit's choice), Allocate's checks and
answers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.deviceplugin import devices as dv
from agent.deviceplugin.devices import SHARES, WHOLE, GpuInfo, Options, Refused
from agent.inventory import Gpu, Inventory
from gpu_scheduler import sharing

A, B, C = "GPU-aaaa", "GPU-bbbb", "GPU-cccc"
GPUS = (GpuInfo(A, 0, 4), GpuInfo(B, 1, 8), GpuInfo(C, 2, 8))


def ids(uuid: str, units) -> list[str]:
    return [sharing.device_id(uuid, k) for k in units]


def health(devices) -> dict[str, bool]:
    return {d.id: d.healthy for d in devices}


def test_lists_name_every_unit_and_every_gpu():
    lists = dv.device_lists(GPUS, set())
    assert [d.id for d in lists[WHOLE]] == [A, B, C]
    assert [d.id for d in lists[SHARES]] == ids(A, range(4)) + ids(B, range(8)) + ids(C, range(8))
    assert all(d.healthy for r in lists.values() for d in r)


def test_load_never_makes_an_id_unhealthy():
    """Issue 49 item 8: the kubelet's allocatable is the Healthy IDs, so a busy GPU's
    other resource stays Healthy (load is not missing capacity); only a sick GPU's IDs
    go. The lists no longer read what is allocated at all."""
    lists = dv.device_lists(GPUS, set())
    assert all(d.healthy for r in lists.values() for d in r)
    assert "allocated" not in dv.device_lists.__code__.co_varnames


def test_a_sick_gpu_has_every_id_unhealthy():
    lists = dv.device_lists(GPUS, {C})
    assert not health(lists[WHOLE])[C]
    assert not any(health(lists[SHARES])[i] for i in ids(C, range(8)))
    assert health(lists[WHOLE])[A]


def test_inventory_gpus_mig_gpus_offer_nothing_and_sick_ones_keep_their_units():
    inventory = Inventory(
        "550.54.15",
        "12.4",
        (
            Gpu(1, B, "H100", 81559, "9.0"),
            Gpu(0, A, "H100", 81559, "9.0", mig_capable=True, mig_enabled=True),
        ),
    )
    gpus = dv.gpus_from_inventory(inventory)
    assert gpus == (GpuInfo(A, 0, 0, None, True), GpuInfo(B, 1, 79))
    assert not health(dv.device_lists(gpus, set())[WHOLE])[A]
    sick = (GpuInfo(A, 0, 0, None, True), GpuInfo(B, 1, 0))  # NVML reads no memory
    assert dv.remember_units(gpus, sick)[1].units == 79


def test_ids_not_of_ours_are_not_parsed():
    assert dv.parse_share(f"{A}::3") == (A, 3)
    for bad in ("GPU-a", "GPU-a::", "::3", "GPU-a::07", "GPU-a::-1", "GPU-a::٣", "x" * 500 + "::1"):
        assert dv.parse_share(bad) is None


# --- preferred allocations --------------------------------------------------------------
def test_preferred_shares_fill_a_partly_used_gpu_before_a_free_one():
    available = ids(A, [1, 2, 3]) + ids(B, range(8)) + ids(C, range(8))
    assert dv.preferred_shares(GPUS, available, [], 2) == ids(A, [1, 2])
    # Too big for A's three: the smallest that holds it, B (before C, by index).
    assert dv.preferred_shares(GPUS, available, [], 5) == ids(B, range(5))


def test_preferred_shares_honour_must_include():
    available = ids(A, range(4)) + ids(B, range(8))
    assert dv.preferred_shares(GPUS, available, [f"{B}::5"], 3) == [f"{B}::5", *ids(B, [0, 1])]
    # On two GPUs: only what must be there; the kubelet fills, Allocate refuses.
    assert dv.preferred_shares(GPUS, available, [f"{A}::0", f"{B}::0"], 3) == [
        f"{A}::0",
        f"{B}::0",
    ]
    # Its GPU has too little left: the same.
    assert dv.preferred_shares(GPUS, ids(A, [0, 1]), [f"{A}::0"], 3) == [f"{A}::0"]
    with pytest.raises(Refused, match="must-include"):
        dv.preferred_shares(GPUS, available, ids(A, [0, 1]), 1)
    with pytest.raises(Refused, match=r"not a gpu-scheduler\.io/gpu-memory device ID"):
        dv.preferred_shares(GPUS, available, ["nvidia0"], 1)


def test_preferred_shares_when_nothing_fits_or_nothing_is_asked():
    available = ids(A, range(4))
    assert dv.preferred_shares(GPUS, available, [], 5) == []
    assert dv.preferred_shares(GPUS, available, [], 0) == []
    assert dv.preferred_shares(GPUS, available, [], -7) == []
    noisy = [*available, "junk", "GPU-zz::1", f"{A}::99", f"{A}::0"]
    assert dv.preferred_shares(GPUS, noisy, [], 4) == ids(A, range(4))


def test_preferred_shares_skip_gpus_given_whole():
    """Issue 49 item 10: the kubelet's list of gpu-memory IDs leaves out those it
    allocated, but counts the other resource apart: it offers every share ID of a GPU
    given whole (a moment ago, to an earlier container of the same pod). The plugin's
    own count keeps a share off it."""
    available = ids(A, range(4)) + ids(B, range(8)) + ids(C, range(8))
    assert dv.preferred_shares(GPUS, available, [], 5) == ids(B, range(5))
    assert dv.preferred_shares(GPUS, available, [], 5, whole={B}) == ids(C, range(5))
    assert dv.preferred_shares(GPUS, available, [], 5, whole={B, C}) == []
    assert dv.preferred_shares(GPUS, available, [], 3, whole={B}) == ids(A, range(3))


def test_preferred_whole_takes_wholly_free_gpus_lowest_index_first():
    assert dv.preferred_whole(GPUS, [C, B, A], [], 2, {A}) == [B, C]
    assert dv.preferred_whole(GPUS, [C, B, A], [C], 2, set()) == [C, A]
    assert dv.preferred_whole(GPUS, [A, B], [], 2, {A}) == [B, A]  # too few: A last
    with pytest.raises(Refused):
        dv.preferred_whole(GPUS, [A], ["GPU-nope"], 1, set())


@st.composite
def gpu_states(draw):
    count = draw(st.integers(1, 6))
    gpus = tuple(GpuInfo(f"GPU-{i:04d}", i, draw(st.integers(1, 24))) for i in range(count))
    available = []
    for gpu in gpus:
        available += ids(gpu.uuid, sorted(draw(st.sets(st.integers(0, gpu.units - 1)))))
    return gpus, draw(st.permutations(available)), draw(st.integers(1, 30))


@settings(max_examples=400, deadline=None)
@given(gpu_states())
def test_preferred_shares_is_sharing_fit_on_one_gpu(state):
    gpus, available, size = state
    answer = dv.preferred_shares(gpus, available, [], size)
    free = {g.uuid: sum(1 for i in available if i.startswith(g.uuid + "::")) for g in gpus}
    rows = [sharing.Gpu(g.uuid, g.units, free[g.uuid], free[g.uuid] == g.units) for g in gpus]
    placement = sharing.fit(rows, [size])
    assert len({sharing.id_gpu(i) for i in answer}) <= 1
    assert set(answer) <= set(available) and len(set(answer)) == len(answer)
    if any(f >= size for f in free.values()):
        assert len(answer) == size
        assert sharing.id_gpu(answer[0]) == gpus[placement.shares[0]].uuid
    else:
        assert placement is None and answer == []


# --- Allocate ---------------------------------------------------------------------------
def test_allocate_checks_refuse_what_is_not_one_gpu_of_ours():
    assert dv.check_shares(GPUS, ids(B, [0, 3]), set()) == (GPUS[1], 2)
    cases = {
        "no gpu-scheduler.io/gpu-memory device ID": [],
        "span 2 GPUs": [f"{A}::0", f"{B}::0"],
        "not a gpu-scheduler.io/gpu-memory device ID": ["nvidia0"],
        "no GPU 'GPU-zzzz' on this node": ["GPU-zzzz::0"],
        "has 4 units": [f"{A}::4"],
        "repeated": [f"{A}::1", f"{A}::1"],
    }
    for message, request in cases.items():
        with pytest.raises(Refused, match=message) as refused:
            dv.check_shares(GPUS, request, set())
        assert not refused.value.precondition
    with pytest.raises(Refused, match="given whole") as refused:
        dv.check_shares(GPUS, [f"{A}::0"], {A})
    assert refused.value.precondition


def test_whole_allocate_checks():
    assert dv.check_whole(GPUS, [C, A], set()) == [GPUS[2], GPUS[0]]
    for request in ([], ["GPU-zzzz"], [A, A], [f"{A}::0"]):
        with pytest.raises(Refused):
            dv.check_whole(GPUS, request, set())
    with pytest.raises(Refused, match="shares in use") as refused:
        dv.check_whole(GPUS, [B], {B})
    assert refused.value.precondition


def test_answers_by_mode_and_cdi():
    ts = dv.share_answer(GPUS[1], 3, Options("time-slicing"))
    assert ts.envs == {
        "NVIDIA_VISIBLE_DEVICES": B,
        "GPU_SCHEDULER_GPU_UUID": B,
        "GPU_SCHEDULER_GPU_MEMORY_GIB": "3",
    }
    assert ts.mounts == () and ts.cdi_devices == ()
    mps = dv.share_answer(GPUS[1], 3, Options("mps", mps_root="/r", mps_container_pipe="/p"))
    assert mps.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/p"
    assert mps.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3G"
    assert mps.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "38"  # ceil(300 / 8)
    assert mps.mounts == (dv.Mount("/p", f"/r/{B}"), dv.Mount("/dev/shm", "/r/shm"))
    cdi = dv.share_answer(GPUS[1], 3, Options("mps", cdi=True))
    assert "NVIDIA_VISIBLE_DEVICES" not in cdi.envs and cdi.cdi_devices == (f"nvidia.com/gpu={B}",)
    assert dv.whole_answer(GPUS[:2], Options()).envs == {"NVIDIA_VISIBLE_DEVICES": f"{A},{B}"}
    assert dv.whole_answer(GPUS[:1], Options(cdi=True)).cdi_devices == (f"nvidia.com/gpu={A}",)
    with pytest.raises(ValueError):
        Options("exclusive")
