"""S3-only behaviour against the real MinIO: errors a user can act on, retries, bucket creation.

Each failure mode (wrong credentials, missing bucket, unreachable endpoint) must surface as its own
error class with a message that names the endpoint or bucket and says what to check; transient
network failures must be retried with backoff and then succeed.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from snapshots_testing import Target, write_payload

from echo_runtime.snapshots import errors, open_store, retry, s3
from echo_runtime.spec import Storage
from services.minio import MinioBucket
from services.procs import free_ports
from services.relay import Relay

pytestmark = pytest.mark.services


def _target(minio: MinioBucket) -> Target:
    return Target.of_bucket(minio)


def test_open_store_reads_credentials_from_the_environment(
    minio: MinioBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ECHORL_S3_ACCESS_KEY", minio.access_key)
    monkeypatch.setenv("ECHORL_S3_SECRET_KEY", minio.secret_key)
    storage = Storage(type="S3", endpoint=minio.url, bucket=minio.bucket, prefix="runs")
    store = open_store(storage, "job")
    store.check()
    store.publish(0, write_payload(tmp_path / "src", 0, [10]), kind="lora", base_model="m")
    assert [o.object_name for o in minio.client.list_objects(minio.bucket, "runs/job/snapshots/0/")]
    assert store.latest_version() == 0


def test_wrong_credentials(minio: MinioBucket, monkeypatch: pytest.MonkeyPatch) -> None:
    for creds, code in [
        ((minio.access_key, "not-the-secret"), "SignatureDoesNotMatch"),
        (("nobody", "whatever-secret"), "InvalidAccessKeyId"),
    ]:
        store = _target(minio).open(credentials=creds)
        with pytest.raises(errors.StoreAuthError) as exc:
            store.latest_version()
        message = str(exc.value)
        assert code in message and minio.url in message and minio.bucket in message
        assert "given by the caller" in message
    monkeypatch.setenv("ECHORL_S3_ACCESS_KEY", "nobody")
    monkeypatch.setenv("ECHORL_S3_SECRET_KEY", "whatever-secret")
    store = open_store(Storage(type="S3", endpoint=minio.url, bucket=minio.bucket), "job")
    with pytest.raises(errors.StoreAuthError, match=r"\$ECHORL_S3_ACCESS_KEY/\$ECHORL_S3_SECRET_KEY"):
        store.check()


def test_missing_bucket(minio: MinioBucket, tmp_path: Path) -> None:
    target = Target(
        "s3",
        endpoint=minio.endpoint,
        bucket=f"{minio.bucket}-absent",
        access_key=minio.access_key,
        secret_key=minio.secret_key,
    )
    store = target.open()
    for action in (
        store.check,
        store.latest_version,
        store.versions,
        lambda: store.publish(1, write_payload(tmp_path / "s", 1, [5]), kind="lora", base_model="m"),
    ):
        with pytest.raises(errors.BucketNotFoundError, match=rf"bucket '{target.bucket}' does not exist on"):
            action()


def test_create_bucket_on_open(minio: MinioBucket) -> None:
    name = f"{minio.bucket}-new"
    storage = Storage(type="S3", endpoint=minio.url, bucket=name)
    try:
        store = open_store(
            storage, "job", credentials=(minio.access_key, minio.secret_key), create_bucket=True
        )
        store.check()
        assert minio.client.bucket_exists(name)
        open_store(storage, "job", credentials=(minio.access_key, minio.secret_key), create_bucket=True)
    finally:
        if minio.client.bucket_exists(name):
            minio.client.remove_bucket(name)


def test_unreachable_endpoint_fails_after_backoff(caplog: pytest.LogCaptureFixture) -> None:
    (port,) = free_ports(1)  # nothing listens there
    backoff = retry.Backoff(attempts=4, base_s=0.05, max_s=0.2)
    store = Target(
        "s3", endpoint=f"127.0.0.1:{port}", bucket="bucket", access_key="a", secret_key="b" * 8
    ).open(backoff=backoff)
    caplog.set_level(logging.WARNING, "echo_runtime.snapshots")
    start = time.monotonic()
    with pytest.raises(errors.StoreUnavailableError) as exc:
        store.latest_version()
    assert time.monotonic() - start < 5
    message = str(exc.value)
    assert f"cannot reach the S3 endpoint http://127.0.0.1:{port}" in message
    assert "connection refused" in message and "4 attempt(s)" in message and "storage.endpoint" in message
    assert sum("retrying in" in r.message for r in caplog.records) == 3


def test_transient_network_errors_are_retried(
    minio: MinioBucket, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = _target(minio)
    target.open().publish(
        1, write_payload(tmp_path / "src", 1, [3000, 6 * 1024 * 1024]), kind="full", base_model="m"
    )
    proxy = Relay(minio.endpoint, drop=2)
    try:
        store = target.open(
            endpoint=f"http://{proxy.endpoint}", backoff=retry.Backoff(attempts=4, base_s=0.01, max_s=0.05)
        )
        caplog.set_level(logging.WARNING, "echo_runtime.snapshots")
        assert store.latest_version() == 1
        path = store.fetch(1, tmp_path / "cache")
        assert (path / "part-0.bin").stat().st_size == 3000
        store.publish(2, tmp_path / "src", kind="full", base_model="m")
    finally:
        proxy.close()
    assert proxy.dropped == 2
    assert sum("retrying in" in r.message for r in caplog.records) >= 1


def test_endpoint_forms() -> None:
    assert s3.parse_endpoint("minio:9000", secure=False) == ("minio:9000", False)
    assert s3.parse_endpoint("http://minio:9000", secure=True) == ("minio:9000", False)
    assert s3.parse_endpoint("https://s3.amazonaws.com/", secure=False) == ("s3.amazonaws.com", True)
    with pytest.raises(ValueError, match="without a path"):
        s3.parse_endpoint("http://minio:9000/bucket", secure=False)


def test_credentials_from_env() -> None:
    assert s3.credentials_from_env({})[0] is None
    creds, source = s3.credentials_from_env({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"})
    assert creds == s3.Credentials("a", "s") and "AWS_ACCESS_KEY_ID" in source
    creds, _ = s3.credentials_from_env(
        {
            "ECHORL_S3_ACCESS_KEY": "e",
            "ECHORL_S3_SECRET_KEY": "hush-hush",
            "AWS_ACCESS_KEY_ID": "a",
            "AWS_SECRET_ACCESS_KEY": "s",
        }
    )
    assert creds is not None and creds.access_key == "e"
    assert "hush" not in repr(creds)  # secrets stay out of logs and tracebacks
    with pytest.raises(errors.StoreAuthError, match="ECHORL_S3_SECRET_KEY is not"):
        s3.credentials_from_env({"ECHORL_S3_ACCESS_KEY": "e"})


def test_ranged_downloads_hash_every_byte_in_order(minio: MinioBucket, tmp_path: Path) -> None:
    """Parts arrive out of order and the hash trails them; every repetition must verify."""
    import hashlib
    import os

    data = os.urandom(26 * 1024 * 1024 + 12345)
    (tmp_path / "big.bin").write_bytes(data)
    store = _target(minio).blobs()
    digest = store.upload("big.bin", tmp_path / "big.bin")
    assert digest.sha256 == hashlib.sha256(data).hexdigest() and digest.size == len(data)
    for i in range(6):
        got = store.download("big.bin", tmp_path / f"copy{i}", len(data))
        assert got == digest
        assert (tmp_path / f"copy{i}").read_bytes() == data
