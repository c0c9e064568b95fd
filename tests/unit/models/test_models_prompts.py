"""The one prompt rendering: text or chat messages, through a real chat template (Jinja, transformers)."""

from __future__ import annotations

from typing import Any

import pytest

from echo_runtime.backends import sampling
from echo_runtime.models import load, prompts
from echo_runtime.models.prompts import PromptStyle

# A ChatML template of the kind chat models ship (SmolLM2 and Qwen use this layout).
TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture
def plain() -> Any:
    """Echo's tiny model's tokenizer: no chat template."""
    return load.load_tokenizer("echorl:tiny")


@pytest.fixture
def chat() -> Any:
    tokenizer = load.load_tokenizer("echorl:tiny")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_auto_is_raw_without_a_template(plain: Any) -> None:
    assert prompts.encode(plain, "12+7=") == list(plain.encode("12+7="))
    assert prompts.render(plain, "12+7=", PromptStyle()) == "12+7="
    assert sampling.encode_prompt(plain, "12+7=") == list(plain.encode("12+7="))


def test_auto_uses_the_template_and_a_system_prompt(chat: Any) -> None:
    text = prompts.render(chat, "What is 2 + 3?", PromptStyle(system_prompt="Be brief."))
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = prompts.encode(chat, "What is 2 + 3?", PromptStyle(system_prompt="Be brief."))
    assert chat.decode(ids) == text  # exactly the rendered bytes, nothing added in front
    assert len(ids) > len(chat.encode("What is 2 + 3?"))
    # messages that bring their own system message keep it; the style's is not added twice
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "Hi"}]
    assert prompts.render(chat, own, PromptStyle(system_prompt="Be brief.")).count("system") == 1


def test_raw_and_chat_formats_are_honoured(chat: Any, plain: Any) -> None:
    assert prompts.render(chat, "12+7=", PromptStyle(format="Raw")) == "12+7="
    assert prompts.render(chat, "x", PromptStyle(format="Raw", system_prompt="S")) == "S\n\nx"
    joined = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert prompts.render(plain, joined, PromptStyle(format="Raw")) == "a\n\nb"
    with pytest.raises(ValueError, match="no chat template"):
        prompts.encode(plain, "x", PromptStyle(format="Chat"))
    with pytest.raises(ValueError, match="chat messages but the model's tokenizer has no chat template"):
        prompts.encode(plain, [{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([], "non-empty list"),
        ([{"role": "wizard", "content": "x"}], "message 0: role must be one of"),
        ([{"role": "user", "content": 3}], "message 0: content must be text"),
        ([{"role": "user", "content": "ok"}, {"content": "x"}], "message 1: role"),
    ],
)
def test_malformed_messages_are_named(chat: Any, bad: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prompts.encode(chat, bad)


def test_styles_come_from_the_task_spec() -> None:
    from echo_runtime.spec.policy import Task

    assert PromptStyle.from_task(Task(promptFormat="Raw", systemPrompt="S")) == PromptStyle("Raw", "S")
    assert PromptStyle.from_task(None) == PromptStyle()
    with pytest.raises(ValueError, match="Auto, Chat or Raw"):
        PromptStyle(format="Fancy")  # type: ignore[arg-type]
