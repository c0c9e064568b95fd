"""One rank of the data-parallel equivalence test (run by torchrun, or called in-process as a world of one).

``python trainer_ddp_script.py OUT_DIR MODEL_DIR``: on a fixed batch, one SGD step (the raw gradient)
and then two AdamW steps, through exactly the trainer's code path (:func:`step_phases`: ``distributed.wrap``,
``batch.shard``, ``step.train_step`` with the all-reduce collective). Rank 0 writes the trainable
parameters after each phase and the step metrics to ``OUT_DIR``. Then two versions of the whole loop (``loop.run``) against the
scripted coordinator and a local store in ``OUT_DIR/store``; rank 0 writes what was published.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

import safetensors.torch
import torch
from trainer_scripted import ScriptedCoordinator, make_job

from echo_runtime import staleness
from echo_runtime.rollout import Batch, Group, Rollout
from echo_runtime.snapshots import open_store, payloads
from echo_runtime.spec.objectives import Objective
from echo_runtime.spec.policy import LoRA, Model
from echo_runtime.trainer import distributed, loop, step
from echo_runtime.trainer.batch import shard
from echo_runtime.trainer.policy import load_policy

RULE = staleness.StalenessPolicy(mode="Async", max_staleness=1, stale_action="ImportanceWeight")


def fixed_batch(version: int, seed: int) -> Batch:
    """3 groups × 3 rollouts (9: an odd count, so rank 1 gets a filler), one group a version behind."""
    rng = random.Random(seed)
    groups = []
    for g in range(3):
        prompt = tuple(rng.randrange(1, 1000) for _ in range(rng.randint(2, 5)))
        rollouts = []
        for i in range(3):
            completion = tuple(rng.randrange(1, 1000) for _ in range(rng.randint(1, 6)))
            rollouts.append(
                Rollout(
                    prompt_ids=prompt,
                    completion_ids=completion,
                    logprobs=tuple(-rng.uniform(6.0, 8.0) for _ in completion),  # ρ ≠ 1: clip and cap matter
                    reward=float(i == g % 3),
                    policy_version=version - 1 if g == 2 else version,
                    backend="transformers",
                )
            )
        groups.append(Group(rollouts=tuple(rollouts), id=f"g{g}"))
    return Batch(version=version, groups=tuple(groups))


def step_phases(
    out: Path,
    model_dir: str,
    world: distributed.World,
    finetune: str = "LoRA",
    strategy: str = "DDP",
    *,
    checkpointing: bool = False,
) -> None:
    """One SGD step at rate 1 (1e-2 for Full: rate 1 on every weight would wreck the model for what
    follows) — the parameters move by the raw gradient — then two AdamW steps, on the fixed batches,
    through ``distributed.wrap`` with ``strategy``, ``batch.shard`` and ``step.train_step``. Each
    optimizer is made after ``wrap``, as FSDP requires. Rank 0 writes the whole trainable parameters
    after each phase (gathered from every rank when sharded), the step metrics, and what one rank holds
    of the parameters against the model's total (``held.json``)."""
    torch.manual_seed(0)
    spec = Model(finetune=finetune, lora=LoRA(rank=4, alpha=8.0))  # type: ignore[arg-type]
    # Full fine-tuning keeps a frozen reference for the KL term (sharded like the policy under FSDP).
    policy = load_policy(
        spec, model_dir=model_dir, device=world.device, with_reference=finetune == "Full",
        gradient_checkpointing=checkpointing,
    )  # fmt: skip
    module = distributed.wrap(policy.model, world, strategy)  # type: ignore[arg-type]
    if strategy == "FSDP" and policy.reference is not None:  # as Trainer.build shards it
        distributed.wrap(policy.reference, world, "FSDP")
    comm = distributed.collective(world)
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in policy.model.parameters())
    total = sum(distributed.full_tensor(p.detach()).numel() for p in policy.model.parameters())
    sgd_rate = 1.0 if finetune == "LoRA" else 1e-2
    phases: list[tuple[str, Callable[[], torch.optim.Optimizer], list[int], float]] = [
        ("sgd", lambda: torch.optim.SGD(policy.trainable_parameters(), lr=sgd_rate), [1], 1e9),
        ("adamw", lambda: step.make_optimizer(policy.trainable_parameters(), 1e-2), [2, 3], 1.0),
    ]
    records = []
    for name, make, versions, max_norm in phases:
        optimizer = make()
        for version in versions:
            batch = world.broadcast(fixed_batch(version, seed=version) if world.is_main else None)
            assert batch is not None
            plan = step.plan_step(batch, RULE)
            config = step.StepConfig(
                micro_batch_size=2, objective=Objective(kl_coef=0.05), max_grad_norm=max_norm
            )
            metrics = step.train_step(
                policy, optimizer, plan, config, module=module, collective=comm, shard=shard
            )
            records.append({k: v for k, v in metrics.to_dict().items() if k not in ("seconds", "mismatch")})
        state = policy.gathered_trainable_state(keep=world.is_main)
        if world.is_main:
            safetensors.torch.save_file(state, str(out / f"{name}.safetensors"))
    if world.is_main:
        (out / "metrics.json").write_text(json.dumps(records))
        reference = policy.reference
        sharded_reference = reference is not None and all(
            hasattr(p, "to_local") for p in reference.parameters()
        )
        (out / "held.json").write_text(
            json.dumps(
                {
                    "local": local,
                    "total": total,
                    "shardedReference": sharded_reference,
                    "checkpointing": bool(getattr(policy.model, "is_activation_checkpointing", False)),
                }
            )
        )


def main(out_dir: str, model_dir: str) -> None:
    world = distributed.init_world("cpu")
    out = Path(out_dir)
    step_phases(out, model_dir, world)

    # The whole loop: rank 0 pulls and broadcasts batches, publishes and checkpoints (RNG of every rank).
    job = make_job(out, model_dir, interval=2, max_steps=2)
    is_main = world.is_main
    store = open_store(job.spec.storage, job.name)  # every rank: each writes its part of a checkpoint
    coordinator = ScriptedCoordinator() if is_main else None
    result = loop.run(job, coordinator=coordinator, store=store, world=world)
    if is_main:
        assert store is not None and coordinator is not None
        summary = {
            "versions": store.versions(),
            "checkpoints": store.checkpoints(),
            "announced": coordinator.announced,
            "steps": len(result.steps),
            "rng_ranks": len(json.loads((store.fetch_checkpoint(2, out / "cache") / "rng.json").read_text())),
        }
        (out / "loop.json").write_text(json.dumps(summary))
        adapter = payloads.load_lora_adapter(store.fetch(2, out / "cache")).tensors
        safetensors.torch.save_file(adapter, str(out / "loop.safetensors"))
    distributed.shutdown(world)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
