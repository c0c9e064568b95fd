"""The one way every part of Echo loads a policy: thin wrappers over ``transformers``' Auto classes.

Promises:

* ``path`` is anything :func:`echo_runtime.models.resolve.resolve_model` accepts: a local Hugging Face
  directory, a hub id, or a built-in name (``echorl:tiny`` resolves with seed 0 and no warm-up; callers
  with a job spec resolve ``Model.path`` themselves with :func:`resolve_spec` first and pass the result).
* :func:`load_tokenizer` returns a tokenizer with a pad token (the EOS token if the model defines none)
  that pads on the left, the side batched generation needs; no token is added to the vocabulary.
* :func:`load_causal_lm` returns the model in eval mode, in ``dtype``, on ``device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from echo_runtime.models import build
from echo_runtime.models.resolve import resolve_model

if TYPE_CHECKING:
    from echo_runtime.spec.policy import Model, Task

Dtype = Literal["float32", "bfloat16", "float16"]


def torch_dtype(dtype: str) -> Any:
    """The ``torch.dtype`` named by a spec dtype (``float32``, ``bfloat16``, ``float16``)."""
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype must be one of {', '.join(table)}, got {dtype!r}")
    return table[dtype]


def resolve_spec(model: Model, task: Task | None = None) -> str:
    """Resolve a job's ``Model`` (and its ``Task``, which a warm-up trains on) to a loadable path."""
    return resolve_model(
        model.path,
        seed=model.seed,
        warmup_steps=model.warmup_steps,
        task=task.name if task is not None else "arithmetic",
        task_options=task.task_options() if task is not None else None,
    )


def load_tokenizer(path: str) -> Any:
    """``AutoTokenizer.from_pretrained`` on the resolved ``path``, with a pad token and left padding."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(path))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(path: str, dtype: Dtype | str = "float32", device: str = "cpu") -> Any:
    """``AutoModelForCausalLM.from_pretrained`` on the resolved ``path``, in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    with build.quiet_progress():
        model: Any = AutoModelForCausalLM.from_pretrained(resolve_model(path), dtype=torch_dtype(dtype))
    return model.to(device).eval()
