"""A real Prometheus server (built by ``scripts/testbin.sh`` from ``github.com/prometheus/prometheus``, without
service discovery plugins) scraping fixed targets, and the dashboard's PromQL run against it.

:func:`start_prometheus` writes a configuration with one scrape job per entry of ``scrape`` (static
targets, a 1 s interval, ``honor_labels`` where asked — as the chart's PodMonitor sets it for
coordinators), starts the server listening on ``127.0.0.1:<port>`` (``wrap`` puts it inside a network
namespace, where that loopback is the namespace's own) and waits until it is ready. Queries go through
``call``, which runs a function where the server is reachable (the test cluster's namespace, or here).

:func:`dashboard_queries` turns the Grafana dashboard's panels into the PromQL Grafana would send, its
variables filled in: ``$job`` with the job's name, ``$__rate_interval`` with a window that holds enough
samples at the test's scrape interval.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from services.procs import REPO_ROOT, ManagedProcess, ServiceError

DASHBOARD = REPO_ROOT / "charts" / "echorl-operator" / "dashboards" / "echojob.json"
START_TIMEOUT_S = 60.0
T = TypeVar("T")


def _here(fn: Callable[[], T], timeout: float = 30.0) -> T:
    return fn()


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: Sequence[str]
    """``host:port`` of each target."""
    honor_labels: bool = False
    path: str = "/metrics"


def config(scrape: Sequence[ScrapeJob], interval: str = "1s") -> str:
    cfg = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {
                "job_name": job.name,
                "honor_labels": job.honor_labels,
                "metrics_path": job.path,
                "static_configs": [{"targets": list(job.targets)}],
            }
            for job in scrape
        ],
    }
    return yaml.safe_dump(cfg, sort_keys=False)


@dataclass
class Prometheus:
    process: ManagedProcess
    url: str
    call: Callable[[Callable[[], Any], float], Any]

    def _get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"

        def fetch() -> Any:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return json.loads(reply.read())

        body = self.call(fetch, 15.0)
        if body.get("status") != "success":
            raise ServiceError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now (Prometheus's HTTP API)."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise ServiceError(f"{expr!r} gave a {data['resultType']}, not a vector")
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets", state="active")["activeTargets"])

    def stop(self) -> None:
        self.process.stop()


def start_prometheus(
    bin_dir: Path,
    workdir: Path,
    scrape: Sequence[ScrapeJob],
    *,
    port: int = 9090,
    wrap: Callable[[Sequence[str | Path]], Sequence[str | Path]] | None = None,
    call: Callable[[Callable[[], Any], float], Any] = _here,
    env: Mapping[str, str] | None = None,
    timeout: float = START_TIMEOUT_S,
) -> Prometheus:
    binary = bin_dir / "prometheus"
    if not binary.is_file():
        raise ServiceError(f"{binary} is missing: run scripts/testbin.sh (it builds Prometheus)")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(config(scrape))
    argv: list[str | Path] = [
        binary,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    full = list(wrap(argv)) if wrap is not None else argv
    process = ManagedProcess("prometheus", full, log_path=workdir / "prometheus.log", env=env).start()
    server = Prometheus(process, f"http://127.0.0.1:{port}", call)

    def ready() -> bool:
        def fetch() -> bool:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=5) as reply:
                return bool(reply.status == 200)

        return bool(call(fetch, 10.0))

    try:
        process.wait_healthy(ready, timeout, interval=0.25)
    except BaseException:
        process.stop()
        raise
    return server


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    legend: str
    expr: str


def dashboard_queries(job: str, rate_interval: str = "30s", path: Path = DASHBOARD) -> list[PanelQuery]:
    """Every target of every panel of the dashboard, as Grafana would send it for ``job``."""
    dashboard = json.loads(path.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", rate_interval).replace("$job", job)
            out.append(PanelQuery(panel["title"], target.get("legendFormat", ""), expr))
    return out


def wait_for_data(
    prometheus: Prometheus, queries: Sequence[PanelQuery], timeout: float, interval: float = 2.0
) -> dict[PanelQuery, list[dict[str, Any]]]:
    """Poll until every query returns a non-empty vector; the results, or, at the deadline, those that
    had data (the caller names the ones missing)."""
    deadline = time.monotonic() + timeout
    results: dict[PanelQuery, list[dict[str, Any]]] = {}
    while True:
        for q in queries:
            if not results.get(q):
                results[q] = prometheus.query(q.expr)
        if all(results.values()) or time.monotonic() > deadline:
            return results
        time.sleep(interval)
