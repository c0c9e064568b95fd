"""Echo against TRL's ``GRPOTrainer`` on the same job, one after the other: peak memory, wall-clock, accuracy.

Issue 34's goal, side by side with TRL's process on the same job: Echo's whole tree ≤ 1.3× TRL's peak
memory (judged on proportional set sizes, and reported on resident sets too), Echo's trainer alone
≤ 0.7× (resident sets), at unchanged wall-clock and held-out accuracy. This runs

* **Echo**: ``python -m echo_runtime.cli run JOB --fresh --no-progress --max-steps N --seed S --cores C``
  (coordinator, inference worker(s), trainer, evaluator, and the runner that watches them) and reads its
  ``summary.json``: ``memory.peakRssMiB`` per process, ``memory.peakTotalRssMiB`` (the peak of their
  resident sets' sum at one moment) and ``memory.peakTotalPssMiB`` (the same with proportional set sizes:
  pages the processes share, libtorch's above all, counted once — what the machine holds at once),
  ``wallClockSeconds`` and the held-out accuracies;
* **TRL**: this script again as a child (``--child-trl``), with TRL put on *that process's* ``PYTHONPATH``
  only (``--trl-path``, default ``~/.cache/echorl/trl/<--trl-version>``), running ``GRPOTrainer`` on the
  CPU on the same job: the same model directory, the same peft ``LoraConfig`` (Echo's own
  :func:`echo_runtime.trainer.policy.lora_config`), the train split of the job's task as conversational
  prompts rendered as Echo renders them (the prompt ids are checked equal to Echo's
  :func:`echo_runtime.models.prompts.encode`), Echo's verifier (``task.score``) as the reward function,
  and the job's groupSize, batchSize, maxNewTokens, temperature, learning rate (constant), clipRange and
  klCoef (0: no reference model). Its peak is the kernel's high-water mark (``VmHWM``) of the process
  over ``trainer.train()``, and its largest proportional set size, sampled every second. Afterwards, so
  that it does not count toward that peak, the trained adapter is scored greedily on the held-out
  problems Echo's evaluator scores, with Echo's own :func:`echo_runtime.models.warmup.evaluate`, and so is
  the base model (adapter disabled; it must match Echo's version-0 accuracy, a check of the two paths).

never at the same time (``--order`` picks which goes first), with the same number of cores and, by
default, the same allocator: TRL's process gets what ``echorl run`` gives its own (jemalloc when the
machine has it; ``--trl-malloc system`` runs TRL on the C library's, as it ships), with the same number of cores: Echo divides
``--cores`` among its processes, TRL's one process gets that many torch threads. The job's manifest is
copied into ``--work-dir`` under the name ``versus-trl`` with its snapshot store there, so ``--fresh``
never touches another run of the same job.

How TRL is configured to match Echo (GRPOConfig): ``num_generations`` = groupSize,
``per_device_train_batch_size`` = Echo's microBatchSize (``--trl-micro-batch``) with
``gradient_accumulation_steps`` = groupSize·batchSize / that, so one generation of groupSize·batchSize
completions (batchSize prompts) makes exactly one optimizer step (``steps_per_generation`` =
accumulation steps, ``num_iterations`` 1). The micro-batch matters: a micro-batch's activations
(kept for the backward pass, every layer, float32) dominate both trainers' peaks, so TRL is given the
micro-batch Echo's trainer uses; ``--trl-micro-batch`` = groupSize·batchSize is TRL with no accumulation (a higher peak, the
same gradients). ``loss_type="dapo"``: the sum of token losses over the whole
generation batch divided by its number of completion tokens, Echo's token-mean (with a micro-batch of the
whole batch ``bnpo`` would be the same); ``scale_rewards="group"`` (TRL divides by std + 1e-4, Echo by
std + 1e-6); ``epsilon`` = clipRange; ``beta`` = klCoef; AdamW (0.9, 0.999), eps 1e-8, no weight decay,
gradient-norm clip 1.0, no warm-up, constant rate (Echo's constants); ``gradient_checkpointing`` as the job
(TRL's default is on); float32 (``bf16``/``fp16`` off); ``top_p`` 1, ``top_k`` 0. What differs by
design: TRL is on-policy (it samples with the weights it trains, ratio 1), Echo's job is Async with Δmax 1
(the worker samples with the previous version; Echo's importance-weight cap then applies, TRL's ``delta``
is left unset); TRL samples with ``model.generate``, Echo's worker with its own KV-cached loop.

    python benchmarks/versus_trl.py                      # the job's maxSteps (24), seed 0
    python benchmarks/versus_trl.py --quick              # 2 steps each: a smoke run
    python benchmarks/versus_trl.py --order trl-first --seed 1 --out benchmarks/results/versus-trl-s1.json

Install TRL once, outside the project's environment (the script says so, and exits with code 2, when it
cannot import it)::

    pip download trl==1.16.0 --no-deps -d /tmp/trl
    pip install --no-deps --target ~/.cache/echorl/trl/1.16.0 /tmp/trl/trl-1.16.0-py3-none-any.whl

Writes ``benchmarks/results/versus-trl.json`` (or ``--out``); the runs' logs and files stay in
``--work-dir`` (default ``runs/versus-trl``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from echo_runtime.runner import memory

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_JOB = ROOT / "examples" / "smollm2.yaml"
TRL_VERSION = "1.16.0"
"""The TRL release this benchmark was written against (``--trl-version``)."""
JOB_NAME = "versus-trl"
"""The name the job runs under here (its own run directory and snapshot store)."""
GOAL_TOTAL = 1.3
"""Echo's whole tree ÷ TRL's peak, at most (issue 34)."""
GOAL_TRAINER = 0.7
"""Echo's trainer process ÷ TRL's peak, at most (issue 34)."""
EXIT_NO_TRL = 2
MIB = 1024.0
INSTALL = """\
Install it outside the project's environment (this benchmark puts it on the TRL process's PYTHONPATH only):
    pip download trl=={version} --no-deps -d /tmp/trl
    pip install --no-deps --target {path} /tmp/trl/trl-{version}-py3-none-any.whl
(TRL's own dependencies — transformers, peft, accelerate, datasets — are already in Echo's environment.)"""


# ---------------------------------------------------------------------------------------------- memory
class Sampler:
    """Samples this process's resident and proportional memory every ``interval_s`` seconds, with
    :class:`echo_runtime.runner.memory.MemoryWatch` (what ``echorl run`` uses for its processes; the
    kernel's own ``VmHWM`` high-water mark is read at each sample too). TRL starts no child process."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.watch = memory.MemoryWatch()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.watch.sample({})
            self._stop.wait(self.interval_s)

    def peak_rss_kib(self) -> int:
        self.watch.sample({})
        return self.watch.peak_kib.get(memory.RUNNER, 0)

    def peak_pss_kib(self) -> int:
        return self.watch.peak_total_pss_kib

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.watch.sample({})


# ---------------------------------------------------------------------------------------------- the job
def write_job(source: Path, work: Path) -> Path:
    """``source``'s EchoJob renamed to :data:`JOB_NAME`, its snapshot store under ``work``: ``work/job.yaml``."""
    docs = [d for d in yaml.safe_load_all(source.read_text(encoding="utf-8")) if d is not None]
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "EchoJob"]
    if len(jobs) != 1:
        raise SystemExit(f"{source}: expected exactly one EchoJob, found {len(jobs)}")
    job = jobs[0]
    job.setdefault("metadata", {})["name"] = JOB_NAME
    storage = job.setdefault("spec", {}).setdefault("storage", {})
    if storage.get("type", "Local") != "Local":
        raise SystemExit(f"{source}: this benchmark runs Echo with a local snapshot store; the job names S3")
    storage["path"] = str((work / "store").resolve())
    work.mkdir(parents=True, exist_ok=True)
    path = work / "job.yaml"
    path.write_text(f"# {source} for benchmarks/versus_trl.py\n" + yaml.safe_dump_all(docs, sort_keys=False))
    return path


def trl_env(trl_path: Path, cores: int, malloc: str = "system") -> dict[str, str]:
    """The environment of the TRL process: TRL first on ``PYTHONPATH``, ``cores`` threads, offline.

    ``malloc`` ``echo``: the allocator ``echorl run`` gives its own processes (jemalloc when the machine
    has it, :mod:`echo_runtime.runner.allocator`), so the two sides are measured on the same one;
    ``system``: the C library's, TRL as it ships.
    """
    from echo_runtime.runner import allocator

    env = dict(os.environ)
    if malloc == "echo":
        env.update(allocator.child_env(env))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(trl_path), env.get("PYTHONPATH", "")) if p)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[key] = str(cores)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def probe_trl(trl_path: Path, cores: int) -> tuple[str | None, str]:
    """``(version, "")`` if ``GRPOTrainer`` imports with ``trl_path`` on the path, else ``(None, why)``."""
    code = "import trl; from trl import GRPOConfig, GRPOTrainer; print(trl.__version__, trl.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=trl_env(trl_path, cores),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return None, lines[-1] if lines else f"exit code {done.returncode}"
    version, _, where = done.stdout.strip().splitlines()[-1].partition(" ")
    if not Path(where).resolve().is_relative_to(trl_path.resolve()):
        return version, f"note: trl {version} was imported from {where}, not from {trl_path}"
    return version, ""


# ---------------------------------------------------------------------------------------------- Echo side
def run_echo(job: Path, work: Path, steps: int, seed: int, cores: int) -> dict[str, Any]:
    run_dir = work / "echo"
    log = work / "echo.log"
    cmd = [
        sys.executable, "-m", "echo_runtime.cli", "run", str(job), "--fresh", "--no-progress",
        "--run-dir", str(run_dir), "--max-steps", str(steps), "--seed", str(seed), "--cores", str(cores),
    ]  # fmt: skip
    print(f"[versus-trl] echo: {' '.join(cmd[1:])}  (log: {log})", flush=True)
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    launched = time.time()
    with log.open("w") as out:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    command_s = time.time() - launched
    if done.returncode != 0 or not (run_dir / "summary.json").is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"echo run failed (exit code {done.returncode}); the end of {log}:\n{tail}")
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    measured = summary.get("memory") or {}
    from echo_runtime.runner import allocator

    measured_allocator = allocator.describe(allocator.child_env(env))
    if not measured.get("measured"):
        raise SystemExit(f"echo run: memory was not measured ({measured.get('reason')})")
    peaks: dict[str, float] = measured["peakRssMiB"]
    t0 = float(json.loads((run_dir / "run.json").read_text())["t0"])
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    trainer = [r for r in records if r.get("kind") == "trainer"]
    last_step = max((float(r["time"]) for r in trainer), default=float("nan"))
    step_s = [float(r["stepSeconds"]) for r in trainer if "stepSeconds" in r]
    total_peaks = sum(peaks.values())
    return {
        "command": cmd[1:],
        "runDir": str(run_dir),
        "allocator": measured_allocator,
        "peakRssMiB": peaks,
        "peakTotalRssMiB": measured["peakTotalRssMiB"],
        "peakTotalPssMiB": measured.get("peakTotalPssMiB"),
        "sumOfPeaksMiB": round(total_peaks, 1),
        "sumOfPeaksWithoutEvaluatorMiB": round(total_peaks - peaks.get("evaluator", 0.0), 1),
        "trainerPeakRssMiB": peaks.get("trainer"),
        "memorySamples": measured.get("samples"),
        "policyVersion": summary.get("policyVersion"),
        "wallClockSeconds": summary.get("wallClockSeconds"),
        "setupSeconds": round(t0 - launched, 2),
        "toLastStepSeconds": round(t0 - launched + last_step, 2),
        # The trainer's own seconds per step (batch wait excluded; generation is the workers'): not TRL's.
        "meanTrainerStepSeconds": sum(step_s) / len(step_s) if step_s else None,
        "commandSeconds": round(command_s, 2),
        "reward": summary.get("reward"),
        "initialHeldoutAccuracy": summary.get("initialHeldoutAccuracy"),
        "finalHeldoutAccuracy": summary.get("finalHeldoutAccuracy"),
        "bestHeldoutAccuracy": summary.get("bestHeldoutAccuracy"),
        "evaluations": summary.get("evaluations"),
        "droppedStale": summary.get("droppedStale"),
    }


# ---------------------------------------------------------------------------------------------- TRL side
def run_trl(
    job: Path,
    work: Path,
    steps: int,
    seed: int,
    cores: int,
    trl_path: Path,
    micro_batch: int | None,
    malloc: str = "system",
) -> dict[str, Any]:
    out = work / "trl.json"
    log = work / "trl.log"
    out.unlink(missing_ok=True)
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--child-trl", str(out), "--job", str(job),
        "--steps", str(steps), "--seed", str(seed), "--cores", str(cores), "--work-dir", str(work),
        "--launched-at", repr(time.time()),
    ]  # fmt: skip
    if micro_batch is not None:
        cmd += ["--trl-micro-batch", str(micro_batch)]
    print(f"[versus-trl] trl: {' '.join(cmd[1:])}  (PYTHONPATH += {trl_path}; log: {log})", flush=True)
    launched = time.time()
    with log.open("w") as f:
        done = subprocess.run(
            cmd,
            cwd=ROOT,
            env=trl_env(trl_path, cores, malloc),
            stdout=f,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0 or not out.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"TRL run failed (exit code {done.returncode}); the end of {log}:\n{tail}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["commandSeconds"] = round(time.time() - launched, 2)
    from echo_runtime.runner import allocator

    result["allocator"] = allocator.describe(trl_env(trl_path, cores, malloc))
    return result


def child_trl(opts: argparse.Namespace) -> int:
    """The TRL process: GRPOTrainer on the job; writes its measurements to ``opts.child_trl``."""
    started = time.time()
    launched = opts.launched_at if opts.launched_at is not None else started
    import torch

    torch.set_num_threads(opts.cores)
    trl = importlib.import_module("trl")
    import datasets
    import peft
    import transformers

    from echo_runtime import spec, tasks
    from echo_runtime.backends import sampling
    from echo_runtime.models import load as model_load
    from echo_runtime.models import prompts, warmup
    from echo_runtime.runner import evaluator
    from echo_runtime.trainer import policy
    from echo_runtime.trainer import step as echo_step

    job = spec.load_job(opts.job)
    algo = job.spec.algorithm
    if job.spec.model.finetune != "LoRA":
        raise SystemExit("this benchmark compares LoRA jobs (spec.model.finetune: LoRA)")
    model_dir = model_load.resolve_spec(job.spec.model, job.spec.task)
    task = tasks.from_spec(job.spec.task)
    style = prompts.PromptStyle.from_task(job.spec.task)
    tokenizer: Any = transformers.AutoTokenizer.from_pretrained(model_dir)
    sizes: Callable[[], dict[str, int]] | None = getattr(task, "sizes", None)
    if sizes is None:
        raise SystemExit(f"task {job.spec.task.name!r} is not finite: this benchmark needs a data-file task")
    n_train = int(sizes()["train"])
    train = list(itertools.islice(task.prompts("train", opts.seed), n_train))
    held_count = min(job.spec.task.heldout_size, int(sizes()["heldout"]))
    heldout = list(itertools.islice(task.prompts("heldout", evaluator.HELDOUT_SEED), held_count))

    def trl_prompt(prompt: prompts.Prompt) -> Any:
        """The prompt as TRL gets it: chat messages (system prompt included) or the rendered text."""
        if not prompts.uses_chat(tokenizer, prompt, style):
            return prompts.render(tokenizer, prompt, style)
        chat = prompts.messages(prompt)
        if style.system_prompt is not None and chat[0]["role"] != "system":
            chat = [{"role": "system", "content": style.system_prompt}, *chat]
        return chat

    rows = [{"prompt": trl_prompt(p.prompt), "problem_index": i} for i, p in enumerate(train)]
    mismatched = 0
    for row, problem in zip(rows, train, strict=True):  # TRL's tokenisation of a prompt against Echo's
        if isinstance(row["prompt"], str):
            ids = tokenizer(text=row["prompt"])["input_ids"]
        else:
            ids = tokenizer.apply_chat_template(
                row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        mismatched += list(ids) != prompts.encode(tokenizer, problem.prompt, style)

    def echo_verifier(completions: Sequence[Any], problem_index: Sequence[int], **_: Any) -> list[float]:
        """Echo's verifier as a TRL reward function (the problem travels in the ``problem_index`` column)."""
        out = []
        for completion, index in zip(completions, problem_index, strict=True):
            if isinstance(completion, str):
                text = completion
            else:
                text = "".join(str(m.get("content", "")) for m in completion if m.get("role") == "assistant")
            out.append(float(task.score(train[int(index)], text).value))
        return out

    per_step = algo.group_size * algo.batch_size
    micro = opts.trl_micro_batch or min(algo.micro_batch_size, per_step)
    if per_step % micro != 0 or micro % algo.group_size != 0:
        raise SystemExit(
            f"--trl-micro-batch {micro} must divide groupSize·batchSize = {per_step} and be a multiple of "
            f"groupSize {algo.group_size} (TRL's generation batch holds whole groups)"
        )
    accumulation = per_step // micro
    if algo.lr_schedule != "Constant":
        raise SystemExit(f"lrSchedule {algo.lr_schedule}: this benchmark maps only Constant onto TRL")
    out_dir = Path(opts.work_dir) / "trl-output"  # save_strategy "no": TRL writes nothing there
    settings: dict[str, Any] = {
        "output_dir": str(out_dir),
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": accumulation,
        "steps_per_generation": accumulation,
        "num_generations": algo.group_size,
        "num_iterations": 1,
        "max_completion_length": algo.sampling.max_new_tokens,
        "temperature": algo.sampling.temperature,
        "top_p": algo.sampling.top_p,
        "top_k": 0,
        "learning_rate": algo.learning_rate,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch",
        "adam_beta1": echo_step.ADAM_BETAS[0],
        "adam_beta2": echo_step.ADAM_BETAS[1],
        "adam_epsilon": echo_step.ADAM_EPS,
        "weight_decay": echo_step.WEIGHT_DECAY,
        "max_grad_norm": echo_step.MAX_GRAD_NORM,
        "beta": algo.objective().kl_coef,
        "epsilon": algo.objective().clip_low,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "mask_truncated_completions": False,
        "gradient_checkpointing": algo.gradient_checkpointing,
        "bf16": False,
        "fp16": False,
        "use_cpu": True,
        "model_init_kwargs": {"dtype": job.spec.model.dtype},
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "max_steps": opts.steps,
        "seed": opts.seed,
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
    }
    config = trl.GRPOConfig(**settings)
    trainer = trl.GRPOTrainer(
        model=model_dir,
        reward_funcs=echo_verifier,
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=policy.lora_config(job.spec.model),
    )
    with Sampler() as sampler:
        t_train = time.time()
        trainer.train()
        train_end = time.time()
    peak_kib, peak_pss_kib = sampler.peak_rss_kib(), sampler.peak_pss_kib()

    model = trainer.model
    eos_ids = sampling.eos_token_ids(model_dir, tokenizer)
    t_eval = time.time()
    trained = warmup.evaluate(
        model, tokenizer, task, heldout, temperature=0.0, max_new_tokens=algo.sampling.max_new_tokens,
        style=style, eos_ids=eos_ids,
    )  # fmt: skip
    with model.disable_adapter():
        base = warmup.evaluate(
            model, tokenizer, task, heldout, temperature=0.0, max_new_tokens=algo.sampling.max_new_tokens,
            style=style, eos_ids=eos_ids,
        )  # fmt: skip
    eval_s = time.time() - t_eval
    logs = [e for e in trainer.state.log_history if "reward" in e]
    result = {
        "trlVersion": trl.__version__,
        "trlFile": trl.__file__,
        "config": {k: v for k, v in settings.items() if k != "output_dir"},
        "lora": {
            "r": job.spec.model.lora.rank,
            "alpha": job.spec.model.lora.alpha,
            "dropout": job.spec.model.lora.dropout,
            "targetModules": list(job.spec.model.lora.target_modules),
        },
        "modelDir": model_dir,
        "threads": torch.get_num_threads(),
        "trainPrompts": len(rows),
        "promptIdsMismatched": mismatched,
        "eosIds": {"trl": list(trainer.eos_token_ids), "echo": sorted(eos_ids)},
        "optimizerSteps": trainer.state.global_step,
        "peakRssMiB": round(peak_kib / MIB, 1),
        "peakPssMiB": round(peak_pss_kib / MIB, 1),
        "memorySamples": sampler.watch.samples,
        "peakAfterEvaluationMiB": round(sampler.peak_rss_kib() / MIB, 1),
        "setupSeconds": round(t_train - launched, 2),
        "trainSeconds": round(train_end - t_train, 2),
        "toLastStepSeconds": round(train_end - launched, 2),
        "meanStepSeconds": (train_end - t_train) / max(1, trainer.state.global_step),  # generation included
        "evaluationSeconds": round(eval_s, 2),
        "finalHeldoutAccuracy": trained.accuracy,
        "finalHeldoutReward": trained.mean_reward,
        "baseHeldoutAccuracy": base.accuracy,
        "heldoutSize": trained.n,
        "examples": [list(e) for e in trained.examples],
        "rewardPerStep": [e.get("reward") for e in logs],
        "completionMeanLengthPerStep": [e.get("completions/mean_length") for e in logs],
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "datasets": datasets.__version__,
            "accelerate": importlib.import_module("accelerate").__version__,
            "trl": trl.__version__,
        },
    }
    Path(opts.child_trl).write_text(json.dumps(result, indent=2) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------- report
def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def compare(echo: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    peak = trl["peakRssMiB"]
    ratios = {
        "echoTotalPssOverTrlPssPeak": ratio(echo["peakTotalPssMiB"], trl["peakPssMiB"]),
        "echoTotalOverTrlPeak": ratio(echo["peakTotalRssMiB"], peak),
        "echoTotalWithoutEvaluatorOverTrlPeak": ratio(echo["sumOfPeaksWithoutEvaluatorMiB"], peak),
        "echoSumOfPeaksOverTrlPeak": ratio(echo["sumOfPeaksMiB"], peak),
        "echoTrainerOverTrlPeak": ratio(echo["trainerPeakRssMiB"], peak),
        "wallClockEchoOverTrl": ratio(echo["toLastStepSeconds"], trl["toLastStepSeconds"]),
    }
    goals = {
        "echoTotalPssOverTrlPssPeak": GOAL_TOTAL,
        "echoTotalOverTrlPeak": GOAL_TOTAL,
        "echoTotalWithoutEvaluatorOverTrlPeak": GOAL_TOTAL,
        "echoTrainerOverTrlPeak": GOAL_TRAINER,
    }
    return {
        "ratios": ratios,
        "goals": {
            k: {"value": value, "atMost": g, "met": value is not None and value <= g}
            for k, g in goals.items()
            for value in [ratios[k]]
        },
        "accuracy": {
            "echoFinal": echo["finalHeldoutAccuracy"],
            "echoBest": echo["bestHeldoutAccuracy"],
            "echoInitial": echo["initialHeldoutAccuracy"],
            "trlFinal": trl["finalHeldoutAccuracy"],
            "trlBase": trl["baseHeldoutAccuracy"],
        },
    }


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(echo: dict[str, Any], trl: dict[str, Any], verdict: dict[str, Any]) -> None:
    print(f"\n{'peak resident memory (MiB)':52} {'MiB':>9}")
    for name, mib in sorted(echo["peakRssMiB"].items()):
        print(f"  echo {name:46} {mib:9.1f}")
    print(f"  {'echo total (peak of the sum at one moment)':50} {echo['peakTotalRssMiB']:9.1f}")
    print(f"  {'echo total, proportional (PSS) at one moment':50} {_fmt(echo['peakTotalPssMiB']):>9}")
    print(f"  {'echo sum of per-process peaks':50} {echo['sumOfPeaksMiB']:9.1f}")
    print(
        f"  {'echo sum of per-process peaks, without evaluator':50} {echo['sumOfPeaksWithoutEvaluatorMiB']:9.1f}"
    )
    print(f"  {'trl GRPOTrainer process, training peak':50} {trl['peakRssMiB']:9.1f}")
    print(f"  {'trl process, proportional (PSS) training peak':50} {_fmt(trl['peakPssMiB']):>9}")
    print(f"  {'trl process after held-out evaluation':50} {trl['peakAfterEvaluationMiB']:9.1f}")
    print(f"\n{'ratio':52} {'value':>9} {'goal':>7}  met")
    for name, value in verdict["ratios"].items():
        goal = verdict["goals"].get(name)
        met = "" if goal is None else ("yes" if goal["met"] else "no")
        print(
            f"  {name:50} {_fmt(value, '.3f'):>9} {'' if goal is None else '≤' + str(goal['atMost']):>7}  {met}"
        )
    print(f"\n{'':52} {'echo':>9} {'trl':>9}")
    rows = [
        ("seconds, launch to last optimizer step", "toLastStepSeconds", ".1f"),
        ("seconds, set-up before training", "setupSeconds", ".1f"),
        ("seconds, whole command", "commandSeconds", ".1f"),
        ("held-out accuracy, final (greedy)", "finalHeldoutAccuracy", ".3f"),
    ]
    for label, key, spec in rows:
        print(f"  {label:50} {_fmt(echo.get(key), spec):>9} {_fmt(trl.get(key), spec):>9}")
    base = (echo.get("initialHeldoutAccuracy"), trl.get("baseHeldoutAccuracy"))
    print(f"  {'held-out accuracy, base model':50} {_fmt(base[0], '.3f'):>9} {_fmt(base[1], '.3f'):>9}")


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--job", type=Path, default=DEFAULT_JOB, help="the EchoJob (default: examples/smollm2.yaml)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps (default: the job's maxSteps)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 steps each: a smoke run")
    parser.add_argument("--order", choices=("echo-first", "trl-first"), default="echo-first")
    parser.add_argument(
        "--cores", type=int, default=os.cpu_count() or 1, help="cores for each side (default: all)"
    )
    parser.add_argument("--trl-version", default=TRL_VERSION, help="names the default --trl-path")
    parser.add_argument("--trl-path", type=Path, default=None, help="where TRL is installed (pip --target)")
    parser.add_argument(
        "--trl-micro-batch", type=int, default=None,
        help="TRL's per_device_train_batch_size (default: the job's microBatchSize; groupSize·batchSize: no accumulation)",
    )  # fmt: skip
    parser.add_argument(
        "--trl-malloc", choices=("echo", "system"), default="echo",
        help="TRL's allocator: 'echo', the one echorl run gives its processes (jemalloc when installed; "
        "the default, so both sides are measured on the same allocator), or 'system', TRL as it ships",
    )  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "versus-trl")
    parser.add_argument("--out", type=Path, default=RESULTS / "versus-trl.json")
    parser.add_argument("--child-trl", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--launched-at", type=float, default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child_trl is not None:
        return child_trl(opts)

    from echo_runtime import spec

    work: Path = opts.work_dir.resolve()
    source: Path = opts.job.resolve()
    steps = 2 if opts.quick else opts.steps or spec.load_job(source).spec.algorithm.max_steps
    if steps < 1 or opts.cores < 1:
        parser.error("--steps and --cores must be ≥ 1")
    trl_path: Path = (
        opts.trl_path or Path.home() / ".cache" / "echorl" / "trl" / opts.trl_version
    ).expanduser()
    version, note = probe_trl(trl_path, opts.cores)
    if version is None:
        print(f"versus-trl: TRL cannot be imported from {trl_path}: {note}", file=sys.stderr)
        print(INSTALL.format(version=opts.trl_version, path=trl_path), file=sys.stderr)
        return EXIT_NO_TRL
    print(f"[versus-trl] trl {version} from {trl_path}" + (f" ({note})" if note else ""), flush=True)
    job = write_job(source, work)
    sides: dict[str, Callable[[], dict[str, Any]]] = {
        "echo": lambda: run_echo(job, work, steps, opts.seed, opts.cores),
        "trl": lambda: run_trl(
            job, work, steps, opts.seed, opts.cores, trl_path, opts.trl_micro_batch, opts.trl_malloc
        ),
    }
    order = ["echo", "trl"] if opts.order == "echo-first" else ["trl", "echo"]
    results = {name: sides[name]() for name in order}  # one after the other, never at once
    echo, trl = results["echo"], results["trl"]
    verdict = compare(echo, trl)
    import torch
    import transformers

    report: dict[str, Any] = {
        "benchmark": "versus-trl",
        "job": str(source.relative_to(ROOT) if source.is_relative_to(ROOT) else source),
        "steps": steps,
        "seed": opts.seed,
        "order": opts.order,
        "cores": opts.cores,
        "trlMalloc": opts.trl_malloc,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {
            **trl["versions"],
            "echoTorch": torch.__version__,
            "echoTransformers": transformers.__version__,
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain")),
        **verdict,
        "echo": echo,
        "trl": trl,
    }
    print_table(echo, trl, verdict)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"→ {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
