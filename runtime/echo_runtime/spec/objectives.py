"""The objective of ``spec.algorithm``: named presets, and every field resolved against them.

A user picks a published recipe by name (``spec.algorithm.preset``) and may override any of its fields
one by one; a field left unset takes the preset's value. :func:`resolve` turns the manifest's fields
into one :class:`Objective` (plain data, no torch), which the trainer's loss
(:mod:`echo_runtime.trainer.loss`) and the coordinator's batch filter read. ``echorl run`` prints it at
start-up (:meth:`Objective.describe`), so a user sees exactly which numbers a preset stands for.

The preset values, each from its paper (the equations are implemented, and cited again, in
:mod:`echo_runtime.trainer.loss`):

* ``GRPO`` — Shao et al. 2024 (DeepSeekMath §4.1), with Echo's defaults before presets existed:
  group mean and std, PPO clip ε = 0.2, token-mean aggregation, no KL.
* ``DAPO`` — Yu et al. 2025 (arXiv 2503.14476): clip-higher ε_low = 0.2, ε_high = 0.28 (§3.1), dynamic
  sampling (§3.2), token-level loss (§3.3), soft overlong punishment with a buffer of 4096 of 20480
  tokens, i.e. the last 20 % of the budget (§3.4, eq. 13), no KL (§2.3).
* ``DrGRPO`` — Liu et al. 2025 ("Understanding R1-Zero-Like Training", §3.2): advantages ``r − mean``
  without the std, and per-sequence token *sums* divided by a constant (the generation budget) instead
  of the sequence length.
* ``GSPO`` — Zheng et al. 2025 (arXiv 2507.18071): the length-normalised sequence ratio, clipped per
  sequence with ε_left = 3e-4, ε_right = 4e-4 (§5.1), averaged over sequences (eq. 5).
* ``CISPO`` — MiniMax 2025 (MiniMax-M1, arXiv 2506.13585, §3.1 eq. 4–5): the clipped, stop-gradient IS
  weight on a REINFORCE term; no lower bound, upper bound ε_high^IS (:data:`CISPO_EPSILON_HIGH`);
  token-level normalisation over all tokens of the batch.
* ``RLOO`` — Ahmadian et al. 2024 ("Back to Basics", §3.4): the leave-one-out baseline, no std; the
  whole completion is one action, so a sequence's token log-probs are summed.
* ``REINFORCEPP`` — Hu 2025 (REINFORCE++, arXiv 2501.03262, §3): no critic and no group baseline; the
  reward minus a token-level KL penalty (k1 of the sampling policy to the reference, in the reward,
  β = 0.01 as OpenRLHF's default), each token's return normalised over the whole batch, PPO's clip
  ε = 0.2.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Preset = Literal["GRPO", "DAPO", "DrGRPO", "GSPO", "CISPO", "RLOO", "REINFORCEPP"]
AdvantageEstimator = Literal["GRPO", "RLOO", "REINFORCEPP", "REINFORCEPPBaseline"]
RewardScaling = Literal["Group", "Batch", "Off"]
PolicyLoss = Literal["PPO", "GSPO", "CISPO"]
LossAggregation = Literal[
    "TokenMean", "SequenceMeanTokenMean", "SequenceMeanTokenSum", "SequenceMeanTokenSumNorm"
]
KLEstimator = Literal["k1", "k2", "k3", "LowVarKL"]
KLPlacement = Literal["Loss", "Reward"]
ImportanceLevel = Literal["Token", "Sequence"]
Rejection = Literal["Off", "Token", "Sequence"]

PRESETS: tuple[str, ...] = ("GRPO", "DAPO", "DrGRPO", "GSPO", "CISPO", "RLOO", "REINFORCEPP")

CISPO_EPSILON_HIGH = 4.0
"""CISPO's upper bound on the IS weight is ``1 + ε_high^IS = 5``. MiniMax-M1 publishes no number (it
sets no lower bound — ε_low^IS "large" — and tunes ε_high^IS only); a ratio bound of 5 is ScaleRL's
(Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute") and the one TRL's docs recommend
for ``loss_type="cispo"`` (TRL's ``epsilon_high=5.0`` is the bound on the ratio itself, ``1 + ε`` here)."""

DAPO_BUFFER_FRACTION = 4096 / 20480
"""DAPO's overlong buffer as a share of its generation budget (§3.4: ``L_cache = 4096``, ``L_max = 20480``)."""

REINFORCEPP_KL = 0.01
"""REINFORCE++'s KL coefficient β in the reward: the default (``init_kl_coef``) of OpenRLHF, the paper's
own implementation."""


@dataclasses.dataclass(frozen=True)
class Objective:
    """Every setting of the loss and of the reward shaping, resolved (no field is "the preset's")."""

    preset: str = "GRPO"
    advantage_estimator: AdvantageEstimator = "GRPO"
    reward_scaling: RewardScaling = "Group"
    policy_loss: PolicyLoss = "PPO"
    clip_low: float = 0.2
    """ε_low: the ratio's lower clip is ``1 − ε_low`` (``ε_low ≥ 1``: no lower bound)."""
    clip_high: float = 0.2
    """ε_high: the ratio's upper clip is ``1 + ε_high``."""
    dual_clip: float | None = None
    """Dual-clip ``c > 1`` (Ye et al. 2020): a negative-advantage token's loss is bounded by ``c·|A|``."""
    importance_weight_cap: float = 2.0
    """C: the truncation cap of importance weights (token or sequence, see ``importance_level``)."""
    loss_aggregation: LossAggregation = "TokenMean"
    length_budget: int = 32
    """The generation budget ``maxNewTokens``: ``SequenceMeanTokenSumNorm``'s constant length and the end
    of the overlong buffer."""
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_placement: KLPlacement = "Loss"
    entropy_coef: float = 0.0
    importance_level: ImportanceLevel = "Token"
    """Train/inference mismatch correction: ``Token`` truncates each token's weight ``π/μ`` at C (with
    PPO's clip on that ratio, the behaviour before presets existed); ``Sequence`` weights every token of a
    rollout by ``min(Π_t π/μ, C)`` (the decoupled form for every group)."""
    rejection: Rejection = "Off"
    rejection_low: float = 0.5
    rejection_high: float = 5.0
    mask_truncated: bool = False
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment: tokens before the budget where it starts; 0 = off."""
    overlong_penalty: float = 1.0
    dynamic_sampling: bool = False

    def describe(self) -> str:
        """One line a person reads at start-up: which numbers the preset and the overrides came to."""
        low = "none" if self.clip_low >= 1 else f"{self.clip_low:g}"
        parts = [
            f"{self.advantage_estimator} advantages (scaling {self.reward_scaling})",
            f"{self.policy_loss} loss, clip {low}/{self.clip_high:g}"
            + (f", dual clip {self.dual_clip:g}" if self.dual_clip is not None else ""),
            self.loss_aggregation,
        ]
        if self.kl_coef > 0:
            parts.append(f"KL {self.kl_estimator} β {self.kl_coef:g} in the {self.kl_placement.lower()}")
        if self.entropy_coef > 0:
            parts.append(f"entropy bonus {self.entropy_coef:g}")
        if self.importance_level != "Token" or self.rejection != "Off":
            parts.append(f"IS {self.importance_level.lower()}, rejection {self.rejection}")
        if self.dynamic_sampling:
            parts.append("dynamic sampling")
        if self.overlong_buffer:
            parts.append(f"overlong penalty over the last {self.overlong_buffer} tokens")
        if self.mask_truncated:
            parts.append("truncated completions masked")
        return f"{self.preset}: " + ", ".join(parts)


def preset_values(preset: str, max_new_tokens: int) -> dict[str, Any]:
    """The fields :data:`PRESETS` entry ``preset`` sets (the others keep :class:`Objective`'s defaults)."""
    if preset == "GRPO":
        return {}
    if preset == "DAPO":
        return {
            "clip_low": 0.2,
            "clip_high": 0.28,
            "overlong_buffer": max(1, round(max_new_tokens * DAPO_BUFFER_FRACTION)),
            "overlong_penalty": 1.0,
            "dynamic_sampling": True,
        }
    if preset == "DrGRPO":
        return {"reward_scaling": "Off", "loss_aggregation": "SequenceMeanTokenSumNorm"}
    if preset == "GSPO":
        return {
            "policy_loss": "GSPO",
            "clip_low": 3e-4,
            "clip_high": 4e-4,
            "loss_aggregation": "SequenceMeanTokenMean",
        }
    if preset == "CISPO":
        return {"policy_loss": "CISPO", "clip_low": 1.0, "clip_high": CISPO_EPSILON_HIGH}
    if preset == "RLOO":
        return {
            "advantage_estimator": "RLOO",
            "reward_scaling": "Off",
            "loss_aggregation": "SequenceMeanTokenSum",
        }
    if preset == "REINFORCEPP":
        return {
            "advantage_estimator": "REINFORCEPP",
            "reward_scaling": "Batch",
            "kl_coef": REINFORCEPP_KL,
            "kl_estimator": "k1",
            "kl_placement": "Reward",
        }
    raise ValueError(f"preset: expected one of {', '.join(PRESETS)}, got {preset!r}")
