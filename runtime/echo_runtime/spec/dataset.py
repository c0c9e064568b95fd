"""The ``dataset`` task's settings: a user's own prompts and answers, the way TRL and verl users bring them.

``spec.task.name: dataset`` with ``spec.task.dataset`` reads JSONL, JSON, CSV or Parquet files, or a local
Hugging Face ``datasets`` directory (``save_to_disk``); what the fields mean and how rows become prompts
and rewards is :mod:`echo_runtime.tasks.dataset`'s docstring. These models only say what a manifest may
write, so that ``echorl validate`` and the API server refuse a bad one before any file is opened.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from echo_runtime.spec.base import Number, SpecModel, cel

_FUNCTION = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
_FIELD = r"^[^.\s][^\s]*$"


class RewardFunction(SpecModel):
    """A user reward function with TRL's signature ``f(prompts, completions, **columns) -> list[float]``."""

    function: str = Field(min_length=3, pattern=_FUNCTION)
    """``module:function``, importable where the coordinator and workers run."""
    weight: Number = Field(default=1.0, ge=0)
    """Its weight in the task's reward (a weighted mean over the checker and the functions)."""


class Dataset(SpecModel):
    """Where a ``dataset`` task's rows come from and how each is scored."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "!has(self.heldoutPath) || !has(self.heldoutSplit)",
                "give the held-out rows as heldoutPath (a second file) or heldoutSplit (a split of a datasets "
                "directory), not both",
            ),
            (
                "self.checker != 'None' || size(self.rewardFunctions) > 0",
                "with checker None the task needs at least one reward function",
                ".checker",
            ),
            (
                "self.checker == 'None' || self.checkerWeight > 0 || size(self.rewardFunctions) > 0",
                "the reward needs a positive weight somewhere: checkerWeight is 0 and there are no reward functions",
                ".checkerWeight",
            ),
        )
    )

    path: str = Field(min_length=1)
    """A ``.jsonl``, ``.json``, ``.csv`` or ``.parquet`` file, or a directory written by
    ``datasets.Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    format: Literal["Auto", "JSONL", "JSON", "CSV", "Parquet", "Datasets"] = "Auto"
    """How to read ``path`` (and ``heldoutPath``); ``Auto`` goes by the file extension, and a directory is
    a datasets directory."""
    split: str | None = Field(default=None, min_length=1)
    """The split of a ``DatasetDict`` directory to train on (default ``train``)."""
    heldout_path: str | None = Field(default=None, min_length=1)
    """A second file (or datasets directory) whose rows are the held-out problems; then every row of
    ``path`` is for training."""
    heldout_split: str | None = Field(default=None, min_length=1)
    """The split of a ``DatasetDict`` directory whose rows are the held-out problems (e.g. ``test``)."""
    heldout_fraction: Number = Field(default=0.1, gt=0, lt=1)
    """Without ``heldoutPath`` / ``heldoutSplit``: the share of rows held out, chosen by a stable hash of
    each row's key (its ``idField``, else its prompt), the same on every machine."""
    prompt_field: str = Field(default="prompt", min_length=1, pattern=_FIELD)
    """The column holding the prompt: text, or a list of chat messages (``{role, content}``, TRL's
    conversational format). Dotted paths reach into nested objects (``extra_info.question``)."""
    messages_field: str | None = Field(default=None, min_length=1, pattern=_FIELD)
    """Instead of ``promptField``: a column holding a conversation; its messages before a final assistant
    message are the prompt, and that assistant message, if present, is the answer."""
    answer_field: str | None = Field(default="answer", pattern=_FIELD)
    """The column holding the reference answer (dotted paths allowed: verl's
    ``reward_model.ground_truth``); null when only reward functions score."""
    id_field: str | None = Field(default=None, min_length=1, pattern=_FIELD)
    """A column naming each row (the key of the held-out hash and of problem ids); default: the prompt."""
    checker: Literal["Math", "Numeric", "Exact", "MathVerify", "None"] = "Math"
    """The built-in check of a completion against the answer: ``Math`` (the boxed answer, else the last
    number, equal as exact fractions; a non-numeric boxed answer equal as normalised text), ``Numeric``
    (the last number), ``Exact`` (the boxed answer or the whole completion, equal after trimming
    whitespace), ``MathVerify`` (Hugging Face's math-verify parses the answer, LaTeX or plain, and
    compares it with the reference symbolically; needs the optional extra: pip install
    'echorl[math-verify]'), or ``None`` (reward functions only)."""
    checker_weight: Number = Field(default=1.0, ge=0)
    """The checker's weight in the reward."""
    reward_functions: list[RewardFunction] = Field(default_factory=list)
    """User reward functions, each with a weight; the reward is the weighted mean of the checker and
    these, each value clipped to [0, 1]."""
    instruction: str | None = None
    """Text appended to every text prompt on a line of its own (e.g. ``Put the final answer in
    \\boxed{}.``)."""

    @model_validator(mode="after")
    def _consistent(self) -> Dataset:
        if self.heldout_path is not None and self.heldout_split is not None:
            raise ValueError("heldoutPath and heldoutSplit: give one of them, not both")
        if self.checker == "None" and not self.reward_functions:
            raise ValueError("checker: None needs at least one entry in rewardFunctions")
        if self.checker != "None" and self.checker_weight == 0 and not self.reward_functions:
            raise ValueError("checkerWeight: 0 with no rewardFunctions leaves no reward")
        if self.checker != "None" and self.answer_field is None and self.messages_field is None:
            raise ValueError(
                f"answerField: the {self.checker} checker needs the answers (an answerField, or a messagesField "
                "whose conversations end with the assistant's answer); or set checker: None"
            )
        return self
