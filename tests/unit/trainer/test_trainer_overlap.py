"""trainer/overlap.py: the background publish keeps publish-then-announce, order and errors."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from echo_runtime.trainer import overlap


class Recorder:
    def __init__(self, fail_at: int | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.fail_at = fail_at
        self.gate = threading.Event()
        self.gate.set()

    def upload(self, version: int, files: object) -> None:
        self.gate.wait(10)
        if version == self.fail_at:
            raise OSError(f"store refused version {version}")
        self.events.append(("upload", version))

    def announce(self, version: int) -> None:
        self.events.append(("announce", version))


def _folder(tmp_path: Path, version: int) -> Path:
    folder = tmp_path / f"snapshot-{version}"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x")
    return folder


def test_each_version_is_uploaded_then_announced_in_order(tmp_path: Path) -> None:
    rec = Recorder()
    publisher = overlap.Publisher(rec.upload, rec.announce)
    rec.gate.clear()  # version 1's upload hangs until released
    assert publisher.submit(1, _folder(tmp_path, 1), {}) is None
    assert publisher.pending == 1 and rec.events == []  # submit returned while the upload waits
    rec.gate.set()
    finished = publisher.submit(2, _folder(tmp_path, 2), {})  # waits for 1 first
    assert finished is not None and finished.version == 1 and finished.upload_seconds >= 0
    last = publisher.wait()
    assert last is not None and last.version == 2 and publisher.wait() is None
    assert rec.events == [("upload", 1), ("announce", 1), ("upload", 2), ("announce", 2)]
    assert not (tmp_path / "snapshot-1").exists() and not (tmp_path / "snapshot-2").exists()
    publisher.close()


def test_a_failed_upload_is_never_announced_and_is_raised_in_the_trainers_thread(tmp_path: Path) -> None:
    rec = Recorder(fail_at=2)
    publisher = overlap.Publisher(rec.upload, rec.announce)
    publisher.submit(1, _folder(tmp_path, 1), {})
    publisher.submit(2, _folder(tmp_path, 2), {})
    with pytest.raises(OSError, match="refused version 2"):
        publisher.wait()
    assert rec.events == [("upload", 1), ("announce", 1)]
    assert not (tmp_path / "snapshot-2").exists()  # the exported files are removed either way
    publisher.close()


def test_close_lets_the_pending_publish_finish_without_raising(tmp_path: Path) -> None:
    ok, failing = Recorder(), Recorder(fail_at=1)
    for rec in (ok, failing):
        publisher = overlap.Publisher(rec.upload, rec.announce)
        publisher.submit(1, _mk(tmp_path, id(rec)), {})
        publisher.close()
    assert ok.events == [("upload", 1), ("announce", 1)] and failing.events == []


def _mk(tmp_path: Path, key: int) -> Path:
    root = tmp_path / str(key)
    root.mkdir()
    return _folder(root, 1)


def test_prefetch_hands_out_only_the_version_it_was_started_for() -> None:
    prefetch: overlap.Prefetch[int] = overlap.Prefetch()
    assert prefetch.take(3) is None
    prefetch.start(3, lambda: 42)
    with pytest.raises(RuntimeError, match="version 3 is still pending"):
        prefetch.start(4, lambda: 0)
    assert prefetch.take(4) is None
    future = prefetch.take(3)
    assert future is not None and future.result(5) == 42 and prefetch.take(3) is None
    prefetch.close()


def test_a_pending_prefetch_does_not_keep_a_stopping_trainer_alive(tmp_path: Path) -> None:
    """A long-poll that never ends (the workers are gone) must not hold the process at exit."""
    import subprocess
    import sys

    code = (
        "import threading, time\n"
        "from echo_runtime.trainer import overlap\n"
        "p = overlap.Prefetch()\n"
        "p.start(1, lambda: threading.Event().wait())\n"  # blocks forever
        "p.close()\n"
        "print('exiting')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "exiting", done.stderr


def test_a_failed_prefetch_is_raised_where_the_trainer_waits() -> None:
    prefetch: overlap.Prefetch[int] = overlap.Prefetch()

    def fail() -> int:
        raise ConnectionError("coordinator gone")

    prefetch.start(2, fail)
    future = prefetch.take(2)
    assert future is not None
    with pytest.raises(ConnectionError, match="coordinator gone"):
        future.result(10)
