"""Model paths: local directories, model ids from a pre-populated (offline) Hugging Face
cache, revisions, ``trust_remote_code``, and the ``save_pretrained`` export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from hf_controller import ConfigurationError
from hf_engines import ModelConfig
from hf_engines.checkpointing import HFExport, write_hf_directory
from hf_engines.hub import resolve_model_path
from hf_engines.models import build_hf_model
from hf_engines.testing import build_tiny_model

MAIN_COMMIT = "a" * 40
V1_COMMIT = "b" * 40


def _save_tokenizer(directory: Path) -> None:
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("abcdef")}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>"
    ).save_pretrained(directory)


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache laid out as huggingface_hub writes it: ``org/tiny`` at ``main`` and ``v1``."""
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    for commit, seed in ((MAIN_COMMIT, 0), (V1_COMMIT, 1)):
        snapshot = build_tiny_model(repo / "snapshots" / commit, "llama", seed=seed)
        _save_tokenizer(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN_COMMIT)
    (repo / "refs" / "v1").write_text(V1_COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_model_id_resolves_to_its_snapshot_at_each_revision(hub_cache: Path) -> None:
    snapshots = hub_cache / "models--org--tiny" / "snapshots"
    assert resolve_model_path("org/tiny") == snapshots / MAIN_COMMIT
    assert resolve_model_path("org/tiny", "v1") == snapshots / V1_COMMIT
    assert resolve_model_path("org/tiny", V1_COMMIT) == snapshots / V1_COMMIT


def test_model_config_loads_a_cached_id_at_a_revision(hub_cache: Path) -> None:
    loaded = build_hf_model(ModelConfig(path="org/tiny", revision="v1"))
    expected = AutoModelForCausalLM.from_pretrained(
        hub_cache / "models--org--tiny" / "snapshots" / V1_COMMIT
    )
    for name, tensor in expected.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_missing_id_names_the_id_the_cache_and_the_fix(hub_cache: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ModelConfig(path="org/absent")
    message = str(caught.value)
    assert "'org/absent'" in message and str(hub_cache) in message
    assert "hf download org/absent" in message and "HF_HOME" in message
    with pytest.raises(ConfigurationError, match=r"at revision 'v9'.*--revision v9"):
        ModelConfig(path="org/tiny", revision="v9")


def test_local_directory_with_a_revision_is_refused(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model")
    with pytest.raises(ConfigurationError, match="revision='v1' applies to a model id only"):
        ModelConfig(path=str(model), revision="v1")
    with pytest.raises(ConfigurationError, match="does not exist"):
        ModelConfig(path=str(tmp_path / "nowhere"))


def test_a_mistyped_local_path_is_named_as_local_not_as_a_hub_id(
    tmp_path: Path, hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``b/nosuchdir`` beside a directory ``b``, ``./x``, ``a/b/c``: missing local paths,
    named with their absolute path and the nearest existing directory, no hub advice."""
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path)
    for path, absolute, parent in [
        ("b/nosuchdir", tmp_path / "b" / "nosuchdir", tmp_path / "b"),
        ("./nosuch", tmp_path / "nosuch", tmp_path),
        ("b/deeper/nosuch", tmp_path / "b" / "deeper" / "nosuch", tmp_path / "b"),
    ]:
        with pytest.raises(ConfigurationError) as caught:
            ModelConfig(path=path)
        message = str(caught.value)
        assert f"{path!r} does not exist: no {str(absolute)!r}" in message, message
        assert f"nearest existing directory is {str(parent)!r}" in message, message
        assert "hf download" not in message
    with pytest.raises(ConfigurationError, match="hf download org/absent"):
        ModelConfig(path="org/absent")  # no directory "org" here: still a hub id


CUSTOM_CONFIG = """
from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny_custom"
"""
CUSTOM_MODEL = """
from transformers import LlamaForCausalLM

from .configuration_tiny import TinyCustomConfig


class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig
"""


def _custom_code_model(directory: Path) -> Path:
    """A tiny model whose architecture lives in the directory's own Python files."""
    build_tiny_model(directory, "llama")
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "tiny_custom"
    config["architectures"] = ["TinyCustomForCausalLM"]
    config["auto_map"] = {
        "AutoConfig": "configuration_tiny.TinyCustomConfig",
        "AutoModelForCausalLM": "modeling_tiny.TinyCustomForCausalLM",
    }
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "configuration_tiny.py").write_text(CUSTOM_CONFIG)
    (directory / "modeling_tiny.py").write_text(CUSTOM_MODEL)
    return directory


def test_custom_code_needs_trust_remote_code(tmp_path: Path) -> None:
    path = str(_custom_code_model(tmp_path / "custom"))
    with pytest.raises(ConfigurationError, match=r"ships its own model code.*trust_remote_code"):
        ModelConfig(path=path)
    model = build_hf_model(ModelConfig(path=path, trust_remote_code=True))
    assert type(model).__name__ == "TinyCustomForCausalLM"
    out = tmp_path / "exported"
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    write_hf_directory(out, weights, model.config, HFExport(type(model), torch.float32))
    assert (out / "modeling_tiny.py").is_file()  # save_pretrained copies the code
    again = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert type(again).__name__ == "TinyCustomForCausalLM"


def test_export_writes_sharded_safetensors_in_the_asked_dtype(tmp_path: Path) -> None:
    source = build_tiny_model(tmp_path / "source", "qwen2")
    _save_tokenizer(source)
    shutil.copy(source / "config.json", tmp_path / "config-before.json")
    model = AutoModelForCausalLM.from_pretrained(source)
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    export = HFExport(type(model), torch.bfloat16, str(source), max_shard_size="40KB")
    out = tmp_path / "out"
    write_hf_directory(out, weights, model.config, export, model.generation_config)
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert model.config.dtype == torch.float32  # the caller's config is untouched
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert loaded.dtype == torch.bfloat16
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, weights[name].to(torch.bfloat16)), name
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("abc")["input_ids"] == [2, 3, 4]
