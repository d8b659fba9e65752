"""Where a model lives: a local directory, or a model id in the local Hugging Face cache.

:func:`resolve_model_path` is the one function every loader of the stack goes through (the
training engines, the reward model, the driver's tokenizer and the rollout's model path), so
a model id means the same directory everywhere. Nothing here contacts a hub: ids resolve
offline (``local_files_only``) from the cache laid out by ``huggingface_hub``
(``models--org--name/snapshots/<commit>/`` with ``refs/<branch>`` naming the commit).
A GGUF file (``*.gguf``, or ``pkg:<module>/<file>`` shipped by an installed package) resolves
to the directory :func:`hf_engines.gguf.import_gguf` dequantizes it into, once, in a cache.
Importing this module is cheap (no transformers, huggingface_hub only when an id is resolved).
"""

from __future__ import annotations

import os
from pathlib import Path

from hf_controller import ConfigurationError
from hf_engines.gguf import import_gguf, is_gguf_reference


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache this process reads: ``HF_HUB_CACHE``, else ``HF_HOME/hub``.

    Read from the environment at each call (huggingface_hub reads it once at import), so a
    test or a launcher that sets ``HF_HOME`` later is still honoured.
    """
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _looks_like_model_id(path: str) -> bool:
    """``org/name`` or ``name``: no leading ``/ . ~``, at most one ``/``, and not under a
    directory that exists here (``b/nosuchdir`` beside a directory ``b`` is a local path)."""
    if path.startswith(("/", ".", "~")) or path.count("/") > 1 or "\\" in path:
        return False
    return not ("/" in path and Path(path.split("/")[0]).is_dir())


def _missing_local_path(path: str, option: str) -> ConfigurationError:
    """The error for local path ``path`` that does not exist: its absolute path and the
    nearest parent that does."""
    absolute = Path(path).expanduser().absolute()
    parent = next((p for p in absolute.parents if p.is_dir()), Path(absolute.anchor))
    return ConfigurationError(
        f"{option}={path!r} does not exist: no {str(absolute)!r} (the nearest existing "
        f"directory is {str(parent)!r}). Fix the path: give a local Hugging Face model "
        "directory (model.save_pretrained(dir)), a .gguf file, or a model id such as "
        "'Qwen/Qwen2.5-0.5B' that is in the local Hugging Face cache"
    )


def resolve_model_path(path: str, revision: str | None = None, option: str = "model.path") -> Path:
    """The local directory of ``path``: itself when it is a directory, the directory a GGUF
    file (``*.gguf`` or ``pkg:<module>/<file>``) is imported into, else the snapshot of model
    id ``path`` (at ``revision``, default ``main``) in the local Hugging Face cache.

    Never touches the network (``local_files_only``); the cache is laid out as
    huggingface_hub writes it (``models--org--name/snapshots/<commit>/``, ``refs/<branch>``).
    ``option`` names the config key in errors. Raises :class:`ConfigurationError` naming the
    id, the cache searched and the fix when neither is there.
    """
    local = Path(path).expanduser()
    if local.is_dir():
        if revision is not None:
            raise ConfigurationError(
                f"{option}={path!r} is a local directory, which has one version; "
                f"revision={revision!r} applies to a model id only. Unset the revision, or give "
                "the model id (org/name) to pick a revision from the Hugging Face cache"
            )
        return local
    if is_gguf_reference(path):
        if revision is not None:
            raise ConfigurationError(
                f"{option}={path!r} is a GGUF file, which has one version; "
                f"revision={revision!r} applies to a model id only. Unset the revision"
            )
        return import_gguf(path, option=option)
    if not _looks_like_model_id(path):
        raise _missing_local_path(path, option)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        found = snapshot_download(path, revision=revision, cache_dir=cache, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as error:
        where = f" at revision {revision!r}" if revision else ""
        raise ConfigurationError(
            f"{option}={path!r} is neither a local directory nor a model id in the Hugging "
            f"Face cache{where} (searched {cache}; no hub is contacted at run time). Download "
            f"it first with `hf download {path}"
            f"{' --revision ' + revision if revision else ''}` on a machine with internet "
            "and point HF_HOME (or HF_HUB_CACHE) at that cache, or give a local directory"
        ) from error
    return Path(str(found))
