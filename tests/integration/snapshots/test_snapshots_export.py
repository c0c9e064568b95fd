"""``echorl export``: versions of a real store as Hugging Face directories that transformers loads.

* Versions published by the trainer's own code (LoRA; full weights, anchors and deltas), exported by the
  CLI, loaded with ``AutoModelForCausalLM.from_pretrained`` (or PEFT's loader for ``--adapter``): their
  log-probs of sampled completions equal the trainer's policy at that version (float32, 1e-5).
* A real ``echorl run``: the export of its final version, with the run's job file, scores on the
  held-out problems exactly what the run's evaluator recorded for that version (greedy).
* What cannot be exported as asked is refused naming the option, and nothing is written.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_runtime import snapshots, spec
from echo_runtime.models import build
from echo_runtime.rollout import Rollout
from echo_runtime.snapshots import deltas
from echo_runtime.spec.policy import LoRA, Model
from echo_runtime.trainer import policy as trainer_policy

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def echorl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "echo_runtime.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.init_model("tiny", tmp_path_factory.mktemp("export-model") / "tiny", seed=0)


def completions(policy: trainer_policy.TrainablePolicy, n: int = 6) -> list[Rollout]:
    """Completions of a few prompts sampled from the policy (what is scored does not matter)."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt = tuple(int(t) for t in torch.randint(5, 200, (4 + i % 3,), generator=generator))
        completion = tuple(int(t) for t in torch.randint(5, 200, (7,), generator=generator))
        out.append(Rollout(prompt_ids=prompt, completion_ids=completion, logprobs=(-1.0,) * 7))
    return out


def logprobs(model: Any, rollouts: list[Rollout], pad_id: int) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return trainer_policy.completion_logprobs(model, trainer_policy.pack(rollouts, pad_id), 1.0)


def publish_versions(
    policy: trainer_policy.TrainablePolicy, store: snapshots.SnapshotStore, root: Path, anchor_every: int
) -> dict[int, torch.Tensor]:
    """Versions 1–3 moved as optimizer steps would move them (full fine-tuning: one tensor each step, so
    versions between anchors go out as deltas); per version, the log-probs of :func:`completions`."""
    rollouts = completions(policy)
    writer = deltas.Writer(anchor_every) if policy.finetune == "Full" else None
    expected = {}
    for version in (1, 2, 3):
        generator = torch.Generator().manual_seed(version)
        with torch.no_grad():
            params = list(policy.trainable_parameters())
            for p in params if writer is None else params[-2:]:
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)
        folder = root / f"v{version}"
        folder.mkdir(parents=True)
        if writer is None:
            files, delta = policy.export_snapshot(folder), None
        else:
            files, delta = writer.export(version, policy.model.state_dict(), folder)
        kind = "lora" if writer is None else "full"
        store.publish(version, files, kind=kind, base_model="echorl:tiny", delta=delta)
        expected[version] = logprobs(policy.model, rollouts, policy.pad_id)
        policy.model.train()
    return expected


@pytest.mark.parametrize("finetune", ["LoRA", "Full"])
def test_an_export_loads_in_transformers_with_the_trainers_log_probs(
    tmp_path: Path, tiny: Path, finetune: str
) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model_spec = Model(finetune=finetune, lora=LoRA(rank=4, alpha=8.0))  # type: ignore[arg-type]
    policy = trainer_policy.load_policy(model_spec, model_dir=str(tiny))
    store = snapshots.open_store(spec.Storage(type="Local", path=str(tmp_path / "store")), "export")
    expected = publish_versions(policy, store, tmp_path / "files", anchor_every=3)
    if finetune == "Full":
        assert store.manifest(2).delta is not None  # version 2 is a delta against 1: rebuilt by the export
    rollouts = completions(policy)
    where = ["--storage", str(tmp_path / "store"), "--job", "export", "--base", str(tiny)]
    out = tmp_path / "export-v2"
    done = echorl("export", *where, "--version", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "version 2" in done.stdout
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    got = logprobs(model, rollouts, policy.pad_id)
    assert torch.allclose(got, expected[2], atol=1e-5), (got - expected[2]).abs().max()
    assert not torch.allclose(got, expected[1], atol=1e-3) and not torch.allclose(got, expected[3], atol=1e-3)
    record = json.loads((out / "echorl-export.json").read_text())
    assert record["version"] == 2 and record["merged"] == (finetune == "LoRA")
    assert (out / "tokenizer_config.json").is_file() and (out / "config.json").is_file()
    if finetune == "LoRA":
        from peft import PeftModel

        # The newest by default, in bfloat16 on request: the weights cast, the log-probs close.
        half = tmp_path / "export-bf16"
        assert echorl("export", *where, "--out", str(half), "--dtype", "bfloat16").returncode == 0
        model = AutoModelForCausalLM.from_pretrained(str(half))
        assert next(model.parameters()).dtype == torch.bfloat16
        assert json.loads((half / "echorl-export.json").read_text())["version"] == 3
        assert (logprobs(model.float(), rollouts, policy.pad_id) - expected[3]).abs().max() < 0.1

        adapter = tmp_path / "adapter"
        assert echorl("export", *where, "--version", "2", "--adapter", "--out", str(adapter)).returncode == 0
        assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in adapter.iterdir()}
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny)), str(adapter))
        assert torch.allclose(logprobs(peft, rollouts, policy.pad_id), expected[2], atol=1e-5)


def test_what_cannot_be_exported_is_refused_naming_the_option(tmp_path: Path, tiny: Path) -> None:
    torch.manual_seed(0)
    policy = trainer_policy.load_policy(Model(finetune="Full"), model_dir=str(tiny))
    store = snapshots.open_store(spec.Storage(type="Local", path=str(tmp_path / "store")), "export")
    publish_versions(policy, store, tmp_path / "files", anchor_every=1)
    where = ["--storage", str(tmp_path / "store"), "--job", "export"]
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    cases = [
        ([*where, "--base", str(tiny), "--out", str(occupied)], "--out", "not an empty directory"),
        ([*where, "--base", str(tiny), "--version", "9", "--out", str(tmp_path / "a")], "--version", "1–3"),
        (
            [*where, "--base", str(tiny), "--adapter", "--out", str(tmp_path / "b")],
            "--adapter",
            "full snapshot",
        ),
        ([*where, "--out", str(tmp_path / "c")], "--base", "--job-file"),
    ]
    for args, option, words in cases:
        done = echorl("export", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert option in done.stderr and words in done.stderr, done.stderr
    assert (occupied / "keep.txt").read_text() == "mine" and [p.name for p in occupied.iterdir()] == [
        "keep.txt"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "files",
        "occupied",
        "store",
    ]  # nothing half-written


def test_the_export_of_a_runs_last_version_scores_what_its_evaluator_recorded(
    tmp_path: Path, built_model_cache: Path
) -> None:
    from echo_runtime import tasks
    from echo_runtime.backends.transformers import TransformersBackend
    from echo_runtime.models import warmup
    from echo_runtime.models.prompts import PromptStyle
    from echo_runtime.runner import evaluator

    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: exported}\n"
        "spec:\n  model: {path: 'echorl:tiny'}\n  task: {name: arithmetic, heldoutSize: 16, evalEvery: 2}\n"
        "  algorithm: {maxSteps: 2, batchSize: 2, groupSize: 4, learningRate: 0.05, sampling: {maxNewTokens: 6}}\n"
        f"  storage: {{path: {tmp_path / 'store'}}}\n"
    )
    run = echorl("run", str(job), "--no-progress", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = next(r for r in records if r.get("kind") == "eval" and r["policyVersion"] == 2)
    out = tmp_path / "export"
    done = echorl("export", "--job-file", str(tmp_path / "run" / "job.yaml"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    resolved = spec.load_job(tmp_path / "run" / "job.yaml")
    task = tasks.from_spec(resolved.spec.task)
    problems = list(itertools.islice(task.prompts("heldout", evaluator.HELDOUT_SEED), 16))
    backend = TransformersBackend(
        str(out), "cpu", "float32", prompt_style=PromptStyle.from_task(resolved.spec.task)
    )
    result = warmup.evaluate(
        backend.model, backend.tokenizer, task, problems, temperature=0.0, max_new_tokens=6,
        style=backend.prompt_style, eos_ids=backend.eos_ids,
    )  # fmt: skip
    assert result.n == final["heldoutSize"] == 16
    assert result.accuracy == final["heldoutAccuracy"] and result.mean_reward == pytest.approx(
        final["heldoutReward"]
    )
    assert [list(e) for e in result.examples] == final["examples"]  # the same greedy completions
