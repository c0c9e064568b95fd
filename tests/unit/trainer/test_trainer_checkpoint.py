"""Checkpoints, snapshots and the resume rule (echo_runtime.trainer.checkpoint, policy export/load)."""

from __future__ import annotations

import enum
import io
import pickle
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
    found = ckpt.load_state(tmp_path / "c1", restored, restored_optimizer)
    assert (found.version, found.finetune, found.world_size, found.base_model) == (
        1,
        finetune,
        1,
        "echorl:tiny",
    )
    step.train_step(restored, restored_optimizer, step.plan_step(second, POLICY), config)
    for name, value in policy.trainable_state().items():
        torch.testing.assert_close(restored.trainable_state()[name], value, rtol=0, atol=0)


def test_checkpoint_restores_the_optimizer_without_the_weights(
    tmp_path: Path, make_policy: Callable[..., TrainablePolicy], make_batch: Callable[..., Batch]
) -> None:
    """``weights=False`` (weights from a newer snapshot): the moments and hyperparameters come back, the
    parameters stay as they are."""
    policy = make_policy()
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-3)
    step.train_step(
        policy, optimizer, step.plan_step(make_batch(policy, 0, seed=5), POLICY), step.StepConfig()
    )
    optimizer.param_groups[0]["lr"] = 0.25  # as a schedule leaves it
    ckpt.write_checkpoint(tmp_path, policy, optimizer, 1, [ckpt.capture_rng()])
    other = make_policy(seed=9)
    before = other.trainable_state()
    other_optimizer = step.make_optimizer(other.trainable_parameters(), 1e-3)
    ckpt.load_state(tmp_path, other, other_optimizer, weights=False)
    for name, value in before.items():
        torch.testing.assert_close(other.trainable_state()[name], value, rtol=0, atol=0)
    assert other_optimizer.param_groups[0]["lr"] == 0.25
    theirs = {n: other_optimizer.state[p] for n, p in other.named_trainable()}
    for name, param in policy.named_trainable():
        for key, value in optimizer.state[param].items():
            torch.testing.assert_close(theirs[name][key], value, rtol=0, atol=0)


def test_checkpoint_of_another_finetune_mode_is_refused(
    tmp_path: Path, make_policy: Callable[..., TrainablePolicy]
) -> None:
    lora = make_policy()
    optimizer = step.make_optimizer(lora.trainable_parameters(), 1e-3)
    ckpt.write_checkpoint(tmp_path, lora, optimizer, 3, [ckpt.capture_rng()])
    full = make_policy(finetune="Full")
    with pytest.raises(ValueError, match="finetune LoRA"):
        ckpt.load_state(tmp_path, full, step.make_optimizer(full.trainable_parameters(), 1e-3))
    (tmp_path / ckpt.DCP_METADATA).unlink()
    with pytest.raises(FileNotFoundError, match=r"metadata\.dcp"):
        ckpt.read_meta(tmp_path)


def test_checkpoint_of_an_older_format_is_refused_with_the_way_out(
    tmp_path: Path, make_policy: Callable[..., TrainablePolicy]
) -> None:
    policy = make_policy()
    ckpt.write_checkpoint(tmp_path, policy, step.make_optimizer(policy.trainable_parameters(), 1e-3), 2, [{}])
    state = tmp_path / ckpt.STATE
    state.write_text(state.read_text().replace('"format": 2', '"format": 1'))
    with pytest.raises(ValueError, match=r"format 1.*reads format 2.*snapshots are unaffected"):
        ckpt.read_meta(tmp_path)


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("code ran",))


def test_checkpoint_metadata_that_would_run_code_is_refused(
    tmp_path: Path, make_policy: Callable[..., TrainablePolicy], capsys: pytest.CaptureFixture[str]
) -> None:
    """DCP's metadata is a pickle: a store a worker could write to must not make the trainer run code.
    Only DCP's own metadata classes are admitted; the real metadata loads (the other tests)."""
    import pickle

    policy = make_policy()
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-3)
    ckpt.write_checkpoint(tmp_path, policy, optimizer, 1, [ckpt.capture_rng()])
    (tmp_path / ckpt.DCP_METADATA).write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(pickle.UnpicklingError, match=r"builtins\.print"):
        ckpt.load_state(tmp_path, policy, optimizer)
    assert "code ran" not in capsys.readouterr().out


class _EnumsByName(pickle.Pickler):
    """Pickles enum members as ``getattr(cls, name)``, as Debian's Python 3.11 (the images') does."""

    def reducer_override(self, obj: object) -> object:
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def test_checkpoint_metadata_with_enums_pickled_by_name_loads_and_nothing_else_does(
    tmp_path: Path, make_policy: Callable[..., TrainablePolicy]
) -> None:
    """A checkpoint the images wrote: DCP's metadata enum pickled as getattr(enum, name). That getattr
    is admitted for the members of DCP's own enums only."""
    policy = make_policy()
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-3)
    ckpt.write_checkpoint(tmp_path, policy, optimizer, 1, [ckpt.capture_rng()])
    path = tmp_path / ckpt.DCP_METADATA
    metadata = pickle.loads(path.read_bytes())
    out = io.BytesIO()
    _EnumsByName(out).dump(metadata)
    assert b"getattr" in out.getvalue()
    path.write_bytes(out.getvalue())
    ckpt.load_state(tmp_path, policy, optimizer)  # loads
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, Metadata

    # Admitted classes, but not an enum's member: a method could be called with chosen arguments.
    for target, name in ((Metadata, "__init__"), (_MEM_FORMAT_ENCODING, "_missing_")):
        evil = io.BytesIO()
        pickle.Pickler(evil).dump(_GetAttr(target, name))
        path.write_bytes(evil.getvalue())
        with pytest.raises(pickle.UnpicklingError):
            ckpt.load_state(tmp_path, policy, optimizer)


class _GetAttr:
    def __init__(self, target: object, name: str) -> None:
        self.target, self.name = target, name

    def __reduce__(self) -> tuple[object, tuple[object, str]]:
        return getattr, (self.target, self.name)


def test_checkpoint_metadata_naming_a_file_outside_its_folder_is_refused(
    tmp_path: Path, make_policy: Callable[..., TrainablePolicy]
) -> None:
    import pickle

    policy = make_policy()
    optimizer = step.make_optimizer(policy.trainable_parameters(), 1e-3)
    ckpt.write_checkpoint(tmp_path, policy, optimizer, 1, [ckpt.capture_rng()])
    path = tmp_path / ckpt.DCP_METADATA
    metadata = pickle.loads(path.read_bytes())
    info = next(iter(metadata.storage_data.values()))
    info.relative_path = "../../trainer.json"
    path.write_bytes(pickle.dumps(metadata))
    with pytest.raises(ValueError, match=r"names a file '\.\./\.\./trainer\.json'"):
        ckpt.load_state(tmp_path, policy, optimizer)


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
