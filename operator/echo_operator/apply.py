"""Apply and prune: make the job's children in the cluster what :func:`children.desired` says.

Every child but the trainer Job is server-side applied (:meth:`Kube.apply`): unchanged objects are
not written, fields other managers own are left alone. The trainer Job is a gang, so it is never
patched: :func:`trainer_action` creates it when missing and replaces it, every rank, when what it runs
changed (its spec hash); a Job being deleted is left to finish (Foreground: until its pods are gone),
so two trainers never run at once. Before a trainer Job is deleted (replaced, or the job suspended or
held by its queue), its pods' logs are kept and the stop recorded (:mod:`echo_operator.trainer_record`);
those logs ConfigMaps are never pruned. Children the job no longer needs are deleted (:func:`prune`), except
the join Secrets (their tokens must outlive a pool being renamed back), the read-only storage Secret,
the coordinator's TLS Secret (its CA, likewise), and a finished job's trainer Job (its record and its pods' logs). An apply the API server refuses as
invalid or conflicting (409, 422) is an ``ApplyFailed`` problem; other API failures are raised.

Suspending scales every pool to zero; a pool whose ``replicas`` is unset (scaled by ``kubectl scale``
or an HPA) gets back on resume what it had (:func:`held_replicas`, :func:`to_restore`), not the
Deployment's default of 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from echo_operator import children, context, lifecycle, names, trainer_record
from echo_operator.children import inputs
from echo_operator.kube import KubeError

Object = dict[str, Any]
Key = tuple[str, str]

CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
)
"""(apiVersion, kind) of everything an EchoJob may own."""


def summary(verb: str, items: Iterable[str]) -> str:
    listed = list(items)
    return f"{verb} {len(listed)} object(s): {', '.join(listed)}"


def trainer_action(
    current: Mapping[str, Any] | None, wanted: Mapping[str, Any]
) -> Literal["create", "replace"] | None:
    """What to do with the trainer Job ``current`` (as stored) to run ``wanted``."""
    if lifecycle.trainer_phase(current) == "Terminating":
        return None
    if current is None:
        return "create"
    have = (current["metadata"].get("annotations") or {}).get(names.SPEC_HASH)
    return "replace" if have != wanted["metadata"]["annotations"][names.SPEC_HASH] else None


def keep(job: inputs.JobInput, wanted: Sequence[Object]) -> set[Key]:
    """The children that stay: the wanted ones, every join Secret, the read-only Secret, the
    coordinator's TLS Secret, a finished trainer."""
    out = {children.key(o) for o in wanted}
    # Its CA is what external workers were told to trust: it outlives a pool turned internal and back.
    out.add(("Secret", names.coordinator_tls(job.name)))
    out |= {("Secret", names.role_secret(job.name, role)) for role in children.roles(job)}
    out.add(("Secret", names.readonly_secret(job.name)))
    if job.finished:  # the finished trainer Job stays, for its record and its pods' logs
        out.add(("Job", names.trainer(job.name)))
    return out


def prune(existing: Mapping[Key, Object], kept: set[Key]) -> list[Key]:
    """The existing children to delete (a trainer Job already being deleted is left to finish; the
    ConfigMaps that keep stopped trainers' logs stay, :mod:`echo_operator.trainer_record` keeps the last
    few)."""
    return [
        key
        for key, obj in existing.items()
        if key not in kept
        and not (key[0] == "Job" and obj["metadata"].get("deletionTimestamp"))
        and not trainer_record.is_logs(obj)
    ]


def why_stopped(job: inputs.JobInput) -> tuple[str, str]:
    """(reason, message) of a trainer Job deleted because the job may not run now."""
    if job.held is not None:
        return job.held.reason, f"the job's queue holds it: {job.held.message}"
    if job.spec.suspend:
        return "Suspended", "spec.suspend is true: every process stops (it resumes from the last checkpoint)"
    return "Stopped", "the job no longer runs a trainer"


def scaled_message(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    """The ``Scaled`` Event's message when an apply changed a Deployment's replicas (else None)."""
    if after.get("kind") != "Deployment":
        return None
    old, new = before.get("spec", {}).get("replicas"), after.get("spec", {}).get("replicas")
    if old == new:
        return None
    labels = after["metadata"].get("labels", {})
    what = f"pool {labels[names.POOL]}" if names.POOL in labels else after["metadata"]["name"]
    return f"{what}: {old} → {new} replica(s)"


def pool_of(job: inputs.JobInput, obj: Mapping[str, Any]) -> inputs.Pool | None:
    """The pool whose Deployment ``obj`` is (None for any other child)."""
    if obj.get("kind") != "Deployment":
        return None
    name = (obj.get("metadata", {}).get("labels") or {}).get(names.POOL)
    return next((p for p in job.pools if p.name == name), None)


def _remembered(before: Mapping[str, Any] | None) -> int | None:
    value = ((before or {}).get("metadata", {}).get("annotations") or {}).get(names.RESUME_REPLICAS)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def held_replicas(
    job: inputs.JobInput, obj: Mapping[str, Any], before: Mapping[str, Any] | None
) -> int | None:
    """While the job is not active: the replicas to give a pool back on resume (None: nothing to keep).

    Only for a pool whose own ``replicas`` is unset (else the spec says what comes back): what a user
    (``kubectl scale``) or an HPA had set on its Deployment before the operator scaled it to zero,
    remembered in the :data:`names.RESUME_REPLICAS` annotation through every pass while suspended.
    A pool that stood at zero already has nothing to keep, and comes back at the Deployment's default.
    """
    pool = pool_of(job, obj)
    if job.active or pool is None or pool.spec.replicas is not None or before is None:
        return None
    remembered = _remembered(before)
    if remembered is not None:
        return remembered
    current = (before.get("spec") or {}).get("replicas")
    return current if isinstance(current, int) and current > 0 else None


def to_restore(job: inputs.JobInput, obj: Mapping[str, Any], before: Mapping[str, Any] | None) -> int | None:
    """On resume: the replicas to give back to a pool's Deployment (None: none remembered)."""
    pool = pool_of(job, obj)
    if not job.active or pool is None or pool.spec.replicas is not None:
        return None
    return _remembered(before)


def with_held(obj: Object, held: int | None) -> Object:
    """``obj`` carrying the replicas to give back on resume (``obj`` itself when there are none)."""
    if held is None:
        return obj
    meta = dict(obj["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), names.RESUME_REPLICAS: str(held)}
    return {**obj, "metadata": meta}


def restore(obj: Mapping[str, Any], replicas: int) -> Object:
    """The apply (as :data:`names.RESUME_MANAGER`) that gives a Deployment its replicas back.

    A separate field manager: the operator's own apply then leaves ``replicas`` out as before, so
    the field is not removed (and defaulted to 1) but stays, and ``kubectl scale`` or an HPA may
    change it afterwards without a conflict.
    """
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": replicas},
    }


# -- I/O -------------------------------------------------------------------------------------------


def existing_children(ctx: context.Context, namespace: str, name: str, uid: str) -> dict[Key, Object]:
    """The job's children as stored: labelled with the job and owned by it (by uid)."""
    found: dict[Key, Object] = {}
    for api_version, kind in CHILD_KINDS:
        for obj in ctx.kube.list(api_version, kind, namespace, {names.JOB: name}):
            if context.owned_by(obj, uid):
                found[(kind, obj["metadata"]["name"])] = obj
    return found


def sync_trainer(
    ctx: context.Context,
    body: Mapping[str, Any],
    job: inputs.JobInput,
    wanted: Object,
    current: Object | None,
) -> Literal["create", "replace"] | None:
    """Carry out :func:`trainer_action`; returns what was done."""
    action = trainer_action(current, wanted)
    if action == "create":
        ctx.kube.apply(wanted)
    elif action == "replace" and current is not None:
        message = "the trainer's spec changed: every rank restarts together from the last checkpoint"
        entry = trainer_record.record(ctx, body, current, "SpecChanged", message)
        ctx.kube.delete(
            "batch/v1", "Job", job.namespace, names.trainer(job.name),
            uid=current["metadata"]["uid"], propagation="Foreground",
        )  # fmt: skip
        ctx.events.post(body, "Normal", "TrainerRestarted", message + trainer_record.hint(entry))
    return action


def apply_children(
    ctx: context.Context,
    body: Mapping[str, Any],
    job: inputs.JobInput,
    existing: Mapping[Key, Object],
) -> None:
    """Apply every wanted child, delete the unwanted ones, and say what changed in Events."""
    wanted = children.desired(job, ctx.settings)
    created: list[str] = []
    updated: list[str] = []
    for obj in wanted:
        key = children.key(obj)
        before = existing.get(key)
        if obj["kind"] == "Job":
            if sync_trainer(ctx, body, job, obj, before) == "create":
                created.append(f"{key[0]} {key[1]}")
            continue
        obj = with_held(obj, held_replicas(job, obj, before))
        replicas = to_restore(job, obj, before)
        try:
            if replicas is not None:
                ctx.kube.apply(restore(obj, replicas), manager=names.RESUME_MANAGER)
            after = ctx.kube.apply(obj)
        except KubeError as exc:
            if exc.status in (409, 422):
                raise ctx.fault(body, "ApplyFailed", f"{key[0]} {key[1]}: {exc.message}") from None
            raise
        if before is None:
            created.append(f"{key[0]} {key[1]}")
        elif before["metadata"].get("resourceVersion") != after["metadata"].get("resourceVersion"):
            updated.append(f"{key[0]} {key[1]}")
            message = scaled_message(before, after)
            if message is not None:
                ctx.events.post(body, "Normal", "Scaled", message)
    removed = []
    for key in prune(existing, keep(job, wanted)):
        obj = existing[key]
        if key == ("Job", names.trainer(job.name)) and lifecycle.trainer_phase(obj) != "Complete":
            reason, message = why_stopped(job)
            entry = trainer_record.record(ctx, body, obj, reason, message)
            ctx.events.post(
                body, "Normal", "TrainerStopped",
                f"trainer Job {key[1]} stopped ({reason}): {message}{trainer_record.hint(entry)}",
            )  # fmt: skip
        ctx.kube.delete(
            obj["apiVersion"], key[0], job.namespace, key[1], uid=obj["metadata"]["uid"],
            # a Job goes only once its pods are gone: a resumed trainer never meets the old one
            propagation="Foreground" if key[0] == "Job" else "Background",
        )  # fmt: skip
        removed.append(f"{key[0]} {key[1]}")
    if created:
        ctx.events.post(body, "Normal", "ChildrenCreated", summary("created", created))
    if updated:
        ctx.events.post(body, "Normal", "ChildrenUpdated", summary("updated", updated))
    if removed:
        ctx.events.post(body, "Normal", "ChildrenDeleted", summary("deleted", removed))


def release(ctx: context.Context, body: Mapping[str, Any], existing: Mapping[Key, Object]) -> None:
    """``ttlSecondsAfterFinished`` passed: delete every child; the EchoJob and its status stay."""
    meta = body["metadata"]
    for (kind, child), obj in existing.items():
        ctx.kube.delete(obj["apiVersion"], kind, meta["namespace"], child, uid=obj["metadata"]["uid"])
    if existing:
        ttl = (body.get("spec") or {}).get("ttlSecondsAfterFinished")
        ctx.events.post(
            body, "Normal", "ChildrenDeleted",
            summary(f"ttlSecondsAfterFinished ({ttl} s) passed: deleted", [f"{k} {n}" for k, n in existing]),
        )  # fmt: skip
