"""The mutation decision, as a pure function: pod (JSON) + config -> JSON patch + warnings.

Rules, for a pod that requests ``nvidia.com/gpu`` (counted by the shared contract):

* A pod whose node is already decided is left alone: one with ``spec.nodeName``, or
  one a DaemonSet controls (the DaemonSet controller pins it to its node by node
  affinity, having checked the node's taints against its template; the GPU
  Operator's validator is one). The configuration's matchConditions never send such
  a pod (the same rule in CEL), so an outage of the webhook cannot hold up the pods
  that bring a GPU node up; this is the handler's half of that rule. Neither needs
  the GPU toleration: the kubelet checks only NoExecute taints of a pod with
  ``spec.nodeName``, and a DaemonSet's pods tolerate what its template tolerates.
* ``spec.schedulerName`` is set to the configured profile when it is absent, empty or
  ``default-scheduler``. Another explicitly chosen scheduler is never overridden.
* Each required toleration (the GPU one, then the configured extras) is added unless
  a toleration already on the pod *covers* it: tolerates every taint it tolerates.
  This is done for every GPU pod, also when another scheduler was kept, as
  Kubernetes' ExtendedResourceToleration admission plugin does.

A pod that requests no GPU is left alone, with one exception: a member of a GPU gang.
Kubernetes' gang scheduling (1.37, ``GenericWorkload``) rejects a PodGroup whose pods
name different schedulers, so a CPU-only launcher (MPI, a coordinator) must go where its
GPU workers go. A pod that joins a PodGroup (``spec.schedulingGroup.podGroupName``) and
carries ``gpu-scheduler.io/group`` (which only such pods reach the webhook with: the
configuration's matchConditions) gets the same ``spec.schedulerName`` rule as a GPU pod,
and nothing else: no GPU toleration, no node affinity, as it uses no GPU. A launcher
without the annotation keeps its scheduler, and kube-scheduler refuses its group with
its own message (docs/GANGS.md).

Coverage follows ``Toleration.ToleratesTaint``. For the GPU toleration
``{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}`` that means: an
``Exists`` toleration whose key is empty (matches every key) or ``nvidia.com/gpu``,
with effect empty (every effect) or ``NoSchedule``. An ``Equal`` toleration for
``nvidia.com/gpu`` does *not* cover it: it only tolerates a taint with that exact
value, and the webhook cannot know the value a cluster's GPU taint carries
(``present``, ``true``, empty...), so the ``Exists`` one is still added. A pod with
both tolerates the taint whatever its value.

The patch always applies to the object it was computed from: ``/spec/tolerations``
is added (absent) or replaced (``null``) with a list, and ``/spec/tolerations/-`` is
used only when the list exists. Run on its own output the function returns no patch.
A GPU quantity it cannot use (``"lots"``, ``"0.5"``) gives no patch and a warning,
never a refusal: the API server's validation, which runs after admission, refuses
such a pod with its own message. A field of the wrong JSON type raises
:class:`FieldError` (an HTTP 400): no API server sends one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_scheduler import taints
from gpu_scheduler.constraints import hard_constraints
from gpu_scheduler.contract import (
    ANN_GROUP,
    ANN_SKIP_MUTATION,
    DEFAULT_SCHEDULER,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
)
from gpu_scheduler.fields import (
    FieldError,
    expect_object,
    is_integer,
    list_at,
    object_at,
    string_at,
)
from gpu_scheduler.podspec import pod_gpu_request, pod_group_name
from gpu_scheduler.sharing import (
    NO_SHARES,
    ShareError,
    ShareRequest,
    order_refusal,
    pod_shares,
    reserved_env,
)
from gpu_scheduler.textclip import clip_text
from webhook import affinity
from webhook.config import WebhookConfig

#: Outcomes, as logged and counted.
MUTATED = "mutated"
UNCHANGED = "unchanged"  # a GPU pod that already had all it needs
NO_GPU = "no-gpu"
GANG_MEMBER = "gang-member"  # a CPU-only pod of a GPU gang, routed to the profile
OPTED_OUT = "opted-out"
NODE_DECIDED = "node-decided"  # spec.nodeName, or a DaemonSet's pod: left alone
UNINTERPRETABLE = "uninterpretable"
IGNORED = "ignored"  # not a Pod CREATE
#: its node affinity cannot be written within the cap, or a GPU share it asks for
#: cannot be met or would set what only the node may
REFUSED = "refused"
OUTCOMES = (
    MUTATED,
    UNCHANGED,
    NO_GPU,
    GANG_MEMBER,
    OPTED_OUT,
    NODE_DECIDED,
    UNINTERPRETABLE,
    IGNORED,
    REFUSED,
)
CHANGES = ("schedulerName", "tolerations", "nodeAffinity")

WARNING_PREFIX = "gpu-scheduler: "
MAX_WARNING = 256  # the API server may truncate longer warnings


@dataclass(frozen=True)
class Decision:
    outcome: str
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    gpus: int = 0
    shares: int = 0  # units of gpu-memory asked, all containers together
    changes: tuple[str, ...] = ()  # "schedulerName", "tolerations"
    scheduler: str | None = None  # the pod's scheduler after the patch
    detail: str = ""


def decide(pod: Any, cfg: WebhookConfig) -> Decision:
    """The patch and warnings for a pod being created (``pod`` is its JSON form).

    Raises :class:`FieldError` for a field of the wrong type: the API server decodes a
    Pod into its Go type before admission, so only another client can send one. A
    value of the right type that the API server will still validate (a fractional or
    malformed GPU quantity) gives no patch and a warning: its own validation speaks.
    """
    pod = expect_object(pod, "object")
    metadata = object_at(pod, "metadata", "metadata")
    annotations = object_at(metadata, "annotations", "metadata.annotations")
    if annotations.get(ANN_SKIP_MUTATION) == "true":
        return Decision(OPTED_OUT, detail=f"{ANN_SKIP_MUTATION}=true")
    spec = object_at(pod, "spec", "spec")
    try:
        gpus = pod_gpu_request(spec)
    except FieldError as exc:
        if exc.wrong_type:
            raise
        return _uninterpretable(f"cannot read its {RESOURCE_GPU} request: {exc}")
    shares, refusal = _shares(spec)
    current = string_at(spec, "schedulerName", "spec.schedulerName")
    decided = node_decided(metadata, spec)
    raw_tolerations = spec.get("tolerations")
    tolerations = list_at(spec, "tolerations", "spec.tolerations")
    have = [_checked_toleration(t, f"spec.tolerations[{i}]") for i, t in enumerate(tolerations)]
    if gpus <= 0 and not shares and refusal is None:
        return _gang_member(annotations, spec, current, decided, cfg)
    if decided:
        scheduler = current or DEFAULT_SCHEDULER
        return Decision(NODE_DECIDED, gpus=gpus, scheduler=scheduler, detail=decided)
    refusal = refusal or (reserved_env(spec) or order_refusal(spec) if shares else None)
    if refusal is not None:
        return Decision(REFUSED, gpus=gpus, detail=clip_text(refusal, MAX_WARNING))

    patch: list[dict[str, Any]] = []
    warnings: list[str] = []
    changes: list[str] = []
    scheduler = current or DEFAULT_SCHEDULER
    asks = f"{gpus} {RESOURCE_GPU}" if gpus else ""
    if shares:
        asks += f"{' and ' if asks else ''}{shares.total} {RESOURCE_GPU_MEMORY}"
    if _routes(spec, current, cfg, f"the pod requests {asks}", patch, warnings):
        changes.append("schedulerName")
        scheduler = cfg.scheduler_name

    missing: list[dict[str, Any]] = []
    for wanted in cfg.tolerations:
        if not any(covers(t, wanted) for t in (*have, *missing)):
            missing.append(dict(wanted))
    if missing:
        if raw_tolerations is None:
            op = "replace" if "tolerations" in spec else "add"
            patch.append({"op": op, "path": "/spec/tolerations", "value": missing})
        else:
            patch += [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing]
        warnings += [f"{WARNING_PREFIX}added toleration {describe(t)}" for t in missing]
        changes.append("tolerations")

    if cfg.node_affinity:
        written = _node_affinity(annotations, spec, cfg, warnings)
        if isinstance(written, str):
            return Decision(REFUSED, gpus=gpus, detail=clip_text(written, MAX_WARNING))
        if written:
            patch += written
            changes.append("nodeAffinity")

    return Decision(
        MUTATED if patch else UNCHANGED,
        patch=patch,
        warnings=warnings,
        gpus=gpus,
        shares=shares.total,
        changes=tuple(changes),
        scheduler=scheduler,
    )


def _shares(spec: Mapping[str, Any]) -> tuple[ShareRequest, str | None]:
    """The GPU shares a pod asks for, or why no GPU could meet them (then it is refused:
    unlike a malformed nvidia.com/gpu, the API server has no rule of its own for it).
    Raises :class:`FieldError` for a field of the wrong JSON type."""
    try:
        return pod_shares(spec), None
    except FieldError as exc:
        if exc.wrong_type:
            raise
        return NO_SHARES, f"cannot read its {RESOURCE_GPU_MEMORY} request: {exc}"
    except ShareError as exc:
        return NO_SHARES, str(exc)


def _routes(
    spec: Mapping[str, Any],
    current: str | None,
    cfg: WebhookConfig,
    why: str,
    patch: list[dict[str, Any]],
    warnings: list[str],
) -> bool:
    """Set ``spec.schedulerName`` to the profile (patch and warning appended) unless the
    pod chose another scheduler itself; whether it did."""
    if current not in (None, "", DEFAULT_SCHEDULER) or cfg.scheduler_name == current:
        return False
    op = "replace" if "schedulerName" in spec else "add"
    patch.append({"op": op, "path": "/spec/schedulerName", "value": cfg.scheduler_name})
    warnings.append(f"{WARNING_PREFIX}set spec.schedulerName to {cfg.scheduler_name} ({why})")
    return True


def _gang_member(
    annotations: Mapping[str, Any],
    spec: Mapping[str, Any],
    current: str | None,
    decided: str | None,
    cfg: WebhookConfig,
) -> Decision:
    """A pod without GPUs: routed to the profile only as a member of a GPU gang (it
    joins a PodGroup and carries ``gpu-scheduler.io/group``), else left alone."""
    group = pod_group_name(spec)
    member = isinstance(annotations.get(ANN_GROUP), str) and annotations.get(ANN_GROUP)
    if not (group and member) or decided:
        return Decision(NO_GPU, scheduler=current or None)
    patch: list[dict[str, Any]] = []
    warnings: list[str] = []
    why = f"a member of PodGroup {clip_text(group, 64)}, whose pods share one scheduler"
    if not _routes(spec, current, cfg, why, patch, warnings):
        return Decision(GANG_MEMBER, scheduler=current or None, detail=group)
    return Decision(
        GANG_MEMBER,
        patch=patch,
        warnings=warnings,
        changes=("schedulerName",),
        scheduler=cfg.scheduler_name,
        detail=group,
    )


def _node_affinity(
    annotations: Mapping[str, Any], spec: Mapping[str, Any], cfg: WebhookConfig, warnings: list[str]
) -> list[dict[str, Any]] | str:
    """The patch that writes the pod's hard GPU constraints as required node affinity
    (:mod:`webhook.affinity`), or why the pod is refused. Constraints it cannot write
    (a malformed annotation, a product the platform map lacks) are left to the
    extender, with a warning."""
    hard = hard_constraints(annotations)
    if hard.errors:
        warnings.append(
            clip_text(
                f"{WARNING_PREFIX}no node affinity written: {'; '.join(hard.errors)}", MAX_WARNING
            )
        )
        return []
    if not hard.any:
        return []
    wanted, skipped = affinity.constraints(hard, cfg.labels, cfg.allow_unlabelled)
    warnings += [
        clip_text(f"{WARNING_PREFIX}not written as node affinity: {s}", MAX_WARNING)
        for s in skipped
    ]
    merged = affinity.merge(spec, wanted)
    if merged.refused:
        return merged.refused
    if merged.terms is None:
        return []
    warnings.append(
        clip_text(
            f"{WARNING_PREFIX}wrote {', '.join(merged.written)} as required node affinity "
            f"on {cfg.labels.product_key.split('/')[0]} labels "
            f"({len(merged.terms)} nodeSelectorTerms)",
            MAX_WARNING,
        )
    )
    return affinity.patch_ops(spec, merged.terms)


def node_decided(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> str | None:
    """Why this pod's node is already decided (``spec.nodeName`` set, or a DaemonSet as
    its controller), or None. Raises :class:`FieldError` for a field of the wrong type."""
    node = string_at(spec, "nodeName", "spec.nodeName")
    if node:
        return f"spec.nodeName is {clip_text(node)}"
    for i, ref in enumerate(list_at(metadata, "ownerReferences", "metadata.ownerReferences")):
        where = f"metadata.ownerReferences[{i}]"
        ref = expect_object(ref, where)
        kind = string_at(ref, "kind", f"{where}.kind")
        controller = ref.get("controller")
        if controller is not None and not isinstance(controller, bool):
            raise FieldError(f"{where}.controller", "must be a boolean")
        if kind == "DaemonSet" and controller and ref.get("apiVersion") == "apps/v1":
            return "owned by a DaemonSet, which pins it to its node"
    return None


def _checked_toleration(value: Any, path: str) -> Mapping[str, Any]:
    """A toleration whose fields have the API's types (strings; an integer
    ``tolerationSeconds``), or :class:`FieldError` naming the field."""
    toleration = expect_object(value, path)
    for key in ("key", "operator", "value", "effect"):
        string_at(toleration, key, f"{path}.{key}")
    seconds = toleration.get("tolerationSeconds")
    if seconds is not None and not is_integer(seconds):
        raise FieldError(f"{path}.tolerationSeconds", "must be an integer")
    return toleration


def covers(have: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether toleration ``have`` tolerates every taint that ``wanted`` tolerates.

    Both are tolerations in their JSON form (missing fields: empty key, operator
    ``Equal``, empty value, empty effect = every effect, no tolerationSeconds).
    A field of the wrong type makes ``have`` cover nothing.
    """
    h = taints.toleration(have)
    w = taints.toleration(wanted)
    if h is None or w is None:
        return False
    h_key, h_op, h_value, h_effect, h_seconds = h
    w_key, w_op, w_value, w_effect, w_seconds = w
    if h_effect and h_effect != w_effect:
        return False  # an empty wanted effect means every effect: only "" covers it
    if not h_key:
        if h_op != "Exists":
            return False  # invalid; the API server refuses it
    elif h_key != w_key:
        return False
    if h_op == "Equal" and not (w_op == "Equal" and w_key and h_value == w_value):
        return False
    if h_op not in ("Exists", "Equal"):
        return False
    if h_seconds is not None and w_effect in ("", "NoExecute"):
        # Evicted after h_seconds: covers only a toleration that keeps the pod no longer.
        return w_seconds is not None and w_seconds <= h_seconds
    return True


def describe(t: Mapping[str, Any]) -> str:
    """``key:effect (operator[ value])`` as a short human string."""
    key = t.get("key") or "*"
    effect = t.get("effect") or "*"
    op = t.get("operator") or "Equal"
    value = f" {t.get('value', '')!s}" if op == "Equal" else ""
    return f"{key}:{effect} ({op}{value})"


def _uninterpretable(reason: str) -> Decision:
    text = clip_text(f"{WARNING_PREFIX}pod left unchanged: {reason}", MAX_WARNING)
    return Decision(UNINTERPRETABLE, warnings=[text], detail=clip_text(reason))
