"""Sampling on the real tiny model, for each backend that runs here: the promises of ``base.Backend.sample``.

n completions per prompt in prompt order; behaviour log-probs equal ``score_logprobs`` of the same tokens
(with temperature and top-p); EOS ends a completion and is kept; the length limit; seeded determinism.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_runtime.backends import base
from echo_runtime.rollout import Rollout

BACKENDS = ["transformers", "mlx"]
PROMPTS = ["What is 12 + 30?", "Solve: 7 * 6 =", "A knight says: I am a knave.", "x", "What is 12 + 30?"]


def _max_gap(backend: Any, samples: list[Rollout], temperature: float) -> float:
    worst = 0.0
    for s in samples:
        scored = backend.score_logprobs(s.prompt_ids, s.completion_ids, temperature)
        worst = max([worst, *(abs(a - b) for a, b in zip(scored, s.logprobs, strict=True))])
    return worst


@pytest.mark.parametrize("name", BACKENDS)
def test_n_samples_per_prompt_with_exact_behaviour_logprobs(
    name: str, make_backend: Callable[..., Any], full_snapshot: Path
) -> None:
    backend = make_backend(name)
    backend.apply_snapshot(1, full_snapshot, "full")  # a sharp policy: top-p cuts real mass
    assert (backend.name, backend.device, backend.dtype) == (name, "cpu", "float32")
    for params in (
        base.SamplingParams(temperature=1.0, max_new_tokens=12, seed=5),
        base.SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=12, seed=5),
    ):
        groups = backend.sample(PROMPTS, 3, params)
        assert len(groups) == len(PROMPTS)
        for prompt, group in zip(PROMPTS, groups, strict=True):
            assert len(group) == 3
            for s in group:
                assert list(s.prompt_ids) == backend.tokenizer.encode(prompt)
                assert len(s.logprobs) == len(s.completion_ids) >= 1
                assert all(lp <= 0.0 for lp in s.logprobs)
        flat = [s for g in groups for s in g]
        assert _max_gap(backend, flat, params.temperature) <= 1e-4
        # n samples of one prompt are not copies of each other.
        assert len({s.completion_ids for s in groups[0]}) > 1


@pytest.mark.parametrize("name", BACKENDS)
def test_length_limit(name: str, make_backend: Callable[..., Any]) -> None:
    backend = make_backend(name)
    backend.eos_ids = frozenset({-1})  # nothing can stop early
    groups = backend.sample(["x", "What is 1 + 1?"], 2, base.SamplingParams(max_new_tokens=7, seed=1))
    for s in (s for g in groups for s in g):
        assert s.finish_reason == "length"
        assert len(s.completion_ids) == 7
        assert s.text == backend.tokenizer.decode(list(s.completion_ids))


@pytest.mark.parametrize("name", BACKENDS)
def test_eos_ends_a_completion_and_is_kept(name: str, make_backend: Callable[..., Any]) -> None:
    backend = make_backend(name)
    # Half the vocabulary ends a completion, so rows stop at different steps within one batch.
    backend.eos_ids = frozenset(range(0, len(backend.tokenizer), 2))
    groups = backend.sample(PROMPTS, 4, base.SamplingParams(max_new_tokens=16, seed=3))
    flat = [s for g in groups for s in g]
    lengths = {len(s.completion_ids) for s in flat if s.finish_reason == "stop"}
    assert len(lengths) > 1, "rows of one batch should stop at different steps"
    for s in flat:
        body = s.completion_ids[:-1] if s.finish_reason == "stop" else s.completion_ids
        assert not set(body) & backend.eos_ids, "tokens after a completion's first EOS must be dropped"
        if s.finish_reason == "stop":
            assert s.completion_ids[-1] in backend.eos_ids
            assert s.text == backend.tokenizer.decode(list(body))
        else:
            assert len(s.completion_ids) == 16
    assert _max_gap(backend, flat, 1.0) <= 1e-4


@pytest.mark.parametrize("name", BACKENDS)
def test_seeded_sampling_is_reproducible(name: str, make_backend: Callable[..., Any]) -> None:
    backend = make_backend(name)
    params = base.SamplingParams(temperature=0.9, max_new_tokens=10, seed=1234)
    torch_rng = torch.get_rng_state()
    first = backend.sample(PROMPTS, 2, params)
    assert backend.sample(PROMPTS, 2, params) == first
    assert torch.equal(torch.get_rng_state(), torch_rng), "sampling must not consume the global torch RNG"
    other = backend.sample(PROMPTS, 2, base.SamplingParams(temperature=0.9, max_new_tokens=10, seed=1235))
    assert other != first
    # A batch larger than max_batch_rows is split into chunks, with the same promises.
    small = make_backend(name, max_batch_rows=3)
    chunked = small.sample(PROMPTS, 2, params)
    assert [len(g) for g in chunked] == [2] * len(PROMPTS)
    assert small.sample(PROMPTS, 2, params) == chunked


@pytest.mark.parametrize("name", BACKENDS)
def test_bad_requests_are_rejected(name: str, make_backend: Callable[..., Any]) -> None:
    backend = make_backend(name)
    with pytest.raises(ValueError, match="n \\(completions per prompt\\)"):
        backend.sample(["x"], 0, base.SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        backend.sample(["x"], 1, base.SamplingParams(temperature=0.0))
    with pytest.raises(ValueError, match="top_p"):
        backend.sample(["x"], 1, base.SamplingParams(top_p=1.5))
    with pytest.raises(ValueError, match="at least one"):
        backend.sample([""], 1, base.SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        backend.score_logprobs([1, 2], [3], 0.0)
    assert backend.sample([], 2, base.SamplingParams()) == []
    assert backend.score_logprobs([1, 2], [], 1.0) == []


@pytest.mark.parametrize("name", BACKENDS)
def test_keyed_draws_are_the_keys_and_pass_the_trainers_interval_check(
    name: str, make_backend: Callable[..., Any], tiny_model: Path
) -> None:
    """With keys, a completion is a function of (weights, prompt, key): the same whatever ``seed`` or
    chunking, different for another key; and every token's interval of the trainer's recomputed
    distribution contains its uniform (within float rounding: both compute float32 probabilities)."""
    from echo_runtime.backends import seeded
    from echo_runtime.spec.policy import Model
    from echo_runtime.trainer import policy as trainer_policy

    keys = tuple(1000 + 17 * i for i in range(len(PROMPTS)))
    params = base.SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=10, keys=keys)
    backend = make_backend(name)
    first = backend.sample(PROMPTS, 3, params)
    assert backend.sample(PROMPTS, 3, base.SamplingParams(**{**params.__dict__, "seed": 99})) == first
    chunked = make_backend(name, max_batch_rows=2).sample(PROMPTS, 3, params)  # other padding: float rounding
    assert [r.completion_ids for g in chunked for r in g] == [r.completion_ids for g in first for r in g]
    other = backend.sample(
        PROMPTS, 3, base.SamplingParams(**{**params.__dict__, "keys": (5,) * len(PROMPTS)})
    )
    assert [r.completion_ids for g in other for r in g] != [r.completion_ids for g in first for r in g]
    with pytest.raises(ValueError, match="keys: one per prompt"):
        backend.sample(PROMPTS, 1, base.SamplingParams(keys=(1,)))
    policy = trainer_policy.load_policy(
        Model(path=str(tiny_model), finetune="Full"), model_dir=str(tiny_model)
    )
    worst, departed = 0.0, []
    with torch.no_grad():
        for key, group in zip(keys, first, strict=True):
            for row, r in enumerate(group):
                packed = trainer_policy.pack([r], policy.pad_id)
                logits = trainer_policy.completion_logits(policy.model.eval(), packed)
                probs = seeded.distribution(logits, params.temperature, params.top_p)
                tokens = torch.tensor(r.completion_ids)
                mine = torch.tensor(
                    [seeded.uniform(key, row, t) for t in range(len(tokens))], dtype=torch.float64
                )
                worst = max(worst, float(seeded.violations(probs, tokens, mine).max()))
                # The same text claimed for another row (a chosen sample) departs from that row's draws.
                theirs = torch.tensor(
                    [seeded.uniform(key, row + 3, t) for t in range(len(tokens))], dtype=torch.float64
                )
                departed.append(float(seeded.violations(probs, tokens, theirs).max()))
    assert worst < 1e-4, worst
    assert sum(d > 1e-3 for d in departed) >= 0.9 * len(departed), departed
