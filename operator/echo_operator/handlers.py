"""The kopf handlers: when to reconcile what. Thin: every decision is in the modules they call.

Run with ``kopf run -m echo_operator.handlers --all-namespaces`` (or ``echorl operator run``,
``python -m echo_operator``). Registered here:

* EchoJob created, resumed (operator start) or its ``spec`` changed → :meth:`Reconciler.reconcile`;
* a daemon per EchoJob: the status pass every ``ECHORL_STATUS_INTERVAL`` seconds and a re-apply of
  the children every ``ECHORL_RESYNC_INTERVAL`` seconds (drift is undone; no drift, no writes);
* EchoJob deleted → storage cleanup, only where a finalizer was needed (:func:`credentials.needs_cleanup`);
  everything else goes with the job through owner references;
* InferenceSwarm / TrainingSwarm / SyncPolicy created, changed (``kubectl scale`` included) or deleted →
  the jobs that reference it are reconciled, and its ``status`` (``usedBy``, the scale subresource's
  ``replicas`` and ``selector``) is refreshed.

kopf keeps its own bookkeeping in ``echorl.dev/*`` annotations (not in ``status``, whose schema is
strict), and posts no Events: kopf would post a new one for every failed try of a handler. The
Events are the operator's (:mod:`echo_operator.events`, deduplicated): a reconcile that keeps
failing on the API is one ``ReconcileFailed`` Warning whose count grows.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import kopf

from echo_operator import credentials, leader, metrics, names, reconcile
from echo_operator.config import Settings
from echo_operator.kube import Kube, KubeError
from echo_runtime import spec

GROUP, VERSION = spec.API_GROUP, spec.API_VERSION
log = logging.getLogger("echo_operator")

_state: dict[str, reconcile.Reconciler] = {}


def _reconciler() -> reconcile.Reconciler:
    try:
        return _state["reconciler"]
    except KeyError:
        raise kopf.TemporaryError("the operator is still starting", delay=1) from None


async def _run(fn: Any, *args: Any, kind: str, about: dict[str, Any] | None = None) -> Any:
    """Run a blocking reconciler call off the event loop (:func:`_timed`); API failures become kopf
    retries.

    With ``about`` (the EchoJob), a failure is also a ``ReconcileFailed`` Warning Event on it.
    """
    try:
        return await _timed(kind, fn, *args)
    except KubeError as exc:
        if about is not None:
            _reconciler().event(about, "Warning", "ReconcileFailed", f"will retry: {exc}")
        raise kopf.TemporaryError(str(exc), delay=5) from exc


async def _timed(kind: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` off the event loop, timed and counted by ``kind`` (the operator's ``/metrics``); a
    KubeError is counted as an error and raised."""
    started = time.monotonic()
    try:
        found = await asyncio.to_thread(fn, *args)
    except KubeError:
        metrics.RECONCILES.labels(kind, "error").inc()
        raise
    finally:
        metrics.RECONCILE_SECONDS.labels(kind).observe(time.monotonic() - started)
    metrics.RECONCILES.labels(kind, "ok").inc()
    return found


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = names.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # kopf would post a new Event per failed try; ours count repeats
    settings.peering.standalone = True  # replicas elect a leader over a Lease first (leader.py)
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    elector = leader.current()
    kube = Kube.from_environment(identity=elector.settings.identity if elector else "")
    kube.fence = elector.is_leader if elector else None
    _state["reconciler"] = reconcile.Reconciler(kube, Settings.from_env())
    metrics.STATE.phases = _state["reconciler"].ctx.phases
    metrics.STATE.leader = elector.is_leader if elector else lambda: True
    metrics.serve(metrics.port_from_env())
    if not _may_scan(kube):
        # The namespaced install (manifests/namespaced/) grants no cluster-wide reads. kopf would retry
        # listing namespaces and CRDs for ever, logging a 403 each time; it serves the namespaces given
        # with --namespace and the resources found at start-up instead.
        settings.scanning.disabled = True
        log.info(
            "no rights to list namespaces and CRDs: watching only the given namespaces; restart the "
            "operator after installing newer Echo CRDs"
        )


def _may_scan(kube: Kube) -> bool:
    """Whether kopf may watch namespaces and CRDs (the cluster-wide install grants both)."""
    try:
        return kube.may("watch", "", "namespaces") and kube.may(
            "watch", "apiextensions.k8s.io", "customresourcedefinitions"
        )
    except KubeError as exc:
        log.warning("could not ask the API server what this operator may do (%s); kopf scans as usual", exc)
        return True


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's client-library login, except that an explicit ``$KUBECONFIG`` is read now.

    The Kubernetes client reads ``$KUBECONFIG`` once, when it is imported; an operator started in a
    process that set it later (tests, ``echorl operator run --kubeconfig``) would miss it. Plain
    kubeconfigs (tokens, client certificates) are read directly; anything else (exec plugins, auth
    providers) goes through the client library as usual.
    """
    if os.environ.get("KUBECONFIG") and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        info = kopf.login_with_kubeconfig(**kwargs)
        if info is not None and (info.token or info.certificate_data or info.certificate_path):
            return info
    return kopf.login_via_client(**kwargs)


@kopf.on.cleanup()
def close(**_: Any) -> None:
    found = _state.pop("reconciler", None)
    if found is not None:
        found.kube.close()


# -- EchoJob ---------------------------------------------------------------------------------------


def _ours(body: kopf.Body, **_: Any) -> bool:
    """Whether this operator runs the EchoJob: not when ``spec.managedBy`` names another controller
    (e.g. MultiKueue's), which then owns it; nothing is applied, polled or written for it here."""
    return names.managed_elsewhere(body) is None


@kopf.on.resume(GROUP, VERSION, "echojobs", backoff=10, when=_ours)
@kopf.on.create(GROUP, VERSION, "echojobs", backoff=10, when=_ours)
@kopf.on.update(GROUP, VERSION, "echojobs", field="spec", backoff=10, when=_ours)
async def reconcile_job(body: kopf.Body, **_: Any) -> None:
    job = dict(body)
    await _run(_reconciler().reconcile, job, kind="EchoJob", about=job)
    await _run(_reconciler().rebalance, job, kind="EchoJob", about=job)
    _poke(body).set()  # a finished job's idle daemon takes a pass (a new ttlSecondsAfterFinished)


_pokes: dict[tuple[str, str], asyncio.Event] = {}
"""Per job: set when its spec changed, to wake a finished job's idle daemon (:func:`monitor_job`)."""
IDLE_CHECK_S = 30.0


def _poke(body: kopf.Body) -> asyncio.Event:
    return _pokes.setdefault((body.metadata.namespace or "", body.metadata.name or ""), asyncio.Event())


@kopf.daemon(GROUP, VERSION, "echojobs", cancellation_timeout=5.0, when=_ours)
async def monitor_job(stopped: kopf.DaemonStopped, body: kopf.Body, **_: Any) -> None:
    """Status pass on a timer, plus a periodic re-apply of the children. A finished job whose status
    has settled is not polled: its daemon idles (no API calls) until ``ttlSecondsAfterFinished`` is
    due or its spec changes."""
    op = _reconciler()
    last_resync = time.monotonic()
    poke = _poke(body)
    while not stopped:
        try:
            await _timed("status", op.observe, dict(body))
            if time.monotonic() - last_resync >= op.settings.resync_interval_s:
                last_resync = time.monotonic()
                await _timed("EchoJob", op.reconcile, dict(body))
        except KubeError as exc:
            log.warning("%s/%s: status pass failed: %s", body.metadata.namespace, body.metadata.name, exc)
        due = op.next_pass_in(dict(body))
        if due is None:
            await stopped.wait(op.settings.status_interval_s)
            continue
        poke.clear()
        idle_until = time.monotonic() + due
        while not stopped and not poke.is_set() and time.monotonic() < idle_until:
            await stopped.wait(min(IDLE_CHECK_S, max(0.0, idle_until - time.monotonic())))
        last_resync = float("-inf")  # the pass after idling re-applies (the TTL's deletion, a new spec)


def _needs_cleanup(body: kopf.Body, **_: Any) -> bool:
    return _ours(body) and credentials.needs_cleanup(body)


@kopf.on.delete(GROUP, VERSION, "echojobs", when=_needs_cleanup, retries=5, backoff=5)
async def cleanup_job(body: kopf.Body, **_: Any) -> None:
    job = dict(body)
    await _run(_reconciler().cleanup, job, kind="EchoJob", about=job)


@kopf.on.delete(GROUP, VERSION, "echojobs", optional=True)
async def forget_job(body: kopf.Body, **_: Any) -> None:
    _reconciler().forget(body.metadata.namespace or "", body.metadata.name or "")
    _pokes.pop((body.metadata.namespace or "", body.metadata.name or ""), None)
    job = dict(body)
    await _run(_reconciler().rebalance, job, kind="EchoJob", about=job)


# -- Referenced objects ----------------------------------------------------------------------------

_KINDS = {
    "inferenceswarms": "InferenceSwarm",
    "trainingswarms": "TrainingSwarm",
    "syncpolicies": "SyncPolicy",
}


def _register(plural: str) -> None:
    kind = _KINDS[plural]

    async def changed(body: kopf.Body, **_: Any) -> None:
        await _run(
            _reconciler().referenced_changed, body.metadata.namespace, kind, body.metadata.name, kind=kind
        )

    changed.__name__ = changed.__qualname__ = f"{plural}_changed"
    kopf.on.resume(GROUP, VERSION, plural)(changed)
    kopf.on.create(GROUP, VERSION, plural)(changed)
    kopf.on.update(GROUP, VERSION, plural, field="spec")(changed)
    kopf.on.delete(GROUP, VERSION, plural, optional=True)(changed)


for _plural in _KINDS:
    _register(_plural)
