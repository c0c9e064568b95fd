"""The record of caught workers (coordinator.quarantine) on its own: first record stands, per-pool counts."""

from __future__ import annotations

from echo_runtime.coordinator import quarantine


def test_the_first_record_of_a_worker_stands() -> None:
    book = quarantine.Quarantines()
    first = book.catch("w-1", pool="cpu", host="mac", reason="log-probs", mismatch=0.7, version=3)
    again = book.catch("w-1", pool="cpu", host=None, reason="lease hoarding", mismatch=None, version=9)
    assert again is first and (first.reason, first.mismatch, first.version) == ("log-probs", 0.7, 3)
    assert "w-1" in book and "w-2" not in book and list(book.records) == ["w-1"]


def test_caught_workers_are_counted_per_pool_in_the_order_caught() -> None:
    book = quarantine.Quarantines()
    for worker, pool in [("w-3", "gpu"), ("w-1", "cpu"), ("w-2", "gpu")]:
        book.catch(worker, pool=pool, host=None, reason="r", mismatch=None, version=0)
    assert (book.in_pool("gpu"), book.in_pool("cpu"), book.in_pool("mac")) == (2, 1, 0)
    assert list(book.records) == ["w-3", "w-1", "w-2"]


def test_a_worker_is_a_hoarder_after_three_overrun_sweeps_in_a_row() -> None:
    # docs/coordinator.md: "past the task timeout three sweeps in a row ... is quarantined"
    assert [quarantine.hoarding(n) for n in range(5)] == [False, False, False, True, True]
    reason = quarantine.hoarding_reason(3, 5.0)
    assert reason.startswith("lease hoarding") and "(5s)" in reason and "3 times" in reason
