"""The agent's kubelet device plugin over real gRPC on unix sockets: registration with
a fake kubelet (and again after it restarts), ListAndWatch, GetPreferredAllocation,
Allocate, and hostile requests."""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.deviceplugin import api_pb2, api_pb2_grpc
from agent.deviceplugin.devices import SHARES, WHOLE, GpuInfo, Options
from agent.deviceplugin.runner import SOCKETS, DevicePlugin, PluginConfig
from agent.deviceplugin.server import file_identity
from gpu_scheduler import contract, sharing
from tests.helpers import ManualClock as Clock

A, B, C = "GPU-aaaa", "GPU-bbbb", "GPU-cccc"
GPUS = (GpuInfo(A, 0, 4), GpuInfo(B, 1, 8), GpuInfo(C, 2, 8, numa=1))
OK_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
HOSTILE = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def ids(uuid: str, units) -> list[str]:
    return [sharing.device_id(uuid, k) for k in units]


# --- the fake kubelet and the sources -----------------------------------------------------
class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """kubelet.sock: records each Register; ``refuse`` answers it with an error."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.calls: list[api_pb2.RegisterRequest] = []
        self.refuse = False
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{folder / 'kubelet.sock'}")
        self.server.start()

    def Register(self, request, context):
        self.calls.append(request)
        if self.refuse:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "resource already taken")
        return api_pb2.Empty()

    def resources(self) -> list[str]:
        return [c.resource_name for c in self.calls]

    def stop(self) -> None:
        self.server.stop(0).wait(1)
        (self.folder / "kubelet.sock").unlink(missing_ok=True)


class Sources:
    """What the agent and the kubelet's PodResources would say, set by each test."""

    def __init__(self) -> None:
        self.gpus = GPUS
        self.unhealthy: set[str] = set()
        self.allocated: dict[str, set[str]] = {SHARES: set(), WHOLE: set()}
        self.failing = False

    def read_gpus(self):
        return self.gpus

    def read_unhealthy(self):
        return self.unhealthy

    def read_allocated(self):
        if self.failing:
            raise ConnectionError("PodResources is down")
        return self.allocated


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # short: a socket path is <108
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(folder: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(folder)
    yield fake
    fake.stop()


@pytest.fixture
def sources() -> Sources:
    return Sources()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def plugin(folder, kubelet, sources, clock) -> Iterator[DevicePlugin]:
    """The plugin, driven round by round with tick() (no thread of its own)."""
    config = PluginConfig(kubelet_dir=folder, options=Options("time-slicing"), grace_s=60)
    dp = DevicePlugin(
        config, sources.read_gpus, sources.read_allocated, sources.read_unhealthy, monotonic=clock
    )
    dp.tick()
    yield dp
    dp.stop()


def stub(folder: Path, resource: str) -> api_pb2_grpc.DevicePluginStub:
    channel = grpc.insecure_channel(f"unix://{folder / SOCKETS[resource]}")
    return api_pb2_grpc.DevicePluginStub(channel)


def allocate(folder: Path, resource: str, *containers: list[str]) -> api_pb2.AllocateResponse:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )
    return stub(folder, resource).Allocate(request, timeout=5)


def refused(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as error:
        call(*args)
    return error.value


class Stream:
    """A ListAndWatch stream read on a thread, each message's {ID: health} queued."""

    def __init__(self, folder: Path, resource: str) -> None:
        self.call = stub(folder, resource).ListAndWatch(api_pb2.Empty(), timeout=30)
        self.messages: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.messages.put({d.ID: d.health for d in message.devices})
        except grpc.RpcError:
            pass
        self.messages.put(None)

    def next(self, timeout: float = 5.0) -> dict[str, str] | None:
        return self.messages.get(timeout=timeout)

    def quiet(self, seconds: float = 0.3) -> bool:
        try:
            self.messages.get(timeout=seconds)
        except queue.Empty:
            return True
        return False


# --- registration -------------------------------------------------------------------------
def test_both_resources_register_and_serve_their_options(plugin, kubelet, folder):
    assert sorted(kubelet.resources()) == sorted([SHARES, WHOLE])
    for call in kubelet.calls:
        assert call.version == "v1beta1"
        assert call.endpoint == SOCKETS[call.resource_name]
        assert call.options.get_preferred_allocation_available
        assert not call.options.pre_start_required
    options = stub(folder, SHARES).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert options.get_preferred_allocation_available and not options.pre_start_required
    plugin.tick()
    assert len(kubelet.calls) == 2  # nothing changed: no registration again


def test_a_kubelet_restart_removing_our_socket_makes_a_new_one_and_registers_again(
    plugin, kubelet, folder
):
    socket = folder / SOCKETS[SHARES]
    before = file_identity(socket)  # (device, inode, ctime): the inode alone may be reused
    socket.unlink()  # what the kubelet does to every socket in its dir when it starts
    plugin.tick()
    assert kubelet.resources()[2:] == [SHARES]
    assert socket.exists() and file_identity(socket) != before
    stream = Stream(folder, SHARES)
    assert len(stream.next()) == 20
    assert plugin.registered() == {SHARES: True, WHOLE: True}


def test_a_new_kubelet_sock_registers_both_again(plugin, kubelet, folder, clock):
    kubelet.stop()
    plugin.tick()  # our sockets are still there: nothing to see yet
    assert len(kubelet.calls) == 2
    again = FakeKubelet(folder)
    try:
        plugin.tick()
        assert sorted(again.resources()) == sorted([SHARES, WHOLE])
    finally:
        again.stop()


def test_registration_is_tried_again_with_backoff(folder, sources, clock):
    dp = DevicePlugin(
        PluginConfig(kubelet_dir=folder, poll_s=1.0),
        sources.read_gpus,
        sources.read_allocated,
        sources.read_unhealthy,
        monotonic=clock,
    )
    try:
        dp.tick()  # no kubelet yet: served, not registered
        assert dp.registered() == {SHARES: False, WHOLE: False}
        assert (folder / SOCKETS[SHARES]).exists()
        kubelet = FakeKubelet(folder)
        kubelet.refuse = True
        dp.tick()  # a kubelet came up: tried at once, refused
        assert len(kubelet.calls) == 2 and dp.registered()[SHARES] is False
        kubelet.refuse = False
        dp.tick()  # backing off (the second failure: 2 s): not tried
        assert len(kubelet.calls) == 2
        clock.now += 1.5
        dp.tick()
        assert len(kubelet.calls) == 2
        clock.now += 1.0
        dp.tick()
        assert len(kubelet.calls) == 4 and dp.registered() == {SHARES: True, WHOLE: True}
        kubelet.stop()
    finally:
        dp.stop()


def test_start_and_stop_from_another_thread_within_a_second(folder, kubelet, sources):
    dp = DevicePlugin(
        PluginConfig(kubelet_dir=folder, poll_s=0.05),
        sources.read_gpus,
        sources.read_allocated,
        sources.read_unhealthy,
    ).start()
    deadline = time.monotonic() + 5
    while not all(dp.registered().values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert dp.running and all(dp.registered().values())
    stream = Stream(folder, WHOLE)
    assert stream.next() == {A: "Healthy", B: "Healthy", C: "Healthy"}
    sources.unhealthy = {B}
    dp.notify()
    assert stream.next()[B] == "Unhealthy"
    started = time.monotonic()
    dp.stop()
    assert time.monotonic() - started < 1.0
    assert stream.next() is None  # the stream ended
    assert not dp.running
    assert not (folder / SOCKETS[SHARES]).exists() and not (folder / SOCKETS[WHOLE]).exists()
    dp.stop()  # twice is fine


def test_follow_runs_the_plugin_as_the_setting_and_the_sharing_label_say(folder, kubelet, sources):
    dp = DevicePlugin(
        PluginConfig(kubelet_dir=folder, poll_s=0.05),
        sources.read_gpus,
        sources.read_allocated,
        sources.read_unhealthy,
    )
    label = contract.LABEL_GPU_SHARING
    try:
        dp.follow({}, "auto")
        assert not dp.running
        dp.follow({label: "mps"}, "auto")
        assert dp.running and dp.state.options.mode == "mps"
        dp.follow({label: "time-slicing"}, "auto")
        assert dp.running and dp.state.options.mode == "time-slicing"
        dp.follow({label: "exclusive"}, "auto")
        assert not dp.running
        dp.follow({}, "on")
        assert dp.running and dp.state.options.mode == "time-slicing"
        dp.follow({label: "mps"}, "off")
        assert not dp.running
    finally:
        dp.stop()


# --- ListAndWatch ------------------------------------------------------------------------
def test_list_and_watch_sends_changes_and_only_changes(plugin, sources, folder, clock):
    shares, whole = Stream(folder, SHARES), Stream(folder, WHOLE)
    first = shares.next()
    assert list(first) == ids(A, range(4)) + ids(B, range(8)) + ids(C, range(8))
    assert set(first.values()) == {"Healthy"}
    assert whole.next() == {A: "Healthy", B: "Healthy", C: "Healthy"}
    plugin.tick()
    assert shares.quiet() and whole.quiet()  # nothing changed: nothing sent

    sources.unhealthy = {C}  # the agent reads C sick
    plugin.tick()
    assert whole.next()[C] == "Unhealthy"
    listed = shares.next()
    assert {listed[i] for i in ids(C, range(8))} == {"Unhealthy"}

    # Load is not missing capacity (issue 49 item 8): a share in use, or a GPU given
    # whole, changes neither list; the kubelet's allocatable of both stays.
    allocate(folder, SHARES, ids(A, [0, 1]))
    assert whole.quiet() and shares.quiet()
    sources.allocated[SHARES] = set(ids(A, [0, 1]))  # PodResources shows it
    sources.allocated[WHOLE] = {B}  # B given whole
    plugin.tick()
    assert whole.quiet() and shares.quiet()

    sources.unhealthy = set()  # C well again
    plugin.tick()
    assert whole.next()[C] == "Healthy"


def test_topology_is_sent_when_known(plugin, folder):
    message = next(stub(folder, WHOLE).ListAndWatch(api_pb2.Empty(), timeout=5))
    topology = {d.ID: [n.ID for n in d.topology.nodes] for d in message.devices}
    assert topology == {A: [], B: [], C: [1]}


def test_a_handed_out_id_never_reported_is_released_after_grace(plugin, folder, sources, clock):
    allocate(folder, SHARES, ids(B, [0]))
    assert preferred(folder, WHOLE, [A, B, C], 1) == [A]  # B holds a share: not whole
    sources.failing = True  # PodResources down: the last answer and the handed-out IDs stay
    clock.now += 61
    plugin.tick()
    assert preferred(folder, WHOLE, [A, B, C], 2) == [A, C]
    sources.failing = False
    plugin.tick()
    assert preferred(folder, WHOLE, [A, B, C], 2) == [A, B]


# --- GetPreferredAllocation -----------------------------------------------------------------
def preferred(folder, resource, available, size, must=()):
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )
    answer = stub(folder, resource).GetPreferredAllocation(request, timeout=5)
    return list(answer.container_responses[0].deviceIDs)


def test_preferred_allocation_is_best_fit_on_one_gpu(plugin, folder):
    available = ids(A, [2, 3]) + ids(B, range(1, 8)) + ids(C, range(8))
    assert preferred(folder, SHARES, available, 2) == ids(A, [2, 3])  # A: partly used, fits
    assert preferred(folder, SHARES, available, 7) == ids(B, range(1, 8))
    assert preferred(folder, SHARES, available, 8) == ids(C, range(8))
    assert preferred(folder, SHARES, available, 9) == []  # no GPU holds it
    assert preferred(folder, SHARES, available, 3, [f"{C}::4"]) == [f"{C}::4", *ids(C, [0, 1])]


def test_preferred_whole_gpus_avoid_shared_ones(plugin, folder, sources):
    sources.allocated[SHARES] = {f"{A}::0"}
    plugin.tick()
    assert preferred(folder, WHOLE, [A, B, C], 1) == [B]
    assert preferred(folder, WHOLE, [C, A, B], 2) == [B, C]


def test_a_later_container_of_the_pod_sees_the_gpus_just_given_whole(plugin, folder):
    """Issue 49 item 10: the kubelet allocates a pod container by container. A GPU the
    first container was just given whole is in no list yet (PodResources has not caught
    up, and the share IDs stay Healthy): the next container's share must not be steered
    onto it, or Allocate refuses and the pod fails admission."""
    everything = ids(A, range(4)) + ids(B, range(8)) + ids(C, range(8))
    assert preferred(folder, SHARES, everything, 6) == ids(B, range(6))
    allocate(folder, WHOLE, [B])  # the first container: B whole
    assert preferred(folder, SHARES, everything, 6) == ids(C, range(6))
    allocate(folder, SHARES, ids(C, range(6)))  # the second container's share
    # A third container's 3 GiB: the tightest that holds it is A (4), then C's 2 left
    # is too small; never B. A fourth container asking whole GPUs: A and C hold shares.
    # (the kubelet's available IDs of a resource leave out those it allocated)
    available = [i for i in everything if i not in ids(C, range(6))]
    assert preferred(folder, SHARES, available, 3) == ids(A, range(3))
    assert preferred(folder, SHARES, available[4:], 2) == ids(C, [6, 7])  # C's free IDs
    allocate(folder, SHARES, ids(A, range(3)))
    error = refused(allocate, folder, WHOLE, [A])
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


@HOSTILE
@given(st.data())
def test_preferred_allocation_property(plugin, folder, data):
    """Any state of the GPUs, any size: one GPU, sharing.fit's, of the asked size when
    a GPU has room."""
    available: list[str] = []
    for gpu in GPUS:
        available += ids(gpu.uuid, sorted(data.draw(st.sets(st.integers(0, gpu.units - 1)))))
    size = data.draw(st.integers(1, 10))
    answer = preferred(folder, SHARES, data.draw(st.permutations(available)), size)
    free = [sum(1 for i in available if sharing.id_gpu(i) == g.uuid) for g in GPUS]
    rows = [sharing.Gpu(g.uuid, g.units, f, f == g.units) for g, f in zip(GPUS, free, strict=True)]
    placement = sharing.fit(rows, [size])
    assert len({sharing.id_gpu(i) for i in answer}) <= 1 and set(answer) <= set(available)
    if max(free) >= size:
        assert len(answer) == size and sharing.id_gpu(answer[0]) == GPUS[placement.shares[0]].uuid
    else:
        assert answer == []


# --- Allocate -----------------------------------------------------------------------------
def test_allocate_refuses_spanning_foreign_and_empty(plugin, folder):
    cases = {
        "span 2 GPUs": [[f"{A}::0", f"{B}::0"]],
        "not a gpu-scheduler.io/gpu-memory device ID of this plugin": [["nvidia-3"]],
        "no GPU 'GPU-zzzz' on this node": [["GPU-zzzz::0"]],
        "no gpu-scheduler.io/gpu-memory device ID": [[]],
        "no container": [],
    }
    for message, containers in cases.items():
        error = refused(allocate, folder, SHARES, *containers)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, message
        assert message in error.details()
    error = refused(allocate, folder, WHOLE, ["GPU-zzzz"])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_allocate_never_gives_a_gpu_whole_and_shared_at_once(plugin, folder):
    allocate(folder, SHARES, ids(A, [0]))
    error = refused(allocate, folder, WHOLE, [A])
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    allocate(folder, WHOLE, [B])
    error = refused(allocate, folder, SHARES, ids(B, [0, 1]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_allocate_in_time_slicing_mode(plugin, folder):
    answer = allocate(folder, SHARES, ids(B, [3, 4, 5]), ids(B, [0]))
    first, second = answer.container_responses
    assert dict(first.envs) == {
        "NVIDIA_VISIBLE_DEVICES": B,
        "GPU_SCHEDULER_GPU_UUID": B,
        "GPU_SCHEDULER_GPU_MEMORY_GIB": "3",
    }
    assert not first.mounts and not first.cdi_devices
    assert dict(second.envs)["GPU_SCHEDULER_GPU_MEMORY_GIB"] == "1"
    whole = allocate(folder, WHOLE, [A, C]).container_responses[0]
    assert dict(whole.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{A},{C}"}


def test_allocate_in_mps_mode_with_and_without_cdi(plugin, folder):
    plugin.set_mode("mps")
    answer = allocate(folder, SHARES, ids(B, [0, 1])).container_responses[0]
    envs = dict(answer.envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == B
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpu-scheduler/mps"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2G"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    mounts = {(m.container_path, m.host_path, m.read_only) for m in answer.mounts}
    assert mounts == {
        ("/run/gpu-scheduler/mps", f"/run/gpu-scheduler/mps/{B}", False),
        ("/dev/shm", "/run/gpu-scheduler/mps/shm", False),
    }
    plugin.state.options = Options("mps", cdi=True)
    answer = allocate(folder, SHARES, ids(A, [0, 1, 2])).container_responses[0]
    assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={A}"]
    assert "NVIDIA_VISIBLE_DEVICES" not in answer.envs
    assert dict(answer.envs)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "75"
    whole = allocate(folder, WHOLE, [C]).container_responses[0]
    assert [d.name for d in whole.cdi_devices] == [f"nvidia.com/gpu={C}"] and not whole.envs


# --- hostile requests -------------------------------------------------------------------
some_ids = st.one_of(
    st.sampled_from([A, B, C, f"{A}::0", f"{B}::7", f"{C}::3", f"{A}::4", "GPU-x::1", "", "::"]),
    st.text(max_size=80),
    st.builds(lambda u, k: f"{u}::{k}", st.sampled_from([A, B, C]), st.integers(-3, 10**30)),
)
id_lists = st.lists(some_ids, max_size=40)
int32 = st.integers(-(2**31), 2**31 - 1)


def answers_or_refuses(call, request) -> None:
    try:
        call(request, timeout=5)
    except grpc.RpcError as error:
        assert error.code() in OK_CODES, (error.code(), error.details())


@HOSTILE
@given(
    resource=st.sampled_from([SHARES, WHOLE]),
    containers=st.lists(st.tuples(id_lists, id_lists, int32), max_size=4),
    allocs=st.lists(id_lists, max_size=4),
)
def test_hostile_requests_are_answered_or_refused_never_fatal(
    plugin, folder, resource, containers, allocs
):
    client = stub(folder, resource)
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=a, must_include_deviceIDs=m, allocation_size=n
            )
            for a, m, n in containers
        ]
    )
    answers_or_refuses(client.GetPreferredAllocation, request)
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=c) for c in allocs]
    )
    answers_or_refuses(client.Allocate, request)
    assert client.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)


@HOSTILE
@given(st.binary(max_size=300))
def test_raw_garbage_never_kills_the_server(plugin, folder, raw):
    channel = grpc.insecure_channel(f"unix://{folder / SOCKETS[SHARES]}")
    for method in ("Allocate", "GetPreferredAllocation", "PreStartContainer"):
        call = channel.unary_unary(f"/v1beta1.DevicePlugin/{method}")
        try:
            call(raw, timeout=5)
        except grpc.RpcError as error:
            assert error.code() != grpc.StatusCode.UNAVAILABLE
    assert stub(folder, SHARES).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)


def test_huge_lists_and_many_streams_are_bounded(plugin, folder):
    too_many = ["x"] * 70_000
    error = refused(preferred, folder, SHARES, too_many, 1)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most" in error.details()
    error = refused(allocate, folder, SHARES, *([[f"{A}::0"]] * 65))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = refused(preferred, folder, SHARES, ["y" * 1000] * 5000, 1)  # 5 MB: over gRPC's cap
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    streams = []  # at most 4 at once: the oldest end (opened one by one: their order known)
    for _ in range(6):
        streams.append(Stream(folder, WHOLE))
        assert streams[-1].next() is not None
    assert streams[0].next() is None and streams[1].next() is None
    assert stub(folder, WHOLE).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
