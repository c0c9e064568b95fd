"""``echorl run``: one EchoJob as local processes — coordinator, workers, trainer and an evaluator.

The embedded default (DESIGN.md). Layout of a run directory (``runs/<job>/`` by default)::

    job.yaml        the manifest every process reads (a copy of the user's)
    tokens.json     join tokens generated for this run (mode 0600)
    run.json        when the run started, for --resume
    metrics.jsonl   status samples, evaluations and optimizer steps (see metrics.py)
    summary.json    computed from metrics.jsonl when the run ends (also after Ctrl-C)
    curves.png, staleness.png
    logs/           one log per process: coordinator, trainer, evaluator, <pool>-<i>
    workers/        per-worker timing (load vs sample seconds)

Promises: a process that dies before the run is over — the coordinator, a worker, the evaluator, or
the trainer with an error — is restarted with a growing delay, like a pod (:mod:`.restarts`): the
coordinator on the same port (workers and the trainer reconnect by themselves), the trainer with
``--resume`` (it continues from the newest published version and checkpoint, so no version is
published twice); restarts are counted in the progress line and in ``summary.json``. Every child process
is stopped when the run ends, fails or is interrupted (Ctrl-C, or a SIGTERM such as ``kill`` or a
timeout sends, which is handled the same way); a run directory
or a snapshot store that already holds a job's versions is never silently overwritten (``--resume``
continues it, ``--fresh`` deletes it first); ``summary.json`` is written even after Ctrl-C.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from echo_runtime import rewards, spec
from echo_runtime.runner import allocator, console, cpus, memory, metrics, plots, restarts
from echo_runtime.runner.procs import Child, NotHealthy, Processes, wait_healthy
from echo_runtime.spec import commands
from echo_runtime.spec import load as spec_load


def _standalone_torchrun(swarm: spec.TrainingSwarmSpec) -> tuple[str, ...]:
    """torchrun on this one machine: ``processesPerNode`` ranks meeting on a port it picks itself."""
    return (
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={swarm.processes_per_node}", "-m", "echo_runtime.cli",
    )  # fmt: skip


PROGRAM = commands.Program(echorl=(sys.executable, "-m", "echo_runtime.cli"), torchrun=_standalone_torchrun)
"""``echorl`` as this interpreter runs it (the console script may not be on PATH)."""
HEARTBEAT_INTERVAL_S = 1.0
LEASE_TIMEOUT_S = 15.0
"""Every process shares this machine: a dead worker's leases are re-issued sooner than in a cluster."""


class RunError(RuntimeError):
    """The run cannot start or a process of it failed; the message says which and why."""


@dataclasses.dataclass
class RunOptions:
    """How to run a job locally (the ``echorl run`` flags)."""

    run_dir: Path | None = None
    resume: bool = False
    fresh: bool = False
    max_steps: int | None = None
    seed: int | None = None
    """Overrides ``spec.algorithm.seed`` in the manifest every process reads (``--seed``)."""
    target_accuracy: float | None = None
    progress: bool = True
    cores: int | None = None
    """CPU cores to divide among the processes (default: all of this machine's)."""
    pin_cores: bool = False
    """Pin each process to its own cores (:func:`.cpus.pin_plan`) instead of only sizing its thread pool."""
    status_interval_s: float = 1.0
    report_to: list[str] | None = None
    """Experiment trackers (``--report-to``); None: ``spec.trainingSwarm.tracking.reportTo``."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def thread_env(threads: int) -> dict[str, str]:
    """The variables that hold a local process to ``threads`` threads (torch, MKL and Echo's own)."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "ECHORL_THREADS": str(threads)}


def run_manifest(source: Path, seed: int | None) -> str:
    """The manifest a run's processes read: the user's file as it is, or with ``--seed`` applied to its
    EchoJob (:func:`echo_runtime.spec.load.seeded`, as ``echorl bench sync`` applies its seeds)."""
    text = source.read_text(encoding="utf-8")
    if seed is None:
        return text
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    jobs = [i for i, d in enumerate(docs) if isinstance(d, dict) and d.get("kind") == "EchoJob"]
    if len(jobs) != 1:
        raise RunError(f"--seed: {source} must hold exactly one EchoJob, found {len(jobs)}")
    docs[jobs[0]] = spec_load.seeded(docs[jobs[0]], seed)
    return yaml.safe_dump_all(docs, sort_keys=False)


def _load_text(text: str, source: Path) -> spec.ResolvedJob:
    manifests = spec_load.load_documents(text, str(source))
    (job,) = [m for m in manifests if isinstance(m, spec.EchoJob)]
    return spec.resolve(job, manifests)


class LocalRun:
    """The processes and files of one local run."""

    def __init__(self, job_path: Path, options: RunOptions, echo: Callable[[str], None] = print) -> None:
        self.source = job_path
        self.options = options
        self.echo = echo
        self._warned: set[str] = set()
        """The status document's warnings already printed (by their first words)."""
        self.manifest = run_manifest(job_path, options.seed)
        """The text of the manifest every process reads (``run-dir/job.yaml``): the user's, seeded."""
        self.job = spec.load_job(job_path) if options.seed is None else _load_text(self.manifest, job_path)
        from echo_runtime.tasks import registry  # a plugin task must be installed here: this run runs it

        try:
            registry.check(self.job.spec.task.name, self.job.spec.task.options, plugins_here=True)
        except ValueError as exc:
            raise RunError(f"spec.task.name: {exc}") from None
        self.dir = options.run_dir or Path("runs") / self.job.name
        self.procs = Processes(self.dir / "logs")
        self.max_steps = options.max_steps or self.job.spec.algorithm.max_steps
        self.t0 = time.time()
        self.elapsed_before = 0.0
        self._offsets: dict[Path, int] = {}
        self.scorer_ports: dict[str, int] = {}
        """Each scoring process's port, picked by :meth:`start`."""
        self._workers_reported: int | None = None
        self._worker_last: dict[str, dict[str, Any]] = {}
        self.restarts = restarts.Restarts()
        self.memory = memory.MemoryWatch()
        """Peak resident memory of every process of the run (``summary.json`` → ``memory``)."""
        try:
            self.malloc_env = allocator.child_env(os.environ)
            """``LD_PRELOAD`` of jemalloc for the torch processes, when installed (:mod:`.allocator`)."""
        except ValueError as exc:
            raise RunError(str(exc)) from exc
        self.report_to = (
            list(options.report_to)
            if options.report_to is not None
            else list(self.job.training_swarm.tracking.report_to)
        )
        """The experiment trackers this process reports to (the trainer reports to none)."""
        self.reporter: Any = None
        self.evaluates = self.job.spec.task.eval_every > 0
        """Whether an evaluator runs (``task.evalEvery`` 0 turns it off)."""
        if options.target_accuracy is not None and not self.evaluates:
            raise RunError(
                "--target-accuracy needs held-out evaluation, which spec.task.evalEvery: 0 turns off; "
                "set evalEvery to 1 or more, or leave --target-accuracy out"
            )

    # ------------------------------------------------------------------------------ preparation
    def prepare(self) -> None:
        from echo_runtime import snapshots

        job = self.job
        store = snapshots.open_store(job.spec.storage, job.name)
        existing = store.latest_version()
        has_run = (self.dir / "metrics.jsonl").exists()
        if self.options.fresh:
            if job.spec.storage.type != "Local" and existing is not None:
                raise RunError(
                    f"--fresh: the S3 store already holds versions of job {job.name!r} (latest {existing}); "
                    "versions are never overwritten: delete them with `echorl snapshots gc` or rename the job"
                )
            shutil.rmtree(self.dir, ignore_errors=True)
            if job.spec.storage.type == "Local":
                shutil.rmtree(
                    Path(job.spec.storage.path) / job.spec.storage.prefix / job.name, ignore_errors=True
                )
            existing, has_run = None, False
        if not self.options.resume and (existing is not None or has_run):
            what = (
                f"the snapshot store holds versions up to {existing}" if existing is not None else "it exists"
            )
            raise RunError(
                f"run {job.name!r} was started before ({what}; run dir {self.dir}): "
                "pass --resume to continue it or --fresh to start over"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.options.resume:
            # Continue the wall-clock where the previous attempt stopped, so curves stay comparable,
            # and follow the processes' own files from where metrics.jsonl already has them.
            previous = metrics.read_records(self.dir / "metrics.jsonl")
            self.elapsed_before = max((float(r.get("time", 0.0)) for r in previous), default=0.0)
            for name in ("eval.jsonl", "trainer.jsonl"):
                path = self.dir / name
                if path.exists():
                    self._offsets[path] = _complete_length(path)
        (self.dir / "job.yaml").write_text(self.manifest, encoding="utf-8")
        from echo_runtime.coordinator import auth

        tokens = auth.generate(name for name, _ in job.inference_pools)
        token_file = self.dir / "tokens.json"
        token_file.write_text(json.dumps(tokens))
        token_file.chmod(0o600)
        self.tokens = tokens
        self.scorer_token = secrets.token_urlsafe(32)
        """The scoring pools' token, for the coordinator and the scorers alone (in their environment)."""

    def resolve_model(self) -> str:
        """Build (and warm up) a built-in model before any process needs it, with visible progress, in a
        child process (:mod:`.prepare_model`: the runner itself never imports torch)."""
        model = self.job.spec.model
        self.echo(
            f"model: {model.path}" + (f" (warm-up {model.warmup_steps} steps)" if model.warmup_steps else "")
        )
        self.echo(f"objective: {self.job.spec.algorithm.objective().describe()}")
        done = subprocess.run(
            [sys.executable, "-m", "echo_runtime.runner.prepare_model"],
            input=self.manifest,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise RunError(
                f"preparing model {model.path!r} failed (exit code {done.returncode}); its messages are above"
            )
        return lines[-1]

    # ------------------------------------------------------------------------------ processes
    def start(self) -> None:
        # The run's clock starts with its processes: building or warming up the model is set-up, not
        # training time (resumed runs continue from where the previous attempt stopped).
        self.t0 = time.time() - self.elapsed_before
        (self.dir / "run.json").write_text(
            json.dumps({"job": self.job.name, "t0": self.t0, "source": str(self.source)})
        )
        n_workers = len(self._workers())
        n_cores = self.options.cores or os.cpu_count() or 1
        plan = cpus.plan_cores(n_cores, n_workers)
        self.plan = plan
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        scorers = self._scorers()
        self.scorer_ports = {process: free_port() for process, _ in scorers}
        argvs = self.command_lines(port, plan)
        scorer_env = {rewards.TOKEN_ENV: self.scorer_token}
        for process, model in scorers:
            self.procs.start(
                process,
                argvs.pop(process),
                env={**thread_env(model.threads or 1), **self.malloc_env, **scorer_env},
            )
        self.procs.start("coordinator", argvs.pop("coordinator"), env={**thread_env(1), **scorer_env})
        self._wait_healthy()
        self._wait_scorers(scorers)
        self.echo(
            f"processes: coordinator, trainer ({plan.trainer} thread(s)), {n_workers} worker(s) "
            f"({plan.worker} thread(s) each), {'evaluator' if self.evaluates else 'no evaluator (task.evalEvery 0)'}"
            f" on {n_cores} core(s), {allocator.describe(self.malloc_env)}; logs in {self.dir / 'logs'}"
        )
        pins = (
            cpus.pin_plan(sorted(os.sched_getaffinity(0)), n_cores, plan, n_workers)
            if self.options.pin_cores
            else None
        )
        if pins is not None:
            self.echo(
                f"pinned: trainer to CPUs {sorted(pins.trainer)}, workers to "
                f"{[sorted(w) for w in pins.workers]}, evaluator to {sorted(pins.evaluator)}"
            )
        (self.dir / "workers").mkdir(exist_ok=True)
        for name, pool in self.job.inference_pools:
            if pool.external:
                join = commands.worker(
                    dataclasses.replace(PROGRAM, echorl=("echorl",)),
                    name,
                    pool,
                    job_file="job.yaml",
                    coordinator_url=self.url,
                )
                token = self.tokens["pools"][name]
                self.echo(
                    f"pool {name!r} is external; join it from another machine with:\n"
                    f"  {shlex.join([*join, '--token', token])}"
                )
        for i, (process, name, pool) in enumerate(self._workers()):
            threads = commands.worker_threads(pool, plan.worker)
            self.procs.start(
                process,
                argvs.pop(process),
                env={
                    **thread_env(threads),
                    **self.malloc_env,
                    commands.WORKER_TOKEN_ENV: self.tokens["pools"][name],
                },
                cpus=None if pins is None else pins.workers[i],
            )
        if "evaluator" in argvs:
            self.procs.start(
                "evaluator",
                argvs.pop("evaluator"),
                env={**thread_env(plan.evaluator), **self.malloc_env},
                cpus=None if pins is None else pins.evaluator,
            )
        trainer_threads = self.job.training_swarm.threads or plan.trainer
        self.procs.start(
            "trainer",
            argvs.pop("trainer"),
            env={
                **thread_env(trainer_threads),
                **self.malloc_env,
                commands.TRAINER_TOKEN_ENV: self.tokens["trainer"],
            },
            cpus=None if pins is None else pins.trainer,
        )

    def _scorers(self) -> list[tuple[str, spec.RewardModel]]:
        """(process name ``scorer-<model>-<i>``, reward model) of every scoring process."""
        return [(f"scorer-{m.name}-{i}", m) for m in self.job.spec.reward_models for i in range(m.replicas)]

    def _wait_scorers(self, scorers: list[tuple[str, spec.RewardModel]], timeout_s: float = 600.0) -> None:
        """Wait until every scoring process answers (loading a model takes a while): workers started
        before would only have their first groups refused with 503 and retried."""
        import httpx

        if not scorers:
            return
        self.echo(
            f"scoring pools: {', '.join(sorted({m.name for _, m in scorers}))} ({len(scorers)} process(es)), loading"
        )
        deadline = time.monotonic() + timeout_s
        for process, _ in scorers:
            url = f"http://127.0.0.1:{self.scorer_ports[process]}/healthz"
            while True:
                child = self.procs.children[process]
                if child.returncode is not None:
                    raise RunError(f"{process} exited with code {child.returncode}:\n{child.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url, timeout=2.0).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RunError(
                        f"{process} did not answer within {timeout_s:.0f} s; log: {child.log_path}"
                    )
                time.sleep(0.5)

    def _workers(self) -> list[tuple[str, str, spec.InferenceSwarmSpec]]:
        """(process name ``<pool>-<i>``, pool name, pool) of every worker this machine runs."""
        return [
            (f"{name}-{i}", name, pool)
            for name, pool in self.job.inference_pools
            if not pool.external
            for i in range(pool.replicas if pool.replicas is not None else 1)
        ]

    def command_lines(self, port: int, plan: cpus.CorePlan) -> dict[str, list[str]]:
        """The argv of every process, by name: the coordinator on ``port``, each worker, the evaluator
        (unless evaluation is off) and the trainer (:mod:`echo_runtime.spec.commands`, as the operator's
        pods get them)."""
        job_file, url = str(self.dir / "job.yaml"), f"http://127.0.0.1:{port}"
        ports = getattr(self, "scorer_ports", None) or {
            p: port + 1 + i for i, (p, _) in enumerate(self._scorers())
        }
        pools: dict[str, list[str]] = {}
        for process, model in self._scorers():
            pools.setdefault(model.name, []).append(f"http://127.0.0.1:{ports[process]}")
        out = {
            "coordinator": commands.coordinator(
                PROGRAM,
                job_file=job_file,
                tokens_file=str(self.dir / "tokens.json"),
                port=port,
                heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
                lease_timeout_s=LEASE_TIMEOUT_S,
                reward_pools=pools,
            )
        }
        for process, model in self._scorers():
            out[process] = commands.scorer(PROGRAM, model, job_file=job_file, port=ports[process])
        for process, name, pool in self._workers():
            out[process] = commands.worker(
                PROGRAM,
                name,
                pool,
                job_file=job_file,
                coordinator_url=url,
                default_threads=plan.worker,
                metrics_file=str(self.dir / "workers" / f"{process}.jsonl"),
                cache_dir=str(self.dir / "cache" / process),
            )
        if self.evaluates:
            out["evaluator"] = self.evaluator_command()
        out["trainer"] = commands.trainer(
            PROGRAM,
            self.job.training_swarm,
            job_file=job_file,
            coordinator_url=url,
            resume=self.options.resume,
            metrics_file=str(self.dir / "trainer.jsonl"),
            max_steps=self.max_steps,
            cache_dir=str(self.dir / "cache" / "trainer"),
            report=False,
        )
        return out

    def evaluator_command(self) -> list[str]:
        return commands.evaluator(
            sys.executable,
            job_file=str(self.dir / "job.yaml"),
            out_file=str(self.dir / "eval.jsonl"),
            t0=self.t0,
            final_version=self.max_steps,
            cache_dir=str(self.dir / "cache" / "evaluator"),
        )

    def _wait_healthy(self, timeout_s: float = 120.0) -> None:
        try:
            wait_healthy(self.url, self.procs.children["coordinator"], timeout_s)
        except NotHealthy as exc:
            raise RunError(str(exc)) from exc

    # ------------------------------------------------------------------------------ monitoring
    def _tail(self, path: Path) -> list[dict[str, Any]]:
        """New complete JSON lines of ``path`` since the last call."""
        if not path.exists():
            return []
        with path.open("rb") as f:
            f.seek(self._offsets.get(path, 0))
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._offsets[path] = self._offsets.get(path, 0) + end
        out = []
        for line in data[:end].splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    def monitor(self) -> int:
        """Follow the run until the trainer finishes cleanly, restarting what dies on the way; returns 0
        (:class:`RunError` when a process keeps dying right after its restarts)."""
        from echo_runtime.coordinator import client as coord

        log = self.metrics_log()
        status_client = coord.TrainerClient(
            self.url, self.tokens["trainer"], timeout=5.0, retry=coord.RetryPolicy(attempts=2, deadline=5.0)
        )
        bar = console.ProgressBar(self.max_steps, enabled=self.options.progress)
        accuracy: float | None = None
        due: dict[str, float] = {}
        """Processes waiting to be restarted, and when."""
        for name in self.procs.children:
            self.restarts.started(name, time.monotonic())
        try:
            while True:
                now = time.time() - self.t0
                with contextlib.suppress(coord.CoordinatorError):
                    doc = status_client.status().model_dump(by_alias=True, mode="json")
                    log.write({"kind": "status", "time": now, **doc})
                    self.report_workers(doc["policyVersion"], now)
                    bar.update_to(doc["policyVersion"], doc, accuracy, self.restarts.counts())
                    self.show_warnings(doc)
                self.memory.sample(memory.group_ids(self.procs.children))
                for record in self._tail(self.dir / "eval.jsonl"):
                    log.write(record)
                    accuracy = record["heldoutAccuracy"]
                for record in self._tail(self.dir / "trainer.jsonl"):
                    stamped = float(record.get("unixTime", self.t0 + now)) - self.t0
                    log.write({**record, "kind": "trainer", "time": stamped})
                if self.procs.children["trainer"].returncode == 0 and "trainer" not in due:
                    return 0
                clock = time.monotonic()
                for child in self.procs.exited():
                    if child.name not in due and not self._finished(child):
                        due[child.name] = clock + self._on_exit(child, clock)
                for name, at in list(due.items()):
                    if clock >= at:
                        del due[name]
                        self._restart(name, clock)
                time.sleep(self.options.status_interval_s)
        finally:
            bar.close()
            status_client.close()
            log.close()

    def show_warnings(self, doc: dict[str, Any]) -> None:
        """Print each warning of a status document once, when it appears (again after it cleared)."""
        current = {str(w).split(":", 1)[0]: str(w) for w in doc.get("warnings") or []}
        for key, message in current.items():
            if key not in self._warned:
                self.echo(f"warning: {message}")
        self._warned = set(current)

    def _finished(self, child: Child) -> bool:
        """An exit that is the end of the process's work, not a failure."""
        return child.returncode == 0 and child.name in ("trainer", "evaluator")

    def _on_exit(self, child: Child, clock: float) -> float:
        """A process died: the seconds until its restart (:class:`RunError` if it keeps dying)."""
        try:
            delay = self.restarts.on_exit(child.name, clock)
        except restarts.GaveUp as exc:
            raise RunError(f"{exc}; last exit code {child.returncode}:\n{child.log_tail()}") from None
        count = self.restarts.counts().get(child.name, 0)
        self.echo(
            f"{child.name} exited with code {child.returncode}; restarting it in {delay:.0f}s "
            f"(restart {count}; log: {child.log_path})"
        )
        return delay

    def _restart(self, name: str, clock: float) -> None:
        old = self.procs.children[name]
        self.procs.stop(name, grace_s=0.0)  # what is left of its process group (the coordinator's scorers)
        argv = list(old.argv)
        if name == "trainer" and "--resume" not in argv:
            argv.append("--resume")  # continue from the newest published version and checkpoint
        self.procs.start(name, argv, env=old.env, cpus=old.cpus)
        self.restarts.started(name, clock)
        if name == "coordinator":
            with contextlib.suppress(RunError):  # if it dies again, the next pass restarts it
                self._wait_healthy(timeout_s=60.0)

    def finish(self, evaluator_timeout_s: float = 600.0) -> dict[str, Any]:
        """Wait for the final evaluation, stop everything, write summary.json and the plots."""
        evaluator = self.procs.children.get("evaluator")
        if evaluator is not None and evaluator.returncode is None:
            with contextlib.suppress(Exception):
                evaluator.proc.wait(timeout=evaluator_timeout_s)
        self.memory.sample(memory.group_ids(self.procs.children))
        workers = [n for n in self.procs.children if n not in ("coordinator", "trainer", "evaluator")]
        self.procs.stop_all(grace_s=15.0, order=workers)
        return self.write_summary()

    # ------------------------------------------------------------------------------ trackers
    def open_reporter(self) -> None:
        """Start reporting to the experiment trackers, if any are asked for (after :meth:`start`: the
        run's clock is set). A tracker that cannot open is reported and retried, never fatal."""
        if not self.report_to:
            return
        from echo_runtime import tracking

        settings = self.job.training_swarm.tracking
        directory = Path(settings.dir) if settings.dir else self.dir / "tracking"
        run = tracking.RunInfo(
            project=settings.project,
            name=settings.run_name or self.job.name,
            run_id=tracking.run_id_file(self.dir / "tracking", self.job.name),
            dir=directory,
            config=tracking.run_config(self.job),
        )
        self.reporter = tracking.Reporter(
            self.report_to, run, t0=self.t0, warn=lambda message: self.echo(f"warning: {message}")
        )
        self.echo(f"reporting to {', '.join(self.report_to)} (run {run.run_id}, files under {directory})")

    def close_reporter(self) -> None:
        if self.reporter is not None:
            self.reporter.close()
            self.reporter = None

    def metrics_log(self) -> metrics.MetricsLog:
        """``metrics.jsonl``, whose records also go to the trackers."""
        forward = self.reporter.log if self.reporter is not None else None
        return metrics.MetricsLog(self.dir / "metrics.jsonl", forward=forward)

    def report_workers(self, version: int, now: float) -> None:
        """Each local worker's busy (sampling) and load fractions, to the trackers only, once per
        version (from the last line of its timing file: the fractions of its current incarnation)."""
        if self.reporter is None or version == self._workers_reported:
            return
        self._workers_reported = version
        for path in sorted((self.dir / "workers").glob("*.jsonl")):
            for record in self._tail(path):
                self._worker_last[path.stem] = record
        fractions = {}
        for name, record in self._worker_last.items():
            wall = float(record.get("time") or 0.0)
            if wall > 0:
                fractions[name] = {
                    "busyFraction": float(record.get("sampleSeconds", 0.0)) / wall,
                    "loadFraction": float(record.get("loadSeconds", 0.0)) / wall,
                }
        if fractions:
            self.reporter.log(
                {"kind": "workerTiming", "policyVersion": version, "time": now, "workers": fractions}
            )

    def write_summary(self) -> dict[str, Any]:
        log = self.metrics_log()
        for record in self._tail(self.dir / "eval.jsonl"):
            log.write(record)
        log.close()
        records = metrics.read_records(self.dir / "metrics.jsonl")
        summary = metrics.summarise(records, self.options.target_accuracy)
        summary["job"] = self.job.name
        summary["mode"] = self.job.sync_policy.mode
        summary["maxStalenessSetting"] = self.job.sync_policy.max_staleness
        summary["workerTiming"] = _worker_timing(self.dir / "workers")
        summary["restarts"] = self.restarts.counts()
        summary["memory"] = self.memory.report()
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
        with contextlib.suppress(Exception):  # plots are a convenience; never lose the summary to them
            plots.plot_run(records, self.dir, self.job.name)
        return summary


def _complete_length(path: Path) -> int:
    """Bytes of ``path`` up to and including its last newline (complete JSON lines)."""
    data = path.read_bytes()
    return data.rfind(b"\n") + 1


def _worker_timing(directory: Path) -> dict[str, Any]:
    """Per-worker load / sample / wall seconds from the workers' timing files, added up over the
    worker's incarnations (a restarted or resumed worker appends to the same file, its clock from 0)."""
    out: dict[str, Any] = {}
    for path in sorted(directory.glob("*.jsonl")):
        ends: list[dict[str, Any]] = []
        previous = -1.0
        for record in metrics.read_records(path):
            at = float(record.get("time", 0.0))
            if at < previous or not ends:
                ends.append(record)  # a new incarnation
            else:
                ends[-1] = record
            previous = at
        if not ends:
            continue
        wall = sum(float(r.get("time", 0.0)) for r in ends)
        load = sum(float(r.get("loadSeconds", 0.0)) for r in ends)
        out[path.stem] = {
            "wallSeconds": wall or None,
            "loadSeconds": load,
            "sampleSeconds": sum(float(r.get("sampleSeconds", 0.0)) for r in ends),
            "rollouts": sum(int(r.get("rollouts", 0)) for r in ends),
            "loadFraction": load / wall if wall else None,
            "incarnations": len(ends),
        }
    return out
