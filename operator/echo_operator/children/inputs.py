"""What the children of an EchoJob are computed from: the job with its references resolved, and the
wiring the operator found or made for it (store credentials, join-token digests, the coordinator's TLS
certificate, the job's queue hold).

Nothing here is read from the cluster: :mod:`echo_operator.reconcile` builds a :class:`JobInput`, and
every renderer of :mod:`echo_operator.children` is a pure function of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from echo_runtime import spec as echo_spec


@dataclasses.dataclass(frozen=True)
class Pool:
    """One inference pool of the job, resolved."""

    name: str
    spec: echo_spec.InferenceSwarmSpec
    swarm: str | None = None
    """The InferenceSwarm object it comes from (None for an inline pool)."""


@dataclasses.dataclass(frozen=True)
class StoreWiring:
    """Which Secret keys hold the snapshot store's credentials, for whom.

    The coordinator and the trainer get the job's credentials (``spec.storage.credentialsSecret``);
    inference pods get the read-only pair when the store could issue one, else the same pair.
    """

    secret: str | None
    access_key: str = "accessKey"
    secret_key: str = "secretKey"
    readonly_secret: str | None = None
    readonly_access_key: str = "accessKey"
    readonly_secret_key: str = "secretKey"


@dataclasses.dataclass(frozen=True)
class TLSWiring:
    """The certificate the coordinator serves external workers with (:mod:`echo_operator.coordinator_tls`)."""

    secret: str
    """The ``kubernetes.io/tls`` Secret the coordinator's pod mounts (``tls.crt``, ``tls.key``)."""
    fingerprint: str
    """``sha256:<hex>`` of that certificate: in the pod's spec hash, so a new one restarts it."""
    ca: str | None = None
    """The CA's PEM certificate, when known (always, for one the operator issued)."""


@dataclasses.dataclass(frozen=True)
class Hold:
    """Why the job's queue (Kueue) does not let it run now: a CamelCase reason and a message.

    Made by :func:`echo_operator.queueing.hold` from the job's Workload; it lives here, with the input it
    is part of (:attr:`JobInput.held`), because the queueing module computes its pod sets from the
    children and so stands above them."""

    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where Kueue admitted one pod set: its ResourceFlavors' node labels and tolerations (and an
    admission check's pod set updates), which the pod set's pods get beside their own, as Kueue's
    built-in integrations apply them (:func:`echo_operator.queueing.placement`)."""

    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class JobInput:
    """Everything the children depend on: nothing here is read from the cluster by this module."""

    name: str
    namespace: str
    uid: str
    spec: echo_spec.EchoJobSpec
    sync_policy: echo_spec.SyncPolicySpec
    training: echo_spec.TrainingSwarmSpec
    pools: tuple[Pool, ...]
    token_digests: Mapping[str, str]
    """``trainer`` and each pool name → hex SHA-256 of its join token."""
    store: StoreWiring = StoreWiring(secret=None)
    finished: bool = False
    """The job Succeeded or Failed: nothing runs any more (its processes are scaled to zero)."""
    tls: TLSWiring | None = None
    """Set when external workers join: the coordinator also serves TLS, on its external Service."""
    held: Hold | None = None
    """Why Kueue does not let the job run now (:mod:`echo_operator.queueing`); None: not held."""
    placement: Mapping[str, Placement] = dataclasses.field(default_factory=dict)
    """Pod set name (``coordinator``, ``trainer``, a pool's name) → where Kueue admitted it."""

    @classmethod
    def from_resolved(
        cls,
        resolved: echo_spec.ResolvedJob,
        uid: str,
        token_digests: Mapping[str, str],
        store: StoreWiring,
    ) -> JobInput:
        refs = {p.name: p.swarm_ref for p in resolved.spec.inference_swarms}
        return cls(
            name=resolved.name,
            namespace=resolved.namespace or "default",
            uid=uid,
            spec=resolved.spec,
            sync_policy=resolved.sync_policy,
            training=resolved.training_swarm,
            pools=tuple(
                Pool(name, pool_spec, refs.get(name)) for name, pool_spec in resolved.inference_pools
            ),
            token_digests=dict(token_digests),
            store=store,
        )

    @property
    def suspended(self) -> bool:
        """Scaled to zero by ``spec.suspend`` or by its queue (Kueue has not admitted it)."""
        return self.spec.suspend or self.held is not None

    @property
    def active(self) -> bool:
        """Processes should run: neither suspended, nor held by the job's queue, nor over."""
        return not (self.suspended or self.finished)

    @property
    def has_external_pools(self) -> bool:
        return any(p.spec.external for p in self.pools)
