"""JSON log lines: bounded fields, and a line is never lost because of its content."""

from __future__ import annotations

import json
import logging

from gpu_scheduler.logs import JsonFormatter
from gpu_scheduler.textclip import LIMIT, clip, clip_text


def line(msg: object = "decision", *args: object, **extra: object) -> dict:
    record = logging.LogRecord("extender", logging.INFO, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return json.loads(JsonFormatter().format(record))


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = {"a": [value]}
    return value


def test_fields_are_cut_and_say_so():
    out = line(pod="p" * (4 << 20), gpus=2, nodes=["a", "b"], ok=True, ms=1.5, none=None)
    assert len(out["pod"]) < LIMIT + 64 and out["pod"].endswith("(truncated of 4194304 characters)")
    assert out["gpus"] == 2 and out["nodes"] == ["a", "b"] and out["ok"] is True


def test_values_that_break_repr_or_str_still_give_a_line():
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

        __str__ = __repr__

    out = line(gpus=10**5000, deep=nested(5000), odd=Hostile(), big=list(range(10**5)))
    assert out["gpus"] == "<integer of about 5000 digits>"
    assert len(out["deep"]) <= LIMIT + 64
    assert out["odd"].startswith("<unprintable Hostile")
    assert len(out["big"]) <= LIMIT + 64


def test_a_message_whose_arguments_do_not_format_is_still_written():
    out = line("%d GPUs", "not a number")
    assert out["level"] == "info" and "log_error" in out


def test_clip():
    assert clip("abc") == "'abc'"
    assert clip_text("x" * 2000, 10) == "x" * 10 + "... (truncated of 2000 characters)"
    assert clip({"k": "v" * 5000}).endswith("(truncated)")
    assert clip(b"bytes") == "<5 bytes>"


def test_every_line_is_ascii_json_whatever_its_text():
    """Lines are written by orjson when they can be; a line with text orjson does not
    write (a lone surrogate) or would write as UTF-8 is escaped to ASCII instead."""
    for value in ("plain", "gpu-ñode-é", "\ud800 lone", "tab\tand\nnewline", 'q"uote\\'):
        record = logging.LogRecord("extender", logging.INFO, __file__, 1, "m", (), None)
        record.pod = value
        text = JsonFormatter().format(record)
        assert text.isascii() and "\n" not in text
        assert json.loads(text)["pod"] == value
    out = line(ms=float("nan"), big=2**64 - 1, neg=-(2**63))
    assert out["big"] == 2**64 - 1 and out["neg"] == -(2**63)
    assert out["ms"] is None or out["ms"] != out["ms"]  # orjson: null; never a crash


def test_plain_numbers_pass_as_they_are_and_the_edges_of_a_64_bit_int_are_kept():
    out = line(
        a=0, b=-(1 << 63), c=(1 << 64) - 1, d=1 << 64, e=True, f=0.25, g=None, h=float("inf")
    )
    assert (out["a"], out["b"], out["c"]) == (0, -(1 << 63), (1 << 64) - 1)
    assert out["d"] == clip(1 << 64)  # past what a JSON reader keeps exact
    assert out["e"] is True and out["f"] == 0.25 and out["g"] is None
    assert out["h"] is None  # orjson writes a non-finite float as null


def test_records_skip_the_caller_lookup_and_other_formats_still_work(monkeypatch):
    from gpu_scheduler.logs import skip_record_lookups

    monkeypatch.setattr(logging, "_srcfile", logging._srcfile)  # type: ignore[attr-defined]
    skip_record_lookups()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("test-skip-lookups")
    logger.addHandler(handler)
    try:
        logger.warning("filter", extra={"ms": 0.5})
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert record.funcName == "(unknown function)"  # the frame was not looked up
    out = json.loads(JsonFormatter().format(record))
    assert out["msg"] == "filter" and out["ms"] == 0.5
    # what gunicorn's own error log formats still has its fields
    gunicorn = logging.Formatter("%(asctime)s [%(process)d] [%(levelname)s] %(message)s")
    assert "] [WARNING] filter" in gunicorn.format(record)
