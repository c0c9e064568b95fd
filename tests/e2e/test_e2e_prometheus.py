"""Monitoring on the real node: a real Prometheus, inside the cluster's network namespace, scrapes both
operator replicas (their pods' metrics port, what the chart's ServiceMonitor selects) and a running job's
coordinator (its pod's ``http`` port with honor_labels, what the chart's PodMonitor selects), and every
panel of the Grafana dashboard (charts/echorl-operator/dashboards/echojob.json) returns data for the job.

Prometheus gets static targets (the pods' IPs read from the API server): it is built without service
discovery (scripts/testbin.sh), and no prometheus-operator runs here to turn the monitors into scrape
configs; the chart's tests (tests/integration/operator/test_operator_chart.py) show the monitors select
these same pods and ports.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_kit import E2E
from test_e2e_echojob import echojob

from services import prometheus as prom

pytestmark = pytest.mark.timeout(900)

OPERATOR_METRICS_PORT = 8081
COORDINATOR_PORT = 8700


def test_a_real_prometheus_fills_every_panel_of_the_dashboard(e2e: E2E, tmp_path: Path) -> None:
    cluster = e2e.cluster
    e2e.apply(echojob("watched", max_steps=400))  # long enough to still run while Prometheus scrapes
    e2e.until("the job publishes version 3", lambda: e2e.version("watched") >= 3)
    operators = cluster.kubectl_json(
        "get", "pods", "-n", "echorl-system", "-l", "app.kubernetes.io/component=operator",
        "--field-selector=status.phase=Running",
    )["items"]  # fmt: skip
    assert len(operators) == 2, [p["metadata"]["name"] for p in operators]
    (coordinator,) = e2e.pods("echorl.dev/component=coordinator", "status.phase=Running")
    server = prom.start_prometheus(
        cluster.bin_dir,
        tmp_path / "prometheus",
        [
            prom.ScrapeJob(
                "echorl-operator", [f"{p['status']['podIP']}:{OPERATOR_METRICS_PORT}" for p in operators]
            ),
            prom.ScrapeJob(
                "echorl-coordinators",
                [f"{coordinator['status']['podIP']}:{COORDINATOR_PORT}"],
                honor_labels=True,
            ),
        ],
        wrap=cluster.ns.argv,
        call=cluster.inside,
        env=cluster.env(),
    )
    try:
        queries = prom.dashboard_queries("watched", rate_interval="1m")
        results = prom.wait_for_data(server, queries, timeout=240.0)
        targets = server.targets()
        leaders = server.query("echorl_operator_leader")
    finally:
        server.stop()
    e2e.note(f"{len(queries)} dashboard queries, {sum(bool(v) for v in results.values())} with data")
    missing = [f"{q.panel} / {q.legend}: {q.expr}" for q in queries if not results.get(q)]
    assert not missing, "panels without data:\n" + "\n".join(missing)
    assert sorted(t["health"] for t in targets) == ["up"] * 3, targets
    assert sorted(float(s["value"][1]) for s in leaders) == [0.0, 1.0]  # one leader, one follower
    for q, vector in results.items():
        if "echorl_coordinator_" in q.expr:
            assert {s["metric"].get("job") for s in vector} <= {"watched", None}, (q, vector)
    (version,) = [q for q in queries if q.legend.startswith("version")]
    assert float(results[version][0]["value"][1]) >= 3
    (bound,) = [q for q in queries if q.legend.startswith("Δmax")]
    (largest,) = [q for q in queries if q.legend.startswith("largest consumed")]
    assert 0 <= float(results[largest][0]["value"][1]) <= float(results[bound][0]["value"][1])
    (running,) = [s for q, v in results.items() if q.panel == "EchoJobs by phase" for s in v
                  if s["metric"]["phase"] == "Running"]  # fmt: skip
    assert float(running["value"][1]) >= 1
