"""Fixtures for the trainer's unit tests: the built-in tiny model and synthetic batches.

``tiny_model_dir`` (session)
    The built-in tiny model, ``init_model("tiny", seed=0)``, in a session temp dir (Echo's cache untouched).
``one_torch_thread`` (autouse)
    Runs each test with one torch thread, restoring the count afterwards.
``make_policy`` (function)
    ``make_policy(finetune="LoRA", seed=0, with_reference=False, **model_fields)`` → a fresh
    :class:`~echo_runtime.trainer.policy.TrainablePolicy` on the tiny model, LoRA ``A`` seeded.
``make_batch``
    ``make_batch(policy, version, groups=..., n=..., versions=..., backends=..., offsets=..., seed=...)``
    → a :class:`~echo_runtime.rollout.Batch` of random token ids whose behaviour log-probs are the
    policy's own (so ρ = 1) plus a per-backend offset; rewards are 0/1.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
import torch

from echo_runtime.models import build
from echo_runtime.rollout import Batch, Group, Rollout
from echo_runtime.spec.policy import LoRA, Model
from echo_runtime.trainer import policy as trainer_policy


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build.init_model("tiny", tmp_path_factory.mktemp("trainer-model") / "tiny", seed=0))


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One torch thread: on a shared 2-core machine two OpenMP threads are far slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def make_policy(tiny_model_dir: str) -> Callable[..., trainer_policy.TrainablePolicy]:
    def make(
        finetune: str = "LoRA", seed: int = 0, with_reference: bool = False, rank: int = 4, **fields: Any
    ) -> trainer_policy.TrainablePolicy:
        spec = Model(finetune=finetune, lora=LoRA(rank=rank, alpha=2.0 * rank), **fields)  # type: ignore[arg-type]
        torch.manual_seed(seed)
        return trainer_policy.load_policy(spec, model_dir=tiny_model_dir, with_reference=with_reference)

    return make


def build_batch(
    policy: trainer_policy.TrainablePolicy,
    version: int,
    *,
    groups: int = 2,
    n: int = 4,
    versions: Sequence[int] | None = None,
    backends: Sequence[str] | None = None,
    offsets: Mapping[str, float] | None = None,
    seed: int = 0,
    temperature: float = 1.0,
) -> Batch:
    """Random groups; behaviour log-probs = the policy's (at its current weights) + offsets[backend]."""
    rng = random.Random(seed)
    vocab = 1000
    built = []
    for g in range(groups):
        prompt = tuple(rng.randrange(1, vocab) for _ in range(rng.randint(2, 6)))
        backend = backends[g] if backends is not None else "transformers"
        rollouts = []
        for _ in range(n):
            completion = tuple(rng.randrange(1, vocab) for _ in range(rng.randint(1, 7)))
            probe = Rollout(prompt, completion, (0.0,) * len(completion), 0.0, 0)
            with torch.no_grad():
                packed = trainer_policy.pack([probe], policy.pad_id)
                lp = trainer_policy.completion_logprobs(policy.model, packed, temperature)[
                    0, : len(completion)
                ]
            shift = (offsets or {}).get(backend, 0.0)
            rollouts.append(
                Rollout(
                    prompt_ids=prompt,
                    completion_ids=completion,
                    logprobs=tuple(float(x) + shift for x in lp),
                    reward=float(rng.random() < 0.5),
                    policy_version=versions[g] if versions is not None else version,
                    backend=backend,
                )
            )
        # make sure every group has signal (not all rewards equal)
        rollouts[0] = dataclasses.replace(rollouts[0], reward=1.0)
        rollouts[1] = dataclasses.replace(rollouts[1], reward=0.0)
        built.append(Group(rollouts=tuple(rollouts), id=f"g{g}"))
    return Batch(version=version, groups=tuple(built))


@pytest.fixture
def make_batch() -> Callable[..., Batch]:
    return build_batch
