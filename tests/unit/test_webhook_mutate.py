"""The mutation decision and the AdmissionReview wrapper, as pure functions."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest

from gpu_scheduler.contract import ANN_SKIP_MUTATION, GPU_TOLERATION, RESOURCE_GPU
from gpu_scheduler.fields import FieldError
from gpu_scheduler.http import BadInput
from tests.factories import admission_review
from webhook import mutate
from webhook.admission import parse_review, review
from webhook.config import ConfigError, WebhookConfig, config_from_mapping, load_config
from webhook.mutate import covers, decide

CFG = WebhookConfig()


def pod(
    gpus: int | str | None = 1,
    *,
    where: str = "limits",
    init: bool = False,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m"}}
    if gpus is not None:
        resources.setdefault(where, {})[RESOURCE_GPU] = gpus
    gpu_container = {"name": "gpu", "image": "cuda", "resources": resources}
    plain = {"name": "app", "image": "busybox"}
    body: dict[str, Any] = {"containers": [plain]}
    if init:
        body["initContainers"] = [gpu_container]
    else:
        body["containers"].append(gpu_container)
    body.update(spec)
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def patched(p: dict[str, Any], cfg: WebhookConfig = CFG) -> dict[str, Any]:
    d = decide(p, cfg)
    return jsonpatch.apply_patch(p, d.patch) if d.patch else copy.deepcopy(p)


# --- decide ----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["requests", "limits"])
@pytest.mark.parametrize("init", [False, True])
def test_gpu_pod_gets_scheduler_and_toleration(where: str, init: bool) -> None:
    p = pod(2, where=where, init=init)
    d = decide(p, CFG)
    assert d.outcome == mutate.MUTATED and d.gpus == 2
    assert d.changes == ("schedulerName", "tolerations")
    assert d.patch == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpu-scheduler"},
        {"op": "add", "path": "/spec/tolerations", "value": [GPU_TOLERATION]},
    ]
    assert len(d.warnings) == 2 and all(w.startswith("gpu-scheduler: ") for w in d.warnings)
    out = patched(p)
    assert out["spec"]["schedulerName"] == "gpu-scheduler"
    assert out["spec"]["tolerations"] == [GPU_TOLERATION]
    assert decide(out, CFG).patch == []  # idempotent


@pytest.mark.parametrize("current", ["", "default-scheduler", None])
def test_empty_or_default_scheduler_is_replaced(current: str | None) -> None:
    p = pod(schedulerName=current)
    d = decide(p, CFG)
    assert d.patch[0] == {"op": "replace", "path": "/spec/schedulerName", "value": "gpu-scheduler"}
    assert patched(p)["spec"]["schedulerName"] == "gpu-scheduler"


def test_other_scheduler_is_kept_but_toleration_still_added() -> None:
    p = pod(schedulerName="volcano")
    d = decide(p, CFG)
    assert d.changes == ("tolerations",) and d.scheduler == "volcano"
    assert [op["path"] for op in d.patch] == ["/spec/tolerations"]
    assert patched(p)["spec"]["schedulerName"] == "volcano"


def test_pod_with_node_name_is_left_alone() -> None:
    """Its node is chosen: no scheduler, no toleration (the kubelet checks only
    NoExecute taints), no node affinity. The matchConditions never send it either."""
    p = pod(nodeName="gpu-node-1", annotations={"gpu-scheduler.io/spot": "forbid"})
    d = decide(p, CFG)
    assert d.outcome == mutate.NODE_DECIDED and d.patch == [] and d.warnings == []
    assert d.changes == () and d.scheduler == "default-scheduler" and d.gpus == 1
    assert "spec.nodeName is gpu-node-1" in d.detail
    assert decide(pod(nodeName="n", schedulerName="volcano"), CFG).scheduler == "volcano"


# --- a CPU-only member of a GPU gang ------------------------------------------------------

GANG = {"schedulingGroup": {"podGroupName": "train"}}


def test_cpu_member_of_a_gpu_gang_gets_the_scheduler_only() -> None:
    """A launcher that joins a PodGroup and names a placement group goes where its GPU
    workers go (kube-scheduler refuses a group split between schedulers), and is given
    nothing a GPU pod is: no GPU toleration, no node affinity."""
    p = pod(None, annotations={"gpu-scheduler.io/group": "train"}, **GANG)
    d = decide(p, CFG)
    assert d.outcome == mutate.GANG_MEMBER and d.gpus == 0 and d.detail == "train"
    assert d.patch == [{"op": "add", "path": "/spec/schedulerName", "value": "gpu-scheduler"}]
    assert d.changes == ("schedulerName",) and d.scheduler == "gpu-scheduler"
    assert "PodGroup train" in d.warnings[0]
    out = patched(p)
    assert "tolerations" not in out["spec"] and "affinity" not in out["spec"]
    assert decide(out, CFG).patch == []  # idempotent


@pytest.mark.parametrize(
    "annotations, spec",
    [
        ({"gpu-scheduler.io/group": "train"}, {}),  # a placement group, no PodGroup
        ({}, GANG),  # a gang, not ours
        ({"gpu-scheduler.io/group": ""}, GANG),
        ({"gpu-scheduler.io/group": "train"}, {**GANG, "schedulerName": "volcano"}),
        ({"gpu-scheduler.io/group": "train"}, {**GANG, "nodeName": "n1"}),
        ({"gpu-scheduler.io/group": "t", ANN_SKIP_MUTATION: "true"}, GANG),
    ],
)
def test_other_cpu_pods_are_left_alone(annotations: dict[str, str], spec: dict) -> None:
    d = decide(pod(None, annotations=annotations, **spec), CFG)
    assert d.patch == [] and d.outcome in (mutate.NO_GPU, mutate.GANG_MEMBER, mutate.OPTED_OUT)


def test_gpu_member_of_a_gang_is_a_gpu_pod() -> None:
    d = decide(pod(8, annotations={"gpu-scheduler.io/group": "train"}, **GANG), CFG)
    assert d.outcome == mutate.MUTATED and d.changes == ("schedulerName", "tolerations")


@pytest.mark.parametrize("group", [7, ["train"], {"podGroupName": 7}])
def test_scheduling_group_of_the_wrong_type_is_refused(group: Any) -> None:
    p = pod(None, annotations={"gpu-scheduler.io/group": "t"}, schedulingGroup=group)
    with pytest.raises(FieldError):
        decide(p, CFG)


DS_OWNER = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "validator", "uid": "u"}


@pytest.mark.parametrize(
    ("owner", "rerouted"),
    [
        ({**DS_OWNER, "controller": True}, False),
        ({**DS_OWNER, "controller": False}, True),  # not its controller
        (DS_OWNER, True),  # no controller field: not its controller
        ({**DS_OWNER, "controller": True, "kind": "ReplicaSet"}, True),
        ({**DS_OWNER, "controller": True, "apiVersion": "example.com/v1"}, True),
    ],
)
def test_daemonset_pod_is_left_alone(owner: dict[str, Any], rerouted: bool) -> None:
    """A pod its DaemonSet controls is not mutated at all: the DaemonSet controller
    chose its node from the template's tolerations, and pins it there by affinity."""
    p = pod()
    p["metadata"]["ownerReferences"] = [owner]
    d = decide(p, CFG)
    out = patched(p)
    assert (d.outcome == mutate.NODE_DECIDED) is not rerouted
    assert (out == p) is not rerouted
    assert (out["spec"].get("schedulerName") == "gpu-scheduler") is rerouted
    assert (out["spec"].get("tolerations") == [GPU_TOLERATION]) is rerouted


@pytest.mark.parametrize(
    ("meta", "spec", "field"),
    [
        ({"ownerReferences": {}}, {}, "metadata.ownerReferences"),
        ({"ownerReferences": ["x"]}, {}, "metadata.ownerReferences[0]"),
        ({"ownerReferences": [{"kind": 1}]}, {}, "metadata.ownerReferences[0].kind"),
        ({"ownerReferences": [{"controller": "y"}]}, {}, "ownerReferences[0].controller"),
        ({}, {"nodeName": 7}, "spec.nodeName"),
    ],
)
def test_decided_pod_fields_of_the_wrong_type(meta: dict, spec: dict, field: str) -> None:
    p = pod(**spec)
    p["metadata"].update(meta)
    with pytest.raises(FieldError) as err:
        decide(p, CFG)
    assert field in str(err.value)


def test_configured_scheduler_name() -> None:
    cfg = WebhookConfig(scheduler_name="gpu-binpack")
    assert patched(pod(), cfg)["spec"]["schedulerName"] == "gpu-binpack"
    # Already on the configured profile: only the toleration is added.
    assert decide(pod(schedulerName="gpu-binpack"), cfg).changes == ("tolerations",)


def test_tolerations_null_is_replaced_with_a_list() -> None:
    p = pod(tolerations=None)
    d = decide(p, CFG)
    assert {"op": "replace", "path": "/spec/tolerations", "value": [GPU_TOLERATION]} in d.patch
    assert patched(p)["spec"]["tolerations"] == [GPU_TOLERATION]


def test_existing_list_is_appended_to() -> None:
    other = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    p = pod(tolerations=[other])
    d = decide(p, CFG)
    assert {"op": "add", "path": "/spec/tolerations/-", "value": GPU_TOLERATION} in d.patch
    assert patched(p)["spec"]["tolerations"] == [other, GPU_TOLERATION]
    assert patched(pod(tolerations=[]))["spec"]["tolerations"] == [GPU_TOLERATION]


@pytest.mark.parametrize(
    "existing",
    [
        {"operator": "Exists"},  # key-less Exists: every taint
        {"key": "", "operator": "Exists", "effect": "NoSchedule"},
        {"key": RESOURCE_GPU, "operator": "Exists"},  # every effect
        {"key": RESOURCE_GPU, "operator": "Exists", "effect": "NoSchedule"},
    ],
)
def test_covering_toleration_means_no_toleration_added(existing: dict[str, Any]) -> None:
    d = decide(pod(tolerations=[existing]), CFG)
    assert d.changes == ("schedulerName",)


@pytest.mark.parametrize(
    "existing",
    [
        # Equal tolerates one value only; the GPU taint's value is unknown.
        {"key": RESOURCE_GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        {"key": RESOURCE_GPU, "value": "", "effect": "NoSchedule"},  # operator "" = Equal
        {"key": RESOURCE_GPU, "operator": "Exists", "effect": "NoExecute"},
        {"key": RESOURCE_GPU, "operator": "Exists", "effect": "PreferNoSchedule"},
        {"operator": "Exists", "effect": "NoExecute"},
        {"key": "nvidia.com/mig", "operator": "Exists"},
    ],
)
def test_non_covering_toleration_means_ours_is_appended(existing: dict[str, Any]) -> None:
    d = decide(pod(tolerations=[existing]), CFG)
    assert {"op": "add", "path": "/spec/tolerations/-", "value": GPU_TOLERATION} in d.patch


def test_covers_with_toleration_seconds() -> None:
    wanted = {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
    assert covers({"key": "k", "operator": "Exists", "effect": "NoExecute"}, wanted)
    longer = {**wanted, "tolerationSeconds": 300}
    assert covers(longer, wanted) and not covers(wanted, longer)
    forever = {"key": "k", "operator": "Exists", "effect": "NoExecute"}
    assert not covers(wanted, forever)


def test_covers_equal_matches_same_value_only() -> None:
    a = {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}
    assert covers(a, a)
    assert not covers(a, {**a, "value": "w"})
    assert not covers(a, {"key": "k", "operator": "Exists", "effect": "NoSchedule"})


def test_extra_tolerations_added_once_and_idempotent() -> None:
    extra = {"key": "example.com/pool", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    covered = {"key": RESOURCE_GPU, "operator": "Exists", "effect": "NoSchedule"}
    cfg = WebhookConfig(extra_tolerations=(extra, covered))  # the second adds nothing
    out = patched(pod(tolerations=None), cfg)
    assert out["spec"]["tolerations"] == [GPU_TOLERATION, extra]
    assert decide(out, cfg).patch == []


@pytest.mark.parametrize("gpus", [None, "0", 0])
def test_no_gpu_pod_is_left_alone(gpus: Any) -> None:
    d = decide(pod(gpus), CFG)
    assert d.outcome == mutate.NO_GPU and d.patch == [] and d.warnings == []


def test_opt_out_annotation() -> None:
    d = decide(pod(annotations={ANN_SKIP_MUTATION: "true"}), CFG)
    assert d.outcome == mutate.OPTED_OUT and d.patch == [] and d.warnings == []
    # Only the exact value "true" opts out (as the webhook's matchCondition checks).
    assert decide(pod(annotations={ANN_SKIP_MUTATION: "false"}), CFG).outcome == "mutated"
    assert decide(pod(annotations={ANN_SKIP_MUTATION: "yes"}), CFG).outcome == "mutated"


@pytest.mark.parametrize("bad", [pod("one"), pod("500m"), pod("-1"), pod("1e999999")])
def test_unusable_gpu_quantity_is_allowed_with_warning(bad: Any) -> None:
    """Values the API server will validate after admission: its message speaks."""
    d = decide(bad, CFG)
    assert d.outcome == mutate.UNINTERPRETABLE and d.patch == []
    assert len(d.warnings) == 1 and d.warnings[0].startswith("gpu-scheduler: pod left unchanged")
    assert len(d.warnings[0]) <= mutate.MAX_WARNING


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (pod(schedulerName=7), "spec.schedulerName: must be a string"),
        (pod(tolerations={"key": "x"}), "spec.tolerations: must be an array"),
        (pod(tolerations=["x"]), "spec.tolerations[0]: must be an object"),
        (pod(tolerations=[{"key": RESOURCE_GPU, "operator": 3}]), "spec.tolerations[0].operator"),
        (pod(tolerations=[{"tolerationSeconds": "5"}]), "tolerationSeconds: must be an integer"),
        ({"metadata": [], "spec": {}}, "metadata: must be an object"),
        ({"metadata": {"annotations": "x"}, "spec": {}}, "metadata.annotations"),
        ({"metadata": {}, "spec": "nope"}, "spec: must be an object"),
        ({"metadata": {}, "spec": {"containers": {"a": 1}}}, "spec.containers: must be an array"),
        ({"metadata": {}, "spec": {"containers": [{"resources": ["x"]}]}}, "resources"),
        (pod(True), "not a boolean"),
        ("a string", "object: must be an object"),
    ],
)
def test_wrong_json_types_raise_naming_the_field(bad: Any, field: str) -> None:
    """No API server sends these (it decoded the Pod first): the webhook answers 400."""
    with pytest.raises(FieldError) as caught:
        decide(bad, CFG)
    assert field in str(caught.value)


def test_wrong_types_are_a_400_through_the_review() -> None:
    with pytest.raises(BadInput, match=r"AdmissionReview.request.object.spec.schedulerName"):
        review(review_body(pod(schedulerName=7)), CFG)
    with pytest.raises(BadInput, match="must be the Pod being created"):
        review(review_body(None), CFG)


# --- AdmissionReview -----------------------------------------------------------------


review_body = admission_review


def test_review_response_shape() -> None:
    body, req, decision = review(review_body(pod()), CFG)
    assert set(body) == {"apiVersion", "kind", "response"}
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    resp = body["response"]
    assert resp["uid"] == req.uid and resp["allowed"] is True
    assert resp["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(resp["patch"])) == decision.patch
    assert resp["warnings"] == decision.warnings
    assert req.pod_key == "ns/p"


def test_dry_run_behaves_the_same() -> None:
    wet, _, _ = review(review_body(pod()), CFG)
    dry, req, _ = review(review_body(pod(), dryRun=True), CFG)
    assert req.dry_run and dry == wet


@pytest.mark.parametrize(
    "change",
    [
        {"operation": "UPDATE"},
        {"operation": "DELETE", "object": None},
        {"kind": {"group": "", "version": "v1", "kind": "Service"}},
        {"kind": {"group": "example.com", "version": "v1", "kind": "Pod"}},
        {"subResource": "binding"},
    ],
)
def test_other_operations_and_kinds_pass_without_patch(change: dict[str, Any]) -> None:
    body, _, decision = review(review_body(pod(), **change), CFG)
    assert decision.outcome == mutate.IGNORED
    assert body["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_uninterpretable_review_is_allowed_with_warning() -> None:
    body, _, _ = review(review_body(pod("lots")), CFG)
    resp = body["response"]
    assert resp["allowed"] is True and "patch" not in resp and "patchType" not in resp
    assert "nvidia.com/gpu" in resp["warnings"][0]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "AdmissionReview JSON object"),
        ({"kind": "AdmissionReview", "request": {"uid": "x"}}, "apiVersion"),
        (
            {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"},
            "apiVersion",
        ),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}, "kind must be"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request"),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}},
            "uid",
        ),
        (
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": 5},
            },
            "uid",
        ),
    ],
)
def test_bad_reviews_raise_bad_input(body: Any, reason: str) -> None:
    with pytest.raises(BadInput, match=reason):
        parse_review(body)


def test_pod_key_uses_generate_name() -> None:
    obj = {"metadata": {"generateName": "train-"}, "spec": {}}
    _, req, _ = review(review_body(obj), CFG)
    assert req.pod_key == "ns/train-*"


# --- config --------------------------------------------------------------------------


def test_config_from_yaml(tmp_path) -> None:
    path = tmp_path / "webhook.yaml"
    path.write_text(
        "schedulerName: gpu-binpack\n"
        "extraTolerations:\n"
        "  - {key: example.com/pool, operator: Exists, effect: NoSchedule}\n"
        "maxBodyBytes: 1048576\n"
    )
    cfg = load_config(str(path))
    assert cfg.scheduler_name == "gpu-binpack" and cfg.max_body_bytes == 1 << 20
    assert cfg.tolerations[1] == {
        "key": "example.com/pool",
        "operator": "Exists",
        "effect": "NoSchedule",
    }
    assert load_config(None) == WebhookConfig()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"schedulerName": "default-scheduler"}, "must not be"),
        ({"schedulerName": "Not_A_Name"}, "DNS subdomain"),
        ({"schedulerName": 3}, "DNS subdomain"),
        ({"unknown": 1}, "unknown config keys"),
        ({"maxBodyBytes": 10}, "maxBodyBytes"),
        ({"extraTolerations": {"key": "x"}}, "must be a list"),
        ({"extraTolerations": [{"operator": "Equal"}]}, "empty key needs operator Exists"),
        ({"extraTolerations": [{"key": "a", "operator": "In"}]}, "operator"),
        ({"extraTolerations": [{"key": "a", "operator": "Exists", "value": "v"}]}, "no value"),
        ({"extraTolerations": [{"key": "a", "effect": "Sometimes"}]}, "effect"),
        ({"extraTolerations": [{"key": "a", "tolerationSeconds": 5}]}, "NoExecute"),
        ({"extraTolerations": [{"key": "bad key!"}]}, "qualified name"),
        ({"extraTolerations": [{"key": "a", "colour": "red"}]}, "unknown fields"),
        ({"extraTolerations": ["x"]}, "mapping"),
    ],
)
def test_config_errors(data: dict[str, Any], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        config_from_mapping(data)


def test_a_toleration_value_must_be_a_label_value_of_at_most_63_characters() -> None:
    from webhook.config import toleration_problem

    ok = {"key": "example.com/pool", "operator": "Equal", "value": "a" * 63, "effect": "NoSchedule"}
    assert toleration_problem(ok) is None
    assert "not a valid label value" in (toleration_problem(ok | {"value": "a" * 64}) or "")
    assert "not a valid label value" in (toleration_problem(ok | {"value": "-x"}) or "")
