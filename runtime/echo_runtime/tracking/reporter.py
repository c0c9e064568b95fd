"""The reporter: records in, trackers fed on a thread of their own, failures contained.

Training never waits for a tracker and never stops for one. :meth:`Reporter.log` only puts the
record on a bounded queue (a full queue drops the record and counts it); one thread turns records
into points (:mod:`.records`) and gives them to every tracker. A tracker that fails — it cannot open
(a bad credential, a server down), or a write raises (a full disk) — is reported once, with the
reason, and tried again later: opening after :data:`RETRY_SECONDS`, a write on the next point. After
:data:`MAX_FAILURES` failures in a row it is turned off, reported again, and the run goes on with
the others. A missing library is reported once and turned off at once (nothing to retry).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from echo_runtime.tracking import backends
from echo_runtime.tracking.records import Points

_log = logging.getLogger(__name__)

MAX_FAILURES = 5
"""Failures in a row after which a tracker is turned off for the rest of the run."""
RETRY_SECONDS = 30.0
"""How long a tracker that could not open waits before it is tried again."""
QUEUE_SIZE = 10_000
"""Records waiting for the trackers; more are dropped (and counted) rather than held in memory."""


class _Slot:
    """One tracker and its state."""

    def __init__(self, tracker: backends.Tracker) -> None:
        self.tracker = tracker
        self.opened = False
        self.off = False
        self.failures = 0
        self.next_try = 0.0
        self.reported = False


class Reporter:
    """Feeds ``trackers`` (names from :data:`echo_runtime.spec.swarms.TRACKERS`) with records."""

    def __init__(
        self,
        names: Iterable[str],
        run: backends.RunInfo,
        *,
        t0: float,
        warn: Callable[[str], None] | None = None,
        factories: Mapping[str, Callable[[], backends.Tracker]] | None = None,
        poll: Callable[[], Mapping[str, Any] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``warn`` is told each failure worth a user's attention (printed by ``echorl run``, logged by
        the trainer); ``poll``, if given, is asked for one more record (the coordinator's status)
        after each trainer record — what the trainer pod reports beside its own records."""
        made = factories or backends.FACTORIES
        unknown = sorted(set(names) - set(made))
        if unknown:
            raise ValueError(
                f"report-to: unknown tracker(s) {', '.join(unknown)}; allowed: {', '.join(made)}, or none"
            )
        self.run = run
        self.slots = [_Slot(made[name]()) for name in dict.fromkeys(names)]
        self.points = Points(t0)
        self.warn = warn or _log.warning
        self.poll = poll
        self.clock = clock
        self.dropped = 0
        self._queue: queue.Queue[Mapping[str, Any] | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread = threading.Thread(target=self._loop, name="echorl-trackers", daemon=True)
        self._thread.start()

    @property
    def names(self) -> list[str]:
        return [slot.tracker.name for slot in self.slots]

    def active(self) -> list[str]:
        """The trackers not turned off."""
        return [slot.tracker.name for slot in self.slots if not slot.off]

    def log(self, record: Mapping[str, Any]) -> None:
        """Queue one record (a ``metrics.jsonl`` record, or a ``workerTiming`` one); never blocks."""
        try:
            self._queue.put_nowait(dict(record))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                self.warn(f"trackers: fell {QUEUE_SIZE} records behind; dropping records until they catch up")

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every record queued so far is handled; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self, timeout_s: float = 60.0) -> None:
        """Write what is queued and close every tracker, waiting at most ``timeout_s`` (a tracker that
        hangs is left behind on its daemon thread, reported)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.warn(
                f"trackers: still writing after {timeout_s:.0f} s; leaving them ({', '.join(self.active())})"
            )

    # ------------------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while True:
            record = self._queue.get()
            if record is None:
                self._queue.task_done()
                break
            self._handle(record)
            if record.get("kind") == "trainer" and self.poll is not None:
                try:
                    extra = self.poll()
                except Exception as exc:  # the coordinator may be restarting: the next step asks again
                    _log.debug("trackers: no status from the coordinator: %s", exc)
                    extra = None
                if extra is not None:
                    self._handle(extra)
            self._queue.task_done()
        for slot in self.slots:
            if slot.opened and not slot.off:
                self._call(slot, "close", slot.tracker.close)

    def _handle(self, record: Mapping[str, Any]) -> None:
        try:
            point = self.points.point(record)
        except Exception as exc:  # a malformed record is skipped, never fatal
            _log.warning("trackers: skipped a record they could not read: %s", exc)
            return
        if point is None:
            return
        for slot in self.slots:
            if slot.off:
                continue
            if not slot.opened:
                if self.clock() < slot.next_try:
                    continue
                if not self._call(slot, "open", functools.partial(slot.tracker.open, self.run)):
                    slot.next_try = self.clock() + RETRY_SECONDS
                    continue
                slot.opened = True
            self._call(slot, "write", functools.partial(slot.tracker.log, point))

    def _call(self, slot: _Slot, what: str, action: Callable[[], None]) -> bool:
        name = slot.tracker.name
        try:
            action()
        except backends.NotInstalled as exc:
            slot.off = True
            self.warn(f"tracker {name}: {exc}; reporting to it is off")
            return False
        except Exception as exc:
            slot.failures += 1
            reason = f"{type(exc).__name__}: {exc}"
            if slot.failures >= MAX_FAILURES:
                slot.off = True
                self.warn(
                    f"tracker {name}: failed {slot.failures} times in a row ({reason}); reporting to it is off"
                )
            elif not slot.reported:
                slot.reported = True
                self.warn(f"tracker {name}: cannot {what} ({reason}); training goes on, retrying")
            return False
        if slot.failures and slot.reported:
            _log.info("tracker %s: working again after %d failure(s)", name, slot.failures)
        slot.failures = 0
        slot.reported = False
        return True
