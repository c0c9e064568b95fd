"""Request-duration histogram of the coordinator (coordinator.metrics.Latency, route_of)."""

from __future__ import annotations

import pytest

from echo_runtime.coordinator import metrics


@pytest.mark.parametrize(
    ("method", "path", "route"),
    [
        ("POST", "/v1/workers", "register"),
        ("POST", "/v1/workers/w-1/heartbeat", "heartbeat"),
        ("POST", "/v1/workers/w-1/leases", "lease"),
        ("POST", "/v1/workers/w-1/tasks/t-9/rollouts", "submit"),
        ("DELETE", "/v1/workers/w-1", "leave"),
        ("POST", "/v1/trainer/version", "version"),
        ("POST", "/v1/trainer/batches", "batches"),
        ("POST", "/v1/trainer/quarantine", "quarantine"),
        ("GET", "/v1/status", "status"),
        ("GET", "/metrics", "metrics"),
        ("GET", "/v1/workers", "other"),
        ("POST", "/v1/workers/w-1/tasks/t-9", "other"),
        ("POST", "/v1/trainer/batches/extra", "other"),
        ("GET", "/nowhere", "other"),
    ],
)
def test_route_names_carry_no_ids(method: str, path: str, route: str) -> None:
    assert metrics.route_of(method, path) == route
    assert route in metrics.ROUTES


def test_durations_fall_in_the_bucket_whose_bound_is_not_below_them() -> None:
    latency = metrics.Latency(buckets=(0.01, 0.1, 1.0))
    for seconds in (0.005, 0.01, 0.0100001, 0.5, 3.0):
        latency.observe("submit", seconds)
    assert latency.counts["submit"] == [2, 1, 1, 1]  # le=0.01 holds 0.005 and 0.01 itself; +Inf holds 3.0
    assert latency.sums["submit"] == pytest.approx(0.005 + 0.01 + 0.0100001 + 0.5 + 3.0)
