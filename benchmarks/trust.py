"""The trainer's log-prob check against the version each group claims: its cost and its power.

``trainer/verify.py`` recomputes, before every step, the behaviour log-probs of one random rollout per
group (``logprobChecksPerGroup``) with the weights of the version the group claims, kept for the last
Δmax versions (:class:`~echo_runtime.trainer.verify.History`). This script measures, on a real model:

1. **Cost, side by side.** A *checked step* — ``History.remember`` (a CPU copy of the trainable weights),
   ``check_batch`` (the weights of the claimed version swapped in, a no-grad forward, the current weights
   swapped back) and the training step — against an *unchecked step* (the training step alone), run
   alternately from the same evolving policy so drift on a shared machine hits both. The batch is the
   manifest's defaults (8 groups of 8, micro-batches of 8) of real completions of the addition prompts,
   at ``examples/smollm2.yaml``'s learning rate for LoRA (2e-4) and verl's and TRL's RL default for full
   fine-tuning (1e-6);
   every group claims the version before the trainer's (Async Δmax 1 with pacing: what the trainer
   sees). Goal: checked ÷ unchecked ≤ 1.15. The kept weights' size per version is reported: the LoRA
   adapter, or every weight when fine-tuning all of them.
2. **Drift, and what a check against the current policy alone could see.** The alternative to keeping
   old weights is to compare a stale group's log-probs with the *current* policy and tolerate the drift
   of k versions. The mean |Δ log-prob| per token between the version that sampled honest completions
   (of other prompts than the steps train on, as a stale group's are) and the versions 1, 2 and 3
   steps later is that drift; such a check would need a bound above the
   drift at Δmax (false alarms otherwise), and would then pass any lie smaller than it. Set beside the
   mismatch of the lies the check has to catch: made-up log-probs (all 0.0, or −0.01 everywhere) and a
   newer version's log-probs claimed as an older one's (which is the drift itself: no check of either
   kind separates that lie from an honest worker, and it gains the liar nothing but a larger
   importance weight, still clipped).

    python benchmarks/trust.py                  # SmolLM2-135M, LoRA and Full, ~10 minutes on 2 cores
    python benchmarks/trust.py --quick          # one round each, the tiny model
    python benchmarks/trust.py --finetune LoRA --rounds 6

Writes ``benchmarks/results/trust.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

RESULTS = REPO / "benchmarks" / "results" / "trust.json"
TARGET = 1.15
DATA = REPO / "examples" / "data" / "addition.jsonl"


def model_dir(name: str) -> str:
    from echo_runtime.models import build
    from echo_runtime.models import load as model_load
    from echo_runtime.spec.policy import Model

    if name == "smollm2":
        return model_load.resolve_spec(Model(path="echorl:smollm2-135m"))
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"echorl-trust-{name}"
    return str(build.init_model(name, out, seed=0, overwrite=True))


def completions(
    path: str, groups: int, n: int, max_new_tokens: int, threads: int, chat: bool
) -> list[list[Any]]:
    """Real completions of ``groups`` addition prompts by the base model, ``n`` each, rewarded by whether
    the answer's number appears (rewards shape the step, not the measurement)."""
    from echo_runtime.backends import base
    from echo_runtime.backends.transformers import TransformersBackend
    from echo_runtime.models.prompts import Prompt

    rows = random.Random(0).sample([json.loads(line) for line in DATA.read_text().splitlines()], groups)
    backend = TransformersBackend(path, device="cpu", threads=threads)
    questions = [f"{r['prompt']} Answer with the number only." for r in rows]
    prompts: list[Prompt] = [((({"role": "user", "content": q}),) if chat else q) for q in questions]
    sampled = backend.sample(
        prompts,
        n,
        base.SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=0),
    )
    out = []
    for row, group in zip(rows, sampled, strict=True):
        out.append([(r, float(str(row["answer"]) in r.text)) for r in group])
    return out


def claimed(policy: Any, sampled: list[list[Any]], version: int, batch_version: int, seed: int) -> Any:
    """A batch at ``batch_version`` whose groups claim ``version``, with the log-probs the policy's
    *current* weights give (the caller holds ``version``'s weights in the policy when honest)."""
    import dataclasses

    import torch

    from echo_runtime.rollout import Batch, Group
    from echo_runtime.trainer import policy as trainer_policy

    groups = []
    rng = random.Random(seed)
    for gi, group in enumerate(sampled):
        rollouts = []
        with torch.no_grad():
            packed = trainer_policy.pack([r for r, _ in group], policy.pad_id)
            lp = trainer_policy.completion_logprobs(policy.model.eval(), packed, 1.0)
        policy.model.train()
        for i, (r, reward) in enumerate(group):
            rollouts.append(
                dataclasses.replace(
                    r,
                    logprobs=tuple(float(x) for x in lp[i, : len(r.completion_ids)]),
                    reward=reward if rng.random() < 0.9 else 1.0 - reward,
                    policy_version=version,
                )
            )
        groups.append(Group(rollouts=tuple(rollouts), id=f"g{gi}", worker=f"w{gi % 2}"))
    return Batch(version=batch_version, groups=tuple(groups))


def mismatch(policy: Any, batch: Any) -> float:
    """Mean |Δ log-prob| per token between ``batch``'s behaviour log-probs and the policy's current weights."""
    import torch

    from echo_runtime.trainer import policy as trainer_policy

    total, tokens = 0.0, 0
    with torch.no_grad():
        for group in batch.groups:
            packed = trainer_policy.pack(list(group.rollouts), policy.pad_id)
            lp = trainer_policy.completion_logprobs(policy.model.eval(), packed, 1.0)
            total += float(((packed.behaviour - lp).abs() * packed.mask).sum())
            tokens += int(packed.mask.sum())
    policy.model.train()
    return total / max(tokens, 1)


def with_logprobs(batch: Any, how: Any) -> Any:
    import dataclasses

    return dataclasses.replace(
        batch,
        groups=tuple(
            dataclasses.replace(
                g,
                rollouts=tuple(dataclasses.replace(r, logprobs=how(r.logprobs)) for r in g.rollouts),
            )
            for g in batch.groups
        ),
    )


def measure(
    finetune: str, path: str, sampled: list[list[Any]], held_out: list[list[Any]], rounds: int, lr: float
) -> dict[str, Any]:
    import torch

    from echo_runtime import staleness
    from echo_runtime.spec.policy import Algorithm, LoRA, Model
    from echo_runtime.trainer import step, verify
    from echo_runtime.trainer.policy import load_policy

    algorithm = Algorithm.model_validate({"learningRate": lr})  # the manifest's defaults otherwise
    config = step.StepConfig.from_algorithm(algorithm)
    rule = staleness.StalenessPolicy("Async", 1)
    torch.manual_seed(0)
    policy = load_policy(Model(path=path, finetune=finetune, lora=LoRA(rank=16, alpha=32)), model_dir=path)  # type: ignore[arg-type]
    optimizer = step.make_optimizer(policy.trainable_parameters(), lr)
    history = verify.History(rule.bound)
    version = 0
    history.remember(version, policy)

    def advance(batch: Any) -> float:
        nonlocal version
        started = time.perf_counter()
        step.train_step(policy, optimizer, step.plan_step(batch, rule, config.objective), config)
        version += 1
        return time.perf_counter() - started

    # Warm-up: one step (allocator, lazy inits). The benchmark's own copies of each version's weights
    # (untimed) make each round's batch honest: it claims the version before the trainer's, with the
    # log-probs that version's weights give.
    states = {version: policy.trainable_state()}
    advance(claimed(policy, sampled, version, version, seed=0))
    states[version] = policy.trainable_state()
    checked_s: list[float] = []
    unchecked_s: list[float] = []
    check_s: list[float] = []
    remember_s: list[float] = []
    for r in range(rounds):
        for checked_first in (r % 2 == 0, r % 2 == 1):
            policy.load_trainable_state(states[version - 1])
            batch = claimed(policy, sampled, version - 1, version, seed=r)
            policy.load_trainable_state(states[version])
            if checked_first:
                began = time.perf_counter()
                history.remember(version, policy)
                remembered = time.perf_counter()
                found = verify.check_batch(
                    policy, batch, checks=1, bound=0.1, temperature=1.0, history=history
                )
                checked = time.perf_counter()
                assert not found.caught() and not found.unverified, found
                advance(batch)
                checked_s.append(time.perf_counter() - began)
                remember_s.append(remembered - began)
                check_s.append(checked - remembered)
            else:
                history.remember(version, policy)  # for the next checked round; not part of this step
                unchecked_s.append(advance(batch))
            states[version] = policy.trainable_state()
            states.pop(version - 2, None)
    # Drift: honest log-probs of one version, on completions of other prompts than the steps train on
    # (as a stale group's are: sampled, then trained on after steps on other groups), against the
    # weights 1, 2, 3 versions later; and the lies.
    base = claimed(policy, held_out, version, version, seed=99)
    drift = []
    for k in range(3):
        advance(claimed(policy, sampled, version, version, seed=100 + k))
        drift.append(mismatch(policy, base))
    zeros = mismatch(policy, with_logprobs(base, lambda lp: (0.0,) * len(lp)))
    flat = mismatch(policy, with_logprobs(base, lambda lp: (-0.01,) * len(lp)))
    kept = sum(t.numel() * t.element_size() for t in policy.trainable_state().values())
    ratio = statistics.median(checked_s) / statistics.median(unchecked_s)
    return {
        "finetune": finetune,
        "learningRate": lr,
        "rounds": rounds,
        "checkedStepSeconds": checked_s,
        "uncheckedStepSeconds": unchecked_s,
        "rememberSeconds": remember_s,
        "checkSeconds": check_s,
        "ratio": round(ratio, 4),
        "meetsTarget": ratio <= TARGET,
        "keptBytesPerVersion": kept,
        "driftMeanAbsByStaleness": {str(k + 1): d for k, d in enumerate(drift)},
        "lies": {
            "madeUpZeros": zeros,
            "madeUpMinus0.01": flat,
            "newerClaimedAsOneOlder": drift[0],
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny", "small"])
    parser.add_argument("--finetune", nargs="+", default=["LoRA", "Full"], choices=["LoRA", "Full"])
    parser.add_argument("--rounds", type=int, default=4, help="pairs of (checked, unchecked) steps")
    parser.add_argument(
        "--lr", type=float, default=2e-4, help="LoRA's: examples/smollm2.yaml's learning rate"
    )
    parser.add_argument(
        "--full-lr", type=float, default=1e-6, help="full fine-tuning's (verl's and TRL's default for RL)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="the tiny model, one round")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.model, args.rounds = "tiny", 1
    import torch

    torch.set_num_threads(args.threads)
    path = model_dir(args.model)
    print(
        f"[trust] sampling 16 groups of 8 from {args.model} (8 to train on, 8 to measure drift on) ...",
        flush=True,
    )
    sampled = completions(path, 16, 8, args.max_new_tokens, args.threads, chat=args.model == "smollm2")
    results = []
    for finetune in args.finetune:
        print(f"[trust] {finetune}: {args.rounds} rounds of checked and unchecked steps ...", flush=True)
        lr = args.lr if finetune == "LoRA" else args.full_lr
        found = measure(finetune, path, sampled[:8], sampled[8:], args.rounds, lr)
        results.append(found)
        drift = found["driftMeanAbsByStaleness"]
        print(
            f"[trust] {finetune}: checked/unchecked {found['ratio']:.3f} (target ≤ {TARGET}); check "
            f"{statistics.median(found['checkSeconds']):.3f} s, copy {statistics.median(found['rememberSeconds']):.3f} s, "
            f"step {statistics.median(found['uncheckedStepSeconds']):.2f} s; kept "
            f"{found['keptBytesPerVersion'] / 2**20:.1f} MiB a version; drift at staleness 1/2/3 "
            f"{drift['1']:.4f}/{drift['2']:.4f}/{drift['3']:.4f}; made-up 0.0 {found['lies']['madeUpZeros']:.3f}, "
            f"−0.01 {found['lies']['madeUpMinus0.01']:.3f}",
            flush=True,
        )
    report = {
        "benchmark": "trust: the log-prob check against the claimed version",
        "model": args.model,
        "target": TARGET,
        "batch": {"groups": 8, "groupSize": 8, "microBatchSize": 8, "maxNewTokens": args.max_new_tokens},
        "results": results,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "loadAverage": list(os.getloadavg()),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"→ {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
