"""Retention while the job runs: the trainer collects the store after the versions it publishes.

The publishing side is the one process of a job that knows when a version is added, and it runs in
both faces (``echorl run`` and the operator's trainer pod), so it applies ``syncPolicy.retention``:
after each published version, :class:`Collector` runs :meth:`~echo_runtime.snapshots.SnapshotStore.gc`
in a background thread (the step never waits for a listing or a delete; a collection still running
when the next version is published is not queued twice, the next one covers both). What it keeps:

* the newest ``keepLast`` versions and every version a live pin holds (:mod:`echo_runtime.snapshots.retention`);
* every version a worker may still generate with or be told to load: from the version just published
  minus the staleness bound (Δmax in Async, the refresh threshold in Sequential) on. Workers pin what
  they fetch, but a worker with a read-only credential cannot pin, and one that was just told to load
  a version has not pinned it yet: the bound covers both;
* the newest ``checkpointKeepLast`` checkpoints.

A store whose deletes fail (permissions, the server down) does not stop training: the first failure of
each kind is logged as a warning with its reason, later ones are counted (``retentionFailures`` in the
trainer's records), and a later success says so. What could not be deleted stays for the next
collection, or for ``echorl snapshots gc`` once the job is done.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Protocol

from echo_runtime import staleness

_log = logging.getLogger(__name__)


class Collectable(Protocol):
    def gc(self, *, keep_from: int | None = None) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Tally:
    """What the collections so far did, for the trainer's records."""

    kept: int | None = None
    """Versions in the store after the last collection that succeeded (None before the first)."""
    collected: int = 0
    """Versions removed so far by this trainer."""
    kept_bytes: int | None = None
    """Bytes of snapshots and checkpoints in the store after the last collection that succeeded."""
    failures: int = 0
    """Collections that failed (the store kept what they would have removed)."""

    def record(self) -> dict[str, int]:
        out = {"snapshotsCollected": self.collected, "retentionFailures": self.failures}
        if self.kept is not None:
            out["snapshotsKept"] = self.kept
        if self.kept_bytes is not None:
            out["storeBytes"] = self.kept_bytes
        return out


class Collector:
    """Collect ``store`` after each published version, in a daemon thread, one collection at a time."""

    def __init__(self, store: Collectable, policy: staleness.StalenessPolicy) -> None:
        self._store = store
        self._policy = policy
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._wanted: int | None = None
        """The newest published version not collected after yet."""
        self._tally = Tally()
        self._reported: set[str] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def tally(self) -> Tally:
        with self._lock:
            return self._tally

    def published(self, version: int) -> None:
        """``version`` is published: collect soon (never blocks)."""
        with self._lock:
            if self._closed:
                return
            self._wanted = version if self._wanted is None else max(self._wanted, version)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="echorl-retention", daemon=True)
                self._thread.start()
            self._wake.notify()

    def collect(self, version: int) -> None:
        """Collect once, now, after ``version`` was published (the thread's body; tests call it)."""
        keep_from = self._policy.min_version(version)
        try:
            report = self._store.gc(keep_from=keep_from)
        except Exception as exc:  # retention must never stop training
            kind = type(exc).__name__
            with self._lock:
                self._tally = dataclasses.replace(self._tally, failures=self._tally.failures + 1)
                first = kind not in self._reported
                self._reported.add(kind)
            if first:
                _log.warning(
                    "snapshot retention failed after version %d (%s: %s); training goes on and the store "
                    "keeps these versions until a collection succeeds (or `echorl snapshots gc` after the job)",
                    version,
                    kind,
                    exc,
                )
            return
        with self._lock:
            recovered = bool(self._reported)
            self._reported.clear()
            self._tally = Tally(
                kept=len(report.kept),
                collected=self._tally.collected + len(report.deleted),
                kept_bytes=report.kept_bytes,
                failures=self._tally.failures,
            )
        if recovered:
            _log.info("snapshot retention works again (after version %d)", version)
        if report.deleted:
            _log.debug("retention after version %d removed versions %s", version, list(report.deleted))

    def close(self, timeout: float = 30.0) -> None:
        """Let a running collection finish (up to ``timeout`` seconds), then stop the thread."""
        with self._lock:
            self._closed = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._wanted is None and not self._closed:
                    self._wake.wait()
                if self._wanted is None:
                    return
                version, self._wanted = self._wanted, None
            self.collect(version)
