"""The trainer's check of what workers claim: behaviour log-probs against its own recomputation.

A worker reports, with each completion, the log-probs its backend assigned to the sampled tokens (the
behaviour policy μ of the PPO ratio). Nothing makes a worker honest: it could fabricate them, or sample
with an older policy than the version it claims. For a group of staleness 0 the trainer holds exactly
the weights that sampled it, so it can tell: before training on a batch, :func:`check_batch` recomputes
the log-probs of ``checks`` rollouts of every staleness-0 group — chosen with the operating system's
randomness, so a worker cannot know which — in evaluation mode (no dropout) and without gradients.

Promises:

* A group whose checked tokens disagree by more than ``bound`` nats on average (mean |Δ log-prob| per
  token) convicts its worker: :meth:`Checked.caught` names it with the statistic, and the caller drops
  every group of that worker from the batch *before* the optimizer step, reports the worker to the
  coordinator (which quarantines it) and never trains on it again (:meth:`Checked.without`).
* Honest backends are far below any sensible bound (≤ 1e-6 between transformers, mlx and the trainer
  in float32), so the default bound (``syncPolicy.maxLogprobMismatch``, 0.1) is only crossed by a lie.
* Groups of staleness > 0 are not checked: the trainer no longer holds the policy that sampled them.
  What a lie there can do is bounded by the PPO clip and the truncated importance weights.
* Cost: one forward pass, without gradients, over ``checks`` rollouts per fresh group — with the
  defaults one rollout in ``groupSize`` of the fresh ones.

:class:`WorkerStats` keeps the per-worker statistic over the run for the trainer's metrics records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import secrets
from collections.abc import Iterator, Sequence

import torch

from echo_runtime.rollout import Batch, Rollout
from echo_runtime.trainer.policy import TrainablePolicy, completion_logprobs, pack

_SYSTEM_RANDOM = secrets.SystemRandom()


@dataclasses.dataclass(frozen=True)
class GroupCheck:
    """The check of one group: which worker, how many tokens, the mean and max |Δ log-prob|."""

    group_id: str
    worker: str
    rollouts: int
    tokens: int
    mean_abs: float
    max_abs: float


@dataclasses.dataclass(frozen=True)
class Checked:
    """What :func:`check_batch` found in one batch."""

    version: int
    groups: tuple[GroupCheck, ...]
    bound: float

    def caught(self) -> dict[str, GroupCheck]:
        """Workers with a checked group above the bound (their worst group)."""
        out: dict[str, GroupCheck] = {}
        for check in self.groups:
            if check.mean_abs > self.bound and (
                check.worker not in out or check.mean_abs > out[check.worker].mean_abs
            ):
                out[check.worker] = check
        return out

    @staticmethod
    def reason(check: GroupCheck, bound: float, version: int) -> str:
        return (
            f"behaviour log-probs disagree with the trainer's recomputation at version {version}: mean "
            f"|Δ log-prob| {check.mean_abs:.4g} per token over {check.tokens} token(s) of group "
            f"{check.group_id} (max {check.max_abs:.4g}), above maxLogprobMismatch {bound:g}"
        )


def without(batch: Batch, workers: Sequence[str] | set[str]) -> Batch:
    """``batch`` minus every group of ``workers``."""
    banned = set(workers)
    return dataclasses.replace(batch, groups=tuple(g for g in batch.groups if g.worker not in banned))


@contextlib.contextmanager
def _evaluating(module: torch.nn.Module) -> Iterator[None]:
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was_training)


def check_batch(
    policy: TrainablePolicy,
    batch: Batch,
    *,
    checks: int,
    bound: float,
    temperature: float,
    rng: random.Random = _SYSTEM_RANDOM,
    max_rows: int = 16,
) -> Checked:
    """Recompute ``checks`` random rollouts of every staleness-0 group and compare (module docstring)."""
    picked: list[tuple[int, Rollout]] = []
    for gi, group in enumerate(batch.groups):
        fresh = [r for r in group.rollouts if r.policy_version == batch.version]
        if checks <= 0 or not fresh:
            continue
        picked.extend((gi, r) for r in rng.sample(fresh, min(checks, len(fresh))))
    if not picked:
        return Checked(batch.version, (), bound)
    per_group: dict[int, list[torch.Tensor]] = {}
    with _evaluating(policy.model):
        for start in range(0, len(picked), max_rows):
            chunk = picked[start : start + max_rows]
            packed = pack([r for _, r in chunk], policy.pad_id, policy.device)
            recomputed = completion_logprobs(policy.model, packed, temperature).float()
            delta = (packed.behaviour.float() - recomputed).abs() * packed.mask
            for row, (gi, _) in enumerate(chunk):
                per_group.setdefault(gi, []).append(delta[row][packed.mask[row].bool()].cpu())
    found = []
    for gi, rows in sorted(per_group.items()):
        values = torch.cat(rows).double()
        group = batch.groups[gi]
        found.append(
            GroupCheck(
                group_id=group.id,
                worker=group.worker,
                rollouts=len(rows),
                tokens=int(values.numel()),
                mean_abs=float(values.mean()) if values.numel() else 0.0,
                max_abs=float(values.max()) if values.numel() else 0.0,
            )
        )
    return Checked(batch.version, tuple(found), bound)


@dataclasses.dataclass
class WorkerStats:
    """Per-worker totals of the checks over the run (for the trainer's metrics records)."""

    tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    abs_sum: dict[str, float] = dataclasses.field(default_factory=dict)
    worst: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, checked: Checked) -> None:
        for c in checked.groups:
            self.tokens[c.worker] = self.tokens.get(c.worker, 0) + c.tokens
            self.abs_sum[c.worker] = self.abs_sum.get(c.worker, 0.0) + c.mean_abs * c.tokens
            self.worst[c.worker] = max(self.worst.get(c.worker, 0.0), c.mean_abs)

    def record(self, workers: Sequence[str]) -> dict[str, dict[str, float]]:
        """``{worker: {tokens, meanAbs, worstGroup}}`` for ``workers`` that have been checked."""
        return {
            w: {
                "tokens": self.tokens[w],
                "meanAbs": self.abs_sum[w] / self.tokens[w] if self.tokens[w] else 0.0,
                "worstGroup": self.worst[w],
            }
            for w in workers
            if w in self.tokens
        }
