"""The byte-level BPE tokenizer of Echo's built-in models, trained on the built-in tasks' text.

Promises:

* **Qwen2-style pre-tokenization.** NFC normalisation, then the Qwen2 split regex, under which every digit
  is its own pre-token (``\\p{N}`` matches one character), then GPT-2 byte-level mapping. So numbers are
  always spelled digit by digit (``"19"`` is two tokens), which is what lets a tiny model learn
  arithmetic, and for the arithmetic task ``encode(prompt) + encode(completion) == encode(prompt +
  completion)``.
* **Any text encodes.** The 256 byte symbols are all in the vocabulary, so no input is ever unknown, and
  ``decode(encode(text)) == text`` for NFC-normal text.
* **One special token**, :data:`EOS_TOKEN` (``<|endoftext|>``), used as end-of-sequence *and* padding.
  Nothing is added to encoded text (no BOS): a prompt's ids are exactly its text's ids.
* **Deterministic.** The same corpus and vocabulary size give a byte-identical ``tokenizer.json``.
* **Loadable by the ordinary tools.** :func:`save_tokenizer` writes a ``PreTrainedTokenizerFast``
  (``tokenizer.json`` + ``tokenizer_config.json``) that ``transformers.AutoTokenizer`` and ``mlx_lm.load``
  read from the directory.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
"""End-of-sequence and padding token of the built-in models."""

SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenization regex: words, single digits, punctuation runs, whitespace."""

CORPUS_SEED = 0
"""Seed of the task corpus the tokenizer is trained on (the tokenizer does not depend on the model seed)."""

CORPUS_PER_TASK = 2000
"""Prompts (each with its reference) drawn per built-in task for tokenizer training."""


def _empty_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    byte_level_decoder: Any = decoders.ByteLevel  # the stubs omit the (decode-irrelevant) options
    tokenizer.decoder = byte_level_decoder(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tokenizer


@functools.lru_cache(maxsize=4)
def _cached_corpus(seed: int, per_task: int) -> tuple[str, ...]:
    from echo_runtime.tasks import corpus

    return tuple(corpus(seed=seed, per_task=per_task))


def task_corpus(seed: int = CORPUS_SEED, per_task: int = CORPUS_PER_TASK) -> list[str]:
    """The built-in tasks' prompts and references (``echo_runtime.tasks.corpus``), memoised per process."""
    return list(_cached_corpus(seed, per_task))


def train_tokenizer(vocab_size: int, texts: Iterable[str] | None = None) -> Tokenizer:
    """Train the byte-level BPE on ``texts`` (default: :func:`task_corpus`) up to ``vocab_size`` tokens.

    ``vocab_size`` counts the 256 byte symbols and :data:`EOS_TOKEN`; it must be at least 257. Training is
    deterministic: the same texts and size give the same tokenizer.
    """
    if vocab_size < 257:
        raise ValueError(f"vocab_size must be at least 257 (256 bytes + {EOS_TOKEN}), got {vocab_size}")
    corpus: Sequence[str] = list(texts) if texts is not None else task_corpus()
    tokenizer = _empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Sorting makes the result independent of the corpus's order as well.
    tokenizer.train_from_iterator(sorted(corpus), trainer=trainer, length=len(corpus))
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, out_dir: str | Path, *, model_max_length: int = 2048) -> None:
    """Write ``tokenizer`` to ``out_dir`` as a ``PreTrainedTokenizerFast`` with EOS = PAD = <|endoftext|>."""
    from transformers import PreTrainedTokenizerFast as _Fast

    fast_class: Any = _Fast

    fast = fast_class(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))
    # transformers 5 records its new backend class name; the classic name loads in every version
    # (transformers 4.x, and so mlx-lm installs that still use it) and maps to the same class in 5.x.
    config_path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
