"""End to end with the trainer: snapshots the trainer exports, applied by each backend, give behaviour
log-probs equal to the trainer's own recomputation of the same rollouts (within 1e-4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_runtime.backends import base
from echo_runtime.rollout import Rollout
from echo_runtime.spec.policy import LoRA, Model
from echo_runtime.trainer import policy as trainer_policy


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("finetune", ["LoRA", "Full"])
def test_trainer_snapshots_sample_with_the_trainers_logprobs(
    finetune: str, tiny_model: Path, make_backend: Callable[..., Any], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    policy = trainer_policy.load_policy(
        Model(finetune=finetune, lora=LoRA(rank=4, alpha=8.0)),
        model_dir=str(tiny_model),
    )
    with torch.no_grad():  # stands in for optimizer steps: every trainable weight moves
        for param in policy.trainable_parameters():
            param.add_(torch.randn_like(param) * 0.05)
    policy.model.eval()
    policy.export_snapshot(tmp_path / "v1")
    kind: base.SnapshotKind = "lora" if finetune == "LoRA" else "full"

    for name in ("transformers", "mlx"):
        backend = make_backend(name)
        backend.apply_snapshot(1, tmp_path / "v1", kind)
        params = base.SamplingParams(temperature=0.8, max_new_tokens=12, seed=0)
        samples = [s for group in backend.sample(["What is 3 + 4?", "x y"], 3, params) for s in group]
        rollouts = [
            Rollout(
                prompt_ids=s.prompt_ids,
                completion_ids=s.completion_ids,
                logprobs=s.logprobs,
                reward=0.0,
                policy_version=1,
                backend=name,
            )
            for s in samples
        ]
        with torch.no_grad():
            recomputed = trainer_policy.completion_logprobs(
                policy.model, trainer_policy.pack(rollouts, backend.pad_id), 0.8
            )
        gap = max(
            abs(recomputed[i, j].item() - lp)
            for i, s in enumerate(samples)
            for j, lp in enumerate(s.logprobs)
        )
        assert gap <= 1e-4, (name, finetune, gap)
