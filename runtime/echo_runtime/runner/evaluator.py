"""The evaluator process of a local run: held-out accuracy of published policy versions.

It sits outside the training loop's critical path: it watches the snapshot store and, whenever the
newest published version is at least ``every`` versions past the last one it evaluated (and for the
base model, version 0, and the final version), it loads that version and scores greedy completions of
the task's *held-out* prompts (never used in training) with the task's verifier.

It generates as the job's workers do: prompts rendered by the backend (the job's ``task.promptFormat``
and ``systemPrompt``, the chat template of a chat model), up to the job's ``sampling.maxNewTokens``,
stopping at the model's own EOS ids (tokenizer, ``config.json`` and ``generation_config.json``, e.g.
``<|im_end|>``). Decoding is greedy, the usual held-out measure; the held-out problems are the first
``task.heldoutSize`` of the held-out stream (at most every held-out row once, for a task over a data
file) under seed :data:`HELDOUT_SEED` whatever the training seed,
so runs with different seeds are scored on the same problems and their differences are paired. Each evaluation is one
``eval`` record (see :mod:`.metrics`) whose ``publishedAt`` is when the trainer published the version,
so wall-clock-to-accuracy curves do not include evaluation lag.

Run as ``python -m echo_runtime.runner.evaluator --job JOB --out FILE --t0 EPOCH --final N``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
from pathlib import Path

import click

from echo_runtime import spec

log = logging.getLogger("echorl.evaluator")

HELDOUT_SEED = 0
"""Seed of the held-out stream the evaluator scores (fixed, so every training seed meets the same set)."""


@click.command()
@click.option("--job", "job_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--t0", type=float, required=True, help="Epoch seconds at which the run started.")
@click.option("--final", "final_version", type=int, required=True, help="Exit after evaluating this version.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
def main(job_path: str, out_path: Path, t0: float, final_version: int, threads: int, cache_dir: Path) -> None:
    """Evaluate held-out accuracy of published versions until the final one is done."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import torch

    from echo_runtime import snapshots, tasks
    from echo_runtime.backends.transformers import TransformersBackend
    from echo_runtime.models import load as model_load
    from echo_runtime.models import warmup
    from echo_runtime.models.prompts import PromptStyle

    torch.set_num_threads(threads)
    job = spec.load_job(job_path)
    task = tasks.from_spec(job.spec.task)
    count = job.spec.task.heldout_size
    sizes = getattr(task, "sizes", None)  # a finite task (a data file): each held-out problem once
    if callable(sizes):
        count = min(count, int(sizes()["heldout"]))
    problems = list(itertools.islice(task.prompts("heldout", HELDOUT_SEED), count))
    backend = TransformersBackend(
        model_load.resolve_spec(job.spec.model, job.spec.task),
        "cpu",
        job.spec.model.dtype,
        prompt_style=PromptStyle.from_task(job.spec.task),
    )
    max_new_tokens = job.spec.algorithm.sampling.max_new_tokens
    store = snapshots.open_store(job.spec.storage, job.name)
    every = job.spec.task.eval_every
    evaluated: int | None = None
    reader = "evaluator"

    def evaluate(version: int) -> None:
        published_at = 0.0
        if version > 0:
            manifest = store.manifest(version)
            with contextlib.suppress(Exception):
                store.pin(version, reader, 600.0)
            path = store.fetch(version, cache_dir, keep_cached=2)
            backend.apply_snapshot(version, path, manifest.kind)
            published_at = manifest.created.timestamp() - t0
        started = time.monotonic()
        result = warmup.evaluate(
            backend.model,
            backend.tokenizer,
            task,
            problems,
            temperature=0.0,
            max_new_tokens=max_new_tokens,
            style=backend.prompt_style,
            eos_ids=backend.eos_ids,
        )
        record = {
            "kind": "eval",
            "time": time.time() - t0,
            "publishedAt": max(0.0, published_at),
            "policyVersion": version,
            "heldoutAccuracy": result.accuracy,
            "heldoutReward": result.mean_reward,
            "heldoutSize": result.n,
            "evalSeconds": time.monotonic() - started,
            "examples": [list(e) for e in result.examples],
        }
        with out_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        log.info("version %d: held-out accuracy %.3f", version, result.accuracy)
        with contextlib.suppress(Exception):
            store.unpin(version, reader)

    while True:
        latest = store.latest_version()
        if evaluated is None:
            evaluate(0)  # the starting policy (the base or warmed-up model)
            evaluated = 0
            continue
        if (
            latest is not None
            and latest > evaluated
            and (latest - evaluated >= every or latest >= final_version)
        ):
            try:
                evaluate(latest)
            except snapshots.SnapshotError as exc:  # collected by retention meanwhile: take the next one
                log.warning("version %d: %s", latest, exc)
                continue
            evaluated = latest
        if evaluated >= final_version:
            return
        time.sleep(0.5)


if __name__ == "__main__":
    main()
