"""Inference backend benchmark: sampling throughput, LoRA-apply time and log-prob parity on the tiny model.

For each backend that can run here (``transformers``; ``mlx`` when installed; ``vllm`` only with CUDA):

* **sampling**: ``sample(prompts, n, SamplingParams(max_new_tokens=...))`` — P arithmetic prompts × n
  samples decoded as one batched call; generated tokens per second (median of the repetitions, after one
  warm-up call), at temperature 1 with EOS disabled so every row generates ``max_new_tokens``;
* **LoRA apply**: ``apply_snapshot`` of a rank-16 peft adapter on all seven projections — the first
  apply (wraps the model) and later versions (tensors copied in place), alternating two versions;
* **full apply**: ``apply_snapshot`` of the whole state dict (one safetensors file);
* **parity**: max and mean |Δ log-prob| of every backend against ``transformers`` on the sampled
  sequences, scored with ``score_logprobs`` (issue 8's fidelity metric; target ≤ 1e-4).

The machine's load average is recorded: on a shared 2-core machine, throughput swings with it.

    python benchmarks/backends.py            # ~1 minute on 2 cores; writes benchmarks/results/backends.json
    python benchmarks/backends.py --quick    # ~20 s
    python benchmarks/backends.py --model echorl:small --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

RESULTS = REPO / "benchmarks" / "results" / "backends.json"
PARITY_TARGET = 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_lora(model_dir: Path, out: Path, seed: int) -> Path:
    """A rank-16 peft adapter on all projections with random nonzero A and B."""
    import warnings

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    peft_model.save_pretrained(str(out))
    return out


def prompts(count: int) -> list[str]:
    return [f"What is {17 * i % 89} + {31 * i % 97}? Answer:" for i in range(count)]


def bench_backend(
    name: str, model_dir: Path, args: argparse.Namespace, loras: list[Path], full: Path
) -> tuple[dict[str, Any], list[Any], Any]:
    from echo_runtime import backends
    from echo_runtime.backends import base

    started = time.perf_counter()
    backend: Any = backends.create_backend(name, model_dir, device=args.device, threads=args.threads)
    load_s = time.perf_counter() - started
    backend.eos_ids = frozenset({-1})  # every row generates max_new_tokens: a fixed amount of work
    batch = prompts(args.prompts)
    params = base.SamplingParams(max_new_tokens=args.max_new_tokens, seed=0)
    backend.sample(batch[:2], 2, params)  # warm-up (lazy initialisation, allocator)
    timings, tokens, samples = [], 0, []
    for rep in range(args.reps):
        t0 = time.perf_counter()
        out = backend.sample(batch, args.n, base.SamplingParams(max_new_tokens=args.max_new_tokens, seed=rep))
        timings.append(time.perf_counter() - t0)
        tokens = sum(len(s.completion_ids) for g in out for s in g)
        samples = [s for g in out for s in g]
    median = statistics.median(timings)

    first = time.perf_counter()
    backend.apply_snapshot(1, loras[0], "lora")
    first_apply = time.perf_counter() - first
    swaps = []
    for version in range(2, 2 + args.apply_reps):
        t0 = time.perf_counter()
        backend.apply_snapshot(version, loras[version % 2], "lora")
        swaps.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    backend.apply_snapshot(100, full, "full")
    full_apply = time.perf_counter() - t0
    # Back to the base weights for the parity check on the sampled (base-policy) sequences.
    fresh: Any = backends.create_backend(name, model_dir, device=args.device, threads=args.threads)
    result = {
        "backend": name,
        "device": backend.device,
        "dtype": backend.dtype,
        "load_s": round(load_s, 3),
        "sampling": {
            "rows": args.prompts * args.n,
            "tokens": tokens,
            "median_s": round(median, 4),
            "tokens_per_s": round(tokens / median, 1),
            "all_s": [round(t, 4) for t in timings],
        },
        "lora_apply_ms": {
            "first": round(first_apply * 1e3, 2),
            "in_place_median": round(statistics.median(swaps) * 1e3, 2),
            "in_place_max": round(max(swaps) * 1e3, 2),
            "base_loads": backend.base_loads,
        },
        "full_apply_ms": round(full_apply * 1e3, 2),
    }
    return result, samples, fresh


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="model path or echorl:<size> (default: build tiny, seed 0)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: best on a shared box)"
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--apply-reps", type=int, default=10)
    parser.add_argument(
        "--quick", action="store_true", help="8 prompts x 4 samples x 16 tokens, 2 repetitions"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.n, args.max_new_tokens, args.reps, args.apply_reps = 8, 4, 16, 2, 4

    from safetensors.torch import load_file, save_file

    from echo_runtime import backends
    from echo_runtime.models import build, resolve

    with tempfile.TemporaryDirectory(prefix="echorl-bench-backends-") as tmp:
        root = Path(tmp)
        model_dir = (
            Path(resolve.resolve_model(args.model)) if args.model else build.init_model("tiny", root / "tiny")
        )
        loras = [make_lora(model_dir, root / f"lora{i}", seed=i) for i in range(2)]
        full = root / "full"
        full.mkdir()
        state = load_file(str(model_dir / "model.safetensors"))
        save_file(
            {k: v * 1.01 for k, v in state.items() if k != "lm_head.weight"}, str(full / "model.safetensors")
        )

        names = [n for n in backends.available_backends() if n != "vllm" or args.device in ("cuda", "auto")]
        results: list[dict[str, Any]] = []
        scorers: dict[str, Any] = {}
        samples: list[Any] = []
        for name in names:
            try:
                result, sampled, fresh = bench_backend(name, model_dir, args, loras, full)
            except (ImportError, RuntimeError, ValueError) as exc:
                results.append({"backend": name, "skipped": str(exc)})
                continue
            results.append(result)
            scorers[name] = fresh
            samples = samples or sampled
            print(
                f"{name:>12}: {result['sampling']['tokens_per_s']:>9.1f} tokens/s, LoRA apply "
                f"{result['lora_apply_ms']['in_place_median']:.1f} ms (first {result['lora_apply_ms']['first']:.1f}), "
                f"full apply {result['full_apply_ms']:.1f} ms",
                flush=True,
            )

        parity: dict[str, Any] = {}
        if "transformers" in scorers and samples:
            reference = [
                scorers["transformers"].score_logprobs(s.prompt_ids, s.completion_ids, 1.0) for s in samples
            ]
            for name, scorer in scorers.items():
                scored = [scorer.score_logprobs(s.prompt_ids, s.completion_ids, 1.0) for s in samples]
                diffs = [
                    abs(a - b)
                    for r, o in zip(reference, scored, strict=True)
                    for a, b in zip(r, o, strict=True)
                ]
                sampled_diffs = [
                    abs(a - b)
                    for r, s in zip(reference, samples, strict=True)
                    for a, b in zip(r, s.logprobs, strict=True)
                ]
                parity[name] = {
                    "max_abs_diff_vs_transformers": max(diffs),
                    "mean_abs_diff_vs_transformers": sum(diffs) / len(diffs),
                    "tokens": len(diffs),
                    "met": sum(diffs) / len(diffs) <= PARITY_TARGET,
                }
            parity["sampled_vs_scored_max_abs_diff"] = max(sampled_diffs)
            for name, entry in parity.items():
                if isinstance(entry, dict):
                    print(
                        f"{name:>12}: parity max |Δ| {entry['max_abs_diff_vs_transformers']:.2e}", flush=True
                    )

    report = {
        "benchmark": "backends",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "settings": {
            "model": args.model or "echorl:tiny (seed 0)",
            "device": args.device,
            "threads": args.threads,
            "prompts": args.prompts,
            "n": args.n,
            "max_new_tokens": args.max_new_tokens,
            "reps": args.reps,
            "lora": {"rank": 16, "alpha": 32, "targets": TARGETS},
        },
        "backends": results,
        "parity": parity,
        "parity_target": PARITY_TARGET,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
