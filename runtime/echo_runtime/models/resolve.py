"""Turn any name of a model into a local Hugging Face directory: the one resolver of every process.

Coordinator, workers (every backend), trainer, evaluator, warm-up and the operator's pods all resolve
``Model.path`` here, so a name that works in one works in all. :func:`resolve_model` always returns a
local directory that ``AutoConfig``, ``AutoTokenizer``, ``AutoModelForCausalLM``, mlx-lm and vLLM read
as it is; :func:`vocab_size` reads a model's vocabulary size through ``AutoConfig``.

Promises of :func:`resolve_model`:

* ``echorl:tiny`` / ``echorl:small`` (the built-in models, :mod:`echo_runtime.models.build`) resolve to a
  directory in the user's cache, ``<cache>/models/<key>``, where ``<cache>`` is ``$ECHORL_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/echorl``, else ``~/.cache/echorl``. The key names everything the weights depend on
  (size, build recipe version, seed, and for a warmed-up model the task, its options, the steps and the
  warm-up recipe version), so a cached directory is never reused for a different request.
* A missing cached model is built (and, with ``warmup_steps > 0``, warmed up on the task) once: builds go
  through a temporary directory renamed into place, and a per-key file lock makes concurrent processes
  wait for one builder instead of building twice. A present one is returned without touching it.
* ``echorl:smollm2-135m`` (a pretrained model shipped on the package index,
  :mod:`echo_runtime.models.pretrained`) resolves to ``<cache>/models/<name>-<version>-c<recipe>``:
  downloaded and converted once, under the same lock-then-rename discipline.
* An existing local directory with a ``config.json`` is returned as is (absolute). A local ``.gguf`` file
  is converted once (:mod:`echo_runtime.models.gguf`) into ``<cache>/models/gguf-<sha256 prefix>-c<recipe>``,
  keyed by the file's content, and that directory is returned.
* Any other string shaped like a hub id (``org/name`` or ``name``) is looked up in the local Hugging Face
  cache (``HF_HUB_CACHE`` / ``HF_HOME``) with ``huggingface_hub.snapshot_download`` and its snapshot
  directory returned: offline (``HF_HUB_OFFLINE=1``) only the cache is read, online missing files are
  downloaded first (config, tokenizer, safetensors weights). A hub id that is not there is a
  :class:`ModelNotFoundError` saying how to provide it; so is a path-shaped string that does not exist.
* ``warmup_steps`` applies to ``echorl:tiny`` / ``echorl:small`` only; asking for it with another path is
  a ``ValueError`` (warm a local model explicitly with ``echorl model warmup``).

Locking uses ``fcntl`` (Linux, macOS).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from echo_runtime.models import build, gguf, pretrained

PREFIX: Final = "echorl:"
"""Scheme of the built-in model names: ``echorl:tiny``, ``echorl:small``, ``echorl:smollm2-135m``."""

HUB_PATTERNS: Final = (
    "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "tokenizer*",
)  # fmt: skip
"""Files of a hub repository a model needs (config, tokenizer, safetensors weights, chat template)."""


class ModelNotFoundError(FileNotFoundError):
    """The name does not lead to a model: a missing path, or a hub id absent from the local cache."""


_log = logging.getLogger(__name__)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def cache_dir() -> Path:
    """Echo's cache root: ``$ECHORL_CACHE_DIR``, else ``$XDG_CACHE_HOME/echorl``, else ``~/.cache/echorl``."""
    explicit = os.environ.get("ECHORL_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "echorl").resolve()


def models_dir() -> Path:
    """Where built-in models are cached: ``<cache_dir()>/models``."""
    return cache_dir() / "models"


def builtin_names() -> list[str]:
    """Every ``echorl:`` name: the built sizes, then the packaged pretrained models."""
    return [f"{PREFIX}{name}" for name in [*build.SIZES, *pretrained.PACKAGED]]


def builtin_size(path: str) -> str | None:
    """``"tiny"`` for ``"echorl:tiny"``; None for any other path, a packaged model's name included.

    An ``echorl:`` name that is neither a size nor a packaged model is a ``ValueError`` listing the names.
    """
    if not path.startswith(PREFIX):
        return None
    name = path[len(PREFIX) :]
    if name in pretrained.PACKAGED:
        return None
    if name not in build.SIZES:
        raise ValueError(f"unknown built-in model {path!r}; built-in models: {', '.join(builtin_names())}")
    return name


def packaged_model(path: str) -> pretrained.PackagedModel | None:
    """The packaged pretrained model ``path`` names (``echorl:smollm2-135m``), or None."""
    if not path.startswith(PREFIX):
        return None
    return pretrained.PACKAGED.get(path[len(PREFIX) :])


def _options_digest(options: Mapping[str, Any]) -> str:
    text = json.dumps(dict(options), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=4).hexdigest()


def cache_key(
    size: str,
    *,
    seed: int = 0,
    warmup_steps: int = 0,
    task: str = "arithmetic",
    task_options: Mapping[str, Any] | None = None,
) -> str:
    """The cache directory name of a built-in model: e.g. ``tiny-b1-s0`` or ``tiny-b1-s0-arithmetic-w200-r1``."""
    from echo_runtime.models import warmup

    key = f"{build.check_size(size)}-b{build.BUILD_VERSION}-s{seed}"
    if warmup_steps > 0:
        task_part = re.sub(r"[^A-Za-z0-9_.]", "_", task)
        key += f"-{task_part}"
        if task_options:
            key += f"-o{_options_digest(task_options)}"
        key += f"-w{warmup_steps}-r{warmup.WARMUP_VERSION}"
    return key


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _complete(directory: Path) -> bool:
    return (directory / build.METADATA_FILE).is_file()


def _looks_like_path(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or "\\" in path or path.count("/") > 1 or not _HUB_ID.match(path)


def resolve_model(
    path: str,
    *,
    seed: int = 0,
    warmup_steps: int = 0,
    task: str = "arithmetic",
    task_options: Mapping[str, Any] | None = None,
) -> str:
    """The local Hugging Face directory ``path`` names, building, converting or locating it first if needed.

    See the module docstring for the rules. ``seed``, ``warmup_steps``, ``task`` and ``task_options``
    matter for built-in models only (``Model.seed``, ``Model.warmup_steps``, ``Task.name``,
    ``Task.options`` of a job spec).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}")
    if not isinstance(path, str) or not path:
        raise ValueError(f"model path must be a non-empty string, got {path!r}")
    size = builtin_size(path)
    if size is None:
        if warmup_steps:
            raise ValueError(
                f"warmup_steps applies only to built-in models ({PREFIX}tiny, {PREFIX}small), not {path!r}; "
                "warm a local model with `echorl model warmup --model DIR --out OUT` and use OUT"
            )
        packaged = packaged_model(path)
        if packaged is not None:
            return _resolve_packaged(packaged)
        return _resolve_external(path)

    key = cache_key(size, seed=seed, warmup_steps=warmup_steps, task=task, task_options=task_options)
    target = models_dir() / key
    if _complete(target):
        return str(target)
    with _locked(models_dir() / f".{key}.lock"):
        if _complete(target):  # another process built it while we waited
            return str(target)
        if target.exists():  # not ours to trust: an interrupted manual copy or similar
            shutil.rmtree(target)
        if warmup_steps == 0:
            _log.info("building %s%s (seed %d) into %s", PREFIX, size, seed, target)
            build.init_model(size, target, seed)
        else:
            from echo_runtime.models import warmup

            base = resolve_model(f"{PREFIX}{size}", seed=seed)
            _log.info("warming up %s with %d steps of %s into %s", base, warmup_steps, task, target)
            warmup.warmup(
                base,
                target,
                task=task,
                task_options=task_options,
                steps=warmup_steps,
                seed=seed,
                log=_log.info,
            )
    return str(target)


def _cached_build(key: str, make: Callable[[Path], object]) -> str:
    """``models_dir()/key``, made by ``make(target)`` under the key's lock unless already complete."""
    target = models_dir() / key
    if _complete(target):
        return str(target)
    with _locked(models_dir() / f".{key}.lock"):
        if not _complete(target):  # nobody built it while we waited
            if target.exists():  # an interrupted copy: not ours to trust
                shutil.rmtree(target)
            make(target)
    return str(target)


def _resolve_packaged(model: pretrained.PackagedModel) -> str:
    return _cached_build(model.cache_key, lambda target: pretrained.materialise(model, target, cache_dir()))


def _resolve_gguf(file: Path) -> str:
    source = file.resolve()
    key = f"gguf-{gguf.file_sha256(source)[:16]}-c{gguf.CONVERT_VERSION}"
    return _cached_build(key, lambda target: gguf.convert(source, target, metadata={"name": str(source)}))


def _resolve_external(path: str) -> str:
    local = Path(path).expanduser()
    if local.exists():
        if local.is_file() and local.suffix.lower() == ".gguf":
            return _resolve_gguf(local)
        if not local.is_dir():
            raise NotADirectoryError(
                f"model path {path!r} is a file; expected a Hugging Face model directory or a .gguf file"
            )
        if not (local / "config.json").is_file() and not (local / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"model directory {path!r} has no config.json: not a Hugging Face model directory"
            )
        return str(local.resolve())
    if _looks_like_path(path):
        raise ModelNotFoundError(
            f"model path {path!r} does not exist (expected a local directory, a .gguf file, a hub id such as "
            f"'Qwen/Qwen3-0.6B', or one of {', '.join(builtin_names())})"
        )
    return _resolve_hub(path)


def _resolve_hub(repo_id: str) -> str:
    """The local snapshot directory of hub model ``repo_id`` (downloaded first when online)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        with build.quiet_progress():
            folder = snapshot_download(repo_id, allow_patterns=list(HUB_PATTERNS), local_files_only=offline)
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError) as exc:
        where = f"the local Hugging Face cache ({constants.HF_HUB_CACHE})"
        hint = (
            "HF_HUB_OFFLINE is set, so only that cache is read: download it there on a machine with hub "
            "access, or use a local directory, a .gguf file"
            if offline
            else "the hub did not provide it either: check the id and your access; or use a local directory, a .gguf file"
        )
        raise ModelNotFoundError(
            f"model {repo_id!r} is not in {where}; {hint}, or one of {', '.join(builtin_names())} "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    if not (Path(folder) / "config.json").is_file():
        raise ModelNotFoundError(f"hub model {repo_id!r} (snapshot {folder}) has no config.json")
    return str(Path(folder).resolve())


def vocab_size(path: str) -> int:
    """The vocabulary size of the model ``path`` names (any name :func:`resolve_model` takes, or an already
    resolved directory), read with ``AutoConfig`` (the text config of a multimodal model): the number of
    rows of the embedding, so every valid token id is below it. ``config.json`` is read directly where it
    states the size (top level, or a ``text_config``): ``AutoConfig`` imports torch, which the
    coordinator, the one caller that needs nothing else of the model, does not otherwise load."""
    folder = Path(resolve_model(path))
    with contextlib.suppress(OSError, ValueError):
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        for section in (raw, raw.get("text_config") if isinstance(raw, dict) else None):
            if (
                isinstance(section, dict)
                and isinstance(section.get("vocab_size"), int)
                and section["vocab_size"] >= 1
            ):
                if section is raw and isinstance(raw.get("text_config"), dict):
                    continue  # a multimodal config: the text model's size is the one that counts
                return int(section["vocab_size"])
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    text: Any = config.get_text_config()
    size = getattr(text, "vocab_size", None)
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"model {path!r}: its config has no vocab_size")
    return size
