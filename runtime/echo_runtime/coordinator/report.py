"""The status document (``GET /v1/status``, docs/contracts.md) built from the coordinator's state.

Pure: a function of the state and two clocks (monotonic ``now`` for ages and rates, ``wall_now`` for
the RFC 3339 heartbeat times people read). The operator and ``echorl run`` read this document; the
operator copies the staleness figures, worker counts and quarantines into the EchoJob's status.
It stands above the state it reads (:mod:`.state` never imports it); :mod:`.api` serves it.
"""

from __future__ import annotations

import datetime

from echo_runtime.coordinator import roster, state, wire


def status_document(coordinator: state.CoordinatorState, now: float, wall_now: float) -> wire.StatusDocument:
    """The status document of ``coordinator`` at ``now`` (monotonic) / ``wall_now`` (Unix seconds)."""
    counts = coordinator.counters
    pools: dict[str, list[roster.WorkerRecord]] = {name: [] for name in coordinator.config.pools}
    workers = []
    for w in coordinator.roster.workers.values():
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
                stuck=coordinator.roster.stuck(w, now),
                quarantined=w.quarantine is not None,
                submitted_groups=w.tally.groups,
                lapsed_leases=w.tally.lapsed,
                withholding=w.withholding,
            )
        )
    summaries = {}
    for name, members in pools.items():
        serving = [w for w in members if w.quarantine is None]
        loaded = [w.loaded_version for w in serving if w.loaded_version is not None]
        summaries[name] = wire.PoolSummary(
            workers=len(serving),
            min_loaded_version=min(loaded) if len(loaded) == len(serving) and loaded else None,
            leases=sum(coordinator.ledger.leases_of(w.id) for w in members),
            quarantined=coordinator.quarantined.in_pool(name),
            rejected_rollouts=counts.rejected.of(name),
        )
    capacity = coordinator.config.batch_size if coordinator.sequential else coordinator.config.buffer_capacity
    return wire.StatusDocument(
        job=coordinator.config.job,
        mode=coordinator.config.policy.mode,
        max_staleness=coordinator.config.policy.max_staleness,
        policy_version=coordinator.published,
        buffer=wire.BufferStatus(groups=coordinator.ledger.buffered, capacity=capacity),
        max_observed_staleness=counts.max_observed_staleness,
        staleness_histogram={str(k): v for k, v in sorted(counts.staleness_histogram.items()) if v},
        dropped_stale=counts.dropped_stale,
        weighted_stale=counts.weighted_stale,
        consumed_groups=counts.consumed_groups,
        generated_groups=counts.generated_groups,
        dropped_quarantined=counts.dropped_quarantined,
        requeued_prompts=counts.requeued_prompts,
        verifier_timeouts=counts.verifier_timeouts,
        verifier_errors=counts.verifier_errors,
        epoch=coordinator.epoch,
        pacing=coordinator.config.pacing,
        rollouts_per_second=round(counts.rate.rate(now), 3),
        reward=counts.last_reward,
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
                trained_groups=q.trained_groups,
            )
            for q in coordinator.quarantined.records.values()
        ],
        filtered_groups=coordinator.signal.filtered_groups,
        set_aside_prompts=coordinator.signal.set_aside_prompts,
        signal_fraction=coordinator.signal.signal_fraction,
        no_signal_batches=coordinator.signal.no_signal_batches,
        warnings=coordinator.signal.warnings(),
    )
