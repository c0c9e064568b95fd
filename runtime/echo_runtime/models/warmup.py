"""Supervised warm-up: a short fine-tune on a task's references so that RL starts from a policy with a low
but non-zero reward.

Promises of :func:`warmup`:

* Trains on ``(prompt, reference)`` pairs drawn from the task's **train** stream (seeded), and evaluates on
  its **held-out** stream only; the two never share a problem (a task promise).
* The loss is the mean cross-entropy over **completion tokens and the EOS token** only: the prompt is
  context, never a target. Prompt and completion are tokenized separately and concatenated, exactly as a
  rollout's ids are (prompt ids — :func:`echo_runtime.models.prompts.encode`, the one rendering of every
  process, chat template included — then generated ids).
* AdamW with a fixed schedule (linear ramp over the first :data:`LR_RAMP_STEPS` steps, then constant) that
  does not depend on ``steps``, and data that does not either: the warm-up of N steps is a prefix of the
  warm-up of M > N steps, so one long run measures every shorter one.
* Deterministic under ``seed`` on one machine and thread count; the global torch RNG state is restored.
* Writes a new Hugging Face directory (model, tokenizer files, and ``echorl-warmup.json`` with the
  settings, loss curve and the held-out accuracy before and after, greedy and sampled at temperature 1);
  built-in models also get an updated ``echorl-model.json``. Written to a temporary sibling, then renamed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from echo_runtime.models import build, prompts

WARMUP_VERSION: Final = 1
"""Version of the warm-up recipe (loss, optimizer, schedule, data order, DEFAULT_LR and DEFAULT_BATCH_SIZE);
part of the cache key of warmed built-in models, so bump it when any of them changes."""

DEFAULT_LR: Final = 3e-3
"""Measured on ``tiny``/arithmetic: 3e-3 learns ~3x faster than 1e-3; 5e-3 is slower again."""
DEFAULT_BATCH_SIZE: Final = 64
DEFAULT_EVAL_SIZE: Final = 200
LR_RAMP_STEPS: Final = 10
"""Steps of the linear learning-rate ramp at the start."""
WEIGHT_DECAY: Final = 0.01
GRAD_CLIP: Final = 1.0
MAX_EVAL_NEW_TOKENS: Final = 256
RECORD_FILE: Final = "echorl-warmup.json"
"""What a warm-up writes next to the weights: settings, loss curve, held-out accuracy before and after."""

_TOKENIZER_FILES: Final = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
)  # fmt: skip

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Held-out scores of one decoding setting."""

    accuracy: float
    """Fraction of problems answered exactly right (reward component ``correct``, or reward 1)."""
    mean_reward: float
    n: int
    temperature: float
    """0 means greedy."""
    examples: tuple[tuple[str, str, float], ...] = ()
    """A few ``(prompt, completion, reward)`` triples, for eyeballing."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy, "mean_reward": self.mean_reward, "n": self.n,
            "temperature": self.temperature, "examples": [list(e) for e in self.examples],
        }  # fmt: skip


@dataclasses.dataclass(frozen=True)
class WarmupResult:
    """What :func:`warmup` did."""

    out_dir: Path
    steps: int
    losses: tuple[float, ...]
    """The training loss of every step."""
    before: dict[str, Evaluation]
    """``{"greedy": ..., "sampled": ...}`` on the held-out stream before training."""
    after: dict[str, Evaluation]
    seconds: float
    """Wall-clock seconds of the training steps (evaluation excluded)."""


def get_task(name: str, options: Mapping[str, Any] | None = None) -> Any:
    """The task named ``name`` (``echo_runtime.tasks.get_task``)."""
    from echo_runtime.tasks import get_task as _get_task

    return _get_task(name, dict(options or {}))


def _eos_id(tokenizer: Any) -> int:
    eos = tokenizer.eos_token_id
    if isinstance(eos, list):
        eos = eos[0]
    if not isinstance(eos, int):
        raise ValueError("the tokenizer has no eos token; a warm-up needs one to end completions")
    return eos


def encode_pair(
    tokenizer: Any, prompt: prompts.Prompt, completion: str, style: prompts.PromptStyle | None = None
) -> tuple[list[int], int]:
    """``(ids, n_prompt)``: prompt ids, then completion ids and EOS; the first ``n_prompt`` are the prompt."""
    prompt_ids = prompts.encode(tokenizer, prompt, style)
    completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    return prompt_ids + completion_ids + [_eos_id(tokenizer)], len(prompt_ids)


def collate(examples: Sequence[tuple[list[int], int]], pad_id: int) -> dict[str, Any]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 on prompt and padding)."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, n_prompt) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        labels[row, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def completion_loss(model: Any, batch: Mapping[str, Any]) -> Any:
    """Mean next-token cross-entropy over the positions whose label is not -100 (a scalar tensor)."""
    import torch.nn.functional as F

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100
    )


def generate(
    model: Any,
    tokenizer: Any,
    requests: Sequence[prompts.Prompt],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 256,
    style: prompts.PromptStyle | None = None,
    eos_ids: Collection[int] | None = None,
) -> list[str]:
    """Completions of ``requests``, decoded up to (not including) the first EOS: greedy if ``temperature``
    is 0, else pure sampling at ``temperature`` (no top-k/top-p) from a generator seeded with ``seed``.

    Prompts are rendered by :func:`echo_runtime.models.prompts.encode` under ``style``; a completion stops
    at any of ``eos_ids`` (default: the tokenizer's EOS) — pass the model's own stop ids
    (:func:`echo_runtime.backends.sampling.eos_token_ids`, e.g. a chat model's ``<|im_end|>``). A plain
    KV-cached decoding loop over left-padded batches, so that evaluation depends on no generation
    defaults (``transformers`` applies top-k 50 unless told otherwise).
    """
    import torch

    eos = _eos_id(tokenizer)
    stops = sorted({int(i) for i in eos_ids}) if eos_ids else [eos]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    out: list[str] = []
    was_training = model.training
    model.eval()
    stop = torch.tensor(stops, device=device)
    with torch.no_grad():
        for start in range(0, len(requests), batch_size):
            chunk = [prompts.encode(tokenizer, p, style) for p in requests[start : start + batch_size]]
            width = max(len(ids) for ids in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(chunk):  # left padding
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                mask[row, width - len(ids) :] = 1
            input_ids, mask = input_ids.to(device), mask.to(device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            result = (
                model(  # the logits of the last position only: [rows, 1, vocab], not [rows, width, vocab]
                    input_ids=input_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=1,
                )
            )
            finished = torch.zeros(len(chunk), dtype=torch.bool, device=device)
            tokens: list[Any] = []
            for _ in range(max_new_tokens):
                logits = result.logits[:, -1, :].float()
                if temperature > 0:
                    probs = torch.softmax(logits / temperature, dim=-1).cpu()
                    nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(device)
                else:
                    nxt = logits.argmax(dim=-1)
                nxt = torch.where(finished, torch.full_like(nxt, pad), nxt)
                tokens.append(nxt)
                finished |= torch.isin(nxt, stop)
                if bool(finished.all()):
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                positions = positions[:, -1:] + 1
                result = model(
                    input_ids=nxt[:, None], attention_mask=mask, position_ids=positions,
                    past_key_values=result.past_key_values, use_cache=True,
                )  # fmt: skip
            rows = torch.stack(tokens, dim=1).tolist() if tokens else [[] for _ in chunk]
            for row in rows:
                ends = [i for i, token in enumerate(row) if token in stops]
                out.append(tokenizer.decode(row[: ends[0]] if ends else row, skip_special_tokens=True))
    model.train(was_training)
    return out


def _correct(reward: Any) -> float:
    components = getattr(reward, "components", {}) or {}
    if "correct" in components:
        return float(components["correct"])
    return 1.0 if float(reward.value) >= 1.0 else 0.0


def evaluate(
    model: Any,
    tokenizer: Any,
    task: Any,
    problems: Sequence[Any],
    *,
    temperature: float = 0.0,
    max_new_tokens: int | None = None,
    seed: int = 0,
    n_examples: int = 3,
    style: prompts.PromptStyle | None = None,
    eos_ids: Collection[int] | None = None,
) -> Evaluation:
    """Score the model's completions of ``problems`` with ``task.score``.

    ``max_new_tokens`` defaults to the longest reference's token count plus 4 (at most
    :data:`MAX_EVAL_NEW_TOKENS`), enough for a right answer and its EOS from a model trained to give just
    that (the warm-up's own check); a job's evaluator passes the job's ``sampling.maxNewTokens`` instead,
    since a real model writes more than the reference. ``style`` and ``eos_ids`` as for :func:`generate`.
    """
    if not problems:
        raise ValueError("evaluate needs at least one problem")
    if max_new_tokens is None:
        longest = max(
            len(tokenizer(task.reference(p), add_special_tokens=False)["input_ids"]) for p in problems
        )
        max_new_tokens = min(longest + 4, MAX_EVAL_NEW_TOKENS)
    completions = generate(
        model, tokenizer, [p.prompt for p in problems], max_new_tokens=max_new_tokens,
        temperature=temperature, seed=seed, style=style, eos_ids=eos_ids,
    )  # fmt: skip
    rewards = [task.score(p, c) for p, c in zip(problems, completions, strict=True)]
    return Evaluation(
        accuracy=sum(_correct(r) for r in rewards) / len(rewards),
        mean_reward=sum(float(r.value) for r in rewards) / len(rewards),
        n=len(rewards),
        temperature=temperature,
        examples=tuple(
            (prompts.describe(p.prompt), c, float(r.value))
            for p, c, r in itertools.islice(zip(problems, completions, rewards, strict=True), n_examples)
        ),
    )


def evaluate_both(
    model: Any, tokenizer: Any, task: Any, problems: Sequence[Any], seed: int
) -> dict[str, Evaluation]:
    """Greedy and temperature-1 held-out evaluations."""
    return {
        "greedy": evaluate(model, tokenizer, task, problems, temperature=0.0, seed=seed),
        "sampled": evaluate(model, tokenizer, task, problems, temperature=1.0, seed=seed),
    }


def training_pairs(task: Any, seed: int) -> Iterator[tuple[prompts.Prompt, str]]:
    """The endless ``(prompt, reference)`` stream of the task's train split under ``seed``."""
    for problem in task.prompts("train", seed):
        yield problem.prompt, task.reference(problem)


def lr_at(step: int, lr: float) -> float:
    """Learning rate of optimizer step ``step`` (0-based): a linear ramp, then constant."""
    return lr * min(1.0, (step + 1) / LR_RAMP_STEPS)


def _describe(ev: Mapping[str, Evaluation]) -> str:
    g, s = ev["greedy"], ev["sampled"]
    return (
        f"greedy accuracy {g.accuracy:.3f} (reward {g.mean_reward:.3f}), "
        f"T=1 accuracy {s.accuracy:.3f} (reward {s.mean_reward:.3f}), n={g.n}"
    )


def warmup(
    model_dir: str | Path,
    out_dir: str | Path,
    task: str = "arithmetic",
    steps: int = 200,
    seed: int = 0,
    lr: float = DEFAULT_LR,
    *,
    task_options: Mapping[str, Any] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    eval_size: int = DEFAULT_EVAL_SIZE,
    eval_seed: int = 0,
    evaluate_at: Sequence[int] = (),
    log: Log | None = None,
    on_step: Callable[[int, float], None] | None = None,
    overwrite: bool = False,
) -> WarmupResult:
    """Fine-tune the model in ``model_dir`` on ``task`` for ``steps`` steps and write it to ``out_dir``.

    ``eval_size`` held-out problems (``task.prompts("heldout", eval_seed)``) are scored before and after,
    greedy and at temperature 1; ``evaluate_at`` lists extra steps to evaluate at (for measurements).
    ``log`` receives progress lines; ``on_step(step, loss)`` is called after every step (1-based).
    """
    import torch

    from echo_runtime.models.load import load_causal_lm, load_tokenizer

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if batch_size < 1 or eval_size < 1:
        raise ValueError("batch_size and eval_size must be positive")
    src = Path(model_dir).expanduser().resolve()
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass overwrite=True / --overwrite to replace it)")
    emit: Log = log or (lambda _line: None)

    task_obj = get_task(task, task_options)
    tokenizer = load_tokenizer(str(src))
    model = load_causal_lm(str(src), dtype="float32")
    pad_id = tokenizer.pad_token_id
    heldout = list(itertools.islice(task_obj.prompts("heldout", eval_seed), eval_size))

    before = evaluate_both(model, tokenizer, task_obj, heldout, eval_seed)
    emit(f"before warm-up: {_describe(before)}")

    log_every = max(1, steps // 20)
    checkpoints = {s for s in evaluate_at if 0 < s < steps}
    losses: list[float] = []
    train_seconds = 0.0
    pairs = training_pairs(task_obj, seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
        model.train()
        for step in range(steps):
            started = time.perf_counter()
            batch = collate(
                [encode_pair(tokenizer, p, c) for p, c in itertools.islice(pairs, batch_size)], pad_id
            )
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, lr)
            loss = completion_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            train_seconds += time.perf_counter() - started
            losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(step + 1, losses[-1])
            if (step + 1) % log_every == 0 or step + 1 == steps:
                emit(f"step {step + 1}/{steps} loss {losses[-1]:.4f} ({train_seconds:.1f} s)")
            if step + 1 in checkpoints:
                emit(
                    f"after {step + 1} steps: {_describe(evaluate_both(model, tokenizer, task_obj, heldout, eval_seed))}"
                )
                model.train()
    model.eval()
    after = evaluate_both(model, tokenizer, task_obj, heldout, eval_seed)
    emit(f"after warm-up ({steps} steps, {train_seconds:.1f} s): {_describe(after)}")

    record = {
        "warmup_version": WARMUP_VERSION, "source": str(src), "task": task,
        "task_options": dict(task_options or {}), "steps": steps, "seed": seed, "lr": lr,
        "batch_size": batch_size, "eval_size": eval_size, "eval_seed": eval_seed,
        "train_seconds": round(train_seconds, 3), "final_loss": losses[-1], "losses": losses,
        "before": {k: v.as_dict() for k, v in before.items()},
        "after": {k: v.as_dict() for k, v in after.items()},
    }  # fmt: skip
    _write_output(model, tokenizer, src, out, record)
    return WarmupResult(out, steps, tuple(losses), before, after, train_seconds)


def read_record(model_dir: str | Path) -> dict[str, Any] | None:
    """The ``echorl-warmup.json`` a warm-up wrote into ``model_dir``, or None if there is none."""
    path = Path(model_dir) / RECORD_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def _write_output(model: Any, tokenizer: Any, src: Path, out: Path, record: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = build.make_temp_dir(out)
    try:
        build.save_model(model, tmp)
        copied = [name for name in _TOKENIZER_FILES if (src / name).is_file()]
        if "tokenizer_config.json" in copied:
            for name in copied:  # byte-identical tokenizer files
                shutil.copyfile(src / name, tmp / name)
        else:
            tokenizer.save_pretrained(str(tmp))
        build.write_json(tmp / RECORD_FILE, record)
        metadata = build.read_metadata(src)
        if metadata is not None:
            metadata["warmup"] = {k: v for k, v in record.items() if k not in ("losses", "source")}
            build.write_json(tmp / build.METADATA_FILE, metadata)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
