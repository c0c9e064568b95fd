"""``echorl bench fidelity``: sample from real backends at one policy version and measure their fidelity.

The I/O shell around :mod:`.fidelity`. One run:

1. resolve the model (``echorl:tiny`` builds Echo's own tiny model into the cache);
2. make policy version 1 *the trainer's way*: the trainer's :func:`~echo_runtime.trainer.policy.load_policy`
   (LoRA as the manifest's defaults configure it), its adapter set to seeded random, clearly nonzero
   ``A`` and ``B``, exported with :meth:`~echo_runtime.trainer.policy.TrainablePolicy.export_snapshot` —
   the files a trainer publishes (``--snapshot none`` compares the base model instead);
3. for each backend (``transformers`` on CPU or CUDA, ``mlx``, ``vllm`` where it can run): apply the
   snapshot, sample ``n`` completions of the same ``prompts`` prompts of the task (seeded);
4. recompute every sampled token's log-prob with the trainer's own code
   (:func:`~echo_runtime.trainer.policy.pack` + :func:`~echo_runtime.trainer.policy.completion_logprobs`
   on the policy that exported the snapshot, prompt ids from the trainer's tokenisation) and compare with
   the behaviour log-probs the backend reported: mean/max ``|Δ|`` per token and the sequence-level KL;
5. for each pair of backends: score each one's samples with the other (``score_logprobs``) and compare,
   both directions pooled — the issue's target is transformers-CPU vs mlx mean ``|Δ|`` ≤ 1e-4 — and
   test whether their reward distributions differ (:func:`.fidelity.compare_samples`) — and, as more
   sensitive checks of the samplers, their completion lengths and the trainer's log-likelihood of the
   sampled sequences (same policy, same sampler ⇒ same distributions).

A backend that cannot run here (a missing package, no CUDA) is reported as skipped with the reason,
never silently dropped.
"""

from __future__ import annotations

import dataclasses
import itertools
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from echo_runtime.bench import fidelity
from echo_runtime.tasks.base import Split

TARGET_PAIR = ("transformers", "mlx")
TARGET_MEAN_ABS = 1e-4
"""Issue 8: transformers-CPU vs mlx mean per-token |Δ log-prob| on the tiny model."""


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """A backend name and its device, as ``--backends`` spells it: ``transformers``, ``transformers:cuda``."""

    name: str
    device: str

    @property
    def label(self) -> str:
        """The name alone on its default device (vllm: cuda, others: cpu), else ``name:device``."""
        return self.name if self.device == _default_device(self.name) else f"{self.name}:{self.device}"


def _default_device(name: str) -> str:
    return "cuda" if name == "vllm" else "cpu"


def parse_backends(text: str) -> list[BackendChoice]:
    """``"transformers,mlx,transformers:cuda"`` → choices (device defaults: cpu, vllm cuda)."""
    from echo_runtime import backends

    out: list[BackendChoice] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, device = item.partition(":")
        backends.check_backend(name)
        choice = BackendChoice(name, device or _default_device(name))
        if choice in out:
            raise ValueError(f"backend {item!r} is listed twice")
        out.append(choice)
    if not out:
        raise ValueError("no backends given; backends: transformers, mlx, vllm")
    return out


@dataclasses.dataclass(frozen=True)
class Options:
    model: str = "echorl:tiny"
    warmup_steps: int = 0
    """Supervised warm-up of a built-in model first (so rewards are not all zero)."""
    backends: tuple[BackendChoice, ...] = (BackendChoice("transformers", "cpu"), BackendChoice("mlx", "cpu"))
    prompts: int = 64
    n: int = 4
    task: str = "arithmetic"
    split: Split = "heldout"
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    snapshot: str = "lora"
    """``lora``: a random nonzero adapter exported by the trainer's policy (version 1); ``none``: the base."""
    lora_scale: float = 0.03
    """Standard deviation of the random adapter weights: large enough that version 1 is clearly not the
    base model (``snapshotEffect``), small enough that a warmed-up model still solves some tasks."""
    threads: int = 1
    resamples: int = 10_000


@dataclasses.dataclass
class _Sampled:
    choice: BackendChoice
    backend: Any
    samples: list[Any]
    problems: list[Any]
    seconds: float
    recomputed: list[list[float]] = dataclasses.field(default_factory=list)
    """The trainer's log-probs of each sample's tokens."""


def run(options: Options, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """One fidelity run; returns the JSON report (see the module docstring)."""
    if options.prompts * options.n < 2:
        raise ValueError(
            f"prompts × n must be at least 2 (two-sample tests need two samples per backend), "
            f"got {options.prompts} × {options.n}"
        )
    import torch

    from echo_runtime import backends as backend_registry
    from echo_runtime.backends import base, sampling
    from echo_runtime.models import load as model_load
    from echo_runtime.spec.policy import Model, Task
    from echo_runtime.tasks import get_task
    from echo_runtime.trainer import policy as trainer_policy

    torch.set_num_threads(options.threads)
    task = get_task(options.task)
    problems = list(itertools.islice(task.prompts(options.split, options.seed), options.prompts))
    model_spec = Model(path=options.model, warmup_steps=options.warmup_steps)
    model_dir = model_load.resolve_spec(model_spec, Task(name=options.task))
    log(f"model {options.model} → {model_dir}")
    policy = trainer_policy.load_policy(model_spec, model_dir=model_dir)
    policy.model.eval()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="echorl-fidelity-") as scratch:
        snapshot = _make_snapshot(policy, options, Path(scratch) / "v1")
        tokenizer = model_load.load_tokenizer(model_dir)
        params = base.SamplingParams(
            temperature=options.temperature,
            top_p=options.top_p,
            max_new_tokens=options.max_new_tokens,
            seed=options.seed,
        )
        sampled: list[_Sampled] = []
        skipped: dict[str, str] = {}
        for choice in options.backends:
            reason = _unavailable(choice, backend_registry)
            if reason:
                skipped[choice.label] = reason
                log(f"{choice.label}: skipped ({reason})")
                continue
            backend = backend_registry.create_backend(
                choice.name, model_dir, device=choice.device, dtype="float32", threads=options.threads
            )
            if snapshot is not None:
                backend.apply_snapshot(1, snapshot, "lora")
            t = time.perf_counter()
            groups = backend.sample([p.prompt for p in problems], options.n, params)
            seconds = time.perf_counter() - t
            flat = [s for group in groups for s in group]
            log(f"{choice.label}: {len(flat)} samples in {seconds:.1f}s")
            sampled.append(
                _Sampled(choice, backend, flat, [p for p in problems for _ in range(options.n)], seconds)
            )
        if not sampled:
            raise RuntimeError(f"no backend could run here: {skipped}")

        def encode(prompt: str) -> list[int]:
            return sampling.encode_prompt(tokenizer, prompt)

        report_backends: dict[str, Any] = {}
        for s in sampled:
            s.recomputed = _trainer_logprobs(
                policy, [encode(p.prompt) for p in s.problems], s.samples, options.temperature
            )
            report_backends[s.choice.label] = _versus_trainer(s, encode, task)
        effect = _snapshot_effect(policy, sampled[0], options) if snapshot is not None else None
        pairs = {
            f"{a.choice.label}~{b.choice.label}": _pair(a, b, options, task)
            for a, b in itertools.combinations(sampled, 2)
        }
    target = _target(pairs)
    return {
        "model": options.model,
        "warmupSteps": options.warmup_steps,
        "modelDir": str(model_dir),
        "task": options.task,
        "snapshot": options.snapshot,
        "loraScale": options.lora_scale if options.snapshot == "lora" else None,
        "policyVersion": 1 if options.snapshot == "lora" else 0,
        "prompts": options.prompts,
        "n": options.n,
        "sampling": {
            "temperature": options.temperature,
            "topP": options.top_p,
            "maxNewTokens": options.max_new_tokens,
            "seed": options.seed,
        },
        "backends": report_backends,
        "skipped": skipped,
        "pairs": pairs,
        "snapshotEffect": effect,
        "target": target,
        "seconds": time.perf_counter() - started,
    }


def _unavailable(choice: BackendChoice, registry: Any) -> str | None:
    missing = registry.missing_packages(choice.name)
    if missing:
        return f"missing packages: {', '.join(missing)}"
    if choice.device.startswith("cuda") or choice.name == "vllm":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device"
    return None


def _make_snapshot(policy: Any, options: Options, out: Path) -> Path | None:
    """Version 1: the trainer's LoRA adapter with seeded random A and B, exported as a trainer publishes it."""
    if options.snapshot == "none":
        return None
    if options.snapshot != "lora":
        raise ValueError(f"snapshot: must be lora or none, got {options.snapshot!r}")
    import torch

    generator = torch.Generator().manual_seed(options.seed + 1)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * options.lora_scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        policy.export_snapshot(out)
    return out


def _trainer_logprobs(
    policy: Any,
    prompt_ids: Sequence[Sequence[int]],
    samples: Sequence[Any],
    temperature: float,
    rows: int = 64,
) -> list[list[float]]:
    """The trainer's recomputation: right-padded batches through the policy, as a step computes them."""
    import torch

    from echo_runtime.rollout import Rollout
    from echo_runtime.trainer import policy as trainer_policy

    out: list[list[float]] = []
    for start in range(0, len(samples), rows):
        chunk = samples[start : start + rows]
        rollouts = [
            Rollout(
                prompt_ids=tuple(p),
                completion_ids=tuple(s.completion_ids),
                logprobs=tuple(s.logprobs),
                reward=0.0,
                policy_version=1,
            )
            for p, s in zip(prompt_ids[start : start + rows], chunk, strict=True)
        ]
        packed = trainer_policy.pack(rollouts, policy.pad_id)
        with torch.no_grad():
            values = trainer_policy.completion_logprobs(policy.model, packed, temperature)
        out.extend(values[i, : len(s.completion_ids)].tolist() for i, s in enumerate(chunk))
    return out


def _versus_trainer(s: _Sampled, encode: Callable[[str], list[int]], task: Any) -> dict[str, Any]:
    """A backend's reported behaviour log-probs against the trainer's recomputation (``s.recomputed``)."""
    trainer_prompts = [encode(p.prompt) for p in s.problems]
    differing = sum(tuple(t) != tuple(x.prompt_ids) for t, x in zip(trainer_prompts, s.samples, strict=True))
    mismatch = fidelity.logprob_mismatch([list(x.logprobs) for x in s.samples], s.recomputed)
    rewards = _rewards(s, task)
    return {
        "device": s.backend.device,
        "dtype": s.backend.dtype,
        "samples": len(s.samples),
        "tokens": sum(len(x.completion_ids) for x in s.samples),
        "sampleSeconds": s.seconds,
        "promptTokenizationDiffers": differing,
        "vsTrainer": mismatch.to_mapping(),
        "rewardMean": sum(rewards) / len(rewards),
        "meanCompletionTokens": sum(len(x.completion_ids) for x in s.samples) / len(s.samples),
    }


def _rewards(s: _Sampled, task: Any) -> list[float]:
    return [float(task.score(p, x.text).value) for p, x in zip(s.problems, s.samples, strict=True)]


def _pair(a: _Sampled, b: _Sampled, options: Options, task: Any) -> dict[str, Any]:
    """Each backend's samples scored by the other (pooled), and their reward and length distributions."""
    t = options.temperature
    a_by_b = [b.backend.score_logprobs(x.prompt_ids, x.completion_ids, t) for x in a.samples]
    b_by_a = [a.backend.score_logprobs(x.prompt_ids, x.completion_ids, t) for x in b.samples]
    reported = [list(x.logprobs) for x in a.samples] + [list(x.logprobs) for x in b.samples]
    mismatch = fidelity.logprob_mismatch(reported, a_by_b + b_by_a)
    rewards = fidelity.compare_samples(
        _rewards(a, task), _rewards(b, task), resamples=options.resamples, seed=options.seed
    )
    lengths = fidelity.compare_samples(
        [float(len(x.completion_ids)) for x in a.samples],
        [float(len(x.completion_ids)) for x in b.samples],
        resamples=options.resamples,
        seed=options.seed,
    )
    # The same policy sampled alike gives the same distribution of sequence log-likelihoods (trainer's).
    likelihoods = fidelity.compare_samples(
        [sum(v) for v in a.recomputed],
        [sum(v) for v in b.recomputed],
        resamples=options.resamples,
        seed=options.seed,
    )
    return {
        "logprobs": mismatch.to_mapping(),
        "rewards": rewards.to_mapping(),
        "completionLengths": lengths.to_mapping(),
        "sequenceLogprobs": likelihoods.to_mapping(),
    }


def _snapshot_effect(policy: Any, s: _Sampled, options: Options) -> dict[str, Any]:
    """How far version 1 is from the base on the same tokens: guards the comparison against vacuity."""
    trainer_prompts = [list(x.prompt_ids) for x in s.samples]
    with policy.model.disable_adapter():
        base = _trainer_logprobs(policy, trainer_prompts, s.samples, options.temperature)
    return fidelity.logprob_mismatch([list(x.logprobs) for x in s.samples], base).to_mapping()


def _target(pairs: dict[str, Any]) -> dict[str, Any]:
    name = next((k for k in pairs if sorted(k.split("~")) == sorted(TARGET_PAIR)), None)
    value = pairs[name]["logprobs"]["meanAbs"] if name else None
    return {
        "pair": "~".join(TARGET_PAIR),
        "meanAbsBound": TARGET_MEAN_ABS,
        "meanAbs": value,
        "met": None if value is None else value <= TARGET_MEAN_ABS,
    }


def table(report: dict[str, Any]) -> str:
    """The report as plain-text tables: each backend vs the trainer, then each pair."""
    lines = [
        f"model {report['model']}, policy version {report['policyVersion']} ({report['snapshot']}), "
        f"{report['prompts']} prompts × {report['n']}, T={report['sampling']['temperature']}",
        "",
        f"{'backend':22s} {'samples':>7s} {'tokens':>7s} {'mean|Δ| vs trainer':>19s} {'max|Δ|':>9s} "
        f"{'KL(seq)':>9s} {'reward':>7s}",
    ]
    for name, b in report["backends"].items():
        m = b["vsTrainer"]
        lines.append(
            f"{name:22s} {b['samples']:7d} {b['tokens']:7d} {m['meanAbs']:19.2e} {m['maxAbs']:9.2e} "
            f"{m['klSeq']:9.2e} {b['rewardMean']:7.3f}"
        )
    for name, reason in report["skipped"].items():
        lines.append(f"{name:22s} skipped: {reason}")
    if report["pairs"]:
        lines += [
            "",
            f"{'pair':30s} {'mean|Δ|':>9s} {'max|Δ|':>9s} {'KL(seq)':>9s} {'Δreward [95% CI]':>24s} "
            f"{'perm p':>7s} {'MW p':>7s} {'KS p':>7s} {'len p':>7s} {'logL p':>7s}",
        ]
        for name, p in report["pairs"].items():
            m, r = p["logprobs"], p["rewards"]
            band = f"[{r['ci95'][0]:+.3f},{r['ci95'][1]:+.3f}]" if r["ci95"] else "[n < 2]"
            ci = f"{r['difference']:+.3f} {band}"
            lines.append(
                f"{name:30s} {m['meanAbs']:9.2e} {m['maxAbs']:9.2e} {m['klSeq']:9.2e} {ci:>24s} "
                f"{r['permutationP']:7.3f} {r['mannWhitneyP']:7.3f} {r['ksP']:7.3f} "
                f"{p['completionLengths']['mannWhitneyP']:7.3f} {p['sequenceLogprobs']['mannWhitneyP']:7.3f}"
            )
        lines.append(
            "(p-values: rewards by permutation, Mann-Whitney, KS; lengths and trainer log-likelihood "
            "of the samples by Mann-Whitney)"
        )
    target = report["target"]
    if target["meanAbs"] is not None:
        verdict = "met" if target["met"] else "NOT met"
        lines += [
            "",
            f"target {target['pair']} mean|Δ| ≤ {target['meanAbsBound']:g}: {target['meanAbs']:.2e} ({verdict})",
        ]
    if report.get("snapshotEffect"):
        lines.append(
            f"(version 1 vs the base model on the same tokens: mean|Δ| {report['snapshotEffect']['meanAbs']:.2e})"
        )
    return "\n".join(lines)
