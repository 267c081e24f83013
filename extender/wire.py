"""``k8s.io/kube-scheduler/extender/v1`` on the wire, both directions.

kube-scheduler sends ``ExtenderArgs`` with Go's field names (``Pod``, ``NodeNames``;
``Nodes`` is ``null`` with ``nodeCacheCapable: true``, the only configuration served)
and reads back ``ExtenderFilterResult`` (``NodeNames``, ``FailedNodes``,
``FailedAndUnresolvableNodes``, ``Error``) or a ``HostPriorityList``
(``[{"Host": ..., "Score": int}]``). Go's decoder matches keys case-insensitively
after an exact match, and so do we.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from extender.engine import FilterOutcome
from extender.model import MAX_NAME
from gpu_scheduler import podspec
from gpu_scheduler.http import BadInput
from gpu_scheduler.quantity import type_name
from gpu_scheduler.textclip import clip


def _field(obj: Mapping[str, Any], name: str) -> Any:
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


#: Why a call in the shape of ``nodeCacheCapable: false`` (whole Node objects, or
#: victims as Pod objects) is refused: the extender decides from its own cluster
#: cache, by node name.
NODE_OBJECTS = (
    "{what}: kube-scheduler's extender entry for gpu-scheduler has "
    "nodeCacheCapable: false. This extender reads nodes and pods from its own cluster "
    "cache and takes node names only: set nodeCacheCapable: true in the extender's entry "
    "of the KubeSchedulerConfiguration (as deploy/scheduler/scheduler-config.yaml does)"
)


@dataclass
class ExtenderArgs:
    pod: dict[str, Any]
    #: Candidate names, in the order given (``NodeNames``).
    names: list[str]


def parse_args(payload: Any) -> ExtenderArgs:
    """The envelope: ``Pod`` an object and ``NodeNames`` an array. Anything else is
    :class:`BadInput` (HTTP 400), and so are whole Node objects (``Nodes``:
    ``nodeCacheCapable: false``, :data:`NODE_OBJECTS`); what is inside the Pod is the
    policies' to judge.

    The elements of ``NodeNames`` and their distinctness are left unchecked: the
    caller looks them up among names it knows to be node names (distinct names have
    distinct rows), and passes a list it cannot vouch for that way to
    :func:`check_names_field`. Checking every name costs 9% of a filter call and 11% of
    a prioritize call at 5,000 candidates (docs/BENCHMARKS.md, "What each mechanism
    of the extender pays for")."""
    if not isinstance(payload, dict):
        raise BadInput(f"ExtenderArgs must be a JSON object, not {type_name(payload)}")
    pod = _field(payload, "Pod")
    if not isinstance(pod, dict):
        raise BadInput(f"ExtenderArgs.Pod must be an object, not {type_name(pod)}")
    if _field(payload, "Nodes") is not None:
        raise BadInput(NODE_OBJECTS.format(what="ExtenderArgs carries Node objects (Nodes)"))
    names_field = _field(payload, "NodeNames")
    if names_field is None:
        raise BadInput("ExtenderArgs carries no NodeNames")
    if not isinstance(names_field, list):
        raise BadInput(f"ExtenderArgs.NodeNames must be an array, not {type_name(names_field)}")
    return ExtenderArgs(pod, names_field)


def check_names_field(names: list[Any]) -> None:
    """``NodeNames`` as the protocol allows it: node names, each once; else
    :class:`BadInput` saying where."""
    check_node_names(names)
    check_distinct(names)


def check_node_names(names: list[Any]) -> None:
    """Every element of ``NodeNames`` a node name, else :class:`BadInput` saying where."""
    if not _all_node_names(names):  # the common case checked in C; else say where
        for i, name in enumerate(names):
            _node_name(name, f"ExtenderArgs.NodeNames[{i}]")


def check_distinct(names: list[Any]) -> None:
    """Each candidate is answered exactly once, so each may be asked about once;
    else :class:`BadInput` naming the first repeat."""
    try:
        distinct = len(set(names))
    except TypeError:  # an element that cannot even be hashed is no name
        check_node_names(names)
        raise
    if distinct != len(names):
        seen: set[str] = set()
        for i, name in enumerate(names):
            if name in seen:
                where = f"ExtenderArgs.NodeNames[{i}]"
                raise BadInput(f"{where} repeats the node name {clip(name, 80)}")
            seen.add(name)


def _all_node_names(names: list[Any]) -> bool:
    """Every element a string of 1..MAX_NAME characters (builtins only: at 500
    candidates a per-name Python call was an eighth of a filter call)."""
    if not names:
        return True
    if not all(map(str.__instancecheck__, names)):
        return False
    lengths = list(map(len, names))
    return min(lengths) > 0 and max(lengths) <= MAX_NAME


def _node_name(name: Any, path: str) -> str:
    if isinstance(name, str) and 0 < len(name) <= MAX_NAME:
        return name
    raise BadInput(f"{path} must be a node name of 1..{MAX_NAME} characters, not {clip(name, 80)}")


def filter_result(outcome: FilterOutcome) -> dict[str, Any]:
    """``ExtenderFilterResult``: the names that passed, and why the others failed."""
    return {
        "NodeNames": outcome.passed,
        "FailedNodes": outcome.failed,
        "FailedAndUnresolvableNodes": outcome.unresolvable,
        "Error": "",
    }


def error_result(message: str) -> dict[str, Any]:
    return {"FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}


def host_priorities(names: Sequence[str], scores: Sequence[int]) -> list[dict[str, Any]]:
    return [{"Host": name, "Score": score} for name, score in zip(names, scores, strict=True)]


#: ``","Score":N}`` for each score the engine can give (0..10), and the same followed
#: by the next entry's opening.
_SCORE_TAILS = [f'","Score":{score}}}' for score in range(11)]
_SCORE_JOINS = [tail + ',{"Host":"' for tail in _SCORE_TAILS]


def host_priorities_json(names: Sequence[str], scores: Sequence[int] | np.ndarray) -> bytes:
    """``HostPriorityList`` as JSON bytes, in the order of ``names``: byte for byte
    what orjson writes for :func:`host_priorities`.

    At 5,000 candidates, a dict per candidate for orjson cost most of a prioritize
    call (and fed the cyclic collector 5,000 objects a call). Node names need no JSON
    escaping (an API server admits only DNS subdomains), so when every name is
    printable ASCII without a quote or backslash, and every score an int in 0..10
    (the engine's), the text is joined from strings (names and score texts
    interleaved by slice assignment, no Python step per candidate); anything else
    goes through orjson. The checks are C scans (``in``, numpy over the names'
    bytes: ``bytes.translate`` was a tenth of the call), the engine's array's range
    is checked in numpy, and the text is made once: at this size each large string
    is memory the process maps afresh, and its pages' first touch is what costs.
    Through orjson's dicts instead, prioritize takes 1.10x as long at 500 candidates
    and 1.33x at 5,000 (docs/BENCHMARKS.md, "What each mechanism of the extender
    pays for")."""
    if isinstance(scores, np.ndarray):
        in_range = scores.dtype.kind in "iu" and (
            not len(scores) or (scores.min() >= 0 and scores.max() <= 10)
        )
        scores = scores.tolist()
    else:  # ints only: a bool or a float is orjson's to write
        in_range = all(type(v) is int and 0 <= v <= 10 for v in scores)
    joined = "".join(names)
    plain = joined.isascii() and '"' not in joined and "\\" not in joined
    if plain and joined:  # no control character: as uint8, c - 32 > 94 below 32 or at 127
        plain = not (np.frombuffer(joined.encode(), np.uint8) - 32 > 94).any()
    if not plain or not in_range:
        return orjson.dumps(host_priorities(names, scores))
    if not names:
        return b"[]"
    parts: list[str] = [""] * (2 * len(names))
    parts[0::2] = names
    parts[1::2] = map(_SCORE_JOINS.__getitem__, scores)
    parts[0] = '[{"Host":"' + parts[0]
    parts[-1] = _SCORE_TAILS[scores[-1]] + "]"
    return "".join(parts).encode()  # one large string and its bytes, no more


#: At most this many candidate nodes in one preemption call, and victims on one node.
MAX_PREEMPTION_NODES = 50_000
MAX_VICTIMS = 4096


def parse_preemption(payload: Any) -> tuple[dict[str, Any], dict[str, tuple[list[str], int]]]:
    """``ExtenderPreemptionArgs``: the Pod, and per node the victims' UIDs and the
    PodDisruptionBudget violations kube-scheduler counted, from
    ``NodeNameToMetaVictims`` (``{"Pods": [{"UID": ...}], "NumPDBViolations": N}``).
    Victims as Pod objects (``NodeNameToVictims``: ``nodeCacheCapable: false``,
    :data:`NODE_OBJECTS`) and anything else are :class:`BadInput`."""
    if not isinstance(payload, dict):
        raise BadInput(f"ExtenderPreemptionArgs must be a JSON object, not {type_name(payload)}")
    pod = _field(payload, "Pod")
    if not isinstance(pod, dict):
        raise BadInput(f"ExtenderPreemptionArgs.Pod must be an object, not {type_name(pod)}")
    key = "NodeNameToMetaVictims"
    nodes = _field(payload, key)
    if nodes is None and _field(payload, "NodeNameToVictims") is not None:
        what = "ExtenderPreemptionArgs carries its victims as Pod objects (NodeNameToVictims)"
        raise BadInput(NODE_OBJECTS.format(what=what))
    nodes = {} if nodes is None else nodes
    if not isinstance(nodes, dict):
        raise BadInput(f"ExtenderPreemptionArgs.{key} must be an object, not {type_name(nodes)}")
    if len(nodes) > MAX_PREEMPTION_NODES:
        raise BadInput(f"ExtenderPreemptionArgs.{key} names {len(nodes)} nodes")
    out: dict[str, tuple[list[str], int]] = {}
    for name, victims in nodes.items():
        where = f"ExtenderPreemptionArgs.{key}[{clip(name, 80)}]"
        _node_name(name, f"a node name in ExtenderPreemptionArgs.{key}")
        if victims is None:
            out[name] = ([], 0)
            continue
        if not isinstance(victims, dict):
            raise BadInput(f"{where} must be an object, not {type_name(victims)}")
        pods = _field(victims, "Pods")
        pods = [] if pods is None else pods
        if not isinstance(pods, list) or len(pods) > MAX_VICTIMS:
            raise BadInput(f"{where}.Pods must be an array of at most {MAX_VICTIMS} pods")
        pdb = _field(victims, "NumPDBViolations")
        pdb = 0 if pdb is None else pdb
        if type(pdb) is not int or not 0 <= pdb <= 1 << 31:
            raise BadInput(f"{where}.NumPDBViolations must be a count, not {clip(pdb, 40)}")
        out[name] = ([_victim_uid(p, f"{where}.Pods[{i}]") for i, p in enumerate(pods)], pdb)
    return pod, out


def _victim_uid(entry: Any, where: str) -> str:
    uid = _field(entry, "UID") if isinstance(entry, dict) else None
    if not isinstance(uid, str) or not 0 < len(uid) <= 128:
        raise BadInput(f"{where} must carry a pod UID, not {clip(entry, 80)}")
    return uid


def preemption_result(kept: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, Any]:
    """``ExtenderPreemptionResult``: the nodes kept, each with its victims by UID (the
    answer is always by UID; kube-scheduler finds the pods on the node)."""
    return {
        "NodeNameToMetaVictims": {
            name: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
            for name, (uids, pdb) in kept.items()
        }
    }


def pod_priority(pod: Mapping[str, Any]) -> int:
    """The Pod's ``spec.priority`` (podspec.pod_priority; 0 for a spec it cannot read)."""
    spec = pod.get("spec")
    return podspec.pod_priority(spec) if isinstance(spec, Mapping) else 0


def nominated_node(pod: Mapping[str, Any]) -> str | None:
    """The node kube-scheduler nominated a pod for (``status.nominatedNodeName``: it
    preempted there and waits for the victims to go), if the Pod says one."""
    status = pod.get("status")
    node = status.get("nominatedNodeName") if isinstance(status, dict) else None
    return node if isinstance(node, str) and 0 < len(node) <= MAX_NAME else None
