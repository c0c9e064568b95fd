"""Keeping the trainer off I/O: the next batch is fetched and the last snapshot uploaded while a step runs.

Two helpers for :mod:`.loop`, both on rank 0, each at most one operation in flight:

* :class:`Prefetch` asks the coordinator for the batch of version ``t + 1`` in a thread as soon as the
  step ``t → t + 1`` starts. The coordinator already treats that request as the trainer being at
  ``t + 1`` (its ``t_train`` is the larger of the versions announced and asked at), so every group it
  hands out passes the staleness rule at ``t + 1``: the bound is exactly as before. Groups of version
  ``t + 1`` itself cannot be in the batch before ``t + 1`` is announced (the coordinator refuses a
  claimed version nobody published), so with Δmax 0 the prefetch simply waits for the publish. The
  batch is *checked* (:mod:`.verify`) only after the step, against the weights of ``t + 1``.
* :class:`Publisher` uploads a version's exported files and then announces it, in a thread. The export
  itself (weights to files) stays on the critical path, because the next step changes the weights;
  what leaves it is the upload to the store and the announcement. Order stays exact: a version is
  announced only after its publish, and a new publish starts only after the previous one finished, so
  versions are announced in order. A failure is raised in the trainer's thread at the next
  :meth:`Publisher.wait`.

Why threads: both operations wait on sockets (MinIO, the coordinator), which release the GIL.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Prefetch(Generic[T]):
    """One background call whose result the trainer collects later.

    The call runs in a daemon thread: a trainer that stops (SIGTERM, an error) while a long-poll for
    the next batch is pending exits at once instead of waiting for a batch it will never train on.
    """

    def __init__(self) -> None:
        self._pending: tuple[int, Future[T]] | None = None

    def start(self, version: int, fetch: Callable[[], T]) -> None:
        if self._pending is not None:
            raise RuntimeError(f"a prefetch for version {self._pending[0]} is still pending")
        future: Future[T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fetch())
            except BaseException as exc:  # handed to the trainer's thread, raised where it waits
                future.set_exception(exc)

        threading.Thread(target=run, name=f"echorl-prefetch-{version}", daemon=True).start()
        self._pending = (version, future)

    def take(self, version: int) -> Future[T] | None:
        """The pending call for ``version`` (the caller waits on it), or None if none was started."""
        if self._pending is None or self._pending[0] != version:
            return None
        _, future = self._pending
        self._pending = None
        return future

    def close(self) -> None:
        """Stop waiting for an unfinished prefetch (its daemon thread is abandoned)."""
        self._pending = None


@dataclasses.dataclass
class Published:
    """What :meth:`Publisher.wait` reports of one finished publish."""

    version: int
    upload_seconds: float
    """Upload and announcement, in the background thread."""


class Publisher:
    """Upload-then-announce in the background, one version at a time, in order."""

    def __init__(self, upload: Callable[[int, Any], Any], announce: Callable[[int], Any]) -> None:
        self._upload = upload
        self._announce = announce
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="echorl-publish")
        self._pending: tuple[int, Future[float], Path] | None = None
        self._lock = threading.Lock()

    @property
    def pending(self) -> int | None:
        """The version being published, if any."""
        return None if self._pending is None else self._pending[0]

    def submit(self, version: int, folder: Path, files: Any) -> Published | None:
        """Publish ``files`` (exported into ``folder``, which the publisher then owns and removes) as
        ``version``. Waits for the previous publish first and returns it (None if there was none)."""
        previous = self.wait()
        with self._lock:
            self._pending = (version, self._pool.submit(self._publish, version, files), folder)
        return previous

    def wait(self) -> Published | None:
        """Wait for the pending publish; return it, or None if there was none. Its error is raised here."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return None
        version, future, folder = pending
        try:
            seconds = future.result()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return Published(version=version, upload_seconds=seconds)

    def close(self) -> None:
        """Let a pending publish finish (no work is thrown away), without raising its error."""
        try:
            self.wait()
        except Exception:  # the error that stopped the loop is the one to report
            pass
        finally:
            self._pool.shutdown(wait=True)

    def _publish(self, version: int, files: Any) -> float:
        started = time.perf_counter()
        self._upload(version, files)
        self._announce(version)
        return time.perf_counter() - started
