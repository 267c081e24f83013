"""gpu_scheduler.kube.decode_json: the API server's JSON through orjson, and through the
stdlib where orjson refuses what the API server may still send."""

from __future__ import annotations

import json

import pytest

from gpu_scheduler.jsondecode import decode_json

EVENT = (
    '{"type":"MODIFIED","object":{"kind":"Pod","metadata":{"name":"p","annotations":'
    '{"a":"\\u00e9\\n"}},"spec":{"nodeName":"n1"}}}'
)


@pytest.mark.parametrize("data", [EVENT, EVENT.encode()])
def test_a_watch_event_decodes_as_the_stdlib_does(data):
    assert decode_json(data) == json.loads(data)


@pytest.mark.parametrize(
    "text",
    [
        '{"metadata":{"annotations":{"x":"\\ud800"}}}',  # a lone surrogate, escaped
        '{"spec":{"n":1e999}}',  # beyond a double
    ],
)
def test_what_orjson_refuses_is_decoded_by_the_stdlib(text):
    import orjson

    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    assert decode_json(text) == json.loads(text)


def test_what_is_not_json_still_raises():
    with pytest.raises(ValueError):
        decode_json("{not json")
