"""The HostPriorityList the extender writes: byte for byte what orjson writes for the
dicts, whichever path made it, and valid JSON whatever the names."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

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
