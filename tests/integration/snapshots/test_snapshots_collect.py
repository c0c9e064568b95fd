"""Retention while the job runs (trainer.collect) against a reader that is still fetching.

The trainer collects the store after every version it publishes. A worker told to load a version may
still be downloading it, and one with a read-only credential cannot pin it: the collector keeps every
version from the one just published minus the staleness bound on, so that download completes. The
race is real here: the reader fetches through a paced link from MinIO while the trainer publishes and
collects, and the same race without that rule (a bare ``gc``) breaks the download.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from snapshots_testing import Target, check_payload, write_payload

from echo_runtime import staleness
from echo_runtime.snapshots import errors
from echo_runtime.snapshots.store import SnapshotStore
from echo_runtime.spec.policy import Retention
from echo_runtime.trainer import collect
from services.relay import Relay

MiB = 1024 * 1024
SIZES = [6 * MiB, 2 * MiB]
LINK_MBIT = 24.0  # 8 MiB at 3 MB/s: a download of about 2.8 s
ASYNC_2 = staleness.StalenessPolicy("Async", 2, "Drop", 0)


class SlowFetch(threading.Thread):
    """A worker that cannot pin (read-only credential) fetching ``version`` over a slow link."""

    def __init__(self, store: SnapshotStore, version: int, cache: Path) -> None:
        super().__init__(daemon=True)
        self.store, self.version, self.cache = store, version, cache
        self.result: Path | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.store.fetch(self.version, self.cache)
        except BaseException as exc:
            self.error = exc


def _stores(minio: Any, tmp_path: Path) -> tuple[SnapshotStore, SnapshotStore, Relay]:
    target = Target.of_bucket(minio, prefix="collect")
    trainer = SnapshotStore(target.blobs(), "job", prefix="collect", retention=Retention(keep_last=1))
    relay = Relay(minio.endpoint, mbit=LINK_MBIT)
    reader = SnapshotStore(target.blobs(endpoint=f"http://{relay.endpoint}"), "job", prefix="collect")
    return trainer, reader, relay


def _publish(store: SnapshotStore, version: int, tmp_path: Path) -> None:
    store.publish(
        version, write_payload(tmp_path / f"src-{version}", version, SIZES), kind="full", base_model="m"
    )


@pytest.mark.services
def test_readers_keep_their_version_while_the_trainer_publishes_and_collects(
    minio: Any, tmp_path: Path
) -> None:
    """Worker A is downloading version 1 over a slow link; worker B was told to load version 1 but is
    still finishing a generation, and fetches it only after the trainer has moved on twice."""
    trainer, reader, relay = _stores(minio, tmp_path)
    collector = collect.Collector(trainer, ASYNC_2)
    _publish(trainer, 1, tmp_path)
    slow = SlowFetch(reader, 1, tmp_path / "worker-a")
    slow.start()
    time.sleep(0.5)  # A's download is under way
    for version in (2, 3):  # the trainer moves on, collecting after each version (keepLast 1)
        _publish(trainer, version, tmp_path)
        collector.collect(version)
        assert trainer.versions()[0] == 1, "version 1 is within the bound of version 3: kept"
    overlapped = slow.is_alive()  # A was still downloading when the trainer had collected twice
    late = SlowFetch(reader, 1, tmp_path / "worker-b")
    late.start()
    for fetch in (slow, late):
        fetch.join(30)
        assert fetch.error is None, f"a reader lost its version: {fetch.error!r}"
        assert fetch.result is not None
        check_payload(fetch.result, 1, SIZES)
    assert overlapped, "the slow download finished before the collections: no race was tested"
    # Version 4 takes version 1 out of the bound: nothing pins it, so it goes; the newest stays.
    _publish(trainer, 4, tmp_path)
    collector.collect(4)
    assert trainer.versions() == [2, 3, 4]
    tally = collector.tally.record()
    assert {k: tally[k] for k in ("snapshotsCollected", "retentionFailures", "snapshotsKept")} == {
        "snapshotsCollected": 1,
        "retentionFailures": 0,
        "snapshotsKept": 3,
    }
    # What the store holds: three versions' payloads and manifests (nothing else is in this prefix).
    assert 3 * sum(SIZES) < tally["storeBytes"] < 3 * sum(SIZES) + 64 * 1024
    with pytest.raises(errors.VersionNotFoundError):
        trainer.fetch(1, tmp_path / "late")
    relay.close()


@pytest.mark.services
def test_without_the_bound_a_worker_told_to_load_finds_its_version_gone(minio: Any, tmp_path: Path) -> None:
    """The control: collecting by keepLast alone deletes the version worker B was sent for."""
    trainer, reader, relay = _stores(minio, tmp_path)
    _publish(trainer, 1, tmp_path)
    _publish(trainer, 2, tmp_path)
    assert trainer.gc().deleted == (1,)  # keepLast 1, no bound
    late = SlowFetch(reader, 1, tmp_path / "worker-b")
    late.start()
    late.join(30)
    assert late.result is None and isinstance(late.error, errors.VersionNotFoundError), late.error
    relay.close()


@pytest.mark.services
def test_a_pinned_version_outlives_the_bound(minio: Any, tmp_path: Path) -> None:
    trainer, _reader, relay = _stores(minio, tmp_path)
    collector = collect.Collector(trainer, ASYNC_2)
    for version in range(1, 6):
        _publish(trainer, version, tmp_path)
        if version == 1:
            trainer.pin(1, "evaluator", ttl_s=600)
        collector.collect(version)
    assert trainer.versions() == [1, 3, 4, 5]  # 1 pinned; 3..5 within the bound of 5; 2 collected
    relay.close()
