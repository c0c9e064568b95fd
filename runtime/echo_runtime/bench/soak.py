"""Soak: a long ``echorl run`` sampled for anything that grows without bound.

:func:`watch` starts ``echorl run`` on a job and, every ``every`` policy versions, samples

* each process's resident memory (``VmRSS`` of its whole process group, as ``summary.json`` counts
  it), open file descriptors and threads — the coordinator, each worker, the trainer, the evaluator and
  ``echorl run`` itself;
* the snapshot store: versions, checkpoints, bytes (every object under the job's root, orphans of
  interrupted publishes included) and live pins;
* the coordinator (its ``/metrics``): groups in the replay buffer, tasks pending and leased, workers, and
  the p99 of request durations since the previous sample, per endpoint (``request_seconds``).

:func:`judge` then fits a least-squares line to every series over the samples after the warm-up and
fails the ones whose growth over that window exceeds their allowance (tasks leased: the series of its
running minimum, :data:`LEASE_FLOOR_SPAN`) (:class:`Allowance`: an
absolute amount, for memory a share of the level too). A leak is a failed run, whatever its size per
step, once the run is long enough for it to pass the allowance: 5000 quickstart steps find a leak of a
few KiB per step (``benchmarks/soak.py``); the suite's 300 steps find tens of KiB per step. Bounded
quantities (store versions and checkpoints, the buffer) are checked against the ceiling the manifest
sets. Sampling stops at the last version: what follows is the run winding down.

Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from echo_runtime import snapshots, spec, staleness
from echo_runtime.coordinator import config as coordinator_config
from echo_runtime.runner import memory

PROC = Path("/proc")
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Reads the coordinator's ``/metrics`` on 127.0.0.1 directly: never through an ``http_proxy`` of the
environment (nothing the soak does may leave the machine)."""
SHORT_ROUTES = ("heartbeat", "submit", "version")
"""Endpoints whose p99 is watched (lease and batches are long-polls: their duration is the wait)."""


# --- the processes of a run --------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # fields from the 3rd (state) on


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid``."""
    out = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                out.append(int(entry.name))
    return sorted(out)


def cmdline(pid: int) -> list[str]:
    try:
        return [
            a.decode(errors="replace") for a in (PROC / str(pid) / "cmdline").read_bytes().split(b"\0") if a
        ]
    except OSError:
        return []


def role_of(argv: Sequence[str]) -> str | None:
    """What a child of ``echorl run`` is, from its argv: ``coordinator``, ``worker:<pool>``, ``trainer``,
    ``evaluator``, ``prepare`` (the model's preparation before the run), or None."""
    if "echo_runtime.runner.evaluator" in argv:
        return "evaluator"
    if "echo_runtime.runner.prepare_model" in argv:
        return "prepare"
    if "echo_runtime.cli" not in argv[:-1]:
        return None
    command = argv[argv.index("echo_runtime.cli") + 1]  # after torchrun's own options too
    if command == "worker":
        pool = argv[argv.index("--pool") + 1] if "--pool" in argv[:-1] else "?"
        return f"worker:{pool}"
    return command if command in ("coordinator", "trainer") else None


def group_members(groups: Mapping[str, int]) -> dict[str, list[int]]:
    """Pids in each process group (``name → group id``)."""
    wanted = {gid: name for name, gid in groups.items()}
    out: dict[str, list[int]] = {name: [] for name in groups}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[2]) in wanted:
                out[wanted[int(fields[2])]].append(int(entry.name))
    return out


def count_fds(pid: int) -> int:
    try:
        return len(os.listdir(PROC / str(pid) / "fd"))
    except OSError:
        return 0


def count_threads(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[17]) if fields is not None else 0  # num_threads, the 20th field


# --- the coordinator's metrics -----------------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
        out.append((m["name"], labels, float(m["value"])))
    return out


def latency_buckets(
    samples: Iterable[tuple[str, dict[str, str], float]],
) -> dict[str, list[tuple[float, float]]]:
    """Cumulative ``(upper bound, count)`` buckets of ``echorl_coordinator_request_seconds`` per route."""
    out: dict[str, list[tuple[float, float]]] = {}
    for name, labels, value in samples:
        if name == "echorl_coordinator_request_seconds_bucket":
            out.setdefault(labels["route"], []).append((float(labels["le"]), value))
    return {route: sorted(b) for route, b in out.items()}


def quantile(
    q: float, now: Sequence[tuple[float, float]], before: Sequence[tuple[float, float]] = ()
) -> float | None:
    """The ``q`` quantile of the observations between two cumulative histograms, interpolated inside
    its bucket as Prometheus's ``histogram_quantile`` does (the largest finite bound if it falls in
    ``+Inf``); None without observations."""
    earlier = dict(before)
    counts = [(bound, n - earlier.get(bound, 0.0)) for bound, n in now]
    if not counts or counts[-1][1] <= 0:
        return None
    rank, lower, below = q * counts[-1][1], 0.0, 0.0
    for bound, cumulative in counts:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


# --- sampling a run ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    version: int
    time: float
    rss_mib: dict[str, float]
    fds: dict[str, int]
    threads: dict[str, int]
    store_bytes: int
    store_versions: int
    store_checkpoints: int
    pins: int
    buffer_groups: float
    tasks_pending: float
    tasks_leased: float
    workers: float
    p99_ms: dict[str, float | None]


def store_usage(store: snapshots.SnapshotStore) -> tuple[int, int, int, int]:
    """(bytes under the job's root, versions, checkpoints, live pins)."""
    total = sum(info.size for info in store.blobs.list(store.layout.root + "/"))
    return total, len(store.versions()), len(store.checkpoints()), len(store.pins())


class Watch:
    """Samples a running ``echorl run`` (process ``runner``) and the store of ``job``."""

    def __init__(self, runner: subprocess.Popen[bytes], job: spec.ResolvedJob) -> None:
        self.runner = runner
        self.store = snapshots.open_store(job.spec.storage, job.name)
        self.port: int | None = None
        self.previous_buckets: dict[str, list[tuple[float, float]]] = {}

    def groups(self) -> dict[str, int]:
        """``name → process group`` of the runner and each of its children (workers numbered)."""
        out = {"runner": self.runner.pid}
        seen: dict[str, int] = {}
        for pid in children_of(self.runner.pid):
            argv = cmdline(pid)
            role = role_of(argv)
            if role is None or role == "prepare":
                continue
            if role == "coordinator" and "--port" in argv[:-1]:
                self.port = int(argv[argv.index("--port") + 1])
            if role.startswith("worker:"):
                seen[role] = seen.get(role, -1) + 1
                role = f"{role}-{seen[role]}"
            out[role] = pid
        return out

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        if self.port is None:
            self.groups()
        if self.port is None:
            return []
        try:
            with _LOOPBACK.open(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                return parse_metrics(r.read().decode())
        except OSError:
            return []

    def version(self, samples: list[tuple[str, dict[str, str], float]] | None = None) -> int | None:
        for name, _, value in samples if samples is not None else self.metrics():
            if name == "echorl_coordinator_policy_version":
                return int(value)
        return None

    def sample(self, t0: float) -> Sample | None:
        scraped = self.metrics()
        version = self.version(scraped)
        if version is None:
            return None
        groups = self.groups()
        members = group_members(groups)
        watch = memory.MemoryWatch(PROC)
        rss = watch.sample(groups)
        gauges = {name: value for name, _, value in scraped if name.startswith("echorl_coordinator_")}
        buckets = latency_buckets(scraped)
        p99 = {}
        for route in SHORT_ROUTES:
            q = quantile(0.99, buckets.get(route, []), self.previous_buckets.get(route, []))
            p99[route] = None if q is None else round(q * 1000.0, 2)
        self.previous_buckets = buckets
        total, versions, checkpoints, pins = store_usage(self.store)
        return Sample(
            version=version,
            time=round(time.time() - t0, 2),
            rss_mib={name: round(rss.get(name, 0) / 1024.0, 1) for name in groups},
            fds={name: sum(count_fds(p) for p in pids) for name, pids in members.items()},
            threads={name: sum(count_threads(p) for p in pids) for name, pids in members.items()},
            store_bytes=total,
            store_versions=versions,
            store_checkpoints=checkpoints,
            pins=pins,
            buffer_groups=gauges.get("echorl_coordinator_buffer_groups", 0.0),
            tasks_pending=gauges.get("echorl_coordinator_tasks_pending", 0.0),
            tasks_leased=gauges.get("echorl_coordinator_tasks_leased", 0.0),
            workers=sum(v for n, _, v in scraped if n == "echorl_coordinator_workers"),
            p99_ms=p99,
        )


def watch(
    job_file: Path,
    run_dir: Path,
    *,
    every: int,
    max_steps: int | None = None,
    extra_args: Sequence[str] = (),
    on_sample: Callable[[Sample], None] | None = None,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
) -> tuple[int, list[Sample]]:
    """Run ``echorl run job_file`` (fresh, in ``run_dir``) and sample it every ``every`` versions;
    return its exit code and the samples. The run is stopped (SIGINT, then SIGKILL) on a timeout or an
    exception."""
    job = spec.load_job(job_file)
    argv = [sys.executable, "-m", "echo_runtime.cli", "run", str(job_file), "--fresh", "--no-progress"]
    argv += ["--run-dir", str(run_dir), *extra_args]
    if max_steps is not None:
        argv += ["--max-steps", str(max_steps)]
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir.parent / f"{run_dir.name}.soak.log").open("wb")
    t0 = time.time()
    runner = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    w = Watch(runner, job)
    last = max_steps if max_steps is not None else job.spec.algorithm.max_steps
    samples: list[Sample] = []
    next_version = 0
    try:
        while runner.poll() is None:
            if timeout_s is not None and time.time() - t0 > timeout_s:
                raise TimeoutError(f"echorl run did not finish in {timeout_s:.0f} s (log: {log.name})")
            version = w.version()
            final = version is not None and version >= last
            if version is not None and version >= next_version and not final:  # not the run's wind-down
                s = w.sample(t0)
                if s is not None:
                    samples.append(s)
                    next_version = (s.version // every + 1) * every
                    if on_sample is not None:
                        on_sample(s)
            time.sleep(poll_s)
        return runner.wait(), samples
    finally:
        if runner.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(runner.pid, signal.SIGINT)
            try:
                runner.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()
        log.close()


# --- judging the samples -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Allowance:
    """How much a series may grow over the judged window: ``absolute`` plus ``relative`` × its level."""

    absolute: float
    relative: float = 0.0

    def of(self, level: float) -> float:
        return self.absolute + self.relative * abs(level)


DEFAULT_ALLOWANCES: dict[str, Allowance] = {
    "rssMiB": Allowance(48.0, 0.03),
    "fds": Allowance(4.0),
    "threads": Allowance(4.0),
    "storeMiB": Allowance(1.0, 0.25),
    "pins": Allowance(2.0),
    "tasksLeased": Allowance(4.0),
    "p99Ms": Allowance(10.0, 0.5),
}


@dataclasses.dataclass(frozen=True)
class Check:
    series: str
    kind: str
    first: float
    last: float
    slope_per_1000: float
    growth: float
    allowed: float
    ceiling: float | None
    peak: float
    ok: bool

    def describe(self) -> str:
        verdict = "flat" if self.ok else "GROWS"
        bound = "" if self.ceiling is None else f", peak {self.peak:g} ≤ {self.ceiling:g}"
        return (
            f"{verdict:5} {self.series}: {self.first:g} → {self.last:g}, {self.slope_per_1000:+.3g} per 1000 "
            f"versions (growth {self.growth:+.3g} over the window, allowed {self.allowed:.3g}{bound})"
        )


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` against ``xs`` (0 for fewer than two distinct ``xs``)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


LEASE_FLOOR_SPAN = 5
"""Samples the tasks-leased series takes its running minimum over. A worker leases a whole batch at a
time, so the gauge swings between 0 and its capacity from one sample to the next and a slope fitted to
it is noise; leases that leak (never submitted, never expired) raise its floor, which is what is judged."""


def series_of(samples: Sequence[Sample]) -> dict[str, tuple[str, list[tuple[int, float]]]]:
    """``series name → (kind, [(version, value)])`` for every quantity sampled."""
    out: dict[str, tuple[str, list[tuple[int, float]]]] = {}

    def add(name: str, kind: str, version: int, value: float | None) -> None:
        if value is not None:
            out.setdefault(name, (kind, []))[1].append((version, float(value)))

    for s in samples:
        for proc, v in s.rss_mib.items():
            add(f"rssMiB[{proc}]", "rssMiB", s.version, v)
        for proc, v in s.fds.items():
            add(f"fds[{proc}]", "fds", s.version, v)
        for proc, v in s.threads.items():
            add(f"threads[{proc}]", "threads", s.version, v)
        add("storeMiB", "storeMiB", s.version, s.store_bytes / 2**20)
        add("storeVersions", "storeVersions", s.version, s.store_versions)
        add("storeCheckpoints", "storeCheckpoints", s.version, s.store_checkpoints)
        add("pins", "pins", s.version, s.pins)
        add("bufferGroups", "bufferGroups", s.version, s.buffer_groups)
        for route, ms in s.p99_ms.items():
            add(f"p99Ms[{route}]", "p99Ms", s.version, ms)
    for i in range(LEASE_FLOOR_SPAN - 1, len(samples)):
        span = samples[i - LEASE_FLOOR_SPAN + 1 : i + 1]
        add("tasksLeased", "tasksLeased", samples[i].version, min(s.tasks_leased for s in span))
    return out


def judge(
    samples: Sequence[Sample],
    *,
    warmup: int,
    ceilings: Mapping[str, float] | None = None,
    allowances: Mapping[str, Allowance] | None = None,
) -> list[Check]:
    """A :class:`Check` of every series over the samples at versions ≥ ``warmup``: its growth (the
    fitted slope times the window's span) must not pass its allowance (scaled by the series' median
    level), and a series with a ceiling (``ceilings`` by kind) must never pass it."""
    allowances = {**DEFAULT_ALLOWANCES, **(allowances or {})}
    ceilings = dict(ceilings or {})
    checks = []
    for name, (kind, points) in series_of(samples).items():
        window = [(v, y) for v, y in points if v >= warmup]
        if len(window) < 3:
            continue
        xs, ys = [float(v) for v, _ in window], [y for _, y in window]
        rate = slope(xs, ys)
        growth = rate * (xs[-1] - xs[0])
        level = sorted(ys)[len(ys) // 2]
        allowance = allowances.get(kind)
        allowed = math.inf if allowance is None else allowance.of(level)
        ceiling = ceilings.get(kind)
        peak = max(ys)
        ok = growth <= allowed and (ceiling is None or peak <= ceiling)
        checks.append(Check(name, kind, ys[0], ys[-1], rate * 1000.0, growth, allowed, ceiling, peak, ok))
    return checks


def ceilings(job: spec.ResolvedJob, readers: int) -> dict[str, float]:
    """What the manifest bounds, by series kind: versions in the store (the newest
    ``max(keepLast, bound + 1)``, one pinned older version per reader, one just published and not yet
    collected), checkpoints (``checkpointKeepLast`` and the one being written), groups in the buffer."""
    retention = job.sync_policy.retention
    bound = staleness.StalenessPolicy.from_spec(job.sync_policy).bound
    return {
        "storeVersions": max(retention.keep_last, bound + 1) + readers + 1,
        "storeCheckpoints": retention.checkpoint_keep_last + 1,
        "bufferGroups": coordinator_config.buffer_capacity(job),
    }


def to_json(samples: Sequence[Sample], checks: Sequence[Check], **meta: Any) -> dict[str, Any]:
    return {
        **meta,
        "samples": [dataclasses.asdict(s) for s in samples],
        "checks": [dataclasses.asdict(c) for c in checks],
        "ok": all(c.ok for c in checks),
    }


def plot(samples: Sequence[Sample], out: Path, title: str) -> None:
    """Four panels against the policy version: RSS per process, fds and threads, the store, the
    coordinator (buffer, leases, pins, p99)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    xs = [s.version for s in samples]
    procs = sorted({p for s in samples for p in s.rss_mib})
    for proc in procs:
        axes[0][0].plot(xs, [s.rss_mib.get(proc, math.nan) for s in samples], label=proc)
        axes[0][1].plot(xs, [s.fds.get(proc, math.nan) for s in samples], label=f"{proc} fds")
    axes[0][0].set_ylabel("resident memory (MiB)")
    axes[0][1].set_ylabel("open file descriptors")
    axes[1][0].plot(xs, [s.store_bytes / 2**20 for s in samples], label="store (MiB)")
    axes[1][0].plot(xs, [s.store_versions for s in samples], label="versions")
    axes[1][0].plot(xs, [s.pins for s in samples], label="live pins")
    axes[1][0].set_ylabel("snapshot store")
    axes[1][1].plot(xs, [s.buffer_groups for s in samples], label="buffer groups")
    axes[1][1].plot(xs, [s.tasks_leased for s in samples], label="tasks leased")
    for route in SHORT_ROUTES:
        axes[1][1].plot(
            xs,
            [math.nan if s.p99_ms.get(route) is None else s.p99_ms[route] for s in samples],
            label=f"p99 {route} (ms)",
        )
    axes[1][1].set_ylabel("coordinator")
    for ax in axes.flat:
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("policy version")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
