"""Start and stop the real service processes the test suite runs against.

Every service (``minio``, ``etcd``, ``kube-apiserver``) is started through :class:`ManagedProcess`:

* it runs in its own session / process group, so stopping it reaches everything it spawned;
* its stdout and stderr go to a log file (normally under pytest's tmp dir), and the tail of that
  log is part of every error raised about it;
* :meth:`ManagedProcess.wait_healthy` polls a health check until a deadline and fails early, with
  the log tail, if the process exits;
* :meth:`ManagedProcess.stop` sends SIGTERM to the whole group, then SIGKILL after a grace period.

Safety nets keep a failing or interrupted run from leaving processes behind: the pytest fixture
finalizers call :meth:`stop`; an ``atexit`` hook stops whatever is still registered; a small reaper
process, fed the process-group ids over a pipe, kills the groups still listed when that pipe closes,
i.e. when the Python process ends in any way (SIGKILL, OOM, ``pytest-timeout``'s thread method calling
``os._exit``); and on Linux each service also gets ``PR_SET_PDEATHSIG=SIGKILL``.

This module also runs ``scripts/testbin.sh``, which builds (once) and locates the binaries.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTBIN_SCRIPT = REPO_ROOT / "scripts" / "testbin.sh"

_PR_SET_PDEATHSIG = 1


class ServiceError(RuntimeError):
    """A test service could not be built, started or reached."""


def log_tail(path: Path, max_lines: int = 40, max_chars: int = 6000) -> str:
    """Return the last lines of a log file, or a note if it cannot be read."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_chars))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    lines = data.splitlines()[-max_lines:]
    return "\n".join(lines) if lines else "<empty log>"


def free_ports(count: int = 1) -> list[int]:
    """Return ``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    All sockets are held open together while the ports are chosen, so the ports are distinct. A
    port can still be taken between this call and the service binding it; that window is tiny on a
    loopback-only test machine and a failed bind surfaces as a start error with the log tail.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _pdeathsig_preexec() -> None:  # pragma: no cover - runs in the forked child
    """In the child, before exec: ask Linux to SIGKILL us when our parent thread dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()

# The reaper: a tiny watchdog process (own session, so Ctrl-C does not reach it) that reads
# "add <pgid>" / "del <pgid>" lines on a pipe from this process. When the pipe closes, whatever the
# reason this process ended (including SIGKILL), it SIGTERMs then SIGKILLs the groups still listed.
# This also covers grandchildren and macOS, which PR_SET_PDEATHSIG does not.
_REAPER_SCRIPT = """
import os, signal, sys, time
groups = set()
for line in sys.stdin:
    op, _, pgid = line.strip().partition(" ")
    if op == "add":
        groups.add(int(pgid))
    elif op == "del":
        groups.discard(int(pgid))
for sig in (signal.SIGTERM, signal.SIGKILL):
    for g in groups:
        try:
            os.killpg(g, sig)
        except OSError:
            pass
    if groups and sig == signal.SIGTERM:
        time.sleep(3)
"""
_reaper: subprocess.Popen[str] | None = None


def _tell_reaper(message: str) -> None:
    global _reaper
    with contextlib.suppress(OSError, ValueError):
        if _reaper is None or _reaper.poll() is not None:
            _reaper = subprocess.Popen(
                [sys.executable, "-c", _REAPER_SCRIPT],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        assert _reaper.stdin is not None
        _reaper.stdin.write(message + "\n")
        _reaper.stdin.flush()


class ManagedProcess:
    """A service subprocess in its own process group, logging to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [os.fspath(a) for a in argv]
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.healthy_after_s: float | None = None

    # ----------------------------------------------------------------------------------------
    def start(self) -> ManagedProcess:
        """Start the process in a new session, its output appended to :attr:`log_path`."""
        if self.popen is not None:
            raise ServiceError(f"{self.name} already started")
        if not Path(self.argv[0]).exists():
            raise ServiceError(f"{self.name}: binary {self.argv[0]} does not exist")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Only the main thread's death is a reliable parent-death signal (PDEATHSIG is per thread).
        use_pdeathsig = sys.platform == "linux" and threading.current_thread() is threading.main_thread()
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.started_at = time.monotonic()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_pdeathsig_preexec if use_pdeathsig else None,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
            _tell_reaper(f"add {self.popen.pid}")
        return self

    @property
    def pid(self) -> int:
        if self.popen is None:
            raise ServiceError(f"{self.name} not started")
        return self.popen.pid

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def describe_failure(self, what: str) -> str:
        rc = None if self.popen is None else self.popen.poll()
        state = "still running" if rc is None else f"exited with code {rc}"
        return (
            f"{self.name}: {what} ({state}).\n"
            f"command: {' '.join(self.argv)}\n"
            f"log: {self.log_path}\n"
            f"--- last lines of the log ---\n{log_tail(self.log_path)}"
        )

    def wait_healthy(self, check: Callable[[], bool], timeout: float, interval: float = 0.1) -> float:
        """Poll ``check`` until it returns True; return the seconds since :meth:`start`.

        Raises :class:`ServiceError` (with the log tail) if the process exits first or the deadline
        passes. Exceptions from ``check`` count as "not yet healthy"; the last one is reported.
        """
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            if not self.running():
                raise ServiceError(self.describe_failure("exited before becoming healthy"))
            try:
                if check():
                    self.healthy_after_s = time.monotonic() - self.started_at
                    return self.healthy_after_s
                last_error = None
            except Exception as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                why = f"not healthy after {timeout:.0f} s"
                if last_error is not None:
                    why += f"; last health-check error: {last_error!r}"
                raise ServiceError(self.describe_failure(why))
            time.sleep(interval)

    def pause(self) -> None:
        """SIGSTOP the whole process group: it holds what it holds and answers nothing until :meth:`resume`."""
        _signal_group(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        _signal_group(self.pid, signal.SIGCONT)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the whole process group, SIGKILL it after ``grace`` seconds; return the exit code."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self.popen is None:
            return None
        pgid = self.popen.pid  # start_new_session: the child leads its own group
        if self.popen.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            _signal_group(pgid, signal.SIGCONT)  # a paused group handles its SIGTERM only once resumed
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                self.popen.wait(timeout=30)
        # The leader is gone; anything it left behind in the group goes too.
        _signal_group(pgid, signal.SIGKILL)
        with _LIVE_LOCK:
            _tell_reaper(f"del {pgid}")
        return self.popen.returncode

    def __repr__(self) -> str:
        pid = self.popen.pid if self.popen else None
        return f"ManagedProcess({self.name!r}, pid={pid}, log={str(self.log_path)!r})"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@atexit.register
def stop_all() -> None:
    """Stop every process still registered (the safety net behind the fixture finalizers)."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.stop(grace=5.0)
    if _reaper is not None and _reaper.stdin is not None:
        with contextlib.suppress(OSError):
            _reaper.stdin.close()  # nothing left to reap: it exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            _reaper.wait(timeout=5)


def live_processes() -> list[ManagedProcess]:
    """The processes started here and not yet stopped."""
    with _LIVE_LOCK:
        return list(_LIVE)


# ---------------------------------------------------------------------------------------------
# Binaries


def testbin_cache_root() -> Path:
    """Where ``scripts/testbin.sh`` caches its builds (``$ECHORL_TESTBIN`` or ``~/.cache/echorl/testbin``)."""
    root = os.environ.get("ECHORL_TESTBIN")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "echorl" / "testbin"


def run_testbin(log_path: Path | None = None, timeout: float | None = None) -> Path:
    """Return the directory holding ``minio``, ``etcd``, ``kube-apiserver`` and ``kubectl``.

    ``$ECHORL_TESTBIN_DIR`` wins if set. Otherwise ``scripts/testbin.sh`` runs (well under a second
    when its cache is warm; a cold build takes many minutes) and the last line of its stdout is the
    bin directory. Its stderr goes to ``log_path`` when given. Raises :class:`ServiceError` with the
    script's output if it fails.
    """
    override = os.environ.get("ECHORL_TESTBIN_DIR")
    if override:
        bin_dir = Path(override)
        _check_bin_dir(bin_dir, f"$ECHORL_TESTBIN_DIR={override}")
        return bin_dir
    if log_path is None:
        proc = subprocess.run(
            ["bash", str(TESTBIN_SCRIPT)],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        err_text = proc.stderr.decode("utf-8", errors="replace")
    else:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as err:
            proc = subprocess.run(
                ["bash", str(TESTBIN_SCRIPT)],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                timeout=timeout,
                check=False,
            )
        err_text = log_tail(log_path, max_lines=60)
    out_lines = proc.stdout.decode("utf-8", errors="replace").strip().splitlines()
    if proc.returncode != 0 or not out_lines:
        tail = "\n".join(err_text.splitlines()[-60:])
        raise ServiceError(
            f"scripts/testbin.sh failed with exit code {proc.returncode}"
            + (f" (log: {log_path})" if log_path else "")
            + f"\n--- its output ---\n{tail}"
        )
    bin_dir = Path(out_lines[-1].strip())
    _check_bin_dir(bin_dir, "scripts/testbin.sh")
    return bin_dir


def _check_bin_dir(bin_dir: Path, source: str) -> None:
    missing = [n for n in ("minio", "etcd", "kube-apiserver", "kubectl") if not (bin_dir / n).is_file()]
    if missing:
        raise ServiceError(f"{source}: {bin_dir} lacks {', '.join(missing)}")
