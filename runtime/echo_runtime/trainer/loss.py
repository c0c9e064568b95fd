"""GRPO's loss as pure torch functions: group advantages, the clipped surrogate with truncated
importance weights, the k3 KL penalty, and how token losses are averaged.

Notation, per completion token ``o_t`` of rollout ``i`` (prompt ``q``):

* ``π_θ`` — the policy being trained; gradients flow through its log-probs ``log π_θ(o_t | q, o_<t)``.
* ``μ`` — the *behaviour* policy: the backend and policy version that sampled the token. Its log-probs
  travel with the rollout (``Rollout.logprobs``); they are constants here.
* ``π_ref`` — the reference policy (the base model) of the optional KL penalty.
* ``ρ_t = π_θ / μ`` — the importance ratio to the behaviour policy; ``A_i`` — the rollout's advantage,
  shared by all of its tokens (outcome supervision).

Decisions, each implemented by one function below:

1. **Advantages** (:func:`group_advantages`): Shao et al. 2024 (DeepSeekMath), §4.1.2, outcome
   supervision: ``A_i = (r_i − mean(r)) / (std(r) + eps)`` within a group. ``std`` is the Bessel-corrected
   sample standard deviation (as TRL's and verl's GRPO), ``eps = 1e-6``. A group whose rewards are all
   equal gets *exactly* zero advantages (no signal), never NaN: such a group is detected by comparing
   the rewards themselves, not by the size of ``std``, because for a reward float arithmetic cannot
   represent (0.1, say) the computed mean is an ulp away from it, the std is ~1e-8 rather than 0, and
   ``(r − mean)/(std + eps)`` would hand every rollout of the group the same spurious ≈ −0.0074.
2. **Surrogate** (:func:`clipped_surrogate`): the PPO-clip objective of Schulman et al. 2017 (eq. 7) on the
   ratio to the behaviour log-probs, ``L^CLIP = min(ρ A, clip(ρ, 1−ε, 1+ε) A)``, whose *unclipped* branch is
   weighted by a truncated importance weight ``min(ρ, C)`` (Espeholt et al. 2018, IMPALA, the V-trace
   ``ρ̄``; Yao et al. 2025, truncated importance sampling)::

       ℓ_t = − sg[min(1, C / ρ_t)] · min(ρ_t A, clip(ρ_t, 1−ε, 1+ε) A)        (sg = stop-gradient)
       ∇ℓ_t = − 1[clip inactive] · min(ρ_t, C) · A · ∇ log π_θ(o_t)

   How the clip and the cap combine: the clip decides *whether* a token contributes (PPO's trust region
   around the policy that sampled it: a token the policy already moved past ``1 ± ε`` in the direction of
   its advantage gives no gradient), the cap decides *how much* (no token's weight exceeds ``C``). PPO-clip
   leaves exactly one branch unbounded — ``A < 0`` with ``ρ ≫ 1``, the case dual-clip PPO (Ye et al.
   2020) bounds — and the cap truncates it at ``C · A`` while keeping its gradient (truncated IS rather
   than dual-clip's zero gradient). With ``C ≥ 1 + ε`` that is the only place the cap binds, so for fresh
   rollouts the cap only guards against backend mismatch (``μ`` from vLLM in bfloat16, say). With
   ``ρ ≡ 1`` (fresh rollouts, a backend that matches the trainer) this is the plain policy gradient
   ``−A ∇ log π_θ``.

   **Importance-weighted groups** (``staleAction: ImportanceWeight`` and staleness > 0, as
   :func:`echo_runtime.staleness.admit` decides) use the *decoupled* objective of Hilton et al.
   2022 (§3, "Batch size-invariance for policy optimization") instead: the proximal policy is the trainer's
   policy before this step, ``π_prox = sg(π_θ)``; the gap from the behaviour policy (staleness and
   mismatch together) is corrected by the truncated weight ``min(π_prox/μ, C)``, and the clip applies to
   ``π_θ/π_prox``, which is 1 where we evaluate it (one optimizer step per batch)::

       ℓ_t = − min(ρ_t, C) · min(r_t A, clip(r_t, 1−ε, 1+ε) A),  r_t = π_θ / sg(π_θ)
       ∇ℓ_t = − min(ρ_t, C) · A · ∇ log π_θ(o_t)

   so a stale token the policy has since moved away from is *kept, with a truncated weight*, instead of
   being clipped away. ``staleAction: Drop`` keeps the coupled form for every group it admits.

3. **KL penalty** (:func:`kl_k3`): the k3 estimator of Schulman 2020 ("Approximating KL Divergence"),
   ``k3 = π_ref/π_θ − 1 − log(π_ref/π_θ) ≥ 0``, an estimate of ``KL(π_θ ‖ π_ref)`` per token, added as
   ``β · k3`` (DeepSeekMath eq. 3–4).
4. **Averaging** (:func:`token_weights`): ``"token"`` (the trainer's default) divides the sum of token
   losses by the number of completion tokens in the whole batch (Yu et al. 2025, DAPO, §3.3 "token-level
   policy gradient loss"; verl's ``token-mean``): every token counts the same, so long completions are not
   down-weighted. ``"sequence"`` averages each rollout's tokens first and then the rollouts (DeepSeekMath
   eq. 3); the manifest has no switch for it yet. Either way a token's weight is
   fixed by the *whole* batch, so the loss is a plain sum over tokens and splitting the batch into
   micro-batches or ranks changes nothing but the order of additions.

Invariants the tests check: advantages of a group sum to 0; the surrogate's gradient with respect to the
log-prob is exactly ``−1[clip inactive] · min(ρ, C) · A`` (``−min(ρ, C) · A`` when decoupled); the weights
of all tokens of a batch sum to 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch

Normalization = Literal["token", "sequence"]
"""How token losses are averaged over a batch; see decision 4 of the module docstring."""

ADVANTAGE_EPS = 1e-6
"""``eps`` of the advantage denominator ``std(r) + eps``."""


def group_advantages(rewards: torch.Tensor, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """GRPO advantages ``(r − mean(r)) / (std(r) + eps)`` per group (DeepSeekMath §4.1.2).

    ``rewards`` has shape ``[groups, n]`` (``n ≥ 2`` rollouts of one prompt per row); the result has the
    same shape, in float32. ``std`` is the sample (Bessel-corrected) standard deviation.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must have shape [groups, n] with n ≥ 2, got {tuple(rewards.shape)}")
    r = rewards.to(torch.float64)  # the statistics in double; the result in float32
    centred = r - r.mean(dim=1, keepdim=True)
    advantages = centred / (r.std(dim=1, unbiased=True, keepdim=True) + eps)
    equal = (r == r[:, :1]).all(dim=1, keepdim=True)
    return torch.where(equal, torch.zeros_like(advantages), advantages).to(torch.float32)


@dataclasses.dataclass(frozen=True)
class Surrogate:
    """Per-token output of :func:`clipped_surrogate`; every tensor has the shape of the log-probs."""

    loss: torch.Tensor
    """``ℓ_t`` (differentiable through the policy's log-probs)."""
    ratio: torch.Tensor
    """``ρ_t = π_θ / μ`` (detached; may be ``inf`` for a token the behaviour policy found ~impossible)."""
    clipped: torch.Tensor
    """True where PPO's clip is active (the token gives no gradient)."""
    truncated: torch.Tensor
    """True where the clip is inactive and the cap binds (``ρ_t > C``)."""


def clipped_surrogate(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    cap: float,
    decoupled: torch.Tensor | None = None,
) -> Surrogate:
    """PPO-clip (Schulman et al. 2017, eq. 7) on ``ρ = π_θ/μ`` with truncated weights ``min(ρ, C)``.

    ``logprobs`` (of ``π_θ``, with gradients) and ``behaviour_logprobs`` (of ``μ``) have one shape, say
    ``[rollouts, tokens]``; ``advantages`` broadcasts against it (``[rollouts, 1]`` for outcome
    supervision). ``clip_range`` is ε > 0 and ``cap`` is C ≥ 1. ``decoupled`` (a bool tensor broadcasting
    against the log-probs, e.g. ``[rollouts, 1]``) selects the decoupled form for importance-weighted
    rollouts. See decision 2 of the module docstring.

    Computed in log space so that no ``exp`` overflows: a ratio of ``e^100`` still gives the finite,
    capped gradient ``C · A``.
    """
    if clip_range <= 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    if cap < 1:
        raise ValueError(f"cap must be ≥ 1, got {cap}")
    log_ratio = logprobs - behaviour_logprobs.to(logprobs.dtype)
    detached = log_ratio.detach()
    adv = advantages.to(logprobs.dtype)
    log_high = math.log1p(clip_range)
    log_low = math.log1p(-clip_range) if clip_range < 1 else -math.inf  # ε = 1: ρ is never below 0
    # PPO's clip is active where moving further in the direction of A is what clip() forbids.
    clipped = ((detached > log_high) & (adv > 0)) | ((detached < log_low) & (adv < 0))
    if decoupled is not None:
        clipped = clipped & ~decoupled.to(torch.bool)  # the decoupled ratio π_θ/sg(π_θ) is 1: never clipped
    log_cap = math.log(cap)
    # Contributing tokens: value min(ρ, C)·A, gradient min(ρ, C)·A·∇log π_θ. exp(x - sg(x)) is 1 with
    # the gradient of x: for the coupled form it is ρ/sg(ρ), for the decoupled one π_θ/sg(π_θ).
    weight = torch.exp(torch.clamp(detached, max=log_cap))
    contributing = weight * torch.exp(log_ratio - detached) * adv
    # Clipped tokens: value sg[min(1, C/ρ)] · clip(ρ, 1−ε, 1+ε) · A, no gradient.
    clipped_ratio = torch.exp(torch.clamp(detached, min=log_low, max=log_high))
    shrink = torch.exp(torch.clamp(log_cap - detached, max=0.0))
    clipped_value = (shrink * clipped_ratio * adv).detach()
    loss = -torch.where(clipped, clipped_value, contributing)
    return Surrogate(
        loss=loss,
        ratio=torch.exp(detached),
        clipped=clipped,
        truncated=(~clipped) & (detached > log_cap),
    )


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of ``KL(π_θ ‖ π_ref)`` (Schulman 2020): ``e^δ − 1 − δ``, ``δ = log π_ref − log π_θ``.

    Non-negative, zero where the two policies agree; differentiable through ``logprobs``.
    """
    delta = ref_logprobs.to(logprobs.dtype) - logprobs
    return torch.expm1(delta) - delta


def token_weights(
    mask: torch.Tensor, normalization: Normalization, total_tokens: int, total_sequences: int
) -> torch.Tensor:
    """The weight of each token in the batch loss, so that the loss is ``Σ_t weight_t · ℓ_t``.

    ``mask`` is ``[rollouts, tokens]`` (1 for a completion token, 0 for padding) of *part* of a batch (a
    micro-batch on one rank); ``total_tokens`` and ``total_sequences`` count the *whole* batch, over all
    micro-batches and ranks. ``"token"``: ``1 / total_tokens``; ``"sequence"``: ``1 / (|o_i| ·
    total_sequences)``. Over the whole batch the weights sum to 1.
    """
    m = mask.to(torch.float32)
    if normalization == "token":
        if total_tokens <= 0:
            raise ValueError(f"total_tokens must be > 0, got {total_tokens}")
        return m / total_tokens
    if normalization == "sequence":
        if total_sequences <= 0:
            raise ValueError(f"total_sequences must be > 0, got {total_sequences}")
        lengths = m.sum(dim=1, keepdim=True).clamp(min=1.0)
        return m / (lengths * total_sequences)
    raise ValueError(f"normalization must be 'token' or 'sequence', got {normalization!r}")


@dataclasses.dataclass(frozen=True)
class GRPOLoss:
    """The weighted loss of part of a batch and its per-token parts (for metrics)."""

    loss: torch.Tensor
    """Scalar ``Σ_t w_t · (ℓ_t + β · k3_t)``; summing it over the parts of a batch gives the batch loss."""
    surrogate: Surrogate
    kl: torch.Tensor | None
    """Per-token k3 (detached), or None without a reference."""


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
) -> GRPOLoss:
    """The GRPO objective, negated: ``Σ_t w_t · (ℓ_t + β · k3_t)`` (DeepSeekMath eq. 3 with decision 2).

    ``weights`` are :func:`token_weights` (zero on padding) times any per-rollout weight; ``advantages``
    is ``[rollouts]`` or ``[rollouts, 1]``; so is ``decoupled`` (True for importance-weighted rollouts).
    ``ref_logprobs`` is required when ``kl_coef > 0``.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be ≥ 0, got {kl_coef}")
    adv = advantages.reshape(-1, 1) if advantages.dim() == 1 else advantages
    dec = decoupled.reshape(-1, 1) if decoupled is not None and decoupled.dim() == 1 else decoupled
    surrogate = clipped_surrogate(logprobs, behaviour_logprobs, adv, clip_range, cap, dec)
    per_token = surrogate.loss
    kl: torch.Tensor | None = None
    if ref_logprobs is not None:
        k3 = kl_k3(logprobs, ref_logprobs)
        kl = k3.detach()
        if kl_coef > 0:
            per_token = per_token + kl_coef * k3
    elif kl_coef > 0:
        raise ValueError("kl_coef > 0 needs the reference policy's log-probs (ref_logprobs)")
    # Padding may hold anything (even inf ratios); where() keeps it out of the sum and its gradient.
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    contributions = torch.where(weights > 0, per_token * weights.to(per_token.dtype), zero)
    return GRPOLoss(loss=contributions.sum(), surrogate=surrogate, kl=kl)
