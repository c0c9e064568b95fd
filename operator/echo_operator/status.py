"""An EchoJob's ``status``, computed from what the operator observed: a pure function.

Inputs are the job's resolved spec (or None when it could not be resolved), the coordinator's status
document (or why it could not be read), the job's Deployments and trainer Job as stored, its pods
that cannot be scheduled, the pools that cannot keep up with Δmax, the faults that stopped the reconcile (:class:`Fault`),
and how the job ended (:mod:`echo_operator.lifecycle`). Output is the whole status document
(:class:`echo_runtime.spec.EchoJobStatus` in manifest form), with ``None`` for every value not known,
so a merge patch of it also clears what is no longer true.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from echo_operator import names
from echo_operator.children import inputs
from echo_operator.conditions import Condition
from echo_operator.lifecycle import Outcome
from echo_operator.pool_lag import PoolLag
from echo_runtime.coordinator import wire

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Fault:
    """Something a user can fix that stopped the reconcile (a missing reference, an unreachable store):
    a CamelCase reason, which becomes the conditions' reason, and a message for humans."""

    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one status pass saw."""

    generation: int | None
    """The newest generation whose children were applied (``observedGeneration``)."""
    suspended: bool
    job: inputs.JobInput | None
    faults: tuple[Fault, ...] = ()
    coordinator: wire.StatusDocument | None = None
    coordinator_error: str | None = None
    unreadable_s: float = 0.0
    """How long the coordinator's status has failed to read, on consecutive tries (0: it was read)."""
    deployments: Mapping[str, Object] = dataclasses.field(default_factory=dict)
    """The job's Deployments by name, as stored (their ``status`` is the controllers')."""
    trainer: Object | None = None
    """The trainer Job as stored."""
    behind: Mapping[str, PoolLag] = dataclasses.field(default_factory=dict)
    """Pools that cannot keep up (behind for longer than the grace period)."""
    restarted: tuple[str, ...] = ()
    """Worker pods deleted in this pass."""
    pending: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Component (``trainer``, ``coordinator`` or a pool's name) → why its pods cannot be scheduled."""
    pending_pods: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Component → how many of its pods are Pending."""
    outcome: Outcome | None = None
    """How the job ended (None while it runs)."""
    restarts: int = 0
    final_version: int | None = None
    """The policy version the store held when the job Succeeded."""
    start_time: str | None = None


def _ready_replicas(obj: Object | None) -> tuple[int, int]:
    """(desired, ready) pods of a Deployment or of the trainer Job."""
    if obj is None:
        return 0, 0
    if obj.get("kind") == "Job":
        return int(obj.get("spec", {}).get("parallelism", 1)), int(obj.get("status", {}).get("ready", 0) or 0)
    spec_replicas = obj.get("spec", {}).get("replicas", 1)
    ready = obj.get("status", {}).get("readyReplicas", 0) or 0
    return int(spec_replicas if spec_replicas is not None else 1), int(ready)


def _finished(job: Object | None) -> bool:
    """Whether the trainer Job completed (every rank exited 0): its pods are gone for a good reason."""
    conditions_ = (job or {}).get("status", {}).get("conditions") or []
    return any(c.get("type") == "Complete" and c.get("status") == "True" for c in conditions_)


def pods_ready(obs: Observation) -> bool:
    """Every pod the running job needs is ready — what Kueue's ``PodsReady`` means: the coordinator and
    each Deployment of the job at its replicas, and every trainer rank (or the trainer done)."""
    if obs.job is None or not obs.job.active:
        return False
    if names.coordinator(obs.job.name) not in obs.deployments:
        return False
    for deployment in obs.deployments.values():
        desired, ready = _ready_replicas(deployment)
        if ready < desired:
            return False
    if _finished(obs.trainer):
        return True
    desired, ready = _ready_replicas(obs.trainer)
    return obs.trainer is not None and ready >= desired


UNREACHABLE_GRACE_S = 30.0
"""How long a ready coordinator's status may fail to read before the job is Degraded: a new operator's
first read, or one during a coordinator's restart, is not a problem."""


def pending(pods: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], dict[str, int]]:
    """Which components have pods the scheduler cannot place, and why (the scheduler's own message).

    Returns (component → explanation of its first unschedulable pod, component → Pending pods).
    A component is a pool's name, ``trainer`` or ``coordinator``.
    """
    why: dict[str, str] = {}
    count: dict[str, int] = {}
    for pod in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", "")):
        if pod.get("status", {}).get("phase") != "Pending" or pod.get("metadata", {}).get(
            "deletionTimestamp"
        ):
            continue
        labels = pod.get("metadata", {}).get("labels", {})
        component = labels.get(names.POOL) or labels.get(names.COMPONENT, "?")
        count[component] = count.get(component, 0) + 1
        for cond in pod.get("status", {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and component not in why:
                why[component] = (
                    f"pod {pod['metadata']['name']}: {cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".strip()
                )
    return why, count


def pool_statuses(obs: Observation) -> list[Object]:
    """``status.pools``: pods from the Deployments, workers and versions from the coordinator."""
    if obs.job is None:
        return []
    doc = obs.coordinator
    out: list[Object] = []
    for pool in obs.job.pools:
        deployment = obs.deployments.get(names.pool(obs.job.name, pool.name))
        replicas = int((deployment or {}).get("status", {}).get("replicas", 0) or 0)
        _, ready = _ready_replicas(deployment)
        summary = doc.pools.get(pool.name) if doc else None
        external = [
            {
                "id": w.id,
                "backend": w.backend,
                "device": w.device,
                "loadedVersion": w.loaded_version,
                "lastHeartbeat": w.last_heartbeat,
            }
            for w in (doc.workers if doc else [])
            if w.pool == pool.name and w.external
        ]
        entry: Object = {
            "name": pool.name,
            "replicas": replicas,
            "readyReplicas": ready,
            "pending": obs.pending_pods.get(pool.name, 0),
            "workers": summary.workers if summary else 0,
            "observedPolicyVersion": summary.min_loaded_version if summary else None,
            "quarantined": summary.quarantined if summary else 0,
            "externalWorkers": [{k: v for k, v in w.items() if v is not None} for w in external],
        }
        out.append(entry)
    return out


def _suspended(obs: Observation) -> Condition:
    held = _queue_hold(obs)
    if held is not None:
        return Condition("Suspended", "True", held.reason, held.message)
    if obs.suspended:
        return Condition(
            "Suspended",
            "True",
            "JobSuspended",
            "spec.suspend is true: every process is scaled to zero; snapshots and checkpoints are kept",
        )
    return Condition("Suspended", "False", "NotSuspended", "the job runs")


def _queue_hold(obs: Observation) -> inputs.Hold | None:
    """Why Kueue keeps the job from running, unless the user's ``spec.suspend`` is the reason."""
    job = obs.job
    return job.held if job is not None and not job.spec.suspend else None


def _why_suspended(obs: Observation) -> str:
    held = _queue_hold(obs)
    if held is not None:
        return f"the job is held by its queue: {held.message}"
    return "the job is suspended"


def _ready(obs: Observation) -> Condition:
    if obs.outcome is not None:
        return Condition(
            "Ready",
            "False",
            f"Job{obs.outcome.type}",
            f"the job {obs.outcome.type.lower()}: its processes are scaled to zero",
        )
    if obs.suspended:
        return Condition("Ready", "False", "Suspended", _why_suspended(obs))
    if obs.faults:
        return Condition("Ready", "False", obs.faults[0].reason, obs.faults[0].message)
    job = obs.job
    if job is None:
        return Condition("Ready", "False", "Reconciling", "the operator has not reconciled this job yet")
    pools = {p.name for p in job.pools}
    for component, why in obs.pending.items():
        what = f"pool {component}" if component in pools else f"the {component}"
        reason = "PoolPending" if component in pools else f"{component.capitalize()}Pending"
        count = obs.pending_pods.get(component, 0)
        return Condition(
            "Ready", "False", reason, f"{what} has {count} pod(s) that cannot be scheduled: {why}"
        )
    doc = obs.coordinator
    if doc is None:
        why = f": {obs.coordinator_error}" if obs.coordinator_error else ""
        return Condition("Ready", "False", "CoordinatorNotReady", f"waiting for the coordinator{why}")
    desired, ready = _ready_replicas(obs.trainer)
    if ready < desired and _finished(obs.trainer):
        return Condition(
            "Ready", "False", "TrainerFinished", "the trainer finished its last step; the job ends next"
        )
    if ready < desired:
        return Condition("Ready", "False", "TrainerNotReady", f"{ready} of {desired} trainer pod(s) ready")
    empty = [
        p.name
        for p in job.pools
        if not p.spec.external
        and _wanted(obs, p) > 0
        and (doc.pools.get(p.name) is None or doc.pools[p.name].workers == 0)
    ]
    if empty:
        return Condition(
            "Ready", "False", "PoolsNotReady", f"no worker registered yet in pool(s) {', '.join(empty)}"
        )
    if not doc.workers:
        return Condition(
            "Ready", "False", "NoWorkers", "no inference worker is registered with the coordinator"
        )
    total = len(doc.workers)
    return Condition(
        "Ready",
        "True",
        "AllComponentsReady",
        f"coordinator, {desired} trainer pod(s) and {total} worker(s) in {len(job.pools)} pool(s) are up",
    )


def _wanted(obs: Observation, pool: inputs.Pool) -> int:
    deployment = obs.deployments.get(names.pool(obs.job.name if obs.job else "", pool.name))
    if deployment is not None:
        return _ready_replicas(deployment)[0]
    return pool.spec.replicas if pool.spec.replicas is not None else 1


def _progressing(obs: Observation) -> Condition:
    if obs.outcome is not None:
        if obs.outcome.type == "Succeeded":
            return Condition("Progressing", "False", "Completed", obs.outcome.message)
        return Condition("Progressing", "False", "Failed", "the job failed; see the Failed condition")
    if obs.suspended:
        return Condition("Progressing", "False", "Suspended", _why_suspended(obs))
    if obs.faults:
        return Condition("Progressing", "False", obs.faults[0].reason, obs.faults[0].message)
    doc, job = obs.coordinator, obs.job
    if job is None:
        return Condition("Progressing", "True", "Reconciling", "the operator has not reconciled this job yet")
    if doc is None:
        return Condition(
            "Progressing", "Unknown", "AwaitingCoordinator", "no status from the coordinator yet"
        )
    max_steps = job.spec.algorithm.max_steps
    if doc.policy_version >= max_steps:
        return Condition(
            "Progressing",
            "False",
            "Completed",
            f"trained {doc.policy_version} of {max_steps} policy versions",
        )
    return Condition(
        "Progressing",
        "True",
        "Training",
        f"policy version {doc.policy_version} of {max_steps}; {doc.rollouts_per_second:.1f} rollouts/s",
    )


def max_observed(obs: Observation, previous: Mapping[str, Any]) -> int | None:
    """The largest staleness any optimizer step consumed over the whole run: the coordinator counts only
    since it (last) started, so the largest the status ever recorded is kept across its restarts."""
    now = obs.coordinator.max_observed_staleness if obs.coordinator is not None else None
    values = [v for v in (previous.get("maxObservedStaleness"), now) if v is not None]
    return max(values) if values else None


def _bounded(obs: Observation, previous: Mapping[str, Any]) -> Condition:
    doc, job = obs.coordinator, obs.job
    if doc is None and obs.outcome is not None and job is not None:
        # The coordinator is gone with the job's end: the verdict is on what it reported last.
        observed, bound = previous.get("maxObservedStaleness"), job.sync_policy.max_staleness
        if observed is not None and observed > bound:
            return Condition(
                "StalenessBounded",
                "False",
                "BoundExceeded",
                f"max observed staleness {observed} > Δmax {bound}",
            )
        return Condition(
            "StalenessBounded", "True", "WithinBound",
            f"max observed staleness {'none' if observed is None else observed} ≤ Δmax {bound} over the whole run",
        )  # fmt: skip
    if doc is None or job is None:
        return Condition(
            "StalenessBounded", "Unknown", "AwaitingCoordinator", "no status from the coordinator yet"
        )
    bound, most = doc.max_staleness, max_observed(obs, previous)
    if most is not None and most > bound:
        return Condition(
            "StalenessBounded",
            "False",
            "BoundExceeded",
            f"an optimizer step consumed a rollout with staleness {most} > Δmax {bound}",
        )
    if obs.behind:
        details = "; ".join(lag.describe(doc.mode) for lag in obs.behind.values())
        restarted = f"; restarted {len(obs.restarted)} stuck worker pod(s)" if obs.restarted else ""
        pools = ", ".join(obs.behind)
        return Condition(
            "StalenessBounded",
            "False",
            "PoolFallingBehind",
            f"pool(s) {pools} cannot keep up with Δmax {bound}: {details}; "
            f"{doc.dropped_stale} group(s) dropped as stale so far{restarted}",
        )
    observed = "none yet" if most is None else str(most)
    return Condition(
        "StalenessBounded",
        "True",
        "WithinBound",
        f"max observed staleness {observed} ≤ Δmax {bound}; {doc.dropped_stale} group(s) dropped as stale",
    )


_SIGNAL_REASONS = {"no learning signal": "NoSignal", "nearly every group is filtered": "NearlyAllFiltered"}


def _learning(obs: Observation, previous: Mapping[str, Any]) -> Condition:
    """False while the coordinator warns that the job learns nothing (its ``warnings``, docs/contracts.md);
    while it cannot be read, the last verdict stands."""
    doc = obs.coordinator
    if doc is None:
        for old in previous.get("conditions") or []:
            if old.get("type") == "LearningSignal":
                return Condition("LearningSignal", old["status"], old["reason"], old.get("message", ""))
        return Condition(
            "LearningSignal", "Unknown", "AwaitingCoordinator", "no status from the coordinator yet"
        )
    for warning in doc.warnings:
        kind = warning.split(":", 1)[0]
        if kind in _SIGNAL_REASONS:
            return Condition("LearningSignal", "False", _SIGNAL_REASONS[kind], warning)
    if doc.consumed_groups == 0:
        return Condition("LearningSignal", "Unknown", "NoBatchYet", "no batch handed to the trainer yet")
    return Condition(
        "LearningSignal", "True", "SignalPresent", "recent batches hold groups whose rewards differ"
    )


def _degraded(obs: Observation, previous: Mapping[str, Any]) -> Condition:
    if obs.outcome is not None and obs.outcome.type == "Failed":
        return Condition("Degraded", "True", obs.outcome.reason, obs.outcome.message)
    if obs.faults:
        return Condition("Degraded", "True", obs.faults[0].reason, "; ".join(p.message for p in obs.faults))
    doc, most = obs.coordinator, max_observed(obs, previous)
    if doc is not None and most is not None and most > doc.max_staleness:
        return Condition(
            "Degraded", "True", "BoundExceeded", "the staleness bound was broken; see StalenessBounded"
        )
    if doc is not None and doc.quarantined:
        caught = "; ".join(
            f"{q.id} (pool {q.pool}, {q.trained_groups} group(s) trained on before it was caught): {q.reason}"
            for q in doc.quarantined[:3]
        )
        more = f"; and {len(doc.quarantined) - 3} more" if len(doc.quarantined) > 3 else ""
        return Condition(
            "Degraded",
            "True",
            "WorkersQuarantined",
            f"{len(doc.quarantined)} worker(s) quarantined by the trainer, their rollouts dropped: {caught}{more}",
        )
    if doc is None and not obs.suspended and obs.outcome is None and obs.job is not None:
        coordinator = obs.deployments.get(names.coordinator(obs.job.name))
        if _ready_replicas(coordinator)[1] > 0 and obs.unreadable_s >= UNREACHABLE_GRACE_S:
            return Condition(
                "Degraded",
                "True",
                "CoordinatorUnreachable",
                f"the coordinator's pod is ready but its status has not been readable for "
                f"{obs.unreadable_s:.0f} s: {obs.coordinator_error}",
            )
    return Condition("Degraded", "False", "AsExpected", "no problem found")


def conditions(obs: Observation, previous: Mapping[str, Any] | None = None) -> list[Condition]:
    """Every condition of the job; ``Succeeded`` or ``Failed`` only once it ended (they stay True)."""
    previous = previous or {}
    out = [
        _ready(obs),
        _progressing(obs),
        _bounded(obs, previous),
        _learning(obs, previous),
        _degraded(obs, previous),
        _suspended(obs),
    ]
    if obs.outcome is not None:
        out.append(Condition(obs.outcome.type, "True", obs.outcome.reason, obs.outcome.message))
    return out


_FROM_COORDINATOR = (
    "policyVersion",
    "maxObservedStaleness",
    "droppedStale",
    "weightedStale",
    "reward",
    "quarantinedWorkers",
)


def job_status(obs: Observation, previous: Mapping[str, Any] | None = None) -> Object:
    """Every field of ``status`` except ``conditions`` (see :func:`conditions`).

    While the coordinator cannot be read (restarting, suspended) the last values it reported are
    kept: they are the last observation, and the conditions say it is not a fresh one.
    """
    doc, job = obs.coordinator, obs.job
    out: Object = {
        "observedGeneration": obs.generation,
        "mode": job.sync_policy.mode if job else None,
        "maxStaleness": job.sync_policy.max_staleness if job else None,
        "rolloutsPerSecond": round(doc.rollouts_per_second, 3) if doc else None,
        "pools": pool_statuses(obs),
        "startTime": obs.start_time,
        "completionTime": obs.outcome.time if obs.outcome and obs.outcome.type == "Succeeded" else None,
        "restarts": obs.restarts,
    }
    if doc is not None:
        out.update(
            policyVersion=doc.policy_version,
            maxObservedStaleness=max_observed(obs, previous or {}),
            droppedStale=doc.dropped_stale,
            weightedStale=doc.weighted_stale,
            reward=doc.reward,
            quarantinedWorkers=len(doc.quarantined),
        )
    else:
        out.update({key: (previous or {}).get(key) for key in _FROM_COORDINATOR})
    if obs.final_version is not None:
        out["policyVersion"] = obs.final_version
    return out


FIGURES = (
    "rolloutsPerSecond",
    "reward",
    "policyVersion",
    "maxObservedStaleness",
    "droppedStale",
    "weightedStale",
)
"""Fields of ``status`` that move on every pass of a running job (written at most every
``ECHORL_STATUS_WRITE_INTERVAL`` seconds when nothing else changed)."""
POOL_FIGURES = ("observedPolicyVersion",)
WORKER_FIGURES = ("loadedVersion", "lastHeartbeat")


FIGURE_CONDITIONS = ("Progressing", "StalenessBounded", "LearningSignal")
"""Conditions whose message restates moving figures ("policy version 41 of 200; 3.2 rollouts/s"): a
change of their message alone waits with the figures. Any other message (Kueue's reason for queueing a
job, a problem's description) is written at once, as is any change of a status or a reason."""


def without_figures(status: Mapping[str, Any]) -> Object:
    """``status`` less its :data:`FIGURES` (and the pools' and external workers' moving ones), and the
    :data:`FIGURE_CONDITIONS` less their messages."""
    out = {k: v for k, v in status.items() if k not in FIGURES}
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "message" or c.get("type") not in FIGURE_CONDITIONS}
        for c in status.get("conditions") or []
    ]
    out["pools"] = [
        {
            **{k: v for k, v in pool.items() if k not in POOL_FIGURES},
            "externalWorkers": [
                {k: v for k, v in w.items() if k not in WORKER_FIGURES}
                for w in pool.get("externalWorkers") or []
            ],
        }
        for pool in status.get("pools") or []
    ]
    return out


def differs(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` would change ``current`` (absent and ``None`` count as equal)."""
    keys = set(current) | set(new)
    return any(_norm(current.get(k)) != _norm(new.get(k)) for k in keys)


def _norm(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _norm(v) for k, v in value.items() if v is not None}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_norm(v) for v in value]
    return value
