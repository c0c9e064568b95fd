"""A small reward model built and fine-tuned here: the tiny Qwen3-architecture model Echo builds, with a
sequence-classification head, trained on preference pairs with the Bradley–Terry loss
(``-log σ(r_chosen - r_rejected)``, as TRL's RewardTrainer) for a preference it cannot know before:
arithmetic answers that end with " !" over the same answers without it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

PREFERRED = " !"


def pairs(n: int, seed: int) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) triples of "What is a + b?" with a random answer."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        answer = str(a + b if rng.random() < 0.5 else rng.randint(0, 198))
        out.append((f"What is {a} + {b}?", answer + PREFERRED, answer))
    return out


def build_classifier(base_dir: str, out: Path, steps: int = 80, seed: int = 0) -> Path:
    """Fine-tune ``base_dir`` (a causal LM directory) into a 1-label reward model at ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    config = AutoConfig.from_pretrained(base_dir, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    model = AutoModelForSequenceClassification.from_pretrained(base_dir, config=config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = pairs(steps * 8, seed)
    model.train()
    for step in range(steps):
        batch = data[step * 8 : (step + 1) * 8]
        chosen = tokenizer([p + c for p, c, _ in batch], return_tensors="pt", padding=True)
        rejected = tokenizer([p + r for p, _, r in batch], return_tensors="pt", padding=True)
        margin = model(**chosen).logits[:, 0] - model(**rejected).logits[:, 0]
        _step(optimizer, -torch.nn.functional.logsigmoid(margin).mean())
    return _save(model, tokenizer, out)


def _step(optimizer: Any, loss: Any) -> None:
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _save(model: Any, tokenizer: Any, out: Path) -> Path:
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


JUDGE_RUBRIC = "Q: {prompt}\nA: {completion}\nScore:"
"""The judge's rubric (the tiny model has no chat template: the rubric is its whole prompt)."""


def build_judge(base_dir: str, out: Path, steps: int = 120, seed: int = 0) -> Path:
    """Fine-tune ``base_dir`` into a judge that answers " 9" for answers ending with " !" and " 2" for
    the rest, after :data:`JUDGE_RUBRIC` (next-token loss on the score and the end of text only)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = pairs(steps * 4, seed)
    model.train()
    for step in range(steps):
        texts, targets = [], []
        for prompt, chosen, rejected in data[step * 4 : (step + 1) * 4]:
            for completion, score in ((chosen, " 9"), (rejected, " 2")):
                texts.append(JUDGE_RUBRIC.format(prompt=prompt, completion=completion))
                targets.append(score)
        loss = torch.zeros(())
        for text, target in zip(texts, targets, strict=True):
            context = tokenizer(text)["input_ids"]
            answer = [*tokenizer(target)["input_ids"], tokenizer.eos_token_id]
            ids = torch.tensor([context + answer])
            labels = torch.tensor([[-100] * len(context) + answer])
            loss = loss + model(input_ids=ids, labels=labels).loss / len(texts)
        _step(optimizer, loss)
    return _save(model, tokenizer, out)
