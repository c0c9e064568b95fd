"""The trainer's check of behaviour log-probs (trainer.verify) on the tiny model.

Honest groups carry the log-probs of the version they claim (what a backend holding it reports); a
liar's are shifted, made up, or those of another version than the one claimed. Groups of every
staleness are checked, with the weights of the version they claim (``verify.History``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_text_not_drawn_from_its_key_is_caught_even_with_exact_log_probs(
    make_policy: Callable[..., TrainablePolicy], tiny_model_dir: str
) -> None:
    """A worker holding the weights can send exact log-probs of any text; with keyed draws the text
    itself must be the key's draw. Swapping two rows of an honest keyed group (choosing which text goes
    where) keeps every log-prob exact and is caught by the draws alone."""
    from echo_runtime.backends import base
    from echo_runtime.backends.transformers import TransformersBackend
    from echo_runtime.rollout import Group

    policy = make_policy()  # fresh LoRA: B = 0, the base model's weights, as the backend's
    backend = TransformersBackend(tiny_model_dir, device="cpu", threads=1)
    key = "0123456789abcdef0123456789abcdef"
    params = base.SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=8, keys=(int(key, 16),))
    sampled = backend.sample(["12+7="], 4, params)[0]
    drawn = [dataclasses.replace(r, policy_version=0, dtype="float32") for r in sampled]  # as registered
    honest = Group(rollouts=tuple(drawn), id="g-honest", worker="honest", key=key)
    swapped = Group(rollouts=(drawn[1], drawn[0], *drawn[2:]), id="g-chosen", worker="chooser", key=key)
    unkeyed = Group(rollouts=tuple(drawn), id="g-plain", worker="plain")
    half = [dataclasses.replace(r, dtype="bfloat16") for r in (drawn[1], drawn[0], *drawn[2:])]
    unmeasured = Group(rollouts=tuple(half), id="g-half", worker="half", key=key)
    batch = Batch(0, (honest, swapped, unkeyed, unmeasured))
    checked = verify.check_batch(policy, batch, checks=4, bound=0.1, temperature=1.0, top_p=0.9)
    by_worker = {c.worker: c for c in checked.groups}
    assert by_worker["honest"].draw_gap is not None and by_worker["honest"].draw_gap < 1e-4
    assert by_worker["honest"].off_draw == 0 and by_worker["honest"].max_abs < 1e-4
    assert by_worker["plain"].draw_gap is None  # no key: the log-probs only
    chooser = by_worker["chooser"]
    assert chooser.max_abs < 1e-4 and chooser.off_draw > 0  # exact log-probs, wrong draws
    assert list(checked.caught()) == ["chooser"]
    # Half-precision draws are not measured yet: the gap is recorded, not judged (docs/trust.md).
    assert (
        by_worker["half"].draw_gap is not None
        and by_worker["half"].draw_gap > 1e-3
        and by_worker["half"].off_draw == 0
    )
    reason = verify.Checked.reason(chooser, 0.1, 0, checked.draw_bound)
    assert "text not drawn from its lease's key" in reason and "g-chosen" in reason


# ------------------------------------------------------------------------------- text drawn without a key
def test_surprise_is_log_p_plus_entropy_and_its_variance_under_p() -> None:
    from echo_runtime.trainer import typical

    rng = random.Random(3)
    for _ in range(20):
        weights = [rng.random() ** 3 for _ in range(7)] + [0.0]  # the last: outside the nucleus
        total = sum(weights)
        p = [w / total for w in weights]
        entropy = -sum(q * math.log(q) for q in p if q > 0)
        token = rng.randrange(7)
        want_s = math.log(p[token]) + entropy
        want_v = sum(q * (math.log(q) + entropy) ** 2 for q in p if q > 0)  # E[(s − E s)²], E s = 0
        s, v = typical.surprise(
            torch.tensor([weights, weights], dtype=torch.float64), torch.tensor([token, 7])
        )
        assert float(s[0]) == pytest.approx(want_s, abs=1e-9) and float(v[0]) == pytest.approx(
            want_v, abs=1e-9
        )
        assert math.isnan(float(s[1])) and math.isnan(float(v[1]))  # probability 0: left out
        top = max(range(7), key=lambda i: p[i])
        assert (
            float(typical.surprise(torch.tensor([weights], dtype=torch.float64), torch.tensor([top]))[0][0])
            >= 0.0
        )  # log p_max ≥ −H


def test_the_verdict_needs_tokens_a_large_z_and_a_large_excess() -> None:
    from echo_runtime.trainer import typical

    few = typical.Typicality(typical.MIN_TOKENS - 1, 100.0, 1.0)
    biased = typical.Typicality(1_000_000, 1_000.0, 1_000_000.0)  # z 1 000 but 1e-3 nats a token: rounding
    chance = typical.Typicality(10_000, 300.0, 10_000.0)  # 0.03 nats a token, z 3
    assert few.verdict() is None and biased.verdict() is None and chance.verdict() is None
    likelier = typical.Typicality(1_000, 100.0, 100.0)
    hotter = typical.Typicality(1_000, -100.0, 100.0)
    assert "likelier" in (likelier.verdict() or "") and "less likely" in (hotter.verdict() or "")


def test_text_chosen_without_a_key_is_caught_by_its_likelihood_and_samples_are_not(
    make_policy: Callable[..., TrainablePolicy], tiny_model_dir: str
) -> None:
    """A keyless worker (vLLM) that submits, of three samples, the likeliest, with exact log-probs:
    every log-prob check passes, the statistic over its checked tokens does not; an honest keyless
    worker's stays near 0. The trainer quarantines the one, through its coordinator."""
    from echo_runtime import spec
    from echo_runtime.backends import base
    from echo_runtime.backends.transformers import TransformersBackend
    from echo_runtime.rollout import Group
    from echo_runtime.trainer import typical
    from echo_runtime.trainer.loop import Trainer

    policy = make_policy()  # fresh LoRA: the base model's weights, as the backend's
    backend = TransformersBackend(tiny_model_dir, device="cpu", threads=1)
    prompts = [f"{a}+{b}=" for a in range(6) for b in range(6)]
    params = base.SamplingParams(temperature=1.0, max_new_tokens=8, seed=1)
    honest = backend.sample(prompts, 3, params)
    tries = [backend.sample(prompts, 3, dataclasses.replace(params, seed=s)) for s in (2, 3, 4)]
    chosen = [
        [max((t[i][r] for t in tries), key=lambda x: sum(x.logprobs)) for r in range(3)] for i in range(36)
    ]

    def groups(worker: str, sampled: list[list[Any]]) -> tuple[Group, ...]:
        return tuple(
            Group(
                tuple(dataclasses.replace(r, policy_version=0) for r in g), id=f"{worker}-{i}", worker=worker
            )
            for i, g in enumerate(sampled)
        )

    job = spec.resolve(
        spec.load_documents(
            "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: typical}\n"
            "spec: {model: {path: echorl:tiny}, syncPolicy: {logprobChecksPerGroup: 3}}\n"
        )[0]  # type: ignore[arg-type]
    )
    trainer = Trainer(job=job, policy=policy, optimizer=None, base_model="tiny", encode=lambda p: [])
    caught: list[tuple[str, str]] = []

    class Coordinator:
        def quarantine(
            self, worker_id: str, reason: str, *, version: int, mismatch: float | None = None
        ) -> None:
            caught.append((worker_id, reason))

    batch = Batch(0, groups("honest", honest) + groups("chooser", chosen))
    kept, checked = trainer.check(batch, Coordinator())  # type: ignore[arg-type]
    assert checked is not None and not checked.caught()  # exact log-probs: the log-prob check passes
    stats = trainer.checks.typicality
    assert stats["honest"].tokens >= typical.MIN_TOKENS and abs(stats["honest"].z) < 4
    assert stats["chooser"].z > 6 and stats["chooser"].excess > 0.05
    assert [w for w, _ in caught] == ["chooser"] and "likelier under the policy" in caught[0][1]
    assert {g.worker for g in kept.groups} == {"honest"}
    record = trainer.checks.record(["honest", "chooser"])
    assert record["chooser"]["samplingZ"] == pytest.approx(stats["chooser"].z)
