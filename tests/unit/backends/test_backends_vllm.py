"""The vLLM backend's CUDA-free parts: request building, adapter checks, output conversion, clear errors.

The engine itself cannot run on the project's machines (CUDA only) and is not exercised by CI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from echo_runtime.backends import base
from echo_runtime.backends import vllm as vllm_backend
from echo_runtime.rollout import Rollout


def test_sampling_params_kwargs() -> None:
    params = base.SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=64, seed=9)
    assert vllm_backend.sampling_params_kwargs(8, params, seed=123) == {
        "n": 8,
        "temperature": 0.7,
        "top_p": 1.0,
        "max_tokens": 64,
        "logprobs": 0,
        "seed": 123,
        "detokenize": False,
        "stop_token_ids": [],
    }
    # the model's own EOS ids (e.g. a chat model's <|im_end|> and <|endoftext|>) are passed explicitly
    with_stops = vllm_backend.sampling_params_kwargs(8, params, seed=123, stop_token_ids=frozenset({2, 0}))
    assert with_stops["stop_token_ids"] == [0, 2]


def test_top_p_below_one_is_refused_rather_than_misreported() -> None:
    with pytest.raises(ValueError, match="top_p = 1 only"):
        vllm_backend.sampling_params_kwargs(2, base.SamplingParams(top_p=0.9), seed=0)


def test_prompt_seeds_are_distinct_and_stable() -> None:
    seeds = [vllm_backend.prompt_seed(5, i) for i in range(100)]
    assert len(set(seeds)) == 100
    assert seeds == [vllm_backend.prompt_seed(5, i) for i in range(100)]
    assert all(0 <= s < 2**63 for s in seeds)
    assert vllm_backend.prompt_seed(2**63 - 1, 3) < 2**63


def test_lora_request_kwargs(tmp_path: Path) -> None:
    assert vllm_backend.lora_request_kwargs(0, tmp_path) == {
        "lora_name": "v0",
        "lora_int_id": 1,
        "lora_path": str(tmp_path),
    }
    assert vllm_backend.lora_request_kwargs(41, tmp_path)["lora_int_id"] == 42
    with pytest.raises(ValueError, match=">= 0"):
        vllm_backend.lora_request_kwargs(-1, tmp_path)


def test_check_adapter_accepts_peft_dirs_within_the_rank_limit(write_adapter: Callable[..., Path]) -> None:
    path = write_adapter(rank=8, config={"r": 8})
    assert vllm_backend.check_adapter(path, max_lora_rank=8).max_rank == 8
    with pytest.raises(ValueError, match="max_lora_rank 4"):
        vllm_backend.check_adapter(path, max_lora_rank=4)
    with pytest.raises(ValueError, match="use_dora"):
        vllm_backend.check_adapter(write_adapter("dora", config={"use_dora": True}))


@dataclasses.dataclass
class _Logprob:  # vllm.sequence.Logprob's shape
    logprob: float


class _Tokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


def test_to_sample_reads_the_sampled_tokens_logprob_and_stops_at_eos() -> None:
    logprobs = [{5: _Logprob(-0.5), 9: _Logprob(-0.1)}, {6: _Logprob(-1.5)}, {2: _Logprob(-0.25)}]
    sample = vllm_backend.to_sample(_Tokenizer(), [1, 2], [5, 6, 2], logprobs, frozenset({2}))
    assert sample == Rollout(
        text="5 6",
        prompt_ids=(1, 2),
        completion_ids=(5, 6, 2),
        logprobs=(-0.5, -1.5, -0.25),
        finish_reason="stop",
    )
    with pytest.raises(ValueError, match="2 log-prob entries for 3 tokens"):
        vllm_backend.to_sample(_Tokenizer(), [1], [5, 6, 2], logprobs[:2], frozenset({2}))


@pytest.mark.skipif(vllm_backend.available(), reason="vllm is installed here")
def test_backend_without_vllm_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(ImportError, match="needs CUDA and the `vllm` extra"):
        vllm_backend.VllmBackend(tmp_path)


def test_backend_refuses_non_cuda_devices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs CUDA"):
        vllm_backend.VllmBackend(tmp_path, device="cpu")
