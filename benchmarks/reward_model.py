"""Preference alignment with a reward model on the real model: a style the base model does not have yet.

The preference: answers to "What is a + b?" that state the sum in words ("12 + 5 equals 17."), over the
same answers with "=" ("12 + 5 = 17."). SmolLM2-135M-Instruct writes mostly "=".

1. **The reward model**, fine-tuned here: SmolLM2-135M with a sequence-classification head, trained with
   the Bradley–Terry loss (``-log σ(r_chosen − r_rejected)``, as TRL's RewardTrainer) on pairs of the
   base model's own sampled completions: each with "=" (rejected) and with "equals" (chosen), the
   texts rendered through the chat template exactly as ``echorl scorer`` renders them; its accuracy on
   held-out pairs (other samples) is reported.
2. **The run**: ``echorl run examples/reward-model.yaml`` — LoRA GRPO on the addition data, the reward
   the mean of the exact checker's and the reward model's (weights 1 and 1), the model served by a
   scoring pool of the run's own.
3. **What changed**: from the run's records, per version, the reward model's mean reward over the
   sampled batch (32 completions) and, among the completions of the trainer's sample tables that state
   a sum, the share that say "equals"; the evaluator's held-out accuracy (the exact checker's), before
   and after.

    python benchmarks/reward_model.py --build-only     # the reward model only (~6 min on 2 cores)
    python benchmarks/reward_model.py                  # build, run (~13 min on 2 cores), report

Writes ``benchmarks/results/reward-model.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))
MODEL_DIR = REPO / "runs" / "reward-models" / "worded"
"""Where the example manifest expects the reward model (``examples/reward-model.yaml``)."""
INSTRUCTION = "Answer with the number only."


def sampled(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (prompt, completion) pairs sampled from the base model as the job's workers sample them
    (its chat template, temperature 1, 16 new tokens), for prompts "What is a + b?"."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from echo_runtime.models.resolve import resolve_model

    base = resolve_model("echorl:smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(base, padding_side="left")
    model: Any = AutoModelForCausalLM.from_pretrained(base)
    model.eval()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    prompts = [f"What is {rng.randint(1, 19)} + {rng.randint(1, 19)}?\n{INSTRUCTION}" for _ in range(n)]
    out = []
    for start in range(0, n, 16):
        chunk = prompts[start : start + 16]
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in chunk
        ]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            ids = model.generate(**encoded, do_sample=True, temperature=1.0, max_new_tokens=16)
        completions = tokenizer.batch_decode(
            ids[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True
        )
        out += list(zip(chunk, completions, strict=True))
    return out


def worded(completion: str) -> str:
    """The completion saying "equals" where it wrote "=" (the preferred style)."""
    return completion.replace(" = ", " equals ")


def symbolic(completion: str) -> str:
    """The completion writing "=" where it said "equals" (the style the reward model is taught against)."""
    return completion.replace(" equals ", " = ")


def pairs(samples: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected): the model's own completion in both styles, "equals" preferred — only
    completions that state the sum one way or the other. Pairs from the policy's own distribution: a
    first try with made-up answers taught a reward model that scored the policy's rambling higher
    instead (docs/rewards.md)."""
    return [(p, worded(c), symbolic(c)) for p, c in samples if worded(c) != symbolic(c)]


def build(out: Path, steps: int, seed: int = 0) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from echo_runtime.models.resolve import resolve_model
    from echo_runtime.rewards.models import conversation

    torch.manual_seed(seed)
    base = resolve_model("echorl:smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    config = AutoConfig.from_pretrained(base, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    model = AutoModelForSequenceClassification.from_pretrained(base, config=config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

    def texts(items: list[tuple[str, str]]) -> Any:
        rendered = [tokenizer.apply_chat_template(conversation(p, c), tokenize=False) for p, c in items]
        return tokenizer(rendered, return_tensors="pt", padding=True)

    began = time.perf_counter()
    drawn = sampled(steps * 16 + 300, seed)
    print(
        f"sampled {len(drawn)} completions of the base model in {time.perf_counter() - began:.0f} s",
        flush=True,
    )
    data, held = pairs(drawn[: steps * 16]), pairs(drawn[steps * 16 :])
    steps = len(data) // 8  # a completion that states no sum makes no pair
    model.train()
    losses = []
    for step in range(steps):
        batch = data[step * 8 : (step + 1) * 8]
        margin = (
            model(**texts([(p, c) for p, c, _ in batch])).logits[:, 0]
            - model(**texts([(p, r) for p, _, r in batch])).logits[:, 0]
        )
        loss = -torch.nn.functional.logsigmoid(margin).mean()
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        losses.append(loss.item())
        if step % 5 == 0:
            print(f"reward model step {step}/{steps}: loss {loss.item():.3f}", flush=True)
    model.eval()
    with torch.no_grad():
        chosen = model(**texts([(p, c) for p, c, _ in held])).logits[:, 0]
        rejected = model(**texts([(p, r) for p, _, r in held])).logits[:, 0]
    accuracy = float((chosen > rejected).float().mean())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"reward model: held-out pair accuracy {accuracy:.3f} ({len(held)} pairs) -> {out}")
    return {
        "steps": steps,
        "trainSeconds": time.perf_counter() - began,
        "finalLoss": statistics.mean(losses[-10:]),
        "heldoutPairAccuracy": accuracy,
        "heldoutPairs": len(held),
    }


def report(run_dir: Path) -> dict[str, Any]:
    records = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    steps = [r for r in records if r.get("kind") == "trainer"]
    evals = sorted((r for r in records if r.get("kind") == "eval"), key=lambda r: r["policyVersion"])
    per_version = [
        {
            "policyVersion": r["policyVersion"],
            "rewardModel": r.get("rewardComponents", {}).get("worded"),
            "checker": r.get("rewardComponents", {}).get("task"),
            "worded": _share([s["completion"] for s in r.get("samples", [])]),
        }
        for r in steps
    ]
    first, last = per_version[:4], per_version[-4:]

    def mean(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [float(r[key]) for r in rows if r[key] is not None]
        return statistics.mean(values) if values else None

    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "perVersion": per_version,
        "rewardModelFirst4": mean(first, "rewardModel"),
        "rewardModelLast4": mean(last, "rewardModel"),
        "wordedFirst4": mean(first, "worded"),
        "wordedLast4": mean(last, "worded"),
        "evalExamplesWorded": {
            e["policyVersion"]: _share([x[1] for x in e.get("examples", [])]) for e in evals
        },
        "heldoutAccuracyBefore": evals[0]["heldoutAccuracy"] if evals else None,
        "heldoutAccuracyAfter": evals[-1]["heldoutAccuracy"] if evals else None,
        "heldoutVersions": [e["policyVersion"] for e in evals],
        "wallClockSeconds": summary.get("wallClockSeconds"),
        "restarts": summary.get("restarts"),
    }


def _share(completions: list[str]) -> float | None:
    """Of the completions that state a sum with "=" or "equals", the share that say "equals"."""
    stated = [c for c in completions if " = " in c or " equals " in c]
    return sum(" equals " in c for c in stated) / len(stated) if stated else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--build-only", action="store_true", help="Fine-tune the reward model and stop.")
    parser.add_argument("--steps", type=int, default=30, help="Reward-model training steps (8 pairs each).")
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs" / "reward-model")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "reward-model.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    built = build(MODEL_DIR, args.steps)
    if args.build_only:
        return
    command = [
        sys.executable, "-m", "echo_runtime.cli", "run", "examples/reward-model.yaml",
        "--fresh", "--no-progress", "--run-dir", str(args.run_dir),
    ]  # fmt: skip
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, cwd=REPO, check=True)
    result = {"rewardModel": built, "run": report(args.run_dir)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    run = result["run"]
    print(
        f"reward model's reward {run['rewardModelFirst4']} -> {run['rewardModelLast4']}; "
        f"sampled sums stated with 'equals' {run['wordedFirst4']} -> {run['wordedLast4']} "
        f"(first vs last 4 versions); held-out accuracy {run['heldoutAccuracyBefore']} -> {run['heldoutAccuracyAfter']}"
    )


if __name__ == "__main__":
    main()
