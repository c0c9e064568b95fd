"""The operator's own Prometheus metrics: ``GET /metrics`` on ``ECHORL_METRICS_PORT`` (default 8081; 0
turns it off), served by every replica, the follower included (its ``echorl_operator_leader`` is 0).

* ``echorl_operator_reconciles_total{kind, result}`` and ``echorl_operator_reconcile_duration_seconds{kind}``:
  each handler call (``kind``: EchoJob, InferenceSwarm, TrainingSwarm, SyncPolicy, or ``status`` for an
  EchoJob's status pass), ``result`` ``ok`` or ``error`` (an API failure kopf retries);
* ``echorl_operator_api_requests_total{verb, code}``: the operator's calls to the API server (``code`` 0:
  not answered), so a scrape shows its load on the API server and its failures;
* ``echorl_operator_status_writes_total{kind}``: status subresource writes;
* ``echorl_operator_jobs{phase}``: EchoJobs this replica follows, by phase (Pending, Running, Suspended,
  Succeeded, Failed), read from the reconciler's memory at scrape time;
* ``echorl_operator_leader``: 1 while this replica holds the leader Lease (or runs without election).

The coordinators' metrics (``echorl_coordinator_*``) are the jobs' own: each coordinator serves them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("echo_operator.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)
RECONCILES = Counter(
    "echorl_operator_reconciles", "Handler calls, by kind and result.", ["kind", "result"], registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "echorl_operator_reconcile_duration_seconds",
    "Time a handler call took, by kind.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "echorl_operator_api_requests",
    "Requests to the Kubernetes API server, by verb and HTTP status (0: not answered).",
    ["verb", "code"],
    registry=REGISTRY,
)
STATUS_WRITES = Counter(
    "echorl_operator_status_writes", "Writes of a status subresource, by kind.", ["kind"], registry=REGISTRY
)
PHASES = ("Pending", "Running", "Suspended", "Succeeded", "Failed")


class _State(Collector):
    """Gauges read at scrape time: jobs by phase and leadership."""

    def __init__(self) -> None:
        self.phases: Callable[[], dict[str, int]] = dict
        self.leader: Callable[[], bool] = lambda: True

    def collect(self) -> Iterator[GaugeMetricFamily]:
        jobs = GaugeMetricFamily(
            "echorl_operator_jobs", "EchoJobs this replica follows, by phase.", labels=["phase"]
        )
        counts = self.phases()
        for phase in PHASES:
            jobs.add_metric([phase], counts.get(phase, 0))
        yield jobs
        yield GaugeMetricFamily(
            "echorl_operator_leader",
            "1 while this replica holds the leader Lease (or runs without leader election), else 0.",
            value=1.0 if self.leader() else 0.0,
        )


STATE = _State()
REGISTRY.register(STATE)
_served: dict[str, object] = {}
_lock = threading.Lock()


def port_from_env() -> int:
    raw = os.environ.get("ECHORL_METRICS_PORT", "8081")
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"ECHORL_METRICS_PORT: expected a port number (0: off), got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"ECHORL_METRICS_PORT: expected 0..65535, got {port}")
    return port


def address_from_env() -> str:
    """``ECHORL_METRICS_ADDRESS``: where ``/metrics`` listens (default every interface, as a pod's port
    must; a process run beside others, as the tests run it, listens on loopback)."""
    return os.environ.get("ECHORL_METRICS_ADDRESS", "0.0.0.0")


def serve(port: int, address: str | None = None) -> None:
    """Serve ``/metrics`` on ``port`` from a daemon thread, once per process (0: not at all)."""
    with _lock:
        if port == 0 or "server" in _served:
            return
        address = address or address_from_env()
        _served["server"] = start_http_server(port, addr=address, registry=REGISTRY)
    log.info("metrics on http://%s:%d/metrics", address, port)


def api_request(verb: str, code: int) -> None:
    API_REQUESTS.labels(verb, str(code)).inc()
