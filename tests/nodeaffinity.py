"""kube-scheduler's required node affinity, in Python, as a test oracle.

Followed line by line from upstream v1.37.2:
``k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity.go``
(``GetRequiredNodeAffinity``, ``RequiredNodeAffinity.Match``,
``LazyErrorNodeSelector.Match``, ``nodeSelectorTerm.match``,
``nodeSelectorRequirementsAsSelector``) and
``k8s.io/apimachinery/pkg/labels/selector.go`` (``NewRequirement``'s checks,
``Requirement.Matches``). Only label expressions are modelled (``matchFields`` on
``metadata.name`` too, as upstream); the pod and node are their JSON forms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_scheduler.contract import is_label_value

_OPS = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}


def _parse_int(value: str) -> int | None:
    """Go's strconv.ParseInt(value, 10, 64)."""
    body = value[1:] if value[:1] in "+-" else value
    if not body or not body.isascii() or not body.isdigit():
        return None
    number = int(value)
    return number if -(1 << 63) <= number < 1 << 63 else None


def _requirement_ok(expr: Mapping[str, Any]) -> bool:
    """NewRequirement's validation: a parse error makes the whole term an error."""
    op, values = expr.get("operator"), expr.get("values") or []
    if op not in _OPS:
        return False
    if op in ("In", "NotIn"):
        return bool(values) and all(is_label_value(v) for v in values)
    if op in ("Exists", "DoesNotExist"):
        return not values
    return len(values) == 1 and _parse_int(values[0]) is not None


def _matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Requirement.Matches."""
    op, key, values = expr["operator"], expr["key"], expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if key not in labels:
        return False
    have = _parse_int(labels[key])
    if have is None:
        return False
    want = _parse_int(values[0])
    assert want is not None
    return have > want if op == "Gt" else have < want


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term matches no objects
    if not all(_requirement_ok(e) for e in exprs):
        return False  # a parse error: the term does not match
    if not all(_matches(e, labels) for e in exprs):
        return False
    for field in fields:  # metadata.name only, In/NotIn with one value
        if field.get("key") != "metadata.name":
            return False
        inside = name in (field.get("values") or [])
        if inside != (field.get("operator") == "In"):
            return False
    return True


def required_node_affinity_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler's NodeAffinity filter lets ``pod`` onto ``node``."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    name = (node.get("metadata") or {}).get("name") or ""
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(_term_matches(t, labels, name) for t in required.get("nodeSelectorTerms") or [])
