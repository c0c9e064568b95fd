"""The children an EchoJob needs, computed by pure functions from its resolved spec.

:func:`desired` turns a :class:`~.inputs.JobInput` (the job with its references resolved, the storage
wiring and the digests of its join tokens) into the list of Kubernetes objects the operator
server-side-applies. One module per thing rendered:

* :mod:`.inputs` — what the children are computed from (:class:`~.inputs.JobInput`, the queue's
  :class:`~.inputs.Hold`);
* :mod:`.manifest` — ``<job>-config`` ConfigMap: the job manifest the processes read (placement and
  replicas left out, so scaling a pool or moving it to other nodes does not restart the coordinator
  and the trainer);
* :mod:`.token_secrets` — ``<job>-tokens`` Secret: the coordinator's tokens file, SHA-256 digests only
  (docs/contracts.md); and the join-token Secrets, made by :func:`~.token_secrets.join_secret` from a
  token the caller generated (they hold random tokens, so they are no part of :func:`desired`);
* :mod:`.coordinator` — ``<job>-coordinator`` Deployment and Service, and the external Service;
* :mod:`.pools` — ``<job>-<pool>`` Deployment per in-cluster inference pool;
* :mod:`.trainer` — ``<job>-trainer`` indexed Job and headless Service: the trainer as a gang;
* :mod:`.scorers` — ``<job>-scorer-<model>`` Deployment and Service per reward model (its scoring pool);
* :mod:`.pods` — what every pod is built from (environment, volumes, security, ``podTemplate``).

Every process's command line comes from :mod:`echo_runtime.spec.commands`, as ``echorl run``'s do.

Promises: the same input gives byte-identical output (re-applying changes nothing); every object is
labelled (:mod:`echo_operator.names`) and controlled by the EchoJob through an owner reference;
``suspend`` sets every replica count to zero and leaves the trainer Job out, and so does a job that
is over (:attr:`~.inputs.JobInput.finished`); a pool whose ``replicas`` is unset leaves the field
unowned, so ``kubectl scale`` or an HPA on the Deployment is not fought.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from echo_operator import names
from echo_operator.children import coordinator, inputs, manifest, pools, scorers, token_secrets, trainer
from echo_operator.config import Settings

Object = dict[str, Any]


def desired(job: inputs.JobInput, settings: Settings) -> list[Object]:
    """Every object the job needs (except join-token Secrets), in the order they are applied.

    The trainer Job only while the job is :attr:`~JobInput.active`: suspending the job, or the job
    being over, stops the trainer (its pods hold GPUs) while everything else is scaled to zero.
    """
    objects: list[Object | None] = [
        manifest.config_map(job),
        token_secrets.tokens_secret(job),
        coordinator.coordinator_service(job),
        coordinator.coordinator_external_service(job, settings),
        coordinator.coordinator_deployment(job, settings),
        trainer.trainer_service(job),
        trainer.trainer_job(job, settings) if job.active else None,
        *(pools.pool_deployment(job, pool, settings) for pool in job.pools),
        *(obj for model in job.spec.reward_models for obj in scorers.scorer_children(job, model, settings)),
    ]
    return [placed(o, job.placement) for o in objects if o is not None]


def pod_set_name(obj: Object) -> str | None:
    """The Kueue pod set a child's pods belong to: ``coordinator``, ``trainer``, a pool's name, or a
    scoring pool's component (None: not a workload)."""
    labels = obj["metadata"].get("labels") or {}
    if obj["kind"] == "Deployment":
        return str(labels.get(names.POOL) or labels.get(names.COMPONENT, "coordinator"))
    if obj["kind"] == "Job":
        return "trainer"
    return None


def placed(obj: Object, placement: Mapping[str, inputs.Placement]) -> Object:
    """``obj`` with its pod set's admitted placement merged into its pod template: the flavor's node
    labels added to the pod's ``nodeSelector``, its tolerations appended where missing."""
    name = pod_set_name(obj)
    where = placement.get(name) if name is not None else None
    if where is None or (not where.node_selector and not where.tolerations):
        return obj
    pod = obj["spec"]["template"]["spec"]
    if where.node_selector:
        pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **where.node_selector}
    if where.tolerations:
        have = list(pod.get("tolerations") or [])
        pod["tolerations"] = have + [dict(t) for t in where.tolerations if dict(t) not in have]
    return obj


def key(obj: Object) -> tuple[str, str]:
    """(kind, name): how children are matched between desired and existing."""
    return obj["kind"], obj["metadata"]["name"]


def roles(job: inputs.JobInput) -> Sequence[str]:
    """The roles that need a token: the trainer, the status reader, the scoring pools (if any) and
    every pool."""
    scorer = [names.SCORER_ROLE] if job.spec.reward_models else []
    return ["trainer", names.STATUS_ROLE, *scorer, *(p.name for p in job.pools)]
