"""Decoding token ids without torch: what the coordinator's trust check needs of a tokenizer.

The coordinator checks that a rollout's token ids decode to the text it scores (:mod:`echo_runtime.
coordinator.trust`), so it needs a tokenizer's ``decode`` and its end-of-sequence ids — nothing else.
``transformers.AutoTokenizer`` would give both, but loading it imports torch (through the model
configuration code): about 0.5 GiB of resident memory in a process that never runs a model. A fast
tokenizer's ``tokenizer.json`` read by the ``tokenizers`` library decodes the same way, so this module
does that.

Promises:

* :func:`load` returns a decoder whose ``decode(ids)`` equals ``AutoTokenizer.decode(ids,
  skip_special_tokens=False)`` for the same directory, and the same end-of-sequence ids as
  :func:`echo_runtime.backends.sampling.eos_token_ids` (tested against transformers on Echo's models);
* where that equality is not assured — no ``tokenizer.json`` (a slow, sentencepiece-only tokenizer), or
  ``clean_up_tokenization_spaces`` set, which transformers applies after decoding — it returns None and
  the caller loads the transformers tokenizer instead.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Decoder:
    """``decode(ids)`` and the model's end-of-sequence ids."""

    decode: Callable[[Sequence[int]], str]
    eos_ids: frozenset[int]


@dataclasses.dataclass(frozen=True)
class _EosOnly:
    """Stands in for a tokenizer where only ``eos_token_id`` is read (:func:`sampling.eos_token_ids`)."""

    eos_token_id: int | None


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def load(model_dir: str | Path) -> Decoder | None:
    """The torch-free decoder of the resolved model directory ``model_dir``, or None where only
    transformers decodes exactly (see the module docstring)."""
    from tokenizers import Tokenizer

    from echo_runtime.backends import sampling

    folder = Path(model_dir)
    if not (folder / "tokenizer.json").is_file():
        return None
    config = _json(folder / "tokenizer_config.json")
    if config.get("clean_up_tokenization_spaces"):
        return None
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos_token = config.get("eos_token")
    if isinstance(eos_token, dict):
        eos_token = eos_token.get("content")
    eos_id = tokenizer.token_to_id(eos_token) if isinstance(eos_token, str) else None
    eos_ids = sampling.eos_token_ids(folder, _EosOnly(eos_id))

    def decode(ids: Sequence[int]) -> str:
        text: str = tokenizer.decode(list(ids), skip_special_tokens=False)
        return text

    return Decoder(decode=decode, eos_ids=eos_ids)
