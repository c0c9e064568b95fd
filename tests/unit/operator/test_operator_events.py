"""The operator's Events: about the right object, from the operator, with a bounded message."""

from __future__ import annotations

from echo_operator import events, names

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
