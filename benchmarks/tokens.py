"""Micro-batches by token budget against micro-batches by count, on a real model's rollouts of mixed length.

``algorithm.microBatchTokens`` forms each forward/backward pass from rollouts sorted by length, as many as
fit a budget of padded cells, instead of ``microBatchSize`` rollouts in batch order
(:func:`echo_runtime.trainer.batch.by_tokens`). This measures what it saves where it matters: a batch
whose completions are short and long at once, as agents' episodes are.

1. **Rollouts.** SmolLM2-135M-Instruct (``echorl:smollm2-135m``) samples 8 completions (temperature 1,
   up to ``--max-new-tokens``) for each of ``--groups`` prompts of the addition task, half of them asking
   for the number only (a few tokens) and half asking to explain the sum step by step (up to the cap):
   the lengths are the model's own. Behaviour log-probs are the trainer's recomputation (ρ = 1), rewards
   the task's verifier. Saved once in ``--work-dir``.
2. **Steps.** Each configuration runs in a fresh process (its peak resident set, ``VmHWM``, is its own),
   alternating count, budget, count, budget: LoRA rank 16 as ``examples/smollm2.yaml``, AdamW, one warm-up
   step then ``--steps`` timed steps on the same plan, all from the same initial adapter. Count is
   ``microBatchSize`` 8 (the default); the budget is 8 times the batch's mean rollout length (prompt +
   completion), the token count of 8 average rollouts.
3. **Reported**: the padding fraction (the trainer's ``paddingFraction``), the median step time, the
   peak resident set, passes per step, and the first step's loss and gradient norm on each side, which
   must agree (the loss does not depend on how the batch is split).

    python benchmarks/tokens.py             # ~6 minutes on 2 cores; benchmarks/results/tokens.json
    python benchmarks/tokens.py --quick     # 2 groups, 1 timed step, ~2 minutes
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

RESULTS = REPO / "benchmarks" / "results" / "tokens.json"
MODEL = "echorl:smollm2-135m"
DATA = REPO / "examples" / "data" / "addition.jsonl"
SHORT = "Answer with the number only."
LONG = "Explain how to add them step by step, then give the answer."


def _model_spec() -> Any:
    from echo_runtime.spec.policy import LoRA, Model

    return Model(path=MODEL, lora=LoRA(rank=16, alpha=32.0))


def make_rollouts(out: Path, groups: int, max_new_tokens: int, seed: int, threads: int) -> dict[str, Any]:
    """Sample the batch with the real model (once) and write it as JSON."""
    import torch

    from echo_runtime.models import load as model_load
    from echo_runtime.rollout import Group, Rollout
    from echo_runtime.trainer import policy as trainer_policy

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    path = model_load.resolve_spec(_model_spec())
    tokenizer = model_load.load_tokenizer(path)
    policy = trainer_policy.load_policy(_model_spec(), model_dir=path)
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    rng.shuffle(rows)
    built, started = [], time.perf_counter()
    for g, row in enumerate(rows[:groups]):
        question = row["prompt"]
        ask = f"{question} {SHORT if g % 2 == 0 else LONG}"
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": ask}], add_generation_prompt=True, tokenize=True
        )
        prompt = [int(i) for i in (prompt["input_ids"] if hasattr(prompt, "keys") else prompt)]
        ids = torch.tensor([prompt] * 8)
        with torch.no_grad():
            generated = policy.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=policy.pad_id,
            )  # fmt: skip
        eos = tokenizer.eos_token_id
        completions = []
        for seq in generated[:, len(prompt) :].tolist():
            end = seq.index(eos) + 1 if eos in seq else len(seq)
            completions.append(tuple(seq[:end]))
        probes = [Rollout(tuple(prompt), c, (0.0,) * len(c), 0.0, 0) for c in completions]
        with torch.no_grad():
            lp = trainer_policy.completion_logprobs(
                policy.model, trainer_policy.pack(probes, policy.pad_id), 1.0
            )
        answer = str(row.get("answer", ""))
        rollouts = tuple(
            Rollout(
                prompt_ids=tuple(prompt),
                completion_ids=c,
                logprobs=tuple(float(x) for x in lp[i, : len(c)]),
                reward=float(answer != "" and answer in tokenizer.decode(list(c))),
                policy_version=0,
                backend="transformers",
            )
            for i, c in enumerate(completions)
        )
        built.append(Group(rollouts=rollouts, id=f"g{g}"))
        lengths = sorted(len(c) for c in completions)
        print(f"[tokens] group {g + 1}/{groups}: completion lengths {lengths}", flush=True)
    payload: dict[str, Any] = {
        "batch": [
            [
                {
                    "prompt": list(r.prompt_ids),
                    "completion": list(r.completion_ids),
                    "logprobs": list(r.logprobs),
                    "reward": r.reward,
                }
                for r in group.rollouts
            ]
            for group in built
        ]
    }
    payload["sampleSeconds"] = round(time.perf_counter() - started, 1)
    out.write_text(json.dumps(payload))
    return payload


def load_batch(path: Path) -> Any:
    from echo_runtime.rollout import Batch, Group, Rollout

    groups = json.loads(path.read_text())["batch"]
    return Batch(
        version=0,
        groups=tuple(
            Group(
                rollouts=tuple(
                    Rollout(
                        tuple(r["prompt"]),
                        tuple(r["completion"]),
                        tuple(r["logprobs"]),
                        r["reward"],
                        0,
                        backend="transformers",
                    )
                    for r in group
                ),
                id=f"g{g}",
            )
            for g, group in enumerate(groups)
        ),
    )


def child(rollouts: Path, config: dict[str, int], steps: int, threads: int) -> dict[str, Any]:
    """One configuration in this (fresh) process: a warm-up step, then ``steps`` timed ones."""
    import torch

    from echo_runtime import staleness
    from echo_runtime.models import load as model_load
    from echo_runtime.trainer import step
    from echo_runtime.trainer.policy import load_policy

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    policy = load_policy(_model_spec(), model_dir=model_load.resolve_spec(_model_spec()))
    optimizer = step.make_optimizer(policy.trainable_parameters(), 2e-4)
    rule = staleness.StalenessPolicy(mode="Async", max_staleness=1, stale_action="ImportanceWeight")
    plan = step.plan_step(load_batch(rollouts), rule)
    step_config = step.StepConfig(
        learning_rate=2e-4,
        micro_batch_size=config.get("micro_batch_size", 8),
        micro_batch_tokens=config.get("micro_batch_tokens"),
    )
    seconds, first = [], None
    for i in range(steps + 1):
        began = time.perf_counter()
        metrics = step.train_step(policy, optimizer, plan, step_config)
        if i == 0:
            first = metrics
        else:
            seconds.append(time.perf_counter() - began)
    assert first is not None
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))
    from echo_runtime.trainer.batch import by_tokens, micro_batches

    passes = (
        len(by_tokens(plan.slots, config["micro_batch_tokens"], 0, 1))
        if "micro_batch_tokens" in config
        else len(micro_batches(plan.slots, config["micro_batch_size"]))
    )
    return {
        "config": config,
        "paddingFraction": first.padding_fraction,
        "stepSeconds": seconds,
        "peakRssMiB": round(peak, 1),
        "passes": passes,
        "firstLoss": first.loss,
        "firstGradNorm": first.grad_norm,
        "rollouts": first.rollouts,
        "tokens": first.tokens,
    }


def run_child(rollouts: Path, config: dict[str, int], steps: int, threads: int) -> dict[str, Any]:
    cmd = [
        sys.executable, __file__, "--child", json.dumps(config), "--rollouts", str(rollouts),
        "--steps", str(steps), "--threads", str(threads),
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
    }
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {config} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"[tokens] {config}: padding {result['paddingFraction']:.3f}, steps {result['stepSeconds']}, "
        f"peak {result['peakRssMiB']} MiB, {result['passes']} passes",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per process (after one warm-up)")
    parser.add_argument("--repeats", type=int, default=2, help="processes per configuration, alternating")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--work-dir", type=Path, default=REPO / "runs" / "tokens")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rollouts", type=Path, default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child is not None:
        print(json.dumps(child(opts.rollouts, json.loads(opts.child), opts.steps, opts.threads)))
        return 0
    if opts.quick:
        opts.groups, opts.steps, opts.repeats = 2, 1, 1
    opts.work_dir.mkdir(parents=True, exist_ok=True)
    rollouts = opts.work_dir / f"rollouts-g{opts.groups}-n{opts.max_new_tokens}-s{opts.seed}.json"
    if not rollouts.is_file():
        make_rollouts(rollouts, opts.groups, opts.max_new_tokens, opts.seed, opts.threads)
    batch = load_batch(rollouts)
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for g in batch.groups for r in g.rollouts]
    completions = [len(r.completion_ids) for g in batch.groups for r in g.rollouts]
    budget = 8 * -(-sum(lengths) // len(lengths))
    configs = {"count": {"micro_batch_size": 8}, "budget": {"micro_batch_tokens": budget}}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for _ in range(opts.repeats):
        for name, config in configs.items():  # alternating: drift on a shared machine hits both
            runs[name].append(run_child(rollouts, config, opts.steps, opts.threads))

    def summary(name: str) -> dict[str, Any]:
        all_steps = [s for r in runs[name] for s in r["stepSeconds"]]
        return {
            "config": configs[name],
            "paddingFraction": runs[name][0]["paddingFraction"],
            "passes": runs[name][0]["passes"],
            "medianStepSeconds": statistics.median(all_steps),
            "stepSeconds": all_steps,
            "peakRssMiB": [r["peakRssMiB"] for r in runs[name]],
            "firstLoss": runs[name][0]["firstLoss"],
            "firstGradNorm": runs[name][0]["firstGradNorm"],
        }

    count, by_budget = summary("count"), summary("budget")
    report = {
        "benchmark": "tokens",
        "model": MODEL,
        "rollouts": len(lengths),
        "completionTokens": {
            "min": min(completions),
            "median": statistics.median(completions),
            "max": max(completions),
        },
        "rowTokens": {"min": min(lengths), "mean": sum(lengths) / len(lengths), "max": max(lengths)},
        "budget": budget,
        "count": count,
        "byBudget": by_budget,
        "ratios": {
            "stepSecondsBudgetOverCount": by_budget["medianStepSeconds"] / count["medianStepSeconds"],
            "peakBudgetOverCount": max(by_budget["peakRssMiB"]) / max(count["peakRssMiB"]),
        },
        "lossDifference": abs(by_budget["firstLoss"] - count["firstLoss"]),
        "gradNormRelativeDifference": abs(by_budget["firstGradNorm"] - count["firstGradNorm"])
        / max(abs(count["firstGradNorm"]), 1e-12),
        "threads": opts.threads,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    print(
        f"\npadding: count 8 {count['paddingFraction']:.3f} → budget {budget} {by_budget['paddingFraction']:.3f}\n"
        f"median step: {count['medianStepSeconds']:.2f} s → {by_budget['medianStepSeconds']:.2f} s "
        f"({report['ratios']['stepSecondsBudgetOverCount']:.2f}x); peak {max(count['peakRssMiB'])} → "
        f"{max(by_budget['peakRssMiB'])} MiB\n"
        f"first step: loss {count['firstLoss']:.6g} vs {by_budget['firstLoss']:.6g}, grad norm "
        f"{count['firstGradNorm']:.6g} vs {by_budget['firstGradNorm']:.6g}"
    )
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"→ {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
