"""The reconciler: the I/O shell around the pure modules, one EchoJob at a time.

:meth:`Reconciler.reconcile` resolves the job's references, wires storage (bucket, prefix marker,
read-only credentials), makes sure every join token exists, server-side-applies the children that
:func:`echo_operator.children.desired` computes, deletes children the job no longer needs, and
writes ``status``. :meth:`Reconciler.observe` is the status pass the operator runs on a timer: it
reads the coordinator, decides which pools cannot keep up with Δmax (:mod:`echo_operator.pool_lag`),
restarts stuck worker pods, follows the trainer Job through the job's life (:mod:`echo_operator.lifecycle`:
Succeeded, a gang restart, Failed), and writes ``status`` and its conditions, posting an Event for every
condition that changes. Both are idempotent and safe to run at any time; a per-job lock serialises them.

Problems a user can fix (a missing reference, a missing credentials Secret, an unreachable store) are
reported in ``status`` and as Events and end the pass; transient API failures raise :class:`KubeError`
for the caller (kopf) to retry.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import logging
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pydantic

from echo_operator import children, conditions, lifecycle, names, observe, pool_lag, storage
from echo_operator import status as status_mod
from echo_operator.config import Settings
from echo_operator.kube import Kube, KubeError
from echo_runtime import spec
from echo_runtime.coordinator import wire
from echo_runtime.snapshots import errors as store_errors

Object = dict[str, Any]
GV = spec.GROUP_VERSION
log = logging.getLogger("echo_operator")

CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
)
REF_FIELDS = {"SyncPolicy": "syncPolicyRef", "TrainingSwarm": "trainingSwarmRef"}


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


@dataclasses.dataclass
class JobMemory:
    """What the operator remembers about one job between passes (lost on restart, rebuilt by them)."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    job: children.JobInput | None = None
    problems: tuple[status_mod.Problem, ...] = ()
    trainer_token: str | None = None
    storage_ready: str | None = None
    """Fingerprint of the storage settings whose bucket and marker were last ensured."""
    readonly_unsupported: str | None = None
    """Why the store could not issue read-only credentials (asked once per operator run)."""
    doc: wire.StatusDocument | None = None
    doc_error: str | None = None
    behind_since: dict[str, float] = dataclasses.field(default_factory=dict)
    behind: dict[str, pool_lag.PoolLag] = dataclasses.field(default_factory=dict)
    """Pools that cannot keep up, as of the last status pass."""
    restarted: dict[str, float] = dataclasses.field(default_factory=dict)
    outcome: lifecycle.Outcome | None = None
    """How the job ended, once it did (also read back from ``status`` after an operator restart)."""
    final_version: int | None = None
    restarts: int | None = None
    """``status.restarts`` as last written (None: read it from the job's status)."""
    counted_jobs: set[str] = dataclasses.field(default_factory=set)
    """UIDs of failed trainer Jobs already acted on (their deletion takes a moment)."""
    store_credentials: storage.Credentials | None = None


class Problems(Exception):
    def __init__(self, problems: Sequence[status_mod.Problem]) -> None:
        super().__init__("; ".join(p.message for p in problems))
        self.problems = tuple(problems)


class Reconciler:
    """Reconciles EchoJobs through a :class:`Kube`; one instance per operator process."""

    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.kube = kube
        self.settings = settings
        self._memory: dict[tuple[str, str], JobMemory] = {}
        self._memory_lock = threading.Lock()
        self._instance = socket.gethostname()

    def memory(self, namespace: str, name: str) -> JobMemory:
        with self._memory_lock:
            return self._memory.setdefault((namespace, name), JobMemory())

    def forget(self, namespace: str, name: str) -> None:
        with self._memory_lock:
            self._memory.pop((namespace, name), None)

    # =============================================================================================
    # Reconcile

    def reconcile(self, body: Mapping[str, Any]) -> children.JobInput | None:
        """Bring the job's children in line with its spec; returns the resolved input (None on problems)."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        mem = self.memory(namespace, name)
        with mem.lock:
            try:
                job = self._reconcile(body, mem)
            except Problems as exc:
                mem.job, mem.problems = None, exc.problems
                job = None
            else:
                mem.job, mem.problems = job, ()
            self._write_status(body, mem, fetch=False)
            return job

    def _reconcile(self, body: Mapping[str, Any], mem: JobMemory) -> children.JobInput:
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        try:
            model = spec.EchoJob.model_validate(
                {
                    "apiVersion": GV,
                    "kind": "EchoJob",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": body.get("spec") or {},
                }
            )
        except pydantic.ValidationError as exc:
            raise self._problem(body, "InvalidSpec", f"spec is invalid: {exc}") from None
        resolved = self._resolve(body, model)
        existing = self._existing_children(namespace, name, uid)
        outcome = mem.outcome or lifecycle.outcome_of(body.get("status"))
        mem.outcome = outcome
        if lifecycle.expired(outcome, model.spec.ttl_seconds_after_finished, _now()):
            return self._release(body, resolved, existing)
        store, issue = self._wire_storage(body, model, mem, existing)
        owner = self._owner(body)
        external_url = self._external_url(body, namespace, name, existing)
        roles = ["trainer", *(p for p, _ in resolved.inference_pools)]
        external_roles = {p for p, s in resolved.inference_pools if s.external}
        tokens = self._ensure_tokens(body, owner, roles, external_roles, external_url, existing)
        mem.trainer_token = tokens["trainer"]
        digests = {role: hashlib.sha256(token.encode()).hexdigest() for role, token in tokens.items()}
        job = dataclasses.replace(
            children.JobInput.from_resolved(resolved, uid, digests, store), finished=outcome is not None
        )
        self._apply_children(body, job, existing)
        if issue is not None:
            # Issuing a MinIO service account takes most of a second: do it once the children exist
            # (pods wait for their Secret), and fall back to the job's own credentials if it fails.
            fallback = dataclasses.replace(store, readonly_secret=None)
            if not self._issue_readonly(body, model.spec.storage, issue):
                job = dataclasses.replace(job, store=fallback)
                self._apply_children(body, job, self._existing_children(namespace, name, uid))
        return job

    def _release(
        self, body: Mapping[str, Any], resolved: spec.ResolvedJob, existing: Mapping[tuple[str, str], Object]
    ) -> children.JobInput:
        """``ttlSecondsAfterFinished`` passed: delete every child; the EchoJob and its status stay."""
        meta = body["metadata"]
        for (kind, child), obj in existing.items():
            self.kube.delete(obj["apiVersion"], kind, meta["namespace"], child, uid=obj["metadata"]["uid"])
        if existing:
            ttl = (body.get("spec") or {}).get("ttlSecondsAfterFinished")
            self.event(
                body, "Normal", "ChildrenDeleted",
                _summary(f"ttlSecondsAfterFinished ({ttl} s) passed: deleted", [f"{k} {n}" for k, n in existing]),
            )  # fmt: skip
        job = children.JobInput.from_resolved(resolved, meta["uid"], {}, children.StoreWiring(secret=None))
        return dataclasses.replace(job, finished=True)

    def _sync_trainer(
        self, body: Mapping[str, Any], job: children.JobInput, wanted: Object, current: Object | None
    ) -> str | None:
        """Create the trainer Job if missing; replace it (every rank) when what it runs changed.

        Returns ``created`` or ``replaced`` when it did either. A Job being deleted is left to finish
        (Foreground: until its pods are gone), so two trainers never run at once.
        """
        phase = lifecycle.trainer_phase(current)
        if phase == "Terminating":
            return None
        if current is None:
            self.kube.apply(wanted)
            return "created"
        have = (current["metadata"].get("annotations") or {}).get(names.SPEC_HASH)
        if have != wanted["metadata"]["annotations"][names.SPEC_HASH]:
            self.kube.delete(
                "batch/v1", "Job", job.namespace, names.trainer(job.name),
                uid=current["metadata"]["uid"], propagation="Foreground",
            )  # fmt: skip
            self.event(
                body, "Normal", "TrainerRestarted",
                "the trainer's spec changed: every rank restarts together from the last checkpoint",
            )  # fmt: skip
            return "replaced"
        return None

    # -- references ------------------------------------------------------------------------------
    def _resolve(self, body: Mapping[str, Any], model: spec.EchoJob) -> spec.ResolvedJob:
        namespace = model.metadata.namespace
        others: list[spec.Manifest] = []
        missing: list[str] = []
        wanted: list[tuple[str, str]] = []
        if model.spec.sync_policy_ref:
            wanted.append(("SyncPolicy", model.spec.sync_policy_ref))
        if model.spec.training_swarm_ref:
            wanted.append(("TrainingSwarm", model.spec.training_swarm_ref))
        wanted += [("InferenceSwarm", p.swarm_ref) for p in model.spec.inference_swarms if p.swarm_ref]
        for kind, ref in dict.fromkeys(wanted):
            obj = self.kube.get(GV, kind, namespace, ref)
            if obj is None:
                missing.append(f"{kind} {ref!r}")
                continue
            others.append(
                spec.KINDS[kind].model_validate(
                    {
                        "apiVersion": GV,
                        "kind": kind,
                        "metadata": {"name": ref, "namespace": namespace},
                        "spec": obj.get("spec") or {},
                    }
                )
            )
        if missing:
            raise self._problem(
                body,
                "ReferenceNotFound",
                f"{', '.join(missing)} not found in namespace {namespace}; create it or fix the reference",
            )
        return spec.resolve(model, others)

    # -- storage ---------------------------------------------------------------------------------
    def _secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        secret = self.kube.get("v1", "Secret", namespace, name)
        if secret is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    def _wire_storage(
        self,
        body: Mapping[str, Any],
        model: spec.EchoJob,
        mem: JobMemory,
        existing: Mapping[tuple[str, str], Object],
    ) -> tuple[children.StoreWiring, storage.Credentials | None]:
        """How the pods get store credentials, and the credentials to issue read-only ones with (if due).

        Ensures the bucket and the prefix marker on the way (once per storage setting).
        """
        store = model.spec.storage
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if store.type != "S3":
            raise self._problem(body, "StorageNotShared", "spec.storage.type must be S3 in a cluster")
        creds: storage.Credentials | None = None
        data: dict[str, str] = {}
        if store.credentials_secret:
            found = self._secret_data(namespace, store.credentials_secret)
            if found is None:
                raise self._problem(
                    body,
                    "StorageCredentialsMissing",
                    f"Secret {store.credentials_secret!r} (spec.storage.credentialsSecret) not found in "
                    f"namespace {namespace}; create it with keys accessKey and secretKey",
                )
            absent = [k for k in ("accessKey", "secretKey") if not found.get(k)]
            if absent:
                raise self._problem(
                    body,
                    "StorageCredentialsMissing",
                    f"Secret {store.credentials_secret!r} has no key(s) {', '.join(absent)}",
                )
            data = found
            creds = storage.Credentials(found["accessKey"], found["secretKey"])
        fingerprint = f"{uid}:{store.model_dump_json()}:{creds.access_key if creds else ''}"
        if mem.storage_ready != fingerprint:
            try:
                written = storage.ensure_job_root(
                    store, creds, name, {"namespace": namespace, "name": name, "uid": uid}
                )
            except (store_errors.SnapshotError, ValueError) as exc:
                raise self._problem(body, "StorageUnavailable", f"snapshot store: {exc}") from None
            mem.storage_ready = fingerprint
            if written:
                root = storage.job_root(store, name)
                self.event(
                    body, "Normal", "StorageReady", f"bucket {store.bucket!r} ready; job prefix {root}/"
                )
        wiring = children.StoreWiring(secret=store.credentials_secret)
        if "readOnlyAccessKey" in data and "readOnlySecretKey" in data:
            return dataclasses.replace(
                wiring,
                readonly_secret=store.credentials_secret,
                readonly_access_key="readOnlyAccessKey",
                readonly_secret_key="readOnlySecretKey",
            ), None
        readonly_name = names.readonly_secret(name)
        if ("Secret", readonly_name) in existing:
            return dataclasses.replace(wiring, readonly_secret=readonly_name), None
        if creds is None or mem.readonly_unsupported is not None:
            return wiring, None
        return dataclasses.replace(wiring, readonly_secret=readonly_name), creds

    def _issue_readonly(
        self, body: Mapping[str, Any], store: spec.Storage, creds: storage.Credentials
    ) -> bool:
        """Create the read-only service account and its Secret; False if the store cannot."""
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        mem = self.memory(namespace, name)
        access_key = storage.readonly_access_key(uid)
        # Annotate first: the annotation is what makes the finalizer (and so the revocation) happen.
        self.kube.merge_patch(
            GV,
            "EchoJob",
            namespace,
            name,
            {"metadata": {"annotations": {names.READONLY_ACCOUNT: access_key}}},
        )
        try:
            issued = storage.issue_readonly(store, creds, name, uid)
        except storage.ReadOnlyUnsupported as exc:
            mem.readonly_unsupported = str(exc)
            self.kube.merge_patch(
                GV, "EchoJob", namespace, name, {"metadata": {"annotations": {names.READONLY_ACCOUNT: None}}}
            )
            self.event(
                body,
                "Warning",
                "ReadOnlyCredentialsUnavailable",
                f"inference pods get the job's own storage credentials: {exc}. Add readOnlyAccessKey and "
                f"readOnlySecretKey to Secret {store.credentials_secret!r} to give them read-only ones",
            )
            return False
        secret: Object = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": names.readonly_secret(name),
                "namespace": namespace,
                "labels": names.labels(name, "storage"),
                "ownerReferences": [self._owner(body)],
            },
            "type": "Opaque",
            "data": {
                "accessKey": base64.b64encode(issued.access_key.encode()).decode(),
                "secretKey": base64.b64encode(issued.secret_key.encode()).decode(),
            },
        }
        self.kube.apply(secret)
        self.event(
            body,
            "Normal",
            "ReadOnlyCredentialsIssued",
            f"MinIO service account {issued.access_key} may only read {storage.job_root(store, name)}/; "
            f"inference pods use it (Secret {names.readonly_secret(name)})",
        )
        return True

    # -- join tokens -----------------------------------------------------------------------------
    def _external_url(
        self, body: Mapping[str, Any], namespace: str, name: str, existing: Mapping[tuple[str, str], Object]
    ) -> str | None:
        annotated = (body["metadata"].get("annotations") or {}).get(names.EXTERNAL_URL)
        if annotated:
            return str(annotated)
        service = existing.get(("Service", names.coordinator_external(name)))
        ingress = ((service or {}).get("status", {}).get("loadBalancer", {}) or {}).get("ingress") or []
        if ingress:
            host = ingress[0].get("hostname") or ingress[0].get("ip")
            if host:
                return f"http://{host}:{names.COORDINATOR_PORT}"
        return None

    def _ensure_tokens(
        self,
        body: Mapping[str, Any],
        owner: Object,
        roles: Sequence[str],
        external: set[str],
        external_url: str | None,
        existing: Mapping[tuple[str, str], Object],
    ) -> dict[str, str]:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        tokens: dict[str, str] = {}
        for role in roles:
            secret_name = names.join_secret(name, role)
            url = external_url if role in external else None
            current = existing.get(("Secret", secret_name))
            if current is None:
                wanted = children.join_secret(name, namespace, owner, role, secrets.token_urlsafe(32), url)
                try:
                    current = self.kube.create(wanted)
                except KubeError as exc:
                    if not exc.conflict:
                        raise
                    current = self.kube.get("v1", "Secret", namespace, secret_name)
                    if current is None or not _owned_by(current, meta["uid"]):
                        raise self._problem(
                            body,
                            "NameConflict",
                            f"Secret {secret_name} exists and does not belong to this EchoJob; rename the "
                            "job or the pool, or delete that Secret",
                        ) from None
            data = current.get("data") or {}
            if url is not None and data.get("coordinator") != base64.b64encode(url.encode()).decode():
                self.kube.merge_patch(
                    "v1",
                    "Secret",
                    namespace,
                    secret_name,
                    {"data": {"coordinator": base64.b64encode(url.encode()).decode()}},
                )
                self.event(
                    body,
                    "Normal",
                    "ExternalAddressAssigned",
                    f"external workers of pool {role} join through {url} (Secret {secret_name})",
                )
            tokens[role] = base64.b64decode(data["token"]).decode()
        return tokens

    # -- children --------------------------------------------------------------------------------
    def _existing_children(self, namespace: str, name: str, uid: str) -> dict[tuple[str, str], Object]:
        found: dict[tuple[str, str], Object] = {}
        for api_version, kind in CHILD_KINDS:
            for obj in self.kube.list(api_version, kind, namespace, {names.JOB: name}):
                if _owned_by(obj, uid):
                    found[(kind, obj["metadata"]["name"])] = obj
        return found

    def _apply_children(
        self, body: Mapping[str, Any], job: children.JobInput, existing: Mapping[tuple[str, str], Object]
    ) -> None:
        wanted = children.desired(job, self.settings)
        created: list[str] = []
        updated: list[str] = []
        for obj in wanted:
            key = children.key(obj)
            before = existing.get(key)
            if obj["kind"] == "Job":
                done = self._sync_trainer(body, job, obj, before)
                if done == "created":
                    created.append(f"{key[0]} {key[1]}")
                continue
            try:
                after = self.kube.apply(obj)
            except KubeError as exc:
                if exc.status in (409, 422):
                    raise self._problem(body, "ApplyFailed", f"{key[0]} {key[1]}: {exc.message}") from None
                raise
            if before is None:
                created.append(f"{key[0]} {key[1]}")
            elif before["metadata"].get("resourceVersion") != after["metadata"].get("resourceVersion"):
                updated.append(f"{key[0]} {key[1]}")
                self._scaled_event(body, before, after)
        keep = {children.key(o) for o in wanted}
        keep |= {("Secret", names.join_secret(job.name, role)) for role in children.roles(job)}
        keep.add(("Secret", names.readonly_secret(job.name)))
        if job.finished:  # the finished trainer Job stays, for its record and its pods' logs
            keep.add(("Job", names.trainer(job.name)))
        removed = []
        for key, obj in existing.items():
            if key not in keep:
                if key[0] == "Job" and obj["metadata"].get("deletionTimestamp"):
                    continue
                self.kube.delete(
                    obj["apiVersion"], key[0], job.namespace, key[1], uid=obj["metadata"]["uid"],
                    # a Job goes only once its pods are gone: a resumed trainer never meets the old one
                    propagation="Foreground" if key[0] == "Job" else "Background",
                )  # fmt: skip
                removed.append(f"{key[0]} {key[1]}")
        if created:
            self.event(body, "Normal", "ChildrenCreated", _summary("created", created))
        if updated:
            self.event(body, "Normal", "ChildrenUpdated", _summary("updated", updated))
        if removed:
            self.event(body, "Normal", "ChildrenDeleted", _summary("deleted", removed))

    def _scaled_event(self, body: Mapping[str, Any], before: Object, after: Object) -> None:
        if after.get("kind") != "Deployment":
            return
        old, new = before.get("spec", {}).get("replicas"), after.get("spec", {}).get("replicas")
        if old != new:
            labels = after["metadata"].get("labels", {})
            what = f"pool {labels[names.POOL]}" if names.POOL in labels else after["metadata"]["name"]
            self.event(body, "Normal", "Scaled", f"{what}: {old} → {new} replica(s)")

    # =============================================================================================
    # Status

    def observe(self, body: Mapping[str, Any]) -> None:
        """The status pass: follow the trainer Job, read the coordinator, enforce Δmax, write status."""
        meta = body["metadata"]
        mem = self.memory(meta["namespace"], meta["name"])
        ended = False
        with mem.lock:
            if mem.job is None and not mem.problems:
                return  # not reconciled yet (the operator just started): nothing to report
            if mem.job is not None and mem.job.active:
                ended = self._follow_trainer(body, mem, mem.job)
            self._write_status(body, mem, fetch=not ended)
        if ended:  # scale everything to zero now, not at the next resync
            self.reconcile(body)

    def _follow_trainer(self, body: Mapping[str, Any], mem: JobMemory, job: children.JobInput) -> bool:
        """Act on the trainer Job's state (:func:`lifecycle.decide`); True when the job just ended."""
        namespace, name = job.namespace, job.name
        current = self.kube.get("batch/v1", "Job", namespace, names.trainer(name))
        phase = lifecycle.trainer_phase(current)
        if phase == "Missing":  # deleted for a restart (or by hand): the gang starts again
            wanted = [o for o in children.desired(job, self.settings) if o["kind"] == "Job"]
            if wanted:
                self._sync_trainer(body, job, wanted[0], None)
            return False
        if phase not in ("Complete", "Failed") or current is None:
            return False
        uid = current["metadata"]["uid"]
        if uid in mem.counted_jobs:
            return False
        if mem.restarts is None:
            mem.restarts = int((body.get("status") or {}).get("restarts") or 0)
        failure = progress = None
        if phase == "Failed":
            pods = self.kube.list("v1", "Pod", namespace, names.selector(name, "trainer"))
            failure = lifecycle.failure_of(current, [p for p in pods if _owned_by(p, uid)])
        else:
            progress = self._progress(body, job)
        decision = lifecycle.decide(
            phase, failure, progress, job.spec.algorithm.max_steps, mem.restarts, job.spec.backoff_limit
        )
        if decision.action == "Wait":
            return False
        mem.counted_jobs.add(uid)
        if decision.counted:
            mem.restarts += 1
        if decision.action == "Restart":
            self.event(body, "Warning", decision.reason, decision.message)
            self.kube.delete(
                "batch/v1", "Job", namespace, names.trainer(name), uid=uid, propagation="Foreground"
            )
            return False
        mem.outcome = lifecycle.Outcome(
            "Succeeded" if decision.action == "Succeed" else "Failed",
            decision.reason,
            decision.message,
            now_rfc3339(),
        )
        if progress is not None:
            mem.final_version = progress.latest_version
        mem.job = dataclasses.replace(job, finished=True)
        self.event(
            body,
            "Normal" if decision.action == "Succeed" else "Warning",
            "JobSucceeded" if decision.action == "Succeed" else "JobFailed",
            decision.message,
        )
        return True

    def _progress(self, body: Mapping[str, Any], job: children.JobInput) -> lifecycle.Progress | None:
        """The newest version and checkpoint in the job's store (None if it cannot be read now)."""
        store = spec.Storage.model_validate((body.get("spec") or {}).get("storage") or {})
        creds = None
        if store.credentials_secret:
            data = self._secret_data(job.namespace, store.credentials_secret)
            if not data or not data.get("accessKey") or not data.get("secretKey"):
                return None
            creds = storage.Credentials(data["accessKey"], data["secretKey"])
        try:
            version, checkpoint = storage.progress(store, creds, job.name)
        except (store_errors.SnapshotError, ValueError) as exc:
            log.warning("%s/%s: cannot read the snapshot store: %s", job.namespace, job.name, exc)
            return None
        return lifecycle.Progress(version, checkpoint)

    def _fetch(self, mem: JobMemory, namespace: str, name: str) -> None:
        if mem.trainer_token is None or mem.job is None or not mem.job.active:
            why = (
                "not reconciled yet"
                if mem.job is None
                else "suspended"
                if mem.job.suspended
                else "the job is over"
            )
            mem.doc, mem.doc_error = None, why
            return
        url = self.settings.status_url(name, namespace)
        try:
            mem.doc = observe.fetch_status(url, mem.trainer_token, self.settings.http_timeout_s)
            mem.doc_error = None
        except observe.Unreachable as exc:
            mem.doc, mem.doc_error = None, str(exc)

    def _write_status(self, body: Mapping[str, Any], mem: JobMemory, fetch: bool) -> None:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if fetch:
            self._fetch(mem, namespace, name)
        job = mem.job
        deployments = {
            d["metadata"]["name"]: d
            for d in self.kube.list("apps/v1", "Deployment", namespace, {names.JOB: name})
            if _owned_by(d, meta["uid"])
        }
        trainer = self.kube.get("batch/v1", "Job", namespace, names.trainer(name))
        pods = (
            self.kube.list("v1", "Pod", namespace, {names.JOB: name})
            if job is not None and job.active
            else []
        )
        waiting, waiting_count = status_mod.pending(pods)
        previous_status: Object = dict(body.get("status") or {})
        if mem.outcome is None:
            mem.outcome = lifecycle.outcome_of(previous_status)
        restarted: list[str] = []
        doc = mem.doc
        if fetch:
            mem.behind = {}
            if doc is not None and job is not None:
                now = time.monotonic()
                lagging = pool_lag.pools_behind(doc, job.sync_policy)
                mem.behind_since = pool_lag.track(lagging, mem.behind_since, now)
                persistent = pool_lag.cannot_keep_up(mem.behind_since, now, self.settings.behind_grace_s)
                mem.behind = {pool: lagging[pool] for pool in persistent}
                restarted = self._restart_stuck(body, job, doc, mem, now)
        obs = status_mod.Observation(
            generation=meta.get("generation"),
            suspended=bool((body.get("spec") or {}).get("suspend")),
            job=job,
            problems=mem.problems,
            coordinator=doc,
            coordinator_error=mem.doc_error,
            deployments=deployments,
            trainer=trainer,
            behind=mem.behind,
            restarted=tuple(restarted),
            pending=waiting,
            pending_pods=waiting_count,
            outcome=mem.outcome,
            restarts=mem.restarts if mem.restarts is not None else int(previous_status.get("restarts") or 0),
            final_version=mem.final_version,
            start_time=previous_status.get("startTime")
            or (now_rfc3339() if job is not None and job.active else None),
        )
        previous = previous_status
        new = status_mod.job_status(obs, previous)
        conds = status_mod.conditions(obs, previous)
        old_conditions = list(previous.get("conditions") or [])
        new["conditions"] = conditions.merge(old_conditions, conds, obs.generation, now_rfc3339())
        for change in conditions.transitions(old_conditions, conds):
            self.event(
                body,
                "Warning" if change.warning else "Normal",
                change.condition.reason,
                f"{change.condition.type} is {change.condition.status}: {change.condition.message}",
            )
        if status_mod.differs(previous, new):
            try:
                self.kube.patch_status(GV, "EchoJob", namespace, name, new)
            except KubeError as exc:
                if not exc.not_found:  # deleted meanwhile
                    raise
        if fetch and job is not None:  # the swarms' replica counts follow their Deployments
            for swarm in sorted({p.swarm for p in job.pools if p.swarm is not None}):
                self.update_swarm_status(namespace, "InferenceSwarm", swarm)

    def _restart_stuck(
        self,
        body: Mapping[str, Any],
        job: children.JobInput,
        doc: wire.StatusDocument,
        mem: JobMemory,
        now: float,
    ) -> list[str]:
        if not any(w.stuck for w in doc.workers):
            return []
        namespace = job.namespace
        pods = self.kube.list("v1", "Pod", namespace, names.selector(job.name, "inference"))
        by_pool: dict[str, list[str]] = {}
        uids: dict[str, str] = {}
        for pod in pods:
            labels = pod["metadata"].get("labels", {})
            by_pool.setdefault(labels.get(names.POOL, ""), []).append(pod["metadata"]["name"])
            uids[pod["metadata"]["name"]] = pod["metadata"]["uid"]
        done: list[str] = []
        for restart in pool_lag.restarts(doc, by_pool, mem.restarted, now, self.settings.restart_cooldown_s):
            if self.kube.delete("v1", "Pod", namespace, restart.pod, uid=uids[restart.pod]):
                mem.restarted[restart.pod] = now
                done.append(restart.pod)
                self.event(
                    body,
                    "Warning",
                    "WorkerRestarted",
                    f"restarted pod {restart.pod} of pool {restart.pool}: worker {restart.worker} is stuck at "
                    f"policy version {restart.loaded_version} while t_train is {doc.policy_version} "
                    f"(Δmax {doc.max_staleness})",
                )
        for worker in pool_lag.stuck_external(doc):
            key = f"external/{worker.id}"
            last = mem.restarted.get(key)
            if last is None or now - last >= self.settings.restart_cooldown_s:
                mem.restarted[key] = now
                self.event(
                    body,
                    "Warning",
                    "ExternalWorkerStuck",
                    f"external worker {worker.id} of pool {worker.pool} is stuck at policy version "
                    f"{worker.loaded_version} (t_train {doc.policy_version}); restart it on its machine",
                )
        return done

    # =============================================================================================
    # Referenced objects

    def referrers(self, namespace: str, kind: str, name: str) -> list[Object]:
        """EchoJobs in ``namespace`` that reference the ``kind`` object ``name``."""
        return [job for job in self.kube.list(GV, "EchoJob", namespace) if _refers(job, kind, name)]

    def referenced_changed(self, namespace: str, kind: str, name: str) -> None:
        """An InferenceSwarm, TrainingSwarm or SyncPolicy changed: reconcile the jobs that use it."""
        for job in self.referrers(namespace, kind, name):
            if job["metadata"].get("deletionTimestamp"):
                continue
            self.reconcile(job)
        self.update_swarm_status(namespace, kind, name)

    def update_swarm_status(self, namespace: str, kind: str, name: str) -> None:
        obj = self.kube.get(GV, kind, namespace, name)
        if obj is None:
            return
        used_by = sorted(j["metadata"]["name"] for j in self.referrers(namespace, kind, name))
        new: Object = {"observedGeneration": obj["metadata"].get("generation"), "usedBy": used_by}
        if kind == "InferenceSwarm":
            deployments = self.kube.list("apps/v1", "Deployment", namespace, {names.INFERENCE_SWARM: name})
            new["replicas"] = sum(int(d.get("status", {}).get("replicas", 0) or 0) for d in deployments)
            new["selector"] = names.swarm_selector(name)
            ready = sum(int(d.get("status", {}).get("readyReplicas", 0) or 0) for d in deployments)
            if not used_by:
                cond = conditions.Condition("Ready", "False", "Unused", "no EchoJob references this pool")
            elif (obj.get("spec") or {}).get("external"):
                cond = conditions.Condition(
                    "Ready", "True", "External", "workers join from outside the cluster; see the jobs' status"
                )
            elif deployments and ready >= new["replicas"] and ready > 0:
                cond = conditions.Condition("Ready", "True", "PodsReady", f"{ready} worker pod(s) ready")
            else:
                cond = conditions.Condition(
                    "Ready", "False", "PodsNotReady", f"{ready} of {new['replicas']} worker pod(s) ready"
                )
            previous = list((obj.get("status") or {}).get("conditions") or [])
            new["conditions"] = conditions.merge(previous, [cond], new["observedGeneration"], now_rfc3339())
        if status_mod.differs(obj.get("status") or {}, new):
            self.kube.patch_status(GV, kind, namespace, name, new)

    # =============================================================================================
    # Deletion

    def cleanup(self, body: Mapping[str, Any]) -> None:
        """External cleanup before the job goes: revoke read-only credentials, delete the prefix if asked."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        self.forget(namespace, name)
        try:
            store = spec.Storage.model_validate((body.get("spec") or {}).get("storage") or {})
        except pydantic.ValidationError:
            return
        creds: storage.Credentials | None = None
        if store.credentials_secret:
            data = self._secret_data(namespace, store.credentials_secret)
            if data is None or not data.get("accessKey") or not data.get("secretKey"):
                self.event(
                    body,
                    "Warning",
                    "CleanupSkipped",
                    f"Secret {store.credentials_secret!r} is gone: cannot clean up "
                    f"{storage.job_root(store, name)}/ on the store; remove it by hand if needed",
                )
                return
            creds = storage.Credentials(data["accessKey"], data["secretKey"])
        access_key = (meta.get("annotations") or {}).get(names.READONLY_ACCOUNT)
        if access_key:
            storage.revoke_readonly(store, creds, access_key)
            self.event(
                body, "Normal", "ReadOnlyCredentialsRevoked", f"deleted MinIO service account {access_key}"
            )
        if store.delete_policy == "Delete":
            count = storage.delete_job_data(store, creds, name)
            self.event(
                body,
                "Normal",
                "SnapshotsDeleted",
                f"deleted {count} object(s) under {storage.job_root(store, name)}/ (deletePolicy: Delete)",
            )

    # =============================================================================================
    # Helpers

    def _owner(self, body: Mapping[str, Any]) -> Object:
        meta = body["metadata"]
        return {
            "apiVersion": GV,
            "kind": "EchoJob",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _problem(self, body: Mapping[str, Any], reason: str, message: str) -> Problems:
        self.event(body, "Warning", reason, message)
        return Problems([status_mod.Problem(reason, message)])

    def event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about the object (best effort: a failed post is only logged)."""
        meta = body["metadata"]
        stamp = now_rfc3339()
        event: Object = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body.get("apiVersion", GV),
                "kind": body.get("kind", "EchoJob"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": names.MANAGER},
            "reportingComponent": names.MANAGER,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        log.info("%s/%s: %s %s: %s", meta["namespace"], meta["name"], type_, reason, message)
        try:
            self.kube.create(event)
        except KubeError as exc:
            log.warning("could not post event %s for %s/%s: %s", reason, meta["namespace"], meta["name"], exc)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def _refers(job: Mapping[str, Any], kind: str, name: str) -> bool:
    job_spec = job.get("spec") or {}
    if kind == "InferenceSwarm":
        return any(p.get("swarmRef") == name for p in job_spec.get("inferenceSwarms") or [])
    return job_spec.get(REF_FIELDS[kind]) == name


def _summary(verb: str, items: Iterable[str]) -> str:
    listed = list(items)
    return f"{verb} {len(listed)} object(s): {', '.join(listed)}"
