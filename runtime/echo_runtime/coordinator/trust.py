"""What the coordinator checks in a worker's submission beyond its shape: nothing a worker says is trusted.

The wire models bound lengths and ranges; :mod:`.state` checks the job's limits (group size,
``maxNewTokens``, vocabulary). This module holds the checks that tie a rollout to the text that is
scored and to the policy the worker really holds — pure functions, densely tested:

* **Token ids are the text.** The trainer trains on token ids, the verifier scores text; a worker could
  send a correct answer as text and any ids it likes. :meth:`Detokenizer.refusal` decodes the ids
  exactly as every backend does (:func:`echo_runtime.backends.sampling.finish`: the ids up to the end of
  sequence, decoded with special tokens kept) and compares with the completion. The stream must end as
  ``finish`` ends one: an end-of-sequence id only as the last token (``finishReason: stop``), or none.
* **The claimed version was loaded.** A rollout's ``policyVersion`` must be one the coordinator told
  this worker to load (``loadVersion``) or the worker reported holding (``loadedVersion`` in a heartbeat
  or lease request; only published versions are accepted) — so a worker still on ``v − 5`` cannot tag
  its rollouts with a newer version it was never given, without also claiming, on the record, to have
  loaded it. Whether it really did is then the trainer's check: for groups of staleness 0 it recomputes
  the log-probs and quarantines a worker whose behaviour log-probs disagree
  (:mod:`echo_runtime.trainer.verify`).

:func:`group_refusal` is the whole check of a submitted group, shape included (size, lengths, the
vocabulary, published versions, finite log-probs), first refusal first; the coordinator turns it into a
422 naming the field, and counts the trust refusals per pool (:class:`PoolCounters`) for the status
document and Prometheus.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from echo_runtime.coordinator import wire


REASONS = ("tokenMismatch", "unloadedVersion")
"""The rejection reasons counted per pool."""


class Refusal(NamedTuple):
    """Why a submitted rollout or group is refused: the field at fault (``rollouts[3].tokenIds``), what
    was wrong, and the counted trust reason (None for a malformed group, and until
    :func:`group_refusal` names it)."""

    field: str
    message: str
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class Detokenizer:
    """The job's tokenizer as the coordinator needs it: decode ids to text, and its end-of-sequence ids."""

    decode: Callable[[Sequence[int]], str]
    """``tokenizer.decode(ids, skip_special_tokens=False)`` — what the backends call."""
    eos_ids: frozenset[int]

    def refusal(
        self, where: str, token_ids: Sequence[int], completion: str, finish_reason: str | None
    ) -> Refusal | None:
        """Why the ids of rollout ``where`` are not the stream that produced ``completion``, or None."""
        last = len(token_ids) - 1
        for i, token in enumerate(token_ids[:-1]):
            if token in self.eos_ids:
                return Refusal(
                    f"{where}.tokenIds[{i}]",
                    f"end-of-sequence id {token} before the last token (at {i} of {last + 1}): a completion "
                    "ends at its first end-of-sequence token",
                )
        stopped = token_ids[last] in self.eos_ids
        if finish_reason is not None and (finish_reason == "stop") != stopped:
            ends = "ends with" if stopped else "does not end with"
            return Refusal(
                f"{where}.finishReason",
                f"finishReason {finish_reason!r}, but the token ids {ends} an end-of-sequence id",
            )
        text_ids = token_ids[:last] if stopped else token_ids
        try:
            decoded = self.decode(text_ids)
        except Exception as exc:  # ids inside the vocabulary decode; anything else is the worker's fault
            return Refusal(f"{where}.tokenIds", f"the token ids do not decode: {exc}")
        if decoded != completion:
            return Refusal(
                f"{where}.tokenIds",
                f"the token ids decode to {_clip(decoded)!r}, not to the completion {_clip(completion)!r}: "
                "the ids a rollout trains on must be the text that is scored",
            )
        return None


def version_refusal(where: str, claimed: int, known: Collection[int], floor: int = 0) -> Refusal | None:
    """Why rollout ``where`` may not claim policy version ``claimed``, given the versions its worker was
    told to load or reported holding from ``floor`` up; None if it may. A claim below ``floor`` (a
    version already too stale for any step, forgotten) passes here and is dropped as stale."""
    if claimed in known or claimed < floor:
        return None
    listed = ", ".join(str(v) for v in sorted(known)[-5:]) or "none"
    return Refusal(
        f"{where}.policyVersion",
        f"this worker was never told to load version {claimed} and never reported holding it (latest "
        f"known: {listed}); report the version the backend holds (loadedVersion in a heartbeat or lease "
        "request) before submitting its rollouts",
    )


def group_refusal(
    req: wire.SubmitRequest,
    *,
    group_size: int,
    max_new_tokens: int,
    vocab_size: int,
    published: int,
    known_versions: Collection[int],
    detokenizer: Detokenizer | None,
    known_floor: int = 0,
    registered: Mapping[str, str] | None = None,
) -> Refusal | None:
    """The first refusal of a submitted group, or None if it may be scored and buffered (or dropped as
    stale: a claim below ``known_floor`` is not checked against ``known_versions``). ``registered``: the
    worker's ``backend``, ``device`` and ``dtype``, which a rollout may repeat but not contradict (the
    trainer's checks depend on them)."""
    if len(req.rollouts) != group_size:
        return Refusal("rollouts", f"a group has exactly {group_size} rollouts, got {len(req.rollouts)}")
    for i, r in enumerate(req.rollouts):
        where = f"rollouts[{i}]"
        for field, value in (("backend", r.backend), ("device", r.device), ("dtype", r.dtype)):
            if registered is not None and value is not None and value != registered[field]:
                return Refusal(
                    f"{where}.{field}",
                    f"this worker registered {field} {registered[field]!r}; a rollout may not claim another "
                    f"({value!r}): leave it out",
                )
        if len(r.token_ids) > max_new_tokens:
            return Refusal(
                f"{where}.tokenIds", f"at most maxNewTokens ({max_new_tokens}) tokens, got {len(r.token_ids)}"
            )
        if len(r.logprobs) != len(r.token_ids):
            return Refusal(
                f"{where}.logprobs",
                f"one log-prob per token id: {len(r.token_ids)} token ids, {len(r.logprobs)} log-probs",
            )
        if max(r.token_ids) >= vocab_size:
            j = next(j for j, tok in enumerate(r.token_ids) if tok >= vocab_size)
            return Refusal(
                f"{where}.tokenIds[{j}]",
                f"token id {r.token_ids[j]} is outside the vocabulary (0..{vocab_size - 1})",
            )
        if r.policy_version > published:
            return Refusal(
                f"{where}.policyVersion",
                f"version {r.policy_version} was never published: the newest is {published}",
            )
        if not all(math.isfinite(x) and x <= 0.0 for x in r.logprobs):  # the wire model checks too
            return Refusal(f"{where}.logprobs", "log-probs must be finite and ≤ 0")
        refusal = version_refusal(where, r.policy_version, known_versions, known_floor)
        if refusal is None and detokenizer is not None:
            refusal = detokenizer.refusal(where, r.token_ids, r.completion, r.finish_reason)
        if refusal is not None:
            return refusal._replace(reason=reason_of(refusal.field))
    return None


def reason_of(field: str) -> str:
    """The counted reason of a refusal's field."""
    return "unloadedVersion" if field.endswith(".policyVersion") else "tokenMismatch"


@dataclasses.dataclass
class PoolCounters:
    """Per-pool counts of rollouts (groups) rejected by the checks above, by reason."""

    counts: dict[str, collections.Counter[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )

    def add(self, pool: str, reason: str) -> None:
        self.counts[pool][reason] += 1

    def of(self, pool: str) -> dict[str, int]:
        got = self.counts.get(pool, collections.Counter())
        return {reason: got[reason] for reason in REASONS}


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
