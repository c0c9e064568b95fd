"""The one conversion between :class:`echo_runtime.rollout.Rollout` and the coordinator's wire schema.

Each hop of a rollout crosses the wire once in each direction, and each crossing is one function here:

* a worker submits what its backend sampled: :func:`submission` (``Rollout`` → ``RolloutIn``);
* the coordinator keeps what it accepted, with its own reward: :func:`accepted` (``RolloutIn`` →
  ``Rollout``), and hands it to the trainer: :func:`rollout_out` / :func:`group_out` (→ ``RolloutOut``,
  ``GroupOut``);
* the trainer takes the typed batch reply: :func:`batch_in` (``GroupOut`` → ``Group`` → ``Batch``),
  encoding each group's prompt the way the workers did.

Validation stays where it is defined: the wire models bound what a worker may send
(:mod:`.wire`), the rollout type what a rollout may hold (:mod:`echo_runtime.rollout`). Errors raised
while building the trainer's batch name their place: ``groups[2].rollouts[5]: logprobs: must all be
finite``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from echo_runtime import rollout as rollouts
from echo_runtime.coordinator import wire
from echo_runtime.tasks import base as tasks_base


def submission(sample: rollouts.Rollout, policy_version: int) -> wire.RolloutIn:
    """What a worker submits for one rollout its backend sampled at ``policy_version``.

    The backend, device and dtype are left out: the coordinator takes them from the worker's
    registration. An episode with environment turns cannot be submitted yet: the wire carries one
    contiguous completion (a ValueError says so rather than dropping the turns' kinds)."""
    if sample.kinds:
        raise ValueError("kinds: the coordinator's wire format carries single-turn completions only")
    return wire.RolloutIn(
        completion=sample.text,
        token_ids=list(sample.completion_ids),
        logprobs=list(sample.logprobs),
        policy_version=policy_version,
        finish_reason=sample.finish_reason,
    )


def accepted(
    submitted: wire.RolloutIn, reward: tasks_base.Reward, *, backend: str, device: str, dtype: str
) -> rollouts.Rollout:
    """A rollout the coordinator accepted, with its own ``reward`` (never the worker's). ``backend``,
    ``device`` and ``dtype`` are the worker's registered ones, where the rollout names none itself.
    The prompt is kept once per task, so ``prompt_ids`` stays empty here."""
    return rollouts.Rollout(
        prompt_ids=(),
        completion_ids=tuple(submitted.token_ids),
        logprobs=tuple(submitted.logprobs),
        reward=reward.value,
        policy_version=submitted.policy_version,
        backend=submitted.backend or backend,
        device=submitted.device or device,
        dtype=submitted.dtype or dtype,
        text=submitted.completion,
        finish_reason=submitted.finish_reason,
        reward_components=dict(reward.components),
        reward_reason=reward.reason,
    )


def rollout_out(r: rollouts.Rollout, version: int) -> wire.RolloutOut:
    """A rollout as the trainer receives it for the step that turns ``version`` into ``version + 1``."""
    return wire.RolloutOut(
        completion=r.text,
        token_ids=list(r.completion_ids),
        logprobs=list(r.logprobs),
        policy_version=r.policy_version,
        staleness=r.staleness(version),
        reward=r.reward,
        reward_components=dict(r.reward_components),
        reward_reason=r.reward_reason,
        backend=r.backend,
        device=r.device,
        dtype=r.dtype,
        finish_reason=r.finish_reason,
    )


def group_out(
    group: rollouts.Group,
    problem: tasks_base.Problem,
    version: int,
    *,
    policy_version: int,
    importance_weighted: bool,
) -> wire.GroupOut:
    """A buffered group as the trainer receives it at ``version``; ``policy_version`` is the version the
    buffer holds it under (its oldest rollout's)."""
    return wire.GroupOut(
        task_id=group.id,
        problem_id=problem.id,
        prompt=problem.prompt,  # type: ignore[arg-type]  # pydantic validates the tuple of messages
        worker_id=group.worker,
        policy_version=policy_version,
        staleness=version - policy_version,
        importance_weighted=importance_weighted,
        rollouts=[rollout_out(r, version) for r in group.rollouts],
        key=group.key,
    )


def rollout_in(received: wire.RolloutOut, prompt_ids: Sequence[int]) -> rollouts.Rollout:
    """A rollout of the trainer's batch; ``prompt_ids`` is its group's prompt, encoded."""
    return rollouts.Rollout(
        prompt_ids=tuple(int(x) for x in prompt_ids),
        completion_ids=tuple(received.token_ids),
        logprobs=tuple(received.logprobs),
        reward=received.reward,
        policy_version=received.policy_version,
        backend=received.backend,
        device=received.device,
        dtype=received.dtype,
        text=received.completion,
        finish_reason=received.finish_reason,
        reward_components=dict(received.reward_components),
        reward_reason=received.reward_reason,
    )


def batch_in(
    version: int,
    groups: Sequence[wire.GroupOut],
    encode: Callable[[tasks_base.Prompt], Sequence[int]],
) -> rollouts.Batch:
    """The trainer's :class:`~echo_runtime.rollout.Batch` from the coordinator's typed groups.

    ``encode`` turns a group's prompt — text, or chat messages as ``{role, content}`` dicts — into token
    ids, as the workers did (:func:`echo_runtime.backends.sampling.encode_prompt` with the job's prompt
    style). Errors name the place: ``groups[2].rollouts[5]: logprobs: must all be finite``.
    """
    built: list[rollouts.Group] = []
    for gi, group in enumerate(groups):
        try:
            prompt_ids = list(encode(wire.plain_prompt(group.prompt)))
            if not prompt_ids:
                raise ValueError("prompt: encodes to no token ids")
        except (ValueError, TypeError) as exc:
            raise ValueError(f"groups[{gi}]: {exc}") from exc
        members: list[rollouts.Rollout] = []
        for ri, received in enumerate(group.rollouts):
            try:
                members.append(rollout_in(received, prompt_ids))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"groups[{gi}].rollouts[{ri}]: {exc}") from exc
        try:
            built.append(
                rollouts.Group(
                    rollouts=tuple(members), id=group.task_id, worker=group.worker_id, key=group.key
                )
            )
        except ValueError as exc:
            raise ValueError(f"groups[{gi}]: {exc}") from exc
    return rollouts.Batch(version=version, groups=tuple(built))  # names groups[i] itself
