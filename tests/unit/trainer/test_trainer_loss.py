"""The loss functions against values computed by hand (echo_runtime.trainer.loss)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime.trainer import loss

EPS = 0.2  # ε (clip range) in every hand-computed case below
CAP = 2.0  # C (importance-weight cap)


# --------------------------------------------------------------------------------------- advantages
def test_advantages_by_hand() -> None:
    # [1, 0, 0, 1]: mean 0.5, sample variance (4 · 0.25) / 3 = 1/3, std 0.577350; A = ±0.5 / 0.577351
    # [0, 3]:       mean 1.5, sample variance (2.25 + 2.25) / 1 = 4.5, std 2.121320; A = ±1.5 / 2.121321
    a = loss.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert a[0].tolist() == pytest.approx([0.866024, -0.866024, -0.866024, 0.866024], abs=1e-6)
    b = loss.group_advantages(torch.tensor([[0.0, 3.0]]))
    assert b[0].tolist() == pytest.approx([-0.707106, 0.707106], abs=1e-6)


def test_advantages_of_equal_rewards_are_zero_not_nan() -> None:
    a = loss.group_advantages(torch.tensor([[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]))
    assert a.tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("reward", [0.1, 0.9, 0.3, 0.7, 1 / 3, 0.2, 0.6])
@pytest.mark.parametrize("size", [2, 8, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_rewards_that_floats_cannot_represent_give_exactly_zero(
    reward: float, size: int, dtype: torch.dtype
) -> None:
    # The computed mean of n copies of 0.1 is an ulp away from 0.1 and the std ~1e-8, not 0: dividing by
    # std + eps gave every rollout of such a group A ≈ -0.0074 at n = 8 (float32) before this was fixed.
    r = torch.full((1, size), reward, dtype=dtype)
    centred = r.to(torch.float32) - r.to(torch.float32).mean(dim=1, keepdim=True)
    naive = centred / (r.to(torch.float32).std(dim=1, keepdim=True) + loss.ADVANTAGE_EPS)
    a = loss.group_advantages(r)
    assert a.dtype == torch.float32
    assert torch.equal(a, torch.zeros_like(a))
    assert a.tolist() == [[0.0] * size]
    if reward == 0.1 and size == 8 and dtype == torch.float32:
        assert naive.abs().max().item() > 1e-3  # the bug this guards against is real in this setting


def test_one_different_reward_still_gets_its_signal() -> None:
    a = loss.group_advantages(torch.tensor([[0.1] * 7 + [1.0]]))
    assert a[0, -1].item() > 2.0 and all(x < 0 for x in a[0, :-1].tolist())
    # a group equal but for one float ulp is not "all equal": it keeps its (tiny) deviations
    b = loss.group_advantages(
        torch.tensor([[0.1, 0.1, float(torch.tensor(0.1).nextafter(torch.tensor(1.0)))]])
    )
    assert b.abs().max().item() < 1e-1 and b.abs().max().item() > 0


def test_advantages_reject_groups_of_one() -> None:
    with pytest.raises(ValueError, match="n ≥ 2"):
        loss.group_advantages(torch.tensor([[1.0], [0.0]]))
    with pytest.raises(ValueError, match="shape"):
        loss.group_advantages(torch.tensor([1.0, 0.0]))


@given(
    st.lists(st.lists(st.floats(0, 1), min_size=2, max_size=8), min_size=1, max_size=4).filter(
        lambda rows: len({len(r) for r in rows}) == 1
    )
)
@settings(max_examples=50, deadline=None)
def test_advantages_of_a_group_sum_to_zero(rows: list[list[float]]) -> None:
    a = loss.group_advantages(torch.tensor(rows, dtype=torch.float64))
    assert a.sum(dim=1).abs().max().item() < 1e-4


# --------------------------------------------------------------------------------------- surrogate
# (ρ, A) → (loss value, d loss / d log π_θ), coupled form, by hand with ε = 0.2 and C = 2:
#   clip active when (ρ > 1.2 and A > 0) or (ρ < 0.8 and A < 0): value −min(1, C/ρ)·clip(ρ)·A, gradient 0;
#   otherwise value −min(ρ, C)·A and gradient −min(ρ, C)·A.
COUPLED = [
    (1.0, 0.5, -0.5, -0.5),  # on-policy: the plain policy gradient −A
    (1.5, 1.0, -1.2, 0.0),  # above 1 + ε with A > 0: clipped at 1.2
    (1.5, -1.0, 1.5, 1.5),  # above 1 + ε with A < 0: PPO keeps the unclipped branch, weight 1.5
    (3.0, -1.0, 2.0, 2.0),  # ... and the cap truncates it: weight min(3, 2) = 2
    (3.0, 1.0, -0.8, 0.0),  # clipped: −(2/3) · 1.2 · 1
    (0.5, -1.0, 0.8, 0.0),  # below 1 − ε with A < 0: clipped at 0.8
    (0.5, 2.0, -1.0, -1.0),  # below 1 − ε with A > 0: unclipped, weight 0.5
    (1.1, 0.0, 0.0, 0.0),  # no advantage, no signal
]
# Decoupled (importance-weighted) form: never clipped; value and gradient −min(ρ, C)·A.
DECOUPLED = [
    (1.0, 0.5, -0.5, -0.5),
    (1.5, 1.0, -1.5, -1.5),
    (3.0, 1.0, -2.0, -2.0),
    (3.0, -1.0, 2.0, 2.0),
    (0.5, -1.0, 0.5, 0.5),
]


def _surrogate(
    cases: list[tuple[float, float, float, float]], decoupled: bool
) -> tuple[loss.Surrogate, torch.Tensor]:
    behaviour = torch.full((len(cases),), -1.0)
    logprobs = (torch.tensor([math.log(c[0]) for c in cases]) + behaviour).requires_grad_(True)
    adv = torch.tensor([c[1] for c in cases])
    flags = torch.full((len(cases),), decoupled)
    out = loss.clipped_surrogate(logprobs, behaviour, adv, EPS, CAP, flags)
    out.loss.sum().backward()
    assert logprobs.grad is not None
    return out, logprobs.grad


def test_coupled_surrogate_by_hand() -> None:
    out, grad = _surrogate(COUPLED, decoupled=False)
    assert out.loss.tolist() == pytest.approx([c[2] for c in COUPLED], abs=1e-6)
    assert grad.tolist() == pytest.approx([c[3] for c in COUPLED], abs=1e-6)
    assert out.clipped.tolist() == [False, True, False, False, True, True, False, False]
    assert out.truncated.tolist() == [False, False, False, True, False, False, False, False]
    assert out.ratio.tolist() == pytest.approx([c[0] for c in COUPLED], rel=1e-6)


def test_decoupled_surrogate_by_hand() -> None:
    out, grad = _surrogate(DECOUPLED, decoupled=True)
    assert out.loss.tolist() == pytest.approx([c[2] for c in DECOUPLED], abs=1e-6)
    assert grad.tolist() == pytest.approx([c[3] for c in DECOUPLED], abs=1e-6)
    assert not out.clipped.any()
    assert out.truncated.tolist() == [False, False, True, True, False]


def test_surrogate_never_overflows() -> None:
    # ρ = e^100 (a token the behaviour policy found ~impossible): value and gradient are C·A, finite.
    logprobs = torch.tensor([0.0, 0.0], requires_grad=True)
    behaviour = torch.tensor([-100.0, -100.0])
    out = loss.clipped_surrogate(logprobs, behaviour, torch.tensor([-1.0, 1.0]), EPS, CAP)
    out.loss.sum().backward()
    assert out.loss.tolist() == pytest.approx([2.0, -1.2 * 2.0 * math.exp(-100.0)], abs=1e-6)
    assert logprobs.grad is not None and logprobs.grad.tolist() == pytest.approx([2.0, 0.0])


def test_surrogate_rejects_bad_settings() -> None:
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="clip_range"):
        loss.clipped_surrogate(x, x, x, 0.0, CAP)
    with pytest.raises(ValueError, match="cap"):
        loss.clipped_surrogate(x, x, x, EPS, 0.5)


def test_clip_range_one_has_no_lower_clip() -> None:
    # ε = 1: clip(ρ, 0, 2); ρ = 0.1 with A < 0 is not clipped (ρ can never go below 0).
    logprobs = torch.tensor([math.log(0.1)], requires_grad=True)
    out = loss.clipped_surrogate(logprobs, torch.zeros(1), torch.tensor([-1.0]), 1.0, CAP)
    out.loss.sum().backward()
    assert out.loss.tolist() == pytest.approx([0.1])
    assert logprobs.grad is not None and logprobs.grad.tolist() == pytest.approx([0.1])


@given(
    st.lists(st.tuples(st.floats(-5, 5), st.floats(-3, 3), st.booleans()), min_size=1, max_size=16),
    st.floats(0.05, 1.0),
    st.floats(1.0, 10.0),
)
@settings(max_examples=100, deadline=None)
def test_surrogate_gradient_identity(cases: list[tuple[float, float, bool]], eps: float, cap: float) -> None:
    """∇ℓ = −1[clip inactive] · min(ρ, C) · A, for any inputs (decision 2)."""
    log_ratio = torch.tensor([c[0] for c in cases], dtype=torch.float64)
    adv = torch.tensor([c[1] for c in cases], dtype=torch.float64)
    decoupled = torch.tensor([c[2] for c in cases])
    logprobs = log_ratio.clone().requires_grad_(True)
    out = loss.clipped_surrogate(logprobs, torch.zeros_like(log_ratio), adv, eps, cap, decoupled)
    out.loss.sum().backward()
    expected = torch.where(out.clipped, 0.0, -torch.clamp(log_ratio.exp(), max=cap) * adv)
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, expected)
    assert not (out.clipped & decoupled).any()


# --------------------------------------------------------------------------------------- KL
def test_k3_by_hand() -> None:
    # π_θ = 0.5, π_ref = 0.25: δ = log 0.5; k3 = 0.5 − 1 − log 0.5 = 0.193147; d k3 / d log π_θ = 1 − e^δ = 0.5.
    logprobs = torch.tensor([math.log(0.5), math.log(0.3)], requires_grad=True)
    k3 = loss.kl_k3(logprobs, torch.tensor([math.log(0.25), math.log(0.3)]))
    k3.sum().backward()
    assert k3.tolist() == pytest.approx([0.193147, 0.0], abs=1e-6)
    assert logprobs.grad is not None and logprobs.grad.tolist() == pytest.approx([0.5, 0.0], abs=1e-6)


# --------------------------------------------------------------------------------------- averaging
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_token_weights_by_hand() -> None:
    token = loss.token_weights(MASK, "TokenMean", total_tokens=4, total_sequences=2)
    assert token.tolist() == [[0.25, 0.25, 0.25, 0.0], [0.25, 0.0, 0.0, 0.0]]
    seq = loss.token_weights(MASK, "SequenceMeanTokenMean", total_tokens=4, total_sequences=2)
    assert seq.flatten().tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 0.0, 0.5, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="lossAggregation"):
        loss.token_weights(MASK, "batch", 4, 2)  # type: ignore[arg-type]


def test_grpo_loss_by_hand() -> None:
    # Two rollouts, fresh (ρ = 1), A = [1, −1]; rollout 0 has 3 tokens, rollout 1 has 1; token weights 1/4.
    # Surrogate per token: −A → [−1, −1, −1, ·] and [1, ·, ·, ·]; sum · 1/4 = (−3 + 1) / 4 = −0.5.
    # KL: token (0, 0) has π_θ = 0.5, π_ref = 0.25 → k3 = 0.193147; β = 0.1 adds 0.1 · 0.193147 / 4.
    behaviour = torch.tensor([[math.log(0.5), -1.0, -2.0, 0.0], [-0.5, 0.0, 0.0, 0.0]])
    logprobs = behaviour.clone().requires_grad_(True)
    ref = behaviour.clone()
    ref[0, 0] = math.log(0.25)
    weights = loss.token_weights(MASK, "TokenMean", 4, 2)
    out = loss.grpo_loss(
        logprobs,
        behaviour,
        torch.tensor([1.0, -1.0]),
        weights,
        clip_range=EPS,
        cap=CAP,
        kl_coef=0.1,
        ref_logprobs=ref,
    )
    assert out.loss.item() == pytest.approx(-0.5 + 0.1 * 0.193147 / 4, abs=1e-6)
    out.loss.backward()
    assert logprobs.grad is not None
    # d/d log π: −A/4 from the surrogate, plus β · (1 − e^δ) / 4 = 0.1 · 0.5 / 4 on token (0, 0).
    assert logprobs.grad.flatten().tolist() == pytest.approx(
        [-0.25 + 0.0125, -0.25, -0.25, 0.0, 0.25, 0.0, 0.0, 0.0], abs=1e-6
    )
    assert out.kl is not None and out.kl[0, 0].item() == pytest.approx(0.193147, abs=1e-6)


def test_grpo_loss_ignores_padding_even_when_it_is_not_finite() -> None:
    behaviour = torch.tensor([[-1.0, -1e30]])
    logprobs = torch.tensor([[-1.0, 0.0]], requires_grad=True)
    weights = loss.token_weights(torch.tensor([[1, 0]]), "TokenMean", 1, 1)
    out = loss.grpo_loss(logprobs, behaviour, torch.tensor([2.0]), weights, clip_range=EPS, cap=CAP)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-2.0)
    assert logprobs.grad is not None and logprobs.grad.tolist() == [[-2.0, 0.0]]


def test_grpo_loss_needs_reference_for_kl() -> None:
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss.grpo_loss(x, x, torch.ones(1), torch.ones(1, 1), clip_range=EPS, cap=CAP, kl_coef=0.1)


@pytest.mark.parametrize("normalization", ["TokenMean", "SequenceMeanTokenMean"])
def test_micro_batches_sum_to_the_full_batch_loss(normalization: loss.Normalization) -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])
    behaviour = -torch.rand(4, 4) * 3
    logprobs = behaviour + 0.3 * torch.randn(4, 4)
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0])
    kwargs = {"clip_range": EPS, "cap": CAP}
    total_tokens, total_sequences = int(mask.sum()), 4
    full = loss.grpo_loss(
        logprobs,
        behaviour,
        adv,
        loss.token_weights(mask, normalization, total_tokens, total_sequences),
        **kwargs,
    ).loss
    parts = sum(
        loss.grpo_loss(
            logprobs[sl],
            behaviour[sl],
            adv[sl],
            loss.token_weights(mask[sl], normalization, total_tokens, total_sequences),
            **kwargs,
        ).loss
        for sl in (slice(0, 1), slice(1, 3), slice(3, 4))
    )
    assert float(parts) == pytest.approx(float(full), abs=1e-6)
    assert float(
        loss.token_weights(mask, normalization, total_tokens, total_sequences).sum()
    ) == pytest.approx(1.0)
