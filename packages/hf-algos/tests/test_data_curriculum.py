"""``data.curriculum``: a reasoning-gym curriculum that advances on the rolling training
accuracy: when it advances, the difficulty of its rows, its state, its loader and its
config checks."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from hf_algos.config import CurriculumSection, DPOConfig, RLConfig, load_config
from hf_algos.data import RLDatasetConfig, build_char_tokenizer
from hf_algos.data.curriculum import Curriculum, batch_seed
from hf_algos.data.curriculum_loader import CurriculumLoader
from hf_algos.data.reasoning_gym import decode_entry
from hf_controller import ConfigurationError
from hf_protocol import fields


def chain_sum(seed: int = 0, **options: Any) -> Curriculum:
    """A ``chain_sum`` curriculum raising ``num_terms`` from two terms, one digit."""
    section: dict[str, Any] = {
        "task": "chain_sum",
        "start": {"num_terms": 0, "num_digits": 0},
        "advance": ("num_terms",),
        "threshold": 0.75,
        "window": 8,
    }
    return Curriculum(CurriculumSection(**{**section, **options}), seed)


def terms(row: dict[str, Any]) -> int:
    """The number of terms of a chain_sum row (from its reasoning-gym entry)."""
    return int(decode_entry(row["extra_info"]["entry"])["metadata"]["num_terms"])


def test_advances_when_a_full_window_reaches_the_threshold_and_not_before() -> None:
    curriculum = chain_sum()
    # a window not yet full never advances, however good
    assert curriculum.observe([1.0] * 4)["curriculum/advanced"] == 0.0
    # full, mean 5/8 < 0.75: no
    metrics = curriculum.observe([1.0, 0.0, 0.0, 0.0])
    assert metrics["curriculum/accuracy"] == pytest.approx(5 / 8)
    assert metrics["curriculum/advanced"] == 0.0 and curriculum.level("num_terms") == 0
    # rolling: the last 8 are [1, 0, 0, 0, 1, 1, 1, 1]: 5/8 still
    assert curriculum.observe([1.0] * 4)["curriculum/advanced"] == 0.0
    # the last 8 are [1, 1, 1, 1, 1, 1, 0, 1]: 7/8 >= 0.75; the step's rows were at level 0
    metrics = curriculum.observe([1.0, 1.0, 0.0, 1.0])
    assert metrics["curriculum/advanced"] == 1.0
    assert metrics["curriculum/num_terms"] == 2.0 and metrics["curriculum/num_terms_level"] == 0
    assert curriculum.levels == {"num_terms": 1, "num_digits": 0}
    # the window starts afresh at the new level
    assert curriculum.scores == []
    assert curriculum.observe([1.0] * 4)["curriculum/advanced"] == 0.0
    assert curriculum.metrics()["curriculum/num_terms"] == 3.0


def test_rows_at_each_level_have_that_difficulty() -> None:
    curriculum = chain_sum(threshold=0.0, max_levels={"num_terms": 3})
    seen = []
    for level in range(4):
        rows = curriculum.next_rows(6)
        assert {terms(row) for row in rows} == {2 + level}
        assert all(row["extra_info"]["levels"]["num_terms"] == level for row in rows)
        config = json.loads(rows[0]["extra_info"]["task_config"])  # what the verifier reads
        assert (config["min_terms"], config["max_terms"]) == (2 + level, 2 + level)
        seen.append(curriculum.observe([0.0] * 8)["curriculum/num_terms"])
    assert seen == [2.0, 3.0, 4.0, 5.0]
    assert curriculum.level("num_terms") == 3  # the maximum: no further
    assert curriculum.observe([1.0] * 8)["curriculum/advanced"] == 0.0


def test_inclusive_levels_mix_the_easier_ones_in() -> None:
    curriculum = chain_sum(range_mode="inclusive", start={"num_terms": 2})
    counts = {terms(row) for row in curriculum.next_rows(64)}
    assert counts == {2, 3, 4}


def test_attributes_advance_in_turn_up_to_their_maximum() -> None:
    curriculum = chain_sum(
        advance=("num_terms", "num_digits"), threshold=0.0, max_levels={"num_terms": 1}
    )
    history = []
    for _ in range(4):
        curriculum.observe([0.0] * 8)
        history.append((curriculum.level("num_terms"), curriculum.level("num_digits")))
    assert history == [(1, 0), (1, 1), (1, 2), (1, 3)]


def test_rows_depend_on_seed_level_and_index_only() -> None:
    first = chain_sum().next_rows(4)
    random.seed(12345)  # the global generators play no part
    again = chain_sum().next_rows(4)
    assert first == again
    assert [row["extra_info"]["index"] for row in first] == [0, 1, 2, 3]
    other_seed = chain_sum(seed=1).next_rows(4)
    assert [r["prompt"] for r in other_seed] != [r["prompt"] for r in first]
    # training rows do not follow a reasoning_gym: spec's seed + i stream
    assert batch_seed(0, 0) not in range(0, 10_000)


def test_state_round_trip_gives_the_same_rows_and_levels() -> None:
    scores = [[1.0] * 8, [0.0] * 8, [1.0, 1.0, 1.0, 1.0], [1.0] * 4, [1.0] * 8]
    uninterrupted, resumed = chain_sum(), chain_sum()
    for step, step_scores in enumerate(scores):
        if step == 2:  # stop here and resume in a new curriculum from the saved state
            state = json.loads(json.dumps(uninterrupted.state_dict()))  # plain data
            resumed.load_state_dict(state)
        rows = uninterrupted.next_rows(4)
        metrics = uninterrupted.observe(step_scores)
        if step >= 2:
            assert resumed.next_rows(4) == rows
            assert resumed.observe(step_scores) == metrics
    assert resumed.state_dict() == uninterrupted.state_dict()
    assert resumed.level("num_terms") == 3


def test_a_state_of_another_task_or_seed_is_refused() -> None:
    state = chain_sum().state_dict()
    with pytest.raises(ValueError, match=r"same data.curriculum.task and data.seed"):
        chain_sum(seed=3).load_state_dict(state)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"advance": ("num_termz",)}, r"no attributes \['num_termz'\].*num_terms \(levels"),
        ({"start": {"num_terms": 11}}, r"start.num_terms=11 .* give 0..10"),
        ({"max_levels": {"num_terms": 20}}, r"max_levels.num_terms=20 must lie between"),
        ({"settings": {"max_terms": 3}}, r"settings \['max_terms'\] are set by the curriculum"),
        ({"task": "leg_counting_typo"}, r"no curriculum for the task 'leg_counting_typo'"),
    ],
)
def test_bad_sections_name_the_fix(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chain_sum(**options)


def test_loader_serves_tokenized_batches_and_resumes(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer(tmp_path / "tokenizer", chat_template=None)
    config = RLDatasetConfig(max_prompt_length=96)

    def loader() -> CurriculumLoader:
        return CurriculumLoader(chain_sum(threshold=0.0), tokenizer, config, batch_size=3)

    served = loader()
    assert len(served.dataset) == 3  # the next batch's prompts; the position stays
    first = served.next_batch()
    assert len(first) == 3
    assert first.non_tensor_batch[fields.DATA_SOURCE].tolist() == ["reasoning_gym"] * 3
    assert served.observe([1.0] * 8)["curriculum/advanced"] == 1.0
    resumed = loader()
    resumed.load_state_dict(served.state_dict())
    a, b = served.next_batch(), resumed.next_batch()
    assert a.batch is not None and b.batch is not None
    assert a.batch[fields.INPUT_IDS].equal(b.batch[fields.INPUT_IDS])
    prompts = b.non_tensor_batch[fields.RAW_PROMPT].tolist()
    expressions = [p[0]["content"].split(":")[1].split("=")[0].split() for p in prompts]
    assert [len(e) for e in expressions] == [5, 5, 5]  # three terms, two operators
    with pytest.raises(ValueError, match=r"same data\.train_batch_size"):
        CurriculumLoader(chain_sum(), tokenizer, config, 4).load_state_dict(served.state_dict())
    with pytest.raises(TypeError, match=r"trainer\.total_training_steps"):
        len(served)
    too_short = RLDatasetConfig(40, overlong_prompts="drop")
    short = CurriculumLoader(chain_sum(), tokenizer, too_short, 2)
    with pytest.raises(ValueError, match=r"raise data\.max_prompt_length"):
        short.next_batch()


def rl_config(model: Path, *extra: str) -> RLConfig:
    return load_config(
        RLConfig,
        overrides=[
            f"actor.engine.model.path={model}",
            "rollout.n=2",
            "data.curriculum.task=chain_sum",
            "data.curriculum.start={num_terms: 0}",
            "trainer.total_training_steps=3",
            *extra,
        ],
    )


def test_config_section_reads_and_refuses_what_cannot_work(tiny_model_dir: Path) -> None:
    curriculum = rl_config(tiny_model_dir, "data.curriculum.advance=[num_terms]").data.curriculum
    assert curriculum is not None and curriculum.advance == ("num_terms",)
    assert curriculum.start == {"num_terms": 0} and curriculum.range_mode == "upper_bound"
    refused = {
        "data.curriculum.start={num_terms: 40}": "start.num_terms=40",
        "data.curriculum.threshold=1.5": "within",
        "data.train_files=['reasoning_gym:chain_sum?size=8']": "give one of them",
        "trainer.total_training_steps=null": "set trainer.total_training_steps",
        "algorithm.filter_groups.enable=true": "algorithm.filter_groups.enable",
        "trainer.async_mode=one_step_off": "trainer.async_mode",
    }
    for override, message in refused.items():
        with pytest.raises(ConfigurationError, match=message):
            rl_config(tiny_model_dir, override)
    with pytest.raises(ConfigurationError, match="which DPO"):
        load_config(
            DPOConfig,
            overrides=[
                f"actor.engine.model.path={tiny_model_dir}",
                "data.curriculum.task=chain_sum",
            ],
        )


def test_few_shot_prompts_take_their_examples_from_few_shot_files(tiny_model_dir: Path) -> None:
    from hf_algos.data.curriculum_loader import curriculum_loader

    examples = "reasoning_gym:chain_sum?size=16&seed=9&min_terms=2&max_terms=2&max_digits=1"
    with pytest.raises(ConfigurationError, match=r"give data\.few_shot_files"):
        rl_config(tiny_model_dir, "data.prompt_format=few_shot", "data.few_shot=2")
    config = rl_config(
        tiny_model_dir,
        "data.prompt_format=few_shot",
        "data.few_shot=2",
        f"data.few_shot_files=['{examples}']",
        "data.max_prompt_length=400",
    )
    tokenizer = build_char_tokenizer(chat_template=None)
    batch = curriculum_loader(config.data, tokenizer).next_batch()
    assert batch.batch is not None
    text = tokenizer.decode(batch.batch[fields.INPUT_IDS][0], skip_special_tokens=True)
    assert text.count("Q: ") == 3 and text.endswith("=\nA:")  # two solved examples, then it
