"""The data checks that run before Ray starts: cheap, from the composed config alone.

``hybridflow`` starts Ray in the background before the config's full checks (they import
torch), so that Ray's start overlaps them. The data files named plainly in the config
(``data.train_files`` / ``data.val_files``) are checked before that start: they exist, and
their bytes are what their suffix says (:func:`hf_algos.data.file_checks.check_file_bytes`:
UTF-8 text, a first jsonl row that is a JSON object with the prompt, parquet's magic bytes).
A bad file then stops the run in well under a second, with no Ray line printed. Every row
is checked later, while the trainer builds its datasets.
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.basecontainer import BaseContainer
from omegaconf.errors import OmegaConfBaseException

from hf_algos.config.data import check_data_paths
from hf_algos.data.file_checks import check_file_bytes

_RESOLVER = re.compile(r"\$\{[^}]*:")
"""An interpolation that calls a resolver (a packaged example's file, made later)."""


def check_data_early(tree: DictConfig) -> None:
    """Check the data files of ``tree`` (an unresolved, composed config) that it names as
    plain paths, or through plain ``${...}`` interpolations; raises
    :class:`~hf_controller.ConfigurationError` (a :class:`~hf_algos.data.files.DataError`
    for a file's content) naming the file and the fix."""
    prompt_key = OmegaConf.select(tree, "data.prompt_key", default=None)
    if not isinstance(prompt_key, str) or "${" in prompt_key:
        prompt_key = None
    for key in ("data.train_files", "data.val_files"):
        for path, plain in _paths(tree, key):
            if not path.exists():
                if plain:  # an interpolated one may be a packaged example's, made later
                    check_data_paths(key, (str(path),))
                continue
            if path.is_file():
                check_file_bytes(path, prompt_key)


def _paths(tree: DictConfig, key: str) -> list[tuple[Path, bool]]:
    """The local files of list ``key``: (path, whether written without interpolation);
    reasoning-gym specs and values that cannot be resolved yet are left out."""
    node = OmegaConf.select(tree, key, default=None, throw_on_resolution_failure=False)
    if not isinstance(node, BaseContainer) or isinstance(node, DictConfig):
        return []  # not a list (a tuple field's node, or a ListConfig)
    paths = []
    raw = OmegaConf.to_container(node, resolve=False)
    assert isinstance(raw, list | tuple)
    for index, text in enumerate(raw):
        if not isinstance(text, str) or _RESOLVER.search(text):
            continue
        plain = "${" not in text
        if not plain:
            try:
                text = node[index]
            except OmegaConfBaseException:  # refers to what is not set yet: checked later
                continue
        if isinstance(text, str) and not text.startswith("reasoning_gym:"):
            paths.append((Path(text).expanduser(), plain))
    return paths
