"""Rollout correction (TIS / MIS weights, mismatch metrics) against hand-computed tokens, the
weighted policy / actor loss, and the config checks."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from hf_algos.config import RLConfig, RolloutCorrectionSection, load_config
from hf_algos.losses import (
    compute_rollout_correction,
    mismatch_kl,
    ppo_actor_loss,
    ppo_policy_loss,
    rollout_log_ratio,
)
from hf_algos.trainers.ppo.trainer import ACTOR_UPDATE_FIELDS, apply_rollout_correction
from hf_algos.trainers.roles.batch_io import for_worker
from hf_controller import ConfigurationError
from hf_protocol import DataProto, fields

# One row, three valid tokens and a pad: ratios (old over rollout) 3, 0.25, 1; the pad's
# log-probs are garbage on purpose and must never count.
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
OLD = ROLLOUT + torch.log(torch.tensor([[3.0, 0.25, 1.0, 50.0]]))
MASK = torch.tensor([[1, 1, 1, 0]])


def test_log_ratio_is_old_minus_rollout_and_zero_on_padding() -> None:
    log_ratio = rollout_log_ratio(OLD, ROLLOUT, MASK)
    expected = torch.tensor([[math.log(3.0), math.log(0.25), 0.0, 0.0]])
    torch.testing.assert_close(log_ratio, expected)


def test_tis_truncates_at_the_cap() -> None:
    out = compute_rollout_correction(OLD, ROLLOUT, MASK, mode="tis", rollout_is_cap=2.0)
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.25, 1.0, 0.0]]))
    assert not out.weights.requires_grad
    m = out.metrics
    assert m["rollout_correction/clipped_frac"] == pytest.approx(1 / 3)  # the ratio-3 token
    assert m["rollout_correction/weight_mean"] == pytest.approx((2.0 + 0.25 + 1.0) / 3)
    assert m["rollout_correction/ratio_mean"] == pytest.approx((3.0 + 0.25 + 1.0) / 3)
    assert m["rollout_correction/ratio_max"] == pytest.approx(3.0)
    assert m["rollout_correction/ratio_min"] == pytest.approx(0.25)
    assert "rollout_correction/masked_frac" not in m


def test_mis_masks_tokens_outside_the_band() -> None:
    out = compute_rollout_correction(OLD, ROLLOUT, MASK, mode="mis", mis_low=0.5, mis_high=2.0)
    # 3 > 2 and 0.25 < 0.5 are dropped; the in-band token keeps its ratio (1).
    torch.testing.assert_close(out.weights, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
    assert out.metrics["rollout_correction/masked_frac"] == pytest.approx(2 / 3)


def test_mismatch_kl_k1_and_k3_by_hand() -> None:
    k1, k3 = mismatch_kl(rollout_log_ratio(OLD, ROLLOUT, MASK), MASK)
    # k1 = mean(-log r) = -(ln 3 + ln 0.25 + 0) / 3; k3 = mean(r - 1 - ln r).
    assert k1.item() == pytest.approx(-(math.log(3.0) + math.log(0.25)) / 3, rel=1e-6)
    k3_tokens = (3.0 - 1 - math.log(3.0)) + (0.25 - 1 - math.log(0.25)) + 0.0
    assert k3.item() == pytest.approx(k3_tokens / 3, rel=1e-6)
    out = compute_rollout_correction(OLD, ROLLOUT, MASK, mode="off")
    assert out.metrics["rollout_correction/kl_k3"] == pytest.approx(k3_tokens / 3, rel=1e-6)


def test_off_gives_the_mask_as_weights() -> None:
    out = compute_rollout_correction(OLD, ROLLOUT, MASK, mode="off")
    torch.testing.assert_close(out.weights, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    assert not any(k.endswith("_frac") for k in out.metrics)


# Two rows: row 0 token ratios 9 and 1 (geometric mean 3), row 1 one token of ratio 0.25.
SEQ_ROLLOUT = torch.zeros(2, 2)
SEQ_OLD = torch.log(torch.tensor([[9.0, 1.0], [0.25, 7.0]]))
SEQ_MASK = torch.tensor([[1, 1], [1, 0]])


def test_sequence_level_uses_the_geometric_mean() -> None:
    tis = compute_rollout_correction(SEQ_OLD, SEQ_ROLLOUT, SEQ_MASK, mode="tis", level="sequence")
    torch.testing.assert_close(tis.weights, torch.tensor([[2.0, 2.0], [0.25, 0.0]]))
    assert tis.metrics["rollout_correction/clipped_frac"] == pytest.approx(2 / 3)
    mis = compute_rollout_correction(
        SEQ_OLD, SEQ_ROLLOUT, SEQ_MASK, mode="mis", level="sequence", mis_low=0.5, mis_high=4.0
    )
    torch.testing.assert_close(mis.weights, torch.tensor([[3.0, 3.0], [0.0, 0.0]]))
    assert mis.metrics["rollout_correction/masked_frac"] == pytest.approx(1 / 3)
    # the metrics' ratios stay per token
    assert mis.metrics["rollout_correction/ratio_max"] == pytest.approx(9.0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="rollout_is_cap=0"):
        compute_rollout_correction(OLD, ROLLOUT, MASK, mode="tis", rollout_is_cap=0.0)
    with pytest.raises(ValueError, match="MIS band"):
        compute_rollout_correction(OLD, ROLLOUT, MASK, mode="mis", mis_low=1.5, mis_high=2.0)
    with pytest.raises(ValueError, match="differ in shape"):
        compute_rollout_correction(OLD, ROLLOUT[:, :3], MASK, mode="tis")


# The PPO tokens of test_policy_loss: log-ratios +-0.5, advantages +-1.
PG_OLD = torch.zeros(1, 4)
PG_NEW = torch.tensor([[0.5, -0.5, 0.5, -0.5]])
PG_ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
PG_MASK = torch.ones(1, 4)
WEIGHTS = torch.tensor([[2.0, 0.5, 0.0, 1.0]])
UP, DOWN = math.exp(0.5), math.exp(-0.5)


def test_weighted_ppo_loss_by_hand() -> None:
    log_prob = PG_NEW.clone().requires_grad_(True)
    out = ppo_policy_loss(log_prob, PG_OLD, PG_ADV, PG_MASK, token_weights=WEIGHTS)
    # unweighted tokens -1.2, -DOWN, UP, 0.8 (see test_policy_loss); the denominator stays 4
    assert out.loss.item() == pytest.approx((2 * -1.2 + 0.5 * -DOWN + 0 + 1 * 0.8) / 4, rel=1e-6)
    out.loss.backward()
    assert log_prob.grad is not None
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, -0.5 * DOWN / 4, 0.0, 0.0]]))


def test_actor_loss_reads_the_weights_from_the_batch_and_shares_them_unevenly() -> None:
    old = torch.zeros(3, 4)
    new = torch.tensor([[0.5, -0.5, 0.5, -0.5], [0.1, 0.2, 0.0, 0.0], [-0.3, 0.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0], [0.5, 0.5, 0.0, 0.0], [-2.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    weights = torch.tensor([[2.0, 0.5, 0.0, 1.0], [1.5, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    tensors = {
        fields.RESPONSE_MASK: mask,
        fields.OLD_LOG_PROBS: old,
        fields.ADVANTAGES: adv,
        fields.ROLLOUT_IS_WEIGHTS: weights,
    }
    whole, _ = ppo_actor_loss({"log_probs": new}, DataProto.from_dict(tensors=tensors))  # type: ignore[arg-type]
    expected = ppo_policy_loss(new, old, adv, mask, token_weights=weights).loss
    assert whole.item() == pytest.approx(expected.item(), rel=1e-6)
    unweighted = {k: v for k, v in tensors.items() if k != fields.ROLLOUT_IS_WEIGHTS}
    plain, _ = ppo_actor_loss({"log_probs": new}, DataProto.from_dict(tensors=unweighted))  # type: ignore[arg-type]
    assert plain.item() != pytest.approx(whole.item())
    # Uneven micro-batches (2 rows + 1 row) with the engine's totals add up to the whole.
    totals = {"tokens": 7.0, "sequences": 3.0}
    shares = 0.0
    for rows in (slice(0, 2), slice(2, 3)):
        part = DataProto.from_dict(
            tensors={k: v[rows] for k, v in tensors.items()},
            meta_info={fields.MINI_BATCH_TOTALS: totals},
        )
        share, _ = ppo_actor_loss({"log_probs": new[rows]}, part)  # type: ignore[arg-type]
        shares += share.item()
    assert shares == pytest.approx(whole.item(), rel=1e-6)


def test_apply_rollout_correction_writes_weights_only_when_on() -> None:
    tensors = {
        fields.OLD_LOG_PROBS: OLD,
        fields.ROLLOUT_LOG_PROBS: ROLLOUT,
        fields.RESPONSE_MASK: MASK,
    }
    batch = DataProto.from_dict(tensors=dict(tensors))
    metrics = apply_rollout_correction(batch, RolloutCorrectionSection(mode="off"))
    assert "rollout_correction/kl_k1" in metrics
    assert batch.batch is not None and fields.ROLLOUT_IS_WEIGHTS not in batch.batch
    metrics = apply_rollout_correction(batch, RolloutCorrectionSection(mode="tis"))
    torch.testing.assert_close(
        batch.batch[fields.ROLLOUT_IS_WEIGHTS], torch.tensor([[2.0, 0.25, 1.0, 0.0]])
    )
    assert metrics["rollout_correction/clipped_frac"] == pytest.approx(1 / 3)
    update = for_worker(batch, ACTOR_UPDATE_FIELDS)  # what the driver sends update_actor
    assert update.batch is not None and fields.ROLLOUT_IS_WEIGHTS in update.batch
    no_rollout = DataProto.from_dict(
        tensors={fields.OLD_LOG_PROBS: OLD, fields.RESPONSE_MASK: MASK}
    )
    assert apply_rollout_correction(no_rollout, RolloutCorrectionSection(mode="off")) == {}
    with pytest.raises(KeyError, match="rollout_log_probs"):
        apply_rollout_correction(no_rollout, RolloutCorrectionSection(mode="mis"))


def test_the_actor_loss_takes_old_log_probs_from_its_own_forward_when_told() -> None:
    """``old_log_probs_from_update``: no old_log_probs in the batch, ratio 1 everywhere,
    and the correction the driver would apply is applied in the loss, with its metrics."""
    log_probs = OLD.clone().requires_grad_(True)  # the current policy's forward
    adv = torch.tensor([[1.0, -1.0, 0.5, 0.0]])
    fused = DataProto.from_dict(
        tensors={
            fields.RESPONSE_MASK: MASK,
            fields.ADVANTAGES: adv,
            fields.ROLLOUT_LOG_PROBS: ROLLOUT,
        },
        meta_info={fields.OLD_LOG_PROBS_FROM_UPDATE: True},
    )
    tis = RolloutCorrectionSection(mode="tis", rollout_is_cap=2.0)
    loss, metrics = ppo_actor_loss({"log_probs": log_probs}, fused, rollout_correction=tis)  # type: ignore[arg-type]
    # The driver's path: old_log_probs recomputed (equal to the forward), weights written.
    driver = DataProto.from_dict(
        tensors={
            fields.RESPONSE_MASK: MASK,
            fields.ADVANTAGES: adv,
            fields.OLD_LOG_PROBS: OLD,
            fields.ROLLOUT_LOG_PROBS: ROLLOUT,
        }
    )
    driver_metrics = apply_rollout_correction(driver, tis)
    update = for_worker(driver, ACTOR_UPDATE_FIELDS)
    expected, expected_metrics = ppo_actor_loss({"log_probs": OLD}, update)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    # ratio 1: the loss is minus the weighted advantage, weights 2, 0.25, 1 over 3 tokens
    assert loss.item() == pytest.approx(-(2.0 * 1.0 - 0.25 * 1.0 + 1.0 * 0.5) / 3, rel=1e-6)
    assert metrics["ppo_kl"] == 0.0 and expected_metrics["ppo_kl"] == pytest.approx(0.0)
    for name, value in driver_metrics.items():
        assert metrics[name] == pytest.approx(value, rel=1e-6), name
    loss.backward()
    assert log_probs.grad is not None and log_probs.grad.abs().sum() > 0
    # Without the flag a missing old_log_probs is an error naming who writes it.
    unflagged = DataProto.from_dict(tensors={fields.RESPONSE_MASK: MASK, fields.ADVANTAGES: adv})
    with pytest.raises(KeyError, match="compute_log_prob"):
        ppo_actor_loss({"log_probs": OLD}, unflagged)  # type: ignore[arg-type]


def test_the_resolved_section_is_what_the_loss_takes() -> None:
    section = RolloutCorrectionSection(rollout_is_cap=3.0, level="sequence")
    assert section.resolved("off") == RolloutCorrectionSection(
        mode="off", level="sequence", rollout_is_cap=3.0
    )
    assert section.resolved("one_step_off").mode == "tis"
    assert RolloutCorrectionSection(mode="mis").resolved("off").enabled


def test_auto_is_tis_for_the_async_modes_and_off_in_the_synchronous_loop() -> None:
    auto = RolloutCorrectionSection(rollout_is_cap=3.0)
    assert auto.mode == "auto" and not auto.enabled
    assert auto.resolved("off").mode == "off"
    for mode in ("one_step_off", "fully_async"):
        assert auto.resolved(mode) == RolloutCorrectionSection(mode="tis", rollout_is_cap=3.0)
    explicit = RolloutCorrectionSection(mode="off")
    assert explicit.resolved("fully_async") is explicit  # a chosen mode is kept


MODEL = [
    "+actor.engine.model.hf_config.model_type=llama",
    f"data.tokenizer_path={Path(__file__).parent}",
    "rollout.n=4",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=8",
]


def test_config_section_and_its_checks() -> None:
    config = load_config(
        RLConfig,
        overrides=[
            *MODEL,
            "algorithm.rollout_correction.mode=mis",
            "algorithm.rollout_correction.level=sequence",
            "algorithm.rollout_correction.mis_high=3.0",
        ],
    )
    spec = config.algorithm.rollout_correction
    assert (spec.mode, spec.level, spec.mis_high, spec.enabled) == ("mis", "sequence", 3.0, True)
    with pytest.raises(ConfigurationError, match=re.escape("actor.use_rollout_log_probs=false")):
        load_config(
            RLConfig,
            overrides=[
                *MODEL,
                "algorithm.rollout_correction.mode=tis",
                "actor.use_rollout_log_probs=true",
            ],
        )
    with pytest.raises(ConfigurationError, match=re.escape("rollout_is_cap=-1.0")):
        load_config(RLConfig, overrides=[*MODEL, "algorithm.rollout_correction.rollout_is_cap=-1"])
    with pytest.raises(ConfigurationError, match=re.escape("mis_low=1.2")):
        RolloutCorrectionSection(mode="mis", mis_low=1.2)
    with pytest.raises(ConfigurationError, match="expected one of"):  # the Literal
        load_config(RLConfig, overrides=[*MODEL, "algorithm.rollout_correction.mode=truncate"])


def test_verl_rollout_is_keys() -> None:
    verl = [
        "algorithm.rollout_is_mode=mask",
        "algorithm.rollout_is_threshold=3.0",
        "algorithm.rollout_is_threshold_lower=0.4",
        "algorithm.rollout_is_level=geometric",
    ]
    spec = load_config(RLConfig, overrides=[*MODEL, *verl]).algorithm.rollout_correction
    assert spec == RolloutCorrectionSection("mis", "sequence", 3.0, 0.4, 3.0)
    # verl's "sequence" level is the product of the ratios: not ours
    with pytest.raises(ConfigurationError, match="'geometric', 'token'"):
        load_config(RLConfig, overrides=[*MODEL, "algorithm.rollout_is_level=sequence"])
    with pytest.raises(ConfigurationError, match="mode=off for no correction"):
        load_config(RLConfig, overrides=[*MODEL, "algorithm.rollout_is_threshold=null"])


def test_off_is_a_word_not_a_yaml_boolean(tmp_path: Path) -> None:
    # YAML 1.1 reads an unquoted off as False; the Literal field takes it as "off".
    config = load_config(RLConfig, overrides=[*MODEL, "algorithm.rollout_correction.mode=off"])
    assert config.algorithm.rollout_correction.mode == "off"
    path = tmp_path / "run.yaml"
    path.write_text(
        "algorithm:\n  rollout_correction:\n    mode: off\ntrainer:\n  progress_bar: off\n"
    )
    config = load_config(RLConfig, path, overrides=MODEL)
    assert config.algorithm.rollout_correction.mode == "off"
    assert config.trainer.progress_bar is False  # a bool field keeps YAML's boolean
