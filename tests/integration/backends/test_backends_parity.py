"""Parity: on the same snapshot and token sequences, the transformers and mlx backends' log-probs agree
within 1e-4 with each other and with the trainer's own recomputation (issue 6; issue 8's fidelity bound).

The trainer's recomputation is :func:`echo_runtime.trainer.policy.completion_logprobs` on a right-padded
batch (:func:`echo_runtime.trainer.policy.pack`) of an independently loaded model: peft's
``PeftModel.from_pretrained`` for a LoRA snapshot, ``from_pretrained`` + the shards for a full one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_runtime.backends import base, snapshot_files
from echo_runtime.models import load as model_load
from echo_runtime.rollout import Rollout
from echo_runtime.trainer import policy as trainer_policy

TOLERANCE = 1e-4
PROMPTS = ["What is 12 + 30?", "Solve: 7 * 6 =", "Knights always tell the truth.", "x"]

_log = logging.getLogger(__name__)


def _reference_model(model_dir: Path, stage: str, snapshot: Path | None) -> Any:
    model = model_load.load_causal_lm(str(model_dir), "float32", "cpu")
    if stage == "lora":
        from peft import PeftModel

        return PeftModel.from_pretrained(model, str(snapshot)).eval()
    if stage == "full":
        from safetensors.torch import load_file

        assert snapshot is not None
        state: dict[str, torch.Tensor] = {}
        for file in snapshot_files.full_weight_files(snapshot):
            state.update(load_file(str(file)))
        model.load_state_dict(state, strict=False)
    return model


def _trainer_logprobs(
    model: Any, samples: list[Rollout], pad_id: int, temperature: float
) -> list[list[float]]:
    rollouts = [
        Rollout(
            prompt_ids=s.prompt_ids,
            completion_ids=s.completion_ids,
            logprobs=s.logprobs,
            reward=0.0,
            policy_version=0,
        )
        for s in samples
    ]
    packed = trainer_policy.pack(rollouts, pad_id)
    with torch.no_grad():
        values = trainer_policy.completion_logprobs(model, packed, temperature)
    return [values[i, : len(s.completion_ids)].tolist() for i, s in enumerate(samples)]


def _max_and_mean(a: list[list[float]], b: list[list[float]]) -> tuple[float, float]:
    diffs = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return max(diffs), sum(diffs) / len(diffs)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("stage", ["base", "lora", "full"])
def test_transformers_mlx_and_trainer_agree(
    stage: str,
    make_backend: Callable[..., Any],
    tiny_model: Path,
    lora_snapshots: dict[str, Path],
    full_snapshot: Path,
) -> None:
    snapshot = {"base": None, "lora": lora_snapshots["v1"], "full": full_snapshot}[stage]
    torch_backend = make_backend("transformers")
    mlx_backend = make_backend("mlx")
    if snapshot is not None:
        kind: base.SnapshotKind = "lora" if stage == "lora" else "full"
        torch_backend.apply_snapshot(3, snapshot, kind)
        mlx_backend.apply_snapshot(3, snapshot, kind)

    reference = _reference_model(tiny_model, stage, snapshot)
    for temperature in (1.0, 0.7):
        # Token sequences sampled by each backend (so both policies' likely tokens appear), 24 tokens each.
        params = base.SamplingParams(temperature=temperature, max_new_tokens=24, seed=11)
        samples = [s for group in torch_backend.sample(PROMPTS, 2, params) for s in group]
        samples += [s for group in mlx_backend.sample(PROMPTS, 2, params) for s in group]

        by_torch = [
            torch_backend.score_logprobs(s.prompt_ids, s.completion_ids, temperature) for s in samples
        ]
        by_mlx = [mlx_backend.score_logprobs(s.prompt_ids, s.completion_ids, temperature) for s in samples]
        by_trainer = _trainer_logprobs(reference, samples, torch_backend.pad_id, temperature)

        torch_mlx = _max_and_mean(by_torch, by_mlx)
        torch_trainer = _max_and_mean(by_torch, by_trainer)
        mlx_trainer = _max_and_mean(by_mlx, by_trainer)
        sampled = _max_and_mean([list(s.logprobs) for s in samples], by_trainer)
        report = (
            f"{stage} T={temperature}: max|Δ| (mean) transformers-mlx {torch_mlx[0]:.2e} ({torch_mlx[1]:.1e}), "
            f"transformers-trainer {torch_trainer[0]:.2e} ({torch_trainer[1]:.1e}), "
            f"mlx-trainer {mlx_trainer[0]:.2e} ({mlx_trainer[1]:.1e}), sampled-trainer {sampled[0]:.2e}"
        )
        _log.info(report)
        for name, (worst, mean) in {
            "transformers vs mlx": torch_mlx,
            "transformers vs trainer": torch_trainer,
            "mlx vs trainer": mlx_trainer,
            "sampled vs trainer": sampled,
        }.items():
            assert worst <= TOLERANCE, f"{name}: {report}"
            assert mean <= TOLERANCE, f"{name}: {report}"


def test_snapshots_change_the_policy(
    make_backend: Callable[..., Any], lora_snapshots: dict[str, Path], full_snapshot: Path
) -> None:
    """Guards the parity test against vacuity: each snapshot moves the log-probs well beyond 1e-4."""
    backend = make_backend("transformers")
    prompt = backend.tokenizer.encode("What is 12 + 30?")
    completion = backend.tokenizer.encode(" 42 and more words")
    before = backend.score_logprobs(prompt, completion, 1.0)
    for version, (path, kind) in enumerate(
        [(lora_snapshots["v1"], "lora"), (lora_snapshots["v2"], "lora"), (full_snapshot, "full")], start=1
    ):
        backend.apply_snapshot(version, path, kind)
        after = backend.score_logprobs(prompt, completion, 1.0)
        assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 0.05, (version, before, after)
        before = after


def test_mlx_reads_the_rope_base_transformers_5_writes(tiny_model: Path, tmp_path: Path) -> None:
    """transformers 5 writes RoPE settings as ``rope_parameters``; mlx-lm's Llama reads ``rope_theta``
    (default 10000). A Llama with another base (SmolLM2's is 100000) must run with it in mlx too, or its
    log-probs drift from the trainer's by tenths of a nat and the honest mlx worker is quarantined."""
    import json
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    from echo_runtime import backends

    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=100000.0, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    llama = tmp_path / "llama"
    LlamaForCausalLM(config).save_pretrained(str(llama))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (tiny_model / name).is_file() and not (llama / name).is_file():
            shutil.copyfile(tiny_model / name, llama / name)
    written = json.loads((llama / "config.json").read_text())
    assert "rope_theta" not in written and written["rope_parameters"]["rope_theta"] == 100000.0
    prompt, completion = list(range(20, 60)), list(range(100, 112))  # positions matter past the first
    scores = {
        name: backends.create_backend(name, llama, device="cpu", threads=1).score_logprobs(
            prompt, completion, 1.0
        )
        for name in ("transformers", "mlx")
    }
    gap = max(abs(a - b) for a, b in zip(scores["transformers"], scores["mlx"], strict=True))
    assert gap <= TOLERANCE, gap
