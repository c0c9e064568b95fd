"""The task ledger (coordinator.buffer): transitions, expiry, capacity and conservation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime.coordinator import buffer

Ledger = buffer.TaskLedger[str, str]


def ledger_with(n: int, capacity: int = 10) -> Ledger:
    ledger: Ledger = buffer.TaskLedger(capacity)
    for i in range(n):
        ledger.add(f"t{i}", f"prompt {i}")
    return ledger


def test_lease_complete_take() -> None:
    ledger = ledger_with(3)
    assert ledger.room() == 7
    leased = ledger.lease("w1", 2, now=0.0, deadline=10.0)
    assert [e.id for e in leased] == ["t0", "t1"]
    assert ledger.lease_of("t0") is not None and ledger.leases_of("w1") == 2
    ledger.complete("t1", "w1", "group 1", version=3)
    ledger.complete("t0", "w1", "group 0", version=2)
    assert ledger.buffered == 2 and ledger.outcome("t1") == ("buffered", "w1")
    taken = ledger.take(1)
    assert [e.id for e in taken] == ["t0"]  # the oldest policy version first, whatever completed first
    assert taken[0].group == "group 0" and ledger.outcome("t0") == ("consumed", "w1")
    ledger.check()


def test_take_breaks_version_ties_in_lease_order() -> None:
    ledger = ledger_with(4)
    ledger.lease("w1", 1, now=0.0, deadline=10.0)  # t0
    ledger.lease("w2", 2, now=1.0, deadline=10.0)  # t1, t2
    ledger.complete("t2", "w2", "g2", version=5)
    ledger.complete("t1", "w2", "g1", version=5)
    ledger.complete("t0", "w1", "g0", version=5)  # leased first, completed last
    ledger.lease("w1", 1, now=2.0, deadline=10.0)  # t3
    ledger.complete("t3", "w1", "g3", version=4)  # an older version jumps the queue
    assert [e.id for e in ledger.take(4)] == ["t3", "t0", "t1", "t2"]
    ledger.check()


def test_a_dropped_groups_prompt_can_go_back_to_the_front() -> None:
    ledger = ledger_with(2)
    (entry,) = ledger.lease("w1", 1, now=0.0, deadline=10.0)
    dropped = ledger.discard(entry.id, "w1")
    ledger.add("t0-again", dropped.payload, front=True)
    assert [e.payload for e in ledger.lease("w2", 2, now=1.0, deadline=10.0)] == ["prompt 0", "prompt 1"]
    assert ledger.dropped == 1 and ledger.created == 3
    ledger.check()


def test_only_the_holder_completes() -> None:
    ledger = ledger_with(1)
    ledger.lease("w1", 1, 0.0, 10.0)
    with pytest.raises(KeyError):
        ledger.complete("t0", "w2", "g", 0)
    with pytest.raises(KeyError):
        ledger.discard("t0", "w2")
    assert ledger.leased == 1


def test_expired_leases_go_back_to_the_front_in_order() -> None:
    ledger = ledger_with(4)
    ledger.lease("w1", 2, now=0.0, deadline=5.0)  # t0, t1
    ledger.lease("w2", 1, now=1.0, deadline=100.0)  # t2
    expired = ledger.expire(now=6.0)
    assert [e.id for e in expired] == ["t0", "t1"]
    assert ledger.pending == 3 and ledger.reissued == 2
    again = ledger.lease("w3", 3, now=7.0, deadline=20.0)
    assert [e.id for e in again] == ["t0", "t1", "t3"]
    assert again[0].leases == 2
    ledger.check()


def test_dead_worker_releases_everything() -> None:
    ledger = ledger_with(3)
    ledger.lease("w1", 2, 0.0, 100.0)
    assert [e.id for e in ledger.expire(1.0, dead_workers={"w1"})] == ["t0", "t1"]
    assert ledger.leases_of("w1") == 0
    ledger.lease("w2", 1, 2.0, 100.0)
    assert [e.id for e in ledger.release_worker("w2")] == ["t0"]
    ledger.check()


def test_drop_and_discard_are_counted() -> None:
    ledger = ledger_with(3)
    ledger.lease("w", 3, 0.0, 10.0)
    ledger.complete("t0", "w", "g0", 1)
    ledger.complete("t1", "w", "g1", 5)
    ledger.discard("t2", "w")
    dropped = ledger.drop_buffered(lambda e: (e.version or 0) < 3)
    assert [e.id for e in dropped] == ["t0"]
    assert ledger.dropped == 2 and ledger.buffered == 1
    assert ledger.outcome("t2") == ("dropped", "w")
    ledger.check()


def test_capacity_bounds_outstanding_tasks() -> None:
    ledger = ledger_with(2, capacity=3)
    assert ledger.room() == 1
    ledger.lease("w", 2, 0.0, 1.0)
    ledger.complete("t0", "w", "g", 0)
    assert ledger.room() == 1
    ledger.capacity = 0
    assert ledger.room() == 0


def test_take_is_all_or_nothing_and_ids_are_unique() -> None:
    ledger = ledger_with(1)
    with pytest.raises(ValueError, match="buffered"):
        ledger.take(1)
    with pytest.raises(ValueError, match="already used"):
        ledger.add("t0", "again")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "lease", "complete", "expire", "take", "drop", "kill"]), st.integers(0, 3)
        ),
        max_size=60,
    )
)
def test_conservation_under_any_sequence(ops: list[tuple[str, int]]) -> None:
    ledger: Ledger = buffer.TaskLedger(8)
    now, made, delivered = 0.0, 0, []
    for op, k in ops:
        now += 1.0
        worker = f"w{k % 2}"
        if op == "add" and ledger.room():
            ledger.add(f"t{made}", "p")
            made += 1
        elif op == "lease":
            ledger.lease(worker, k + 1, now, now + 3.0)
        elif op == "complete":
            held = [e for e in (ledger.lease_of(f"t{i}") for i in range(made)) if e and e.worker == worker]
            if held:
                ledger.complete(held[0].id, worker, "g", k)
        elif op == "expire":
            ledger.expire(now)
        elif op == "take" and ledger.buffered >= k:
            delivered += [e.id for e in ledger.take(k)]
        elif op == "drop":
            ledger.drop_buffered(lambda e: (e.version or 0) < k)  # noqa: B023 (called at once)
        elif op == "kill":
            ledger.release_worker(worker)
        ledger.check()
        assert ledger.outstanding <= 8
    assert len(delivered) == len(set(delivered)) == ledger.consumed
