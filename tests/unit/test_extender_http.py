"""The extender over HTTP: a real gunicorn process (args mode) and the Flask app with a
filled cluster cache (cluster mode), speaking JSON in the exact upstream shape."""

from __future__ import annotations

import http.client
import json

import pytest
import requests

from extender.app import create_app
from extender.cache import ClusterCache
from gpu_scheduler import contract
from tests.factories import make_node, make_pod
from tests.helpers import CLI, free_port, running, tail, wait_for

H100 = dict(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)


def args_body(pod, nodes):
    # json.Marshal(ExtenderArgs) with nodeCacheCapable false: NodeNames is null.
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def names_body(pod, names):
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


@pytest.fixture(scope="module")
def extender_url(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("extender") / "extender.log"
    cmd = [*CLI, "extender", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"]
    with running(cmd, log) as proc:
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: requests.get(url + "/healthz", timeout=1).ok, 30, "extender")
        except TimeoutError:
            raise AssertionError(tail(log)) from None
        yield url
        assert proc.poll() is None, tail(log)


def test_filter_args_mode_echoes_passing_node_objects(extender_url):
    nodes = [make_node("h", 8, **H100), make_node("cpu"), make_node("small", 1, **H100)]
    r = requests.post(extender_url + "/filter", json=args_body(make_pod(gpus=2), nodes))
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    body = r.json()
    assert set(body) == {"Nodes", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert body["Error"] == ""
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["h"]
    assert body["Nodes"]["items"][0] == nodes[0]  # the whole object, unchanged
    assert set(body["FailedAndUnresolvableNodes"]) == {"cpu", "small"}
    assert body["FailedNodes"] == {}


def test_prioritize_args_mode_returns_host_priority_list(extender_url):
    nodes = [make_node("a", 8, **H100), make_node("b", 2, **H100)]
    r = requests.post(extender_url + "/prioritize", json=args_body(make_pod(gpus=2), nodes))
    assert r.status_code == 200
    body = r.json()
    assert [h["Host"] for h in body] == ["a", "b"]
    assert all(set(h) == {"Host", "Score"} and type(h["Score"]) is int for h in body)
    assert body[1]["Score"] == 10 and body[0]["Score"] < 10  # binpack: b fits exactly


def test_node_names_in_args_mode_is_a_clear_400(extender_url):
    r = requests.post(extender_url + "/filter", json=names_body(make_pod(), ["a"]))
    assert r.status_code == 400
    assert "nodeCacheCapable: false" in r.json()["error"]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"not json", "not JSON"),
        (b"", "empty request body"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"Nodes": {"items": []}}', "ExtenderArgs.Pod must be an object, not null"),
        (b'{"Pod": "x", "NodeNames": []}', "ExtenderArgs.Pod must be an object, not a string"),
        (b'{"Pod": {"metadata": {}, "spec": {}}}', "neither Nodes nor NodeNames"),
        (
            b'{"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": "x"}}',
            "ExtenderArgs.Nodes.items must be an array",
        ),
        (
            b'{"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": [{}]}}',
            "ExtenderArgs.Nodes.items[0].metadata.name must be a node name",
        ),
        (
            b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": ["a", 1]}',
            "ExtenderArgs.NodeNames[1] must be a node name",
        ),
        (
            b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": ["a", "b", "a"]}',
            "ExtenderArgs.NodeNames[2] repeats the node name 'a'",
        ),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_bad_input_is_a_400_with_a_reason_and_the_worker_lives(extender_url, verb, data, needle):
    r = requests.post(
        f"{extender_url}/{verb}", data=data, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]
    ok = requests.post(f"{extender_url}/{verb}", json=args_body(make_pod(), []))
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        ({"metadata": {}}, None),  # no spec: no GPUs, every node passes
        ({"metadata": 3, "spec": {}}, "metadata: must be an object, not a number"),
        (
            {"metadata": {}, "spec": {"containers": [{"resources": {"limits": []}}]}},
            "spec.containers[0].resources.limits: must be an object, not an array",
        ),
        (make_pod(gpus="1e999999"), "quantity '1e999999' is beyond 2**63-1"),
        (
            make_pod(gpus=1, annotations={contract.ANN_MIN_GPU_MEMORY: 40}),
            "gpu-scheduler.io/min-gpu-memory must be a string, not a number",
        ),
    ],
)
def test_a_malformed_pod_fails_every_node_naming_the_field(extender_url, pod, field):
    nodes = [make_node("a", 8, **H100), make_node("b", 2, **H100)]
    r = requests.post(extender_url + "/filter", json=args_body(pod, nodes))
    assert r.status_code == 200, r.text
    body = r.json()
    if field is None:
        assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["a", "b"]
        return
    assert body["Nodes"]["items"] == [] and body["FailedNodes"] == {}
    assert set(body["FailedAndUnresolvableNodes"]) == {"a", "b"}
    assert all(field in reason for reason in body["FailedAndUnresolvableNodes"].values())
    r = requests.post(extender_url + "/prioritize", json=args_body(pod, nodes))
    assert r.status_code == 200 and [h["Score"] for h in r.json()] == [0, 0]


def test_a_node_nested_too_deep_to_echo_fails_alone(extender_url):
    deep: object = "x"
    for _ in range(300):
        deep = [deep]
    odd = make_node("deep", 8, **H100)
    odd["spec"]["extra"] = deep
    nodes = [make_node("a", 8, **H100), odd]
    r = requests.post(extender_url + "/filter", json=args_body(make_pod(gpus=1), nodes))
    assert r.status_code == 200, r.text
    body = r.json()
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["a"]
    assert "nests too deep" in body["FailedAndUnresolvableNodes"]["deep"]


def test_huge_values_come_back_truncated(extender_url):
    huge = "x" * (4 << 20)
    r = requests.post(extender_url + "/filter", json={"Pod": {}, "NodeNames": [huge]})
    assert r.status_code == 400
    assert len(r.content) < 8192 and "must be a node name" in r.json()["error"]
    pod = make_pod(gpus=1, annotations={contract.ANN_PLACEMENT: huge})
    r = requests.post(extender_url + "/filter", json=args_body(pod, [make_node("a", 8, **H100)]))
    reason = r.json()["FailedAndUnresolvableNodes"]["a"]
    assert len(reason) < 4096 and "truncated" in reason


def test_oversized_body_is_refused_before_it_is_read(extender_url):
    host, port = extender_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/filter")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(1 << 30))
    conn.endheaders()
    conn.send(b'{"Pod": ')
    response = conn.getresponse()
    assert response.status == 413  # answered by the worker before any thread sees it
    assert "over the limit" in json.loads(response.read())["error"]
    conn.close()
    assert requests.get(extender_url + "/healthz").ok


def test_ops_endpoints(extender_url):
    assert requests.get(extender_url + "/healthz").json() == {"status": "ok"}
    assert requests.get(extender_url + "/readyz").status_code == 200
    requests.post(extender_url + "/filter", json=args_body(make_pod(), [make_node("a", 1)]))
    text = requests.get(extender_url + "/metrics").text
    assert 'gpu_scheduler_extender_requests_total{code="200",verb="filter"}' in text
    assert "gpu_scheduler_extender_request_seconds_bucket" in text
    assert requests.get(extender_url + "/nope").status_code == 404
    assert requests.get(extender_url + "/filter").status_code == 405


# --- cluster mode: the app with a cache filled as list+watch would -----------------
@pytest.fixture
def cluster_client():
    cache = ClusterCache(clock=lambda: 1_800_000_000.0)
    cache.replace_nodes(
        [
            make_node("a", 8, zone="z1", **H100),
            make_node("b", 8, zone="z2", **H100),
            make_node("c", 4, zone="z1", **H100),
            make_node("cpu", zone="z1"),
        ]
    )
    cache.replace_pods(
        [
            make_pod("r1", 6, node="a", phase="Running"),
            make_pod("r2", 3, node="c", phase="Running"),
            make_pod("done", 8, node="b", phase="Succeeded"),
        ]
    )
    assert cache.ready()[0] is False  # not synced by a watch: readyz says so
    app = create_app(node_source="cluster", cache=cache)
    return app.test_client(), cache


def test_cluster_mode_answers_with_node_names_and_counts_running_pods(cluster_client):
    client, _ = cluster_client
    r = client.post("/filter", json=names_body(make_pod(gpus=2), ["a", "b", "c", "cpu", "new"]))
    body = r.get_json()
    assert set(body) == {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert body["NodeNames"] == ["a", "b"]
    assert body["FailedNodes"] == {
        "c": "1 of 4 GPUs free; pod requests 2",
        "new": "node is not in the extender's node cache yet (just added?)",
    }
    assert list(body["FailedAndUnresolvableNodes"]) == ["cpu"]
    r = client.post("/prioritize", json=names_body(make_pod(gpus=2), ["a", "b"]))
    scores = {h["Host"]: h["Score"] for h in r.get_json()}
    assert scores["a"] > scores["b"]  # binpack: a has 2 free, b has 8


def test_cluster_mode_accepts_node_objects_too_and_uses_the_pod_cache(cluster_client):
    client, _ = cluster_client
    r = client.post("/filter", json=args_body(make_pod(gpus=4), [make_node("a", 8, **H100)]))
    assert r.get_json()["FailedNodes"] == {"a": "2 of 8 GPUs free; pod requests 4"}


def test_cluster_mode_readyz_waits_for_first_list(cluster_client):
    client, cache = cluster_client
    assert client.get("/readyz").status_code == 503
    for event in cache._synced.values():
        event.set()
    assert client.get("/readyz").get_json()["ready"] is True


def test_group_zone_via_cache(cluster_client):
    client, cache = cluster_client
    cache.pod_event(
        "ADDED",
        make_pod("w0", 1, node="b", phase="Running", annotations={contract.ANN_GROUP: "job"}),
    )
    pod = make_pod("w1", 1, annotations={contract.ANN_GROUP: "job", contract.ANN_SPOT: "avoid"})
    r = client.post("/prioritize", json=names_body(pod, ["a", "b"]))
    scores = {h["Host"]: h["Score"] for h in r.get_json()}
    # zone (weight 4) outweighs binpack (weight 3): b (7 free, the group's zone) wins
    # over a (2 free, another zone)
    assert scores["b"] > scores["a"]


def test_chunked_body_without_content_length(extender_url):
    body = json.dumps(args_body(make_pod(gpus=1), [make_node("a", 8, **H100)])).encode()

    def chunks():
        for i in range(0, len(body), 100):
            yield body[i : i + 100]

    r = requests.post(
        extender_url + "/filter", data=chunks(), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200
    assert [n["metadata"]["name"] for n in r.json()["Nodes"]["items"]] == ["a"]
