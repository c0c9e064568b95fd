"""The coordinator's tallies (coordinator.counters) on their own: the rate meter and the counts."""

from __future__ import annotations

import pytest

from echo_runtime.coordinator import counters


def test_the_rate_is_events_over_the_window_or_over_the_time_since_start_if_shorter() -> None:
    window = counters.RateWindow(30.0, now=100.0)
    window.add(100.2, 6)
    window.add(100.7, 4)  # the same second
    assert window.rate(100.9) == pytest.approx(10.0)  # spans count at least one second
    assert window.rate(105.0) == pytest.approx(10 / 5)
    window.add(125.0, 20)
    assert window.rate(125.5) == pytest.approx(30 / 25.5)
    assert window.rate(140.0) == pytest.approx(20 / 30)  # the first second left the window
    assert window.rate(200.0) == 0.0


def test_a_window_shorter_than_a_second_counts_one_second() -> None:
    window = counters.RateWindow(0.2, now=0.0)
    window.add(3.5, 5)
    assert window.rate(3.9) == pytest.approx(5.0)
    assert window.rate(4.0) == 0.0


def test_consumed_and_withdrawn_keep_count_and_histogram_in_step() -> None:
    c = counters.Counters(rate=counters.RateWindow(30.0, 0.0))
    for staleness, weighted in [(0, False), (1, True), (1, False), (2, True)]:
        c.consumed(staleness, weighted)
    assert (c.consumed_groups, c.weighted_stale, c.max_observed_staleness) == (4, 2, 2)
    assert dict(c.staleness_histogram) == {0: 1, 1: 2, 2: 1}
    c.withdrawn(2)
    c.withdrawn(1)
    assert c.consumed_groups == sum(c.staleness_histogram.values()) == 2
    assert dict(c.staleness_histogram) == {0: 1, 1: 1, 2: 0}
    assert c.max_observed_staleness == 2  # what was observed was observed


def test_batches_carry_their_mean_reward_and_accepted_rollouts_feed_the_rate() -> None:
    c = counters.Counters(rate=counters.RateWindow(10.0, 0.0))
    assert c.last_reward is None and c.max_observed_staleness is None
    c.handed([1.0, 0.0, 0.5, 0.5])
    c.handed([1.0, 1.0])
    assert (c.batches, c.last_reward) == (2, 1.0)
    c.accepted(4, now=2.0, pool="gpu")
    c.accepted(4, now=3.0, pool="gpu")
    assert c.accepted_rollouts == 8 and c.rate.rate(4.0) == pytest.approx(8 / 4)
