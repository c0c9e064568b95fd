"""The reconciler: one EchoJob at a time, through the parts that each do one thing.

:meth:`Reconciler.reconcile` resolves the job's references (:mod:`echo_operator.references`), wires
storage (:mod:`echo_operator.credentials`: bucket, prefix marker, read-only credentials), makes sure
every join token exists (:mod:`echo_operator.tokens`) and, with external pools, the coordinator's TLS
certificate (:mod:`echo_operator.coordinator_tls`), applies the children that
:func:`echo_operator.children.desired` computes and deletes those the job no longer needs
(:mod:`echo_operator.apply`), and writes ``status``. :meth:`Reconciler.observe` is the status pass the
operator runs on a timer (:mod:`echo_operator.status_pass`). Both are idempotent and safe to run at
any time; a per-job lock serialises them.

Faults a user can fix (a missing reference, a missing credentials Secret, an unreachable store) are
reported in ``status`` and as Events and end the pass; transient API failures raise :class:`KubeError`
for the caller (kopf) to retry.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import socket
from collections.abc import Mapping
from typing import Any

import pydantic

from echo_operator import (
    apply,
    context,
    coordinator_tls,
    credentials,
    events,
    lifecycle,
    names,
    queueing,
    references,
    status_pass,
    tokens,
)
from echo_operator.children import inputs
from echo_operator.config import Settings
from echo_operator.context import Faults, JobMemory
from echo_operator.kube import Kube, KubeError

Object = dict[str, Any]
__all__ = ["Faults", "JobMemory", "Reconciler"]


class Reconciler:
    """Reconciles EchoJobs through a :class:`Kube`; one instance per operator process."""

    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.ctx = context.Context(kube, settings, events.Recorder(kube, socket.gethostname()))

    @property
    def kube(self) -> Kube:
        return self.ctx.kube

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    def memory(self, namespace: str, name: str) -> JobMemory:
        return self.ctx.memory(namespace, name)

    def forget(self, namespace: str, name: str) -> None:
        self.ctx.forget(namespace, name)

    def event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event about the object (best effort: a failed post is only logged)."""
        self.ctx.events.post(body, type_, reason, message)

    # -- EchoJob ---------------------------------------------------------------------------------

    def reconcile(self, body: Mapping[str, Any]) -> inputs.JobInput | None:
        """Bring the job's children in line with its spec; returns the resolved input (None on problems)."""
        meta = body["metadata"]
        mem = self.memory(meta["namespace"], meta["name"])
        with mem.lock:
            try:
                job = self._reconcile(body, mem)
            except Faults as exc:
                mem.job, mem.faults = None, exc.faults
                job = None
            else:
                mem.job, mem.faults = job, ()
                mem.applied_generation = meta.get("generation")
            status_pass.write_status(self.ctx, body, mem, fetch_doc=False)
            return job

    def _reconcile(self, body: Mapping[str, Any], mem: JobMemory) -> inputs.JobInput:
        ctx = self.ctx
        meta = body["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        try:
            model = references.parse_job(body)
        except pydantic.ValidationError as exc:
            raise references.invalid(ctx, body, exc) from None
        resolved = references.resolve(ctx, body, model)
        existing = apply.existing_children(ctx, namespace, name, uid)
        outcome = mem.outcome or lifecycle.outcome_of(body.get("status"))
        mem.outcome = outcome
        if lifecycle.expired(outcome, model.spec.ttl_seconds_after_finished, context.now()):
            apply.release(ctx, body, existing)
            mem.released = True
            job = inputs.JobInput.from_resolved(resolved, uid, {}, inputs.StoreWiring(secret=None))
            return dataclasses.replace(job, finished=True)
        store, issue = credentials.wire_storage(ctx, body, model, mem, existing)
        annotations = meta.get("annotations") or {}
        external_service = existing.get(("Service", names.coordinator_external(name)))
        roles, external_roles = tokens.roles(resolved)
        tls = None
        if external_roles and ctx.settings.external_service_type != "None":
            hosts = coordinator_tls.hosts(name, namespace, annotations, external_service)
            tls = coordinator_tls.ensure(ctx, body, hosts, existing)
        fields = tokens.external_fields(annotations, external_service, tls)
        found = tokens.ensure(ctx, body, roles, external_roles, fields, existing)
        mem.status_token = found[names.STATUS_ROLE]
        job = dataclasses.replace(
            inputs.JobInput.from_resolved(resolved, uid, tokens.digests(found), store),
            finished=outcome is not None,
            tls=tls,
        )
        queue = queueing.queue_name(body)
        if queue is not None:
            held, where = queueing.admit(ctx, body, job, queue, outcome.type if outcome is not None else None)
            job = dataclasses.replace(job, held=held, placement=where)
        else:
            queueing.forget(ctx, body, job)
        apply.apply_children(ctx, body, job, existing)
        # Issuing a MinIO service account takes most of a second: do it once the children exist
        # (pods wait for their Secret), and fall back to the job's own credentials if it fails.
        if issue is not None and not credentials.issue_readonly(ctx, body, model.spec.storage, issue):
            job = dataclasses.replace(job, store=dataclasses.replace(store, readonly_secret=None))
            apply.apply_children(ctx, body, job, apply.existing_children(ctx, namespace, name, uid))
        return job

    def observe(self, body: Mapping[str, Any]) -> None:
        """The status pass: follow the trainer Job, read the coordinator, enforce Δmax, write status."""
        meta = body["metadata"]
        mem = self.memory(meta["namespace"], meta["name"])
        with mem.lock:
            if mem.job is None and not mem.faults:
                return  # not reconciled yet (the operator just started): nothing to report
            ended = status_pass.observe_job(self.ctx, body, mem)
            admission = self._admission_changed(body, mem)
            queue = queueing.queue_name(body)
            if queue is not None and not admission and mem.job is not None and mem.job.active:
                queueing.report_pods_ready(self.ctx, mem.job, mem.pods_ready)
        if ended:  # scale everything to zero now, not at the next resync
            self.reconcile(body)
            self.rebalance(body)
        elif admission:  # Kueue admitted or evicted the job, or its pods are gone after an eviction
            self.reconcile(body)

    def next_pass_in(self, body: Mapping[str, Any]) -> float | None:
        """How long a finished job can wait for its next pass: None while it runs or its status still
        moves (the usual interval), the time left to ``ttlSecondsAfterFinished``, or ``math.inf`` when
        nothing more is due (finished jobs are then not polled)."""
        meta = body["metadata"]
        mem = self.memory(meta["namespace"], meta["name"])
        if mem.outcome is None or not mem.settled:
            return None
        ttl = (body.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None or mem.released:
            return math.inf
        ended = datetime.datetime.fromisoformat(mem.outcome.time.replace("Z", "+00:00"))
        return max(0.0, ended.timestamp() + float(ttl) - context.now().timestamp())

    def _admission_changed(self, body: Mapping[str, Any], mem: JobMemory) -> bool:
        """Whether the job's Kueue Workload says something the last reconcile did not act on."""
        queue = queueing.queue_name(body)
        if queue is None or mem.job is None or mem.job.finished:
            return False
        try:
            held, awaiting_release = queueing.current_hold(self.ctx, mem.job, queue)
        except KubeError:
            return False  # the next reconcile reports it
        return awaiting_release or held != mem.job.held

    def rebalance(self, body: Mapping[str, Any]) -> None:
        """The job started, changed, ended or went: re-apply the other running jobs that share an
        InferenceSwarm with it, since their part of the swarm's ``replicas`` changed with it."""
        meta = body["metadata"]
        swarms = {p.get("swarmRef") for p in (body.get("spec") or {}).get("inferenceSwarms") or []} - {None}
        done = {meta["name"]}
        for swarm in sorted(s for s in swarms if s):
            for other in self.referrers(meta["namespace"], "InferenceSwarm", swarm):
                if other["metadata"]["name"] not in done and references.running(other):
                    done.add(other["metadata"]["name"])
                    self.reconcile(other)

    def cleanup(self, body: Mapping[str, Any]) -> None:
        """External cleanup before the job goes: revoke read-only credentials, delete the prefix if asked."""
        meta = body["metadata"]
        self.forget(meta["namespace"], meta["name"])
        credentials.cleanup(self.ctx, body)

    # -- Referenced objects ----------------------------------------------------------------------

    def referrers(self, namespace: str, kind: str, name: str) -> list[Object]:
        """EchoJobs in ``namespace`` that reference the ``kind`` object ``name``."""
        return references.referrers(self.ctx, namespace, kind, name)

    def referenced_changed(self, namespace: str, kind: str, name: str) -> None:
        """An InferenceSwarm, TrainingSwarm or SyncPolicy changed: reconcile the jobs that use it."""
        for job in self.referrers(namespace, kind, name):
            if job["metadata"].get("deletionTimestamp"):
                continue
            self.reconcile(job)
        self.update_swarm_status(namespace, kind, name)

    def update_swarm_status(self, namespace: str, kind: str, name: str) -> None:
        status_pass.update_swarm_status(self.ctx, namespace, kind, name)
