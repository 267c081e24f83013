"""The filter rules node by node, in plain Python: the oracle the property tests hold
the policies' one vectorised rule (``refuse``, its codes and their words) to.

Each function answers for one node what the rule says of it: None where the pod fits,
else (reason, unresolvable). They read only :class:`NodeFacts` and the view, never the
candidates' rows, so a row the cache keeps wrongly, or a vector rule that misses a
case, shows as a difference.
"""

from __future__ import annotations

from typing import Any

from extender.model import NodeFacts
from extender.view import View
from gpu_scheduler import contract, sharing

Verdict = tuple[str, bool] | None


def gpu(state: Any, node: NodeFacts, view: View) -> Verdict:
    want = state.gpus
    if state.shares:
        if node.shared is None:
            return (
                f"node does not share its GPUs (no {contract.LABEL_GPU_SHARING} label, no "
                f"allocatable {contract.RESOURCE_GPU_MEMORY})",
                True,
            )
    elif node.allocatable == 0:
        if node.labelled_gpu:
            return (
                f"node is labelled with GPUs but advertises no allocatable "
                f"{contract.RESOURCE_GPU} yet",
                False,
            )
        return f"node has no GPUs (no allocatable {contract.RESOURCE_GPU})", True
    if state.products is not None and node.model not in state.products:
        have = node.product or f"unknown (no {contract.LABEL_GPU_PRODUCT} label)"
        return (
            f"GPU product {have} is not one of {contract.ANN_GPU_PRODUCTS}="
            f"{','.join(sorted(state.products))}",
            True,
        )
    if state.min_memory_mib is not None:
        if node.memory_mib is None:
            return (
                f"node publishes no GPU memory label ({contract.LABEL_GPU_MEMORY}); "
                f"{contract.ANN_MIN_GPU_MEMORY} needs it",
                True,
            )
        if node.memory_mib < state.min_memory_mib:
            return (
                f"GPU memory {node.memory_mib} MiB per GPU is below "
                f"{contract.ANN_MIN_GPU_MEMORY}={state.min_memory_mib} MiB",
                True,
            )
    if state.shares:
        return _shares(state, view.shared_gpus(node), want)
    if node.allocatable < want:
        return f"node has {node.allocatable} GPUs in all; pod requests {want}", True
    usable = node.usable
    if usable < want:
        return (
            f"{usable} of {node.allocatable} GPUs healthy; pod requests {want}; "
            f"unhealthy: {', '.join(node.unhealthy) or 'unknown'}",
            True,
        )
    free = view.free_gpus(node)
    if free < want:
        sick = f" ({len(node.unhealthy)} unhealthy)" if usable < node.allocatable else ""
        return f"{max(free, 0)} of {usable} GPUs free{sick}; pod requests {want}", False
    return None


def _shares(state: Any, gpus: tuple[sharing.Gpu, ...], whole: int) -> Verdict:
    if sharing.fit(gpus, state.shares, whole) is not None:
        return None
    need = max(state.shares)
    biggest = max((g.capacity for g in gpus), default=0)
    if biggest < need:
        return (
            f"no GPU here has {need} GiB (the largest has {biggest} GiB); pod asks "
            f"{contract.RESOURCE_GPU_MEMORY}={need} of one GPU",
            True,
        )
    wholly = sum(1 for g in gpus if g.whole_free)
    if whole and wholly < whole:
        return f"{wholly} GPUs wholly free (none shared); pod requests {whole}", False
    asked = "+".join(map(str, state.shares))
    best = max(gpus, key=lambda g: g.free) if gpus else None
    if best is not None and best.free >= need:
        pieces = ", ".join(str(g.free) for g in gpus[:16])
        return (
            f"the shares {asked} GiB fit no set of its GPUs, one GPU each (free: {pieces} GiB)",
            False,
        )
    piece = f"{best.free} GiB on {best.uuid}" if best is not None else "none"
    return (
        f"no single GPU has {need} GiB free: the largest free piece is {piece} "
        f"({sum(g.free for g in gpus)} GiB free on {len(gpus)} GPUs); pod asks {asked} GiB",
        False,
    )


def spot(state: str, node: NodeFacts, view: View) -> Verdict:
    is_spot = node.capacity_type == "spot"
    if state == "require" and not is_spot:
        labels = ", ".join(f"{key}={value}" for key, value in contract.SPOT_LABELS)
        return (
            f"node is not spot capacity (none of {labels}) and the pod has "
            f"{contract.ANN_SPOT}=require",
            True,
        )
    if state == "forbid" and is_spot:
        return f"node is spot capacity and the pod has {contract.ANN_SPOT}=forbid", True
    return None


def heartbeat(oldest: float, node: NodeFacts, view: View, window: float) -> Verdict:
    beat = node.heartbeat
    if beat is None or beat >= oldest:
        return None
    return (
        f"gpu-scheduler agent on this node is silent: its heartbeat Lease "
        f"{contract.LEASE_SELECTOR} was last renewed {int(view.now() - beat)}s ago (window "
        f"{int(window)}s)",
        True,
    )
