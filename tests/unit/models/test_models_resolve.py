"""resolve_model: the cache of built-in models, local directories, hub ids, clear errors; load wrappers."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_runtime.models import build, load, resolve
from echo_runtime.spec.policy import Model, Task


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ECHORL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ECHORL_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve.models_dir() == (tmp_path / "explicit" / "models").resolve()
    monkeypatch.delenv("ECHORL_CACHE_DIR")
    assert resolve.models_dir() == (tmp_path / "xdg" / "echorl" / "models").resolve()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve.models_dir() == (tmp_path / "home" / ".cache" / "echorl" / "models").resolve()


def test_builtin_is_built_once_then_reused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve.resolve_model("echorl:tiny")
    assert Path(first).parent == (cache / "models").resolve()
    assert Path(first).name == resolve.cache_key("tiny", seed=0)
    weights = Path(first) / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    def no_rebuild(*args: Any, **kwargs: Any) -> Path:
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(build, "init_model", no_rebuild)
    assert resolve.resolve_model("echorl:tiny") == first
    assert weights.stat().st_mtime_ns == mtime
    leftovers = [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == [Path(first).name]  # no temporary build directories


def test_seed_and_warmup_are_part_of_the_key() -> None:
    keys = {
        resolve.cache_key("tiny", seed=0),
        resolve.cache_key("tiny", seed=1),
        resolve.cache_key("small", seed=0),
        resolve.cache_key("tiny", seed=0, warmup_steps=10),
        resolve.cache_key("tiny", seed=0, warmup_steps=20),
        resolve.cache_key("tiny", seed=0, warmup_steps=10, task="sokoban"),
        resolve.cache_key("tiny", seed=0, warmup_steps=10, task_options={"digits": 1}),
        resolve.cache_key("tiny", seed=0, warmup_steps=10, task="my.mod:make"),
    }
    assert len(keys) == 8
    assert all("/" not in key and ":" not in key for key in keys)
    # options only matter when they change the weights (a warm-up)
    assert resolve.cache_key("tiny", task_options={"digits": 1}) == resolve.cache_key("tiny")


def test_concurrent_resolves_build_once(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = build.init_model
    calls: list[int] = []

    def slow_init(*args: Any, **kwargs: Any) -> Path:
        calls.append(1)
        time.sleep(0.3)  # widen the race window
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "init_model", slow_init)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(resolve.resolve_model("echorl:tiny", seed=3)))
               for _ in range(3)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and len(results) == 3


def test_an_interrupted_cache_entry_is_rebuilt(cache: Path) -> None:
    target = cache / "models" / resolve.cache_key("tiny", seed=5)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # a half-copied directory without the metadata marker
    assert resolve.resolve_model("echorl:tiny", seed=5) == str(target.resolve())
    assert build.read_metadata(target) is not None


def test_local_directories_hub_ids_and_errors(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "my-model"
    local.mkdir()
    (local / "config.json").write_text("{}")
    assert resolve.resolve_model(str(local)) == str(local.resolve())
    monkeypatch.chdir(tmp_path)
    assert resolve.resolve_model("my-model") == str(local.resolve())
    assert resolve.resolve_model("./my-model") == str(local.resolve())

    # hub ids are looked up in the local Hugging Face cache (offline here); absent ones say so
    for hub_id in ("Qwen/Qwen3-0.6B", "gpt2"):
        with pytest.raises(
            resolve.ModelNotFoundError, match=f"{hub_id!r} is not in the local Hugging Face cache"
        ):
            resolve.resolve_model(hub_id)

    for missing in ("./nope", str(tmp_path / "nope"), "~/definitely/not/here", "a/b/c"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            resolve.resolve_model(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        resolve.resolve_model(str(empty))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError):
        resolve.resolve_model(str(tmp_path / "file"))
    with pytest.raises(ValueError, match="built-in models: echorl:tiny, echorl:small, echorl:smollm2-135m"):
        resolve.resolve_model("echorl:huge")
    with pytest.raises(ValueError, match="built-in models"):
        resolve.resolve_model("echorl:smollm2-135m", warmup_steps=5)
    with pytest.raises(ValueError, match="built-in models"):
        resolve.resolve_model(str(local), warmup_steps=5)
    with pytest.raises(ValueError, match="seed"):
        resolve.resolve_model("echorl:tiny", seed=-1)
    assert not (cache / "models").exists()  # none of that built anything


def test_load_wrappers_take_builtin_names_and_specs(cache: Path) -> None:
    model = load.load_causal_lm("echorl:tiny", dtype="bfloat16")
    assert not model.training
    assert next(model.parameters()).dtype == torch.bfloat16
    tokenizer = load.load_tokenizer("echorl:tiny")
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    assert tokenizer.padding_side == "left"
    assert load.resolve_spec(Model(path="echorl:tiny"), Task()) == resolve.resolve_model("echorl:tiny")
    with pytest.raises(ValueError, match="dtype"):
        load.torch_dtype("float64")


def test_offline_hub_id_fails_clearly(cache: Path) -> None:
    with pytest.raises(OSError):
        load.load_tokenizer("echorl-test/definitely-not-cached")
