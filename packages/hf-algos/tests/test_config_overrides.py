"""Config loading on OmegaConf: every override form, ``vars`` interpolation, typos, verl keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hf_algos.config import VERL_ALIASES, RLConfig, SFTConfig, compose_config, load_config
from hf_controller import ConfigurationError

MODEL = [
    "+actor.engine.model.hf_config.model_type=llama",
    f"data.tokenizer_path={Path(__file__).parent}",
]
BASE = [*MODEL, "rollout.n=4", "data.train_batch_size=4", "actor.ppo_mini_batch_size=8"]


def load(*overrides: str, path: Path | None = None) -> RLConfig:
    return load_config(RLConfig, path, overrides=[*BASE, *overrides])


def test_set_add_and_drop() -> None:
    config = load(
        "actor.engine.optim.lr=2e-6",
        "+rollout.engine_kwargs.lean_forward=false",
        "+actor.engine.model.hf_config.hidden_size=32",
        "trainer.save_freq=3",
        "~trainer.save_freq",
    )
    assert config.actor.engine.optim.lr == pytest.approx(2e-6)
    assert config.rollout.engine_kwargs == {"lean_forward": False}
    assert config.actor.engine.model.hf_config == {"model_type": "llama", "hidden_size": 32}
    assert config.trainer.save_freq == 0  # dropped: back to its default
    lists = load("trainer.loggers=[console,jsonl]", "data.val_files=")
    assert lists.trainer.loggers == ("console", "jsonl") and lists.data.val_files == ()
    dropped = load("+rollout.engine_kwargs.x=1", "~rollout.engine_kwargs.x")
    assert dropped.rollout.engine_kwargs == {}
    replaced = load("+rollout.engine_kwargs.x=1", "rollout.engine_kwargs={y: 2}")
    assert replaced.rollout.engine_kwargs == {"y": 2}  # a value replaces a free mapping
    assert (
        load("rollout.engine_kwargs={x: 1}", "rollout.engine_kwargs={}").rollout.engine_kwargs == {}
    )
    # +key for a key that is there, a key new to a free mapping without +
    with pytest.raises(
        ConfigurationError, match=r"(?s)already at 'trainer.save_freq'.*'\+\+trainer.save_freq=3'"
    ):
        load("+trainer.save_freq=3")
    with pytest.raises(ConfigurationError, match=r"already at 'rollout\.engine_kwargs\.x'"):
        load("+rollout.engine_kwargs.x=1", "+rollout.engine_kwargs.x=2")
    with pytest.raises(ConfigurationError, match=r"use \+rollout.engine_kwargs.x=1"):
        load("rollout.engine_kwargs.x=1")
    with pytest.raises(
        ConfigurationError,
        match=r"trainer\.sav_freq is not a key of TrainerSection \(did you "
        r"mean trainer\.save_freq\?\)",
    ):
        load("+trainer.sav_freq=3")
    # ++key sets a key of the schema, or adds one inside a free mapping
    forced = load(
        "++trainer.save_freq=3", "++rollout.engine_kwargs.x=1", "++rollout.engine_kwargs.x=2"
    )
    assert forced.trainer.save_freq == 3 and forced.rollout.engine_kwargs == {"x": 2}
    with pytest.raises(ConfigurationError, match=r"delete from config\. 'trainer\.nothing' does"):
        load("~trainer.nothing")


def test_required_section_filled_by_dotted_keys_and_missing_named() -> None:
    assert load().actor.engine.model.hf_config == {"model_type": "llama"}
    with pytest.raises(ConfigurationError, match="missing required key actor"):
        load_config(RLConfig, overrides=["rollout.n=2"])


def test_vars_interpolate_one_model_path_everywhere(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    path = tmp_path / "run.yaml"
    path.write_text(
        f"vars:\n  model: {model}\n  steps: 3\n"
        "actor:\n  engine:\n    model: {path: '${vars.model}'}\n"
        "data: {tokenizer_path: '${vars.model}', train_batch_size: 4}\n"
        "rollout: {n: 4}\n"
        "trainer: {total_training_steps: '${vars.steps}', save_freq: '${trainer.test_freq}'}\n"
    )
    config = load_config(RLConfig, path, ["vars.steps=5"])
    assert config.actor.engine.model.path == str(model)
    assert config.data.tokenizer_path == str(model)
    assert config.trainer.total_training_steps == 5  # the override of the variable won
    assert config.trainer.save_freq == 0
    with pytest.raises(ConfigurationError, match=r"vars\.nothing"):
        load_config(RLConfig, path, ["actor.engine.model.path=${vars.nothing}"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.total_epoch=2", "Did you mean: 'total_epochs'?"),
        ("actor.engine.optim.lrr=1", "actor.engine.optim.lrr: Key 'lrr' not in 'OptimConfig'"),
        ("trainr.nnodes=2", "Did you mean: 'trainer'?"),
        ("rollout.n=many", "rollout.n: Value 'many'"),
        ("trainer.placement=cloud", "expected one of ['hybrid', 'separate']"),
        ("rollout.n", "override 'rollout.n' does not parse: expected key=value"),
    ],
)
def test_typos_and_bad_values_name_the_key(override: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        load(override)
    assert expected in str(error.value)
    assert override.split("=")[0] in str(error.value)


def test_verl_keys_in_overrides_and_yaml(tmp_path: Path) -> None:
    verl_base = [*MODEL, "data.train_batch_size=4", "actor.ppo_mini_batch_size=8"]
    config = load_config(
        RLConfig,
        overrides=[
            *verl_base,
            "actor_rollout_ref.actor.optim.lr=3e-6",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.response_length=12",
            "actor_rollout_ref.actor.clip_ratio=0.3",
            "trainer.logger=[console,jsonl]",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=2",
            "data.filter_overlong_prompts=true",
        ],
    )
    assert config.actor.engine.optim.lr == pytest.approx(3e-6)
    assert (config.rollout.n, config.rollout.backend, config.rollout.max_new_tokens) == (
        8,
        "native",
        12,
    )
    assert config.actor.clip_low == config.actor.clip_high == pytest.approx(0.3)
    assert config.trainer.loggers == ("console", "jsonl")
    assert (config.trainer.n_workers, config.trainer.workers_per_node) == (4, 2)
    assert config.data.overlong_prompts == "drop"
    path = tmp_path / "verl.yaml"
    path.write_text(
        "actor_rollout_ref:\n  actor:\n    optim: {lr: 5.0e-6}\n    grad_clip: 0.5\n"
        "  rollout: {temperature: 0.7}\ntrainer: {logger: [console], total_epochs: 2}\n"
    )
    from_yaml = load(path=path)
    assert from_yaml.actor.engine.optim.lr == pytest.approx(5e-6)
    assert from_yaml.actor.engine.optim.grad_clip == pytest.approx(0.5)
    assert from_yaml.rollout.temperature == pytest.approx(0.7)
    assert (from_yaml.trainer.loggers, from_yaml.trainer.total_epochs) == (("console",), 2)
    # an alias targets the config's own key: SFT's response length is top-level
    sft = load_config(SFTConfig, overrides=[*MODEL, "data.max_response_length=9"])
    assert sft.max_response_length == 9


def test_verl_keys_that_differ_or_do_not_exist_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"is 16 rows with rollout.n=4, but .*=8"):
        load("actor_rollout_ref.actor.ppo_mini_batch_size=4")  # BASE says 8 rows
    with pytest.raises(ConfigurationError, match="not supported by hybridflow"):
        load("trainer.critic_warmup=1")
    with pytest.raises(ConfigurationError, match=r"refused: .* set trainer\.max_staleness"):
        load("async_training.staleness_threshold=0.5")
    with pytest.raises(ConfigurationError, match="no equivalent in hybridflow"):
        load("actor_rollout_ref.actor.no_such_knob=true")
    with pytest.raises(ConfigurationError, match=r"hybrid_engine .* not supported"):
        load("actor_rollout_ref.hybrid_engine=false")  # true (verl's only mode) is accepted
    with pytest.raises(ConfigurationError, match=r"set the same key actor\.engine\.optim\.lr"):
        load("actor.engine.optim.lr=1e-6", "actor_rollout_ref.actor.optim.lr=2e-6")
    path = tmp_path / "both.yaml"
    path.write_text("trainer: {logger: [console], loggers: [jsonl]}\n")
    with pytest.raises(ConfigurationError, match=r"trainer.logger=.* trainer.loggers="):
        load(path=path)
    with pytest.raises(ConfigurationError, match="set only one of them"):
        load("trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.n_workers=4")
    with pytest.warns(UserWarning, match="no effect here"):
        load("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4")


def test_verl_keys_whose_meaning_matches_are_accepted() -> None:
    # verl's mini-batch counts prompts: 2 prompts x rollout.n=4 = our 8 rows
    config = load_config(
        RLConfig, overrides=[*MODEL, "rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    )
    assert config.actor.ppo_mini_batch_size == 8
    assert load("trainer.critic_warmup=0").trainer == load().trainer  # verl's default: a no-op
    with pytest.warns(UserWarning, match="verl key trainer.balance_batch has no effect"):
        load("trainer.balance_batch=true")
    with pytest.warns(UserWarning, match="rollout.mode has no effect"):
        load("actor_rollout_ref.rollout.mode=async")


def test_alias_table_targets_exist_in_the_schema() -> None:
    # every key an alias writes must be a real key, or the alias would fail at every use
    # (left out: SFT / DPO keys, the optional critic, free mappings, sibling changes' keys)
    tree = compose_config(RLConfig, overrides=MODEL)
    missing = [
        ours
        for alias in VERL_ALIASES
        for ours in alias.ours
        if not ours.startswith(("critic", "max_response_length", "response_key", "actor.lora"))
        and ".engine_kwargs." not in ours
        and not ours.endswith(".*")  # a mapping's keys: data.chat_template_kwargs.*
        and not ours.startswith(("reward.function", "reward.model"))
        and ".trust_remote_code" not in ours
        and ours != "trainer.log_val_generations"
        and OmegaConf.select(tree, ours, default="<absent>") == "<absent>"
    ]
    assert missing == []


def test_rollout_dtype_defaults_to_the_actor_model_and_takes_verl_key(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from hf_algos.data import build_char_tokenizer
    from hf_algos.trainers.roles.workers import rollout_class

    build_char_tokenizer(tmp_path, chat_template=None)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)

    def rollout_dtype(*overrides: str) -> str:
        config = load(*overrides)
        cls = rollout_class(config.rollout, config.actor, config.trainer, tokenizer)
        return cls.args[0].dtype

    assert rollout_dtype() == "float32"  # the actor's model.dtype
    assert rollout_dtype("rollout.dtype=bfloat16") == "bfloat16"
    assert rollout_dtype("actor_rollout_ref.rollout.dtype=bfloat16") == "bfloat16"
    with pytest.raises(ConfigurationError, match=r"rollout\.dtype"):
        load("rollout.dtype=bf16")


def test_data_paths_expand_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "data_source": "x"}\n')
    config = load("data.train_files=['~/rows.jsonl']", "data.val_files='~/rows.jsonl'")
    assert config.data.train_files == config.data.val_files == (str(tmp_path / "rows.jsonl"),)


def test_an_unbracketed_comma_list_of_files_is_a_list(tmp_path: Path) -> None:
    """verl's ``data.train_files=a.parquet,b.parquet`` (elsewhere: "Ambiguous value")."""
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text('{"prompt": "a", "data_source": "x"}\n')
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    config = load(f"data.train_files={a},{b}", f"data.val_files={b},{a}")
    assert config.data.train_files == (str(a), str(b))
    assert config.data.val_files == (str(b), str(a))
    with pytest.raises(ConfigurationError, match="Ambiguous value"):
        load("data.max_prompt_length=3,4")  # not a list key: still refused


def test_a_single_file_in_yaml_is_a_one_item_list(tmp_path: Path) -> None:
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"prompt": "a", "data_source": "x"}\n')
    path = tmp_path / "verl.yaml"
    path.write_text(f"data:\n  train_files: {rows}\ntrainer: {{logger: console}}\n")
    config = load(path=path)
    assert config.data.train_files == (str(rows),) and config.trainer.loggers == ("console",)


def test_every_problem_of_a_file_is_reported_in_one_run(tmp_path: Path) -> None:
    path = tmp_path / "typos.yaml"
    path.write_text("trainer: {total_epoch: 2, save_freq: often}\nrollout: {temprature: 0.7}\n")
    with pytest.raises(ConfigurationError) as typos:
        load(path=path)
    message = str(typos.value)
    assert message.startswith("3 problems:")
    for key in ("trainer.total_epoch", "trainer.save_freq", "rollout.temprature"):
        assert key in message
    path.write_text("data: {max_prompt_length: 0}\ntrainer: {n_workers: 0}\n")
    with pytest.raises(ConfigurationError, match=r"(?s)^2 problems:.*max_prompt.*n_workers"):
        load(path=path)  # values each section refuses, also together


def test_optimizer_name_reaches_the_engine() -> None:
    """``optim.name`` (ours) and verl's ``optim.optimizer`` class name pick the optimizer."""
    assert load().actor.engine.optim.name == "adamw"
    config = load("actor.engine.optim.name=muon", "actor.engine.optim.muon_ns_steps=3")
    assert (config.actor.engine.optim.name, config.actor.engine.optim.muon_ns_steps) == ("muon", 3)
    verl = load("actor_rollout_ref.actor.optim.optimizer=Muon")
    assert verl.actor.engine.optim.name == "muon"
    assert load("actor_rollout_ref.actor.optim.optimizer=AdamW").actor.engine.optim.name == "adamw"
    with pytest.raises(ConfigurationError, match=r"optim.optimizer='AdamW8bit' has no equivalent"):
        load("actor_rollout_ref.actor.optim.optimizer=AdamW8bit")
    with pytest.raises(ConfigurationError, match=r"actor.engine.optim.name: Invalid value 'sgd'"):
        load("actor.engine.optim.name=sgd")


def test_override_grammar_beyond_key_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The override grammar's lists, dicts, quoting, ``++`` and unbracketed commas, and its
    errors naming the override."""
    monkeypatch.chdir(tmp_path)
    config = load(
        "trainer.loggers=[console, jsonl]",
        "+rollout.engine_kwargs={enforce_eager: true, max_model_len: 64}",
        "actor.engine.model.hf_config={model_type: llama, hidden_size: 32}",
        "trainer.project_name='my run, v2'",
        "++trainer.save_freq=7",
        "++rollout.engine_kwargs.enforce_eager=false",
        'data.prompt_key="question text"',
    )
    assert config.trainer.loggers == ("console", "jsonl")
    assert config.rollout.engine_kwargs == {"enforce_eager": False, "max_model_len": 64}
    assert config.actor.engine.model.hf_config == {"model_type": "llama", "hidden_size": 32}
    assert config.trainer.project_name == "my run, v2"  # quoted: one string, not a sweep
    assert (config.trainer.save_freq, config.data.prompt_key) == (7, "question text")
    # true/false/null and numbers are read as such, off is a word; a quoted word stays a string
    assert load("algorithm.rollout_correction.mode=off").algorithm.rollout_correction.mode == "off"
    assert load("trainer.experiment_name='3'").trainer.experiment_name == "3"
    with pytest.raises(ConfigurationError, match=r"override 'rollout.n=\[1' does not parse"):
        load("rollout.n=[1")
    with pytest.raises(ConfigurationError, match=r"Ambiguous value for argument 'trainer.loggers"):
        load("trainer.loggers=console,jsonl")  # ambiguous: not a list
    with pytest.raises(ConfigurationError, match=r"'data.val_files=~/x' does not parse.*quote"):
        load("data.val_files=~/x")  # the grammar wants '~/x'
    # ++ adds keys only inside free mappings: a misspelt key of the schema is refused
    with pytest.raises(ConfigurationError, match=r"did you mean trainer\.save_freq"):
        load("++trainer.sav_freq=3")
    # no output directory or log file in the working directory
    assert Path.cwd() == tmp_path and list(tmp_path.iterdir()) == []


def test_a_multi_stage_file_takes_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_mapping`` (a recipe's stages, no schema) applies overrides in the same grammar:
    every key is free, so ``key=value`` sets or adds, ``~key`` removes, a mapping value
    replaces; the stage is checked against its schema when it is built."""
    from hf_algos.config import load_mapping

    monkeypatch.chdir(tmp_path)
    stages = tmp_path / "stages.yaml"
    stages.write_text(
        "workdir: /tmp/a\n"
        "sft: {trainer: {total_training_steps: 3}, rollout: {engine_kwargs: {a: 1, b: 2}}}\n"
        "grpo: {actor: {ppo_epochs: 2}, path: '${workdir}/model'}\n"
    )
    raw = load_mapping(
        stages,
        [
            "sft.trainer.total_training_steps=5",
            "grpo.trainer.loggers=[console, jsonl]",  # not in the file: added
            "sft.rollout.engine_kwargs={c: 3}",  # replaces, does not merge
            "~grpo.actor",
            "workdir=/tmp/b",
            "+note='a b, c'",
        ],
    )
    assert raw == {
        "workdir": "/tmp/b",
        "sft": {"trainer": {"total_training_steps": 5}, "rollout": {"engine_kwargs": {"c": 3}}},
        "grpo": {"path": "/tmp/b/model", "trainer": {"loggers": ["console", "jsonl"]}},
        "note": "a b, c",
    }
    with pytest.raises(ConfigurationError, match=r"override 'sft.x=\[1' does not parse"):
        load_mapping(stages, ["sft.x=[1"])
    with pytest.raises(ConfigurationError, match=r"Ambiguous value for argument 'sft.x=a,b'"):
        load_mapping(stages, ["sft.x=a,b"])
    with pytest.raises(ConfigurationError, match=r"'nope' does not exist"):
        load_mapping(stages, ["~nope"])
    with pytest.raises(ConfigurationError, match=r"An item is already at 'workdir'"):
        load_mapping(stages, ["+workdir=/tmp/c"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stages.yaml"]


def test_verl_megatron_layout_keys_reach_every_engine() -> None:
    """verl's ``strategy`` and ``megatron.*`` sizes set the actor's and the critic's engines;
    the reference's must match the actor's (it runs in the actor's engine layout)."""
    ara, ref = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
    critic = [
        "algorithm.adv_estimator=gae",
        "+critic.engine.model.hf_config.model_type=llama",
        "critic.ppo_mini_batch_size=8",
    ]
    layout = [
        f"{ara}.strategy=megatron",
        f"{ara}.megatron.tensor_model_parallel_size=2",
        f"{ara}.megatron.pipeline_model_parallel_size=1",
        f"{ref}.strategy=megatron",
        f"{ref}.megatron.tensor_model_parallel_size=2",
        "critic.strategy=megatron",
        "critic.megatron.tensor_model_parallel_size=2",
    ]
    config = load(*critic, *layout, "trainer.n_workers=4")
    actor = config.actor.engine
    assert (actor.backend, actor.megatron.tensor_model_parallel_size) == ("megatron", 2)
    assert actor.megatron.pipeline_model_parallel_size == 1
    assert config.critic is not None
    value = config.critic.engine
    assert (value.backend, value.megatron.tensor_model_parallel_size) == ("megatron", 2)
    assert load(f"{ara}.strategy=fsdp2", f"{ref}.strategy=fsdp").actor.engine.backend == "fsdp"
    differs = (
        r"ref.megatron.tensor_model_parallel_size=2 .*differs from actor.engine.megatron."
        r"tensor_model_parallel_size=1.*set actor_rollout_ref.actor.megatron.tensor_model_"
        r"parallel_size=2"
    )
    with pytest.raises(ConfigurationError, match=differs):
        load(f"{ara}.strategy=megatron", f"{ref}.megatron.tensor_model_parallel_size=2")
    with pytest.raises(ConfigurationError, match=r"ref.strategy='megatron' .* actor's engine"):
        load(f"{ref}.strategy=megatron")
    with pytest.raises(ConfigurationError, match=r"strategy='deepspeed' has no equivalent"):
        load(f"{ara}.strategy=deepspeed")


def test_verl_expert_parallel_key_reaches_the_actor_engine() -> None:
    """verl's ``actor.megatron.expert_model_parallel_size`` sets our actor engine's (the
    trainer test of EP2 is ``test_trainer_megatron_layouts.py``); on a dense model it is
    refused naming the value."""
    ep = "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"
    moe = [
        "actor.engine.model.hf_config.model_type=qwen3_moe",
        "+actor.engine.model.hf_config.num_experts=4",
        "actor_rollout_ref.actor.strategy=megatron",
        "trainer.n_workers=2",
    ]
    engine = load(*moe, ep).actor.engine
    assert (engine.backend, engine.megatron.expert_model_parallel_size) == ("megatron", 2)
    with pytest.raises(ConfigurationError, match=r"expert_model_parallel_size=2 needs a mixture"):
        load("actor_rollout_ref.actor.strategy=megatron", "trainer.n_workers=2", ep)


def test_megatron_layouts_that_cannot_work_are_refused() -> None:
    """Sizes that do not divide the workers, a critic laid out unlike the actor (they share
    processes), and LoRA (FSDP only) are refused naming the fix."""
    actor = ["actor.engine.backend=megatron", "trainer.n_workers=2"]
    with pytest.raises(ConfigurationError, match=r"= 4 does not divide trainer.n_workers=2"):
        load(*actor, "actor.engine.megatron.tensor_model_parallel_size=2",
             "actor.engine.megatron.pipeline_model_parallel_size=2")  # fmt: skip
    critic = [
        "algorithm.adv_estimator=gae",
        "+critic.engine.model.hf_config.model_type=llama",
        "critic.ppo_mini_batch_size=8",
        "critic.engine.backend=megatron",
        "actor.engine.megatron.tensor_model_parallel_size=2",
    ]
    with pytest.raises(ConfigurationError, match=r"\(1, 1\) differ from actor.*\(2, 1\).*"
                       r"critic.engine.backend=fsdp"):  # fmt: skip
        load(*actor, *critic)
    same = load(*actor, *critic, "critic.engine.megatron.tensor_model_parallel_size=2")
    assert same.critic is not None and same.critic.engine.megatron.tensor_model_parallel_size == 2
    reward_model = [
        "+reward.model.model.hf_config.model_type=llama",
        "reward.model.backend=megatron",
        "reward.model.megatron.pipeline_model_parallel_size=2",
    ]
    with pytest.raises(ConfigurationError, match=r"reward.model.megatron .* \(1, 2\) differ"):
        load(*actor, "actor.engine.megatron.tensor_model_parallel_size=2", *reward_model)
    with pytest.raises(ConfigurationError, match=r"lora.rank=4 needs the FSDP2 engine.*"
                       r"set backend='fsdp'"):  # fmt: skip
        load(*actor, "actor.lora.rank=4")


def test_verl_expert_parallel_size_reaches_the_megatron_engine() -> None:
    moe = [
        "actor.engine.backend=megatron",
        "actor.engine.model.hf_config.model_type=qwen3_moe",
        "+actor.engine.model.hf_config.num_experts=4",
    ]
    config = load(*moe, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2")
    assert config.actor.engine.megatron.expert_model_parallel_size == 2
    with pytest.raises(ConfigurationError, match="needs a mixture-of-experts model"):
        load("actor.engine.backend=megatron", "actor.engine.megatron.expert_model_parallel_size=2")
    with pytest.raises(ConfigurationError, match="does not divide the model's num_experts=4"):
        load(*moe, "actor.engine.megatron.expert_model_parallel_size=3")


def test_router_replay_is_an_actor_option_of_both_engines() -> None:
    assert load("actor.router_replay=true").actor.router_replay
    megatron = load("actor.router_replay=true", "actor.engine.backend=megatron").actor
    assert megatron.router_replay and megatron.engine.backend == "megatron"


def test_verl_names_of_renamed_native_keys_reach_the_consumers_names() -> None:
    """verl's ``clip_ratio_*`` and ``norm_adv_by_std_in_grpo`` are aliases of the keys named
    as the policy loss and the estimator take them; both spellings of one key must agree."""
    config = load_config(
        RLConfig,
        overrides=[
            *BASE,
            "actor_rollout_ref.actor.clip_ratio_low=0.1",
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "actor_rollout_ref.actor.clip_ratio_c=3.0",
            "algorithm.norm_adv_by_std_in_grpo=false",
        ],
    )
    actor = config.actor
    assert (actor.clip_low, actor.clip_high, actor.clip_c) == (0.1, 0.28, 3.0)
    assert config.algorithm.norm_adv_by_std is False
    with pytest.raises(ConfigurationError, match=r"set the same key algorithm\.norm_adv_by_std"):
        load_config(
            RLConfig,
            overrides=[
                *BASE,
                "algorithm.norm_adv_by_std_in_grpo=false",
                "algorithm.norm_adv_by_std=true",
            ],
        )
    with pytest.raises(ConfigurationError, match="Did you mean: 'clip_low'"):
        load_config(RLConfig, overrides=[*BASE, "actor.clip_ratio_low=0.1"])
