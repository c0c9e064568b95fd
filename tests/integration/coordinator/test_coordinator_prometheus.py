"""A real Prometheus scrapes a real coordinator process while worker threads and a trainer loop drive it,
and every coordinator panel of the Grafana dashboard (charts/echorl-operator/dashboards/echojob.json)
returns data for the job; the values agree with the coordinator's own status.

The operator's panels are shown against the real node (tests/e2e/test_e2e_prometheus.py), where the
operator runs; here there is none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from coordinator_procs import RunningCoordinator
from test_coordinator_process import run_worker

from services import prometheus as prom
from services.procs import free_ports

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def scraped(
    coordinator_factory: Callable[..., RunningCoordinator], testbin_dir: Path, tmp_path: Path
) -> Iterator[tuple[RunningCoordinator, prom.Prometheus]]:
    c = coordinator_factory("Async", max_staleness=1, batch_size=2, buffer_size=6)
    server = prom.start_prometheus(
        testbin_dir,
        tmp_path / "prometheus",
        [prom.ScrapeJob("echorl-coordinators", [f"127.0.0.1:{c.port}"], honor_labels=True)],
        port=free_ports(1)[0],
    )
    try:
        yield c, server
    finally:
        server.stop()


def test_every_coordinator_panel_of_the_dashboard_returns_data(
    scraped: tuple[RunningCoordinator, prom.Prometheus],
) -> None:
    c, server = scraped
    stop = threading.Event()
    workers = [threading.Thread(target=run_worker, args=(c, stop), daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    trainer, version = c.trainer(), 0
    queries = [q for q in prom.dashboard_queries(c.job) if "echorl_operator_" not in q.expr]
    assert len(queries) >= 15  # the coordinator's panels: staleness, rollouts/s, busy, drops, reward...
    try:
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:  # ~20 s of training under 1 s scrapes: rates have samples
            trainer.announce(version)
            trainer.wait_batch(version, timeout=60)
            time.sleep(0.2)  # the step's own time: the trainer is busy part of the time
            version += 1
        results = prom.wait_for_data(server, queries, timeout=30.0)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=10)
    missing = [f"{q.panel} / {q.legend}: {q.expr}" for q in queries if not results.get(q)]
    assert not missing, "panels without data:\n" + "\n".join(missing)

    up = server.targets()
    assert [t["health"] for t in up] == ["up"], up
    # honor_labels: the job label is the EchoJob's name, which the dashboard's $job selects
    for q, vector in results.items():
        assert {s["metric"].get("job") for s in vector} <= {c.job, None}, (q, vector)

    def value(legend_prefix: str) -> float:
        (q,) = [q for q in queries if q.legend.startswith(legend_prefix)]
        return float(results[q][0]["value"][1])

    status = c.status()
    assert value("Δmax") == 1.0
    assert 0.0 <= value("largest consumed") <= 1.0  # within the bound
    assert value("version") >= version - 2 > 0
    assert 0.0 < value("busy") <= 1.0
    assert value("reward") == status.reward == 1.0  # the workers answer every arithmetic prompt right
    (pool,) = [q for q in queries if q.panel == "Rollouts/s per pool"]
    assert [s["metric"]["pool"] for s in results[pool]] == ["cpu"] and float(results[pool][0]["value"][1]) > 0
