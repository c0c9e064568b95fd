"""trainer.collect: retention after each published version, off the step, never fatal."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from echo_runtime import staleness
from echo_runtime.snapshots import errors
from echo_runtime.trainer import collect


class Report:
    def __init__(self, kept: tuple[int, ...], deleted: tuple[int, ...], freed: int) -> None:
        self.kept, self.deleted, self.freed_bytes = kept, deleted, freed
        self.kept_bytes = 1000 - freed


class FakeStore:
    """Records each gc's ``keep_from``; raises what ``failures`` holds, in order, before succeeding."""

    def __init__(self, failures: list[Exception] | None = None, hold: threading.Event | None = None) -> None:
        self.calls: list[int | None] = []
        self.failures = list(failures or [])
        self.hold = hold

    def gc(self, *, keep_from: int | None = None) -> Any:
        self.calls.append(keep_from)
        if self.hold is not None:
            self.hold.wait(5)
        if self.failures:
            raise self.failures.pop(0)
        return Report(kept=(1, 2, 3), deleted=(0,), freed=10)


@pytest.mark.parametrize(
    ("policy", "version", "keep_from"),
    [
        (staleness.StalenessPolicy("Async", 2, "Drop", 0), 7, 5),
        (staleness.StalenessPolicy("Async", 0, "Drop", 0), 7, 7),
        (staleness.StalenessPolicy("Sequential", 4, "Drop", 1), 7, 6),  # the refresh threshold
        (staleness.StalenessPolicy("Async", 8, "Drop", 0), 3, 0),
    ],
)
def test_it_keeps_what_workers_may_still_use(
    policy: staleness.StalenessPolicy, version: int, keep_from: int
) -> None:
    store = FakeStore()
    collect.Collector(store, policy).collect(version)
    assert store.calls == [keep_from]


def test_a_failing_store_is_reported_once_per_kind_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = errors.StoreUnavailableError("minio: connection refused")
    denied = errors.StoreAuthError("AccessDenied: s3:DeleteObject")
    store = FakeStore([down, down, denied, down])
    collector = collect.Collector(store, staleness.StalenessPolicy("Async", 1, "Drop", 0))
    with caplog.at_level(logging.INFO, logger=collect.__name__):
        for version in range(1, 7):
            collector.collect(version)  # never raises
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one per kind of failure, with its reason
    assert "StoreUnavailableError: minio: connection refused" in warnings[0]
    assert "AccessDenied" in warnings[1]
    assert any("works again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert collector.tally.record() == {
        "snapshotsCollected": 2,
        "retentionFailures": 4,
        "snapshotsKept": 3,
        "storeBytes": 990,
    }


def test_publishes_never_wait_and_collections_do_not_pile_up() -> None:
    """While one collection runs, later publishes only raise the version the next one starts from."""
    hold = threading.Event()
    store = FakeStore(hold=hold)
    collector = collect.Collector(store, staleness.StalenessPolicy("Async", 1, "Drop", 0))
    collector.published(3)
    deadline = time.monotonic() + 5
    while not store.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    for version in (4, 5, 6):
        collector.published(version)  # returns while the first collection is still held: no waiting
    assert not hold.is_set() and store.calls == [2]
    hold.set()
    collector.close()
    assert store.calls == [2, 5]  # after 3, then once after 6 (covering 4 and 5)
    assert collector.tally.collected == 2
    collector.published(7)  # after close: ignored
    assert store.calls == [2, 5]
