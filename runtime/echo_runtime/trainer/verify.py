"""The trainer's check of what workers claim: behaviour log-probs against its own recomputation.

A worker reports, with each completion, the log-probs its backend assigned to the sampled tokens (the
behaviour policy μ of the PPO ratio) and the policy version that sampled it. Nothing makes a worker
honest: it could fabricate the log-probs, or claim an older version than the one it used. Before
training on a batch, :func:`check_batch` recomputes the log-probs of ``checks`` rollouts of **every**
group — chosen with the operating system's randomness, so a worker cannot know which — in evaluation
mode (no dropout) and without gradients, **with the weights of the version each rollout claims**:

* the trainer's current weights for a group of staleness 0;
* for a group of staleness k ≤ Δmax, the trainable weights of that version, which :class:`History`
  keeps (CPU copies of the last Δmax versions: the LoRA adapter, a few MiB, or every weight when
  fine-tuning all of them) and swaps in for the recomputation, restoring the current ones bit for bit.
  A resumed trainer fetches the versions it lacks from the snapshot store (retention keeps at least
  Δmax + 1 of them).

Promises:

* A group whose checked tokens disagree by more than ``bound`` nats on average (mean |Δ log-prob| per
  token) convicts its worker: :meth:`Checked.caught` names it with the statistic, and the caller drops
  every group of that worker from the batch *before* the optimizer step, reports the worker to the
  coordinator (which quarantines it) and never trains on it again (:func:`without`). A worker that
  claims an older version than it sampled with, or makes up log-probs for a stale group, is caught like
  one that lies about a fresh group: the claimed version's weights are the ones recomputed.
* Honest backends are far below any sensible bound (≤ 1e-6 between transformers, mlx and the trainer
  in float32), so the default bound (``syncPolicy.maxLogprobMismatch``, 0.1) is only crossed by a lie.
* A group whose claimed version's weights cannot be had (neither kept nor in the store) is never
  trained on unchecked: :attr:`Checked.unverified` names it and the caller drops it.
* The policy is left as it was found: its mode, its weights (bit for bit), no gradients.
* Cost: one forward pass, without gradients, over ``checks`` rollouts per group (with the defaults one
  rollout in ``groupSize``), one copy of the trainable weights per version, and two weight copies per
  older version present in the batch.

:class:`WorkerStats` keeps the per-worker statistic over the run for the trainer's metrics records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import secrets
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from echo_runtime.backends import seeded
from echo_runtime.backends.logprobs import token_logprobs
from echo_runtime.rollout import Batch, Rollout
from echo_runtime.trainer import typical
from echo_runtime.trainer.policy import TrainablePolicy, completion_logits, pack

SYSTEM_RANDOM = secrets.SystemRandom()
"""Where the rollouts a check recomputes are chosen: the operating system's randomness, which no worker
sees."""
DRAW_BOUND = 1e-3
"""How far (probability mass) a checked token's interval may miss its key's uniform before the token
counts as not drawn: float32 backends miss by ≤ 1e-6 on rounding (8.6e-7 at worst on SmolLM2, 0 on the tiny
model: ``benchmarks/draws.py``).
Only rollouts sampled in float32 and checked by a float32 trainer convict on it: half-precision
backends have not been measured yet (``scripts/gpu-check.sh``), so their gaps are recorded, not judged."""
PRECISE = frozenset({"float32", "float64"})
DRAW_CHUNK_ELEMENTS = 1 << 24
"""Logits turned into a distribution at a time (64 MiB of float32), whatever the vocabulary."""
_log = logging.getLogger(__name__)


class History:
    """The trainable weights of the last ``keep`` versions before the current one (CPU copies), for
    checking groups against the version they claim.

    ``fetch(version)`` (optional) returns a snapshot directory of an older version the history lacks (a
    resumed trainer's store); None or an exception means the version cannot be had."""

    def __init__(self, keep: int, fetch: Callable[[int], Path | None] | None = None) -> None:
        if keep < 0:
            raise ValueError(f"keep must be ≥ 0, got {keep}")
        self.keep = keep
        self._fetch = fetch
        self._states: dict[int, dict[str, torch.Tensor]] = {}

    @property
    def versions(self) -> list[int]:
        return sorted(self._states)

    def remember(self, version: int, policy: TrainablePolicy) -> None:
        """Record the policy's current weights as ``version`` (the trainer holds that version now) and
        forget versions no group can claim any more (older than ``version − keep``)."""
        if self.keep == 0:
            self._states.clear()
            return
        if version not in self._states:
            self._states[version] = policy.trainable_state()
        for old in [v for v in self._states if v < version - self.keep or v > version]:
            del self._states[old]

    def _state(self, version: int, current: int, policy: TrainablePolicy) -> dict[str, torch.Tensor] | None:
        """The weights of ``version`` (kept, or fetched and kept); None if they cannot be had. Loading a
        fetched snapshot changes the policy's weights: the caller restores ``current``'s afterwards."""
        if version in self._states:
            return self._states[version]
        if self._fetch is None or version < current - self.keep or version > current:
            return None
        try:
            folder = self._fetch(version)
            if folder is None:
                return None
            policy.load_snapshot(folder)
        except Exception as exc:  # a collected or unreadable snapshot: the groups go unchecked, not trained
            _log.warning("cannot load version %d to check the groups that claim it: %s", version, exc)
            return None
        self._states[version] = policy.trainable_state()
        return self._states[version]

    @contextlib.contextmanager
    def weights_of(self, version: int, current: int, policy: TrainablePolicy) -> Iterator[bool]:
        """Within the block the policy holds ``version``'s trainable weights (yields True), or, when they
        cannot be had, its own (yields False); afterwards ``current``'s again, bit for bit."""
        if version == current:
            yield True
            return
        if current not in self._states:
            raise RuntimeError(f"remember({current}) first: the current weights must be kept to be restored")
        try:
            state = self._state(version, current, policy)
            if state is not None:
                policy.load_trainable_state(state)
            yield state is not None
        finally:
            policy.load_trainable_state(self._states[current])


@dataclasses.dataclass(frozen=True)
class GroupCheck:
    """The check of one group: which worker, how many tokens, the mean and max |Δ log-prob|."""

    group_id: str
    worker: str
    version: int
    """The policy version the checked rollouts claim (the weights they were recomputed with)."""
    rollouts: int
    tokens: int
    mean_abs: float
    max_abs: float
    draw_gap: float | None = None
    """For a group drawn with a key: the largest distance between a checked token's interval and its
    key's uniform (0 when every token is its draw); None without a key."""
    off_draw: int = 0
    """Checked tokens further than the draw bound from their draw."""
    surprise: tuple[int, float, float] | None = None
    """For a group drawn without a key: its checked tokens' count, ``Σ (log p + H)`` and ``Σ`` variance
    (:mod:`.typical`); None with a key."""


@dataclasses.dataclass(frozen=True)
class Checked:
    """What :func:`check_batch` found in one batch."""

    version: int
    groups: tuple[GroupCheck, ...]
    bound: float
    unverified: tuple[str, ...] = ()
    """Groups whose claimed version's weights could not be had: never to be trained on."""
    draw_bound: float = 1e-3

    def convicts(self, check: GroupCheck) -> bool:
        """Whether ``check`` convicts its worker: log-probs above the bound, or a token not its draw."""
        return check.mean_abs > self.bound or check.off_draw > 0

    def caught(self) -> dict[str, GroupCheck]:
        """Workers with a convicting checked group (their worst group)."""
        out: dict[str, GroupCheck] = {}
        for check in self.groups:
            if self.convicts(check) and (
                check.worker not in out
                or (check.off_draw, check.mean_abs) > (out[check.worker].off_draw, out[check.worker].mean_abs)
            ):
                out[check.worker] = check
        return out

    @staticmethod
    def reason(check: GroupCheck, bound: float, version: int, draw_bound: float = 1e-3) -> str:
        if check.off_draw > 0 and check.mean_abs <= bound:
            return (
                f"text not drawn from its lease's key: {check.off_draw} checked token(s) of group "
                f"{check.group_id} lie outside the interval their key's uniform falls in, by up to "
                f"{check.draw_gap:.3g} of probability mass (above {draw_bound:g}), recomputed with the weights "
                f"of version {check.version} (trainer at {version}): the worker chose the text, or sampled it "
                "another way"
            )
        return (
            f"behaviour log-probs disagree with the trainer's recomputation with the weights of version "
            f"{check.version}, the version they claim (trainer at {version}): mean "
            f"|Δ log-prob| {check.mean_abs:.4g} per token over {check.tokens} token(s) of group "
            f"{check.group_id} (max {check.max_abs:.4g}), above maxLogprobMismatch {bound:g}"
        )


def without(batch: Batch, workers: Sequence[str] | set[str], groups: Sequence[str] = ()) -> Batch:
    """``batch`` minus every group of ``workers`` and the groups named in ``groups``."""
    banned, gone = set(workers), set(groups)
    return dataclasses.replace(
        batch, groups=tuple(g for g in batch.groups if g.worker not in banned and g.id not in gone)
    )


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
    rng: random.Random = SYSTEM_RANDOM,
    max_rows: int = 16,
    history: History | None = None,
    top_p: float = 1.0,
    draw_bound: float = DRAW_BOUND,
) -> Checked:
    """Recompute ``checks`` random rollouts of every group with the weights of the version each claims
    and compare (module docstring). The policy holds ``batch.version``; without a ``history`` only groups
    of that version can be checked, and the others are :attr:`Checked.unverified`."""
    by_version: dict[int, list[tuple[int, int, Rollout]]] = {}
    for gi, group in enumerate(batch.groups):
        if checks <= 0 or not group.rollouts:
            continue
        for ri in rng.sample(range(len(group.rollouts)), min(checks, len(group.rollouts))):
            r = group.rollouts[ri]
            by_version.setdefault(r.policy_version, []).append((gi, ri, r))
    if not by_version:
        return Checked(batch.version, (), bound)
    if history is not None:
        history.remember(batch.version, policy)
    per_group: dict[tuple[int, int], list[torch.Tensor]] = {}
    gaps: dict[tuple[int, int], list[torch.Tensor]] = {}
    judged: dict[tuple[int, int], list[torch.Tensor]] = {}
    surprises: dict[tuple[int, int], list[torch.Tensor]] = {}
    unverified: set[int] = set()
    param = next(policy.model.parameters(), None)
    precise = param is None or param.dtype in (torch.float32, torch.float64)
    with _evaluating(policy.model):
        for version in sorted(by_version, reverse=True):  # the current version first: no swap
            picked = by_version[version]
            weights = (
                history.weights_of(version, batch.version, policy)
                if history is not None
                else contextlib.nullcontext(version == batch.version)
            )
            with weights as available:
                if not available:
                    unverified.update(gi for gi, _, _ in picked)
                    continue
                for start in range(0, len(picked), max_rows):
                    chunk = picked[start : start + max_rows]
                    packed = pack([r for _, _, r in chunk], policy.pad_id, policy.device)
                    mask = packed.mask.bool()
                    logits = completion_logits(policy.model, packed)  # [tokens, vocab], row by row
                    values = token_logprobs(logits, packed.targets[mask], temperature).float()
                    recomputed = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
                    recomputed = recomputed.masked_scatter(mask, values)
                    delta = (packed.behaviour.float() - recomputed).abs() * packed.mask
                    drawn = _draw_gaps(logits, chunk, batch, temperature, top_p)
                    likely = _surprises(logits, chunk, batch, temperature, top_p)
                    offset = 0
                    for row, (gi, _, r) in enumerate(chunk):
                        per_group.setdefault((gi, version), []).append(delta[row][mask[row]].cpu())
                        if likely is not None and batch.groups[gi].key is None:
                            row_s = likely[:, offset : offset + len(r.completion_ids)]
                            surprises.setdefault((gi, version), []).append(row_s)
                        if drawn is not None and batch.groups[gi].key is not None:
                            row_gaps = drawn[offset : offset + len(r.completion_ids)]
                            gaps.setdefault((gi, version), []).append(row_gaps)
                            judge = precise and r.dtype in PRECISE  # half precision: recorded, not judged
                            judged.setdefault((gi, version), []).append(
                                row_gaps if judge else torch.zeros_like(row_gaps)
                            )
                        offset += len(r.completion_ids)
    found = []
    for (gi, version), rows in sorted(per_group.items()):
        if gi in unverified:
            continue
        values = torch.cat(rows).double()
        group = batch.groups[gi]
        drawn = torch.cat(gaps[(gi, version)]) if (gi, version) in gaps else None
        counted = torch.cat(judged[(gi, version)]) if (gi, version) in judged else None
        surprise = None
        if (gi, version) in surprises:
            sv = torch.cat(surprises[(gi, version)], dim=1)
            sv = sv[:, ~torch.isnan(sv).any(0)]  # tokens outside the recomputed nucleus: left out
            surprise = (int(sv.shape[1]), float(sv[0].sum()), float(sv[1].sum()))
        found.append(
            GroupCheck(
                group_id=group.id,
                worker=group.worker,
                version=version,
                rollouts=len(rows),
                tokens=int(values.numel()),
                mean_abs=float(values.mean()) if values.numel() else 0.0,
                max_abs=float(values.max()) if values.numel() else 0.0,
                draw_gap=float(drawn.max()) if drawn is not None and drawn.numel() else None,
                off_draw=int((counted > draw_bound).sum()) if counted is not None else 0,
                surprise=surprise,
            )
        )
    return Checked(
        batch.version,
        tuple(found),
        bound,
        tuple(batch.groups[gi].id for gi in sorted(unverified)),
        draw_bound,
    )


def _draw_gaps(
    logits: torch.Tensor,
    chunk: Sequence[tuple[int, int, Rollout]],
    batch: Batch,
    temperature: float,
    top_p: float,
) -> torch.Tensor | None:
    """Per completion token of ``chunk`` (in ``logits``' order), how far its key's uniform lies outside
    the token's interval of the recomputed distribution (:func:`echo_runtime.backends.seeded.violations`);
    NaN for rollouts of groups without a key; None when no group of the chunk has one."""
    if all(batch.groups[gi].key is None for gi, _, _ in chunk):
        return None
    uniforms: list[float] = []
    tokens: list[int] = []
    for gi, ri, r in chunk:
        key = batch.groups[gi].key
        k = seeded.parse_key(key) if key is not None else None
        uniforms.extend(
            seeded.uniform(k, ri, t) if k is not None else math.nan for t in range(len(r.completion_ids))
        )
        tokens.extend(r.completion_ids)
    u = torch.tensor(uniforms, dtype=torch.float64)
    ids = torch.tensor(tokens, dtype=torch.long)
    out = torch.full((len(tokens),), math.nan, dtype=torch.float64)
    for at, probs in _distributions(logits, torch.arange(len(tokens)), temperature, top_p):
        out[at] = seeded.violations(probs, ids[at], u[at]).cpu()
    return out.nan_to_num(nan=0.0) if not torch.isnan(u).all() else None


def _surprises(
    logits: torch.Tensor,
    chunk: Sequence[tuple[int, int, Rollout]],
    batch: Batch,
    temperature: float,
    top_p: float,
) -> torch.Tensor | None:
    """``[2, tokens]``: per completion token of ``chunk``, ``(s, v)`` of :func:`.typical.surprise` for
    rollouts of groups drawn without a key (NaN for the others); None when every group has a key."""
    if all(batch.groups[gi].key is not None for gi, _, _ in chunk):
        return None
    keyless = torch.tensor(
        [batch.groups[gi].key is None for gi, _, r in chunk for _ in r.completion_ids], dtype=torch.bool
    )
    ids = torch.tensor([t for _, _, r in chunk for t in r.completion_ids], dtype=torch.long)
    out = torch.full((2, len(ids)), math.nan, dtype=torch.float64)
    for at, probs in _distributions(logits, keyless.nonzero().squeeze(-1), temperature, top_p):
        s, v = typical.surprise(probs, ids[at])
        out[0, at], out[1, at] = s.cpu(), v.cpu()
    return out


def _distributions(
    logits: torch.Tensor, rows: torch.Tensor, temperature: float, top_p: float
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(rows, their sampling distributions)`` in slices of at most :data:`DRAW_CHUNK_ELEMENTS`
    probabilities, so a large vocabulary never holds a whole batch's worth of them at once."""
    step = max(1, DRAW_CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    for start in range(0, len(rows), step):
        at = rows[start : start + step]
        yield at, seeded.distribution(logits[at.to(logits.device)], temperature, top_p)


@dataclasses.dataclass
class WorkerStats:
    """Per-worker totals of the checks over the run (for the trainer's metrics records)."""

    tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    abs_sum: dict[str, float] = dataclasses.field(default_factory=dict)
    worst: dict[str, float] = dataclasses.field(default_factory=dict)
    draw_gap: dict[str, float] = dataclasses.field(default_factory=dict)
    """The largest distance of a checked token from its key's draw, for workers whose groups had keys."""
    typicality: dict[str, typical.Typicality] = dataclasses.field(default_factory=dict)
    """The statistic of the checked tokens of each worker's groups drawn without a key."""

    def add(self, checked: Checked) -> None:
        for c in checked.groups:
            self.tokens[c.worker] = self.tokens.get(c.worker, 0) + c.tokens
            self.abs_sum[c.worker] = self.abs_sum.get(c.worker, 0.0) + c.mean_abs * c.tokens
            self.worst[c.worker] = max(self.worst.get(c.worker, 0.0), c.mean_abs)
            if c.draw_gap is not None:
                self.draw_gap[c.worker] = max(self.draw_gap.get(c.worker, 0.0), c.draw_gap)
            if c.surprise is not None:
                self.typicality.setdefault(c.worker, typical.Typicality()).add(*c.surprise)

    def record(self, workers: Sequence[str]) -> dict[str, dict[str, float]]:
        """``{worker: {tokens, meanAbs, worstGroup[, worstDrawGap][, samplingZ, samplingExcess]}}`` for
        ``workers`` that have been checked."""
        return {
            w: {
                "tokens": self.tokens[w],
                "meanAbs": self.abs_sum[w] / self.tokens[w] if self.tokens[w] else 0.0,
                "worstGroup": self.worst[w],
                **({"worstDrawGap": self.draw_gap[w]} if w in self.draw_gap else {}),
                **(
                    {"samplingZ": self.typicality[w].z, "samplingExcess": self.typicality[w].excess}
                    if w in self.typicality
                    else {}
                ),
            }
            for w in workers
            if w in self.tokens
        }
