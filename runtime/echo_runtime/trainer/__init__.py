"""The GRPO trainer (``echorl trainer``): consumes batches of groups, takes optimizer steps, publishes versions.

Modules, from pure decisions to I/O shells:

* :mod:`~echo_runtime.trainer.loss` — advantages, the clipped surrogate with truncated importance weights,
  the k3 KL, token weights (pure torch, each citing its equation);
* :mod:`~echo_runtime.trainer.batch` — rollouts, groups and batches as plain dataclasses (no torch);
* :mod:`~echo_runtime.trainer.policy` — the trainable model (LoRA via peft, or all weights), its
  log-probs, snapshot export;
* :mod:`~echo_runtime.trainer.step` — one optimizer step: admission by the staleness rule, accumulation,
  AdamW, metrics (including the per-backend log-prob mismatch);
* :mod:`~echo_runtime.trainer.checkpoint` — checkpoints and the resume rule;
* :mod:`~echo_runtime.trainer.distributed` — torchrun, DDP, collectives;
* :mod:`~echo_runtime.trainer.loop` — batch → step → publish → announce → checkpoint.
"""
