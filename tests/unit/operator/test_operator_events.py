"""The operator's Events: about the right object, from the operator, with a bounded message."""

from __future__ import annotations

from typing import Any

import pytest

from echo_operator import events, names
from echo_operator.kube import KubeError

BODY = {
    "apiVersion": "echorl.dev/v1alpha1",
    "kind": "EchoJob",
    "metadata": {"name": "j", "namespace": "ml", "uid": "u-1"},
}


def test_an_event_is_about_the_object_and_from_the_operator() -> None:
    event = events.new_event(BODY, "Warning", "ReferenceNotFound", "gone", "op-0", "2026-01-01T00:00:00Z")
    assert event["involvedObject"] == {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "name": "j",
        "namespace": "ml",
        "uid": "u-1",
    }
    assert event["metadata"]["namespace"] == "ml"
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "ReferenceNotFound", "gone")
    assert event["source"] == {"component": names.MANAGER}
    assert (event["reportingComponent"], event["reportingInstance"]) == (names.MANAGER, "op-0")
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-01-01T00:00:00Z"
    assert event["count"] == 1


def test_an_object_of_another_kind_is_named_as_such() -> None:
    swarm = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "InferenceSwarm",
        "metadata": {"name": "p", "namespace": "ml"},
    }
    event = events.new_event(swarm, "Normal", "R", "m", "op-0", "t")
    assert event["involvedObject"]["kind"] == "InferenceSwarm"
    assert event["involvedObject"]["uid"] is None


def test_a_long_message_is_cut_to_what_the_api_server_accepts() -> None:
    event = events.new_event(BODY, "Warning", "ApplyFailed", "x" * 5000, "op-0", "t")
    assert len(event["message"]) == 1024


def test_the_same_event_is_the_same_key_and_anything_else_is_not() -> None:
    same = events.key(BODY, "Warning", "ReferenceNotFound", "SyncPolicy 'x' not found")
    assert events.key(BODY, "Warning", "ReferenceNotFound", "SyncPolicy 'x' not found") == same
    others = {
        events.key(BODY, "Normal", "ReferenceNotFound", "SyncPolicy 'x' not found"),
        events.key(BODY, "Warning", "StorageUnavailable", "SyncPolicy 'x' not found"),
        events.key(BODY, "Warning", "ReferenceNotFound", "SyncPolicy 'y' not found"),
        events.key(
            {**BODY, "metadata": {**BODY["metadata"], "uid": "u-2"}},
            "Warning",
            "ReferenceNotFound",
            "SyncPolicy 'x' not found",
        ),
        events.key(
            {**BODY, "kind": "InferenceSwarm"}, "Warning", "ReferenceNotFound", "SyncPolicy 'x' not found"
        ),
        events.key(
            {**BODY, "metadata": {**BODY["metadata"], "namespace": "other"}},
            "Warning",
            "ReferenceNotFound",
            "SyncPolicy 'x' not found",
        ),
    }
    assert same not in others and len(others) == 6


def test_messages_that_differ_only_beyond_what_is_posted_are_the_same_event() -> None:
    long = "x" * 1024
    assert events.key(BODY, "Warning", "R", long + "a") == events.key(BODY, "Warning", "R", long + "b")


def test_a_repeat_counts_one_more_and_moves_the_last_time() -> None:
    assert events.repeat(1, "2026-01-01T00:00:09Z") == {"count": 2, "lastTimestamp": "2026-01-01T00:00:09Z"}
    assert events.repeat(41, "t")["count"] == 42


class FakeKube:
    """Records the Event calls; ``gone`` names Events the API server has expired."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.gone: set[str] = set()
        self.created = 0

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.created += 1
        name = f"{obj['metadata']['generateName']}{self.created}"
        self.calls.append(("create", name))
        return {**obj, "metadata": {**obj["metadata"], "name": name}}

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        if name in self.gone:
            raise KubeError(404, "not found", f"patch Event {name}")
        self.calls.append(("patch", (name, patch["count"])))
        return {}


def recorder() -> tuple[events.Recorder, FakeKube]:
    fake = FakeKube()
    return events.Recorder(fake, "op-0"), fake  # type: ignore[arg-type]


def test_a_repeated_event_is_patched_with_a_growing_count() -> None:
    rec, fake = recorder()
    for _ in range(3):
        rec.post(BODY, "Warning", "ReferenceNotFound", "gone")
    rec.post(BODY, "Warning", "StorageUnavailable", "down")
    assert fake.calls == [("create", "j.1"), ("patch", ("j.1", 2)), ("patch", ("j.1", 3)), ("create", "j.2")]


def test_an_expired_event_is_posted_anew_and_counted_from_one() -> None:
    rec, fake = recorder()
    rec.post(BODY, "Warning", "R", "m")
    fake.gone.add("j.1")
    rec.post(BODY, "Warning", "R", "m")
    rec.post(BODY, "Warning", "R", "m")
    assert fake.calls == [("create", "j.1"), ("create", "j.2"), ("patch", ("j.2", 2))]


def test_a_failed_post_is_not_raised_and_not_remembered() -> None:
    rec, fake = recorder()

    def refuse(obj: dict[str, Any]) -> dict[str, Any]:
        raise KubeError(403, "forbidden", "create Event")

    fake.create = refuse  # type: ignore[method-assign]
    rec.post(BODY, "Warning", "R", "m")  # only logged
    fake.create = FakeKube.create.__get__(fake)  # type: ignore[method-assign]
    rec.post(BODY, "Warning", "R", "m")
    assert fake.calls == [("create", "j.1")]


def test_the_memory_is_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "CACHE_SIZE", 2)
    rec, fake = recorder()
    for reason in ("A", "B", "C", "A"):
        rec.post(BODY, "Normal", reason, "m")
    assert [c for c in fake.calls if c[0] == "create"] == [
        ("create", "j.1"),
        ("create", "j.2"),
        ("create", "j.3"),
        ("create", "j.4"),
    ]
