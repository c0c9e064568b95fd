"""Property tests of the trainer's log-prob check (trainer.verify) under random tamperings.

For every tampering the check's statistic must equal what the tampering did, computed independently
(the claimed version's weights loaded by hand, the log-probs recomputed directly), and the worker must be
convicted exactly when that is above the bound: log-probs shifted or scaled, a token swapped, a version
claimed k off. Versions 3, 4 and 5 of the tiny model's LoRA policy; the trainer holds version 5 and keeps
3 and 4 (Δmax 2).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_runtime.rollout import Batch, Group, Rollout
from echo_runtime.spec.policy import LoRA, Model
from echo_runtime.trainer import policy as trainer_policy
from echo_runtime.trainer import verify

BOUND = 0.1
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@dataclasses.dataclass
class Versions:
    policy: trainer_policy.TrainablePolicy
    states: dict[int, dict[str, torch.Tensor]]
    groups: dict[int, Group]
    """Per version, one honest group: its log-probs are that version's own."""


def honest_group(policy: trainer_policy.TrainablePolicy, version: int, seed: int) -> Group:
    """Four random completions of one prompt with the policy's own log-probs (what a worker holding it sends)."""
    rng = random.Random(seed)
    prompt = tuple(rng.randrange(1, 1000) for _ in range(rng.randint(2, 6)))
    rollouts = []
    for _ in range(4):
        completion = tuple(rng.randrange(1, 1000) for _ in range(rng.randint(1, 7)))
        with torch.no_grad():
            packed = trainer_policy.pack(
                [Rollout(prompt, completion, (0.0,) * len(completion))], policy.pad_id
            )
            lp = trainer_policy.completion_logprobs(policy.model.eval(), packed, 1.0)[0, : len(completion)]
        rollouts.append(Rollout(prompt, completion, tuple(float(x) for x in lp), policy_version=version))
    return Group(rollouts=tuple(rollouts), id=f"g{version}")


@pytest.fixture(scope="module")
def versions(tiny_model_dir: str) -> Iterator[Versions]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy = trainer_policy.load_policy(
        Model(finetune="LoRA", lora=LoRA(rank=4, alpha=8.0)), model_dir=tiny_model_dir
    )
    states, groups = {}, {}
    generator = torch.Generator().manual_seed(1)
    for version in (3, 4, 5):
        if version > 3:
            with torch.no_grad():
                for p in policy.trainable_parameters():
                    p.add_(torch.randn(p.shape, generator=generator) * 0.05)
        states[version] = policy.trainable_state()
        groups[version] = honest_group(policy, version, seed=version)
    yield Versions(policy, states, groups)


def recompute(v: Versions, version: int, rollouts: list[Rollout]) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probs of ``rollouts`` under ``version``'s weights, computed directly; the policy is left at 5."""
    v.policy.load_trainable_state(v.states[version])
    try:
        with torch.no_grad():
            packed = trainer_policy.pack(rollouts, v.policy.pad_id)
            return trainer_policy.completion_logprobs(v.policy.model.eval(), packed, 1.0), packed.mask
    finally:
        v.policy.load_trainable_state(v.states[5])


def check(v: Versions, group: Group) -> verify.GroupCheck:
    history = verify.History(2)
    for version in (3, 4, 5):  # what the trainer kept as it went
        v.policy.load_trainable_state(v.states[version])
        history.remember(version, v.policy)
    batch = Batch(5, (dataclasses.replace(group, worker="w"),))
    found = verify.check_batch(
        v.policy, batch, checks=4, bound=BOUND, temperature=1.0, rng=random.Random(0), history=history
    )
    assert not found.unverified
    assert all((v.policy.trainable_state()[k] == t).all() for k, t in v.states[5].items())  # left at 5
    (only,) = found.groups
    assert (only.mean_abs > BOUND) == ("w" in found.caught())
    return only


def tampered(group: Group, change: object) -> Group:
    return dataclasses.replace(group, rollouts=tuple(change(r) for r in group.rollouts))  # type: ignore[operator]


@SETTINGS
@given(version=st.sampled_from([3, 4, 5]), shift=st.floats(-2.0, 0.0))
def test_shifted_log_probs_show_as_the_shift(versions: Versions, version: int, shift: float) -> None:
    group = tampered(
        versions.groups[version],
        lambda r: dataclasses.replace(r, logprobs=tuple(x + shift for x in r.logprobs)),
    )
    assert check(versions, group).mean_abs == pytest.approx(abs(shift), abs=1e-5)


@SETTINGS
@given(version=st.sampled_from([3, 4, 5]), scale=st.floats(0.0, 3.0))
def test_scaled_log_probs_show_as_the_scaling(versions: Versions, version: int, scale: float) -> None:
    honest = versions.groups[version]
    group = tampered(honest, lambda r: dataclasses.replace(r, logprobs=tuple(x * scale for x in r.logprobs)))
    values = [abs(x) for r in honest.rollouts for x in r.logprobs]
    expected = abs(scale - 1.0) * sum(values) / len(values)
    assert check(versions, group).mean_abs == pytest.approx(expected, rel=1e-4, abs=1e-5)


@SETTINGS
@given(true=st.sampled_from([3, 4, 5]), claim=st.sampled_from([3, 4, 5]))
def test_a_version_claimed_k_off_shows_as_the_distance_between_the_versions(
    versions: Versions, true: int, claim: int
) -> None:
    group = tampered(versions.groups[true], lambda r: dataclasses.replace(r, policy_version=claim))
    rollouts = list(group.rollouts)
    honest, mask = recompute(versions, true, rollouts)
    claimed, _ = recompute(versions, claim, rollouts)
    expected = float(((honest - claimed).abs() * mask).sum() / mask.sum())
    found = check(versions, group)
    assert found.version == claim and found.mean_abs == pytest.approx(expected, abs=1e-5)
    if claim == true:
        assert found.mean_abs < 1e-5


@SETTINGS
@given(version=st.sampled_from([3, 4, 5]), data=st.data())
def test_a_swapped_token_shows_as_what_it_changes(
    versions: Versions, version: int, data: st.DataObject
) -> None:
    honest = versions.groups[version]
    row = data.draw(st.integers(0, len(honest.rollouts) - 1))
    target = honest.rollouts[row]
    position = data.draw(st.integers(0, len(target.completion_ids) - 1))
    token = data.draw(st.integers(1, 999).filter(lambda t: t != target.completion_ids[position]))
    ids = list(target.completion_ids)
    ids[position] = token
    swapped = dataclasses.replace(target, completion_ids=tuple(ids))  # the log-probs of the original tokens
    rollouts = [swapped if i == row else r for i, r in enumerate(honest.rollouts)]
    recomputed, mask = recompute(versions, version, rollouts)
    sent = torch.zeros_like(recomputed)
    for i, r in enumerate(rollouts):
        sent[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
    expected = float(((sent - recomputed).abs() * mask).sum() / mask.sum())
    found = check(versions, dataclasses.replace(honest, rollouts=tuple(rollouts)))
    assert found.mean_abs == pytest.approx(expected, abs=1e-5) and found.mean_abs > 0
