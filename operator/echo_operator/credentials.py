"""Storage credentials: who gets which keys to the snapshot store, and the store's setup and cleanup.

The coordinator and the trainer use the job's own credentials (``spec.storage.credentialsSecret``,
keys ``accessKey``/``secretKey``). Inference pods only read snapshots, so they get read-only ones,
decided by :func:`wiring` in this order: keys ``readOnlyAccessKey``/``readOnlySecretKey`` in the
credentials Secret; the ``<job>-storage-readonly`` Secret the operator issued before; a MinIO service
account the operator issues now (:func:`issue_readonly`, once the children exist); or, where the store
cannot issue one, the job's own pair (said in a ``ReadOnlyCredentialsUnavailable`` Event).

:func:`wire_storage` also ensures the bucket and the job's prefix marker, once per storage setting
(:func:`fingerprint`). :func:`cleanup` is the external cleanup behind the finalizer
(:func:`needs_cleanup`): revoke the service account, and empty the prefix under ``deletePolicy: Delete``.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import Any

import pydantic

from echo_operator import context, names, storage
from echo_operator.children import inputs
from echo_runtime import spec
from echo_runtime.snapshots import errors as store_errors

Object = dict[str, Any]
GV = spec.GROUP_VERSION
KEYS = ("accessKey", "secretKey")
READONLY_KEYS = ("readOnlyAccessKey", "readOnlySecretKey")


def needs_cleanup(body: Mapping[str, Any]) -> bool:
    """Whether deleting the job needs external cleanup (and so a finalizer).

    Only for S3 storage, and only if the prefix is to be deleted or the operator issued read-only
    credentials there; everything else the job owns is removed by owner references.
    """
    store = body.get("spec", {}).get("storage", {}) or {}
    if store.get("type") != "S3":
        return False
    annotations = body.get("metadata", {}).get("annotations", {}) or {}
    return store.get("deletePolicy") == "Delete" or names.READONLY_ACCOUNT in annotations


def credentials_problem(secret: str, namespace: str, data: Mapping[str, str] | None) -> str | None:
    """What is wrong with the credentials Secret ``secret`` holding ``data`` (None: it is usable)."""
    if data is None:
        return (
            f"Secret {secret!r} (spec.storage.credentialsSecret) not found in namespace {namespace}; "
            "create it with keys accessKey and secretKey"
        )
    absent = [k for k in KEYS if not data.get(k)]
    if absent:
        return f"Secret {secret!r} has no key(s) {', '.join(absent)}"
    return None


def usable(data: Mapping[str, str] | None) -> storage.Credentials | None:
    """The job's credentials in ``data``, None unless both keys are there."""
    if not data or not all(data.get(k) for k in KEYS):
        return None
    return storage.Credentials(data["accessKey"], data["secretKey"])


def fingerprint(uid: str, store: spec.Storage, creds: storage.Credentials | None) -> str:
    """What the bucket and the marker were ensured for: a change of any of it ensures them again."""
    return f"{uid}:{store.model_dump_json()}:{creds.access_key if creds else ''}"


def wiring(
    store: spec.Storage,
    data: Mapping[str, str],
    job: str,
    issued_before: bool,
    creds: storage.Credentials | None,
    readonly_unsupported: bool,
) -> tuple[inputs.StoreWiring, storage.Credentials | None]:
    """How the pods get their credentials, and the credentials to issue read-only ones with (if due).

    ``data`` is the credentials Secret's content, ``issued_before`` whether the job's read-only
    Secret exists, ``readonly_unsupported`` whether the store already refused to issue one.
    """
    base = inputs.StoreWiring(secret=store.credentials_secret)
    if all(k in data for k in READONLY_KEYS):
        return dataclasses.replace(
            base,
            readonly_secret=store.credentials_secret,
            readonly_access_key=READONLY_KEYS[0],
            readonly_secret_key=READONLY_KEYS[1],
        ), None
    if issued_before:
        return dataclasses.replace(base, readonly_secret=names.readonly_secret(job)), None
    if creds is None or readonly_unsupported:
        return base, None
    return dataclasses.replace(base, readonly_secret=names.readonly_secret(job)), creds


def readonly_secret(job: str, namespace: str, owner: Object, issued: storage.Credentials) -> Object:
    """The ``<job>-storage-readonly`` Secret holding an issued read-only key pair."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.readonly_secret(job),
            "namespace": namespace,
            "labels": names.labels(job, "storage"),
            "ownerReferences": [owner],
        },
        "type": "Opaque",
        "data": {
            "accessKey": base64.b64encode(issued.access_key.encode()).decode(),
            "secretKey": base64.b64encode(issued.secret_key.encode()).decode(),
        },
    }


# -- I/O -------------------------------------------------------------------------------------------


def secret_data(ctx: context.Context, namespace: str, name: str) -> dict[str, str] | None:
    """A Secret's data, decoded (None if there is no such Secret)."""
    secret = ctx.kube.get("v1", "Secret", namespace, name)
    if secret is None:
        return None
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def wire_storage(
    ctx: context.Context,
    body: Mapping[str, Any],
    model: spec.EchoJob,
    mem: context.JobMemory,
    existing: Mapping[tuple[str, str], Object],
) -> tuple[inputs.StoreWiring, storage.Credentials | None]:
    """:func:`wiring` for the job as stored; ensures the bucket and the prefix marker on the way."""
    store = model.spec.storage
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    if store.type != "S3":
        raise ctx.fault(body, "StorageNotShared", "spec.storage.type must be S3 in a cluster")
    creds: storage.Credentials | None = None
    data: dict[str, str] = {}
    if store.credentials_secret:
        found = secret_data(ctx, namespace, store.credentials_secret)
        wrong = credentials_problem(store.credentials_secret, namespace, found)
        if wrong is not None:
            raise ctx.fault(body, "StorageCredentialsMissing", wrong)
        data = found or {}
        creds = usable(found)
    wanted = fingerprint(uid, store, creds)
    if mem.storage_ready != wanted:
        try:
            written = storage.ensure_job_root(
                store, creds, name, {"namespace": namespace, "name": name, "uid": uid}
            )
        except (store_errors.SnapshotError, ValueError) as exc:
            raise ctx.fault(body, "StorageUnavailable", f"snapshot store: {exc}") from None
        mem.storage_ready = wanted
        if written:
            root = storage.job_root(store, name)
            ctx.events.post(
                body, "Normal", "StorageReady", f"bucket {store.bucket!r} ready; job prefix {root}/"
            )
    issued_before = ("Secret", names.readonly_secret(name)) in existing
    return wiring(store, data, name, issued_before, creds, mem.readonly_unsupported is not None)


def issue_readonly(
    ctx: context.Context, body: Mapping[str, Any], store: spec.Storage, creds: storage.Credentials
) -> bool:
    """Create the read-only service account and its Secret; False if the store cannot."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    mem = ctx.memory(namespace, name)
    access_key = storage.readonly_access_key(uid)
    # Annotate first: the annotation is what makes the finalizer (and so the revocation) happen.
    ctx.kube.merge_patch(
        GV, "EchoJob", namespace, name, {"metadata": {"annotations": {names.READONLY_ACCOUNT: access_key}}}
    )
    try:
        issued = storage.issue_readonly(store, creds, name, uid)
    except storage.ReadOnlyUnsupported as exc:
        mem.readonly_unsupported = str(exc)
        ctx.kube.merge_patch(
            GV, "EchoJob", namespace, name, {"metadata": {"annotations": {names.READONLY_ACCOUNT: None}}}
        )
        ctx.events.post(
            body,
            "Warning",
            "ReadOnlyCredentialsUnavailable",
            f"inference pods get the job's own storage credentials: {exc}. Add readOnlyAccessKey and "
            f"readOnlySecretKey to Secret {store.credentials_secret!r} to give them read-only ones",
        )
        return False
    ctx.kube.apply(readonly_secret(name, namespace, context.owner(body), issued))
    ctx.events.post(
        body,
        "Normal",
        "ReadOnlyCredentialsIssued",
        f"MinIO service account {issued.access_key} may only read {storage.job_root(store, name)}/; "
        f"inference pods use it (Secret {names.readonly_secret(name)})",
    )
    return True


def cleanup(ctx: context.Context, body: Mapping[str, Any]) -> None:
    """External cleanup before the job goes: revoke read-only credentials, delete the prefix if asked."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        store = spec.Storage.model_validate((body.get("spec") or {}).get("storage") or {})
    except pydantic.ValidationError:
        return
    creds: storage.Credentials | None = None
    if store.credentials_secret:
        creds = usable(secret_data(ctx, namespace, store.credentials_secret))
        if creds is None:
            ctx.events.post(
                body,
                "Warning",
                "CleanupSkipped",
                f"Secret {store.credentials_secret!r} is gone: cannot clean up "
                f"{storage.job_root(store, name)}/ on the store; remove it by hand if needed",
            )
            return
    access_key = (meta.get("annotations") or {}).get(names.READONLY_ACCOUNT)
    if access_key:
        storage.revoke_readonly(store, creds, access_key)
        ctx.events.post(
            body, "Normal", "ReadOnlyCredentialsRevoked", f"deleted MinIO service account {access_key}"
        )
    if store.delete_policy == "Delete":
        count = storage.delete_job_data(store, creds, name)
        ctx.events.post(
            body,
            "Normal",
            "SnapshotsDeleted",
            f"deleted {count} object(s) under {storage.job_root(store, name)}/ (deletePolicy: Delete)",
        )
