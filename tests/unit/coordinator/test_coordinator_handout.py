"""What the trainer is handed (coordinator.handout) on its own: groups on the wire, retries, rewinds, and
withdrawing a caught worker's groups."""

from __future__ import annotations

import pytest

from echo_runtime import rollout, staleness
from echo_runtime.coordinator import buffer, convert, handout, wire
from echo_runtime.tasks import base as tasks_base

ASYNC_WEIGHTED = staleness.StalenessPolicy("Async", 2, "ImportanceWeight", 0)


def entry(
    task_id: str, worker: str, versions: tuple[int, ...], rewards: tuple[float, ...] = ()
) -> handout.Entry:
    rewards = rewards or tuple(0.0 for _ in versions)
    rollouts = tuple(
        convert.accepted(
            wire.RolloutIn(
                completion=f"c{i}",
                token_ids=[1, 2],
                logprobs=[-0.5, -0.25],
                policy_version=v,
                finish_reason="stop",
            ),
            tasks_base.Reward(r, {"exact": r}, "why"),
            backend="mlx",
            device="mps",
            dtype="float16",
        )
        for i, (v, r) in enumerate(zip(versions, rewards, strict=True))
    )
    payload = handout.TaskPayload(tasks_base.Problem(id=f"p-{task_id}", prompt=f"{task_id}?", answer=0))
    return buffer.Entry(
        task_id,
        payload,
        place="consumed",
        worker=worker,
        group=rollout.Group(rollouts, id=task_id, worker=worker),
        version=min(versions),
    )


def batch(h: handout.Handout, version: int, *entries: handout.Entry) -> wire.BatchReply:
    groups = [handout.group_out(e, version, ASYNC_WEIGHTED) for e in entries]
    return h.hand(version, list(entries), groups)


# ------------------------------------------------------------------------------------------- group_out
def test_a_group_goes_out_with_the_staleness_of_its_oldest_rollout_and_each_rollouts_own() -> None:
    out = handout.group_out(entry("t1", "w-a", (5, 4), (1.0, 0.0)), 6, ASYNC_WEIGHTED)
    assert (out.task_id, out.problem_id, out.prompt, out.worker_id) == ("t1", "p-t1", "t1?", "w-a")
    assert (out.policy_version, out.staleness, out.importance_weighted) == (4, 2, True)
    assert [r.staleness for r in out.rollouts] == [1, 2]
    first = out.rollouts[0]
    assert (first.completion, first.token_ids, first.logprobs, first.finish_reason) == (
        "c0",
        [1, 2],
        [-0.5, -0.25],
        "stop",
    )
    assert (first.reward, first.reward_components, first.reward_reason) == (1.0, {"exact": 1.0}, "why")
    assert (first.backend, first.device, first.dtype) == ("mlx", "mps", "float16")


@pytest.mark.parametrize(
    ("policy", "t", "weighted"),
    [
        (ASYNC_WEIGHTED, 3, False),  # staleness 0 is never weighted
        (staleness.StalenessPolicy("Async", 2, "Drop", 0), 5, False),  # Drop consumes within the bound as is
        (ASYNC_WEIGHTED, 5, True),
    ],
)
def test_importance_weighting_follows_the_stale_action(
    policy: staleness.StalenessPolicy, t: int, weighted: bool
) -> None:
    assert handout.group_out(entry("t", "w", (3, 3)), t, policy).importance_weighted is weighted


def test_a_group_past_the_bound_is_never_handed_out() -> None:
    with pytest.raises(AssertionError):
        handout.group_out(entry("t", "w", (3, 3)), 6, ASYNC_WEIGHTED)  # staleness 3 > Δmax 2


# ------------------------------------------------------------------------------------------- batches
def test_a_retry_at_the_last_version_gets_the_same_batch_and_the_next_step_moves_on() -> None:
    h = handout.Handout()
    assert h.again(0) is None and h.last_version is None and h.next_step(0) == 0
    first = batch(h, 0, entry("a", "w", (0, 0)))
    assert first.ready and h.again(0) is first and h.again(1) is None
    assert h.next_step(0) == 1  # the batch of 0 went out: the next one is 1's
    assert h.next_step(1) == 1  # t_train moved on: 1's batch is not taken yet


def test_a_resumed_trainer_rewinds_to_the_batch_before_a_never_published_prefetch() -> None:
    h = handout.Handout()
    at_3 = batch(h, 3, entry("a", "w", (3, 3)))
    prefetched = entry("b", "w", (3, 3))
    batch(h, 4, prefetched)
    assert h.may_rewind(3, t_train=4, published=3)
    assert not h.may_rewind(3, t_train=4, published=4)  # 4 was published: trained on, no going back
    assert not h.may_rewind(3, t_train=3, published=3)  # not behind t_train
    assert not h.may_rewind(2, t_train=4, published=2)  # never handed out
    again, withdrawn = h.rewind(3)
    assert again is at_3 and h.again(3) is at_3 and h.again(4) is None
    assert [(w.version, w.entries) for w in withdrawn] == [(4, [prefetched])]
    assert not h.may_rewind(3, t_train=4, published=3)  # once: the batch before is forgotten


def test_a_trainer_two_batches_ahead_of_the_store_rewinds_two() -> None:
    """Batch 4 prefetched while 4's upload ran, then 5 prefetched: killed, it resumes at 3 (the newest
    published) and gets 3's batch again; 4's and 5's groups are withdrawn. Three back is too far."""
    h = handout.Handout()
    at_3 = batch(h, 3, entry("a", "w", (3, 3)))
    b4, b5 = entry("b", "w", (3, 3)), entry("c", "w", (4, 4))
    batch(h, 4, b4)
    batch(h, 5, b5)
    assert h.may_rewind(3, t_train=5, published=3) and h.may_rewind(4, t_train=5, published=3)
    assert not h.may_rewind(3, t_train=5, published=4)  # 4 was published: 3's batch was trained on
    batch(h, 6, entry("d", "w", (5, 5)))
    assert not h.may_rewind(3, t_train=6, published=3)  # only REWIND_BACK batches are kept
    h = handout.Handout()
    at_3 = batch(h, 3, entry("a", "w", (3, 3)))
    batch(h, 4, b4)
    batch(h, 5, b5)
    again, withdrawn = h.rewind(3)
    assert again is at_3 and h.again(3) is at_3
    assert [(w.version, w.entries) for w in withdrawn] == [(4, [b4]), (5, [b5])]


def test_a_caught_workers_groups_leave_only_the_batch_about_to_be_trained_on() -> None:
    h = handout.Handout()
    liar_old, honest_old = entry("a", "liar", (0, 0)), entry("b", "honest", (0, 0))
    batch(h, 0, liar_old, honest_old)
    liar, honest = entry("c", "liar", (0, 1)), entry("d", "honest", (1, 1))
    current = batch(h, 1, liar, honest)
    assert h.withdraw_worker("liar", version=0, t_train=1) is None  # trained on already
    assert h.withdraw_worker("liar", version=1, t_train=2) is None  # t_train moved past it
    assert h.withdraw_worker("nobody", version=1, t_train=1) is None
    assert h.again(1) is current
    withdrawn = h.withdraw_worker("liar", version=1, t_train=1)
    assert withdrawn is not None and (withdrawn.version, withdrawn.entries) == (1, [liar])
    assert h.again(1) is None and h.last_version is None  # a retry at 1 assembles a new batch
    assert h.withdraw_worker("honest", version=1, t_train=1) is None


def test_a_rewind_after_a_withdrawn_batch_withdraws_nothing_more() -> None:
    h = handout.Handout()
    at_2 = batch(h, 2, entry("a", "w", (2, 2)))
    batch(h, 3, entry("b", "liar", (3, 3)))
    assert h.withdraw_worker("liar", version=3, t_train=3) is not None
    again, withdrawn = h.rewind(2)
    assert again is at_2 and withdrawn == []
