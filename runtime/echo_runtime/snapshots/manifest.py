"""``manifest.json`` and the ``latest`` pointer: the two small documents that make a version visible.

A version exists exactly when its manifest exists. The manifest is written after every file it
lists, with a create-only write, and never changes afterwards; it records for each file its name,
size and sha256, so a reader can prove that what it downloaded is what was published.

The ``latest`` pointer (``{"version": N}``) only ever moves forward and only ever names a version
whose manifest was written first. It is a hint for speed: the list of manifests is the truth.
"""

from __future__ import annotations

import datetime
import json
from typing import Literal, Self

import pydantic

from echo_runtime.snapshots import errors, layout

Kind = Literal["lora", "full", "checkpoint"]
"""``lora``: a peft adapter (weights + config); ``full``: a whole safetensors state dict (sharded for
large models); ``checkpoint``: trainer state (optimizer, step, RNG) beside the snapshots."""

FORMAT = 2
"""The newest manifest format this echorl reads; readers refuse manifests from a newer format. Format 1
is written for every manifest without a delta, so older readers keep reading them."""


class FileEntry(pydantic.BaseModel):
    """One payload file of a version."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    name: str
    """Path relative to the version's folder (``adapter_model.safetensors``, ``shards/model-1.safetensors``)."""
    size: int = pydantic.Field(ge=0)
    sha256: str = pydantic.Field(pattern=r"^[0-9a-f]{64}$")

    @pydantic.field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return layout.check_file_name(value)


class Delta(pydantic.BaseModel):
    """A version published as the changes against the version before it (:mod:`.deltas`)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    base: int = pydantic.Field(ge=0)
    """The version the changes apply to (the one before)."""
    anchor: int = pydantic.Field(ge=0)
    """The full version the chain of deltas starts from: reading this version needs every version
    from ``anchor`` to ``base``."""
    files: tuple[FileEntry, ...] = pydantic.Field(min_length=1)
    """The full snapshot's files (``model.safetensors``, or the shards and their index) as the trainer
    would have written them: what a reader rebuilds, checked by size and sha256."""

    @pydantic.model_validator(mode="after")
    def _order(self) -> Delta:
        if self.anchor > self.base:
            raise ValueError(f"anchor {self.anchor} must not be newer than base {self.base}")
        return self


DELTA_FORMAT = 2
"""The format of a delta version's manifest: readers from before deltas refuse it with "upgrade"."""


class Manifest(pydantic.BaseModel):
    """What one published version holds."""

    model_config = pydantic.ConfigDict(frozen=True, extra="ignore")

    format: int = 1
    version: int = pydantic.Field(ge=0)
    """Policy version (snapshots) or trainer step (checkpoints)."""
    kind: Kind
    base_model: str
    """The model the weights belong to: a path, a hub id or ``echorl:tiny``."""
    step: int = pydantic.Field(ge=0)
    """Trainer optimizer step that produced these weights (equals ``version`` for snapshots)."""
    created: datetime.datetime
    """When the publish finished uploading (UTC, the publisher's clock)."""
    data: str = pydantic.Field(pattern=r"^data-[0-9a-f]{8,64}$")
    """The folder, inside the version's folder, that holds this publish's files."""
    files: tuple[FileEntry, ...] = pydantic.Field(min_length=1)
    delta: Delta | None = None
    """Set when the files hold the changes against ``delta.base`` instead of the full weights."""

    @pydantic.model_validator(mode="after")
    def _delta_after_base(self) -> Manifest:
        if self.delta is not None and self.delta.base >= self.version:
            raise ValueError(f"delta.base {self.delta.base} must be older than the version {self.version}")
        return self

    @pydantic.field_validator("files")
    @classmethod
    def _unique(cls, files: tuple[FileEntry, ...]) -> tuple[FileEntry, ...]:
        names = [f.name for f in files]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"file names must be unique, repeated: {', '.join(dupes)}")
        return files

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, name: str) -> FileEntry:
        for entry in self.files:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Self:
        """Parse a manifest read from ``where``; raise :class:`~errors.InvalidManifestError` if it is bad."""
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise errors.InvalidManifestError(f"{where}: not valid JSON ({exc})") from None
        if isinstance(raw, dict) and isinstance(raw.get("format"), int) and raw["format"] > FORMAT:
            raise errors.InvalidManifestError(
                f"{where}: manifest format {raw['format']} is newer than this echorl understands ({FORMAT}); "
                "upgrade echorl on this machine"
            )
        try:
            return cls.model_validate(raw)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()
            )
            raise errors.InvalidManifestError(f"{where}: invalid manifest ({problems})") from None


class SnapshotManifest(Manifest):
    """The manifest of a policy version: a LoRA adapter or full weights."""

    kind: Literal["lora", "full"]


class CheckpointManifest(Manifest):
    """The manifest of a trainer checkpoint (optimizer state, step, RNG), numbered by step."""

    kind: Literal["checkpoint"] = "checkpoint"


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def pointer_bytes(version: int) -> bytes:
    """The ``latest`` pointer's content for ``version``."""
    return json.dumps({"version": version}).encode() + b"\n"


def parse_pointer(data: bytes, where: str) -> int:
    """The version a ``latest`` pointer names; raise :class:`~errors.InvalidManifestError` if it is bad."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raw = None
    version = raw.get("version") if isinstance(raw, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise errors.InvalidManifestError(f'{where}: expected {{"version": <int ≥ 0>}}, got {data[:80]!r}')
    return version
