"""Leader election over a ``coordination.k8s.io/v1`` Lease: of the operator's replicas, one acts.

The manifests run two replicas (``manifests/common/operator.yaml``, the Helm chart's default); each
starts here (:func:`echo_operator.__main__.main`) with ``ECHORL_LEADER_ELECTION=true``. A replica
that does not hold the Lease waits, answering its liveness probe; the one that holds it runs kopf and
renews the Lease every ``retry_s``. Lease-based election as client-go's ``leaderelection`` does it, which
is what KubeRay, Kueue, JobSet and Kubeflow Trainer run:

* **Expiry is judged on the follower's own clock.** A follower never compares the holder's
  ``renewTime`` with its own wall clock (clocks of two nodes differ); it notes when it last saw the
  record change and takes the Lease over only once ``leaseDurationSeconds`` passed on its own
  monotonic clock without a change.
* **Writes are guarded by ``resourceVersion``**: of two replicas that race to take an expired Lease,
  one gets a conflict and stays a follower.
* **A leader that cannot renew stops acting before anyone else may start.** It counts itself the
  leader only for ``renew_deadline_s`` after its last successful renewal (less than the Lease's
  duration, so it stops before a follower's clock lets it take over); :meth:`Elector.is_leader` is
  the fence the operator's own API client checks before every write
  (:attr:`echo_operator.kube.Kube.fence`), and the renewing thread ends the process once it is false
  (the Deployment restarts it as a follower). A replica paused for longer than the deadline (a frozen
  node, a stopped process) therefore writes nothing when it wakes.
* **A replica that stops cleanly** (a rolling update, ``kubectl delete pod``) releases the Lease, so
  the other takes over at its next try instead of after the whole duration.

Why not kopf's peering: it is not a Lease but kopf's own ``KopfPeering`` objects (a CRD more to
install and grant), whose "freeze" of lower-priority peers carries no deadline a paused leader would
honour; and the Kubernetes Python client's ``leaderelection`` package (36.x) locks a ConfigMap, not a
Lease, and offers no fence for the caller's writes.
"""

from __future__ import annotations

import datetime
import http.server
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from echo_operator.kube import Kube, KubeError, Object

log = logging.getLogger("echo_operator.leader")

API_VERSION, KIND = "coordination.k8s.io/v1", "Lease"
LEASE_NAME = "echorl-operator"
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class Settings:
    """Leader election's settings, from the environment (the manifests set them; see docs/operator.md).

    ``ECHORL_LEADER_ELECTION`` (``true``/``false``, default ``false``: one process run by hand or by a
    test acts alone), ``ECHORL_LEADER_ELECTION_NAMESPACE`` (default: the pod's namespace),
    ``ECHORL_LEADER_ELECTION_ID`` (the Lease's name), ``POD_NAME`` (this replica's identity; the
    manifests pass it from the downward API), ``ECHORL_LEASE_DURATION`` / ``ECHORL_RENEW_DEADLINE`` /
    ``ECHORL_RETRY_PERIOD`` in seconds (client-go's defaults: 15, 10, 2).
    """

    namespace: str
    name: str
    identity: str
    lease_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_s < self.renew_deadline_s < self.lease_s:
            raise ValueError(
                "leader election: need 0 < ECHORL_RETRY_PERIOD < ECHORL_RENEW_DEADLINE < "
                f"ECHORL_LEASE_DURATION, got {self.retry_s}, {self.renew_deadline_s}, {self.lease_s}"
            )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings | None:
        """The settings, or ``None`` when leader election is off."""
        env = dict(os.environ if env is None else env)
        enabled = env.get("ECHORL_LEADER_ELECTION", "false").strip().lower()
        if enabled not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"ECHORL_LEADER_ELECTION: expected true or false, got {enabled!r}")
        if enabled in ("false", "0", "no"):
            return None

        def seconds(key: str, default: float) -> float:
            raw = env.get(key, "")
            try:
                return float(raw) if raw else default
            except ValueError:
                raise ValueError(f"{key}: expected a number of seconds, got {raw!r}") from None

        namespace = env.get("ECHORL_LEADER_ELECTION_NAMESPACE") or env.get("POD_NAMESPACE") or _sa_namespace()
        identity = env.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        return cls(
            namespace=namespace,
            name=env.get("ECHORL_LEADER_ELECTION_ID") or LEASE_NAME,
            identity=identity,
            lease_s=seconds("ECHORL_LEASE_DURATION", 15.0),
            renew_deadline_s=seconds("ECHORL_RENEW_DEADLINE", 10.0),
            retry_s=seconds("ECHORL_RETRY_PERIOD", 2.0),
        )


def _sa_namespace() -> str:
    try:
        with open(SA_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or "echorl-system"
    except OSError:
        return "echorl-system"


def _now() -> str:
    """A Lease's MicroTime."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """One replica's side of the election. Thread-safe: the renewing thread and the fence share it."""

    def __init__(self, kube: Kube, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.settings = settings
        self.clock = clock
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        """When (``clock``) this replica last acquired or renewed the Lease."""
        self._seen: tuple[str, str, str] | None = None
        self._seen_at = 0.0
        """The record (holder, renewTime, resourceVersion) as last read, and when it was first seen so."""
        self.holder = ""
        """Who held the Lease at the last read (this replica's identity when it leads)."""
        self.transitions = 0
        self._stop = threading.Event()

    # -- one try ---------------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """Take the Lease if it is free or expired, renew it if held: one read and at most one write."""
        s = self.settings
        try:
            lease = self.kube.get(API_VERSION, KIND, s.namespace, s.name)
            if lease is None:
                return self._write(None, transitions=0, acquire_time=_now())
            spec = lease.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            record = (holder, str(spec.get("renewTime") or ""), str(lease["metadata"].get("resourceVersion")))
            now = self.clock()
            with self._lock:
                if record != self._seen:
                    self._seen, self._seen_at = record, now
                self.holder = holder
                self.transitions = int(spec.get("leaseTransitions") or 0)
            duration = float(spec.get("leaseDurationSeconds") or s.lease_s)
            if holder and holder != s.identity and now < self._seen_at + duration:
                return False  # another replica's, and not expired on this replica's clock
            ours = holder == s.identity
            return self._write(
                lease,
                transitions=self.transitions + (0 if ours else 1),
                acquire_time=str(spec.get("acquireTime") or _now()) if ours else _now(),
            )
        except KubeError as exc:
            if not exc.conflict:
                log.warning("leader election: %s", exc)
            return False

    def _write(self, lease: Object | None, transitions: int, acquire_time: str) -> bool:
        s = self.settings
        spec = {
            "holderIdentity": s.identity,
            "leaseDurationSeconds": max(1, round(s.lease_s)),
            "acquireTime": acquire_time,
            "renewTime": _now(),
            "leaseTransitions": transitions,
        }
        if lease is None:
            body: Object = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": s.name, "namespace": s.namespace},
                "spec": spec,
            }
            self.kube.create(body)
        else:
            body = {**lease, "spec": spec}  # metadata.resourceVersion guards the write
            self.kube.update(body)
        with self._lock:
            if self.holder != s.identity:
                log.info("leader election: %s now leads (Lease %s/%s)", s.identity, s.namespace, s.name)
            self.holder = s.identity
            self.transitions = transitions
            self._renewed_at = self.clock()
        return True

    # -- the fence -------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        """Whether this replica may act: it renewed the Lease less than ``renew_deadline_s`` ago."""
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and self.clock() - renewed < self.settings.renew_deadline_s

    # -- loops -----------------------------------------------------------------------------------
    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Block until this replica leads (True) or ``stop`` is set (False)."""
        stop = stop or self._stop
        announced = None
        while not stop.is_set():
            if self.try_acquire_or_renew():
                return True
            if self.holder and self.holder != announced:
                log.info(
                    "leader election: %s leads; %s waits as a follower", self.holder, self.settings.identity
                )
                announced = self.holder
            stop.wait(self.settings.retry_s)
        return False

    def keep(self, on_lost: Callable[[str], None]) -> threading.Thread:
        """Renew every ``retry_s`` from a daemon thread; call ``on_lost`` (once) when leadership is gone."""

        def renew() -> None:
            while not self._stop.wait(self.settings.retry_s):
                renewed = self.try_acquire_or_renew()
                if self._stop.is_set():
                    return
                if not renewed and self.holder and self.holder != self.settings.identity:
                    on_lost(f"the Lease is now held by {self.holder}")
                    return
                if not self.is_leader():
                    on_lost(f"could not renew the Lease for {self.settings.renew_deadline_s:g} s")
                    return

        thread = threading.Thread(target=renew, name="lease-renewer", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> bool:
        """Give the Lease up if this replica holds it (a clean stop): the other replica takes it over at
        its next try rather than after the Lease's whole duration."""
        s = self.settings
        self.stop()
        try:
            lease = self.kube.get(API_VERSION, KIND, s.namespace, s.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != s.identity:
                return False
            spec = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _now()}
            self.kube.update({**lease, "spec": spec})
        except KubeError as exc:
            log.warning("leader election: could not release the Lease: %s", exc)
            return False
        with self._lock:
            self._renewed_at = None
            self.holder = ""
        log.info("leader election: %s released the Lease", s.identity)
        return True


# -- what a follower serves ------------------------------------------------------------------------
class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok: a follower, waiting for the Lease\n")

    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: not logged
        return


def liveness_address(kopf_args: list[str]) -> tuple[str, int] | None:
    """Host and port of kopf's ``--liveness=http://HOST:PORT/PATH`` among ``kopf_args`` (None if absent)."""
    for i, arg in enumerate(kopf_args):
        value = arg.split("=", 1)[1] if arg.startswith("--liveness=") else None
        if arg == "--liveness" and i + 1 < len(kopf_args):
            value = kopf_args[i + 1]
        if value:
            url = urlparse(value)
            return (url.hostname or "0.0.0.0", url.port or 80)
    return None


def serve_health(address: tuple[str, int]) -> http.server.ThreadingHTTPServer:
    """Answer liveness probes while waiting (kopf, which answers them when leading, is not running yet);
    ``shutdown()`` and ``server_close()`` it before kopf binds the same port."""
    server = http.server.ThreadingHTTPServer(address, _Healthy)
    threading.Thread(target=server.serve_forever, name="follower-health", daemon=True).start()
    return server


_current: dict[str, Elector] = {}


def set_current(elector: Elector | None) -> None:
    """The process's elector (the reconciler's API client fences its writes with it)."""
    if elector is None:
        _current.pop("elector", None)
    else:
        _current["elector"] = elector


def current() -> Elector | None:
    return _current.get("elector")
