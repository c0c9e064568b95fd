"""The one rollout type: validation, the episode shape's single-turn case, and its trip over the wire."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from echo_runtime import rollout
from echo_runtime.coordinator import convert, wire
from echo_runtime.tasks.base import Problem, Reward
from echo_runtime.trainer import policy as trainer_policy


def _sampled() -> rollout.Rollout:
    return rollout.sampled([5, 6], [7, 8, 2], [-0.5, 1e-7, -0.25], text="7 8", finish_reason="stop")


def test_sampled_clamps_rounding_above_zero_and_leaves_the_rest() -> None:
    r = _sampled()
    assert r.logprobs == (-0.5, 0.0, -0.25)
    assert (r.prompt_ids, r.completion_ids, r.text, r.finish_reason) == ((5, 6), (7, 8, 2), "7 8", "stop")
    assert (r.reward, r.policy_version, r.backend) == (0.0, 0, "unknown")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"completion_ids": ()}, "completion_ids: must not be empty"),
        ({"completion_ids": (1, -2)}, "non-negative integers"),
        ({"prompt_ids": (True,)}, "prompt_ids: token ids"),
        ({"logprobs": (-1.0,)}, r"logprobs: need one per model token \(2\)"),
        ({"logprobs": (-1.0, float("nan"))}, "must all be finite"),
        ({"reward": float("inf")}, "reward: must be finite"),
        ({"policy_version": -1}, "policy_version"),
        ({"kinds": (rollout.MODEL,)}, r"kinds: need one per completion id \(2\)"),
        ({"kinds": (rollout.MODEL, rollout.PROMPT)}, "kinds: each must be MODEL"),
    ],
)
def test_construction_names_the_bad_field(change: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"prompt_ids": (1,), "completion_ids": (3, 4), "logprobs": (-1.0, -2.0)}
    with pytest.raises(ValueError, match=message):
        rollout.Rollout(**{**fields, **change})  # type: ignore[arg-type]


def test_an_episode_has_log_probs_and_loss_only_where_the_model_sampled() -> None:
    single = rollout.Rollout((1,), (3, 4, 5), (-1.0, -2.0, -3.0))
    assert single.model_tokens == 3
    assert single.loss_mask == (1.0, 1.0, 1.0)
    assert single.token_logprobs == (-1.0, -2.0, -3.0)
    m, e = rollout.MODEL, rollout.ENVIRONMENT
    episode = rollout.Rollout((1,), (3, 4, 9, 9, 5), (-1.0, -2.0, -3.0), kinds=(m, m, e, e, m))
    assert episode.model_tokens == 3
    assert episode.loss_mask == (1.0, 1.0, 0.0, 0.0, 1.0)
    assert episode.token_logprobs == (-1.0, -2.0, 0.0, 0.0, -3.0)
    with pytest.raises(ValueError, match=r"one per model token \(3\), got 5"):
        rollout.Rollout((1,), (3, 4, 9, 9, 5), (-1.0,) * 5, kinds=(m, m, e, e, m))


def test_pack_masks_an_environments_tokens_and_keeps_single_turn_numbers() -> None:
    m, e = rollout.MODEL, rollout.ENVIRONMENT
    single = rollout.Rollout((1, 2), (3, 4, 5), (-1.0, -2.0, -3.0))
    episode = rollout.Rollout((1,), (3, 9, 5), (-1.0, -3.0), kinds=(m, e, m))
    packed = trainer_policy.pack([single, episode], pad_id=0)
    assert packed.mask.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]]
    assert packed.behaviour.tolist() == [[-1.0, -2.0, -3.0], [-1.0, 0.0, -3.0]]
    assert torch.equal(packed.targets, torch.tensor([[3, 4, 5], [3, 9, 5]]))


def test_a_group_is_as_stale_as_its_oldest_and_a_batch_needs_two_rollouts_a_group() -> None:
    a = rollout.Rollout((1,), (2,), (-1.0,), policy_version=3)
    b = dataclasses.replace(a, policy_version=5)
    group = rollout.Group((a, b), id="t1", worker="w")
    assert group.policy_version == 3
    assert group.staleness(6) == 3
    with pytest.raises(ValueError, match="has no rollouts"):
        rollout.Group((), id="t0")
    assert rollout.Batch(7, (group,)).num_tokens == 2
    with pytest.raises(ValueError, match=r"groups\[1\]: group 't1': needs ≥ 2 rollouts"):
        rollout.Batch(7, (group, rollout.Group((a,), id="t1")))


def test_every_field_survives_worker_coordinator_trainer() -> None:
    """Backend → submission → the coordinator's accepted rollout → the trainer's batch: nothing is
    dropped on the way (``finishReason`` included), and the reward is the coordinator's."""
    sample = _sampled()
    submitted = wire.RolloutIn.model_validate_json(
        convert.submission(sample, 4).model_dump_json(by_alias=True)
    )
    assert submitted.policy_version == 4 and submitted.backend is None
    reward = Reward(1.0, {"answer": 1.0}, "ok")
    kept = convert.accepted(submitted, reward, backend="mlx", device="cpu", dtype="float32")
    assert (kept.reward, kept.reward_components, kept.reward_reason) == (1.0, {"answer": 1.0}, "ok")
    assert (kept.backend, kept.device, kept.dtype, kept.text) == ("mlx", "cpu", "float32", "7 8")
    problem = Problem(id="p1", prompt="What is 7 + 8?", answer=15)
    group = rollout.Group((kept, dataclasses.replace(kept, policy_version=5)), id="t9", worker="w-1")
    out = convert.group_out(group, problem, 6, policy_version=4, importance_weighted=True)
    reply = wire.BatchReply.model_validate_json(
        wire.BatchReply(ready=True, version=6, groups=[out]).model_dump_json(by_alias=True)
    )
    assert reply.groups[0].staleness == 2 and [r.staleness for r in reply.groups[0].rollouts] == [2, 1]
    encoded: list[object] = []

    def encode(prompt: object) -> list[int]:
        encoded.append(prompt)
        return [5, 6]

    batch = convert.batch_in(6, reply.groups, encode)
    assert encoded == ["What is 7 + 8?"]
    (got,) = batch.groups
    assert (got.id, got.worker, got.policy_version) == ("t9", "w-1", 4)
    assert got.rollouts[0] == dataclasses.replace(kept, prompt_ids=(5, 6))
    assert got.rollouts[0].finish_reason == "stop"


def test_chat_prompts_reach_the_trainer_as_the_workers_saw_them() -> None:
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"})
    problem = Problem(id="p", prompt=messages, answer=4)
    r = rollout.Rollout((), (1, 2), (-1.0, -1.0), text="4")
    out = convert.group_out(
        rollout.Group((r, r), id="t"), problem, 0, policy_version=0, importance_weighted=False
    )
    seen: list[object] = []
    convert.batch_in(0, [out], lambda p: seen.append(p) or [1])
    assert seen == [wire.plain_prompt(out.prompt)] == [messages]


def test_batch_errors_name_the_place() -> None:
    r = rollout.Rollout((), (1, 2), (-1.0, -1.0))
    problem = Problem(id="p", prompt="x", answer=None)
    good = convert.group_out(
        rollout.Group((r, r), id="t"), problem, 0, policy_version=0, importance_weighted=False
    )
    bad = good.model_copy(
        update={"rollouts": [good.rollouts[0], good.rollouts[1].model_copy(update={"logprobs": [-1.0]})]}
    )
    with pytest.raises(ValueError, match=r"groups\[1\]\.rollouts\[1\]: logprobs: need one per model token"):
        convert.batch_in(0, [good, bad], lambda p: [1])
    with pytest.raises(ValueError, match=r"groups\[0\]: prompt: encodes to no token ids"):
        convert.batch_in(0, [good], lambda p: [])
    lonely = good.model_copy(update={"rollouts": good.rollouts[:1]})
    with pytest.raises(ValueError, match=r"groups\[0\]: group 't': needs ≥ 2 rollouts"):
        convert.batch_in(0, [lonely], lambda p: [1])


def test_an_episode_is_refused_by_the_single_turn_wire_rather_than_flattened() -> None:
    m, e = rollout.MODEL, rollout.ENVIRONMENT
    episode = rollout.Rollout((1,), (3, 9, 5), (-1.0, -3.0), kinds=(m, e, m))
    with pytest.raises(ValueError, match=r"kinds: .*single-turn"):
        convert.submission(episode, 0)
