"""Fuzz the real coordinator process from its published OpenAPI schema (schemathesis): schema-valid and
malformed requests to every operation, with real credentials so that bodies reach the validation code.
No request may be answered 5xx, malformed ones must be rejected with 4xx, and every reply must match the
schema the coordinator publishes."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from coordinator_procs import POOL_TOKEN, REPO, TRAINER_TOKEN, RunningCoordinator, job_yaml
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from services import procs

pytestmark = pytest.mark.timeout(180)  # a hang fails fast, with a traceback


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCoordinator]:
    tmp = tmp_path_factory.mktemp("fuzz")
    job, tokens = tmp / "job.yaml", tmp / "tokens.json"
    job.write_text(job_yaml("fuzz", tmp / "store", "Async", 1, 2, 2, 4, 0))
    tokens.write_text(json.dumps({"trainer": TRAINER_TOKEN, "pools": {"cpu": POOL_TOKEN}}))
    port = procs.free_ports(1)[0]
    argv = [
        sys.executable,
        "-m",
        "echo_runtime.coordinator",
        "--job",
        str(job),
        "--tokens-file",
        str(tokens),
        "--vocab-size",
        "100",
        "--port",
        str(port),
        "--no-store",
        "--log-level",
        "warning",
    ]
    coordinator = RunningCoordinator(argv, port, tmp / "coordinator.log", tmp / "store", "fuzz")
    coordinator.start()
    yield coordinator
    assert coordinator.process is not None and coordinator.process.running(), "the coordinator died"
    log = Path(coordinator.log).read_text()
    coordinator.stop()
    assert "Traceback" not in log, log[-3000:]


OPERATIONS = [
    ("POST", "/v1/workers"),
    ("POST", "/v1/workers/{workerId}/heartbeat"),
    ("POST", "/v1/workers/{workerId}/leases"),
    ("POST", "/v1/workers/{workerId}/tasks/{taskId}/rollouts"),
    ("DELETE", "/v1/workers/{workerId}"),
    ("POST", "/v1/trainer/version"),
    ("POST", "/v1/trainer/batches"),
    ("GET", "/v1/status"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
]


@pytest.fixture(scope="module")
def api_schema(fuzzed: RunningCoordinator) -> Any:
    return schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")


def register(url: str) -> tuple[str, str]:
    body = {"pool": "cpu", "backend": "transformers", "device": "cpu", "dtype": "float32", "capacity": 4}
    r = httpx.post(f"{url}/v1/workers", json=body, headers={"Authorization": f"Bearer {POOL_TOKEN}"})
    reply = r.json()
    return reply["workerId"], reply["sessionKey"]


def call(case: Any, url: str) -> None:
    headers = {"Authorization": f"Bearer {TRAINER_TOKEN}"}
    if "workerId" in (case.path_parameters or {}):
        worker_id, session = register(url)  # a real worker, so auth passes and the body is checked
        case.path_parameters["workerId"] = worker_id
        headers = {"Authorization": f"Bearer {POOL_TOKEN}", "X-Echo-Session": session}
    elif case.path == "/v1/workers":
        headers = {"Authorization": f"Bearer {POOL_TOKEN}"}
    long_polls = {"/v1/trainer/batches": 60.0, "/v1/workers/{workerId}/leases": 30.0}  # waitSeconds maxima
    if case.path in long_polls and isinstance(case.body, dict):
        wait = case.body.get("waitSeconds")
        if (
            isinstance(wait, int | float)
            and not isinstance(wait, bool)
            and 0.05 < wait <= long_polls[case.path]
        ):
            # Keep valid long-polls short; the value stays valid. Invalid ones (negative tests) are
            # left alone: they are rejected before any wait.
            case.body["waitSeconds"] = 0.05
    case.call_and_validate(
        base_url=url,
        headers=headers,
        checks=[
            checks.not_a_server_error,
            checks.status_code_conformance,
            checks.content_type_conformance,
            checks.response_schema_conformance,
            negative_data_rejection,
        ],
    )


def negative_data_rejection(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis's check, with 413 counted as the rejection it is: a body over the endpoint's size
    limit (too many rollouts, say) is refused before its schema is even read."""
    if response.status_code == 413:
        return None
    return checks.negative_data_rejection(ctx, response, case)


@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [
        (m, p, mode)
        for m, p in OPERATIONS
        for mode in ("positive", "negative")
        if mode == "positive" or p not in ("/healthz", "/metrics")
    ],  # those two take no input to break
)
def test_no_5xx_on_any_input(
    method: str, path: str, mode: str, api_schema: Any, fuzzed: RunningCoordinator
) -> None:
    operation = api_schema[path][method]

    @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(schemathesis.GenerationMode(mode)))
    def fuzz(case: Any) -> None:
        call(case, fuzzed.url)

    fuzz()


def test_the_fuzzed_coordinator_still_works(fuzzed: RunningCoordinator) -> None:
    status = fuzzed.status()
    assert status.max_observed_staleness is None or status.max_observed_staleness <= status.max_staleness
    assert httpx.get(f"{fuzzed.url}/healthz").status_code == 200
    assert os.environ.get("NO_SUCH_VARIABLE") is None and REPO.is_dir()
