"""The coordinator's wire format: every request and reply body, as pydantic models.

One definition shared by the service (:mod:`.api`, which publishes them in its OpenAPI schema) and the
client (:mod:`.client`). JSON keys are camelCase; Python attributes snake_case. Models forbid unknown keys and
the service parses requests strictly, so a typo, a wrong type or a client/server mismatch is a 422
naming the key rather than a silently ignored or coerced field.

Static bounds live here (lengths, ranges, finite log-probs ≤ 0). Bounds that depend on the job (group
size, vocabulary, ``maxNewTokens``, versions, leases) are checked by :mod:`.state`, which raises
:class:`~.state.Rejected` naming the field in the same ``rollouts[3].tokenIds[7]`` form.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

MAX_GROUP_SIZE = 1024
MAX_TOKENS = 32_768
"""Largest ``maxNewTokens`` the spec allows; the job's own value is checked by the state."""
MAX_COMPLETION_CHARS = 1_048_576
MAX_TASKS_PER_LEASE = 1024

M = TypeVar("M", bound="WireModel")
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,63}$"
LogProb = Annotated[float, Field(le=0.0, allow_inf_nan=False)]
TokenId = Annotated[int, Field(ge=0, lt=2**31)]


class WireModel(BaseModel):
    """camelCase JSON, snake_case Python; unknown keys are errors. The service parses request bodies in
    strict mode (:func:`parse_request`): nothing is coerced, ``false`` is not 0 and ``"3"`` is not 3."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def parse_request(model: type[M], raw: bytes) -> M:
    """Parse an untrusted JSON body strictly (raises :class:`pydantic.ValidationError`)."""
    return model.model_validate_json(raw, strict=True)


class ErrorDetail(WireModel):
    code: Literal[
        "unauthorized",
        "forbidden",
        "unknown_worker",
        "not_found",
        "lease_not_held",
        "conflict",
        "invalid",
        "too_large",
        "unavailable",
        "quarantined",
        "limit",
    ]
    field: str
    """The offending field, as a path (``rollouts[3].logprobs[7]``), a header or ``body``."""
    message: str
    """What was wrong and what is allowed."""


class ErrorReply(WireModel):
    """Every 4xx/5xx reply. Nothing in the coordinator changed because of the rejected request."""

    error: ErrorDetail


# ------------------------------------------------------------------------------------------- workers
class RegisterRequest(WireModel):
    pool: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """The inference pool the worker joins; the join token must be that pool's."""
    backend: Literal["transformers", "mlx", "vllm"]
    device: str = Field(pattern=r"^[a-z]+(:[0-9]{1,3})?$", max_length=16)
    """Resolved device, e.g. ``cpu``, ``cuda:0``, ``mps``."""
    dtype: Literal["float32", "bfloat16", "float16"]
    capacity: int = Field(default=1, ge=1, le=MAX_TASKS_PER_LEASE)
    """Tasks (groups) this worker may hold leases on at once (capped by the pool's ``capacity``)."""
    external: bool = False
    """Joined from outside the cluster (shown in status)."""
    host: str | None = Field(default=None, max_length=253)
    """Host name, for people reading the status."""


class Instructions(WireModel):
    """Version bookkeeping every worker-facing reply carries."""

    policy_version: int
    """``t_train``: the trainer's version."""
    min_version: int
    """Tasks handed out now need a loaded version ≥ this."""
    load_version: int | None = None
    """Set when the worker's loaded version is below ``minVersion`` (or it has loaded none): load this
    snapshot, the newest published, before generating. Version 0 is the base model."""


class RegisterReply(Instructions):
    worker_id: str
    session_key: str
    """Secret for this registration: send it as ``X-Echo-Session`` on every worker request."""
    capacity: int
    """Leases this worker may hold at once: its own capacity, capped by its pool's."""
    lease_timeout_seconds: float
    """A worker silent (no request) for this long loses its leases and its registration."""
    heartbeat_interval_seconds: float


class HeartbeatRequest(WireModel):
    loaded_version: int | None = Field(default=None, ge=0)
    """The policy version the backend holds now (None while the base model has not loaded)."""


class HeartbeatReply(Instructions):
    lease_timeout_seconds: float
    heartbeat_interval_seconds: float


class LeaseRequest(WireModel):
    max_tasks: int = Field(default=1, ge=1, le=MAX_TASKS_PER_LEASE)
    loaded_version: int | None = Field(default=None, ge=0)
    """The policy version the backend holds now, as in a heartbeat (None: not reported here)."""
    wait_seconds: float = Field(default=0.0, ge=0.0, le=30.0)
    """Long-poll: with nothing to lease, hold the request up to this long for work to appear (a
    Sequential round opening, buffer room in Async, leases returned) instead of polling."""


class ChatMessage(WireModel):
    """One message of a chat prompt (the model's chat template renders the list)."""

    role: str = Field(min_length=1, max_length=32)
    content: str = Field(max_length=MAX_COMPLETION_CHARS)


PromptBody = str | list[ChatMessage]
"""A task's prompt: text, or chat messages (``task.promptFormat`` decides how it is rendered)."""


def plain_prompt(prompt: PromptBody) -> str | tuple[dict[str, str], ...]:
    """The prompt as the tasks, backends and the trainer take it: text, or messages as plain dicts."""
    if isinstance(prompt, str):
        return prompt
    return tuple({"role": m.role, "content": m.content} for m in prompt)


class TaskSampling(WireModel):
    """How to sample a task's group: the job's ``spec.algorithm.sampling`` (a worker's backend adds its seed)."""

    temperature: float
    top_p: float
    max_new_tokens: int
    key: str | None = None
    """Seeded draws: 32 hex digits (128 bits), fresh for this lease. A backend that draws with keys
    (transformers, mlx) takes row ``r``'s token at position ``t`` from ``uniform(key, r, t)``
    (``backends/seeded.py``), so the group's text is a function of (weights, prompt, key) and the trainer
    can check it token by token."""


class TaskOut(WireModel):
    """One prompt to sample ``groupSize`` completions of, with a backend at version ≥ ``minVersion``."""

    task_id: str
    problem_id: str
    prompt: PromptBody
    group_size: int
    min_version: int
    """Generate with a loaded version ≥ this (pacing: the oldest whose group is still consumed in
    bound, given the groups ahead of it); load the newest published one first if yours is older."""
    sampling: TaskSampling
    lease_seconds: float
    """Submit within this long (and keep heartbeating), or the task goes to another worker."""


class LeaseReply(Instructions):
    tasks: list[TaskOut]
    retry_after_seconds: float | None = None
    """Set when no task was handed out: backpressure (buffer full) or no batch requested yet."""


class RolloutIn(WireModel):
    """One completion as a worker reports it. Its reward is not taken from the worker: the coordinator
    re-scores ``completion`` with the task's verifier."""

    completion: str = Field(max_length=MAX_COMPLETION_CHARS)
    token_ids: list[TokenId] = Field(min_length=1, max_length=MAX_TOKENS)
    """Generated token ids (including a final end-of-sequence token, if one was sampled)."""
    logprobs: list[LogProb] = Field(min_length=1, max_length=MAX_TOKENS)
    """Behaviour log-probs, one per token id: finite and ≤ 0."""
    policy_version: int = Field(ge=0)
    """The version that produced it: one this worker reported holding (heartbeat or lease request)."""
    backend: str | None = Field(default=None, pattern=_NAME)
    """Defaults to the worker's registered backend (likewise device and dtype)."""
    device: str | None = Field(default=None, pattern=_NAME)
    dtype: str | None = Field(default=None, pattern=_NAME)
    finish_reason: Literal["stop", "length"] | None = None


class SubmitRequest(WireModel):
    rollouts: list[RolloutIn] = Field(min_length=1, max_length=MAX_GROUP_SIZE)
    """The whole group: exactly the task's ``groupSize`` rollouts."""


class SubmitReply(WireModel):
    outcome: Literal["buffered", "dropped", "duplicate"]
    """``buffered``: in the replay buffer. ``dropped``: valid but already too stale to be consumed
    (counted in ``droppedStale``). ``duplicate``: this worker had already submitted this task; the
    first submission stands."""
    rewards: list[float]
    """The coordinator's rewards (empty for a duplicate)."""
    staleness: int | None = None
    """The group's staleness at the current trainer version."""
    reason: str = ""


class LeaveReply(WireModel):
    released_tasks: int


# ------------------------------------------------------------------------------------------- trainer
class AnnounceRequest(WireModel):
    version: int = Field(ge=0, lt=2**62)
    """The version just published to the snapshot store; becomes ``t_train``."""


class AnnounceReply(WireModel):
    policy_version: int
    dropped_stale: int
    """Buffered groups dropped because this version made them too stale."""


class QuarantineRequest(WireModel):
    """The trainer caught a worker: its behaviour log-probs disagree with the trainer's recomputation."""

    worker_id: str = Field(min_length=1, max_length=64)
    reason: str = Field(min_length=1, max_length=2000)
    mismatch: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    """The statistic that caught it: mean |Δ log-prob| per token on the checked rollouts."""
    version: int = Field(ge=0, lt=2**62)
    """The trainer's version at the check."""
    pool: str | None = Field(default=None, max_length=63)
    """The worker's pool, if the coordinator no longer knows the worker (it expired)."""


class QuarantineReply(WireModel):
    dropped_groups: int
    """The worker's groups dropped from the buffer and from the last batch (prompts re-queued)."""
    released_leases: int


class BatchRequest(WireModel):
    version: int = Field(ge=0, lt=2**62)
    """The trainer's version t: the batch is consumed by the step t → t+1."""
    wait_seconds: float = Field(default=0.0, ge=0.0, le=60.0)
    """Long-poll: hold the request up to this long for a full batch."""
    step_seconds: float | None = Field(default=None, ge=0.0, le=86400.0)
    """The trainer's own time for its last version (step, export, checkpoint). A trainer that asks for
    the next batch while its step runs (prefetch) says it, because the coordinator cannot tell it from
    the gap between a batch taken and the next request; pacing plans generation at this pace."""


class RolloutOut(WireModel):
    completion: str
    token_ids: list[int]
    logprobs: list[float]
    policy_version: int
    staleness: int
    reward: float
    """Re-computed by the coordinator with the task's verifier."""
    reward_components: dict[str, float]
    reward_reason: str
    backend: str
    device: str
    dtype: str
    finish_reason: Literal["stop", "length"] | None = None


class GroupOut(WireModel):
    task_id: str
    problem_id: str
    prompt: PromptBody
    worker_id: str
    policy_version: int
    """The oldest version among the group's rollouts."""
    staleness: int
    """``version - policyVersion``: ≤ Δmax, always."""
    importance_weighted: bool
    """Apply truncated importance weights to this group (staleAction ImportanceWeight, staleness > 0)."""
    rollouts: list[RolloutOut]
    key: str | None = None
    """The seeded-draw key its rollouts were drawn with (row i from ``uniform(key, i, t)``); None when its
    worker's backend does not draw with keys."""


class BatchReply(WireModel):
    ready: bool
    version: int
    groups: list[GroupOut]
    retry_after_seconds: float | None = None
    """Set when not ready: ask again after this long."""


# ------------------------------------------------------------------------------------------- status
class WorkerStatus(WireModel):
    id: str
    pool: str
    host: str | None = None
    """The host name the worker registered with (a pod's name in Kubernetes): how the operator finds
    the pod of a stuck worker."""
    backend: str
    device: str
    dtype: str
    external: bool
    loaded_version: int | None
    last_heartbeat: str
    """RFC 3339 UTC time of the worker's last request."""
    rollouts_per_second: float
    """Rollouts accepted from this worker per second (measured by the coordinator)."""
    stuck: bool
    """Its loaded version would break the bound and it has not loaded the version it was told to
    load within its lease timeout."""
    quarantined: bool = False
    """The trainer caught it (see ``quarantined`` in the status document); it is refused from now on."""
    submitted_groups: int = 0
    """Groups it submitted that passed the coordinator's checks."""
    lapsed_leases: int = 0
    """Its leases that ran out while it was alive (re-issued to others)."""
    withholding: str | None = None
    """Set when its lapsed leases and the reward of what it submitted suggest it submits only the groups
    it likes (coordinator/withholding.py); past a stricter bound it is quarantined."""


class BufferStatus(WireModel):
    groups: int
    capacity: int


class PoolSummary(WireModel):
    workers: int
    min_loaded_version: int | None
    leases: int = 0
    """Leases the pool's workers hold now."""
    quarantined: int = 0
    """Workers of the pool the trainer quarantined (they count against ``maxWorkers``)."""
    rejected_rollouts: dict[str, int] = Field(default_factory=dict)
    """Group submissions refused by a trust check, by reason: ``tokenMismatch`` (the token ids do not
    decode to the completion) and ``unloadedVersion`` (a policy version the worker never reported)."""


class QuarantinedWorker(WireModel):
    id: str
    pool: str
    host: str | None = None
    reason: str
    mismatch: float | None = None
    version: int
    """The trainer's version when it was caught."""
    trained_groups: int = 0
    """Its groups that optimizer steps had already trained on when it was caught."""


class StatusDocument(WireModel):
    """``GET /v1/status``, exactly as docs/contracts.md fixes it."""

    job: str
    mode: Literal["Sequential", "Async"]
    max_staleness: int
    policy_version: int
    buffer: BufferStatus
    max_observed_staleness: int | None
    staleness_histogram: dict[str, int]
    dropped_stale: int
    weighted_stale: int
    consumed_groups: int
    generated_groups: int = 0
    """Valid group submissions: buffered, or dropped as stale on arrival (what the swarm generated)."""
    dropped_quarantined: int = 0
    """Groups of quarantined workers dropped from the buffer or withdrawn from a batch."""
    requeued_prompts: int = 0
    """Prompts of dropped groups put back at the front of the queue (no prompt is lost)."""
    verifier_timeouts: int = 0
    """Rollouts whose re-scoring hit the verifier timeout (scored 0)."""
    verifier_errors: int = 0
    """Rollouts whose verifier raised (scored 0)."""
    epoch: str = ""
    """Changes when the coordinator restarts (its counters then start again from 0)."""
    pacing: bool = False
    """Leases are paced so that groups are consumed within the bound (``--no-pacing`` turns it off)."""
    rollouts_per_second: float
    reward: float | None
    """Mean coordinator-verified reward of the last batch handed to the trainer."""
    workers: list[WorkerStatus]
    pools: dict[str, PoolSummary]
    quarantined: list[QuarantinedWorker] = Field(default_factory=list)
    """Workers the trainer quarantined, for the job's life."""
    filtered_groups: int = 0
    """Groups kept out of batches by dynamic sampling (every reward equal); their prompts are not re-queued."""
    set_aside_prompts: int = 0
    """Prompts skipped once by dynamic sampling because their last groups were all filtered."""
    signal_fraction: float | None = None
    """Fraction of the last 64 completed groups whose rewards differed (None before the first)."""
    no_signal_batches: int = 0
    """Consecutive batches handed to the trainer in which no group's rewards differed."""
    warnings: list[str] = Field(default_factory=list)
    """Problems a user should see: a job that learns nothing, one whose groups are nearly all filtered."""


class Health(WireModel):
    status: Literal["ok"]
    policy_version: int
