"""The trainer's check of behaviour log-probs (trainer.verify) on the tiny model.

Honest groups carry the log-probs of the version they claim (what a backend holding it reports); a
liar's are shifted, made up, or those of another version than the one claimed. Groups of every
staleness are checked, with the weights of the version they claim (``verify.History``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

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


def test_without_a_history_only_the_current_version_is_checked_and_checks_can_be_turned_off(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy = make_policy()
    stale = by_workers(
        make_batch(policy, 5, groups=2, n=3, versions=[4, 5], offsets={"transformers": -1.0}), ["old", "new"]
    )
    checked = verify.check_batch(policy, stale, checks=1, bound=0.1, temperature=1.0)
    assert [c.worker for c in checked.groups] == ["new"] and checked.unverified == ("g0",)
    assert list(checked.caught()) == ["new"]
    assert [g.id for g in verify.without(stale, [], checked.unverified).groups] == [
        "g1"
    ]  # never trained unchecked
    off = verify.check_batch(policy, stale, checks=0, bound=0.1, temperature=1.0)
    assert off.groups == () and off.unverified == ()


def step_weights(policy: TrainablePolicy, seed: int, scale: float = 0.05) -> None:
    """Move the trainable weights as an optimizer step would (a new version)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)


def versions_3_to_5(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch], keep: int = 2
) -> tuple[TrainablePolicy, verify.History, dict[int, Batch]]:
    """A policy stepped from version 3 to 5 with a history kept as the trainer keeps it, and per version a
    batch whose log-probs are that version's own (what an honest worker holding it reports)."""
    policy, history, honest = make_policy(), verify.History(keep), {}
    for version in (3, 4, 5):
        if version > 3:
            step_weights(policy, version)
        history.remember(version, policy)
        honest[version] = make_batch(policy, version, groups=2, n=4, seed=version)
    return policy, history, honest


def test_stale_groups_are_checked_against_the_version_they_claim(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy, history, honest = versions_3_to_5(make_policy, make_batch)
    batch = Batch(5, honest[3].groups + honest[4].groups + honest[5].groups)
    batch = by_workers(batch, ["a", "b", "c", "d", "e", "f"])
    checked = verify.check_batch(
        policy, batch, checks=2, bound=0.1, temperature=1.0, rng=random.Random(0), history=history
    )
    assert sorted((c.worker, c.version) for c in checked.groups) == [
        ("a", 3), ("b", 3), ("c", 4), ("d", 4), ("e", 5), ("f", 5)
    ]  # fmt: skip
    assert max(c.max_abs for c in checked.groups) < 1e-5 and not checked.caught() and not checked.unverified
    # The same version-3 groups recomputed with the current weights differ: the swap is what makes them pass.
    relabelled = tuple(
        dataclasses.replace(g, rollouts=tuple(dataclasses.replace(r, policy_version=5) for r in g.rollouts))
        for g in batch.groups[:2]
    )
    as_fresh = verify.check_batch(
        policy, Batch(5, relabelled), checks=2, bound=0.1, temperature=1.0, history=history
    )
    assert min(c.mean_abs for c in as_fresh.groups) > 1e-3


def test_the_patient_liar_is_caught_whatever_version_it_claims(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    """Made-up log-probs (all 0.0) under an older version's name, and log-probs of version 5 claimed as
    version 3: both are recomputed with version 3's weights and convicted."""
    policy, history, honest = versions_3_to_5(make_policy, make_batch)
    made_up = dataclasses.replace(
        honest[3].groups[0],
        rollouts=tuple(dataclasses.replace(r, logprobs=(0.0,) * len(r.logprobs)) for r in honest[3].groups[0].rollouts),
    )  # fmt: skip
    newer_as_older = dataclasses.replace(
        honest[5].groups[0],
        rollouts=tuple(dataclasses.replace(r, policy_version=3) for r in honest[5].groups[0].rollouts),
    )
    batch = by_workers(Batch(5, (made_up, newer_as_older, honest[4].groups[0])), ["zeros", "claims-3", "ok"])
    checked = verify.check_batch(policy, batch, checks=4, bound=0.1, temperature=1.0, history=history)
    caught = checked.caught()
    assert sorted(caught) == ["claims-3", "zeros"]
    assert caught["zeros"].version == 3 and caught["zeros"].mean_abs > 1.0
    assert "version 3, the version they claim (trainer at 5)" in verify.Checked.reason(
        caught["zeros"], 0.1, 5
    )
    assert [g.worker for g in verify.without(batch, caught).groups] == ["ok"]


def test_the_history_keeps_delta_max_versions_and_fetches_what_a_resumed_trainer_lacks(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch], tmp_path: Path
) -> None:
    policy, history, honest = versions_3_to_5(make_policy, make_batch, keep=1)
    assert history.versions == [4, 5]  # Δmax 1: version 3 is forgotten
    exported = {}
    for v, state in ((4, history._states[4]), (5, history._states[5])):  # the store's snapshots of 4 and 5
        policy.load_trainable_state(state)
        exported[v] = tmp_path / f"v{v}"
        policy.export_snapshot(exported[v])
    fetched: list[int] = []

    def fetch(version: int) -> Path | None:
        fetched.append(version)
        return exported.get(version)

    resumed = verify.History(1, fetch)  # a trainer resumed at version 5 (its weights are 5's)
    batch = by_workers(Batch(5, honest[4].groups + honest[3].groups[:1]), ["a", "b", "old"])
    checked = verify.check_batch(policy, batch, checks=2, bound=0.1, temperature=1.0, history=resumed)
    assert fetched == [4]  # 3 is beyond Δmax: not even asked for
    assert (
        sorted(c.worker for c in checked.groups) == ["a", "b"]
        and max(c.max_abs for c in checked.groups) < 1e-5
    )
    assert checked.unverified == ("g0",) and batch.groups[2].id == "g0" and batch.groups[2].worker == "old"
    assert resumed.versions == [4, 5]
    with pytest.raises(ValueError, match="keep"):
        verify.History(-1)


def test_the_check_leaves_the_policy_as_it_found_it(
    make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    policy, history, honest = versions_3_to_5(make_policy, make_batch)
    policy.model.train()
    batch = by_workers(
        Batch(5, (honest[3].groups[0], honest[4].groups[0], honest[5].groups[0])), ["a", "b", "c"]
    )
    before = {k: v.clone() for k, v in policy.trainable_state().items()}
    checked = verify.check_batch(policy, batch, checks=2, bound=0.1, temperature=1.0, history=history)
    assert sorted(c.version for c in checked.groups) == [3, 4, 5]  # two other versions were swapped in
    assert policy.model.training
    assert all((before[k] == v).all() for k, v in policy.trainable_state().items())
    assert all(p.grad is None for p in policy.trainable_parameters())


def test_per_worker_totals_over_the_run() -> None:
    stats = verify.WorkerStats()
    first = verify.Checked(1, (verify.GroupCheck("g1", "a", 1, 1, 4, 0.01, 0.02),), 0.1)
    second = verify.Checked(2, (verify.GroupCheck("g2", "a", 2, 1, 12, 0.03, 0.05),), 0.1)
    stats.add(first)
    stats.add(second)
    record = stats.record(["a", "b"])
    assert record == {"a": {"tokens": 16, "meanAbs": pytest.approx((0.04 + 0.36) / 16), "worstGroup": 0.03}}
