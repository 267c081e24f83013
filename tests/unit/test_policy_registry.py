"""The registry is the one place for a policy's name and default weight: a scoring
policy cannot be registered without a weight, nor a filter-only one be given one."""

from __future__ import annotations

import pytest

from extender.config import DEFAULT_WEIGHTS, ConfigError, ExtenderConfig, config_from_mapping
from extender.policies import REGISTRY, Policy


def test_every_policy_that_scores_has_a_default_weight_and_no_other_does():
    cfg = ExtenderConfig()
    for name, entry in REGISTRY.items():
        policy = entry.make(cfg)
        assert isinstance(policy, Policy) and policy.name == name
        scores = type(policy).score_all is not Policy.score_all
        assert scores == (entry.weight is not None), name
    # The shipped weights, as README and docs/BENCHMARKS.md give them.
    assert DEFAULT_WEIGHTS == {"gpu": 5, "spot": 5, "group": 15, "scarcity": 15, "fragmentation": 8}


def test_the_default_weights_pass_the_configs_own_rule():
    assert ExtenderConfig().weights == DEFAULT_WEIGHTS
    assert config_from_mapping({}).weights == DEFAULT_WEIGHTS


def test_a_weight_for_a_filter_only_policy_is_refused():
    with pytest.raises(ConfigError, match="unknown policies"):
        config_from_mapping({"weights": {"heartbeat": 1}})
