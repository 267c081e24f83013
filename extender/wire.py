"""``k8s.io/kube-scheduler/extender/v1`` on the wire, both directions.

kube-scheduler sends ``ExtenderArgs`` with Go's field names (``Pod``, ``Nodes``,
``NodeNames``; the unused one is ``null``) and reads back ``ExtenderFilterResult``
(``Nodes`` *or* ``NodeNames``, ``FailedNodes``, ``FailedAndUnresolvableNodes``,
``Error``) or a ``HostPriorityList`` (``[{"Host": ..., "Score": int}]``). Go's
decoder matches keys case-insensitively after an exact match, and so do we.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.engine import FilterOutcome
from gpu_scheduler.http import BadInput


def _field(obj: Mapping[str, Any], name: str) -> Any:
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


@dataclass
class ExtenderArgs:
    pod: dict[str, Any]
    #: Node objects (nodeCacheCapable: false), else None.
    nodes: list[dict[str, Any]] | None
    #: Candidate names, in the order given (from NodeNames or the Node objects).
    names: list[str]


def parse_args(payload: Any) -> ExtenderArgs:
    if not isinstance(payload, dict):
        raise BadInput("ExtenderArgs must be a JSON object")
    pod = _field(payload, "Pod")
    if not isinstance(pod, dict):
        raise BadInput("ExtenderArgs.Pod is missing or not an object")
    nodes_field = _field(payload, "Nodes")
    names_field = _field(payload, "NodeNames")
    if nodes_field is not None:
        if not isinstance(nodes_field, dict):
            raise BadInput("ExtenderArgs.Nodes must be a NodeList object")
        items = nodes_field.get("items") or []
        if not isinstance(items, list):
            raise BadInput("ExtenderArgs.Nodes.items must be a list")
        names = []
        for item in items:
            name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
            if not isinstance(name, str):
                raise BadInput("every node in ExtenderArgs.Nodes.items needs metadata.name")
            names.append(name)
        return ExtenderArgs(pod, items, names)
    if names_field is not None:
        if not isinstance(names_field, list) or not set(map(type, names_field)) <= {str}:
            raise BadInput("ExtenderArgs.NodeNames must be a list of strings")
        return ExtenderArgs(pod, None, names_field)
    raise BadInput("ExtenderArgs carries neither Nodes nor NodeNames")


def filter_result(args: ExtenderArgs, outcome: FilterOutcome) -> dict[str, Any]:
    """``ExtenderFilterResult`` in the shape the request came in."""
    result: dict[str, Any] = {}
    if args.nodes is None:
        result["NodeNames"] = outcome.passed
    else:
        keep = set(outcome.passed)
        result["Nodes"] = {
            "metadata": {},
            "items": [n for n, name in zip(args.nodes, args.names, strict=True) if name in keep],
        }
    result["FailedNodes"] = outcome.failed
    result["FailedAndUnresolvableNodes"] = outcome.unresolvable
    result["Error"] = ""
    return result


def error_result(message: str) -> dict[str, Any]:
    return {"FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def host_priorities(names: Sequence[str], scores: Sequence[int]) -> list[dict[str, Any]]:
    return [{"Host": name, "Score": score} for name, score in zip(names, scores, strict=True)]
