"""The coordinator's HTTP API: a thin shell around :class:`~.state.CoordinatorState`.

Endpoints (all JSON; the schema is served at ``/openapi.json``, docs at ``/docs``)::

    POST   /v1/workers                                     register (pool token)    -> 201 RegisterReply
    POST   /v1/workers/{workerId}/heartbeat                heartbeat (token+session) -> HeartbeatReply
    POST   /v1/workers/{workerId}/leases                   lease tasks               -> LeaseReply
    POST   /v1/workers/{workerId}/tasks/{taskId}/rollouts  submit a whole group      -> SubmitReply
    DELETE /v1/workers/{workerId}                          leave; leases re-issued   -> LeaveReply
    POST   /v1/trainer/version                             announce a published version -> AnnounceReply
    POST   /v1/trainer/batches                             pull a batch (long-poll)  -> BatchReply
    POST   /v1/trainer/quarantine                          quarantine a worker       -> QuarantineReply
    GET    /v1/status                                      the status document (any join token)
    GET    /healthz                                        liveness (no token)
    GET    /metrics                                        Prometheus (no token, unless metrics_auth)

Promises: every request is authenticated before its body is read (registration: before the pool in
its body is checked against the token); bodies are size-bounded (413) before they are read in full;
every rejection is a 4xx :class:`~.wire.ErrorReply` naming the field, counted in ``/metrics``, and
changes nothing. Handlers never ``await`` between reading and changing the state, so each request is
atomic on the one event loop; the only waits are the batch and lease long-polls, which re-read the
state after waking, and the re-scoring of a submission, which runs off the loop (:mod:`.scoring`)
between the state's ``prepare_submit`` and ``commit_submit`` — the second checks the lease again. An
unexpected error is logged and answered 500; nothing changes before a submission is validated and scored.

Each endpoint is one ``handle_*`` coroutine taking an :class:`Incoming` request. FastAPI routes call
them and give the schema; :class:`FastPath`, the ASGI app actually served, sends the three requests
workers make all the time (heartbeat, lease, submit) straight to the same handlers. Measured on two
cores, FastAPI's routing, dependency and middleware layers cost more per heartbeat than the handler
itself; skipping them roughly halves the CPU per request at 1000 heartbeats/s. Request bodies are
parsed by pydantic-core straight from the raw bytes (``model_validate_json``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Annotated, Any, Protocol, TypeVar

import pydantic
from fastapi import FastAPI, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from echo_runtime.coordinator import auth, config, errors, metrics, report, roster, scoring, state, wire

log = logging.getLogger("echorl.coordinator")
M = TypeVar("M", bound=wire.WireModel)
SESSION_HEADER = "X-Echo-Session"
SMALL_BODY = 64 * 1024
MAX_ID_CHARS = 64
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": wire.ErrorReply, "description": what}
    for status, what in [
        (401, "No join token, or an unknown one."),
        (403, "A valid token for another role or pool, or a wrong session key."),
        (404, "Unknown worker: register again."),
        (409, "Conflict: the lease is not held, or a version goes backwards."),
        (413, "Body too large."),
        (422, "Invalid body or parameter; `error.field` names it."),
        (429, "A limit of the pool (`maxWorkers`) is reached: try again later."),
    ]
}
_REQUEST_MODELS: tuple[type[pydantic.BaseModel], ...] = (
    wire.RegisterRequest,
    wire.HeartbeatRequest,
    wire.LeaseRequest,
    wire.SubmitRequest,
    wire.AnnounceRequest,
    wire.BatchRequest,
    wire.QuarantineRequest,
)


def submit_body_limit(cfg: config.CoordinatorConfig) -> int:
    """Bytes a group submission may take: generous per token (id, log-prob, text) and per rollout."""
    return cfg.group_size * (cfg.max_new_tokens * 96 + 4096) + 4096


class Incoming(Protocol):
    """What a handler reads from a request, whichever layer received it."""

    def header(self, name: str) -> str | None:
        """A header's value (``name`` in lower case)."""
        ...

    async def body(self, limit: int) -> bytes:
        """The whole body; :class:`~.errors.Rejected` (413) past ``limit`` bytes."""
        ...

    async def disconnected(self) -> bool: ...


class Service:
    """What the handlers share: the state, the tokens, the clocks and the long-poll wake-up."""

    def __init__(
        self,
        coordinator: state.CoordinatorState,
        tokens: auth.TokenStore,
        *,
        scorer: scoring.Scorer | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        expire_interval: float = 1.0,
        recheck_interval: float = 1.0,
        metrics_auth: bool = False,
    ) -> None:
        self.state = coordinator
        self.metrics_auth = metrics_auth
        """``/metrics`` wants the status or the trainer token (else it is open, as Prometheus expects)."""
        self.tokens = tokens
        self.scorer = scorer if scorer is not None else scoring.InlineScorer(coordinator.task)
        """Re-scores submissions off the event loop (the default scores inline: tests with task objects)."""
        self.clock = clock
        self.wall_clock = wall_clock
        self.expire_interval = expire_interval
        self.recheck_interval = recheck_interval
        """Long-polls re-read the state at least this often, even if no wake-up came (a safety net)."""
        self.rejections = metrics.Rejections()
        self.latency = metrics.Latency()
        self.registry = metrics.registry_for(coordinator, self.rejections, self.latency)
        self.submit_limit = submit_body_limit(coordinator.config)
        self._batch_ready: asyncio.Event | None = None
        self._work_ready: asyncio.Event | None = None

    def notify_batch(self) -> None:
        """Wake a waiting batch request if a batch might be ready."""
        if self._batch_ready is not None and self.state.ledger.buffered >= self.state.config.batch_size:
            self._batch_ready.set()
            self._batch_ready = None

    async def wait_batch(self, timeout: float) -> None:
        if self._batch_ready is None:
            self._batch_ready = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._batch_ready.wait(), timeout)

    def notify_work(self) -> None:
        """Wake waiting lease requests: tasks may have become leasable (they re-check the state)."""
        if self._work_ready is not None:
            self._work_ready.set()
            self._work_ready = None

    async def wait_work(self, timeout: float) -> None:
        if self._work_ready is None:
            self._work_ready = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._work_ready.wait(), timeout)

    async def expire_forever(self) -> None:
        """Expire silent workers and overdue leases every ``expire_interval`` seconds, for ever."""
        while True:
            await asyncio.sleep(self.expire_interval)
            caught = len(self.state.quarantined.records)
            try:
                dead, released = self.state.expire(self.clock())
            except Exception:  # a bug here must not stop expiry for the rest of the run
                log.exception("lease expiry failed; trying again in %.1f s", self.expire_interval)
                continue
            for record in list(self.state.quarantined.records.values())[caught:]:
                log.warning(
                    "worker %s (pool %s) quarantined: %s", record.worker_id, record.pool, record.reason
                )
            if dead or released:
                self.notify_work()
                log.info(
                    "expired %d worker(s) %s; %d lease(s) back in the queue", len(dead), dead[:5], released
                )

    # ------------------------------------------------------------------ auth
    def token(self, incoming: Incoming) -> str:
        """The request's join token (401 unless it is one of the job's)."""
        token = auth.bearer(incoming.header("authorization"))
        if token is None or not self.tokens.is_known(token):
            raise errors.Rejected(
                401, "unauthorized", "Authorization", "send a join token as 'Authorization: Bearer <token>'"
            )
        return token

    def require_trainer(self, incoming: Incoming) -> None:
        if not self.tokens.is_trainer(self.token(incoming)):
            raise errors.Rejected(
                403, "forbidden", "Authorization", "this endpoint needs the trainer's token"
            )

    def require_worker(self, incoming: Incoming, worker_id: str) -> roster.WorkerRecord:
        token = self.token(incoming)
        if len(worker_id) > MAX_ID_CHARS:
            raise errors.Rejected(422, "invalid", "workerId", f"at most {MAX_ID_CHARS} characters")
        worker = self.state.worker(worker_id)
        if not self.tokens.is_pool(worker.pool, token):
            raise errors.Rejected(
                403,
                "forbidden",
                "Authorization",
                f"not the join token of pool {worker.pool!r} (worker {worker_id})",
            )
        if not auth.matches(incoming.header("x-echo-session"), worker.session_hash):
            raise errors.Rejected(
                403, "forbidden", SESSION_HEADER, f"missing or wrong session key for {worker_id}"
            )
        return worker


async def parse(incoming: Incoming, model: type[M], limit: int) -> M:
    """Read and parse a JSON body into ``model``: 413 past ``limit`` bytes, 422 naming the first bad field."""
    raw = await incoming.body(limit)
    try:
        return wire.parse_request(model, raw)
    except pydantic.ValidationError as exc:
        raise invalid(exc.errors(include_url=False)) from None


def invalid(failures: Any) -> errors.Rejected:
    """A 422 naming the field of pydantic's first validation error (``rollouts[3].logprobs[7]``)."""
    first = failures[0]
    field = ""
    for part in first.get("loc", ()):
        if part in ("body", "path", "query", "header"):
            continue
        part = str(part)
        field += f"[{part}]" if part.isdigit() else (f".{part}" if field else part)
    message = (
        "required field is missing" if first.get("type") == "missing" else str(first.get("msg", "invalid"))
    )
    if first.get("type") == "json_invalid":
        field, message = "body", f"not valid JSON: {first.get('ctx', {}).get('error', message)}"
    more = f" (and {len(failures) - 1} more problem(s))" if len(failures) > 1 else ""
    return errors.Rejected(422, "invalid", field or "body", message + more)


# ---------------------------------------------------------------------------------------- handlers
async def handle_register(svc: Service, incoming: Incoming) -> wire.RegisterReply:
    token = svc.token(incoming)
    req = await parse(incoming, wire.RegisterRequest, SMALL_BODY)
    if not svc.tokens.is_pool(req.pool, token):
        raise errors.Rejected(403, "forbidden", "Authorization", f"not the join token of pool {req.pool!r}")
    key = auth.new_secret()
    reply = svc.state.register(req, auth.digest(key), svc.clock())
    return reply.model_copy(update={"session_key": key})


async def handle_heartbeat(svc: Service, incoming: Incoming, worker_id: str) -> wire.HeartbeatReply:
    svc.require_worker(incoming, worker_id)
    req = await parse(incoming, wire.HeartbeatRequest, SMALL_BODY)
    return svc.state.heartbeat(worker_id, req, svc.clock())


async def handle_lease(svc: Service, incoming: Incoming, worker_id: str) -> wire.LeaseReply:
    svc.require_worker(incoming, worker_id)
    req = await parse(incoming, wire.LeaseRequest, SMALL_BODY)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + req.wait_seconds
    while True:
        reply = svc.state.lease(worker_id, req.max_tasks, svc.clock(), req.loaded_version)
        remaining = deadline - loop.time()
        if reply.tasks or remaining <= 0 or await incoming.disconnected():
            return reply
        await svc.wait_work(min(remaining, svc.recheck_interval))


async def handle_submit(svc: Service, incoming: Incoming, worker_id: str, task_id: str) -> wire.SubmitReply:
    svc.require_worker(incoming, worker_id)
    if len(task_id) > MAX_ID_CHARS:
        raise errors.Rejected(422, "invalid", "taskId", f"at most {MAX_ID_CHARS} characters")
    req = await parse(incoming, wire.SubmitRequest, svc.submit_limit)
    prepared = svc.state.prepare_submit(worker_id, task_id, req, svc.clock())
    if isinstance(prepared, wire.SubmitReply):
        return prepared  # a repeat of an accepted submission
    scores = await svc.scorer.score(prepared.problem, [r.completion for r in req.rollouts])
    reply = svc.state.commit_submit(
        prepared, scores.rewards, svc.clock(), timeouts=scores.timeouts, errors=scores.errors
    )
    svc.notify_batch()
    if reply.outcome == "dropped":
        svc.notify_work()  # its prompt is back in the queue
    return reply


async def handle_leave(svc: Service, incoming: Incoming, worker_id: str) -> wire.LeaveReply:
    svc.require_worker(incoming, worker_id)
    reply = svc.state.leave(worker_id)
    svc.notify_work()  # its leases are back in the queue
    return reply


async def handle_announce(svc: Service, incoming: Incoming) -> wire.AnnounceReply:
    svc.require_trainer(incoming)
    req = await parse(incoming, wire.AnnounceRequest, SMALL_BODY)
    reply = svc.state.announce(req.version)
    svc.notify_work()
    return reply


async def handle_quarantine(svc: Service, incoming: Incoming) -> wire.QuarantineReply:
    svc.require_trainer(incoming)
    req = await parse(incoming, wire.QuarantineRequest, SMALL_BODY)
    reply = svc.state.quarantine(req)
    log.warning("worker %s quarantined at version %d: %s", req.worker_id, req.version, req.reason)
    svc.notify_work()  # its leases and its groups' prompts are back in the queue
    return reply


async def handle_batch(svc: Service, incoming: Incoming) -> wire.BatchReply:
    svc.require_trainer(incoming)
    req = await parse(incoming, wire.BatchRequest, SMALL_BODY)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + req.wait_seconds
    while True:
        reply = svc.state.pull_batch(req.version, svc.clock(), req.step_seconds)
        svc.notify_work()  # a Sequential round opened, or a batch taken made room in the Async buffer
        remaining = deadline - loop.time()
        if reply.ready or remaining <= 0 or await incoming.disconnected():
            return reply
        await svc.wait_batch(min(remaining, svc.recheck_interval))


async def handle_status(svc: Service, incoming: Incoming) -> wire.StatusDocument:
    svc.token(incoming)
    return report.status_document(svc.state, svc.clock(), svc.wall_clock())


# ---------------------------------------------------------------------------------------- FastAPI
class _StarletteIncoming:
    def __init__(self, request: Request) -> None:
        self.request = request

    def header(self, name: str) -> str | None:
        return self.request.headers.get(name)

    async def body(self, limit: int) -> bytes:
        _check_declared_length(self.request.headers.get("content-length"), limit)
        chunks, size = [], 0
        async for chunk in self.request.stream():
            size += len(chunk)
            if size > limit:
                raise errors.Rejected(413, "too_large", "body", f"at most {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def disconnected(self) -> bool:
        return await self.request.is_disconnected()


def _check_declared_length(declared: str | None, limit: int) -> None:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise errors.Rejected(413, "too_large", "body", f"at most {limit} bytes, got {declared}")


def _json(model: pydantic.BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(by_alias=True), status_code=status, media_type="application/json")


def error_reply(exc: errors.Rejected) -> wire.ErrorReply:
    return wire.ErrorReply(error=wire.ErrorDetail(code=exc.code, field=exc.field, message=exc.message))


def _body_schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


def _security(*schemes: str) -> dict[str, Any]:
    return {"security": [{s: [] for s in schemes}]}


WorkerId = Annotated[str, Path(alias="workerId", description="Id returned by registration.")]
TaskId = Annotated[str, Path(alias="taskId", description="Id of a leased task.")]


def create_fastapi(svc: Service) -> FastAPI:
    """The FastAPI application: every endpoint, the schema, the error format and the expiry timer."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(svc.expire_forever())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            svc.scorer.close()

    app = FastAPI(
        title="Echo coordinator",
        version="v1",
        description="One per EchoJob: worker registration, leases, the replay buffer and the Δmax bound. "
        "See docs/coordinator.md.",
        lifespan=lifespan,
    )
    worker_auth = _security("joinToken", "session")

    @app.exception_handler(errors.Rejected)
    async def _rejected(request: Request, exc: errors.Rejected) -> Response:
        svc.rejections.add(exc.status, exc.code, exc.field)
        return _json(error_reply(exc), exc.status)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> Response:
        return await _rejected(request, invalid(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = "not_found" if exc.status_code in (404, 405) else "invalid"
        return await _rejected(request, errors.Rejected(exc.status_code, code, "path", str(exc.detail)))

    def route(
        method: str,
        path: str,
        reply: type[pydantic.BaseModel],
        extra: dict[str, Any],
        status: int = 200,
        tag: str = "workers",
    ) -> Callable[[Any], Any]:
        return app.api_route(
            path,
            methods=[method],
            status_code=status,
            response_model=reply,
            responses=_ERRORS,
            tags=[tag],
            openapi_extra=extra,
        )

    @route(
        "POST",
        "/v1/workers",
        wire.RegisterReply,
        {**_body_schema(wire.RegisterRequest), **_security("joinToken")},
        status=201,
    )
    async def register(request: Request) -> Response:
        """Join the swarm with the pool's join token; the reply's session key authenticates the worker."""
        return _json(await handle_register(svc, _StarletteIncoming(request)), 201)

    @route(
        "POST",
        "/v1/workers/{workerId}/heartbeat",
        wire.HeartbeatReply,
        {**_body_schema(wire.HeartbeatRequest), **worker_auth},
    )
    async def heartbeat(worker_id: WorkerId, request: Request) -> Response:
        """Report the loaded version; the reply says which version to load, if any."""
        return _json(await handle_heartbeat(svc, _StarletteIncoming(request), worker_id))

    @route(
        "POST",
        "/v1/workers/{workerId}/leases",
        wire.LeaseReply,
        {**_body_schema(wire.LeaseRequest), **worker_auth},
    )
    async def lease(worker_id: WorkerId, request: Request) -> Response:
        """Lease up to ``maxTasks`` tasks; none (with ``retryAfterSeconds``) while leasing is paused."""
        return _json(await handle_lease(svc, _StarletteIncoming(request), worker_id))

    @route(
        "POST",
        "/v1/workers/{workerId}/tasks/{taskId}/rollouts",
        wire.SubmitReply,
        {**_body_schema(wire.SubmitRequest), **worker_auth},
    )
    async def submit(worker_id: WorkerId, task_id: TaskId, request: Request) -> Response:
        """Submit the whole group of a leased task; the coordinator re-scores every completion."""
        return _json(await handle_submit(svc, _StarletteIncoming(request), worker_id, task_id))

    @route("DELETE", "/v1/workers/{workerId}", wire.LeaveReply, worker_auth)
    async def leave(worker_id: WorkerId, request: Request) -> Response:
        """Leave the swarm; the worker's leases go back to the queue at once."""
        return _json(await handle_leave(svc, _StarletteIncoming(request), worker_id))

    @route(
        "POST",
        "/v1/trainer/version",
        wire.AnnounceReply,
        {**_body_schema(wire.AnnounceRequest), **_security("joinToken")},
        tag="trainer",
    )
    async def announce(request: Request) -> Response:
        """The trainer published snapshot ``version`` (workers behind the bound will be told to load it)."""
        return _json(await handle_announce(svc, _StarletteIncoming(request)))

    @route(
        "POST",
        "/v1/trainer/batches",
        wire.BatchReply,
        {**_body_schema(wire.BatchRequest), **_security("joinToken")},
        tag="trainer",
    )
    async def batch(request: Request) -> Response:
        """The batch for the step ``version -> version+1``, waiting up to ``waitSeconds`` for one.

        Not ready: ``ready: false`` with ``retryAfterSeconds``. Asking again at the version of the last
        batch returns the same batch (safe retries)."""
        return _json(await handle_batch(svc, _StarletteIncoming(request)))

    @route(
        "POST",
        "/v1/trainer/quarantine",
        wire.QuarantineReply,
        {**_body_schema(wire.QuarantineRequest), **_security("joinToken")},
        tag="trainer",
    )
    async def quarantine(request: Request) -> Response:
        """The trainer caught a worker whose behaviour log-probs disagree with its recomputation: the
        worker is refused from now on, its buffered groups are dropped and their prompts re-queued."""
        return _json(await handle_quarantine(svc, _StarletteIncoming(request)))

    @route("GET", "/v1/status", wire.StatusDocument, _security("joinToken"), tag="status")
    async def status(request: Request) -> Response:
        """The status document of docs/contracts.md (any join token, or the read-only status token)."""
        return _json(await handle_status(svc, _StarletteIncoming(request)))

    @app.get("/healthz", response_model=wire.Health, tags=["status"])
    async def healthz() -> Response:
        """Liveness: the process serves requests."""
        return _json(wire.Health(status="ok", policy_version=svc.state.published))

    @app.get(
        "/metrics",
        tags=["status"],
        response_class=Response,
        responses={200: {"content": {metrics.CONTENT_TYPE: {}}, "description": "Prometheus text format."}},
    )
    async def prometheus(request: Request) -> Response:
        """Prometheus metrics (see :mod:`echo_runtime.coordinator.metrics`); with ``--metrics-auth``, only
        for the status or the trainer token (``Authorization: Bearer``)."""
        if svc.metrics_auth:
            token = auth.bearer(request.headers.get("authorization"))
            if not (svc.tokens.is_status(token) or svc.tokens.is_trainer(token)):
                raise errors.Rejected(
                    401,
                    "unauthorized",
                    "Authorization",
                    "metrics need the status or the trainer token as 'Authorization: Bearer <token>'",
                )
        return Response(metrics.render(svc.registry), media_type=metrics.CONTENT_TYPE)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus the request-body models and the two security schemes."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    _, defs = models_json_schema(
        [(m, "validation") for m in _REQUEST_MODELS], ref_template="#/components/schemas/{model}"
    )
    for name, body in defs.get("$defs", {}).items():
        schemas.setdefault(name, body)
    schema["components"]["securitySchemes"] = {
        "joinToken": {
            "type": "http",
            "scheme": "bearer",
            "description": "The pool's or the trainer's join token.",
        },
        "session": {
            "type": "apiKey",
            "in": "header",
            "name": SESSION_HEADER,
            "description": "The session key returned by registration.",
        },
    }
    app.openapi_schema = schema
    return schema


# ---------------------------------------------------------------------------------------- fast path
class _AsgiIncoming:
    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.headers: dict[bytes, bytes] = dict(scope["headers"])
        self.receive = receive

    def header(self, name: str) -> str | None:
        value = self.headers.get(name.encode())
        return None if value is None else value.decode("latin-1")

    async def body(self, limit: int) -> bytes:
        _check_declared_length(self.header("content-length"), limit)
        chunks, size = [], 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise errors.Rejected(400, "invalid", "body", "client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise errors.Rejected(413, "too_large", "body", f"at most {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def disconnected(self) -> bool:
        # Not watched on the fast path: a lease long-poll whose client went away ends at its deadline
        # (``waitSeconds`` ≤ 30), and its reply, if any, is lost with the connection (the lease expires).
        return False


class FastPath:
    """The ASGI app served: heartbeat, lease and submit go straight to their handlers; all else to FastAPI."""

    def __init__(self, svc: Service) -> None:
        self.service = svc
        self.api = create_fastapi(svc)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            call = self._match(scope["path"]) if scope["method"] == "POST" else None
            if call is not None:
                await self._serve(call, scope, receive, send)
            else:
                await self.api(scope, receive, send)
        finally:
            elapsed = time.perf_counter() - started
            self.service.latency.observe(metrics.route_of(scope["method"], scope["path"]), elapsed)

    def _match(self, path: str) -> Callable[[Incoming], Awaitable[pydantic.BaseModel]] | None:
        parts = path.split("/")  # "", "v1", "workers", id, ...
        if len(parts) < 5 or parts[1] != "v1" or parts[2] != "workers" or not parts[3]:
            return None
        svc, worker_id = self.service, parts[3]
        if len(parts) == 5 and parts[4] == "heartbeat":
            return lambda incoming: handle_heartbeat(svc, incoming, worker_id)
        if len(parts) == 5 and parts[4] == "leases":
            return lambda incoming: handle_lease(svc, incoming, worker_id)
        if len(parts) == 7 and parts[4] == "tasks" and parts[5] and parts[6] == "rollouts":
            task_id = parts[5]
            return lambda incoming: handle_submit(svc, incoming, worker_id, task_id)
        return None

    async def _serve(
        self,
        call: Callable[[Incoming], Awaitable[pydantic.BaseModel]],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        status = 200
        try:
            reply: pydantic.BaseModel = await call(_AsgiIncoming(scope, receive))
        except errors.Rejected as exc:
            self.service.rejections.add(exc.status, exc.code, exc.field)
            status, reply = exc.status, error_reply(exc)
        except Exception:
            log.exception("%s %s failed", scope["method"], scope["path"])
            status = 500
            reply = wire.ErrorReply(
                error=wire.ErrorDetail(
                    code="unavailable", field="body", message="internal error; the request changed nothing"
                )
            )
        body = reply.model_dump_json(by_alias=True).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def create_app(svc: Service) -> FastPath:
    """The ASGI application to serve (``.api`` is the FastAPI app, for its schema)."""
    return FastPath(svc)
