"""Kubernetes API clients: kubeconfig when given, else in-cluster, else ~/.kube/config."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def api_client(kubeconfig: str | None = None) -> Any:
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()


def core_api(kubeconfig: str | None = None) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client(kubeconfig))


class Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def watch_events(
    list_func: Any,
    resource_version: str | None = None,
    timeout_seconds: int = 300,
    **params: Any,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(type, object)`` for each event of one watch call, objects as plain dicts.

    ``list_func`` is a client list method (``CoreV1Api.list_node``). Bookmarks are asked
    for and passed through (type ``BOOKMARK``) so the caller can keep its
    resourceVersion current. An ``ERROR`` event raises :class:`Gone` for 410, else
    :class:`RuntimeError`. The call ends when the server closes it (``timeout_seconds``).
    """
    from kubernetes.watch.watch import iter_resp_lines

    response = list_func(
        watch=True,
        resource_version=resource_version or None,
        allow_watch_bookmarks=True,
        timeout_seconds=timeout_seconds,
        _preload_content=False,
        **params,
    )
    try:
        for line in iter_resp_lines(response):
            if not line or line.isspace():
                continue
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message", "resourceVersion too old"))
                raise RuntimeError(f"watch error: {obj.get('code')} {obj.get('message')}")
            yield kind, obj
    finally:
        response.close()
        response.release_conn()
