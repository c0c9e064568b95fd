"""Reference resolution: an EchoJob's ``syncPolicyRef``, ``trainingSwarmRef`` and pools' ``swarmRef``.

:func:`wanted` lists what a job references (each object once, in the order the spec names them);
:func:`refers` says whether a job (as stored) references an object, so a change to that object
reconciles exactly the jobs that use it. :func:`resolve` reads the referenced objects from the job's
namespace and returns the job with every reference replaced by its spec; a missing one is a problem
the user can fix (``ReferenceNotFound``, naming every missing object), not an error to retry.
"""

from __future__ import annotations

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
    """The job with its references replaced by the referenced specs; :class:`Problems` if one is missing."""
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
        raise ctx.problem(body, "ReferenceNotFound", missing_message(missing, namespace))
    return spec.resolve(model, others)


def referrers(ctx: context.Context, namespace: str, kind: str, name: str) -> list[Object]:
    """EchoJobs in ``namespace`` that reference the ``kind`` object ``name``."""
    return [job for job in ctx.kube.list(GV, "EchoJob", namespace) if refers(job, kind, name)]


def invalid(ctx: context.Context, body: Mapping[str, Any], exc: pydantic.ValidationError) -> context.Problems:
    return ctx.problem(body, "InvalidSpec", f"spec is invalid: {exc}")
