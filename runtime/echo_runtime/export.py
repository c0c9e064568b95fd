"""A version of a job's store as a Hugging Face model directory (``echorl export``).

At the end of a run the policy exists as snapshots in Echo's store: a LoRA adapter, full weights, or a
delta against earlier versions. :func:`export_version` turns one version into what every tool of the
ecosystem loads — ``config.json``, ``model.safetensors`` (sharded when large), the tokenizer with its
chat template, ``generation_config.json`` — or, for a LoRA version when asked, the adapter alone in
PEFT's layout beside the tokenizer:

* the version is fetched through the store's verified path (checksums checked, a delta rebuilt into
  full weights from the versions before it), and applied to the base model exactly as a worker applies
  it (:class:`echo_runtime.backends.transformers.TransformersBackend`: shapes and names checked first);
* a LoRA is merged into the base in float32 (``merge_and_unload``), then the weights are cast to the
  dtype asked for (default: the base model's dtype as the job trained it);
* the directory is written under a temporary name beside ``out`` and renamed into place when complete,
  so an interrupted export leaves no half-written model; an ``out`` that exists and is not empty is
  refused, never overwritten;
* ``echorl-export.json`` records where it came from (job, store, version, kind, base, merged, dtype).

vLLM loads such a directory with its ordinary loader (the layout ``save_pretrained`` writes), and a
PEFT adapter directory with its LoRA loader; neither is run here (vLLM needs CUDA).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from echo_runtime.snapshots import SnapshotStore, payloads

Dtype = Literal["float32", "bfloat16", "float16"]
RECORD = "echorl-export.json"


class ExportError(ValueError):
    """An export that cannot be done as asked (the message names the option and what is allowed)."""


@dataclasses.dataclass(frozen=True)
class Exported:
    """What :func:`export_version` wrote."""

    out: Path
    version: int
    kind: str
    merged: bool
    dtype: str
    base: str
    bytes: int


def export_version(
    store: SnapshotStore,
    out: str | os.PathLike[str],
    *,
    base: str,
    version: int | None = None,
    adapter_only: bool = False,
    dtype: Dtype | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> Exported:
    """Write ``version`` (default: the newest) of ``store`` into ``out`` as a Hugging Face directory.

    ``base``: the model directory the job started from, as the job resolved it (a built-in model's
    warm-up is part of it: :func:`echo_runtime.models.load.resolve_spec`). ``adapter_only``: for a LoRA version, the adapter alone (PEFT's
    layout) instead of the merged model. ``dtype``: of the written weights (merged or full)."""
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ExportError(f"--out: {target} exists and is not an empty directory; name a new one")
    versions = store.versions()
    if not versions:
        raise ExportError(f"the store {store.location} holds no version of job {store.job!r}")
    chosen = versions[-1] if version is None else version
    if chosen not in versions:
        raise ExportError(
            f"--version: {chosen} is not in the store (it holds {_ranges(versions)}; retention keeps the newest)"
        )
    manifest = store.manifest(chosen)
    if adapter_only and manifest.kind != "lora":
        raise ExportError(f"--adapter: version {chosen} is a {manifest.kind} snapshot; it has no adapter")
    base_model = str(base)
    progress(f"fetching version {chosen} ({manifest.kind}) from {store.location}")
    with tempfile.TemporaryDirectory(prefix="echorl-export-") as scratch:
        snapshot = store.fetch(chosen, cache_dir if cache_dir is not None else scratch)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            written_dtype = _write(
                snapshot, manifest.kind, base_model, staging, adapter_only=adapter_only, dtype=dtype,
                progress=progress,
            )  # fmt: skip
            record = {
                "job": store.job,
                "store": store.location,
                "version": chosen,
                "kind": manifest.kind,
                "createdAt": manifest.created.isoformat(),
                "base": base_model,
                "baseNamed": manifest.base_model,
                "merged": manifest.kind == "lora" and not adapter_only,
                "adapterOnly": adapter_only,
                "dtype": written_dtype,
            }
            (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n")
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)  # mkdtemp's is private; the export is the user's like any directory
            if target.exists():
                target.rmdir()  # empty (checked above)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    progress(f"wrote {target} ({size / 2**20:.1f} MiB)")
    return Exported(target, chosen, manifest.kind, bool(record["merged"]), written_dtype, base_model, size)


def _write(
    snapshot: Path,
    kind: str,
    base_model: str,
    out: Path,
    *,
    adapter_only: bool,
    dtype: Dtype | None,
    progress: Callable[[str], None],
) -> str:
    """Write the model (or adapter) and tokenizer into ``out``; return the weights' dtype."""
    from echo_runtime.backends import sampling
    from echo_runtime.backends.transformers import TransformersBackend
    from echo_runtime.models import load as model_load
    from echo_runtime.models import resolve

    path = resolve.resolve_model(base_model)
    tokenizer = model_load.load_tokenizer(str(path))
    if adapter_only:
        progress("writing the adapter alone (PEFT's layout)")
        for name in (payloads.ADAPTER_WEIGHTS, payloads.ADAPTER_CONFIG):
            shutil.copyfile(snapshot / name, out / name)
        config = json.loads((out / payloads.ADAPTER_CONFIG).read_text())
        config["base_model_name_or_path"] = base_model
        (out / payloads.ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        tokenizer.save_pretrained(str(out))
        from safetensors import safe_open

        with safe_open(str(out / payloads.ADAPTER_WEIGHTS), "pt") as weights:
            first = next(iter(weights.keys()))
            stored = str(weights.get_slice(first).get_dtype())
        return {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(stored, stored)
    written: str = dtype or sampling.model_dtype(Path(path))
    progress(
        f"applying version to the base model {base_model}"
        + (" and merging the adapter" if kind == "lora" else "")
    )
    backend = TransformersBackend(path, device="cpu", dtype="float32")
    backend.apply_snapshot(1, snapshot, "lora" if kind == "lora" else "full")
    model: Any = backend.model
    if kind == "lora":
        model = model.merge_and_unload()
    model = model.to(model_load.torch_dtype(written))
    progress(f"writing the model in {written}")
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size=payloads.DEFAULT_SHARD_BYTES)
    tokenizer.save_pretrained(str(out))
    generation = Path(path) / "generation_config.json"
    if generation.is_file():
        shutil.copyfile(generation, out / "generation_config.json")
    return written


def _ranges(versions: list[int]) -> str:
    """``[1, 2, 3, 7]`` → ``"1–3, 7"``."""
    spans: list[str] = []
    start = prev = versions[0]
    for v in [*versions[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        spans.append(f"{start}" if start == prev else f"{start}–{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(spans)
