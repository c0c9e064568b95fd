"""How many Apple-Silicon or consumer-GPU workers keep one H100 trainer busy? GRPO on a 4B model.

A sizing table for ``docs/simulate.md``, computed with ``echorl simulate``'s engine. Nothing here is
measured on this project's machines: every input is derived from a stated assumption, and each assumption
names its source (:data:`ASSUMPTIONS`; the JSON repeats them next to the results).

The derivation, in short:

* **The trainer's step** (one H100 SXM, LoRA): 6·N FLOPs per token — the policy's forward (2N) and the
  backward through the activations (2N; LoRA computes no weight gradients of the frozen base) plus the
  reference forward of the KL term (2N) — over every token of the batch, at a model-FLOPs utilisation
  (MFU) of 40 % and, for a slower trainer, 25 %.
* **A worker's group** (8 completions decoded together): decoding is memory-bound, so one decode step
  reads the weights (bf16, the exact policy: a quantised copy would not be the policy the trainer scores)
  plus the KV cache of every sequence; its time is those bytes over the device's bandwidth at a stated
  efficiency. A lease of k groups decodes 8k sequences together (``batchScaling``).
* **The simulation**: each class alone, for Δmax 0, 1, 2 and 4, the smallest worker count whose trainer
  busy fraction (mean of 3 seeds, 90 optimizer steps) reaches 0.9 — found by bisection over the count.

    python benchmarks/sizing_4b.py            # a few minutes on one core; writes benchmarks/results/sizing_4b.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

from echo_runtime.bench.simulate import config as sim_config  # noqa: E402
from echo_runtime.bench.simulate import engine  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "sizing_4b.json"

ASSUMPTIONS: dict[str, dict[str, Any]] = {
    "params": {
        "value": 4.02e9,
        "what": "parameters of the policy (Qwen3-4B, the paper's 4B model)",
        "source": "Qwen3-4B model card, huggingface.co/Qwen/Qwen3-4B (4.0B parameters)",
    },
    "kvBytesPerToken": {
        "value": 2 * 36 * 8 * 128 * 2,
        "what": "KV cache per token in bf16: 2 (K, V) × 36 layers × 8 KV heads × 128 head dim × 2 bytes",
        "source": "Qwen3-4B config.json (num_hidden_layers 36, num_key_value_heads 8, head_dim 128)",
    },
    "promptTokens": {"value": 256, "what": "prompt length", "source": "assumption"},
    "completionTokens": {
        "value": 1024,
        "what": "completion length; every completion runs to the limit (the worst case for generation)",
        "source": "the issue's '1k-token completions'",
    },
    "groupSize": {"value": 8, "what": "completions per prompt (GRPO group)", "source": "assumption"},
    "batchSize": {"value": 64, "what": "groups per optimizer step (512 rollouts)", "source": "assumption"},
    "h100PeakFlops": {
        "value": 989.4e12,
        "what": "H100 SXM dense BF16 tensor-core peak",
        "source": "NVIDIA H100 Tensor Core GPU datasheet / Hopper architecture whitepaper "
        "(1,979 TFLOPS with sparsity, half of it dense)",
    },
    "mfu": {
        "value": [0.40, 0.25],
        "what": "model-FLOPs utilisation of the trainer: 40 % (as well as large-scale pretraining), "
        "25 % (a less tuned RL trainer)",
        "source": "Llama 3 paper (arXiv:2407.21783), Table 4: 38–43 % BF16 MFU on H100",
    },
    "flopsPerToken": {
        "value": 6,
        "what": "× N per trained token: policy forward 2N + backward through activations 2N (LoRA: no "
        "weight gradients of the base) + reference forward 2N (the KL term); attention FLOPs at 1.3k "
        "tokens (~5 % more) and activation recomputation left out",
        "source": "Kaplan et al. 2020 (arXiv:2001.08361), §2.1: forward 2N, backward 4N per token",
    },
    "publishSeconds": {
        "value": 0.5,
        "what": "export of the adapter on the trainer's critical path (upload runs in the background)",
        "source": "assumption (Echo's trainer/overlap.py moves upload + announce off the critical path)",
    },
    "snapshotMB": {
        "value": 66,
        "what": "a rank-16 LoRA adapter on all 7 linear layers × 36 blocks, bf16: "
        "16 × Σ(in+out) = 16 × 57,344 × 36 × 2 bytes",
        "source": "Qwen3-4B config.json (hidden 2560, 32 q heads, intermediate 9728)",
    },
    "m4proBandwidth": {
        "value": 273e9,
        "what": "M4 Pro unified-memory bandwidth (bytes/s)",
        "source": "Apple, 'Apple introduces M4 Pro and M4 Max' (newsroom, 30 Oct 2024): 273GB/s",
    },
    "m4proBandwidthEfficiency": {
        "value": 0.82,
        "what": "fraction of the bandwidth single-stream MLX decode achieves on an M4 Pro",
        "source": "github.com/raullenchai/Rapid-MLX/issues/567: 43.4 tok/s on a 5.1 GB model on an M4 Pro "
        "= 82 % of 273 GB/s",
    },
    "m4proBatchEfficiency": {
        "value": 0.58,
        "what": "decoding 8 sequences together reaches this fraction of the memory-bound ideal",
        "source": "github.com/unslothai/unsloth/pull/10310 (MLX, a 4B model at 8 bits): 3.1× the "
        "single-stream rate at 4 sequences, 4.3× at 10; interpolated to 8 (3.9×) over the ideal 6.7×",
    },
    "m4proDownloadMBps": {"value": 25, "what": "home connection (~200 Mbit/s)", "source": "assumption"},
    "rtx5090Bandwidth": {
        "value": 1792e9,
        "what": "RTX 5090 GDDR7 bandwidth (bytes/s)",
        "source": "NVIDIA GeForce RTX 5090 specifications (1,792 GB/s, 32 GB)",
    },
    "rtx5090BandwidthEfficiency": {
        "value": 0.70,
        "what": "fraction of the bandwidth vLLM's decode achieves",
        "source": "assumption; checked against github.com/vllm-project/vllm/issues/16515: Llama-3.1-8B "
        "in FP16 on one RTX 5090 served 3,413–3,708 tok/s at 30–100 req/s; the model here gives a "
        "4B model (half the weights) 5.2k tok/s for 64 sequences",
    },
    "rtx5090Capacity": {
        "value": 8,
        "what": "groups per lease (64 sequences: 8 GB weights + ≤ 12 GB KV cache fit in 32 GB)",
        "source": "assumption",
    },
    "rtx5090DownloadMBps": {"value": 100, "what": "~1 Gbit/s lab connection", "source": "assumption"},
    "busyTarget": {"value": 0.9, "what": "what 'keeps the trainer busy' means", "source": "the issue"},
}


def value(name: str) -> Any:
    return ASSUMPTIONS[name]["value"]


def step_seconds(mfu: float) -> float:
    tokens = value("batchSize") * value("groupSize") * (value("promptTokens") + value("completionTokens"))
    return float(value("flopsPerToken") * value("params") * tokens / (value("h100PeakFlops") * mfu))


def decode_seconds(sequences: int, bandwidth: float, efficiency: float) -> float:
    """``completionTokens`` decode steps of ``sequences`` sequences, memory-bound."""
    weights = value("params") * 2
    mean_context = value("promptTokens") + value("completionTokens") / 2
    per_step = weights + sequences * mean_context * value("kvBytesPerToken")
    return float(value("completionTokens") * per_step / (bandwidth * efficiency))


def worker_classes() -> dict[str, dict[str, Any]]:
    """The simulator's two classes, derived from :data:`ASSUMPTIONS`."""
    n = value("groupSize")
    mac = decode_seconds(n, value("m4proBandwidth"), value("m4proBandwidthEfficiency"))
    mac /= value("m4proBatchEfficiency")
    gpu_one = decode_seconds(n, value("rtx5090Bandwidth"), value("rtx5090BandwidthEfficiency"))
    k = value("rtx5090Capacity")
    gpu_lease = decode_seconds(n * k, value("rtx5090Bandwidth"), value("rtx5090BandwidthEfficiency"))
    ideal = decode_seconds(n, value("m4proBandwidth"), value("m4proBandwidthEfficiency"))
    return {
        "m4pro": {
            "name": "m4pro",
            "count": 0,
            "groupSeconds": round(mac, 2),
            "groupCv": 0.1,
            "capacity": 1,
            "downloadMBps": value("m4proDownloadMBps"),
            "applySeconds": 1.0,
        },
        # Sensitivity: an M4 Pro whose batched decode kept the single-stream bandwidth efficiency.
        "m4pro-idealbatch": {
            "name": "m4pro-idealbatch",
            "count": 0,
            "groupSeconds": round(ideal, 2),
            "groupCv": 0.1,
            "capacity": 1,
            "downloadMBps": value("m4proDownloadMBps"),
            "applySeconds": 1.0,
        },
        "rtx5090": {
            "name": "rtx5090",
            "count": 0,
            "groupSeconds": round(gpu_one, 2),
            "groupCv": 0.1,
            "capacity": k,
            "batchScaling": round((gpu_lease / gpu_one - 1) / (k - 1), 4),
            "downloadMBps": value("rtx5090DownloadMBps"),
            "applySeconds": 0.5,
        },
    }


def base_config(mfu: float, classes: dict[str, dict[str, Any]], steps: int) -> sim_config.SimConfig:
    return sim_config.config_from_mapping(
        {
            "mode": "Async",
            "groupSize": value("groupSize"),
            "batchSize": value("batchSize"),
            "snapshotMB": value("snapshotMB"),
            "durationSeconds": 48 * 3600,
            "maxSteps": steps,
            "trainer": {
                "stepSeconds": step_seconds(mfu),
                "stepCv": 0.05,
                "publishSeconds": value("publishSeconds"),
            },
            "workerClasses": list(classes.values()),
        }
    )


def busy(base: sim_config.SimConfig, name: str, count: int, delta: int, seeds: int) -> float:
    cls = next(c for c in base.worker_classes if c.name == name)
    # Room for every lease the pool holds at once plus a batch (docs/simulate.md, point 3).
    buffer = max(2 * base.batch_size, count * cls.capacity + base.batch_size)
    config = base.with_pools({name: count}).with_max_staleness(delta).replace(buffer_size=buffer)
    return statistics.fmean(
        engine.simulate(config.replace(seed=s)).trainer_busy_fraction for s in range(seeds)
    )


def smallest_pool(
    base: sim_config.SimConfig, name: str, delta: int, seeds: int, limit: int
) -> dict[str, Any]:
    """The smallest count reaching the busy target (bisection; busy grows with the count), or None."""
    target = value("busyTarget")
    seen: dict[int, float] = {}

    def at(count: int) -> float:
        if count not in seen:
            seen[count] = busy(base, name, count, delta, seeds)
        return seen[count]

    high = 1
    while at(high) < target:
        if high >= limit:
            return {"workers": None, "busyAtLimit": at(high), "limit": limit, "tried": _sorted(seen)}
        high = min(limit, high * 2)
    low = high // 2  # at(low) < target, or low == 0
    while high - low > 1:
        middle = (low + high) // 2
        if at(middle) >= target:
            high = middle
        else:
            low = middle
    return {"workers": high, "busy": at(high), "tried": _sorted(seen)}


def _sorted(seen: dict[int, float]) -> dict[str, float]:
    return {str(k): round(v, 4) for k, v in sorted(seen.items())}


def throughput_count(base: sim_config.SimConfig, name: str) -> float:
    """Workers whose generation rate equals the trainer's consumption, staleness ignored."""
    cls = next(c for c in base.worker_classes if c.name == name)
    groups_per_second = cls.capacity / cls.lease_seconds(cls.capacity)
    version_seconds = base.trainer.step_seconds + base.trainer.publish_seconds
    return base.batch_size / version_seconds / groups_per_second


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON report (default {RESULTS})")
    parser.add_argument("--seeds", type=int, default=3, help="simulations per point (default 3)")
    parser.add_argument("--steps", type=int, default=90, help="optimizer steps per simulation (default 90)")
    parser.add_argument("--deltas", default="0,1,2,4", help="Δmax values (default 0,1,2,4)")
    args = parser.parse_args(argv)
    deltas = [int(d) for d in args.deltas.split(",")]
    classes = worker_classes()
    limits = {"m4pro": 1024, "m4pro-idealbatch": 1024, "rtx5090": 64}
    started = time.monotonic()
    rows = []
    for mfu in value("mfu"):
        base = base_config(mfu, classes, args.steps)
        for name in classes:
            row: dict[str, Any] = {
                "mfu": mfu,
                "stepSeconds": round(base.trainer.step_seconds, 2),
                "class": name,
                "throughputWorkers": round(throughput_count(base, name), 2),
                "byMaxStaleness": {},
            }
            for delta in deltas:
                found = smallest_pool(base, name, delta, args.seeds, limits[name])
                row["byMaxStaleness"][str(delta)] = found
                shown = found["workers"] if found["workers"] is not None else f"none ≤ {limits[name]}"
                print(
                    f"MFU {mfu:.2f} (step {base.trainer.step_seconds:.1f} s)  {name:8s} Δmax {delta}: "
                    f"{shown}  ({time.monotonic() - started:.0f}s elapsed)",
                    flush=True,
                )
            rows.append(row)
    report = {
        "command": "python benchmarks/sizing_4b.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "assumptions": ASSUMPTIONS,
        "workerClasses": classes,
        "seeds": args.seeds,
        "steps": args.steps,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(markdown(rows, deltas, classes))
    print(f"wrote {args.out}")
    return 0


def markdown(rows: list[dict[str, Any]], deltas: list[int], classes: dict[str, dict[str, Any]]) -> str:
    head = ["trainer (one H100)", "workers", "throughput alone"] + [f"Δmax {d}" for d in deltas]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [f"MFU {row['mfu']:.0%}: {row['stepSeconds']:.0f} s/step", row["class"],
                 str(math.ceil(row["throughputWorkers"]))]  # fmt: skip
        for d in deltas:
            found = row["byMaxStaleness"][str(d)]
            if found["workers"] is None:
                cells.append(f"never (busy {found['busyAtLimit']:.2f} at {found['limit']})")
            else:
                cells.append(f"{found['workers']} (busy {found['busy']:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for name, cls in classes.items():
        lines.append(f"{name}: {json.dumps({k: v for k, v in cls.items() if k not in ('name', 'count')})}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
