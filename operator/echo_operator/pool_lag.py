"""Δmax from the cluster's side: which pools cannot keep up, and which worker pods to restart.

The coordinator enforces the bound on every group (:func:`echo_runtime.staleness.admit`,
the one place the rule lives); nothing consumed is ever staler than Δmax. What the coordinator cannot
do is fix a pool whose workers lag: their groups are dropped (or down-weighted), throughput falls, and
the job looks healthy while it wastes the pool. This module decides, from the status document:

* a pool is *behind* when its oldest loaded version could no longer be consumed at ``t_train``
  (``admit(minLoadedVersion, t_train).verdict == "stale"``) or one of its workers is ``stuck``;
* a pool *cannot keep up* when it has been behind for ``grace_s`` without a break (a pool catches
  up after every trainer step; only a persistent lag is news) — then ``StalenessBounded`` turns False
  naming the pool;
* a worker pod is restarted when the coordinator reports it ``stuck`` (told to load a version, still
  on an old one after its lease timeout), at most once per ``cooldown_s``, and only if it is a pod of
  that pool of this job (the id comes over the network and is matched against our own pods).

Everything is a pure function of its inputs; the caller keeps the small ``since`` / ``restarted`` maps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from echo_runtime import staleness as rule
from echo_runtime.coordinator import wire
from echo_runtime.spec import SyncPolicySpec


@dataclasses.dataclass(frozen=True)
class PoolLag:
    """Why a pool is behind."""

    pool: str
    min_loaded_version: int | None
    t_train: int
    bound: int
    stuck: tuple[str, ...]
    """Ids of its stuck workers."""

    @property
    def staleness(self) -> int | None:
        return None if self.min_loaded_version is None else self.t_train - self.min_loaded_version

    def describe(self, mode: str) -> str:
        what = "refreshThreshold" if mode == "Sequential" else "Δmax"
        parts = []
        if self.min_loaded_version is not None and self.staleness is not None and self.staleness > self.bound:
            parts.append(
                f"pool {self.pool} is at policy version {self.min_loaded_version} while t_train is "
                f"{self.t_train} (staleness {self.staleness} > {what} {self.bound}): its rollouts are too stale"
            )
        if self.stuck:
            parts.append(f"pool {self.pool} has {len(self.stuck)} stuck worker(s): {', '.join(self.stuck)}")
        return "; ".join(parts)


def pools_behind(doc: wire.StatusDocument, policy: SyncPolicySpec) -> dict[str, PoolLag]:
    """The pools that are behind right now (see the module docstring), by name."""
    stale_policy = rule.StalenessPolicy.from_spec(policy)
    stuck: dict[str, list[str]] = {}
    for worker in doc.workers:
        if worker.stuck:
            stuck.setdefault(worker.pool, []).append(worker.id)
    out: dict[str, PoolLag] = {}
    for name in sorted(set(doc.pools) | set(stuck)):
        summary = doc.pools.get(name)
        oldest = summary.min_loaded_version if summary is not None else None
        too_old = (
            oldest is not None and rule.admit(oldest, doc.policy_version, stale_policy).verdict == "stale"
        )
        if too_old or name in stuck:
            out[name] = PoolLag(
                name, oldest, doc.policy_version, stale_policy.bound, tuple(stuck.get(name, ()))
            )
    return out


def track(behind: Iterable[str], since: Mapping[str, float], now: float) -> dict[str, float]:
    """When each currently-behind pool started being behind (pools that caught up are forgotten)."""
    return {pool: since.get(pool, now) for pool in behind}


def cannot_keep_up(since: Mapping[str, float], now: float, grace_s: float) -> list[str]:
    """Pools behind for at least ``grace_s`` seconds without a break."""
    return sorted(pool for pool, start in since.items() if now - start >= grace_s)


@dataclasses.dataclass(frozen=True)
class Restart:
    """A worker pod to delete so its Deployment replaces it."""

    pool: str
    pod: str
    worker: str
    loaded_version: int | None


def restarts(
    doc: wire.StatusDocument,
    pods_by_pool: Mapping[str, Iterable[str]],
    restarted: Mapping[str, float],
    now: float,
    cooldown_s: float,
) -> list[Restart]:
    """Stuck in-cluster workers whose pod is ours and was not restarted within ``cooldown_s``.

    A worker is matched to a pod by its ``host`` (the pod name a worker reports when it registers)
    or, failing that, by its id.
    """
    out: list[Restart] = []
    for worker in doc.workers:
        if not worker.stuck or worker.external:
            continue
        pods = set(pods_by_pool.get(worker.pool, ()))
        host = getattr(worker, "host", None)
        pod = host if host in pods else worker.id if worker.id in pods else None
        if pod is None:
            continue
        last = restarted.get(pod)
        if last is not None and now - last < cooldown_s:
            continue
        out.append(Restart(worker.pool, pod, worker.id, worker.loaded_version))
    return out


def stuck_external(doc: wire.StatusDocument) -> list[wire.WorkerStatus]:
    """Stuck workers outside the cluster: the operator can only report them."""
    return [w for w in doc.workers if w.stuck and w.external]
