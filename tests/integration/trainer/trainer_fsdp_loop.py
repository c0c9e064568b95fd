"""The whole trainer loop under torchrun with a strategy, for the sharding tests (test_trainer_fsdp.py).

``python trainer_fsdp_loop.py OUT_DIR MODEL_DIR STORE MAX_STEPS STRATEGY RESUME [FINETUNE [STALE_BY]]``: ``loop.run``
of a ``make_job`` job (LoRA, or Full in bfloat16, or FullDelta: Full with an anchor every 2
versions and deltas between; checkpoint every 2 versions) whose ``trainingSwarm.strategy`` is ``STRATEGY``,
against the scripted coordinator and a local store at ``STORE``, up to ``MAX_STEPS``, resuming from
the store when ``RESUME`` is ``resume``; the second group of each batch claims the version ``STALE_BY``
older (default 0). The log-prob check is on, with a bound no made-up log-prob
crosses, so that its recomputations run. Rank 0 writes ``OUT_DIR/loop.json`` (versions, checkpoints,
announcements, each step's loss, what the check recomputed) and the last version's weights (the
adapter, or the whole model) as ``OUT_DIR/adapter.safetensors``, with a Full snapshot's file names.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import safetensors.torch
from trainer_scripted import ScriptedCoordinator, make_job

from echo_runtime.snapshots import open_store, payloads
from echo_runtime.trainer import distributed, loop, policy


def _parts(folder: Path) -> dict[str, list[str]]:
    """Which DCP file holds a piece of each tensor of a checkpoint (read with plain pickle: this test
    wrote it)."""
    import pickle

    from echo_runtime.trainer import checkpoint as ckpt

    metadata = pickle.loads((folder / ckpt.DCP_METADATA).read_bytes())
    parts: dict[str, set[str]] = {key: set() for key in metadata.state_dict_metadata}
    for index, info in metadata.storage_data.items():
        parts[index.fqn].add(info.relative_path)
    return {key: sorted(files) for key, files in parts.items()}


def main(
    out_dir: str,
    model_dir: str,
    store_dir: str,
    max_steps: str,
    strategy: str,
    resume: str,
    finetune: str = "LoRA",
    stale_by: str = "0",
) -> None:
    world = distributed.init_world("cpu")
    out = Path(out_dir)
    policy.STREAM_SHARD_BYTES = 1 << 19  # the tiny model's Full snapshot in several files, as a large model's
    job = make_job(
        Path(store_dir).parent, model_dir, interval=2, max_steps=int(max_steps), full=finetune != "LoRA",
        anchor_interval=2 if finetune == "FullDelta" else None,
        training_swarm={"strategy": strategy}, logprobChecksPerGroup=1, maxLogprobMismatch=100.0,
    )  # fmt: skip
    assert job.training_swarm.strategy == strategy  # the loop takes it from the manifest
    assert job.spec.storage.path == str(Path(store_dir)), job.spec.storage.path
    store = open_store(job.spec.storage, job.name)  # every rank: each writes its part of a checkpoint
    coordinator = ScriptedCoordinator(stale_by=int(stale_by)) if world.is_main else None
    metrics = out / "metrics.jsonl"
    options = loop.LoopOptions(resume=resume == "resume", collect=False, metrics_path=metrics)
    result = loop.run(job, coordinator=coordinator, store=store, world=world, options=options)
    if world.is_main:
        assert store is not None and coordinator is not None
        (out / "loop.json").write_text(
            json.dumps(
                {
                    "start": result.start_version,
                    "versions": store.versions(),
                    "checkpoints": store.checkpoints(),
                    # the newest checkpoint's files and sizes: one DCP part per rank that held a shard
                    "checkpointFiles": sorted(
                        f.name for f in store.checkpoint_manifest(store.checkpoints()[-1]).files
                    ),
                    "checkpointParts": _parts(store.fetch_checkpoint(store.checkpoints()[-1], out / "cache")),
                    "announced": coordinator.announced,
                    "losses": {str(m.version): m.loss for m in result.steps},
                    # what the log-prob check recomputed, per step: (versions checked, groups left out)
                    "checked": [
                        (r["checkedVersions"], r["uncheckedGroups"])
                        for r in map(json.loads, metrics.read_text().splitlines())
                    ],
                }
            )
        )
        last = store.fetch(store.versions()[-1], out / "cache")
        if finetune != "LoRA":
            weights = payloads.load_state_dict(last)
            (out / "files.json").write_text(json.dumps(sorted(p.name for p in last.iterdir())))
            # Every version as a reader rebuilds it (deltas applied to their anchor), and which are deltas.
            every = {
                f"v{v}/{name}": tensor
                for v in store.versions()
                for name, tensor in payloads.load_state_dict(store.fetch(v, out / "cache")).items()
            }
            safetensors.torch.save_file(every, str(out / "versions.safetensors"))
            sizes = {str(v): store.manifest(v).total_size for v in store.versions()}
            deltas = [v for v in store.versions() if store.manifest(v).delta is not None]
            (out / "deltas.json").write_text(json.dumps({"deltas": deltas, "sizes": sizes}))
        else:
            weights = payloads.load_lora_adapter(last).tensors
        safetensors.torch.save_file(weights, str(out / "adapter.safetensors"))
    distributed.shutdown(world)


if __name__ == "__main__":
    main(*sys.argv[1:9])
