"""The coordinator's side of the scoring pools: call them, cache by rollout, combine by weight.

Promises:

* Every group a worker submits is scored by the task's verifier *and* every reward model before it
  enters the buffer; the reward is ``(w_task · r_task + Σ w_i · r_i) / (w_task + Σ w_i)``, each part in
  ``rewardComponents`` (``task`` and each reward model's name) beside the verifier's own components.
* A reward model's score is cached by rollout (its prompt and completion), so a submission scored
  again — a worker's retry after a 503, a duplicate — gets the same reward without a second call.
* A scoring pool that does not answer within ``timeoutSeconds`` (each of its addresses tried once)
  makes the submission fail with 503 ``rewardModels[<name>]``: nothing is buffered, the worker retries,
  its lease's prompt is not lost, and no group is trained on with a reward it lacks.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from echo_runtime.coordinator import errors, scoring
from echo_runtime.models.prompts import Prompt, messages
from echo_runtime.spec.rewards import RewardModel
from echo_runtime.tasks import base as tasks_base

log = logging.getLogger("echorl.coordinator")

CACHE_SIZE = 100_000
"""Rewards cached per reward model (least recently used go first)."""


class PoolUnavailable(Exception):
    pass


class PoolClient:
    """One reward model's scoring pool: its addresses, tried in turn, and the cache."""

    def __init__(
        self,
        settings: RewardModel,
        urls: Sequence[str],
        token: str,
        *,
        cache_size: int = CACHE_SIZE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``transport``: how requests travel (tests hand an in-process app); default the network."""
        if not urls:
            raise ValueError(f"rewardModels[{settings.name}]: no scoring pool address")
        self.settings = settings
        self.urls = [u.rstrip("/") for u in urls]
        self.cache: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        self.cache_size = cache_size
        self.hits = 0
        self.calls = 0
        self._next = 0
        self._client = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=settings.timeout_seconds,
            transport=transport,
        )

    @staticmethod
    def key(prompt: Prompt, completion: str) -> str:
        body = json.dumps([messages(prompt), completion], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()

    async def score(self, prompt: Prompt, completions: Sequence[str]) -> list[tuple[float, str]]:
        keys = [self.key(prompt, c) for c in completions]
        unique: dict[str, int] = {}  # each completion not cached yet, once
        for i, k in enumerate(keys):
            if k not in self.cache:
                unique.setdefault(k, i)
        self.hits += len(completions) - len(unique)
        if unique:
            got = await self._call(prompt, [completions[i] for i in unique.values()])
            for k, scored in zip(unique, got, strict=True):
                self.cache[k] = scored
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
        out = []
        for k in keys:
            self.cache.move_to_end(k)
            out.append(self.cache[k])
        return out

    async def _call(self, prompt: Prompt, completions: list[str]) -> list[tuple[float, str]]:
        body = {"prompt": prompt if isinstance(prompt, str) else messages(prompt), "completions": completions}
        failures = []
        for _ in range(len(self.urls)):
            url = self.urls[self._next % len(self.urls)]
            self._next += 1
            self.calls += 1
            try:
                response = await self._client.post(f"{url}/v1/score", json=body)
                response.raise_for_status()
                reply = response.json()
                rewards, reasons = reply["rewards"], reply["reasons"]
                if len(rewards) != len(completions) or len(reasons) != len(completions):
                    raise ValueError(f"{len(rewards)} rewards for {len(completions)} completions")
                return [(_unit(r), str(why)[:200]) for r, why in zip(rewards, reasons, strict=True)]
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                failures.append(f"{url}: {type(exc).__name__}: {exc}"[:300])
        raise PoolUnavailable("; ".join(failures))

    async def close(self) -> None:
        await self._client.aclose()


def _unit(value: Any) -> float:
    reward = float(value)
    if not 0.0 <= reward <= 1.0:
        raise ValueError(f"reward {reward} outside [0, 1]")
    return reward


class WithRewardModels:
    """A :class:`~echo_runtime.coordinator.scoring.Scorer`: the task's verifier (``base``) and the
    scoring pools, combined by weight."""

    def __init__(self, base: scoring.Scorer, pools: Sequence[PoolClient], task_weight: float) -> None:
        self.base = base
        self.pools = list(pools)
        self.task_weight = task_weight

    async def score(self, problem: tasks_base.Problem, completions: Sequence[str]) -> scoring.Scores:
        async def pool_scores(pool: PoolClient) -> list[tuple[float, str]]:
            try:
                return await pool.score(problem.prompt, completions)
            except PoolUnavailable as exc:
                name = pool.settings.name
                log.warning("reward model %s: its scoring pool did not answer (%s)", name, exc)
                raise errors.Rejected(
                    503, "unavailable", f"rewardModels[{name}]",
                    f"the scoring pool did not answer: {exc}; nothing was buffered, submit again",
                ) from exc  # fmt: skip

        task: scoring.Scores
        models: list[list[tuple[float, str]]]
        task, models = await asyncio.gather(
            self.base.score(problem, completions), asyncio.gather(*map(pool_scores, self.pools))
        )
        rewards = [
            combine(
                self.task_weight,
                reward,
                {p.settings.name: (p.settings.weight, m[i]) for p, m in zip(self.pools, models, strict=True)},
            )
            for i, reward in enumerate(task.rewards)
        ]
        return scoring.Scores(tuple(rewards), task.timeouts, task.errors)

    def close(self) -> None:
        self.base.close()


def combine(
    task_weight: float, task: tasks_base.Reward, models: Mapping[str, tuple[float, tuple[float, str]]]
) -> tasks_base.Reward:
    """The weighted mean of the verifier's reward and each model's ``(weight, (reward, reason))``."""
    total = task_weight + sum(w for w, _ in models.values())
    value = (task_weight * task.value + sum(w * r for w, (r, _) in models.values())) / total
    components = {**task.components, "task": task.value, **{name: r for name, (_, (r, _)) in models.items()}}
    reasons = [task.reason] if task.reason else []
    reasons += [f"{name}: {why}" for name, (_, (_, why)) in models.items() if why]
    return tasks_base.Reward(min(1.0, max(0.0, value)), components, "; ".join(reasons)[:500])
