"""extender.columns: the cache's rows per node, the snapshot a view holds, and one
call's candidates gathered from it."""

from __future__ import annotations

import numpy as np

from extender.columns import (
    ALLOC,
    FREE,
    MODEL,
    OK,
    SPOT,
    ZONE,
    Candidates,
    NodeTable,
    free_state,
)
from extender.model import NodeFacts
from tests.factories import make_node


def facts(name, gpus=8, product="H100", spot=False, zone="z1", error=None):
    return NodeFacts(
        name,
        gpus,
        labelled_gpu=True,
        product=product,
        capacity_type="spot" if spot else None,
        zone=zone,
        cpu_milli=64000,
        ram_mib=1 << 19,
        error=error,
    )


def put(table, node, used=0):
    table.put(node.name, node, free_state(node, used, 0, 0))


def test_rows_follow_puts_removals_and_growth_and_a_snapshot_stays_as_it_was():
    table = NodeTable(capacity=2)
    nodes = [facts(f"n{i}", spot=i % 2 == 0, zone=f"z{i % 3}") for i in range(7)]
    for node in nodes:  # past the initial capacity: the arrays grow
        put(table, node)
    before = table.snapshot()
    put(table, nodes[3], used=5)
    table.put("n4", None, None)
    put(table, facts("n7", 4, product="L4"))  # reuses n4's slot
    after = table.snapshot()
    assert len(table) == 7 and before.slots.keys() != after.slots.keys()
    old = Candidates.from_view(["n3", "n4"], before, {})
    assert old.cols[FREE].tolist() == [8, 8] and old.where is None
    new = Candidates.from_view(["n3", "n4", "n7", "n0"], after, {"n4": None})
    assert new.cols[FREE].tolist() == [3, 4, 8] and new.where.tolist() == [0, 2, 3]
    assert new.cols[ALLOC].tolist() == [8, 4, 8]
    assert [new.models.values[c] for c in new.cols[MODEL]] == ["H100", "L4", "H100"]
    assert new.cols[SPOT].tolist() == [0, 0, 1]
    assert [new.zones.values[c] for c in new.cols[ZONE]] == ["z0", "z1", "z0"]
    assert new.unknown() == 1 and new.at(1) is None


def test_an_unreadable_node_is_not_known_and_says_why():
    table = NodeTable()
    bad = facts("bad", error="the Node object is malformed: x")
    put(table, bad)
    put(table, facts("good"))
    got = Candidates.from_view(["bad", "good"], table.snapshot(), {"bad": bad})
    assert got.known == 1 and got.cols[OK].tolist() == [1]
    assert got.at(0).error.startswith("the Node object is malformed")
    assert got.unknown() == 0  # known to the view, only unreadable


def test_a_lookup_gives_each_names_slot_and_whether_they_are_known_and_distinct():
    table = NodeTable()
    for name in ("a", "b", "c"):
        put(table, facts(name))
    snap = table.snapshot()
    first, distinct = snap.lookup(["c", "a", "x"])
    assert first.tolist() == [snap.slots["c"], snap.slots["a"], 0]
    assert not distinct  # "x" is not known: the caller checks the names itself
    slots, distinct = snap.lookup(["a", "c"])
    assert slots.tolist() == [snap.slots["a"], snap.slots["c"]] and distinct
    assert snap.lookup(["a", "c", "a"])[1] is False  # a known name twice
    assert snap.lookup(["b"])[1] is True and snap.lookup([])[1] is True


def test_candidates_from_facts_are_the_same_rows():
    nodes = [facts("a", spot=True), None, facts("b", 2, product=None, zone=None)]
    got = Candidates.from_facts(["a", "gone", "b"], nodes, {}, {"a": 3})
    assert got.where.tolist() == [0, 2] and got.count == 3
    assert got.cols[FREE].tolist() == [5, 2] and got.cols[SPOT].tolist() == [1, 0]
    assert got.cols[MODEL].tolist()[1] == 0 and got.cols[ZONE].tolist()[1] == 0
    assert np.isnan(got.beats).all()
    assert got.facts(1).name == "b" and got.at(1) is None


def test_values_many_nodes_share_are_kept_once():
    """A zone's topology domains, an instance type's CPU and memory and an idle node's
    free state are one object across nodes (the cache's bytes a node), and the canon
    stops keeping new values at its limit."""
    from extender import model
    from extender.columns import free_state
    from extender.model import node_facts

    a, b = (node_facts(make_node(n, 8, zone="z1", cpu="192", memory="2Ti")) for n in ("a", "b"))
    assert a.domains is b.domains and a.cpu_milli is b.cpu_milli and a.ram_mib is b.ram_mib
    assert free_state(a, 0, 0, 0) is free_state(b, 0, 0, 0)
    assert free_state(a, 1, 0, 0) == (7, a.cpu_milli, a.ram_mib, a.model)
    saved = dict(model._CANON)
    try:
        model._CANON.clear()
        model._CANON.update({i: i for i in range(model.CANON_LIMIT)})
        fresh = (1 << 50) + 3
        assert model.canon(fresh) == fresh and fresh not in model._CANON
    finally:
        model._CANON.clear()
        model._CANON.update(saved)
