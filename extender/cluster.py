"""A cluster-mode worker's link to the API server: one API client, the cluster cache
that lists and watches through it, and the placement explainer that writes its
Events through it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from extender.cache import ClusterCache
from extender.explain import Explainer
from gpu_scheduler import contract


def start(
    kubeconfig: str | None,
    heartbeat_namespace: str | None = None,
    levels: Sequence[str] = contract.TOPOLOGY_LEVELS,
) -> tuple[ClusterCache, Explainer]:
    """The cluster cache (list+watch from this worker; the agents' heartbeat Leases
    from ``heartbeat_namespace``) and the placement explainer, which writes its Events
    through the same API client."""
    from kubernetes import client

    from gpu_scheduler.kube import api_client

    api = api_client(kubeconfig)
    core = client.CoreV1Api(api)

    def post(body: dict[str, Any]) -> None:
        # A failure raises ApiException: ``status`` 409 when the Event exists already.
        core.create_namespaced_event(body["metadata"]["namespace"], body)

    explainer = Explainer(post).start()
    cache = ClusterCache(on_bound=explainer.bound, levels=levels)
    cache.start(core, client.ResourceV1Api(api), client.CoordinationV1Api(api), heartbeat_namespace)
    return cache, explainer
