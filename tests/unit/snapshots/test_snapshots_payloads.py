"""payloads: sharding, the index, aliasing and dtypes survive save → load bit-exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from echo_runtime.snapshots import payloads


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())


def test_single_file_when_small(tmp_path: Path) -> None:
    state = {"a": torch.arange(10, dtype=torch.float32), "b": torch.ones(2, 2, dtype=torch.bfloat16)}
    files = payloads.save_state_dict(state, tmp_path)
    assert files == [tmp_path / payloads.FULL_WEIGHTS]
    loaded = payloads.load_state_dict(tmp_path)
    assert all(_bits(loaded[k]) == _bits(v) and loaded[k].dtype == v.dtype for k, v in state.items())
    assert payloads.detect_kind(tmp_path) == "full"


@pytest.mark.parametrize("limit", [1, 400, 1000, 10**9])
def test_shards_respect_the_limit_and_the_index(tmp_path: Path, limit: int) -> None:
    state = {f"layer.{i}": torch.full((25 * (i + 1),), float(i)) for i in range(6)}  # 100..600 bytes
    files = payloads.save_state_dict(state, tmp_path, max_shard_bytes=limit)
    shards = [f for f in files if f.name.endswith(".safetensors")]
    if limit == 10**9:
        assert files == [tmp_path / payloads.FULL_WEIGHTS]
    else:
        index = json.loads((tmp_path / payloads.FULL_INDEX).read_text())
        assert set(index["weight_map"]) == set(state)
        assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in state.values())
        assert sorted(set(index["weight_map"].values())) == sorted(f.name for f in shards)
        for shard in shards:
            names = [n for n, f in index["weight_map"].items() if f == shard.name]
            size = sum(state[n].numel() * 4 for n in names)
            assert size <= limit or len(names) == 1  # an oversized tensor gets a shard of its own
        assert shards[0].name == f"model-00001-of-{len(shards):05d}.safetensors"
    loaded = payloads.load_state_dict(tmp_path)
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)


@pytest.mark.parametrize("limit", [1, 400, 1000, 10**9])
def test_streamed_files_are_the_same_bytes_and_fetched_one_file_at_a_time(tmp_path: Path, limit: int) -> None:
    """What a sharded trainer writes as it gathers: save_state_dict's files byte for byte, each tensor
    asked for once, when its file is written."""
    state = {f"layer.{i}": torch.full((25 * (i + 1),), float(i)) for i in range(6)}
    state["head"] = state["layer.0"]  # tied: its own gather, as a sharded trainer's is
    whole = payloads.save_state_dict(state, tmp_path / "whole", max_shard_bytes=limit)
    asked: list[str] = []
    files_when_asked: list[int] = []

    def fetch(name: str) -> torch.Tensor:
        asked.append(name)
        files_when_asked.append(len(list((tmp_path / "streamed").glob("*.safetensors"))))
        return state[name].clone()

    sizes = [(name, t.numel() * t.element_size()) for name, t in state.items()]
    streamed = payloads.save_state_dict_streamed(sizes, fetch, tmp_path / "streamed", max_shard_bytes=limit)
    assert [f.name for f in streamed] == [f.name for f in whole]
    assert all((tmp_path / "streamed" / f.name).read_bytes() == f.read_bytes() for f in whole)
    assert asked == list(state)  # each once, in state-dict order
    index = json.loads((tmp_path / "whole" / payloads.FULL_INDEX).read_text()) if limit < 10**9 else None
    if index is not None:  # a file's tensors are asked for after the files before it are written
        order = sorted(set(index["weight_map"].values()))
        assert files_when_asked == [order.index(index["weight_map"][name]) for name in asked]
    others: list[str] = []
    nothing = payloads.save_state_dict_streamed(
        sizes, lambda n: others.append(n) or state[n], None, max_shard_bytes=limit
    )
    assert nothing == [] and others == list(state)  # the ranks that write nothing gather all the same


def test_shared_and_strided_tensors(tmp_path: Path) -> None:
    base = torch.randn(8, 8)
    state = {"embed": base, "head": base, "view": base[2:4], "t": base.t(), "step": base[:, ::2]}
    payloads.save_state_dict(state, tmp_path, max_shard_bytes=100)
    loaded = payloads.load_state_dict(tmp_path)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert base.data_ptr() == state["embed"].data_ptr()  # the caller's tensors are untouched


def test_index_mismatch_is_an_error(tmp_path: Path) -> None:
    payloads.save_state_dict({"a": torch.ones(100), "b": torch.ones(100)}, tmp_path, max_shard_bytes=400)
    index = json.loads((tmp_path / payloads.FULL_INDEX).read_text())
    index["weight_map"]["ghost"] = index["weight_map"]["a"]
    (tmp_path / payloads.FULL_INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match="ghost"):
        payloads.load_state_dict(tmp_path)


def test_lora_adapter_from_tensors(tmp_path: Path) -> None:
    tensors = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 32),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(32, 4),
    }
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": {"v_proj", "q_proj"}}
    payloads.save_lora_adapter(tensors, config, tmp_path)
    adapter = payloads.load_lora_adapter(tmp_path)
    assert adapter.config["target_modules"] == ["q_proj", "v_proj"] and adapter.config["r"] == 4
    assert all(torch.equal(adapter.tensors[k], v) for k, v in tensors.items())
    assert payloads.detect_kind(tmp_path) == "lora"
    with pytest.raises(ValueError, match="neither"):
        payloads.detect_kind(tmp_path / "nothing")
