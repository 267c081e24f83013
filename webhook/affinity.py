"""A pod's hard GPU constraints as required node affinity, merged into its own.

``gpu-products``, ``min-gpu-memory`` and ``spot: require|forbid`` are read by our
extender only; autoscalers (Cluster Autoscaler, Karpenter, GKE's node auto-
provisioning) and other schedulers run kube-scheduler's own filters and never see
them. Written as ``requiredDuringSchedulingIgnoredDuringExecution`` they refuse the
same nodes everywhere. Pure functions: annotations + the pod's affinity + the label
map -> the new ``nodeSelectorTerms``.

Semantics follow kube-scheduler's NodeAffinity filter
(``k8s.io/component-helpers/scheduling/corev1/nodeaffinity/nodeaffinity.go``, with
``k8s.io/apimachinery/pkg/labels/selector.go`` ``Requirement.Matches``): terms are
OR-ed, a term's expressions AND-ed, a term with no expressions and no fields matches
nothing; ``NotIn`` matches a node without the label; ``Gt`` needs the label and an
integer value (Go's ``strconv.ParseInt``).

Each constraint is a list of alternatives (OR), each a list of expressions (AND):

* ``gpu-products`` -> ``<product label> In [values]`` (GFD: each model and its
  ``-SHARED`` name, since the extender counts a shared GPU as its model);
* ``min-gpu-memory`` -> ``<memory label> Gt MiB-1`` (GFD: or, where that label is
  absent, the legacy one; GKE has no memory label, so the accelerators with enough
  memory are listed instead);
* ``spot: forbid`` -> ``NotIn`` on every cloud's spot label; ``spot: require`` -> one
  alternative per cloud's spot label.

``gpu-products`` and ``min-gpu-memory`` have one more alternative unless the
configuration says ``unlabelledNodes: refuse``: a node that carries none of the label
map's GPU labels (``DoesNotExist`` on the product label and on every memory label),
left to the scheduler's GPU rule. Such a node is a DRA node (its GPUs are devices of
ResourceSlices, judged by the extender and the plugins from their attributes) or a
node without GPUs (kube-scheduler's own filters refuse it a GPU pod); a node with any
of the labels must match them. Spot labels are not GPU labels: the spot constraints
have no such alternative.

Merging keeps the user's terms: every constraint a term does not already carry is
AND-ed into it, one term per alternative (the cross product, since the terms are
OR-ed). A term that already carries an alternative of a constraint is left as is,
so mutating the mutated pod changes nothing. An empty term matches nothing and stays
so. A term the cross product makes self-contradictory (``DoesNotExist`` beside an
expression that needs the same label: the unlabelled alternative of one constraint
with a labelled one of another) matches no node and is left out, unless all of a
term's are; an expression the term already has is not repeated. Beyond
:data:`MAX_TERMS` terms the pod is refused with what to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gpu_scheduler import contract
from gpu_scheduler.constraints import HardConstraints
from gpu_scheduler.fields import FieldError, expect_object, list_at, object_at, string_at

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
#: The most nodeSelectorTerms a mutated pod may carry. The product of the pod's own
#: terms and the constraints' alternatives (5 for ``spot: require``; 3 for
#: ``min-gpu-memory`` with GFD's legacy label and unlabelled nodes, 3 as well with
#: ``gpu-products`` beside it, whose unlabelled alternative it shares) stays far below
#: what the API server or kube-scheduler would mind; beyond it the pod is refused,
#: never half-written.
MAX_TERMS = 64
#: The operators that need the label on the node (``NotIn`` matches a node without it).
_NEEDS_LABEL = frozenset({"In", "Exists", "Gt", "Lt"})

Expr = dict[str, Any]
Alternative = tuple[Expr, ...]


@dataclass(frozen=True, eq=False)  # hashed by identity: one per configuration
class LabelMap:
    """Where a platform keeps a GPU's model and memory on its nodes.

    ``product_values``: GFD product name -> the platform's label values; None means
    the label holds GFD's names (with ``-SHARED`` variants). ``memory_keys``: the
    memory label (MiB per GPU), then a fallback read only where it is absent.
    ``memory_by_value``: where no memory label exists, MiB per GPU of each product
    label value (the accelerators with enough memory are listed instead).
    """

    platform: str
    product_key: str
    product_values: Mapping[str, tuple[str, ...]] | None = None
    memory_keys: tuple[str, ...] = ()
    memory_by_value: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Constraint:
    name: str  # as the user wrote it, for messages
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True)
class Merged:
    terms: list[dict[str, Any]] | None  # the new nodeSelectorTerms; None: no change
    written: tuple[str, ...] = ()  # constraint names written
    refused: str | None = None


def _expr(key: str, operator: str, values: Sequence[str] = ()) -> Expr:
    out: Expr = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


@lru_cache(maxsize=1024)
def constraints(
    hard: HardConstraints, labels: LabelMap, unlabelled: bool = True
) -> tuple[tuple[Constraint, ...], tuple[str, ...]]:
    """The constraints a pod's annotations ask for, and why any could not be written
    (cached: pods of one workload ask the same; the results are never changed).
    ``unlabelled``: a node without the map's GPU labels passes the GPU constraints
    (left to the scheduler's GPU rule); False: only labelled nodes do."""
    bare: tuple[Alternative, ...] = (_unlabelled(labels),) if unlabelled else ()
    out: list[Constraint] = []
    skipped: list[str] = []
    products = _product_values(hard.products, labels) if hard.products else None
    if hard.products and products is None:
        skipped.append(
            f"{contract.ANN_GPU_PRODUCTS}: no {labels.product_key} value is known for "
            f"{', '.join(sorted(p for p in hard.products if not _known(p, labels)))} "
            "(webhook config nodeAffinity.productValues)"
        )
    memory = hard.min_memory_mib
    if memory is not None and not labels.memory_keys:
        # No memory label: the product values whose GPUs have enough memory.
        enough = {v for v, mib in labels.memory_by_value.items() if mib >= memory}
        products = enough if products is None else products & enough
        memory = None
        if not products:
            skipped.append(f"{contract.ANN_MIN_GPU_MEMORY}: no {labels.product_key} value known")
            products = None
    if products is not None:
        name = contract.ANN_GPU_PRODUCTS if hard.products else contract.ANN_MIN_GPU_MEMORY
        product = (_expr(labels.product_key, "In", sorted(products)),)
        out.append(Constraint(name, (product, *bare)))
    if memory is not None:
        threshold = [str(memory - 1)]
        first, *fallbacks = labels.memory_keys
        alternatives = [(_expr(first, "Gt", threshold),)]
        absent = [_expr(first, "DoesNotExist")]
        for key in fallbacks:
            alternatives.append((*absent, _expr(key, "Gt", threshold)))
            absent.append(_expr(key, "DoesNotExist"))
        out.append(Constraint(contract.ANN_MIN_GPU_MEMORY, (*alternatives, *bare)))
    if hard.spot_rule == "forbid":
        spot = tuple(_expr(key, "NotIn", [value]) for key, value in contract.SPOT_LABELS)
        out.append(Constraint(f"{contract.ANN_SPOT}=forbid", (spot,)))
    elif hard.spot_rule == "require":
        spot_terms = tuple((_expr(key, "In", [value]),) for key, value in contract.SPOT_LABELS)
        out.append(Constraint(f"{contract.ANN_SPOT}=require", spot_terms))
    return tuple(out), tuple(skipped)


def _unlabelled(labels: LabelMap) -> Alternative:
    """A node with none of the map's GPU labels: no product label, no memory label."""
    return tuple(_expr(key, "DoesNotExist") for key in (labels.product_key, *labels.memory_keys))


def _known(product: str, labels: LabelMap) -> bool:
    return labels.product_values is None or product in labels.product_values


def _product_values(products: frozenset[str], labels: LabelMap) -> set[str] | None:
    """The label values that mean one of ``products`` (GFD base names), or None when a
    product has no value on this platform (writing the others would refuse its nodes)."""
    values: set[str] = set()
    for product in products:
        if labels.product_values is None:
            values.add(product)
            shared = product + contract.SHARED_SUFFIX
            if contract.is_label_value(shared):
                values.add(shared)
        elif product in labels.product_values:
            values.update(labels.product_values[product])
        else:
            return None
    # A value no node label can hold matches no node either; the API server refuses
    # a pod whose In list carries one.
    values = {v for v in values if contract.is_label_value(v)}
    return values or None


def merge(spec: Mapping[str, Any], wanted: Sequence[Constraint]) -> Merged:
    """The pod's nodeSelectorTerms with ``wanted`` AND-ed in (see the module doc).
    Raises :class:`FieldError` for a field of the wrong type."""
    affinity = object_at(spec, "affinity", "spec.affinity")
    node = object_at(affinity, "nodeAffinity", "spec.affinity.nodeAffinity")
    where = f"spec.affinity.nodeAffinity.{REQUIRED}"
    required = node.get(REQUIRED)
    own: list[dict[str, Any]] | None = None
    if required is not None:
        required = expect_object(required, where)
        listed = list_at(required, "nodeSelectorTerms", f"{where}.nodeSelectorTerms")
        own = [_checked_term(t, f"{where}.nodeSelectorTerms[{i}]") for i, t in enumerate(listed)]
    if not own:  # none of its own (an empty list is invalid in the API): ours alone
        return _ours_alone(wanted)
    out: list[dict[str, Any]] = []
    written: set[str] = set()
    for term in own:
        if not term.get("matchExpressions") and not term.get("matchFields"):
            out.append(term)  # matches nothing, and must keep matching nothing
            continue
        expanded = [term]
        have = {_key(e) for e in term.get("matchExpressions") or ()}
        for constraint in wanted:
            if any(all(_key(e) in have for e in alt) for alt in constraint.alternatives):
                continue
            written.add(constraint.name)
            expanded = _expand(expanded, constraint.alternatives)
            if len(out) + len(expanded) > MAX_TERMS:  # stop early: the work stays bounded
                return Merged(None, refused=_too_many(own, wanted))
        out.extend(expanded)
    if not written:
        return Merged(None)
    if len(out) > MAX_TERMS:
        return Merged(None, refused=_too_many(own, wanted))
    return Merged(out, tuple(sorted(written)))


def _ours_alone(wanted: Sequence[Constraint]) -> Merged:
    if not wanted:
        return Merged(None)
    terms = _product(wanted)
    if len(terms) > MAX_TERMS:
        return Merged(None, refused=_too_many(None, wanted))
    return Merged(terms, tuple(sorted({c.name for c in wanted})))


def _product(wanted: Sequence[Constraint]) -> list[dict[str, Any]]:
    """The constraints' own terms: the cross product of their alternatives, less the
    self-contradictory ones. Its size is fixed by the label map (at most 3 x 5)."""
    terms: list[dict[str, Any]] = [{}]
    for constraint in wanted:
        terms = _expand(terms, constraint.alternatives)
    return terms


def _expand(
    terms: Sequence[Mapping[str, Any]], alternatives: Sequence[Alternative]
) -> list[dict[str, Any]]:
    """Each term AND-ed with each alternative, in order; the results no node can match
    are left out unless all of a term's are (then its first stays: it matched no node
    with this constraint before either, and a pod must keep a term)."""
    out: list[dict[str, Any]] = []
    for term in terms:
        grown = [_with(term, alt) for alt in alternatives]
        live = [t for t in grown if not _contradictory(t["matchExpressions"])]
        out.extend(live or grown[:1])
    return out


def _contradictory(exprs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the expressions, AND-ed, match no node: a key both ``DoesNotExist`` and
    needed (``In``, ``Exists``, ``Gt``, ``Lt``)."""
    absent = {e.get("key") for e in exprs if e.get("operator") == "DoesNotExist"}
    return bool(absent) and any(
        e.get("operator") in _NEEDS_LABEL and e.get("key") in absent for e in exprs
    )


def _too_many(own: list[dict[str, Any]] | None, wanted: Sequence[Constraint]) -> str:
    # The annotations without their prefix: the message must fit the warning's limit.
    several = [c.name.removeprefix(contract.PREFIX) for c in wanted if len(c.alternatives) > 1]
    ours = f"{len(_product(wanted))} ({', '.join(several)})" if several else "1"
    require = f"{contract.ANN_SPOT.removeprefix(contract.PREFIX)}=require" in several
    advice = f", or {contract.ANN_SPOT}: prefer instead of require" if require else ""
    return (
        f"the pod's required node affinity would need more than {MAX_TERMS} "
        f"nodeSelectorTerms: its own {len(own or ())} x {ours}. Use fewer "
        f"nodeSelectorTerms{advice}"
    )


def _with(term: Mapping[str, Any], alternative: Alternative) -> dict[str, Any]:
    """``term`` with ``alternative`` AND-ed in, but for the expressions it already has;
    the expressions are copies (the cached constraints are shared by every request)."""
    out = dict(term)
    have = [*(term.get("matchExpressions") or ())]
    seen = {_key(e) for e in have}
    ours = [
        {**e, "values": list(e["values"])} if "values" in e else dict(e)
        for e in alternative
        if _key(e) not in seen
    ]
    out["matchExpressions"] = [*have, *ours]
    return out


def _key(expr: Mapping[str, Any]) -> tuple[Any, ...]:
    return expr.get("key"), expr.get("operator"), tuple(expr.get("values") or ())


def _checked_term(value: Any, path: str) -> dict[str, Any]:
    term = expect_object(value, path)
    for part in ("matchExpressions", "matchFields"):
        for i, expr in enumerate(list_at(term, part, f"{path}.{part}")):
            where = f"{path}.{part}[{i}]"
            expr = expect_object(expr, where)
            string_at(expr, "key", f"{where}.key")
            string_at(expr, "operator", f"{where}.operator")
            for j, v in enumerate(list_at(expr, "values", f"{where}.values")):
                if not isinstance(v, str):
                    raise FieldError(f"{where}.values[{j}]", "must be a string")
    return dict(term)


def patch_ops(spec: Mapping[str, Any], terms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON patch operations that set the required node affinity to ``terms`` and
    always apply: each missing (or ``null``) parent is added whole."""
    required = {"nodeSelectorTerms": terms}
    affinity = spec.get("affinity")
    if affinity is None:
        op = "replace" if "affinity" in spec else "add"
        value = {"nodeAffinity": {REQUIRED: required}}
        return [{"op": op, "path": "/spec/affinity", "value": value}]
    node = affinity.get("nodeAffinity")
    if node is None:
        op = "replace" if "nodeAffinity" in affinity else "add"
        return [{"op": op, "path": "/spec/affinity/nodeAffinity", "value": {REQUIRED: required}}]
    op = "replace" if REQUIRED in node else "add"
    return [{"op": op, "path": f"/spec/affinity/nodeAffinity/{REQUIRED}", "value": required}]
