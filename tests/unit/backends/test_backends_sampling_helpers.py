"""The framework-free sampling helpers: request checks, EOS handling, EOS ids, declared dtype."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from echo_runtime.backends import base, sampling
from echo_runtime.rollout import Rollout


class _Tokenizer:
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("<eos>" if i == 0 else chr(i) for i in ids)


@pytest.mark.parametrize(
    ("n", "params", "message"),
    [
        (0, base.SamplingParams(), "n \\(completions per prompt\\)"),
        (True, base.SamplingParams(), "n \\(completions per prompt\\)"),
        (1, base.SamplingParams(temperature=0.0), "temperature"),
        (1, base.SamplingParams(temperature=float("nan")), "temperature"),
        (1, base.SamplingParams(top_p=0.0), "top_p"),
        (1, base.SamplingParams(top_p=1.01), "top_p"),
        (1, base.SamplingParams(max_new_tokens=0), "max_new_tokens"),
        (1, base.SamplingParams(seed=-1), "seed"),
    ],
)
def test_check_request_names_the_field(n: Any, params: base.SamplingParams, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sampling.check_request(["p"], n, params)


def test_check_request_accepts_good_requests() -> None:
    sampling.check_request([], 1, base.SamplingParams())
    sampling.check_request(["a", "b"], 8, base.SamplingParams(temperature=0.7, top_p=0.9, seed=0))
    with pytest.raises(TypeError, match="not one string"):
        sampling.check_request("abc", 1, base.SamplingParams())


def test_finish_cuts_at_the_first_eos_and_keeps_it() -> None:
    tok = _Tokenizer()
    s = sampling.finish(tok, [104, 105], [97, 98, 0, 99, 0], [-1.0, -2.0, -3.0, -4.0, -5.0], frozenset({0}))
    assert s == Rollout(
        text="ab",
        prompt_ids=(104, 105),
        completion_ids=(97, 98, 0),
        logprobs=(-1.0, -2.0, -3.0),
        finish_reason="stop",
    )
    s = sampling.finish(tok, [104], [97, 98], [-1.0, -2.0], frozenset({0}))
    assert (s.text, s.completion_ids, s.finish_reason) == ("ab", (97, 98), "length")
    with pytest.raises(ValueError):
        sampling.finish(tok, [104], [97, 98], [-1.0], frozenset({0}))


def test_encode_prompt_refuses_empty_prompts() -> None:
    assert sampling.encode_prompt(_Tokenizer(), "hi") == [104, 105]
    with pytest.raises(ValueError, match="at least one"):
        sampling.encode_prompt(_Tokenizer(), "")


def test_eos_ids_collect_tokenizer_and_configs(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 5}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    assert sampling.eos_token_ids(tmp_path, _Tokenizer()) == {0, 5, 7}
    empty = tmp_path / "empty"
    empty.mkdir()

    class NoEos:
        eos_token_id = None

    with pytest.raises(ValueError, match="no EOS"):
        sampling.eos_token_ids(empty, NoEos())


def test_model_dtype_reads_the_declared_dtype(tmp_path: Path) -> None:
    assert sampling.model_dtype(tmp_path) == "float32"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert sampling.model_dtype(tmp_path) == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float64"}))
    assert sampling.model_dtype(tmp_path, default="float16") == "float16"


def test_resolve_seed() -> None:
    assert sampling.resolve_seed(42) == 42
    assert 0 <= sampling.resolve_seed(None) <= sampling.MAX_SEED
