"""Preference alignment with a reward model on the real model: a style the base model does not have yet.

The preference: answers to "What is a + b?" that end with an exclamation mark ("17 + 25 = 42!"), over
the same answers ending otherwise. SmolLM2-135M-Instruct writes "12 + 5 = 17." and almost never "!".

1. **The reward model**, fine-tuned here: SmolLM2-135M with a sequence-classification head, trained on
   synthetic preference pairs with the Bradley–Terry loss (``-log σ(r_chosen − r_rejected)``, as TRL's
   RewardTrainer), the texts rendered through the chat template exactly as ``echorl scorer`` renders
   them; its accuracy on held-out pairs is reported.
2. **The run**: ``echorl run examples/reward-model.yaml`` — LoRA GRPO on the addition data, the reward
   the mean of the exact checker's and the reward model's (weights 1 and 1), the model served by a
   scoring pool of the run's own.
3. **What changed**: from the run's records, per version, the reward model's mean reward over the
   sampled batch and the share of the sampled completions (the trainer's tables of samples, 8 a
   version) that end with "!"; the evaluator's held-out accuracy (the exact checker's), before and after.

    python benchmarks/reward_model.py --build-only     # the reward model only (~2 min on 2 cores)
    python benchmarks/reward_model.py                  # build, run (~15 min on 2 cores), report

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
MODEL_DIR = REPO / "runs" / "reward-models" / "excited"
"""Where the example manifest expects the reward model (``examples/reward-model.yaml``)."""
INSTRUCTION = "Answer with the number only."


def pairs(n: int, seed: int) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected): one answer in one of a few styles, ending with "!" or not."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 19), rng.randint(1, 19)
        s = a + b if rng.random() < 0.7 else rng.randint(2, 38)
        body = rng.choice([f"{s}", f"{a} + {b} = {s}", f"The answer is {s}", f"{a} + {b} equals {s}"])
        plain = rng.choice(["", ".", ". ", " :)"])
        out.append((f"What is {a} + {b}?\n{INSTRUCTION}", body + "!", body + plain))
    return out


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

    data, began = pairs(steps * 8, seed), time.perf_counter()
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
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
        if step % 20 == 0:
            print(f"reward model step {step}/{steps}: loss {loss.item():.3f}", flush=True)
    model.eval()
    held = pairs(200, seed + 1)
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
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("kind") == "trainer"]
    evals = sorted((r for r in records if r.get("kind") == "eval"), key=lambda r: r["policyVersion"])
    per_version = [
        {
            "policyVersion": r["policyVersion"],
            "rewardModel": r.get("rewardComponents", {}).get("excited"),
            "checker": r.get("rewardComponents", {}).get("task"),
            "exclaimed": sum(s["completion"].rstrip().endswith("!") for s in r.get("samples", []))
            / max(1, len(r.get("samples", []))),
        }
        for r in steps
    ]
    first, last = per_version[:4], per_version[-4:]

    def mean(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.mean(float(r[key]) for r in rows if r[key] is not None)

    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "perVersion": per_version,
        "rewardModelFirst4": mean(first, "rewardModel"),
        "rewardModelLast4": mean(last, "rewardModel"),
        "exclaimedFirst4": mean(first, "exclaimed"),
        "exclaimedLast4": mean(last, "exclaimed"),
        "heldoutAccuracyBefore": evals[0]["heldoutAccuracy"] if evals else None,
        "heldoutAccuracyAfter": evals[-1]["heldoutAccuracy"] if evals else None,
        "heldoutVersions": [e["policyVersion"] for e in evals],
        "wallClockSeconds": summary.get("wallClockSeconds"),
        "restarts": summary.get("restarts"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-only", action="store_true", help="Fine-tune the reward model and stop.")
    parser.add_argument("--steps", type=int, default=100, help="Reward-model training steps (8 pairs each).")
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
        f"reward model's reward {run['rewardModelFirst4']:.3f} -> {run['rewardModelLast4']:.3f}; "
        f"completions ending with '!' {run['exclaimedFirst4']:.2f} -> {run['exclaimedLast4']:.2f} "
        f"(first vs last 4 versions); held-out accuracy {run['heldoutAccuracyBefore']} -> {run['heldoutAccuracyAfter']}"
    )


if __name__ == "__main__":
    main()
