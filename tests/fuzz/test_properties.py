"""Hypothesis: whole pods, nodes and reviews with wrong types at random depths, through
the pure decision functions. Each either decides or raises the one error type its
caller turns into an answer; nothing else escapes."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.config import ExtenderConfig
from extender.engine import filter_nodes
from extender.model import node_facts, pod_facts
from extender.policies import build_policies
from gpu_scheduler.fields import FieldError
from gpu_scheduler.http import BadInput
from tests.fuzz.corpus import HOSTILE_QUANTITIES, _paths, _set
from tests.fuzz.servers import base_nodes, base_pod, review_body
from tests.helpers import score_nodes
from tests.unit.test_extender_policies import View
from webhook.admission import review
from webhook.config import WebhookConfig

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(HOSTILE_QUANTITIES),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def mangled(draw: Any, base: Any) -> Any:
    """``base`` with one to three values, at random depths, replaced by any JSON."""
    body = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(body) if p]
        path = draw(st.sampled_from(paths))
        _set(body, path, draw(json_values))
    return body


CFG = ExtenderConfig()
POLICIES = build_policies(CFG)
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(mangled(base_pod()), st.lists(mangled(base_nodes()[0]), max_size=3))
def test_extender_decides_on_any_pod_and_nodes(pod, nodes):
    facts = {}
    for node in nodes:
        try:
            fact = node_facts(node)
        except FieldError:
            continue  # no usable name: the envelope check answers 400 for these
        facts.setdefault(fact.name, fact)  # a repeated name: the envelope check, too
    facts = list(facts.values())
    pod_view = pod_facts(pod) if isinstance(pod, dict) else None
    if pod_view is None:
        return
    names = [f.name for f in facts]
    out = filter_nodes(pod_view, names, facts, View(), POLICIES)
    assert {*out.passed, *out.failed, *out.unresolvable} == set(names)
    assert not set(out.passed) & {*out.failed, *out.unresolvable}
    scores = score_nodes(pod_view, facts, View(), POLICIES, CFG)
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores)


@SETTINGS
@given(mangled(review_body()))
def test_webhook_answers_any_review_or_says_why_not(body):
    try:
        answer, _, _ = review(body, WebhookConfig())
    except BadInput as exc:
        assert len(str(exc)) <= 2200
        return
    response = answer["response"]
    if response["allowed"] is False:  # a pod the webhook refuses (a nonsense GPU share)
        status = response["status"]
        assert status["code"] == 422 and status["message"].startswith("gpu-scheduler: ")
        assert len(status["message"]) <= 2200
        return
    assert response["allowed"] is True
