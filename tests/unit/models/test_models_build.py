"""The built-in models: Hugging Face and mlx-lm load them, builds are deterministic, the tokenizer fits the
tasks."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from echo_runtime.models import build
from echo_runtime.models import tokenizer as tok
from echo_runtime.tasks import BUILTIN_TASKS, get_task


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.init_model("tiny", tmp_path_factory.mktemp("build") / "tiny", seed=0)


def test_directory_holds_a_hugging_face_checkpoint(tiny_dir: Path) -> None:
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", build.METADATA_FILE} <= names  # fmt: skip
    assert not any(name.startswith(".") for name in names)
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    metadata = build.read_metadata(tiny_dir)
    assert metadata is not None
    assert (
        metadata["size"] == "tiny"
        and metadata["seed"] == 0
        and metadata["build_version"] == build.BUILD_VERSION
    )


def test_auto_classes_load_it(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert tokenizer.eos_token == tokenizer.pad_token == tok.EOS_TOKEN
    assert model.config.eos_token_id == tokenizer.eos_token_id == model.generation_config.eos_token_id
    assert len(tokenizer) == model.config.vocab_size == build.SIZES["tiny"]["vocab_size"]
    ids = tokenizer("12+7=", return_tensors="pt").input_ids
    assert ids.shape == (1, 5)  # digits and symbols one token each, nothing added
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 5, model.config.vocab_size)
    assert torch.isfinite(logits).all()
    metadata = build.read_metadata(tiny_dir)
    assert metadata is not None and metadata["parameters"] == build.count_parameters(model)


def test_mlx_lm_loads_it_and_matches_torch(tiny_dir: Path) -> None:
    mx = pytest.importorskip("mlx.core")
    mlx_lm = pytest.importorskip("mlx_lm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mlx_model, mlx_tokenizer = mlx_lm.load(str(tiny_dir))
    hf_tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    text = "Alice says: 12+7=19"
    ids = hf_tokenizer(text).input_ids
    assert mlx_tokenizer.encode(text) == ids
    assert hf_tokenizer.eos_token_id in mlx_tokenizer.eos_token_ids

    mlx_logits = mlx_model(mx.array([ids]))
    torch_model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    with torch.no_grad():
        torch_logits = torch_model(torch.tensor([ids])).logits
    import numpy as np

    diff = np.abs(np.array(mlx_logits.astype(mx.float32)) - torch_logits.numpy()).max()
    assert diff < 1e-4, f"mlx and torch logits differ by {diff}"


def test_same_seed_gives_identical_bytes_and_another_seed_other_weights(
    tmp_path: Path, tiny_dir: Path
) -> None:
    again = build.init_model("tiny", tmp_path / "again", seed=0)
    other = build.init_model("tiny", tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()


def test_build_leaves_the_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build.init_model("tiny", tmp_path / "m", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_existing_output_is_not_overwritten_unless_asked(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(FileExistsError):
        build.init_model("tiny", out, seed=0)
    assert (out / "keep").exists()
    build.init_model("tiny", out, seed=0, overwrite=True)
    assert not (out / "keep").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary directory left behind


def test_unknown_size_and_bad_seed_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tiny, small"):
        build.init_model("huge", tmp_path / "m")
    with pytest.raises(ValueError, match="seed"):
        build.init_model("tiny", tmp_path / "m", seed=-1)


def test_sizes_have_the_promised_parameter_counts() -> None:
    from transformers import Qwen3ForCausalLM

    counts = {}
    for size in build.SIZES:
        with torch.device("meta"):
            counts[size] = build.count_parameters(Qwen3ForCausalLM(build.qwen3_config(size, 0)))
    assert 200_000 < counts["tiny"] < 3_000_000
    assert 5_000_000 < counts["small"] < 30_000_000


def test_tokenizer_round_trips_every_task_and_spells_numbers_digit_by_digit(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    # The procedural tasks the corpus draws on (not the user's dataset, nor reasoning-gym's English).
    for name in (n for n in BUILTIN_TASKS if n not in ("dataset", "reasoning_gym")):
        task = get_task(name)
        for split in ("train", "heldout"):
            for problem in itertools.islice(task.prompts(split, 3), 20):
                for text in (
                    problem.prompt,
                    task.reference(problem),
                    problem.prompt + task.reference(problem),
                ):
                    ids = tokenizer(text, add_special_tokens=False).input_ids
                    assert tokenizer.decode(ids) == text
                    assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids
    assert tokenizer.tokenize("2024+19=") == ["2", "0", "2", "4", "+", "1", "9", "="]
    arithmetic = get_task("arithmetic", {"digits": 4, "ops": "+-*", "operands": 3})
    for problem in itertools.islice(arithmetic.prompts("train", 0), 50):
        prompt, answer = problem.prompt, arithmetic.reference(problem)
        joined = tokenizer(prompt + answer, add_special_tokens=False).input_ids
        assert (
            joined
            == tokenizer(prompt, add_special_tokens=False).input_ids
            + tokenizer(answer, add_special_tokens=False).input_ids
        )
    odd = "naïve — 数字 🙂\ttabs\r\n"
    assert tokenizer.decode(tokenizer(odd, add_special_tokens=False).input_ids) == odd


def test_tokenizer_training_is_deterministic_and_order_free() -> None:
    texts = [f"{a}+{b}={a + b} Alice is a knight" for a in range(30) for b in range(30)]
    first = tok.train_tokenizer(300, texts).to_str()
    assert tok.train_tokenizer(300, list(reversed(texts))).to_str() == first
    with pytest.raises(ValueError, match="257"):
        tok.train_tokenizer(100, texts)
