"""Property tests over generated pods: the patch applies, does exactly what it should,
and a second pass finds nothing to do. The oracle below is written independently of
webhook.mutate (it follows Toleration.ToleratesTaint directly)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_scheduler.contract import ANN_SKIP_MUTATION, GPU_TOLERATION, RESOURCE_GPU
from webhook.config import WebhookConfig
from webhook.mutate import decide

CFG = WebhookConfig()
MISSING = object()

gpu_values = st.sampled_from(["0", "1", "2", "8", 1, 0])


@st.composite
def containers(draw: st.DrawFn, name: str) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "img"}
    shape = draw(st.sampled_from(["none", "empty", "requests", "limits", "both", "cpu"]))
    if shape == "none":
        return c
    resources: dict[str, Any] = {}
    gpu = draw(gpu_values)
    if shape in ("requests", "both"):
        resources["requests"] = {"cpu": "1", RESOURCE_GPU: gpu}
    if shape in ("limits", "both"):
        resources["limits"] = {RESOURCE_GPU: gpu}  # equal to the request, as required
    if shape == "cpu":
        resources["requests"] = {"cpu": "1"}
        if draw(st.booleans()):
            resources["limits"] = None
    c["resources"] = resources
    if name.startswith("init") and draw(st.booleans()):
        c["restartPolicy"] = "Always"  # a sidecar
    return c


@st.composite
def tolerations(draw: st.DrawFn) -> dict[str, Any]:
    key = draw(st.sampled_from([None, "", RESOURCE_GPU, "other.io/x"]))
    op = draw(st.sampled_from([None, "Exists", "Equal"]))
    if not key:
        op = "Exists"  # the API server requires it for an empty key
    t: dict[str, Any] = {}
    if key is not None:
        t["key"] = key
    if op is not None:
        t["operator"] = op
    if op != "Exists":
        t["value"] = draw(st.sampled_from(["", "present", "true"]))
    effect = draw(st.sampled_from([None, "", "NoSchedule", "NoExecute", "PreferNoSchedule"]))
    if effect is not None:
        t["effect"] = effect
    if effect == "NoExecute" and draw(st.booleans()):
        t["tolerationSeconds"] = draw(st.integers(0, 600))
    return t


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 3))
    spec: dict[str, Any] = {"containers": [draw(containers(f"c{i}")) for i in range(n)]}
    init = draw(st.sampled_from(["absent", "null", "list"]))
    if init == "null":
        spec["initContainers"] = None
    elif init == "list":
        k = draw(st.integers(0, 2))
        spec["initContainers"] = [draw(containers(f"init{i}")) for i in range(k)]
    tol = draw(st.sampled_from(["absent", "null", "list"]))
    if tol == "null":
        spec["tolerations"] = None
    elif tol == "list":
        spec["tolerations"] = draw(st.lists(tolerations(), max_size=4))
    sched = draw(st.sampled_from([MISSING, None, "", "default-scheduler", "gpu-scheduler", "x"]))
    if sched is not MISSING:
        spec["schedulerName"] = sched
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    ann = draw(st.sampled_from([MISSING, None, {}, {ANN_SKIP_MUTATION: "true"}, {"a": "b"}]))
    if ann is not MISSING:
        meta["annotations"] = ann
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# --- the oracle -------------------------------------------------------------------------


def requests_gpu(spec: dict[str, Any]) -> bool:
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(RESOURCE_GPU)
        if value is None:
            value = (res.get("limits") or {}).get(RESOURCE_GPU)
        if value is not None and int(value) > 0:
            return True
    return False


def tolerates(t: dict[str, Any], key: str, value: str, effect: str) -> bool:
    """Toleration.ToleratesTaint."""
    if t.get("effect") and t["effect"] != effect:
        return False
    if t.get("key") and t["key"] != key:
        return False
    op = t.get("operator") or "Equal"
    if op == "Exists":
        return True
    return op == "Equal" and (t.get("value") or "") == value


def tolerates_gpu_taint_whatever_value(tols: list[dict[str, Any]]) -> bool:
    values = ["", "present", "true", "a-value-no-one-wrote"]
    return all(any(tolerates(t, RESOURCE_GPU, v, "NoSchedule") for t in tols) for v in values)


@settings(max_examples=400, deadline=None)
@given(pods())
def test_patch_applies_and_does_exactly_what_it_should(pod: dict[str, Any]) -> None:
    original = copy.deepcopy(pod)
    d = decide(pod, CFG)
    assert pod == original, "decide must not modify its input"
    out = jsonpatch.apply_patch(pod, d.patch) if d.patch else copy.deepcopy(pod)

    spec, new = original["spec"], out["spec"]
    opted_out = (original["metadata"].get("annotations") or {}).get(ANN_SKIP_MUTATION) == "true"
    gpu = requests_gpu(spec) and not opted_out
    before = list(spec.get("tolerations") or [])

    if not gpu:
        assert d.patch == [] and d.warnings == []
        return
    # Only schedulerName and tolerations may change.
    rest = {k: v for k, v in new.items() if k not in ("schedulerName", "tolerations")}
    assert rest == {k: v for k, v in spec.items() if k not in ("schedulerName", "tolerations")}
    assert out["metadata"] == original["metadata"]

    if spec.get("schedulerName") in (None, "", "default-scheduler"):
        assert new["schedulerName"] == "gpu-scheduler"
    else:
        assert new["schedulerName"] == spec["schedulerName"]  # never overridden

    assert isinstance(new.get("tolerations"), list)
    assert tolerates_gpu_taint_whatever_value(new["tolerations"])
    added = new["tolerations"][len(before) :]
    assert new["tolerations"][: len(before)] == before  # existing ones untouched, in order
    if tolerates_gpu_taint_whatever_value(before):
        assert added == []
    else:
        assert added == [GPU_TOLERATION]
    # One warning per change made: the scheduler set, each toleration added.
    assert len(d.warnings) == (new["schedulerName"] != spec.get("schedulerName")) + len(added)

    # Idempotent: run on its own output, nothing to do.
    again = decide(out, CFG)
    assert again.patch == [] and again.outcome == "unchanged"


@settings(max_examples=200, deadline=None)
@given(pods(), st.booleans())
def test_extra_tolerations_property(pod: dict[str, Any], covered_extra: bool) -> None:
    extra = {"key": "example.com/pool", "operator": "Exists", "effect": "NoSchedule"}
    extras = (extra, dict(GPU_TOLERATION)) if covered_extra else (extra,)
    cfg = WebhookConfig(extra_tolerations=extras)
    d = decide(pod, cfg)
    out = jsonpatch.apply_patch(pod, d.patch) if d.patch else pod
    if d.outcome in ("mutated", "unchanged"):
        tols = out["spec"]["tolerations"]
        assert any(tolerates(t, "example.com/pool", "", "NoSchedule") for t in tols)
        assert tols.count(GPU_TOLERATION) <= 1 + (pod["spec"].get("tolerations") or []).count(
            GPU_TOLERATION
        )
    assert decide(out, cfg).patch == []
