"""Events about an Echo object: the operator's own, with specific CamelCase reasons.

:class:`Recorder` posts core/v1 Events for the objects it is given (best effort: a failed post is
logged, never raised, so an Event cannot fail a reconcile). :func:`new_event` builds one, a pure
function of the object, the event and the time.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from echo_operator import names
from echo_operator.kube import Kube, KubeError
from echo_runtime import spec

Object = dict[str, Any]
log = logging.getLogger("echo_operator")
MAX_MESSAGE = 1024


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


class Recorder:
    """Posts the operator's Events through a :class:`Kube` (thread-safe)."""

    def __init__(self, kube: Kube, instance: str) -> None:
        self.kube = kube
        self.instance = instance

    def post(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event about ``body`` (best effort: a failed post is only logged)."""
        meta = body["metadata"]
        log.info("%s/%s: %s %s: %s", meta["namespace"], meta["name"], type_, reason, message)
        event = new_event(body, type_, reason, message, self.instance, now_rfc3339())
        try:
            self.kube.create(event)
        except KubeError as exc:
            log.warning("could not post event %s for %s/%s: %s", reason, meta["namespace"], meta["name"], exc)
