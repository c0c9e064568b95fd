"""Models: any Hugging Face causal LM, plus the tiny Qwen3-architecture ones Echo builds itself.

* :mod:`.resolve` — ``resolve_model(path)``: ``echorl:tiny`` / ``echorl:small`` → a cached directory
  (built, and optionally warmed up, on first use); a local directory or hub id as is.
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
