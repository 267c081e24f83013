"""JSON logs on stderr: one object a line, so decisions can be counted and searched.

Fields often carry values from requests (a pod name, an error quoting a label). Each
one is cut to :data:`gpu_scheduler.textclip.LIMIT` characters and the formatter never
raises: a line whose content cannot be written whole is written with what can be,
and says so, instead of being lost.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import orjson

from gpu_scheduler.textclip import LIMIT, clip, clip_text

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message"}
_MAX_LIST = 32


def _field(value: Any) -> Any:
    """A JSON-ready, bounded form of one log field."""
    # Numbers and None first: most fields are, and each is one test.
    if value is None or isinstance(value, float):
        return value
    if isinstance(value, int):  # bool too
        return value if -(1 << 63) <= value < (1 << 64) else clip(value)
    if isinstance(value, str):
        return clip_text(value, LIMIT)
    if (
        isinstance(value, list | tuple)
        and len(value) <= _MAX_LIST
        and all(isinstance(v, str | int | float | bool) or v is None for v in value)
    ):
        return [_field(v) for v in value]
    return clip(value)


def _dumps(out: dict[str, Any]) -> str:
    """One line of JSON. orjson writes it (the extender logs every call, and the
    standard library's encoder was two thirds of the line's cost); a line it cannot
    write (a lone surrogate) or that is not ASCII goes through the standard library,
    which escapes to ASCII, as every line was before."""
    try:
        line = orjson.dumps(out).decode()
    except TypeError:  # orjson.JSONEncodeError
        line = ""
    return line if line and line.isascii() else json.dumps(out, separators=(",", ":"))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z"
        )
        out: dict[str, Any] = {"ts": stamp, "level": record.levelname.lower()}
        try:
            out["logger"] = record.name
            out["msg"] = clip_text(record.getMessage(), LIMIT)
            for key, value in record.__dict__.items():
                if key not in _RESERVED and not key.startswith("_"):
                    out[key] = _field(value)
            if record.exc_info:
                out["exc"] = clip_text(self.formatException(record.exc_info), 8 * LIMIT)
            return _dumps(out)
        except Exception as exc:  # never lose the line: keep what is safe to write
            fallback = {
                "ts": stamp,
                "level": record.levelname.lower(),
                "logger": clip_text(str(record.name), 200),
                "msg": clip(record.msg),
                "log_error": f"fields dropped: {type(exc).__name__}",
            }
            return json.dumps(fallback, separators=(",", ":"))


def skip_record_lookups() -> None:
    """A line names no source location, so the records need not look up the caller's
    frame (the logging HOWTO's "Optimization": a fifth of a line's cost, and the
    extender logs every call). The thread and process stay: gunicorn's own error log
    formats ``%(process)d``, which fails on a record without one."""
    logging._srcfile = None  # type: ignore[attr-defined]


def setup_logging(level: str = "INFO") -> None:
    """Route every logger (gunicorn's too) to stderr as JSON lines."""
    skip_record_lookups()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
