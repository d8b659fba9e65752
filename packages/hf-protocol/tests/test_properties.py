"""Properties that must hold for every DataProto, checked with hypothesis."""

import pickle

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_protocol import DataProto
from hf_protocol.testing import assert_dataproto_equal

_DTYPES = [torch.float32, torch.int64, torch.bool, torch.bfloat16]
_TEXT = st.text(max_size=5)
_OBJECTS = st.one_of(st.none(), _TEXT, st.integers(-5, 5), st.lists(st.integers(0, 3), max_size=3))


@st.composite
def dataprotos(draw: st.DrawFn) -> DataProto:
    """DataProtos of 0-12 rows with mixed tensor dtypes, trailing shapes and object columns."""
    length = draw(st.integers(0, 12))
    tensors = {}
    for i in range(draw(st.integers(0, 3))):
        dtype = draw(st.sampled_from(_DTYPES))
        trailing = draw(st.lists(st.integers(0, 3), max_size=2))
        seed = draw(st.integers(0, 2**16))
        values = torch.randn(length, *trailing, generator=torch.Generator().manual_seed(seed))
        tensors[f"t{i}"] = (values > 0) if dtype == torch.bool else (values * 10).to(dtype)
    non_tensors: dict[str, object] = {}
    if draw(st.booleans()):
        non_tensors["obj"] = draw(st.lists(_OBJECTS, min_size=length, max_size=length))
    if draw(st.booleans()):
        non_tensors["num"] = np.arange(length, dtype=np.float64)
    meta = draw(st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2))
    if not tensors and not non_tensors:
        tensors["t"] = torch.zeros(length)
    return DataProto.from_dict(tensors, non_tensors, meta)


@settings(max_examples=60, deadline=None)
@given(data=dataprotos(), chunks=st.integers(1, 15))
def test_concat_of_chunks_is_identity(data: DataProto, chunks: int) -> None:
    parts = data.chunk(chunks)
    assert len(parts) == chunks
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert_dataproto_equal(DataProto.concat(parts), data)


@settings(max_examples=60, deadline=None)
@given(data=dataprotos(), split_size=st.integers(1, 5))
def test_concat_of_splits_is_identity(data: DataProto, split_size: int) -> None:
    parts = data.split(split_size)
    if parts:
        assert_dataproto_equal(DataProto.concat(parts), data)
    else:
        assert len(data) == 0


@settings(max_examples=60, deadline=None)
@given(data=dataprotos(), protocol=st.sampled_from([2, 4, 5]), out_of_band=st.booleans())
def test_pickle_round_trip(data: DataProto, protocol: int, out_of_band: bool) -> None:
    if out_of_band and protocol == 5:
        buffers: list[pickle.PickleBuffer] = []
        payload = pickle.dumps(data, protocol=5, buffer_callback=buffers.append)
        restored = pickle.loads(payload, buffers=buffers)
    else:
        restored = pickle.loads(pickle.dumps(data, protocol=protocol))
    assert_dataproto_equal(restored, data)


@settings(max_examples=60, deadline=None)
@given(data=dataprotos(), pick=st.data())
def test_select_pop_union_are_inverses(data: DataProto, pick: st.DataObject) -> None:
    batch_keys = list(data.batch.keys()) if data.batch is not None else []
    chosen_batch = pick.draw(
        st.lists(st.sampled_from(batch_keys), unique=True) if batch_keys else st.just([])
    )
    non_keys = list(data.non_tensor_batch)
    chosen_non = pick.draw(
        st.lists(st.sampled_from(non_keys), unique=True) if non_keys else st.just([])
    )
    original = data.select(deepcopy=True)

    selected = data.select(batch_keys=chosen_batch, non_tensor_batch_keys=chosen_non)
    popped = data.pop(batch_keys=chosen_batch, non_tensor_batch_keys=chosen_non)
    assert_dataproto_equal(popped, selected, check_meta=False)
    data.union(popped)
    assert_dataproto_equal(data, original)


@settings(max_examples=40, deadline=None)
@given(data=dataprotos(), times=st.integers(1, 3), interleave=st.booleans())
def test_repeat_then_stride_recovers_rows(data: DataProto, times: int, interleave: bool) -> None:
    repeated = data.repeat(times, interleave=interleave)
    assert len(repeated) == len(data) * times
    first_copy = repeated.slice(0, None, times) if interleave else repeated.slice(0, len(data))
    assert_dataproto_equal(first_copy, data)
