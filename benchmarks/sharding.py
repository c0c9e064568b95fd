"""FSDP against DDP on CPU ranks: what each rank holds, the step time, the publishing rank's cost.

For full fine-tuning of a Qwen3-0.6B-shaped model with random weights (hidden 1024, 152k vocabulary,
tied embeddings, ``--layers`` decoder layers instead of 28 so that 4 ranks fit this machine), each
configuration runs under ``torchrun --standalone`` in fresh processes, one torch thread per rank:

* ``FSDP`` with 1, 2 and 4 ranks and ``DDP`` with 1 and 2, every rank taking ``--steps`` optimizer steps
  of the trainer's own ``train_step`` (AdamW, the same global batch of ``--rollouts`` rollouts of
  ``--prompt`` + ``--completion`` tokens split over the ranks, micro-batches of ``--micro``);
* per rank: the bytes of parameters, of gradients (measured in a backward hook before they are
  reduced away: the local shards FSDP keeps, the whole ones DDP keeps) and of AdamW's state the rank
  holds, their sum against the ideal (one rank's sum / N), the peak resident set, the median step;
* the publishing rank (rank 0) and the others: the seconds and the extra resident memory of writing a
  Full snapshot (``export_full_streamed`` for FSDP, as the loop does: gathered and written 512 MiB at a
  time; ``export_snapshot`` of the whole model for DDP), sampled by a thread every 10 ms;
* every rank: the bytes, seconds and extra resident memory of writing its part of a checkpoint
  (``checkpoint.write_part``, DCP, as the loop does before uploading it).

From the measured bytes per parameter it prints how large a model fits a GPU of 80 GB and 141 GB with
1–8 ranks, with every assumption in the table's notes.

    python benchmarks/sharding.py          # ~6 minutes on 2 cores; benchmarks/results/sharding.json
    python benchmarks/sharding.py --quick  # 1 layer, 1 step
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))
sys.path.insert(0, str(REPO / "benchmarks"))

RESULTS = REPO / "benchmarks" / "results" / "sharding.json"
CONFIGS = (("FSDP", 1), ("FSDP", 2), ("FSDP", 4), ("DDP", 1), ("DDP", 2))
GPUS = {"80 GB (H100)": 80e9, "141 GB (H200)": 141e9}
RESERVE = 0.25
"""Share of a GPU kept for activations, the gathered layer, the CUDA context and fragmentation."""


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Peak:
    """The highest resident set seen every 10 ms while the block runs, above where it started."""

    def __enter__(self) -> Peak:
        self.start = self.high = _status("VmRSS")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.high = max(self.high, _status("VmRSS"))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.high = max(self.high, _status("VmRSS"))


def _bytes(tensor: Any) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


def child(opts: argparse.Namespace) -> None:
    import random

    import torch
    from memory import qwen3_config  # benchmarks/memory.py: the same Qwen3-shaped configuration
    from transformers import AutoModelForCausalLM

    from echo_runtime import staleness
    from echo_runtime.rollout import Batch, Group, Rollout
    from echo_runtime.trainer import checkpoint, distributed, step
    from echo_runtime.trainer.batch import shard
    from echo_runtime.trainer.policy import TrainablePolicy

    torch.set_num_threads(1)
    world = distributed.init_world("cpu")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(qwen3_config(opts.layers), dtype=torch.float32)  # type: ignore[no-untyped-call]
    policy = TrainablePolicy(model, "Full", pad_id=0)
    total = sum(p.numel() for p in model.parameters())
    module = distributed.wrap(model, world, opts.strategy)
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-5)
    grads: dict[int, int] = {}

    def count(param: Any) -> None:  # the gradient as the rank holds it once the backward produced it
        grads[id(param)] = _bytes(param.grad)

    for param in policy.trainable_parameters():
        param.register_post_accumulate_grad_hook(count)  # type: ignore[no-untyped-call]
    rng = random.Random(0)
    vocab = model.config.vocab_size
    groups = []
    for g in range(opts.rollouts // 4):
        prompt = tuple(rng.randrange(1, vocab) for _ in range(opts.prompt))
        rollouts = tuple(
            Rollout(
                prompt,
                tuple(rng.randrange(1, vocab) for _ in range(opts.completion)),
                (-5.0,) * opts.completion,
                float(i % 2),
                0,
            )
            for i in range(4)
        )
        groups.append(Group(rollouts=rollouts, id=f"g{g}"))
    plan = step.plan_step(Batch(version=0, groups=tuple(groups)), staleness.StalenessPolicy(mode="Async"))
    config = step.StepConfig(micro_batch_size=opts.micro, learning_rate=1e-5)
    comm = distributed.collective(world)
    seconds = []
    for _ in range(opts.steps + 1):
        grads.clear()
        began = time.perf_counter()
        step.train_step(policy, optimizer, plan, config, module=module, collective=comm, shard=shard)
        seconds.append(time.perf_counter() - began)
    params = sum(_bytes(p) for p in model.parameters())
    moments = sum(_bytes(v) for s in optimizer.state.values() for v in s.values() if v.dim() > 0)
    with tempfile.TemporaryDirectory() as out, Peak() as peak:
        began = time.perf_counter()
        if policy.sharded:  # as the loop publishes a sharded Full version: gathered file by file
            policy.export_full_streamed(out if world.is_main else None)
        elif world.is_main:
            policy.export_snapshot(out)
        world.barrier()
        publish = time.perf_counter() - began
    # The checkpoint as the loop writes it: every rank its own DCP part (before uploading it).
    with tempfile.TemporaryDirectory() as out, Peak() as ckpt_peak:
        began = time.perf_counter()
        part = checkpoint.write_part(Path(out) / "part", policy, optimizer)
        world.barrier()
        ckpt_seconds = time.perf_counter() - began
        ckpt_bytes = sum(path.stat().st_size for path in part.values())
    mine = {
        "rank": world.rank,
        "parameters": params,
        "gradients": sum(grads.values()),
        "optimizer": moments,
        "peakRssMiB": round(_status("VmHWM"), 1),
        "stepSeconds": statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0],
        "publishSeconds": round(publish, 3),
        "publishExtraMiB": round(peak.high - peak.start, 1),
        "checkpointSeconds": round(ckpt_seconds, 3),
        "checkpointExtraMiB": round(ckpt_peak.high - ckpt_peak.start, 1),
        "checkpointBytes": ckpt_bytes,
    }
    gathered = world.gather(mine)
    if world.is_main:
        Path(opts.child).write_text(json.dumps({"total": total, "perRank": gathered}))
    distributed.shutdown(world)


def run(strategy: str, ranks: int, opts: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / f"{strategy}-{ranks}.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
        __file__, "--child", str(out), "--strategy", strategy, "--layers", str(opts.layers),
        "--rollouts", str(opts.rollouts), "--prompt", str(opts.prompt), "--completion", str(opts.completion),
        "--micro", str(opts.micro), "--steps", str(opts.steps),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{strategy} × {ranks} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    per_rank = result["perRank"]
    held = [r["parameters"] + r["gradients"] + r["optimizer"] for r in per_rank]
    print(
        f"[sharding] {strategy} × {ranks}: per rank {max(held) / 2**20:.0f} MiB of parameters+gradients+AdamW, "
        f"peak RSS {max(r['peakRssMiB'] for r in per_rank):.0f} MiB, step "
        f"{statistics.median(r['stepSeconds'] for r in per_rank):.2f} s, publish {per_rank[0]['publishSeconds']:.2f} s "
        f"(+{per_rank[0]['publishExtraMiB']:.0f} MiB on rank 0), checkpoint part "
        f"{max(r['checkpointBytes'] for r in per_rank) / 2**20:.0f} MiB per rank in "
        f"{max(r['checkpointSeconds'] for r in per_rank):.2f} s (+{max(r['checkpointExtraMiB'] for r in per_rank):.0f} MiB)",
        flush=True,
    )
    return {"strategy": strategy, "ranks": ranks, "heldBytes": held, **result}


def fit_table(bytes_per_param_per_rank: dict[int, float]) -> list[dict[str, Any]]:
    """Largest full fine-tuning and LoRA model per GPU and rank count, from the measured bytes."""
    rows = []
    for gpu, capacity in GPUS.items():
        usable = capacity * (1 - RESERVE)
        for ranks in (1, 2, 4, 8):
            full = bytes_per_param_per_rank[1] / ranks  # measured: the FSDP sum scales as 1/N
            rows.append(
                {
                    "gpu": gpu,
                    "ranks": ranks,
                    "fullFineTuningBillions": round(usable / full / 1e9, 1),
                    # LoRA: the frozen base in bfloat16 (2 bytes) sharded, the adapter's share negligible.
                    "loraBillions": round(usable / (2.0 / ranks) / 1e9, 1),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="FSDP", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child is not None:
        child(opts)
        return 0
    if opts.quick:
        opts.layers, opts.steps = 1, 1
    with tempfile.TemporaryDirectory() as tmp:
        results = [run(strategy, ranks, opts, Path(tmp)) for strategy, ranks in CONFIGS]
    by = {(r["strategy"], r["ranks"]): r for r in results}
    total = results[0]["total"]
    one = max(by[("FSDP", 1)]["heldBytes"])
    scaling = {
        str(n): {
            "perRankBytes": max(by[("FSDP", n)]["heldBytes"]),
            "overIdeal": max(by[("FSDP", n)]["heldBytes"]) / (one / n),
        }
        for n in (1, 2, 4)
    }
    per_param = {1: one / total}
    step = {k: statistics.median(r["stepSeconds"] for r in v["perRank"]) for k, v in by.items()}
    report = {
        "benchmark": "sharding",
        "model": {
            "shape": "Qwen3-0.6B (hidden 1024, vocab 151936, tied)",
            "layers": opts.layers,
            "parameters": total,
        },
        "batch": {
            "rollouts": opts.rollouts,
            "prompt": opts.prompt,
            "completion": opts.completion,
            "micro": opts.micro,
        },
        "results": [{k: v for k, v in r.items() if k != "total"} for r in results],
        "fsdpScaling": scaling,
        "bytesPerParameterOneRank": per_param[1],
        "stepSeconds": {f"{s}-{n}": t for (s, n), t in step.items()},
        "stepFsdpOverDdp2Ranks": step[("FSDP", 2)] / step[("DDP", 2)],
        "publishSecondsFsdpOverDdp2Ranks": by[("FSDP", 2)]["perRank"][0]["publishSeconds"]
        / by[("DDP", 2)]["perRank"][0]["publishSeconds"],
        "checkpointPartBytes": {
            f"{s}-{n}": [r["checkpointBytes"] for r in v["perRank"]] for (s, n), v in by.items()
        },
        "fit": fit_table(per_param),
        "fitAssumptions": [
            f"{RESERVE:.0%} of the GPU kept for activations, one gathered layer, the CUDA context, fragmentation",
            "full fine-tuning: the bytes per parameter measured here on one rank (float32 parameters, gradients "
            "and AdamW's two moments), divided by the ranks as the measured FSDP scaling shows; mixed precision "
            "adds bfloat16 copies of one layer at a time only",
            "LoRA: the frozen base in bfloat16 (2 bytes a parameter), sharded; the adapter and its optimizer "
            "state (under 1 % of the base at rank 16) left out",
        ],
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"parameters {total:,}; bytes per parameter on one rank {per_param[1]:.2f}")
    for n, s in scaling.items():
        print(f"FSDP × {n}: {s['perRankBytes'] / 2**20:.0f} MiB a rank, {s['overIdeal']:.3f}× the ideal 1/N")
    print(f"step FSDP/DDP with 2 ranks: {report['stepFsdpOverDdp2Ranks']:.2f}; publish: "
          f"{report['publishSecondsFsdpOverDdp2Ranks']:.2f}")  # fmt: skip
    for row in report["fit"]:
        print(f"  {row['gpu']:14} × {row['ranks']}: full fine-tuning {row['fullFineTuningBillions']:6.1f} B, "
              f"LoRA {row['loraBillions']:6.1f} B")  # fmt: skip
    print(f"→ {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
