"""Converting a GGUF file into an ordinary Hugging Face directory, once.

transformers reads GGUF files (``from_pretrained(dir, gguf_file=name)``, which needs the ``gguf``
package) and dequantises the weights to float32, but a model loaded that way refuses ``save_pretrained``
("quantized with gguf and is not serializable"), and every other reader of a model — mlx-lm, vLLM,
``AutoConfig`` in the coordinator, peft — wants a plain directory. So Echo converts once: read the file
with transformers, build the same architecture from the file's config, copy the dequantised state dict
into it, and save that with the tokenizer (chat template included) and a generation config holding
the file's special tokens.

Promises of :func:`convert`:

* The output is a complete Hugging Face directory: ``config.json``, ``model.safetensors`` (float32),
  ``generation_config.json`` (``bos``/``eos``/``pad`` ids from the file), the tokenizer files and
  ``echorl-model.json`` (source file, its sha256, parameter count, vocabulary size). It is written in a
  temporary sibling and renamed into place, so a reader never sees half a conversion.
* The weights are the file's dequantised weights, bit for bit (the conversion changes containers, not
  numbers): a test compares the logits of the converted directory with those of the GGUF file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from echo_runtime.models import build

CONVERT_VERSION: Final = 1
"""Version of the conversion recipe; part of the cache key of converted models."""


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _no_tqdm() -> Iterator[None]:
    """transformers' GGUF reader draws its own tqdm bars; ``TQDM_DISABLE`` silences them."""
    before = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


def _special_ids(config: Any, tokenizer: Any) -> dict[str, Any]:
    ids: dict[str, Any] = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name, None)
        if value is None:
            value = getattr(tokenizer, name, None)
        if value is not None:
            ids[name] = value
    if "pad_token_id" not in ids and "eos_token_id" in ids:
        eos = ids["eos_token_id"]
        ids["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
    return ids


def convert(gguf_path: str | Path, out_dir: str | Path, *, metadata: dict[str, Any] | None = None) -> Path:
    """Convert the GGUF file ``gguf_path`` into the Hugging Face directory ``out_dir``; return it.

    ``metadata`` is merged into the ``echorl-model.json`` written last. An existing ``out_dir`` is
    replaced (callers hold the cache entry's lock). A file transformers cannot read is a ValueError that
    names it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    source = Path(gguf_path).expanduser().resolve()
    if not source.is_file():
        raise FileNotFoundError(f"GGUF file {str(source)!r} does not exist")
    out = Path(out_dir).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    folder, name = str(source.parent), source.name
    try:
        with build.quiet_progress(), _no_tqdm():
            tokenizer: Any = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            config: Any = AutoConfig.from_pretrained(folder, gguf_file=name)
            loaded: Any = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ImportError as exc:
        raise ImportError(f"reading GGUF file {str(source)!r} needs the `gguf` package: {exc}") from exc
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"cannot read GGUF file {str(source)!r} with transformers: {exc}") from exc
    config.dtype = "float32"
    config.architectures = [type(loaded).__name__]
    # A GGUF-loaded model is marked as quantised and will not save; the same architecture built from the
    # config and given the dequantised tensors saves like any other model.
    auto: Any = AutoModelForCausalLM
    with torch.device("meta"):
        fresh: Any = auto.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.eval()
    special = _special_ids(config, tokenizer)
    generation_config_class: Any = GenerationConfig
    fresh.generation_config = generation_config_class(**special)
    tmp = build.make_temp_dir(out)
    try:
        build.save_model(fresh, tmp)
        tokenizer.save_pretrained(str(tmp))
        record = {
            "name": None,
            "source": {"gguf": name, "sha256": file_sha256(source)},
            "convert_version": CONVERT_VERSION,
            "parameters": build.count_parameters(fresh),
            "vocab_size": int(config.vocab_size),
            "warmup": None,
            **(metadata or {}),
        }
        build.write_json(tmp / build.METADATA_FILE, record)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
