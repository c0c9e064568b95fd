"""Storage wiring: the job's bucket and prefix in S3/MinIO, and read-only credentials for inference pods.

The snapshot layout (``<prefix>/<job>/snapshots/...``) and the S3 client setup come from
:mod:`echo_runtime.snapshots` so the operator and the processes agree on every key. What only the
operator does lives here:

* :func:`ensure_job_root` creates the bucket if missing and writes ``<prefix>/<job>/job.json`` (who
  owns the prefix: namespace, name, uid), so an operator-made prefix is visible before the first
  snapshot and a second job pointed at the same prefix can be detected;
* :func:`issue_readonly` asks MinIO for a service account limited to reading the job's prefix (inference
  workers only fetch snapshots). Stores without MinIO's admin API (AWS S3, ...) raise
  :class:`ReadOnlyUnsupported` and the caller falls back to the job's own credentials, saying so;
* :func:`revoke_readonly` and :func:`delete_job_data` are the external cleanup behind the EchoJob's
  finalizer (only set when there is something to clean: a service account, or ``deletePolicy: Delete``);
* :func:`progress` reads the newest published version and checkpoint: a job has Succeeded only once
  both reached ``maxSteps``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
from typing import Any

import certifi
import urllib3
from minio import MinioAdmin
from minio.credentials.providers import StaticProvider
from minio.error import MinioAdminException

from echo_runtime import spec
from echo_runtime.snapshots import layout, retry, s3
from echo_runtime.snapshots import store as snapshot_store

MARKER = "job.json"
# The operator retries on its own schedule (the next reconcile), so one quick retry here is enough
# and a dead store never holds a reconcile for long.
BACKOFF = retry.Backoff(attempts=2, base_s=0.2, max_s=1.0)
TUNING = s3.Tuning(connect_timeout_s=3.0, read_timeout_s=30.0)


@dataclasses.dataclass(frozen=True)
class Credentials:
    """An S3 access key pair."""

    access_key: str
    secret_key: str = dataclasses.field(repr=False)


class ReadOnlyUnsupported(Exception):
    """The store cannot issue restricted credentials (no MinIO admin API, or not allowed)."""


def job_root(storage: spec.Storage, job: str) -> str:
    """``<prefix>/<job>``: every key of the job lives below it."""
    return layout.Layout(storage.prefix, job).root


def _blobs(storage: spec.Storage, creds: Credentials | None, create_bucket: bool = False) -> s3.S3Blobs:
    if storage.endpoint is None or storage.bucket is None:
        raise ValueError("storage: endpoint and bucket are required for S3")
    pair = (creds.access_key, creds.secret_key) if creds else None
    return s3.connect(
        storage.endpoint,
        storage.bucket,
        secure=storage.secure,
        region=storage.region,
        credentials=pair,
        backoff=BACKOFF,
        tuning=TUNING,
        create_bucket=create_bucket,
    )


def ensure_job_root(
    storage: spec.Storage, creds: Credentials | None, job: str, owner: dict[str, str]
) -> bool:
    """Create the bucket if missing and the prefix marker if absent; True if the marker was written now.

    Raises :class:`echo_runtime.snapshots.errors.SnapshotError` (with the endpoint and what to check)
    when the store is unreachable or refuses the credentials.
    """
    store = _blobs(storage, creds, create_bucket=True)
    marker = layout.join(job_root(storage, job), MARKER)
    if store.exists(marker):
        return False
    store.put(marker, json.dumps(owner, sort_keys=True).encode())
    return True


def read_marker(storage: spec.Storage, creds: Credentials | None, job: str) -> dict[str, Any] | None:
    data = _blobs(storage, creds).get(layout.join(job_root(storage, job), MARKER))
    return None if data is None else dict(json.loads(data))


def delete_job_data(storage: spec.Storage, creds: Credentials | None, job: str) -> int:
    """Delete every object under ``<prefix>/<job>/``; returns how many there were."""
    store = _blobs(storage, creds)
    keys = [info.key for info in store.list(job_root(storage, job) + "/")]
    if keys:
        store.delete(keys)
    return len(keys)


def readonly_policy(bucket: str, root: str) -> dict[str, Any]:
    """IAM policy: list and get objects under ``root/`` of ``bucket``; write only reader pins.

    Readers pin the versions they use (``root/pins/``) so retention keeps them; without write access
    there, a pin is refused and gc could remove a version a worker is loading.
    """
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{root}/*"],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:DeleteObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{root}/pins/*"],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{root}/*", root]}},
            },
            {"Effect": "Allow", "Action": ["s3:GetBucketLocation"], "Resource": [f"arn:aws:s3:::{bucket}"]},
        ],
    }


def readonly_access_key(uid: str) -> str:
    """The service account's access key: derived from the job's uid, so a retry finds its own."""
    return "echorl" + hashlib.sha256(uid.encode()).hexdigest()[:14]


def _admin(storage: spec.Storage, creds: Credentials) -> MinioAdmin:
    if storage.endpoint is None:
        raise ValueError("storage: endpoint is required for S3")
    host, tls = s3.parse_endpoint(storage.endpoint, storage.secure)
    return MinioAdmin(
        endpoint=host,
        credentials=StaticProvider(creds.access_key, creds.secret_key),
        region=storage.region or "",
        secure=tls,
        http_client=urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=TUNING.connect_timeout_s, read=TUNING.read_timeout_s),
            retries=urllib3.Retry(total=1, backoff_factor=0.2),
            cert_reqs="CERT_REQUIRED",
            ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        ),
    )


def issue_readonly(storage: spec.Storage, creds: Credentials | None, job: str, uid: str) -> Credentials:
    """Create a MinIO service account that can only read the job's prefix, and return its keys.

    Idempotent over retries: a leftover account with the job's access key is replaced (its secret
    was never stored). Raises :class:`ReadOnlyUnsupported` if the store has no such API for us.
    """
    if creds is None or storage.bucket is None:
        raise ReadOnlyUnsupported("no credentials to derive restricted ones from")
    admin = _admin(storage, creds)
    access_key = readonly_access_key(uid)
    secret_key = secrets.token_urlsafe(30)
    policy = readonly_policy(storage.bucket, job_root(storage, job))
    try:
        with contextlib.suppress(MinioAdminException):  # not there: the usual case
            admin.delete_service_account(access_key)
        admin.add_service_account(
            access_key=access_key,
            secret_key=secret_key,
            name=f"echorl-{job}"[:32],
            description=f"Echo: read-only snapshots of job {job} (uid {uid})",
            policy=policy,
        )
    except MinioAdminException as exc:
        raise ReadOnlyUnsupported(f"the store refused to create a service account: {exc}") from exc
    except Exception as exc:  # the SDK raises plain errors for non-MinIO replies (AWS S3: 403/404 HTML)
        raise ReadOnlyUnsupported(f"the store has no MinIO admin API: {exc}") from exc
    return Credentials(access_key, secret_key)


def revoke_readonly(storage: spec.Storage, creds: Credentials | None, access_key: str) -> bool:
    """Delete the job's service account; True if it existed."""
    if creds is None:
        return False
    try:
        _admin(storage, creds).delete_service_account(access_key)
    except MinioAdminException as exc:
        if "not found" in str(exc).lower() or "404" in str(exc):
            return False
        raise
    return True


def progress(storage: spec.Storage, creds: Credentials | None, job: str) -> tuple[int | None, int | None]:
    """(newest published policy version, newest checkpoint) of ``job``; None where there is none yet."""
    pair = (creds.access_key, creds.secret_key) if creds else None
    found = snapshot_store.open_store(storage, job, credentials=pair, backoff=BACKOFF)
    return found.latest_version(), found.latest_checkpoint()
