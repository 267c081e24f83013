"""extender/layered.py: a Layered map behaves as a dict, and every snapshot stays what
the map was when it was taken, through any later writes, deletions and folds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extender import layered
from extender.layered import Layered

KEYS = st.sampled_from([f"n{i}" for i in range(12)])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers(-3, 3)),
        st.tuples(st.just("del"), KEYS, st.none()),
        st.tuples(st.just("snap"), st.none(), st.none()),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(1, 8))
def test_a_layered_map_is_a_dict_and_its_snapshots_do_not_move(ops, fold_at):
    old = layered.FOLD_AT
    layered.FOLD_AT = fold_at  # fold often: the folds are what must not leak
    try:
        live, model = Layered[str, int](), {}
        taken: list[tuple[object, dict[str, int]]] = []
        for op, key, value in ops:
            if op == "set":
                live[key] = value
                model[key] = value
            elif op == "del":
                assert (key in live) == (key in model)
                if key in model:
                    del live[key]
                    del model[key]
            else:
                taken.append((live.snapshot(), dict(model)))
            assert len(live) == len(model)
        assert dict(live) == model and sorted(live) == sorted(model)
        for snap, then in taken:
            assert dict(snap) == then and len(snap) == len(then)  # type: ignore[arg-type]
            for key in [f"n{i}" for i in range(12)]:
                assert snap.get(key) == then.get(key)  # type: ignore[attr-defined]
                assert (key in snap) == (key in then)  # type: ignore[operator]
    finally:
        layered.FOLD_AT = old


def test_the_cache_counts_with_it_as_with_a_dict():
    from extender.records import add_count

    counts: Layered[str, int] = Layered()
    add_count(counts, "a", 2)
    before = counts.snapshot()
    add_count(counts, "a", -2)  # back to zero: the entry goes
    add_count(counts, "b", 1)
    assert dict(counts) == {"b": 1} and dict(before) == {"a": 2}
    assert before.get("b", 0) == 0 and "a" not in counts


def test_a_snapshot_with_entries_over_it_leaves_the_snapshot_alone():
    counts: Layered[str, int] = Layered({"a": 1, "b": 2})
    snap = counts.snapshot()
    over = snap.with_entries({"b": 5, "c": 7})
    assert dict(over) == {"a": 1, "b": 5, "c": 7} and len(over) == 3
    assert dict(snap) == {"a": 1, "b": 2} and snap.with_entries({}) is snap


def test_a_snapshot_copies_the_changes_not_the_whole_map():
    counts: Layered[str, int] = Layered({f"n{i}": i for i in range(5000)})
    counts["n1"] = 99
    snap = counts.snapshot()
    assert snap._base is counts._base and snap._delta == {"n1": 99}  # type: ignore[attr-defined]
    assert snap["n1"] == 99 and snap["n2"] == 2
