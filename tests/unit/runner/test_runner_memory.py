"""runner.memory: peak resident memory of process groups, read from /proc for real."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from echo_runtime.runner import memory

# A parent that starts a child in its own process group (as torchrun starts ranks); each holds
# `MiB` of touched memory until told to stop.
HOLD = """
import subprocess, sys, time
mib = int(sys.argv[1])
block = bytearray(mib * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
if sys.argv[2] == "parent":
    child = subprocess.Popen([sys.executable, "-c", sys.argv[3], str(mib), "child", sys.argv[3]])
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc")
def test_a_groups_peak_counts_every_member_and_the_total_is_simultaneous() -> None:
    watch = memory.MemoryWatch()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, "150", "parent", HOLD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,  # its own process group, led by it, as Processes.start does
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 30
        now: dict[str, int] = {}
        while time.monotonic() < deadline:  # until the grandchild has touched its block too
            now = watch.sample({"job": proc.pid})
            if now["job"] > 290 * 1024:
                break
            time.sleep(0.2)
        assert now["job"] > 290 * 1024, now  # parent + child, 150 MiB each
    finally:
        proc.communicate(b"", timeout=30)
    report = watch.report()
    assert report["measured"] is True
    peaks = report["peakRssMiB"]
    assert isinstance(peaks, dict) and 290 < peaks["job"] < 600, peaks
    assert peaks[memory.RUNNER] > 10  # this test process itself
    total = report["peakTotalRssMiB"]
    assert isinstance(total, float) and total >= peaks["job"]
    pss = report["peakTotalPssMiB"]  # the two blocks are private: proportional sizes count them whole
    assert isinstance(pss, float) and 290 < pss <= total


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux /proc smaps_rollup")
def test_proportional_sizes_count_pages_shared_by_two_processes_once() -> None:
    """Two processes mapping the same 200 MiB file: each resident set counts it, their PSS halves it."""
    share = (
        "import mmap, sys\n"
        "f = open(sys.argv[1], 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "total = sum(m[i] for i in range(0, len(m), 4096))\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    import tempfile

    with tempfile.NamedTemporaryFile() as data:
        data.write(b"\1" * (200 * 1024 * 1024))
        data.flush()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", share, data.name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            for _ in range(2)
        ]
        try:
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            watch = memory.MemoryWatch()
            now = watch.sample({"a": procs[0].pid, "b": procs[1].pid})
        finally:
            for proc in procs:
                proc.communicate(b"", timeout=30)
    report = watch.report()
    assert now["a"] > 200 * 1024 and now["b"] > 200 * 1024  # each resident set counts the whole file
    rss, pss = report["peakTotalRssMiB"], report["peakTotalPssMiB"]  # both include this process
    assert isinstance(rss, float) and isinstance(pss, float)
    assert pss < rss - 150  # the proportional sum counts the file about once


def test_parsing_stat_and_status() -> None:
    assert memory.parse_stat_group("4242 (a b) c) S 1 4240 4240 0 -1") == 4240
    status = "Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert memory.parse_status_kib(status, "VmRSS") == 102400
    assert memory.parse_status_kib(status, "VmHWM") == 204800
    assert memory.parse_status_kib("Name:\tkthreadd\n", "VmRSS") == 0


def test_without_proc_it_says_it_did_not_measure(tmp_path: Path) -> None:
    watch = memory.MemoryWatch(proc=tmp_path)
    assert watch.sample({"job": 1}) == {}
    assert watch.report() == {"measured": False, "reason": "no /proc here (Linux only)"}


def test_the_runner_itself_never_imports_torch() -> None:
    """`echorl run` only starts and watches processes (the model is prepared in a child of its own):
    importing what it runs loads no torch, which would stay resident for the whole run."""
    probe = (
        "import sys\n"
        "from echo_runtime.cli import run\n"
        "from echo_runtime.runner import local, memory, metrics, plots, prepare_model, session\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out
