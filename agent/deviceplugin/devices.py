"""What the device plugin says to the kubelet, decided without I/O: the device lists
of both resources, the preferred allocations, the checks of an Allocate and what it
adds to the container. The gRPC servicer (:mod:`agent.deviceplugin.server`) only
turns these into protobuf messages.

Two resources share each GPU of a sharing node: ``gpu-scheduler.io/gpu-memory`` (one
device ID per GiB, ``<uuid>::<k>``) and ``nvidia.com/gpu`` (one ID per GPU, its UUID).
The kubelet counts them apart, and its allocatable of each is the Healthy IDs: so the
lists mark only a sick GPU's IDs Unhealthy, never a busy one's (load is not missing
capacity: kube-scheduler's preemption and its count of a node's GPUs read allocatable).
The two never overlap on one GPU all the same: ``GetPreferredAllocation`` offers a
share only on a GPU not given whole and whole GPUs only without a share, by what this
plugin handed out and PodResources reports (so a container sees what an earlier one of
the same pod was just given), and Allocate refuses an overlap (FAILED_PRECONDITION).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from agent.inventory import Inventory
from gpu_scheduler import contract, sharing
from gpu_scheduler.textclip import clip, clip_text

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
SHARES, WHOLE = contract.RESOURCE_GPU_MEMORY, contract.RESOURCE_GPU
RESOURCES = (SHARES, WHOLE)
MPS, TIME_SLICING = contract.SHARING_MODES

#: At most this many containers in one request (a pod has a few; the kubelet sends one).
MAX_CONTAINERS = 64
#: At most this many device IDs in one list: every share ID of the largest node.
MAX_IDS = sharing.MAX_GPUS * sharing.MAX_UNITS
#: A GPU UUID longer than this is not one (NVML's are 40 characters).
MAX_UUID = 128

#: What the container reads to tell what it was given.
ENV_UUID = "GPU_SCHEDULER_GPU_UUID"
ENV_MEMORY = "GPU_SCHEDULER_GPU_MEMORY_GIB"
ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#: CDI names of NVIDIA's container toolkit: ``nvidia.com/gpu=<uuid>``.
CDI_KIND = "nvidia.com/gpu"


class Refused(ValueError):
    """A request the plugin will not carry out; ``precondition``: it was well formed
    but the GPU's state forbids it now (gRPC FAILED_PRECONDITION, else
    INVALID_ARGUMENT)."""

    def __init__(self, message: str, precondition: bool = False) -> None:
        super().__init__(message)
        self.precondition = precondition


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as the plugin serves it: ``units`` of gpu-memory (0: none, e.g. a GPU in
    MIG mode or of unknown memory), its NUMA node when known."""

    uuid: str
    index: int
    units: int
    numa: int | None = None
    #: In MIG mode: not served at all (its whole ID stays Unhealthy), as the extender
    #: reads such a GPU (sharing.node_gpus).
    mig: bool = False


@dataclass(frozen=True, slots=True)
class Device:
    id: str
    healthy: bool
    numa: int | None = None


@dataclass(frozen=True, slots=True)
class Options:
    """How Allocate answers: the node's sharing mode (``mps`` or ``time-slicing``),
    CDI device names instead of NVIDIA_VISIBLE_DEVICES, and the MPS directories: the
    host's root (a pipe directory per GPU, ``<root>/<uuid>``, and ``<root>/shm``, the
    MPS daemons' /dev/shm) and where the pipe directory appears in the container."""

    mode: str = TIME_SLICING
    cdi: bool = False
    mps_root: str = "/run/gpu-scheduler/mps"
    mps_container_pipe: str = "/run/gpu-scheduler/mps"

    def __post_init__(self) -> None:
        if self.mode not in contract.SHARING_MODES:
            raise ValueError(f"sharing mode must be one of {contract.SHARING_MODES}")


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class Answer:
    """What Allocate adds to one container."""

    envs: Mapping[str, str]
    mounts: tuple[Mount, ...] = ()
    cdi_devices: tuple[str, ...] = ()


# --- the inventory -----------------------------------------------------------------
def gpus_from_inventory(inventory: Inventory) -> tuple[GpuInfo, ...]:
    """The plugin's GPUs from the agent's read, in index order: a GPU in MIG mode
    offers no share and is not given whole."""
    out = []
    for gpu in inventory.gpus:
        units = 0 if gpu.mig_enabled else sharing.gpu_units(gpu.memory_mib)
        out.append(GpuInfo(gpu.uuid, gpu.index, units, None, gpu.mig_enabled))
    return tuple(sorted(out, key=lambda g: g.index))


def remember_units(before: Sequence[GpuInfo], now: Sequence[GpuInfo]) -> tuple[GpuInfo, ...]:
    """``now``, where a GPU that reads no memory (NVML fails on a sick GPU) keeps the
    units it had: its share IDs stay listed (Unhealthy) instead of vanishing."""
    known = {g.uuid: g.units for g in before}
    out = []
    for gpu in now:
        if gpu.units == 0 and not gpu.mig and known.get(gpu.uuid, 0) > 0:
            gpu = GpuInfo(gpu.uuid, gpu.index, known[gpu.uuid], gpu.numa, gpu.mig)
        out.append(gpu)
    return tuple(out)


# --- the device lists --------------------------------------------------------------
def share_ids(gpu: GpuInfo) -> list[str]:
    return [sharing.device_id(gpu.uuid, k) for k in range(gpu.units)]


def parse_share(device: str) -> tuple[str, int] | None:
    """(GPU UUID, unit) of a gpu-memory ID, None for an ID not of this plugin."""
    if not isinstance(device, str) or len(device) > MAX_UUID + 8:
        return None
    try:
        uuid = sharing.id_gpu(device)
    except ValueError:
        return None
    text = device.rpartition(sharing.ID_SEPARATOR)[2]
    unit = int(text)
    # Only the spelling device_id makes: "GPU-a::07" is not "GPU-a::7".
    return (uuid, unit) if text == str(unit) else None


def shared_gpus(share_devices: Iterable[str]) -> set[str]:
    """The GPUs any of these gpu-memory IDs is on (IDs not of ours are ignored)."""
    out = set()
    for device in share_devices:
        parsed = parse_share(device)
        if parsed is not None:
            out.add(parsed[0])
    return out


def device_lists(
    gpus: Sequence[GpuInfo], unhealthy: Collection[str]
) -> dict[str, tuple[Device, ...]]:
    """Both resources' device lists: a sick GPU (or one in MIG mode) has every ID
    Unhealthy, every other ID is Healthy, whatever holds it: what is allocated is the
    kubelet's count, and the overlap of the two resources is kept off by the preferred
    allocations and Allocate's checks."""
    shares: list[Device] = []
    wholes: list[Device] = []
    for gpu in gpus:
        ok = not (gpu.uuid in unhealthy or gpu.mig)
        wholes.append(Device(gpu.uuid, ok, gpu.numa))
        shares.extend(Device(i, ok, gpu.numa) for i in share_ids(gpu))
    return {SHARES: tuple(shares), WHOLE: tuple(wholes)}


# --- preferred allocations ---------------------------------------------------------
def unique(ids: Iterable[str], what: str) -> list[str]:
    """``ids`` without repeats, in order; refused beyond :data:`MAX_IDS`."""
    seen: dict[str, None] = {}
    for n, device in enumerate(ids):
        if n >= MAX_IDS:
            raise Refused(f"{what}: more than {MAX_IDS} device IDs")
        seen[device] = None
    return list(seen)


def preferred_shares(
    gpus: Sequence[GpuInfo],
    available: Iterable[str],
    must: Iterable[str],
    size: int,
    whole: Collection[str] = (),
) -> list[str]:
    """The gpu-memory IDs a container of ``size`` units should get: all on one GPU,
    the one :func:`gpu_scheduler.sharing.fit` picks among the available IDs (best
    fit: the GPU with the least room that holds it), its lowest units first. A GPU
    given whole (``whole``: the nvidia.com/gpu IDs allocated, an earlier container of
    the same pod's among them) offers none. The available IDs are the kubelet's exact
    count of its own resource: it leaves out those it allocated (to earlier containers
    too) and frees a deleted pod's before it asks.

    ``must`` (IDs the container already holds) on one GPU: that GPU is filled from its
    available IDs. When that cannot be (``must`` spans GPUs, or its GPU has too little
    left), and when no single GPU has ``size`` units available, only ``must`` comes
    back: the kubelet fills the rest itself, and Allocate then refuses the IDs
    spanning two GPUs, saying so (a preference is never an error: the kubelet would
    fail the pod on one)."""
    known = {g.uuid: g for g in gpus}
    must_ids = unique(must, "must_include_deviceIDs")
    for device in must_ids:
        _share_of(known, device)
    if must_ids and len(must_ids) > size:
        raise Refused(f"{len(must_ids)} must-include IDs for an allocation of {size}")
    if size <= len(must_ids):
        return must_ids
    free: dict[str, list[int]] = {}
    for device in unique(available, "available_deviceIDs"):
        parsed = parse_share(device)
        gpu = known.get(parsed[0]) if parsed else None
        if parsed is None or gpu is None or parsed[1] >= gpu.units:
            continue
        if gpu.uuid not in whole:
            free.setdefault(gpu.uuid, []).append(parsed[1])
    on = {_share_of(known, d)[0].uuid for d in must_ids}
    if len(on) > 1:
        return must_ids
    if on:
        (uuid,) = on
        held = set(must_ids)
        fill = [i for i in _ids(uuid, free.get(uuid, [])) if i not in held]
        need = size - len(must_ids)
        return must_ids + fill[:need] if len(fill) >= need else must_ids
    rows = [g for g in gpus if g.units > 0]
    table = []
    for g in rows:
        left = len(free.get(g.uuid, ()))
        table.append(sharing.Gpu(g.uuid, g.units, left, left >= g.units))
    placement = sharing.fit(table, [size])
    if placement is None:
        return []
    uuid = rows[placement.shares[0]].uuid
    return _ids(uuid, free[uuid])[:size]


def _ids(uuid: str, units: Iterable[int]) -> list[str]:
    return [sharing.device_id(uuid, k) for k in sorted(units)]


def preferred_whole(
    gpus: Sequence[GpuInfo],
    available: Iterable[str],
    must: Iterable[str],
    size: int,
    shared: Collection[str],
) -> list[str]:
    """The nvidia.com/gpu IDs a container of ``size`` GPUs should get: ``must`` first,
    then the wholly free GPUs (no share in use, ``shared``: an earlier container of the
    same pod's among them) as :func:`sharing.fit` takes them (lowest index first),
    then, if those are too few, the other available GPUs by index: Allocate refuses
    those with a share in use, and the kubelet fails the pod (a bypassed scheduler)."""
    known = {g.uuid: g for g in gpus}
    must_ids = unique(must, "must_include_deviceIDs")
    for uuid in must_ids:
        _whole_of(known, uuid)
    if must_ids and len(must_ids) > size:
        raise Refused(f"{len(must_ids)} must-include IDs for an allocation of {size}")
    offered = set(unique(available, "available_deviceIDs"))
    rows = [g for g in gpus if g.uuid in offered and g.uuid not in must_ids]
    need = size - len(must_ids)
    if need <= 0:
        return must_ids
    table = [sharing.Gpu(g.uuid, g.units, 0, g.uuid not in shared) for g in rows]
    placement = sharing.fit(table, [], need)
    if placement is not None:
        return must_ids + [rows[i].uuid for i in placement.whole]
    rest = sorted(rows, key=lambda g: (g.uuid in shared, g.index))
    return must_ids + [g.uuid for g in rest[:need]]


# --- Allocate ----------------------------------------------------------------------
def check_shares(
    gpus: Sequence[GpuInfo], ids: Sequence[str], whole: Collection[str]
) -> tuple[GpuInfo, int]:
    """The GPU and units of a gpu-memory allocation. Refused: no ID, an ID not of this
    plugin or of a GPU this node does not have, a repeat, IDs on two GPUs, a GPU
    that is given whole now (``whole``: the nvidia.com/gpu IDs allocated)."""
    if not ids:
        raise Refused(f"no {SHARES} device ID to allocate")
    if len(ids) > sharing.MAX_UNITS:
        raise Refused(f"{len(ids)} {SHARES} IDs: a share is at most {sharing.MAX_UNITS} GiB")
    if len(set(ids)) != len(ids):
        raise Refused(f"{SHARES} device IDs repeated: {clip(list(ids), 200)}")
    known = {g.uuid: g for g in gpus}
    on: dict[str, int] = {}
    gpu = None
    for device in ids:
        gpu, _ = _share_of(known, device)
        on[gpu.uuid] = on.get(gpu.uuid, 0) + 1
    if len(on) > 1 or gpu is None:
        spread = ", ".join(f"{clip_text(u, 64)}: {n}" for u, n in sorted(on.items()))
        raise Refused(
            f"{SHARES} IDs span {len(on)} GPUs ({spread}): a share must be on one GPU "
            f"(the kubelet picks across GPUs when none has {len(ids)} GiB available alone)"
        )
    if gpu.uuid in whole:
        raise Refused(f"GPU {gpu.uuid} is given whole to another container now", True)
    return gpu, len(ids)


def check_whole(
    gpus: Sequence[GpuInfo], ids: Sequence[str], shared: Collection[str]
) -> list[GpuInfo]:
    """The GPUs of an nvidia.com/gpu allocation. Refused: no ID, an unknown one, a
    repeat, a GPU that has a share in use now (``shared``)."""
    if not ids:
        raise Refused(f"no {WHOLE} device ID to allocate")
    if len(ids) > sharing.MAX_GPUS:
        raise Refused(f"{len(ids)} {WHOLE} IDs: a node has at most {sharing.MAX_GPUS}")
    if len(set(ids)) != len(ids):
        raise Refused(f"{WHOLE} device IDs repeated: {clip(list(ids), 200)}")
    known = {g.uuid: g for g in gpus}
    out = [_whole_of(known, uuid) for uuid in ids]
    busy = [g.uuid for g in out if g.uuid in shared]
    if busy:
        raise Refused(f"GPU {', '.join(busy)} has {SHARES} shares in use: not given whole", True)
    return out


def _share_of(known: Mapping[str, GpuInfo], device: str) -> tuple[GpuInfo, int]:
    parsed = parse_share(device)
    if parsed is None:
        raise Refused(f"{clip(device, 100)} is not a {SHARES} device ID of this plugin")
    gpu = known.get(parsed[0])
    if gpu is None:
        raise Refused(f"{clip(device, 100)}: no GPU {clip(parsed[0], 64)} on this node")
    if parsed[1] >= gpu.units:
        raise Refused(f"{clip(device, 100)}: GPU {gpu.uuid} has {gpu.units} units")
    return gpu, parsed[1]


def _whole_of(known: Mapping[str, GpuInfo], uuid: str) -> GpuInfo:
    gpu = known.get(uuid)
    if gpu is None or gpu.mig:
        raise Refused(f"{clip(uuid, 100)} is not a {WHOLE} device of this node")
    return gpu


def share_answer(gpu: GpuInfo, units: int, options: Options) -> Answer:
    """What a container given ``units`` GiB of ``gpu`` gets. In MPS mode the MPS client
    settings too: the pipe directory of the GPU's MPS daemon, the memory limit of its
    one visible device (ordinal 0 in the container) and a compute share proportional
    to the memory share (``ceil(100 * units / GPU units)`` percent of the SMs)."""
    envs = {ENV_UUID: gpu.uuid, ENV_MEMORY: str(units)}
    cdi: tuple[str, ...] = ()
    if options.cdi:
        cdi = (f"{CDI_KIND}={gpu.uuid}",)
    else:
        envs[ENV_VISIBLE] = gpu.uuid
    mounts: tuple[Mount, ...] = ()
    if options.mode == MPS:
        envs[ENV_MPS_PIPE] = options.mps_container_pipe
        envs[ENV_MPS_MEMORY] = f"0={units}G"
        envs[ENV_MPS_THREADS] = str(min(100, math.ceil(100 * units / max(gpu.units, 1))))
        root = PurePosixPath(options.mps_root)
        # As NVIDIA's device plugin in its MPS mode: the daemon's pipe directory and
        # the shared-memory directory it uses as /dev/shm, both writable (a client
        # connects to the daemon's sockets there and shares memory with it).
        mounts = (
            Mount(options.mps_container_pipe, str(root / gpu.uuid)),
            Mount("/dev/shm", str(root / "shm")),
        )
    return Answer(envs, mounts, cdi)


def whole_answer(gpus: Sequence[GpuInfo], options: Options) -> Answer:
    uuids = [g.uuid for g in gpus]
    if options.cdi:
        return Answer({}, (), tuple(f"{CDI_KIND}={u}" for u in uuids))
    return Answer({ENV_VISIBLE: ",".join(uuids)})
