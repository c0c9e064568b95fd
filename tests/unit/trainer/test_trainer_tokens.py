"""Micro-batches by token budget (``algorithm.microBatchTokens``): the layout, and a step it leaves unchanged."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
import yaml

from echo_runtime import spec, staleness
from echo_runtime.rollout import Batch, Group, Rollout
from echo_runtime.trainer import step
from echo_runtime.trainer.batch import Slot, by_tokens, micro_batches, padded_tokens, shard
from echo_runtime.trainer.policy import TrainablePolicy

RULE = staleness.StalenessPolicy(mode="Async", max_staleness=1, stale_action="ImportanceWeight")


def _slots(shapes: list[tuple[int, int]]) -> list[Slot]:
    return [
        Slot(Rollout(tuple(range(1, p + 1)), tuple(range(1, c + 1)), (-1.0,) * c, 0.0, 0), advantage=float(i))
        for i, (p, c) in enumerate(shapes)
    ]


def _cells(chunks: list[list[Slot]]) -> int:
    return sum(padded_tokens([s.rollout for s in chunk]) for chunk in chunks)


def test_each_micro_batch_fits_the_budget_and_every_rollout_is_trained_once() -> None:
    rng = random.Random(3)
    slots = _slots([(rng.randint(3, 12), rng.choice([2, 3, 40, 90])) for _ in range(37)])
    for world in (1, 2, 3):
        layouts = [by_tokens(slots, 200, rank, world) for rank in range(world)]
        assert len({len(chunks) for chunks in layouts}) == 1, "ranks must run as many passes as each other"
        real = [s for chunks in layouts for chunk in chunks for s in chunk if not s.filler]
        assert sorted(id(s) for s in real) == sorted(id(s) for s in slots)
        for chunks in layouts:
            for chunk in chunks:
                assert padded_tokens([s.rollout for s in chunk]) <= 200 or len(chunk) == 1
                assert all(s.filler for s in chunk) or not any(s.filler for s in chunk)


def test_a_rollout_longer_than_the_budget_runs_alone_unsplit() -> None:
    slots = _slots([(5, 300), (5, 3), (5, 3)])
    (first, second) = by_tokens(slots, 50, 0, 1)
    assert first == [slots[0]] and padded_tokens([slots[0].rollout]) == 305
    assert second == [slots[1], slots[2]]


def test_sorting_by_length_wastes_less_than_fixed_counts() -> None:
    """Mixed lengths in batch order: fixed micro-batches of 4 pad every short rollout to a long one."""
    shapes = [(8, 90) if i % 4 == 0 else (8, 4) for i in range(32)]
    slots = _slots(shapes)
    real = sum(p + c for p, c in shapes)
    fixed = micro_batches(slots, 4)
    budget = max(padded_tokens([s.rollout for s in chunk]) for chunk in fixed)  # the same peak as count 4
    packed = by_tokens(slots, budget, 0, 1)
    assert 1 - real / _cells(fixed) > 0.5  # by hand: each chunk 4 × 98 cells for 98 + 3 × 12 real
    assert 1 - real / _cells(packed) < 0.05
    assert len(packed) < len(fixed)


def test_ranks_get_the_same_number_of_passes_with_fillers_and_balanced_tokens() -> None:
    slots = _slots([(4, 100), (4, 2), (4, 2)])
    r0, r1 = by_tokens(slots, 110, 0, 2), by_tokens(slots, 110, 1, 2)
    assert r0 == [[slots[0]]] and r1 == [[slots[1], slots[2]]]
    uneven = _slots([(4, 100), (4, 100), (4, 100)])
    a, b = by_tokens(uneven, 110, 0, 2), by_tokens(uneven, 110, 1, 2)
    assert len(a) == len(b) == 2
    assert [s.filler for chunk in b for s in chunk] == [False, True]


def test_bad_budgets_and_ranks_are_refused() -> None:
    slots = _slots([(2, 2)])
    with pytest.raises(ValueError, match="microBatchTokens must be ≥ 1"):
        by_tokens(slots, 0, 0, 1)
    with pytest.raises(ValueError, match="rank must be in"):
        by_tokens(slots, 10, 2, 2)
    job = {"apiVersion": "echorl.dev/v1alpha1", "kind": "EchoJob", "metadata": {"name": "j"}}
    with pytest.raises(spec.ManifestError, match=r"spec\.algorithm\.microBatchTokens"):
        spec.load_documents(yaml.safe_dump({**job, "spec": {"algorithm": {"microBatchTokens": 0}}}))
    (loaded,) = spec.load_documents(yaml.safe_dump({**job, "spec": {"algorithm": {"microBatchTokens": 512}}}))
    assert isinstance(loaded, spec.EchoJob)
    assert step.StepConfig.from_algorithm(loaded.spec.algorithm).micro_batch_tokens == 512


def _batch(policy: TrainablePolicy, seed: int) -> Batch:
    """Two groups with completions of very different lengths, behaviour log-probs off the policy's (ρ ≠ 1)."""
    rng = random.Random(seed)
    groups = []
    for g in range(2):
        prompt = tuple(rng.randrange(1, 200) for _ in range(rng.randint(3, 9)))
        rollouts = []
        for i in range(4):
            n = rng.choice([2, 3, 30])
            completion = tuple(rng.randrange(1, 200) for _ in range(n))
            rollouts.append(
                Rollout(prompt, completion, tuple(-rng.uniform(4, 6) for _ in range(n)), float(i % 2), 0)
            )
        groups.append(Group(rollouts=tuple(rollouts), id=f"g{g}"))
    return Batch(version=0, groups=tuple(groups))


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_token_budget_step_makes_the_same_update_and_pads_less(
    make_policy: Callable[..., TrainablePolicy], ranks: int
) -> None:
    """SGD at rate 1 (the update is the gradient): by count 3 and by a budget of 80 cells, one gradient.
    With ``ranks`` 2 each simulated rank's share is summed, as the all-reduce would."""
    plan = step.plan_step(_batch(make_policy(), seed=4), RULE)

    def gradient(**config: int) -> tuple[dict[str, torch.Tensor], float]:
        total: dict[str, torch.Tensor] = {}
        padding = []
        for rank in range(ranks):
            policy = make_policy()
            before = policy.trainable_state()
            optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)

            class Rank(step.Collective):
                world_size, rank = ranks, 0

            Rank.rank = rank
            metrics = step.train_step(
                policy, optimizer, plan, step.StepConfig(max_grad_norm=1e9, **config),
                collective=Rank(), shard=shard,
            )  # fmt: skip
            after = policy.trainable_state()
            for k in before:  # each rank's loss is scaled by the world size (DDP then averages)
                total[k] = total.get(k, 0) + (before[k] - after[k]) / ranks
            padding.append(metrics.padding_fraction)
        return total, sum(padding) / len(padding)

    by_count, padded_count = gradient(micro_batch_size=3)
    by_budget, padded_budget = gradient(micro_batch_tokens=80)
    assert any(g.abs().max() > 0 for g in by_count.values())
    for name, expected in by_count.items():
        torch.testing.assert_close(by_budget[name], expected, rtol=1e-4, atol=1e-7)
    assert padded_budget < padded_count
