"""The soak's judgement (echo_runtime.bench.soak): slopes, allowances, ceilings, quantiles, roles."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import time

import pytest

from echo_runtime.bench import soak


def sample(version: int, **override: object) -> soak.Sample:
    base = soak.Sample(
        version=version,
        time=float(version),
        rss_mib={"trainer": 900.0, "coordinator": 150.0},
        fds={"trainer": 6, "coordinator": 40},
        threads={"trainer": 4, "coordinator": 7},
        store_bytes=3 * 2**20,
        store_versions=4,
        store_checkpoints=2,
        pins=1,
        buffer_groups=8.0,
        tasks_pending=0.0,
        tasks_leased=8.0,
        workers=1.0,
        p99_ms={"heartbeat": 2.0, "submit": 9.0, "version": 4.0},
    )
    return dataclasses.replace(base, **override)  # type: ignore[arg-type]


def failing(checks: list[soak.Check]) -> set[str]:
    return {c.series for c in checks if not c.ok}


def test_a_flat_noisy_run_passes() -> None:
    noise = [0.0, 6.0, -4.0, 3.0, -6.0, 5.0, -2.0, 1.0]
    samples = [
        sample(v, rss_mib={"trainer": 900.0 + noise[i % 8] * 3, "coordinator": 150.0 + noise[(i + 3) % 8]})
        for i, v in enumerate(range(0, 5000, 50))
    ]
    checks = soak.judge(samples, warmup=1000)
    assert checks and failing(checks) == set()


def test_a_slow_memory_leak_fails_once_the_run_is_long_enough() -> None:
    """4 KiB a version: 16 MiB over 4000 versions passes the trainer's allowance (48 MiB + 3 %), 20 KiB a
    version (78 MiB) does not; the short run of the suite would not see the first."""

    def run(kib_per_version: float, last: int) -> set[str]:
        samples = [
            sample(v, rss_mib={"trainer": 900.0 + v * kib_per_version / 1024.0, "coordinator": 150.0})
            for v in range(0, last, 50)
        ]
        return failing(soak.judge(samples, warmup=last // 5))

    assert run(4, 5000) == set()
    assert run(20, 5000) == {"rssMiB[trainer]"}
    assert run(20, 300) == set()
    assert run(700, 300) == {"rssMiB[trainer]"}


def test_a_descriptor_leak_fails_and_a_shrinking_series_does_not() -> None:
    samples = [
        sample(v, fds={"trainer": 6 + v // 200, "coordinator": 60 - v // 100}) for v in range(0, 3000, 50)
    ]
    assert failing(soak.judge(samples, warmup=500)) == {"fds[trainer]"}


def test_the_store_fails_past_its_ceiling_even_when_flat() -> None:
    samples = [sample(v, store_versions=4 + (v % 100 == 0)) for v in range(0, 2000, 50)]
    assert failing(soak.judge(samples, warmup=0, ceilings={"storeVersions": 5})) == set()
    assert failing(soak.judge(samples, warmup=0, ceilings={"storeVersions": 4})) == {"storeVersions"}


def test_a_store_that_keeps_everything_grows() -> None:
    samples = [sample(v, store_bytes=(3 + v // 10) * 2**20) for v in range(0, 1000, 20)]
    assert "storeMiB" in failing(soak.judge(samples, warmup=200))


def test_latency_that_climbs_fails() -> None:
    samples = [sample(v, p99_ms={"heartbeat": 2.0 + v / 20, "submit": 9.0}) for v in range(0, 2000, 50)]
    assert failing(soak.judge(samples, warmup=400)) == {"p99Ms[heartbeat]"}


def test_samples_before_the_warmup_are_not_judged() -> None:
    samples = [sample(v, rss_mib={"trainer": 100.0 + min(v, 500) * 2.0}) for v in range(0, 3000, 50)]
    assert failing(soak.judge(samples, warmup=0)) == {"rssMiB[trainer]"}
    assert failing(soak.judge(samples, warmup=600)) == set()


def test_slope_is_least_squares() -> None:
    assert soak.slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert soak.slope([0, 1, 2], [0, 3, 0]) == pytest.approx(0.0)
    assert soak.slope([5], [1]) == 0.0


def test_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    buckets = [(0.01, 50.0), (0.1, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert soak.quantile(0.5, buckets) == pytest.approx(0.01)
    assert soak.quantile(0.7, buckets) == pytest.approx(0.01 + 0.09 * 0.5)
    assert soak.quantile(0.99, buckets) == pytest.approx(0.1 + 0.9 * 0.9)
    # between two scrapes: only what happened since counts
    before = [(0.01, 50.0), (0.1, 50.0), (1.0, 50.0), (math.inf, 50.0)]
    assert soak.quantile(0.99, buckets, before) == pytest.approx(
        0.1 + 0.9 * 0.95
    )  # 49.5th of 50: 9.5 of the 10 in (0.1, 1]
    assert soak.quantile(0.99, before, before) is None
    assert soak.quantile(0.99, [(0.1, 0.0), (math.inf, 5.0)]) == pytest.approx(
        0.1
    )  # all beyond the last bound


def test_metrics_text_is_parsed_with_labels() -> None:
    text = (
        "# HELP x y\n"
        'echorl_coordinator_request_seconds_bucket{job="j",le="0.005",route="submit"} 3.0\n'
        'echorl_coordinator_request_seconds_bucket{job="j",le="+Inf",route="submit"} 4.0\n'
        'echorl_coordinator_policy_version{job="j"} 12.0\n'
    )
    parsed = soak.parse_metrics(text)
    assert ("echorl_coordinator_policy_version", {"job": "j"}, 12.0) in parsed
    assert soak.latency_buckets(parsed) == {"submit": [(0.005, 3.0), (math.inf, 4.0)]}


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (
            [sys.executable, "-m", "echo_runtime.cli", "coordinator", "--job", "j.yaml", "--port", "9"],
            "coordinator",
        ),
        (
            [
                sys.executable,
                "-m",
                "echo_runtime.cli",
                "worker",
                "--coordinator",
                "http://x",
                "--pool",
                "gpu",
            ],
            "worker:gpu",
        ),
        (
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "-m",
                "echo_runtime.cli",
                "trainer",
            ],
            "trainer",
        ),
        ([sys.executable, "-m", "echo_runtime.runner.evaluator", "--job", "j"], "evaluator"),
        ([sys.executable, "-m", "echo_runtime.runner.prepare_model"], "prepare"),
        ([sys.executable, "-m", "echo_runtime.cli", "snapshots", "ls"], None),
        (["sleep", "1"], None),
    ],
)
def test_roles_are_read_from_argv(argv: list[str], role: str | None) -> None:
    assert soak.role_of(argv) == role


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux /proc")
def test_process_counters_read_proc() -> None:
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        # Popen returns once the child is forked: until it has exec'd, /proc shows this interpreter's argv.
        deadline = time.monotonic() + 10.0
        while soak.cmdline(child.pid) != ["sleep", "30"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert child.pid in soak.children_of(os.getpid())
        assert soak.cmdline(child.pid) == ["sleep", "30"]
        assert soak.group_members({"sleep": child.pid}) == {"sleep": [child.pid]}
        assert soak.count_fds(child.pid) >= 3 and soak.count_threads(child.pid) == 1
    finally:
        child.kill()
        child.wait()


def test_metrics_are_read_without_the_environments_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy in the environment must not carry the soak's requests off the machine."""
    import urllib.request

    monkeypatch.setenv("http_proxy", "http://192.0.2.1:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    assert not any(isinstance(h, urllib.request.ProxyHandler) and h.proxies for h in soak._LOOPBACK.handlers)


def test_leases_swinging_by_a_batch_pass_and_leaked_leases_fail() -> None:
    """One worker leases a whole batch (8) at a time: the gauge is 0 or 8 when sampled. This is the
    series a CI run of the suite's soak recorded, which a slope fitted to the raw gauge called growth.
    Leases that are never given back raise the floor (the running minimum) instead, and fail."""
    seen = [0, 8, 8, 8, 0, 8, 0, 0, 0, 8, 8, 8, 0, 0, 1, 1, 8, 0, 0, 8, 8, 8, 8, 8, 6, 8, 8, 0, 0, 8]
    versions = list(range(0, 300, 10))
    window = [(float(v), float(y)) for v, y in zip(versions, seen, strict=True) if v >= 60]
    raw = soak.slope([x for x, _ in window], [y for _, y in window]) * (window[-1][0] - window[0][0])
    assert raw > soak.DEFAULT_ALLOWANCES["tasksLeased"].of(8.0)  # what judging the raw gauge flagged
    samples = [sample(v, tasks_leased=float(y)) for v, y in zip(versions, seen, strict=True)]
    assert failing(soak.judge(samples, warmup=60)) == set()
    leaking = [sample(v, tasks_leased=float(y + v // 40)) for v, y in zip(versions, seen, strict=True)]
    assert failing(soak.judge(leaking, warmup=60)) == {"tasksLeased"}
