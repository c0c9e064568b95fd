"""Trainer overhead benchmark: one ``train_step`` vs the bare loss + backward + optimizer step, same batch.

The **trainer step** is what ``echorl trainer`` runs per version: :func:`echo_runtime.trainer.step.plan_step`
(the staleness rule on every group, GRPO advantages) and :func:`~echo_runtime.trainer.step.train_step`
(packing rollouts into tensors, micro-batched forward/backward with the clipped, truncated surrogate,
gradient clipping, AdamW, and every metric including the per-backend log-prob mismatch).

The **bare step** is the least a hand-written GRPO step can do on the same micro-batches: tensors
prepared in advance (not timed), forward, log-probs with the shared definition, ``−A · ρ`` summed with
the same token weights, backward, ``optimizer.step()``, ``zero_grad()`` — no admission, no clipping of
ratios or gradients, no metrics. The ratio of the medians is the overhead (target ≤ 1.15×). Both run
interleaved (trainer, bare, trainer, ...) from the same weights so drift on a shared machine hits both.

The batch is the manifest's defaults: 8 groups × 8 rollouts, micro-batches of 8, completions of 32 tokens
after ~12-token prompts, LoRA rank 16 on all seven projections, fresh rollouts from one backend.

    python benchmarks/trainer.py            # ~1 minute on 2 cores; writes benchmarks/results/trainer.json
    python benchmarks/trainer.py --quick    # ~15 s
    python benchmarks/trainer.py --model small --finetune Full --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

RESULTS = REPO / "benchmarks" / "results" / "trainer.json"
TARGET = 1.15


def make_batch(policy: Any, groups: int, n: int, prompt_len: int, completion_len: int, seed: int) -> Any:
    """Fresh rollouts whose behaviour log-probs are the policy's own plus small noise (a backend's rounding)."""
    import torch

    from echo_runtime.rollout import Batch, Group, Rollout
    from echo_runtime.trainer import policy as trainer_policy

    rng = random.Random(seed)
    vocab = int(policy.model.config.vocab_size)
    built = []
    for g in range(groups):
        prompt = tuple(rng.randrange(1, vocab) for _ in range(prompt_len))
        completions = [tuple(rng.randrange(1, vocab) for _ in range(completion_len)) for _ in range(n)]
        probes = [Rollout(prompt, c, (0.0,) * len(c), 0.0, 0) for c in completions]
        with torch.no_grad():
            lp = trainer_policy.completion_logprobs(
                policy.model, trainer_policy.pack(probes, policy.pad_id), 1.0
            )
        rollouts = tuple(
            Rollout(
                prompt_ids=prompt,
                completion_ids=c,
                logprobs=tuple(float(x) + rng.gauss(0.0, 1e-3) for x in lp[i, : len(c)]),
                reward=float(rng.random() < 0.5) if i > 1 else float(i),
                policy_version=0,
                backend="transformers",
            )
            for i, c in enumerate(completions)
        )
        built.append(Group(rollouts=rollouts, id=f"g{g}"))
    return Batch(version=0, groups=tuple(built))


def bare_inputs(policy: Any, plan: Any, micro: int) -> list[tuple[Any, Any, Any]]:
    """Per micro-batch: packed tensors, advantages, token weights — prepared before timing."""
    import torch

    from echo_runtime.trainer import loss
    from echo_runtime.trainer.batch import micro_batches
    from echo_runtime.trainer.policy import pack

    out = []
    for chunk in micro_batches(list(plan.slots), micro):
        packed = pack([s.rollout for s in chunk], policy.pad_id)
        adv = torch.tensor([s.advantage for s in chunk]).unsqueeze(1)
        weights = loss.token_weights(packed.mask, "TokenMean", plan.total_tokens, len(plan.slots))
        out.append((packed, adv, weights))
    return out


def bare_step(policy: Any, optimizer: Any, inputs: list[tuple[Any, Any, Any]]) -> None:
    import torch

    from echo_runtime.trainer.policy import completion_logprobs

    for packed, adv, weights in inputs:
        logp = completion_logprobs(policy.model, packed, 1.0)
        ratio = torch.exp(logp - packed.behaviour)
        loss = -(ratio * adv * weights).sum()
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--finetune", default="LoRA", choices=["LoRA", "Full"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="5 repetitions")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats

    import torch

    from echo_runtime import staleness
    from echo_runtime.models import build
    from echo_runtime.spec.policy import Algorithm, Model
    from echo_runtime.trainer import step
    from echo_runtime.trainer.policy import load_policy

    torch.set_num_threads(args.threads)
    algorithm = Algorithm()  # the manifest's defaults
    rule = staleness.StalenessPolicy()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build.init_model(args.model, Path(tmp) / args.model, seed=0))
        spec = Model(finetune=args.finetune)
        torch.manual_seed(0)
        trainer_policy = load_policy(spec, model_dir=model_dir)
        torch.manual_seed(0)
        bare_policy = load_policy(spec, model_dir=model_dir)
        batch = make_batch(trainer_policy, algorithm.batch_size, algorithm.group_size, 12, 32, seed=0)
        config = step.StepConfig.from_algorithm(algorithm)
        trainer_opt = step.make_optimizer(trainer_policy.trainable_parameters(), algorithm.learning_rate)
        bare_opt = step.make_optimizer(bare_policy.trainable_parameters(), algorithm.learning_rate)
        inputs = bare_inputs(
            bare_policy, step.plan_step(batch, rule, config.objective), config.micro_batch_size
        )

        def run_trainer() -> float:
            started = time.perf_counter()
            step.train_step(
                trainer_policy, trainer_opt, step.plan_step(batch, rule, config.objective), config
            )
            return time.perf_counter() - started

        def run_bare() -> float:
            started = time.perf_counter()
            bare_step(bare_policy, bare_opt, inputs)
            return time.perf_counter() - started

        for _ in range(2):  # warm-up (allocator, lazy inits)
            run_trainer()
            run_bare()
        trainer_times, bare_times = [], []
        for _ in range(repeats):
            trainer_times.append(run_trainer())
            bare_times.append(run_bare())

    trainer_s, bare_s = statistics.median(trainer_times), statistics.median(bare_times)
    ratio = trainer_s / bare_s
    result = {
        "benchmark": "trainer step vs bare loss+backward+optimizer step",
        "ratio": round(ratio, 4),
        "target": TARGET,
        "meetsTarget": ratio <= TARGET,
        "trainerStepSeconds": {"median": trainer_s, "min": min(trainer_times), "max": max(trainer_times)},
        "bareStepSeconds": {"median": bare_s, "min": min(bare_times), "max": max(bare_times)},
        "repeats": repeats,
        "setup": {
            "model": f"echorl:{args.model}",
            "finetune": args.finetune,
            "loraRank": spec.lora.rank if args.finetune == "LoRA" else None,
            "groups": algorithm.batch_size,
            "groupSize": algorithm.group_size,
            "microBatchSize": algorithm.micro_batch_size,
            "promptTokens": 12,
            "completionTokens": 32,
            "threads": args.threads,
        },
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "loadAverage": list(os.getloadavg()),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("ratio", "target", "meetsTarget")}), f"→ {args.out}")


if __name__ == "__main__":
    main()
