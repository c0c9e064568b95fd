"""What is trained and how: model, task, GRPO algorithm, and the sync policy with Δmax.

Vocabulary (DESIGN.md): the *policy version* ``v`` is the number of optimizer steps applied. A rollout
produced by version ``v`` and consumed by the optimizer step that turns ``t`` into ``t+1`` has
*staleness* ``t - v``. ``maxStaleness`` (Δmax) bounds it: no optimizer step ever consumes a rollout
with staleness > Δmax. Δmax = 0 is on-policy.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from echo_runtime.spec.base import LOCAL_DEFAULT, Bool, Int, Number, SpecModel, cel
from echo_runtime.spec.dataset import Dataset


class LoRA(SpecModel):
    """Low-rank adapter settings (peft ``LoraConfig``)."""

    rank: Int = Field(default=16, ge=1, le=1024)
    """Adapter rank r."""
    alpha: Number = Field(default=32.0, gt=0)
    """Scaling numerator: the update is scaled by alpha / rank."""
    dropout: Number = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter's input."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
    )
    """Names of the linear modules that get adapters."""


class Model(SpecModel):
    """The policy's base model and how it is fine-tuned."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "self == oldSelf",
                "model is immutable once the job exists: its snapshots belong to this base model and "
                "adapter shape; create a new EchoJob to train another model",
            )
        )
    )

    path: str = Field(default="echorl:tiny", min_length=1, json_schema_extra=LOCAL_DEFAULT)
    """A local Hugging Face directory, a hub id (``Qwen/Qwen3-0.6B``), or ``echorl:tiny`` /
    ``echorl:small`` for the Qwen3-architecture models Echo builds itself (``echorl model init``).
    Required in a cluster; ``echorl run`` defaults it to ``echorl:tiny``."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype for training and inference."""
    finetune: Literal["LoRA", "Full"] = "LoRA"
    """``LoRA`` publishes only the adapter per version; ``Full`` publishes the whole state dict."""
    lora: LoRA = Field(default_factory=LoRA)
    """Adapter settings; used when ``finetune`` is ``LoRA``."""
    warmup_steps: Int = Field(default=0, ge=0)
    """Supervised warm-up steps on task references before RL (built-in models only); 0 = none."""
    seed: Int = Field(default=0, ge=0)
    """Seed for building and warming up a built-in model."""


class Task(SpecModel):
    """The prompt source and its verifier."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "(self.name == 'dataset') == has(self.dataset)",
                "the dataset task needs spec.task.dataset, and only the dataset task takes it",
                ".dataset",
            ),
        )
    )

    name: str = Field(default="arithmetic", min_length=1, pattern=r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")
    """A built-in task (``arithmetic``, ``knights_knaves``, ``sokoban``, ``math``, ``dataset``), a task
    installed under the ``echorl.tasks`` entry-point group, or ``module:function``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Task options, passed to the task's constructor."""
    dataset: Dataset | None = None
    """The ``dataset`` task's files, fields, held-out split and rewards (required by it, refused by others)."""
    prompt_format: Literal["Auto", "Chat", "Raw"] = "Auto"
    """How prompts reach the model: ``Chat`` through the tokenizer's chat template (text becomes one
    user message), ``Raw`` as plain text, ``Auto`` = ``Chat`` when the tokenizer has a chat template. The
    same rendering is used by every worker, the trainer, the evaluator and the warm-up."""
    system_prompt: str | None = None
    """A system message put before every prompt (chat), or text before it (raw)."""
    heldout_size: Int = Field(default=200, ge=1, le=100_000)
    """Number of held-out prompts (never used in training) for evaluation."""
    eval_every: Int = Field(default=10, ge=0)
    """Evaluate held-out accuracy every N policy versions (and the starting and final ones); ``0``
    turns evaluation off: ``echorl run`` starts no evaluator process (one model less in memory) and
    reports no held-out accuracy."""

    @model_validator(mode="after")
    def _dataset_settings(self) -> Task:
        if self.name == "dataset" and self.dataset is None:
            raise ValueError("dataset: the dataset task needs spec.task.dataset (at least its path)")
        if self.name != "dataset" and self.dataset is not None:
            raise ValueError(f"dataset: only the dataset task takes it, not {self.name!r}")
        if self.name == "dataset" and self.options:
            raise ValueError(
                f"options: the dataset task takes its settings from spec.task.dataset, got options {sorted(self.options)}"
            )
        return self

    def task_options(self) -> dict[str, Any]:
        """What the task's constructor gets: ``options``, or for the dataset task its ``dataset`` settings."""
        if self.dataset is not None:
            return self.dataset.model_dump(mode="python")
        return dict(self.options)


class Sampling(SpecModel):
    """Generation settings every worker uses."""

    temperature: Number = Field(default=1.0, gt=0, le=10)
    """Sampling temperature."""
    top_p: Number = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest token set with this much probability."""
    max_new_tokens: Int = Field(default=32, ge=1, le=32_768)
    """Longest completion, in tokens."""


class Algorithm(SpecModel):
    """GRPO with a PPO-clip loss on the ratio to the behaviour policy."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                # Only once learningRate is itself valid: a non-positive one is reported on its own field.
                "self.learningRate <= 0.0 || self.minLearningRate <= self.learningRate",
                "minLearningRate must be ≤ learningRate: a schedule decays from learningRate down to it",
                ".minLearningRate",
            ),
        )
    )

    name: Literal["GRPO"] = "GRPO"
    """The algorithm; GRPO is the one implemented."""
    group_size: Int = Field(default=8, ge=2, le=1024)
    """n: completions sampled per prompt; advantages are normalised within a group."""
    batch_size: Int = Field(default=8, ge=1, le=65_536)
    """Groups (prompts) consumed per optimizer step."""
    micro_batch_size: Int = Field(default=8, ge=1)
    """Rollouts per forward/backward pass; gradients are accumulated over the batch."""
    learning_rate: Number = Field(default=1e-4, gt=0, le=1)
    """AdamW learning rate (the peak, when ``lrSchedule`` decays it)."""
    lr_schedule: Literal["Constant", "Linear", "Cosine"] = "Constant"
    """How the learning rate moves over ``maxSteps``: ``Constant``; or from ``learningRate`` at the first
    step down to ``minLearningRate`` at step ``maxSteps``, in a straight line (``Linear``) or along a half
    cosine (``Cosine``). The rate of a step depends only on its version, so a resumed run continues the
    same curve."""
    min_learning_rate: Number = Field(default=0.0, ge=0, le=1)
    """Where ``Linear`` and ``Cosine`` end; must not exceed ``learningRate``; unused by ``Constant``."""
    clip_range: Number = Field(default=0.2, gt=0, le=1)
    """ε of the PPO-clip objective."""
    kl_coef: Number = Field(default=0.0, ge=0)
    """β of the KL penalty to the reference (base) policy; 0 disables it."""
    importance_weight_cap: Number = Field(default=2.0, ge=1)
    """Truncation cap of per-token importance weights for stale or mismatched rollouts."""
    max_steps: Int = Field(default=100, ge=1)
    """Optimizer steps (policy versions) to train."""
    sampling: Sampling = Field(default_factory=Sampling)
    """Generation settings every worker uses (and the evaluator: its greedy completions get
    ``maxNewTokens`` too)."""
    gradient_checkpointing: Bool = False
    """Recompute the model's activations during the backward pass instead of keeping them: less trainer
    memory for longer sequences, at about a third more compute per step."""
    seed: Int = Field(default=0, ge=0)
    """Seed of prompt order, sampling and initialisation."""

    @model_validator(mode="after")
    def _consistent(self) -> Algorithm:
        if self.min_learning_rate > self.learning_rate:
            raise ValueError(
                f"minLearningRate: must be ≤ learningRate ({self.learning_rate:g}), got {self.min_learning_rate:g}"
            )
        return self


class Retention(SpecModel):
    """How many snapshots and checkpoints the store keeps."""

    keep_last: Int = Field(default=4, ge=1)
    """Newest snapshots kept (plus any pinned by readers still using them)."""
    checkpoint_keep_last: Int = Field(default=2, ge=1)
    """Newest trainer checkpoints kept."""


COLOCATED_IN_CLUSTER = (
    "mode Colocated is local-only (`echorl run`): it has no coordinator or workers to reconcile; "
    "in a cluster use Sequential with maxStaleness 0 for on-policy training"
)


class SyncPolicySpec(SpecModel):
    """How rollouts and policy versions are kept in step, and the staleness bound Δmax."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                # Only once maxStaleness is itself valid: a negative one is reported on its own field.
                "self.maxStaleness < 0 || self.refreshThreshold <= self.maxStaleness",
                "refreshThreshold must be ≤ maxStaleness: a worker may not generate with a version "
                "older than Δmax allows",
                ".refreshThreshold",
            ),
            (
                "self.mode == 'Async' || !has(self.bufferSize)",
                "bufferSize is only allowed in Async mode (Sequential and Colocated have no replay buffer)",
                ".bufferSize",
            ),
            ("self.mode != 'Colocated'", COLOCATED_IN_CLUSTER, ".mode"),
            (
                "self.mode != 'Colocated' || self.refreshThreshold == 0",
                "refreshThreshold must be 0 in Colocated mode: one process samples with the weights it trains",
                ".refreshThreshold",
            ),
        )
    )

    mode: Literal["Sequential", "Async", "Colocated"] = "Async"
    """``Sequential``: the trainer asks for a batch at version t and workers load t first.
    ``Async``: workers generate continuously into a replay buffer; the trainer pulls at its pace.
    ``Colocated``: the baseline without a swarm (verl's default arrangement): one process holds one
    model and alternates sampling a batch and training on it — no coordinator, no workers, and every
    consumed rollout has staleness 0. Local-only (``echorl run``): a CEL rule refuses it in a cluster.
    ``bufferSize`` and a non-zero ``refreshThreshold`` are forbidden, as in Sequential."""
    max_staleness: Int = Field(default=1, ge=0, le=1024)
    """Δmax: no optimizer step consumes a rollout with staleness (t − policy version) above this."""
    stale_action: Literal["Drop", "ImportanceWeight"] = "Drop"
    """Δmax is absolute: a group whose staleness would exceed it is always dropped and counted
    (``droppedStale``). ``ImportanceWeight`` additionally applies truncated importance weights
    (cap ``importanceWeightCap``) to the off-policy groups *within* the bound (counted as
    ``weightedStale``); ``Drop`` consumes them with the plain PPO ratio to the behaviour log-probs."""
    refresh_threshold: Int = Field(default=0, ge=0)
    """Sequential: a worker whose loaded version is within this many versions of t may generate
    without reloading; must not exceed ``maxStaleness``."""
    buffer_size: Int | None = Field(default=None, ge=1)
    """Async only: replay-buffer capacity in groups (default 2 × batchSize); leasing pauses when full."""
    max_logprob_mismatch: Number = Field(default=0.1, gt=0, le=100)
    """Trust bound, in nats: before training on a group of staleness 0, the trainer recomputes the
    log-probs of ``logprobChecksPerGroup`` of its rollouts and compares them with the behaviour log-probs
    the worker sent; a worker whose mean |Δ log-prob| per token exceeds this is quarantined (its rollouts
    dropped and refused, counted, shown in status). Honest backends differ by ≤ 1e-6 in float32 and by
    about 1e-3–1e-2 in bfloat16 (docs/coordinator.md)."""
    logprob_checks_per_group: Int = Field(default=1, ge=0, le=1024)
    """Rollouts of each staleness-0 group the trainer re-scores before training on it, chosen at random
    so a worker cannot tell which; 0 turns the check off."""
    retention: Retention = Field(default_factory=Retention)
    """How many snapshots and checkpoints the store keeps."""

    @model_validator(mode="after")
    def _consistent(self) -> SyncPolicySpec:
        if self.refresh_threshold > self.max_staleness:
            raise ValueError(
                f"refreshThreshold: must be ≤ maxStaleness ({self.max_staleness}), got {self.refresh_threshold}"
            )
        if self.mode != "Async" and self.buffer_size is not None:
            raise ValueError(f"bufferSize: only allowed in Async mode ({self.mode} has no replay buffer)")
        if self.mode == "Colocated" and self.refresh_threshold != 0:
            raise ValueError(
                "refreshThreshold: must be 0 in Colocated mode (one process samples with the weights it "
                f"trains), got {self.refresh_threshold}"
            )
        return self
