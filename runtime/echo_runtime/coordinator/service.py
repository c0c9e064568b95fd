"""Running a coordinator: job file → state → HTTP service (uvicorn, one process, one event loop).

Restart semantics (docs/coordinator.md): the coordinator keeps nothing on disk of its own. On start it
reads ``t_train`` from the snapshot store (the newest published version; 0 for a fresh job), so policy
versions never go back and the Δmax bound keeps holding across a restart. What a restart loses is only
in memory and regenerable: the replay buffer, open leases (late submissions for them are rejected; the
prompts are drawn again), worker registrations (workers re-register by themselves when they get
``unknown_worker``) and the status counters. It never loses a published snapshot, a trainer checkpoint
or a consumed batch's effect, all of which live in the store and the trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import uvicorn

from echo_runtime import rewards
from echo_runtime.coordinator import api, auth, config, scoring, state, trust
from echo_runtime.spec import ResolvedJob
from echo_runtime.tasks import base as tasks_base

log = logging.getLogger("echorl.coordinator")


class VersionSource(Protocol):
    """The one thing the coordinator asks the snapshot store: the newest published version."""

    def latest_version(self) -> int | None: ...


class SetupError(RuntimeError):
    """The coordinator cannot start; the message says what to fix."""


def recover_version(store: VersionSource | None) -> int:
    """``t_train`` to start from: the store's newest published version, or 0."""
    if store is None:
        return 0
    try:
        latest = store.latest_version()
    except Exception as exc:  # the store's own errors say what is wrong (unreachable, credentials)
        raise SetupError(f"cannot read the newest version from the snapshot store: {exc}") from exc
    return 0 if latest is None else int(latest)


def open_store(job: ResolvedJob) -> VersionSource:
    """The job's snapshot store (``echo_runtime.snapshots``)."""
    from echo_runtime import snapshots

    try:
        return snapshots.open_store(job.spec.storage, job.name)
    except (ValueError, snapshots.SnapshotError) as exc:
        raise SetupError(f"cannot open the snapshot store of job {job.name!r}: {exc}") from exc


def model_vocab_size(job: ResolvedJob) -> int:
    """The vocabulary size of the job's model, through the one model resolver (any name: built-in, local
    directory, hub id in the local Hugging Face cache, GGUF file) and ``AutoConfig``."""
    try:
        # Imported by name: it pulls in torch and transformers, which only this fallback needs.
        models_load = importlib.import_module("echo_runtime.models.load")
        models_resolve = importlib.import_module("echo_runtime.models.resolve")
        size: int = models_resolve.vocab_size(models_load.resolve_spec(job.spec.model, job.spec.task))
        return size
    except Exception as exc:
        raise SetupError(
            f"cannot read the vocabulary size of model {job.spec.model.path!r} ({exc}); "
            "pass --vocab-size N to set it"
        ) from exc


def load_detokenizer(job: ResolvedJob, model: str | None = None) -> trust.Detokenizer:
    """The job's tokenizer (or ``model``'s) as the token-id check needs it: decoding exactly as every
    backend does (:func:`echo_runtime.backends.sampling.finish`), and the model's end-of-sequence ids.
    From ``tokenizer.json`` alone where that decodes exactly (:mod:`echo_runtime.models.detokenizer`:
    the coordinator then never imports torch), else through transformers."""
    try:
        models_load = importlib.import_module("echo_runtime.models.load")
        path = model if model is not None else models_load.resolve_spec(job.spec.model, job.spec.task)
        # tokenizer.json alone where it decodes exactly as transformers does: no torch in this process.
        light = importlib.import_module("echo_runtime.models.detokenizer").load(
            models_load.resolve_model(path)
        )
        if light is not None:
            return trust.Detokenizer(decode=light.decode, eos_ids=light.eos_ids)
        sampling = importlib.import_module("echo_runtime.backends.sampling")
        tokenizer = models_load.load_tokenizer(path)
        eos = sampling.eos_token_ids(models_load.resolve_model(path), tokenizer)
    except Exception as exc:
        raise SetupError(
            f"cannot load the tokenizer of model {model or job.spec.model.path!r} to check rollouts' token "
            f"ids ({exc}); pass --tokenizer with a model directory"
        ) from exc

    def decode(ids: Sequence[int]) -> str:
        text: str = tokenizer.decode(list(ids), skip_special_tokens=False)
        return text

    return trust.Detokenizer(decode=decode, eos_ids=frozenset(eos))


def build(
    job: ResolvedJob,
    tokens: auth.TokenStore,
    *,
    vocab_size: int,
    store: VersionSource | None,
    task: tasks_base.Task | None = None,
    detokenizer: trust.Detokenizer | None = None,
    lease_timeout: float = 30.0,
    heartbeat_interval: float = 5.0,
    task_timeout: float = 600.0,
    score_timeout: float = scoring.DEFAULT_TIMEOUT_S,
    verifier_processes: int = 1,
    pacing: bool = True,
    metrics_auth: bool = False,
    reward_pools: Mapping[str, Sequence[str]] | None = None,
    scorer_token: str | None = None,
) -> api.Service:
    """A ready-to-serve coordinator for ``job`` (``t_train`` recovered from ``store``).

    With ``task`` given as an object, rollouts are scored in the event loop's thread (tests); otherwise
    the task is built from the spec here and, by name again, in ``verifier_processes`` scoring processes.
    ``detokenizer`` None skips the token-id check (load tests with synthetic ids only).
    ``reward_pools``: each of ``spec.rewardModels``' scoring pool addresses (``echorl scorer``), called
    with ``scorer_token``."""
    missing = tokens.missing_pools(name for name, _ in job.inference_pools)
    if missing:
        raise SetupError(f"tokens: no join token for pool(s) {', '.join(missing)}")
    try:
        settings = config.CoordinatorConfig.from_job(
            job,
            vocab_size=vocab_size,
            lease_timeout=lease_timeout,
            heartbeat_interval=heartbeat_interval,
            task_timeout=task_timeout,
            pacing=pacing,
        )
    except ValueError as exc:
        raise SetupError(str(exc)) from exc
    scorer: scoring.Scorer
    if task is None:
        from echo_runtime import tasks

        try:
            task = tasks.from_spec(job.spec.task)
        except ValueError as exc:
            raise SetupError(f"spec.task: {exc}") from exc
        scorer = scoring.ProcessScorer(job.spec.task, processes=verifier_processes, timeout_s=score_timeout)
    else:
        scorer = scoring.InlineScorer(task, score_timeout)
    scorer = _with_reward_models(job, scorer, reward_pools or {}, scorer_token)
    t_train = recover_version(store)
    coordinator = state.CoordinatorState(
        settings, task, now=time.monotonic(), t_train=t_train, detokenizer=detokenizer
    )
    log.info(
        "job %s: %s mode, Δmax %d, t_train %d (%s), pacing %s, token-id check %s",
        settings.job,
        settings.policy.mode,
        settings.policy.max_staleness,
        t_train,
        "from the snapshot store" if store is not None else "no store",
        "on" if settings.pacing else "OFF",
        "on" if detokenizer is not None else "OFF",
    )
    if metrics_auth and tokens.status is None:
        raise SetupError("--metrics-auth: the tokens file has no 'status' token to read the metrics with")
    return api.Service(coordinator, tokens, scorer=scorer, metrics_auth=metrics_auth)


def _with_reward_models(
    job: ResolvedJob, scorer: scoring.Scorer, pools: Mapping[str, Sequence[str]], token: str | None
) -> scoring.Scorer:
    """The verifier's scorer, with the job's reward models' scoring pools when it has any."""
    wanted = {m.name: m for m in job.spec.reward_models}
    unknown = sorted(set(pools) - set(wanted))
    if unknown:
        raise SetupError(
            f"--reward-model: {', '.join(unknown)} not in spec.rewardModels ({', '.join(wanted) or 'none'})"
        )
    if not wanted:
        return scorer
    missing = sorted(n for n in wanted if not pools.get(n))
    if missing:
        raise SetupError(
            f"spec.rewardModels: no scoring pool address for {', '.join(missing)} (--reward-model NAME=URL)"
        )
    if not token:
        raise SetupError(f"spec.rewardModels: the scoring pools' token is missing ({rewards.TOKEN_ENV})")
    from echo_runtime.rewards import pool

    clients = [pool.PoolClient(settings, pools[name], token) for name, settings in wanted.items()]
    log.info(
        "reward models: %s",
        ", ".join(f"{c.settings.name} ({c.settings.type}, {len(c.urls)} address(es))" for c in clients),
    )
    return pool.WithRewardModels(scorer, clients, job.spec.task.reward_weight)


class _CoalescingTransport:
    """Forwards to an asyncio transport, but gathers the writes of one loop iteration into one send.

    An ASGI response arrives as two messages (head, body) and uvicorn writes each at once: two
    ``send`` calls and two wake-ups of the client per response. Joining them halves that, which
    matters at thousands of small replies per second on two cores."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._chunks: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._chunks.append(bytes(data))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools if installed, else h11) with coalesced writes."""
    base: type[Any]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol

    class Coalescing(base):  # type: ignore[misc]  # base is chosen at run time
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(_CoalescingTransport(transport, asyncio.get_running_loop()))

    Coalescing.__name__ = f"Coalescing{base.__name__}"
    return Coalescing


def tune_gc() -> None:
    """Keep the garbage collector's pauses out of the request latency (process-wide: call it only in a
    process that is nothing but a coordinator).

    Measured with 1000 heartbeating workers and 2,000 rollouts/s on two cores: full (generation 2)
    collections traversed every object of the imported libraries and paused the event loop for up to
    ~90 ms, several times in ten seconds, which set the p99. Freezing what exists after start-up takes
    those ~60k objects out of every collection, and larger thresholds make full collections rare; the
    p99 of a submission dropped from ~20 ms to ~9 ms and the longest pause from ~110 ms to ~30 ms."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 50)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to :func:`serve` (which runs one or two of them)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(
    app: Any,
    host: str,
    port: int,
    *,
    log_level: str = "info",
    keep_alive: float = 75.0,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_port: int | None = None,
) -> None:
    """Serve the ASGI ``app`` until SIGINT/SIGTERM (tuning the GC first: :func:`tune_gc`).

    With ``tls_cert``/``tls_key`` the coordinator speaks TLS: on ``port`` alone, or, given
    ``tls_port``, on that port while ``port`` stays plain HTTP (in-cluster pods use the plain port
    behind a ClusterIP; workers outside the cluster join on the TLS one).
    """
    tune_gc()

    def config(listen: int, lifespan: Literal["on", "off"], **ssl: Any) -> uvicorn.Config:
        return uvicorn.Config(
            app,
            host=host,
            port=listen,
            log_level=log_level,
            access_log=False,
            timeout_keep_alive=int(keep_alive),
            lifespan=lifespan,
            http=http_protocol(),
            **ssl,
        )

    if tls_cert is None:
        uvicorn.Server(config(port, "on")).run()
        return
    ssl = {"ssl_certfile": tls_cert, "ssl_keyfile": tls_key}
    if tls_port is None:
        uvicorn.Server(config(port, "on", **ssl)).run()
        return
    asyncio.run(_serve_all([_Server(config(port, "on")), _Server(config(tls_port, "off", **ssl))]))


async def _serve_all(servers: list[uvicorn.Server]) -> None:
    """Run the servers side by side (the first one runs the app's lifespan) until a signal or one ends."""
    loop = asyncio.get_running_loop()

    def stop_all() -> None:
        for server in servers:
            server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_all)
    first = asyncio.create_task(servers[0].serve())
    while not servers[0].started and not first.done():  # the app starts before the second port opens
        await asyncio.sleep(0.05)
    tasks = [first, *(asyncio.create_task(s.serve()) for s in servers[1:])]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stop_all()
    await asyncio.gather(*tasks)
