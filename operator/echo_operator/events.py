"""Events about an Echo object: the operator's own, with specific CamelCase reasons.

:class:`Recorder` posts core/v1 Events for the objects it is given (best effort: a failed post is
logged, never raised, so an Event cannot fail a reconcile). Like client-go's recorder, which the
built-in controllers use, it deduplicates: the same Event (object, type, reason, message) posted
again is one Event whose ``count`` grows and whose ``lastTimestamp`` moves (``kubectl describe``
shows ``x5 over 2m``), not a new one per resync. The memory of what was posted is the process's
(:data:`CACHE_SIZE` Events, oldest forgotten first): after an operator restart a repeat starts a new
Event, as it does for kube-controller-manager. :func:`new_event` and :func:`repeat` are pure.

kopf would post an Event of its own for every failed handler run (a new one each time); the
operator turns that off (``handlers.configure``): its own Events say what failed.
"""

from __future__ import annotations

import collections
import datetime
import logging
import threading
from collections.abc import Mapping
from typing import Any

from echo_operator import names
from echo_operator.kube import Kube, KubeError
from echo_runtime import spec

Object = dict[str, Any]
log = logging.getLogger("echo_operator")
MAX_MESSAGE = 1024
CACHE_SIZE = 4096
"""Distinct Events remembered for deduplication (client-go's ``maxLruCacheEntries``)."""
Key = tuple[str, str, str, str, str, str, str]


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_event(
    body: Mapping[str, Any], type_: str, reason: str, message: str, instance: str, stamp: str
) -> Object:
    """A core/v1 Event about ``body`` (an EchoJob unless its kind says otherwise), seen once at ``stamp``."""
    meta = body["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body.get("apiVersion", spec.GROUP_VERSION),
            "kind": body.get("kind", "EchoJob"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type_,
        "source": {"component": names.MANAGER},
        "reportingComponent": names.MANAGER,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def key(body: Mapping[str, Any], type_: str, reason: str, message: str) -> Key:
    """What makes two Events the same one: the object (by uid, so a re-created job starts afresh),
    the type, the reason and the message as posted."""
    meta = body["metadata"]
    return (
        meta["namespace"],
        str(body.get("kind", "EchoJob")),
        meta["name"],
        str(meta.get("uid") or ""),
        type_,
        reason,
        message[:MAX_MESSAGE],
    )


def repeat(count: int, stamp: str) -> Object:
    """The merge patch that records the Event once more, at ``stamp``, after ``count`` times."""
    return {"count": count + 1, "lastTimestamp": stamp}


class Recorder:
    """Posts the operator's Events through a :class:`Kube` (thread-safe)."""

    def __init__(self, kube: Kube, instance: str) -> None:
        self.kube = kube
        self.instance = instance
        self._posted: collections.OrderedDict[Key, tuple[str, int]] = collections.OrderedDict()
        """Key → (the Event's name, its count)."""
        self._lock = threading.Lock()

    def post(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event about ``body``, or count it again (best effort: a failure is only logged)."""
        meta = body["metadata"]
        log.info("%s/%s: %s %s: %s", meta["namespace"], meta["name"], type_, reason, message)
        stamp = now_rfc3339()
        wanted = key(body, type_, reason, message)
        with self._lock:  # one post per key at a time, so a count is never lost between threads
            try:
                self._post(body, wanted, type_, reason, message, stamp)
            except KubeError as exc:
                log.warning(
                    "could not post event %s for %s/%s: %s", reason, meta["namespace"], meta["name"], exc
                )

    def _post(
        self, body: Mapping[str, Any], wanted: Key, type_: str, reason: str, message: str, stamp: str
    ) -> None:
        namespace = body["metadata"]["namespace"]
        seen = self._posted.get(wanted)
        if seen is not None:
            name, count = seen
            try:
                self.kube.merge_patch("v1", "Event", namespace, name, repeat(count, stamp))
            except KubeError as exc:
                if not exc.not_found:  # expired (the API server keeps Events an hour): a new one
                    raise
            else:
                self._posted[wanted] = (name, count + 1)
                self._posted.move_to_end(wanted)
                return
        created = self.kube.create(new_event(body, type_, reason, message, self.instance, stamp))
        self._posted[wanted] = (str(created.get("metadata", {}).get("name", "")), 1)
        self._posted.move_to_end(wanted)
        while len(self._posted) > CACHE_SIZE:
            self._posted.popitem(last=False)
