"""The trainer's check of behaviour log-probs (trainer.verify) on the tiny model.

Honest groups carry the policy's own log-probs (what a backend at the trainer's version reports);
a liar's are shifted. Only groups of staleness 0 can be checked: their sampling policy is the one the
trainer holds.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest

from echo_runtime.rollout import Batch
from echo_runtime.trainer import verify
from echo_runtime.trainer.policy import TrainablePolicy


def by_workers(batch: Batch, workers: list[str]) -> Batch:
    return dataclasses.replace(
        batch,
        groups=tuple(dataclasses.replace(g, worker=w) for g, w in zip(batch.groups, workers, strict=True)),
    )


def test_honest_groups_pass_and_a_liar_is_caught(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy()
    honest = make_batch(policy, 3, groups=2, n=4, seed=1)
    lying = make_batch(policy, 3, groups=1, n=4, seed=2, offsets={"transformers": -0.5})
    batch = by_workers(Batch(3, honest.groups + lying.groups), ["w-ok", "w-ok2", "w-liar"])
    checked = verify.check_batch(policy, batch, checks=2, bound=0.1, temperature=1.0, rng=random.Random(0))
    assert sorted(c.worker for c in checked.groups) == ["w-liar", "w-ok", "w-ok2"]
    assert all(c.rollouts == 2 and c.tokens > 0 for c in checked.groups)
    honest_checks = [c for c in checked.groups if c.worker != "w-liar"]
    assert max(c.max_abs for c in honest_checks) < 1e-5  # the same weights: float rounding only
    caught = checked.caught()
    assert list(caught) == ["w-liar"] and caught["w-liar"].mean_abs == pytest.approx(0.5, abs=1e-5)
    reason = verify.Checked.reason(caught["w-liar"], 0.1, 3)
    assert "above maxLogprobMismatch 0.1" in reason and "version 3" in reason
    assert [g.worker for g in verify.without(batch, caught).groups] == ["w-ok", "w-ok2"]


def test_stale_groups_are_not_checked_and_checks_can_be_turned_off(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy()
    stale = by_workers(
        make_batch(policy, 5, groups=2, n=3, versions=[4, 5], offsets={"transformers": -1.0}), ["old", "new"]
    )
    checked = verify.check_batch(policy, stale, checks=1, bound=0.1, temperature=1.0)
    assert [c.worker for c in checked.groups] == ["new"]  # version 4 at trainer version 5: unverifiable
    assert list(checked.caught()) == ["new"]
    assert verify.check_batch(policy, stale, checks=0, bound=0.1, temperature=1.0).groups == ()


def test_the_check_leaves_the_policy_as_it_found_it(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy()
    policy.model.train()
    batch = by_workers(make_batch(policy, 0, groups=1, n=2), ["w"])
    before = {k: v.clone() for k, v in policy.trainable_state().items()}
    verify.check_batch(policy, batch, checks=2, bound=0.1, temperature=1.0)
    assert policy.model.training
    assert all((before[k] == v).all() for k, v in policy.trainable_state().items())
    assert all(p.grad is None for p in policy.trainable_parameters())


def test_per_worker_totals_over_the_run() -> None:
    stats = verify.WorkerStats()
    first = verify.Checked(1, (verify.GroupCheck("g1", "a", 1, 4, 0.01, 0.02),), 0.1)
    second = verify.Checked(2, (verify.GroupCheck("g2", "a", 1, 12, 0.03, 0.05),), 0.1)
    stats.add(first)
    stats.add(second)
    record = stats.record(["a", "b"])
    assert record == {"a": {"tokens": 16, "meanAbs": pytest.approx((0.04 + 0.36) / 16), "worstGroup": 0.03}}
