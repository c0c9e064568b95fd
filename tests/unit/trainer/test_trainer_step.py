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
from echo_runtime.spec.objectives import Objective
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
    _, metrics = _sgd_step(
        policy,
        plan,
        micro_batch_size=3,
        objective=Objective(clip_low=0.2, clip_high=0.2, importance_weight_cap=2.0),
    )
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
    config = step.StepConfig(objective=Objective(kl_coef=0.1), micro_batch_size=4)
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
    step.train_step(
        policy,
        optimizer,
        step.plan_step(batch, ASYNC_DROP),
        step.StepConfig(objective=Objective(kl_coef=0.05)),
    )
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
    o = config.objective
    assert (o.clip_low, o.clip_high, o.importance_weight_cap, o.kl_coef) == (0.3, 0.3, 4.0, 0.01)
    assert (config.temperature, config.micro_batch_size) == (0.7, 2)


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


# --------------------------------------------------------------------------------------- objectives
def _lengths_group(version: int, gid: str, specs: tuple[tuple[float, int, str], ...]) -> Group:
    """A group of (reward, completion length, finish reason) rollouts."""
    return Group(
        rollouts=tuple(
            Rollout((1, 2), tuple(range(3, 3 + n)), (-1.0,) * n, r, version, finish_reason=f)  # type: ignore[arg-type]
            for r, n, f in specs
        ),
        id=gid,
    )


def test_plan_shapes_rewards_with_the_overlong_penalty() -> None:
    # Budget 10, buffer 4: lengths 6 (no penalty), 8 (−0.5), 10 (−1). Rewards 1, 1, 1 → shaped 1, 0.5, 0.
    group = _lengths_group(0, "g", ((1.0, 6, "stop"), (1.0, 8, "stop"), (1.0, 10, "length")))
    objective = Objective(length_budget=10, overlong_buffer=4, reward_scaling="Off")
    plan = step.plan_step(Batch(version=0, groups=(group,)), ASYNC_DROP, objective)
    assert [s.reward for s in plan.slots] == pytest.approx([1.0, 0.5, 0.0])
    assert [s.advantage for s in plan.slots] == pytest.approx([0.5, 0.0, -0.5])  # r − mean, no std
    assert plan.reward_mean == pytest.approx(1.0)  # the task's reward, as reported
    assert plan.zero_signal_groups == 0
    # Without the penalty the same group has no signal.
    plain = step.plan_step(Batch(version=0, groups=(group,)), ASYNC_DROP)
    assert plain.zero_signal_groups == 1 and {s.advantage for s in plain.slots} == {0.0}


def test_truncated_completions_can_be_masked_out_of_the_loss(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy()
    batch = make_batch(policy, 0, groups=2, n=4, seed=4)
    cut = {batch.groups[0].rollouts[1].completion_ids, batch.groups[1].rollouts[0].completion_ids}
    groups = tuple(
        dataclasses.replace(
            g,
            rollouts=tuple(
                dataclasses.replace(r, finish_reason="length" if r.completion_ids in cut else "stop")
                for r in g.rollouts
            ),
        )
        for g in batch.groups
    )
    batch = Batch(version=0, groups=groups)
    masked_plan = step.plan_step(batch, ASYNC_DROP, Objective(mask_truncated=True))
    assert masked_plan.masked_rollouts == 2
    kept = sum(s.rollout.model_tokens for s in masked_plan.slots if s.rollout.completion_ids not in cut)
    assert masked_plan.total_tokens == kept
    # The masked rollouts contribute nothing: the step equals one over a plan without them at all, with
    # the same advantages (computed with them) and the same token totals.
    grad_masked, metrics = _sgd_step(policy, masked_plan)
    assert metrics.masked_rollouts == 2 and metrics.rollouts == 6 and metrics.tokens == kept
    without = dataclasses.replace(
        masked_plan, slots=tuple(s for s in masked_plan.slots if not s.masked), masked_rollouts=0
    )
    grad_without, _ = _sgd_step(make_policy(), without)
    for name in grad_masked:
        torch.testing.assert_close(grad_masked[name], grad_without[name])


def test_step_records_entropy_and_clip_sides(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy()
    # Behaviour 1 nat below the policy: ρ = e on every token: with ε_high = 0.28 every A > 0 token is
    # clipped high, none low; dual clip c = 2 catches every A < 0 token (ρ = e > 2).
    batch = make_batch(policy, 0, groups=2, n=4, offsets={"transformers": -1.0})
    objective = Objective(clip_high=0.28, dual_clip=2.0)
    plan = step.plan_step(batch, ASYNC_DROP, objective)
    _, metrics = _sgd_step(policy, plan, objective=objective)
    positive = sum(s.rollout.model_tokens for s in plan.slots if s.advantage > 0)
    negative = sum(s.rollout.model_tokens for s in plan.slots if s.advantage < 0)
    assert metrics.clip_fraction_high == pytest.approx(positive / plan.total_tokens)
    assert metrics.dual_clip_fraction == pytest.approx(negative / plan.total_tokens)
    assert metrics.clip_fraction_low == 0.0
    assert metrics.clip_fraction == pytest.approx((positive + negative) / plan.total_tokens)
    # entropy of the tiny model's next-token distributions: between 0 and log(vocab)
    packed = pack([s.rollout for s in plan.slots], policy.pad_id)
    with torch.no_grad():
        logits = policy.model(
            input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=packed.position_ids
        ).logits
    assert 0.0 < metrics.entropy <= math.log(logits.shape[-1])


def test_entropy_bonus_changes_the_gradient(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy(seed=3)
    batch = make_batch(policy, 0, seed=5)
    plan = step.plan_step(batch, ASYNC_DROP)
    plain, _ = _sgd_step(make_policy(seed=3), plan)
    bonus, _ = _sgd_step(make_policy(seed=3), plan, objective=Objective(entropy_coef=0.5))
    assert any((plain[k] - bonus[k]).abs().max() > 1e-6 for k in plain)


def test_kl_in_the_reward_uses_the_trainers_own_logprobs(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    # LoRA: the reference is the adapter-disabled base. Train one step so π_θ ≠ π_ref, then a REINFORCE++
    # step with the KL in the reward records a positive KL and gives every token its own advantage.
    policy = make_policy()
    optimizer = step.make_optimizer(policy.trainable_parameters(), 5e-2)
    step.train_step(
        policy, optimizer, step.plan_step(make_batch(policy, 0, seed=6), ASYNC_DROP), step.StepConfig()
    )
    objective = Objective(
        advantage_estimator="REINFORCEPP",
        reward_scaling="Batch",
        kl_coef=0.5,
        kl_estimator="k1",
        kl_placement="Reward",
    )
    # Behaviour log-probs shifted by 5 nats: the penalty must not depend on what the worker reported.
    batch = make_batch(policy, 1, seed=7, offsets={"transformers": -5.0})
    plan = step.plan_step(batch, ASYNC_DROP, objective)
    packed = pack([s.rollout for s in plan.slots], policy.pad_id)
    with torch.no_grad():
        own = completion_logprobs(policy.model, packed, 1.0)
        ref = policy.reference_logprobs(packed, 1.0)
    penalties = [(0.5 * (own[i] - ref[i]))[packed.mask[i].bool()].double() for i in range(len(plan.slots))]
    expected = step.with_reward_penalties(plan, penalties, objective)
    sums = [float(p.sum()) / 0.5 for p in penalties]
    assert expected.reward_kl == pytest.approx(sum(sums) / len(sums))
    metrics = step.train_step(policy, optimizer, plan, step.StepConfig(objective=objective))
    assert metrics.reward_kl == pytest.approx(expected.reward_kl, rel=1e-4)
    assert metrics.reward_kl is not None and abs(metrics.reward_kl) > 1e-4
    assert all(s.token_advantages is not None for s in expected.slots)
    assert any(len(set(s.token_advantages or ())) > 1 for s in expected.slots)  # G_t differs along a rollout
