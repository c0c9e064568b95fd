"""The one way a prompt becomes token ids: text or chat messages, through the model's chat template.

A task's prompt is either text (``"12+7="``) or chat messages (``[{"role": "user", "content": ...}]``,
the conversational format of TRL and verl datasets). Every process that turns a prompt into ids — each
backend of each worker, the trainer recomputing log-probs, the evaluator, the warm-up — calls
:func:`encode` with the job's :class:`PromptStyle` (``task.promptFormat``, ``task.systemPrompt``) and
the model's own tokenizer, so all of them feed the model the same bytes and the trainer's prompt ids for
a rollout equal the worker's.

Rules (:func:`render`):

* ``Chat``: the prompt goes through ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``;
  text becomes one user message; ``systemPrompt`` becomes a leading system message unless the messages
  already start with one. The rendered text is then encoded without adding special tokens (the template
  writes any BOS itself, as TRL and vLLM do it). A tokenizer without a chat template is an error.
* ``Raw``: text is encoded with the tokenizer's defaults (a BOS exactly when the tokenizer adds one);
  ``systemPrompt`` is put before it, followed by a blank line; messages are joined by blank lines.
* ``Auto`` (the default): ``Chat`` when the tokenizer has a chat template, else ``Raw`` — so Echo's tiny
  built-in models, which have none, see their prompts exactly as before — except that chat *messages*
  for a tokenizer without a template are an error rather than a guess.

A prompt that renders to no tokens is a ValueError: a completion needs a position to start from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from echo_runtime.tasks import base as tasks_base

if TYPE_CHECKING:
    from echo_runtime.spec.policy import Task

PromptFormat = Literal["Auto", "Chat", "Raw"]
"""How prompts are rendered; ``task.promptFormat`` of a job."""

Message: TypeAlias = Mapping[str, Any]
"""One chat message: ``{"role": "system" | "user" | "assistant" | ..., "content": str}``."""

Prompt: TypeAlias = tasks_base.Prompt
"""Text, or chat messages: the one in-process prompt type (:data:`echo_runtime.tasks.base.Prompt`)."""

ROLES = ("system", "user", "assistant", "tool", "developer")


@dataclasses.dataclass(frozen=True)
class PromptStyle:
    """A job's prompt settings (see the module docstring)."""

    format: PromptFormat = "Auto"
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.format not in ("Auto", "Chat", "Raw"):
            raise ValueError(f"promptFormat must be Auto, Chat or Raw, got {self.format!r}")

    @classmethod
    def from_task(cls, task: Task | None) -> PromptStyle:
        """The style of a job's ``spec.task`` (the default style for None)."""
        if task is None:
            return cls()
        return cls(format=task.prompt_format, system_prompt=task.system_prompt)


def is_chat(prompt: object) -> bool:
    """Whether ``prompt`` is chat messages rather than text."""
    return not isinstance(prompt, str) and isinstance(prompt, Sequence)


def messages(prompt: Prompt) -> list[dict[str, str]]:
    """``prompt`` as a list of ``{"role", "content"}`` dicts (text is one user message).

    Malformed messages are a ValueError naming the message and what is allowed.
    """
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not is_chat(prompt) or not prompt:
        raise ValueError(f"a prompt is text or a non-empty list of chat messages, got {prompt!r:.80}")
    out: list[dict[str, str]] = []
    for index, message in enumerate(prompt):
        if isinstance(message, Mapping):
            role, content = message.get("role"), message.get("content")
        else:
            role, content = getattr(message, "role", None), getattr(message, "content", None)
        if not isinstance(role, str) or role not in ROLES:
            raise ValueError(f"prompt message {index}: role must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"prompt message {index}: content must be text, got {content!r:.80}")
        out.append({"role": role, "content": content})
    return out


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat(tokenizer: Any, prompt: Prompt, style: PromptStyle) -> bool:
    """Whether ``prompt`` is rendered through the chat template under ``style`` (errors as :func:`render`)."""
    if style.format == "Raw":
        return False
    if has_chat_template(tokenizer):
        return True
    if style.format == "Chat":
        raise ValueError(
            "task.promptFormat is Chat but the model's tokenizer has no chat template; use Raw (or Auto) "
            "or a model with a chat template"
        )
    if is_chat(prompt):
        raise ValueError(
            "the prompt is chat messages but the model's tokenizer has no chat template; give text "
            "prompts, set task.promptFormat: Raw to join the messages as plain text, or use a chat model"
        )
    return False


def render(tokenizer: Any, prompt: Prompt, style: PromptStyle) -> str:
    """The exact text the model is fed for ``prompt`` (see the module docstring)."""
    if uses_chat(tokenizer, prompt, style):
        chat = messages(prompt)
        if style.system_prompt is not None and chat[0]["role"] != "system":
            chat = [{"role": "system", "content": style.system_prompt}, *chat]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        if not isinstance(text, str):
            raise ValueError(f"the chat template rendered {type(text).__name__}, not text")
        return text
    body = prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in messages(prompt))
    return body if style.system_prompt is None else f"{style.system_prompt}\n\n{body}"


def encode(tokenizer: Any, prompt: Prompt, style: PromptStyle | None = None) -> list[int]:
    """The token ids of ``prompt`` under ``style`` (default: ``Auto``, no system prompt)."""
    style = style if style is not None else PromptStyle()
    text = render(tokenizer, prompt, style)
    if uses_chat(tokenizer, prompt, style):
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    else:
        ids = list(tokenizer.encode(text))
    if not ids:
        raise ValueError(f"prompt {prompt!r:.80} encodes to no tokens; a prompt needs at least one")
    return [int(i) for i in ids]


def describe(prompt: Prompt) -> str:
    """A one-line text of ``prompt`` for logs and eval examples (the last user message for chat)."""
    if isinstance(prompt, str):
        return prompt
    try:
        chat = messages(prompt)
    except ValueError:
        return repr(prompt)[:200]
    users = [m["content"] for m in chat if m["role"] == "user"]
    return users[-1] if users else chat[-1]["content"]
