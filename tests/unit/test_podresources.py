"""The kubelet's PodResources API (agent/podresources.py): a real gRPC server on a unix
socket plays the kubelet (its answers, a missing socket, a stall past the deadline, an
answer too big or not decodable, a restart); the report it makes of the answers is
checked against hostile device IDs and read back by sharing.read_report."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent import podresources_pb2 as pb
from agent import podresources_pb2_grpc as pb_grpc
from agent.podresources import (
    MALFORMED,
    NO_UID,
    NOT_OURS,
    OVER,
    PodResourcesClient,
    allocated_ids,
    encode_report,
    read_shares,
    shares_report,
)
from gpu_scheduler import contract, sharing

ROOT = Path(__file__).resolve().parents[2]
MEM, GPU = contract.RESOURCE_GPU_MEMORY, contract.RESOURCE_GPU
A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
OURS = (A, B)


def ids(uuid: str, *units: int) -> list[str]:
    return [sharing.device_id(uuid, k) for k in units]


def pod(namespace: str, name: str, *containers: list[tuple[str, list[str]]]) -> pb.PodResources:
    return pb.PodResources(
        namespace=namespace,
        name=name,
        containers=[
            pb.ContainerResources(
                name=f"c{i}",
                devices=[pb.ContainerDevices(resource_name=r, device_ids=d) for r, d in devices],
            )
            for i, devices in enumerate(containers)
        ],
    )


def answer(*pods: pb.PodResources) -> pb.ListPodResourcesResponse:
    return pb.ListPodResourcesResponse(pod_resources=list(pods))


def uids_of(response: pb.ListPodResourcesResponse) -> dict[str, str]:
    """What the kubelet's device checkpoint would say: each device ID's pod UID
    (``uid-<namespace>-<name>`` here)."""
    return {
        device: f"uid-{p.namespace}-{p.name}"
        for p in response.pod_resources
        for c in p.containers
        for d in c.devices
        for device in d.device_ids
    }


NORMAL = answer(
    pod("ml", "train", [(MEM, ids(A, 0, 1, 2))], [(MEM, ids(A, 3))]),  # two containers: 4
    pod("ml", "infer", [(MEM, ids(B, 7, 8)), ("example.com/nic", ["eth1"])]),
    pod("batch", "big", [(GPU, [B])]),
    pod("other", "cpu-only", [("cpu", ["0"])]),
)


# --- the fake kubelet ----------------------------------------------------------------
class FakeKubelet(pb_grpc.PodResourcesListerServicer):
    """Answers ``List`` with ``self.response``; stalls while ``self.stall`` is set."""

    def __init__(self) -> None:
        self.response = answer()
        self.stall = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def List(self, request, context):
        self.calls += 1
        if self.stall.is_set():
            self.release.wait(10)
        return self.response


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory: a unix socket's path must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="prs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def serve(path: Path, servicer=None, handler=None) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    if servicer is not None:
        pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    if handler is not None:
        server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[tuple[FakeKubelet, Path]]:
    fake = FakeKubelet()
    path = sock_dir / "kubelet.sock"
    server = serve(path, fake)
    yield fake, path
    fake.release.set()
    server.stop(None)


# --- the client ----------------------------------------------------------------------
def test_the_client_reads_the_kubelets_answer(kubelet):
    fake, path = kubelet
    fake.response = NORMAL
    client = PodResourcesClient(str(path))
    got = client.list()
    assert got.ok and not got.stale and got.error is None
    assert got.response == NORMAL
    assert shares_report(got.response, OURS, uids_of(NORMAL)) == {
        A: {"uid-ml-train": 4},
        B: {"uid-batch-big": "whole", "uid-ml-infer": 2},
    }
    assert client.last().response == NORMAL
    client.close()


def test_a_missing_socket_is_an_error_in_words_not_a_crash(sock_dir):
    client = PodResourcesClient(str(sock_dir / "nothing.sock"))
    started = time.monotonic()
    got = client.list()
    assert time.monotonic() - started < 1
    assert got.response is None and not got.stale and not got.ok
    assert "no socket at" in got.error and "nothing.sock" in got.error
    assert got.age(100.0) is None


def test_a_path_that_is_not_a_socket_or_has_no_listener_is_an_error(sock_dir):
    plain = sock_dir / "plain"
    plain.write_text("")
    assert "is not a socket" in PodResourcesClient(str(plain)).list().error
    dead = sock_dir / "dead.sock"
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(str(dead))  # bound, never listening: connections are refused
    try:
        got = PodResourcesClient(str(dead), timeout_s=1).list()
    finally:
        bound.close()
    assert got.error.startswith("cannot reach the kubelet at"), got.error


def test_a_stalled_kubelet_hits_the_deadline_and_the_last_answer_stays_stale(kubelet):
    fake, path = kubelet
    fake.response = NORMAL
    now = [100.0]
    client = PodResourcesClient(str(path), timeout_s=0.3, monotonic=lambda: now[0])
    assert client.list().ok
    fake.stall.set()
    now[0] = 130.0
    started = time.monotonic()
    got = client.list()
    assert time.monotonic() - started < 2
    assert got.error == f"the kubelet gave no answer within 0.3s ({path})"
    assert got.stale and got.response == NORMAL
    assert got.at == 100.0 and got.age(now[0]) == 30.0
    assert client.last().stale
    fake.stall.clear()
    fake.release.set()
    fresh = client.list()  # the kubelet answers again: fresh, not stale
    assert fresh.ok and fresh.at == 130.0


def test_an_answer_over_the_cap_is_refused(kubelet):
    fake, path = kubelet
    fake.response = NORMAL
    client = PodResourcesClient(str(path), max_bytes=64 << 10)
    assert client.list().ok
    fake.response = answer(*(pod("ns", f"p{i}", [(MEM, ids(A, *range(50)))]) for i in range(100)))
    assert fake.response.ByteSize() > 64 << 10
    got = client.list()
    assert got.error.startswith("the kubelet's answer is over 65536 bytes"), got.error
    assert got.stale and got.response == NORMAL


def test_an_answer_that_does_not_decode_is_an_error(sock_dir):
    path = sock_dir / "garbage.sock"
    raw = grpc.unary_unary_rpc_method_handler(lambda request, context: b"\x0a\xff\xff\xff")
    handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": raw})
    server = serve(path, handler=handler)
    try:
        got = PodResourcesClient(str(path)).list()
    finally:
        server.stop(None)
    assert got.response is None
    assert got.error.startswith("PodResources List failed"), got.error


def test_a_restarted_kubelet_is_read_again(sock_dir):
    path = sock_dir / "kubelet.sock"
    fake = FakeKubelet()
    fake.response = NORMAL
    server = serve(path, fake)
    client = PodResourcesClient(str(path), timeout_s=1)
    assert client.list().ok
    server.stop(None).wait()
    path.unlink(missing_ok=True)
    assert client.list().stale
    second = FakeKubelet()
    server = serve(path, second)
    try:
        got = client.list()
    finally:
        server.stop(None)
    assert got.ok and got.response == answer() and second.calls == 1


# --- the report: pure ----------------------------------------------------------------
def test_foreign_malformed_and_unnamed_ids_are_skipped_and_counted():
    """And pods whose UID the checkpoint does not give (or gives several, or one a
    reader would refuse) are left out: the extender then fits them itself."""
    hostile = answer(
        pod(
            "ml",
            "mixed",
            [
                (MEM, [*ids(A, 0, 1), "GPU-unknown::0", "nvidia0::3"]),  # 2 ours, 2 not
                (MEM, ["GPU-a", f"{A}::", f"{A}::x", "::3", f"{A}::\u0661"]),  # malformed
            ],
            [(GPU, [A, f"{B}::0", "GPU-unknown", "0"])],  # whole A; 3 not ours
        ),
        pod("ns", "slashed", [(MEM, ids(B, 1))]),
        pod("ns", "unknown", [(MEM, ids(B, 2))]),
        pod("ns", "long", [(GPU, [B])]),
        pod("ns", "two", [(MEM, ids(B, 3, 4))]),
    )
    uids = uids_of(hostile)
    uids[ids(B, 1)[0]] = "ns/slashed"  # an old report's key: never written
    del uids[ids(B, 2)[0]]
    uids[B] = "u" * (sharing.MAX_POD_KEY + 1)
    uids[ids(B, 4)[0]] = "uid-another"
    shares = read_shares(hostile, OURS, uids)
    assert shares.report == {A: {"uid-ml-mixed": "whole"}, B: {}}
    assert shares.skipped == {MALFORMED: 5, NOT_OURS: 5, NO_UID: 5}


def test_units_are_distinct_ids_per_gpu_summed_over_containers():
    reused = answer(
        pod(
            "ml",
            "p",
            [(MEM, ids(A, 0, 1))],
            [(MEM, ids(A, 1, 2)), (MEM, ids(B, 5))],  # A::1 given twice counts once
        ),
        pod("ml", "p", [(MEM, ids(A, 9))]),  # the same pod twice: merged
    )
    report = shares_report(reused, OURS, uids_of(reused))
    assert report == {A: {"uid-ml-p": 4}, B: {"uid-ml-p": 1}}
    assert shares_report(reused, (), {}) == {}


def test_a_huge_answer_is_capped_to_what_a_reader_accepts():
    flood = answer(pod("ml", "flood", [(MEM, ids(A, *range(sharing.MAX_UNITS + 500)))]))
    shares = read_shares(flood, OURS, uids_of(flood))
    assert shares.report[A] == {"uid-ml-flood": sharing.MAX_UNITS}
    assert shares.skipped == {OVER: 500}
    assert sharing.read_report(shares.encoded) == shares.report


def test_the_encoding_round_trips_and_is_one_string_for_one_report():
    report = shares_report(NORMAL, OURS, uids_of(NORMAL))
    text = encode_report(report)
    assert text == (
        '{"GPU-aaaaaaaa-1111-2222-3333-444444444444":{"uid-ml-train":4},'
        '"GPU-bbbbbbbb-1111-2222-3333-444444444444":{"uid-batch-big":"whole","uid-ml-infer":2}}'
    )
    assert sharing.read_report(text) == report
    shuffled = answer(*reversed(NORMAL.pod_resources))
    assert read_shares(shuffled, (B, A), uids_of(shuffled)).encoded == text
    assert encode_report({}) == "{}" and sharing.read_report("{}") == {}


def test_a_report_a_reader_would_refuse_is_not_written():
    many = answer(
        *(pod("namespace-x", f"pod-{i:05d}-{'n' * 40}", [(MEM, ids(A, i))]) for i in range(5000))
    )
    report = shares_report(many, OURS, uids_of(many))
    assert len(report[A]) == 5000
    assert encode_report(report) is None
    assert encode_report({f"GPU-{i}": {} for i in range(sharing.MAX_GPUS + 1)}) is None
    small = {f"GPU-{i}": {} for i in range(sharing.MAX_GPUS)}
    assert sharing.read_report(encode_report(small)) == small


def test_allocated_ids_are_every_resources_ids_in_use():
    assert allocated_ids(NORMAL) == {
        MEM: {*ids(A, 0, 1, 2, 3), *ids(B, 7, 8)},
        GPU: {B},
        "example.com/nic": {"eth1"},
        "cpu": {"0"},
    }
    assert allocated_ids(answer(pod("a", "b", [("", ["x"]), (MEM, [""])]))) == {}
    assert allocated_ids(answer()) == {}


def test_the_messages_are_the_kubelets_v1_fields_and_numbers():
    file = pb.DESCRIPTOR
    assert file.package == "v1"
    fields = {
        name: {f.name: f.number for f in message.fields}
        for name, message in file.message_types_by_name.items()
    }
    assert fields == {
        "ListPodResourcesRequest": {},
        "ListPodResourcesResponse": {"pod_resources": 1},
        "PodResources": {"name": 1, "namespace": 2, "containers": 3},
        "ContainerResources": {"name": 1, "devices": 2},
        "ContainerDevices": {"resource_name": 1, "device_ids": 2},
    }
    methods = file.services_by_name["PodResourcesLister"].methods_by_name
    assert methods["List"].output_type.name == "ListPodResourcesResponse"


def _varint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        out += bytes([low | (0x80 if n else 0)])
        if not n:
            return out


def _field(number: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_a_kubelet_answer_with_the_fields_left_out_here_still_decodes():
    """CPUs, memory, topology and DRA claims, as a real kubelet sends them, are skipped."""
    topology = _field(1, _field(1, 0))  # TopologyInfo{nodes: [NUMANode{ID: 0}]}
    devices = _field(1, GPU.encode()) + _field(2, A.encode()) + _field(3, topology)
    claim = _field(2, b"claim") + _field(3, b"ml")  # DynamicResource
    container = _field(1, b"main") + _field(2, devices) + _field(3, 4) + _field(5, claim)
    memory = _field(1, b"memory") + _field(2, 1 << 30)  # ContainerMemory
    wire = _field(
        1, _field(1, b"train") + _field(2, b"ml") + _field(3, container) + _field(5, memory)
    )
    response = pb.ListPodResourcesResponse.FromString(wire)
    report = shares_report(response, OURS, uids_of(response))
    assert report == {A: {"uid-ml-train": "whole"}, B: {}}


def test_the_generated_modules_are_what_the_script_makes_of_the_proto():
    spec = importlib.util.spec_from_file_location("gen", ROOT / "tools" / "gen_podresources.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main(["--check"]) == 0, "agent/podresources_api.proto changed: run the script"
