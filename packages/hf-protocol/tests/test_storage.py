"""save_to_disk / load_from_disk: a safe archive that loads without unpickling."""

import os
import pickle
import zipfile
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_protocol import DataProto
from hf_protocol.testing import assert_dataproto_equal


def test_round_trip_without_pickle(make_batch: Callable[..., DataProto], tmp_path: Path) -> None:
    data = make_batch(length=7)
    data.non_tensor_batch["fixed_width"] = np.array(["a", "bb", "c", "d", "e", "f", "g"])
    data.meta_info["metrics"] = {"loss": [1.0, 2.0]}
    path = tmp_path / "batch.hfdp"
    data.save_to_disk(path)
    with zipfile.ZipFile(path) as archive:
        assert not [n for n in archive.namelist() if n.endswith(".pkl")]
    assert_dataproto_equal(DataProto.load_from_disk(path), data)


def _rewrite(path: Path, replace: Callable[[str, bytes], bytes]) -> None:
    """Rewrite every entry of a zip archive through ``replace(name, data)``."""
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, replace(name, data))


def test_files_never_unpickle_without_opt_in(tmp_path: Path) -> None:
    data = DataProto.from_dict(
        {"x": torch.zeros(2)}, {"obj": [(1, 2), Fraction(1, 3)]}, {"when": (1, 2)}
    )
    path = tmp_path / "custom.hfdp"
    data.save_to_disk(path)
    with pytest.raises(
        ValueError,
        match=r"stores non_tensor_batch\['obj'\], meta_info as pickle.*allow_pickle=True",
    ):
        DataProto.load_from_disk(path)
    loaded = DataProto.load_from_disk(path, allow_pickle=True)
    assert loaded.non_tensor_batch["obj"][0] == (1, 2) and loaded.meta_info == {"when": (1, 2)}


def test_malicious_pickle_entry_is_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple:
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.hfdp"
    DataProto.from_dict({"x": torch.zeros(1)}, {"e": ["x"]}).save_to_disk(path)

    def swap_json_column_for_pickle(name: str, data: bytes) -> bytes:
        if name == "arrays/0.json":
            return pickle.dumps(Exploit())
        return data.replace(b'"json"', b'"pickle"') if name == "manifest.json" else data

    _rewrite(path, swap_json_column_for_pickle)
    with pytest.raises(ValueError, match="allow_pickle=True"):
        DataProto.load_from_disk(path)
    assert not marker.exists()


def test_non_dataproto_files_get_a_clear_error(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match=r"notes\.txt' is not a saved DataProto"):
        DataProto.load_from_disk(text)
    other_zip = tmp_path / "other.zip"
    with zipfile.ZipFile(other_zip, "w") as archive:
        archive.writestr("a.txt", "x")
    with pytest.raises(ValueError, match="zip file but not a saved DataProto"):
        DataProto.load_from_disk(other_zip)
    legacy = tmp_path / "legacy.pkl"
    legacy.write_bytes(pickle.dumps({"batch": None}))
    with pytest.raises(ValueError, match="verl's pickle-based save_to_disk"):
        DataProto.load_from_disk(legacy)


def test_bad_dtype_in_manifest_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "b.hfdp"
    DataProto.from_dict({"x": torch.zeros(2)}).save_to_disk(path)
    _rewrite(path, lambda name, data: data.replace(b'"float32"', b'"load"'))
    with pytest.raises(ValueError, match="'load' is not a torch dtype"):
        DataProto.load_from_disk(path)


def test_save_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "b.hfdp"
    DataProto.from_dict({"x": torch.zeros(2)}).save_to_disk(path)
    DataProto.from_dict({"x": torch.ones(3)}).save_to_disk(path)
    assert len(DataProto.load_from_disk(path)) == 3
    assert os.listdir(tmp_path) == ["b.hfdp"]


def test_non_tensor_only_and_folded_round_trip(
    make_batch: Callable[..., DataProto], tmp_path: Path
) -> None:
    only = DataProto.from_dict(non_tensors={"s": ["a", None]})
    only.save_to_disk(tmp_path / "a")
    assert_dataproto_equal(DataProto.load_from_disk(tmp_path / "a"), only)
    folded = make_batch(length=4).fold_batch_dim(2)
    folded.save_to_disk(tmp_path / "b")
    assert_dataproto_equal(DataProto.load_from_disk(tmp_path / "b"), folded)
