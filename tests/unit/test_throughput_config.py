"""The throughput bench's scheduler configs: each variant differs from deploy/'s only
where it says (the extender, its verbs, the client rate limit)."""

from __future__ import annotations

from tests.bench.e2e_throughput import variant_config

OURS, BARE = "http://127.0.0.1:1", "http://127.0.0.1:2"


def test_each_variant_changes_only_its_part():
    ours = variant_config("ours", OURS, BARE, 2000)
    (extender,) = ours["extenders"]
    assert extender["urlPrefix"] == OURS
    assert extender["filterVerb"] == "filter" and extender["prioritizeVerb"] == "prioritize"
    assert ours["clientConnection"] == {"qps": 2000, "burst": 2000}
    assert ours["profiles"][0]["schedulerName"] == "bench-ours"

    (bare,) = variant_config("bare", OURS, BARE, 2000)["extenders"]
    assert bare["urlPrefix"] == BARE and bare["filterVerb"] == "filter"

    (prio,) = variant_config("ours-prio", OURS, BARE, 2000)["extenders"]
    assert "filterVerb" not in prio and prio["prioritizeVerb"] == "prioritize"

    without = variant_config("without", OURS, BARE, 2000)
    assert "extenders" not in without
    assert without["profiles"][0]["pluginConfig"] == ours["profiles"][0]["pluginConfig"]

    assert "clientConnection" not in variant_config("ours", OURS, BARE, 0)
