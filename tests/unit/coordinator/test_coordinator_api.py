"""The HTTP shell (coordinator.api): auth, error format, limits, schema; the fast path matches FastAPI."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from coordinator_helpers import CPU_TOKEN, GPU_TOKEN, TRAINER_TOKEN, answer
from fastapi.testclient import TestClient

from echo_runtime.coordinator import api, auth

REGISTER = {"pool": "cpu", "backend": "transformers", "device": "cpu", "dtype": "float32", "capacity": 2}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(params=["fast-path", "fastapi"])
def client(request: pytest.FixtureRequest, make_service: Callable[..., api.Service]) -> Iterator[TestClient]:
    """The served app (FastPath), and FastAPI alone: both must answer every request the same way."""
    app = api.create_app(make_service())
    with TestClient(app if request.param == "fast-path" else app.api) as c:
        yield c


def join(c: TestClient, token: str = CPU_TOKEN, pool: str = "cpu") -> tuple[str, dict[str, str]]:
    r = c.post("/v1/workers", json={**REGISTER, "pool": pool}, headers=bearer(token))
    assert r.status_code == 201, r.text
    body = r.json()
    return body["workerId"], {**bearer(token), "X-Echo-Session": body["sessionKey"]}


def rollouts(prompt: str, n: int = 2, **override: Any) -> list[dict[str, Any]]:
    one = {
        "completion": answer(prompt),
        "tokenIds": [1, 2, 3],
        "logprobs": [-0.5, -0.1, -2.0],
        "policyVersion": 0,
    }
    return [{**one, **override} for _ in range(n)]


def error(r: Any) -> tuple[int, str, str]:
    body = r.json()["error"]
    return r.status_code, body["code"], body["field"]


def test_worker_and_trainer_round_trip(client: TestClient) -> None:
    wid, headers = join(client)
    hb = client.post(f"/v1/workers/{wid}/heartbeat", json={"loadedVersion": 0}, headers=headers)
    assert hb.status_code == 200 and hb.json()["loadVersion"] is None
    tasks = client.post(f"/v1/workers/{wid}/leases", json={"maxTasks": 2}, headers=headers).json()["tasks"]
    assert len(tasks) == 2 and tasks[0]["groupSize"] == 2 and tasks[0]["sampling"]["maxNewTokens"] == 8
    for task in tasks:
        r = client.post(
            f"/v1/workers/{wid}/tasks/{task['taskId']}/rollouts",
            json={"rollouts": rollouts(task["prompt"])},
            headers=headers,
        )
        assert r.json() == {"outcome": "buffered", "rewards": [1.0, 1.0], "staleness": 0, "reason": ""}
    batch = client.post("/v1/trainer/batches", json={"version": 0}, headers=bearer(TRAINER_TOKEN)).json()
    assert batch["ready"] and [g["taskId"] for g in batch["groups"]] == [t["taskId"] for t in tasks]
    assert batch["groups"][0]["rollouts"][0]["reward"] == 1.0
    assert (
        client.post("/v1/trainer/version", json={"version": 1}, headers=bearer(TRAINER_TOKEN)).json()[
            "policyVersion"
        ]
        == 1
    )
    status = client.get("/v1/status", headers=bearer(CPU_TOKEN)).json()
    assert status["consumedGroups"] == 2 and status["workers"][0]["id"] == wid
    assert client.delete(f"/v1/workers/{wid}", headers=headers).json() == {"releasedTasks": 0}


def test_authentication(client: TestClient) -> None:
    wid, headers = join(client)
    hb = f"/v1/workers/{wid}/heartbeat"
    assert error(client.post(hb, json={})) == (401, "unauthorized", "Authorization")
    assert error(client.post(hb, json={}, headers=bearer("not-a-token-at-all"))) == (
        401,
        "unauthorized",
        "Authorization",
    )
    assert error(client.post(hb, json={}, headers={**headers, "Authorization": "Basic abc"}))[0] == 401
    assert error(client.post(hb, json={}, headers={**headers, **bearer(GPU_TOKEN)})) == (
        403,
        "forbidden",
        "Authorization",
    )
    assert error(client.post(hb, json={}, headers={**headers, "X-Echo-Session": "stolen"})) == (
        403,
        "forbidden",
        "X-Echo-Session",
    )
    assert error(client.post(hb, json={}, headers=bearer(CPU_TOKEN)))[0] == 403  # no session key
    r = client.post("/v1/workers", json={**REGISTER, "pool": "gpu"}, headers=bearer(CPU_TOKEN))
    assert error(r) == (403, "forbidden", "Authorization")
    join(client, GPU_TOKEN, "gpu")  # a pool whose token is stored only as a hash
    assert error(client.post("/v1/trainer/version", json={"version": 1}, headers=bearer(CPU_TOKEN)))[0] == 403
    assert client.get("/v1/status", headers=bearer(TRAINER_TOKEN)).status_code == 200
    assert error(client.get("/v1/status"))[0] == 401
    assert client.get("/healthz").json() == {"status": "ok", "policyVersion": 0}


def test_rejections_name_the_field_and_change_nothing(client: TestClient) -> None:
    wid, headers = join(client)
    task = client.post(f"/v1/workers/{wid}/leases", json={"maxTasks": 1}, headers=headers).json()["tasks"][0]
    url = f"/v1/workers/{wid}/tasks/{task['taskId']}/rollouts"

    def submit(body: Any) -> Any:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return client.post(url, content=content, headers={**headers, "Content-Type": "application/json"})

    cases = [
        (b"{not json", "body"),
        ({"rollouts": []}, "rollouts"),
        ({"rollouts": rollouts(task["prompt"], 3)}, "rollouts"),
        ({"rollouts": rollouts(task["prompt"], logprobs=[-1.0, 0.5, -1.0])}, "rollouts[0].logprobs[1]"),
        ({"rollouts": rollouts(task["prompt"], tokenIds=[1, -2, 3])}, "rollouts[0].tokenIds[1]"),
        ({"rollouts": rollouts(task["prompt"], tokenIds=[1, 2, 100])}, "rollouts[0].tokenIds[2]"),
        ({"rollouts": rollouts(task["prompt"], policyVersion=5)}, "rollouts[0].policyVersion"),
        ({"rollouts": rollouts(task["prompt"], reward=1.0)}, "rollouts[0].reward"),
        ({"rollouts": rollouts(task["prompt"], completion=7)}, "rollouts[0].completion"),
        (
            json.dumps({"rollouts": rollouts(task["prompt"])}).replace("-0.5", "NaN").encode(),
            "rollouts[0].logprobs[0]",
        ),
    ]
    for body, field in cases:
        r = submit(body)
        assert (r.status_code, r.json()["error"]["field"]) == (422, field), (body, r.text)
        assert r.json()["error"]["message"]
    status = client.get("/v1/status", headers=headers).json()
    assert status["buffer"]["groups"] == 0 and status["droppedStale"] == 0
    assert submit({"rollouts": rollouts(task["prompt"])}).json()["outcome"] == "buffered"  # lease intact
    metrics = client.get("/metrics").text
    assert (
        'echorl_coordinator_requests_rejected_total{code="invalid",field="rollouts[].tokenIds[]"' in metrics
    )
    late = client.post(
        f"/v1/workers/{wid}/tasks/nope/rollouts", json={"rollouts": rollouts(task["prompt"])}, headers=headers
    )
    assert error(late) == (409, "lease_not_held", "taskId")
    assert error(client.post("/v1/workers/w-gone/heartbeat", json={}, headers=headers)) == (
        404,
        "unknown_worker",
        "workerId",
    )
    assert error(client.post(f"/v1/workers/{wid}/leases", json={"maxTasks": 0}, headers=headers)) == (
        422,
        "invalid",
        "maxTasks",
    )
    assert error(client.post(f"/v1/workers/{wid}/heartbeat", json={"loadedVersion": "x"}, headers=headers))[
        2
    ] == ("loadedVersion")


def test_bodies_are_bounded(client: TestClient) -> None:
    wid, headers = join(client)
    huge = b'{"rollouts": [' + b" " * 200_000 + b"]}"
    r = client.post(
        f"/v1/workers/{wid}/tasks/t/rollouts",
        content=huge,
        headers={**headers, "Content-Type": "application/json"},
    )
    assert error(r) == (413, "too_large", "body")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
        yield b'{"loadedVersion": 0'
        yield b" " * 100_000
        yield b"}"

    r = client.post(f"/v1/workers/{wid}/heartbeat", content=chunks(), headers=headers)
    assert error(r) == (413, "too_large", "body")


def test_errors_for_unknown_routes_use_the_same_format(client: TestClient) -> None:
    assert error(client.get("/v1/nothing-here")) == (404, "not_found", "path")
    assert error(client.put("/v1/status", headers=bearer(CPU_TOKEN)))[0] == 405


def test_batch_long_poll_times_out_not_ready(client: TestClient) -> None:
    r = client.post(
        "/v1/trainer/batches", json={"version": 0, "waitSeconds": 0.2}, headers=bearer(TRAINER_TOKEN)
    )
    assert r.json() == {"ready": False, "version": 0, "groups": [], "retryAfterSeconds": 1.0}


def test_metrics_export_the_state(client: TestClient) -> None:
    join(client)
    text = client.get("/metrics").text
    for line in (
        'echorl_coordinator_policy_version{job="test"} 0.0',
        'echorl_coordinator_max_staleness{job="test"} 1.0',
        'echorl_coordinator_workers{job="test",pool="cpu"} 1.0',
        'echorl_coordinator_staleness_bucket{job="test",le="+Inf"} 0.0',
    ):
        assert line in text


def test_metrics_count_rollouts_per_pool_and_the_trainer_busy_time(
    make_service: Callable[..., api.Service],
) -> None:
    clock = [100.0]
    with TestClient(api.create_app(make_service(clock=lambda: clock[0]))) as c:
        for pool, token in (("cpu", CPU_TOKEN), ("gpu", GPU_TOKEN)):
            wid, headers = join(c, token, pool)
            (task,) = c.post(f"/v1/workers/{wid}/leases", json={"maxTasks": 1}, headers=headers).json()[
                "tasks"
            ]
            r = c.post(
                f"/v1/workers/{wid}/tasks/{task['taskId']}/rollouts",
                json={"rollouts": rollouts(task["prompt"], n=2)},
                headers=headers,
            )
            assert r.json()["outcome"] == "buffered"
        trainer = bearer(TRAINER_TOKEN)
        assert c.post("/v1/trainer/batches", json={"version": 0}, headers=trainer).json()["ready"]
        assert c.post("/v1/trainer/version", json={"version": 1}, headers=trainer).status_code == 200
        clock[0] += 2.5  # the step took 2.5 s from the batch handed out to the next request
        c.post("/v1/trainer/batches", json={"version": 1, "waitSeconds": 0}, headers=trainer)
        c.post(
            "/v1/trainer/batches", json={"version": 1, "waitSeconds": 0, "stepSeconds": 9.0}, headers=trainer
        )
        text = c.get("/metrics").text
    assert 'echorl_coordinator_pool_rollouts_accepted_total{job="test",pool="cpu"} 2.0' in text
    assert 'echorl_coordinator_pool_rollouts_accepted_total{job="test",pool="gpu"} 2.0' in text
    # one step measured once: asking again for the same batch measures nothing
    assert 'echorl_coordinator_trainer_busy_seconds_total{job="test"} 2.5' in text
    assert 'echorl_coordinator_trainer_step_seconds{job="test"} 2.5' in text


def test_openapi_schema_is_complete(make_service: Callable[..., api.Service]) -> None:
    app = api.create_app(make_service())
    schema = TestClient(app).get("/openapi.json").json()
    paths = schema["paths"]
    assert set(paths) == {
        "/v1/workers",
        "/v1/workers/{workerId}/heartbeat",
        "/v1/workers/{workerId}/leases",
        "/v1/workers/{workerId}/tasks/{taskId}/rollouts",
        "/v1/workers/{workerId}",
        "/v1/trainer/version",
        "/v1/trainer/batches",
        "/v1/trainer/quarantine",
        "/v1/status",
        "/healthz",
        "/metrics",
    }
    submit = paths["/v1/workers/{workerId}/tasks/{taskId}/rollouts"]["post"]
    assert submit["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/SubmitRequest"
    }
    assert {"422", "409", "403"} <= set(submit["responses"])
    components = schema["components"]["schemas"]

    def refs(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    for ref in refs(schema):
        assert ref.removeprefix("#/components/schemas/") in components, ref
    rollout = components["RolloutIn"]["properties"]
    assert rollout["logprobs"]["items"]["maximum"] == 0.0 and rollout["tokenIds"]["maxItems"] == 32768


STATUS_TOKEN = "read-only-status-token-0001"


@pytest.fixture
def with_status_token(make_service: Callable[..., api.Service]) -> Callable[..., TestClient]:
    def make(metrics_auth: bool) -> TestClient:
        svc = make_service(metrics_auth=metrics_auth)
        svc.tokens = dataclasses.replace(svc.tokens, status=auth.digest(STATUS_TOKEN))
        return TestClient(api.create_app(svc))

    return make


def test_the_status_token_reads_the_status_and_nothing_else(
    with_status_token: Callable[..., TestClient],
) -> None:
    with with_status_token(metrics_auth=False) as c:
        assert c.get("/v1/status", headers=bearer(STATUS_TOKEN)).status_code == 200
        refused = c.post("/v1/workers", json=REGISTER, headers=bearer(STATUS_TOKEN))
        assert refused.status_code == 403 and refused.json()["error"]["field"] == "Authorization"
        batch = c.post(
            "/v1/trainer/batches", json={"version": 0, "waitSeconds": 0}, headers=bearer(STATUS_TOKEN)
        )
        assert batch.status_code == 403, batch.text
        assert c.get("/metrics").status_code == 200  # open by default, as Prometheus expects


def test_metrics_auth_wants_the_status_or_the_trainer_token(
    with_status_token: Callable[..., TestClient],
) -> None:
    with with_status_token(metrics_auth=True) as c:
        anonymous = c.get("/metrics")
        assert anonymous.status_code == 401 and anonymous.json()["error"]["field"] == "Authorization"
        assert c.get("/metrics", headers=bearer(CPU_TOKEN)).status_code == 401  # a join token is not enough
        assert "echorl_coordinator_policy_version" in c.get("/metrics", headers=bearer(STATUS_TOKEN)).text
        assert c.get("/metrics", headers=bearer(TRAINER_TOKEN)).status_code == 200


def test_request_durations_are_exported_per_route(make_service: Callable[..., api.Service]) -> None:
    with TestClient(api.create_app(make_service())) as c:
        wid, headers = join(c)
        for _ in range(3):
            c.post(f"/v1/workers/{wid}/heartbeat", json={"loadedVersion": 0}, headers=headers)
        c.post(f"/v1/workers/{wid}/leases", json={"maxTasks": 1}, headers=headers)
        c.post(
            f"/v1/workers/{wid}/heartbeat", json={"loadedVersion": "x"}, headers=headers
        )  # rejected: counted
        text = c.get("/metrics").text
    counts = {
        line.split('route="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("echorl_coordinator_request_seconds_count")
    }
    assert counts == {
        "register": 1.0,
        "heartbeat": 4.0,
        "lease": 1.0,
    }  # /metrics answers before it counts itself
    inf = [ln for ln in text.splitlines() if 'le="+Inf",route="heartbeat"' in ln]
    assert inf and inf[0].endswith(" 4.0")
