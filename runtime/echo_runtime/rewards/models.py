"""The two kinds of model reward, in the scoring process: a sequence classifier and an LLM judge.

Both take a task's prompt (text or chat messages) and a batch of completions and return, per
completion, a reward in [0, 1] and a short reason. Deterministic: eval mode, no sampling.

* :class:`Classifier` — ``AutoModelForSequenceClassification``. The conversation (the prompt's
  messages, then the completion as the assistant's) goes through the tokenizer's chat template when it
  has one, else prompt and completion are joined. The score is the first logit (with two labels, the
  second minus the first: the "chosen" class), and the reward ``sigmoid(score / temperature)``.
* :class:`Judge` — a causal LM given ``rubric`` with ``{prompt}`` and ``{completion}`` filled in, as
  a user message through its chat template, decoded greedily for at most ``max_new_tokens``. The first
  number it writes is its score; in ``[score_min, score_max]`` it maps linearly to [0, 1]; none, or
  one outside the range, is reward 0 with the reason. The completion is untrusted text: it is only
  ever put into the rubric as text, and whatever it says the judge's reply is parsed for a number only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from echo_runtime.models.prompts import Prompt, messages
from echo_runtime.spec.rewards import RewardModel

Scored = tuple[float, str]
"""A reward in [0, 1] and why."""

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def conversation(prompt: Prompt, completion: str) -> list[dict[str, str]]:
    return [*messages(prompt), {"role": "assistant", "content": completion}]


def prompt_text(prompt: Prompt) -> str:
    """A prompt as text for a rubric: text as it is, chat messages as ``role: content`` lines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages(prompt))


def parse_score(reply: str, low: float, high: float) -> Scored:
    """The judge's first number, mapped from ``[low, high]`` to [0, 1]; 0 with the reason otherwise."""
    found = _NUMBER.search(reply)
    if found is None:
        return 0.0, f"judge gave no score: {reply[:80]!r}"
    value = float(found.group())
    if not math.isfinite(value) or not low <= value <= high:
        return 0.0, f"judge score {found.group()} outside {low:g}..{high:g}"
    return (value - low) / (high - low), f"judge score {found.group()}"


def _device(name: str) -> str:
    import torch

    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


class Classifier:
    def __init__(self, path: str, settings: RewardModel) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from echo_runtime.models.load import torch_dtype

        self.settings = settings
        self.device = _device(settings.device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        kwargs: dict[str, Any] = {}
        if settings.dtype is not None:
            kwargs["dtype"] = torch_dtype(settings.dtype)
        self.model: Any = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
        self.model = self.model.to(self.device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.labels = int(self.model.config.num_labels)
        if self.labels not in (1, 2):
            raise ValueError(
                f"rewardModels[{settings.name}]: a Classifier needs 1 or 2 labels (a score, or rejected/chosen); "
                f"{path} has {self.labels}"
            )

    def text(self, prompt: Prompt, completion: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            rendered = self.tokenizer.apply_chat_template(conversation(prompt, completion), tokenize=False)
            return str(rendered)
        return prompt_text(prompt) + completion

    def score(self, items: Sequence[tuple[Prompt, str]]) -> list[Scored]:
        import torch

        texts = [self.text(prompt, completion) for prompt, completion in items]
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True).to(self.device)
        with torch.no_grad():
            logits = self.model(**encoded).logits.float()
        raw = logits[:, 0] if self.labels == 1 else logits[:, 1] - logits[:, 0]
        rewards = torch.sigmoid(raw / self.settings.temperature).tolist()
        return [(float(r), f"score {float(s):.3g}") for r, s in zip(rewards, raw.tolist(), strict=True)]


class Judge:
    def __init__(self, path: str, settings: RewardModel) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from echo_runtime.models.load import torch_dtype

        assert settings.rubric is not None
        self.settings = settings
        self.device = _device(settings.device)
        self.tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        kwargs: dict[str, Any] = {}
        if settings.dtype is not None:
            kwargs["dtype"] = torch_dtype(settings.dtype)
        loader: Any = AutoModelForCausalLM
        self.model: Any = loader.from_pretrained(path, **kwargs)
        self.model = self.model.to(self.device).eval()
        self._torch = torch

    def text(self, prompt: Prompt, completion: str) -> str:
        rubric = self.settings.rubric or ""
        # One pass, so text inside the prompt or the completion that looks like a field stays text.
        filled = re.sub(
            r"\{prompt\}|\{completion\}",
            lambda m: prompt_text(prompt) if m.group() == "{prompt}" else completion,
            rubric,
        )
        if getattr(self.tokenizer, "chat_template", None):
            rendered = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": filled}], tokenize=False, add_generation_prompt=True
            )
            return str(rendered)
        return filled

    def replies(self, items: Sequence[tuple[Prompt, str]]) -> list[str]:
        texts = [self.text(prompt, completion) for prompt, completion in items]
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.device
        )
        with self._torch.no_grad():
            out = self.model.generate(
                **encoded,
                do_sample=False,
                max_new_tokens=self.settings.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new = out[:, encoded["input_ids"].shape[1] :]
        return [str(t) for t in self.tokenizer.batch_decode(new, skip_special_tokens=True)]

    def score(self, items: Sequence[tuple[Prompt, str]]) -> list[Scored]:
        low, high = self.settings.score_min, self.settings.score_max
        return [parse_score(reply, low, high) for reply in self.replies(items)]


def load(path: str, settings: RewardModel) -> Classifier | Judge:
    """The scorer of ``settings.type`` on the model at the local directory ``path``."""
    return Classifier(path, settings) if settings.type == "Classifier" else Judge(path, settings)
