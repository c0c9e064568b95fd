"""The status document (``GET /v1/status``, docs/contracts.md) built from the coordinator's state.

Pure: a function of the state and two clocks (monotonic ``now`` for ages and rates, ``wall_now`` for
the RFC 3339 heartbeat times people read). The operator and ``echorl run`` read this document; the
operator copies the staleness figures, worker counts and quarantines into the EchoJob's status.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from echo_runtime.coordinator import wire

if TYPE_CHECKING:
    from echo_runtime.coordinator.state import CoordinatorState, Worker


def status_document(state: CoordinatorState, now: float, wall_now: float) -> wire.StatusDocument:
    """The status document of ``state`` at ``now`` (monotonic) / ``wall_now`` (Unix seconds)."""
    pools: dict[str, list[Worker]] = {name: [] for name in state.config.pools}
    workers = []
    for w in state.workers.values():
        pools.setdefault(w.pool, []).append(w)
        seen = datetime.datetime.fromtimestamp(wall_now - (now - w.last_seen), tz=datetime.UTC)
        workers.append(
            wire.WorkerStatus(
                id=w.id,
                pool=w.pool,
                host=w.host,
                backend=w.backend,
                device=w.device,
                dtype=w.dtype,
                external=w.external,
                loaded_version=w.loaded_version,
                last_heartbeat=seen.strftime("%Y-%m-%dT%H:%M:%SZ"),
                rollouts_per_second=round(w.rate.rate(now), 3),
                stuck=state.stuck(w, now),
                quarantined=w.quarantine is not None,
            )
        )
    summaries = {}
    for name, members in pools.items():
        serving = [w for w in members if w.quarantine is None]
        loaded = [w.loaded_version for w in serving if w.loaded_version is not None]
        summaries[name] = wire.PoolSummary(
            workers=len(serving),
            min_loaded_version=min(loaded) if len(loaded) == len(serving) and loaded else None,
            leases=sum(state.ledger.leases_of(w.id) for w in members),
            quarantined=sum(1 for q in state.quarantined.values() if q.pool == name),
            rejected_rollouts=state.rejected.of(name),
        )
    capacity = state.config.batch_size if state.sequential else state.config.buffer_capacity
    return wire.StatusDocument(
        job=state.config.job,
        mode=state.config.policy.mode,
        max_staleness=state.config.policy.max_staleness,
        policy_version=state.published,
        buffer=wire.BufferStatus(groups=state.ledger.buffered, capacity=capacity),
        max_observed_staleness=state.max_observed_staleness,
        staleness_histogram={str(k): v for k, v in sorted(state.staleness_histogram.items()) if v},
        dropped_stale=state.dropped_stale,
        weighted_stale=state.weighted_stale,
        consumed_groups=state.consumed_groups,
        generated_groups=state.generated_groups,
        dropped_quarantined=state.dropped_quarantined,
        requeued_prompts=state.requeued_prompts,
        verifier_timeouts=state.verifier_timeouts,
        verifier_errors=state.verifier_errors,
        epoch=state.epoch,
        pacing=state.config.pacing,
        rollouts_per_second=round(state.rate.rate(now), 3),
        reward=state.last_reward,
        workers=workers,
        pools=summaries,
        quarantined=[
            wire.QuarantinedWorker(
                id=q.worker_id,
                pool=q.pool,
                host=q.host,
                reason=q.reason,
                mismatch=q.mismatch,
                version=q.version,
            )
            for q in state.quarantined.values()
        ],
    )
