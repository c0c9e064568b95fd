"""``spec.algorithm``'s presets and field-by-field overrides (echo_runtime.spec.objectives)."""

from __future__ import annotations

import pydantic
import pytest

from echo_runtime.spec.objectives import PRESETS, Objective
from echo_runtime.spec.policy import Algorithm


def _objective(**fields: object) -> Objective:
    return Algorithm.model_validate(fields).objective()


def test_the_default_is_todays_grpo() -> None:
    o = _objective()
    assert (o.preset, o.advantage_estimator, o.reward_scaling, o.policy_loss) == (
        "GRPO",
        "GRPO",
        "Group",
        "PPO",
    )
    assert (o.clip_low, o.clip_high, o.dual_clip, o.importance_weight_cap) == (0.2, 0.2, None, 2.0)
    assert (o.loss_aggregation, o.kl_coef, o.entropy_coef) == ("TokenMean", 0.0, 0.0)
    assert (o.overlong_buffer, o.mask_truncated, o.dynamic_sampling) == (0, False, False)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        # the papers' values (docs/algorithms.md cites each)
        ("DAPO", {"clip_low": 0.2, "clip_high": 0.28, "overlong_buffer": 20, "dynamic_sampling": True}),
        (
            "DrGRPO",
            {"reward_scaling": "Off", "loss_aggregation": "SequenceMeanTokenSumNorm", "length_budget": 100},
        ),
        (
            "GSPO",
            {
                "policy_loss": "GSPO",
                "clip_low": 3e-4,
                "clip_high": 4e-4,
                "loss_aggregation": "SequenceMeanTokenMean",
            },
        ),
        (
            "CISPO",
            {"policy_loss": "CISPO", "clip_low": 1.0, "clip_high": 4.0, "loss_aggregation": "TokenMean"},
        ),
        (
            "RLOO",
            {
                "advantage_estimator": "RLOO",
                "reward_scaling": "Off",
                "loss_aggregation": "SequenceMeanTokenSum",
            },
        ),
        (
            "REINFORCEPP",
            {
                "advantage_estimator": "REINFORCEPP",
                "kl_coef": 0.01,
                "kl_estimator": "k1",
                "kl_placement": "Reward",
            },
        ),
    ],
)
def test_presets_set_their_papers_values(preset: str, expected: dict[str, object]) -> None:
    o = _objective(preset=preset, sampling={"maxNewTokens": 100})
    assert {k: getattr(o, k) for k in expected} == expected


def test_every_field_overrides_its_preset() -> None:
    o = _objective(
        preset="DAPO",
        clipRangeHigh=0.3,
        rewardScaling="Off",
        overlong={"buffer": 0, "maskTruncated": True},
        lossAggregation="SequenceMeanTokenMean",
        klCoef=0.05,
        klEstimator="LowVarKL",
    )
    assert (o.clip_low, o.clip_high, o.reward_scaling, o.overlong_buffer, o.mask_truncated) == (
        0.2,
        0.3,
        "Off",
        0,
        True,
    )
    assert (o.loss_aggregation, o.kl_coef, o.kl_estimator, o.dynamic_sampling) == (
        "SequenceMeanTokenMean",
        0.05,
        "LowVarKL",
        True,
    )
    # clipRange sets both sides; a side's own field wins over it
    both = _objective(preset="GSPO", clipRange=0.1, clipRangeLow=0.05)
    assert (both.clip_low, both.clip_high) == (0.05, 0.1)


def test_the_reinforce_pp_estimator_brings_its_batch_normalisation() -> None:
    # On the GRPO preset (group scaling), choosing the estimator alone is enough: its scaling is Batch.
    assert _objective(advantageEstimator="REINFORCEPPBaseline").reward_scaling == "Batch"
    assert _objective(advantageEstimator="REINFORCEPP", rewardScaling="Batch").reward_scaling == "Batch"


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_is_a_valid_manifest(preset: str) -> None:
    assert Algorithm.model_validate({"preset": preset}).objective().preset == preset


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "GRPO"}, "name: replaced by preset"),
        ({"preset": "PPO"}, "preset"),
        ({"preset": "REINFORCEPP", "rewardScaling": "Group"}, "rewardScaling"),
        ({"policyLoss": "GSPO", "rolloutCorrection": {"rejection": "Token"}}, "rolloutCorrection.rejection"),
        ({"policyLoss": "CISPO", "rolloutCorrection": {"level": "Sequence"}}, "rolloutCorrection.level"),
        ({"overlong": {"buffer": 40}}, "overlong.buffer"),
        ({"dualClip": 1.0}, "dual_clip|dualClip"),
        ({"lossAggregation": "seq-mean"}, "lossAggregation|loss_aggregation"),
    ],
)
def test_bad_objectives_are_refused_naming_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        Algorithm.model_validate(fields)


def test_the_resolved_objective_is_described_in_one_line() -> None:
    line = _objective(preset="DAPO", sampling={"maxNewTokens": 16}).describe()
    assert line.startswith("DAPO: ") and "clip 0.2/0.28" in line and "dynamic sampling" in line
    assert "over the last 3 tokens" in line  # 20 % of 16
    assert "clip none/4" in _objective(preset="CISPO").describe()
