"""Kubernetes API clients: kubeconfig when given, else in-cluster, else ~/.kube/config.

Clients have TCP keepalive on (client-go's timings), so a long-lived watch to a peer
that vanished is noticed by the kernel; callers also give every call a read timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpu_scheduler.jsondecode import decode_json


def json_pointer_token(key: str) -> str:
    """A key as a JSON-pointer segment (RFC 6901): ``nvidia.com/gpu`` -> ``nvidia.com~1gpu``."""
    return key.replace("~", "~0").replace("/", "~1")


def api_client(kubeconfig: str | None = None) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
    configuration.keep_alive = True
    return client.ApiClient(configuration)


def core_api(kubeconfig: str | None = None) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client(kubeconfig))


def reset_connections(api: Any) -> None:
    """Close the client's idle pooled connections, so the next call dials anew (one of
    them may be the half-open connection that just timed out)."""
    pool = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    if pool is not None:
        pool.clear()


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a connect or read timeout."""
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, TimeoutError | Urllib3Timeout):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return False


class Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def watch_events(
    list_func: Any,
    resource_version: str | None = None,
    timeout_seconds: int = 300,
    *,
    request_timeout: float | tuple[float, float] | None = None,
    **params: Any,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(type, object)`` for each event of one watch call, objects as plain dicts.

    ``list_func`` is a client list method (``CoreV1Api.list_node``). Bookmarks are asked
    for and passed through (type ``BOOKMARK``) so the caller can keep its
    resourceVersion current. An ``ERROR`` event raises :class:`Gone` for 410, else
    :class:`RuntimeError`. The call ends when the server closes it (``timeout_seconds``);
    ``request_timeout`` (connect, read) bounds the silence between two reads.
    """
    from kubernetes.client.exceptions import ApiException
    from kubernetes.watch.watch import iter_resp_lines

    try:
        response = list_func(
            watch=True,
            resource_version=resource_version or None,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            _request_timeout=request_timeout,
            **params,
        )
    except ApiException as exc:
        if exc.status == 410:  # some servers answer the watch call itself with 410
            raise Gone(str(exc.reason)) from exc
        raise
    try:
        for line in iter_resp_lines(response):
            if not line or line.isspace():
                continue
            event = decode_json(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message", "resourceVersion too old"))
                raise RuntimeError(f"watch error: {obj.get('code')} {obj.get('message')}")
            yield kind, obj
    finally:
        response.close()
        response.release_conn()
