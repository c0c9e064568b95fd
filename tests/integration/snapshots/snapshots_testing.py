"""Helpers for the snapshot-store tests: open the same store twice, deterministic payloads, a
request-counting store, a TCP proxy that drops connections, and the child process that gets killed.

``Target`` describes a store (local directory or MinIO bucket) in plain data, so a test, its threads
and a child process each open their own handle on the same store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from echo_runtime.snapshots import blobs, retry, s3
from echo_runtime.snapshots.local import LocalBlobs
from echo_runtime.snapshots.store import SnapshotStore

MiB = 1024 * 1024
HERE = Path(__file__).resolve().parent
# Small parts, so that multipart uploads and ranged downloads run with files of a few MiB.
TEST_TUNING = s3.Tuning(part_size=5 * MiB, parallel=3, lookahead=3)
FAST_BACKOFF = retry.Backoff(attempts=3, base_s=0.01, max_s=0.05)


@dataclasses.dataclass(frozen=True)
class Target:
    kind: str  # "local" | "s3"
    path: str = ""
    endpoint: str = ""
    bucket: str = ""
    access_key: str = ""
    secret_key: str = ""
    prefix: str = ""

    def blobs(self, **overrides: Any) -> blobs.Blobs:
        if self.kind == "local":
            return LocalBlobs(self.path)
        return s3.connect(
            overrides.get("endpoint", f"http://{self.endpoint}"),
            self.bucket,
            prefix=self.prefix,
            credentials=overrides.get("credentials", (self.access_key, self.secret_key)),
            backoff=overrides.get("backoff", FAST_BACKOFF),
            tuning=overrides.get("tuning", TEST_TUNING),
        )

    @classmethod
    def of_bucket(cls, bucket: Any, prefix: str = "") -> Target:
        """The S3 target of a test MinIO bucket (``services.minio.MinioBucket``)."""
        return cls(
            "s3",
            endpoint=bucket.endpoint,
            bucket=bucket.bucket,
            access_key=bucket.access_key,
            secret_key=bucket.secret_key,
            prefix=prefix,
        )

    def open(self, job: str = "job", **overrides: Any) -> SnapshotStore:
        return SnapshotStore(self.blobs(**overrides), job, prefix=self.prefix)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def content(version: int, index: int, size: int) -> bytes:
    """Deterministic bytes for file ``index`` of ``version``: readers can check what they got."""
    seed = hashlib.sha256(f"{version}/{index}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def write_payload(folder: Path, version: int, sizes: Sequence[int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes):
        (folder / f"part-{i}.bin").write_bytes(content(version, i, size))
    return folder


def check_payload(folder: Path, version: int, sizes: Sequence[int]) -> None:
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([*(f"part-{i}.bin" for i in range(len(sizes))), "manifest.json"]), names
    for i, size in enumerate(sizes):
        data = (folder / f"part-{i}.bin").read_bytes()
        assert data == content(version, i, size), f"version {version} file {i}: wrong bytes"


class CountingBlobs:
    """Wraps a Blobs and counts every call, to prove that cached reads touch no store."""

    def __init__(self, inner: blobs.Blobs) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted

    @property
    def location(self) -> str:
        return self.inner.location

    @property
    def cache_key(self) -> str:
        return self.inner.cache_key


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    return env


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.01)


def _child_main(argv: Sequence[str]) -> None:  # pragma: no cover - runs in the child process
    """``python snapshots_testing.py TARGET_JSON MODE SRC MARKER``.

    MODE ``stall``: publish version 1 from SRC, but after the first file is uploaded touch MARKER
    and hang (the parent SIGKILLs us). MODE ``stream``: publish versions 1, 2, … from payloads made
    on the fly, touching MARKER once started, until killed.
    """
    target = Target(**json.loads(argv[0]))
    mode, src, marker = argv[1], Path(argv[2]), Path(argv[3])
    store = target.open()
    if mode == "stall":
        real_upload = store.blobs.upload

        def upload(key: str, source: Path) -> blobs.Digest:
            digest = real_upload(key, source)
            marker.touch()
            time.sleep(600)
            return digest

        store.blobs.upload = upload  # type: ignore[method-assign]
        store.publish(1, src, kind="full", base_model="test")
        return
    marker.touch()
    for version in _count(1):
        store.publish(
            version, write_payload(src / str(version), version, STREAM_SIZES), kind="full", base_model="test"
        )


STREAM_SIZES = (3000, 6 * MiB + 17, 100)


def _count(start: int) -> Iterator[int]:
    while True:
        yield start
        start += 1


if __name__ == "__main__":  # pragma: no cover
    _child_main(sys.argv[1:])
