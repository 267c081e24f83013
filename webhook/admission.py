"""``admission.k8s.io/v1`` AdmissionReview in and out, around :func:`webhook.mutate.decide`.

Pure: a parsed JSON body in, the response body and the decision out. A body that is
not an AdmissionReview v1 with a ``request.uid`` raises :class:`BadInput` (HTTP 400);
everything else is answered ``allowed: true``, with a patch only for a Pod CREATE
that needs one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_scheduler.fields import FieldError
from gpu_scheduler.http import BadInput
from gpu_scheduler.textclip import clip, clip_text
from webhook.config import WebhookConfig
from webhook.mutate import IGNORED, REFUSED, Decision, decide

API_VERSION = "admission.k8s.io/v1"
#: A UID is 36 characters; the answer echoes it, so it is bounded.
MAX_UID = 128
KIND = "AdmissionReview"


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionRequest the webhook reads."""

    uid: str
    operation: str
    kind: Mapping[str, Any]
    sub_resource: str
    namespace: str
    name: str
    dry_run: bool
    object: Any

    @property
    def is_pod_create(self) -> bool:
        return (
            self.operation == "CREATE"
            and self.kind.get("group", "") == ""
            and self.kind.get("kind") == "Pod"
            and not self.sub_resource
        )

    @property
    def pod_key(self) -> str:
        """``namespace/name`` (``generateName*`` when the name is not set yet), cut to
        a bound for the log."""
        name = self.name
        obj = self.object if isinstance(self.object, Mapping) else {}
        meta = obj.get("metadata")
        if not name and isinstance(meta, Mapping):
            own, generate = meta.get("name"), meta.get("generateName")
            if isinstance(own, str) and own:
                name = own
            elif isinstance(generate, str):
                name = f"{generate}*"
        key = f"{self.namespace}/{name}" if self.namespace else name
        return clip_text(key, 300)


def parse_review(body: Any) -> Request:
    """The request of an AdmissionReview v1, or :class:`BadInput` saying what is wrong."""
    if not isinstance(body, Mapping):
        raise BadInput("expected an AdmissionReview JSON object")
    if body.get("apiVersion") != API_VERSION:
        raise BadInput(
            f"apiVersion must be {API_VERSION!r}, got {clip(body.get('apiVersion'), 80)} "
            "(set admissionReviewVersions: [v1])"
        )
    if body.get("kind") != KIND:
        raise BadInput(f"kind must be {KIND!r}, got {clip(body.get('kind'), 80)}")
    req = body.get("request")
    if not isinstance(req, Mapping):
        raise BadInput("AdmissionReview.request is missing or not an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID:
        raise BadInput(f"AdmissionReview.request.uid must be a string of 1..{MAX_UID} characters")
    kind = req.get("kind")
    return Request(
        uid=uid,
        operation=_str(req.get("operation")),
        kind=kind if isinstance(kind, Mapping) else {},
        sub_resource=_str(req.get("subResource")),
        namespace=_str(req.get("namespace")),
        name=_str(req.get("name")),
        dry_run=req.get("dryRun") is True,
        object=req.get("object"),
    )


def review(body: Any, cfg: WebhookConfig) -> tuple[dict[str, Any], Request, Decision]:
    """Answer one AdmissionReview: (response body, the request, the decision)."""
    req = parse_review(body)
    # dryRun changes nothing here: the decision has no side effects to skip.
    if not req.is_pod_create:
        return review_response(req.uid, Decision(IGNORED)), req, Decision(IGNORED)
    if not isinstance(req.object, Mapping):
        raise BadInput("AdmissionReview.request.object must be the Pod being created")
    try:
        decision = decide(req.object, cfg)
    except FieldError as exc:
        raise BadInput(f"AdmissionReview.request.object.{exc.path}: {exc.problem}") from None
    return review_response(req.uid, decision), req, decision


def review_response(uid: str, decision: Decision) -> dict[str, Any]:
    if decision.outcome == REFUSED:
        # 422, as the API server's own validation answers a pod it cannot accept.
        status = {"code": 422, "reason": "Invalid", "message": f"gpu-scheduler: {decision.detail}"}
        response: dict[str, Any] = {"uid": uid, "allowed": False, "status": status}
        return {"apiVersion": API_VERSION, "kind": KIND, "response": response}
    response = {"uid": uid, "allowed": True}
    if decision.patch:
        raw = json.dumps(decision.patch, separators=(",", ":")).encode()
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(raw).decode("ascii")
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""
