"""What is trained and how: model, task, GRPO algorithm, and the sync policy with Δmax.

Vocabulary (DESIGN.md): the *policy version* ``v`` is the number of optimizer steps applied. A rollout
produced by version ``v`` and consumed by the optimizer step that turns ``t`` into ``t+1`` has
*staleness* ``t - v``. ``maxStaleness`` (Δmax) bounds it: no optimizer step ever consumes a rollout
with staleness > Δmax. Δmax = 0 is on-policy.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from echo_runtime.spec import objectives
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
    """A built-in task (``arithmetic``, ``knights_knaves``, ``sokoban``, ``math``, ``dataset``,
    ``reasoning_gym``), a task installed under the ``echorl.tasks`` entry-point group, or
    ``module:function``."""
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
    reward_weight: Number = Field(default=1.0, ge=0)
    """The verifier's weight in the reward when ``spec.rewardModels`` adds model rewards (the weighted
    mean of all); 0 leaves the reward to the models (held-out accuracy still uses the verifier)."""
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

    @model_validator(mode="after")
    def _known_task(self) -> Task:
        # Unknown options of a built-in, bad values, a misspelt name: refused wherever a manifest is read
        # (echorl validate, echorl run, the operator's InvalidSpec), not when the coordinator starts.
        from echo_runtime.tasks import registry

        try:
            registry.check(self.name, self.options)
        except ValueError as exc:
            raise ValueError(
                f"{'options' if self.name in registry.BUILTIN_TASKS else 'name'}: {exc}"
            ) from None
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


class RolloutCorrection(SpecModel):
    """Correction of the gap between the behaviour policy ``μ`` (the backend that sampled) and ``π_θ``."""

    level: objectives.ImportanceLevel = "Token"
    """``Token``: each token's importance weight ``π_θ/μ`` is truncated at ``importanceWeightCap``
    (PPO's clip acts on that ratio); ``Sequence``: every token of a completion is weighted by
    ``min(Π_t π_θ/μ, importanceWeightCap)``, the sequence-level truncated IS weight."""
    rejection: objectives.Rejection = "Off"
    """Mask out of the loss the tokens (``Token``) or whole completions (``Sequence``, by the geometric
    mean of their ratios) whose ratio ``π_θ/μ`` lies outside ``[rejectionLow, rejectionHigh]`` (IcePop).
    A masked token keeps its place in the averaging, with loss 0."""
    rejection_low: Number = Field(default=0.5, gt=0, le=1)
    """Lower edge of the band."""
    rejection_high: Number = Field(default=5.0, ge=1)
    """Upper edge of the band (the defaults are IcePop's ``[0.5, 5]``)."""


class Overlong(SpecModel):
    """What happens to a completion that the length budget ``maxNewTokens`` cut off."""

    mask_truncated: Bool | None = None
    """Leave completions whose finish reason is ``length`` out of the loss (their advantages still count in
    their group's statistics). Unset: the preset's (off)."""
    buffer: Int | None = Field(default=None, ge=0)
    """DAPO's soft overlong punishment: over the last ``buffer`` tokens of the budget the reward falls
    linearly by up to ``penaltyFactor``; 0 turns it off. Unset: the preset's (20 % of ``maxNewTokens``
    for DAPO, else 0)."""
    penalty_factor: Number | None = Field(default=None, ge=0)
    """The penalty at the budget itself. Unset: the preset's (1.0)."""


class DynamicSampling(SpecModel):
    """DAPO's dynamic sampling: groups whose rewards are all equal are kept out of batches."""

    enabled: Bool | None = None
    """Filter groups without signal (every reward equal) before they reach a batch; counted as
    ``filteredGroups``. Unset: the preset's (on for DAPO)."""
    set_aside_after: Int = Field(default=2, ge=0)
    """A prompt whose last this-many groups were all filtered is skipped once, the next time the prompt
    stream offers it (counted as ``setAsidePrompts``); 0 never sets a prompt aside."""


class Algorithm(SpecModel):
    """The RL objective (a named preset, overridable field by field) and the optimizer's settings."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                # Only once learningRate is itself valid: a non-positive one is reported on its own field.
                "self.learningRate <= 0.0 || self.minLearningRate <= self.learningRate",
                "minLearningRate must be ≤ learningRate: a schedule decays from learningRate down to it",
                ".minLearningRate",
            ),
            (
                "(has(self.advantageEstimator) ? !self.advantageEstimator.startsWith('REINFORCEPP') "
                ": self.preset != 'REINFORCEPP') || !has(self.rewardScaling) || self.rewardScaling == 'Batch'",
                "the REINFORCE++ estimators normalise over the batch themselves: leave rewardScaling unset or Batch",
                ".rewardScaling",
            ),
            (
                "!has(self.rolloutCorrection) || self.rolloutCorrection.level != 'Sequence' || "
                "(has(self.policyLoss) ? self.policyLoss == 'PPO' : !(self.preset in ['GSPO', 'CISPO']))",
                "rolloutCorrection.level Sequence applies to the PPO loss only: GSPO and CISPO bring their own "
                "importance weight",
                ".rolloutCorrection.level",
            ),
            (
                "!has(self.rolloutCorrection) || self.rolloutCorrection.rejection != 'Token' || "
                "(has(self.policyLoss) ? self.policyLoss != 'GSPO' : self.preset != 'GSPO')",
                "GSPO weighs whole sequences: rolloutCorrection.rejection must be Sequence or Off",
                ".rolloutCorrection.rejection",
            ),
            (
                "!has(self.overlong) || !has(self.overlong.buffer) || "
                "self.overlong.buffer <= (has(self.sampling) ? self.sampling.maxNewTokens : "
                f"{Sampling.model_fields['max_new_tokens'].default})",
                "overlong.buffer must be ≤ sampling.maxNewTokens: the buffer is the last tokens of the budget",
                ".overlong.buffer",
            ),
        )
    )

    preset: objectives.Preset = "GRPO"
    """A published recipe: ``GRPO`` (the default), ``DAPO``, ``DrGRPO``, ``GSPO``, ``CISPO``, ``RLOO`` or
    ``REINFORCEPP``. Every objective field below left unset takes the preset's value (docs/algorithms.md
    lists them, with the matching verl and TRL keys)."""
    group_size: Int = Field(default=8, ge=2, le=1024)
    """n: completions sampled per prompt; advantages are normalised within a group."""
    batch_size: Int = Field(default=8, ge=1, le=65_536)
    """Groups (prompts) consumed per optimizer step."""
    micro_batch_size: Int = Field(default=8, ge=1)
    """Rollouts per forward/backward pass; gradients are accumulated over the batch."""
    micro_batch_tokens: Int | None = Field(default=None, ge=1)
    """A token budget per forward/backward pass instead of a rollout count (``microBatchSize`` is then
    not used): rollouts sorted by length, and as many in each pass as fit once padded (rows × (longest
    prompt + longest completion)); a rollout longer than the budget gets a pass alone, and is never
    split. Long and short rollouts then stop paying for each other's padding, and the peak memory
    follows the budget rather than the longest rollout. The loss is the same either way. The trainer
    reports ``paddingFraction`` per step."""
    learning_rate: Number = Field(default=1e-4, gt=0, le=1)
    """AdamW learning rate (the peak, when ``lrSchedule`` decays it)."""
    lr_schedule: Literal["Constant", "Linear", "Cosine"] = "Constant"
    """How the learning rate moves over ``maxSteps``: ``Constant``; or from ``learningRate`` at the first
    step down to ``minLearningRate`` at step ``maxSteps``, in a straight line (``Linear``) or along a half
    cosine (``Cosine``). The rate of a step depends only on its version, so a resumed run continues the
    same curve."""
    min_learning_rate: Number = Field(default=0.0, ge=0, le=1)
    """Where ``Linear`` and ``Cosine`` end; must not exceed ``learningRate``; unused by ``Constant``."""
    advantage_estimator: objectives.AdvantageEstimator | None = None
    """``GRPO``: reward minus the group mean; ``RLOO``: minus the mean of the *other* rollouts of the group;
    ``REINFORCEPP``: the reward itself, normalised over the batch; ``REINFORCEPPBaseline``: minus the
    group mean, then normalised over the batch. Unset: the preset's."""
    reward_scaling: objectives.RewardScaling | None = None
    """What GRPO and RLOO advantages are divided by: ``Group`` (the group's std), ``Batch`` (the std of
    all rewards of the batch) or ``Off`` (nothing: Dr. GRPO). The REINFORCE++ estimators normalise over
    the batch themselves and take ``Batch`` only. Unset: the preset's."""
    policy_loss: objectives.PolicyLoss | None = None
    """``PPO`` (the clipped token ratio, asymmetric and dual clip allowed), ``GSPO`` (the length-normalised
    sequence ratio, clipped per sequence) or ``CISPO`` (a clipped, stop-gradient weight on a REINFORCE
    term: every token keeps its gradient). Unset: the preset's."""
    clip_range: Number | None = Field(default=None, gt=0, le=1)
    """ε of the clip, both sides (``clipRangeLow``/``clipRangeHigh`` override a side). Unset: the
    preset's (0.2 for GRPO)."""
    clip_range_low: Number | None = Field(default=None, gt=0, le=1)
    """ε_low: the ratio is clipped below at ``1 − ε_low``; 1 leaves it unbounded below (CISPO)."""
    clip_range_high: Number | None = Field(default=None, gt=0, le=100)
    """ε_high: the ratio is clipped above at ``1 + ε_high`` (DAPO's clip-higher: 0.28)."""
    dual_clip: Number | None = Field(default=None, gt=1)
    """Dual-clip constant ``c`` (Ye et al. 2020; verl's ``clip_ratio_c``, 3 by default there): a token with
    a negative advantage whose ratio exceeds ``c`` is clipped at ``c·A`` and gives no gradient. Unset: off."""
    loss_aggregation: objectives.LossAggregation | None = None
    """How token losses become the batch loss: ``TokenMean`` (over every token of the batch),
    ``SequenceMeanTokenMean`` (each sequence's mean, then the mean over sequences),
    ``SequenceMeanTokenSum`` (each sequence's sum, then the mean) or ``SequenceMeanTokenSumNorm`` (each
    sequence's sum divided by the constant ``maxNewTokens``, then the mean: Dr. GRPO). Unset: the preset's."""
    kl_coef: Number | None = Field(default=None, ge=0)
    """β of the KL term to the reference (base) policy; 0 disables it. Unset: the preset's (0 but for
    REINFORCEPP)."""
    kl_estimator: objectives.KLEstimator | None = None
    """``k1`` (``log π − log π_ref``), ``k2`` (half its square), ``k3`` (``e^δ − 1 − δ``) or ``LowVarKL``
    (k3 clamped as verl's ``low_var_kl``). Unset: the preset's (k3)."""
    kl_placement: objectives.KLPlacement | None = None
    """``Loss`` (``β·KL`` per token in the loss) or ``Reward`` (``β·Σ_t KL`` of the behaviour policy
    subtracted from each completion's reward before advantages). Unset: the preset's."""
    entropy_coef: Number = Field(default=0.0, ge=0)
    """An entropy bonus: ``coef · H(π_θ(·|context))`` per token is subtracted from the loss. Entropy is
    recorded every step whatever this is."""
    importance_weight_cap: Number = Field(default=2.0, ge=1)
    """C: the truncation cap of importance weights for stale or mismatched rollouts (per token, or per
    sequence with ``rolloutCorrection.level: Sequence``)."""
    rollout_correction: RolloutCorrection = Field(default_factory=RolloutCorrection)
    """Train/inference mismatch correction: the level of the truncated importance weights and optional
    rejection of tokens or sequences whose ratio leaves a band."""
    overlong: Overlong = Field(default_factory=Overlong)
    """Completions cut by ``maxNewTokens``: masked out of the loss, or DAPO's soft penalty."""
    dynamic_sampling: DynamicSampling = Field(default_factory=DynamicSampling)
    """DAPO's dynamic sampling: the coordinator keeps groups without signal out of batches."""
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
        resolved = self.objective()
        if resolved.advantage_estimator.startswith("REINFORCEPP") and self.reward_scaling not in (
            None,
            "Batch",
        ):
            raise ValueError(
                f"rewardScaling: the {resolved.advantage_estimator} estimator normalises over the batch itself; "
                f"leave rewardScaling unset or Batch, got {self.reward_scaling}"
            )
        if resolved.policy_loss != "PPO" and resolved.importance_level == "Sequence":
            raise ValueError(
                f"rolloutCorrection.level: {resolved.policy_loss} brings its own importance weight; Sequence "
                "applies to PPO only, use Token"
            )
        if resolved.policy_loss == "GSPO" and resolved.rejection == "Token":
            raise ValueError(
                "rolloutCorrection.rejection: GSPO weighs whole sequences; use Sequence or Off, got Token"
            )
        if resolved.overlong_buffer > self.sampling.max_new_tokens:
            raise ValueError(
                f"overlong.buffer: must be ≤ sampling.maxNewTokens ({self.sampling.max_new_tokens}), "
                f"got {resolved.overlong_buffer}"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "name" in data:
            raise ValueError(
                f"name: replaced by preset (one of {', '.join(objectives.PRESETS)}); write preset: {data['name']}"
            )
        return data

    def objective(self) -> objectives.Objective:
        """Every objective setting, resolved: the manifest's field where set, else the preset's."""
        values: dict[str, Any] = {
            "preset": self.preset,
            "length_budget": self.sampling.max_new_tokens,
            "importance_weight_cap": self.importance_weight_cap,
            "entropy_coef": self.entropy_coef,
            "importance_level": self.rollout_correction.level,
            "rejection": self.rollout_correction.rejection,
            "rejection_low": self.rollout_correction.rejection_low,
            "rejection_high": self.rollout_correction.rejection_high,
            "dual_clip": self.dual_clip,
        }
        values.update(objectives.preset_values(self.preset, self.sampling.max_new_tokens))
        explicit = {
            "advantage_estimator": self.advantage_estimator,
            "reward_scaling": self.reward_scaling,
            "policy_loss": self.policy_loss,
            "clip_low": self.clip_range_low if self.clip_range_low is not None else self.clip_range,
            "clip_high": self.clip_range_high if self.clip_range_high is not None else self.clip_range,
            "loss_aggregation": self.loss_aggregation,
            "kl_coef": self.kl_coef,
            "kl_estimator": self.kl_estimator,
            "kl_placement": self.kl_placement,
            "mask_truncated": self.overlong.mask_truncated,
            "overlong_buffer": self.overlong.buffer,
            "overlong_penalty": self.overlong.penalty_factor,
            "dynamic_sampling": self.dynamic_sampling.enabled,
        }
        values.update({k: v for k, v in explicit.items() if v is not None})
        if str(values.get("advantage_estimator", "")).startswith("REINFORCEPP"):
            values["reward_scaling"] = (
                "Batch"  # its own normalisation (a different explicit value is refused)
            )
        if self.dual_clip is not None:
            values["dual_clip"] = self.dual_clip
        return objectives.Objective(**values)


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
    """Trust bound, in nats: before training on a group, the trainer recomputes the log-probs of
    ``logprobChecksPerGroup`` of its rollouts with the weights of the version the group claims (it keeps
    the last Δmax versions) and compares them with the behaviour log-probs the worker sent; a worker whose
    mean |Δ log-prob| per token exceeds this is quarantined (its rollouts dropped and refused, counted,
    shown in status). Honest backends differ by ≤ 1e-6 in float32 and by
    about 1e-3–1e-2 in bfloat16 (docs/coordinator.md)."""
    logprob_checks_per_group: Int = Field(default=1, ge=0, le=1024)
    """Rollouts of each group the trainer re-scores before training on it, whatever its staleness,
    chosen at random so a worker cannot tell which; 0 turns the check off."""
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
