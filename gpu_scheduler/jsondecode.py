"""JSON from the API server, decoded: one parser for every component and for the
contract's annotations alike. Pure: no client, no I/O."""

from __future__ import annotations

import json
from typing import Any

import orjson


def decode_json(data: bytes | str) -> Any:
    """An API server's JSON (a list page, a watch event, an annotation's value) as
    plain Python objects: orjson (a fifth of the stdlib's time on a watch event), or
    the stdlib for what orjson refuses and the API server may still send (a lone
    surrogate escaped in a string, a number beyond a double)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
