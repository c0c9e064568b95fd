"""``echorl scorer``: one process of a reward model's scoring pool, an HTTP service the coordinator calls.

``POST /v1/score`` with ``{"prompt": text or messages, "completions": [...]}`` (bearer token) returns
``{"rewards": [...], "reasons": [...]}``, one per completion, in order; ``GET /healthz`` says it is up
and how many completions it has scored. Only the coordinator calls it, with the job's scorer token
(:data:`~echo_runtime.rewards.TOKEN_ENV`): a worker never reaches a reward.

Batching: requests that arrive together are merged, up to ``batchSize`` completions a forward pass,
and the model runs on one thread of its own, so the event loop keeps answering ``/healthz``. A
request's completions are scored in order and returned together.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from echo_runtime.models.prompts import Prompt

log = logging.getLogger("echorl.scorer")

MAX_COMPLETIONS = 1024
MAX_CHARS = 200_000


class _Message(BaseModel):
    role: str = Field(min_length=1, max_length=32)
    content: str = Field(max_length=MAX_CHARS)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    prompt: str | list[_Message] = Field(max_length=MAX_CHARS)
    completions: list[str] = Field(min_length=1, max_length=MAX_COMPLETIONS)


class ScoreReply(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    model: str
    rewards: list[float]
    reasons: list[str]


@dataclasses.dataclass
class _Pending:
    prompt: Prompt
    completions: list[str]
    future: asyncio.Future[list[tuple[float, str]]]


class Batcher:
    """Merges concurrent requests into forward passes of at most ``batch_size`` completions."""

    def __init__(
        self, score: Callable[[Sequence[tuple[Prompt, str]]], list[tuple[float, str]]], batch_size: int
    ) -> None:
        self.score = score
        self.batch_size = batch_size
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="scorer")
        self.scored = 0
        self.batches = 0

    async def submit(self, prompt: Prompt, completions: list[str]) -> list[tuple[float, str]]:
        future: asyncio.Future[list[tuple[float, str]]] = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(prompt, completions, future))
        return await future

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            taken = [await self.queue.get()]
            while not self.queue.empty() and sum(len(p.completions) for p in taken) < self.batch_size:
                taken.append(self.queue.get_nowait())
            items = [(p.prompt, c) for p in taken for c in p.completions]
            try:
                results: list[tuple[float, str]] = []
                for start in range(0, len(items), self.batch_size):
                    chunk = items[start : start + self.batch_size]
                    results += await loop.run_in_executor(self.executor, self.score, chunk)
                    self.batches += 1
            except Exception as exc:  # a request's failure is its own: the others get the error too
                log.exception("scoring failed")
                for pending in taken:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            self.scored += len(items)
            at = 0
            for pending in taken:
                n = len(pending.completions)
                if not pending.future.done():
                    pending.future.set_result(results[at : at + n])
                at += n


def app(name: str, token: str, batcher: Batcher) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        runner = asyncio.create_task(batcher.run())
        try:
            yield
        finally:
            runner.cancel()
            batcher.executor.shutdown(wait=False, cancel_futures=True)

    service = FastAPI(title=f"echorl scorer {name}", lifespan=lifespan)
    expected = f"Bearer {token}".encode()

    def authorised(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise HTTPException(401, "the scoring pool's token is required (Authorization: Bearer ...)")

    @service.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "model": name, "scored": batcher.scored, "batches": batcher.batches}

    @service.post("/v1/score", response_model=ScoreReply, response_model_by_alias=True)
    async def score(body: ScoreRequest, request: Request) -> ScoreReply:
        authorised(request)
        prompt: Prompt = (
            body.prompt if isinstance(body.prompt, str) else tuple(m.model_dump() for m in body.prompt)
        )
        try:
            scored = await batcher.submit(prompt, body.completions)
        except Exception as exc:
            raise HTTPException(500, f"scoring failed: {type(exc).__name__}: {exc}"[:500]) from exc
        return ScoreReply(model=name, rewards=[r for r, _ in scored], reasons=[why for _, why in scored])

    return service
