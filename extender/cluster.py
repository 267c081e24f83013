"""A cluster-mode worker's link to the API server: one API client, the cluster cache
that lists and watches through it, and the placement explainer that writes its
Events through it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from extender.cache import ClusterCache
from extender.explain import Explainer
from gpu_scheduler import contract

#: The interpreter's thread switch interval in a cluster-mode worker (seconds).
SWITCH_INTERVAL = 0.001


def start(
    kubeconfig: str | None,
    heartbeat_namespace: str | None = None,
    levels: Sequence[str] = contract.TOPOLOGY_LEVELS,
) -> tuple[ClusterCache, Explainer]:
    """The cluster cache (list+watch from this worker; the agents' heartbeat Leases
    from ``heartbeat_namespace``) and the placement explainer, which writes its Events
    through the same API client."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpu_scheduler.kube import api_client

    # The watches and the Event writer are threads of the process that answers
    # kube-scheduler. A request thread that wants the interpreter while one of them
    # holds it waits up to the switch interval (5 ms by default, several times a
    # whole decision): ask for it back after 1 ms.
    sys.setswitchinterval(SWITCH_INTERVAL)
    api = api_client(kubeconfig)
    core = client.CoreV1Api(api)

    def post(body: dict[str, Any]) -> None:
        # The client's own create_namespaced_event validates the body into its pydantic
        # model first, which cost this thread more CPU than sending it (and it holds
        # the GIL, which the request threads need): the same request through the
        # client's serialiser, auth and pool, the answer read and dropped unparsed.
        request = api.param_serialize(
            method="POST",
            resource_path="/api/v1/namespaces/{namespace}/events",
            path_params={"namespace": body["metadata"]["namespace"]},
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = api.call_api(*request)
        response.read()  # the connection goes back to the pool
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)

    explainer = Explainer(post).start()
    cache = ClusterCache(on_bound=explainer.bound, levels=levels)
    cache.start(core, client.ResourceV1Api(api), client.CoordinationV1Api(api), heartbeat_namespace)
    return cache, explainer
