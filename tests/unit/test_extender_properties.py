"""Properties over generated clusters and pods, through the app's wire format."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.app import create_app
from extender.cache import ClusterCache
from extender.config import ExtenderConfig
from extender.model import pod_facts
from extender.records import pod_record
from gpu_scheduler import contract
from tests.factories import make_lease, make_node, make_pod
from tests.fakeapi import synced_cache

PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L4", None]
MEMORY = {"NVIDIA-H100-80GB-HBM3": 81559, "NVIDIA-A100-SXM4-40GB": 40960, "NVIDIA-L4": 23034}


@st.composite
def nodes(draw):
    count = draw(st.integers(0, 25))
    out = []
    for i in range(count):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        product = draw(st.sampled_from(PRODUCTS)) if gpus else None
        node = make_node(
            f"n{i}",
            gpus,
            product=product,
            memory_mib=MEMORY.get(product) if draw(st.booleans()) else None,
            capacity_type=draw(st.sampled_from([None, "SPOT", "ON_DEMAND"])),
            zone=draw(st.sampled_from([None, "a", "b"])),
        )
        gib = draw(st.sampled_from([None, 16, 40, 80])) if gpus else None
        if gib:  # a node that shares its GPUs (gpu-memory units: GiB)
            node["metadata"]["labels"][contract.LABEL_GPU_SHARING] = "mps"
            node["status"]["allocatable"][contract.RESOURCE_GPU_MEMORY] = str(gpus * gib)
        if gpus and (gib or draw(st.booleans())):  # the agent's per-GPU report, some sick
            sick = draw(st.lists(st.booleans(), min_size=gpus, max_size=gpus))
            node["metadata"]["annotations"][contract.ANN_GPUS] = json.dumps(
                [
                    {"uuid": f"GPU-{i}-{g}", "healthy": not bad, "xid": 79}
                    | ({contract.GPU_MEMORY_MIB: gib * 1024} if gib else {})
                    for g, bad in enumerate(sick)
                ]
            )
        out.append(node)
    return out


@st.composite
def leases(draw, node_names):
    """The agents' heartbeat Leases: none (not agent-managed), fresh, stale, or not
    renewed yet, per node; and one for a node that does not exist."""
    renewed = st.sampled_from(["none", None, "2027-01-15T07:59:00.000000Z", "2020-01-01T00:00:00Z"])
    out = []
    for name in [*node_names, "gone"]:
        when = draw(renewed)
        if when != "none":
            out.append(make_lease(name, when))
    return out


annotation_values = {
    contract.ANN_MIN_GPU_MEMORY: st.sampled_from(["20Gi", "40960", "80Gi", "bad"]),
    contract.ANN_GPU_PRODUCTS: st.sampled_from(["NVIDIA-L4", "NVIDIA-L4,NVIDIA-H100-80GB-HBM3"]),
    contract.ANN_PLACEMENT: st.sampled_from(["binpack", "spread", "zigzag"]),
    contract.ANN_SPOT: st.sampled_from(["prefer", "avoid", "require", "forbid"]),
    contract.ANN_GROUP: st.sampled_from(["g1", "g2"]),
}


@st.composite
def pods(draw):
    chosen = draw(st.lists(st.sampled_from(sorted(annotation_values)), unique=True, max_size=5))
    annotations = {key: draw(annotation_values[key]) for key in chosen}
    gpus = draw(st.sampled_from([0, 1, 2, 3, 8, 16]))
    shares = draw(st.lists(st.sampled_from(SHARES), max_size=2)) if gpus < 2 else []
    pod = make_pod("p", gpus, annotations=annotations, use_limits=draw(st.booleans()))
    return with_shares(pod, shares)


#: gpu-memory units a container may ask (GiB; nodes' GPUs have 16, 40 or 80)
SHARES = [1, 10, 20, 40, 80, 100]


def with_shares(pod, units):
    """``pod`` with a container per unit count asking that share of one GPU."""
    for i, amount in enumerate(units):
        pod["spec"]["containers"].append(
            {
                "name": f"share-{i}",
                "image": "busybox",
                "resources": {"limits": {contract.RESOURCE_GPU_MEMORY: str(amount)}},
            }
        )
    return pod


@st.composite
def running_pods(draw, node_names):
    if not node_names:
        return []
    out = []
    for i in range(draw(st.integers(0, 15))):
        ann = (
            {contract.ANN_GROUP: draw(st.sampled_from(["g1", "g2"]))} if draw(st.booleans()) else {}
        )
        pod = make_pod(
            f"r{i}",
            draw(st.integers(0, 4)),
            node=draw(st.sampled_from(node_names)),
            phase=draw(st.sampled_from(["Pending", "Running", "Succeeded"])),
            annotations=ann,
        )
        out.append(with_shares(pod, draw(st.lists(st.sampled_from(SHARES[:4]), max_size=2))))
    return out


def check_filter(body, names, unknown=0):
    if body["Error"]:
        # Only when nothing it knows fits and some candidates are unknown: a retry.
        assert unknown and "not in the extender's cache yet" in body["Error"]
        return
    passed = body["NodeNames"]
    failed, unresolvable = body["FailedNodes"], body["FailedAndUnresolvableNodes"]
    assert body["Error"] == ""
    # nothing invented, everything accounted for exactly once
    assert set(passed) | set(failed) | set(unresolvable) == set(names)
    assert len(passed) + len(failed) + len(unresolvable) == len(names)
    assert all(
        isinstance(reason, str) and reason for reason in [*failed.values(), *unresolvable.values()]
    )


def check_scores(body, names):
    assert [h["Host"] for h in body] == names
    assert all(type(h["Score"]) is int and 0 <= h["Score"] <= 10 for h in body)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data(), nodes=nodes(), pod=pods(), unknown=st.integers(0, 3))
def test_cluster_mode_accounts_for_every_node(data, nodes, pod, unknown):
    names = [n["metadata"]["name"] for n in nodes]
    cache = synced_cache(nodes, data.draw(running_pods(names)), clock=lambda: 1_800_000_000.0)
    cache.replace_leases(data.draw(leases(names)))
    client = create_app(ExtenderConfig(filter_chooses=False), cache=cache).test_client()
    picks = create_app(cache=cache).test_client()
    asked = names + [f"ghost{i}" for i in range(unknown)]
    body = {"Pod": pod, "Nodes": None, "NodeNames": asked}
    try:
        every = client.post("/filter", json=body).get_json()
        check_filter(every, asked, unknown)
        check_scores(client.post("/prioritize", json=body).get_json(), asked)
        check_pick(picks.post("/filter", json=body).get_json(), every, client, pod)
    finally:
        cache.stop()


def check_pick(picked, every, client, pod):
    """A filter that picks answers the same refusals, and of the nodes that fit only
    one that prioritize ranks first (these nodes carry no soft taints)."""
    assert picked["Error"] == every["Error"]
    if every["Error"]:
        return
    assert picked["FailedNodes"] == every["FailedNodes"]
    assert picked["FailedAndUnresolvableNodes"] == every["FailedAndUnresolvableNodes"]
    fit = every["NodeNames"]
    if len(fit) < 2 or pod_facts(pod).preference is not None:
        assert picked["NodeNames"] == fit
        return
    (chosen,) = picked["NodeNames"]
    scores = {
        h["Host"]: h["Score"]
        for h in client.post(
            "/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": fit}
        ).get_json()
    }
    assert scores[chosen] == max(scores.values())


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
            st.integers(0, 5),  # pod
            st.sampled_from(["n0", "n1", "n2"]),
            st.integers(0, 3),  # gpus
            st.sampled_from(["Pending", "Running", "Succeeded"]),
            st.sampled_from([None, "g"]),
            st.sampled_from([None, "T4", "T4,G2"]),
            # before the pod event, the node: unchanged, resized/relabelled, or gone
            st.sampled_from([None, (8, "32"), (4, "16"), (8, "64"), "gone"]),
        ),
        max_size=40,
    )
)
def test_watch_events_keep_the_same_totals_as_a_fresh_list(events):
    nodes = {n: make_node(n, 8, zone=n) for n in ("n0", "n1", "n2")}
    cache = ClusterCache()
    cache.replace_nodes(nodes.values())
    live = {}
    for kind, i, node, gpus, phase, group, products, change in events:
        if change == "gone":
            if nodes.pop(node, None) is not None:
                cache.node_event("DELETED", make_node(node))
        elif change is not None:
            kind_of_change = "MODIFIED" if node in nodes else "ADDED"
            nodes[node] = make_node(node, change[0], zone=node, cpu=change[1])
            cache.node_event(kind_of_change, nodes[node])
        annotations = {contract.ANN_GROUP: group} if group else {}
        if products:
            annotations[contract.ANN_GPU_PRODUCTS] = products
        pod = make_pod(f"p{i}", gpus, node=node, phase=phase, annotations=annotations)
        cache.pod_event(kind, pod)
        if kind == "DELETED":
            live.pop(i, None)
        else:
            live[i] = pod
    fresh = ClusterCache()
    fresh.replace_nodes(nodes.values())
    fresh.replace_pods(live.values())
    seen, truth = cache.view(), fresh.view()
    for node in ("n0", "n1", "n2"):
        assert seen.used_gpus(node) == truth.used_gpus(node)
    # What the fragmentation policy reads per node, kept by events, equals a relist's.
    assert dict(seen.free) == dict(truth.free) and truth.free.keys() == nodes.keys()
    assert seen.group_zones("default", "g") == truth.group_zones("default", "g")
    assert cache._used == fresh._used and cache._groups == fresh._groups
    assert cache._demand_total == fresh._demand_total
    assert cache._demand.keys() == fresh._demand.keys()
    for product, share in fresh._demand.items():
        assert abs(cache._demand[product] - share) < 1e-6


def test_concurrent_readers_never_see_a_torn_state():
    """A writer applies events that keep the totals fixed (pods updated in place, nodes
    relabelled); readers check every view they take: all nodes present, the GPUs in
    use exactly the total, every group member on a known node. Readers of the live
    state saw both tears (a node removed and re-added; a pod's GPUs subtracted, then
    added)."""
    import threading

    nodes = [make_node(f"n{i}", 8, zone="z") for i in range(20)]
    pods = [
        make_pod(
            f"p{i}", 2, node=f"n{i % 20}", phase="Running", annotations={contract.ANN_GROUP: "g"}
        )
        for i in range(40)
    ]
    cache = ClusterCache()
    cache.replace_nodes(nodes)
    cache.replace_pods(pods)
    total = sum(cache.view().used.values())
    stop = threading.Event()
    torn: list[str] = []

    def write() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            node = nodes[i % 20]
            node["metadata"]["labels"]["touched"] = str(i)
            cache.node_event("MODIFIED", node)
            cache.pod_event("MODIFIED", pods[i % 40])

    def read() -> None:
        while not stop.is_set():
            view = cache.view()
            if len(view.nodes) != 20:
                torn.append(f"{len(view.nodes)} nodes")
            if sum(view.used.values()) != total:
                torn.append(f"{sum(view.used.values())} GPUs in use, not {total}")
            if sum(view.group_zones("default", "g").values()) != 40:
                torn.append("a group member on an unknown node")

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    threading.Event().wait(1.0)
    stop.set()
    for thread in threads:
        thread.join()
    assert not torn, torn[:5]


def test_pod_record_skips_unbound_finished_and_uninteresting_pods():
    assert pod_record(make_pod(gpus=1)) is None
    assert pod_record(make_pod(gpus=1, node="n", phase="Failed")) is None
    assert pod_record(make_pod(gpus=0, node="n", phase="Running")) is None
    _uid, record = pod_record(make_pod(gpus=2, node="n", phase="Running"))
    assert (record.node, record.gpus, record.group) == ("n", 2, None)


@SETTINGS
@given(data=st.data(), nodes=nodes(), pod=pods())
def test_each_filter_rule_refuses_as_the_node_by_node_reference_does(data, nodes, pod):
    """A policy's one rule (``refuse``, over the candidates' rows) refuses exactly the
    nodes the plain node-by-node reference (tests/reference_rules.py, over NodeFacts)
    refuses, each with the reference's words and resolvability."""
    from extender.config import ExtenderConfig
    from extender.model import node_facts, pod_facts
    from extender.policies import build_policies
    from tests import reference_rules

    names = [n["metadata"]["name"] for n in nodes]
    cache = ClusterCache(clock=lambda: 1_800_000_000.0)
    cache.replace_nodes(nodes)
    cache.replace_pods(data.draw(running_pods(names)))
    cache.replace_leases(data.draw(leases(names)))
    view = cache.view()
    batch = view.candidates([node_facts(n).name for n in nodes])
    facts = [batch.facts(j) for j in range(batch.known)]
    pod_state = pod_facts(pod)
    for policy in build_policies(ExtenderConfig()):
        state = policy.pre_filter(pod_state, view)
        if state is None:
            continue
        codes = policy.refuse(state, batch, view)
        assert codes is not None and len(codes) == batch.known, policy.name
        for j, node in enumerate(facts):
            if policy.name == "heartbeat":
                want = reference_rules.heartbeat(state, node, view, policy.window)
            else:
                want = getattr(reference_rules, policy.name)(state, node, view)
            code = int(codes[j])
            got = None if code == 0 else (
                policy.word(state, code, node, view), code in policy.unresolvable
            )  # fmt: skip
            assert got == want, (policy.name, node.name)
