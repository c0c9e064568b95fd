"""Reward models and LLM judges: rewards from a model, run by the job's own scoring pool.

``spec.rewardModels`` lists them beside the task's verifier. Each runs as a *scoring pool* — processes
(``echorl scorer``; pods in a cluster) the coordinator calls for every submitted group, never an
untrusted worker — and its score, in [0, 1], is combined with the task's by weight (docs/rewards.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from echo_runtime.spec import podtemplate
from echo_runtime.spec.base import Int, Number, cel
from echo_runtime.spec.podtemplate import NODE_AFFINITY_RULE, TemplatedPlacement

JUDGE_FIELDS = ("{prompt}", "{completion}")
"""What a judge's rubric must contain: where the prompt and the completion go."""


class RewardModel(TemplatedPlacement):
    """One reward model (a sequence classifier) or LLM judge (a rubric, a parsed score)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "self.type != 'Judge' || (has(self.rubric) && self.rubric.contains('{prompt}') "
                "&& self.rubric.contains('{completion}'))",
                "a Judge needs a rubric containing {prompt} and {completion}",
                ".rubric",
            ),
            (
                "!has(self.scoreMin) || !has(self.scoreMax) || self.scoreMin < self.scoreMax",
                "scoreMin must be below scoreMax",
                ".scoreMax",
            ),
            NODE_AFFINITY_RULE,
            podtemplate.container_rule("scorer"),
        )
    )

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=30)
    """Names the reward's component (``rewardComponents[<name>]``) and its scoring pool."""
    type: Literal["Classifier", "Judge"]
    """``Classifier``: any Hugging Face ``AutoModelForSequenceClassification``, fed the prompt and the
    completion through its chat template; its score (the first logit; with two labels, the second
    minus the first) through a sigmoid. ``Judge``: a causal LM given ``rubric`` (greedy decoding); the
    first number of its answer, from ``scoreMin`` to ``scoreMax``, mapped to [0, 1]."""
    model: str = Field(min_length=1)
    """Any model name Echo resolves (a local directory, a hub id, ``echorl:smollm2-135m``, a .gguf)."""
    weight: Number = Field(default=1.0, ge=0)
    """Its weight in the reward: the weighted mean of the task's verifier (``task.rewardWeight``) and
    every reward model."""
    rubric: str | None = Field(default=None, min_length=1, max_length=20_000)
    """Judge: the prompt, with ``{prompt}`` and ``{completion}`` where the task's prompt and the
    completion go; it should ask for one number from ``scoreMin`` to ``scoreMax``."""
    score_min: Number = 0.0
    """Judge: the lowest score the rubric asks for (maps to reward 0)."""
    score_max: Number = 10.0
    """Judge: the highest score (maps to reward 1). A number outside the range, or none, scores 0."""
    max_new_tokens: Int = Field(default=16, ge=1, le=4096)
    """Judge: tokens it may write (its score must be among them)."""
    temperature: Number = Field(default=1.0, gt=0, le=100)
    """Classifier: the sigmoid's temperature, ``sigmoid(score / temperature)``."""
    batch_size: Int = Field(default=8, ge=1, le=1024)
    """Completions scored together in one forward pass (requests arriving together are merged)."""
    timeout_seconds: Number = Field(default=120.0, gt=0, le=3600)
    """How long the coordinator waits for one group's scores; past it (or with the pool down) the
    submission is refused with 503 and the worker retries it: no group is trained on without them."""
    replicas: Int = Field(default=1, ge=0, le=1000)
    """Scoring processes (pods in a cluster); the coordinator spreads groups over them."""
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    """Torch device: ``auto`` picks CUDA, then MPS, then CPU."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """The scorer's dtype; defaults to the model's."""
    threads: Int | None = Field(default=None, ge=1, le=1024)
    """CPU threads per scoring process; default: its share of the cores."""

    @model_validator(mode="after")
    def _judge(self) -> RewardModel:
        if self.type == "Judge":
            if self.rubric is None:
                raise ValueError("rubric: a Judge needs a rubric containing {prompt} and {completion}")
            missing = [f for f in JUDGE_FIELDS if f not in self.rubric]
            if missing:
                raise ValueError(f"rubric: must contain {' and '.join(missing)} (where they go)")
        if self.score_min >= self.score_max:
            raise ValueError(f"scoreMax: must be above scoreMin ({self.score_min:g}), got {self.score_max:g}")
        podtemplate.check_container(self.pod_template, "scorer")
        return self
