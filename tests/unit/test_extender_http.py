"""The extender over HTTP: a real gunicorn process (its cache listed from a fake API,
tests/fake_extender.py) and the Flask app with a filled cluster cache, speaking JSON
in the exact upstream shape."""

from __future__ import annotations

import http.client
import json

import pytest
import requests

from extender.app import create_app
from extender.cache import ClusterCache
from gpu_scheduler import contract
from tests.factories import make_node, make_pod
from tests.fakeapi import synced_cache
from tests.fuzz.servers import extender_fake_cluster
from tests.helpers import wait_for

H100 = dict(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)


def names_body(pod, names):
    # json.Marshal(ExtenderArgs) with nodeCacheCapable true: Nodes is null.
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


@pytest.fixture(scope="module")
def extender_url(tmp_path_factory):
    nodes = [
        make_node("h", 8, **H100),
        make_node("cpu"),
        make_node("small", 1, **H100),
        make_node("a", 8, **H100),
        make_node("b", 2, **H100),
    ]
    work = tmp_path_factory.mktemp("extender")
    with extender_fake_cluster(work, nodes=nodes) as (url, _pid, _log):
        yield url


def test_filter_answers_node_names(extender_url):
    r = requests.post(
        extender_url + "/filter", json=names_body(make_pod(gpus=2), ["h", "cpu", "small"])
    )
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json"
    body = r.json()
    assert set(body) == {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert body["Error"] == ""
    assert body["NodeNames"] == ["h"]
    assert set(body["FailedAndUnresolvableNodes"]) == {"cpu", "small"}
    assert body["FailedNodes"] == {}


def test_prioritize_returns_host_priority_list(extender_url):
    r = requests.post(extender_url + "/prioritize", json=names_body(make_pod(gpus=2), ["a", "b"]))
    assert r.status_code == 200
    body = r.json()
    assert [h["Host"] for h in body] == ["a", "b"]
    assert all(set(h) == {"Host", "Score"} and type(h["Score"]) is int for h in body)
    assert all(0 <= h["Score"] <= 10 for h in body)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"not json", "not JSON"),
        (b"", "empty request body"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"NodeNames": []}', "ExtenderArgs.Pod must be an object, not null"),
        (b'{"Pod": "x", "NodeNames": []}', "ExtenderArgs.Pod must be an object, not a string"),
        (b'{"Pod": {"metadata": {}, "spec": {}}}', "ExtenderArgs carries no NodeNames"),
        (
            b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": {"a": 1}}',
            "ExtenderArgs.NodeNames must be an array, not an object",
        ),
        (
            b'{"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": []}, "NodeNames": null}',
            "set nodeCacheCapable: true",
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
    ok = requests.post(f"{extender_url}/{verb}", json=names_body(make_pod(), []))
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
    r = requests.post(extender_url + "/filter", json=names_body(pod, ["a", "b"]))
    assert r.status_code == 200, r.text
    body = r.json()
    if field is None:  # both fit; the filter answers the one it ranks first
        assert body["FailedNodes"] == body["FailedAndUnresolvableNodes"] == {}
        assert len(body["NodeNames"]) == 1 and set(body["NodeNames"]) <= {"a", "b"}
        return
    assert body["NodeNames"] == [] and body["FailedNodes"] == {}
    assert set(body["FailedAndUnresolvableNodes"]) == {"a", "b"}
    assert all(field in reason for reason in body["FailedAndUnresolvableNodes"].values())
    r = requests.post(extender_url + "/prioritize", json=names_body(pod, ["a", "b"]))
    assert r.status_code == 200 and [h["Score"] for h in r.json()] == [0, 0]


def test_huge_values_come_back_truncated(extender_url):
    huge = "x" * (4 << 20)
    r = requests.post(extender_url + "/filter", json={"Pod": {}, "NodeNames": [huge]})
    assert r.status_code == 400
    assert len(r.content) < 8192 and "must be a node name" in r.json()["error"]
    pod = make_pod(gpus=1, annotations={contract.ANN_PLACEMENT: huge})
    r = requests.post(extender_url + "/filter", json=names_body(pod, ["a"]))
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
    requests.post(extender_url + "/filter", json=names_body(make_pod(), ["a"]))
    text = requests.get(extender_url + "/metrics").text
    assert 'gpu_scheduler_extender_requests_total{code="200",verb="filter"}' in text
    assert "gpu_scheduler_extender_request_seconds_bucket" in text
    assert requests.get(extender_url + "/nope").status_code == 404
    assert requests.get(extender_url + "/filter").status_code == 405


# --- cluster mode: the app with a cache filled as list+watch would -----------------
@pytest.fixture
def cluster_client():
    cache = synced_cache(
        [
            make_node("a", 8, zone="z1", **H100),
            make_node("b", 8, zone="z2", **H100),
            make_node("c", 4, zone="z1", **H100),
            make_node("cpu", zone="z1"),
        ],
        [
            make_pod("r1", 6, node="a", phase="Running"),
            make_pod("r2", 3, node="c", phase="Running"),
            make_pod("done", 8, node="b", phase="Succeeded"),
        ],
        clock=lambda: 1_800_000_000.0,
    )
    app = create_app(cache=cache)
    yield app.test_client(), cache
    cache.stop()


def test_cluster_mode_answers_with_node_names_and_counts_running_pods(cluster_client):
    client, _ = cluster_client
    r = client.post("/filter", json=names_body(make_pod(gpus=2), ["a", "b", "c", "cpu", "new"]))
    body = r.get_json()
    assert set(body) == {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    # a and b fit; the filter picks (extender/choice.py) the one binpack ranks first
    assert body["NodeNames"] == ["a"]
    assert body["FailedNodes"] == {"c": "1 of 4 GPUs free; pod requests 2"}
    assert body["FailedAndUnresolvableNodes"] == {
        "cpu": "node has no GPUs (no allocatable nvidia.com/gpu)",
        "new": "node is not in the extender's node cache yet (just added?)",
    }
    r = client.post("/prioritize", json=names_body(make_pod(gpus=2), ["a", "b"]))
    scores = {h["Host"]: h["Score"] for h in r.get_json()}
    assert scores["a"] > scores["b"]  # binpack: a has 2 free, b has 8


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
def test_node_objects_are_a_400_that_names_node_cache_capable(cluster_client, verb):
    """kube-scheduler with ``nodeCacheCapable: false`` sends whole Node objects (and a
    preemption's victims as Pod objects): the extender decides from its own cache, by
    name, and says what to set."""
    client, _ = cluster_client
    pod = make_pod(gpus=4)
    if verb == "preempt":
        victim = make_pod("r1", 6, node="a", phase="Running")
        body = {"Pod": pod, "NodeNameToVictims": {"a": {"Pods": [victim]}}}
    else:
        nodes = {"metadata": {}, "items": [make_node("a", 8, **H100)]}
        body = {"Pod": pod, "Nodes": nodes, "NodeNames": None}
    r = client.post(f"/{verb}", json=body)
    assert r.status_code == 400, r.get_data(as_text=True)
    error = r.get_json()["error"]
    assert "nodeCacheCapable: false" in error
    assert "set nodeCacheCapable: true in the extender's entry" in error
    assert "KubeSchedulerConfiguration" in error


def test_cluster_mode_before_the_first_list_answers_an_error_and_is_not_ready():
    from tests.fakeapi import FakeCore

    core = FakeCore([make_node("a", 8, **H100)])
    core.list_node.hold.set()  # the first list of nodes does not come back yet
    cache = ClusterCache()
    cache.start(core)
    client = create_app(cache=cache).test_client()
    try:
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "first list of nodes" in ready.get_json()["detail"]
        body = client.post("/filter", json=names_body(make_pod(gpus=1), ["a"])).get_json()
        # Error, not "every node unknown": kube-scheduler retries within seconds instead
        # of parking the pod as unschedulable.
        assert "has not synced yet" in body["Error"]
        r = client.post("/prioritize", json=names_body(make_pod(gpus=1), ["a"]))
        assert r.status_code == 503
        core.list_node.hold.clear()
        wait_for(lambda: client.get("/readyz").status_code == 200, 5, "readyz")
        body = client.post("/filter", json=names_body(make_pod(gpus=1), ["a"])).get_json()
        assert body["Error"] == "" and body["NodeNames"] == ["a"]
    finally:
        cache.stop()


def test_group_zone_via_cache(cluster_client):
    client, cache = cluster_client
    cache.pod_event(
        "ADDED",
        make_pod("w0", 1, node="b", phase="Running", annotations={contract.ANN_GROUP: "job"}),
    )
    pod = make_pod("w1", 1, annotations={contract.ANN_GROUP: "job", contract.ANN_SPOT: "avoid"})
    r = client.post("/prioritize", json=names_body(pod, ["a", "b"]))
    scores = {h["Host"]: h["Score"] for h in r.get_json()}
    # zone (weight 15) outweighs binpack (5) and fragmentation (8) together: b (7 free,
    # the group's zone) wins over a (2 free, another zone), which both of those prefer
    # (a's last 2 GPUs are stranded for the 3- and 6-GPU pods of the mix)
    assert scores["b"] > scores["a"]


def test_chunked_body_without_content_length(extender_url):
    body = json.dumps(names_body(make_pod(gpus=1), ["a"])).encode()

    def chunks():
        for i in range(0, len(body), 100):
            yield body[i : i + 100]

    r = requests.post(
        extender_url + "/filter", data=chunks(), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200
    assert r.json()["NodeNames"] == ["a"]


@pytest.mark.parametrize(
    ("names", "needle"),
    [
        (["a", 1], "ExtenderArgs.NodeNames[1] must be a node name"),
        (["a", ["b"]], "ExtenderArgs.NodeNames[1] must be a node name"),
        (["a", {"b": 1}], "ExtenderArgs.NodeNames[1] must be a node name"),
        (["a", ""], "ExtenderArgs.NodeNames[1] must be a node name"),
        (["a", "x" * 254], "ExtenderArgs.NodeNames[1] must be a node name"),
        (["a", True, "b"], "ExtenderArgs.NodeNames[1] must be a node name"),
        (["a", "b", "a"], "ExtenderArgs.NodeNames[2] repeats the node name 'a'"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_cluster_mode_checks_the_names_its_cache_does_not_know(cluster_client, verb, names, needle):
    """Cluster mode looks names up before checking them (a known one is a node name):
    whatever it does not find is still checked, and a bad one is still a 400."""
    client, _ = cluster_client
    r = client.post(f"/{verb}", json=names_body(make_pod(gpus=1), names))
    assert r.status_code == 400, r.get_data()
    assert needle in r.get_json()["error"]
    assert (
        client.post(f"/{verb}", json=names_body(make_pod(gpus=1), ["a", "x" * 253])).status_code
        == 200
    )


def test_two_equal_pods_nested_past_the_recursion_limit_are_answered(cluster_client):
    client, _ = cluster_client
    pod = make_pod("p", 1)
    nested = json.dumps(pod)[:-1] + ', "extra": ' + '{"a":' * 1020 + "1" + "}" * 1020 + "}"
    body = '{"Pod": ' + nested + ', "Nodes": null, "NodeNames": ["a"]}'
    for verb in ("filter", "prioritize", "prioritize"):
        r = client.post(f"/{verb}", data=body, content_type="application/json")
        assert r.status_code == 200, r.get_data(as_text=True)[:300]
