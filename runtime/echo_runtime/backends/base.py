"""The inference backend interface: load a base model, apply snapshots in place, sample with log-probs.

Every backend (``transformers``, ``mlx``, ``vllm``) implements :class:`Backend`. Promises:

* ``sample`` returns, for each prompt, ``n`` rollouts (:class:`echo_runtime.rollout.Rollout`, Echo's
  one rollout type, built by :func:`echo_runtime.rollout.sampled`) whose ``logprobs[i]`` is the
  *behaviour log-probability* of ``completion_ids[i]``: ``log softmax(logits / temperature)`` at that
  position under the currently applied snapshot — the quantity the trainer recomputes (top-p, if
  used, restricts what can be sampled but is not folded into the reported log-prob).
* Prompts are text or chat messages, turned into ids by
  :func:`echo_runtime.backends.sampling.encode_prompt` under the job's prompt style (``encode``).
* A completion ends at one of the model's EOS ids — the tokenizer's, ``config.json``'s and
  ``generation_config.json``'s (:func:`~echo_runtime.backends.sampling.eos_token_ids`), e.g. a chat
  model's ``<|im_end|>`` — included in ``completion_ids`` (``finish_reason`` ``"stop"``), or after
  ``max_new_tokens`` (``"length"``).
* ``apply_snapshot`` switches the weights to a published version without reloading the base model
  for LoRA snapshots; ``loaded_version`` then reports it (``None`` means the base model itself).
* ``name``, ``device`` and ``dtype`` describe where the samples came from; every rollout carries them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

from echo_runtime.models.prompts import Prompt
from echo_runtime.rollout import Rollout

SnapshotKind = Literal["lora", "full"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample: mirrors the manifest's ``spec.algorithm.sampling``."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    seed: int | None = None
    keys: tuple[int, ...] | None = None
    """Seeded draws (:mod:`echo_runtime.backends.seeded`): one 128-bit key per prompt; row ``r`` of
    prompt ``p``'s completions draws its token at position ``t`` by inverse CDF from
    ``uniform(keys[p], r, t)``, so the text is a function of (weights, prompt, key). ``seed`` is then
    not used."""


class Backend(Protocol):
    """What a worker needs from an inference engine."""

    name: str
    device: str
    dtype: str

    @property
    def loaded_version(self) -> int | None: ...

    def apply_snapshot(self, version: int, path: Path, kind: SnapshotKind) -> None:
        """Load snapshot ``version`` from the verified local directory ``path``."""
        ...

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's ids as this backend feeds them to the model (the job's prompt style applied)."""
        ...

    def sample(self, prompts: Sequence[Prompt], n: int, params: SamplingParams) -> list[list[Rollout]]:
        """``n`` completions for each prompt (text or chat messages), in prompt order."""
        ...

    def score_logprobs(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float
    ) -> list[float]:
        """Log-probs of a given completion under the current weights (parity and fidelity checks)."""
        ...
