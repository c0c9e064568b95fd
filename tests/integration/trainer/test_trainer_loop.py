"""The trainer loop against the real local snapshot store: publish, announce, checkpoint, resume.

The coordinator here is a scripted stand-in (deterministic batches per version, recorded announcements),
so that two runs can be compared bit for bit; test_trainer_e2e.py runs against the real coordinator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_scripted import ScriptedCoordinator, make_job

from echo_runtime import spec
from echo_runtime.snapshots import open_store, payloads
from echo_runtime.trainer import loop


def _run(job: spec.ResolvedJob, coordinator: ScriptedCoordinator, **options: Any) -> loop.RunResult:
    store = open_store(job.spec.storage, job.name, retention=job.sync_policy.retention)
    return loop.run(job, coordinator=coordinator, store=store, options=loop.LoopOptions(**options))


def _store(job: spec.ResolvedJob) -> Any:
    return open_store(job.spec.storage, job.name)


def _assert_same_adapter(
    a_job: spec.ResolvedJob, b_job: spec.ResolvedJob, version: int, tmp_path: Path
) -> None:
    """Version ``version`` of the two jobs' adapters is the same, bit for bit."""
    a, b = _adapter(a_job, version, tmp_path / "ca"), _adapter(b_job, version, tmp_path / "cb")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0)


def _adapter(job: spec.ResolvedJob, version: int, cache: Path) -> dict[str, torch.Tensor]:
    store = open_store(job.spec.storage, job.name)
    return payloads.load_lora_adapter(store.fetch(version, cache)).tensors


def test_every_step_publishes_the_next_version(tiny_model_dir: str, tmp_path: Path) -> None:
    job = make_job(tmp_path, tiny_model_dir, interval=2, max_steps=3)
    coordinator = ScriptedCoordinator()
    result = _run(job, coordinator, metrics_path=tmp_path / "metrics.jsonl")
    assert (result.start_version, result.version, len(result.steps)) == (0, 3, 3)
    store = open_store(job.spec.storage, job.name)
    assert store.versions() == [1, 2, 3]
    assert store.checkpoints() == [2, 3]  # every 2 versions, and the last one
    assert store.manifest(3).kind == "lora"
    assert coordinator.asked == [0, 1, 2] and coordinator.announced == [0, 1, 2, 3]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["policyVersion"] for r in records] == [1, 2, 3]
    assert all(
        r["kind"] == "trainer" and r["stepSeconds"] > 0 and r["publishSeconds"] > 0 and r["batchSeconds"] >= 0
        for r in records
    )
    assert records[0]["logprobMismatch"]["transformers"]["sequences"] == 6
    assert records[1]["checkpointSeconds"] > 0 and records[0]["checkpointSeconds"] == 0
    assert records[2]["kl"] > 0


def test_the_result_keeps_only_the_last_steps(
    tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of any length holds a bounded number of step metrics (every record is in the file)."""
    monkeypatch.setattr(loop, "RECENT_STEPS", 2)
    job = make_job(tmp_path, tiny_model_dir, interval=10, max_steps=3)
    result = _run(job, ScriptedCoordinator(), metrics_path=tmp_path / "metrics.jsonl")
    assert result.version == 3 and [m.version for m in result.steps] == [2, 3]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_the_next_batch_is_fetched_while_the_step_runs_and_announced_versions_stay_in_order(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    """Overlapped I/O (the default): the batch of v + 1 is asked for before v + 1 is announced (the step
    and the upload run meanwhile); announcements stay in order; from the second request on the
    coordinator is told the trainer's own time per version; each record is written once, in order."""
    job = make_job(tmp_path, tiny_model_dir, interval=10, max_steps=4)
    coordinator = ScriptedCoordinator()
    _run(job, coordinator, metrics_path=tmp_path / "metrics.jsonl")
    events = coordinator.events
    assert coordinator.announced == [0, 1, 2, 3, 4] and coordinator.asked == [0, 1, 2, 3]
    for v in (1, 2, 3):
        assert events.index(("ask", v)) < events.index(("announce", v)), events
    told = coordinator.step_seconds
    assert told[:2] == [None, None] and all(t is not None and t > 0 for t in told[2:]), told
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["policyVersion"] for r in records] == [1, 2, 3, 4]
    assert all(r["publishUploadSeconds"] > 0 and r["publishSeconds"] > 0 for r in records)
    assert _store(job).versions() == [1, 2, 3, 4] and _store(job).checkpoints() == [4]


def test_overlapped_io_trains_exactly_what_the_inline_loop_trains(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    inline = make_job(tmp_path / "a", tiny_model_dir, interval=2, max_steps=4)
    plain = ScriptedCoordinator()
    _run(inline, plain, overlap_io=False)
    overlapped = make_job(tmp_path / "b", tiny_model_dir, interval=2, max_steps=4)
    _run(overlapped, ScriptedCoordinator())
    events = plain.events
    assert all(events.index(("announce", v)) < events.index(("ask", v)) for v in (1, 2, 3)), events
    _assert_same_adapter(inline, overlapped, 4, tmp_path)


def test_full_fine_tuning_with_delta_snapshots_publishes_the_same_weights(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    """The same run twice, full fine-tuning: every version in full, or anchors every 3 versions and deltas
    between. Every version a reader fetches is bit-identical between the two, and the deltas are small."""
    plain = make_job(tmp_path / "a", tiny_model_dir, interval=10, max_steps=5, full=True)
    _run(plain, ScriptedCoordinator(), collect=False)  # every version stays, to be read back
    delta = make_job(tmp_path / "b", tiny_model_dir, interval=10, max_steps=5, full=True, anchor_interval=3)
    _run(delta, ScriptedCoordinator(), collect=False)
    a, b = _store(plain), _store(delta)
    assert [v for v in b.versions() if b.manifest(v).delta is None] == [1, 3]
    assert all(a.manifest(v).delta is None for v in a.versions())
    for v in (2, 4, 5):
        assert b.manifest(v).total_size < a.manifest(v).total_size / 3
    for v in range(1, 6):
        want = payloads.load_state_dict(a.fetch(v, tmp_path / "ca"))
        got = payloads.load_state_dict(b.fetch(v, tmp_path / "cb"))
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(want[name].view(torch.uint8), got[name].view(torch.uint8)), (v, name)


def test_records_a_killed_trainer_did_not_write_are_recovered_from_the_snapshots(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    """Killed with the newest version published in the background and the one before published but its
    record not yet written: its successor writes both from the snapshots, once each."""
    job = make_job(tmp_path, tiny_model_dir, interval=10, max_steps=4)
    metrics = tmp_path / "metrics.jsonl"
    _run(job, ScriptedCoordinator(), metrics_path=metrics)
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines[:2]) + "\n")  # versions 3 and 4 unrecorded
    store = _store(job)
    assert loop.recover_record(store, metrics, 4, tmp_path / "cache")
    assert not loop.recover_record(store, metrics, 4, tmp_path / "cache")  # nothing left to recover
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["policyVersion"] for r in records] == [1, 2, 3, 4]
    assert [bool(r.get("recovered")) for r in records] == [False, False, True, True]


def test_resume_after_a_clean_stop_is_exact(tiny_model_dir: str, tmp_path: Path) -> None:
    """4 steps in one go == 2 steps, stop, resume, 2 more steps: the same version 4, bit for bit."""
    straight = make_job(tmp_path / "a", tiny_model_dir, interval=3, max_steps=4)
    _run(straight, ScriptedCoordinator())

    split = make_job(tmp_path / "b", tiny_model_dir, interval=3, max_steps=4)
    first = _run(split, ScriptedCoordinator(), max_steps=2)
    coordinator = ScriptedCoordinator()
    second = _run(split, coordinator, resume=True)
    assert (first.version, second.start_version, second.version) == (2, 2, 4)
    assert coordinator.asked == [2, 3] and coordinator.announced == [2, 3, 4]
    store = open_store(split.spec.storage, split.name)
    assert store.versions() == [1, 2, 3, 4] and store.checkpoints() == [3, 4]  # retention keeps 2
    _assert_same_adapter(straight, split, 4, tmp_path)


def test_resume_after_a_crash_continues_from_the_newest_published_version(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    job = make_job(tmp_path, tiny_model_dir, interval=2, max_steps=5)
    with pytest.raises(ConnectionError, match="scripted crash"):
        _run(job, ScriptedCoordinator(fail_at=3))
    store = open_store(job.spec.storage, job.name)
    # version 3 was published but not checkpointed
    assert store.versions() == [1, 2, 3] and store.checkpoints() == [2]

    coordinator = ScriptedCoordinator()
    resumed = _run(job, coordinator, resume=True, max_steps=4)
    # Version 3 is neither repeated nor skipped: training continues from its weights and publishes 4.
    assert (resumed.start_version, resumed.version) == (3, 4)
    assert coordinator.asked == [3] and coordinator.announced == [3, 4]
    assert store.versions() == [1, 2, 3, 4]
    assert store.checkpoints() == [2, 4]


def test_an_existing_store_needs_resume(tiny_model_dir: str, tmp_path: Path) -> None:
    job = make_job(tmp_path, tiny_model_dir, max_steps=1)
    _run(job, ScriptedCoordinator())
    with pytest.raises(loop.ResumeRefused, match="--resume"):
        _run(job, ScriptedCoordinator())
    done = _run(job, ScriptedCoordinator(), resume=True)  # already at maxSteps: nothing to do
    assert (done.start_version, done.version, done.steps) == (1, 1, ())


def test_groups_the_staleness_rule_refuses_are_never_trained_on(
    tiny_model_dir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Group 1 of every batch comes from 2 versions back: beyond Δmax = 1, so the trainer drops it.
    job = make_job(tmp_path, tiny_model_dir, max_steps=3)
    result = _run(job, ScriptedCoordinator(stale_by=2))
    assert [m.dropped_groups for m in result.steps] == [0, 0, 1]  # at versions 0 and 1, 2 back is still 0
    assert [m.rollouts for m in result.steps] == [6, 6, 3]
    assert all(m.max_staleness is not None and m.max_staleness <= 1 for m in result.steps)
    assert "dropping group t2-1 at version 2" in caplog.text

    # With ImportanceWeight, a group one version behind is consumed with the decoupled surrogate.
    weighted = make_job(tmp_path / "w", tiny_model_dir, max_steps=2, staleAction="ImportanceWeight")
    steps = _run(weighted, ScriptedCoordinator(stale_by=1)).steps
    assert [m.weighted_groups for m in steps] == [0, 1]


def test_the_trainer_applies_retention_while_it_runs(tiny_model_dir: str, tmp_path: Path) -> None:
    """keepLast 1, Δmax 1: after each version the store keeps the newest and the one before it (a worker
    may still generate with it), and the newest checkpoint; the records say how many versions remain."""
    job = make_job(
        tmp_path, tiny_model_dir, interval=2, max_steps=7, retention={"keepLast": 1, "checkpointKeepLast": 1}
    )
    metrics = tmp_path / "metrics.jsonl"
    _run(job, ScriptedCoordinator(), metrics_path=metrics)
    store = _store(job)
    assert store.versions() == [6, 7] and store.checkpoints() == [7]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["policyVersion"] for r in records] == list(range(1, 8))
    assert all(r["retentionFailures"] == 0 for r in records)
    assert max(r.get("snapshotsKept", 0) for r in records) <= 2  # never more than keepLast + the bound
    assert records[-1]["snapshotsCollected"] >= 3
