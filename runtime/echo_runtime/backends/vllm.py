"""The ``vllm`` backend: datacenter GPUs through vLLM's offline ``LLM`` engine. CUDA only.

NOT EXERCISED BY CI: vLLM needs CUDA, which the project's machines do not have. What CI does test is the
pure part, below the :class:`VllmBackend` shell: :func:`sampling_params_kwargs`, :func:`lora_request_kwargs`,
:func:`check_adapter` and :func:`to_sample`. The shell is kept thin on purpose — every decision it makes
lives in one of those functions.

Promises (by construction; verify on a GPU before relying on them):

* **LoRA versions** are ``LoRARequest(name="v<version>", int_id=version + 1, path=<peft dir>)``: vLLM
  reads peft adapter directories as they are, so no conversion is needed; :func:`check_adapter` verifies
  the directory is one vLLM accepts (plain LoRA, rank within ``max_lora_rank``). The base model stays
  loaded; the previous adapter is evicted from vLLM's LoRA cache.
* **Full snapshots** are loaded in place on every worker through a vLLM worker extension
  (:class:`WorkerExtension`, ``model.load_weights`` on the snapshot's safetensors).
* **Behaviour log-probs** are requested as ``logprobs=0`` (the sampled token only) with the engine's
  ``logprobs_mode="processed_logprobs"``, i.e. ``log_softmax(logits / T)`` — the definition in
  :mod:`echo_runtime.backends.logprobs`. vLLM applies top-p before computing processed log-probs, which
  would renormalise them over the nucleus, so this backend refuses ``top_p < 1`` rather than report a
  different quantity.
* **Seeds:** a call's seed gives each prompt its own derived seed (:func:`prompt_seed`), so identical
  prompts in one call still draw different samples.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from echo_runtime.backends import base, sampling, snapshot_files
from echo_runtime.models import prompts
from echo_runtime.models.prompts import Prompt
from echo_runtime.rollout import Rollout

INSTALL_HINT = "the vllm backend needs CUDA and the `vllm` extra (pip install 'echorl[vllm]')"

DEFAULT_MAX_LORA_RANK = 64


def available() -> bool:
    """Whether the ``vllm`` package is importable (says nothing about CUDA)."""
    return importlib.util.find_spec("vllm") is not None


def prompt_seed(seed: int, prompt_index: int) -> int:
    """The seed of prompt ``prompt_index`` in a call seeded with ``seed`` (distinct per prompt, stable)."""
    return (seed * 1_000_003 + prompt_index) % (2**63)


def sampling_params_kwargs(
    n: int, params: base.SamplingParams, seed: int, stop_token_ids: Iterable[int] = ()
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for ``n`` completions of one prompt.

    ``stop_token_ids`` are the model's own EOS ids (:func:`~echo_runtime.backends.sampling.eos_token_ids`:
    tokenizer, ``config.json`` and ``generation_config.json``), passed explicitly so that vLLM stops where
    the other backends and the evaluator stop, e.g. at a chat model's ``<|im_end|>``."""
    if params.top_p < 1.0:
        raise ValueError(
            f"the vllm backend supports top_p = 1 only (got {params.top_p}): vLLM folds top-p into the "
            f"log-probs it reports, and Echo's behaviour log-probs must not include it"
        )
    return {
        "n": n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
        "logprobs": 0,
        "seed": seed,
        "detokenize": False,
        "stop_token_ids": sorted(int(i) for i in stop_token_ids),
    }


def lora_request_kwargs(version: int, path: Path) -> dict[str, Any]:
    """Keyword arguments of ``vllm.lora.request.LoRARequest`` for snapshot ``version`` (ids start at 1)."""
    if version < 0:
        raise ValueError(f"policy version must be >= 0, got {version}")
    return {"lora_name": f"v{version}", "lora_int_id": version + 1, "lora_path": str(path)}


def check_adapter(path: Path, max_lora_rank: int = DEFAULT_MAX_LORA_RANK) -> snapshot_files.LoraAdapter:
    """The peft adapter in ``path`` if vLLM can serve it as is, else a ValueError saying why."""
    adapter = snapshot_files.read_lora_adapter(
        path, snapshot_files.safetensors_shapes(path / snapshot_files.ADAPTER_WEIGHTS)
    )
    if adapter.max_rank > max_lora_rank:
        raise ValueError(
            f"LoRA snapshot {path} has rank {adapter.max_rank}, above the engine's max_lora_rank "
            f"{max_lora_rank}; start the backend with a larger max_lora_rank"
        )
    return adapter


def to_sample(
    tokenizer: Any,
    prompt_ids: Sequence[int],
    token_ids: Sequence[int],
    logprobs: Sequence[Mapping[int, Any]],
    eos_ids: frozenset[int],
) -> Rollout:
    """An Echo sample from one vLLM ``CompletionOutput`` (``token_ids`` and its per-position logprob maps,
    each holding at least the sampled token with a ``.logprob``)."""
    if len(logprobs) != len(token_ids):
        raise ValueError(f"vLLM returned {len(logprobs)} log-prob entries for {len(token_ids)} tokens")
    values = [float(position[token].logprob) for token, position in zip(token_ids, logprobs, strict=True)]
    return sampling.finish(tokenizer, prompt_ids, token_ids, values, eos_ids)


class WorkerExtension:
    """Mixed into vLLM's GPU workers (``worker_extension_cls``): loads a full snapshot in place."""

    model_runner: Any

    def echorl_load_full_snapshot(self, path: str) -> None:
        from safetensors.torch import load_file

        model = self.model_runner.model
        for file in snapshot_files.full_weight_files(Path(path)):
            model.load_weights(weights=load_file(str(file)).items())


class VllmBackend:
    """:class:`~echo_runtime.backends.base.Backend` on vLLM (CUDA). Not exercised by CI."""

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        device: str = "auto",
        dtype: str | None = None,
        threads: int | None = None,
        *,
        max_lora_rank: int = DEFAULT_MAX_LORA_RANK,
        gpu_memory_utilization: float = 0.85,
        prompt_style: prompts.PromptStyle | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        from echo_runtime.models import load as model_load
        from echo_runtime.models import resolve

        del threads  # vLLM schedules its own CPU work
        if device not in ("auto", "cuda"):
            raise ValueError(f"{INSTALL_HINT}; got device {device!r}")
        if not available():
            raise ImportError(INSTALL_HINT)
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"{INSTALL_HINT}: torch sees no CUDA device")
        from vllm import LLM  # type: ignore[import-not-found,unused-ignore]

        self.model_path = Path(resolve.resolve_model(str(model_path)))
        self.device = "cuda"
        self.dtype = dtype if dtype is not None else sampling.model_dtype(self.model_path)
        self.max_lora_rank = max_lora_rank
        self.tokenizer: Any = model_load.load_tokenizer(str(self.model_path))
        self.eos_ids = sampling.eos_token_ids(self.model_path, self.tokenizer)
        self.prompt_style = prompt_style if prompt_style is not None else prompts.PromptStyle()
        """How prompts become ids (the job's ``task.promptFormat`` / ``systemPrompt``)."""
        self.llm: Any = LLM(
            model=str(self.model_path),
            dtype=self.dtype,
            enable_lora=True,
            max_lora_rank=max_lora_rank,
            max_loras=1,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,  # the pool's gpusPerReplica; not exercised by CI
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.WorkerExtension",
        )
        self._lora: Any = None
        self._version: int | None = None

    @property
    def loaded_version(self) -> int | None:
        return self._version

    def apply_snapshot(self, version: int, path: Path, kind: base.SnapshotKind) -> None:
        snapshot_files.check_snapshot_dir(Path(path), kind)
        previous = self._lora
        if kind == "lora":
            from vllm.lora.request import LoRARequest  # type: ignore[import-not-found,unused-ignore]

            check_adapter(Path(path), self.max_lora_rank)
            self._lora = LoRARequest(**lora_request_kwargs(version, Path(path)))
        else:
            self.llm.collective_rpc("echorl_load_full_snapshot", args=(str(path),))
            self._lora = None
        if previous is not None and (self._lora is None or previous.lora_int_id != self._lora.lora_int_id):
            remove = getattr(self.llm.llm_engine, "remove_lora", None)
            if remove is not None:
                remove(previous.lora_int_id)
        self._version = version

    def sample(self, prompts: Sequence[Prompt], n: int, params: base.SamplingParams) -> list[list[Rollout]]:
        from vllm import SamplingParams as VllmSamplingParams  # type: ignore[import-not-found,unused-ignore]

        sampling.check_request(prompts, n, params)
        seed = sampling.resolve_seed(params.seed)
        encoded = [self.encode(p) for p in prompts]
        requests = [{"prompt_token_ids": ids} for ids in encoded]
        per_prompt = [
            VllmSamplingParams(**sampling_params_kwargs(n, params, prompt_seed(seed, i), self.eos_ids))
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(requests, per_prompt, lora_request=self._lora, use_tqdm=False)
        return [
            [
                to_sample(self.tokenizer, ids, list(c.token_ids), list(c.logprobs), self.eos_ids)
                for c in out.outputs
            ]
            for ids, out in zip(encoded, outputs, strict=True)
        ]

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt ids this backend samples from (:func:`echo_runtime.backends.sampling.encode_prompt`)."""
        return sampling.encode_prompt(self.tokenizer, prompt, self.prompt_style)

    def score_logprobs(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float
    ) -> list[float]:
        """Scored with ``prompt_logprobs=0`` over prompt + completion. vLLM computes prompt log-probs from
        the raw logits, which equal Echo's definition at temperature 1 only; other temperatures raise."""
        from vllm import SamplingParams as VllmSamplingParams

        from echo_runtime.backends.logprobs import check_temperature

        if check_temperature(temperature) != 1.0:
            raise NotImplementedError(f"the vllm backend scores at temperature 1 only, got {temperature}")
        if not prompt_ids:
            raise ValueError("prompt_ids must hold at least one token")
        if not completion_ids:
            return []
        ids = [*prompt_ids, *completion_ids]
        request = VllmSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate(
            [{"prompt_token_ids": ids}], request, lora_request=self._lora, use_tqdm=False
        )[0]
        positions = out.prompt_logprobs[len(prompt_ids) :]
        return [
            float(position[token].logprob) for token, position in zip(completion_ids, positions, strict=True)
        ]
