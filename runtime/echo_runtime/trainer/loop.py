"""The trainer's loop: batch at version t → admission → one optimizer step → publish t+1 → announce.

One iteration, on every rank of the data-parallel group (rank 0 alone does the I/O)::

    rank 0: batch = coordinator.wait_batch(t)          # long-poll; the prompt text is tokenised here
    rank 0: verify.check_batch(batch)                   # behaviour log-probs, each group with the
                                                        # weights of the version it claims; liars
                                                        # are quarantined and their groups removed
    all:    plan  = plan_step(batch, staleness policy)  # the trainer's own admission check
    all:    train_step(plan)                            # micro-batches, DDP all-reduce, AdamW
    rank 0: export t + 1 to files; then, in a thread: store.publish(t + 1); coordinator.announce(t + 1)
    all:    every checkpointInterval versions (and at the last one): checkpoint through the store

The trainer does not wait on I/O it can overlap (:mod:`.overlap`): the batch of ``t + 1`` is fetched
while the step ``t → t + 1`` runs, and the upload and announcement of ``t + 1`` happen while the next
step runs. ``LoopOptions.overlap_io=False`` does both in line, one after the other (benchmarks compare
the two side by side).

Promises:

* **Versions are consecutive and never reused.** The version published after a step is exactly one more
  than the version the batch was requested at; a (re)started trainer continues from the newest published
  version (:func:`echo_runtime.trainer.checkpoint.resume_point`), so no version is repeated or skipped.
  Without ``resume`` a store that already holds versions or checkpoints of the job is an error, never
  silently continued or overwritten.
* **Publish, then announce.** A version is announced only after the store has it, so a worker told to
  load it can; versions are announced in order (one publish in flight at a time), and a checkpoint of
  a version is written only after the version itself is published.
* **Nothing too stale is trained on.** Every group goes through
  :func:`echo_runtime.staleness.admit` again here; refused groups are dropped (and logged as
  errors: the coordinator applies the same rule, so any is a bug or a mismatched manifest). A batch with
  nothing admissible stops the trainer with an error rather than asking for the same batch forever.
* **Nothing a caught worker sent is trained on.** Before a step, the log-probs of random rollouts of
  every group are recomputed with the weights of the version the group claims (:mod:`.verify`: the
  trainer keeps the last Δmax versions' trainable weights); a worker above ``maxLogprobMismatch`` is
  reported to the coordinator (quarantined) and all its groups leave the batch before the optimizer
  step, as does a group whose version could not be had to check it; a batch left empty is replaced by
  a new one at the same version.
* A clean end (``maxSteps`` reached) always leaves a checkpoint of the last version.
* Each step's metrics go to the log and, when a metrics file is given, as one JSON record
  (``kind: "trainer"``) per version, written once the version is published, including the per-backend log-prob mismatch, the rollouts trained
  on per worker and the log-prob checks. The record also travels inside the version's snapshot
  (``trainer-record.json``), so a trainer killed between publishing a version and writing its record
  writes it when it resumes (marked ``recovered``): every version has exactly one record.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import random
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

from echo_runtime import staleness
from echo_runtime.coordinator import convert, wire
from echo_runtime.models.prompts import Prompt, PromptStyle
from echo_runtime.rollout import Batch
from echo_runtime.snapshots import deltas, errors, manifest
from echo_runtime.spec.load import ResolvedJob
from echo_runtime.tracking import samples as tracking_samples
from echo_runtime.trainer import checkpoint as ckpt
from echo_runtime.trainer import collect, distributed, overlap, step, verify
from echo_runtime.trainer.batch import shard
from echo_runtime.trainer.policy import TrainablePolicy, load_policy

_log = logging.getLogger(__name__)
T = TypeVar("T")
RECORD_FILE = "trainer-record.json"
"""The step's metrics record, published inside the version's snapshot."""
RECOVER_BACK = 2
"""How many versions back from the newest a resumed trainer looks for records its predecessor did not
write: the newest and the one before (one publish in flight, :mod:`.overlap`)."""


class Coordinator(Protocol):
    """What the loop needs from the coordinator (:class:`echo_runtime.coordinator.client.TrainerClient`)."""

    def announce(self, version: int) -> Any: ...

    def wait_batch(
        self,
        version: int,
        policy: staleness.StalenessPolicy | None = None,
        timeout: float | None = None,
        *,
        step_seconds: float | None = None,
    ) -> wire.BatchReply: ...

    def quarantine(
        self, worker_id: str, reason: str, *, version: int, mismatch: float | None = None
    ) -> Any: ...


class Store(Protocol):
    """What the loop needs from the snapshot store (:class:`echo_runtime.snapshots.SnapshotStore`)."""

    def publish(
        self,
        version: int,
        files: Any,
        *,
        kind: Any,
        base_model: str,
        step: int | None = None,
        delta: Any = None,
    ) -> Any: ...

    def latest_version(self) -> int | None: ...

    def gc(self, *, keep_from: int | None = None) -> Any: ...

    def latest_checkpoint(self) -> int | None: ...

    def fetch(self, version: int, cache_dir: Any) -> Path: ...

    def fetch_checkpoint(self, step: int, cache_dir: Any) -> Path: ...

    def stage_checkpoint(self, step: int) -> str: ...

    def upload_checkpoint_part(self, step: int, data: str, files: Any) -> list[Any]: ...

    def commit_checkpoint(
        self, step: int, data: str, entries: Sequence[Any], *, base_model: str = ""
    ) -> Any: ...


class ResumeRefused(RuntimeError):
    """The store already holds this job's versions and ``resume`` was not asked for."""


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """How to run the loop (the rest comes from the manifest)."""

    resume: bool = False
    cache_dir: Path | None = None
    """Where fetched snapshots/checkpoints are kept (default: a temporary directory)."""
    metrics_path: Path | None = None
    """Append one JSON record per step here (rank 0)."""
    max_steps: int | None = None
    """Stop at this version instead of ``spec.algorithm.maxSteps``."""
    batch_timeout_s: float | None = None
    """Give up waiting for one batch after this long (None: wait as long as it takes)."""
    on_step: Callable[[step.StepMetrics], None] | None = None
    """Called on rank 0 after each published step (tests, progress bars)."""
    overlap_io: bool = True
    """Fetch the next batch and upload the last snapshot while a step runs (:mod:`.overlap`); False
    does them in line (to measure what overlapping saves). The batch timeout then starts with the
    prefetch, that is with the step before."""
    on_record: Callable[[dict[str, Any]], None] | None = None
    """Called on rank 0 with each step's record as it is written (the experiment trackers)."""
    collect: bool = True
    """Apply ``syncPolicy.retention`` to the store after each published version (:mod:`.collect`);
    False leaves every version in place (tests that read old versions back; a user sets ``keepLast``)."""
    strategy: distributed.Strategy | None = None
    """How the ranks hold the model (:func:`echo_runtime.trainer.distributed.wrap`), overriding
    ``trainingSwarm.strategy``: ``FSDP`` shards it, and then every rank takes part in the log-prob
    check, the export and the checkpoint."""


@dataclasses.dataclass(frozen=True)
class RunResult:
    start_version: int
    version: int
    """The last version published (equal to ``start_version`` if no step ran)."""
    steps: tuple[step.StepMetrics, ...]
    """The metrics of the last steps, at most :data:`RECENT_STEPS` (a run of any length holds no more;
    every step's record is in the metrics file)."""


RECENT_STEPS = 1000


def run(
    job: ResolvedJob,
    *,
    coordinator: Coordinator | None,
    store: Store | None,
    world: distributed.World | None = None,
    options: LoopOptions | None = None,
    model_dir: str | None = None,
) -> RunResult:
    """Train ``job`` until ``maxSteps``; ``coordinator`` and ``store`` are needed on rank 0 only."""
    world = world or distributed.World()
    options = options or LoopOptions()
    if world.is_main and (coordinator is None or store is None):
        raise ValueError("rank 0 needs a coordinator client and a snapshot store")
    algorithm = job.spec.algorithm
    max_steps = options.max_steps if options.max_steps is not None else algorithm.max_steps
    interval = job.training_swarm.checkpoint_interval
    with tempfile.TemporaryDirectory(prefix="echorl-trainer-") as scratch:
        cache_dir = options.cache_dir or Path(scratch) / "cache"
        swarm = job.training_swarm
        strategy = options.strategy or swarm.strategy
        fsdp = distributed.FSDP(
            mixed_precision=swarm.fsdp.mixed_precision,
            offload=swarm.fsdp.offload,
            reshard_after_forward=swarm.fsdp.reshard_after_forward,
        )
        trainer = Trainer.build(job, world, model_dir, strategy, fsdp)
        sharded = trainer.policy.sharded
        start = resume_from_store(trainer, store, world, options.resume, cache_dir)
        if world.is_main and store is not None and options.metrics_path is not None:
            recover_record(store, options.metrics_path, start, cache_dir)
        # FSDP shards the model in place (Trainer.build); DDP wraps it now, broadcasting rank 0's weights.
        module = trainer.policy.model if sharded else distributed.wrap(trainer.policy.model, world)
        policy_rule = staleness.StalenessPolicy.from_spec(job.sync_policy)
        if sharded and job.sync_policy.logprob_checks_per_group > 0:
            # Every rank checks (each forward is a collective) and keeps its own shards of the last
            # Δmax versions; a version it lacks (right after a resume) every rank fetches from the store.
            trainer.history = verify.History(
                policy_rule.bound, functools.partial(_fetch_on_every_rank, store, cache_dir, world)
            )
        elif world.is_main and store is not None and job.sync_policy.logprob_checks_per_group > 0:
            trainer.history = verify.History(policy_rule.bound, functools.partial(_fetch, store, cache_dir))
        config = step.StepConfig.from_algorithm(algorithm)
        comm = distributed.collective(world)
        metrics_file = (
            options.metrics_path.open("a", encoding="utf-8")
            if options.metrics_path and world.is_main
            else None
        )
        version, done = start, collections.deque[step.StepMetrics](maxlen=RECENT_STEPS)
        main = world.is_main and store is not None and coordinator is not None
        prefetch: overlap.Prefetch[wire.BatchReply] = overlap.Prefetch()
        publisher = (
            overlap.Publisher(
                lambda v, exported: upload_version(trainer, store, v, exported),  # type: ignore[arg-type]
                coordinator.announce,  # type: ignore[union-attr]
            )
            if main
            else None
        )
        collector = (
            collect.Collector(store, policy_rule) if main and store is not None and options.collect else None
        )
        finals: dict[int, tuple[dict[str, Any], step.StepMetrics]] = {}
        uploads: dict[int, float] = {}

        def published(finished: overlap.Published | None) -> None:
            """Note a finished publish and write every record it completes at once: at most the version
            still in flight lacks its record if the trainer is killed (its successor recovers it)."""
            if finished is not None:
                uploads[finished.version] = finished.upload_seconds
                if collector is not None:
                    collector.published(finished.version)
                write_records()

        def write_records() -> None:
            """Write, in order, the records of every version that is published and whose step is done."""
            for v in sorted(finals):
                if v not in uploads:
                    break
                record, stepped = finals.pop(v)
                record = {**record, "publishUploadSeconds": uploads.pop(v)}
                if collector is not None:
                    record.update(collector.tally.record())
                _log.info("step %s", json.dumps(record, sort_keys=True))
                if metrics_file is not None:
                    metrics_file.write(json.dumps(record, sort_keys=True) + "\n")
                    metrics_file.flush()
                if options.on_record is not None:
                    options.on_record(record)
                if options.on_step is not None:
                    options.on_step(stepped)

        own_seconds: float | None = None
        try:
            if main:
                assert coordinator is not None
                coordinator.announce(version)
            while version < max_steps:
                waited = time.perf_counter()
                batch, checked = _next_batch(
                    trainer,
                    coordinator,
                    world,
                    version,
                    options.batch_timeout_s,
                    prefetched=prefetch.take(version),
                    step_seconds=own_seconds,
                )
                waited = time.perf_counter() - waited
                plan = step.plan_step(batch, policy_rule, config.objective)
                _check_plan(plan)
                began = time.perf_counter()
                if main and options.overlap_io and version + 1 < max_steps:
                    assert coordinator is not None
                    prefetch.start(
                        version + 1,
                        functools.partial(
                            coordinator.wait_batch,
                            version + 1,
                            timeout=options.batch_timeout_s,
                            step_seconds=own_seconds,
                        ),
                    )
                metrics = step.train_step(
                    trainer.policy,
                    trainer.optimizer,
                    plan,
                    config,
                    module=module,
                    collective=comm,
                    shard=shard,
                )
                version += 1
                timings = {"batchSeconds": waited, "publishSeconds": 0.0, "checkpointSeconds": 0.0}
                record = metrics_record(metrics, timings, checked, trainer)
                record["rewardComponents"] = reward_components(batch)
                if trainer.samples:
                    record["samples"], trainer.samples = trainer.samples, []
                gathered: dict[str, Any] | None = None
                streamed: tuple[Path | None, dict[str, Path]] | None = None
                if sharded and trainer.policy.finetune == "Full" and trainer.delta_writer is None:
                    # every rank: the model gathered and written one file at a time, into rank 0's folder
                    into = (
                        Path(tempfile.mkdtemp(dir=scratch, prefix=f"snapshot-{version}-")) if main else None
                    )
                    streamed = (into, trainer.policy.export_full_streamed(into))
                elif sharded:
                    gathered = gathered_snapshot(trainer, world)
                if main:
                    assert store is not None and coordinator is not None and publisher is not None
                    blocked = time.perf_counter()
                    written = streamed[1] if streamed is not None else None
                    if options.overlap_io:
                        folder = (
                            streamed[0]
                            if streamed is not None and streamed[0] is not None
                            else Path(tempfile.mkdtemp(dir=scratch, prefix=f"snapshot-{version}-"))
                        )
                        exported = export_version(trainer, folder, version, record, gathered, written)
                        published(publisher.submit(version, folder, exported))
                    else:
                        uploads[version] = publish_version(
                            trainer, store, coordinator, version, scratch, record=record, state=gathered,
                            written=written,
                        )  # fmt: skip
                        if streamed is not None and streamed[0] is not None:
                            shutil.rmtree(streamed[0], ignore_errors=True)
                        if collector is not None:
                            collector.published(version)
                    timings["publishSeconds"] = time.perf_counter() - blocked
                if version % interval == 0 or version == max_steps:
                    blocked = time.perf_counter()
                    if publisher is not None:
                        published(publisher.wait())  # a checkpoint follows its version's snapshot
                    checkpoint_version(trainer, store, world, version, scratch)
                    timings["checkpointSeconds"] = time.perf_counter() - blocked
                    if collector is not None:  # older checkpoints go too (checkpointKeepLast)
                        collector.published(version)
                own_seconds = time.perf_counter() - began
                done.append(metrics)
                if main:
                    finals[version] = ({**record, **timings}, metrics)
                    write_records()
            if publisher is not None:
                published(publisher.wait())
                write_records()
        finally:
            prefetch.close()
            if publisher is not None:
                publisher.close()
            if collector is not None:
                collector.close()
            if metrics_file is not None:
                metrics_file.close()
    return RunResult(start_version=start, version=version, steps=tuple(done))


@dataclasses.dataclass
class Trainer:
    """What one trainer process holds: the job, the policy, its optimizer (shared with the Colocated
    runner, which trains with exactly this code)."""

    job: ResolvedJob
    policy: TrainablePolicy
    optimizer: Any
    base_model: str
    encode: Callable[[Prompt], Sequence[int]]
    """A group's prompt (text or chat messages) to ids: the workers' own function and prompt style."""
    checks: verify.WorkerStats = dataclasses.field(default_factory=verify.WorkerStats)
    """The log-prob checks per worker, over the run."""
    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Rank 0: sample completions of the batch being trained, for its record when
    ``tracking.samplesEvery`` says it is due (taken from the batch as it arrives)."""
    quarantined: set[str] = dataclasses.field(default_factory=set)
    """Workers caught lying; their groups never reach a step."""
    history: verify.History | None = None
    """The trainable weights of the last Δmax versions, to check stale groups (rank 0; set by :func:`run`)."""
    unverified_groups: int = 0
    """Groups left out because their claimed version could not be had to check them, over the run."""
    delta_writer: deltas.Writer | None = None
    """Full fine-tuning with ``snapshotAnchorInterval``: versions between anchors go out as deltas."""

    def check(
        self, batch: Batch, coordinator: Coordinator | None, rng: random.Random | None = None
    ) -> tuple[Batch, verify.Checked | None]:
        """Check ``batch``'s groups, each against the version it claims (:mod:`.verify`); quarantine the
        workers caught, through the coordinator (none: a sharded trainer's other ranks, which only
        compute); return the batch without any group of a quarantined worker or that could not be
        checked. ``rng`` picks the rollouts checked (default: the system's randomness)."""
        batch = verify.without(batch, self.quarantined)
        sync = self.job.sync_policy
        if sync.logprob_checks_per_group == 0:
            return batch, None
        checked = verify.check_batch(
            self.policy,
            batch,
            checks=sync.logprob_checks_per_group,
            bound=sync.max_logprob_mismatch,
            temperature=self.job.spec.algorithm.sampling.temperature,
            top_p=self.job.spec.algorithm.sampling.top_p,
            history=self.history,
            rng=rng if rng is not None else verify.SYSTEM_RANDOM,
        )
        self.checks.add(checked)
        if checked.unverified:
            self.unverified_groups += len(checked.unverified)
            _log.warning(
                "leaving out %d group(s) of the batch for version %d: the weights of the version they claim "
                "are neither kept nor in the store, so they cannot be checked (%s)",
                len(checked.unverified),
                batch.version,
                ", ".join(checked.unverified[:3]),
            )
        for worker, worst in checked.caught().items():
            reason = verify.Checked.reason(worst, checked.bound, batch.version, checked.draw_bound)
            _log.error("quarantining worker %s: %s", worker, reason)
            if coordinator is not None:
                coordinator.quarantine(worker, reason, version=batch.version, mismatch=worst.mean_abs)
            self.quarantined.add(worker)
        for worker in sorted({c.worker for c in checked.groups if c.surprise is not None} - self.quarantined):
            verdict = self.checks.typicality[worker].verdict()  # keyless groups: judged over the run
            if verdict is not None:
                _log.error("quarantining worker %s: %s", worker, verdict)
                if coordinator is not None:
                    coordinator.quarantine(worker, verdict, version=batch.version)
                self.quarantined.add(worker)
        return verify.without(batch, self.quarantined, checked.unverified), checked

    @classmethod
    def build(
        cls,
        job: ResolvedJob,
        world: distributed.World,
        model_dir: str | None,
        strategy: distributed.Strategy = "DDP",
        fsdp: distributed.FSDP | None = None,
    ) -> Trainer:
        from echo_runtime.backends import sampling
        from echo_runtime.models import load as model_load

        spec = job.spec
        # Same start on every rank (DDP also broadcasts rank 0's weights); then per-rank streams.
        ckpt.seed_everything(spec.algorithm.seed)
        path = model_dir if model_dir is not None else model_load.resolve_spec(spec.model, spec.task)
        policy = load_policy(
            spec.model,
            spec.task,
            device=world.device,
            with_reference=spec.algorithm.objective().kl_coef > 0 and spec.model.finetune == "Full",
            model_dir=path,
            gradient_checkpointing=spec.algorithm.gradient_checkpointing,
        )
        if strategy == "FSDP":  # sharding replaces the parameters: before the optimizer is made
            distributed.wrap(policy.model, world, "FSDP", fsdp)
            if policy.reference is not None:  # the KL term's frozen base: sharded the same way
                distributed.wrap(policy.reference, world, "FSDP", fsdp)
            held = sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in policy.model.parameters())
            total = sum(p.numel() for p in policy.model.parameters())
            _log.info(
                "strategy FSDP: rank %d of %d holds %d of the model's %d parameters (%.1f %%)",
                world.rank, world.world_size, held, total, 100.0 * held / max(total, 1),
            )  # fmt: skip
        ckpt.seed_everything(spec.algorithm.seed + world.rank)
        optimizer = step.make_optimizer(policy.trainable_parameters(), spec.algorithm.learning_rate)
        tokenizer = model_load.load_tokenizer(path) if world.is_main else None

        style = PromptStyle.from_task(spec.task)

        def encode(prompt: Prompt) -> Sequence[int]:
            return sampling.encode_prompt(tokenizer, prompt, style)

        interval = job.training_swarm.snapshot_anchor_interval
        writer = deltas.Writer(interval) if interval and policy.finetune == "Full" and world.is_main else None
        return cls(
            job=job,
            policy=policy,
            optimizer=optimizer,
            base_model=spec.model.path,
            encode=encode,
            delta_writer=writer,
        )


@dataclasses.dataclass(frozen=True)
class _Failure:
    """What the other ranks learn when rank 0 fails (exceptions do not always survive pickling)."""

    message: str


def _from_main(world: distributed.World, compute: Callable[[], T]) -> T:
    """``compute()`` on rank 0, broadcast to every rank; a failure on rank 0 is raised on every rank."""
    if world.backend is None:
        return compute()
    result: T | _Failure | None = None
    error: BaseException | None = None
    if world.is_main:
        try:
            result = compute()
        except Exception as exc:
            error, result = exc, _Failure(f"{type(exc).__name__}: {exc}")
    shared = world.broadcast(result)
    if error is not None:
        raise error
    if isinstance(shared, _Failure):
        raise RuntimeError(f"rank 0 failed: {shared.message}")
    return shared  # type: ignore[return-value]


def resume_from_store(
    trainer: Trainer, store: Store | None, world: distributed.World, resume: bool, cache_dir: Path
) -> int:
    """Find the resume point on rank 0 and restore it on every rank; return its version.

    Every rank fetches what it restores from the store itself: a snapshot's weights (each rank keeps
    its shards when sharded) and the checkpoint, which DCP reads each rank only the pieces of the
    tensors it holds of, whatever the number of ranks that wrote it.
    """
    point = _from_main(world, lambda: _resume_point(_store(store, world), resume))
    if point.weights == "snapshot":
        folder = _on_every_rank(
            world, lambda: _store(store, world).fetch(point.version, cache_dir / "snapshots")
        )
        trainer.policy.load_snapshot(folder)
    if point.checkpoint is not None:
        step = point.checkpoint
        folder = _on_every_rank(
            world, lambda: _store(store, world).fetch_checkpoint(step, cache_dir / "checkpoints")
        )
        meta = ckpt.load_state(
            folder, trainer.policy, trainer.optimizer, weights=point.weights == "checkpoint"
        )
        rng = ckpt.rng_for_rank(meta, world.rank)
        if rng is not None:
            ckpt.restore_rng(rng)
    if point.version > 0 and world.is_main:
        lag = (
            ""
            if point.checkpoint == point.version
            else (
                f"; optimizer state from checkpoint {point.checkpoint}"
                if point.checkpoint is not None
                else "; fresh optimizer state (no checkpoint)"
            )
        )
        _log.info("resuming at version %d (weights from %s%s)", point.version, point.weights, lag)
    return point.version


def _resume_point(store: Store, resume: bool) -> ckpt.ResumePoint:
    latest_checkpoint, latest_snapshot = store.latest_checkpoint(), store.latest_version()
    if not resume and (latest_checkpoint is not None or latest_snapshot is not None):
        raise ResumeRefused(
            f"the snapshot store already holds this job's versions (latest snapshot {latest_snapshot}, "
            f"latest checkpoint {latest_checkpoint}); pass --resume to continue from them, or use another "
            f"job name or storage path to start over"
        )
    return ckpt.resume_point(latest_checkpoint, latest_snapshot)


def _store(store: Store | None, world: distributed.World) -> Store:
    if store is None:
        raise RuntimeError(
            f"rank {world.rank} has no snapshot store: every rank reads and writes its own part of a "
            "checkpoint, so every rank needs the store"
        )
    return store


def _on_every_rank(world: distributed.World, compute: Callable[[], T]) -> T:
    """``compute()`` on every rank; if it fails on any, every rank raises (none is left waiting in a
    collective the failed one never joins)."""
    result: T | None = None
    failure: _Failure | None = None
    error: BaseException | None = None
    try:
        result = compute()
    except Exception as exc:
        error, failure = exc, _Failure(f"rank {world.rank}: {type(exc).__name__}: {exc}")
    failures = world.gather(failure)
    first = _from_main(world, lambda: next((f for f in failures or [] if f is not None), None))
    if error is not None:
        raise error
    if first is not None:
        raise RuntimeError(first.message)
    return result  # type: ignore[return-value]


def _next_batch(
    trainer: Trainer,
    coordinator: Coordinator | None,
    world: distributed.World,
    version: int,
    timeout: float | None,
    *,
    prefetched: Future[wire.BatchReply] | None = None,
    step_seconds: float | None = None,
) -> tuple[Batch, verify.Checked | None]:
    """Rank 0 fetches the batch for ``version`` (or collects the one ``prefetched`` during the previous
    step), checks it against the current weights, and broadcasts it to every rank. ``step_seconds``, the
    trainer's own time for its last version, tells the coordinator the pace to plan generation for."""

    pending = [prefetched]

    def receive() -> Batch:
        """Rank 0: the coordinator's batch for ``version``, not yet checked."""
        assert coordinator is not None
        if pending[0] is not None:
            reply, pending[0] = pending[0].result(), None
        else:
            reply = coordinator.wait_batch(version, timeout=timeout, step_seconds=step_seconds)
        if reply.version != version:
            raise RuntimeError(f"asked for the batch at version {version}, got one for {reply.version}")
        tracking = trainer.job.training_swarm.tracking
        if tracking.samples_every and (version + 1) % tracking.samples_every == 0:
            trainer.samples = tracking_samples(reply.groups, tracking.samples)
        return convert.batch_in(version, reply.groups, trainer.encode)

    def empty() -> None:
        _log.warning(
            "every group of the batch for version %d came from quarantined workers; asking for another",
            version,
        )

    if not trainer.policy.sharded:

        def fetch() -> tuple[Batch, verify.Checked | None]:
            while True:
                batch, checked = trainer.check(receive(), coordinator)
                if batch.groups:
                    return batch, checked
                empty()

        return _from_main(world, fetch)
    # Sharded: each recomputation is a forward every rank runs, so every rank checks the batch rank 0
    # received, choosing the same rollouts (a seed rank 0 draws from the system's randomness, which no
    # worker sees); rank 0's verdict, the one it reported to the coordinator, is the one every rank keeps.
    while True:
        raw, seed = _from_main(world, lambda: (receive(), secrets.randbits(64)))
        batch, checked = trainer.check(raw, coordinator if world.is_main else None, rng=random.Random(seed))
        batch, checked, quarantined = world.broadcast((batch, checked, trainer.quarantined))
        trainer.quarantined = set(quarantined)
        if batch.groups:
            return batch, checked
        empty()


def _fetch_on_every_rank(
    store: Store | None, cache_dir: Path, world: distributed.World, version: int
) -> Path | None:
    """Snapshot ``version`` fetched by every rank of a sharded trainer, or None on every rank when any
    could not have it (the ranks then agree to leave its groups unchecked, and out)."""
    import torch

    try:
        folder: Path | None = _fetch(_store(store, world), cache_dir, version)
    except Exception as exc:
        _log.warning("rank %d cannot fetch version %d: %s", world.rank, version, exc)
        folder = None
    missing = distributed.collective(world).max(torch.tensor([0.0 if folder is not None else 1.0]))
    return folder if float(missing[0]) == 0.0 else None


def _fetch(store: Store, cache_dir: Path, version: int) -> Path:
    """A snapshot of ``version`` in the trainer's cache (to check the groups that claim it after a resume)."""
    return store.fetch(version, cache_dir / "snapshots")


def _check_plan(plan: step.Plan) -> None:
    for dropped in plan.dropped:
        _log.error(
            "dropping group %s at version %d: %s", dropped.group_id, plan.version, dropped.admission.reason
        )
    if not plan.slots:
        raise staleness_error(plan)


def staleness_error(plan: step.Plan) -> RuntimeError:
    reasons = "; ".join(f"{d.group_id}: {d.admission.reason}" for d in plan.dropped[:3])
    return RuntimeError(
        f"the coordinator's batch for version {plan.version} holds no group the staleness rule admits "
        f"({reasons}); do the coordinator and the trainer read the same manifest?"
    )


def publish_version(
    trainer: Trainer,
    store: Store,
    coordinator: Coordinator,
    version: int,
    scratch: str,
    *,
    record: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    written: dict[str, Path] | None = None,
) -> float:
    """Export, publish, then announce ``version`` (publish-then-pointer); returns the seconds it took.
    ``record`` (the step's metrics) travels inside the snapshot as :data:`RECORD_FILE`; ``state`` is
    :func:`gathered_snapshot`'s for a sharded trainer."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=scratch, prefix=f"snapshot-{version}-") as out:
        upload_version(
            trainer, store, version, export_version(trainer, Path(out), version, record, state, written)
        )
    coordinator.announce(version)
    return time.perf_counter() - started


def gathered_snapshot(trainer: Trainer, world: distributed.World) -> dict[str, Any]:
    """A sharded trainer's weights made whole for its snapshot, on rank 0 (every rank calls: each tensor
    is all-gathered in turn; the others get an empty dict): the trainable parameters of a LoRA policy,
    the model's state dict when fine-tuning all of it with delta snapshots (which are computed from it;
    without them, the loop writes the files as it gathers)."""
    if trainer.policy.finetune == "LoRA":
        return trainer.policy.gathered_trainable_state(keep=world.is_main)
    return trainer.policy.gathered_model_state(keep=world.is_main)


def export_version(
    trainer: Trainer,
    folder: Path,
    version: int,
    record: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    written: dict[str, Path] | None = None,
) -> Exported:
    """Write ``version`` (the policy's current weights, and the step's ``record``) into ``folder``: the
    snapshot's files, and the delta they are when :attr:`Trainer.delta_writer` makes one. ``state``: the
    whole weights a sharded trainer gathered (:func:`gathered_snapshot`) instead of the model's own;
    ``written``: the snapshot's files a sharded Full trainer already wrote
    (:meth:`~echo_runtime.trainer.policy.TrainablePolicy.export_full_streamed`)."""
    delta = None
    if written is not None:
        files = dict(written)
    elif trainer.delta_writer is not None:
        weights = state if state is not None else trainer.policy.model.state_dict()
        files, delta = trainer.delta_writer.export(version, weights, folder)
    else:
        files = dict(trainer.policy.export_snapshot(folder, state))
    if record is not None:
        path = folder / RECORD_FILE
        path.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        files[RECORD_FILE] = path
    return Exported(files=files, delta=delta)


@dataclasses.dataclass(frozen=True)
class Exported:
    files: dict[str, Path]
    delta: manifest.Delta | None = None


def upload_version(trainer: Trainer, store: Store, version: int, exported: Exported) -> None:
    """Publish the ``exported`` files as ``version`` (atomic; raises if the version exists)."""
    kind = trainer.policy.snapshot_kind
    if exported.delta is None:
        store.publish(version, exported.files, kind=kind, base_model=trainer.base_model)
    else:
        store.publish(version, exported.files, kind=kind, base_model=trainer.base_model, delta=exported.delta)


def checkpoint_version(
    trainer: Trainer, store: Store | None, world: distributed.World, version: int, scratch: str
) -> float:
    """Save a checkpoint of ``version`` shard by shard (:mod:`.checkpoint`); returns the seconds.

    Every rank writes its part with DCP and uploads it into the folder rank 0 staged; rank 0 adds the
    meta (every rank's RNG) and commits once all parts are in. A failure on any rank fails the
    checkpoint on every rank, and nothing of it becomes visible."""
    started = time.perf_counter()
    own = _store(store, world)
    with tempfile.TemporaryDirectory(dir=scratch, prefix=f"checkpoint-{version}-") as out:
        part = _on_every_rank(
            world, lambda: ckpt.write_part(Path(out) / "part", trainer.policy, trainer.optimizer)
        )
        rng = world.gather(ckpt.capture_rng())
        data = _from_main(world, lambda: own.stage_checkpoint(version))
        if world.is_main:
            assert rng is not None
            part.update(
                ckpt.write_meta(
                    Path(out) / "meta", trainer.policy, trainer.optimizer, version, rng, trainer.base_model
                )
            )
        entries = _on_every_rank(world, lambda: own.upload_checkpoint_part(version, data, part))
        everything = world.gather(entries)

        def commit() -> None:
            assert everything is not None
            own.commit_checkpoint(
                version, data, [e for some in everything for e in some], base_model=trainer.base_model
            )

        _from_main(world, commit)
    return time.perf_counter() - started


def recover_record(store: Store, metrics_path: Path, version: int, cache_dir: Path) -> bool:
    """Append the record of ``version`` from its snapshot if the metrics file lacks it (the previous
    trainer was killed between publishing it and writing the record); True if it did."""
    if version < 1:
        return False
    written: set[int] = set()
    if metrics_path.exists():
        for line in metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                written.add(int(json.loads(line).get("policyVersion")))
            except (json.JSONDecodeError, TypeError, ValueError, AttributeError):
                continue
    if version in written:
        return False
    # The previous trainer published in the background: the version before the newest may lack its
    # record too (killed between that publish and writing it). Walk back to the last one written.
    missing = []
    for v in range(version, max(0, version - RECOVER_BACK), -1):
        if v in written:
            break
        missing.append(v)
    recovered = []
    for v in sorted(missing):
        try:
            found = store.fetch(v, cache_dir / "snapshots") / RECORD_FILE
            recovered.append(json.loads(found.read_text(encoding="utf-8")))
        except (OSError, ValueError, errors.SnapshotError) as exc:  # collected by retention, too
            _log.warning("version %d has no trainer record and none in its snapshot (%s)", v, exc)
    if not recovered:
        return False
    with metrics_path.open("a", encoding="utf-8") as out:
        for record in recovered:
            out.write(json.dumps({**record, "recovered": True}, sort_keys=True) + "\n")
    _log.info(
        "wrote the record(s) of version(s) %s from their snapshots (the previous trainer stopped before)",
        ", ".join(str(r.get("policyVersion")) for r in recovered),
    )
    return True


def reward_components(batch: Batch) -> dict[str, float]:
    """Each reward component's mean over the batch's rollouts that have it (the task's own parts, and
    with ``spec.rewardModels`` the verifier's reward as ``task`` and each model's by its name)."""
    sums: dict[str, list[float]] = {}
    for group in batch.groups:
        for rollout in group.rollouts:
            for name, value in rollout.reward_components.items():
                sums.setdefault(name, []).append(float(value))
    return {name: sum(values) / len(values) for name, values in sorted(sums.items())}


def metrics_record(
    metrics: step.StepMetrics,
    timings: dict[str, float],
    checked: verify.Checked | None = None,
    trainer: Trainer | None = None,
) -> dict[str, Any]:
    """The ``kind: "trainer"`` record of one step (camelCase, as the run's ``metrics.jsonl`` holds them)."""
    checks: dict[str, Any] = {}
    if checked is not None and trainer is not None:
        checks = {
            "logprobChecks": trainer.checks.record(sorted({c.worker for c in checked.groups})),
            "checkedVersions": sorted({c.version for c in checked.groups}),
            "uncheckedGroups": len(checked.unverified),
            "quarantinedWorkers": sorted(trainer.quarantined),
        }
    return {
        "kind": "trainer",
        "unixTime": time.time(),
        "policyVersion": metrics.version,
        "stepSeconds": metrics.seconds,
        **timings,
        "loss": metrics.loss,
        "kl": metrics.kl,
        "clipFraction": metrics.clip_fraction,
        "clipFractionLow": metrics.clip_fraction_low,
        "clipFractionHigh": metrics.clip_fraction_high,
        "dualClipFraction": metrics.dual_clip_fraction,
        "truncatedFraction": metrics.truncated_fraction,
        "rejectedFraction": metrics.rejected_fraction,
        "paddingFraction": round(metrics.padding_fraction, 6),
        "entropy": metrics.entropy,
        "zeroSignalGroups": metrics.zero_signal_groups,
        "maskedRollouts": metrics.masked_rollouts,
        "rewardKl": metrics.reward_kl,
        "importanceWeightMean": metrics.importance_weight_mean,
        "importanceWeightMax": metrics.importance_weight_max,
        "rewardMean": metrics.reward_mean,
        "gradNorm": metrics.grad_norm,
        "learningRate": metrics.learning_rate,
        "groups": metrics.groups,
        "rollouts": metrics.rollouts,
        "tokens": metrics.tokens,
        "droppedGroups": metrics.dropped_groups,
        "weightedGroups": metrics.weighted_groups,
        "maxStaleness": metrics.max_staleness,
        "workers": dict(metrics.workers),
        **checks,
        "logprobMismatch": {
            name: {
                "sequences": m.sequences,
                "tokens": m.tokens,
                "meanAbs": m.mean_abs,
                "maxAbs": m.max_abs,
                "klSeq": m.kl_seq,
            }
            for name, m in metrics.mismatch.items()
        },
    }
