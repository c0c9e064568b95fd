"""models.detokenizer against transformers: the coordinator's torch-free decoding is exact.

The coordinator refuses a rollout whose ids do not decode to its text, so a decoder that differs from
the backends' by one character would refuse honest workers. Both of Echo's models are checked: the
built-in tiny tokenizer and SmolLM2's (a chat model with several special tokens), on random id
sequences that include special tokens, and on their end-of-sequence ids.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from echo_runtime.backends import sampling
from echo_runtime.models import detokenizer, load, resolve


@pytest.fixture(scope="module", params=["echorl:tiny", "echorl:smollm2-135m"])
def model_dir(request: pytest.FixtureRequest) -> str:
    return resolve.resolve_model(request.param)


def test_decoding_and_eos_ids_equal_the_transformers_tokenizers(model_dir: str) -> None:
    light = detokenizer.load(model_dir)
    assert light is not None
    full = load.load_tokenizer(model_dir)
    assert light.eos_ids == sampling.eos_token_ids(model_dir, full)
    rng = random.Random(0)
    vocab = len(full)
    specials = sorted(set(full.all_special_ids))
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.3:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        assert light.decode(ids) == full.decode(ids, skip_special_tokens=False), ids


def test_the_coordinators_tokenizer_needs_no_torch(model_dir: str) -> None:
    """Measured in a fresh process: the coordinator's detokenizer and vocabulary size import no torch."""
    probe = (
        "import sys\n"
        "from echo_runtime.models import detokenizer\n"
        f"d = detokenizer.load({model_dir!r})\n"
        "assert d is not None and d.decode([1, 2])\n"
        "from echo_runtime.models import resolve\n"
        f"assert resolve.vocab_size({model_dir!r}) > 2\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "False"], out


def test_a_tokenizer_that_cleans_up_spaces_goes_to_transformers(tmp_path: Path, model_dir: str) -> None:
    copy = tmp_path / "m"
    copy.mkdir()
    for name in ("tokenizer.json", "config.json"):
        (copy / name).write_bytes((Path(model_dir) / name).read_bytes())
    (copy / "tokenizer_config.json").write_text('{"clean_up_tokenization_spaces": true}')
    assert detokenizer.load(copy) is None
    (copy / "tokenizer.json").unlink()
    (copy / "tokenizer_config.json").write_text("{}")
    assert detokenizer.load(copy) is None


def test_the_vocabulary_size_read_from_config_json_is_autoconfigs(model_dir: str, tmp_path: Path) -> None:
    from transformers import AutoConfig

    assert resolve.vocab_size(model_dir) == AutoConfig.from_pretrained(model_dir).get_text_config().vocab_size
    # A multimodal layout: the text model's size counts, not a top-level one.
    (tmp_path / "config.json").write_text(
        '{"model_type": "x", "vocab_size": 7, "text_config": {"vocab_size": 4096}}', encoding="utf-8"
    )
    assert resolve.vocab_size(str(tmp_path)) == 4096
