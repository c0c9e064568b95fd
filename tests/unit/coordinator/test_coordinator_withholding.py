"""Withholding (coordinator.withholding): lapsed leases together with a reward above the pool's.

The statistics are simulated with honest workers whose lapses are independent of reward (false alarms)
and with workers that submit only their better groups (power); then a real CoordinatorState is driven
by two honest workers and one that lets its bad groups' leases run out.
"""

from __future__ import annotations

import random

import pytest
from coordinator_helpers import answer, config, make_state, register, rollout

from echo_runtime.coordinator import errors, metrics, report, wire, withholding


def test_tests_run_at_doublings_only() -> None:
    assert [n for n in range(1, 300) if withholding.due(n)] == [16, 32, 64, 128, 256]


def simulate(
    rng: random.Random, groups: int, lapse: float, picky: bool, pool: withholding.Tally
) -> tuple[bool, bool]:
    """One worker leasing until it has submitted ``groups`` groups (rollout rewards 0/1 with a per-prompt
    difficulty): (reported, quarantined) at any of its tests. ``picky`` keeps only groups with mean ≥ 0.5;
    an honest worker lets a lease lapse with probability ``lapse`` whatever it sampled."""
    me = withholding.Tally()
    reported = quarantined = False
    while me.groups < groups:
        p = rng.random()
        rewards = [float(rng.random() < p) for _ in range(8)]
        keep = sum(rewards) / 8 >= 0.5 if picky else rng.random() >= lapse
        if not keep:
            me.lapsed += 1
            continue
        me.submitted(rewards)
        if withholding.due(me.groups):
            verdict = withholding.judge(me, pool)
            reported |= verdict is not None
            quarantined |= verdict is not None and verdict.quarantine
    return reported, quarantined


def pool_of_honest(rng: random.Random, groups: int = 4000) -> withholding.Tally:
    pool = withholding.Tally()
    for _ in range(groups):
        p = rng.random()
        pool.submitted([float(rng.random() < p) for _ in range(8)])
    return pool


def test_honest_workers_that_lapse_a_lot_are_never_quarantined_and_rarely_reported() -> None:
    rng = random.Random(1)
    pool = pool_of_honest(rng)
    outcomes = [simulate(rng, 256, lapse=0.3, picky=False, pool=pool) for _ in range(400)]
    assert not any(q for _, q in outcomes)
    assert sum(r for r, _ in outcomes) <= 8  # 400 workers × 5 tests at 1.3e-3 each: about 2.6 expected


def test_a_worker_keeping_its_better_half_is_quarantined_by_its_64th_group() -> None:
    rng = random.Random(2)
    pool = pool_of_honest(rng)
    outcomes = [simulate(rng, 64, lapse=0.0, picky=True, pool=pool) for _ in range(50)]
    assert all(q for _, q in outcomes)


def test_without_lapses_a_high_reward_is_not_an_anomaly() -> None:
    me, pool = withholding.Tally(), pool_of_honest(random.Random(3))
    for _ in range(64):
        me.submitted([1.0] * 8)  # a worker on an easy streak, or a better model: nothing lapsed
    assert withholding.judge(me, pool) is None
    me.lapsed = 40
    verdict = withholding.judge(me, pool)
    assert verdict is not None and verdict.quarantine and "40 of its 104 leases lapsed" in verdict.message


def test_a_coordinator_reports_then_quarantines_a_worker_that_lets_its_bad_groups_lapse() -> None:
    s = make_state(config(max_staleness=1000, batch_size=1, capacity=64, group_size=8, task_timeout=5.0))
    honest = [register(s, capacity=4), register(s, capacity=4)]
    picky = register(s, capacity=4)
    rng = random.Random(4)
    now, pulled, seen = 0.0, 0, set()

    def sampled(prompt: str) -> list[wire.RolloutIn]:
        p = rng.random()
        return [rollout(0, answer(prompt) if rng.random() < p else "x", rng=rng) for _ in range(8)]

    quarantined = False
    for _ in range(200):
        for w in [*honest, picky]:
            try:
                s.heartbeat(w, wire.HeartbeatRequest(loaded_version=0), now)
                tasks = s.lease(w, 4, now).tasks  # several at once: the picky one submits some every round
            except errors.Rejected:
                quarantined = True
                continue
            for task in tasks:
                body = sampled(task.prompt)
                mean = sum(r.completion != "x" for r in body) / 8
                if w == picky and mean < 0.5:
                    continue  # holds the lease until it runs out
                if w == picky and s.roster.workers[w].withholding is not None:
                    seen.add("reported")
                try:
                    s.submit(w, task.task_id, wire.SubmitRequest(rollouts=body), now)
                except errors.Rejected as exc:
                    assert exc.code == "quarantined", exc
                    quarantined = True
        now += 6.0  # past the task timeout: the leases it kept lapse at this sweep
        s.expire(now)
        while s.ledger.buffered:
            s.pull_batch(pulled, now)
            pulled += 1
        if quarantined:
            break
    assert quarantined, s.roster.workers[picky].tally
    assert seen == {"reported"}  # the status said so at the 32-group test, before the 64-group one convicted
    doc = report.status_document(s, now, 0.0)
    caught = {q.id: q for q in doc.quarantined}
    assert list(caught) == [picky] and caught[picky].reason.startswith("withholding: ")
    assert "leases lapsed" in caught[picky].reason
    assert all(w.lapsed_leases == 0 and w.withholding is None for w in doc.workers if w.id in honest)
    exposition = metrics.render(metrics.registry_for(s, metrics.Rejections())).decode()
    assert 'leases_lapsed_total{job="test",pool="cpu"}' in exposition
    with pytest.raises(errors.Rejected):
        s.heartbeat(picky, wire.HeartbeatRequest(loaded_version=0), now)
