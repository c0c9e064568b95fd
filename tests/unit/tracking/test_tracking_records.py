"""Records → what the trackers log: names, values, the busy fraction, one status per version, tables."""

from __future__ import annotations

import math

import pytest

from echo_runtime import tracking
from echo_runtime.coordinator import wire
from echo_runtime.tracking.records import Points, clean, params

T0 = 1_700_000_000.0


def trainer(version: int, time: float, step_seconds: float, **extra: object) -> dict[str, object]:
    return {
        "kind": "trainer", "policyVersion": version, "time": time, "unixTime": T0 + time,
        "stepSeconds": step_seconds, "loss": -0.25 * version, "kl": None, "clipFraction": 0.125,
        "logprobMismatch": {"transformers": {"meanAbs": 1e-7, "maxAbs": 3e-7}},
        "quarantinedWorkers": ["w-1"], "workers": {"w-2": 8}, **extra,
    }  # fmt: skip


def test_trainer_record_scalars_are_named_by_their_path_and_nothing_else_is_made_up() -> None:
    point = Points(T0).point(trainer(3, 10.0, 2.0, entropy=float("nan")))
    assert point is not None
    assert point.version == 3 and point.unix_time == T0 + 10.0 and point.seconds == 10.0
    assert point.scalars == {
        "train/stepSeconds": 2.0,
        "train/loss": -0.75,
        "train/clipFraction": 0.125,
        "train/logprobMismatch/transformers/meanAbs": 1e-7,
        "train/logprobMismatch/transformers/maxAbs": 3e-7,
        "train/workers/w-2": 8.0,
    }  # None, NaN, lists and the axes are not series
    assert point.tables == ()


def test_busy_fraction_is_the_step_over_the_wall_clock_since_the_record_before() -> None:
    points = Points(T0)
    first = points.point(trainer(1, 10.0, 2.0))
    second = points.point(trainer(2, 14.0, 3.0))
    assert first is not None and "train/busyFraction" not in first.scalars
    assert second is not None and second.scalars["train/busyFraction"] == pytest.approx(3.0 / 4.0)


def test_one_status_document_per_version_with_histogram_pools_and_workers() -> None:
    points = Points(T0)
    status = {
        "kind": "status", "policyVersion": 2, "time": 5.0, "reward": 0.5, "rolloutsPerSecond": 1.5,
        "stalenessHistogram": {"0": 3, "1": 9}, "epoch": "ab12", "mode": "Async",
        "pools": {"cpu": {"workers": 2, "rejectedRollouts": {"tokenMismatch": 1}}},
        "workers": [{"id": "w-9", "rolloutsPerSecond": 0.75, "loadedVersion": 2, "host": "h"}],
    }  # fmt: skip
    point = points.point(status)
    assert point is not None and point.unix_time == T0 + 5.0
    assert point.scalars == {
        "coordinator/reward": 0.5,
        "coordinator/rolloutsPerSecond": 1.5,
        "coordinator/stalenessHistogram/0": 3.0,
        "coordinator/stalenessHistogram/1": 9.0,
        "coordinator/pools/cpu/workers": 2.0,
        "coordinator/pools/cpu/rejectedRollouts/tokenMismatch": 1.0,
        "coordinator/workers/w-9/rolloutsPerSecond": 0.75,
        "coordinator/workers/w-9/loadedVersion": 2.0,
    }
    assert points.point({**status, "time": 6.0}) is None  # asked every second, logged once per version
    assert points.point({**status, "policyVersion": 3}) is not None


def test_tables_of_samples_and_eval_examples() -> None:
    points = Points(T0)
    samples = [{"prompt": "1+1?", "completion": "2", "reward": 1.0, "worker": "w-1", "staleness": 1}]
    point = points.point(trainer(10, 30.0, 1.0, samples=samples))
    assert point is not None
    (table,) = point.tables
    assert table.name == "samples" and table.rows == ((10, "1+1?", "2", 1.0, "w-1", 1.0),)
    evaluation = {
        "kind": "eval", "policyVersion": 10, "time": 31.0, "heldoutAccuracy": 0.75, "evalSeconds": 2.0,
        "examples": [["What is 2+2?", "4", 1.0], ["bad"]],
    }  # fmt: skip
    point = points.point(evaluation)
    assert point is not None
    assert point.scalars == {"eval/heldoutAccuracy": 0.75, "eval/evalSeconds": 2.0}
    assert point.tables[0].rows == ((10, "What is 2+2?", "4", 1.0),)


def test_records_without_a_version_or_of_unknown_kinds_give_nothing() -> None:
    points = Points(T0)
    assert points.point({"kind": "trainer", "loss": 1.0}) is None
    assert points.point({"kind": "status", "policyVersion": True}) is None
    assert points.point({"kind": "other", "policyVersion": 1}) is None


def test_names_every_tracker_accepts_and_flat_parameters() -> None:
    assert (
        clean("coordinator/workers/w@1#x/rolloutsPerSecond") == "coordinator/workers/w_1_x/rolloutsPerSecond"
    )
    flat = params({"spec": {"algorithm": {"learningRate": 0.0002, "sampling": {"topP": 1.0}}, "tags": ["a"]}})
    assert flat == {
        "spec.algorithm.learningRate": "0.0002",
        "spec.algorithm.sampling.topP": "1.0",
        "spec.tags": '["a"]',
    }
    assert not math.isnan(float(flat["spec.algorithm.learningRate"]))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, []),
        ("none", []),
        ("", []),
        ("tensorboard", ["tensorboard"]),
        ("MLflow, wandb,mlflow", ["mlflow", "wandb"]),
        ("all", ["tensorboard", "mlflow", "wandb", "trackio"]),
        (["trackio"], ["trackio"]),
    ],
)
def test_report_to_parsing(given: str | list[str] | None, expected: list[str]) -> None:
    assert tracking.parse_report_to(given) == expected


@pytest.mark.parametrize("given", ["comet", "tensorboard,none", "all,wandb"])
def test_report_to_refuses_what_it_does_not_know_and_says_what_is_allowed(given: str) -> None:
    with pytest.raises(ValueError, match=r"report-to: .*tensorboard, mlflow, wandb, trackio"):
        tracking.parse_report_to(given)


def test_samples_take_the_first_rollout_of_the_first_groups_and_render_chat_prompts() -> None:
    def group(i: int, prompt: wire.PromptBody) -> wire.GroupOut:
        rollout = wire.RolloutOut(
            completion=f"c{i}", token_ids=[1], logprobs=[-0.5], policy_version=0, staleness=1, reward=0.5 * i,
            reward_components={}, reward_reason="", backend="transformers", device="cpu", dtype="float32",
        )  # fmt: skip
        return wire.GroupOut(
            task_id=f"t{i}", problem_id=f"p{i}", prompt=prompt, worker_id=f"w{i}", policy_version=0,
            staleness=1, importance_weighted=False, rollouts=[rollout, rollout],
        )  # fmt: skip

    chat = [
        wire.ChatMessage(role="system", content="Be brief."),
        wire.ChatMessage(role="user", content="2+2?"),
    ]
    got = tracking.samples([group(1, "1+1?"), group(2, chat), group(3, "x")], 2)
    assert got == [
        {"prompt": "1+1?", "completion": "c1", "reward": 0.5, "worker": "w1", "staleness": 1},
        {
            "prompt": "system: Be brief.\nuser: 2+2?",
            "completion": "c2",
            "reward": 1.0,
            "worker": "w2",
            "staleness": 1,
        },
    ]
