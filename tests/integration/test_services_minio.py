"""Proof that the ``minio`` fixtures run a real S3 server: object CRUD, multipart, presigned URLs,
and that a service which cannot start fails with its log."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from minio.error import S3Error

from services.minio import MinioBucket, MinioServer
from services.procs import ManagedProcess, ServiceError, live_processes

pytestmark = pytest.mark.services

MiB = 1024 * 1024


def test_server_is_live(minio_server: MinioServer) -> None:
    with urllib.request.urlopen(f"{minio_server.url}/minio/health/live", timeout=5) as resp:
        assert resp.status == 200
    assert minio_server.process.running()


def test_put_get_list_stat_delete(minio: MinioBucket) -> None:
    client, bucket = minio.client, minio.bucket
    payloads = {
        "a/one.txt": b"first object",
        "a/two.txt": b"second object, a bit longer",
        "b/three.bin": os.urandom(4096),
    }
    for name, data in payloads.items():
        client.put_object(
            bucket,
            name,
            io.BytesIO(data),
            len(data),
            content_type="application/octet-stream",
            metadata={"x-amz-meta-origin": "echorl-test"},
        )

    for name, data in payloads.items():
        resp = client.get_object(bucket, name)
        try:
            assert resp.read() == data
        finally:
            resp.close()
            resp.release_conn()

    assert sorted(o.object_name for o in client.list_objects(bucket, recursive=True)) == sorted(payloads)
    assert [o.object_name for o in client.list_objects(bucket, prefix="a/")] == ["a/one.txt", "a/two.txt"]
    assert sorted(o.object_name for o in client.list_objects(bucket)) == ["a/", "b/"]  # common prefixes

    stat = client.stat_object(bucket, "a/two.txt")
    assert stat.size == len(payloads["a/two.txt"])
    assert stat.etag == hashlib.md5(payloads["a/two.txt"]).hexdigest()  # single-part ETag is the MD5
    assert stat.metadata is not None and stat.metadata.get("x-amz-meta-origin") == "echorl-test"

    client.remove_object(bucket, "a/one.txt")
    with pytest.raises(S3Error) as err:
        client.stat_object(bucket, "a/one.txt")
    assert err.value.code == "NoSuchKey"
    assert sorted(o.object_name for o in client.list_objects(bucket, recursive=True)) == [
        "a/two.txt",
        "b/three.bin",
    ]


def test_multipart_50mb_roundtrip(minio: MinioBucket) -> None:
    size, part_size = 50 * MiB, 8 * MiB
    data = os.urandom(size)
    digest = hashlib.sha256(data).hexdigest()

    minio.client.put_object(minio.bucket, "big/blob.bin", io.BytesIO(data), size, part_size=part_size)

    stat = minio.client.stat_object(minio.bucket, "big/blob.bin")
    assert stat.size == size
    parts = -(-size // part_size)
    assert stat.etag is not None and stat.etag.endswith(f"-{parts}"), (
        f"not a {parts}-part upload: {stat.etag}"
    )

    h = hashlib.sha256()
    resp = minio.client.get_object(minio.bucket, "big/blob.bin")
    try:
        for chunk in resp.stream(1 * MiB):
            h.update(chunk)
    finally:
        resp.close()
        resp.release_conn()
    assert h.hexdigest() == digest

    # A ranged read from the middle of a part boundary comes back exact.
    offset = part_size - 100
    resp = minio.client.get_object(minio.bucket, "big/blob.bin", offset=offset, length=200)
    try:
        assert resp.read() == data[offset : offset + 200]
    finally:
        resp.close()
        resp.release_conn()


def test_presigned_get_url(minio: MinioBucket) -> None:
    data = os.urandom(100_000)
    minio.client.put_object(minio.bucket, "shared/file.bin", io.BytesIO(data), len(data))

    # Without a signature the object is private.
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{minio.url}/{minio.bucket}/shared/file.bin", timeout=10)
    assert err.value.code == 403

    url = minio.client.presigned_get_object(minio.bucket, "shared/file.bin", expires=timedelta(minutes=5))
    assert "X-Amz-Signature=" in url
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.read() == data

    # Tampering with the signed URL is rejected.
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url.replace("shared/file.bin", "shared/other.bin"), timeout=10)
    assert err.value.code == 403


def test_buckets_are_isolated(minio: MinioBucket, minio_server: MinioServer) -> None:
    assert minio.client.bucket_exists(minio.bucket)
    assert list(minio.client.list_objects(minio.bucket, recursive=True)) == []
    assert minio.endpoint == minio_server.endpoint


def test_start_failure_reports_log_tail(testbin_dir: Path, tmp_path: Path) -> None:
    """A service that cannot start fails fast with its own log in the error, and leaves nothing running."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = ManagedProcess(
            "minio",
            [testbin_dir / "minio", "server", tmp_path / "data", "--address", f"127.0.0.1:{port}"],
            log_path=tmp_path / "minio.log",
            env={**os.environ, "MINIO_ROOT_USER": "echorl-test", "MINIO_ROOT_PASSWORD": "echorl-test-secret"},
        ).start()
        try:
            with pytest.raises(ServiceError) as err:
                proc.wait_healthy(lambda: False, timeout=60)
        finally:
            proc.stop()
    message = str(err.value)
    assert "exited before becoming healthy" in message
    assert str(tmp_path / "minio.log") in message
    assert "already in use" in message.split("--- last lines of the log ---", 1)[1]  # minio's own words
    assert not proc.running() and proc not in live_processes()
