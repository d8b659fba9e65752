"""The Tinker API's protobuf messages <-> plain Python values.

``forward_backward`` requests arrive as the SDK's protobuf ``ForwardBackwardRequest``;
forward/backward and sample results leave as protobuf ``ForwardBackwardOutput`` and
``SampleResponse`` (the SDK accepts nothing else for those two). The message classes are
the SDK's own (``tinker.proto.tinker_public_pb2``), so the layout is never guessed here.
Everything else on the wire is JSON, validated with the SDK's pydantic models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from hf_algos.serve.errors import BadRequestError

_DTYPES: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_INT32: np.dtype("<i4"),
}


@dataclass(frozen=True)
class Datum:
    """One training example: its input tokens and per-token loss inputs (each as long)."""

    tokens: np.ndarray
    """``model_input`` token ids, int64 ``(N,)``."""
    inputs: dict[str, np.ndarray]
    """``loss_fn_inputs`` by name, each ``(N,)`` (``target_tokens`` int64, the rest float32)."""


@dataclass(frozen=True)
class ForwardBackwardCall:
    """A decoded ``forward_backward`` (or, with ``forward_only``, ``forward``) request."""

    model_id: str
    seq_id: int
    loss_fn: str
    data: list[Datum]
    config: dict[str, float] = field(default_factory=dict)
    forward_only: bool = False


def _tensor(message: pb.Tensor, where: str) -> np.ndarray:
    """A dense 1-D array from a protobuf ``Tensor`` (sparse CSR densified)."""
    dtype = _DTYPES.get(message.dtype)
    if dtype is None:
        raise BadRequestError(f"{where}: unsupported dtype {message.dtype} (send float32 or int64)")
    shape = [int(s) for s in message.shape]
    if message.WhichOneof("encoding") == "sparse_csr":
        values = np.frombuffer(message.sparse_csr.values, dtype=dtype)
        crow = np.frombuffer(message.sparse_csr.crow_indices, dtype="<i8")
        cols = np.frombuffer(message.sparse_csr.col_indices, dtype="<i8")
        if len(shape) != 2:
            raise BadRequestError(f"{where}: a sparse tensor needs a 2-D shape, got {shape}")
        dense = np.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            dense[row, cols[crow[row] : crow[row + 1]]] = values[crow[row] : crow[row + 1]]
        array = dense
    else:
        array = np.frombuffer(message.dense, dtype=dtype)
        if shape and int(np.prod(shape)) != array.size:
            raise BadRequestError(f"{where}: shape {shape} does not match {array.size} values")
    if array.ndim != 1 and not (array.ndim == 2 and 1 in array.shape):
        raise BadRequestError(
            f"{where}: per-token inputs must be 1-D (one value per input token), got shape "
            f"{list(array.shape)}"
        )
    return array.reshape(-1)


def _datum(message: pb.Datum, index: int) -> Datum:
    tokens: list[np.ndarray] = []
    for chunk in message.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise BadRequestError(
                f"data[{index}].model_input: {kind} chunks are not supported by this server "
                "(text only: send encoded_text chunks)"
            )
        tokens.append(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4"))
    ids = np.concatenate(tokens).astype(np.int64) if tokens else np.zeros(0, np.int64)
    if ids.size == 0:
        raise BadRequestError(f"data[{index}].model_input is empty: send at least one token")
    inputs: dict[str, np.ndarray] = {}
    for name, tensor in message.loss_fn_inputs.items():
        array = _tensor(tensor, f"data[{index}].loss_fn_inputs.{name}")
        if array.size != ids.size:
            raise BadRequestError(
                f"data[{index}].loss_fn_inputs.{name} has {array.size} values for "
                f"{ids.size} input tokens: give one per input token"
            )
        inputs[name] = array.astype(np.int64 if name == "target_tokens" else np.float32)
    return Datum(tokens=ids, inputs=inputs)


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """The request in ``body`` (protobuf ``ForwardBackwardRequest``); :class:`BadRequestError`
    naming the field when it is malformed."""
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as error:
        raise BadRequestError(
            f"the body is not a protobuf ForwardBackwardRequest ({error}); send it with the "
            "tinker SDK (Content-Type: application/x-protobuf)"
        ) from error
    if not message.model_id:
        raise BadRequestError("model_id is missing")
    config = {key: float(value) for key, value in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():
        if value.WhichOneof("value") == "number":
            config[key] = float(value.number)
        elif value.WhichOneof("value") == "text":
            raise BadRequestError(
                f"loss_fn_config.{key}: text values are not supported (give a number)"
            )
    return ForwardBackwardCall(
        model_id=message.model_id,
        seq_id=int(message.seq_id),
        loss_fn=message.loss_fn,
        data=[_datum(datum, index) for index, datum in enumerate(message.data)],
        config=config,
        forward_only=bool(message.forward_only),
    )


def encode_forward_backward(logprobs: list[np.ndarray], metrics: dict[str, float]) -> bytes:
    """A protobuf ``ForwardBackwardOutput``: per datum its ``logprobs`` (float32, one per
    input token) in one ``ArrayRecord``, and ``metrics`` (keys ``name:reduction``)."""
    output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = output.loss_fn_outputs.add(num_datums=len(logprobs))
    arrays = [np.asarray(row, dtype="<f4") for row in logprobs]
    offsets = np.cumsum([0] + [row.nbytes for row in arrays]).astype("<i8")
    batched = record.fields["logprobs"]
    batched.data = b"".join(row.tobytes() for row in arrays)
    batched.offsets = offsets.tobytes()
    batched.dtype = pb.DTYPE_FLOAT32
    for key, value in metrics.items():
        output.metrics[key] = float(value)
    return output.SerializeToString()


@dataclass(frozen=True)
class SampledSequence:
    """One sampled continuation: its tokens, their log-probs and why it ended."""

    tokens: list[int]
    logprobs: list[float]
    stopped: bool
    """True when a stop token or string ended it, False when it ran to ``max_tokens``."""


def encode_sample(
    sequences: list[SampledSequence], prompt_logprobs: list[float] | None = None
) -> bytes:
    """A protobuf ``SampleResponse`` (``prompt_logprobs``: one per prompt token, NaN first)."""
    response = pb.SampleResponse(prompt_cache_hit_tokens=0)
    for sequence in sequences:
        response.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if sequence.stopped else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(sequence.tokens, dtype="<i4").tobytes(),
            logprobs=np.asarray(sequence.logprobs, dtype="<f4").tobytes(),
        )
    if prompt_logprobs is not None:
        response.prompt_logprobs = np.asarray(prompt_logprobs, dtype="<f4").tobytes()
    return response.SerializeToString()
