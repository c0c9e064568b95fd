"""``echorl scorer --job job.yaml --reward-model NAME``: one process of a reward model's scoring pool.

Serves ``POST /v1/score`` to the coordinator (:mod:`echo_runtime.rewards.server`); its token comes
from ``ECHORL_SCORER_TOKEN``. ``echorl run`` starts ``spec.rewardModels[].replicas`` of them per
reward model; in a cluster the operator runs them as a Deployment behind a Service.
"""

from __future__ import annotations

import logging
import os

import click

from echo_runtime import spec
from echo_runtime.rewards import TOKEN_ENV


@click.command()
@click.option("--job", "job_path", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--name", default=None, help="Which EchoJob, if the file holds several.")
@click.option("--reward-model", "model_name", required=True, help="Which of spec.rewardModels to serve.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8710, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token", envvar=TOKEN_ENV, required=True, show_envvar=True, help="The scoring pool's token.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
def scorer(
    job_path: str, name: str | None, model_name: str, host: str, port: int, token: str, log_level: str
) -> None:
    """Serve one reward model (a classifier or an LLM judge) to the job's coordinator."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        job = spec.load_job(job_path, name)
    except spec.ManifestError as exc:
        raise click.ClickException(str(exc)) from exc
    models = {m.name: m for m in job.spec.reward_models}
    if model_name not in models:
        allowed = ", ".join(models) or "none: the job has no spec.rewardModels"
        raise click.BadParameter(
            f"{model_name!r} is not one of the job's reward models ({allowed})", param_hint="--reward-model"
        )
    settings = models[model_name]
    import torch
    import uvicorn

    from echo_runtime.models.resolve import resolve_model
    from echo_runtime.rewards import models as reward_models
    from echo_runtime.rewards import server

    threads = settings.threads or int(os.environ.get("ECHORL_THREADS", "0") or 0)
    if threads:
        torch.set_num_threads(threads)
    path = resolve_model(settings.model)
    logging.getLogger("echorl.scorer").info("loading %s %s from %s", settings.type, model_name, path)
    model = reward_models.load(path, settings)
    app = server.app(model_name, token, server.Batcher(model.score, settings.batch_size))
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)


if __name__ == "__main__":
    scorer()
