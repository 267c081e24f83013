"""Hard GPU constraints written as required node affinity: the rules, the merge with
the user's own affinity, the caps, the platform maps, and the proof that
kube-scheduler's NodeAffinity over the mutated pod refuses exactly what the extender
refuses (tests/nodeaffinity.py follows upstream's component-helpers)."""

from __future__ import annotations

import copy
import time
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.config import ExtenderConfig
from extender.engine import filter_nodes
from extender.model import node_facts, pod_facts
from extender.policies import build_policies
from extender.view import View
from gpu_scheduler import contract
from tests.factories import make_node, make_pod
from tests.nodeaffinity import required_node_affinity_matches
from webhook import mutate
from webhook.config import ConfigError, WebhookConfig, config_from_mapping

CFG = WebhookConfig()
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ZONE = "topology.kubernetes.io/zone"


def mutated(pod: dict[str, Any], cfg: WebhookConfig = CFG) -> dict[str, Any]:
    decision = mutate.decide(pod, cfg)
    assert decision.outcome != mutate.REFUSED, decision.detail
    return jsonpatch.apply_patch(pod, decision.patch) if decision.patch else copy.deepcopy(pod)


def terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]


def gpu_pod(annotations: dict[str, str], node_affinity: list | None = None) -> dict[str, Any]:
    pod = make_pod(annotations=annotations)
    if node_affinity is not None:
        pod["spec"]["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": node_affinity}}}
    return pod


# --- the rules ------------------------------------------------------------------------
def test_products_become_in_with_their_shared_names():
    pod = mutated(gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4, NVIDIA-A10G-SHARED"}))
    assert terms(pod) == [
        {
            "matchExpressions": [
                {
                    "key": "nvidia.com/gpu.product",
                    "operator": "In",
                    "values": [
                        "NVIDIA-A10G",
                        "NVIDIA-A10G-SHARED",
                        "NVIDIA-L4",
                        "NVIDIA-L4-SHARED",
                    ],
                }
            ]
        }
    ]


def test_min_memory_is_gt_mib_minus_one_with_the_legacy_label_where_it_is_absent():
    pod = mutated(gpu_pod({contract.ANN_MIN_GPU_MEMORY: "80G"}))  # 76293 MiB
    assert terms(pod) == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["76292"]}
            ]
        },
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.memory", "operator": "DoesNotExist"},
                {"key": "gpu.nvidia.com/memory", "operator": "Gt", "values": ["76292"]},
            ]
        },
    ]


def test_spot_forbid_is_not_in_on_every_clouds_label():
    pod = mutated(gpu_pod({contract.ANN_SPOT: "forbid"}))
    assert terms(pod) == [
        {
            "matchExpressions": [
                {"key": "eks.amazonaws.com/capacityType", "operator": "NotIn", "values": ["SPOT"]},
                {"key": "karpenter.sh/capacity-type", "operator": "NotIn", "values": ["spot"]},
                {"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]},
                {
                    "key": "cloud.google.com/gke-preemptible",
                    "operator": "NotIn",
                    "values": ["true"],
                },
                {
                    "key": "kubernetes.azure.com/scalesetpriority",
                    "operator": "NotIn",
                    "values": ["spot"],
                },
            ]
        }
    ]


def test_spot_require_is_one_term_per_clouds_label():
    pod = mutated(gpu_pod({contract.ANN_SPOT: "require"}))
    assert [t["matchExpressions"] for t in terms(pod)] == [
        [{"key": "eks.amazonaws.com/capacityType", "operator": "In", "values": ["SPOT"]}],
        [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}],
        [{"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]}],
        [{"key": "cloud.google.com/gke-preemptible", "operator": "In", "values": ["true"]}],
        [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "In", "values": ["spot"]}],
    ]


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {contract.ANN_PLACEMENT: "spread"},
        {contract.ANN_SPOT: "prefer"},
        {contract.ANN_SPOT: "avoid"},
        {contract.ANN_GROUP: "job-1"},
    ],
)
def test_nothing_asked_nothing_added_and_soft_wishes_stay_scores(annotations):
    decision = mutate.decide(gpu_pod(annotations), CFG)
    assert "nodeAffinity" not in decision.changes
    assert not any("/affinity" in op["path"] for op in decision.patch)


def test_malformed_annotations_are_left_to_the_extender_with_a_warning():
    decision = mutate.decide(gpu_pod({contract.ANN_MIN_GPU_MEMORY: "lots"}), CFG)
    assert "nodeAffinity" not in decision.changes
    assert any("no node affinity written" in w for w in decision.warnings)


# --- the merge ----------------------------------------------------------------------------
def test_users_terms_are_kept_and_each_gets_every_constraint():
    own = [
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]},
        {
            "matchExpressions": [{"key": ZONE, "operator": "In", "values": ["b"]}],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
        },
    ]
    pod = mutated(
        gpu_pod({contract.ANN_SPOT: "require", contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, own)
    )
    out = terms(pod)
    assert len(out) == 2 * 5
    for term in out:
        zone = term["matchExpressions"][0]
        assert zone in (own[0]["matchExpressions"][0], own[1]["matchExpressions"][0])
        assert term["matchExpressions"][1]["key"] == "nvidia.com/gpu.product"
        if zone["values"] == ["b"]:
            assert term["matchFields"] == own[1]["matchFields"]


def test_mutating_the_mutated_pod_changes_nothing():
    pod = gpu_pod(
        {
            contract.ANN_SPOT: "require",
            contract.ANN_MIN_GPU_MEMORY: "40Gi",
            contract.ANN_GPU_PRODUCTS: "NVIDIA-L4",
        },
        [{"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["c"]}]}],
    )
    once = mutated(pod)
    assert mutate.decide(once, CFG).patch == []


def test_an_empty_user_term_keeps_matching_nothing():
    own = [{}, {"matchExpressions": [{"key": ZONE, "operator": "Exists"}]}]
    out = terms(mutated(gpu_pod({contract.ANN_SPOT: "forbid"}, own)))
    assert out[0] == {} and len(out) == 2


def test_a_user_expression_already_saying_it_is_not_repeated():
    mine = {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": ["NVIDIA-L4", "NVIDIA-L4-SHARED"],
    }
    pod = gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, [{"matchExpressions": [mine]}])
    assert "nodeAffinity" not in mutate.decide(pod, CFG).changes


@pytest.mark.parametrize(
    ("spec_affinity", "kept"),
    [
        (None, {}),
        ({"affinity": None}, {}),
        ({"affinity": {"podAntiAffinity": {"x": 1}}}, {"podAntiAffinity": {"x": 1}}),
        ({"affinity": {"nodeAffinity": None}}, {}),
        (
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
            {},
        ),
    ],
)
def test_the_patch_applies_whatever_is_there(spec_affinity, kept):
    pod = gpu_pod({contract.ANN_SPOT: "forbid"})
    pod["spec"].update(spec_affinity or {})
    out = mutated(pod)
    assert len(terms(out)) == 1
    for key, value in kept.items():
        assert out["spec"]["affinity"][key] == value


def test_beyond_the_cap_the_pod_is_refused_and_never_half_written():
    own = [
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [f"z{i}"]}]}
        for i in range(13)
    ]  # 13 x 5 = 65 > 64
    decision = mutate.decide(gpu_pod({contract.ANN_SPOT: "require"}, own), CFG)
    assert decision.outcome == mutate.REFUSED and decision.patch == []
    assert "more than 64 nodeSelectorTerms" in decision.detail
    assert "spot: prefer instead of require" in decision.detail
    from webhook.admission import review_response

    response = review_response("u", decision)["response"]
    assert response["allowed"] is False and response["status"]["code"] == 422
    # 12 x 5 = 60 fits
    assert mutate.decide(gpu_pod({contract.ANN_SPOT: "require"}, own[:12]), CFG).outcome == (
        mutate.MUTATED
    )


def test_huge_user_affinity_costs_bounded_work():
    exprs = [{"key": ZONE, "operator": "In", "values": [f"v{j}" for j in range(200)]}]
    own = [{"matchExpressions": exprs} for _ in range(5000)]
    pod = gpu_pod({contract.ANN_SPOT: "forbid"}, own)
    started = time.process_time()
    decision = mutate.decide(pod, CFG)
    assert time.process_time() - started < 0.5
    assert decision.outcome == mutate.REFUSED


def test_wrong_types_in_the_users_affinity_are_field_errors():
    from gpu_scheduler.fields import FieldError

    pod = gpu_pod({contract.ANN_SPOT: "forbid"}, [{"matchExpressions": [{"key": 5}]}])
    with pytest.raises(FieldError, match=r"nodeSelectorTerms\[0\].matchExpressions\[0\].key"):
        mutate.decide(pod, CFG)


def test_decided_pods_and_the_off_switch_get_no_affinity():
    pinned = gpu_pod({contract.ANN_SPOT: "forbid"})
    pinned["spec"]["nodeName"] = "n1"
    assert "nodeAffinity" not in mutate.decide(pinned, CFG).changes
    off = WebhookConfig(node_affinity=False)
    assert "nodeAffinity" not in mutate.decide(gpu_pod({contract.ANN_SPOT: "forbid"}), off).changes


# --- platform maps ------------------------------------------------------------------------
def test_gke_products_and_memory_become_accelerator_values():
    gke = config_from_mapping({"nodeAffinity": {"platform": "gke"}})
    pod = mutated(gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3"}), gke)
    assert terms(pod)[0]["matchExpressions"] == [
        {
            "key": "cloud.google.com/gke-accelerator",
            "operator": "In",
            "values": ["nvidia-h100-80gb", "nvidia-h100-mega-80gb"],
        }
    ]
    # No memory label on GKE: the accelerators with at least 80 (decimal) GB.
    pod = mutated(gpu_pod({contract.ANN_MIN_GPU_MEMORY: "80G"}), gke)
    assert terms(pod)[0]["matchExpressions"][0]["values"] == [
        "nvidia-a100-80gb",
        "nvidia-b200",
        "nvidia-gb200",
        "nvidia-h100-80gb",
        "nvidia-h100-mega-80gb",
        "nvidia-h200-141gb",
        "nvidia-rtx-pro-6000",
    ]
    both = {contract.ANN_MIN_GPU_MEMORY: "80G", contract.ANN_GPU_PRODUCTS: "NVIDIA-L4,NVIDIA-B200"}
    assert terms(mutated(gpu_pod(both), gke))[0]["matchExpressions"][0]["values"] == ["nvidia-b200"]


def test_a_product_the_platform_map_lacks_is_left_to_the_extender():
    gke = config_from_mapping({"nodeAffinity": {"platform": "gke"}})
    decision = mutate.decide(gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4,NVIDIA-X9"}), gke)
    assert "nodeAffinity" not in decision.changes
    assert any("NVIDIA-X9" in w and "productValues" in w for w in decision.warnings)
    extended = config_from_mapping(
        {"nodeAffinity": {"platform": "gke", "productValues": {"NVIDIA-X9": ["nvidia-x9"]}}}
    )
    pod = mutated(gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4,NVIDIA-X9"}), extended)
    assert terms(pod)[0]["matchExpressions"][0]["values"] == ["nvidia-l4", "nvidia-x9"]


def test_karpenter_names_and_memory():
    aws = config_from_mapping({"nodeAffinity": {"platform": "karpenter-aws"}})
    pod = mutated(
        gpu_pod(
            {
                contract.ANN_GPU_PRODUCTS: "NVIDIA-A100-SXM4-80GB",
                contract.ANN_MIN_GPU_MEMORY: "80Gi",
            }
        ),
        aws,
    )
    assert terms(pod)[0]["matchExpressions"] == [
        {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["a100"]},
        {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gt", "values": ["81919"]},
    ]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"nodeAffinity": {"platform": "azure"}}, "platform must be one of"),
        ({"nodeAffinity": {"enabled": "yes"}}, "enabled must be true or false"),
        (
            {"nodeAffinity": {"platform": "gke", "productValues": {"X": ["Bad Value"]}}},
            "label values",
        ),
        ({"nodeAffinity": {"productValues": {"X": ["x"]}}}, "gke and karpenter-aws maps only"),
        ({"nodeAffinity": {"platform": "gke", "productValues": {"X": "x"}}}, "to lists"),
        ({"nodeAffinity": {"labels": {}}}, "unknown config keys"),
    ],
)
def test_affinity_config_errors(data, reason):
    with pytest.raises(ConfigError, match=reason):
        config_from_mapping(data)


# --- equivalence with the extender ---------------------------------------------------------
PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L4", "NVIDIA-A100-SXM4-40GB", "Tesla-T4"]
EXTENDER = build_policies(ExtenderConfig())
VIEW = View(used={}, groups={}, pressure={}, nodes={}, now=1.8e9, age=1.0)


@st.composite
def nodes(draw) -> dict[str, Any]:
    labels: dict[str, str] = {ZONE: draw(st.sampled_from(["a", "b", "c"]))}
    product = draw(st.sampled_from([None, *PRODUCTS, "NVIDIA-L4-SHARED", "Tesla-T4-SHARED"]))
    if product:
        labels[contract.LABEL_GPU_PRODUCT] = product
    memory = draw(
        st.sampled_from(
            [None, "15360", "23034", "40960", "81559", "n-a", "0081920", "99999999999999999999"]
        )
    )
    if memory:
        labels[contract.LABEL_GPU_MEMORY] = memory
    legacy = draw(st.sampled_from([None, "40960", "81920", "x"]))
    if legacy:
        labels[contract.LABEL_GPU_MEMORY_LEGACY] = legacy
    for key, spot in contract.SPOT_LABELS:
        value = draw(st.sampled_from([None, spot, "on-demand", spot.swapcase()]))
        if value:
            labels[key] = value
    name = f"n{draw(st.integers(0, 5))}"
    return make_node(name, 8, extra_labels=labels)


@st.composite
def pods(draw) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    chosen = draw(st.lists(st.sampled_from([*PRODUCTS, "NVIDIA-B200"]), max_size=3))
    if chosen:
        annotations[contract.ANN_GPU_PRODUCTS] = ",".join(chosen)
    memory = draw(st.sampled_from([None, "16Gi", "40Gi", "80G", "23034", "0"]))
    if memory:
        annotations[contract.ANN_MIN_GPU_MEMORY] = memory
    spot = draw(st.sampled_from([None, "prefer", "avoid", "require", "forbid"]))
    if spot:
        annotations[contract.ANN_SPOT] = spot
    expression = st.sampled_from(
        [
            {"key": ZONE, "operator": "In", "values": ["a", "b"]},
            {"key": ZONE, "operator": "NotIn", "values": ["c"]},
            {"key": contract.LABEL_GPU_PRODUCT, "operator": "Exists"},
            {"key": contract.LABEL_GPU_MEMORY, "operator": "Gt", "values": ["20000"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
        ]
    )
    term = st.fixed_dictionaries({"matchExpressions": st.lists(expression, max_size=3)})
    own = draw(st.one_of(st.none(), st.lists(term, min_size=1, max_size=3)))
    return gpu_pod(annotations, own)


def extender_accepts(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    facts = node_facts(node)
    out = filter_nodes(pod_facts(pod), [facts.name], [facts], VIEW, EXTENDER)
    return out.passed == [facts.name]


@settings(max_examples=400, deadline=None)
@given(pod=pods(), candidates=st.lists(nodes(), min_size=1, max_size=6))
def test_node_affinity_refuses_exactly_what_the_extender_refuses(pod, candidates):
    after = mutated(pod)
    for node in candidates:
        expected = required_node_affinity_matches(pod, node) and extender_accepts(pod, node)
        assert required_node_affinity_matches(after, node) == expected, (
            node["metadata"]["labels"],
            pod["metadata"]["annotations"],
        )
    assert mutate.decide(after, CFG).patch == []  # idempotent


def test_shared_gpus_memory_is_the_documented_exception():
    """The extender counts a time-sliced GPU's memory per replica; node affinity cannot
    divide, so it checks the whole GPU's (README): looser there, never stricter."""
    node = make_node(
        "shared",
        8,
        extra_labels={
            contract.LABEL_GPU_MEMORY: "81559",
            contract.LABEL_GPU_REPLICAS: "4",
            contract.LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3-SHARED",
        },
    )
    pod = gpu_pod({contract.ANN_MIN_GPU_MEMORY: "40Gi"})
    assert required_node_affinity_matches(mutated(pod), node)
    assert not extender_accepts(pod, node)
