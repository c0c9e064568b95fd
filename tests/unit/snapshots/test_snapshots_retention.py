"""retention.plan and retention.orphans: hand-checked cases and properties over random inputs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo_runtime.snapshots import retention
from echo_runtime.snapshots.retention import DataDir, Pin


def pin(version: int, reader: str = "r", ttl: int = 60, since: float = 0.0) -> Pin:
    return Pin(version=version, reader=reader, ttl_s=ttl, since=since)


@pytest.mark.parametrize(
    ("versions", "keep_last", "pins", "now", "keep", "delete", "pinned"),
    [
        ([], 3, [], 0, (), (), ()),
        ([1], 1, [], 0, (1,), (), ()),
        ([1, 2, 3, 4, 5], 2, [], 0, (4, 5), (1, 2, 3), ()),
        ([5, 1, 3, 2, 4], 2, [], 0, (4, 5), (1, 2, 3), ()),  # order does not matter
        ([1, 1, 2, 2], 1, [], 0, (2,), (1,), ()),  # duplicates count once
        ([1, 2, 3], 10, [], 0, (1, 2, 3), (), ()),  # fewer than keep_last
        ([1, 2, 3, 4, 5], 2, [pin(2)], 30, (2, 4, 5), (1, 3), (2,)),
        ([1, 2, 3, 4, 5], 2, [pin(2)], 60, (4, 5), (1, 2, 3), ()),  # expired exactly at since + ttl
        (
            [1, 2, 3, 4, 5],
            2,
            [pin(2), pin(2, "s", ttl=600)],
            100,
            (2, 4, 5),
            (1, 3),
            (2,),
        ),  # one live pin is enough
        ([1, 2, 3, 4, 5], 2, [pin(5)], 0, (4, 5), (1, 2, 3), ()),  # pinned and newest: not "pinned only"
        ([1, 2, 3], 1, [pin(9)], 0, (3,), (1, 2), ()),  # a pin on a version that is not there
        ([0, 10, 200], 1, [pin(0, since=1000)], 1001, (0, 200), (10,), (0,)),
    ],
)
def test_plan_cases(
    versions: list[int],
    keep_last: int,
    pins: list[Pin],
    now: float,
    keep: tuple[int, ...],
    delete: tuple[int, ...],
    pinned: tuple[int, ...],
) -> None:
    result = retention.plan(versions, keep_last, pins, now)
    assert (result.keep, result.delete, result.pinned) == (keep, delete, pinned)


def test_expired_pins_are_listed_for_removal() -> None:
    pins = [pin(1, "b", ttl=10), pin(1, "a", ttl=10), pin(2, "c", ttl=100), pin(7, "d", ttl=1)]
    result = retention.plan([1, 2, 3], 1, pins, now=50)
    assert [(p.version, p.reader) for p in result.expired_pins] == [(1, "a"), (1, "b"), (7, "d")]
    assert result.keep == (2, 3)


def test_keep_last_must_be_positive() -> None:
    with pytest.raises(ValueError, match="keep_last: must be ≥ 1"):
        retention.plan([1, 2], 0)


versions_st = st.lists(st.integers(min_value=0, max_value=60), max_size=30)
pins_st = st.lists(
    st.builds(
        Pin,
        version=st.integers(0, 60),
        reader=st.sampled_from("abcd"),
        ttl_s=st.integers(1, 100),
        since=st.floats(0, 100),
    ),
    max_size=10,
)


@given(versions_st, st.integers(1, 10), pins_st, st.floats(0, 300))
def test_plan_properties(versions: list[int], keep_last: int, pins: list[Pin], now: float) -> None:
    result = retention.plan(versions, keep_last, pins, now)
    present = sorted(set(versions))
    live = {p.version for p in pins if p.expires_at > now}
    # A partition of the versions present, each part sorted.
    assert sorted(result.keep + result.delete) == present
    assert not set(result.keep) & set(result.delete)
    assert list(result.keep) == sorted(result.keep) and list(result.delete) == sorted(result.delete)
    # The newest keep_last always stay (so the newest version is never removed) ...
    assert set(present[-keep_last:]) <= set(result.keep)
    # ... and so does every version with a live pin.
    assert live & set(present) <= set(result.keep)
    # Nothing else is kept.
    assert set(result.keep) <= set(present[-keep_last:]) | live
    # "Pinned" are exactly the versions kept only because of a pin.
    assert set(result.pinned) == set(result.keep) - set(present[-keep_last:])
    # Expired pins are exactly the pins that are not live.
    assert sorted(result.expired_pins, key=id) == sorted((p for p in pins if p.expires_at <= now), key=id)


def test_orphans() -> None:
    dirs = [
        DataDir(1, "data-aa", 0),
        DataDir(1, "data-bb", 0),
        DataDir(2, "data-cc", 95),
        DataDir(3, "data-dd", 0),
    ]
    owners = {1: "data-aa"}  # 2 and 3 have no manifest (a killed or an ongoing publish)
    assert retention.orphans(dirs, owners, now=100, grace_s=10) == (
        DataDir(1, "data-bb", 0),
        DataDir(3, "data-dd", 0),
    )
    assert retention.orphans(dirs, owners, now=100, grace_s=0) == (
        DataDir(1, "data-bb", 0),
        DataDir(2, "data-cc", 95),
        DataDir(3, "data-dd", 0),
    )
    assert retention.orphans(dirs, owners, now=100, grace_s=1000) == ()
    with pytest.raises(ValueError, match="grace_s"):
        retention.orphans(dirs, owners, now=0, grace_s=-1)


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(["data-a", "data-b"]), st.floats(0, 100)), max_size=12
    ),
    st.dictionaries(st.integers(0, 5), st.sampled_from(["data-a", "data-b"])),
    st.floats(0, 200),
    st.floats(0, 50),
)
def test_orphans_never_include_an_owned_or_recent_folder(
    raw: list[tuple[int, str, float]], owners: dict[int, str], now: float, grace: float
) -> None:
    dirs = [DataDir(v, d, m) for v, d, m in raw]
    for orphan in retention.orphans(dirs, owners, now, grace):
        assert owners.get(orphan.version) != orphan.data
        assert orphan.modified + grace <= now


def test_a_kept_delta_version_keeps_its_chain_back_to_its_anchor() -> None:
    versions = range(1, 11)  # anchors 1, 4, 8; the others are deltas against the version before
    needs = {v: max(a for a in (1, 4, 8) if a <= v) for v in versions}
    plan = retention.plan(versions, keep_last=2, pins=[retention.Pin(6, "w", 60, 0.0)], now=1.0, needs=needs)
    assert plan.keep == (4, 5, 6, 8, 9, 10)  # 9, 10 need 8; pinned 6 needs 4 and 5
    assert plan.needed == (4, 5, 8) and plan.pinned == (6,) and plan.delete == (1, 2, 3, 7)
    assert retention.plan(versions, keep_last=2).keep == (9, 10)  # without deltas: as before


@pytest.mark.parametrize(
    ("versions", "keep_last", "pins", "keep_from", "keep", "delete", "in_use", "pinned"),
    [
        ([1, 2, 3, 4, 5, 6], 1, [], 4, (4, 5, 6), (1, 2, 3), (4, 5), ()),
        ([1, 2, 3, 4, 5, 6], 3, [], 5, (4, 5, 6), (1, 2, 3), (), ()),  # keepLast covers the window
        ([1, 2, 3, 4, 5, 6], 1, [pin(1)], 5, (1, 5, 6), (2, 3, 4), (5,), (1,)),
        ([1, 2, 3, 4, 5, 6], 1, [pin(5)], 5, (5, 6), (1, 2, 3, 4), (), (5,)),  # pinned, not in_use
        ([1, 2, 3], 1, [], 0, (1, 2, 3), (), (1, 2), ()),  # the bound reaches back to the base
        ([1, 2, 3], 1, [], 7, (3,), (1, 2), (), ()),  # a window past the newest keeps the newest
        ([1, 2, 3], 1, [], None, (3,), (1, 2), (), ()),  # no window: keepLast and pins alone
    ],
)
def test_a_running_job_keeps_every_version_from_keep_from_on(
    versions: list[int],
    keep_last: int,
    pins: list[Pin],
    keep_from: int | None,
    keep: tuple[int, ...],
    delete: tuple[int, ...],
    in_use: tuple[int, ...],
    pinned: tuple[int, ...],
) -> None:
    p = retention.plan(versions, keep_last, pins, now=10.0, keep_from=keep_from)
    assert (p.keep, p.delete, p.in_use, p.pinned) == (keep, delete, in_use, pinned)


@given(
    st.sets(st.integers(0, 40), max_size=25),
    st.integers(1, 6),
    st.one_of(st.none(), st.integers(0, 45)),
)
def test_keep_from_only_ever_keeps_more(versions: set[int], keep_last: int, keep_from: int | None) -> None:
    bare = retention.plan(versions, keep_last)
    bounded = retention.plan(versions, keep_last, keep_from=keep_from)
    assert set(bare.keep) <= set(bounded.keep)
    assert set(bounded.keep) | set(bounded.delete) == versions
    assert all(v >= keep_from for v in bounded.in_use) if keep_from is not None else not bounded.in_use
    if keep_from is not None:
        assert {v for v in versions if v >= keep_from} <= set(bounded.keep)
