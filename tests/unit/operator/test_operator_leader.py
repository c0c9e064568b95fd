"""Leader election's decisions, on an in-memory Lease store with the API server's resourceVersion
rule and a clock the test moves. The same code against the real API server, with real operator
processes killed and paused: tests/integration/operator/test_operator_failover.py."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest

from echo_operator import leader
from echo_operator.kube import Kube, KubeError

Object = dict[str, Any]


class Leases:
    """create/get/update of Leases, refusing a stale resourceVersion (409) as the API server does."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], Object] = {}
        self.version = 0
        self.writes: list[str] = []
        self.down = False

    def _check(self, what: str) -> None:
        if self.down:
            raise KubeError(0, "connection refused", what)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Object | None:
        self._check("get")
        found = self.stored.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def create(self, obj: Object) -> Object:
        self._check("create")
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key in self.stored:
            raise KubeError(409, "already exists", "create Lease")
        return self._store(key, obj)

    def update(self, obj: Object) -> Object:
        self._check("update")
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if self.stored[key]["metadata"]["resourceVersion"] != obj["metadata"].get("resourceVersion"):
            raise KubeError(409, "the object has been modified", "update Lease")
        return self._store(key, obj)

    def _store(self, key: tuple[str, str], obj: Object) -> Object:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.stored[key] = stored
        self.writes.append(str(stored["spec"].get("holderIdentity")))
        return copy.deepcopy(stored)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(leases: Leases, clock: Clock, identity: str, **kw: float) -> leader.Elector:
    settings = leader.Settings(namespace="echorl-system", name="echorl-operator", identity=identity, **kw)
    return leader.Elector(leases, settings, clock=clock)  # type: ignore[arg-type]


def test_the_first_takes_a_free_lease_and_the_second_waits_the_whole_duration_on_its_own_clock() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader() and b.holder == "a"
    # a stops renewing (killed): b sees the same record for 14.9 s of its own clock and still waits.
    clock.now += 14.9
    assert not b.try_acquire_or_renew()
    clock.now += 0.2
    assert b.try_acquire_or_renew() and b.is_leader()
    lease = leases.stored[("echorl-system", "echorl-operator")]["spec"]
    assert lease["holderIdentity"] == "b" and lease["leaseTransitions"] == 1
    assert lease["leaseDurationSeconds"] == 15
    # a never counted itself the leader after its renew deadline (10 s), long before b took over.
    assert not a.is_leader()


def test_a_renewing_leader_keeps_it_and_the_follower_never_judges_by_the_renew_time_it_reads() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew()
    for _ in range(20):  # 40 s of a renewing every 2 s: b never takes it
        clock.now += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    # A leader whose wall clock is far behind (renewTime in the past) is still alive: the record changes.
    leases.stored[("echorl-system", "echorl-operator")]["spec"]["renewTime"] = "2001-01-01T00:00:00.000000Z"
    clock.now += 2
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()


def test_two_followers_racing_for_an_expired_lease_one_wins() -> None:
    leases, clock = Leases(), Clock()
    a, b, c = elector(leases, clock, "a"), elector(leases, clock, "b"), elector(leases, clock, "c")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.now += 16
    # Both read the expired record; b writes first; c's write carries the old resourceVersion.
    stale = leases.get("", "", "echorl-system", "echorl-operator")
    assert b.try_acquire_or_renew()
    real_get = leases.get
    leases.get = lambda *args: stale  # type: ignore[assignment,method-assign]
    assert not c.try_acquire_or_renew() and not c.is_leader()
    leases.get = real_get  # type: ignore[method-assign]
    assert leases.stored[("echorl-system", "echorl-operator")]["spec"]["holderIdentity"] == "b"


def test_a_released_lease_is_taken_at_the_next_try_not_after_the_duration() -> None:
    leases, clock = Leases(), Clock()
    a, b = elector(leases, clock, "a"), elector(leases, clock, "b")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and not a.is_leader()
    assert b.try_acquire_or_renew()
    assert not a.release()  # not its own any more: left alone
    assert leases.stored[("echorl-system", "echorl-operator")]["spec"]["holderIdentity"] == "b"


def test_a_leader_that_cannot_reach_the_api_stops_counting_itself_leader_at_the_renew_deadline() -> None:
    leases, clock = Leases(), Clock()
    a = elector(leases, clock, "a")
    assert a.try_acquire_or_renew()
    leases.down = True
    clock.now += 9.9
    assert not a.try_acquire_or_renew() and a.is_leader()
    clock.now += 0.2
    assert not a.is_leader()


def test_keep_reports_a_lost_lease_once_and_fences_the_writes_of_the_operators_client() -> None:
    leases, clock = Leases(), Clock()
    a = elector(leases, clock, "a", retry_s=0.01, renew_deadline_s=10.0, lease_s=15.0)
    assert a.try_acquire_or_renew()
    lost: list[str] = []
    done = threading.Event()
    # Someone else holds it now (an admin edited it, or a follower took it while a was paused).
    key = ("echorl-system", "echorl-operator")
    taken = copy.deepcopy(leases.stored[key])
    taken["spec"]["holderIdentity"] = "b"
    leases.update(taken)
    a.keep(lambda reason: (lost.append(reason), done.set()))
    assert done.wait(10)
    assert lost == ["the Lease is now held by b"]

    class Api:
        user_agent = ""

        def call_api(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a fenced write reached the API")

    kube = Kube(Api())  # type: ignore[arg-type]
    kube.fence = a.is_leader
    clock.now += 11  # past the renew deadline
    with pytest.raises(KubeError, match="no longer holds the leader Lease"):
        kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "n"}})


def test_settings_come_from_the_environment_and_bad_ones_name_the_variable() -> None:
    assert leader.Settings.from_env({}) is None
    assert leader.Settings.from_env({"ECHORL_LEADER_ELECTION": "false"}) is None
    s = leader.Settings.from_env(
        {
            "ECHORL_LEADER_ELECTION": "true",
            "POD_NAME": "op-1",
            "POD_NAMESPACE": "ops",
            "ECHORL_RETRY_PERIOD": "1",
        }
    )
    assert s == leader.Settings(namespace="ops", name="echorl-operator", identity="op-1", retry_s=1.0)
    with pytest.raises(ValueError, match="ECHORL_LEADER_ELECTION: expected true or false"):
        leader.Settings.from_env({"ECHORL_LEADER_ELECTION": "sometimes"})
    with pytest.raises(ValueError, match="ECHORL_LEASE_DURATION: expected a number of seconds"):
        leader.Settings.from_env({"ECHORL_LEADER_ELECTION": "true", "ECHORL_LEASE_DURATION": "15s"})
    with pytest.raises(ValueError, match="RENEW_DEADLINE < ECHORL_LEASE_DURATION"):
        leader.Settings.from_env({"ECHORL_LEADER_ELECTION": "true", "ECHORL_RENEW_DEADLINE": "20"})


def test_the_liveness_address_is_read_from_kopfs_options() -> None:
    assert leader.liveness_address(["run", "--liveness=http://0.0.0.0:8080/healthz"]) == ("0.0.0.0", 8080)
    assert leader.liveness_address(["--liveness", "http://127.0.0.1:9/x"]) == ("127.0.0.1", 9)
    assert leader.liveness_address(["run", "-A"]) is None
