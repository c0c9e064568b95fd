"""The staleness rule (echo_runtime.staleness.admit): a table of cases and its properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo_runtime import staleness
from echo_runtime.spec import SyncPolicySpec

policies = st.builds(
    lambda mode, dmax, action, frac: staleness.StalenessPolicy(mode, dmax, action, int(frac * dmax)),
    st.sampled_from(["Sequential", "Async"]),
    st.integers(0, 8),
    st.sampled_from(["Drop", "ImportanceWeight"]),
    st.floats(0, 1),
)


@pytest.mark.parametrize(
    ("mode", "dmax", "action", "refresh", "version", "t", "verdict", "weighted"),
    [
        ("Async", 2, "Drop", 0, 5, 5, "fresh", False),
        ("Async", 2, "Drop", 0, 3, 5, "fresh", False),  # staleness 2 = Δmax: allowed
        ("Async", 2, "Drop", 0, 2, 5, "stale", False),  # staleness 3 > Δmax
        ("Async", 2, "ImportanceWeight", 0, 4, 5, "weighted", True),
        ("Async", 2, "ImportanceWeight", 0, 5, 5, "fresh", False),
        ("Async", 2, "ImportanceWeight", 0, 2, 5, "stale", False),  # the bound is absolute
        ("Async", 0, "Drop", 0, 4, 5, "stale", False),  # Δmax 0 is on-policy
        ("Async", 2, "Drop", 0, 6, 5, "future", False),
        ("Sequential", 2, "Drop", 1, 4, 5, "fresh", False),  # within the refresh threshold
        ("Sequential", 2, "Drop", 1, 3, 5, "stale", False),  # within Δmax but not permitted
        ("Sequential", 2, "Drop", 0, 5, 5, "fresh", False),
    ],
)
def test_admit_table(
    mode: staleness.Mode,
    dmax: int,
    action: staleness.StaleAction,
    refresh: int,
    version: int,
    t: int,
    verdict: str,
    weighted: bool,
) -> None:
    adm = staleness.admit(version, t, staleness.StalenessPolicy(mode, dmax, action, refresh))
    assert adm.verdict == verdict
    assert adm.consume == (verdict in ("fresh", "weighted"))
    assert adm.importance_weighted == weighted
    assert adm.staleness == t - version
    assert adm.reason


@given(policies, st.integers(0, 50), st.integers(0, 50))
def test_consumed_groups_never_exceed_the_bound(
    policy: staleness.StalenessPolicy, version: int, t: int
) -> None:
    adm = staleness.admit(version, t, policy)
    if adm.consume:
        assert 0 <= adm.staleness <= policy.bound <= policy.max_staleness
    assert adm.importance_weighted == (
        adm.consume and policy.stale_action == "ImportanceWeight" and adm.staleness > 0
    )


@given(policies, st.integers(0, 50), st.integers(0, 50), st.integers(0, 20))
def test_refusal_as_stale_is_permanent(
    policy: staleness.StalenessPolicy, version: int, t: int, later: int
) -> None:
    if staleness.admit(version, t, policy).verdict == "stale":
        assert staleness.admit(version, t + later, policy).verdict == "stale"


@given(policies, st.integers(0, 50))
def test_min_version_is_the_oldest_consumable(policy: staleness.StalenessPolicy, t: int) -> None:
    oldest = policy.min_version(t)
    assert staleness.admit(oldest, t, policy).consume
    if oldest > 0:
        assert not staleness.admit(oldest - 1, t, policy).consume


def test_from_spec_reads_the_sync_policy() -> None:
    spec = SyncPolicySpec(
        mode="Sequential", max_staleness=3, stale_action="ImportanceWeight", refresh_threshold=2
    )
    policy = staleness.StalenessPolicy.from_spec(spec)
    assert policy == staleness.StalenessPolicy("Sequential", 3, "ImportanceWeight", 2)
    assert policy.bound == 2


def test_colocated_is_on_policy() -> None:
    spec = SyncPolicySpec(mode="Colocated", max_staleness=2)
    policy = staleness.StalenessPolicy.from_spec(spec)
    assert policy.bound == 0 and policy.mode == "Sequential"
    assert staleness.admit(4, 4, policy).consume and not staleness.admit(3, 4, policy).consume


def test_invalid_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="maxStaleness"):
        staleness.StalenessPolicy("Async", -1)
    with pytest.raises(ValueError, match="refreshThreshold"):
        staleness.StalenessPolicy("Sequential", 1, "Drop", 2)
    with pytest.raises(ValueError, match="mode"):
        staleness.StalenessPolicy("Colocated", 1)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- pacing
def test_the_floor_follows_the_consumption_order() -> None:
    policy = staleness.StalenessPolicy("Async", max_staleness=2)
    # Batch 4, the trainer waits for the batch of step 10: positions 0-3 go to step 10, 4-7 to step 11.
    assert [staleness.lease_floor(10, k, 4, policy) for k in (0, 3, 4, 7, 8)] == [8, 8, 9, 9, 10]
    assert staleness.consuming_step(10, 7, 4) == 11
    with pytest.raises(ValueError, match="batchSize"):
        staleness.consuming_step(10, 0, 0)


@pytest.mark.parametrize(
    ("next_step", "published", "ahead", "room"),
    [
        (10, 10, 0, 12),  # waiting at 10 with Δmax 2: steps 10, 11, 12 can take version-10 groups
        (11, 10, 0, 8),  # training 10 → 11: steps 11 and 12 are left
        (11, 10, 5, 3),
        (13, 10, 0, 0),  # the trainer ran past what version 10 can serve
        (11, 10, 20, 0),
    ],
)
def test_lease_room_is_what_the_published_version_can_still_serve(
    next_step: int, published: int, ahead: int, room: int
) -> None:
    policy = staleness.StalenessPolicy("Async", max_staleness=2)
    assert staleness.lease_room(next_step, ahead, 4, policy, published) == room
    # Every position the room allows has a floor the published version meets, the next one does not.
    if room:
        assert staleness.lease_floor(next_step, ahead + room - 1, 4, policy) <= published
    assert staleness.lease_floor(next_step, ahead + room, 4, policy) > published or room == 0


def test_pacing_in_time_passes_over_slow_workers_only_while_someone_is_fast_enough() -> None:
    policy = staleness.StalenessPolicy("Async", max_staleness=1)
    budget = staleness.time_budget(5.0, next_step=10, published=10, policy=policy)
    assert budget == 10.0  # steps 10 and 11 left, 5 s each
    assert staleness.time_budget(None, 10, 10, policy) is None
    assert staleness.fast_enough(9.0, budget, fastest=2.0)
    assert not staleness.fast_enough(30.0, budget, fastest=2.0)  # a faster worker can do it in time
    assert staleness.fast_enough(30.0, budget, fastest=20.0)  # nobody can: the trainer must not starve
    assert staleness.fast_enough(None, budget, fastest=2.0)  # unknown speed: try it
    assert staleness.ahead(buffered=3, leased=5, stragglers=2) == 6
