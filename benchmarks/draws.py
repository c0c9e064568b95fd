"""Seeded draws on a real model: false alarms of honest backends, detection of chosen text, sampling quality.

Each lease carries a fresh key; transformers and mlx workers draw every token from the key's uniforms
(``backends/seeded.py``) and the trainer checks, for each checked rollout, that every token's interval
of its own recomputed distribution contains its uniform, to within ``DRAW_BOUND`` (``trainer/verify.py``).
This script measures that check where it matters, on SmolLM2-135M-Instruct and the addition prompts of
``examples/smollm2.yaml``, per backend, in float32 on CPU:

1. **False alarms.** Honest keyed completions (each its own group of one, with its own fresh key, so
   that every completion is one *checked rollout*, what the trainer checks one of per group), checked by
   the trainer's code (:func:`~echo_runtime.trainer.verify.check_batch`, float32 policy). A false alarm
   is a checked rollout with a token further than the bound from its draw. Also the largest distance
   any honest token has from its draw: the margin below the bound.
2. **Detection.** What a worker that holds the weights can submit instead, with the *exact* log-probs
   its backend gives (so the log-prob check passes): text sampled with the operating system's randomness
   instead of the key, and the best of 8 such samples by reward (a worker choosing what Echo trains on).
   Each is checked against a fresh key, as the lease's would be. A submission identical to the key's own
   draw is not a lie (it *is* the draw); the detection rate is over those that differ from it.
3. **Text drawn without a key** (what a vLLM worker sends): the statistic ``z`` of
   ``trainer/typical.py`` over the checked tokens of honest samples and of the best of 8 by reward,
   each submitted as a keyless worker's would be (exact log-probs).
4. **Sampling quality.** The reward (the task's own ``Numeric`` checker) and length of keyed completions
   beside completions drawn with torch's generator, on the same prompts: seeded draws must sample the
   same distribution. Greedy evaluation (the evaluator) never takes a key, and is untouched.

    python benchmarks/draws.py                          # SmolLM2, transformers and mlx, ~25 minutes
    python benchmarks/draws.py --backends transformers --rollouts 512
    python benchmarks/draws.py --quick                  # the tiny model, 32 rollouts

Writes ``benchmarks/results/draws.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import random
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))
sys.path.insert(0, str(REPO / "benchmarks"))

from trust import model_dir  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "draws.json"
DATA = REPO / "examples" / "data" / "addition.jsonl"
INSTRUCTION = "Answer with the number only."


def prompts(n: int, chat: bool) -> tuple[list[Any], list[str]]:
    """``n`` addition prompts (cycled over the file in a fixed shuffled order) and their answers."""
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    random.Random(0).shuffle(rows)
    picked = [rows[i % len(rows)] for i in range(n)]
    questions = [f"{r['prompt']} {INSTRUCTION}" for r in picked]
    out: list[Any] = [((({"role": "user", "content": q}),) if chat else q) for q in questions]
    return out, [str(r["answer"]) for r in picked]


def reward(text: str, answer: str) -> float:
    """The job's reward: the ``Numeric`` checker graded as the dataset task grades it (1, 0.1, 0)."""
    from echo_runtime.tasks import dataset, scoring

    found, correct, _ = dataset.check("Numeric", text, answer)
    return float(scoring.graded(found, correct).value)


def sample(backend: Any, batch: list[Any], params: Any, chunk: int) -> list[Any]:
    """One completion per prompt of ``batch`` (keys, if any, one per prompt), ``chunk`` prompts a call;
    without keys, each call with a fresh seed (one seed for every call would draw every chunk from the
    same random stream: correlated samples, and intervals too narrow)."""
    out: list[Any] = []
    for start in range(0, len(batch), chunk):
        keys = None if params.keys is None else params.keys[start : start + chunk]
        part = dataclasses.replace(params, keys=keys, seed=None if keys is not None else secrets.randbits(63))
        out.extend(g[0] for g in backend.sample(batch[start : start + chunk], 1, part))
    return out


class First(random.Random):
    """Picks the first rollouts of a group to check: the one under test (row 0 of its key)."""

    def sample(self, population: Any, k: int, *, counts: Any = None) -> list[Any]:
        return list(population)[:k]


def check(policy: Any, rollouts: list[Any], keys: list[int], temperature: float, top_p: float) -> Any:
    """The trainer's check of each rollout as its own group (groups hold two rollouts at least: a copy
    fills the second place, never checked), every one of them checked."""
    from echo_runtime.rollout import Batch, Group
    from echo_runtime.trainer import verify

    groups = tuple(
        Group(
            rollouts=(dataclasses.replace(r, policy_version=0, dtype="float32"),) * 2,
            id=f"g{i}",
            worker=f"w{i}",
            key=f"{k:032x}",
        )
        for i, (r, k) in enumerate(zip(rollouts, keys, strict=True))
    )
    return verify.check_batch(
        policy,
        Batch(version=0, groups=groups),
        checks=1,
        bound=0.1,
        temperature=temperature,
        top_p=top_p,
        rng=First(),
    )


def mean_ci(values: list[float]) -> dict[str, float]:
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return {"mean": mean, "low": mean - half, "high": mean + half}


def upper_95(failures: int, trials: int) -> float:
    """One-sided 95 % upper bound on a rate from ``failures`` in ``trials`` (exact binomial, Clopper–Pearson)."""
    if trials == 0:
        return 1.0
    if failures == 0:
        return 1.0 - math.pow(0.05, 1.0 / trials)
    lo, hi = failures / trials, 1.0
    for _ in range(60):  # bisect P(X ≤ failures; p) = 0.05
        mid = (lo + hi) / 2
        tail = sum(math.comb(trials, k) * mid**k * (1 - mid) ** (trials - k) for k in range(failures + 1))
        lo, hi = (mid, hi) if tail > 0.05 else (lo, mid)
    return hi


def lower_95(successes: int, trials: int) -> float:
    return 1.0 - upper_95(trials - successes, trials)


def measure(name: str, path: str, n: int, args: argparse.Namespace, policy: Any) -> dict[str, Any]:
    from echo_runtime import backends
    from echo_runtime.backends import base
    from echo_runtime.models.prompts import PromptStyle

    chat = args.model == "smollm2"
    style = PromptStyle(format="Chat" if chat else "Raw")
    backend = backends.create_backend(
        name, path, device="cpu", dtype="float32", threads=args.threads, prompt_style=style
    )
    batch, answers = prompts(n, chat)
    t, p = args.temperature, args.top_p
    keys = [secrets.randbits(128) for _ in range(n)]
    plain = base.SamplingParams(temperature=t, top_p=p, max_new_tokens=args.max_new_tokens)
    began = time.perf_counter()
    honest = sample(backend, batch, dataclasses.replace(plain, keys=tuple(keys)), args.chunk)
    honest_s = time.perf_counter() - began
    print(f"  {name}: {n} keyed completions in {honest_s:.0f} s", flush=True)
    free = sample(backend, batch, dataclasses.replace(plain, seed=secrets.randbits(63)), args.chunk)
    candidates = [
        sample(backend, batch, dataclasses.replace(plain, seed=secrets.randbits(63)), args.chunk)
        for _ in range(args.best_of - 1)
    ]
    best = [
        max((free[i], *(c[i] for c in candidates)), key=lambda r: reward(r.text, answers[i]))
        for i in range(n)
    ]
    print(f"  {name}: {n} × {args.best_of} completions drawn without the key", flush=True)

    def judged(rollouts: list[Any]) -> dict[str, Any]:
        found = check(policy, rollouts, keys, t, p)
        by_id = {c.group_id: c for c in found.groups}
        differ = [rollouts[i].completion_ids != honest[i].completion_ids for i in range(n)]
        caught = [found.convicts(by_id[f"g{i}"]) for i in range(n)]
        gaps = [by_id[f"g{i}"].draw_gap or 0.0 for i in range(n)]
        logprob = [by_id[f"g{i}"].mean_abs for i in range(n)]
        return {"differ": differ, "caught": caught, "gaps": gaps, "meanAbsLogprob": logprob}

    h, f, b = judged(honest), judged(free), judged(best)

    def keyless(rollouts: list[Any]) -> dict[str, Any]:
        """The statistic a keyless (vLLM) worker's text gets: over every checked token (``trainer/typical``)."""
        from echo_runtime.rollout import Batch, Group
        from echo_runtime.trainer import typical, verify

        groups = tuple(
            Group(
                rollouts=(dataclasses.replace(r, policy_version=0, dtype="float32"),) * 2,
                id=f"g{i}",
                worker="w",
            )
            for i, r in enumerate(rollouts)
        )
        found = verify.check_batch(
            policy, Batch(version=0, groups=groups), checks=1, bound=0.1, temperature=t, top_p=p, rng=First()
        )
        stat = typical.Typicality()
        for c in found.groups:
            if c.surprise is not None:
                stat.add(*c.surprise)
        return {
            "tokens": stat.tokens,
            "z": stat.z,
            "excess": stat.excess,
            "convicted": stat.verdict() is not None,
        }

    alarms = sum(h["caught"])
    out: dict[str, Any] = {
        "backend": name,
        "dtype": "float32",
        "checkedRollouts": n,
        "checkedTokens": sum(len(r.completion_ids) for r in honest),
        "falseAlarms": alarms,
        "falseAlarmRateUpper95": upper_95(alarms, n),
        "honestWorstDrawGap": max(h["gaps"]),
        "honestRolloutsWithAnyGap": sum(g > 0 for g in h["gaps"]),
        "honestLargestGaps": sorted(h["gaps"])[-10:],
        "honestWorstMeanAbsLogprob": max(h["meanAbsLogprob"]),
        "keyedSeconds": honest_s,
    }
    for label, found in (("osRandom", f), (f"bestOf{args.best_of}", b)):
        differing = [i for i in range(n) if found["differ"][i]]
        caught = sum(found["caught"][i] for i in differing)
        out[label] = {
            "differFromDraw": len(differing),
            "caught": caught,
            "detectionRate": caught / len(differing) if differing else math.nan,
            "detectionRateLower95": lower_95(caught, len(differing)),
            "identicalToDrawCaught": sum(found["caught"][i] for i in range(n) if not found["differ"][i]),
            "passLogprobCheck": sum(v <= 0.1 for v in found["meanAbsLogprob"]),
            "smallestGapsOfDiffering": sorted(found["gaps"][i] for i in differing)[:10],
            "smallestGapCaught": min(
                (found["gaps"][i] for i in differing if found["caught"][i]), default=math.nan
            ),
            "meanReward": statistics.fmean(
                reward(r.text, a)
                for r, a in zip(best if label.startswith("best") else free, answers, strict=True)
            ),
        }
    out["keyless"] = {"sampled": keyless(free), f"bestOf{args.best_of}ByReward": keyless(best)}
    out["quality"] = {
        "keyed": {
            "reward": mean_ci([reward(r.text, a) for r, a in zip(honest, answers, strict=True)]),
            "tokens": mean_ci([float(len(r.completion_ids)) for r in honest]),
            "logprobPerToken": mean_ci([statistics.fmean(r.logprobs) for r in honest]),
        },
        "generator": {
            "reward": mean_ci([reward(r.text, a) for r, a in zip(free, answers, strict=True)]),
            "tokens": mean_ci([float(len(r.completion_ids)) for r in free]),
            "logprobPerToken": mean_ci([statistics.fmean(r.logprobs) for r in free]),
        },
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny", "small"])
    parser.add_argument(
        "--backends", nargs="+", default=["transformers", "mlx"], choices=["transformers", "mlx"]
    )
    parser.add_argument("--rollouts", type=int, default=1024, help="checked rollouts per backend and kind")
    parser.add_argument("--mlx-rollouts", type=int, default=256, help="mlx is slow on a CPU: fewer")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--best-of", type=int, default=8, help="candidates the choosing worker picks from")
    parser.add_argument("--chunk", type=int, default=64, help="prompts per sampling call")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the tiny model, 32 rollouts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.model, args.rollouts, args.mlx_rollouts = "tiny", 32, 32
    import torch

    from echo_runtime.spec.policy import Model
    from echo_runtime.trainer.policy import load_policy
    from echo_runtime.trainer.verify import DRAW_BOUND

    torch.set_num_threads(args.threads)
    path = model_dir(args.model)
    policy = load_policy(Model(path=path, finetune="Full"), model_dir=path)  # type: ignore[call-arg]
    results: list[dict[str, Any]] = []
    for name in args.backends:
        n = args.mlx_rollouts if name == "mlx" else args.rollouts
        print(f"{name}: {n} checked rollouts of each kind, {args.max_new_tokens} tokens at most", flush=True)
        results.append(measure(name, path, n, args, policy))
        r = results[-1]
        print(
            f"  false alarms {r['falseAlarms']} of {n} (rate ≤ {r['falseAlarmRateUpper95']:.2g} at 95 %), "
            f"worst honest gap {r['honestWorstDrawGap']:.3g} (bound {DRAW_BOUND:g}); "
            f"detected {r['osRandom']['caught']}/{r['osRandom']['differFromDraw']} sampled without the key, "
            f"{r[f'bestOf{args.best_of}']['caught']}/{r[f'bestOf{args.best_of}']['differFromDraw']} "
            f"best of {args.best_of}",
            flush=True,
        )
        report = {  # written after each backend: a long run keeps what it measured so far
            "model": args.model,
            "temperature": args.temperature,
            "topP": args.top_p,
            "maxNewTokens": args.max_new_tokens,
            "bestOf": args.best_of,
            "drawBound": DRAW_BOUND,
            "machine": {
                "cpus": platform.machine(),
                "python": platform.python_version(),
                "torch": torch.__version__,
            },
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
