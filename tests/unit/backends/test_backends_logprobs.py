"""The one log-prob definition (torch) and its mlx twin; the top-p nucleus filters of both backends."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from echo_runtime.backends import logprobs, seeded


class _ToyLM(torch.nn.Module):
    """A causal LM of sorts: logits depend on the current and previous token (so position matters)."""

    def __init__(self, vocab: int = 11, dim: int = 5) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter(torch.randn(vocab, dim, generator=generator))
        self.out = torch.nn.Parameter(torch.randn(dim, vocab, generator=generator) * 3)

    def forward(self, input_ids: torch.Tensor) -> Any:
        h = self.embed[input_ids]
        h = h + torch.nn.functional.pad(h, (0, 0, 1, 0))[:, :-1] * 0.5
        return SimpleNamespace(logits=h @ self.out)


def test_token_logprobs_is_log_softmax_of_scaled_float32_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    got = logprobs.token_logprobs(logits, torch.tensor([2, 1]), 0.5)
    assert got.dtype == torch.float32
    expected = [6.0 - math.log(math.exp(2) + math.exp(4) + math.exp(6)), -math.log(3)]
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_completion_and_shifted_forms_agree() -> None:
    model = _ToyLM()
    prompt, completion = [3, 1, 4], [1, 5, 9, 2]
    single = logprobs.sequence_logprobs(model, prompt, completion, 0.8)
    ids = torch.tensor([prompt + completion])
    batched = logprobs.shifted_logprobs(model(ids).logits, ids, 0.8)[0, len(prompt) - 1 :]
    assert single == pytest.approx(batched.tolist(), abs=1e-6)
    assert logprobs.sequence_logprobs(model, prompt, [], 1.0) == []
    with pytest.raises(ValueError, match="at least one token"):
        logprobs.sequence_logprobs(model, [], [1], 1.0)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf"), float("nan")])
def test_temperature_must_be_positive_and_finite(temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        logprobs.check_temperature(temperature)


PROBS = [0.5, 0.3, 0.15, 0.05]


@pytest.mark.parametrize(
    ("top_p", "kept"), [(1.0, {0, 1, 2, 3}), (0.81, {0, 1, 2}), (0.7, {0, 1}), (0.5, {0}), (0.01, {0})]
)
def test_torch_top_p_keeps_the_smallest_nucleus(top_p: float, kept: set[int]) -> None:
    order = [2, 0, 3, 1]  # shuffled, so the filter must sort and unsort
    logits = torch.log(torch.tensor([[PROBS[i] for i in order]]))
    filtered = seeded.top_p_filter(logits, top_p)
    survivors = {order[i] for i in range(4) if math.isfinite(filtered[0, i].item())}
    assert survivors == kept
    finite = torch.isfinite(filtered)
    assert torch.equal(filtered[finite], logits[finite])


def test_mlx_top_p_and_log_softmax_match_torch() -> None:
    mx = pytest.importorskip("mlx.core")
    from echo_runtime.backends import mlx as mlx_backend

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 50)).astype(np.float32) * 3
    for top_p in (1.0, 0.95, 0.6, 0.2):
        by_torch = torch.isfinite(seeded.top_p_filter(torch.from_numpy(logits), top_p)).numpy()
        by_mlx = np.isfinite(np.array(mlx_backend.top_p_filter(mx.array(logits), top_p)))
        assert (by_torch == by_mlx).all(), top_p
    ours = np.array(mlx_backend.log_softmax(mx.array(logits), 0.7))
    reference = torch.log_softmax(torch.from_numpy(logits) / 0.7, dim=-1).numpy()
    assert np.abs(ours - reference).max() <= 1e-5


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("in_place", [False, True])
def test_entropy_and_its_gradient_match_the_full_softmax(temperature: float, in_place: bool) -> None:
    torch.manual_seed(3)
    base = torch.randn(6, 4, 17)
    targets = torch.randint(0, 17, (6, 4))
    mix_v, mix_h = torch.randn(6, 4), torch.randn(6, 4)
    # reference: H = −Σ p log p over the whole softmax, autograd through it
    ref_logits = base.clone().double().requires_grad_(True)
    log_p = torch.log_softmax(ref_logits / temperature, dim=-1)
    ref_v = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ref_h = -(log_p.exp() * log_p).sum(-1)
    (ref_v * mix_v + ref_h * mix_h).sum().backward()
    logits = base.clone().requires_grad_(True)
    work = logits * 1.0  # a non-leaf the in-place backward may overwrite
    values, entropy = logprobs.token_logprobs_entropy(work, targets, temperature, in_place=in_place)
    torch.testing.assert_close(values.double(), ref_v.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy.double(), ref_h.detach(), atol=1e-5, rtol=1e-5)
    (values * mix_v + entropy * mix_h).sum().backward()
    assert logits.grad is not None and ref_logits.grad is not None
    torch.testing.assert_close(logits.grad.double(), ref_logits.grad, atol=1e-5, rtol=1e-5)
    # without gradients: the same numbers
    with torch.no_grad():
        v2, h2 = logprobs.token_logprobs_entropy(base, targets, temperature)
    torch.testing.assert_close(h2, entropy.detach())
    torch.testing.assert_close(v2, values.detach())
