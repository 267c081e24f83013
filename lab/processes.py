"""Processes of the lab: started in their own session, logged to a file, waited on
over HTTP or TCP, and stopped by their process group (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class ControlPlaneError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env() -> dict[str, str]:
    """The environment without proxies (everything in the lab is on loopback)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def stop_group(popen: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM to the process's group, SIGKILL after ``grace`` seconds; then reap it."""
    if popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGTERM)
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    args: list[str] = field(default_factory=list)
    env: Mapping[str, str] | None = None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        stop_group(self.popen, grace)


def wait_url(
    url: str,
    timeout: float,
    proc: Process,
    *,
    ca_file: Path | None = None,
    token: str | None = None,
    insecure: bool = False,
) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` exits."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ControlPlaneError(f"{proc.name} exited:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(request, context=context, timeout=2) as response:
                if response.status == 200:
                    return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.25)
    raise ControlPlaneError(f"{proc.name} not ready after {timeout}s ({last!r}):\n{proc.tail()}")


def wait_port(port: int, timeout: float, proc: Process) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ControlPlaneError(f"{proc.name} exited:\n{proc.tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)
    raise ControlPlaneError(f"{proc.name} did not open port {port}:\n{proc.tail()}")
