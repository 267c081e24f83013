"""Soft taints and the tolerations that match them, as kube-scheduler reads them.

A ``PreferNoSchedule`` taint asks the scheduler to avoid a node for pods that do not
tolerate it: kube-scheduler's TaintToleration score counts each node's intolerable
ones. Cluster Autoscaler puts one (``DeletionCandidateOfClusterAutoscaler``) on the
nodes it means to remove, so that new pods land elsewhere and the node can drain. The
extender reads both sides wherever it picks a node itself (extender/choice.py).

Matching follows ``Toleration.ToleratesTaint`` (k8s.io/api/core/v1): an effect, when
given, must equal the taint's; a key, when given, must equal it (an empty key matches
every key; the API server admits it only with ``Exists``); ``Equal`` (the default)
compares values; ``Exists`` matches any value. An operator it does not know
tolerates nothing, so such a taint is still avoided. Past :data:`MAX_ENTRIES`
entries of a list (of any effect) nothing more is read.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from gpu_scheduler.fields import FieldError, expect_object, is_integer, list_at, string_at

PREFER_NO_SCHEDULE = "PreferNoSchedule"
#: A soft taint as the extender keeps it: (key, value).
SoftTaint = tuple[str, str]
#: A toleration that may match a soft taint: (key, operator, value); only those whose
#: effect is empty (every effect) or PreferNoSchedule are kept.
SoftToleration = tuple[str, str, str]
#: More soft taints or tolerations than this are not read one by one: the node (or
#: pod) is taken to have the first ones only (no real object comes near).
MAX_ENTRIES = 64

_intern = sys.intern


#: What a node whose taints cannot be read is taken to carry: one soft taint that
#: only a toleration of every key tolerates (so it is avoided, never failed: the
#: taints only inform a preference).
UNREADABLE: tuple[SoftTaint, ...] = (("", "(taints unreadable)"),)


def node_soft_taints(spec: Any) -> tuple[SoftTaint, ...]:
    """A Node spec's ``PreferNoSchedule`` taints (:data:`UNREADABLE` for a field of
    the wrong type). Never raises."""
    try:
        return _soft_taints(expect_object(spec, "spec"))
    except FieldError:
        return UNREADABLE


def _soft_taints(spec: Mapping[str, Any]) -> tuple[SoftTaint, ...]:
    out: list[SoftTaint] = []
    for i, taint in enumerate(list_at(spec, "taints", "spec.taints")[:MAX_ENTRIES]):
        path = f"spec.taints[{i}]"
        taint = expect_object(taint, path)
        if string_at(taint, "effect", f"{path}.effect") != PREFER_NO_SCHEDULE:
            continue
        key = string_at(taint, "key", f"{path}.key") or ""
        value = string_at(taint, "value", f"{path}.value") or ""
        out.append((_intern(key), value))
    return tuple(out)


#: A toleration in its JSON form, read with the API's defaults: (key, operator, value,
#: effect, tolerationSeconds).
Toleration = tuple[str, str, str, str, int | None]
_DEFAULTS = (("key", ""), ("operator", "Equal"), ("value", ""), ("effect", ""))


def toleration(t: Any) -> Toleration | None:
    """A toleration with the API's defaults for what is absent, null or empty (empty
    key, ``Equal``, empty value, empty effect = every effect, no tolerationSeconds);
    None where it is not an object or a field has the wrong type."""
    if not isinstance(t, Mapping):
        return None
    fields: list[str] = []
    for name, default in _DEFAULTS:
        value = t.get(name)
        if value is not None and not isinstance(value, str):
            return None
        fields.append(value or default)
    seconds = t.get("tolerationSeconds")
    if seconds is not None and not is_integer(seconds):
        return None
    key, operator, value, effect = fields
    return key, operator, value, effect, seconds


def pod_soft_tolerations(spec: Mapping[str, Any]) -> tuple[SoftToleration, ...]:
    """A Pod spec's tolerations that can match a ``PreferNoSchedule`` taint. Raises
    :class:`FieldError` for a field of the wrong type."""
    out: list[SoftToleration] = []
    for i, given in enumerate(list_at(spec, "tolerations", "spec.tolerations")[:MAX_ENTRIES]):
        read = toleration(given)
        if read is None:
            raise FieldError(f"spec.tolerations[{i}]", "is not a toleration")
        key, operator, value, effect, _ = read
        if effect in ("", PREFER_NO_SCHEDULE):
            out.append((key, operator, value))
    return tuple(out)


def tolerates(tolerations: tuple[SoftToleration, ...], taint: SoftTaint) -> bool:
    """Whether any of ``tolerations`` (effects already matched) tolerates ``taint``."""
    key, value = taint
    for t_key, operator, t_value in tolerations:
        if t_key and t_key != key:
            continue
        if operator == "Exists" or (operator == "Equal" and t_value == value):
            return True
    return False


def intolerable(tolerations: tuple[SoftToleration, ...], taints: tuple[SoftTaint, ...]) -> int:
    """How many of a node's soft ``taints`` the pod does not tolerate (what
    kube-scheduler's TaintToleration score counts)."""
    return sum(1 for taint in taints if not tolerates(tolerations, taint))
