"""Registration with the kubelet, and knowing when to do it again.

A plugin serves its socket first, then calls ``Registration.Register`` on the
kubelet's ``kubelet.sock`` in the same directory (API version, the socket's file
name, the resource, the options); the kubelet dials the socket back, asks the
options and opens ListAndWatch. When the kubelet starts it removes every socket in
that directory and serves a new ``kubelet.sock``, and it knows no plugin until each
registers again. So :class:`Registrar` looks, every round: our socket gone (or
another file in its place), or ``kubelet.sock`` another file than the one we
registered with (its device, inode and ctime), and then the resource is served on a
fresh socket and registered again. A failed registration (no kubelet yet, or one
that refuses) is tried again after a backoff: one round, doubling to ``retry_max_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from agent.deviceplugin import api_pb2, api_pb2_grpc
from agent.deviceplugin.server import DevicePluginServicer, Endpoint, file_identity
from gpu_scheduler.textclip import clip_text

log = logging.getLogger("gpu_scheduler.agent")

VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")


class RegistrationError(Exception):
    """The kubelet could not be reached, or refused the registration."""


def register(
    kubelet_dir: Path,
    endpoint: str,
    resource: str,
    *,
    timeout_s: float = 5.0,
    stop: threading.Event | None = None,
) -> None:
    """Register ``resource``, served on ``kubelet_dir/endpoint``, with the kubelet.
    Returns early (raising) when ``stop`` is set. Raises :class:`RegistrationError`."""
    request = api_pb2.RegisterRequest(
        version=VERSION,
        endpoint=endpoint,
        resource_name=resource,
        options=api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        ),
    )
    target = f"unix://{(kubelet_dir / KUBELET_SOCKET).absolute()}"
    with grpc.insecure_channel(target) as channel:
        call = api_pb2_grpc.RegistrationStub(channel).Register.future(request, timeout=timeout_s)
        done = threading.Event()
        call.add_done_callback(lambda _: done.set())
        while not done.wait(0.05):
            if stop is not None and stop.is_set():
                call.cancel()
                raise RegistrationError("stopped while registering")
        try:
            call.result()
        except grpc.RpcError as exc:
            code = exc.code().name if exc.code() else "UNKNOWN"
            raise RegistrationError(f"{code}: {clip_text(str(exc.details()), 300)}") from None
        except grpc.FutureCancelledError:
            raise RegistrationError("registration cancelled") from None


@dataclass(eq=False)
class Registrar:
    """One resource: its socket, its server, its registration."""

    kubelet_dir: Path
    socket_name: str
    resource: str
    servicer: DevicePluginServicer
    stop: threading.Event
    monotonic: Callable[[], float] = time.monotonic
    poll_s: float = 1.0
    retry_max_s: float = 30.0
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        self.endpoint: Endpoint | None = None
        #: kubelet.sock as it was when the registration succeeded; None: not registered.
        self.registered_with: tuple[int, int, int] | None = None
        self.registrations = 0
        self._failures = 0
        self._next_try = 0.0
        self._kubelet_at_failure: tuple[int, int, int] | None = None
        self._last_error = ""

    @property
    def socket(self) -> Path:
        return self.kubelet_dir / self.socket_name

    def ensure(self) -> None:
        """One round: serve and register, or serve again and register again."""
        kubelet = file_identity(self.kubelet_dir / KUBELET_SOCKET)
        if self.endpoint is not None:
            if self.endpoint.alive() and self.registered_with is not None:
                if kubelet == self.registered_with:
                    return
                why = "kubelet.sock was re-created (the kubelet restarted)"
            elif not self.endpoint.alive():
                why = "our socket is gone (the kubelet restarted)"
            else:
                why = ""
            if why:
                extra = {"resource": self.resource, "why": why}
                log.info("device plugin: serving again", extra=extra)
                self.close()
        # Backing off, unless kubelet.sock changed since the failure (a kubelet came up).
        if self.monotonic() < self._next_try and kubelet == self._kubelet_at_failure:
            return
        try:
            if self.endpoint is None:
                self.endpoint = Endpoint(self.socket, self.servicer).start()
            if kubelet is None:
                raise RegistrationError(f"no {KUBELET_SOCKET} in {self.kubelet_dir}")
            register(
                self.kubelet_dir,
                self.socket_name,
                self.resource,
                timeout_s=self.timeout_s,
                stop=self.stop,
            )
        except (RegistrationError, OSError, RuntimeError) as exc:
            self._kubelet_at_failure = kubelet
            self._failed(exc)
            return
        self.registered_with = kubelet
        self.registrations += 1
        self._failures, self._last_error = 0, ""
        log.info(
            "device plugin registered with the kubelet",
            extra={"resource": self.resource, "socket": str(self.socket)},
        )

    def _failed(self, exc: Exception) -> None:
        self._failures += 1
        delay = min(self.retry_max_s, self.poll_s * 2 ** min(self._failures - 1, 16))
        self._next_try = self.monotonic() + delay
        text = clip_text(str(exc), 300)
        if text != self._last_error:
            log.warning(
                "device plugin: not registered; trying again",
                extra={"resource": self.resource, "error": text, "retry_in_s": delay},
            )
        self._last_error = text

    def close(self) -> None:
        endpoint, self.endpoint = self.endpoint, None
        self.registered_with = None
        if endpoint is not None:
            endpoint.stop()
