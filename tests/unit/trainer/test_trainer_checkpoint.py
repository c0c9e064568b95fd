"""Checkpoints, snapshots and the resume rule (echo_runtime.trainer.checkpoint, policy export/load)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from echo_runtime import staleness
from echo_runtime.backends import snapshot_files
from echo_runtime.rollout import Batch
from echo_runtime.trainer import checkpoint as ckpt
from echo_runtime.trainer import step
from echo_runtime.trainer.policy import TrainablePolicy

POLICY = staleness.StalenessPolicy(max_staleness=1)


@pytest.mark.parametrize(
    ("latest_checkpoint", "latest_snapshot", "expected"),
    [
        (None, None, ckpt.ResumePoint(0, "base", None)),  # a fresh job
        (None, 0, ckpt.ResumePoint(0, "base", None)),  # version 0 is the base model
        (None, 3, ckpt.ResumePoint(3, "snapshot", None)),  # crashed before the first checkpoint
        (4, 4, ckpt.ResumePoint(4, "checkpoint", 4)),  # clean stop or crash right after a checkpoint
        (4, 6, ckpt.ResumePoint(6, "snapshot", 4)),  # versions 5, 6 were published after checkpoint 4
        (4, None, ckpt.ResumePoint(4, "checkpoint", 4)),  # snapshots removed by hand: continue after 4
    ],
)
def test_resume_point(
    latest_checkpoint: int | None, latest_snapshot: int | None, expected: ckpt.ResumePoint
) -> None:
    point = ckpt.resume_point(latest_checkpoint, latest_snapshot)
    assert point == expected
    # never repeat a published version: the next one is always newer than anything in the store
    assert point.version + 1 > max(v for v in (latest_checkpoint, latest_snapshot, 0) if v is not None)


def test_rng_round_trip() -> None:
    ckpt.seed_everything(7)
    state = ckpt.capture_rng()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    ckpt.seed_everything(99)
    ckpt.restore_rng(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


@pytest.mark.parametrize("finetune", ["LoRA", "Full"])
def test_checkpoint_round_trip_continues_identically(
    finetune: str,
    tmp_path: Path,
    make_policy: Callable[..., TrainablePolicy],
    make_batch: Callable[..., Batch],
) -> None:
    """Train 1 step, checkpoint, train a 2nd; a fresh trainer restored from the checkpoint makes the same 2nd step."""
    config = step.StepConfig(micro_batch_size=3)
    first, second = make_batch(make_policy(), 0, seed=5), make_batch(make_policy(), 1, seed=6)
    policy = make_policy(finetune=finetune)
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-3)
    step.train_step(policy, optimizer, step.plan_step(first, POLICY), config)
    ckpt.write_checkpoint(tmp_path / "c1", policy, optimizer, 1, [ckpt.capture_rng()], "echorl:tiny")
    step.train_step(policy, optimizer, step.plan_step(second, POLICY), config)

    restored = make_policy(
        finetune=finetune, seed=123
    )  # different LoRA init: the checkpoint must overwrite it
    restored_optimizer = step.make_optimizer(restored.trainable_parameters(), 1e-3)
    found = ckpt.read_checkpoint(tmp_path / "c1")
    assert (found.version, found.finetune, found.world_size, found.base_model) == (
        1,
        finetune,
        1,
        "echorl:tiny",
    )
    ckpt.apply_checkpoint(found, restored, restored_optimizer)
    step.train_step(restored, restored_optimizer, step.plan_step(second, POLICY), config)
    for name, value in policy.trainable_state().items():
        torch.testing.assert_close(restored.trainable_state()[name], value, rtol=0, atol=0)


def test_checkpoint_of_another_finetune_mode_is_refused(
    tmp_path: Path, make_policy: Callable[..., TrainablePolicy]
) -> None:
    lora = make_policy()
    optimizer = step.make_optimizer(lora.trainable_parameters(), 1e-3)
    ckpt.write_checkpoint(tmp_path, lora, optimizer, 3, [ckpt.capture_rng()])
    full = make_policy(finetune="Full")
    with pytest.raises(ValueError, match="finetune LoRA"):
        ckpt.apply_checkpoint(
            ckpt.read_checkpoint(tmp_path), full, step.make_optimizer(full.trainable_parameters(), 1e-3)
        )
    (tmp_path / ckpt.OPTIMIZER).unlink()
    with pytest.raises(FileNotFoundError, match=r"optimizer\.pt"):
        ckpt.read_checkpoint(tmp_path)


@pytest.mark.parametrize("finetune", ["LoRA", "Full"])
def test_snapshot_export_and_load_are_exact(
    finetune: str,
    tmp_path: Path,
    make_policy: Callable[..., TrainablePolicy],
    make_batch: Callable[..., Batch],
) -> None:
    policy = make_policy(finetune=finetune)
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-2)
    step.train_step(policy, optimizer, step.plan_step(make_batch(policy, 0), POLICY), step.StepConfig())
    files = policy.export_snapshot(tmp_path / "snap")
    kind = policy.snapshot_kind
    assert kind == ("lora" if finetune == "LoRA" else "full")
    snapshot_files.check_snapshot_dir(tmp_path / "snap", kind)
    if kind == "lora":
        assert set(files) == {"adapter_config.json", "adapter_model.safetensors"}
        adapter = snapshot_files.read_lora_adapter(
            tmp_path / "snap", snapshot_files.safetensors_shapes(files["adapter_model.safetensors"])
        )
        assert adapter.max_rank == 4 and len(adapter.modules) == 2 * 7  # 2 layers × 7 target modules
    else:
        assert set(files) == {"model.safetensors"}

    fresh = make_policy(finetune=finetune, seed=9)
    fresh.load_snapshot(tmp_path / "snap")
    for name, value in policy.trainable_state().items():
        torch.testing.assert_close(fresh.trainable_state()[name], value, rtol=0, atol=0)
