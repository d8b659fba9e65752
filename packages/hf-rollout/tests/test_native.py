"""The native backend checked against transformers on tiny local models (CPU, fp32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hf_protocol import DataProto, fields
from hf_rollout import RolloutConfig, SamplingConfig
from hf_rollout.backends.native import NativeRollout
from hf_rollout.testing import make_prompts, random_prompt_ids

PAD = 0


def engine_for(path: Path, **options: object) -> NativeRollout:
    return NativeRollout(RolloutConfig(model_path=str(path), pad_token_id=PAD, **options))  # type: ignore[arg-type]


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers-forward"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_greedy_equals_transformers_generate(
    tiny_models: dict[str, Path], hf: Any, family: str, lean: bool
) -> None:
    prompts = make_prompts(random_prompt_ids(12, seed=1), PAD)
    engine = engine_for(tiny_models[family], engine_kwargs={"lean_forward": lean})
    assert (engine.decoder is not None) == lean
    # An eos that shows up in some greedy outputs, so early exit of finished rows is exercised.
    out, eos = hf.check_greedy(engine, tiny_models[family], prompts)
    responses = out.batch["responses"]
    finished = (responses == eos).any(dim=1)
    assert finished.any() and not finished.all()
    assert out.batch["response_mask"].sum() == (responses != PAD).sum()


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers-forward"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_log_probs_agree_with_a_forward_pass(
    tiny_models: dict[str, Path], hf: Any, family: str, lean: bool
) -> None:
    prompts = make_prompts(random_prompt_ids(6, seed=2), PAD)
    sampling = SamplingConfig(n=2, temperature=0.7, top_p=0.9, max_new_tokens=8, seed=3)
    engine = engine_for(tiny_models[family], engine_kwargs={"lean_forward": lean})
    out = engine.generate(prompts, sampling)
    expected = hf.log_probs(tiny_models[family], out, temperature=0.7)
    mask = out.batch["response_mask"].bool()
    assert torch.allclose(out.batch["rollout_log_probs"][mask], expected[mask], atol=1e-5)
    assert (out.batch["rollout_log_probs"][~mask] == 0).all()
    assert out.meta_info["temperature"] == 0.7


def test_update_weights_switches_to_the_other_model(tiny_models: dict[str, Path], hf: Any) -> None:
    prompts = make_prompts(random_prompt_ids(8, seed=4), PAD)
    sampling = SamplingConfig(greedy=True, max_new_tokens=6, eos_token_id=1)
    engine = engine_for(tiny_models["qwen2"])
    before = engine.generate(prompts, sampling).batch["responses"]
    other = hf.model(tiny_models["qwen2_other"])
    engine.update_weights(iter(other.state_dict().items()))  # tied names included
    after = engine.generate(prompts, sampling).batch["responses"]
    expected = hf.greedy(tiny_models["qwen2_other"], prompts, max_new_tokens=6, eos=1)
    assert torch.equal(after, hf.trim(expected, after.shape[1]))
    assert not torch.equal(before, after)


def test_update_weights_rejects_unknown_names_and_shapes(tiny_models: dict[str, Path]) -> None:
    engine = engine_for(tiny_models["qwen2"])
    with pytest.raises(KeyError, match=r"no tensor 'model\.nope'"):
        engine.update_weights([("model.nope", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(3,\)"):
        engine.update_weights([("model.norm.weight", torch.zeros(3))])


def test_n_samples_are_interleaved_and_seeded(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts(random_prompt_ids(3, seed=5), PAD)
    prompts.non_tensor_batch["uid"] = np.array(["a", "b", "c"], dtype=object)
    engine = engine_for(tiny_models["llama"])
    sampling = SamplingConfig(n=4, max_new_tokens=6, seed=11, eos_token_id=1)
    out = engine.generate(prompts, sampling)
    assert len(out) == 12
    assert out.non_tensor_batch["uid"].tolist() == [u for u in "abc" for _ in range(4)]
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(4, 0))
    assert len({tuple(row.tolist()) for row in out.batch["responses"][:4]}) > 1
    again = engine.generate(prompts, sampling)
    assert torch.equal(out.batch["responses"], again.batch["responses"])


def test_stop_tokens_end_a_row_and_are_kept(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts(random_prompt_ids(10, seed=6), PAD)
    engine = engine_for(tiny_models["llama"])
    free = engine.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=8, eos_token_id=1))
    stop = int(free.batch["responses"][0, 1])  # the 2nd token of row 0 becomes a stop token
    first = free.batch["responses"][0].tolist().index(stop)
    out = engine.generate(
        prompts, SamplingConfig(greedy=True, max_new_tokens=8, stop_token_ids=(stop,))
    )
    responses, mask = out.batch["responses"], out.batch["response_mask"]
    for row in range(len(out)):
        tokens = responses[row][mask[row].bool()].tolist()
        if stop in tokens:
            assert tokens.index(stop) == len(tokens) - 1  # stop kept, nothing after it
        else:
            assert len(tokens) == 8
    assert mask[0].sum() == first + 1


def test_max_new_tokens_and_max_model_len_cap_the_length(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts([[5, 6, 7], [8, 9]], PAD)
    sampling = SamplingConfig(max_new_tokens=5, eos_token_id=1, seed=0)
    out = engine_for(tiny_models["qwen2"]).generate(prompts, sampling)
    assert out.batch["responses"].shape[1] <= 5
    capped = engine_for(tiny_models["qwen2"], max_model_len=6).generate(prompts, sampling)
    assert capped.batch["response_mask"][0].sum() <= 3  # 3 prompt tokens + 3 new = 6


def test_empty_prompt_list_gives_an_empty_batch(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts([], PAD)
    out = engine_for(tiny_models["qwen2"]).generate(prompts, SamplingConfig(n=2))
    assert len(out) == 0
    assert set(out.batch.keys()) >= {"responses", "response_mask", "rollout_log_probs"}


def test_over_long_prompt_names_the_limit(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts([[5] * 3, [5] * 20], PAD)
    engine = engine_for(tiny_models["qwen2"], max_model_len=16)
    with pytest.raises(ValueError, match=r"row 1 has 20 tokens, but max_model_len=16"):
        engine.generate(prompts, SamplingConfig())


def test_raw_token_lists_give_the_same_result(tiny_models: dict[str, Path]) -> None:
    token_lists = random_prompt_ids(5, seed=7)
    raw = DataProto.from_dict(non_tensors={"raw_prompt_ids": token_lists})
    engine = engine_for(tiny_models["qwen2"])
    sampling = SamplingConfig(greedy=True, max_new_tokens=5, eos_token_id=1)
    from_raw = engine.generate(raw, sampling)
    from_tensors = engine.generate(make_prompts(token_lists, PAD), sampling)
    for key in ("input_ids", "attention_mask", "position_ids", "rollout_log_probs"):
        assert torch.equal(from_raw.batch[key], from_tensors.batch[key])


def test_top_k_one_is_greedy(tiny_models: dict[str, Path]) -> None:
    prompts = make_prompts(random_prompt_ids(6, seed=8), PAD)
    engine = engine_for(tiny_models["llama"])
    greedy = engine.generate(prompts, SamplingConfig(greedy=True, max_new_tokens=6, eos_token_id=1))
    top1 = engine.generate(prompts, SamplingConfig(top_k=1, max_new_tokens=6, eos_token_id=1))
    assert torch.equal(greedy.batch["responses"], top1.batch["responses"])


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers-forward"])
def test_compacting_finished_rows_changes_nothing(tiny_models: dict[str, Path], lean: bool) -> None:
    prompts = make_prompts(random_prompt_ids(12, seed=1), PAD)
    sampling = SamplingConfig(n=2, max_new_tokens=10, seed=5, stop_token_ids=(3, 4, 5, 6, 7))
    always = engine_for(
        tiny_models["llama"], engine_kwargs={"compact_fraction": 0.0, "lean_forward": lean}
    )
    never = engine_for(
        tiny_models["llama"], engine_kwargs={"compact_fraction": 1.0, "lean_forward": lean}
    )
    a, b = always.generate(prompts, sampling), never.generate(prompts, sampling)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.allclose(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=1e-5)


def test_sleep_and_wake_up(tiny_models: dict[str, Path]) -> None:
    engine = engine_for(tiny_models["qwen2"])
    prompts = make_prompts([[5, 6]], PAD)
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep; call wake_up"):
        engine.generate(prompts, SamplingConfig())
    engine.wake_up()
    assert len(engine.generate(prompts, SamplingConfig(max_new_tokens=2))) == 1


def test_unknown_engine_kwargs_are_an_error(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"unknown engine_kwargs \['gpu_memory'\]"):
        engine_for(tiny_models["qwen2"], engine_kwargs={"gpu_memory": 0.5})


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers-forward"])
def test_samples_share_one_prefill_with_the_same_result(
    tiny_models: dict[str, Path], lean: bool
) -> None:
    """n samples per prompt prefill each prompt once and copy its cache row: the same
    tokens as sampling once from each prompt repeated n times (the engine's generator
    restarted from one seed: the same stream)."""
    ids = random_prompt_ids(4, seed=5)
    engine = engine_for(tiny_models["qwen2"], engine_kwargs={"lean_forward": lean})
    engine.reseed(11)
    shared = engine.generate(make_prompts(ids, PAD), SamplingConfig(n=3, max_new_tokens=6))
    engine.reseed(11)
    repeated = engine.generate(
        make_prompts([p for p in ids for _ in range(3)], PAD),
        SamplingConfig(n=1, max_new_tokens=6),
    )
    assert torch.equal(shared.batch["responses"], repeated.batch["responses"])
    torch.testing.assert_close(
        shared.batch["rollout_log_probs"], repeated.batch["rollout_log_probs"]
    )


def test_seeded_rows_sample_the_same_however_the_request_is_split(
    tiny_models: dict[str, Path],
) -> None:
    """With a request seed each prompt row draws from its own stream, keyed by its
    ``prompt_index``: two halves sent apart (as two rollout workers get them) sample exactly
    what the whole request samples."""
    ids = random_prompt_ids(6, seed=3)
    engine = engine_for(tiny_models["qwen2"])
    sampling = SamplingConfig(n=2, max_new_tokens=6, seed=21, temperature=1.5)

    def request(rows: range) -> DataProto:
        prompts = make_prompts([ids[i] for i in rows], PAD)
        assert prompts.batch is not None
        prompts.batch[fields.PROMPT_INDEX] = torch.tensor(list(rows))
        return prompts

    whole = engine.generate(request(range(6)), sampling)
    halves = [engine.generate(request(rows), sampling) for rows in (range(4), range(4, 6))]
    joined = torch.cat([half.batch["responses"] for half in halves])
    assert torch.equal(whole.batch["responses"], joined)
    unindexed = engine.generate(make_prompts(ids[4:], PAD), sampling)  # rows counted from 0
    assert not torch.equal(unindexed.batch["responses"], halves[1].batch["responses"])
