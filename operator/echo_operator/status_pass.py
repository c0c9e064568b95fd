"""The status pass: what the operator observes about a job, and the ``status`` it writes.

:func:`observe` runs on a timer. It follows the trainer Job through the job's life
(:mod:`echo_operator.lifecycle`: a gang restart, Succeeded, Failed), reads the coordinator's status
document, decides which pools cannot keep up with Δmax (:mod:`echo_operator.pool_lag`) and restarts
stuck worker pods, then :func:`write_status` computes ``status`` (:mod:`echo_operator.status`) and
writes it only when it differs, posting an Event for every condition that changes. The InferenceSwarm
and other referenced objects get their own ``status`` (``usedBy``; for a swarm, the scale
subresource's ``replicas`` and ``selector`` and a ``Ready`` condition: :func:`swarm_status`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from echo_operator import (
    apply,
    children,
    conditions,
    context,
    credentials,
    events,
    lifecycle,
    names,
    observe,
    pool_lag,
    references,
    storage,
    trainer_record,
)
from echo_operator import status as status_mod
from echo_operator.children import inputs
from echo_operator.kube import KubeError
from echo_runtime import spec
from echo_runtime.coordinator import wire
from echo_runtime.snapshots import errors as store_errors

Object = dict[str, Any]
GV = spec.GROUP_VERSION
log = logging.getLogger("echo_operator")


def why_unread(job: inputs.JobInput | None, token_known: bool) -> str | None:
    """Why the coordinator is not to be read now (None: it is)."""
    if token_known and job is not None and job.active:
        return None
    if job is None:
        return "not reconciled yet"
    return "suspended" if job.suspended else "the job is over"


def swarm_status(
    obj: Mapping[str, Any], deployments: Sequence[Mapping[str, Any]], used_by: Sequence[str], now: str
) -> Object:
    """An InferenceSwarm's ``status`` from the Deployments of its pools across every job using it."""
    new: Object = {"observedGeneration": obj["metadata"].get("generation"), "usedBy": list(used_by)}
    replicas = sum(int(d.get("status", {}).get("replicas", 0) or 0) for d in deployments)
    ready = sum(int(d.get("status", {}).get("readyReplicas", 0) or 0) for d in deployments)
    new["replicas"] = replicas
    new["selector"] = names.swarm_selector(obj["metadata"]["name"])
    if not used_by:
        cond = conditions.Condition("Ready", "False", "Unused", "no EchoJob references this pool")
    elif (obj.get("spec") or {}).get("external"):
        cond = conditions.Condition(
            "Ready", "True", "External", "workers join from outside the cluster; see the jobs' status"
        )
    elif deployments and ready >= replicas and ready > 0:
        cond = conditions.Condition("Ready", "True", "PodsReady", f"{ready} worker pod(s) ready")
    else:
        cond = conditions.Condition(
            "Ready", "False", "PodsNotReady", f"{ready} of {replicas} worker pod(s) ready"
        )
    previous = list((obj.get("status") or {}).get("conditions") or [])
    new["conditions"] = conditions.merge(previous, [cond], new["observedGeneration"], now)
    return new


def observed_generation(applied: int | None, previous: Mapping[str, Any]) -> int | None:
    """``status.observedGeneration``: the newest generation whose children were applied.

    Not the generation the pass looked at: a spec whose children the API server refused leaves it
    where it was, so a client comparing it with ``metadata.generation`` (Argo CD, ``kubectl wait``)
    does not take the refused spec for running. After an operator restart, until the first
    successful apply, it is what ``status`` said.
    """
    if applied is not None:
        return applied
    found = previous.get("observedGeneration")
    return int(found) if found is not None else None


def should_write(
    previous: Mapping[str, Any], new: Mapping[str, Any], written_at: float | None, interval_s: float
) -> bool:
    """Write a changed status now, unless only its figures moved (:data:`status.FIGURES`) and this
    operator wrote it less than ``interval_s`` ago."""
    if status_mod.differs(status_mod.without_figures(previous), status_mod.without_figures(new)):
        return True
    return written_at is None or time.monotonic() - written_at >= interval_s


def outcome_event(decision: lifecycle.Decision) -> tuple[str, str]:
    """(type, reason) of the Event for a job that just ended."""
    if decision.action == "Succeed":
        return "Normal", "JobSucceeded"
    return "Warning", "JobFailed"


# -- I/O -------------------------------------------------------------------------------------------


def observe_job(ctx: context.Context, body: Mapping[str, Any], mem: context.JobMemory) -> bool:
    """One status pass (the caller holds ``mem.lock``); True when the job just ended."""
    ended = False
    if mem.job is not None and mem.job.active:
        ended = follow_trainer(ctx, body, mem, mem.job)
    write_status(ctx, body, mem, fetch_doc=not ended)
    return ended


def follow_trainer(
    ctx: context.Context, body: Mapping[str, Any], mem: context.JobMemory, job: inputs.JobInput
) -> bool:
    """Act on the trainer Job's state (:func:`lifecycle.decide`); True when the job just ended."""
    namespace, name = job.namespace, job.name
    current = ctx.kube.get("batch/v1", "Job", namespace, names.trainer(name))
    phase = lifecycle.trainer_phase(current)
    over = lifecycle.past_deadline(job.spec.active_deadline_seconds, body.get("status"), context.now())
    if over is not None:
        if current is not None and phase in ("Running", "Missing"):
            # The Job's record stays (a finished job keeps its trainer Job); its pods are stopped.
            entry = trainer_record.record(ctx, body, current, over.reason, over.message)
            over = dataclasses.replace(over, message=over.message + trainer_record.hint(entry))
            ctx.kube.merge_patch(
                "batch/v1", "Job", namespace, names.trainer(name), {"spec": {"suspend": True}}
            )
        return end(ctx, body, mem, job, over)
    if phase == "Missing":  # deleted for a restart (or by hand): the gang starts again
        wanted = [o for o in children.desired(job, ctx.settings) if o["kind"] == "Job"]
        if wanted:
            apply.sync_trainer(ctx, body, job, wanted[0], None)
        return False
    if phase not in ("Complete", "Failed") or current is None:
        return False
    uid = current["metadata"]["uid"]
    if uid in mem.counted_jobs:
        return False
    previous = body.get("status") or {}
    if mem.restarts is None:
        mem.restarts = int(previous.get("restarts") or 0)
    if mem.last_counted is None:
        mem.last_counted = str(previous.get("lastCountedTrainer") or "")
    failure = progress = None
    pods: list[Object] | None = None
    if phase == "Failed":
        pods = ctx.kube.list("v1", "Pod", namespace, names.selector(name, "trainer"))
        failure = lifecycle.failure_of(current, [p for p in pods if context.owned_by(p, uid)])
    else:
        progress = read_progress(ctx, body, job)
    # Counted already by an operator that stopped before it deleted this Job: decide as it did, count once.
    before = mem.restarts - (1 if mem.last_counted == uid else 0)
    decision = lifecycle.decide(
        phase, failure, progress, job.spec.algorithm.max_steps, before, job.spec.backoff_limit,
        job.spec.oom_policy,
    )  # fmt: skip
    if decision.action == "Wait":
        return False
    if decision.counted and mem.last_counted != uid:
        # The count reaches status before anything is deleted, with the Job it counted: an operator that
        # stops between the two neither loses the count nor counts the Job again.
        ctx.kube.patch_status(
            GV, "EchoJob", namespace, name, {"restarts": before + 1, "lastCountedTrainer": uid}
        )
        mem.restarts, mem.last_counted = before + 1, uid
    if decision.action in ("Restart", "Fail"):
        # Before the Job or its pods go: their logs, and where the trainer stopped and why.
        entry = trainer_record.record(
            ctx, body, current, decision.reason,
            failure.summary if failure is not None else decision.message, pods,
        )  # fmt: skip
        decision = dataclasses.replace(decision, message=decision.message + trainer_record.hint(entry))
    if decision.action == "Restart":
        ctx.events.post(body, "Warning", decision.reason, decision.message)
        ctx.kube.delete("batch/v1", "Job", namespace, names.trainer(name), uid=uid, propagation="Foreground")
        mem.counted_jobs.add(uid)  # only now: a delete that failed is tried again at the next pass
        return False
    mem.counted_jobs.add(uid)
    if progress is not None:
        mem.final_version = progress.latest_version
    return end(ctx, body, mem, job, decision)


def end(
    ctx: context.Context,
    body: Mapping[str, Any],
    mem: context.JobMemory,
    job: inputs.JobInput,
    decision: lifecycle.Decision,
) -> bool:
    """The job is over (Succeed or Fail): remember how, say so; the caller scales it to zero."""
    mem.outcome = lifecycle.Outcome(
        "Succeeded" if decision.action == "Succeed" else "Failed",
        decision.reason,
        decision.message,
        events.now_rfc3339(),
    )
    mem.job = dataclasses.replace(job, finished=True)
    type_, reason = outcome_event(decision)
    ctx.events.post(body, type_, reason, decision.message)
    return True


def read_progress(
    ctx: context.Context, body: Mapping[str, Any], job: inputs.JobInput
) -> lifecycle.Progress | None:
    """The newest version and checkpoint in the job's store (None if it cannot be read now)."""
    store = spec.Storage.model_validate((body.get("spec") or {}).get("storage") or {})
    creds = None
    if store.credentials_secret:
        creds = credentials.usable(credentials.secret_data(ctx, job.namespace, store.credentials_secret))
        if creds is None:
            return None
    try:
        version, checkpoint = storage.progress(store, creds, job.name)
    except (store_errors.SnapshotError, ValueError) as exc:
        log.warning("%s/%s: cannot read the snapshot store: %s", job.namespace, job.name, exc)
        return None
    return lifecycle.Progress(version, checkpoint)


RETRY_READ_S = 0.5
"""The pause before reading a coordinator's status again after a failed read."""


def fetch(ctx: context.Context, mem: context.JobMemory, namespace: str, name: str) -> None:
    """Read the coordinator's status document into ``mem`` (or why it could not be read)."""
    why = why_unread(mem.job, mem.status_token is not None)
    if why is not None or mem.status_token is None:
        mem.doc, mem.doc_error, mem.doc_error_since = None, why, None
        return
    url = ctx.settings.status_url(name, namespace)
    for attempt in range(2):  # one retry: a single failed read (a new operator's first) is not news
        try:
            mem.doc = observe.fetch_status(url, mem.status_token, ctx.settings.http_timeout_s)
            mem.doc_error, mem.doc_error_since = None, None
            return
        except observe.Unreachable as exc:
            mem.doc, mem.doc_error = None, str(exc)
            if attempt == 0:
                time.sleep(RETRY_READ_S)
    if mem.doc_error_since is None:
        mem.doc_error_since = time.monotonic()


def write_status(
    ctx: context.Context, body: Mapping[str, Any], mem: context.JobMemory, fetch_doc: bool
) -> None:
    """Compute the job's ``status`` from what is observed now and write it if it changed."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    kube = ctx.kube
    if fetch_doc:
        fetch(ctx, mem, namespace, name)
    job = mem.job
    deployments = {
        d["metadata"]["name"]: d
        for d in kube.list("apps/v1", "Deployment", namespace, {names.JOB: name})
        if context.owned_by(d, meta["uid"])
    }
    trainer = kube.get("batch/v1", "Job", namespace, names.trainer(name))
    pods = kube.list("v1", "Pod", namespace, {names.JOB: name}) if job is not None and job.active else []
    if job is not None and job.active:
        trainer_record.remember(ctx, body, mem, trainer, pods)
    waiting, waiting_count = status_mod.pending(pods)
    previous: Object = dict(body.get("status") or {})
    if mem.outcome is None:
        mem.outcome = lifecycle.outcome_of(previous)
    restarted: list[str] = []
    doc = mem.doc
    if fetch_doc:
        mem.behind = {}
        if doc is not None and job is not None:
            now = time.monotonic()
            lagging = pool_lag.pools_behind(doc, job.sync_policy)
            mem.behind_since = pool_lag.track(lagging, mem.behind_since, now)
            persistent = pool_lag.cannot_keep_up(mem.behind_since, now, ctx.settings.behind_grace_s)
            mem.behind = {pool: lagging[pool] for pool in persistent}
            restarted = restart_stuck(ctx, body, job, doc, mem, now)
    obs = status_mod.Observation(
        generation=observed_generation(mem.applied_generation, previous),
        suspended=bool((body.get("spec") or {}).get("suspend")) or (job is not None and job.held is not None),
        job=job,
        faults=mem.faults,
        coordinator=doc,
        coordinator_error=mem.doc_error,
        unreadable_s=0.0 if mem.doc_error_since is None else time.monotonic() - mem.doc_error_since,
        deployments=deployments,
        trainer=trainer,
        behind=mem.behind,
        restarted=tuple(restarted),
        pending=waiting,
        pending_pods=waiting_count,
        outcome=mem.outcome,
        restarts=mem.restarts if mem.restarts is not None else int(previous.get("restarts") or 0),
        final_version=mem.final_version,
        start_time=previous.get("startTime")
        or (events.now_rfc3339() if job is not None and job.active else None),
    )
    mem.pods_ready = status_mod.pods_ready(obs)
    new = status_mod.job_status(obs, previous)
    new["lastCountedTrainer"] = mem.last_counted or previous.get("lastCountedTrainer")
    new["trainerHistory"] = trainer_record.history_of(mem, body) or None
    conds = status_mod.conditions(obs, previous)
    old_conditions = list(previous.get("conditions") or [])
    new["conditions"] = conditions.merge(old_conditions, conds, obs.generation, events.now_rfc3339())
    for change in conditions.transitions(old_conditions, conds):
        ctx.events.post(
            body,
            "Warning" if change.warning else "Normal",
            change.condition.reason,
            f"{change.condition.type} is {change.condition.status}: {change.condition.message}",
        )
    changed = status_mod.differs(previous, new)
    if changed and not should_write(
        previous, new, mem.status_written_at, ctx.settings.status_write_interval_s
    ):
        changed = False  # only the figures moved, and they were written a moment ago
    elif changed:
        try:
            kube.patch_status(GV, "EchoJob", namespace, name, new)
        except KubeError as exc:
            if not exc.not_found:  # deleted meanwhile
                raise
        mem.status_written_at = time.monotonic()
    mem.settled = mem.outcome is not None and not changed
    if fetch_doc and job is not None:  # the swarms' replica counts follow their Deployments
        for swarm in sorted({p.swarm for p in job.pools if p.swarm is not None}):
            update_swarm_status(ctx, namespace, "InferenceSwarm", swarm)


def restart_stuck(
    ctx: context.Context,
    body: Mapping[str, Any],
    job: inputs.JobInput,
    doc: wire.StatusDocument,
    mem: context.JobMemory,
    now: float,
) -> list[str]:
    """Delete the pods of stuck workers (their Deployment replaces them); say so in Events."""
    if not any(w.stuck for w in doc.workers):
        return []
    namespace = job.namespace
    pods = ctx.kube.list("v1", "Pod", namespace, names.selector(job.name, "inference"))
    by_pool: dict[str, list[str]] = {}
    uids: dict[str, str] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels", {})
        by_pool.setdefault(labels.get(names.POOL, ""), []).append(pod["metadata"]["name"])
        uids[pod["metadata"]["name"]] = pod["metadata"]["uid"]
    done: list[str] = []
    cooldown = ctx.settings.restart_cooldown_s
    for restart in pool_lag.restarts(doc, by_pool, mem.restarted, now, cooldown):
        if ctx.kube.delete("v1", "Pod", namespace, restart.pod, uid=uids[restart.pod]):
            mem.restarted[restart.pod] = now
            done.append(restart.pod)
            ctx.events.post(
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
        if last is None or now - last >= cooldown:
            mem.restarted[key] = now
            ctx.events.post(
                body,
                "Warning",
                "ExternalWorkerStuck",
                f"external worker {worker.id} of pool {worker.pool} is stuck at policy version "
                f"{worker.loaded_version} (t_train {doc.policy_version}); restart it on its machine",
            )
    return done


def update_swarm_status(ctx: context.Context, namespace: str, kind: str, name: str) -> None:
    """Refresh a referenced object's ``status`` (``usedBy``; for a swarm :func:`swarm_status`)."""
    obj = ctx.kube.get(GV, kind, namespace, name)
    if obj is None:
        return
    used_by = sorted(j["metadata"]["name"] for j in references.referrers(ctx, namespace, kind, name))
    if kind == "InferenceSwarm":
        deployments = ctx.kube.list("apps/v1", "Deployment", namespace, {names.INFERENCE_SWARM: name})
        new = swarm_status(obj, deployments, used_by, events.now_rfc3339())
    else:
        new = {"observedGeneration": obj["metadata"].get("generation"), "usedBy": used_by}
    if status_mod.differs(obj.get("status") or {}, new):
        ctx.kube.patch_status(GV, kind, namespace, name, new)
