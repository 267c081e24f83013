"""agent.loop over a fake API: writes, conflicts, backoff, readiness, stop mid-write;
agent.kubeapi over the real kubernetes client against a local HTTP server."""

from __future__ import annotations

import copy
import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from agent.fake import FakeBackend
from agent.heartbeat import PodIdentity
from agent.inventory import Inventory, InventoryError
from agent.kubeapi import ApiError, KubeNodeApi
from agent.loop import Agent, AgentConfig, backoff_delay
from agent.sync import NodeState
from gpu_scheduler import contract

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"
T0 = datetime(2026, 11, 29, 14, 0, 0, tzinfo=UTC)


def merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


class FakeApi:
    """The three calls on one Node held in memory, applied as the API server does
    (including the resourceVersion precondition and JSON-patch ``test``)."""

    def __init__(self, node: dict[str, Any] | None = None) -> None:
        self.node = node or {
            "metadata": {
                "name": "gpu-1",
                "labels": {"kubernetes.io/hostname": "gpu-1"},
                "annotations": {},
                "resourceVersion": "1",
            },
            "status": {"capacity": {"cpu": "32"}},
        }
        self.calls: list[str] = []
        self.fail: list[ApiError] = []  # raised by the next write calls, in order
        self.on_patch: Any = None
        self.dra: int | None = 0
        self.dra_calls = 0
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.lease_fail: list[ApiError] = []

    def _bump(self) -> None:
        meta = self.node["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def get_node(self, name: str) -> NodeState:
        self.calls.append("get")
        return NodeState.from_json(copy.deepcopy(self.node))

    def patch_metadata(self, name: str, patch: dict[str, Any]) -> None:
        self.calls.append("metadata")
        if self.on_patch:
            self.on_patch()
        if self.fail:
            raise self.fail.pop(0)
        want_rv = patch["metadata"].get("resourceVersion")
        if want_rv and want_rv != self.node["metadata"]["resourceVersion"]:
            raise ApiError("conflict", 409)
        self.node = merge(self.node, patch)
        self._bump()

    def patch_status(self, name: str, ops: list[dict[str, Any]]) -> None:
        self.calls.append("status")
        if self.fail:
            raise self.fail.pop(0)

        try:
            self.node = jsonpatch.apply_patch(self.node, ops)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise ApiError(str(exc), 422) from exc
        self._bump()

    def dra_gpus(self, name: str) -> int | None:
        self.dra_calls += 1
        return self.dra

    def renew_lease(self, namespace: str, name: str, lease: dict) -> None:
        self.calls.append("lease")
        if self.lease_fail:
            raise self.lease_fail.pop(0)
        self.leases[(namespace, name)] = lease


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def mono(self) -> float:
        return (self.now - T0).total_seconds()


class ScriptedStop(threading.Event):
    """A stop event whose wait() records the delay, advances the clock, and sets
    itself after ``rounds`` waits: run_forever without real sleeping."""

    def __init__(self, rounds: int, clock: Clock | None = None) -> None:
        super().__init__()
        self.rounds = rounds
        self.delays: list[float] = []
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.delays.append(float(timeout or 0))
        if self.clock:
            self.clock.now += timedelta(seconds=timeout or 0)
        if len(self.delays) >= self.rounds:
            self.set()
        return self.is_set()


class FailingBackend:
    def __init__(self, failures: int, then: Inventory) -> None:
        self.failures = failures
        self.then = then
        self.reads = 0

    def read(self) -> Inventory:
        self.reads += 1
        if self.reads <= self.failures:
            raise InventoryError("NVML could not be initialised (Driver Not Loaded (code 9))")
        return self.then


def h100() -> Inventory:
    return FakeBackend(FIXTURES / "h100x8.yaml").read()


POD = PodIdentity("gpu-scheduler", "gpu-scheduler-agent-abcde", "uid-1")


def make_agent(
    api: FakeApi, backend: Any = None, pod: PodIdentity | None = None, **kw: Any
) -> Agent:
    config = AgentConfig(
        node_name="gpu-1", backoff_base_s=2.0, backoff_max_s=60.0, manage_capacity=True, pod=pod
    )
    if "clock" in kw:
        kw["monotonic"] = kw["clock"].mono
    return Agent(
        config, backend or FakeBackend(FIXTURES / "h100x8.yaml"), api, jitter=lambda: 1.0, **kw
    )


def test_sync_writes_once_then_nothing() -> None:
    api = FakeApi()
    clock = Clock()
    agent = make_agent(api, clock=clock)
    agent.sync_once()
    assert api.calls == ["get", "metadata", "status"]
    labels = api.node["metadata"]["labels"]
    assert labels[contract.LABEL_GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert labels["kubernetes.io/hostname"] == "gpu-1"
    assert api.node["status"]["capacity"] == {"cpu": "32", contract.RESOURCE_GPU: "8"}
    assert contract.ANN_LEGACY_HEARTBEAT not in api.node["metadata"]["annotations"]
    api.calls.clear()
    clock.now += timedelta(seconds=60)
    assert agent.sync_once().empty
    assert api.calls == ["get"]


def test_a_conflict_is_re_read_and_retried() -> None:
    api = FakeApi()
    api.fail = [ApiError("conflict", 409)]
    agent = make_agent(api, clock=Clock())
    agent.sync_once()
    assert api.calls == ["get", "metadata", "get", "metadata", "status"]
    assert api.node["status"]["capacity"][contract.RESOURCE_GPU] == "8"


def test_a_concurrent_change_to_capacity_is_not_overwritten_blind() -> None:
    api = FakeApi()
    api.node["status"]["capacity"][contract.RESOURCE_GPU] = "4"
    agent = make_agent(api, clock=Clock())

    def someone_else_writes() -> None:  # between our read and our status patch
        api.node["status"]["capacity"][contract.RESOURCE_GPU] = "5"
        api.on_patch = None

    api.on_patch = someone_else_writes
    agent.sync_once()
    # The test op failed (422), the agent re-read and replaced 5 with 8.
    assert api.calls == ["get", "metadata", "status", "get", "status"]
    assert api.node["status"]["capacity"][contract.RESOURCE_GPU] == "8"


def test_endless_conflicts_give_up_with_the_error() -> None:
    api = FakeApi()
    api.fail = [ApiError("conflict", 409)] * 10
    agent = make_agent(api, clock=Clock())
    with pytest.raises(ApiError):
        agent.sync_once()
    assert api.calls.count("metadata") == agent.config.conflict_retries + 1


def test_inventory_failure_backs_off_touches_nothing_and_is_not_ready() -> None:
    api = FakeApi()
    before = copy.deepcopy(api.node)
    stop = ScriptedStop(rounds=4)
    backend = FailingBackend(failures=4, then=h100())
    agent = make_agent(api, backend, stop=stop, clock=Clock())
    assert agent.run_forever() == 0
    assert stop.delays == [2.0, 4.0, 8.0, 16.0]
    assert api.calls == [] and api.node == before
    ok, detail = agent.ready()
    assert not ok and "Driver Not Loaded" in detail


def test_recovery_after_inventory_failures_resets_backoff_and_turns_ready() -> None:
    api = FakeApi()
    stop = ScriptedStop(rounds=4)
    agent = make_agent(api, FailingBackend(failures=2, then=h100()), stop=stop, clock=Clock())
    agent.run_forever()
    assert stop.delays == [2.0, 4.0, 60.0, 60.0]
    assert agent.ready() == (True, "synced")
    assert api.node["status"]["capacity"][contract.RESOURCE_GPU] == "8"


@pytest.mark.parametrize("status", [None, 429, 500, 503, 403])
def test_api_errors_back_off(status: int | None) -> None:
    api = FakeApi()
    api.fail = [ApiError("boom", status), ApiError("boom", status)]
    stop = ScriptedStop(rounds=3)
    agent = make_agent(api, stop=stop, clock=Clock())
    agent.run_forever()
    assert stop.delays == [2.0, 4.0, 60.0]
    assert agent.ready()[0]


def test_retry_after_is_honoured() -> None:
    api = FakeApi()
    api.fail = [ApiError("slow down", 429, retry_after=30)]
    stop = ScriptedStop(rounds=1)
    make_agent(api, stop=stop, clock=Clock()).run_forever()
    assert stop.delays == [30.0]


def test_an_hour_in_a_steady_state_writes_nothing_to_the_node() -> None:
    """One hour at 60 s rounds: the first round writes the Node, then nothing; the Node
    is read every resync (10 min) and the Lease renewed every 5 min: 18 calls an hour
    (before Leases: 60 reads and 12 Node writes)."""
    api = FakeApi()
    clock = Clock()
    stop = ScriptedStop(rounds=60, clock=clock)
    make_agent(api, pod=POD, stop=stop, clock=clock).run_forever()
    assert api.calls[:4] == ["get", "metadata", "status", "lease"]
    assert api.calls.count("metadata") == 1 and api.calls.count("status") == 1
    assert api.calls.count("get") == 6  # t = 0, 10m, ..., 50m
    assert api.calls.count("lease") == 12  # t = 0, 5m, ..., 55m
    lease = api.leases[("gpu-scheduler", "gpu-1")]
    assert lease["spec"]["renewTime"] == "2026-11-29T14:55:00.000000Z"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_a_change_of_the_gpus_is_written_at_the_next_round() -> None:
    api = FakeApi()
    clock = Clock()
    stop = ScriptedStop(rounds=3, clock=clock)
    backend = FakeBackend(FIXTURES / "h100x8.yaml")
    lost = FakeBackend(FIXTURES / "cpu-none.yaml").read()
    reads = iter([h100(), lost, lost])
    backend.read = lambda: next(reads)  # type: ignore[method-assign]
    make_agent(api, backend, pod=POD, stop=stop, clock=clock).run_forever()
    assert api.calls == ["get", "metadata", "status", "lease", "get", "metadata", "status"]
    assert api.node["status"]["capacity"][contract.RESOURCE_GPU] == "0"


def test_no_pod_identity_means_no_heartbeat() -> None:
    api = FakeApi()
    stop = ScriptedStop(rounds=2, clock=(clock := Clock()))
    make_agent(api, stop=stop, clock=clock).run_forever()
    assert "lease" not in api.calls and api.leases == {}


def test_a_failed_renewal_backs_off_and_is_retried_without_rereading_the_node() -> None:
    api = FakeApi()
    api.lease_fail = [ApiError("forbidden", 403)]
    clock = Clock()
    stop = ScriptedStop(rounds=2, clock=clock)
    agent = make_agent(api, pod=POD, stop=stop, clock=clock)
    agent.run_forever()
    assert stop.delays == [2.0, 60.0]
    assert api.calls == ["get", "metadata", "status", "lease", "lease"]
    assert agent.ready() == (True, "synced")


def test_stop_during_a_write_finishes_the_round_and_exits() -> None:
    api = FakeApi()
    stop = threading.Event()
    api.on_patch = stop.set  # SIGTERM arrives while the metadata patch is in flight
    agent = make_agent(api, stop=stop, clock=Clock())
    assert agent.run_forever() == 0
    assert api.calls == ["get", "metadata", "status"]  # the round completed
    assert api.node["status"]["capacity"][contract.RESOURCE_GPU] == "8"


def test_backoff_delay() -> None:
    assert [backoff_delay(n, 2, 60) for n in range(0, 8)] == [0, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay(3, 2, 60, jitter=1.2) == pytest.approx(9.6)
    assert backoff_delay(10_000, 2, 60) == 60


# --- the real kubernetes client: the Content-Type each patch is sent with ----------


class _Recorder(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]
    node: dict[str, Any]
    status_code = 200

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.requests.append(
            {
                "method": self.command,
                "path": self.path,
                "content_type": self.headers.get("Content-Type"),
                "body": json.loads(body) if body else None,
            }
        )
        payload = json.dumps(
            self.node
            if self.status_code == 200
            else {
                "kind": "Status",
                "message": "the object has been modified",
                "reason": "Conflict",
                "code": self.status_code,
            }
        ).encode()
        self.send_response(self.status_code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _reply
    do_PATCH = _reply

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def apiserver() -> Any:
    handler = type(
        "Handler",
        (_Recorder,),
        {
            "requests": [],
            "node": {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": "gpu-1",
                    "resourceVersion": "9",
                    "labels": {"a": "b"},
                    "annotations": {},
                },
                "status": {"capacity": {"cpu": "32", "nvidia.com/gpu": "4"}},
            },
        },
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, handler
    server.shutdown()
    server.server_close()


def _kube_api(server: Any) -> KubeNodeApi:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    return KubeNodeApi(client.CoreV1Api(client.ApiClient(configuration)), timeout_s=5)


def test_kube_api_sends_merge_patch_and_json_patch(apiserver: Any) -> None:
    server, handler = apiserver
    api = _kube_api(server)
    node = api.get_node("gpu-1")
    assert node.resource_version == "9"
    assert node.capacity == {"cpu": "32", "nvidia.com/gpu": "4"}
    meta = {
        "metadata": {
            "labels": {contract.LABEL_GPU_COUNT: "8", contract.LABEL_GPU_MEMORY: None},
            "resourceVersion": "9",
        }
    }
    api.patch_metadata("gpu-1", meta)
    ops = [{"op": "replace", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}]
    api.patch_status("gpu-1", ops)
    get, patch, status = handler.requests
    assert (get["method"], get["path"]) == ("GET", "/api/v1/nodes/gpu-1")
    assert patch["method"] == "PATCH" and patch["path"].startswith("/api/v1/nodes/gpu-1?")
    assert patch["content_type"] == "application/merge-patch+json"
    assert patch["body"] == meta  # the null survives: it is what removes a label
    assert "fieldManager=gpu-scheduler-agent" in patch["path"]
    assert status["path"].startswith("/api/v1/nodes/gpu-1/status")
    assert status["content_type"] == "application/json-patch+json"
    assert status["body"] == ops


def test_kube_api_maps_http_errors(apiserver: Any) -> None:
    server, handler = apiserver
    handler.status_code = 409
    with pytest.raises(ApiError) as err:
        _kube_api(server).patch_metadata("gpu-1", {"metadata": {"labels": {}}})
    assert err.value.status == 409 and err.value.conflict
    assert "the object has been modified" in str(err.value)


def test_kube_api_no_server_is_an_error_without_status() -> None:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard: nothing listens
    configuration.retries = 0
    api = KubeNodeApi(client.CoreV1Api(client.ApiClient(configuration)), timeout_s=2)
    with pytest.raises(ApiError) as err:
        api.get_node("gpu-1")
    assert err.value.status is None and not err.value.conflict


# --- what the agent leaves to others --------------------------------------------------


def test_capacity_owned_by_the_device_plugin_is_never_touched() -> None:
    api = FakeApi()
    api.node["status"]["capacity"][contract.RESOURCE_GPU] = "8"
    api.node["metadata"]["managedFields"] = [
        {
            "manager": "kubelet",
            "operation": "Update",
            "subresource": "status",
            "fieldsV1": {"f:status": {"f:capacity": {"f:nvidia.com/gpu": {}}}},
        }
    ]
    agent = make_agent(api, backend=FakeBackend(FIXTURES / "h100x8-unhealthy.yaml"))
    agent.sync_once()
    assert "status" not in api.calls  # 7 healthy, but the device plugin's 8 stands
    assert api.node["status"]["capacity"][contract.RESOURCE_GPU] == "8"


def test_capacity_is_left_alone_where_a_dra_driver_publishes_the_gpus() -> None:
    api = FakeApi()
    api.dra = 8
    agent = make_agent(api, clock=Clock())
    agent.sync_once()
    assert "status" not in api.calls and contract.RESOURCE_GPU not in api.node["status"]["capacity"]
    agent.sync_once()
    assert api.dra_calls == 1  # asked once per dra_check_s, not every round


def test_capacity_is_off_by_default() -> None:
    api = FakeApi()
    config = AgentConfig(node_name="gpu-1")
    Agent(config, FakeBackend(FIXTURES / "h100x8.yaml"), api, jitter=lambda: 1.0).sync_once()
    assert "status" not in api.calls and api.dra_calls == 0


def test_gfd_labels_are_left_to_gfd_in_auto_mode() -> None:
    api = FakeApi()
    gfd = {contract.LABEL_GFD_TIMESTAMP: "1724632719", contract.LABEL_GPU_PRODUCT: "Tesla-T4"}
    api.node["metadata"]["labels"].update(gfd)
    agent = make_agent(api, clock=Clock())
    agent.sync_once()
    labels = api.node["metadata"]["labels"]
    assert labels[contract.LABEL_GPU_PRODUCT] == "Tesla-T4"  # GFD's value stands
    assert contract.LABEL_GPU_COUNT not in labels  # and none of GFD's keys is added
    annotations = api.node["metadata"]["annotations"]
    assert contract.ANN_GPUS in annotations


def test_kube_api_applies_the_lease_as_sent(apiserver: Any) -> None:
    """One server-side apply (creates or renews), the body byte for byte as built:
    renewTime keeps its six fractional digits (a MicroTime), which the client's typed
    V1Lease would drop."""
    from agent.heartbeat import lease_object

    server, handler = apiserver
    api = _kube_api(server)
    lease = lease_object("gpu-1", POD, T0, 300)
    api.renew_lease("gpu-scheduler", "gpu-1", lease)
    sent = handler.requests[-1]
    assert sent["method"] == "PATCH"
    assert sent["path"].startswith(
        "/apis/coordination.k8s.io/v1/namespaces/gpu-scheduler/leases/gpu-1?"
    )
    assert "fieldManager=gpu-scheduler-agent" in sent["path"] and "force=true" in sent["path"]
    assert sent["content_type"] == "application/apply-patch+yaml"
    assert sent["body"] == lease
    assert sent["body"]["spec"]["renewTime"] == "2026-11-29T14:00:00.000000Z"
