"""The extender's YAML configuration: policy weights and limits.

```yaml
weights: {gpu: 5, spot: 5, group: 15, scarcity: 15, fragmentation: 8}  # each >= 1/10 of sum
disabled: []                          # policy names to switch off (e.g. [heartbeat])
defaultPlacement: binpack             # or spread; pods override with an annotation
heartbeatWindow: 15m                  # agent silent longer -> no new GPU pods; 0 = off
maxBodyBytes: 134217728               # request body limit
filterChooses: true                   # filter answers the one node it ranks first
                                      # (extender/choice.py); false: every node that fits
groupLevels:                          # topology labels a placement group is packed
  - nvidia.com/gpu.clique             # along, the tightest first (the default list:
  - topology.kubernetes.io/zone       # gpu_scheduler.contract.TOPOLOGY_LEVELS)
```

``zone``, the ``group`` policy's name before it packed along more levels than the
zone, is still read in ``weights`` and ``disabled`` as ``group``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.model import PLACEMENTS
from extender.policies import REGISTRY
from gpu_scheduler import contract
from gpu_scheduler.configfile import checked_mapping, load_yaml_file
from gpu_scheduler.durations import parse_duration
from gpu_scheduler.fields import is_integer

KNOWN_POLICIES = tuple(REGISTRY)
SCORING_POLICIES = tuple(name for name, entry in REGISTRY.items() if entry.weight is not None)
DEFAULT_WEIGHTS = {n: e.weight for n, e in REGISTRY.items() if e.weight is not None}
MIN_BODY_BYTES = 64 << 20
#: Old policy names still read as their new ones.
RENAMED = {"zone": "group"}
MAX_LEVELS = 16


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ExtenderConfig:
    weights: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    disabled: frozenset[str] = frozenset()
    default_placement: str = "binpack"
    heartbeat_window_seconds: float = 900.0
    max_body_bytes: int = 128 << 20
    group_levels: tuple[str, ...] = contract.TOPOLOGY_LEVELS
    filter_chooses: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(SCORING_POLICIES)
        if unknown:
            raise ConfigError(f"weights: unknown policies {sorted(unknown)}")
        bad = set(self.disabled) - set(KNOWN_POLICIES)
        if bad:
            raise ConfigError(f"disabled: unknown policies {sorted(bad)}")
        for name, weight in self.weights.items():
            if not is_integer(weight) or weight < 0:
                raise ConfigError(f"weights.{name} must be a non-negative integer")
        active = {n: w for n, w in self.weights.items() if w > 0 and n not in self.disabled}
        total = sum(active.values())
        for name, weight in active.items():
            # One policy alone moving a node from 0 to 10 must move the integer score
            # by at least one, or its preference could vanish in the rounding.
            if weight * 10 < total:
                raise ConfigError(
                    f"weights.{name}={weight} is under a tenth of the total ({total}): "
                    "it could never change an integer score 0..10"
                )
        if self.default_placement not in PLACEMENTS:
            raise ConfigError(f"defaultPlacement must be one of {PLACEMENTS}")
        if self.max_body_bytes < MIN_BODY_BYTES:
            raise ConfigError(f"maxBodyBytes must be at least {MIN_BODY_BYTES}")
        levels = self.group_levels
        if not isinstance(levels, tuple) or not 0 < len(levels) <= MAX_LEVELS:
            raise ConfigError(f"groupLevels must list 1..{MAX_LEVELS} node label keys")
        for key in levels:
            if not isinstance(key, str) or not contract.is_label_key(key):
                raise ConfigError(f"groupLevels: {key!r} is not a node label key")
        if len(set(levels)) != len(levels):
            raise ConfigError("groupLevels: a label key is listed twice")
        if not isinstance(self.filter_chooses, bool):
            raise ConfigError("filterChooses must be true or false")

    def weight(self, policy: str) -> int:
        return 0 if policy in self.disabled else int(self.weights.get(policy, 0))


_KEYS = {
    "weights",
    "disabled",
    "defaultPlacement",
    "heartbeatWindow",
    "maxBodyBytes",
    "groupLevels",
    "filterChooses",
}


def config_from_mapping(data: Mapping[str, Any] | None) -> ExtenderConfig:
    data = checked_mapping(data, _KEYS, ConfigError)
    kwargs: dict[str, Any] = {}
    if "weights" in data:
        weights = dict(DEFAULT_WEIGHTS)
        given = data["weights"] or {}
        if not isinstance(given, dict):
            raise ConfigError("weights must be a mapping of policy name to weight")
        weights.update({RENAMED.get(k, k): v for k, v in given.items()})
        kwargs["weights"] = weights
    if "disabled" in data:
        disabled = data["disabled"] or []
        if not isinstance(disabled, list):
            raise ConfigError("disabled must be a list of policy names")
        kwargs["disabled"] = frozenset(RENAMED.get(n, n) for n in disabled)
    if "defaultPlacement" in data:
        kwargs["default_placement"] = data["defaultPlacement"]
    if "heartbeatWindow" in data:
        try:
            kwargs["heartbeat_window_seconds"] = parse_duration(data["heartbeatWindow"])
        except ValueError as exc:
            raise ConfigError(f"heartbeatWindow: {exc}") from exc
    if "maxBodyBytes" in data:
        kwargs["max_body_bytes"] = int(data["maxBodyBytes"])
    if "groupLevels" in data:
        levels = data["groupLevels"]
        if not isinstance(levels, list):
            raise ConfigError("groupLevels must be a list of node label keys")
        kwargs["group_levels"] = tuple(levels)
    if "filterChooses" in data:
        kwargs["filter_chooses"] = data["filterChooses"]
    return ExtenderConfig(**kwargs)


def load_config(path: str | None) -> ExtenderConfig:
    if not path:
        return ExtenderConfig()
    return load_yaml_file(path, config_from_mapping, ConfigError)
