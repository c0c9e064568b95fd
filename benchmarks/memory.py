"""Trainer memory benchmark: selective, chunked log-probs vs the naive full-logits path, on a 152k vocabulary.

**Ours** is what the trainer runs (:func:`echo_runtime.trainer.policy.completion_logprobs`): the model
is asked for the logits of the completion positions only (``logits_to_keep``) and the log-softmax is
taken a chunk at a time, checkpointed (:func:`echo_runtime.backends.logprobs.token_logprobs`). **Naive**
is what it did before (:func:`~echo_runtime.trainer.policy.full_logits_logprobs`): logits at every
position, a window copied out of them, one float32 log-softmax over it.

The model is Qwen3-shaped with Qwen3's vocabulary (151,936 tokens, tied embeddings, hidden 1024, 16/8
heads of 128, MLP 3072) but few layers (``--layers``, default 2), random weights, LoRA rank 16 on all
seven projections as the trainer's default; the batch is ``--rows`` rollouts of ``--prompt`` prompt and
``--completion`` completion tokens, the GRPO loss of :mod:`echo_runtime.trainer.loss` on it, backward.

Each variant runs in its own fresh process (so one's allocations cannot hide in the other's peak): it
builds the same seeded model and batch, runs one warm-up step (which also pays the allocator's,
OpenMP's and autograd's one-time set-up), records its memory, runs one step and records the peak, then
times ``--repeats`` more steps. Peak memory is ``torch.cuda.max_memory_allocated`` on CUDA. On CPU it is
the largest resident set a sampling thread sees during the step (every millisecond, from
``/proc/self/statm``) minus the resident set just before it; the child runs with
``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc gives every large tensor its own mapping and returns it
when freed, and the resident set follows the live tensors (without it, memory freed while the model was
built is reused silently and the growth undercounts). The two variants are run
alternately ``--rounds`` times so drift on a shared machine hits both; the report gives the medians,
the ratios ours/naive, and the loss difference (goal: peak ≤ 0.5×, step time within ±10 %, loss equal
to 1e-6).

    python benchmarks/memory.py                 # a few minutes on 2 CPU cores; writes benchmarks/results/memory.json
    python benchmarks/memory.py --quick         # one round, one repeat
    python benchmarks/memory.py --device cuda --layers 28 --rows 16 --prompt 256 --completion 512
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

RESULTS = REPO / "benchmarks" / "results" / "memory.json"
QWEN3_VOCAB = 151_936


def qwen3_config(layers: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=QWEN3_VOCAB, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip


def rss_bytes() -> int:
    """The current resident set of this process (Linux)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakSampler:
    """The largest resident set seen while it runs, sampled every millisecond in a thread."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def one_variant(args: argparse.Namespace) -> dict[str, Any]:
    """Build model and batch, run the steps of ``args.variant``; the measurements (in this process)."""
    import torch
    from peft import get_peft_model
    from transformers import Qwen3ForCausalLM

    from echo_runtime.rollout import Rollout
    from echo_runtime.spec.policy import Model
    from echo_runtime.trainer import loss, policy

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model: Any = Qwen3ForCausalLM(qwen3_config(args.layers))
    model = model.to(device)
    model = get_peft_model(model, policy.lora_config(Model()))
    model.train()
    g = torch.Generator().manual_seed(1)
    rollouts = [
        Rollout(
            tuple(torch.randint(0, QWEN3_VOCAB, (args.prompt,), generator=g).tolist()),
            tuple(torch.randint(0, QWEN3_VOCAB, (args.completion,), generator=g).tolist()),
            tuple([-11.93] * args.completion),  # about log(1 / 151,936): ratios near 1 for random weights
            float(i % 2),
            0,
        )
        for i in range(args.rows)
    ]
    packed = policy.pack(rollouts, pad_id=0, device=device)
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(args.rows)], device=device)
    weights = packed.mask / packed.mask.sum()
    compute = policy.completion_logprobs if args.variant == "ours" else policy.full_logits_logprobs

    def step() -> float:
        logp = compute(model, packed, 1.0)
        out = loss.grpo_loss(logp, packed.behaviour, advantages, weights, clip_range=0.2, cap=2.0)
        total: Any = out.loss
        total.backward()
        model.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    step()  # warm-up: one-time allocations are not the step's
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        started = time.perf_counter()
        value = step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        before = rss_bytes()
        started = time.perf_counter()
        with PeakSampler() as sampler:
            value = step()
        peak = sampler.peak - before
    first = time.perf_counter() - started
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return {
        "variant": args.variant,
        "peakBytes": peak,
        "loss": value,
        "firstStepSeconds": first,
        "stepSeconds": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--variant", choices=["ours", "naive"], help=argparse.SUPPRESS)  # the child's role
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(one_variant(args)))
        return
    if args.quick:
        args.rounds, args.repeats = 1, 1
    shared = [
        f"--device={args.device}", f"--layers={args.layers}", f"--rows={args.rows}", f"--prompt={args.prompt}",
        f"--completion={args.completion}", f"--repeats={args.repeats}", f"--threads={args.threads}",
    ]  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "naive": []}
    for round_ in range(args.rounds):
        for variant in ("naive", "ours") if round_ % 2 == 0 else ("ours", "naive"):
            result = subprocess.run(
                [sys.executable, __file__, *shared, f"--variant={variant}"],
                check=True, capture_output=True, text=True, env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"},
            )  # fmt: skip
            record = json.loads(result.stdout.strip().splitlines()[-1])
            runs[variant].append(record)
            print(
                f"round {round_ + 1} {variant:5s}: peak {record['peakBytes'] / 2**20:8.1f} MiB, "
                f"step {statistics.median(record['stepSeconds'] or [record['firstStepSeconds']]):.3f} s, "
                f"loss {record['loss']:.9f}",
                flush=True,
            )

    def median_of(variant: str, key: str) -> float:
        values = [r[key] for r in runs[variant]] if key == "peakBytes" else [
            statistics.median(r["stepSeconds"] or [r["firstStepSeconds"]]) for r in runs[variant]
        ]  # fmt: skip
        return float(statistics.median(values))

    peak = {v: median_of(v, "peakBytes") for v in runs}
    step = {v: median_of(v, "stepSeconds") for v in runs}
    loss_gap = max(abs(a["loss"] - b["loss"]) for a in runs["ours"] for b in runs["naive"])
    report = {
        "benchmark": "memory",
        "config": {
            "vocab": QWEN3_VOCAB, "hidden": 1024, "layers": args.layers, "rows": args.rows,
            "promptTokens": args.prompt, "completionTokens": args.completion, "device": args.device,
            "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats, "lora": "rank 16, all projections",
        },
        "peakMiB": {v: peak[v] / 2**20 for v in peak},
        "stepSeconds": step,
        "peakRatio": peak["ours"] / peak["naive"],
        "stepTimeRatio": step["ours"] / step["naive"],
        "lossAbsDifference": loss_gap,
        "goals": {"peakRatioAtMost": 0.5, "stepTimeRatioWithin": [0.9, 1.1], "lossWithin": 1e-6},
        "runs": runs,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "loadAverage": os.getloadavg(),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"peak ours/naive {report['peakRatio']:.3f} ({peak['ours'] / 2**20:.0f} / {peak['naive'] / 2**20:.0f} MiB), "
        f"step time ours/naive {report['stepTimeRatio']:.3f}, |Δ loss| {loss_gap:.2e}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
