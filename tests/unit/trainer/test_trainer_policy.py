"""The trainer's log-probs: selective and chunked, equal to the naive full-logits form, gradients too."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from echo_runtime.backends import logprobs as shared
from echo_runtime.rollout import Rollout
from echo_runtime.spec.policy import LoRA, Model
from echo_runtime.trainer import policy as trainer_policy


def rollouts(seed: int, shapes: list[tuple[int, int]]) -> list[Rollout]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for p, c in shapes:
        prompt = torch.randint(0, 1000, (p,), generator=g).tolist()
        completion = torch.randint(0, 1000, (c,), generator=g).tolist()
        out.append(Rollout(tuple(prompt), tuple(completion), tuple([-1.0] * c), 0.0, 0))
    return out


SHAPES = [(3, 5), (9, 2), (5, 7), (1, 1)]


def test_pack_aligns_every_completion_at_one_column() -> None:
    rs = rollouts(0, SHAPES)
    packed = trainer_policy.pack(rs, pad_id=7)
    assert packed.start == 9 and packed.input_ids.shape == (4, 9 + 7)
    for i, r in enumerate(rs):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        row = packed.input_ids[i].tolist()
        assert row[9 - p : 9 + c] == [*r.prompt_ids, *r.completion_ids]
        assert row[: 9 - p] == [7] * (9 - p) and row[9 + c :] == [7] * (7 - c)
        assert packed.attention_mask[i].tolist() == [0] * (9 - p) + [1] * (p + c) + [0] * (7 - c)
        # positions count from the row's own first token, as in an unpadded forward pass
        assert packed.position_ids[i, 9 - p : 9 + c].tolist() == list(range(p + c))
        assert packed.targets[i, :c].tolist() == list(r.completion_ids)
        assert packed.mask[i].tolist() == [1.0] * c + [0.0] * (7 - c)
        # the logits asked for: exactly the positions that predict this row's completion tokens
        assert packed.keep[i].nonzero().flatten().tolist() == list(range(9 - 1, 9 - 1 + c))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selective_log_probs_equal_unpadded_and_naive_ones(
    make_policy: Callable[..., trainer_policy.TrainablePolicy], temperature: float
) -> None:
    policy = make_policy()
    rs = rollouts(1, SHAPES)
    packed = trainer_policy.pack(rs, policy.pad_id)
    selective = trainer_policy.completion_logprobs(policy.model, packed, temperature)
    naive = trainer_policy.full_logits_logprobs(policy.model, packed, temperature)
    mask = packed.mask.bool()
    assert (selective - naive).abs()[mask].max().item() < 2e-6
    for i, r in enumerate(rs):
        alone = shared.sequence_logprobs(
            policy.model, list(r.prompt_ids), list(r.completion_ids), temperature
        )
        assert selective[i, : len(alone)].tolist() == pytest.approx(alone, abs=2e-6)


def test_gradients_equal_the_naive_form(make_policy: Callable[..., trainer_policy.TrainablePolicy]) -> None:
    rs = rollouts(2, SHAPES)

    def grads(fn: Callable[..., torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
        policy = make_policy(seed=3)
        packed = trainer_policy.pack(rs, policy.pad_id)
        value = (fn(policy.model, packed, 0.9) * packed.mask).sum()
        value.backward()
        return value.item(), [p.grad.clone() for p in policy.trainable_parameters() if p.grad is not None]

    loss_a, grads_a = grads(trainer_policy.completion_logprobs)
    loss_b, grads_b = grads(trainer_policy.full_logits_logprobs)
    assert loss_a == pytest.approx(loss_b, abs=1e-5)
    assert len(grads_a) == len(grads_b) > 0
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_chunks_split_a_large_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "CHUNK_ELEMENTS", 64)  # 2 tokens of a 32-entry vocabulary per chunk
    logits = torch.randn(3, 5, 32, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 32, (3, 5))
    chunked = shared.token_logprobs(logits, targets, 0.5)
    full = shared.full_logprobs(logits, targets, 0.5)
    assert torch.allclose(chunked, full.float(), atol=1e-6)
    (g_chunked,) = torch.autograd.grad(chunked.sum(), logits)
    (g_full,) = torch.autograd.grad(full.sum(), logits)
    assert torch.allclose(g_chunked, g_full, atol=1e-6)


def test_gradient_checkpointing_changes_memory_not_gradients(tiny_model_dir: str) -> None:
    rs = rollouts(4, SHAPES)
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(5)
        spec = Model(finetune="LoRA", lora=LoRA(rank=4, alpha=8.0))
        policy = trainer_policy.load_policy(
            spec, model_dir=tiny_model_dir, gradient_checkpointing=checkpointing
        )
        inner = policy.model.base_model.model
        on = getattr(type(inner), "is_activation_checkpointing", None)
        assert (
            inner.is_activation_checkpointing if on is not None else inner.is_gradient_checkpointing
        ) == checkpointing
        packed = trainer_policy.pack(rs, policy.pad_id)
        (trainer_policy.completion_logprobs(policy.model, packed, 1.0) * packed.mask).sum().backward()
        results.append([p.grad.clone() for p in policy.trainable_parameters()])
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
