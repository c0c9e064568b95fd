"""One optimizer step over a batch of groups: admission, advantages, accumulated gradients, AdamW, metrics.

The step that turns version ``t`` into ``t + 1`` works in two parts:

* :func:`plan_step` (pure) decides what is consumed. It asks the staleness rule —
  :func:`echo_runtime.staleness.admit`, the same function the coordinator enforces — about
  every group: groups it refuses are dropped (never trained on, whatever the coordinator sent), groups
  it marks ``importance_weighted`` get the decoupled, truncated-importance-weighted surrogate. It then
  shapes the rewards (DAPO's overlong penalty), computes advantages with the objective's estimator
  (:func:`echo_runtime.trainer.loss.advantages`) and the batch totals that fix every token's weight.
* :func:`train_step` (the shell) runs forward/backward over micro-batches of ``microBatchSize``
  rollouts, accumulating gradients, then clips the gradient norm and takes one AdamW step.

Invariants:

* **Accumulation is exact.** Each micro-batch's loss is its share of the full-batch loss (token weights
  come from the whole batch, :func:`echo_runtime.trainer.loss.token_weights`), so the summed gradient is
  the full-batch gradient whatever the micro-batch size; under DDP each rank's loss is multiplied by
  the world size because DDP averages gradients over ranks.
* **One step, one version.** A call performs exactly one optimizer step, or raises before touching
  the weights (an empty plan is refused up front).
* **Metrics are global.** With ``world_size > 1`` every sum and maximum is all-reduced, so every rank
  returns the same :class:`StepMetrics`. ``mismatch`` compares, per backend, the behaviour log-probs a
  backend reported with this step's recomputation *for rollouts sampled at the trainer's current
  version* (other rollouts differ by policy drift, not by backend numerics): mean and max per-token
  ``|Δ|`` and a sequence-level estimate of ``KL(μ ‖ π_θ)`` (per-token k3 summed over the completion,
  averaged over sequences). With LoRA dropout > 0 the recomputation includes dropout noise.

Constants (not in the manifest): AdamW with betas (0.9, 0.999), eps 1e-8 and no weight decay;
gradient-norm clipping at 1.0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from echo_runtime import staleness
from echo_runtime.rollout import Batch, Group
from echo_runtime.spec.objectives import Objective
from echo_runtime.spec.policy import Algorithm
from echo_runtime.trainer import loss
from echo_runtime.trainer.batch import Slot, by_tokens, micro_batches, padded_tokens, real_tokens
from echo_runtime.trainer.policy import (
    Packed,
    TrainablePolicy,
    completion_logprobs,
    completion_logprobs_entropy,
    pack,
)

MAX_GRAD_NORM = 1.0
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.0


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """The loss and accumulation settings of a step (from the manifest's ``spec.algorithm``)."""

    objective: Objective = dataclasses.field(default_factory=Objective)
    """Advantages, policy loss, aggregation, KL and entropy terms (``spec.algorithm``, resolved)."""
    temperature: float = 1.0
    """The sampling temperature: log-probs are ``log_softmax(logits / T)``, as the backends report them."""
    micro_batch_size: int = 8
    micro_batch_tokens: int | None = None
    """A token budget per micro-batch (padded cells), replacing ``micro_batch_size`` when set
    (:func:`echo_runtime.trainer.batch.by_tokens`)."""
    max_grad_norm: float = MAX_GRAD_NORM
    learning_rate: float | None = None
    """The peak rate; None leaves the optimizer's own rate untouched (callers that manage it)."""
    lr_schedule: str = "Constant"
    min_learning_rate: float = 0.0
    max_steps: int = 1

    @classmethod
    def from_algorithm(cls, algorithm: Algorithm) -> StepConfig:
        return cls(
            objective=algorithm.objective(),
            temperature=algorithm.sampling.temperature,
            micro_batch_size=algorithm.micro_batch_size,
            micro_batch_tokens=algorithm.micro_batch_tokens,
            learning_rate=algorithm.learning_rate,
            lr_schedule=algorithm.lr_schedule,
            min_learning_rate=algorithm.min_learning_rate,
            max_steps=algorithm.max_steps,
        )

    def learning_rate_at(self, version: int) -> float | None:
        """The rate of the step from ``version`` to ``version + 1`` (``spec.algorithm.lrSchedule``).

        With ``s = min(version / maxSteps, 1)``: Constant ``lr``; Linear ``lr − (lr − min)·s``;
        Cosine ``min + (lr − min)·(1 + cos(π·s))/2``. The first step runs at ``lr``; a step past
        ``maxSteps`` (a run extended with ``--max-steps``) stays at ``min``.
        """
        if self.learning_rate is None:
            return None
        peak, floor = self.learning_rate, self.min_learning_rate
        progress = min(max(version, 0) / max(self.max_steps, 1), 1.0)
        if self.lr_schedule == "Constant":
            return peak
        if self.lr_schedule == "Linear":
            return peak - (peak - floor) * progress
        if self.lr_schedule == "Cosine":
            return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        raise ValueError(f"lrSchedule: expected Constant, Linear or Cosine, got {self.lr_schedule!r}")


@dataclasses.dataclass(frozen=True)
class Dropped:
    """A group the staleness rule refused at this version."""

    group_id: str
    admission: staleness.Admission


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one optimizer step consumes (pure data; the same on every rank)."""

    version: int
    """``t``: the step turns it into ``t + 1``."""
    slots: tuple[Slot, ...]
    """The admitted rollouts with their advantages, group by group."""
    dropped: tuple[Dropped, ...]
    groups: int
    weighted_groups: int
    max_staleness: int | None
    reward_mean: float | None
    total_tokens: int
    """Model tokens of the admitted rollouts (an environment's tokens are not in the loss)."""
    backends: tuple[str, ...]
    """Backend names of the admitted rollouts, sorted (fixes the layout of the mismatch metrics)."""
    workers: tuple[tuple[str, int], ...] = ()
    """``(worker id, rollouts)`` of the admitted groups, sorted: whose rollouts this step trains on."""
    group_sizes: tuple[int, ...] = ()
    """Rollouts per admitted group, in slot order (the groups' advantages are recomputed from it when
    the KL is in the reward)."""
    zero_signal_groups: int = 0
    """Admitted groups whose rewards were all equal: GRPO and RLOO give them no gradient."""
    masked_rollouts: int = 0
    """Admitted rollouts left out of the loss (``overlong.maskTruncated``)."""
    reward_kl: float | None = None
    """With the KL in the reward: the mean over rollouts of ``Σ_t k_t`` (before β)."""


GRPO = Objective()
"""The default objective (the ``GRPO`` preset)."""


def plan_step(batch: Batch, policy: staleness.StalenessPolicy, objective: Objective = GRPO) -> Plan:
    """Admit the groups of ``batch`` at ``batch.version`` with the staleness rule; shape the rewards
    (overlong penalty) and compute advantages with the objective's estimator."""
    o = objective
    admitted: list[tuple[Group, staleness.Admission]] = []
    dropped: list[Dropped] = []
    per_worker: dict[str, int] = {}
    weighted = 0
    max_seen: int | None = None
    for group in batch.groups:
        verdict = staleness.admit(group.policy_version, batch.version, policy)
        if not verdict.consume:
            dropped.append(Dropped(group.id, verdict))
            continue
        admitted.append((group, verdict))
        weighted += verdict.importance_weighted
        max_seen = verdict.staleness if max_seen is None else max(max_seen, verdict.staleness)
        per_worker[group.worker] = per_worker.get(group.worker, 0) + len(group.rollouts)
    task_rewards = [[r.reward for r in g.rollouts] for g, _ in admitted]
    shaped = [
        [
            r.reward
            + loss.overlong_penalty(r.model_tokens, o.length_budget, o.overlong_buffer, o.overlong_penalty)
            for r in g.rollouts
        ]
        for g, _ in admitted
    ]
    lengths = [[r.model_tokens for r in g.rollouts] for g, _ in admitted]
    values = (
        loss.advantages(shaped, o.advantage_estimator, o.reward_scaling, lengths=lengths) if admitted else []
    )
    slots: list[Slot] = []
    for (group, verdict), advantages, rewards in zip(admitted, values, shaped, strict=True):
        slots.extend(
            Slot(
                rollout=r,
                advantage=float(a),
                decoupled=verdict.importance_weighted,
                masked=o.mask_truncated and r.finish_reason == "length",
                reward=reward,
            )
            for r, a, reward in zip(group.rollouts, advantages, rewards, strict=True)
        )
    flat = [r for rewards in task_rewards for r in rewards]
    return Plan(
        version=batch.version,
        slots=tuple(slots),
        dropped=tuple(dropped),
        groups=len(admitted),
        weighted_groups=weighted,
        max_staleness=max_seen,
        reward_mean=sum(flat) / len(flat) if flat else None,
        total_tokens=sum(s.rollout.model_tokens for s in slots if not s.masked),
        backends=tuple(sorted({s.rollout.backend for s in slots})),
        workers=tuple(sorted(per_worker.items())),
        group_sizes=tuple(len(g.rollouts) for g, _ in admitted),
        zero_signal_groups=sum(1 for rewards in shaped if all(r == rewards[0] for r in rewards)),
        masked_rollouts=sum(s.masked for s in slots),
    )


def with_reward_penalties(plan: Plan, penalties: Sequence[torch.Tensor], objective: Objective) -> Plan:
    """``plan`` with advantages recomputed after subtracting the per-token KL penalties from the rewards
    (``klPlacement: Reward``; :func:`echo_runtime.trainer.loss.advantages`). ``penalties[i]`` belongs to
    ``plan.slots[i]``, one value per model token."""
    if len(penalties) != len(plan.slots):
        raise ValueError(f"need one penalty vector per slot ({len(plan.slots)}), got {len(penalties)}")
    groups: list[list[Slot]] = []
    grouped: list[list[torch.Tensor]] = []
    at = 0
    for size in plan.group_sizes:
        groups.append(list(plan.slots[at : at + size]))
        grouped.append(list(penalties[at : at + size]))
        at += size
    values = loss.advantages(
        [[s.reward for s in g] for g in groups],
        objective.advantage_estimator,
        objective.reward_scaling,
        lengths=[[s.rollout.model_tokens for s in g] for g in groups],
        penalties=grouped,
    )
    slots: list[Slot] = []
    for group, advantages in zip(groups, values, strict=True):
        for slot, a in zip(group, advantages, strict=True):
            if isinstance(a, torch.Tensor):
                mean = float(a.mean()) if a.numel() else 0.0
                slots.append(dataclasses.replace(slot, advantage=mean, token_advantages=tuple(a.tolist())))
            else:
                slots.append(dataclasses.replace(slot, advantage=float(a)))
    beta = objective.kl_coef
    totals = [float(p.double().sum()) / beta for p in penalties] if beta > 0 else [0.0] * len(penalties)
    return dataclasses.replace(
        plan, slots=tuple(slots), reward_kl=sum(totals) / len(totals) if totals else None
    )


def make_optimizer(params: Sequence[torch.nn.Parameter], learning_rate: float) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (constants in the module docstring)."""
    return torch.optim.AdamW(
        params, lr=learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY
    )


@dataclasses.dataclass(frozen=True)
class BackendMismatch:
    """Behaviour log-probs a backend reported vs the trainer's recomputation, same tokens, same version."""

    sequences: int
    tokens: int
    mean_abs: float
    """Mean over tokens of ``|log μ − log π_θ|``."""
    max_abs: float
    kl_seq: float
    """Mean over sequences of ``Σ_t k3`` — an estimate of the sequence-level ``KL(μ ‖ π_θ)``."""


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step did (the same on every rank)."""

    version: int
    """The new version ``t + 1``."""
    loss: float
    kl: float | None
    """Token-weighted mean k3 ``KL(π_θ ‖ π_ref)``; None without a KL penalty."""
    clip_fraction: float
    """Fraction of completion tokens where PPO's clip was active."""
    truncated_fraction: float
    """Fraction of completion tokens whose importance weight was truncated at the cap."""
    importance_weight_mean: float
    """Mean over tokens of ``ρ = π_θ / μ`` before truncation."""
    importance_weight_max: float
    reward_mean: float | None
    grad_norm: float
    """Gradient norm before clipping."""
    groups: int
    rollouts: int
    tokens: int
    dropped_groups: int
    weighted_groups: int
    max_staleness: int | None
    mismatch: dict[str, BackendMismatch]
    """Per backend; only backends with rollouts at the trainer's current version appear."""
    seconds: float
    learning_rate: float | None = None
    """The rate this step ran at (``lrSchedule``); None when the caller manages the optimizer's rate."""
    workers: dict[str, int] = dataclasses.field(default_factory=dict)
    """Rollouts trained on, per worker id."""
    clip_fraction_low: float = 0.0
    """Fraction of completion tokens where the lower clip was active (``A < 0``, ratio below ``1 − ε_low``;
    for CISPO: weight at its lower bound)."""
    clip_fraction_high: float = 0.0
    """Fraction where the upper clip was active (``A > 0``, ratio above ``1 + ε_high``; CISPO: at its upper
    bound)."""
    dual_clip_fraction: float = 0.0
    """Fraction where dual clip was active."""
    entropy: float = 0.0
    """Mean over completion tokens of the policy's entropy ``H(π_θ(·|context))`` at the sampling temperature."""
    rejected_fraction: float = 0.0
    """Fraction of completion tokens masked by ``rolloutCorrection.rejection``."""
    zero_signal_groups: int = 0
    """Groups whose rewards were all equal (no signal for GRPO and RLOO)."""
    masked_rollouts: int = 0
    """Rollouts left out of the loss because the length budget cut them (``overlong.maskTruncated``)."""
    reward_kl: float | None = None
    """With the KL in the reward: mean over rollouts of ``Σ_t k_t`` to the reference (before β)."""
    padding_fraction: float = 0.0
    """Of the token positions the step's forward passes computed (every rank's micro-batches, rows
    times their longest prompt plus longest completion), the share that held no rollout's token:
    padding, and the fillers that keep ranks in step. ``microBatchTokens`` lowers it."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Collective:
    """How a step combines numbers across data-parallel ranks; this base is the single-process case."""

    world_size: int = 1
    rank: int = 0

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def max(self, values: torch.Tensor) -> torch.Tensor:
        return values


SINGLE = Collective()

# Layout of the summed metrics vector (per step) and of the per-backend part.
_LOSS, _KL, _CLIPPED, _TRUNCATED, _RATIO, _TOKENS, _ROLLOUTS, _LOW, _HIGH, _DUAL, _ENTROPY, _REJECTED = range(
    12
)
_MEASURED = 12
"""The sums :func:`_accumulate` reads off the micro-batch's tensors; then the layout's own counts."""
_CELLS, _PADDING = 12, 13
_SUMS = 14
_M_TOKENS, _M_ABS, _M_SEQS, _M_KL = range(4)


def train_step(
    policy: TrainablePolicy,
    optimizer: torch.optim.Optimizer,
    plan: Plan,
    config: StepConfig,
    *,
    module: torch.nn.Module | None = None,
    collective: Collective = SINGLE,
    shard: Callable[[Sequence[Slot], int, int], list[Slot]] | None = None,
) -> StepMetrics:
    """One optimizer step over ``plan`` (see the module docstring); returns the global metrics.

    ``module`` is what runs the forward pass: ``policy.model`` itself (sharded in place by FSDP, which
    reduce-scatters each micro-batch's gradients), or its DDP wrapper (whose ``no_sync`` then defers the
    gradient all-reduce to the last micro-batch). ``shard`` picks this rank's
    slots (:func:`echo_runtime.trainer.batch.shard`); without it the rank processes every slot.
    """
    if not plan.slots:
        raise ValueError(f"nothing to train on at version {plan.version}: every group was dropped")
    started = time.perf_counter()
    o = config.objective
    net = module if module is not None else policy.model
    world = collective.world_size
    if o.kl_placement == "Reward" and o.kl_coef > 0:
        plan = with_reward_penalties(plan, _reward_penalties(policy, plan, config, collective, shard), o)
    chunks = _chunks(plan.slots, config, collective, shard)
    device = policy.device
    index = {name: i for i, name in enumerate(plan.backends)}
    sums = torch.zeros(_SUMS, dtype=torch.float64)
    per_backend = torch.zeros(len(plan.backends), 4, dtype=torch.float64)
    maxima = torch.full((1 + len(plan.backends),), -math.inf, dtype=torch.float64)
    total_sequences = max(1, sum(not s.masked for s in plan.slots))
    total_tokens = max(1, plan.total_tokens)
    kl_in_loss = o.kl_coef > 0 and o.kl_placement == "Loss"
    optimizer.zero_grad(set_to_none=True)
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        packed = pack([s.rollout for s in chunk], policy.pad_id, device)
        cells = padded_tokens([s.rollout for s in chunk])
        sums[_CELLS] += cells
        sums[_PADDING] += cells - real_tokens([s.rollout for s in chunk if not s.filler])
        live = torch.tensor([0.0 if s.filler or s.masked else 1.0 for s in chunk], device=device).unsqueeze(1)
        weights = (
            loss.token_weights(
                packed.mask, o.loss_aggregation, total_tokens, total_sequences, o.length_budget
            )
            * live
        )
        advantages = _advantages(chunk, packed, device)
        decoupled = torch.tensor([s.decoupled for s in chunk], dtype=torch.bool, device=device)
        ref = policy.reference_logprobs(packed, config.temperature) if kl_in_loss else None
        with _maybe_no_sync(net, last):
            logp, entropy = completion_logprobs_entropy(net, packed, config.temperature)
            out = loss.policy_objective(
                logp,
                packed.behaviour,
                advantages,
                weights,
                o,
                mask=packed.mask,
                ref_logprobs=ref,
                decoupled=decoupled,
                entropy=entropy if o.entropy_coef > 0 else None,
            )
            torch.autograd.backward(out.loss * world)
        _accumulate(
            sums,
            per_backend,
            maxima,
            out,
            packed,
            logp.detach(),
            entropy.detach(),
            live,
            weights,
            chunk,
            index,
            plan.version,
        )
    params = policy.trainable_parameters()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
    if hasattr(grad_norm, "full_tensor"):  # FSDP's sharded gradients: the norm is a replicated DTensor
        grad_norm = grad_norm.full_tensor()
    rate = config.learning_rate_at(plan.version)
    if rate is not None:
        for group in optimizer.param_groups:
            group["lr"] = rate
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sums = collective.sum(sums)
    per_backend = collective.sum(per_backend)
    maxima = collective.max(maxima)
    metrics = _metrics(
        plan, sums, per_backend, maxima, float(grad_norm), config, time.perf_counter() - started
    )
    return dataclasses.replace(metrics, learning_rate=rate)


def _chunks(
    slots: Sequence[Slot],
    config: StepConfig,
    collective: Collective,
    shard: Callable[[Sequence[Slot], int, int], list[Slot]] | None,
) -> list[list[Slot]]:
    """This rank's micro-batches: by token budget when ``config`` has one, else ``micro_batch_size``
    slots of its shard. Every rank gets as many as the others (fillers where it runs short)."""
    rank, world = (collective.rank, collective.world_size) if shard is not None else (0, 1)
    if config.micro_batch_tokens is not None:
        return by_tokens(slots, config.micro_batch_tokens, rank, world)
    mine = shard(slots, rank, world) if shard is not None else list(slots)
    return micro_batches(mine, config.micro_batch_size)


def _advantages(chunk: Sequence[Slot], packed: Packed, device: torch.device) -> torch.Tensor:
    """``[rows]`` per-rollout advantages, or ``[rows, completion]`` when some slot has one per token."""
    per_rollout = torch.tensor([s.advantage for s in chunk], dtype=torch.float32, device=device)
    if all(s.token_advantages is None for s in chunk):
        return per_rollout
    table = per_rollout.unsqueeze(1).expand_as(packed.mask).clone()
    for row, slot in enumerate(chunk):
        if slot.token_advantages is not None:
            where = packed.mask[row].bool()
            values = torch.tensor(slot.token_advantages, dtype=torch.float32, device=device)
            table[row] = table[row].masked_scatter(where, values)
    return table


def _reward_penalties(
    policy: TrainablePolicy,
    plan: Plan,
    config: StepConfig,
    collective: Collective,
    shard: Callable[[Sequence[Slot], int, int], list[Slot]] | None,
) -> list[torch.Tensor]:
    """``β k_t`` per model token of every slot: the trainer's own log-probs at this version (``π_old``,
    never the worker's) against the reference's, each rank its share, summed over ranks."""
    o = config.objective
    n = len(plan.slots)
    width = max(1, max(s.rollout.model_tokens for s in plan.slots))
    table = torch.zeros(n, width, dtype=torch.float64)
    where = {id(slot): i for i, slot in enumerate(plan.slots)}  # fillers are copies: not in it
    device = policy.device
    with torch.no_grad():
        # The step's own micro-batches: under FSDP every rank must run as many forwards as the others.
        for chunk in _chunks(plan.slots, config, collective, shard):
            packed = pack([s.rollout for s in chunk], policy.pad_id, device)
            own = completion_logprobs(policy.model, packed, config.temperature)
            ref = policy.reference_logprobs(packed, config.temperature)
            penalty = (o.kl_coef * loss.kl_penalty(own, ref, o.kl_estimator)).double().cpu()
            mask = packed.mask.bool().cpu()
            for row, slot in enumerate(chunk):
                i = where.get(id(slot))
                if slot.filler or i is None:
                    continue
                values = penalty[row][mask[row]]
                table[i, : values.numel()] = values
    table = collective.sum(table)
    return [table[i, : plan.slots[i].rollout.model_tokens] for i in range(n)]


@contextlib.contextmanager
def _maybe_no_sync(module: torch.nn.Module, last: bool) -> Iterator[None]:
    no_sync = getattr(module, "no_sync", None)
    if last or no_sync is None:
        yield
    else:
        with no_sync():
            yield


def _accumulate(
    sums: torch.Tensor,
    per_backend: torch.Tensor,
    maxima: torch.Tensor,
    out: loss.PolicyObjective,
    packed: Packed,
    logp: torch.Tensor,
    entropy: torch.Tensor,
    live: torch.Tensor,
    weights: torch.Tensor,
    chunk: Sequence[Slot],
    index: dict[str, int],
    version: int,
) -> None:
    """Add one micro-batch's statistics (one device-to-host copy per micro-batch)."""
    mask = (packed.mask * live).bool()
    ratio = out.surrogate.ratio.masked_fill(~mask, 0.0)
    delta = (packed.behaviour - logp).abs().masked_fill(~mask, 0.0)
    k3 = loss.kl_k3(packed.behaviour, logp).masked_fill(~mask, 0.0)  # KL(μ ‖ π_θ) per token, sampled from μ
    kl = (out.kl * weights).sum() if out.kl is not None else torch.zeros((), device=logp.device)
    sur = out.surrogate
    none = torch.zeros_like(mask)

    def count(flags: torch.Tensor | None) -> torch.Tensor:
        return ((flags if flags is not None else none) & mask).sum()

    scalars = torch.stack(
        [
            out.loss.detach(),
            kl,
            count(sur.clipped),
            count(sur.truncated),
            ratio.sum(),
            mask.sum(),
            live.sum(),
            count(sur.clipped_low),
            count(sur.clipped_high),
            count(sur.dual_clipped),
            entropy.masked_fill(~mask, 0.0).sum(),
            count(~out.kept),
            ratio.max(),
        ]
    ).double()
    rows = torch.stack([mask.sum(1), delta.sum(1), k3.sum(1), delta.max(1).values], dim=1).double()
    host = torch.cat([scalars, rows.flatten()]).cpu()
    sums[:_MEASURED] += host[:_MEASURED]
    maxima[0] = max(float(maxima[0]), float(host[_MEASURED]))
    first = _MEASURED + 1
    for row, slot in enumerate(chunk):
        if slot.filler or slot.masked or slot.rollout.policy_version != version:
            continue
        tokens, abs_sum, kl_sum, abs_max = host[first + 4 * row : first + 4 + 4 * row].tolist()
        b = index[slot.rollout.backend]
        per_backend[b, _M_TOKENS] += tokens
        per_backend[b, _M_ABS] += abs_sum
        per_backend[b, _M_SEQS] += 1.0
        per_backend[b, _M_KL] += kl_sum
        maxima[1 + b] = max(float(maxima[1 + b]), abs_max)


def _metrics(
    plan: Plan,
    sums: torch.Tensor,
    per_backend: torch.Tensor,
    maxima: torch.Tensor,
    grad_norm: float,
    config: StepConfig,
    seconds: float,
) -> StepMetrics:
    tokens = max(1.0, float(sums[_TOKENS]))
    mismatch = {
        name: BackendMismatch(
            sequences=int(per_backend[b, _M_SEQS]),
            tokens=int(per_backend[b, _M_TOKENS]),
            mean_abs=float(per_backend[b, _M_ABS]) / float(per_backend[b, _M_TOKENS]),
            max_abs=float(maxima[1 + b]),
            kl_seq=float(per_backend[b, _M_KL]) / float(per_backend[b, _M_SEQS]),
        )
        for name, b in ((n, i) for i, n in enumerate(plan.backends))
        if per_backend[b, _M_SEQS] > 0
    }
    return StepMetrics(
        version=plan.version + 1,
        loss=float(sums[_LOSS]),
        kl=float(sums[_KL])
        if config.objective.kl_coef > 0 and config.objective.kl_placement == "Loss"
        else None,
        clip_fraction=float(sums[_CLIPPED]) / tokens,
        truncated_fraction=float(sums[_TRUNCATED]) / tokens,
        importance_weight_mean=float(sums[_RATIO]) / tokens,
        importance_weight_max=float(maxima[0]),
        reward_mean=plan.reward_mean,
        grad_norm=grad_norm,
        groups=plan.groups,
        rollouts=int(sums[_ROLLOUTS]),
        tokens=int(sums[_TOKENS]),
        dropped_groups=len(plan.dropped),
        weighted_groups=plan.weighted_groups,
        max_staleness=plan.max_staleness,
        mismatch=mismatch,
        seconds=seconds,
        workers=dict(plan.workers),
        clip_fraction_low=float(sums[_LOW]) / tokens,
        clip_fraction_high=float(sums[_HIGH]) / tokens,
        dual_clip_fraction=float(sums[_DUAL]) / tokens,
        entropy=float(sums[_ENTROPY]) / tokens,
        rejected_fraction=float(sums[_REJECTED]) / tokens,
        padding_fraction=float(sums[_PADDING]) / max(1.0, float(sums[_CELLS])),
        zero_signal_groups=plan.zero_signal_groups,
        masked_rollouts=plan.masked_rollouts,
        reward_kl=plan.reward_kl,
    )
