"""The RL objectives as pure torch functions: advantages, policy losses, KL and entropy terms, averaging.

Notation, per completion token ``o_t`` of rollout ``i`` (prompt ``q``, group of ``n`` rollouts):

* ``π_θ`` — the policy being trained; gradients flow through its log-probs ``log π_θ(o_t | q, o_<t)``.
* ``μ`` — the *behaviour* policy: the backend and policy version that sampled the token. Its log-probs
  travel with the rollout (``Rollout.logprobs``); they are constants here.
* ``π_ref`` — the reference policy (the base model) of the optional KL term.
* ``ρ_t = π_θ / μ`` — the importance ratio to the behaviour policy; ``A_i`` — the rollout's advantage,
  shared by all of its tokens (outcome supervision) unless an estimator gives one per token.

Which variant applies is the resolved :class:`~echo_runtime.spec.objectives.Objective` of the manifest's
``spec.algorithm`` (a preset, overridable field by field). Each function below implements one equation
and cites it; docs/algorithms.md maps every option to verl's and TRL's keys.

1. **Advantages** (:func:`advantages`):

   * ``GRPO`` — Shao et al. 2024 (DeepSeekMath), §4.1.2: ``A_i = r_i − mean(r)`` over the group, divided
     by the group's std (``rewardScaling: Group``, Bessel-corrected as TRL's and verl's, ``+ 1e-6``), by
     the std of every reward in the batch (``Batch``, TRL's ``scale_rewards="batch"``) or by nothing
     (``Off``: Dr. GRPO, Liu et al. 2025 §3.2, who show the std biases towards too easy and too hard
     questions). A group whose rewards are all equal gets *exactly* zero advantages, never NaN: such a
     group is detected by comparing the rewards themselves, not by the size of ``std``, because for a
     reward float arithmetic cannot represent (0.1, say) the computed mean is an ulp away from it, the
     std is ~1e-8 rather than 0, and ``(r − mean)/(std + eps)`` would hand every rollout of the group
     the same spurious ≈ −0.0074.
   * ``RLOO`` — Ahmadian et al. 2024 ("Back to Basics", eq. 9): the baseline of rollout ``i`` is the mean
     of the *other* ``n − 1``, ``A_i = r_i − (Σ_j r_j − r_i)/(n − 1) = n/(n − 1) · (r_i − mean(r))``.
   * ``REINFORCEPP`` — Hu 2025 (REINFORCE++, §3.2–3.3): no baseline; the return of token ``t`` is the
     reward minus the KL penalties of the tokens from ``t`` on (``klPlacement: Reward``),
     ``G_t = r_i − β Σ_{s ≥ t} k_s``, normalised over *every token of the batch*:
     ``A_t = (G_t − mean) / sqrt(var + 1e-8)`` with the token-weighted mean and Bessel-corrected
     variance (verl's ``masked_whiten``). ``REINFORCEPPBaseline`` (REINFORCE++-baseline, same paper)
     subtracts the group mean of the rewards first.

2. **Policy losses** (:func:`clipped_surrogate`, :func:`gspo_surrogate`, :func:`cispo_surrogate`):

   * ``PPO`` — the PPO-clip objective of Schulman et al. 2017 (eq. 7) on the ratio to the behaviour
     log-probs with *asymmetric* bounds (DAPO's clip-higher, Yu et al. 2025 eq. 10:
     ``clip(ρ, 1 − ε_low, 1 + ε_high)``), whose *unclipped* branch is weighted by a truncated importance
     weight ``min(ρ, C)`` (Espeholt et al. 2018, IMPALA, the V-trace ``ρ̄``; Yao et al. 2025, truncated
     importance sampling)::

         ℓ_t = − sg[min(1, C / ρ_t)] · min(ρ_t A, clip(ρ_t, 1−ε_low, 1+ε_high) A)        (sg = stop-gradient)
         ∇ℓ_t = − 1[clip inactive] · min(ρ_t, C) · A · ∇ log π_θ(o_t)

     The clip decides *whether* a token contributes (a token the policy already moved past the band in
     the direction of its advantage gives no gradient), the cap decides *how much* (no token's weight
     exceeds ``C``). PPO-clip leaves exactly one branch unbounded — ``A < 0`` with ``ρ ≫ 1`` — and the
     cap truncates it at ``C · A`` while keeping its gradient. **Dual clip** (Ye et al. 2020, "Mastering
     Complex Control in MOBA Games", eq. 5; verl's ``clip_ratio_c``) instead bounds that branch at
     ``c · A`` *without* gradient: for ``A < 0`` and ``ρ > c``, ``ℓ_t = − sg[min(1, C/ρ)] · c · A``.
   * **Decoupled** (``staleAction: ImportanceWeight`` and staleness > 0, as
     :func:`echo_runtime.staleness.admit` decides; every group with ``rolloutCorrection.level:
     Sequence``): the objective of Hilton et al. 2022 (§3, "Batch size-invariance for policy
     optimization"). The proximal policy is the trainer's policy before this step, ``π_prox = sg(π_θ)``;
     the gap from the behaviour policy (staleness and backend mismatch together) is corrected by a
     truncated weight ``w = min(π_prox/μ, C)``, and the clip applies to ``π_θ/π_prox``, which is 1 where we
     evaluate it (one optimizer step per batch)::

         ℓ_t = − w · min(r_t A, clip(r_t) A),  r_t = π_θ / sg(π_θ),   ∇ℓ_t = − w · A · ∇ log π_θ(o_t)

     ``w`` is per token (``level: Token``, ``min(ρ_t, C)``) or per sequence (``level: Sequence``,
     ``min(Π_t ρ_t, C)``: sequence-level truncated IS, computed in log space).
   * ``GSPO`` — Zheng et al. 2025 (Group Sequence Policy Optimization, eq. 5–7): the ratio of a sequence
     is the geometric mean of its token ratios, ``s_i = exp((1/|o_i|) Σ_t log ρ_t)``, clipped *per
     sequence* (``clip(s_i, 1 − ε_low, 1 + ε_high)``). Implemented in its token form (GSPO-token, eq. 13):
     ``s_{i,t} = sg[s_i] · π_θ(o_t)/sg[π_θ(o_t)]``, which has the value ``s_i`` and, averaged over a
     sequence's tokens (``SequenceMeanTokenMean``), exactly GSPO's gradient
     ``s_i A_i (1/|o_i|) Σ_t ∇ log π_θ(o_t)``. The cap and dual clip act on ``s_i``; decoupled groups are
     weighted by ``min(s_i, C)``.
   * ``CISPO`` — MiniMax 2025 (MiniMax-M1, §3.1 eq. 4–5): REINFORCE with a clipped, stop-gradient
     importance weight, ``ℓ_t = − sg[clip(ρ_t, 1 − ε_low, 1 + ε_high)] · A · log π_θ(o_t)`` (its value is
     reported as ``− sg[clip(ρ_t)] · A``, the gradient is the paper's). No token loses its gradient: a
     token whose ratio left the band keeps the weight at the bound. Its weight already corrects the gap
     from ``μ``, so the decoupled form is the same objective, and ``C`` is not used.

3. **Rejection** (:func:`rejection_keep`; IcePop, Ling team 2025, "Every Step Evolves" §3 — masking
   tokens whose ratio ``π_train/π_infer`` leaves ``[α, β] = [0.5, 5]``; verl's rollout rejection sampling):
   tokens (``Token``) or whole sequences (``Sequence``, by the geometric mean of their ratios) whose
   ratio ``π_θ/μ`` lies outside ``[low, high]`` get loss 0; they keep their place in the averaging.
4. **KL** (:func:`kl_penalty`), of ``π_θ`` to ``π_ref`` per token with ``δ = log π_ref − log π_θ`` (Schulman
   2020, "Approximating KL Divergence"): ``k1 = −δ``, ``k2 = δ²/2``, ``k3 = e^δ − 1 − δ``, and ``LowVarKL``:
   k3 with ``δ`` clamped to ±20 and the result to ±10 (verl's ``low_var_kl``). In the loss as ``β · k``
   (DeepSeekMath eq. 3–4), or in the reward (:func:`advantages`; REINFORCE++).
5. **Entropy**: ``− coef · H_t`` per token, ``H_t`` the entropy of ``π_θ(·|q, o_<t)`` at the sampling
   temperature (:func:`echo_runtime.backends.logprobs.token_logprobs_entropy`).
6. **Averaging** (:func:`token_weights`): ``TokenMean`` divides the sum of token losses by the number of
   completion tokens in the whole batch (DAPO §3.3; verl's ``token-mean``); ``SequenceMeanTokenMean``
   averages each rollout's tokens, then the rollouts (DeepSeekMath eq. 3; GSPO eq. 5);
   ``SequenceMeanTokenSum`` sums each rollout's tokens, then averages the rollouts (RLOO: the completion
   is one action); ``SequenceMeanTokenSumNorm`` divides each rollout's sum by a constant length, the
   generation budget, then averages (Dr. GRPO §3.2; TRL's ``dr_grpo``). Either way a token's weight is
   fixed by the *whole* batch, so the loss is a plain sum over tokens and splitting the batch into
   micro-batches or ranks changes nothing but the order of additions.

Invariants the tests check: GRPO and RLOO advantages of a group sum to 0; the PPO surrogate's gradient
with respect to the log-prob is exactly ``−1[clip inactive] · min(ρ, C) · A`` (``−w · A`` when
decoupled); CISPO's is ``−clip(ρ) · A`` on every token; GSPO's sequence ratio is the geometric mean of its
token ratios; TokenMean and SequenceMeanTokenMean weights of a batch sum to 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from echo_runtime.spec.objectives import Objective

ADVANTAGE_EPS = 1e-6
"""``eps`` of the advantage denominator ``std(r) + eps``."""
WHITEN_EPS = 1e-8
"""``eps`` of REINFORCE++'s batch normalisation ``(G − mean) / sqrt(var + eps)`` (verl's ``masked_whiten``)."""


# --------------------------------------------------------------------------------------- advantages
def group_advantages(rewards: torch.Tensor, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """GRPO advantages ``(r − mean(r)) / (std(r) + eps)`` per group (DeepSeekMath §4.1.2).

    ``rewards`` has shape ``[groups, n]`` (``n ≥ 2`` rollouts of one prompt per row); the result has the
    same shape, in float32. ``std`` is the sample (Bessel-corrected) standard deviation.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must have shape [groups, n] with n ≥ 2, got {tuple(rewards.shape)}")
    groups = [row for row in rewards.to(torch.float64)]
    out = advantages(groups, "GRPO", "Group", eps=eps)
    return torch.stack([torch.as_tensor(a, dtype=torch.float64) for a in out]).to(torch.float32)


def advantages(
    rewards: Sequence[torch.Tensor | Sequence[float]],
    estimator: str = "GRPO",
    scaling: str = "Group",
    *,
    lengths: Sequence[Sequence[int]] | None = None,
    penalties: Sequence[Sequence[torch.Tensor]] | None = None,
    eps: float = ADVANTAGE_EPS,
) -> list[list[float | torch.Tensor]]:
    """Advantages of a batch of groups (decision 1 of the module docstring).

    ``rewards[g]`` holds the rewards of group ``g`` (``n ≥ 2`` each; groups may differ in size).
    ``lengths[g][i]`` is the number of loss tokens of rollout ``i`` (needed by the REINFORCE++
    estimators, whose normalisation is over tokens). ``penalties[g][i]``, when given, is the per-token KL
    penalty ``β k_t`` of rollout ``i`` (``klPlacement: Reward``): GRPO and RLOO subtract its sum from the
    reward, the REINFORCE++ estimators its suffix sums from each token's return.

    Returns, per group, a list of floats (one advantage per rollout) — or, for the REINFORCE++ estimators
    with penalties, a list of float64 tensors (one advantage per token).
    """
    if estimator not in ("GRPO", "RLOO", "REINFORCEPP", "REINFORCEPPBaseline"):
        raise ValueError(
            f"advantageEstimator: expected GRPO, RLOO, REINFORCEPP or REINFORCEPPBaseline, got {estimator!r}"
        )
    if scaling not in ("Group", "Batch", "Off"):
        raise ValueError(f"rewardScaling: expected Group, Batch or Off, got {scaling!r}")
    rows = [torch.as_tensor(r, dtype=torch.float64).reshape(-1) for r in rewards]
    for g, r in enumerate(rows):
        if r.numel() < 2:
            raise ValueError(f"group {g}: need n ≥ 2 rollouts for a group baseline, got {r.numel()}")
    if penalties is not None and estimator in ("GRPO", "RLOO"):
        rows = [
            r - torch.tensor([float(p.double().sum()) for p in pen], dtype=torch.float64)
            for r, pen in zip(rows, penalties, strict=True)
        ]
    if estimator.startswith("REINFORCEPP"):
        return _reinforce_pp(rows, estimator == "REINFORCEPPBaseline", lengths, penalties)
    out: list[list[float | torch.Tensor]] = []
    batch_std = torch.cat(rows).std(unbiased=True) if scaling == "Batch" else None
    for r in rows:
        n = r.numel()
        centred = r - r.mean()
        if estimator == "RLOO":
            centred = centred * (n / (n - 1))
        if scaling == "Group":
            centred = centred / (r.std(unbiased=True) + eps)
        elif batch_std is not None:
            centred = centred / (batch_std + eps)
        equal = bool((r == r[0]).all())
        out.append([0.0] * n if equal else centred.tolist())
    return out


def _reinforce_pp(
    rows: list[torch.Tensor],
    baseline: bool,
    lengths: Sequence[Sequence[int]] | None,
    penalties: Sequence[Sequence[torch.Tensor]] | None,
) -> list[list[float | torch.Tensor]]:
    """REINFORCE++ (Hu 2025 §3.2–3.3): token returns normalised over every token of the batch."""
    if lengths is None:
        raise ValueError("the REINFORCE++ estimators need the token count of every rollout (lengths)")
    returns: list[list[torch.Tensor]] = []
    for g, r in enumerate(rows):
        base = r - r.mean() if baseline else r
        if baseline and bool((r == r[0]).all()):
            base = torch.zeros_like(r)
        group: list[torch.Tensor] = []
        for i, value in enumerate(base.tolist()):
            length = int(lengths[g][i])
            if penalties is not None:
                pen = penalties[g][i].to(torch.float64).reshape(-1)
                if pen.numel() != length:
                    raise ValueError(f"group {g} rollout {i}: {pen.numel()} penalties for {length} tokens")
                suffix = pen.flip(0).cumsum(0).flip(0)  # Σ_{s ≥ t} β k_s
                group.append(value - suffix)
            else:
                group.append(torch.full((length,), value, dtype=torch.float64))
        returns.append(group)
    flat = torch.cat([t for group in returns for t in group])
    if flat.numel() < 2:
        raise ValueError("REINFORCE++ normalises over the batch's tokens: it needs at least 2")
    mean, var = flat.mean(), flat.var(unbiased=True)
    scale = torch.rsqrt(var + WHITEN_EPS)
    whitened = [[(t - mean) * scale for t in group] for group in returns]
    if penalties is not None:
        return [list(group) for group in whitened]
    return [[float(t[0]) if t.numel() else 0.0 for t in group] for group in whitened]


def overlong_penalty(length: int, budget: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, §3.4 eq. 13), scaled by ``factor``.

    ``0`` while ``length ≤ budget − buffer``; then falling linearly, ``−factor · (length − (budget −
    buffer)) / buffer``, to ``−factor`` at the budget; ``−factor`` beyond it. ``buffer = 0`` is off.
    """
    if buffer <= 0:
        return 0.0
    if buffer > budget:
        raise ValueError(f"overlong buffer ({buffer}) must not exceed the length budget ({budget})")
    excess = length - (budget - buffer)
    if excess <= 0:
        return 0.0
    return -factor * min(excess / buffer, 1.0)


# --------------------------------------------------------------------------------------- policy losses
@dataclasses.dataclass(frozen=True)
class Surrogate:
    """Per-token output of a policy loss; every tensor has the shape of the log-probs."""

    loss: torch.Tensor
    """``ℓ_t`` (differentiable through the policy's log-probs)."""
    ratio: torch.Tensor
    """``ρ_t = π_θ / μ`` (detached; may be ``inf`` for a token the behaviour policy found ~impossible)."""
    clipped: torch.Tensor
    """True where the clip is active and the token gives no gradient (low, high or dual)."""
    truncated: torch.Tensor
    """True where the token contributes and its weight was truncated (at C, or at CISPO's bounds)."""
    clipped_low: torch.Tensor | None = None
    """True where the lower clip is active (``A < 0``, ratio below ``1 − ε_low``)."""
    clipped_high: torch.Tensor | None = None
    """True where the upper clip is active (``A > 0``, ratio above ``1 + ε_high``)."""
    dual_clipped: torch.Tensor | None = None
    """True where dual clip is active (``A < 0``, ratio above ``c``)."""


def _log_bounds(clip_low: float, clip_high: float) -> tuple[float, float]:
    if clip_low <= 0 or clip_high <= 0:
        raise ValueError(f"clip ranges must be > 0, got low {clip_low}, high {clip_high}")
    log_low = math.log1p(-clip_low) if clip_low < 1 else -math.inf  # ε_low ≥ 1: ρ is never below 0
    return log_low, math.log1p(clip_high)


def _clipped(
    carrier: torch.Tensor,
    clip_log_ratio: torch.Tensor,
    weight_log_ratio: torch.Tensor,
    adv: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    cap: float,
    dual_clip: float | None,
    decoupled: torch.Tensor | None,
) -> Surrogate:
    """The clipped, truncated surrogate shared by PPO and GSPO (decision 2), in log space.

    ``carrier`` has value 0 and the gradient of ``log π_θ(o_t)``; ``clip_log_ratio`` (detached) is the log
    of the ratio the clip looks at (the token's, or GSPO's sequence ratio); ``weight_log_ratio`` the log of
    the decoupled rows' weight before truncation.
    """
    if cap < 1:
        raise ValueError(f"cap must be ≥ 1, got {cap}")
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual clip c must be > 1, got {dual_clip}")
    log_low, log_high = _log_bounds(clip_low, clip_high)
    d = clip_log_ratio
    coupled = (
        torch.ones_like(d, dtype=torch.bool) if decoupled is None else ~decoupled.to(torch.bool).expand_as(d)
    )
    high = (d > log_high) & (adv > 0) & coupled
    low = (d < log_low) & (adv < 0) & coupled
    if dual_clip is not None:
        dual = (d > math.log(dual_clip)) & (adv < 0) & coupled
    else:
        dual = torch.zeros_like(high)
    clipped = high | low
    log_cap = math.log(cap)
    log_w = torch.where(coupled, d, weight_log_ratio)
    # Contributing tokens: value min(ρ, C)·A, gradient min(ρ, C)·A·∇log π_θ (exp(carrier) is 1 with the
    # gradient of log π_θ).
    contributing = torch.exp(torch.clamp(log_w, max=log_cap)) * torch.exp(carrier) * adv
    # Clipped tokens: value sg[min(1, C/ρ)] · clip(ρ, 1−ε_low, 1+ε_high) · A, no gradient.
    shrink = torch.exp(torch.clamp(log_cap - d, max=0.0))
    clipped_value = (shrink * torch.exp(torch.clamp(d, min=log_low, max=log_high)) * adv).detach()
    loss = -torch.where(clipped, clipped_value, contributing)
    if dual_clip is not None:
        loss = torch.where(dual, -(shrink * dual_clip * adv).detach(), loss)
    stopped = clipped | dual
    return Surrogate(
        loss=loss,
        ratio=torch.exp(d),
        clipped=stopped,
        truncated=(~stopped) & (log_w > log_cap),
        clipped_low=low,
        clipped_high=high,
        dual_clipped=dual,
    )


def clipped_surrogate(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    cap: float,
    decoupled: torch.Tensor | None = None,
    *,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    sequence_weight: torch.Tensor | None = None,
) -> Surrogate:
    """PPO-clip on ``ρ = π_θ/μ`` with truncated weights ``min(ρ, C)`` (decision 2, ``PPO``).

    ``logprobs`` (of ``π_θ``, with gradients) and ``behaviour_logprobs`` (of ``μ``) have one shape, say
    ``[rollouts, tokens]``; ``advantages`` broadcasts against it (``[rollouts, 1]`` for outcome
    supervision). ``clip_range`` is ε_low (and ε_high unless ``clip_high`` is given), ``cap`` is C ≥ 1,
    ``dual_clip`` is c > 1 or None. ``decoupled`` (a bool tensor broadcasting against the log-probs, e.g.
    ``[rollouts, 1]``) selects the decoupled form; its weight is the token's ratio, or
    ``sequence_weight`` (``[rollouts, 1]``, the log of ``Π_t ρ_t``) for sequence-level IS.

    Computed in log space so that no ``exp`` overflows: a ratio of ``e^100`` still gives the finite,
    capped gradient ``C · A``.
    """
    if clip_range <= 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    log_ratio = logprobs - behaviour_logprobs.to(logprobs.dtype)
    d = log_ratio.detach()
    weight = d if sequence_weight is None else sequence_weight.to(d.dtype).expand_as(d)
    return _clipped(
        log_ratio - d,
        d,
        weight,
        advantages.to(logprobs.dtype),
        clip_low=clip_range,
        clip_high=clip_range if clip_high is None else clip_high,
        cap=cap,
        dual_clip=dual_clip,
        decoupled=decoupled,
    )


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, *, mean: bool) -> torch.Tensor:
    """``[rows, 1]``: the masked sum (``Π_t ρ_t`` in log space) or mean (GSPO's ``log s_i``) of ``log_ratio``.

    Padding may hold anything, even ``inf``: it is left out, not multiplied by 0.
    """
    m = mask.to(torch.bool)
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    total = torch.where(m, log_ratio, zero).sum(dim=1, keepdim=True)
    if not mean:
        return total
    return total / m.sum(dim=1, keepdim=True).clamp(min=1).to(log_ratio.dtype)


def gspo_surrogate(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    cap: float,
    dual_clip: float | None = None,
    decoupled: torch.Tensor | None = None,
) -> Surrogate:
    """GSPO in its token form (decision 2, ``GSPO``; Zheng et al. 2025 eq. 7 and 13).

    ``mask`` (``[rows, tokens]``, 1 on the tokens of the sequence) fixes ``|o_i|``. Every token of a row
    gets the row's clip decision; ``ratio`` holds ``s_i`` on every token of row ``i``.
    """
    log_ratio = logprobs - behaviour_logprobs.to(logprobs.dtype)
    d = log_ratio.detach()
    log_s = sequence_log_ratio(d, mask, mean=True).expand_as(d)
    zero = torch.zeros((), dtype=d.dtype, device=d.device)
    carrier = torch.where(mask.to(torch.bool), log_ratio - d, zero)
    return _clipped(
        carrier,
        log_s,
        log_s,
        advantages.to(logprobs.dtype),
        clip_low=clip_low,
        clip_high=clip_high,
        cap=cap,
        dual_clip=dual_clip,
        decoupled=decoupled,
    )


def cispo_surrogate(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> Surrogate:
    """CISPO (decision 2; MiniMax-M1 eq. 4–5): ``− sg[clip(ρ_t, 1 − ε_low, 1 + ε_high)] · A · log π_θ``.

    The value reported is ``− sg[clip(ρ_t)] · A``; the gradient, on every token, ``− clip(ρ_t) · A · ∇ log π_θ``.
    ``truncated`` marks the tokens whose weight sits at a bound (``clipped_low``/``clipped_high`` say which).
    """
    log_low, log_high = _log_bounds(clip_low, clip_high)
    log_ratio = logprobs - behaviour_logprobs.to(logprobs.dtype)
    d = log_ratio.detach()
    adv = advantages.to(logprobs.dtype)
    weight = torch.exp(torch.clamp(d, min=log_low, max=log_high))
    loss = -weight * torch.exp(log_ratio - d) * adv
    high = (d > log_high).expand_as(loss)
    low = (d < log_low).expand_as(loss)
    return Surrogate(
        loss=loss,
        ratio=torch.exp(d),
        clipped=torch.zeros_like(high),
        truncated=high | low,
        clipped_low=low,
        clipped_high=high,
        dual_clipped=torch.zeros_like(high),
    )


def rejection_keep(
    log_ratio: torch.Tensor, mask: torch.Tensor, level: str, low: float, high: float
) -> torch.Tensor:
    """Decision 3: True for the tokens whose ratio (``Token``) or sequence's geometric-mean ratio
    (``Sequence``) lies in ``[low, high]``; ``Off`` keeps everything. ``log_ratio`` is detached."""
    if level == "Off":
        return torch.ones_like(log_ratio, dtype=torch.bool)
    if not 0 < low <= 1 <= high:
        raise ValueError(f"rejection band must satisfy 0 < low ≤ 1 ≤ high, got [{low}, {high}]")
    lo, hi = math.log(low), math.log(high)
    if level == "Token":
        return (log_ratio >= lo) & (log_ratio <= hi)
    if level == "Sequence":
        g = sequence_log_ratio(log_ratio, mask, mean=True)
        return ((g >= lo) & (g <= hi)).expand_as(log_ratio)
    raise ValueError(f"rolloutCorrection.rejection: expected Off, Token or Sequence, got {level!r}")


# --------------------------------------------------------------------------------------- KL
def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of ``KL(π_θ ‖ π_ref)`` (decision 4); differentiable through ``logprobs``."""
    delta = ref_logprobs.to(logprobs.dtype) - logprobs
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta * delta
    if estimator == "k3":
        return torch.expm1(delta) - delta
    if estimator == "LowVarKL":
        clamped = torch.clamp(delta, min=-20.0, max=20.0)
        return torch.clamp(torch.expm1(clamped) - clamped, min=-10.0, max=10.0)
    raise ValueError(f"klEstimator: expected k1, k2, k3 or LowVarKL, got {estimator!r}")


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of ``KL(π_θ ‖ π_ref)`` (Schulman 2020): ``e^δ − 1 − δ``, ``δ = log π_ref − log π_θ``.

    Non-negative, zero where the two policies agree; differentiable through ``logprobs``.
    """
    return kl_penalty(logprobs, ref_logprobs, "k3")


# --------------------------------------------------------------------------------------- averaging
def token_weights(
    mask: torch.Tensor,
    normalization: str,
    total_tokens: int,
    total_sequences: int,
    constant: int | None = None,
) -> torch.Tensor:
    """The weight of each token in the batch loss, so that the loss is ``Σ_t weight_t · ℓ_t`` (decision 6).

    ``mask`` is ``[rollouts, tokens]`` (1 for a completion token, 0 for padding) of *part* of a batch (a
    micro-batch on one rank); ``total_tokens`` and ``total_sequences`` count the *whole* batch, over all
    micro-batches and ranks; ``constant`` is ``SequenceMeanTokenSumNorm``'s length. ``TokenMean``:
    ``1 / total_tokens``; ``SequenceMeanTokenMean``: ``1 / (|o_i| · total_sequences)``;
    ``SequenceMeanTokenSum``: ``1 / total_sequences``; ``SequenceMeanTokenSumNorm``:
    ``1 / (constant · total_sequences)``.
    """
    mode = normalization
    m = mask.to(torch.float32)
    if mode == "TokenMean":
        if total_tokens <= 0:
            raise ValueError(f"total_tokens must be > 0, got {total_tokens}")
        return m / total_tokens
    if mode not in ("SequenceMeanTokenMean", "SequenceMeanTokenSum", "SequenceMeanTokenSumNorm"):
        raise ValueError(
            "lossAggregation: expected TokenMean, SequenceMeanTokenMean, SequenceMeanTokenSum or "
            f"SequenceMeanTokenSumNorm, got {normalization!r}"
        )
    if total_sequences <= 0:
        raise ValueError(f"total_sequences must be > 0, got {total_sequences}")
    if mode == "SequenceMeanTokenMean":
        lengths = m.sum(dim=1, keepdim=True).clamp(min=1.0)
        return m / (lengths * total_sequences)
    if mode == "SequenceMeanTokenSum":
        return m / total_sequences
    if constant is None or constant <= 0:
        raise ValueError(f"SequenceMeanTokenSumNorm needs a constant length > 0, got {constant}")
    return m / (constant * total_sequences)


# --------------------------------------------------------------------------------------- the objective
@dataclasses.dataclass(frozen=True)
class PolicyObjective:
    """The weighted loss of part of a batch and its per-token parts (for metrics)."""

    loss: torch.Tensor
    """Scalar ``Σ_t w_t · keep_t · (ℓ_t + β · k_t − coef · H_t)``; summing it over the parts of a batch gives
    the batch loss."""
    surrogate: Surrogate
    kl: torch.Tensor | None
    """Per-token KL estimate to the reference (detached), or None without a reference in the loss."""
    kept: torch.Tensor
    """Per-token bool: not rejected (decision 3)."""


def policy_objective(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    objective: Objective,
    *,
    mask: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    decoupled: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> PolicyObjective:
    """The objective, negated: ``Σ_t w_t · keep_t · (ℓ_t + β · k_t − coef · H_t)`` (decisions 2–6).

    ``weights`` are :func:`token_weights` (zero on padding) times any per-rollout weight; ``advantages``
    is ``[rollouts]``, ``[rollouts, 1]`` or per token ``[rollouts, tokens]``; ``decoupled`` is ``[rollouts]``
    or ``[rollouts, 1]`` (True for importance-weighted rollouts). ``mask`` (1 on loss tokens) defaults to
    ``weights > 0``. ``ref_logprobs`` is required for a KL term in the loss, ``entropy`` (per token, with
    gradients) for an entropy bonus.
    """
    o = objective
    if o.kl_coef < 0:
        raise ValueError(f"kl_coef must be ≥ 0, got {o.kl_coef}")
    adv = advantages.reshape(-1, 1) if advantages.dim() == 1 else advantages
    dec = decoupled.reshape(-1, 1) if decoupled is not None and decoupled.dim() == 1 else decoupled
    token_mask = (weights > 0) if mask is None else mask.to(torch.bool)
    log_ratio = (logprobs - behaviour_logprobs.to(logprobs.dtype)).detach()
    if o.policy_loss == "PPO":
        seq_weight = None
        if o.importance_level == "Sequence":
            seq_weight = sequence_log_ratio(log_ratio, token_mask, mean=False)
            dec = torch.ones_like(adv[:, :1], dtype=torch.bool)
        surrogate = clipped_surrogate(
            logprobs,
            behaviour_logprobs,
            adv,
            o.clip_low,
            o.importance_weight_cap,
            dec,
            clip_high=o.clip_high,
            dual_clip=o.dual_clip,
            sequence_weight=seq_weight,
        )
    elif o.policy_loss == "GSPO":
        surrogate = gspo_surrogate(
            logprobs,
            behaviour_logprobs,
            adv,
            token_mask,
            clip_low=o.clip_low,
            clip_high=o.clip_high,
            cap=o.importance_weight_cap,
            dual_clip=o.dual_clip,
            decoupled=dec,
        )
    elif o.policy_loss == "CISPO":
        surrogate = cispo_surrogate(
            logprobs, behaviour_logprobs, adv, clip_low=o.clip_low, clip_high=o.clip_high
        )
    else:
        raise ValueError(f"policyLoss: expected PPO, GSPO or CISPO, got {o.policy_loss!r}")
    per_token = surrogate.loss
    kl: torch.Tensor | None = None
    in_loss = o.kl_coef > 0 and o.kl_placement == "Loss"
    if ref_logprobs is not None and o.kl_placement == "Loss":
        k = kl_penalty(logprobs, ref_logprobs, o.kl_estimator)
        kl = k.detach()
        if in_loss:
            per_token = per_token + o.kl_coef * k
    elif in_loss:
        raise ValueError("kl_coef > 0 in the loss needs the reference policy's log-probs (ref_logprobs)")
    if o.entropy_coef > 0:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the policy's per-token entropy")
        per_token = per_token - o.entropy_coef * entropy
    kept = rejection_keep(log_ratio, token_mask, o.rejection, o.rejection_low, o.rejection_high)
    # Padding may hold anything (even inf ratios); where() keeps it out of the sum and its gradient.
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    live = (weights > 0) & kept
    contributions = torch.where(live, per_token * weights.to(per_token.dtype), zero)
    return PolicyObjective(loss=contributions.sum(), surrogate=surrogate, kl=kl, kept=kept)


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    clip_range: float,
    cap: float,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    decoupled: torch.Tensor | None = None,
) -> PolicyObjective:
    """The ``GRPO`` preset's objective with a symmetric clip: :func:`policy_objective` with k3 in the loss."""
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be ≥ 0, got {kl_coef}")
    if clip_range <= 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    objective = Objective(
        clip_low=clip_range, clip_high=clip_range, importance_weight_cap=cap, kl_coef=kl_coef
    )
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs the reference policy's log-probs (ref_logprobs)")
    return policy_objective(
        logprobs,
        behaviour_logprobs,
        advantages,
        weights,
        objective,
        ref_logprobs=ref_logprobs,
        decoupled=decoupled,
    )
