"""Reference resolution: an EchoJob's ``syncPolicyRef``, ``trainingSwarmRef`` and pools' ``swarmRef``.

:func:`wanted` lists what a job references (each object once, in the order the spec names them);
:func:`refers` says whether a job (as stored) references an object, so a change to that object
reconciles exactly the jobs that use it. :func:`resolve` reads the referenced objects from the job's
namespace and returns the job with every reference replaced by its spec; a missing one is a problem
the user can fix (``ReferenceNotFound``, naming every missing object), not an error to retry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic

from echo_operator import context
from echo_runtime import spec

Object = dict[str, Any]
GV = spec.GROUP_VERSION
REF_FIELDS = {"SyncPolicy": "syncPolicyRef", "TrainingSwarm": "trainingSwarmRef"}
"""The EchoJob spec field that references an object of each (non-InferenceSwarm) kind."""


def manifest(kind: str, name: str, namespace: str, object_spec: Mapping[str, Any] | None) -> Object:
    """The manifest form the spec models validate: the object's ``spec`` under its own name."""
    return {
        "apiVersion": GV,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": dict(object_spec or {}),
    }


def parse_job(body: Mapping[str, Any]) -> spec.EchoJob:
    """The stored EchoJob as the spec model (raises :class:`pydantic.ValidationError`)."""
    meta = body["metadata"]
    return spec.EchoJob.model_validate(manifest("EchoJob", meta["name"], meta["namespace"], body.get("spec")))


def wanted(model: spec.EchoJob) -> list[tuple[str, str]]:
    """(kind, name) of every object the job references, each once, in spec order."""
    out: list[tuple[str, str]] = []
    if model.spec.sync_policy_ref:
        out.append(("SyncPolicy", model.spec.sync_policy_ref))
    if model.spec.training_swarm_ref:
        out.append(("TrainingSwarm", model.spec.training_swarm_ref))
    out += [("InferenceSwarm", p.swarm_ref) for p in model.spec.inference_swarms if p.swarm_ref]
    return list(dict.fromkeys(out))


def missing_message(missing: Sequence[tuple[str, str]], namespace: str) -> str:
    listed = ", ".join(f"{kind} {name!r}" for kind, name in missing)
    return f"{listed} not found in namespace {namespace}; create it or fix the reference"


def refers(job: Mapping[str, Any], kind: str, name: str) -> bool:
    """Whether the stored EchoJob ``job`` references the ``kind`` object ``name``."""
    job_spec = job.get("spec") or {}
    if kind == "InferenceSwarm":
        return any(p.get("swarmRef") == name for p in job_spec.get("inferenceSwarms") or [])
    return bool(job_spec.get(REF_FIELDS[kind]) == name)


def resolve(ctx: context.Context, body: Mapping[str, Any], model: spec.EchoJob) -> spec.ResolvedJob:
    """The job with its references replaced by the referenced specs; :class:`~echo_operator.context.Faults` if one is missing."""
    namespace = model.metadata.namespace or body["metadata"]["namespace"]
    others: list[spec.Manifest] = []
    missing: list[tuple[str, str]] = []
    for kind, ref in wanted(model):
        obj = ctx.kube.get(GV, kind, namespace, ref)
        if obj is None:
            missing.append((kind, ref))
            continue
        others.append(spec.KINDS[kind].model_validate(manifest(kind, ref, namespace, obj.get("spec"))))
    if missing:
        raise ctx.fault(body, "ReferenceNotFound", missing_message(missing, namespace))
    resolved = spec.resolve(model, others)
    shared = {p.name: p.swarm_ref for p in model.spec.inference_swarms if p.swarm_ref}
    if not shared:
        return resolved
    jobs = ctx.kube.list(GV, "EchoJob", namespace)
    me = body["metadata"]["name"]
    pools = []
    for pool, pool_spec in resolved.inference_pools:
        swarm = shared.get(pool)
        if swarm is not None and pool_spec.replicas is not None:
            users = swarm_users(jobs, swarm, me, body)
            if (me, pool) in users:
                pool_spec = pool_spec.model_copy(
                    update={"replicas": share(pool_spec.replicas, users, (me, pool))}
                )
        pools.append((pool, pool_spec))
    return dataclasses.replace(resolved, inference_pools=tuple(pools))


def running(job: Mapping[str, Any]) -> bool:
    """Whether a stored EchoJob runs pods now: not suspended, not being deleted, not Succeeded or Failed."""
    if job["metadata"].get("deletionTimestamp") or (job.get("spec") or {}).get("suspend"):
        return False
    ended = {"Succeeded", "Failed"}
    return not any(
        c.get("type") in ended and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def swarm_users(
    jobs: Sequence[Mapping[str, Any]], swarm: str, me: str, body: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """(job, pool) of every pool of a running job that uses InferenceSwarm ``swarm``, sorted; the job
    being reconciled is taken as ``body`` (the listed copy may be older)."""
    listed = [j for j in jobs if j["metadata"]["name"] != me] + [body]
    return sorted(
        (j["metadata"]["name"], p["name"])
        for j in listed
        if running(j)
        for p in (j.get("spec") or {}).get("inferenceSwarms") or []
        if p.get("swarmRef") == swarm
    )


def share(total: int, users: Sequence[tuple[str, str]], user: tuple[str, str]) -> int:
    """``user``'s part of a shared InferenceSwarm's ``replicas``: the total split evenly over the pools of
    the running jobs that use it, the remainder going to the first in name order. So the swarm's
    ``spec.replicas`` and ``status.replicas`` count the same pods, and ``kubectl scale`` or an HPA on
    its scale subresource sets how many run in all, however many jobs share it."""
    index, n = sorted(users).index(user), len(users)
    return total // n + (1 if index < total % n else 0)


def referrers(ctx: context.Context, namespace: str, kind: str, name: str) -> list[Object]:
    """EchoJobs in ``namespace`` that reference the ``kind`` object ``name``."""
    return [job for job in ctx.kube.list(GV, "EchoJob", namespace) if refers(job, kind, name)]


def invalid(ctx: context.Context, body: Mapping[str, Any], exc: pydantic.ValidationError) -> context.Faults:
    return ctx.fault(body, "InvalidSpec", f"spec is invalid: {exc}")
