"""RolloutWorker with ``RolloutConfig.multi_turn``: episodes of the agent loop through a
local worker group, on a tiny model with a character tokenizer built here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_controller import LocalWorkerGroup, RayClassWithInitArgs, WorkerGroupError
from hf_protocol import fields
from hf_rollout import MultiTurnConfig, RolloutConfig, SamplingConfig
from hf_rollout.multiturn import StepResult
from hf_rollout.multiturn.agent import TokenizerCodec
from hf_rollout.testing import make_prompts, random_prompt_ids
from hf_rollout.workers import RolloutWorker

PAD = 0


class ReplyTwice:
    """Replies ``<r>`` to the first model turn and ends the episode at the second."""

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        self.turns = 0

    def step(self, model_text: str) -> StepResult:
        self.turns += 1
        return StepResult("<r>", reward=1.0, tool_calls=1, done=self.turns >= 2)


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A character tokenizer (``<pad>`` 0, ``<eos>`` 1, printable ASCII) saved to a directory."""
    vocab = {"<pad>": 0, "<eos>": 1, **{chr(c): c - 30 for c in range(32, 127)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    directory = tmp_path_factory.mktemp("char-tokenizer")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(directory)
    return directory


def group(model: Path, multi_turn: MultiTurnConfig) -> LocalWorkerGroup:
    config = RolloutConfig(model_path=str(model), pad_token_id=PAD, multi_turn=multi_turn)
    return LocalWorkerGroup(
        world_size=1, ray_cls_with_init=RayClassWithInitArgs(RolloutWorker, config)
    )


def test_codec_adds_no_special_tokens(char_tokenizer: Path) -> None:
    codec = TokenizerCodec.from_path(str(char_tokenizer))
    assert codec.encode("<r>") == [ord("<") - 30, ord("r") - 30, ord(">") - 30]
    assert codec.decode([*codec.encode("a b"), 1]) == "a b"  # the eos is dropped


def test_worker_runs_episodes_within_the_budget(
    tiny_models: dict[str, Path], char_tokenizer: Path
) -> None:
    spec = f"{__file__}:ReplyTwice"
    workers = group(
        tiny_models["llama"],
        MultiTurnConfig(
            tokenizer_path=str(char_tokenizer), environment=spec, max_tokens_per_turn=4
        ),
    )
    workers.init_model()
    prompts = make_prompts(random_prompt_ids(3, seed=1), PAD)
    prompts.meta_info["sampling"] = SamplingConfig(n=2, max_new_tokens=12, seed=0)
    out = workers.generate_sequences(prompts)
    assert out.batch is not None
    responses, mask = out.batch[fields.RESPONSES], out.batch[fields.RESPONSE_MASK]
    assert responses.shape == (6, 12)  # padded to the episode budget
    width = out.batch[fields.PROMPTS].shape[1]
    attended = out.batch[fields.ATTENTION_MASK][:, width:]
    assert (out.non_tensor_batch[fields.NUM_TURNS] == 2).all()
    assert out.non_tensor_batch[fields.ENV_REWARD].tolist() == [2.0] * 6
    reply = TokenizerCodec.from_path(str(char_tokenizer)).encode("<r>")
    for row in range(6):
        keep = attended[row].bool()
        ids, bits = responses[row][keep].tolist(), mask[row][keep].tolist()
        first = bits.index(0)  # the first turn (<= 4 tokens), then the reply, then turn 2
        assert 1 <= first <= 4 and ids[first : first + 3] == reply
        assert bits[first : first + 3] == [0, 0, 0] and all(bits[first + 3 :])
        assert len(ids) - first - 3 <= 4
    # model tokens only (one value per rank)
    lengths = out.meta_info[fields.METRICS]["rollout/response_length"]
    assert lengths == [pytest.approx(float(mask.sum(-1).float().mean()))]
    assert torch.all(out.batch[fields.ROLLOUT_LOG_PROBS][mask == 0] == 0)


def test_a_bad_environment_fails_init_naming_it(
    tiny_models: dict[str, Path], char_tokenizer: Path
) -> None:
    workers = group(
        tiny_models["llama"],
        MultiTurnConfig(tokenizer_path=str(char_tokenizer), environment="browser"),
    )
    with pytest.raises(WorkerGroupError, match="unknown environment 'browser'"):
        workers.init_model()
