"""The roster of registered workers (coordinator.roster) on its own: admission, lookup, versions, stuck."""

from __future__ import annotations

import pytest
from coordinator_helpers import config

from echo_runtime.coordinator import errors, quarantine, roster, wire


def request(pool: str = "cpu", capacity: int = 4) -> wire.RegisterRequest:
    return wire.RegisterRequest(
        pool=pool, backend="transformers", device="cpu", dtype="float32", capacity=capacity
    )


def admit(
    r: roster.Roster, book: quarantine.Quarantines, now: float = 0.0, pool: str = "cpu", capacity: int = 4
) -> roster.WorkerRecord:
    return r.register(request(pool, capacity), b"digest", now, book)


def catch(book: quarantine.Quarantines, worker: roster.WorkerRecord) -> None:
    worker.quarantine = book.catch(
        worker.id, pool=worker.pool, host=None, reason="caught", mismatch=None, version=0
    )


def test_a_worker_joins_a_known_pool_with_its_capacity_capped_by_the_pools() -> None:
    r, book = roster.Roster(config(pools=("cpu", "gpu"), pool_capacity={"cpu": 2})), quarantine.Quarantines()
    capped, free = admit(r, book, capacity=5), admit(r, book, pool="gpu", capacity=5)
    assert (capped.capacity, free.capacity) == (2, 5)
    assert admit(r, book, capacity=1).capacity == 1  # a worker asking for less keeps less
    with pytest.raises(errors.Rejected) as refused:
        admit(r, book, pool="tpu")
    assert (refused.value.status, refused.value.field) == (
        422,
        "pool",
    ) and "cpu, gpu" in refused.value.message
    assert len(r.workers) == 3  # the refusal added nobody


def test_worker_ids_are_unique_and_never_those_of_a_caught_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    r, book = roster.Roster(config()), quarantine.Quarantines()
    book.catch("w-00000000", pool="cpu", host=None, reason="caught", mismatch=None, version=0)
    draws = iter(["00000000", "00000000", "11111111", "11111111", "22222222"])
    monkeypatch.setattr(roster.secrets, "token_hex", lambda n: next(draws))
    first, second = admit(r, book), admit(r, book)
    assert (first.id, second.id) == ("w-11111111", "w-22222222")


def test_max_workers_counts_the_live_and_the_caught_of_that_pool_only() -> None:
    r, book = (
        roster.Roster(config(pools=("cpu", "gpu"), pool_max_workers={"cpu": 2})),
        quarantine.Quarantines(),
    )
    a, b = admit(r, book), admit(r, book)
    for _ in range(3):
        admit(r, book, pool="gpu")  # another pool, no limit
    with pytest.raises(errors.Rejected) as full:
        admit(r, book)
    assert (full.value.status, full.value.code) == (429, "limit")
    catch(book, a)
    del r.workers[a.id]  # caught, then expired: its record still counts
    with pytest.raises(errors.Rejected):
        admit(r, book)
    del r.workers[b.id]
    admit(r, book)
    assert len(r.in_pool("cpu")) == 1 and len(r.in_pool("gpu")) == 3


def test_lookup_refuses_unknown_workers_and_active_refuses_caught_ones() -> None:
    r, book = roster.Roster(config()), quarantine.Quarantines()
    w = admit(r, book)
    assert r.get(w.id) is w and r.active(w.id) is w
    with pytest.raises(errors.Rejected) as unknown:
        r.get("w-nobody")
    assert (unknown.value.status, unknown.value.code) == (404, "unknown_worker")
    catch(book, w)
    assert r.get(w.id) is w
    with pytest.raises(errors.Rejected) as caught:
        r.active(w.id)
    assert (caught.value.status, caught.value.code) == (
        403,
        "quarantined",
    ) and "caught" in caught.value.message


def test_a_worker_is_silent_only_past_the_lease_timeout() -> None:
    r, book = roster.Roster(config(lease_timeout=10.0)), quarantine.Quarantines()
    early, late = admit(r, book, now=0.0), admit(r, book, now=5.0)
    assert r.silent(10.0) == []  # exactly the timeout: still alive
    assert r.silent(10.5) == [early.id]
    late.last_seen = 20.0
    assert r.silent(25.0) == [early.id]


def test_a_reported_version_must_be_published_and_becomes_claimable() -> None:
    r, book = roster.Roster(config()), quarantine.Quarantines()
    w = admit(r, book)
    r.report(w, None, published=3)
    assert w.loaded_version is None and not w.known_versions
    with pytest.raises(errors.Rejected) as refused:
        r.report(w, 4, published=3)
    assert (refused.value.status, refused.value.field) == (422, "loadedVersion")
    assert w.loaded_version is None and not w.known_versions  # refused: nothing recorded
    r.report(w, 2, published=3)
    r.report(w, 3, published=3)
    assert w.loaded_version == 3 and w.known_versions == {2, 3}


def test_a_worker_is_told_to_load_published_only_when_behind_what_its_next_task_needs() -> None:
    r, book = roster.Roster(config()), quarantine.Quarantines()
    w = admit(r, book)
    assert r.instruct(w, need=0, min_version=0, published=0, now=0.0) == 0  # holds nothing: load
    assert w.known_versions == {0}  # a version it was told to load may be claimed
    w.loaded_version = 2
    assert r.instruct(w, need=2, min_version=1, published=4, now=0.0) is None  # fresh enough
    assert r.instruct(w, need=3, min_version=1, published=4, now=0.0) == 4  # behind its next task
    assert 4 in w.known_versions
    w.loaded_version = 4
    assert r.instruct(w, need=5, min_version=5, published=4, now=0.0) is None  # nothing newer to load


def test_stuck_means_told_and_still_behind_after_a_lease_timeout() -> None:
    r, book = roster.Roster(config(lease_timeout=10.0)), quarantine.Quarantines()
    w = admit(r, book)
    w.loaded_version = 0
    r.instruct(w, need=0, min_version=0, published=2, now=1.0)  # only pacing lags: not on the clock
    assert not r.stuck(w, 100.0)
    r.instruct(w, need=2, min_version=1, published=2, now=1.0)  # below t_train - bound: on the clock
    r.instruct(w, need=2, min_version=1, published=2, now=8.0)  # told again: the clock keeps running
    assert not r.stuck(w, 11.0) and r.stuck(w, 11.5)
    r.instruct(w, need=3, min_version=2, published=3, now=12.0)  # a newer version: a new clock
    assert not r.stuck(w, 21.0) and r.stuck(w, 22.5)
    w.loaded_version = 3  # it loaded what it was told
    assert not r.stuck(w, 30.0)


def test_forgetting_old_versions_never_goes_back_and_keeps_the_newer_ones() -> None:
    r, book = roster.Roster(config()), quarantine.Quarantines()
    w = admit(r, book)
    for v in (0, 2, 3, 5, 8):
        r.report(w, v, published=8)
    r.forget_below(4)
    assert w.known_versions == {5, 8} and w.known_floor == 4
    r.forget_below(2)  # a lower floor later changes nothing
    assert w.known_versions == {5, 8} and w.known_floor == 4
