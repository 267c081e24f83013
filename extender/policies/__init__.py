"""The policy registry: adding a policy is one new module and one line in REGISTRY."""

from __future__ import annotations

from collections.abc import Callable

from extender.config import ExtenderConfig
from extender.policies.base import ClusterView, Failure, Policy
from extender.policies.fragmentation import FragmentationPolicy
from extender.policies.gpu import GpuPolicy
from extender.policies.heartbeat import HeartbeatPolicy
from extender.policies.scarcity import ScarcityPolicy
from extender.policies.spot import SpotPolicy
from extender.policies.zone import ZonePolicy

REGISTRY: dict[str, Callable[[ExtenderConfig], Policy]] = {
    "gpu": lambda cfg: GpuPolicy(),
    "spot": lambda cfg: SpotPolicy(),
    "zone": lambda cfg: ZonePolicy(),
    "scarcity": lambda cfg: ScarcityPolicy(),
    "fragmentation": lambda cfg: FragmentationPolicy(),
    "heartbeat": lambda cfg: HeartbeatPolicy(cfg.heartbeat_window_seconds),
}


def build_policies(cfg: ExtenderConfig) -> list[Policy]:
    return [REGISTRY[name](cfg) for name in REGISTRY if name not in cfg.disabled]


__all__ = ["REGISTRY", "ClusterView", "Failure", "Policy", "build_policies"]
