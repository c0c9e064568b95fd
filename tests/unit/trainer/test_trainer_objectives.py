"""The objective variants against values computed by hand from each paper's formula (trainer.loss).

Every expected value here is derived in the comment next to it, or computed by a direct, naive
transcription of the paper's equation (a plain loop, or autograd of the sequence-level formula) — never
by the function under test.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime.spec.objectives import Objective
from echo_runtime.trainer import loss


# --------------------------------------------------------------------------------------- advantages
def test_rloo_is_the_leave_one_out_baseline() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5]
    # Ahmadian et al. eq. 9, literally: r_i minus the mean of the others.
    expected = [r - (sum(rewards) - r) / (len(rewards) - 1) for r in rewards]
    (got,) = loss.advantages([rewards], "RLOO", "Off")
    assert got == pytest.approx(expected, abs=1e-12)
    # by hand for the first: 1 − (0 + 0 + 1 + 0.5)/4 = 0.625
    assert got[0] == pytest.approx(0.625)


def test_dr_grpo_drops_the_std() -> None:
    (got,) = loss.advantages([[1.0, 0.0, 0.0, 1.0]], "GRPO", "Off")
    assert got == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_batch_scaling_divides_by_the_std_of_the_whole_batch() -> None:
    groups = [[1.0, 0.0], [0.0, 0.0, 3.0]]
    flat = [1.0, 0.0, 0.0, 0.0, 3.0]
    std = statistics.stdev(flat)  # Bessel-corrected, over every reward of the batch
    expected = [
        [0.5 / (std + 1e-6), -0.5 / (std + 1e-6)],
        [-1 / (std + 1e-6), -1 / (std + 1e-6), 2 / (std + 1e-6)],
    ]
    got = loss.advantages(groups, "GRPO", "Batch")
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=1e-9)


@pytest.mark.parametrize("estimator", ["GRPO", "RLOO"])
@pytest.mark.parametrize("scaling", ["Group", "Batch", "Off"])
def test_equal_groups_get_exactly_zero(estimator: str, scaling: str) -> None:
    got = loss.advantages([[0.1] * 8, [1.0, 0.0]], estimator, scaling)
    assert got[0] == [0.0] * 8
    assert got[1][0] > 0 > got[1][1]


def _whiten(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]


def test_reinforce_pp_normalises_over_every_token_of_the_batch() -> None:
    # Rewards [[1, 0], [0, 0]] with 2, 1, 3, 1 tokens: the token returns are 1,1 | 0 | 0,0,0 | 0.
    tokens = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    w = _whiten(tokens)
    got = loss.advantages([[1.0, 0.0], [0.0, 0.0]], "REINFORCEPP", "Batch", lengths=[[2, 1], [3, 1]])
    assert got == [pytest.approx([w[0], w[2]]), pytest.approx([w[3], w[6]])]
    # The baseline form subtracts the group mean first: 0.5, −0.5 | 0, 0 per token, then whitens.
    tokens_b = [0.5, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    wb = _whiten(tokens_b)
    got_b = loss.advantages(
        [[1.0, 0.0], [0.0, 0.0]], "REINFORCEPPBaseline", "Batch", lengths=[[2, 1], [3, 1]]
    )
    assert got_b == [pytest.approx([wb[0], wb[2]]), pytest.approx([wb[3], wb[6]])]


def test_reinforce_pp_token_returns_carry_the_kl_of_the_tokens_after() -> None:
    # Hu 2025: G_t = r − β Σ_{s ≥ t} k_s. Rewards [[1, 0]], penalties β·k = [0.1, 0.2] and [0.3].
    penalties = [[torch.tensor([0.1, 0.2]), torch.tensor([0.3])]]
    returns = [1 - 0.3, 1 - 0.2, 0 - 0.3]
    w = _whiten(returns)
    (got,) = loss.advantages([[1.0, 0.0]], "REINFORCEPP", "Batch", lengths=[[2, 1]], penalties=penalties)
    assert [t.tolist() for t in got] == [pytest.approx(w[:2]), pytest.approx(w[2:])]


def test_kl_in_the_reward_of_grpo_subtracts_the_sequence_total() -> None:
    penalties = [[torch.tensor([0.25, 0.25]), torch.tensor([0.0])]]
    # rewards 1 − 0.5 and 0 − 0: mean 0.25, std of [0.5, 0] is 0.353553
    (got,) = loss.advantages([[1.0, 0.0]], "GRPO", "Group", penalties=penalties)
    assert got == pytest.approx([0.25 / (0.3535534 + 1e-6), -0.25 / (0.3535534 + 1e-6)], abs=1e-6)


def test_advantage_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="advantageEstimator"):
        loss.advantages([[1.0, 0.0]], "PPO")
    with pytest.raises(ValueError, match="rewardScaling"):
        loss.advantages([[1.0, 0.0]], "GRPO", "Std")
    with pytest.raises(ValueError, match="n ≥ 2"):
        loss.advantages([[1.0]], "RLOO")
    with pytest.raises(ValueError, match="lengths"):
        loss.advantages([[1.0, 0.0]], "REINFORCEPP", "Batch")


@given(st.lists(st.lists(st.floats(0, 1), min_size=2, max_size=8), min_size=1, max_size=4))
@settings(max_examples=50, deadline=None)
def test_rloo_and_dr_grpo_advantages_of_a_group_sum_to_zero(groups: list[list[float]]) -> None:
    for estimator in ("RLOO", "GRPO"):
        for scaling in ("Off", "Batch"):
            for got in loss.advantages(groups, estimator, scaling):
                assert abs(sum(got)) < 1e-6


# --------------------------------------------------------------------------------------- overlong
@pytest.mark.parametrize(
    ("length", "expected"),
    # DAPO eq. 13 with L_max = 20, L_cache = 4: 0 up to 16, then (16 − |y|)/4, −1 at 20.
    [(10, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0)],
)
def test_overlong_penalty_by_hand(length: int, expected: float) -> None:
    assert loss.overlong_penalty(length, budget=20, buffer=4, factor=1.0) == pytest.approx(expected)
    assert loss.overlong_penalty(length, budget=20, buffer=4, factor=0.5) == pytest.approx(expected / 2)
    assert loss.overlong_penalty(length, budget=20, buffer=0, factor=1.0) == 0.0


# --------------------------------------------------------------------------------------- PPO variants
def _ppo(ratio: float, adv: float, **kwargs: float | None) -> tuple[float, float, loss.Surrogate]:
    behaviour = torch.tensor([-1.0])
    logprobs = (torch.tensor([math.log(ratio)]) + behaviour).requires_grad_(True)
    out = loss.clipped_surrogate(
        logprobs,
        behaviour,
        torch.tensor([adv]),
        kwargs.pop("clip_low", 0.2),  # type: ignore[arg-type]
        kwargs.pop("cap", 10.0),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
    out.loss.sum().backward()
    assert logprobs.grad is not None
    return float(out.loss.detach()), float(logprobs.grad), out


def test_clip_higher_is_asymmetric() -> None:
    # DAPO: ε_low = 0.2, ε_high = 0.28. ρ = 1.25, A = 1: inside 1 + 0.28, so it keeps its gradient −1.25 ...
    value, grad, out = _ppo(1.25, 1.0, clip_high=0.28)
    assert (value, grad) == (pytest.approx(-1.25), pytest.approx(-1.25))
    assert not bool(out.clipped_high.any())  # type: ignore[union-attr]
    # ... while the symmetric 0.2 clips it at 1.2, without gradient.
    value, grad, out = _ppo(1.25, 1.0)
    assert (value, grad) == (pytest.approx(-1.2), 0.0)
    assert bool(out.clipped_high.all())  # type: ignore[union-attr]
    # The low side still clips at 1 − 0.2: ρ = 0.75, A = −1 → value −0.8·(−1) = 0.8, no gradient.
    value, grad, out = _ppo(0.75, -1.0, clip_high=0.28)
    assert (value, grad) == (pytest.approx(0.8), 0.0)
    assert bool(out.clipped_low.all())  # type: ignore[union-attr]


def test_dual_clip_bounds_negative_advantages_without_gradient() -> None:
    # Ye et al. 2020: for A < 0 the objective is max(min(ρA, clip(ρ)A), cA). ρ = 4, A = −1, c = 3:
    # min(−4, −1.2) = −4, max(−4, −3) = −3 → the loss is 3 and its gradient 0.
    value, grad, out = _ppo(4.0, -1.0, dual_clip=3.0)
    assert (value, grad) == (pytest.approx(3.0), 0.0)
    assert bool(out.dual_clipped.all()) and bool(out.clipped.all())  # type: ignore[union-attr]
    # Below c it is plain PPO: ρ = 2.5 → loss 2.5, gradient 2.5.
    value, grad, _ = _ppo(2.5, -1.0, dual_clip=3.0)
    assert (value, grad) == (pytest.approx(2.5), pytest.approx(2.5))
    # Positive advantages are untouched by it.
    value, grad, _ = _ppo(4.0, 1.0, dual_clip=3.0)
    assert (value, grad) == (pytest.approx(-1.2), 0.0)
    with pytest.raises(ValueError, match="dual clip"):
        _ppo(1.0, 1.0, dual_clip=1.0)


def test_sequence_level_importance_weight_is_the_truncated_product() -> None:
    # Token ratios 1.5 and 1.2 → Π = 1.8; with C = 2 the weight is 1.8, with C = 1.5 it is 1.5.
    behaviour = torch.tensor([[-1.0, -1.0]])
    logprobs = (behaviour + torch.log(torch.tensor([[1.5, 1.2]]))).requires_grad_(True)
    seq = loss.sequence_log_ratio((logprobs - behaviour).detach(), torch.ones(1, 2), mean=False)
    assert float(seq.exp()) == pytest.approx(1.8)
    for cap, weight in ((2.0, 1.8), (1.5, 1.5)):
        logprobs.grad = None
        out = loss.clipped_surrogate(
            logprobs, behaviour, torch.tensor([[1.0]]), 0.2, cap, torch.tensor([[True]]), sequence_weight=seq
        )
        out.loss.sum().backward()
        assert logprobs.grad is not None
        assert logprobs.grad.tolist() == [[pytest.approx(-weight), pytest.approx(-weight)]]


# --------------------------------------------------------------------------------------- GSPO
def test_gspo_ratio_is_the_geometric_mean_of_token_ratios() -> None:
    behaviour = torch.tensor([[-2.0, -1.0, -3.0, 0.0]])
    token_ratios = [1.1, 0.8, 1.3]
    logprobs = behaviour.clone()
    logprobs[0, :3] += torch.log(torch.tensor(token_ratios))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = loss.gspo_surrogate(
        logprobs, behaviour, torch.tensor([[1.0]]), mask, clip_low=0.5, clip_high=0.5, cap=10.0
    )
    geometric = (1.1 * 0.8 * 1.3) ** (1 / 3)
    assert out.ratio[0, :3].tolist() == pytest.approx([geometric] * 3, rel=1e-6)


def _gspo_by_the_paper(
    logprobs: torch.Tensor,
    behaviour: torch.Tensor,
    adv: torch.Tensor,
    lengths: list[int],
    eps: tuple[float, float],
) -> torch.Tensor:
    """Zheng et al. 2025 eq. 5 and 7, transcribed: −(1/G) Σ_i min(s_i A_i, clip(s_i, 1−ε_l, 1+ε_h) A_i)."""
    terms = []
    for i, n in enumerate(lengths):
        s = torch.exp((logprobs[i, :n] - behaviour[i, :n]).sum() / n)
        terms.append(torch.minimum(s * adv[i], torch.clamp(s, 1 - eps[0], 1 + eps[1]) * adv[i]))
    return -torch.stack(terms).mean()


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.2, 0.2)])
def test_gspo_token_form_has_the_sequence_objectives_gradient(eps: tuple[float, float]) -> None:
    torch.manual_seed(1)
    lengths = [4, 2, 3]
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in lengths])
    behaviour = -torch.rand(3, 4) * 2
    # Ratios near 1 (some inside the tight GSPO band, some outside), behaviour on padding arbitrary.
    base = behaviour + torch.tensor(
        [[2e-4, -1e-4, 1e-4, 0.0], [0.3, 0.1, 0.0, 0.0], [-5e-5, 5e-5, 1e-4, 0.0]]
    )
    adv = torch.tensor([1.0, -0.5, 2.0])
    ours = base.clone().requires_grad_(True)
    weights = loss.token_weights(mask, "SequenceMeanTokenMean", int(mask.sum()), 3)
    o = Objective(policy_loss="GSPO", clip_low=eps[0], clip_high=eps[1], importance_weight_cap=100.0)
    out = loss.policy_objective(ours, behaviour, adv, weights, o, mask=mask)
    out.loss.backward()
    paper = base.clone().requires_grad_(True)
    reference = _gspo_by_the_paper(paper, behaviour, adv, lengths, eps)
    reference.backward()
    assert float(out.loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-6)
    assert ours.grad is not None and paper.grad is not None
    torch.testing.assert_close(ours.grad * mask, paper.grad * mask, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------- CISPO
def test_cispo_keeps_the_gradient_of_a_clipped_token() -> None:
    # ρ = e ≈ 2.718 with ε_high = 0.28: PPO would clip it (gradient 0, A > 0); CISPO's weight is 1.28 and
    # the gradient −1.28 · A.
    behaviour = torch.tensor([[-1.0, -1.0]])
    logprobs = (behaviour + torch.tensor([[1.0, math.log(0.5)]])).requires_grad_(True)
    out = loss.cispo_surrogate(logprobs, behaviour, torch.tensor([[2.0]]), clip_low=1.0, clip_high=0.28)
    out.loss.sum().backward()
    assert logprobs.grad is not None
    # second token: ρ = 0.5, no lower bound (ε_low = 1): weight 0.5, gradient −0.5 · 2 = −1
    assert logprobs.grad.tolist() == [[pytest.approx(-1.28 * 2), pytest.approx(-1.0)]]
    assert out.truncated.tolist() == [[True, False]] and not bool(out.clipped.any())


def test_cispo_matches_minimax_m1_equation() -> None:
    # MiniMax-M1 eq. 4: J = (1/Σ|o_i|) Σ_i Σ_t sg(r̂_it) Â_it log π_θ(o_it), r̂ = clip(r, 1−ε_l, 1+ε_h).
    torch.manual_seed(2)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    behaviour = -torch.rand(2, 3) * 2
    base = behaviour + torch.randn(2, 3)
    adv = torch.tensor([0.7, -1.3])
    ours = base.clone().requires_grad_(True)
    o = Objective(policy_loss="CISPO", clip_low=0.5, clip_high=1.0)
    out = loss.policy_objective(
        ours, behaviour, adv, loss.token_weights(mask, "TokenMean", 5, 2), o, mask=mask
    )
    out.loss.backward()
    paper = base.clone().requires_grad_(True)
    r_hat = torch.clamp(torch.exp(paper.detach() - behaviour), 0.5, 2.0)
    objective = (r_hat * adv[:, None] * paper * mask).sum() / mask.sum()
    (-objective).backward()
    assert ours.grad is not None and paper.grad is not None
    torch.testing.assert_close(ours.grad, paper.grad)


# --------------------------------------------------------------------------------------- rejection
def test_rejection_masks_tokens_or_sequences_outside_the_band() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ratios = torch.tensor([[1.0, 6.0, 1.0], [0.6, 0.7, 0.9]])
    log_ratio = torch.log(ratios)
    token = loss.rejection_keep(log_ratio, mask, "Token", 0.5, 5.0)
    assert token.tolist() == [[True, False, True], [True, True, True]]
    # geometric means: √6 ≈ 2.449 (kept), (0.6·0.7·0.9)^(1/3) ≈ 0.723 (kept); with the band [0.75, 2]
    # the first (2.449 > 2) and the second (0.723 < 0.75) both go.
    seq = loss.rejection_keep(log_ratio, mask, "Sequence", 0.5, 5.0)
    assert seq.all()
    assert not loss.rejection_keep(log_ratio, mask, "Sequence", 0.75, 2.0).any()


def test_rejected_tokens_give_no_loss_and_no_gradient() -> None:
    behaviour = torch.tensor([[-1.0, -1.0]])
    logprobs = (behaviour + torch.log(torch.tensor([[1.1, 8.0]]))).requires_grad_(True)
    o = Objective(rejection="Token", importance_weight_cap=100.0, clip_high=100.0)
    out = loss.policy_objective(logprobs, behaviour, torch.tensor([1.0]), torch.tensor([[0.5, 0.5]]), o)
    out.loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad.tolist() == [[pytest.approx(-0.55), 0.0]]
    assert out.kept.tolist() == [[True, False]]


# --------------------------------------------------------------------------------------- KL, entropy
def test_kl_estimators_by_hand() -> None:
    # π_θ = 1/4, π_ref = 1/2: δ = log π_ref − log π_θ = ln 2.
    lp, ref = torch.log(torch.tensor([0.25])), torch.log(torch.tensor([0.5]))
    ln2 = math.log(2)
    assert float(loss.kl_penalty(lp, ref, "k1")) == pytest.approx(-ln2)
    assert float(loss.kl_penalty(lp, ref, "k2")) == pytest.approx(ln2**2 / 2)
    assert float(loss.kl_penalty(lp, ref, "k3")) == pytest.approx(2 - 1 - ln2)
    assert float(loss.kl_penalty(lp, ref, "LowVarKL")) == pytest.approx(2 - 1 - ln2)
    # verl's low_var_kl clamps: δ = 30 → e^20 − 1 − 20, then at most 10.
    assert float(loss.kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "LowVarKL")) == 10.0
    with pytest.raises(ValueError, match="klEstimator"):
        loss.kl_penalty(lp, ref, "k4")


def test_entropy_bonus_pushes_towards_higher_entropy() -> None:
    behaviour = torch.tensor([[-1.0]])
    logprobs = behaviour.clone().requires_grad_(True)
    entropy = torch.tensor([[0.7]], requires_grad=True)
    o = Objective(entropy_coef=0.01)
    out = loss.policy_objective(
        logprobs, behaviour, torch.tensor([0.0]), torch.tensor([[1.0]]), o, entropy=entropy
    )
    out.loss.backward()
    # loss = w · (ℓ − coef · H) = −0.01 · 0.7 with A = 0; d loss / d H = −0.01
    assert float(out.loss.detach()) == pytest.approx(-0.007)
    assert entropy.grad is not None and float(entropy.grad) == pytest.approx(-0.01)
    with pytest.raises(ValueError, match="entropy"):
        loss.policy_objective(logprobs, behaviour, torch.tensor([0.0]), torch.tensor([[1.0]]), o)


# --------------------------------------------------------------------------------------- aggregation
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_sequence_sum_aggregations_by_hand() -> None:
    # Two sequences: each one's token sum, averaged → every token weighs 1/2; with the constant 8
    # (Dr. GRPO: the budget) every token weighs 1/(8·2).
    s = loss.token_weights(MASK, "SequenceMeanTokenSum", total_tokens=4, total_sequences=2)
    assert s.tolist() == [[0.5, 0.5, 0.5, 0.0], [0.5, 0.0, 0.0, 0.0]]
    n = loss.token_weights(MASK, "SequenceMeanTokenSumNorm", total_tokens=4, total_sequences=2, constant=8)
    assert n.tolist() == [[1 / 16, 1 / 16, 1 / 16, 0.0], [1 / 16, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="constant"):
        loss.token_weights(MASK, "SequenceMeanTokenSumNorm", total_tokens=4, total_sequences=2)


OBJECTIVES = [
    Objective(),
    Objective(clip_high=0.28, dual_clip=3.0),
    Objective(policy_loss="GSPO", clip_low=3e-4, clip_high=4e-4),
    Objective(policy_loss="CISPO", clip_low=1.0, clip_high=4.0),
    Objective(importance_level="Sequence"),
    Objective(rejection="Token", rejection_low=0.9, rejection_high=1.1),
]


@pytest.mark.parametrize(
    "objective", OBJECTIVES, ids=lambda o: f"{o.policy_loss}-{o.importance_level}-{o.rejection}"
)
@pytest.mark.parametrize(
    "aggregation", ["TokenMean", "SequenceMeanTokenMean", "SequenceMeanTokenSum", "SequenceMeanTokenSumNorm"]
)
def test_micro_batches_change_nothing_but_the_order_of_additions(
    objective: Objective, aggregation: str
) -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])
    behaviour = -torch.rand(4, 4) * 3
    base = behaviour + 0.3 * torch.randn(4, 4)
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0])

    def run(parts: list[slice]) -> tuple[float, torch.Tensor]:
        logprobs = base.clone().requires_grad_(True)
        total = torch.zeros(())
        for sl in parts:
            w = loss.token_weights(mask[sl], aggregation, int(mask.sum()), 4, constant=6)
            total = (
                total
                + loss.policy_objective(
                    logprobs[sl], behaviour[sl], adv[sl], w, objective, mask=mask[sl]
                ).loss
            )
        total.backward()
        assert logprobs.grad is not None
        return float(total.detach()), logprobs.grad

    full, g_full = run([slice(0, 4)])
    parts, g_parts = run([slice(0, 1), slice(1, 3), slice(3, 4)])
    assert parts == pytest.approx(full, abs=1e-6)
    torch.testing.assert_close(g_parts, g_full)
