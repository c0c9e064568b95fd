"""Local-run child processes: logs captured, and every process (and its children) really stopped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from echo_runtime.runner.procs import Processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_logs_and_exit_codes(tmp_path: Path) -> None:
    procs = Processes(tmp_path)
    child = procs.start("hello", [sys.executable, "-c", "print('hi'); import sys; sys.exit(3)"])
    child.proc.wait(timeout=60)
    assert child.returncode == 3
    assert procs.exited() == [child]
    assert child.log_tail() == "hi"


def test_stop_all_kills_grandchildren_and_ignores_sigterm(tmp_path: Path) -> None:
    procs = Processes(tmp_path)
    pidfile = tmp_path / "grandchild.pid"
    # A child that ignores SIGTERM and starts a grandchild: both must be gone after stop_all.
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = procs.start("stubborn", [sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, child.log_tail()
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    assert _alive(child.proc.pid) and _alive(grandchild)
    procs.stop_all(grace_s=0.5)
    assert child.returncode is not None
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
