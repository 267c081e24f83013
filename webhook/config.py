"""The webhook's YAML configuration.

```yaml
schedulerName: gpu-scheduler      # the profile GPU pods are sent to
extraTolerations:                 # added to every GPU pod, beside the nvidia.com/gpu one
  - {key: example.com/gpu-pool, operator: Exists, effect: NoSchedule}
maxBodyBytes: 8388608             # request body limit
nodeAffinity:                     # hard GPU constraints as required node affinity
  enabled: true                   # false: annotations only (the extender alone enforces)
  platform: gfd                   # gfd | gke | karpenter-aws: where nodes say their GPU
  productValues: {}               # gke/karpenter-aws: GFD product -> [label values]
  unlabelledNodes: allow          # allow | refuse: a node without the map's GPU labels
```

``nodeAffinity.unlabelledNodes``: ``allow`` (the default) lets a node that carries none
of the label map's GPU labels through the written affinity, to the scheduler's GPU
rule (a DRA node: its GPUs are judged from their ResourceSlice devices); ``refuse``
writes the strict form, which such a node never matches (only labelled nodes).

Extra tolerations are validated as the API server validates a pod's tolerations: a
toleration that the API server would refuse would make every GPU pod fail creation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpu_scheduler.configfile import checked_mapping, load_yaml_file
from gpu_scheduler.contract import (
    DEFAULT_SCHEDULER,
    DNS_SUBDOMAIN,
    GPU_TOLERATION,
    SCHEDULER_NAME,
    is_label_key,
    is_label_value,
)
from gpu_scheduler.fields import is_integer
from webhook.affinity import LabelMap
from webhook.platforms import label_map

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
OPERATORS = ("Exists", "Equal")
MIN_BODY_BYTES = 64 << 10
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_KEYS = {"schedulerName", "extraTolerations", "maxBodyBytes", "nodeAffinity"}
_AFFINITY_KEYS = {"enabled", "platform", "productValues", "unlabelledNodes"}
UNLABELLED_NODES = ("allow", "refuse")

Toleration = Mapping[str, Any]


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class WebhookConfig:
    scheduler_name: str = SCHEDULER_NAME
    extra_tolerations: tuple[Toleration, ...] = ()
    max_body_bytes: int = 8 << 20
    node_affinity: bool = True
    platform: str = "gfd"
    product_values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unlabelled_nodes: str = "allow"

    def __post_init__(self) -> None:
        name = self.scheduler_name
        if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
            raise ConfigError(f"schedulerName must be a DNS subdomain, got {name!r}")
        if name == DEFAULT_SCHEDULER:
            raise ConfigError(f"schedulerName must not be {DEFAULT_SCHEDULER!r}")
        for i, toleration in enumerate(self.extra_tolerations):
            problem = toleration_problem(toleration)
            if problem:
                raise ConfigError(f"extraTolerations[{i}]: {problem}")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < MIN_BODY_BYTES:
            raise ConfigError(f"maxBodyBytes must be an integer >= {MIN_BODY_BYTES}")
        if not isinstance(self.node_affinity, bool):
            raise ConfigError("nodeAffinity.enabled must be true or false")
        if self.unlabelled_nodes not in UNLABELLED_NODES:
            raise ConfigError(
                f"nodeAffinity.unlabelledNodes must be one of {UNLABELLED_NODES}, "
                f"got {self.unlabelled_nodes!r}"
            )
        for product, values in self.product_values.items():
            if not values or not all(isinstance(v, str) and is_label_value(v) for v in values):
                raise ConfigError(
                    f"nodeAffinity.productValues[{product!r}] must be a list of label values"
                )
        try:
            self.labels  # noqa: B018 - the platform and its values are checked here
        except ValueError as exc:
            raise ConfigError(f"nodeAffinity: {exc}") from None

    @cached_property
    def labels(self) -> LabelMap:
        """Where nodes say their GPU model and memory, for the node affinity written."""
        return label_map(self.platform, {k: tuple(v) for k, v in self.product_values.items()})

    @property
    def allow_unlabelled(self) -> bool:
        """Whether the affinity lets a node without the map's GPU labels through."""
        return self.unlabelled_nodes == "allow"

    @property
    def tolerations(self) -> tuple[Toleration, ...]:
        """Every toleration a GPU pod must carry: the GPU one first, then the extras."""
        return (GPU_TOLERATION, *self.extra_tolerations)


def toleration_problem(t: Any) -> str | None:
    """What the API server would refuse in this toleration (None when it is valid)."""
    if not isinstance(t, Mapping):
        return "must be a mapping"
    unknown = set(t) - _TOLERATION_KEYS
    if unknown:
        return f"unknown fields {sorted(unknown)}"
    key = t.get("key", "")
    operator = t.get("operator", "Equal")
    value = t.get("value", "")
    effect = t.get("effect", "")
    seconds = t.get("tolerationSeconds")
    if not isinstance(key, str) or not isinstance(value, str) or not isinstance(effect, str):
        return "key, value and effect must be strings"
    if key and not is_label_key(key):
        return f"key {key!r} is not a qualified name"
    if operator not in OPERATORS:
        return f"operator must be one of {OPERATORS}"
    if not key and operator != "Exists":
        return "an empty key needs operator Exists"
    if operator == "Exists" and value:
        return "operator Exists takes no value"
    if operator == "Equal" and not is_label_value(value):
        return f"value {value!r} is not a valid label value"
    if effect and effect not in EFFECTS:
        return f"effect must be empty or one of {EFFECTS}"
    if seconds is not None:
        if not is_integer(seconds):
            return "tolerationSeconds must be an integer"
        if effect != "NoExecute":
            return "tolerationSeconds needs effect NoExecute"
    return None


def config_from_mapping(data: Mapping[str, Any] | None) -> WebhookConfig:
    data = checked_mapping(data, _KEYS, ConfigError)
    kwargs: dict[str, Any] = {}
    if "schedulerName" in data:
        kwargs["scheduler_name"] = data["schedulerName"]
    if "extraTolerations" in data:
        extra = data["extraTolerations"] or []
        if not isinstance(extra, list):
            raise ConfigError("extraTolerations must be a list")
        kwargs["extra_tolerations"] = tuple(dict(t) if isinstance(t, Mapping) else t for t in extra)
    if "maxBodyBytes" in data:
        kwargs["max_body_bytes"] = data["maxBodyBytes"]
    if "nodeAffinity" in data:
        affinity = checked_mapping(data["nodeAffinity"], _AFFINITY_KEYS, ConfigError)
        kwargs["node_affinity"] = affinity.get("enabled", True)
        kwargs["platform"] = affinity.get("platform", "gfd")
        values = affinity.get("productValues") or {}
        if not isinstance(values, Mapping) or not all(isinstance(v, list) for v in values.values()):
            raise ConfigError("nodeAffinity.productValues must map products to lists")
        kwargs["product_values"] = {str(k): tuple(v) for k, v in values.items()}
        kwargs["unlabelled_nodes"] = affinity.get("unlabelledNodes", "allow")
    return WebhookConfig(**kwargs)


def load_config(path: str | None) -> WebhookConfig:
    if not path:
        return WebhookConfig()
    return load_yaml_file(path, config_from_mapping, ConfigError)
