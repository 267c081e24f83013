"""The throughput bench's scheduler configs: each variant differs from deploy/'s only
where it says (the extender, its verbs, the client rate limit)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.e2e_throughput import binding_times, variant_config

OURS, BARE, BASE = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"
URLS = {"bare": BARE, "bare-first": BARE, "ours-base": BASE}


def test_each_variant_changes_only_its_part():
    ours = variant_config("ours", OURS, URLS, 2000)
    (extender,) = ours["extenders"]
    assert extender["urlPrefix"] == OURS
    assert extender["filterVerb"] == "filter" and extender["prioritizeVerb"] == "prioritize"
    assert ours["clientConnection"] == {"qps": 2000, "burst": 2000}
    assert ours["profiles"][0]["schedulerName"] == "bench-ours"

    (bare,) = variant_config("bare", OURS, URLS, 2000)["extenders"]
    assert bare["urlPrefix"] == BARE and bare["filterVerb"] == "filter"

    # the floor of a filter that picks: the bare extender's first-candidate filter
    (first,) = variant_config("bare-first", OURS, URLS, 2000)["extenders"]
    assert first["urlPrefix"] == BARE and first["filterVerb"] == "filter-first"
    assert first["prioritizeVerb"] == "prioritize"

    # another tree's extender, with deploy/'s profile as ours has it
    (base,) = variant_config("ours-base", OURS, URLS, 2000)["extenders"]
    assert base["urlPrefix"] == BASE and base["filterVerb"] == "filter"

    (prio,) = variant_config("ours-prio", OURS, URLS, 2000)["extenders"]
    assert "filterVerb" not in prio and prio["prioritizeVerb"] == "prioritize"

    without = variant_config("without", OURS, URLS, 2000)
    assert "extenders" not in without
    assert without["profiles"][0]["pluginConfig"] == ours["profiles"][0]["pluginConfig"]

    # our binary with the profile of without: the binary's own cost
    none = variant_config("plugins-none", OURS, URLS, 2000)
    assert "extenders" not in none
    assert none["profiles"][0]["pluginConfig"] == without["profiles"][0]["pluginConfig"]
    assert none["profiles"][0].get("plugins") == without["profiles"][0].get("plugins")

    # the plugins path's profile, for this build and for another (plugins-base)
    for variant in ("plugins", "plugins-base"):
        cfg = variant_config(variant, OURS, URLS, 2000)
        assert "extenders" not in cfg
        enabled = [p["name"] for p in cfg["profiles"][0]["plugins"]["multiPoint"]["enabled"]]
        assert (
            "GPUScheduler" in enabled and cfg["profiles"][0]["schedulerName"] == f"bench-{variant}"
        )

    # 0: deploy/'s own limit
    assert variant_config("ours", OURS, URLS, 0)["clientConnection"] == {"qps": 300, "burst": 600}


def test_binding_times_come_from_kube_schedulers_own_log():
    log = "\n".join(
        [
            'I1201 18:53:23.780232   25062 schedule_one.go:483] "Successfully bound pod to '
            'node" pod="default/a" node="n-1" evaluatedNodes=1 feasibleNodes=1',
            'E1201 18:53:23.900000   25062 something else "Successfully bound pod to node"',
            'I1201 18:53:24.280232   25062 schedule_one.go:483] "Successfully bound pod to '
            'node" pod="default/b" node="n-2" evaluatedNodes=1 feasibleNodes=1',
            "I1201 18:53:25.000000   25062 other.go:1] unrelated",
        ]
    )
    times = binding_times(log)
    assert len(times) == 2
    assert abs(times[1] - times[0] - 0.5) < 1e-6
    assert abs(times[0] - (18 * 3600 + 53 * 60 + 23.780232)) < 1e-6


def test_the_prepared_answer_counters_are_read_by_outcome():
    from tests.bench.e2e_throughput import prepared_in

    text = (
        "# HELP gpu_scheduler_extender_prepared_answers_total ...\n"
        'gpu_scheduler_extender_prepared_answers_total{outcome="used"} 414.0\n'
        'gpu_scheduler_extender_prepared_answers_total{outcome="used-older-view"} 586.0\n'
        'gpu_scheduler_extender_prepared_answers_created{outcome="used"} 1.7e+09\n'
    )
    assert prepared_in(text) == {"used": 414.0, "used-older-view": 586.0}
    # an extender without prepared answers: nothing to report
    other = 'gpu_scheduler_extender_requests_total{verb="filter",code="200"} 3.0\n'
    assert prepared_in(other) == {} and prepared_in("") == {}


def test_the_handlers_own_timings_are_read_from_the_extenders_log(tmp_path):
    from tests.bench.e2e_throughput import handler_line, handler_timings

    lines = [
        '{"ts":"t","level":"info","logger":"extender","msg":"filter","ms":0.3}',
        '{"ts":"t","level":"info","logger":"extender","msg":"filter","ms":0.5}',
        '{"ts":"t","level":"info","logger":"extender","msg":"filter","ms":0.7}',
        '{"msg":"prioritize","ms":0.1,"prepared":true,"prepared_after_ms":2.0,'
        '"prepared_wait_ms":0.0,"prepared_ms":0.4}',
        '{"msg":"prioritize","ms":0.9,"prepared":false}',
        '{"msg":"bad extender call","ms":9}',
        "not json",
        '{"msg":"filter","ms":"x"}',
    ]
    timings = handler_timings(lines)
    assert timings["filter"] == {"ms": 0.5}
    # a filter that passed every candidate: its time is on prioritize's line
    carried = '{"msg":"prioritize","ms":0.2,"prepared":true,"filter_ms":0.9}'
    assert handler_timings([*lines[:3], carried, carried])["filter"] == {"ms": 0.7}
    assert timings["prioritize"] == {
        "ms": 0.5,
        "prepared_after_ms": 2.0,
        "prepared_wait_ms": 0.0,
        "prepared_ms": 0.4,
    }
    log = tmp_path / "extender.log"
    log.write_text("\n".join(lines[:3]) + "\n")
    offset = log.stat().st_size
    assert handler_line(log, offset) == ""  # nothing logged since
    with log.open("a") as f:
        f.write(lines[3] + "\n")
    assert "prioritize ms 0.100, prepared_after_ms 2.000" in handler_line(log, offset)


def test_each_round_turns_the_variants_order_so_none_always_runs_first():
    from tests.bench.e2e_throughput import round_order

    variants = ["bare", "ours", "ours-base"]
    orders = [round_order(variants, r) for r in range(4)]
    assert orders[0] == variants and orders[3] == variants
    assert [o[0] for o in orders[:3]] == variants  # each is first once in three rounds
    assert all(sorted(o) == sorted(variants) for o in orders)
    assert round_order([], 2) == []


def test_base_trees_name_their_variants():
    from tests.bench.e2e_throughput import base_trees

    assert base_trees(["/tmp/a", "noprep=/tmp/b", "x=/tmp/c=d"]) == {
        "ours-base": Path("/tmp/a"),
        "ours-noprep": Path("/tmp/b"),
        "ours-x": Path("/tmp/c=d"),
    }
