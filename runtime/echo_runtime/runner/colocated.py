"""``mode: Colocated``: the baseline without a swarm — one process alternates sampling and training.

This is the arrangement verl uses by default and the one Echo's decoupled modes are measured against
(``echorl bench sync``). One process holds one model, the trainer's
:class:`~echo_runtime.trainer.policy.TrainablePolicy`, and repeats::

    sample   batchSize prompts × groupSize completions with the current weights   (all cores)
    score    each completion with the task's verifier
    train    plan_step + train_step: the trainer's admission, GRPO loss and AdamW  (all cores)
    publish  snapshot t+1 to the store (the evaluator scores held-out accuracy from it)

What is shared with the decoupled modes, so that the architecture is the only difference:

* **Sampling** is :class:`~echo_runtime.backends.transformers.TransformersBackend`'s decoding loop,
  run on the policy's own module (no copy, no snapshot load): behaviour log-probs come from the same
  definition and the same code as a worker's.
* **Prompts** are the task's ``train`` stream with the coordinator's seed, in the coordinator's order;
  **rewards** are the task's verifier on the decoded text, as the coordinator re-scores them.
* **Training** builds its state, publishes and checkpoints exactly like ``echorl trainer``
  (:mod:`echo_runtime.trainer.loop`'s helpers) and steps with :func:`~echo_runtime.trainer.step.plan_step`
  and :func:`~echo_runtime.trainer.step.train_step`.
* **Evaluation** is the same evaluator process reading the same snapshot store.
* **Records**: ``metrics.jsonl`` gets the same ``status``, ``trainer`` and ``eval`` records (see
  :mod:`.metrics`), so :func:`~echo_runtime.runner.metrics.summarise` works unchanged. Each
  ``trainer`` record also has ``sampleSeconds``; ``workers/colocated.jsonl`` reports sampling time and
  zero snapshot-load time in the workers' timing format.

Invariants: every consumed rollout was sampled by the very weights it trains (staleness 0; the
staleness rule is still applied, with bound 0, so a bug cannot hide); versions are consecutive, one
per step; the process uses every core in both phases (``torch.set_num_threads(cores)``). The
manifest's ``inferenceSwarms`` are ignored (there are no workers); ``trainingSwarm.processesPerNode``
must be 1.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from echo_runtime import rollout, spec, staleness
from echo_runtime.backends import base as backend_base
from echo_runtime.coordinator import signal
from echo_runtime.runner import console, cpus, local, memory
from echo_runtime.tasks import base as tasks_base

RATE_WINDOW_S = 30.0
"""rolloutsPerSecond is a sliding-window rate, over the coordinator's default window."""


class _NoCoordinator:
    """Announcing a version is a no-op: there are no workers to tell, and batches are sampled here."""

    def announce(self, version: int) -> None:
        return None

    def wait_batch(
        self, version: int, policy: Any = None, timeout: float | None = None, *, step_seconds: Any = None
    ) -> Any:
        raise NotImplementedError("a Colocated run samples its own batches")

    def quarantine(self, worker_id: str, reason: str, *, version: int, mismatch: float | None = None) -> None:
        raise NotImplementedError("a Colocated run has no workers to quarantine")


def sampling_seed(seed: int, version: int) -> int:
    """The sampling seed of the batch at ``version`` (distinct per version and per run seed)."""
    return (seed * 1_000_003 + version) % (2**63 - 1)


def shared_backend(policy_module: torch.nn.Module, model_dir: str, dtype: str, style: Any = None) -> Any:
    """A :class:`TransformersBackend` whose forward passes go through ``policy_module`` itself.

    The backend reads its tokenizer and EOS ids from ``model_dir`` as a worker would; the base weights
    it loads are dropped in favour of the policy's module, so sampling always sees the current weights.
    """
    from echo_runtime.backends.transformers import TransformersBackend

    backend = TransformersBackend(model_dir, "cpu", dtype, prompt_style=style)
    backend.base_model = policy_module
    return backend


def sample_batch(
    backend: Any,
    module: torch.nn.Module,
    problems: list[tasks_base.Problem],
    task: tasks_base.Task,
    algorithm: spec.Algorithm,
    version: int,
) -> rollout.Batch:
    """Sample and score one batch at ``version`` with the current weights: what a step consumes."""
    params = backend_base.SamplingParams(
        temperature=algorithm.sampling.temperature,
        top_p=algorithm.sampling.top_p,
        max_new_tokens=algorithm.sampling.max_new_tokens,
        seed=sampling_seed(algorithm.seed, version),
    )
    was_training = module.training
    module.eval()  # no dropout while sampling, as a worker's backend samples
    try:
        samples = backend.sample([p.prompt for p in problems], algorithm.group_size, params)
    finally:
        module.train(was_training)
    groups = []
    for i, (problem, group) in enumerate(zip(problems, samples, strict=True)):
        scored = []
        for s in group:
            reward = task.score(problem, s.text)
            scored.append(
                dataclasses.replace(
                    s,
                    reward=reward.value,
                    reward_components=dict(reward.components),
                    reward_reason=reward.reason,
                    policy_version=version,
                    backend=backend.name,
                    device=backend.device,
                    dtype=backend.dtype,
                )
            )
        groups.append(rollout.Group(rollouts=tuple(scored), id=f"c{version}-{i}"))
    return rollout.Batch(version=version, groups=tuple(groups))


def status_record(
    job: spec.ResolvedJob,
    version: int,
    consumed: int,
    rps: float,
    reward: float | None,
    now: float,
    watch: signal.SignalWatch | None = None,
) -> dict[str, Any]:
    """A ``status`` record shaped like the coordinator's status document (docs/contracts.md)."""
    watch = watch if watch is not None else signal.SignalWatch()
    return {
        "kind": "status",
        "time": now,
        "job": job.name,
        "mode": "Colocated",
        "maxStaleness": 0,
        "policyVersion": version,
        "buffer": {"groups": 0, "capacity": 0},
        "maxObservedStaleness": 0 if consumed else None,
        "stalenessHistogram": {"0": consumed} if consumed else {},
        "droppedStale": 0,
        "weightedStale": 0,
        "consumedGroups": consumed,
        "rolloutsPerSecond": rps,
        "reward": reward,
        "workers": [],
        "pools": {},
        "filteredGroups": watch.filtered_groups,
        "setAsidePrompts": 0,
        "signalFraction": watch.signal_fraction,
        "noSignalBatches": watch.no_signal_batches,
        "warnings": watch.warnings(),
    }


MAX_SAMPLING_ROUNDS = 10
"""Dynamic sampling: most rounds of ``batchSize`` prompts sampled for one batch (the DAPO recipe's
``max_num_gen_batches``); after them the step trains on what it has."""


def sample_filtered(
    backend: Any,
    model: Any,
    problems: Iterator[tasks_base.Problem],
    task: tasks_base.Task,
    algorithm: spec.Algorithm,
    version: int,
    watch: signal.SignalWatch,
) -> rollout.Batch:
    """One batch of ``batchSize`` groups at ``version``. With dynamic sampling, groups whose rewards are
    all equal are filtered (counted by ``watch``) and more prompts sampled, up to
    :data:`MAX_SAMPLING_ROUNDS` rounds; if no group had signal by then, the last round's groups are
    trained on (zero gradient) and the status warns."""
    kept: list[rollout.Group] = []
    last: rollout.Batch | None = None
    rounds = MAX_SAMPLING_ROUNDS if watch.dynamic_sampling else 1
    for round_ in range(rounds):
        chosen = list(itertools.islice(problems, algorithm.batch_size))
        if len(chosen) < algorithm.batch_size:
            raise local.RunError(f"task {task.name!r} ran out of training prompts at version {version}")
        last = sample_batch(backend, model, chosen, task, algorithm, version)
        for problem, group in zip(chosen, last.groups, strict=True):
            if watch.completed(problem.id, [r.reward for r in group.rollouts]):
                kept.append(group if round_ == 0 else dataclasses.replace(group, id=f"{group.id}-r{round_}"))
        if len(kept) >= algorithm.batch_size:
            break
    assert last is not None
    if not kept:
        return last
    return rollout.Batch(version=version, groups=tuple(kept[: algorithm.batch_size]))


class ColocatedRun(local.LocalRun):
    """``echorl run`` of a Colocated job: the evaluator as a process, sampling and training in this one."""

    def start(self) -> None:
        if self.job.training_swarm.processes_per_node * self.job.training_swarm.nodes > 1:
            raise local.RunError(
                "mode Colocated runs in one process: set trainingSwarm.processesPerNode and nodes to 1"
            )
        if self.job.training_swarm.strategy != "DDP":
            raise local.RunError(
                "mode Colocated samples and trains in one process with the whole model: "
                "trainingSwarm.strategy FSDP shards it over trainer ranks; use mode Async or Sequential for it"
            )
        # As LocalRun.start: the clock starts with the processes (model building/warm-up is set-up).
        self.t0 = time.time() - self.elapsed_before
        (self.dir / "run.json").write_text(
            json.dumps({"job": self.job.name, "t0": self.t0, "source": str(self.source)})
        )
        cores = self.options.cores or os.cpu_count() or 1
        self.cores = self.job.training_swarm.threads or cores
        self.plan = cpus.CorePlan(trainer=self.cores, worker=self.cores, evaluator=1)
        self.echo(
            f"processes: colocated sampler+trainer ({self.cores} thread(s) in both phases), "
            f"{'evaluator' if self.evaluates else 'no evaluator (task.evalEvery 0)'} on {cores} core(s); "
            f"logs in {self.dir / 'logs'}"
        )
        pins = None
        if self.options.pin_cores:  # this process samples and trains: it takes the first `cores` CPUs
            pins = cpus.pin_plan(sorted(os.sched_getaffinity(0)), cores, self.plan, 0)
            os.sched_setaffinity(0, pins.trainer)
            self.echo(
                f"pinned: sampler+trainer to CPUs {sorted(pins.trainer)}, evaluator to {sorted(pins.evaluator)}"
            )
        if self.evaluates:
            self.procs.start(
                "evaluator",
                self.evaluator_command(),
                env={**local.thread_env(1), **self.malloc_env},
                cpus=None if pins is None else pins.evaluator,
            )

    def monitor(self) -> int:
        """Sample and train until maxSteps, in this process; 0 when done (errors raise)."""
        log = self.metrics_log()
        timing = (self.dir / "workers").joinpath("colocated.jsonl")
        timing.parent.mkdir(exist_ok=True)
        bar = console.ProgressBar(self.max_steps, enabled=self.options.progress)
        accuracy: list[float | None] = [None]

        def drain_evals() -> None:
            self.memory.sample(memory.group_ids(self.procs.children))
            for record in self._tail(self.dir / "eval.jsonl"):
                log.write(record)
                accuracy[0] = record["heldoutAccuracy"]
            evaluator = self.procs.children.get("evaluator")
            if evaluator is not None and evaluator.returncode not in (None, 0):
                raise local.RunError(
                    f"the evaluator exited with code {evaluator.returncode}:\n{evaluator.log_tail()}"
                )

        def emit(record: dict[str, Any]) -> None:
            log.write(record)
            if record["kind"] == "status":
                bar.update_to(record["policyVersion"], record, accuracy[0], {})
                self.show_warnings(record)
            drain_evals()

        try:
            with timing.open("a", encoding="utf-8") as timing_file:

                def write_timing(record: dict[str, Any]) -> None:
                    timing_file.write(json.dumps(record) + "\n")
                    timing_file.flush()

                train(
                    self.job,
                    max_steps=self.max_steps,
                    threads=self.cores,
                    resume=self.options.resume,
                    t0=self.t0,
                    cache_dir=self.dir / "cache" / "colocated",
                    emit=emit,
                    timing=write_timing,
                )
        finally:
            bar.close()
            log.close()
        return 0


def train(
    job: spec.ResolvedJob,
    *,
    max_steps: int,
    threads: int,
    resume: bool,
    t0: float,
    cache_dir: Path,
    emit: Callable[[dict[str, Any]], None],
    timing: Callable[[dict[str, Any]], None] = lambda record: None,
) -> int:
    """The Colocated loop (module docstring); returns the last published version.

    ``emit`` receives every ``status`` and ``trainer`` record (``time`` in seconds since ``t0``);
    ``timing`` the cumulative sample/load seconds after each step, in the workers' timing format.
    """
    from echo_runtime import snapshots, tasks
    from echo_runtime.coordinator.counters import RateWindow
    from echo_runtime.models import load as model_load
    from echo_runtime.models.prompts import PromptStyle
    from echo_runtime.trainer import distributed, step
    from echo_runtime.trainer import loop as trainer_loop

    torch.set_num_threads(threads)
    algorithm = job.spec.algorithm
    store = snapshots.open_store(job.spec.storage, job.name)
    world = distributed.World()
    model_dir = model_load.resolve_spec(job.spec.model, job.spec.task)
    # The trainer's own start (seeds, LoRA initialisation, AdamW) and resume rule, shared on purpose.
    trainer = trainer_loop.Trainer.build(job, world, model_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    version = trainer_loop.resume_from_store(trainer, store, world, resume, cache_dir)
    backend = shared_backend(
        trainer.policy.model, model_dir, job.spec.model.dtype, PromptStyle.from_task(job.spec.task)
    )
    task = tasks.from_spec(job.spec.task)
    config = step.StepConfig.from_algorithm(algorithm)
    rule = staleness.StalenessPolicy.from_spec(job.sync_policy)  # Colocated: bound 0
    assert rule.bound == 0, rule
    interval = job.training_swarm.checkpoint_interval
    no_coordinator = _NoCoordinator()
    # The coordinator's prompt order: the train stream, skipped past what earlier versions consumed.
    problems: Iterator[tasks_base.Problem] = itertools.islice(
        task.prompts("train", algorithm.seed), version * algorithm.batch_size, None
    )
    started = time.time()
    rate = RateWindow(RATE_WINDOW_S, time.monotonic())
    consumed, rollouts, sample_seconds, reward = 0, 0, 0.0, None
    watch = signal.SignalWatch(dynamic_sampling=config.objective.dynamic_sampling, set_aside_after=0)
    emit(status_record(job, version, consumed, 0.0, reward, time.time() - t0, watch))
    with tempfile.TemporaryDirectory(prefix="echorl-colocated-") as scratch:
        while version < max_steps:
            sampling_started = time.perf_counter()
            batch = sample_filtered(backend, trainer.policy.model, problems, task, algorithm, version, watch)
            sampled = time.perf_counter() - sampling_started
            sample_seconds += sampled
            rate.add(time.monotonic(), len(batch.rollouts))
            plan = step.plan_step(batch, rule, config.objective)
            if plan.dropped:  # impossible by construction; the rule is applied so that a bug cannot hide
                raise trainer_loop.staleness_error(plan)
            result = step.train_step(trainer.policy, trainer.optimizer, plan, config)
            version += 1
            timings = {
                "publishSeconds": trainer_loop.publish_version(
                    trainer, store, no_coordinator, version, scratch
                ),
                "checkpointSeconds": 0.0,
                "sampleSeconds": sampled,
            }
            if version % interval == 0 or version == max_steps:
                timings["checkpointSeconds"] = trainer_loop.checkpoint_version(
                    trainer, store, world, version, scratch
                )
            consumed += plan.groups
            rollouts += len(plan.slots)
            reward = plan.reward_mean
            record = trainer_loop.metrics_record(result, timings)
            emit({**record, "time": float(record["unixTime"]) - t0})
            watch.handed([[r.reward for r in g.rollouts] for g in batch.groups])
            emit(
                status_record(
                    job, version, consumed, rate.rate(time.monotonic()), reward, time.time() - t0, watch
                )
            )
            timing(
                {
                    "event": "sample",
                    "version": version,
                    "time": time.time() - started,
                    "loadSeconds": 0.0,
                    "sampleSeconds": sample_seconds,
                    "rollouts": rollouts,
                    "backend": backend.name,
                }
            )
    return version
