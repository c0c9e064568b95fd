"""What the operator keeps of a trainer Job it stops: its pods' last log lines in a ConfigMap (named,
labelled, owned, bounded), and ``status.trainerHistory`` (capped, one entry per Job)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from echo_operator import apply, names
from echo_operator import trainer_record as tr
from echo_operator.children import inputs
from echo_operator.kube import KubeError
from echo_runtime import spec

MakeJob = Callable[..., inputs.JobInput]  # the make_job fixture (tests/unit/operator/conftest.py)

BODY = {"apiVersion": "echorl.dev/v1alpha1", "kind": "EchoJob",
        "metadata": {"name": "grpo", "namespace": "ml", "uid": "job-uid"}}  # fmt: skip


def pod(
    rank: int,
    phase: str = "Running",
    deleting: bool = False,
    exit_code: int | None = None,
    reason: str = "Error",
    restarts: int = 0,
) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "trainer", "restartCount": restarts, "state": {"running": {}}}
    if exit_code is not None:
        status["state"] = {"terminated": {"exitCode": exit_code, "reason": reason}}
    obj: dict[str, Any] = {
        "metadata": {"name": f"grpo-trainer-{rank}-x{rank}", "labels": {names.JOB_INDEX_LABEL: str(rank)}},
        "spec": {"nodeName": f"node-{rank}", "containers": [{"name": "trainer"}]},
        "status": {"phase": phase, "containerStatuses": [status]},
    }
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return obj


def test_a_pod_is_seen_with_its_rank_node_phase_and_how_it_ended() -> None:
    running = tr.pod_seen(pod(0))
    assert (running.rank, running.name, running.node, running.phase) == (
        0,
        "grpo-trainer-0-x0",
        "node-0",
        "Running",
    )
    assert running.exit_code is None and running.reason is None and running.containers == ("trainer",)
    assert tr.pod_seen(pod(1, deleting=True)).phase == "Terminating"
    oom = tr.pod_seen(pod(1, "Failed", deleting=True, exit_code=137, reason="OOMKilled"))
    assert (oom.phase, oom.exit_code, oom.reason, oom.deleted) == ("Failed", 137, "OOMKilled", True)
    assert tr.pod_seen(pod(0, restarts=2)).restarted == ("trainer",)


def test_a_pod_seen_earlier_and_gone_now_is_recorded_as_gone_by_rank() -> None:
    earlier = {p.key: p for p in (tr.pod_seen(pod(0)), tr.pod_seen(pod(1, deleting=True)))}
    now = [tr.pod_seen(pod(0, "Failed", exit_code=1))]
    combined = tr.combine(now, earlier)
    assert [(p.rank, p.phase, p.gone) for p in combined] == [(0, "Failed", False), (1, "Gone", True)]
    assert combined[1].name == "grpo-trainer-1-x1" and combined[1].deleted


def test_a_running_trainer_is_going_down_once_a_rank_is_deleted_or_failed_or_the_job_is_marked() -> None:
    job: dict[str, Any] = {"status": {}}
    assert not tr.going_down(job, [tr.pod_seen(pod(0)), tr.pod_seen(pod(1))])
    assert tr.going_down(job, [tr.pod_seen(pod(0)), tr.pod_seen(pod(1, deleting=True))])
    assert tr.going_down(job, [tr.pod_seen(pod(1, "Failed", exit_code=1))])
    marked = {"status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}}
    assert tr.going_down(marked, [])


def reader(texts: dict[str, str | KubeError]) -> tr.Reader:
    """Reads the logs of ``texts`` (pod name[.previous] → text, or the error the API answers)."""

    def read(p: tr.PodSeen, container: str, previous: bool, wanted: int) -> str:
        found = texts[p.name + (".previous" if previous else "")]
        if isinstance(found, KubeError):
            raise found
        return found

    return read


def test_each_rank_gets_its_log_or_a_short_reason_why_not() -> None:
    pods = tr.combine(
        [
            tr.pod_seen(pod(0, restarts=1)),
            tr.pod_seen(pod(2)),
            tr.pod_seen(pod(3)),
            tr.pod_seen(pod(4)),
        ],
        {"rank-1": tr.pod_seen(pod(1, deleting=True))},
    )
    no_host = KubeError(400, "pod grpo-trainer-2-x2 does not have a host assigned", "read log")
    forbidden = KubeError(403, 'pods "grpo-trainer-3-x3" is forbidden: cannot get resource "pods/log"', "x")
    data = tr.read_logs(
        reader({"grpo-trainer-0-x0": "step 1\nstep 2\n", "grpo-trainer-0-x0.previous": "first run\n",
                "grpo-trainer-2-x2": no_host, "grpo-trainer-3-x3": forbidden, "grpo-trainer-4-x4": ""}),
        pods,
    )  # fmt: skip
    assert data["rank-0.trainer.log"] == "step 1\nstep 2\n"
    assert data["rank-0.trainer.previous.log"] == "first run\n"
    assert data["rank-1.trainer.log"] == (
        "(log unavailable: pod grpo-trainer-1-x1 was deleted before the operator could read its log)"
    )
    assert data["rank-2.trainer.log"] == (
        "(log unavailable: pod grpo-trainer-2-x2 does not have a host assigned (HTTP 400))"
    )
    assert data["rank-3.trainer.log"].startswith("(log unavailable: forbidden: the operator may not read")
    assert data["rank-4.trainer.log"] == "(log unavailable: the container wrote nothing)"
    assert len(data) == 6
    unscheduled = pod(5)
    del unscheduled["spec"]["nodeName"]
    (only,) = tr.read_logs(reader({}), [tr.pod_seen(unscheduled)]).values()
    assert only == "(log unavailable: pod grpo-trainer-5-x5 was never scheduled to a node: it wrote no log)"


def test_reading_stops_when_its_time_is_spent_and_says_so() -> None:
    pods = [tr.pod_seen(pod(r)) for r in range(3)]
    ticks = itertools.count(0.0, tr.READ_BUDGET_S / 2 + 0.1)  # the third read starts past the budget
    data = tr.read_logs(reader({p.name: "ok\n" for p in pods}), pods, clock=lambda: next(ticks))
    assert data["rank-0.trainer.log"] == "ok\n"
    assert data["rank-2.trainer.log"].startswith("(log unavailable: not read: the operator spends at most")


def test_a_long_log_keeps_its_end_from_a_lines_start_within_its_share() -> None:
    text = "".join(f"line {i} é\n" for i in range(20_000))
    kept = tr.fit(text, 4096)
    assert len(kept.encode()) <= 4096
    assert kept.startswith("[… earlier lines cut …]\nline ")
    assert kept.endswith("line 19999 é\n")
    assert tr.fit("short\n", 4096) == "short\n"
    assert tr.per_log_bytes(1) == tr.LOG_BYTES
    assert tr.per_log_bytes(64) == tr.BUDGET_BYTES // 64


def test_a_configmap_of_many_ranks_with_long_logs_stays_well_under_the_one_mebibyte_limit() -> None:
    pods = [tr.pod_seen(pod(r, restarts=1)) for r in range(200)]
    huge = "x" * 300 + "\n"
    data = tr.read_logs(lambda p, c, prev, wanted: huge * 2000, pods)
    data[tr.SUMMARY_KEY] = tr.summary("grpo-trainer", 1, "now", "TrainerFailed", "m", 7, pods)
    cm = tr.logs_configmap(BODY, 1, "trainer-uid", data)
    size = sum(len(k) + len(v.encode()) for k, v in cm["data"].items())
    assert size < 768 * 1024, size
    assert len(data) == 2 * tr.MAX_LOGGED_PODS + 1  # the first 128 ranks' logs, both runs, and the summary
    assert "(the logs of the first 128 ranks are kept)" in data[tr.SUMMARY_KEY]


def test_the_configmap_is_named_after_the_job_and_number_labelled_and_owned_by_the_job() -> None:
    cm = tr.logs_configmap(BODY, 3, "trainer-uid", {"rank-0.trainer.log": "hi\n"})
    meta = cm["metadata"]
    assert meta["name"] == names.trainer_logs("grpo", 3) == "grpo-trainer-logs-3"
    assert meta["namespace"] == "ml"
    assert meta["labels"][names.JOB] == "grpo"
    assert meta["labels"][names.COMPONENT] == "trainer-logs"
    assert meta["labels"][tr.NUMBER_LABEL] == "3"
    assert meta["annotations"][tr.UID_ANNOTATION] == "trainer-uid"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "EchoJob",
        "grpo",
        "job-uid",
        True,
    )
    assert tr.is_logs(cm) and tr.number_of(cm) == 3
    assert not tr.is_logs({"kind": "ConfigMap", "metadata": {"labels": {names.COMPONENT: "config"}}})


def test_a_later_read_keeps_the_log_an_earlier_read_of_the_same_job_got() -> None:
    early = {"rank-0.trainer.log": "rank 0 text\n", "rank-1.trainer.log": "rank 1 last words\n"}
    late = {
        "rank-0.trainer.log": "rank 0 text\nand more\n",
        "rank-1.trainer.log": tr.unavailable("pod gone"),
        tr.SUMMARY_KEY: "s\n",
    }
    merged = tr.merge(early, late)
    assert merged == {
        "rank-0.trainer.log": "rank 0 text\nand more\n",
        "rank-1.trainer.log": "rank 1 last words\n",
        tr.SUMMARY_KEY: "s\n",
    }


def test_only_the_last_few_configmaps_are_kept() -> None:
    listed = [{"metadata": {"name": f"grpo-trainer-logs-{n}", "labels": {tr.NUMBER_LABEL: str(n)}}}
              for n in range(1, 8)]  # fmt: skip
    assert tr.stale(listed, 7) == ["grpo-trainer-logs-1", "grpo-trainer-logs-2"]
    assert tr.stale(listed[:3], 3) == []


def entry(number: int, uid: str) -> dict[str, Any]:
    return tr.history_entry(number, "2026-12-01T00:00:00Z", "TrainerFailed", "m", uid, None, None, [])


def test_the_history_keeps_one_entry_per_trainer_job_and_only_the_last_ten() -> None:
    history: list[dict[str, Any]] = []
    for n in range(1, 13):
        assert tr.next_number(history) == n
        history = tr.appended(history, entry(n, f"u{n}"))
    assert [e["restart"] for e in history] == list(range(3, 13))
    assert tr.next_number(history) == 13
    again = tr.appended(history, {**entry(12, "u12"), "reason": "SpecChanged"})
    assert len(again) == 10 and again[-1]["reason"] == "SpecChanged"
    assert tr.entry_for(again, "u5") is not None and tr.entry_for(again, "u1") is None


def test_a_history_entry_is_bounded_and_fits_the_status_schema() -> None:
    pods = [tr.pod_seen(pod(r, "Failed", exit_code=137, reason="OOMKilled")) for r in range(20)]
    made = tr.history_entry(
        2, "2026-12-01T00:00:00Z", "OOMKilled", "m" * 5000, "u2", 41, "grpo-trainer-logs-2", pods
    )
    assert len(made["message"]) == tr.MESSAGE_CHARS
    assert len(made["pods"]) == tr.MAX_PODS
    assert made["pods"][0] == {
        "rank": 0, "name": "grpo-trainer-0-x0", "node": "node-0", "phase": "Failed",
        "exitCode": 137, "reason": "OOMKilled",
    }  # fmt: skip
    assert "policyVersion" in made and "logsConfigMap" in made
    assert "logsConfigMap" not in entry(1, "u1") and "policyVersion" not in entry(1, "u1")
    history = [entry(n, f"u{n}") for n in range(1, 10)] + [made]
    status = spec.EchoJobStatus.model_validate({"trainerHistory": history})
    assert status.trainer_history[-1].logs_config_map == "grpo-trainer-logs-2"
    with pytest.raises(ValueError):
        spec.EchoJobStatus.model_validate({"trainerHistory": [*history, entry(11, "u11")]})


def test_events_and_messages_name_the_configmap_to_read() -> None:
    assert tr.hint({"logsConfigMap": "grpo-trainer-logs-2"}) == (
        "; its pods' last log lines: kubectl get configmap grpo-trainer-logs-2 -o yaml"
    )
    assert tr.hint({}) == ""


def test_pruning_leaves_the_logs_configmaps_and_a_suspended_trainer_says_why(make_job: MakeJob) -> None:
    logs = tr.logs_configmap(BODY, 1, "u", {})
    config = {"kind": "ConfigMap", "metadata": {"name": "grpo-config", "labels": {}}}
    existing = {("ConfigMap", "grpo-trainer-logs-1"): logs, ("ConfigMap", "grpo-config"): config}
    assert apply.prune(existing, set()) == [("ConfigMap", "grpo-config")]
    job = make_job()
    held = dataclasses.replace(job, held=inputs.Hold("Preempted", "by a-b"))
    assert apply.why_stopped(held) == ("Preempted", "the job's queue holds it: by a-b")
    suspended = dataclasses.replace(job, spec=job.spec.model_copy(update={"suspend": True}))
    assert apply.why_stopped(suspended)[0] == "Suspended"
