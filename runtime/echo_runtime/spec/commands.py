"""The command line (argv) of every Echo process of a job, from its spec: one definition for both faces.

``echorl run`` (:mod:`echo_runtime.runner.local`) starts the coordinator, the workers, the trainer and
the evaluator on this machine; the operator (:mod:`echo_operator.children`) puts the first three in
pods. Both build every argv here, so a flag that a spec field decides (a pool's backend, device,
dtype, capacity, threads and ``gpusPerReplica``; whether the trainer runs under torchrun) cannot be
passed by one face and forgotten by the other. What legitimately differs between the faces is a
parameter, named for what it is:

* how ``echorl`` is started (:class:`Program`): this interpreter's ``-m echo_runtime.cli`` on a
  laptop, the image's ``echorl`` console script in a pod; and how torchrun's ranks meet (standalone
  on one machine, at rank 0's DNS name across pods);
* where files are (the run directory vs the ConfigMap and Secret mounted in a pod), the coordinator's
  URL (localhost vs the Service's DNS name) and the address and port it listens on;
* what only one face asks for: a local run's per-process metrics and cache directories, its shorter
  heartbeat and lease timeout (every process shares one machine, so a dead one is noticed sooner),
  ``--resume`` and ``--max-steps``; a pod's ``--metrics-auth`` and TLS files.

Promises: pure functions of their arguments (no files, clock or environment read); join tokens never
appear in an argv, where any user of the machine could read them: the faces pass them in
:data:`WORKER_TOKEN_ENV` and :data:`TRAINER_TOKEN_ENV`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import overload

from echo_runtime.spec.rewards import RewardModel
from echo_runtime.spec.swarms import InferenceSwarmSpec, TrainingSwarmSpec

WORKER_TOKEN_ENV = "ECHORL_TOKEN"
"""The variable ``echorl worker`` reads its pool's join token from."""
TRAINER_TOKEN_ENV = "ECHORL_TRAINER_TOKEN"
"""The variable ``echorl trainer`` reads its join token from."""
EVALUATOR_MODULE = "echo_runtime.runner.evaluator"
"""The evaluator runs as ``python -m`` this module (a local run's own process, not an ``echorl`` command)."""


@dataclasses.dataclass(frozen=True)
class Program:
    """How a face starts ``echorl``, alone and under torchrun."""

    echorl: tuple[str, ...]
    """The argv prefix that runs the ``echorl`` command line."""
    torchrun: Callable[[TrainingSwarmSpec], tuple[str, ...]]
    """The argv prefix that runs ``echorl`` under torchrun for this training swarm (its rendezvous)."""


@dataclasses.dataclass(frozen=True)
class TLSFiles:
    """The certificate the coordinator serves TLS with, on a port of its own beside the plain one."""

    cert: str
    key: str
    port: int


def coordinator(
    program: Program,
    *,
    job_file: str,
    tokens_file: str,
    port: int,
    host: str | None = None,
    heartbeat_interval_s: float | None = None,
    lease_timeout_s: float | None = None,
    metrics_auth: bool = False,
    tls: TLSFiles | None = None,
    reward_pools: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """``echorl coordinator``; ``None`` leaves an option at the command's default. ``reward_pools``:
    the scoring pool addresses of each of ``spec.rewardModels`` (the face's own: ports on this machine,
    or a Service's DNS name)."""
    argv = [*program.echorl, "coordinator", "--job", job_file, "--tokens-file", tokens_file]
    if host is not None:
        argv += ["--host", host]
    argv += ["--port", str(port)]
    if heartbeat_interval_s is not None:
        argv += ["--heartbeat-interval", f"{heartbeat_interval_s:g}"]
    if lease_timeout_s is not None:
        argv += ["--lease-timeout", f"{lease_timeout_s:g}"]
    if metrics_auth:
        argv.append("--metrics-auth")
    if tls is not None:
        argv += ["--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-port", str(tls.port)]
    for name, urls in (reward_pools or {}).items():
        argv += ["--reward-model", f"{name}={','.join(urls)}"]
    return argv


def scorer(
    program: Program, model: RewardModel, *, job_file: str, port: int, host: str | None = None
) -> list[str]:
    """``echorl scorer``: one process of a reward model's scoring pool (its token comes from
    :data:`echo_runtime.rewards.TOKEN_ENV`)."""
    argv = [*program.echorl, "scorer", "--job", job_file, "--reward-model", model.name]
    if host is not None:
        argv += ["--host", host]
    return [*argv, "--port", str(port)]


@overload
def worker_threads(pool: InferenceSwarmSpec, default: int) -> int: ...
@overload
def worker_threads(pool: InferenceSwarmSpec, default: None) -> int | None: ...
def worker_threads(pool: InferenceSwarmSpec, default: int | None) -> int | None:
    """A worker's threads: the pool's ``threads``, else the face's ``default`` (None: the worker's own)."""
    return pool.threads if pool.threads is not None else default


def worker(
    program: Program,
    name: str,
    pool: InferenceSwarmSpec,
    *,
    job_file: str,
    coordinator_url: str,
    default_threads: int | None = None,
    metrics_file: str | None = None,
    cache_dir: str | None = None,
) -> list[str]:
    """``echorl worker`` of pool ``name`` (its join token comes from :data:`WORKER_TOKEN_ENV`).

    ``default_threads`` is the face's thread count for a pool that sets none (a local run's share of
    the cores; None in a pod, where the container's CPU limit decides).
    """
    argv = [
        *program.echorl, "worker", "--job", job_file, "--coordinator", coordinator_url, "--pool", name,
        "--backend", pool.backend, "--device", pool.device, "--capacity", str(pool.capacity),
    ]  # fmt: skip
    if pool.dtype is not None:
        argv += ["--dtype", pool.dtype]
    threads = worker_threads(pool, default_threads)
    if threads is not None:
        argv += ["--threads", str(threads)]
    if pool.gpus_per_replica is not None:
        argv += ["--tensor-parallel-size", str(pool.gpus_per_replica)]
    if metrics_file is not None:
        argv += ["--metrics", metrics_file]
    if cache_dir is not None:
        argv += ["--cache-dir", cache_dir]
    return argv


def distributed(swarm: TrainingSwarmSpec) -> bool:
    """Whether the trainer is a group of processes (torchrun starts it) rather than one."""
    return swarm.nodes * swarm.processes_per_node > 1


def trainer(
    program: Program,
    swarm: TrainingSwarmSpec,
    *,
    job_file: str,
    coordinator_url: str,
    resume: bool,
    metrics_file: str | None = None,
    max_steps: int | None = None,
    cache_dir: str | None = None,
    report: bool = True,
) -> list[str]:
    """``echorl trainer``, under torchrun when the swarm has more than one process (its join token
    comes from :data:`TRAINER_TOKEN_ENV`). ``report=False``: the trainer reports to no experiment
    tracker (``echorl run`` reports itself, evaluations included)."""
    launch = program.torchrun(swarm) if distributed(swarm) else program.echorl
    argv = [*launch, "trainer", "--job", job_file, "--coordinator", coordinator_url]
    if metrics_file is not None:
        argv += ["--metrics-file", metrics_file]
    if max_steps is not None:
        argv += ["--max-steps", str(max_steps)]
    if cache_dir is not None:
        argv += ["--cache-dir", cache_dir]
    if resume:
        argv.append("--resume")
    if not report:
        argv += ["--report-to", "none"]
    return argv


def evaluator(
    python: str, *, job_file: str, out_file: str, t0: float, final_version: int, cache_dir: str
) -> list[str]:
    """The evaluator of a local run (:mod:`echo_runtime.runner.evaluator`), started by ``python``."""
    return [
        python, "-m", EVALUATOR_MODULE, "--job", job_file, "--out", out_file, "--t0", repr(t0),
        "--final", str(final_version), "--cache-dir", cache_dir,
    ]  # fmt: skip
