"""data.prompt_format: chat / raw / few_shot / auto prompts, refusals and the start-up line,
with real character tokenizers built locally (one with a chat template, one without, as a
base model's)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from hf_algos.config import DPOConfig, RLConfig, SFTConfig, load_config
from hf_algos.config.actor import ActorSection
from hf_algos.config.data import DataSection
from hf_algos.data import (
    PreferenceDataset,
    PreferenceDatasetConfig,
    RLDataset,
    RLDatasetConfig,
    SFTDataset,
    build_char_tokenizer,
    write_rows,
)
from hf_algos.data.few_shot import FewShotExample, FewShotExamples, draw_examples
from hf_algos.data.prompts import announce_prompt_format, prompt_format_line, prompt_options
from hf_algos.data.rl_dataset import rl_dataset
from hf_algos.data.sources import load_parts
from hf_algos.data.template_check import directory_has_chat_template
from hf_algos.data.tokenizer import PRINTABLE_CHARACTERS
from hf_controller import ConfigurationError
from hf_engines.config import EngineConfig, ModelConfig

MODEL = "+actor.engine.model.hf_config.model_type=llama"
BASE = [MODEL, "rollout.n=4", "data.train_batch_size=4", "actor.ppo_mini_batch_size=8"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Saved tokenizer directories: ``chat`` (with a template) and ``base`` (without)."""
    root = tmp_path_factory.mktemp("tokenizers")
    build_char_tokenizer(root / "chat")
    # a blank line is one token of its own (the default characters hold single newlines)
    build_char_tokenizer(root / "base", None, characters=(*PRINTABLE_CHARACTERS, "\n\n"))
    return {"chat": root / "chat", "base": root / "base"}


def _load(path: Path):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _rows(count: int) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"{i}+{i}="}],
            "data_source": "toy",
            "reward_model": {"ground_truth": str(2 * i)},
        }
        for i in range(count)
    ]


def _decoded(tokenizer, dataset: RLDataset) -> list[str]:  # type: ignore[no-untyped-def]
    return [tokenizer.decode(dataset[i]["input_ids"]) for i in range(len(dataset))]


def test_template_files_tell_base_from_chat_tokenizers(tokenizers: dict[str, Path]) -> None:
    assert directory_has_chat_template(tokenizers["chat"]) is True
    assert directory_has_chat_template(tokenizers["base"]) is False
    assert directory_has_chat_template(tokenizers["base"].parent) is None  # no tokenizer there


def test_chat_on_a_base_tokenizer_is_refused_at_config_time(tokenizers: dict[str, Path]) -> None:
    base = f"data.tokenizer_path={tokenizers['base']}"
    with pytest.raises(ConfigurationError) as refused:
        load_config(RLConfig, overrides=[*BASE, base, "data.prompt_format=chat"])
    message = str(refused.value)
    assert str(tokenizers["base"]) in message and "has no chat template" in message
    assert "data.prompt_format=raw" in message and "few_shot" in message
    with pytest.raises(ConfigurationError, match="has no chat template"):
        load_config(SFTConfig, overrides=[MODEL, base, "data.prompt_format=chat"])
    chat = load_config(
        RLConfig,
        overrides=[*BASE, f"data.tokenizer_path={tokenizers['chat']}", "data.prompt_format=chat"],
    )
    assert chat.data.prompt_format == "chat"
    # auto and raw load on a base tokenizer
    assert load_config(RLConfig, overrides=[*BASE, base]).data.prompt_format == "auto"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["data.prompt_format=chat", "data.apply_chat_template=false"], "contradict each other"),
        (["data.prompt_format=few_shot"], r"needs data.few_shot >= 1"),
        (["data.few_shot=2"], "only under data.prompt_format=few_shot"),
        (["data.prompt_format=chat", "data.raw_suffix=x"], "raw_suffix is added to raw-text"),
        (
            ["data.prompt_format=few_shot", "data.few_shot=2", "data.few_shot_template=Q {q}"],
            r"must hold \{question\} and \{answer\}",
        ),
        (["data.prompt_format=few_shot", "data.few_shot=2"], "both are empty"),
    ],
)
def test_contradictory_settings_are_refused(
    tokenizers: dict[str, Path], overrides: list[str], match: str
) -> None:
    tokenizer = f"data.tokenizer_path={tokenizers['chat']}"
    with pytest.raises(ConfigurationError, match=match):
        load_config(RLConfig, overrides=[*BASE, tokenizer, *overrides])


def test_few_shot_is_refused_for_sft_and_offline_dpo(
    tmp_path: Path, tokenizers: dict[str, Path]
) -> None:
    files = str(write_rows(_rows(4), tmp_path / "train.jsonl"))
    few = [
        f"data.tokenizer_path={tokenizers['base']}",
        f"data.train_files=[{files}]",
        "data.prompt_format=few_shot",
        "data.few_shot=1",
    ]
    with pytest.raises(ConfigurationError, match="SFT rows carry their own targets"):
        load_config(SFTConfig, overrides=[MODEL, *few])
    pairs = [MODEL, "actor.engine.micro_batch.micro_batch_size=2", *few]
    with pytest.raises(ConfigurationError, match="offline DPO rows"):
        load_config(DPOConfig, overrides=pairs)
    online = load_config(DPOConfig, overrides=[*pairs, "dpo.online=true", "rollout.n=2"])
    assert online.data.few_shot == 1


def test_auto_picks_raw_on_a_base_tokenizer_and_says_why(
    tokenizers: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base, chat = _load(tokenizers["base"]), _load(tokenizers["chat"])
    line = announce_prompt_format(DataSection(), base)
    assert line == (
        f"data: prompts are raw text: tokenizer {tokenizers['base']} has no chat template "
        "(data.prompt_format=auto)"
    )
    assert capsys.readouterr().out == line + "\n"  # one line
    assert prompt_format_line(DataSection(), chat) == (
        f"data: prompts are chat-templated: tokenizer {tokenizers['chat']} has a chat "
        "template (data.prompt_format=auto)"
    )
    raw = prompt_format_line(DataSection(prompt_format="raw", raw_suffix="\nA:"), chat)
    suffixed = "raw text + data.raw_suffix '\\nA:'"
    assert raw == f"data: prompts are {suffixed}: asked for (data.prompt_format=raw)"
    verl_raw = prompt_format_line(DataSection(apply_chat_template=False), chat)
    assert verl_raw.endswith("(data.prompt_format=auto, data.apply_chat_template=false)")
    # at start-up, before any data loads: the tokenizer decides where its files could not
    with pytest.raises(ConfigurationError, match=r"has no chat template.*data.prompt_format=raw"):
        prompt_format_line(DataSection(prompt_format="chat"), base)


def test_apply_chat_template_false_is_raw(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    chat = _load(tokenizers["chat"])
    files = (str(write_rows(_rows(3), tmp_path / "train.jsonl")),)
    verl = DataSection(train_files=files, apply_chat_template=False)
    raw = DataSection(train_files=files, prompt_format="raw")
    assert verl.resolved_prompt_format == raw.resolved_prompt_format == "raw"
    assert prompt_options(verl) == prompt_options(raw)
    texts = _decoded(chat, rl_dataset(verl, files, chat))
    assert texts == _decoded(chat, rl_dataset(raw, files, chat)) == ["0+0=", "1+1=", "2+2="]
    templated = _decoded(chat, rl_dataset(DataSection(train_files=files), files, chat))
    assert templated[0] == "<|user|>0+0=<|assistant|>"


def test_raw_suffix_and_chat_refusal_in_every_dataset(tokenizers: dict[str, Path]) -> None:
    base = _load(tokenizers["base"])
    suffixed = RLDataset(
        _rows(2), base, RLDatasetConfig(use_chat_template=False, raw_suffix="\nA:")
    )
    assert _decoded(base, suffixed) == ["0+0=\nA:", "1+1=\nA:"]
    with pytest.raises(ConfigurationError, match=r"data\.prompt_format=raw"):
        RLDataset(_rows(2), base, RLDatasetConfig(use_chat_template=True))
    pairs = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}]
    with pytest.raises(ConfigurationError, match="has no chat template"):
        PreferenceDataset(pairs, base, PreferenceDatasetConfig(use_chat_template=True))
    options = PreferenceDatasetConfig(use_chat_template=False, raw_suffix=" =>")
    assert base.decode(PreferenceDataset(pairs, base, options)[0]["prompt_ids"]) == "1+1= =>"


def test_sft_takes_the_prompt_format(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    base = _load(tokenizers["base"])
    path = str(write_rows([{"prompt": "1+1=", "response": "2"}], tmp_path / "sft.jsonl"))
    actor = ActorSection(engine=EngineConfig(model=ModelConfig(hf_config={"model_type": "llama"})))
    data = DataSection(
        train_files=(path,),
        tokenizer_path=str(tokenizers["base"]),
        prompt_format="raw",
        raw_suffix="\nA:",
    )
    prompt, _ = SFTDataset([path], base, SFTConfig(actor=actor, data=data))[0]
    assert base.decode(prompt) == "1+1=\nA:"
    chat = DataSection(
        train_files=(path,), tokenizer_path=str(tokenizers["chat"]), prompt_format="chat"
    )
    with pytest.raises(ConfigurationError, match=str(tokenizers["base"])):
        SFTDataset([path], base, SFTConfig(actor=actor, data=chat))


def test_few_shot_prompts_are_deterministic_and_never_self_examples(
    tmp_path: Path, tokenizers: dict[str, Path]
) -> None:
    base = _load(tokenizers["base"])
    train = (str(write_rows(_rows(12), tmp_path / "train.jsonl")),)
    val = (str(write_rows(_rows(3), tmp_path / "val.jsonl")),)
    data = DataSection(
        train_files=train,
        val_files=val,
        prompt_format="few_shot",
        few_shot=2,
        max_prompt_length=128,
        seed=3,
    )
    first = _decoded(base, rl_dataset(data, train, base))
    assert first == _decoded(base, rl_dataset(data, train, base))  # same seed, same prompts
    assert len(first) == 12 - 3  # k + 1 training rows set aside as examples
    pattern = re.compile(r"Q: (\d+)\+\d+=\nA: (\d+)\n\n" * 2 + r"Q: (\d+)\+\d+=\nA:")
    examples = set()
    for text in first:
        match = pattern.fullmatch(text)
        assert match is not None, text
        one, two, asked = match.group(1), match.group(3), match.group(5)
        assert int(match.group(2)) == 2 * int(one)  # the answer is the ground truth
        examples.update((one, two))
        assert asked not in (one, two)
    asked_all = {pattern.fullmatch(t).group(5) for t in first}  # type: ignore[union-attr]
    assert not examples & asked_all  # an example row is never a training prompt
    other_seed = dataclasses.replace(data, seed=4)
    assert _decoded(base, rl_dataset(other_seed, train, base)) != first
    # validation prompts get the training rows' examples, and all their rows stay prompts
    assert len(rl_dataset(data, val, base)) == 3


def test_few_shot_files_overlapping_the_prompts_use_the_spare(
    tmp_path: Path, tokenizers: dict[str, Path]
) -> None:
    base = _load(tokenizers["base"])
    train = (str(write_rows(_rows(3), tmp_path / "train.jsonl")),)
    data = DataSection(
        train_files=train,
        prompt_format="few_shot",
        few_shot=2,
        few_shot_files=train,
        max_prompt_length=128,
    )
    texts = _decoded(base, rl_dataset(data, train, base))
    assert len(texts) == 3  # examples from few_shot_files: every training row stays a prompt
    for i, text in enumerate(texts):
        assert text.count(f"Q: {i}+{i}=") == 1 and text.endswith(f"Q: {i}+{i}=\nA:")
        assert text.count("Q: ") == 3


def test_few_shot_render_is_readable() -> None:
    examples = FewShotExamples(
        (FewShotExample("What is 2*3?", "6"), FewShotExample("What is 7*8?", "56")),
        k=1,
        template="Question: {question}\nAnswer: {answer}",
    )
    assert examples.render("What is 2*3?", "Solve.") == (
        "Solve.\n\nQuestion: What is 7*8?\nAnswer: 56\n\nQuestion: What is 2*3?\nAnswer:"
    )
    with pytest.raises(ConfigurationError, match=r"too few for data.few_shot=3 examples and a"):
        draw_examples(load_parts(_rows(3)), 3, 0, keep_prompts=True)
    assert len(draw_examples(load_parts(_rows(3)), 3, 0).examples) == 3  # no spare left
    repeated = _rows(3) * 4  # generated tasks repeat questions: each is shown once
    drawn = draw_examples(load_parts(repeated), 2, 0, keep_prompts=True)
    assert len({example.question for example in drawn.examples}) == 3
    with pytest.raises(ConfigurationError, match=r"3 distinct questions, too few"):
        draw_examples(load_parts(repeated), 3, 0, keep_prompts=True)


def test_few_shot_from_a_reasoning_gym_spec(tokenizers: dict[str, Path]) -> None:
    pytest.importorskip("reasoning_gym")
    from hf_algos.data.reasoning_gym import reasoning_gym_rows

    base = _load(tokenizers["base"])
    spec = "reasoning_gym:basic_arithmetic?size=8&seed=0&min_terms=2&max_terms=2&max_digits=1"
    data = DataSection(
        train_files=(spec,), prompt_format="few_shot", few_shot=1, max_prompt_length=512
    )
    dataset = rl_dataset(data, (spec,), base)
    assert len(dataset) == 8 - 2
    answers = {
        row["prompt"][0]["content"]: row["reward_model"]["ground_truth"]
        for row in reasoning_gym_rows(spec)
    }
    for text in _decoded(base, dataset):
        example, asked = text.split("\n\n")[-2:]
        question, answer = example.removeprefix("Q: ").rsplit("\nA: ", 1)
        assert answers[question] == answer  # the example's answer is its ground truth
        assert asked.startswith("Q: ") and asked.endswith("\nA:")
        assert asked[3:-3] in answers and asked[3:-3] != question


def test_set_aside_example_rows_are_not_checked_as_prompts(
    tmp_path: Path, tokenizers: dict[str, Path]
) -> None:
    base = _load(tokenizers["base"])
    rows = _rows(6)
    data = DataSection(
        train_files=(str(write_rows(rows, tmp_path / "probe.jsonl")),),
        prompt_format="few_shot",
        few_shot=1,
        max_prompt_length=128,
    )
    first, spare = (row for _, row in rl_dataset(data, data.train_files, base).config.held_out)
    # the spare is shown only to the first example's own prompt: long, both set-aside rows'
    # texts are over the limit, every training prompt's text is not
    rows[spare]["prompt"] = [{"role": "user", "content": "9" * 60}]
    train = (str(write_rows(rows, tmp_path / "train.jsonl")),)
    data = dataclasses.replace(data, train_files=train, max_prompt_length=60)
    dataset = rl_dataset(data, train, base)
    assert len(dataset) == 4 and dataset.num_filtered == 0  # no prompt was dropped
    assert first != spare
