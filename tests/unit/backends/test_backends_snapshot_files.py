"""Reading snapshot directories: peft adapter layouts and scales, unsupported settings, full-snapshot shards."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from echo_runtime.backends import snapshot_files


def _read(path: Path) -> snapshot_files.LoraAdapter:
    shapes = snapshot_files.safetensors_shapes(path / snapshot_files.ADAPTER_WEIGHTS)
    return snapshot_files.read_lora_adapter(path, shapes)


def test_plain_lora_layout_and_scale(write_adapter: Callable[..., Path]) -> None:
    adapter = _read(write_adapter())
    assert [m.path for m in adapter.modules] == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
    ]
    assert {(m.rank, m.scaling) for m in adapter.modules} == {(4, 2.0)}
    assert adapter.modules[0].key_a == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert adapter.max_rank == 4
    assert adapter.layout == (
        ("model.layers.0.self_attn.q_proj", 4, 2.0),
        ("model.layers.0.self_attn.v_proj", 4, 2.0),
    )


def test_layout_ignores_values_but_not_structure(write_adapter: Callable[..., Path]) -> None:
    a = _read(write_adapter("a"))
    b = _read(write_adapter("b"))
    assert a.layout == b.layout
    assert _read(write_adapter("c", config={"lora_alpha": 16})).layout != a.layout
    assert _read(write_adapter("d", modules=["model.layers.0.self_attn.q_proj"])).layout != a.layout


def test_rslora_and_patterns(write_adapter: Callable[..., Path]) -> None:
    rs = _read(write_adapter("rs", config={"use_rslora": True}))
    assert rs.modules[0].scaling == pytest.approx(8 / math.sqrt(4))
    patterned = _read(
        write_adapter(
            "pat",
            config={"rank_pattern": {"v_proj": 2}, "alpha_pattern": {"v_proj": 6}},
            rank={"model.layers.0.self_attn.q_proj": 4, "model.layers.0.self_attn.v_proj": 2},
        )
    )
    by_path = {m.path: m for m in patterned.modules}
    assert (
        by_path["model.layers.0.self_attn.q_proj"].rank,
        by_path["model.layers.0.self_attn.q_proj"].scaling,
    ) == (
        4,
        2.0,
    )
    assert (
        by_path["model.layers.0.self_attn.v_proj"].rank,
        by_path["model.layers.0.self_attn.v_proj"].scaling,
    ) == (
        2,
        3.0,
    )


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("use_dora", True),
        ("lora_bias", True),
        ("fan_in_fan_out", True),
        ("modules_to_save", ["lm_head"]),
        ("bias", "all"),
        ("peft_type", "IA3"),
    ],
)
def test_settings_that_change_the_forward_pass_are_refused(
    write_adapter: Callable[..., Path], setting: str, value: object
) -> None:
    with pytest.raises(ValueError, match=setting):
        _read(write_adapter(config={setting: value}))


def test_rank_mismatch_and_half_pairs_are_refused(write_adapter: Callable[..., Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rank 4 in its weights but 8"):
        _read(write_adapter("r", config={"r": 8}))
    path = write_adapter("half")
    save_file(
        {"base_model.model.model.layers.0.q_proj.lora_A.weight": np.zeros((4, 8), np.float32)},
        str(path / snapshot_files.ADAPTER_WEIGHTS),
    )
    with pytest.raises(ValueError, match="not both lora_A and lora_B"):
        _read(path)


def test_module_path_parsing() -> None:
    assert snapshot_files.module_path("base_model.model.model.layers.3.mlp.down_proj.lora_B.weight") == (
        "model.layers.3.mlp.down_proj",
        "B",
    )
    assert snapshot_files.module_path(
        "base_model.model.model.layers.3.mlp.down_proj.lora_A.default.weight"
    ) == (
        "model.layers.3.mlp.down_proj",
        "A",
    )
    with pytest.raises(ValueError, match="embedding LoRA"):
        snapshot_files.module_path("base_model.model.model.embed_tokens.lora_embedding_A")


def test_check_snapshot_dir_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        snapshot_files.check_snapshot_dir(tmp_path / "nope", "lora")
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json"):
        snapshot_files.check_snapshot_dir(tmp_path, "lora")
    with pytest.raises(ValueError, match="'lora' or 'full'"):
        snapshot_files.check_snapshot_dir(tmp_path, "delta")  # type: ignore[arg-type]


def test_full_weight_files_single_and_sharded(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        snapshot_files.full_weight_files(tmp_path)
    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    assert snapshot_files.full_weight_files(tmp_path) == [tmp_path / "model.safetensors"]

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for name in ("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"):
        save_file({name: np.zeros(1, np.float32)}, str(sharded / name))
    index = {"weight_map": {"x": "model-00002-of-00002.safetensors", "y": "model-00001-of-00002.safetensors"}}
    (sharded / snapshot_files.FULL_INDEX).write_text(json.dumps(index))
    assert [f.name for f in snapshot_files.full_weight_files(sharded)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002"):
        snapshot_files.full_weight_files(sharded)


def test_safetensors_shapes_reads_the_header_only(tmp_path: Path) -> None:
    save_file(
        {"w": np.zeros((3, 5), np.float32), "b": np.zeros(5, np.float32)}, str(tmp_path / "x.safetensors")
    )
    assert snapshot_files.safetensors_shapes(tmp_path / "x.safetensors") == {"w": [3, 5], "b": [5]}
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 8)
    with pytest.raises(ValueError, match="not a safetensors file"):
        snapshot_files.safetensors_shapes(tmp_path / "bad.safetensors")
