"""How much memory a local run's processes hold: peak resident set per process and of the whole run.

``echorl run`` samples, at every pass of its monitor loop, the resident set (``VmRSS``) of each
child's whole process group — a trainer under torchrun is several processes, the coordinator has its
scoring processes — and of the runner itself (which samples and trains in a Colocated run). It keeps
each process's peak and the peak of their sum at one moment (the sum of the per-process peaks can only
be larger). ``summary.json`` reports both, in MiB.

Resident sets overlap: every torch process maps the same libraries (about 320 MiB of libtorch and its
kin are shared, clean pages), and each process's ``VmRSS`` counts them whole, so the sum of resident
sets counts them once per process. The *proportional* set size (``Pss`` in ``/proc/<pid>/smaps_rollup``)
divides each shared page among the processes that map it; the sum of the processes' PSS at one moment
(``peakTotalPssMiB``) is what the machine holds for the run at once, and what compares with another
system's single process.

Linux only (``/proc``); elsewhere the report says it was not measured. Sampling misses a peak shorter
than the monitor's interval; the kernel's own high-water mark (``VmHWM``) of each live process is read
too, so a process's own peak is not missed while it lives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

PROC = Path("/proc")
RUNNER = "runner"


def parse_stat_group(stat: str) -> int:
    """The process group of a ``/proc/<pid>/stat`` line (the 5th field; the command may hold spaces
    and parentheses, so fields are counted after its last ``)``)."""
    rest = stat[stat.rindex(")") + 2 :].split()
    return int(rest[2])


def parse_status_kib(status: str, key: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), 0 when absent (a kernel thread,
    a zombie)."""
    for line in status.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # the process ended between listing and reading
        return None


class MemoryWatch:
    """Peak resident memory of named process groups (and of this process), sampled on demand."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc
        self.available = (proc / "self" / "status").exists()
        self.peak_kib: dict[str, int] = {}
        self.peak_total_kib = 0
        self.peak_total_pss_kib = 0
        self.samples = 0

    def sample(self, groups: Mapping[str, int]) -> dict[str, int]:
        """Read the RSS of every process in each group (``name → process group id``) and of this process;
        update the peaks; return this sample's KiB per name."""
        if not self.available:
            return {}
        members: dict[int, list[Path]] = {gid: [] for gid in groups.values()}
        for entry in self._pids():
            stat = _read(entry / "stat")
            if stat is None:
                continue
            try:
                gid = parse_stat_group(stat)
            except (ValueError, IndexError):
                continue
            if gid in members:
                members[gid].append(entry)
        now: dict[str, int] = {}
        pss = 0
        for name, gid in groups.items():
            rss = hwm = 0
            for entry in members[gid]:
                status = _read(entry / "status")
                if status is not None:
                    rss += parse_status_kib(status, "VmRSS")
                    hwm = max(hwm, parse_status_kib(status, "VmHWM"))
                pss += parse_status_kib(_read(entry / "smaps_rollup") or "", "Pss")
            now[name] = rss
            # A group's peak is at least its largest member's own high-water mark.
            self.peak_kib[name] = max(self.peak_kib.get(name, 0), rss, hwm)
        own = _read(self.proc / "self" / "status") or ""
        now[RUNNER] = parse_status_kib(own, "VmRSS")
        pss += parse_status_kib(_read(self.proc / "self" / "smaps_rollup") or "", "Pss")
        self.peak_kib[RUNNER] = max(self.peak_kib.get(RUNNER, 0), parse_status_kib(own, "VmHWM"))
        self.peak_total_kib = max(self.peak_total_kib, sum(now.values()))
        self.peak_total_pss_kib = max(self.peak_total_pss_kib, pss)
        self.samples += 1
        return now

    def report(self) -> dict[str, object]:
        """What ``summary.json`` holds under ``memory``."""
        if not self.available or not self.samples:
            return {
                "measured": False,
                "reason": "no /proc here (Linux only)" if not self.available else "no sample",
            }
        mib = 1024.0
        return {
            "measured": True,
            "peakRssMiB": {k: round(v / mib, 1) for k, v in sorted(self.peak_kib.items())},
            "peakTotalRssMiB": round(self.peak_total_kib / mib, 1),
            "peakTotalPssMiB": round(self.peak_total_pss_kib / mib, 1) if self.peak_total_pss_kib else None,
            "samples": self.samples,
        }

    def _pids(self) -> Iterable[Path]:
        try:
            return [p for p in self.proc.iterdir() if p.name.isdigit()]
        except OSError:
            return []


def group_ids(children: Mapping[str, object]) -> dict[str, int]:
    """``name → process group id`` of running children (each runs in a group of its own, led by it)."""
    out: dict[str, int] = {}
    for name, child in children.items():
        proc = getattr(child, "proc", None)
        if proc is not None and proc.poll() is None:
            out[name] = int(proc.pid)
    return out
