"""``echorl coordinator --job job.yaml``: run the coordinator service of one job."""

from __future__ import annotations

import logging
import os

import click

from echo_runtime import rewards, spec


@click.command()
@click.option(
    "--job",
    "job_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="The EchoJob manifest (with any objects it references).",
)
@click.option("--name", default=None, help="Which EchoJob, if the file holds several.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8700, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--tokens-file",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="YAML/JSON: {trainer: TOKEN, pools: {POOL: TOKEN}, status: TOKEN}; values may be sha256:<hex>; "
    "status (optional) may only read /v1/status and /metrics.",
)
@click.option(
    "--vocab-size",
    type=click.IntRange(1),
    default=None,
    help="Vocabulary size for token-id checks (default: read from the job's model).",
)
@click.option(
    "--lease-timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds of silence after which a worker loses its leases.",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0.05),
    default=5.0,
    show_default=True,
    help="Seconds between worker heartbeats (told to workers).",
)
@click.option(
    "--task-timeout",
    type=click.FloatRange(min=0.1),
    default=600.0,
    show_default=True,
    help="Seconds after which a lease is re-issued even if its worker is alive.",
)
@click.option(
    "--tokenizer",
    default=None,
    help="Model (directory or name) whose tokenizer the rollouts' token ids must decode with (default: the "
    "job's model). 'none' turns the check off: only for load tests that submit synthetic token ids.",
)
@click.option(
    "--score-timeout",
    type=click.FloatRange(min=0.01),
    default=10.0,
    show_default=True,
    help="Seconds of verifier time per rollout; a rollout past it scores 0 (counted as verifierTimeouts).",
)
@click.option(
    "--verifier-processes",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Processes that re-score rollouts, off the event loop.",
)
@click.option(
    "--pacing/--no-pacing",
    default=True,
    show_default=True,
    envvar="ECHORL_PACING",
    help="Lease only what can be consumed within Δmax (default). --no-pacing exists to measure what pacing "
    "saves: fast workers then generate groups that are dropped as too stale.",
)
@click.option(
    "--metrics-auth/--no-metrics-auth",
    default=False,
    show_default=True,
    envvar="ECHORL_METRICS_AUTH",
    help="/metrics only for the status or the trainer token (default: open, as Prometheus scrapes expect).",
)
@click.option(
    "--no-store",
    is_flag=True,
    help="Start at t_train 0 without reading the snapshot store (tests, benchmarks).",
)
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    envvar="ECHORL_TLS_CERT",
    help="PEM certificate (chain) to serve TLS with; needs --tls-key.",
)
@click.option(
    "--tls-key",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    envvar="ECHORL_TLS_KEY",
    help="PEM private key of --tls-cert.",
)
@click.option(
    "--tls-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve TLS on this port and keep --port plain HTTP (default: TLS on --port itself).",
)
@click.option(
    "--reward-model",
    "reward_models",
    multiple=True,
    metavar="NAME=URL[,URL...]",
    help="The scoring pool of spec.rewardModels[NAME] (its echorl scorer processes); one per reward model. "
    "The token they take comes from ECHORL_SCORER_TOKEN.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
def coordinator(
    job_path: str,
    name: str | None,
    host: str,
    port: int,
    tokens_file: str,
    vocab_size: int | None,
    lease_timeout: float,
    heartbeat_interval: float,
    task_timeout: float,
    tokenizer: str | None,
    score_timeout: float,
    verifier_processes: int,
    pacing: bool,
    metrics_auth: bool,
    no_store: bool,
    tls_cert: str | None,
    tls_key: str | None,
    tls_port: int | None,
    reward_models: tuple[str, ...],
    log_level: str,
) -> None:
    """Run the coordinator of one EchoJob: leases, replay buffer, both sync protocols and the Δmax bound.

    Serves HTTP (OpenAPI schema at /openapi.json, status at /v1/status, Prometheus at /metrics).
    On start it recovers t_train from the job's snapshot store; see docs/coordinator.md.
    """
    from echo_runtime.coordinator import api, auth, service

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_port is not None and tls_cert is None:
        raise click.UsageError("--tls-port needs --tls-cert and --tls-key")
    if tls_port is not None and tls_port == port:
        raise click.UsageError(
            f"--tls-port {tls_port} is --port: leave --tls-port out to serve TLS on --port"
        )
    if tls_cert is not None:
        _check_tls_pair(tls_cert, tls_key or "")
    pools: dict[str, list[str]] = {}
    for given in reward_models:
        model, _, urls = given.partition("=")
        if not model or not urls:
            raise click.BadParameter(f"{given!r}: expected NAME=URL[,URL...]", param_hint="--reward-model")
        pools.setdefault(model, []).extend(u for u in urls.split(",") if u)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        job = spec.load_job(job_path, name)
        tokens = auth.TokenStore.load(tokens_file)
        store = None if no_store else service.open_store(job)
        vocab = vocab_size if vocab_size is not None else service.model_vocab_size(job)
        detokenizer = None if tokenizer == "none" else service.load_detokenizer(job, tokenizer)
        svc = service.build(
            job,
            tokens,
            vocab_size=vocab,
            store=store,
            detokenizer=detokenizer,
            lease_timeout=lease_timeout,
            heartbeat_interval=heartbeat_interval,
            task_timeout=task_timeout,
            score_timeout=score_timeout,
            verifier_processes=verifier_processes,
            pacing=pacing,
            metrics_auth=metrics_auth,
            reward_pools=pools,
            scorer_token=os.environ.get(rewards.TOKEN_ENV),
        )
    except (spec.ManifestError, auth.TokenError, service.SetupError) as exc:
        raise click.ClickException(str(exc)) from exc
    service.serve(
        api.create_app(svc),
        host,
        port,
        log_level=log_level,
        keep_alive=max(75.0, 3 * heartbeat_interval),
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_port=tls_port,
    )


def _check_tls_pair(cert: str, key: str) -> None:
    """Load the pair now, so a wrong file is an error that names it rather than a failed start-up."""
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise click.BadParameter(
            f"{cert} / {key}: not a PEM certificate and its private key ({exc})", param_hint="--tls-cert"
        ) from exc
