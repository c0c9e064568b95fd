"""The coordinator client: the only code in Echo that speaks HTTP to a coordinator.

:class:`WorkerClient` (inference workers) and :class:`TrainerClient` (the trainer) share one transport
that retries what is safe to retry and fails fast on what is not:

* connection errors, timeouts, 5xx and 429 are retried with exponential backoff and full jitter
  (``delay = uniform(0, min(cap, base * 2**attempt))``), honouring ``Retry-After``, until
  :attr:`RetryPolicy.attempts` or :attr:`RetryPolicy.deadline` runs out, then :class:`Unavailable`;
  a restarting coordinator is therefore waited for, not reported;
* 4xx are never retried: each raises a subclass of :class:`CoordinatorError` with the coordinator's
  ``field`` and ``message`` (:class:`Unauthorized` — also a quarantined worker, code ``quarantined``
  — :class:`UnknownWorker`, :class:`LeaseLost`, :class:`Invalid`, :class:`Conflict`). A pool that is
  full (``maxWorkers``, 429) is therefore waited for like a restarting coordinator.

Every call is safe to retry on the server side: a repeated submission is answered ``duplicate``, a
repeated announcement is a no-op, a repeated batch request at the same version returns the same batch.
A worker whose registration the coordinator forgot (lease timeout, restart) re-registers by itself on
its next heartbeat or lease; a submission for a lease lost that way raises :class:`LeaseLost`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
import pydantic

from echo_runtime import staleness
from echo_runtime.coordinator import tls, wire

M = TypeVar("M", bound=pydantic.BaseModel)
SESSION_HEADER = "X-Echo-Session"


class CoordinatorError(Exception):
    """A request the coordinator refused (4xx), or could not be reached (:class:`Unavailable`)."""

    def __init__(self, status: int, code: str, field: str, message: str) -> None:
        super().__init__(f"coordinator replied {status} {code}: {field}: {message}")
        self.status = status
        self.code = code
        self.field = field
        self.message = message


class Unauthorized(CoordinatorError):
    """401/403: wrong or missing join token, a token of another pool, or a wrong session key."""


class UnknownWorker(CoordinatorError):
    """404: the coordinator does not know this worker (lease timeout or restart): register again."""


class LeaseLost(CoordinatorError):
    """409: the lease on the task is no longer this worker's; drop the group and lease anew."""


class Conflict(CoordinatorError):
    """409: a version going backwards, or another conflict with the coordinator's state."""


class Invalid(CoordinatorError):
    """413/422 (and other 4xx): the request was malformed; ``field`` names what was wrong."""


class Unavailable(CoordinatorError):
    """The coordinator could not be reached (or kept failing) within the retry policy."""


class Untrusted(CoordinatorError):
    """The coordinator's TLS certificate failed verification (wrong CA, name or pin): never retried."""


class StalenessViolation(AssertionError):
    """A batch holds a group the staleness rule refuses at the trainer's version (never expected)."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 100
    """Tries in total (1 = no retry). The default leaves ``deadline`` in charge: a coordinator restarting
    on a busy machine (imports, tokenizer) can take half a minute, which ten tries would not wait out."""
    base: float = 0.2
    """First backoff ceiling, seconds."""
    cap: float = 10.0
    """Largest backoff ceiling, seconds."""
    deadline: float | None = 300.0
    """Give up after this many seconds in total (None: only ``attempts`` limits)."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.cap, self.base * 2**attempt))


def _error(response: httpx.Response) -> CoordinatorError:
    status = response.status_code
    try:
        detail = wire.ErrorReply.model_validate_json(response.content).error
        code, field, message = detail.code, detail.field, detail.message
    except pydantic.ValidationError:
        code, field, message = "invalid", "body", response.text[:500] or response.reason_phrase
    cls: type[CoordinatorError]
    if status in (401, 403):
        cls = Unauthorized
    elif code == "unknown_worker":
        cls = UnknownWorker
    elif code == "lease_not_held":
        cls = LeaseLost
    elif status == 409:
        cls = Conflict
    else:
        cls = Invalid
    return cls(status, code, field, message)


class Transport:
    """One httpx client plus the retry loop. Thread-safe (httpx's pool is)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
            verify=verify,
        )

    def close(self) -> None:
        self._http.close()

    def call(
        self,
        method: str,
        path: str,
        reply: type[M],
        body: pydantic.BaseModel | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> M:
        content = (
            body.model_dump_json(by_alias=True, exclude_unset=False).encode() if body is not None else None
        )
        send_headers = {"Content-Type": "application/json", **(headers or {})}
        started = time.monotonic()
        last, attempt = "no attempt made", 0
        for attempt in range(self.retry.attempts):
            wait: float | None = None
            try:
                response = self._http.request(
                    method, path, content=content, headers=send_headers, timeout=timeout or self.timeout
                )
            except httpx.TransportError as exc:
                refused = tls.verify_failure(exc)
                if refused is not None:
                    raise Untrusted(
                        0,
                        "untrusted",
                        "url",
                        f"{self.url}: its TLS certificate was refused ({refused.verify_message or refused}); "
                        "check --ca-file / --tls-fingerprint and that the URL names the coordinator",
                    ) from exc
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 400:
                    return reply.model_validate_json(response.content)
                if response.status_code < 500 and response.status_code != 429:
                    raise _error(response)
                last = f"HTTP {response.status_code}: {response.text[:200]}"
                wait = _retry_after(response)
            if attempt + 1 >= self.retry.attempts:
                break
            delay = wait if wait is not None else self.retry.delay(attempt, self._rng)
            if self.retry.deadline is not None and time.monotonic() - started + delay > self.retry.deadline:
                break
            self._sleep(delay)
        raise Unavailable(
            503,
            "unavailable",
            "url",
            f"{method} {self.url}{path} failed after {attempt + 1} attempt(s) in "
            f"{time.monotonic() - started:.1f}s; last error: {last}",
        )


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return min(60.0, max(0.0, float(value))) if value is not None else None
    except ValueError:
        return None


class WorkerClient:
    """An inference worker's side of the protocol. Call :meth:`register` first (or let the first
    heartbeat/lease do it)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        pool: str,
        backend: str,
        device: str,
        dtype: str,
        capacity: int = 1,
        external: bool = False,
        host: str | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._t = Transport(url, token, timeout=timeout, retry=retry, transport=transport, verify=verify)
        self._registration = wire.RegisterRequest(
            pool=pool,
            backend=backend,
            device=device,
            dtype=dtype,
            capacity=capacity,
            external=external,
            host=host,
        )
        self._lock = threading.Lock()
        self.worker_id: str | None = None
        self._session: str | None = None
        self.lease_timeout: float | None = None
        self.heartbeat_interval: float | None = None
        self.registrations = 0
        """How many times this client registered (more than 1: the coordinator forgot it)."""

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._t.close()

    def register(self) -> wire.RegisterReply:
        """Join the swarm (again): a new worker id and session key."""
        with self._lock:
            reply = self._t.call("POST", "/v1/workers", wire.RegisterReply, self._registration)
            self.worker_id, self._session = reply.worker_id, reply.session_key
            self.lease_timeout, self.heartbeat_interval = (
                reply.lease_timeout_seconds,
                reply.heartbeat_interval_seconds,
            )
            self.registrations += 1
            return reply

    def heartbeat(self, loaded_version: int | None) -> wire.HeartbeatReply:
        """Report the loaded version; act on ``loadVersion`` in the reply."""
        body = wire.HeartbeatRequest(loaded_version=loaded_version)
        return self._as_worker(
            lambda wid, h: self._t.call(
                "POST", f"/v1/workers/{wid}/heartbeat", wire.HeartbeatReply, body, headers=h
            )
        )

    def lease(
        self, max_tasks: int = 1, wait: float = 0.0, loaded_version: int | None = None
    ) -> wire.LeaseReply:
        """Lease up to ``max_tasks`` tasks, long-polling up to ``wait`` seconds while there are none;
        an empty list comes with ``retryAfterSeconds``. ``loaded_version`` reports the version the
        backend holds, as a heartbeat does (rollouts may only claim versions reported so)."""
        body = wire.LeaseRequest(max_tasks=max_tasks, wait_seconds=wait, loaded_version=loaded_version)
        return self._as_worker(
            lambda wid, h: self._t.call(
                "POST",
                f"/v1/workers/{wid}/leases",
                wire.LeaseReply,
                body,
                headers=h,
                timeout=wait + self._t.timeout,
            )
        )

    def submit(
        self, task_id: str, rollouts: Sequence[wire.RolloutIn | Mapping[str, Any]]
    ) -> wire.SubmitReply:
        """Submit a task's whole group. Raises :class:`LeaseLost` if the lease is gone."""
        body = wire.SubmitRequest(
            rollouts=[
                r if isinstance(r, wire.RolloutIn) else wire.RolloutIn.model_validate(r) for r in rollouts
            ]
        )
        worker_id, headers = self._identity()
        try:
            return self._t.call(
                "POST",
                f"/v1/workers/{worker_id}/tasks/{task_id}/rollouts",
                wire.SubmitReply,
                body,
                headers=headers,
            )
        except UnknownWorker as exc:
            raise LeaseLost(
                exc.status,
                "lease_not_held",
                "taskId",
                f"the coordinator forgot worker {worker_id} and its lease on {task_id}",
            ) from exc

    def give_up_after(self, seconds: float) -> None:
        """Shorten every retry loop, the ones in flight included, to ``seconds`` in total: a worker that
        is stopping must not wait out the full deadline for a coordinator that is gone."""
        current = self._t.retry.deadline
        self._t.retry = dataclasses.replace(
            self._t.retry, deadline=seconds if current is None else min(current, seconds)
        )

    def leave(self) -> None:
        """Leave the swarm; leases go back to the queue at once."""
        if self.worker_id is None:
            return
        worker_id, headers = self._identity()
        with contextlib.suppress(UnknownWorker):
            self._t.call("DELETE", f"/v1/workers/{worker_id}", wire.LeaveReply, headers=headers)
        self.worker_id = self._session = None

    def status(self) -> wire.StatusDocument:
        return self._t.call("GET", "/v1/status", wire.StatusDocument)

    def run_heartbeats(
        self,
        stop: threading.Event,
        loaded_version: Callable[[], int | None],
        on_reply: Callable[[wire.HeartbeatReply], None] = lambda reply: None,
    ) -> None:
        """Heartbeat every ``heartbeatIntervalSeconds`` until ``stop`` is set (run it in a thread).
        Errors other than Unauthorized are retried on the next beat."""
        while not stop.is_set():
            try:
                on_reply(self.heartbeat(loaded_version()))
            except Unauthorized:
                raise
            except CoordinatorError:
                pass
            stop.wait(self.heartbeat_interval or 1.0)

    def _identity(self) -> tuple[str, dict[str, str]]:
        with self._lock:
            if self.worker_id is None or self._session is None:
                raise UnknownWorker(
                    404, "unknown_worker", "workerId", "not registered: call register() first"
                )
            return self.worker_id, {SESSION_HEADER: self._session}

    def _as_worker(self, call: Callable[[str, dict[str, str]], M]) -> M:
        if self.worker_id is None:
            self.register()
        worker_id, headers = self._identity()
        try:
            return call(worker_id, headers)
        except UnknownWorker:
            with self._lock:
                forgotten = self.worker_id == worker_id
            if forgotten:
                self.register()
            worker_id, headers = self._identity()
            return call(worker_id, headers)


class TrainerClient:
    """The trainer's side: announce published versions, pull batches."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self._t = Transport(url, token, timeout=timeout, retry=retry, transport=transport, verify=verify)

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._t.close()

    def announce(self, version: int) -> wire.AnnounceReply:
        """Tell the coordinator snapshot ``version`` is published (after it is, never before)."""
        return self._t.call(
            "POST", "/v1/trainer/version", wire.AnnounceReply, wire.AnnounceRequest(version=version)
        )

    def quarantine(
        self, worker_id: str, reason: str, *, version: int, mismatch: float | None = None
    ) -> wire.QuarantineReply:
        """Quarantine a worker whose behaviour log-probs disagree with the trainer's recomputation."""
        body = wire.QuarantineRequest(worker_id=worker_id, reason=reason, version=version, mismatch=mismatch)
        return self._t.call("POST", "/v1/trainer/quarantine", wire.QuarantineReply, body)

    def batch(self, version: int, wait: float = 20.0, step_seconds: float | None = None) -> wire.BatchReply:
        """One long-poll for the batch of step ``version -> version+1`` (``ready`` may be False)."""
        return self._t.call(
            "POST",
            "/v1/trainer/batches",
            wire.BatchReply,
            wire.BatchRequest(version=version, wait_seconds=wait, step_seconds=step_seconds),
            timeout=wait + self._t.timeout,
        )

    def wait_batch(
        self,
        version: int,
        policy: staleness.StalenessPolicy | None = None,
        timeout: float | None = None,
        *,
        step_seconds: float | None = None,
    ) -> wire.BatchReply:
        """Long-poll until the batch for ``version`` is ready (checked with :func:`check_batch` when
        ``policy`` is given); :class:`TimeoutError` after ``timeout`` seconds. ``step_seconds``: the
        trainer's own time for its last version (:class:`wire.BatchRequest`)."""
        started = time.monotonic()
        while True:
            left = None if timeout is None else timeout - (time.monotonic() - started)
            if left is not None and left <= 0:
                raise TimeoutError(f"no batch for version {version} within {timeout}s")
            reply = self.batch(
                version, wait=20.0 if left is None else max(0.0, min(20.0, left)), step_seconds=step_seconds
            )
            if reply.ready:
                if policy is not None:
                    check_batch(reply, policy)
                return reply

    def status(self) -> wire.StatusDocument:
        return self._t.call("GET", "/v1/status", wire.StatusDocument)


def check_batch(batch: wire.BatchReply, policy: staleness.StalenessPolicy) -> None:
    """The trainer's own check: every group and rollout passes :func:`.staleness.admit` at the batch's version."""
    for group in batch.groups:
        versions = [group.policy_version, *(r.policy_version for r in group.rollouts)]
        for version in versions:
            verdict = staleness.admit(version, batch.version, policy)
            if not verdict.consume:
                raise StalenessViolation(f"group {group.task_id}: {verdict.reason}")
