"""The agent's API calls (its Node, its heartbeat Lease, the DRA check), behind a small
interface the loop (and tests) use. Every call is counted in
``gpu_scheduler_agent_api_requests_total`` by verb and resource.

The kubernetes client (v29+, checked against v37) picks a patch's Content-Type by
itself: ``application/json-patch+json`` for a list body and *strategic merge* for a
dict body. We want a JSON merge patch for metadata and a JSON patch for status, so
each call names its Content-Type explicitly (``_content_type``).
"""

from __future__ import annotations

from typing import Any, Protocol

from agent import metrics
from agent.sync import FIELD_MANAGER, NodeState

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the client sends the dict as JSON


class ApiError(Exception):
    """An API call that failed. ``status`` is the HTTP code (None: no answer at all:
    connection refused, timeout). ``retry_after`` in seconds when the server said."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after

    @property
    def conflict(self) -> bool:
        """409 (resourceVersion precondition) or 422 from a failed JSON-patch ``test``:
        someone changed the Node since we read it. Re-read and re-plan."""
        return self.status in (409, 422)


class NodeApi(Protocol):
    def get_node(self, name: str) -> NodeState: ...

    def patch_metadata(self, name: str, patch: dict[str, Any]) -> None: ...

    def patch_status(self, name: str, ops: list[dict[str, Any]]) -> None: ...

    def dra_gpus(self, name: str) -> int | None: ...

    def renew_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> None: ...


class KubeNodeApi:
    """:class:`NodeApi` over ``kubernetes.client.CoreV1Api``."""

    def __init__(self, core: Any, timeout_s: float = 10.0) -> None:
        self.core = core
        self.timeout = timeout_s

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, timeout_s: float = 10.0) -> KubeNodeApi:
        from gpu_scheduler.kube import core_api

        return cls(core_api(kubeconfig), timeout_s)

    def get_node(self, name: str) -> NodeState:
        node = self._call("read node", self.core.read_node, name)
        serialize = self.core.api_client.sanitize_for_serialization
        return NodeState.from_json(serialize(node))

    def patch_metadata(self, name: str, patch: dict[str, Any]) -> None:
        self._call(
            "patch node",
            self.core.patch_node,
            name,
            patch,
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
        )

    def patch_status(self, name: str, ops: list[dict[str, Any]]) -> None:
        self._call(
            "patch node status",
            self.core.patch_node_status,
            name,
            ops,
            field_manager=FIELD_MANAGER,
            _content_type=JSON_PATCH,
        )

    def renew_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> None:
        """Server-side apply of the node's Lease: creates it when there is none (the
        first start on a node, or the garbage collector took it with a previous pod),
        renews it otherwise. One call either way."""
        from kubernetes import client

        api = client.CoordinationV1Api(self.core.api_client)
        self._call(
            "apply lease",
            api.patch_namespaced_lease,
            name,
            namespace,
            lease,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=APPLY_PATCH,
        )

    def dra_gpus(self, name: str) -> int | None:
        """GPU devices a DRA driver publishes for the node: devices in its ResourceSlices
        of the DeviceClass serving ``nvidia.com/gpu``. 0 where the cluster serves no
        ``resource.k8s.io/v1`` or no class maps the resource; None when it cannot tell
        (no permission to read DeviceClasses and ResourceSlices)."""
        from kubernetes import client

        from gpu_scheduler import contract, dra

        api = client.ResourceV1Api(self.core.api_client)
        serialize = self.core.api_client.sanitize_for_serialization
        try:
            found = self._call("list deviceclasses", api.list_device_class)
            classes = [dra.device_class(c) for c in serialize(found.items)]
            chosen = dra.class_for([c for c in classes if c], contract.RESOURCE_GPU)
            if chosen is None:
                return 0
            slices = self._call(
                "list resourceslices",
                api.list_resource_slice,
                field_selector=f"spec.nodeName={name}",
            )
        except ApiError as exc:
            if exc.status == 404:
                return 0
            if exc.status == 403:
                return None
            raise
        matcher = dra.ClassMatcher(chosen)
        count = 0
        for item in serialize(slices.items):
            parsed = dra.slice_devices(item)
            if parsed is not None:
                count += sum(1 for d in parsed[3] if d.node == name and matcher.matches(d))
        return count

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        verb, _, resource = what.partition(" ")
        try:
            result = fn(*args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            code = f"{exc.status // 100}xx" if isinstance(exc.status, int) else "none"
            metrics.API_REQUESTS.labels(verb, resource, code).inc()
            raise ApiError(
                f"{what}: HTTP {exc.status} {exc.reason}: {_message(exc.body)}",
                status=exc.status,
                retry_after=_retry_after(exc.headers),
            ) from exc
        except (HTTPError, OSError) as exc:
            metrics.API_REQUESTS.labels(verb, resource, "none").inc()
            raise ApiError(f"{what}: {type(exc).__name__}: {exc}") from exc
        metrics.API_REQUESTS.labels(verb, resource, "2xx").inc()
        return result


def _message(body: Any) -> str:
    import json

    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        return str(json.loads(body).get("message", body))
    except (TypeError, ValueError, AttributeError):
        return str(body)[:500]


def _retry_after(headers: Any) -> float | None:
    if not headers:
        return None
    try:
        value = headers.get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None
