"""The policy registry: the one place that names the policies and their default
weights. Adding a policy is one module (a :class:`Policy` subclass) and one line here;
the configuration's known names and default weights come from this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from extender.policies.base import ClusterView, Failure, Policy
from extender.policies.fragmentation import FragmentationPolicy
from extender.policies.gpu import GpuPolicy
from extender.policies.group import GroupPolicy
from extender.policies.heartbeat import HeartbeatPolicy
from extender.policies.scarcity import ScarcityPolicy
from extender.policies.spot import SpotPolicy


class PolicySettings(Protocol):
    """What building the policies reads from the extender's configuration
    (``extender.config.ExtenderConfig`` has it; the configuration imports this
    registry, so the registry names no configuration class)."""

    @property
    def disabled(self) -> frozenset[str]: ...

    @property
    def heartbeat_window_seconds(self) -> float: ...

    @property
    def group_levels(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Registration:
    make: Callable[[PolicySettings], Policy]
    #: Default weight of its score; None: it never scores (a filter only), and a weight
    #: for it in the configuration is an error.
    weight: int | None


#: Name -> how to build it and its default weight. The weights were chosen on the
#: openb trace's sample protocol (docs/BENCHMARKS.md, "Sample mode"); each must stay
#: at least a tenth of their sum (extender.config).
REGISTRY: dict[str, Registration] = {
    "gpu": Registration(lambda cfg: GpuPolicy(), 5),
    "spot": Registration(lambda cfg: SpotPolicy(), 5),
    "group": Registration(lambda cfg: GroupPolicy(cfg.group_levels), 15),
    "scarcity": Registration(lambda cfg: ScarcityPolicy(), 15),
    "fragmentation": Registration(lambda cfg: FragmentationPolicy(), 8),
    "heartbeat": Registration(lambda cfg: HeartbeatPolicy(cfg.heartbeat_window_seconds), None),
}


def build_policies(cfg: PolicySettings) -> list[Policy]:
    return [entry.make(cfg) for name, entry in REGISTRY.items() if name not in cfg.disabled]


__all__ = [
    "REGISTRY",
    "ClusterView",
    "Failure",
    "Policy",
    "PolicySettings",
    "Registration",
    "build_policies",
]
