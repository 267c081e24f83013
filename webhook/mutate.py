"""The mutation decision, as a pure function: pod (JSON) + config -> JSON patch + warnings.

Rules, for a pod that requests ``nvidia.com/gpu`` (counted by the shared contract):

* ``spec.schedulerName`` is set to the configured profile when it is absent, empty or
  ``default-scheduler``. Another explicitly chosen scheduler is never overridden.
* Each required toleration (the GPU one, then the configured extras) is added unless
  a toleration already on the pod *covers* it: tolerates every taint it tolerates.
  This is done for every GPU pod, also when another scheduler was kept, as
  Kubernetes' ExtendedResourceToleration admission plugin does.

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
Anything it cannot interpret gives no patch and a warning: never a reason to block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_scheduler.contract import (
    ANN_SKIP_MUTATION,
    DEFAULT_SCHEDULER,
    RESOURCE_GPU,
    pod_gpu_request,
)
from gpu_scheduler.quantity import QuantityError
from webhook.config import WebhookConfig

#: Outcomes, as logged and counted.
MUTATED = "mutated"
UNCHANGED = "unchanged"  # a GPU pod that already had all it needs
NO_GPU = "no-gpu"
OPTED_OUT = "opted-out"
UNINTERPRETABLE = "uninterpretable"
IGNORED = "ignored"  # not a Pod CREATE
OUTCOMES = (MUTATED, UNCHANGED, NO_GPU, OPTED_OUT, UNINTERPRETABLE, IGNORED)
CHANGES = ("schedulerName", "tolerations")

WARNING_PREFIX = "gpu-scheduler: "
MAX_WARNING = 256  # the API server may truncate longer warnings


@dataclass(frozen=True)
class Decision:
    outcome: str
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    gpus: int = 0
    changes: tuple[str, ...] = ()  # "schedulerName", "tolerations"
    scheduler: str | None = None  # the pod's scheduler after the patch
    detail: str = ""


def decide(pod: Any, cfg: WebhookConfig) -> Decision:
    """The patch and warnings for a pod being created (``pod`` is its JSON form)."""
    if not isinstance(pod, Mapping):
        return _uninterpretable("the object is not a JSON object")
    metadata = pod.get("metadata")
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, Mapping):
        return _uninterpretable("metadata is not an object")
    annotations = metadata.get("annotations")
    annotations = {} if annotations is None else annotations
    if not isinstance(annotations, Mapping):
        return _uninterpretable("metadata.annotations is not an object")
    if annotations.get(ANN_SKIP_MUTATION) == "true":
        return Decision(OPTED_OUT, detail=f"{ANN_SKIP_MUTATION}=true")
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return _uninterpretable("spec is not an object")
    try:
        gpus = pod_gpu_request(spec)
    except (QuantityError, AttributeError, TypeError) as exc:
        return _uninterpretable(f"cannot read its {RESOURCE_GPU} request: {exc}")
    if gpus <= 0:
        return Decision(NO_GPU, scheduler=_scheduler_or_none(spec))

    current = spec.get("schedulerName")
    if current is not None and not isinstance(current, str):
        return _uninterpretable("spec.schedulerName is not a string", gpus)
    tolerations = spec.get("tolerations")
    if tolerations is not None and not isinstance(tolerations, list):
        return _uninterpretable("spec.tolerations is not a list", gpus)

    patch: list[dict[str, Any]] = []
    warnings: list[str] = []
    changes: list[str] = []
    scheduler = current or DEFAULT_SCHEDULER
    if current in (None, "", DEFAULT_SCHEDULER) and cfg.scheduler_name != current:
        op = "replace" if "schedulerName" in spec else "add"
        patch.append({"op": op, "path": "/spec/schedulerName", "value": cfg.scheduler_name})
        warnings.append(
            f"{WARNING_PREFIX}set spec.schedulerName to {cfg.scheduler_name} "
            f"(the pod requests {gpus} {RESOURCE_GPU})"
        )
        changes.append("schedulerName")
        scheduler = cfg.scheduler_name

    have = [t for t in tolerations or () if isinstance(t, Mapping)]
    missing: list[dict[str, Any]] = []
    for wanted in cfg.tolerations:
        if not any(covers(t, wanted) for t in (*have, *missing)):
            missing.append(dict(wanted))
    if missing:
        if tolerations is None:
            op = "replace" if "tolerations" in spec else "add"
            patch.append({"op": op, "path": "/spec/tolerations", "value": missing})
        else:
            patch += [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing]
        warnings += [f"{WARNING_PREFIX}added toleration {describe(t)}" for t in missing]
        changes.append("tolerations")

    return Decision(
        MUTATED if patch else UNCHANGED,
        patch=patch,
        warnings=warnings,
        gpus=gpus,
        changes=tuple(changes),
        scheduler=scheduler,
    )


def covers(have: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether toleration ``have`` tolerates every taint that ``wanted`` tolerates.

    Both are tolerations in their JSON form (missing fields: empty key, operator
    ``Equal``, empty value, empty effect = every effect, no tolerationSeconds).
    A field of the wrong type makes ``have`` cover nothing.
    """
    h = _normal(have)
    w = _normal(wanted)
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


def _normal(t: Mapping[str, Any]) -> tuple[str, str, str, str, int | None] | None:
    key = t.get("key") or ""
    op = t.get("operator") or "Equal"
    value = t.get("value") or ""
    effect = t.get("effect") or ""
    seconds = t.get("tolerationSeconds")
    if not all(isinstance(x, str) for x in (key, op, value, effect)):
        return None
    if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool)):
        return None
    return key, op, value, effect, seconds


def _scheduler_or_none(spec: Mapping[str, Any]) -> str | None:
    value = spec.get("schedulerName")
    return value if isinstance(value, str) and value else None


def _uninterpretable(reason: str, gpus: int = 0) -> Decision:
    text = f"{WARNING_PREFIX}pod left unchanged: {reason}"
    if len(text) > MAX_WARNING:
        text = text[: MAX_WARNING - 3] + "..."
    return Decision(UNINTERPRETABLE, warnings=[text], gpus=gpus, detail=reason)
