"""A real MinIO server on loopback for the test suite.

:func:`start_minio` runs ``minio server <datadir> --address 127.0.0.1:<port> --console-address
127.0.0.1:<port>`` with fixed root credentials and waits for ``/minio/health/live``. The server
is single-drive ("FS"-like) mode, which supports everything Echo uses: buckets, multipart uploads,
presigned URLs, listing and stat.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from services.procs import ManagedProcess, free_ports

if TYPE_CHECKING:
    from minio import Minio

ACCESS_KEY = "echorl-test"
SECRET_KEY = "echorl-test-secret-key"  # MinIO wants at least 8 characters
START_TIMEOUT_S = 60.0


@dataclass
class MinioServer:
    """A running MinIO server. ``endpoint`` is ``host:port`` as the ``minio`` SDK expects."""

    endpoint: str
    access_key: str
    secret_key: str
    data_dir: Path
    process: ManagedProcess
    console_endpoint: str
    startup_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def secure(self) -> bool:
        return False

    def client(self) -> Minio:
        """A new ``minio.Minio`` client with the root credentials."""
        from minio import Minio

        return Minio(self.endpoint, access_key=self.access_key, secret_key=self.secret_key, secure=False)

    def env(self) -> dict[str, str]:
        """Environment variables an S3 client (boto3, the AWS CLI, Echo's runtime) would read."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.url,
            "AWS_REGION": "us-east-1",
        }

    def stop(self) -> None:
        self.process.stop()


@dataclass
class MinioBucket:
    """A fresh bucket on the session's server, with a client. Emptied and removed after the test."""

    server: MinioServer
    bucket: str
    client: Minio = field(repr=False)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def access_key(self) -> str:
        return self.server.access_key

    @property
    def secret_key(self) -> str:
        return self.server.secret_key

    @property
    def url(self) -> str:
        return self.server.url


def _live(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except urllib.error.URLError:
        return False


def start_minio(bin_dir: Path, workdir: Path, timeout: float = START_TIMEOUT_S) -> MinioServer:
    """Start ``minio`` from ``bin_dir`` with its data and log under ``workdir``; wait until live."""
    data_dir = workdir / "data"
    certs_dir = workdir / "certs"  # keeps MinIO from creating ~/.minio/certs
    data_dir.mkdir(parents=True, exist_ok=True)
    certs_dir.mkdir(parents=True, exist_ok=True)
    port, console_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINIO_", "AWS_")) and k != "HTTP_PROXY"}
    env.update(
        MINIO_ROOT_USER=ACCESS_KEY,
        MINIO_ROOT_PASSWORD=SECRET_KEY,
        MINIO_UPDATE="off",
        MINIO_CI_CD="1",  # no "drive is on the root disk" refusal, no update checks
        HOME=str(workdir),
    )
    proc = ManagedProcess(
        "minio",
        [
            bin_dir / "minio",
            "server",
            data_dir,
            "--address",
            f"127.0.0.1:{port}",
            "--console-address",
            f"127.0.0.1:{console_port}",
            "--certs-dir",
            certs_dir,
            "--quiet",
        ],
        log_path=workdir / "minio.log",
        env=env,
    ).start()
    try:
        startup = proc.wait_healthy(lambda: _live(f"http://127.0.0.1:{port}/minio/health/live"), timeout)
    except BaseException:
        proc.stop()
        raise
    return MinioServer(
        endpoint=f"127.0.0.1:{port}",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        data_dir=data_dir,
        process=proc,
        console_endpoint=f"127.0.0.1:{console_port}",
        startup_s=startup,
    )


def bucket_name(hint: str) -> str:
    """A valid, unique S3 bucket name (3-63 chars of ``[a-z0-9-]``) derived from ``hint``."""
    stem = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:40].strip("-") or "test"
    return f"{stem}-{uuid.uuid4().hex[:12]}"


def empty_and_remove_bucket(client: Minio, bucket: str) -> None:
    """Delete every object (all versions) in ``bucket``, then the bucket itself."""
    from minio.deleteobjects import DeleteObject

    if not client.bucket_exists(bucket):
        return
    to_delete = [
        DeleteObject(o.object_name, o.version_id)
        for o in client.list_objects(bucket, recursive=True, include_version=True)
        if o.object_name is not None
    ]
    if to_delete:
        errors = list(client.remove_objects(bucket, to_delete))
        if errors:
            raise RuntimeError(f"could not empty bucket {bucket}: {errors[:3]}")
    for upload in _incomplete_uploads(client, bucket):
        client._abort_multipart_upload(bucket, upload[0], upload[1])
    client.remove_bucket(bucket)


def _incomplete_uploads(client: Minio, bucket: str) -> list[tuple[str, str]]:
    """Multipart uploads left open (a test that failed mid-upload), as ``(object, upload_id)``."""
    try:
        result = client._list_multipart_uploads(bucket)
    except Exception:
        return []
    return [(u.object_name, u.upload_id) for u in result.uploads if u.object_name and u.upload_id]
