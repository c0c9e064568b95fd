"""Framework-free pieces every backend shares: request checks, prompt encoding, EOS ids, finished samples.

Promises:

* :func:`check_request` rejects what no backend can honour (no prompts is fine; ``n < 1``, a
  non-positive temperature, ``top_p`` outside ``(0, 1]``, ``max_new_tokens < 1`` are not) with a message
  naming the field and what is allowed.
* :func:`encode_prompt` is the one tokenisation of a prompt (text or chat messages):
  :func:`echo_runtime.models.prompts.encode` under the job's prompt style — the chat template when the
  model has one (``task.promptFormat: Auto``), else the tokenizer's defaults. Every backend, and so every
  rollout's ``prompt_ids``, and the trainer's recomputation come from it.
* :func:`finish` cuts a sampled token stream at its first EOS (kept, ``"stop"``) or leaves it at the
  length limit (``"length"``), keeps the log-probs aligned with the tokens, and decodes the text without
  the EOS token.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from echo_runtime import rollout
from echo_runtime.backends import base, seeded
from echo_runtime.models import prompts

MAX_SEED = 2**63 - 1


def check_request(requests: Sequence[prompts.Prompt], n: int, params: base.SamplingParams) -> None:
    """Raise a ValueError naming the offending field if the request cannot be sampled."""
    if isinstance(requests, str):
        raise TypeError("prompts must be a sequence of strings, not one string")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (completions per prompt) must be an integer >= 1, got {n!r}")
    if not math.isfinite(params.temperature) or params.temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {params.temperature!r}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p!r}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens!r}")
    if params.seed is not None and not 0 <= params.seed <= MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**63 - 1], got {params.seed!r}")
    if params.keys is not None:
        if len(params.keys) != len(requests):
            raise ValueError(f"keys: one per prompt, got {len(params.keys)} for {len(requests)} prompt(s)")
        for i, key in enumerate(params.keys):
            if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < 1 << seeded.KEY_BITS:
                raise ValueError(f"keys[{i}]: a {seeded.KEY_BITS}-bit non-negative integer, got {key!r}")


def seeded_rows(keys: Sequence[int] | None, prompts: int, n: int) -> list[tuple[int, int]] | None:
    """Per sampled row (prompt-major, ``n`` rows a prompt) its ``(key, row in its group)``; None
    without keys."""
    if keys is None:
        return None
    if len(keys) != prompts:
        raise ValueError(f"keys: one per prompt, got {len(keys)} for {prompts} prompt(s)")
    return [(keys[p], r) for p in range(prompts) for r in range(n)]


def resolve_seed(seed: int | None) -> int:
    """``seed`` itself, or a fresh random one when it is None (so every call is reproducible from its seed)."""
    return secrets.randbits(63) if seed is None else seed


def encode_prompt(
    tokenizer: Any, prompt: prompts.Prompt, style: prompts.PromptStyle | None = None
) -> list[int]:
    """Token ids of ``prompt`` under ``style`` (:func:`echo_runtime.models.prompts.encode`); an empty
    encoding is a ValueError."""
    return prompts.encode(tokenizer, prompt, style)


def _as_ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def eos_token_ids(model_dir: str | Path, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a completion: the tokenizer's EOS plus ``eos_token_id`` of ``config.json`` and
    ``generation_config.json`` in ``model_dir`` (chat models often list several there)."""
    ids = _as_ids(getattr(tokenizer, "eos_token_id", None))
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                ids |= _as_ids(data.get("eos_token_id"))
    if not ids:
        raise ValueError(f"the model in {model_dir} defines no EOS token; completions could never stop")
    return frozenset(ids)


def finish(
    tokenizer: Any,
    prompt_ids: Sequence[int],
    token_ids: Iterable[int],
    logprobs: Iterable[float],
    eos_ids: frozenset[int],
) -> rollout.Rollout:
    """A rollout (:func:`echo_runtime.rollout.sampled`) from a raw sampled stream (cut at its first EOS)."""
    completion: list[int] = []
    values: list[float] = []
    stopped = False
    for token, logprob in zip(token_ids, logprobs, strict=True):
        completion.append(int(token))
        values.append(float(logprob))
        if token in eos_ids:
            stopped = True
            break
    text_ids = completion[:-1] if stopped else completion
    return rollout.sampled(
        prompt_ids,
        completion,
        values,
        text=tokenizer.decode(text_ids, skip_special_tokens=False),
        finish_reason="stop" if stopped else "length",
    )


def model_dtype(model_dir: str | Path, default: str = "float32") -> str:
    """The dtype a Hugging Face checkpoint declares (``dtype`` or ``torch_dtype`` in ``config.json``),
    as one of ``float32``/``bfloat16``/``float16``; ``default`` when it declares none of those."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return default
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        return default
    declared = data.get("dtype") or data.get("torch_dtype")
    return declared if declared in ("float32", "bfloat16", "float16") else default
