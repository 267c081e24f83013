"""Helpers shared by the tests and benchmarks: processes, waiting (ports and stopping
by process group come from :mod:`lab.processes`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from lab.processes import free_port, stop_group

__all__ = ["CLI", "ROOT", "free_port", "running", "tail", "wait_for", "webhook_command"]

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "gpu_scheduler.cli"]


def webhook_command(
    port: int, cert_dir: Path, *extra: str, log_level: str | None = None
) -> list[str]:
    """``gpu-scheduler webhook`` on 127.0.0.1:``port``, serving the pair in ``cert_dir``;
    ``extra``: more of its options."""
    return [
        *CLI,
        *([f"--log-level={log_level}"] if log_level else []),
        "webhook",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--cert-dir={cert_dir}",
        *extra,
    ]


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")


@contextlib.contextmanager
def running(
    args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a process for the duration of the block; stop it by pid; keep its log."""
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        stop_group(proc)
        log.close()


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def score_nodes(*args: Any, **kwargs: Any) -> list[int]:
    """extender.engine.score_array's scores as a list (what the tests compare)."""
    from extender.engine import score_array

    return score_array(*args, **kwargs).tolist()


def skip_with_an_nvidia_driver() -> Any:
    """pynvml, on a machine where NVML cannot initialise (no NVIDIA driver: this test
    machine); skips the test where a driver is present."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return pynvml
    pynvml.nvmlShutdown()  # pragma: no cover - a machine with a driver
    pytest.skip("an NVIDIA driver is present")  # pragma: no cover


def required(what: str, how: str) -> NoReturn:
    """A prerequisite is missing: skip the test here, fail it in CI (``CI`` set), where
    a skip would hide that the test never ran. ``what``: what CI must run; ``how``: how
    to get what is missing."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run {what}, but {how}", pytrace=False)
    pytest.skip(how)


class ManualClock:
    """A clock a test moves by hand (``clock.now += 5``)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
