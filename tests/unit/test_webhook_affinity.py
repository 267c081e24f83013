"""Hard GPU constraints written as required node affinity: the rules, the merge with
the user's own affinity, the caps, the platform maps, and the proof that
kube-scheduler's NodeAffinity over the mutated pod refuses exactly what the extender
refuses (tests/nodeaffinity.py follows upstream's component-helpers)."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
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
from webhook.affinity import MAX_TERMS
from webhook.config import ConfigError, WebhookConfig, config_from_mapping, load_config

CFG = WebhookConfig()
STRICT = WebhookConfig(unlabelled_nodes="refuse")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ZONE = "topology.kubernetes.io/zone"
GFD_KEYS = (contract.LABEL_GPU_PRODUCT, contract.LABEL_GPU_MEMORY, contract.LABEL_GPU_MEMORY_LEGACY)
#: The alternative for a node with none of GFD's GPU labels (a DRA node).
UNLABELLED = {"matchExpressions": [{"key": k, "operator": "DoesNotExist"} for k in GFD_KEYS]}


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
        },
        UNLABELLED,
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
        UNLABELLED,
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
    assert len(out) == 2 * 2 * 5  # own x (the product or no GPU label) x spot
    for term in out:
        zone = term["matchExpressions"][0]
        assert zone in (own[0]["matchExpressions"][0], own[1]["matchExpressions"][0])
        assert term["matchExpressions"][1]["key"] == "nvidia.com/gpu.product"
        if zone["values"] == ["b"]:
            assert term["matchFields"] == own[1]["matchFields"]
    strict = mutated(
        gpu_pod({contract.ANN_SPOT: "require", contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, own),
        STRICT,
    )
    assert len(terms(strict)) == 2 * 5


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


# --- nodes without GPU labels (DRA) ------------------------------------------------------
DRA_NODE = make_node("dra", 0, extra_labels={ZONE: "a"})  # GPUs in ResourceSlices only
BOTH = {
    contract.ANN_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3",
    contract.ANN_MIN_GPU_MEMORY: "40Gi",
}


def gfd_node(name: str, **labels: str) -> dict[str, Any]:
    return make_node(name, 8, extra_labels={ZONE: "a", **labels})


H100 = {contract.LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3", contract.LABEL_GPU_MEMORY: "81559"}
#: Labelled nodes each constraint refuses: any one GPU label makes a node labelled.
WRONG_PRODUCT = [
    gfd_node("l4", **{contract.LABEL_GPU_PRODUCT: "NVIDIA-L4", contract.LABEL_GPU_MEMORY: "81559"}),
    gfd_node("memory-only", **{contract.LABEL_GPU_MEMORY: "81559"}),
    gfd_node("legacy-only", **{contract.LABEL_GPU_MEMORY_LEGACY: "81559"}),
]
TOO_LITTLE_MEMORY = [
    gfd_node("small", **{**H100, contract.LABEL_GPU_MEMORY: "23034"}),
    gfd_node("small-legacy", **{contract.LABEL_GPU_MEMORY_LEGACY: "23034"}),
    gfd_node("product-only", **{contract.LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3"}),
]


@pytest.mark.parametrize(
    ("annotations", "refused"),
    [
        ({contract.ANN_GPU_PRODUCTS: "NVIDIA-H100-80GB-HBM3"}, WRONG_PRODUCT),
        ({contract.ANN_MIN_GPU_MEMORY: "40Gi"}, TOO_LITTLE_MEMORY),
        (BOTH, WRONG_PRODUCT + TOO_LITTLE_MEMORY),
        ({**BOTH, contract.ANN_SPOT: "forbid"}, WRONG_PRODUCT + TOO_LITTLE_MEMORY),
    ],
)
def test_a_node_without_gpu_labels_is_left_to_the_scheduler_a_labelled_one_must_match(
    annotations, refused
):
    pod = mutated(gpu_pod(annotations))
    assert any(  # one term says: none of the GPU labels
        [e for e in t["matchExpressions"] if e["key"] in GFD_KEYS] == UNLABELLED["matchExpressions"]
        for t in terms(pod)
    )
    assert required_node_affinity_matches(pod, DRA_NODE)
    assert required_node_affinity_matches(pod, gfd_node("h100", **H100))
    for node in refused:
        assert not required_node_affinity_matches(pod, node), node["metadata"]["name"]
    # The strict form: only labelled nodes.
    strict = mutated(gpu_pod(annotations), STRICT)
    assert not any(
        e["operator"] == "DoesNotExist" and e["key"] == contract.LABEL_GPU_PRODUCT
        for t in terms(strict)
        for e in t["matchExpressions"]
    )
    assert not required_node_affinity_matches(strict, DRA_NODE)
    assert required_node_affinity_matches(strict, gfd_node("h100", **H100))
    for node in refused:
        assert not required_node_affinity_matches(strict, node), node["metadata"]["name"]


def test_spot_labels_are_not_gpu_labels():
    forbid = terms(mutated(gpu_pod({contract.ANN_SPOT: "forbid"})))
    require = terms(mutated(gpu_pod({contract.ANN_SPOT: "require"})))
    assert len(forbid) == 1 and len(require) == 5
    for term in forbid + require:
        assert not any(e["operator"] == "DoesNotExist" for e in term["matchExpressions"])
    # An unlabelled node still answers to the spot constraints.
    pod = mutated(gpu_pod({**BOTH, contract.ANN_SPOT: "forbid"}))
    spot = make_node("dra-spot", 0, extra_labels={"karpenter.sh/capacity-type": "spot"})
    assert not required_node_affinity_matches(pod, spot)
    pod = mutated(gpu_pod({**BOTH, contract.ANN_SPOT: "require"}))
    assert required_node_affinity_matches(pod, spot)
    assert not required_node_affinity_matches(pod, DRA_NODE)


def test_products_and_memory_share_the_unlabelled_term():
    """The cross product would AND a labelled alternative of one with the unlabelled
    one of the other: such a term matches no node and is not written."""
    assert terms(mutated(gpu_pod(BOTH))) == [
        {
            "matchExpressions": [
                {
                    "key": contract.LABEL_GPU_PRODUCT,
                    "operator": "In",
                    "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED"],
                },
                {"key": contract.LABEL_GPU_MEMORY, "operator": "Gt", "values": ["40959"]},
            ]
        },
        {
            "matchExpressions": [
                {
                    "key": contract.LABEL_GPU_PRODUCT,
                    "operator": "In",
                    "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED"],
                },
                {"key": contract.LABEL_GPU_MEMORY, "operator": "DoesNotExist"},
                {"key": contract.LABEL_GPU_MEMORY_LEGACY, "operator": "Gt", "values": ["40959"]},
            ]
        },
        UNLABELLED,  # once, not its expressions twice
    ]
    assert len(terms(mutated(gpu_pod(BOTH), STRICT))) == 2


@pytest.mark.parametrize(
    ("annotations", "count", "strict"),
    [
        ({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, 2, 1),
        ({contract.ANN_MIN_GPU_MEMORY: "40Gi"}, 3, 2),
        (BOTH, 3, 2),
        ({**BOTH, contract.ANN_SPOT: "forbid"}, 3, 2),
        ({**BOTH, contract.ANN_SPOT: "require"}, 15, 10),
    ],
)
def test_term_counts_of_the_usual_cases(annotations, count, strict):
    assert len(terms(mutated(gpu_pod(annotations)))) == count
    assert len(terms(mutated(gpu_pod(annotations), STRICT))) == strict
    # With the pod's own terms: each gets them all, within the cap up to 64 // count.
    own = [
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [f"z{i}"]}]}
        for i in range(MAX_TERMS // count)
    ]
    assert len(terms(mutated(gpu_pod(annotations, own)))) == len(own) * count


def test_beyond_the_cap_the_message_counts_the_terms_written():
    annotations = {**BOTH, contract.ANN_SPOT: "require"}
    own = [
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": [f"z{i}"]}]}
        for i in range(5)
    ]  # 5 x 15 = 75 > 64
    decision = mutate.decide(gpu_pod(annotations, own), CFG)
    assert decision.outcome == mutate.REFUSED and decision.patch == []
    assert decision.detail == (
        "the pod's required node affinity would need more than 64 nodeSelectorTerms: its "
        "own 5 x 15 (gpu-products, min-gpu-memory, spot=require). Use fewer "
        "nodeSelectorTerms, or gpu-scheduler.io/spot: prefer instead of require"
    )  # whole: within the limit of a warning
    assert mutate.decide(gpu_pod(annotations, own), STRICT).outcome == mutate.MUTATED  # 50
    # No spot: require, no advice about it.
    many = own * 7  # 35 x 2 = 70
    decision = mutate.decide(gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, many), CFG)
    assert decision.outcome == mutate.REFUSED
    assert decision.detail.endswith("its own 35 x 2 (gpu-products). Use fewer nodeSelectorTerms")


@pytest.mark.parametrize(
    ("own", "count"),
    [
        # needs a GPU label: the unlabelled alternative can never match with it
        ({"key": contract.LABEL_GPU_PRODUCT, "operator": "Exists"}, 1),
        ({"key": contract.LABEL_GPU_MEMORY, "operator": "Gt", "values": ["1000"]}, 1),
        # says none: only the unlabelled alternative can
        ({"key": contract.LABEL_GPU_PRODUCT, "operator": "DoesNotExist"}, 1),
        # NotIn matches a node without the label: both can
        ({"key": contract.LABEL_GPU_PRODUCT, "operator": "NotIn", "values": ["x"]}, 2),
    ],
)
def test_a_users_term_gets_only_the_alternatives_it_can_match_with(own, count):
    pod = mutated(gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, [{"matchExpressions": [own]}]))
    assert len(terms(pod)) == count
    assert mutate.decide(pod, CFG).patch == []


def test_a_users_term_no_alternative_can_match_keeps_one_and_still_matches_nothing():
    absent = {"key": contract.LABEL_GPU_PRODUCT, "operator": "DoesNotExist"}
    own = [
        {"matchExpressions": [absent]},
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]},
    ]
    # Strict: the first term AND-ed with the product's one alternative (In: the label
    # present) matches no node; it stays, one term, matching nothing (never dropped:
    # a pod of that term alone must keep one).
    pod = mutated(gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, own), STRICT)
    first, second = terms(pod)
    assert first["matchExpressions"][0] == absent
    assert first["matchExpressions"][1]["operator"] == "In"
    assert second["matchExpressions"][1]["operator"] == "In"
    assert not required_node_affinity_matches(pod, DRA_NODE)
    assert mutate.decide(pod, STRICT).patch == []
    alone = mutated(gpu_pod({contract.ANN_GPU_PRODUCTS: "NVIDIA-L4"}, own[:1]), STRICT)
    assert len(terms(alone)) == 1


def test_mutating_a_pod_the_strict_form_was_written_on_changes_nothing():
    once = mutated(gpu_pod({**BOTH, contract.ANN_SPOT: "require"}), STRICT)
    assert mutate.decide(once, CFG).patch == []
    lenient = mutated(gpu_pod({**BOTH, contract.ANN_SPOT: "require"}))
    assert mutate.decide(lenient, CFG).patch == []
    # The other way round the strict form is written: the unlabelled terms then need
    # the product label too, and match no node.
    spot_dra = make_node("dra-spot", 0, extra_labels={"karpenter.sh/capacity-type": "spot"})
    assert required_node_affinity_matches(lenient, spot_dra)
    strict = mutated(lenient, STRICT)
    assert len(terms(strict)) == len(terms(lenient))
    assert not required_node_affinity_matches(strict, spot_dra)
    assert mutate.decide(strict, STRICT).patch == []


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
    # A node without gke-accelerator (a DRA node) is left to the scheduler.
    no_accelerator = {
        "matchExpressions": [
            {"key": "cloud.google.com/gke-accelerator", "operator": "DoesNotExist"}
        ]
    }
    for asked in ({contract.ANN_MIN_GPU_MEMORY: "80G"}, both):
        assert terms(mutated(gpu_pod(asked), gke))[1:] == [no_accelerator]
    strict = config_from_mapping({"nodeAffinity": {"platform": "gke", "unlabelledNodes": "refuse"}})
    assert len(terms(mutated(gpu_pod(both), strict))) == 1


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
    assert terms(pod) == [
        {
            "matchExpressions": [
                {
                    "key": "karpenter.k8s.aws/instance-gpu-name",
                    "operator": "In",
                    "values": ["a100"],
                },
                {
                    "key": "karpenter.k8s.aws/instance-gpu-memory",
                    "operator": "Gt",
                    "values": ["81919"],
                },
            ]
        },
        {
            "matchExpressions": [
                {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "DoesNotExist"},
                {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "DoesNotExist"},
            ]
        },
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
        ({"nodeAffinity": {"unlabelledNodes": True}}, "unlabelledNodes must be one of"),
        ({"nodeAffinity": {"unlabelledNodes": "deny"}}, "unlabelledNodes must be one of"),
    ],
)
def test_affinity_config_errors(data, reason):
    with pytest.raises(ConfigError, match=reason):
        config_from_mapping(data)


def test_deploys_config_and_the_charts_values_are_the_defaults():
    """deploy/ and the chart spell every key out, unlabelledNodes included."""
    root = Path(__file__).resolve().parents[2]
    deployed = load_config(str(root / "deploy/webhook/webhook-config.yaml"))
    values = yaml.safe_load((root / "charts/gpu-scheduler/values.yaml").read_text())
    charted = values["webhook"]["config"]
    for data in (
        yaml.safe_load((root / "deploy/webhook/webhook-config.yaml").read_text()),
        charted,
    ):
        assert data["nodeAffinity"]["unlabelledNodes"] == "allow"
    assert deployed == config_from_mapping(charted) == WebhookConfig()


def test_unlabelled_nodes_are_allowed_unless_the_config_refuses_them():
    assert config_from_mapping({}).allow_unlabelled
    assert config_from_mapping({"nodeAffinity": {"platform": "gke"}}).allow_unlabelled
    allow = config_from_mapping({"nodeAffinity": {"unlabelledNodes": "allow"}})
    assert allow.allow_unlabelled
    refuse = config_from_mapping({"nodeAffinity": {"unlabelledNodes": "refuse"}})
    assert not refuse.allow_unlabelled


# --- equivalence with the extender ---------------------------------------------------------
PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L4", "NVIDIA-A100-SXM4-40GB", "Tesla-T4"]
EXTENDER = build_policies(ExtenderConfig())
VIEW = View(used={}, groups={}, pressure={}, nodes={}, now=1.8e9, age=1.0)


@st.composite
def nodes(draw) -> dict[str, Any]:
    labels: dict[str, str] = {ZONE: draw(st.sampled_from(["a", "b", "c"]))}
    bare = draw(st.sampled_from([False, False, True]))  # no GPU label (a DRA node)
    product = draw(st.sampled_from([None, *PRODUCTS, "NVIDIA-L4-SHARED", "Tesla-T4-SHARED"]))
    if product and not bare:
        labels[contract.LABEL_GPU_PRODUCT] = product
    memory = draw(
        st.sampled_from(
            [None, "15360", "23034", "40960", "81559", "n-a", "0081920", "99999999999999999999"]
        )
    )
    if memory and not bare:
        labels[contract.LABEL_GPU_MEMORY] = memory
    legacy = draw(st.sampled_from([None, "40960", "81920", "x"]))
    if legacy and not bare:
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
            {"key": contract.LABEL_GPU_PRODUCT, "operator": "DoesNotExist"},
            {"key": contract.LABEL_GPU_MEMORY, "operator": "Gt", "values": ["20000"]},
            {"key": contract.LABEL_GPU_MEMORY_LEGACY, "operator": "DoesNotExist"},
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


def gpu_labelled(node: dict[str, Any]) -> bool:
    return any(key in node["metadata"]["labels"] for key in GFD_KEYS)


def without_gpu_constraints(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    for key in (contract.ANN_GPU_PRODUCTS, contract.ANN_MIN_GPU_MEMORY):
        out["metadata"]["annotations"].pop(key, None)
    return out


@settings(max_examples=400, deadline=None)
@given(pod=pods(), candidates=st.lists(nodes(), min_size=1, max_size=6))
def test_node_affinity_refuses_exactly_what_the_extender_refuses(pod, candidates):
    """Strict (``unlabelledNodes: refuse``): exactly the extender's GFD rule."""
    after = mutated(pod, STRICT)
    for node in candidates:
        expected = required_node_affinity_matches(pod, node) and extender_accepts(pod, node)
        assert required_node_affinity_matches(after, node) == expected, (
            node["metadata"]["labels"],
            pod["metadata"]["annotations"],
        )
    assert mutate.decide(after, STRICT).patch == []  # idempotent
    assert len(terms(after)) <= MAX_TERMS if "affinity" in after["spec"] else True


@settings(max_examples=400, deadline=None)
@given(pod=pods(), candidates=st.lists(nodes(), min_size=1, max_size=6))
def test_node_affinity_leaves_unlabelled_nodes_to_the_scheduler(pod, candidates):
    """The default: the same on a node with any GPU label; on a node with none, the
    pod's own affinity and what the extender says of the pod without its GPU
    constraints (spot, which the affinity still writes)."""
    after = mutated(pod)
    for node in candidates:
        judged = pod if gpu_labelled(node) else without_gpu_constraints(pod)
        expected = required_node_affinity_matches(pod, node) and extender_accepts(judged, node)
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
