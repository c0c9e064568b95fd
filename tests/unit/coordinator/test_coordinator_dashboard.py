"""The Grafana dashboard (charts/echorl-operator/dashboards/echojob.json) names only metrics Echo exports,
covers what an operator of a job watches, and is a dashboard Grafana can import. Real Prometheus runs
its queries in tests/integration/coordinator/test_coordinator_prometheus.py and on the real node."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from coordinator_helpers import TRAINER_TOKEN
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from test_coordinator_api import bearer, join, rollouts

from echo_operator import metrics as operator_metrics
from echo_runtime.coordinator import api
from services.prometheus import DASHBOARD, dashboard_queries

METRIC = re.compile(r"\becho(?:rl)?_[a-z_]+")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def exported(make_service: Callable[..., api.Service]) -> set[str]:
    """Sample names a coordinator that has seen a batch and a step exports, and the operator's."""
    clock = [0.0]
    with TestClient(api.create_app(make_service(clock=lambda: clock[0]))) as c:
        wid, headers = join(c)
        for task in c.post(f"/v1/workers/{wid}/leases", json={"maxTasks": 2}, headers=headers).json()[
            "tasks"
        ]:
            c.post(
                f"/v1/workers/{wid}/tasks/{task['taskId']}/rollouts",
                json={"rollouts": rollouts(task["prompt"])},
                headers=headers,
            )
        trainer = bearer(TRAINER_TOKEN)
        c.post("/v1/trainer/batches", json={"version": 0}, headers=trainer)
        c.post("/v1/trainer/version", json={"version": 1}, headers=trainer)
        clock[0] = 1.0
        c.post("/v1/trainer/batches", json={"version": 1, "waitSeconds": 0}, headers=trainer)
        text = c.get("/metrics").text
    text += generate_latest(operator_metrics.REGISTRY).decode()
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    # a labelled family with no child yet (no reconcile so far) exports only its TYPE line
    # (the text format names a counter's family with its _total already)
    suffixes = {"histogram": ("_bucket", "_sum", "_count")}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ")
            names |= {family + suffix for suffix in suffixes.get(kind, ("",))}
    return names


def test_every_metric_the_dashboard_queries_is_exported(
    dashboard: dict[str, Any], make_service: Callable[..., api.Service]
) -> None:
    names = exported(make_service)
    queried = {m for q in dashboard_queries("j") for m in METRIC.findall(q.expr)}
    assert queried, "no metric found in the dashboard's queries"
    assert queried - names == set()


def test_the_dashboard_covers_what_the_issue_asks_and_imports_in_grafana(dashboard: dict[str, Any]) -> None:
    titles = [p["title"] for p in dashboard["panels"] if p["type"] != "row"]
    for wanted in ("Staleness against Δmax", "Rollouts/s per pool", "Trainer busy", "Drops and filters",
                   "Reward", "Quarantines", "EchoJobs by phase", "Leader"):  # fmt: skip
        assert any(t.startswith(wanted) for t in titles), (wanted, titles)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "job"}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            if "echorl_coordinator_" in target["expr"]:
                assert 'job=~"$job"' in target["expr"], target["expr"]  # every job panel follows $job
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
