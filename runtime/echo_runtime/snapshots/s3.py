"""The S3 store (MinIO, AWS S3 and other S3-compatible services) through the ``minio`` SDK.

Promises on top of :class:`~echo_runtime.snapshots.blobs.Blobs`:

* create-only writes use ``If-None-Match: *`` and the pointer's compare-and-swap uses ``If-Match``
  (MinIO, AWS S3 since 2024); the server, not the client, decides which of two publishers wins. A
  request retried after a lost response can fail its own precondition, so a failed create is read
  back: identical bytes mean this writer won;
* large files move in parts, in parallel: multipart uploads, and ranged GETs whose bytes are written
  in place and hashed in order while later parts are still downloading (memory stays bounded by
  ``lookahead × part_size``);
* every request is retried with jittered exponential backoff on transient failures (connection
  errors, timeouts, 5xx, ``SlowDown``); what is left is translated into an error that names the
  endpoint, the bucket and what to check (:mod:`~echo_runtime.snapshots.errors`).

The SDK's own urllib3 retries are turned off so that one policy (:class:`~retry.Backoff`) governs.
"""

from __future__ import annotations

import collections
import email.utils
import hashlib
import io
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

import certifi
import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, S3Error, ServerError

from echo_runtime.snapshots import blobs, errors, retry
from echo_runtime.snapshots.s3config import Credentials, Tuning, credentials_from_env, parse_endpoint

T = TypeVar("T")
MiB = 1024 * 1024
_CHUNK = 4 * MiB
"""Read size for streamed bodies and for hashing downloaded parts back from the page cache."""
__all__ = ["Credentials", "S3Blobs", "Tuning", "connect", "credentials_from_env", "parse_endpoint"]
log = logging.getLogger("echo_runtime.snapshots")

_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "SlowDown",
        "ServiceUnavailable",
        "RequestTimeout",
        "OperationTimedOut",
        "ConditionalRequestConflict",
        "XMinioServerNotInitialized",
        "XMinioReadQuorum",
        "XMinioWriteQuorum",
    }
)
_AUTH_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "InvalidToken",
        "ExpiredToken",
        "AuthorizationHeaderMalformed",
        "InvalidSecurity",
        "AllAccessDisabled",
    }
)
_PRECONDITION_CODES = frozenset({"PreconditionFailed"})


class S3Blobs:
    """A :class:`~echo_runtime.snapshots.blobs.Blobs` on one bucket of an S3-compatible service."""

    def __init__(
        self,
        client: Minio,
        bucket: str,
        *,
        url: str,
        prefix: str = "",
        backoff: retry.Backoff | None = None,
        tuning: Tuning | None = None,
        credentials_source: str = "",
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.url = url
        self.prefix = prefix
        self.backoff = backoff or retry.Backoff()
        self.tuning = tuning or Tuning()
        self.credentials_source = credentials_source

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix.strip('/')} at {self.url}".replace("/ at", " at")

    @property
    def cache_key(self) -> str:
        return "s3-" + hashlib.sha256(f"{self.url}/{self.bucket}".encode()).hexdigest()[:12]

    def __repr__(self) -> str:
        return f"S3Blobs({self.location!r})"

    # ------------------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        found = self.get_tagged(key)
        return None if found is None else found[0]

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        def once() -> tuple[bytes, str] | None:
            try:
                resp = self.client.get_object(self.bucket, key)
            except S3Error as exc:
                if exc.code == "NoSuchKey":
                    return None
                raise
            try:
                return resp.read(), str(resp.headers.get("etag", "")).strip('"')
            finally:
                resp.close()
                resp.release_conn()

        return self._call(f"GET {key}", once)

    def exists(self, key: str) -> bool:
        def once() -> bool:
            try:
                self.client.stat_object(self.bucket, key)
                return True
            except S3Error as exc:
                if exc.code == "NoSuchKey":
                    return False
                raise

        return self._call(f"HEAD {key}", once)

    def create(self, key: str, data: bytes) -> bool:
        if self._put_if(key, data, {"If-None-Match": "*"}):
            return True
        return self.get(key) == data  # our own earlier try may have succeeded before a retry

    def swap(self, key: str, data: bytes, tag: str | None) -> bool:
        return self._put_if(key, data, {"If-None-Match": "*"} if tag is None else {"If-Match": f'"{tag}"'})

    def put(self, key: str, data: bytes) -> None:
        self._call(
            f"PUT {key}", lambda: self.client.put_object(self.bucket, key, io.BytesIO(data), len(data))
        )

    def upload(self, key: str, source: Path) -> blobs.Digest:
        def once() -> blobs.Digest:
            with source.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                reader = _HashingReader(fh)
                self.client.put_object(
                    self.bucket,
                    key,
                    cast(BinaryIO, reader),
                    size,
                    part_size=self.tuning.upload_part_size(size),
                    num_parallel_uploads=self.tuning.parallel,
                )
            return blobs.Digest(reader.size, reader.digest.hexdigest())

        return self._call(f"PUT {key}", once)

    def download(self, key: str, dest: Path, size: int) -> blobs.Digest:
        if size <= self.tuning.part_size:
            return self._call(f"GET {key}", lambda: self._get_whole(key, dest))
        return self._get_ranged(key, dest, size)

    def list(self, prefix: str) -> Iterator[blobs.BlobInfo]:
        def once() -> list[blobs.BlobInfo]:
            return [
                blobs.BlobInfo(
                    o.object_name, o.size or 0, o.last_modified.timestamp() if o.last_modified else 0.0
                )
                for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
                if o.object_name is not None and not o.is_dir
            ]

        return iter(self._call(f"LIST {prefix}", once))

    def delete(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [DeleteObject(k) for k in keys[start : start + 1000]]

            def once(batch: list[DeleteObject] = batch) -> list[str]:
                return [
                    f"{e.name}: {e.code} {e.message}"
                    for e in self.client.remove_objects(self.bucket, batch)
                    if e.code != "NoSuchKey"
                ]

            failed = self._call("DELETE objects", once)
            if failed:
                raise errors.SnapshotError(
                    f"{self.location}: could not delete {len(failed)} object(s): {failed[:3]}"
                )

    def now(self) -> float:
        def once() -> float:
            resp = self.client._execute("HEAD", self.bucket)
            date = resp.headers.get("date")
            if not date:
                raise errors.SnapshotError(f"{self.url} sent no Date header; cannot read the server's clock")
            return email.utils.parsedate_to_datetime(date).timestamp()

        return self._call(f"HEAD bucket {self.bucket}", once)

    def check(self) -> None:
        if not self._call(f"HEAD bucket {self.bucket}", lambda: self.client.bucket_exists(self.bucket)):
            raise self._no_bucket()

    # ------------------------------------------------------------------------------------------
    def _put_if(self, key: str, data: bytes, condition: dict[str, str]) -> bool:
        def once() -> bool:
            try:
                # The public put_object() turns unknown headers into x-amz-meta-* user metadata, so
                # the conditional header goes through the SDK's request method (minio 7.2 pinned).
                self.client._put_object(
                    self.bucket, key, data, headers={**condition, "Content-Type": "application/json"}
                )
                return True
            except S3Error as exc:
                if exc.code in _PRECONDITION_CODES:
                    return False
                if exc.code == "NotImplemented":
                    raise errors.SnapshotError(
                        f"{self.url} does not support conditional writes ({', '.join(condition)}), which "
                        "the snapshot store needs so that two publishers never claim one version; use "
                        "MinIO 2024-11 or newer, AWS S3, or another store with If-None-Match/If-Match"
                    ) from None
                raise

        return self._call(f"PUT {key} ({', '.join(f'{k}: {v}' for k, v in condition.items())})", once)

    def _get_whole(self, key: str, dest: Path) -> blobs.Digest:
        try:
            resp = self.client.get_object(self.bucket, key)
        except S3Error as exc:
            if exc.code == "NoSuchKey":
                raise blobs.BlobNotFound(key) from None
            raise
        digest, size = hashlib.sha256(), 0
        try:
            with dest.open("wb") as fh:
                for chunk in resp.stream(_CHUNK, decode_content=False):
                    digest.update(chunk)
                    fh.write(chunk)
                    size += len(chunk)
        finally:
            resp.close()
            resp.release_conn()
        return blobs.Digest(size, digest.hexdigest())

    def _get_ranged(self, key: str, dest: Path, size: int) -> blobs.Digest:
        """Parallel ranged GETs, each streamed into its place in ``dest``, hashed here in order.

        The hash follows the download closely: whatever prefix of the oldest range has reached the
        file is read back from the page cache and hashed while the later ranges still arrive, so
        verifying overlaps with transferring. No range is held in memory; reads go through one
        reused buffer.
        """
        part = self.tuning.range_size(size)
        todo = iter([(offset, min(part, size - offset)) for offset in range(0, size, part)])
        digest, got = hashlib.sha256(), 0
        view = memoryview(bytearray(_CHUNK))
        arrived = threading.Condition()

        def wake(_: object) -> None:
            with arrived:
                arrived.notify_all()

        with dest.open("w+b") as fh, ThreadPoolExecutor(self.tuning.parallel, "echorl-get") as pool:
            fd = fh.fileno()
            pending: collections.deque[_Range] = collections.deque()

            def refill() -> None:
                while len(pending) < self.tuning.lookahead:
                    nxt = next(todo, None)
                    if nxt is None:
                        return
                    rng = _Range(*nxt, arrived)
                    rng.future = pool.submit(self._get_range, key, fd, rng)
                    rng.future.add_done_callback(wake)
                    pending.append(rng)

            refill()
            try:
                hashed = 0  # bytes of pending[0] already hashed
                while pending:
                    rng = pending[0]
                    with arrived:
                        while rng.written <= hashed and not rng.future.done():
                            arrived.wait(1.0)
                        finished = rng.future.done()
                        available = rng.written  # read once: the download goes on meanwhile
                    if finished:
                        received, total = rng.future.result()
                    if available > hashed:
                        got += _hash_file_range(fd, rng.offset + hashed, available - hashed, digest, view)
                        hashed = available
                    if not finished:
                        continue
                    if total not in (size, -1):  # the object is longer or shorter than the manifest says
                        got = total
                        break
                    if received < rng.length:
                        break
                    pending.popleft()
                    hashed = 0
                    refill()
            finally:
                for rng in pending:
                    rng.future.cancel()
        return blobs.Digest(got, digest.hexdigest())

    def _get_range(self, key: str, fd: int, rng: _Range) -> tuple[int, int]:
        """Write ``rng``'s bytes in place, reporting progress; return how many came and the object's size."""

        def once() -> tuple[int, int]:
            try:
                resp = self.client.get_object(self.bucket, key, offset=rng.offset, length=rng.length)
            except S3Error as exc:
                if exc.code == "NoSuchKey":
                    raise blobs.BlobNotFound(key) from None
                if exc.code == "InvalidRange":  # the object ends before offset
                    return 0, -1
                raise
            try:
                total = str(resp.headers.get("content-range", "")).rpartition("/")[2]
                position = rng.offset
                for chunk in resp.stream(_CHUNK, decode_content=False):
                    _pwrite_all(fd, chunk, position)
                    position += len(chunk)
                    rng.reached(position - rng.offset)
                return position - rng.offset, int(total) if total.isdigit() else -1
            finally:
                resp.close()
                resp.release_conn()

        return self._call(f"GET {key} [{rng.offset}, {rng.offset + rng.length})", once)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one request with retries; translate what is left into an actionable error."""
        try:
            return retry.call(fn, transient=_transient, backoff=self.backoff, what=f"{what} on {self.url}")
        except S3Error as exc:
            raise self._translate(exc, what) from None
        except (urllib3.exceptions.HTTPError, ServerError, InvalidResponseError) as exc:
            if _transient(exc):
                raise errors.StoreUnavailableError(
                    f"cannot reach the S3 endpoint {self.url} ({_reason(exc)}), gave up after "
                    f"{self.backoff.attempts} attempt(s) of {what}; check storage.endpoint, that the server "
                    "is running, and that this machine can reach it"
                ) from None
            raise errors.SnapshotError(f"{what} on {self.url} failed: {_reason(exc)}") from None

    def _translate(self, exc: S3Error, what: str) -> errors.SnapshotError:
        if exc.code == "NoSuchBucket":
            return self._no_bucket()
        if exc.code in _AUTH_CODES:
            return errors.StoreAuthError(
                f"the S3 endpoint {self.url} rejected the request {what} on bucket {self.bucket!r} "
                f"({exc.code}: {exc.message}). Check the access key and secret key (credentials used: "
                f"{self.credentials_source or 'given by the caller'}; in Kubernetes, storage.credentialsSecret) "
                "and that they may read and write this bucket"
            )
        if exc.code == "RequestTimeTooSkewed":
            return errors.SnapshotError(
                f"{self.url} refused {what}: this machine's clock differs from the server's by more than "
                "15 minutes; synchronise the clock (NTP)"
            )
        if exc.code in _TRANSIENT_CODES:
            return errors.StoreUnavailableError(
                f"the S3 endpoint {self.url} kept failing {what} ({exc.code}: {exc.message}) after "
                f"{self.backoff.attempts} attempt(s)"
            )
        return errors.SnapshotError(f"{what} on {self.location} failed: {exc.code}: {exc.message}")

    def _no_bucket(self) -> errors.BucketNotFoundError:
        return errors.BucketNotFoundError(
            f"bucket {self.bucket!r} does not exist on {self.url}; create it (for example "
            f"`mc mb <alias>/{self.bucket}`; `echorl run` and the operator create it for you) or fix storage.bucket"
        )


def connect(
    endpoint: str,
    bucket: str,
    *,
    prefix: str = "",
    secure: bool = True,
    region: str | None = None,
    credentials: Credentials | tuple[str, str] | None = None,
    backoff: retry.Backoff | None = None,
    tuning: Tuning | None = None,
    create_bucket: bool = False,
) -> S3Blobs:
    """An :class:`S3Blobs` for ``bucket`` at ``endpoint``; no request is made unless ``create_bucket``.

    ``credentials`` default to the environment (:func:`credentials_from_env`).
    """
    host, tls = parse_endpoint(endpoint, secure)
    tuning = tuning or Tuning()
    if isinstance(credentials, tuple):
        credentials = Credentials(*credentials)
    source = "given by the caller"
    if credentials is None:
        credentials, source = credentials_from_env()
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=tuning.connect_timeout_s, read=tuning.read_timeout_s),
        maxsize=max(10, 2 * tuning.parallel + 2),
        retries=False,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
    )
    client = Minio(
        host,
        access_key=credentials.access_key if credentials else None,
        secret_key=credentials.secret_key if credentials else None,
        session_token=credentials.session_token if credentials else None,
        secure=tls,
        region=region,
        http_client=http,
    )
    store = S3Blobs(
        client,
        bucket,
        url=f"{'https' if tls else 'http'}://{host}",
        prefix=prefix,
        backoff=backoff,
        tuning=tuning,
        credentials_source=source,
    )
    if create_bucket and not store._call(f"HEAD bucket {bucket}", lambda: client.bucket_exists(bucket)):

        def make() -> None:
            try:
                client.make_bucket(bucket, location=region)
            except S3Error as exc:
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        store._call(f"create bucket {bucket}", make)
    return store


class _Range:
    """One ranged GET in flight and how far its bytes have reached the file.

    ``written`` only grows: a retried range rewrites the same bytes (data objects never change), so
    a prefix hashed before the retry stays valid; if the bytes did differ, the file hash would not
    match the manifest and the fetch would report the object as corrupt.
    """

    def __init__(self, offset: int, length: int, arrived: threading.Condition) -> None:
        self.offset = offset
        self.length = length
        self.written = 0
        self.arrived = arrived
        self.future: Future[tuple[int, int]]

    def reached(self, written: int) -> None:
        with self.arrived:
            if written > self.written:
                self.written = written
                self.arrived.notify_all()


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _hash_file_range(fd: int, offset: int, length: int, digest: Any, buffer: memoryview) -> int:
    """Feed ``length`` bytes of the file from ``offset`` into ``digest``; return the bytes read."""
    done = 0
    while done < length:
        n = os.preadv(fd, [buffer[: min(len(buffer), length - done)]], offset + done)
        if n == 0:
            break
        digest.update(buffer[:n])
        done += n
    return done


class _HashingReader:
    """A read-only stream that hashes what is read through it (the bytes actually uploaded)."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self.digest.update(data)
        self.size += len(data)
        return data


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, S3Error):
        return exc.code in _TRANSIENT_CODES
    if isinstance(exc, ServerError):
        return exc.status_code >= 500 or exc.status_code == 429
    if isinstance(exc, InvalidResponseError):
        return int(getattr(exc, "_code", 0) or 0) >= 500
    if isinstance(exc, urllib3.exceptions.SSLError):
        return False  # a certificate problem does not heal by waiting
    return isinstance(exc, urllib3.exceptions.HTTPError)


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    if "Connection refused" in text:
        return "connection refused"
    return text if len(text) < 300 else text[:300] + "…"
