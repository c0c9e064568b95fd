"""Kueue admission: the Workload the operator writes for a queued EchoJob, and what Kueue's answer means.

An EchoJob labelled ``kueue.x-k8s.io/queue-name: Q`` runs only while Kueue admits it. The route is
Kueue's own model for a job kind (one Workload per job, as its integrations for JobSet or Kubeflow
Trainer's TrainJob keep, and as AppWrapper's controller keeps from outside Kueue): the operator
writes one ``Workload`` (``kueue.x-k8s.io/v1beta2``) per job, owned by it, whose pod sets are the pods the job will run —
the coordinator, each in-cluster inference pool, the trainer's ranks — with their requests, node
selectors and tolerations, and keeps every process scaled to zero until Kueue admits it. Kueue
needs no webhook and no knowledge of EchoJobs for this, and ``spec.suspend`` stays the user's:
GitOps tools never see the operator rewrite the spec they applied.

The contract with Kueue, as its own job reconciler keeps it:

* run only while the Workload's ``Admitted`` condition is True and it is not ``Evicted``;
* when Kueue evicts it (preemption by a higher-priority Workload, ``spec.active: false``), scale
  every process to zero, and once **no pod of the job is left** give the quota back: clear
  ``status.admission``, set ``QuotaReserved`` and ``Admitted`` False and ``Requeued`` True (a
  preempted Workload queues again; one the user deactivated waits), through the status subresource;
* when the job ends, set ``Finished`` True: Kueue releases its quota;
* ``spec.suspend: true`` deactivates the Workload (``spec.active: false``), which also releases quota.

A job that changes the pods it needs while admitted (a pool's ``replicas``) gets a new Workload and
queues again, as Kueue does for its own kinds: quota always matches what runs. A pool without
``replicas`` (scaled by ``kubectl scale`` or an HPA) is counted as one pod: what an autoscaler adds later
is not charged to the queue (docs/operator.md, "Kueue").

The decisions are pure functions of the job and the stored Workload; :func:`admit` is the I/O.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any, Literal

from echo_operator import children, conditions, context, events, names
from echo_operator.children import inputs, pods
from echo_operator.conditions import Condition
from echo_operator.config import Settings
from echo_operator.kube import KubeError

Object = dict[str, Any]

API = "kueue.x-k8s.io/v1beta2"
CRD_API = "apiextensions.k8s.io/v1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MAX_POD_SETS = 8
"""Kueue's limit on a Workload's pod sets when its Workload CRD cannot be read (8 in v0.15-v0.17): the
coordinator, the trainer and at most six pools. Where it can, the limit is the installed CRD's own
(:func:`pod_set_limit`)."""
MIN_KUEUE = "v0.15"
"""The oldest Kueue whose Workloads Echo writes: the first to serve ``kueue.x-k8s.io/v1beta2``."""
WORKLOAD_CRD = "workloads.kueue.x-k8s.io"
_LIMIT_TTL_S = 600.0
_limit_cache: dict[str, tuple[float, int]] = {}
REQUEUED_AFTER = ("Preempted", "NodeFailures")
"""Eviction reasons after which Kueue queues the Workload again on its own (its job reconciler's rule)."""
EVICTIONS_NAMED = ("Preempted", "PodsReadyTimeout")
"""Kueue's eviction reasons that the job's ``Suspended`` condition carries as its own reason (any other
eviction reads ``EvictedByKueue``, Kueue's reason in the message): a higher priority took the quota,
or ``waitForPodsReady``'s timeout passed before every pod of the job was ready."""
_POD_FIELDS = ("nodeSelector", "tolerations", "affinity")
"""What of a pod's spec Kueue reads to place it on a ResourceFlavor, beside the containers' requests."""


def queue_name(body: Mapping[str, Any]) -> str | None:
    """The LocalQueue the job asks for (None: not queued through Kueue)."""
    value = ((body.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    return str(value) if value else None


def priority_class(body: Mapping[str, Any]) -> str | None:
    """The WorkloadPriorityClass the job names (None: Kueue's default priority, 0)."""
    value = ((body.get("metadata") or {}).get("labels") or {}).get(PRIORITY_LABEL)
    return str(value) if value else None


# -- the Workload ----------------------------------------------------------------------------------


def _pod_set(name: str, count: int, template: Mapping[str, Any]) -> Object:
    """One pod set: the pod's containers with their resources, and what places it on a node."""
    pod = template.get("spec") or {}
    containers = [
        {"name": c["name"], "image": c.get("image", ""), "resources": c.get("resources") or {}}
        for c in pod.get("containers") or []
    ]
    spec: Object = {"containers": containers}
    spec.update({f: pod[f] for f in _POD_FIELDS if pod.get(f)})
    return {"name": name, "count": count, "template": {"spec": spec}}


def pod_sets(job: inputs.JobInput, settings: Settings) -> list[Object]:
    """The pods the job runs once admitted, as Kueue pod sets: coordinator, pools, trainer.

    Computed from the children the job would have running (:func:`children.desired` of the job
    neither suspended nor held), so a Workload charges exactly the requests those pods make.
    """
    # As the job asks (never with an admission's placement: the Workload would change with it).
    running = dataclasses.replace(
        job, spec=job.spec.model_copy(update={"suspend": False}), finished=False, held=None, placement={}
    )
    out: list[Object] = []
    for obj in children.desired(running, settings):
        name = children.pod_set_name(obj)
        if name is None:
            continue
        count = (
            obj["spec"].get("replicas", 1)
            if obj["kind"] == "Deployment"
            else obj["spec"].get("parallelism", 1)
        )
        if count:
            out.append(_pod_set(name, int(count), obj["spec"]["template"]))
    return out


def placement(
    wl: Mapping[str, Any] | None, flavors: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, inputs.Placement]:
    """Where an admitted Workload's pod sets go: per pod set, the node labels and tolerations of the
    ResourceFlavors ``status.admission.podSetAssignments`` gave it (``flavors``: name → the stored
    ResourceFlavor), then what admission checks' ``podSetUpdates`` add. Empty while not admitted."""
    if not admitted(wl):
        return {}
    status = (wl or {}).get("status") or {}
    out: dict[str, inputs.Placement] = {}
    for assignment in (status.get("admission") or {}).get("podSetAssignments") or []:
        selector: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        for flavor_name in sorted(set((assignment.get("flavors") or {}).values())):
            flavor_spec = (flavors.get(flavor_name) or {}).get("spec") or {}
            selector.update(flavor_spec.get("nodeLabels") or {})
            tolerations += [t for t in flavor_spec.get("tolerations") or [] if t not in tolerations]
        out[str(assignment["name"])] = inputs.Placement(selector, tuple(tolerations))
    for check in status.get("admissionChecks") or []:
        for update in check.get("podSetUpdates") or []:
            before = out.get(str(update.get("name")), inputs.Placement())
            added = [t for t in update.get("tolerations") or [] if t not in before.tolerations]
            out[str(update.get("name"))] = inputs.Placement(
                {**before.node_selector, **(update.get("nodeSelector") or {})}, (*before.tolerations, *added)
            )
    return out


def flavor_names(wl: Mapping[str, Any] | None) -> list[str]:
    """The ResourceFlavors an admitted Workload's pod sets were assigned."""
    assignments = ((((wl or {}).get("status") or {}).get("admission") or {}).get("podSetAssignments")) or []
    return sorted({f for a in assignments for f in (a.get("flavors") or {}).values()})


SUSPENDED_MARK = "echorl.dev/deactivated-for-suspend"
"""On a Workload the operator deactivated because the EchoJob's ``spec.suspend`` is true: the only
deactivation the operator undoes. One made by Kueue (``waitForPodsReady``'s requeue limit) or an admin
(``kueuectl stop workload``) stays until they reactivate it."""


def deactivated_by_others(stored: Mapping[str, Any] | None) -> bool:
    """Whether ``stored`` is inactive, and not because the operator suspended it."""
    if stored is None or (stored.get("spec") or {}).get("active") is not False:
        return False
    return SUSPENDED_MARK not in ((stored.get("metadata") or {}).get("annotations") or {})


def workload(
    job: inputs.JobInput,
    settings: Settings,
    queue: str,
    priority: tuple[str, int] | None,
    stored: Mapping[str, Any] | None = None,
) -> Object:
    """The Workload the operator applies for ``job`` (``priority``: the class's name and value). It is
    active unless the job is suspended, or ``stored`` (the Workload as it is) was deactivated by
    Kueue or an admin: the operator never reactivates what it did not deactivate."""
    suspend = bool(job.spec.suspend)
    spec: Object = {
        "queueName": queue,
        "podSets": pod_sets(job, settings),
        "active": not suspend and not deactivated_by_others(stored),
    }
    if priority is not None:
        name, value = priority
        spec["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": name}
        spec["priority"] = value
    return {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {
            "name": names.workload(job.name),
            "namespace": job.namespace,
            "labels": {names.JOB: job.name},
            **({"annotations": {SUSPENDED_MARK: "true"}} if suspend else {}),
            "ownerReferences": [pods.owner_reference(job)],
        },
        "spec": spec,
    }


def too_many_pod_sets(job: inputs.JobInput, settings: Settings, limit: int = MAX_POD_SETS) -> str | None:
    """Why Kueue cannot take this job (None: it can); ``limit`` is the installed Kueue's."""
    n = len(pod_sets(job, settings))
    if n <= limit:
        return None
    return (
        f"Kueue admits at most {limit} pod sets per Workload (the coordinator, the trainer and "
        f"{limit - 2} in-cluster pools); this job needs {n}: merge pools or drop the "
        f"{QUEUE_LABEL} label"
    )


def pod_set_limit(crd: Mapping[str, Any]) -> int | None:
    """The most pod sets the installed Kueue takes (its Workload CRD's ``spec.podSets.maxItems`` in
    ``v1beta2``), or None when that version is not served: Kueue older than :data:`MIN_KUEUE`."""
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") != API.split("/")[1] or not version.get("served"):
            continue
        schema = ((version.get("schema") or {}).get("openAPIV3Schema") or {}).get("properties") or {}
        pod_sets_schema = ((schema.get("spec") or {}).get("properties") or {}).get("podSets") or {}
        return int(pod_sets_schema.get("maxItems") or MAX_POD_SETS)
    return None


def _pod_set_limit(ctx: context.Context, body: Mapping[str, Any]) -> int:
    """The installed Kueue's pod-set limit, read from its CRD every 10 minutes at most; the default
    when the CRD cannot be read (the namespaced install may not). A Kueue too old is a fault."""
    now = time.monotonic()
    cached = _limit_cache.get(WORKLOAD_CRD)
    if cached is not None and now - cached[0] < _LIMIT_TTL_S:
        return cached[1]
    try:
        crd = ctx.kube.get(CRD_API, "CustomResourceDefinition", None, WORKLOAD_CRD)
    except KubeError as exc:
        if exc.status != 403:
            raise
        crd = None
    limit = MAX_POD_SETS
    if crd is not None:
        found = pod_set_limit(crd)
        if found is None:
            served = [v.get("name") for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")]
            raise ctx.fault(
                body, "KueueTooOld",
                f"the installed Kueue serves Workloads as {', '.join(map(str, served))}; Echo writes "
                f"{API} Workloads: upgrade Kueue to {MIN_KUEUE} or newer",
            )  # fmt: skip
        limit = found
    _limit_cache[WORKLOAD_CRD] = (now, limit)
    return limit


def _resources(pod_set: Mapping[str, Any]) -> list[Any]:
    spec = (pod_set.get("template") or {}).get("spec") or {}
    return [
        [c.get("name"), (c.get("resources") or {}).get("requests"), (c.get("resources") or {}).get("limits")]
        for c in spec.get("containers") or []
    ] + [spec.get(f) for f in _POD_FIELDS]


def same_pods(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether the stored Workload charges for the pods ``wanted`` describes (names, counts, requests,
    placement): Kueue's defaults filled into the stored copy do not count as a difference."""

    def key(wl: Mapping[str, Any]) -> list[Any]:
        sets = (wl.get("spec") or {}).get("podSets") or []
        return [[p.get("name"), p.get("count"), _resources(p)] for p in sets]

    return key(stored) == key(wanted)


# -- what Kueue says -------------------------------------------------------------------------------


def _conditions(wl: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in ((wl or {}).get("status") or {}).get("conditions") or []}


def _true(conds: Mapping[str, Mapping[str, Any]], kind: str) -> bool:
    return conds.get(kind, {}).get("status") == "True"


def admitted(wl: Mapping[str, Any] | None) -> bool:
    """Kueue admitted the Workload and has not evicted it: the job may run."""
    conds = _conditions(wl)
    return _true(conds, "Admitted") and not _true(conds, "Evicted") and not _true(conds, "Finished")


def holds_quota(wl: Mapping[str, Any] | None) -> bool:
    """The Workload still holds quota (an admission, or ``QuotaReserved`` True)."""
    return bool(((wl or {}).get("status") or {}).get("admission")) or _true(_conditions(wl), "QuotaReserved")


def evicted(wl: Mapping[str, Any] | None) -> bool:
    """Kueue evicted the Workload and it still holds quota: the job must stop, then give it back."""
    return _true(_conditions(wl), "Evicted") and holds_quota(wl)


def finished(wl: Mapping[str, Any] | None) -> bool:
    return _true(_conditions(wl), "Finished")


def hold(wl: Mapping[str, Any] | None, queue: str, workload_name: str) -> inputs.Hold | None:
    """Why the job must not run now (None: Kueue admitted it, or the Workload is finished)."""
    if admitted(wl) or finished(wl):
        return None
    conds = _conditions(wl)
    if deactivated_by_others(wl):
        ev = conds.get("Evicted") or {}
        why = f" ({ev.get('reason', '?')}: {ev.get('message', '')})" if ev.get("status") == "True" else ""
        return inputs.Hold(
            "WorkloadDeactivated",
            f"Workload {workload_name} was deactivated by Kueue or an admin{why}; every process stays scaled "
            f"to zero until it is active again (kueuectl resume workload {workload_name}, or set its "
            "spec.active to true)",
        )
    if _true(conds, "Evicted"):
        ev = conds["Evicted"]
        return inputs.Hold(
            str(ev["reason"]) if ev.get("reason") in EVICTIONS_NAMED else "EvictedByKueue",
            f"Kueue evicted Workload {workload_name} ({ev.get('reason', '?')}: {ev.get('message', '')}); "
            "every process is scaled to zero and the job resumes from its checkpoint once admitted again",
        )
    if wl is not None and (wl.get("spec") or {}).get("active") is False:
        return inputs.Hold("Deactivated", f"Workload {workload_name} is inactive while spec.suspend is true")
    waiting = conds.get("QuotaReserved", {}).get("message") or "not admitted yet"
    return inputs.Hold(
        "Queued",
        f"waiting for Kueue to admit Workload {workload_name} from LocalQueue {queue}: {waiting}",
    )


def released(wl: Mapping[str, Any], now: str) -> Object:
    """The evicted Workload with its quota given back (what Kueue's job reconciler writes once the
    job's pods are gone): no admission, ``QuotaReserved``/``Admitted`` False, ``Requeued`` True
    after a preemption (Kueue then queues it again) and False otherwise."""
    ev = _conditions(wl).get("Evicted", {})
    reason, message = str(ev.get("reason", "Evicted")), str(ev.get("message", "evicted"))
    out = _with_conditions(
        wl,
        [
            Condition("QuotaReserved", "False", "Pending", message),
            Condition("Admitted", "False", "NoReservation", "The workload has no reservation"),
            Condition("Requeued", "True" if reason in REQUEUED_AFTER else "False", reason, message),
        ],
        now,
    )
    out["status"].pop("admission", None)
    return out


def with_finished(
    wl: Mapping[str, Any], outcome: Literal["Succeeded", "Failed"], message: str, now: str
) -> Object:
    """The Workload marked ``Finished`` (``outcome``: Succeeded or Failed): Kueue frees its quota."""
    return _with_conditions(wl, [Condition("Finished", "True", outcome, message)], now)


def with_pods_ready(wl: Mapping[str, Any], ready: bool, now: str) -> Object | None:
    """The Workload with ``PodsReady`` saying ``ready`` (None: it says so already), with Kueue's reasons:
    ``PodsReady``, or ``WaitForStart`` before the job's pods were first ready and ``WaitForRecovery``
    after. Kueue's ``waitForPodsReady`` evicts (and requeues) a Workload that is not ready in time."""
    current = _conditions(wl).get("PodsReady") or {}
    if current.get("status") == ("True" if ready else "False"):
        return None
    if ready:
        cond = Condition(
            "PodsReady", "True", "PodsReady", "All pods reached readiness and the workload is running"
        )
    else:
        was_ready = current.get("status") == "True" or current.get("reason") == "WaitForRecovery"
        cond = Condition(
            "PodsReady", "False", "WaitForRecovery" if was_ready else "WaitForStart",
            "Not all pods are ready or succeeded",
        )  # fmt: skip
    return _with_conditions(wl, [cond], now)


def _with_conditions(wl: Mapping[str, Any], new: list[Condition], now: str) -> Object:
    """A copy of ``wl`` with ``new`` merged into its conditions (the operator's one merge rule:
    transition times kept where the status did not change, Kueue's other conditions left alone)."""
    status = dict(wl.get("status") or {})
    generation = (wl.get("metadata") or {}).get("generation")
    status["conditions"] = conditions.merge(status.get("conditions") or [], new, generation, now)
    return {**wl, "status": status}


# -- I/O -------------------------------------------------------------------------------------------


def _priority(ctx: context.Context, body: Mapping[str, Any]) -> tuple[str, int] | None:
    name = priority_class(body)
    if name is None:
        return None
    try:
        found = ctx.kube.get(API, "WorkloadPriorityClass", None, name)
    except KubeError as exc:
        if exc.status == 403:
            message = f"cannot read WorkloadPriorityClass {name}: {exc.message}"
            raise ctx.fault(body, "KueueForbidden", message) from None
        raise
    if found is None:
        raise ctx.fault(
            body,
            "PriorityClassNotFound",
            f"metadata.labels[{PRIORITY_LABEL}]: WorkloadPriorityClass {name!r} does not exist",
        )
    return name, int(found.get("value", 0))


def pods_left(ctx: context.Context, job: inputs.JobInput) -> int:
    """How many pods of the job still exist (terminating ones included)."""
    return len(ctx.kube.list("v1", "Pod", job.namespace, {names.JOB: job.name}))


def admit(
    ctx: context.Context,
    body: Mapping[str, Any],
    job: inputs.JobInput,
    queue: str,
    outcome: Literal["Succeeded", "Failed"] | None,
) -> tuple[inputs.Hold | None, dict[str, inputs.Placement]]:
    """Keep the job's Workload in line with the job; return why the job must not run (None: run) and,
    once admitted, where each pod set goes (:func:`placement`).

    ``outcome`` is how the job ended (Succeeded / Failed), if it did: the Workload is then marked
    Finished so that its quota is released.
    """
    kube, name = ctx.kube, names.workload(job.name)
    problem = too_many_pod_sets(job, ctx.settings, _pod_set_limit(ctx, body))
    if problem is not None:
        raise ctx.fault(body, "TooManyPodSets", problem)
    try:
        stored = kube.get(API, "Workload", job.namespace, name)
    except KubeError as exc:
        raise _kueue_problem(ctx, body, exc) from None
    if stored is not None and not context.owned_by(stored, job.uid):
        raise ctx.fault(body, "WorkloadNotOwned", f"Workload {name} exists and belongs to something else")
    if outcome is not None:
        if stored is not None and not finished(stored):
            done = with_finished(stored, outcome, f"the EchoJob {outcome.lower()}", events.now_rfc3339())
            kube.replace_status(API, "Workload", job.namespace, name, done)
        return None, {}
    wanted = workload(job, ctx.settings, queue, _priority(ctx, body), stored)
    if stored is not None and holds_quota(stored) and not same_pods(stored, wanted) and not evicted(stored):
        # The job now needs other pods than the quota was reserved for: queue it again, as Kueue does.
        kube.delete(API, "Workload", job.namespace, name, uid=stored["metadata"]["uid"])
        ctx.events.post(
            body, "Normal", "WorkloadRecreated",
            f"the job's pods changed while admitted: Workload {name} is made anew and queued again",
        )  # fmt: skip
        stored = None
    if stored is None or not holds_quota(stored):
        try:
            stored = kube.apply(wanted)
        except KubeError as exc:
            raise _kueue_problem(ctx, body, exc) from None
    elif (stored.get("spec") or {}).get("active") != wanted["spec"]["active"]:
        stored = kube.apply(wanted)  # suspend or resume: only `active` may change while admitted
    if evicted(stored) and pods_left(ctx, job) == 0:
        kube.replace_status(API, "Workload", job.namespace, name, released(stored, events.now_rfc3339()))
        ctx.events.post(
            body, "Normal", "QuotaReleased",
            f"every pod of the job is gone: Workload {name} gave its quota back to its ClusterQueue",
        )  # fmt: skip
    return hold(stored, queue, name), placement(stored, _flavors(ctx, body, flavor_names(stored)))


def _flavors(ctx: context.Context, body: Mapping[str, Any], wanted: list[str]) -> dict[str, Object | None]:
    """The ResourceFlavors ``wanted`` (cluster-scoped: the namespaced install cannot read them)."""
    out: dict[str, Object | None] = {}
    for name in wanted:
        try:
            out[name] = ctx.kube.get(API, "ResourceFlavor", None, name)
        except KubeError as exc:
            if exc.status == 403:
                raise ctx.fault(
                    body, "KueueForbidden",
                    f"cannot read ResourceFlavor {name} to place the job's pods on its nodes: {exc.message} "
                    "(the cluster-wide install grants it; the namespaced one cannot)",
                ) from None  # fmt: skip
            raise
    return out


def forget(ctx: context.Context, body: Mapping[str, Any], job: inputs.JobInput) -> None:
    """The job no longer names a queue: delete its Workload, if it has one, so no quota stays held."""
    name = names.workload(job.name)
    try:
        stored = ctx.kube.get(API, "Workload", job.namespace, name)
    except KubeError as exc:
        if exc.status in (403, 404):  # no Kueue API here, or not ours to read: nothing to forget
            return
        raise
    if stored is not None and context.owned_by(stored, job.uid):
        ctx.kube.delete(API, "Workload", job.namespace, name, uid=stored["metadata"]["uid"])
        ctx.events.post(
            body, "Normal", "WorkloadDeleted",
            f"the job no longer names a queue ({QUEUE_LABEL}): Workload {name} is deleted and its quota freed",
        )  # fmt: skip


def _kueue_problem(ctx: context.Context, body: Mapping[str, Any], exc: KubeError) -> Exception:
    if exc.status == 404:
        return ctx.fault(
            body,
            "KueueNotInstalled",
            f"metadata.labels[{QUEUE_LABEL}] asks for Kueue, but the API server does not serve {API} "
            "Workloads: install Kueue or drop the label",
        )
    if exc.status in (403, 422):
        return ctx.fault(
            body, "WorkloadRejected", f"Workload {names.workload(body['metadata']['name'])}: {exc.message}"
        )
    return exc


def report_pods_ready(ctx: context.Context, job: inputs.JobInput, ready: bool) -> None:
    """Write ``PodsReady`` on the job's admitted Workload when it changed (a conflict with Kueue's own
    write is tried again at the next pass)."""
    name = names.workload(job.name)
    stored = ctx.kube.get(API, "Workload", job.namespace, name)
    if stored is None or not admitted(stored) or not context.owned_by(stored, job.uid):
        return
    updated = with_pods_ready(stored, ready, events.now_rfc3339())
    if updated is None:
        return
    try:
        ctx.kube.replace_status(API, "Workload", job.namespace, name, updated)
    except KubeError as exc:
        if not exc.conflict:
            raise


def current_hold(ctx: context.Context, job: inputs.JobInput, queue: str) -> tuple[inputs.Hold | None, bool]:
    """What the stored Workload says now: the hold, and whether an eviction awaits its release."""
    name = names.workload(job.name)
    stored = ctx.kube.get(API, "Workload", job.namespace, name)
    return hold(stored, queue, name), evicted(stored)
