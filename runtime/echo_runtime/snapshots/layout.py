"""Where everything lives in a store: the one key layout both implementations share.

::

    <prefix>/<job>/snapshots/latest                       {"version": 17}: the newest complete version
    <prefix>/<job>/snapshots/<version>/manifest.json      written last; its presence *is* the version
    <prefix>/<job>/snapshots/<version>/<data>/<file>      the payload, <data> = "data-<random hex>"
    <prefix>/<job>/checkpoints/...                        the same layout, keyed by trainer step
    <prefix>/<job>/pins/<version>/<reader>.ttl<s>.json    "reader still uses version", for <s> seconds

Versions are plain decimal integers (``17``, not ``00017``): listings are sorted numerically here.

Each publish writes its files under a fresh ``data-<hex>`` folder of the version, never at a fixed
key. Two publishers racing for one version therefore cannot overwrite each other's bytes, and a
publisher killed half-way leaves an orphan folder that blocks nothing; only the manifest (a
conditional, create-only write) decides which publish owns the version, and it names its folder.

Keys are ``/``-separated for both implementations; the local one maps them onto directories.
"""

from __future__ import annotations

import dataclasses
import re

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_FILE_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")
_PIN = re.compile(r"^(?P<reader>.+)\.ttl(?P<ttl>[0-9]{1,9})\.json$")
DATA_PREFIX = "data-"
MANIFEST = "manifest.json"
LATEST = "latest"

SNAPSHOTS = "snapshots"
CHECKPOINTS = "checkpoints"
PINS = "pins"


def check_name(value: str, what: str) -> str:
    """Return ``value`` if it is a safe single path component (job names, reader ids), else raise."""
    if not _NAME.match(value):
        raise ValueError(
            f"{what}: must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit, "
            f"got {value!r}"
        )
    return value


def check_file_name(name: str) -> str:
    """Return ``name`` if it is a safe relative file name (``a/b.safetensors``), else raise.

    No absolute paths, no ``..``, no hidden components, and not the manifest's own name at the top.
    """
    parts = name.split("/")
    if not all(_FILE_PART.match(p) for p in parts) or ".." in parts:
        raise ValueError(
            f"file name {name!r}: must be a relative path of letters, digits, '.', '_' or '-' components "
            "(no leading '/', '.' or '..')"
        )
    if name == MANIFEST:
        raise ValueError(f"file name {name!r}: reserved for the snapshot's own manifest")
    return name


def join(*parts: str) -> str:
    """Join key parts with ``/``, dropping empty parts and stray slashes."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


@dataclasses.dataclass(frozen=True)
class Series:
    """The keys of one numbered series: ``snapshots`` (by policy version) or ``checkpoints`` (by step)."""

    base: str
    """``<prefix>/<job>/<snapshots|checkpoints>``."""

    @property
    def latest(self) -> str:
        return f"{self.base}/{LATEST}"

    def version_dir(self, version: int) -> str:
        return f"{self.base}/{version}/"

    def manifest(self, version: int) -> str:
        return f"{self.base}/{version}/{MANIFEST}"

    def data_dir(self, version: int, data: str) -> str:
        return f"{self.base}/{version}/{data}/"

    def data(self, version: int, data: str, name: str) -> str:
        return f"{self.base}/{version}/{data}/{name}"

    def parse(self, key: str) -> tuple[int, str] | None:
        """``(version, rest)`` for a key inside a version folder, else ``None`` (``latest``, strays)."""
        if not key.startswith(self.base + "/"):
            return None
        head, sep, rest = key[len(self.base) + 1 :].partition("/")
        if not sep or not head.isdigit() or (head != "0" and head.startswith("0")):
            return None
        return int(head), rest


@dataclasses.dataclass(frozen=True)
class Pins:
    """The keys of reader pins: one small object per (version, reader)."""

    base: str
    """``<prefix>/<job>/pins``."""

    def key(self, version: int, reader: str, ttl_s: int) -> str:
        return f"{self.base}/{version}/{reader}.ttl{ttl_s}.json"

    def reader_prefix(self, version: int) -> str:
        return f"{self.base}/{version}/"

    def parse(self, key: str) -> tuple[int, str, int] | None:
        """``(version, reader, ttl_s)`` of a pin key, else ``None``."""
        if not key.startswith(self.base + "/"):
            return None
        head, sep, rest = key[len(self.base) + 1 :].partition("/")
        match = _PIN.match(rest)
        if not sep or not head.isdigit() or match is None or not _NAME.match(match["reader"]):
            return None
        return int(head), match["reader"], int(match["ttl"])


@dataclasses.dataclass(frozen=True)
class Layout:
    """All keys of one job in one store."""

    prefix: str
    job: str

    def __post_init__(self) -> None:
        check_name(self.job, "job")

    @property
    def root(self) -> str:
        return join(self.prefix, self.job)

    @property
    def snapshots(self) -> Series:
        return Series(join(self.root, SNAPSHOTS))

    @property
    def checkpoints(self) -> Series:
        return Series(join(self.root, CHECKPOINTS))

    @property
    def pins(self) -> Pins:
        return Pins(join(self.root, PINS))
