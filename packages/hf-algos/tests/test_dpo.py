"""DPO losses, the adjacent-pair engine loss function and online preference pairs."""

from __future__ import annotations

import functools
import math
import pickle

import numpy as np
import pytest
import torch

from hf_algos.data import build_preference_pairs, make_preference_batch
from hf_algos.losses import dpo_loss, dpo_loss_fn
from hf_protocol import DataProto, fields

# One pair: policy chosen -1, rejected -2; reference -1.5 for both -> margin h = 1.
POLICY_W, POLICY_L = torch.tensor([-1.0]), torch.tensor([-2.0])
REF_W, REF_L = torch.tensor([-1.5]), torch.tensor([-1.5])


@pytest.mark.parametrize(
    ("loss_type", "smoothing", "expected"),
    [
        ("sigmoid", 0.0, math.log1p(math.exp(-0.1))),  # -log sigmoid(0.1)
        ("sigmoid", 0.1, 0.9 * math.log1p(math.exp(-0.1)) + 0.1 * math.log1p(math.exp(0.1))),
        ("ipo", 0.0, (1.0 - 1 / 0.2) ** 2),
        ("hinge", 0.0, 1.0 - 0.1),
    ],
)
def test_losses_by_hand(loss_type: str, smoothing: float, expected: float) -> None:
    out = dpo_loss(
        POLICY_W, POLICY_L, REF_W, REF_L, beta=0.1, loss_type=loss_type, label_smoothing=smoothing
    )
    assert out.losses.item() == pytest.approx(expected, rel=1e-6)
    assert out.chosen_rewards.item() == pytest.approx(0.05)
    assert out.rejected_rewards.item() == pytest.approx(-0.05)


def test_sigmoid_gradient_pushes_chosen_up_and_rejected_down() -> None:
    chosen = POLICY_W.clone().requires_grad_(True)
    rejected = POLICY_L.clone().requires_grad_(True)
    dpo_loss(chosen, rejected, REF_W, REF_L, beta=0.1).losses.sum().backward()
    sigma = 1 / (1 + math.exp(0.1))  # d(-log sigmoid(b h))/dh = -b * sigmoid(-b h)
    assert chosen.grad is not None and rejected.grad is not None
    assert chosen.grad.item() == pytest.approx(-0.1 * sigma, rel=1e-6)
    assert rejected.grad.item() == pytest.approx(0.1 * sigma, rel=1e-6)


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(ValueError, match="choose one of sigmoid, ipo, hinge"):
        dpo_loss(POLICY_W, POLICY_L, REF_W, REF_L, loss_type="kto")
    with pytest.raises(ValueError, match=r"beta=0\.0 must be > 0"):
        dpo_loss(POLICY_W, POLICY_L, REF_W, REF_L, beta=0.0)


def pair_batch() -> tuple[dict[str, torch.Tensor], DataProto]:
    # Rows 0/1 and 2/3 are pairs; column 2 of row 0 is padding and must not count.
    log_probs = torch.tensor([[-0.5, -0.5, -9.0], [-1.0, -1.0, -1.0], [-2.0, 0, 0], [-1.0, 0, 0]])
    ref = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, -1.0, -1.0], [-1.0, 0, 0], [-1.0, 0, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 0, 0]])
    batch = DataProto.from_dict(tensors={"ref_log_prob": ref, "response_mask": mask})
    return {"log_probs": log_probs}, batch


def test_dpo_loss_fn_pairs_adjacent_rows() -> None:
    outputs, batch = pair_batch()
    loss, metrics = dpo_loss_fn(outputs, batch, beta=0.5)  # type: ignore[arg-type]
    # pair 1: chosen -1 vs ref -2 (+1), rejected -3 vs ref -3 (0): h = 1.
    # pair 2: chosen -2 vs ref -1 (-1), rejected -1 vs ref -1 (0): h = -1.
    expected = (math.log1p(math.exp(-0.5)) + math.log1p(math.exp(0.5))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["reward_chosen"] == pytest.approx((0.5 - 0.5) / 2)
    assert metrics["reward_margin"] == pytest.approx(0.0)
    assert metrics["reward_accuracy"] == pytest.approx(0.5)
    restored = pickle.loads(pickle.dumps(functools.partial(dpo_loss_fn, beta=0.5)))
    assert restored(outputs, batch)[0].item() == loss.item()


def test_ipo_averages_each_response_over_its_tokens() -> None:
    # IPO's margin uses per-token average log-ratios (as TRL's DPOTrainer and the IPO
    # authors' reported results); summed log-ratios made the squared loss grow with length.
    outputs, batch = pair_batch()
    loss, metrics = dpo_loss_fn(outputs, batch, beta=0.5, loss_type="ipo")  # type: ignore[arg-type]
    # pair 1: chosen +1 over 2 tokens, rejected 0 over 3 -> 0.5; pair 2: -1 over 1 token.
    expected = ((0.5 - 1.0) ** 2 + (-1.0 - 1.0) ** 2) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["reward_margin"] == pytest.approx(0.0)  # rewards stay sequence sums
    by_hand = dpo_loss(
        POLICY_W,
        POLICY_L,
        REF_W,
        REF_L,
        beta=0.1,
        loss_type="ipo",
        chosen_lengths=torch.tensor([2.0]),
        rejected_lengths=torch.tensor([4.0]),
    )
    assert by_hand.losses.item() == pytest.approx((0.25 + 0.125 - 5.0) ** 2, rel=1e-6)


def test_dpo_loss_fn_rejects_odd_micro_batches() -> None:
    outputs, batch = pair_batch()
    with pytest.raises(ValueError, match="even"):
        dpo_loss_fn({"log_probs": outputs["log_probs"][:3]}, batch[:3])  # type: ignore[arg-type,index]


def test_build_preference_pairs_best_versus_worst() -> None:
    scores = torch.tensor([0.2, 1.0, 0.0, 0.5, 0.5, 3.0, 1.0, 0.0])
    uids = ["a", "a", "a", "b", "b", "c", "d", "d"]
    # a: best row 1, worst row 2; b: tie -> no pair; c: alone; d: 6 over 7.
    assert build_preference_pairs(scores, uids) == [(1, 2), (6, 7)]
    assert build_preference_pairs(scores, uids, min_margin=1.0) == []


def test_make_preference_batch_interleaves_chosen_and_rejected() -> None:
    data = DataProto.from_dict(
        tensors={
            "token_level_scores": torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0], [0.0, 0.0]])
        },
        non_tensors={"uid": np.array(["x", "x", "y", "y"], dtype=object), "row": [0, 1, 2, 3]},
    )
    pairs = make_preference_batch(data)
    assert pairs.non_tensor_batch["row"].tolist() == [0, 1, 2, 3]
    swapped = make_preference_batch(data, scores=torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert swapped.non_tensor_batch["row"].tolist() == [1, 0, 3, 2]


def test_dpo_shares_of_pair_micro_batches_add_up_and_a_filler_pair_adds_nothing() -> None:
    outputs, batch = pair_batch()
    whole, _ = dpo_loss_fn(outputs, batch, beta=0.5)  # type: ignore[arg-type]
    totals = {fields.MINI_BATCH_TOTALS: {"tokens": 8.0, "sequences": 4.0}}
    shares = []
    for start in (0, 2):
        part = batch[start : start + 2]  # type: ignore[index]
        part.meta_info.update(totals)
        log_probs = {"log_probs": outputs["log_probs"][start : start + 2]}
        shares.append(dpo_loss_fn(log_probs, part, beta=0.5)[0])  # type: ignore[arg-type]
    torch.testing.assert_close(shares[0] + shares[1], whole)
    filler = batch[0:2]  # type: ignore[index]
    filler.batch["response_mask"] = torch.zeros_like(filler.batch["response_mask"])
    filler.meta_info.update(totals)
    log_probs = outputs["log_probs"][0:2].clone().requires_grad_(True)
    share, _ = dpo_loss_fn({"log_probs": log_probs}, filler, beta=0.5)  # type: ignore[arg-type]
    share.backward()
    assert float(share.detach()) == 0.0
    assert log_probs.grad is not None and not log_probs.grad.any()
