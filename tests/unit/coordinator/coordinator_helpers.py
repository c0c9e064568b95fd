"""Builders shared by the coordinator's unit tests: a state machine on a real task, and valid groups."""

from __future__ import annotations

import random
from typing import Any

from echo_runtime import staleness, tasks
from echo_runtime.coordinator import state, wire
from echo_runtime.coordinator.config import CoordinatorConfig

VOCAB = 100
TRAINER_TOKEN = "trainer-token-0123456789"
CPU_TOKEN = "cpu-pool-token-0123456789"
GPU_TOKEN = "gpu-pool-token-0123456789"


def config(
    mode: staleness.Mode = "Async",
    max_staleness: int = 1,
    action: staleness.StaleAction = "Drop",
    refresh: int = 0,
    *,
    group_size: int = 2,
    batch_size: int = 2,
    capacity: int = 4,
    pools: tuple[str, ...] = ("cpu",),
    **extra: Any,
) -> CoordinatorConfig:
    settings: dict[str, Any] = {
        "max_new_tokens": 8,
        "lease_timeout": 10.0,
        "heartbeat_interval": 1.0,
        "task_timeout": 60.0,
        **extra,
    }
    return CoordinatorConfig(
        job="test",
        policy=staleness.StalenessPolicy(mode, max_staleness, action, refresh),
        group_size=group_size,
        batch_size=batch_size,
        buffer_capacity=capacity,
        vocab_size=VOCAB,
        pools=pools,
        **settings,
    )


def make_state(
    cfg: CoordinatorConfig | None = None, *, t_train: int = 0, now: float = 0.0
) -> state.CoordinatorState:
    return state.CoordinatorState(cfg or config(), tasks.get_task("arithmetic"), now=now, t_train=t_train)


def register(s: state.CoordinatorState, now: float = 0.0, pool: str = "cpu", capacity: int = 4) -> str:
    req = wire.RegisterRequest(
        pool=pool, backend="transformers", device="cpu", dtype="float32", capacity=capacity
    )
    return s.register(req, b"session-digest", now).worker_id


def answer(prompt: str) -> str:
    return str(eval(prompt.rstrip("=")))  # arithmetic prompts: "12+7="


def rollout(
    version: int, completion: str = "0", tokens: int = 3, rng: random.Random | None = None
) -> wire.RolloutIn:
    rng = rng or random.Random(0)
    return wire.RolloutIn(
        completion=completion,
        token_ids=[rng.randrange(VOCAB) for _ in range(tokens)],
        logprobs=[-rng.random() for _ in range(tokens)],
        policy_version=version,
    )


def group(s: state.CoordinatorState, task: wire.TaskOut, version: int) -> wire.SubmitRequest:
    """A valid group for ``task``: half the completions right, all at ``version``."""
    right = answer(task.prompt)
    return wire.SubmitRequest(
        rollouts=[rollout(version, right if i % 2 == 0 else "x") for i in range(s.config.group_size)]
    )
