"""One optimizer step: admission, exact gradient accumulation, metrics (echo_runtime.trainer.step)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from echo_runtime import staleness
from echo_runtime.rollout import Batch, Group, Rollout
from echo_runtime.trainer import step
from echo_runtime.trainer.batch import shard
from echo_runtime.trainer.policy import TrainablePolicy, completion_logprobs, pack

ASYNC_IW = staleness.StalenessPolicy(mode="Async", max_staleness=1, stale_action="ImportanceWeight")
ASYNC_DROP = staleness.StalenessPolicy(mode="Async", max_staleness=1, stale_action="Drop")
BIG = 1e9  # no gradient clipping: the tests compare raw gradients


def _group(version: int, gid: str, rewards: tuple[float, ...] = (1.0, 0.0, 0.0, 1.0)) -> Group:
    return Group(
        rollouts=tuple(Rollout((1, 2), (3, 4, 5), (-1.0, -1.0, -1.0), r, version) for r in rewards), id=gid
    )


# --------------------------------------------------------------------------------------- the plan
def test_plan_applies_the_staleness_rule() -> None:
    batch = Batch(
        version=5,
        groups=(_group(5, "fresh"), _group(4, "one-behind"), _group(3, "too-old"), _group(6, "future")),
    )
    plan = step.plan_step(batch, ASYNC_IW)
    assert [d.group_id for d in plan.dropped] == ["too-old", "future"]
    assert [d.admission.verdict for d in plan.dropped] == ["stale", "future"]
    assert plan.groups == 2 and plan.weighted_groups == 1 and plan.max_staleness == 1
    assert [s.decoupled for s in plan.slots] == [False] * 4 + [True] * 4
    # advantages by hand: rewards [1, 0, 0, 1] → ±0.5 / sqrt(1/3) = ±0.866024
    assert [s.advantage for s in plan.slots[:4]] == pytest.approx(
        [0.866024, -0.866024, -0.866024, 0.866024], abs=1e-6
    )
    assert plan.total_tokens == 8 * 3 and plan.reward_mean == pytest.approx(0.5)

    drop = step.plan_step(batch, ASYNC_DROP)
    assert drop.weighted_groups == 0 and not any(s.decoupled for s in drop.slots)
    assert [d.group_id for d in drop.dropped] == ["too-old", "future"]


def test_a_step_never_consumes_what_the_rule_refuses() -> None:
    plan = step.plan_step(Batch(version=9, groups=(_group(2, "old"),)), ASYNC_IW)
    assert plan.slots == () and plan.max_staleness is None
    with pytest.raises(ValueError, match="every group was dropped"):
        step.train_step(None, None, plan, step.StepConfig())  # type: ignore[arg-type]


def test_shard_balances_ranks_with_fillers() -> None:
    plan = step.plan_step(Batch(version=0, groups=(_group(0, "a", (1.0, 0.0, 1.0)),)), ASYNC_IW)
    r0, r1 = shard(plan.slots, 0, 2), shard(plan.slots, 1, 2)
    assert len(r0) == len(r1) == 2
    assert [s.filler for s in r0] == [False, False] and [s.filler for s in r1] == [False, True]
    assert {id(s.rollout) for s in r0[:2] + r1[:1]} == {id(s.rollout) for s in plan.slots}


# --------------------------------------------------------------------------------------- the step
def _sgd_step(
    policy: TrainablePolicy, plan: step.Plan, **config: Any
) -> tuple[dict[str, torch.Tensor], step.StepMetrics]:
    before = policy.trainable_state()
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
    metrics = step.train_step(policy, optimizer, plan, step.StepConfig(max_grad_norm=BIG, **config))
    after = policy.trainable_state()
    return {k: before[k] - after[k] for k in before}, metrics  # = the gradient (SGD, lr 1)


def test_accumulation_gives_the_full_batch_gradient(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    """Micro-batches of 1, 3 and all rollouts give one gradient: that of a hand-written full-batch loss."""
    batch = make_batch(make_policy(), 0, groups=3, n=3, seed=1)
    plan = step.plan_step(batch, ASYNC_IW)
    grads = [_sgd_step(make_policy(), plan, micro_batch_size=size)[0] for size in (1, 3, 100)]

    # The bare loss on the whole batch: fresh rollouts, ρ = 1, so ℓ = −A per token, averaged over tokens.
    policy = make_policy()
    packed = pack([s.rollout for s in plan.slots], policy.pad_id)
    logp = completion_logprobs(policy.model, packed, 1.0)
    adv = torch.tensor([s.advantage for s in plan.slots]).unsqueeze(1)
    bare = -(torch.exp(logp - logp.detach()) * adv * packed.mask).sum() / packed.mask.sum()
    bare.backward()
    reference = {name: p.grad.detach().clone() for name, p in policy.named_trainable() if p.grad is not None}

    assert any(g.abs().max() > 0 for g in reference.values())
    for grad in grads:
        for name, expected in reference.items():
            torch.testing.assert_close(grad[name], expected, rtol=1e-4, atol=1e-7)


def test_mismatch_is_reported_per_backend_by_hand(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    # Group 0 from "transformers" (exact), group 1 from "vllm" with every behaviour log-prob 0.1 too high,
    # group 2 from "mlx" one version behind (policy drift, not backend numerics: not reported).
    policy = make_policy()
    batch = make_batch(
        policy,
        3,
        groups=3,
        n=4,
        versions=[3, 3, 2],
        backends=["transformers", "vllm", "mlx"],
        offsets={"vllm": 0.1},
    )
    _, metrics = _sgd_step(policy, step.plan_step(batch, ASYNC_DROP), micro_batch_size=5)
    assert set(metrics.mismatch) == {"transformers", "vllm"}
    exact, shifted = metrics.mismatch["transformers"], metrics.mismatch["vllm"]
    assert exact.sequences == 4 and exact.max_abs < 1e-4 and abs(exact.kl_seq) < 1e-6
    vllm_rollouts = batch.groups[1].rollouts
    assert shifted.sequences == 4 and shifted.tokens == sum(len(r.completion_ids) for r in vllm_rollouts)
    assert shifted.mean_abs == pytest.approx(0.1, abs=1e-4) and shifted.max_abs == pytest.approx(
        0.1, abs=1e-4
    )
    # k3 per token with log π − log μ = −0.1: e^−0.1 − 1 + 0.1 = 0.00483742; summed per sequence, averaged.
    mean_length = shifted.tokens / shifted.sequences
    assert shifted.kl_seq == pytest.approx(mean_length * 0.00483742, rel=1e-3)
    assert metrics.version == 4 and metrics.max_staleness == 1 and metrics.dropped_groups == 0


def test_clip_and_truncation_fractions_by_hand(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    # Behaviour log-probs 1 nat below the policy's: ρ = e ≈ 2.72 on every token. With ε = 0.2 and C = 2,
    # tokens with A > 0 are clipped and tokens with A < 0 are truncated (decision 2 of the loss).
    policy = make_policy()
    batch = make_batch(policy, 0, groups=2, n=4, offsets={"transformers": -1.0})
    plan = step.plan_step(batch, ASYNC_DROP)
    _, metrics = _sgd_step(policy, plan, micro_batch_size=3, clip_range=0.2, cap=2.0)
    positive = sum(len(s.rollout.completion_ids) for s in plan.slots if s.advantage > 0)
    negative = sum(len(s.rollout.completion_ids) for s in plan.slots if s.advantage < 0)
    assert metrics.clip_fraction == pytest.approx(positive / plan.total_tokens)
    assert metrics.truncated_fraction == pytest.approx(negative / plan.total_tokens)
    assert metrics.importance_weight_mean == pytest.approx(math.e, rel=1e-4)
    assert metrics.importance_weight_max == pytest.approx(math.e, rel=1e-4)
    assert metrics.tokens == plan.total_tokens and metrics.rollouts == 8


def test_full_finetuning_with_kl_to_the_reference(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy(finetune="Full", with_reference=True)
    assert policy.finetune == "Full" and all(p.requires_grad for p in policy.model.parameters())
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-3)
    config = step.StepConfig(kl_coef=0.1, micro_batch_size=4)
    first = step.train_step(
        policy, optimizer, step.plan_step(make_batch(policy, 0, seed=2), ASYNC_DROP), config
    )
    assert first.kl == 0.0  # π_θ = π_ref before the first update
    second = step.train_step(
        policy, optimizer, step.plan_step(make_batch(policy, 1, seed=3), ASYNC_DROP), config
    )
    assert second.kl is not None and second.kl > 0 and second.version == 2
    assert math.isfinite(second.loss) and second.grad_norm > 0


def test_lora_reference_is_the_base_model(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy()
    base = make_policy(finetune="Full")
    batch = make_batch(policy, 0)
    # Move the adapter away from its zero start, then the adapter-disabled forward must still be the base.
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-2)
    step.train_step(policy, optimizer, step.plan_step(batch, ASYNC_DROP), step.StepConfig(kl_coef=0.05))
    packed = pack(batch.rollouts, policy.pad_id)
    with torch.no_grad():
        trained = completion_logprobs(policy.model, packed, 1.0)
        expected = completion_logprobs(base.model, packed, 1.0)
    torch.testing.assert_close(policy.reference_logprobs(packed, 1.0), expected)
    assert (trained - expected).abs().max() > 1e-5


def test_step_config_from_the_manifest() -> None:
    from echo_runtime.spec.policy import Algorithm, Sampling

    algorithm = Algorithm(
        clip_range=0.3,
        importance_weight_cap=4.0,
        kl_coef=0.01,
        micro_batch_size=2,
        sampling=Sampling(temperature=0.7),
    )
    config = step.StepConfig.from_algorithm(algorithm)
    assert dataclasses.astuple(config)[:5] == (0.3, 4.0, 0.01, 0.7, 2)


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # lr 1e-3 → min 1e-4 over maxSteps 4; the step from version v runs at f(v / 4).
        ("Constant", [1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3]),
        ("Linear", [1e-3, 7.75e-4, 5.5e-4, 3.25e-4, 1e-4, 1e-4]),
        # min + (lr − min)·(1 + cos(π·v/4))/2 with cos(π/4) = √2/2 and cos(3π/4) = −√2/2.
        (
            "Cosine",
            [1e-3, 1e-4 + 9e-4 * (1 + 2**-0.5) / 2, 5.5e-4, 1e-4 + 9e-4 * (1 - 2**-0.5) / 2, 1e-4, 1e-4],
        ),
    ],
)
def test_learning_rate_schedules_by_hand(schedule: str, expected: list[float]) -> None:
    config = step.StepConfig(learning_rate=1e-3, lr_schedule=schedule, min_learning_rate=1e-4, max_steps=4)
    got = [config.learning_rate_at(v) for v in range(6)]  # versions 4 and 5: past maxSteps (extended run)
    assert got == pytest.approx(expected, rel=1e-12)
    assert step.StepConfig().learning_rate_at(3) is None  # a caller that manages the rate itself


def test_the_step_runs_at_its_scheduled_rate(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    from echo_runtime.spec.policy import Algorithm

    algorithm = Algorithm(learning_rate=1e-2, lr_schedule="Linear", min_learning_rate=0.0, max_steps=2)
    config = step.StepConfig.from_algorithm(algorithm)
    policy = make_policy()
    optimizer = step.make_optimizer(policy.trainable_parameters(), algorithm.learning_rate)
    first = step.train_step(
        policy, optimizer, step.plan_step(make_batch(policy, 0, seed=2), ASYNC_DROP), config
    )
    assert first.learning_rate == pytest.approx(1e-2)
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    # Version 2 = maxSteps: the Linear schedule has reached its floor 0, so AdamW must not move a weight.
    last = step.train_step(
        policy, optimizer, step.plan_step(make_batch(policy, 2, seed=3), ASYNC_DROP), config
    )
    assert last.learning_rate == 0.0 and optimizer.param_groups[0]["lr"] == 0.0
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, policy.trainable_parameters(), strict=True))
