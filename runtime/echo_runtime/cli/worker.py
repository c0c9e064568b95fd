"""``echorl worker``: join a coordinator as an inference worker (in a pod, on a laptop, on a Mac)."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

import click

from echo_runtime import spec


@click.command()
@click.option("--coordinator", "url", required=True, envvar="ECHORL_COORDINATOR", help="Coordinator URL.")
@click.option("--token", required=True, envvar="ECHORL_TOKEN", help="The pool's join token.")
@click.option(
    "--ca-file",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="ECHORL_CA_FILE",
    help="PEM CA that an https:// coordinator's certificate must chain to (the join Secret's ca.crt).",
)
@click.option(
    "--tls-fingerprint",
    default=None,
    envvar="ECHORL_TLS_FINGERPRINT",
    help="sha256:<hex> of the https:// coordinator's own certificate (pinned; no hostname check).",
)
@click.option(
    "--backend",
    type=click.Choice(["transformers", "mlx", "vllm"]),
    default="transformers",
    show_default=True,
    envvar="ECHORL_BACKEND",
)
@click.option(
    "--pool", default="default", show_default=True, envvar="ECHORL_POOL", help="Inference pool name."
)
@click.option(
    "--job",
    "job_file",
    type=click.Path(exists=True, dir_okay=False),
    envvar="ECHORL_JOB_FILE",
    required=True,
    help="The EchoJob manifest (model and snapshot store are read from it).",
)
@click.option("--device", default="auto", show_default=True, envvar="ECHORL_DEVICE")
@click.option("--dtype", default=None, help="Inference dtype (default: the model's).")
@click.option("--threads", type=click.IntRange(min=1), default=None, envvar="ECHORL_THREADS")
@click.option("--capacity", type=click.IntRange(min=1), default=1, show_default=True, help="Tasks per lease.")
@click.option(
    "--tensor-parallel-size",
    type=click.IntRange(min=1),
    default=None,
    help="vllm only: GPUs the model is sharded over (the pool's gpusPerReplica).",
)
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None, help="Local snapshot cache.")
@click.option("--external", is_flag=True, help="This worker joins from outside the cluster.")
@click.option("--metrics", "metrics_path", type=click.Path(dir_okay=False), default=None)
@click.option("--max-groups", type=click.IntRange(min=1), default=None, help="Exit after this many groups.")
@click.option("-v", "--verbose", is_flag=True)
def worker(
    url: str,
    token: str,
    ca_file: str | None,
    tls_fingerprint: str | None,
    backend: str,
    pool: str,
    job_file: str,
    device: str,
    dtype: str | None,
    threads: int | None,
    capacity: int,
    tensor_parallel_size: int | None,
    cache_dir: str | None,
    external: bool,
    metrics_path: str | None,
    max_groups: int | None,
    verbose: bool,
) -> None:
    """Generate rollouts for a coordinator until stopped (SIGTERM/Ctrl-C finishes the group in hand)."""
    if tensor_parallel_size is not None and backend != "vllm":
        raise click.UsageError("--tensor-parallel-size is for --backend vllm only")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)  # one line per request
    from echo_runtime.runner import allocator

    logging.getLogger("echo_runtime.worker").info("memory allocator: %s", allocator.in_use())
    from echo_runtime import backends, snapshots
    from echo_runtime.coordinator import client as coord
    from echo_runtime.coordinator import tls
    from echo_runtime.models import load as model_load
    from echo_runtime.models import resolve as model_resolve
    from echo_runtime.models.prompts import PromptStyle
    from echo_runtime.worker.loop import Worker

    try:
        verify = tls.client_context(url, ca_file=ca_file, pinned=tls_fingerprint)  # before the model loads
    except tls.TLSError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        job = spec.load_job(job_file)
    except spec.ManifestError as exc:
        raise click.ClickException(str(exc)) from exc
    model_path = model_load.resolve_spec(job.spec.model, job.spec.task)
    model_dtype = dtype or job.spec.model.dtype
    store = snapshots.open_store(job.spec.storage, job.name)
    cache = Path(cache_dir) if cache_dir else model_resolve.cache_dir() / "snapshots" / job.name / pool
    engine = backends.create_backend(
        backend,
        model_path,
        device=device,
        dtype=model_dtype,
        threads=threads,
        prompt_style=PromptStyle.from_task(job.spec.task),
        **({"tensor_parallel_size": tensor_parallel_size} if tensor_parallel_size is not None else {}),
    )
    client = coord.WorkerClient(
        url,
        token,
        pool=pool,
        backend=engine.name,
        device=engine.device,
        dtype=engine.dtype,
        capacity=capacity,
        external=external,
        host=socket.gethostname()[:253],
        verify=verify,
    )
    loop = Worker(
        engine,
        client,
        store,
        cache,
        capacity=capacity,
        metrics_path=Path(metrics_path) if metrics_path else None,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("echorl.worker").info("signal %d: finishing the group in hand", signum)
        loop.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        loop.run(max_groups=max_groups)
    except coord.Untrusted as exc:
        raise click.ClickException(exc.message) from exc
    except coord.Unauthorized as exc:
        raise click.ClickException(f"the coordinator rejected the token: {exc.message}") from exc
    except coord.Unavailable as exc:
        raise click.ClickException(f"the coordinator is unreachable: {exc.message}") from exc
    finally:
        client.close()
