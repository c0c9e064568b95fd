"""Turn a ``Model.path`` into something ``from_pretrained`` loads: a local directory or a hub id.

Promises of :func:`resolve_model`:

* ``echorl:tiny`` / ``echorl:small`` (the built-in models, :mod:`echo_runtime.models.build`) resolve to a
  directory in the user's cache, ``<cache>/models/<key>``, where ``<cache>`` is ``$ECHORL_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/echorl``, else ``~/.cache/echorl``. The key names everything the weights depend on
  (size, build recipe version, seed, and for a warmed-up model the task, its options, the steps and the
  warm-up recipe version), so a cached directory is never reused for a different request.
* A missing cached model is built (and, with ``warmup_steps > 0``, warmed up on the task) once: builds go
  through a temporary directory renamed into place, and a per-key file lock makes concurrent processes
  wait for one builder instead of building twice. A present one is returned without touching it.
* An existing local directory is returned as is (absolute). A string that looks like a filesystem path but
  does not exist is a ``FileNotFoundError`` naming it; any other string is treated as a hub id and
  returned unchanged for ``from_pretrained`` (which, offline, fails with its own clear error).
* ``warmup_steps`` applies to built-in models only; asking for it with another path is a ``ValueError``
  (warm a local model explicitly with ``echorl model warmup``).

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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from echo_runtime.models import build

PREFIX: Final = "echorl:"
"""Scheme of the built-in model names: ``echorl:tiny``, ``echorl:small``."""

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


def builtin_size(path: str) -> str | None:
    """``"tiny"`` for ``"echorl:tiny"``; None for any path that is not a built-in name.

    An ``echorl:`` name with an unknown size is a ``ValueError`` listing the sizes.
    """
    if not path.startswith(PREFIX):
        return None
    return build.check_size(path[len(PREFIX) :])


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
    """A local directory or hub id for ``path``, building a built-in model first if needed.

    See the module docstring for the rules. ``seed``, ``warmup_steps``, ``task`` and ``task_options``
    matter for built-in models only (``Model.seed``, ``Model.warmup_steps``, ``Task.name``,
    ``Task.options`` of a job spec).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}")
    size = builtin_size(path)
    if size is None:
        if warmup_steps:
            raise ValueError(
                f"warmup_steps applies only to built-in models ({PREFIX}tiny, {PREFIX}small), not {path!r}; "
                "warm a local model with `echorl model warmup --model DIR --out OUT` and use OUT"
            )
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


def _resolve_external(path: str) -> str:
    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise NotADirectoryError(
                f"model path {path!r} is a file; expected a Hugging Face model directory"
            )
        if not (local / "config.json").is_file() and not (local / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"model directory {path!r} has no config.json: not a Hugging Face model directory"
            )
        return str(local.resolve())
    if _looks_like_path(path):
        raise FileNotFoundError(
            f"model path {path!r} does not exist (expected a local directory, a hub id such as "
            f"'Qwen/Qwen3-0.6B', or {PREFIX}tiny / {PREFIX}small)"
        )
    return path
