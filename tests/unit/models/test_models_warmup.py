"""Supervised warm-up: completion-only loss, it actually learns, determinism, output directory, generation."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_runtime.models import build, load, resolve, warmup
from echo_runtime.tasks import get_task


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.init_model("tiny", tmp_path_factory.mktemp("warm") / "tiny", seed=0)


def _heldout_loss(model_dir: Path, n: int = 64) -> float:
    tokenizer = load.load_tokenizer(str(model_dir))
    model = load.load_causal_lm(str(model_dir))
    task = get_task("arithmetic")
    pairs = [(p.prompt, task.reference(p)) for p in itertools.islice(task.prompts("heldout", 0), n)]
    batch = warmup.collate([warmup.encode_pair(tokenizer, p, c) for p, c in pairs], tokenizer.pad_token_id)
    with torch.no_grad():
        return float(warmup.completion_loss(model, batch))


def test_labels_cover_only_the_completion_and_eos(tiny_dir: Path) -> None:
    tokenizer = load.load_tokenizer(str(tiny_dir))
    ids, n_prompt = warmup.encode_pair(tokenizer, "12+7=", "19")
    assert n_prompt == 5 and len(ids) == 8 and ids[-1] == tokenizer.eos_token_id
    batch = warmup.collate([(ids, n_prompt), ([1, 2, 3], 2)], pad_id=tokenizer.pad_token_id)
    assert batch["labels"][0].tolist() == [-100] * 5 + ids[5:]
    assert batch["labels"][1].tolist() == [-100, -100, 3] + [-100] * 5
    assert batch["attention_mask"][1].tolist() == [1, 1, 1] + [0] * 5


def test_warmup_lowers_the_heldout_loss_and_writes_a_loadable_model(tiny_dir: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    steps_seen: list[int] = []
    result = warmup.warmup(
        tiny_dir, tmp_path / "warm", task="arithmetic", steps=40, seed=0, lr=3e-3, eval_size=16,
        log=lines.append, on_step=lambda step, loss: steps_seen.append(step),
    )  # fmt: skip
    assert steps_seen == list(range(1, 41))
    assert result.losses[-1] < 0.6 * result.losses[0]
    before, after = _heldout_loss(tiny_dir), _heldout_loss(result.out_dir)
    assert after < 0.6 * before, (before, after)
    assert any(line.startswith("before warm-up") for line in lines)
    assert any(line.startswith("after warm-up") for line in lines)

    record = warmup.read_record(result.out_dir)
    assert record is not None
    assert record["steps"] == 40 and record["task"] == "arithmetic" and len(record["losses"]) == 40
    assert set(record["before"]) == set(record["after"]) == {"greedy", "sampled"}
    assert 0.0 <= record["after"]["greedy"]["accuracy"] <= 1.0
    metadata = build.read_metadata(result.out_dir)
    assert metadata is not None and metadata["warmup"]["steps"] == 40 and metadata["size"] == "tiny"
    # tokenizer files are copied byte for byte; the model loads with the ordinary classes
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (result.out_dir / name).read_bytes() == (tiny_dir / name).read_bytes()
    from transformers import AutoModelForCausalLM

    assert type(AutoModelForCausalLM.from_pretrained(result.out_dir)).__name__ == "Qwen3ForCausalLM"


def test_warmup_is_deterministic_and_a_shorter_run_is_a_prefix(tiny_dir: Path, tmp_path: Path) -> None:
    long = warmup.warmup(tiny_dir, tmp_path / "a", steps=8, seed=4, eval_size=2)
    short = warmup.warmup(tiny_dir, tmp_path / "b", steps=4, seed=4, eval_size=2)
    again = warmup.warmup(tiny_dir, tmp_path / "c", steps=4, seed=4, eval_size=2)
    assert short.losses == long.losses[:4]
    assert (short.out_dir / "model.safetensors").read_bytes() == (
        again.out_dir / "model.safetensors"
    ).read_bytes()
    other = warmup.warmup(tiny_dir, tmp_path / "d", steps=4, seed=5, eval_size=2)
    assert other.losses != short.losses


def test_warmup_rejects_bad_arguments(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="steps"):
        warmup.warmup(tiny_dir, tmp_path / "x", steps=0)
    with pytest.raises(ValueError, match="lr"):
        warmup.warmup(tiny_dir, tmp_path / "x", steps=1, lr=0.0)
    with pytest.raises(ValueError, match="unknown task"):
        warmup.warmup(tiny_dir, tmp_path / "x", task="nope", steps=1)
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError):
        warmup.warmup(tiny_dir, tmp_path / "exists", steps=1)


def test_generate_matches_transformers_greedy_decoding(tiny_dir: Path) -> None:
    from transformers import GenerationConfig

    model = load.load_causal_lm(str(tiny_dir))
    tokenizer = load.load_tokenizer(str(tiny_dir))
    prompts = ["1+2=", "93-17=", "5*4+3=", "Who is a knight?"]  # different lengths: left padding matters
    ours = warmup.generate(model, tokenizer, prompts, max_new_tokens=6)
    for prompt, completion in zip(prompts, ours, strict=True):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        config = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)[
            0, ids.shape[1] :
        ]
        assert completion == tokenizer.decode(out, skip_special_tokens=True)
    sampled = warmup.generate(model, tokenizer, prompts * 8, max_new_tokens=6, temperature=1.0, seed=3)
    assert sampled == warmup.generate(
        model, tokenizer, prompts * 8, max_new_tokens=6, temperature=1.0, seed=3
    )
    assert len(set(sampled)) > 4  # an untrained model samples varied text


def test_generate_asks_the_prompt_pass_for_the_last_position_only(tiny_dir: Path) -> None:
    """The evaluator's prefill holds ``[rows, 1, vocab]`` logits, not a row of logits per prompt token."""
    model = load.load_causal_lm(str(tiny_dir))
    tokenizer = load.load_tokenizer(str(tiny_dir))
    widths: list[int] = []

    def record(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        widths.append(int(output.logits.shape[1]))

    handle = model.register_forward_hook(record, with_kwargs=True)
    try:
        warmup.generate(model, tokenizer, ["1+2=", "93-17=", "5*4+3="], max_new_tokens=3)
    finally:
        handle.remove()
    assert widths and set(widths) == {1}


def test_resolve_builds_and_caches_a_warmed_model(tmp_path: Path) -> None:
    path = resolve.resolve_model("echorl:tiny", seed=0, warmup_steps=3)
    assert Path(path).name == resolve.cache_key("tiny", seed=0, warmup_steps=3, task="arithmetic")
    record = json.loads((Path(path) / warmup.RECORD_FILE).read_text())
    assert record["steps"] == 3 and record["lr"] == warmup.DEFAULT_LR
    base = resolve.resolve_model("echorl:tiny", seed=0)
    assert (Path(base) / "model.safetensors").read_bytes() != (Path(path) / "model.safetensors").read_bytes()
    mtime = (Path(path) / "model.safetensors").stat().st_mtime_ns
    assert resolve.resolve_model("echorl:tiny", seed=0, warmup_steps=3) == path
    assert (Path(path) / "model.safetensors").stat().st_mtime_ns == mtime
