"""``echorl run`` and the operator tell every process the same thing (:mod:`echo_runtime.spec.commands`).

For each example manifest, each valid manifest ``echorl run`` reads, and one that sets every field a
command line depends on, the local runner's argv of the coordinator, every worker and the trainer is
held against the command of the operator's pod for the same process. Only what the faces differ in on
purpose is set aside (paths, URLs, listening address, local files and timeouts, ``--resume``,
torchrun's rendezvous, a local run's default thread count); everything else must be equal, so a flag
that one face derives from the spec and the other forgets fails here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from echo_operator import children
from echo_operator.children import inputs, pods
from echo_operator.config import Settings
from echo_runtime import spec
from echo_runtime.runner import cpus, local

REPO = Path(__file__).resolve().parents[3]

EVERY_FIELD = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: every-field}
spec:
  syncPolicy: {mode: Async, maxStaleness: 2}
  trainingSwarm: {nodes: 1, processesPerNode: 2, threads: 3}
  inferenceSwarms:
  - {name: gpu, backend: vllm, device: cuda, dtype: bfloat16, capacity: 4, gpusPerReplica: 2, replicas: 2}
  - {name: cpu, device: cpu, dtype: float32, threads: 5}
  - {name: plain}
  - {name: mac, backend: mlx, external: true}
"""

CLUSTER_ONLY = {"nulls-are-pruned.yaml"}
"""Read as the API server reads it (``key: null`` pruned); ``echorl run`` refuses it, as it should."""

FACE_ONLY = {
    "coordinator": {
        "--job", "--tokens-file", "--host", "--port", "--heartbeat-interval", "--lease-timeout",
        "--metrics-auth", "--tls-cert", "--tls-key", "--tls-port",
        "--reward-model",  # the scoring pools' addresses (compared by name below)
    },
    "scorer": {"--job", "--host", "--port"},
    "worker": {"--job", "--coordinator", "--metrics", "--cache-dir"},
    # --report-to none: locally the runner reports to the trackers, in a pod the trainer does.
    "trainer": {"--job", "--coordinator", "--metrics-file", "--max-steps", "--cache-dir", "--resume", "--report-to"},
}  # fmt: skip
"""Per command, the options whose values are a face's own (files, addresses, local-only settings)."""


def manifests() -> list[Path]:
    valid = [
        p for p in sorted((REPO / "tests/data/valid-manifests").glob("*.yaml")) if p.name not in CLUSTER_ONLY
    ]
    return sorted((REPO / "examples").glob("*.yaml")) + valid


def _options(argv: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs (None for a bare flag) of an ``echorl <command>`` argv."""
    out: dict[str, str | None] = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            following = argv[i + 1] if i + 1 < len(argv) else None
            out[arg] = None if following is None or following.startswith("--") else following
    return out


def _all(argv: list[str], flag: str) -> list[str]:
    """Every value of a repeated ``flag``."""
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def _normalised(argv: list[str], echorl: tuple[str, ...]) -> tuple[bool, str, dict[str, str | None]]:
    """(under torchrun, the echorl command, its options without the face's own) of one argv."""
    torchrun = argv[: len(echorl)] != list(echorl)
    if torchrun:  # the launcher is each face's rendezvous; what it starts is compared
        at = max(i for i in range(len(argv)) if argv[i : i + 1] == [echorl[-1]])
        rest = argv[at + 1 :]
    else:
        rest = argv[len(echorl) :]
    command, options = rest[0], _options(rest[1:])
    return torchrun, command, {k: v for k, v in options.items() if k not in FACE_ONLY[command]}


def _local(path: Path, run_dir: Path) -> dict[str, list[str]]:
    run = local.LocalRun(path, local.RunOptions(run_dir=run_dir), echo=lambda _: None)
    run.t0 = 0.0
    return run.command_lines(8700, cpus.CorePlan(trainer=1, worker=1, evaluator=1))


def _pods(path: Path) -> tuple[dict[str, list[str]], spec.ResolvedJob]:
    docs = spec.load_file(path)
    resolved = spec.resolve(next(d for d in docs if isinstance(d, spec.EchoJob)), docs)
    roles = ["trainer", "status", *(name for name, _ in resolved.inference_pools)]
    digests = {role: hashlib.sha256(role.encode()).hexdigest() for role in roles}
    job = inputs.JobInput.from_resolved(resolved, "uid", digests, inputs.StoreWiring(secret=None))
    out = {}
    for obj in children.desired(job, Settings()):
        if obj["kind"] in ("Deployment", "Job"):
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            out[obj["metadata"]["name"]] = list(container["command"])
    return out, resolved


def _compare(path: Path, run_dir: Path) -> int:
    """Assert both faces agree on ``path``'s processes; return how many were compared."""
    on_machine, (in_pods, resolved) = _local(path, run_dir), _pods(path)
    name = resolved.name
    pairs = [(on_machine["coordinator"], in_pods[f"{name}-coordinator"], "coordinator", None)]
    pairs.append((on_machine["trainer"], in_pods[f"{name}-trainer"], "trainer", None))
    for pool_name, pool in resolved.inference_pools:
        pod = f"{name}-{pool_name}"
        if pool.external:
            assert pod not in in_pods and f"{pool_name}-0" not in on_machine, pool_name
            continue
        replicas = [argv for process, argv in on_machine.items() if process.rsplit("-", 1)[0] == pool_name]
        assert len(replicas) == (pool.replicas if pool.replicas is not None else 1), pool_name
        pairs += [(argv, in_pods[pod], pool_name, pool) for argv in replicas]
    pools_named = {a.split("=", 1)[0] for a in _all(on_machine["coordinator"], "--reward-model")}
    assert pools_named == {a.split("=", 1)[0] for a in _all(in_pods[f"{name}-coordinator"], "--reward-model")}
    assert pools_named == {m.name for m in resolved.spec.reward_models}
    for model in resolved.spec.reward_models:
        local_scorers = [
            argv for process, argv in on_machine.items() if process.startswith(f"scorer-{model.name}-")
        ]
        assert len(local_scorers) == model.replicas
        pairs += [
            (argv, in_pods[f"{name}-scorer-{model.name}"], f"scorer {model.name}", None)
            for argv in local_scorers
        ]
    for mine, theirs, what, pool in pairs:
        torchrun, command, options = _normalised(mine, local.PROGRAM.echorl)
        expected = _normalised(theirs, pods.PROGRAM.echorl)
        if pool is not None and pool.threads is None:
            # A local run gives a pool without `threads` its share of the cores; a pod, its CPU limit.
            options.pop("--threads", None)
        assert (torchrun, command, options) == expected, f"{path.name}: {what} differs"
    return len(pairs)


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.name)
def test_both_faces_give_every_process_the_same_command_line(path: Path, tmp_path: Path) -> None:
    assert _compare(path, tmp_path / "run") >= 3  # the coordinator, the trainer, a worker at least


def test_every_field_a_command_line_reads_reaches_both_faces(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(EVERY_FIELD)
    assert _compare(path, tmp_path / "run") == 2 + 2 + 1 + 1
    gpu = _local(path, tmp_path / "run")["gpu-0"]
    assert gpu[gpu.index("--dtype") + 1] == "bfloat16" and gpu[gpu.index("--tensor-parallel-size") + 1] == "2"
    assert "torch.distributed.run" in _local(path, tmp_path / "run")["trainer"]
