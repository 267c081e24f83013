"""The HostPriorityList the extender writes: byte for byte what orjson writes for the
dicts, whichever path made it, and valid JSON whatever the names."""

from __future__ import annotations

import json

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import wire
from extender.wire import host_priorities, host_priorities_json

DNS_NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,40}[a-z0-9])?", fullmatch=True)


def _reference(names, scores):
    return orjson.dumps(host_priorities(names, scores))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), names=st.lists(DNS_NAMES, max_size=40, unique=True))
def test_node_names_are_written_as_orjson_writes_them(data, names):
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(names), max_size=len(names)))
    assert host_priorities_json(names, scores) == _reference(names, scores)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), names=st.lists(st.text(min_size=1, max_size=12), max_size=20))
def test_any_name_still_gives_the_same_json(data, names):
    """Quotes, backslashes, control characters, non-ASCII: the orjson path."""
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(names), max_size=len(names)))
    out = host_priorities_json(names, scores)
    assert out == _reference(names, scores)
    assert json.loads(out) == [{"Host": n, "Score": s} for n, s in zip(names, scores, strict=True)]


def test_the_fast_path_and_the_edges():
    assert host_priorities_json([], []) == b"[]"
    assert host_priorities_json(["a"], [10]) == b'[{"Host":"a","Score":10}]'
    assert host_priorities_json(['a"b', "c\\d"], [1, 2]) == _reference(['a"b', "c\\d"], [1, 2])
    assert host_priorities_json(["x\ty"], [3]) == _reference(["x\ty"], [3])
    assert host_priorities_json(["a"], [11]) == _reference(["a"], [11])  # out of range


@settings(max_examples=200, deadline=None)
@given(data=st.data(), names=st.lists(DNS_NAMES, min_size=1, max_size=60))
def test_the_engines_arrays_take_the_joined_path(data, names):
    """The engine's int64 arrays, 10s included, are joined without a dict per
    candidate, and still byte for byte as orjson writes the dicts."""
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(names), max_size=len(names)))
    expected = _reference(names, scores)
    original = wire.host_priorities
    wire.host_priorities = _refuse
    try:
        out = host_priorities_json(names, np.array(scores, dtype=np.int64))
    finally:
        wire.host_priorities = original
    assert out == expected


def _refuse(names, scores):
    raise AssertionError("the orjson path was taken for plain names and engine scores")


def test_a_control_character_or_scores_not_ints_go_through_orjson():
    names = ["a\x01b", "c\x7f"]
    assert host_priorities_json(names, np.array([1, 10])) == _reference(names, [1, 10])
    assert host_priorities_json(["a"], np.array([1.0])) == _reference(["a"], [1.0])
    assert host_priorities_json(["a"], np.array([-1])) == _reference(["a"], [-1])
    assert host_priorities_json(["a", "b"], [True, 2]) == _reference(["a", "b"], [True, 2])
