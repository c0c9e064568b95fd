"""One rank of the sharding equivalence test (run by torchrun, or called in-process as a world of one).

``python trainer_fsdp_script.py OUT_DIR MODEL_DIR FINETUNE STRATEGY [CHECKPOINTING]``:
``trainer_ddp_script``'s step phases (an SGD step, then two AdamW steps, on its fixed batches) with
``FINETUNE`` (LoRA or Full) and ``STRATEGY`` (DDP or FSDP), with gradient checkpointing when
``CHECKPOINTING`` is ``1``; rank 0 writes the whole parameters after each phase, the step metrics and
what one rank holds to ``OUT_DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trainer_ddp_script import step_phases

from echo_runtime.trainer import distributed


def main(
    out_dir: str, model_dir: str, finetune: str = "LoRA", strategy: str = "DDP", checkpointing: str = "0"
) -> None:
    world = distributed.init_world("cpu")
    step_phases(Path(out_dir), model_dir, world, finetune, strategy, checkpointing=checkpointing == "1")
    distributed.shutdown(world)


if __name__ == "__main__":
    main(*sys.argv[1:6])
