"""The on-disk format of ``DataProto.save_to_disk``: a zip archive that loads safely.

Layout (uncompressed zip):

* ``manifest.json`` — format name and version, length, and one entry per column
  saying how it is encoded;
* ``tensors/<i>.bin`` — the raw bytes of each tensor (dtype and shape in the manifest);
* ``arrays/<i>.npy`` — numeric and fixed-width string numpy arrays, written with
  ``allow_pickle=False``;
* ``arrays/<i>.json`` — object arrays whose entries are strings, numbers, booleans,
  ``None``, or lists/dicts of those;
* ``meta_info.json`` — meta_info when it is JSON data;
* ``*.pkl`` — anything else, pickled.

Loading never unpickles unless the caller passes ``allow_pickle=True``, so a file
holding only tensors, numbers and strings cannot run code when read.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import zipfile
from typing import Any

import numpy as np
from tensordict import TensorDict

from hf_protocol.columns import dtype_from_name, tensor_columns
from hf_protocol.transport import tensor_from_bytes, tensor_to_bytes_view

FORMAT_NAME = "hf-protocol/dataproto"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

SavedParts = tuple[TensorDict | None, dict[str, np.ndarray], dict[str, Any]]


def is_json_data(value: Any) -> bool:
    """True when ``value`` survives a JSON round trip unchanged (types included)."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return not math.isnan(value)  # NaN != NaN would break equality after loading
    if isinstance(value, list):
        return all(is_json_data(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json_data(v) for k, v in value.items())
    return False


def save_parts(
    path: str | os.PathLike[str],
    batch: TensorDict | None,
    non_tensor_batch: dict[str, np.ndarray],
    meta_info: dict[str, Any],
    length: int,
) -> None:
    """Write a DataProto's parts to ``path`` (atomically: a temp file, then a rename)."""
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "length": length,
        "batch": None,
        "non_tensor_batch": [],
    }
    tmp_path = f"{os.fspath(path)}.tmp-{os.getpid()}"
    with zipfile.ZipFile(tmp_path, "w", compression=zipfile.ZIP_STORED) as archive:
        if batch is not None:
            manifest["batch"] = {"batch_size": list(batch.batch_size), "columns": []}
            for i, (key, tensor) in enumerate(tensor_columns(batch).items()):
                name = f"tensors/{i}.bin"
                archive.writestr(name, tensor_to_bytes_view(tensor).tobytes())
                dtype = str(tensor.dtype).removeprefix("torch.")
                column = {"key": key, "file": name, "dtype": dtype, "shape": list(tensor.shape)}
                manifest["batch"]["columns"].append(column)
        for i, (key, array) in enumerate(non_tensor_batch.items()):
            manifest["non_tensor_batch"].append(_write_array(archive, i, key, array))
        manifest["meta_info"] = _write_meta(archive, meta_info)
        archive.writestr(MANIFEST, json.dumps(manifest, indent=1))
    os.replace(tmp_path, path)


def _write_array(archive: zipfile.ZipFile, index: int, key: str, array: np.ndarray) -> dict:
    entry: dict[str, Any] = {"key": key, "shape": list(array.shape)}
    if array.dtype != object:
        entry.update(encoding="npy", file=f"arrays/{index}.npy")
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        archive.writestr(entry["file"], buffer.getvalue())
    elif all(is_json_data(v) for v in array.ravel()):
        entry.update(encoding="json", file=f"arrays/{index}.json")
        archive.writestr(entry["file"], json.dumps(array.ravel().tolist()))
    else:
        entry.update(encoding="pickle", file=f"arrays/{index}.pkl")
        archive.writestr(entry["file"], pickle.dumps(array, protocol=5))
    return entry


def _write_meta(archive: zipfile.ZipFile, meta_info: dict[str, Any]) -> dict[str, str]:
    if is_json_data(meta_info):
        archive.writestr("meta_info.json", json.dumps(meta_info))
        return {"encoding": "json", "file": "meta_info.json"}
    archive.writestr("meta_info.pkl", pickle.dumps(meta_info, protocol=5))
    return {"encoding": "pickle", "file": "meta_info.pkl"}


def load_parts(path: str | os.PathLike[str], allow_pickle: bool = False) -> SavedParts:
    """Read what :func:`save_parts` wrote: ``(batch, non_tensor_batch, meta_info)``."""
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{os.fspath(path)!r} is not a saved DataProto (not an hf-protocol archive). "
            f"Save with DataProto.save_to_disk; files written by verl's pickle-based "
            f"save_to_disk must be converted once with a trusted unpickle."
        )
    with zipfile.ZipFile(path) as archive:
        manifest = _read_manifest(archive, path)
        pickled = _pickled_entries(manifest)
        if pickled and not allow_pickle:
            raise ValueError(
                f"{os.fspath(path)!r} stores {', '.join(pickled)} as pickle (values that are not "
                f"tensors, numbers or strings). Loading runs pickle: pass allow_pickle=True "
                f"only if you trust this file."
            )
        batch = _read_batch(archive, manifest["batch"])
        non_tensor = {e["key"]: _read_array(archive, e) for e in manifest["non_tensor_batch"]}
        meta = manifest["meta_info"]
        raw = archive.read(meta["file"])
        meta_info = json.loads(raw) if meta["encoding"] == "json" else pickle.loads(raw)
    return batch, non_tensor, meta_info


def _read_manifest(archive: zipfile.ZipFile, path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        manifest = json.loads(archive.read(MANIFEST))
    except (KeyError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{os.fspath(path)!r} is a zip file but not a saved DataProto ({error})."
        ) from None
    if manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{os.fspath(path)!r} is not a saved DataProto (format field missing).")
    if manifest.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{os.fspath(path)!r} uses DataProto format version {manifest.get('version')}; "
            f"this hf-protocol reads version {FORMAT_VERSION}. Upgrade hf-protocol."
        )
    return manifest


def _pickled_entries(manifest: dict[str, Any]) -> list[str]:
    names = [
        f"non_tensor_batch[{e['key']!r}]"
        for e in manifest["non_tensor_batch"]
        if e["encoding"] == "pickle"
    ]
    if manifest["meta_info"]["encoding"] == "pickle":
        names.append("meta_info")
    return names


def _read_batch(archive: zipfile.ZipFile, entry: dict[str, Any] | None) -> TensorDict | None:
    if entry is None:
        return None
    tensors = {}
    for column in entry["columns"]:
        # A bytearray is writable, so the loaded tensors own ordinary writable memory.
        raw = np.frombuffer(bytearray(archive.read(column["file"])), dtype=np.uint8)
        dtype = dtype_from_name(column["dtype"])
        tensors[column["key"]] = tensor_from_bytes(raw, dtype, column["shape"])
    return TensorDict(tensors, batch_size=entry["batch_size"])


def _read_array(archive: zipfile.ZipFile, entry: dict[str, Any]) -> np.ndarray:
    raw = archive.read(entry["file"])
    if entry["encoding"] == "npy":
        return np.load(io.BytesIO(raw), allow_pickle=False)
    if entry["encoding"] == "json":
        values = json.loads(raw)
        array = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            array[i] = value
        return array.reshape(entry["shape"])
    loaded: np.ndarray = pickle.loads(raw)
    return loaded
