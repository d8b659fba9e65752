"""Tinker datums <-> the engines' prompt/response batch.

A datum is ``N`` input tokens and ``N`` next-token targets (``target_tokens[i]`` follows
``model_input[:i + 1]``), with per-token loss inputs. The engines compute the log-probs of
a batch's ``responses`` given its ``prompts``, so a datum becomes the prompt
``model_input[:1]`` and the response ``model_input[1:] + target_tokens[-1:]``: its ``N``
response log-probs are exactly the ``N`` target log-probs. Loss inputs travel as
``(B, R)`` columns named ``tinker/<input>``, plus ``tinker/row`` (each row's index).
"""

from __future__ import annotations

import numpy as np
import torch

from hf_algos.serve.errors import BadRequestError
from hf_algos.serve.losses import CONFIG_KEYS, INPUTS, LOSSES
from hf_algos.serve.wire import Datum
from hf_protocol import DataProto, build_prompt_response_batch

ROW = "tinker/row"
"""Each row's index in the request, ``(B,)`` long."""
LOSS_FN = "tinker/loss_fn"
"""meta_info: the loss name."""
LOSS_CONFIG = "tinker/loss_config"
"""meta_info: the loss's ``loss_fn_config``."""


def input_column(name: str) -> str:
    """The batch column of loss input ``name``."""
    return f"tinker/{name}"


def check_call(loss_fn: str, data: list[Datum], config: dict[str, float]) -> None:
    """Refuse an unknown loss, a missing input, non-shifted targets or an unknown config
    key, naming the datum and field (:class:`BadRequestError`)."""
    if loss_fn not in LOSSES:
        raise BadRequestError(
            f"loss_fn {loss_fn!r} is not served here; use one of {sorted(LOSSES)} "
            "(custom losses run client-side through cross_entropy)"
        )
    if not data:
        raise BadRequestError("data is empty: send at least one datum")
    unknown = sorted(set(config) - set(CONFIG_KEYS[loss_fn]))
    if unknown:
        raise BadRequestError(
            f"loss_fn_config keys {unknown} are not read by {loss_fn} "
            f"(it reads {list(CONFIG_KEYS[loss_fn]) or 'none'})"
        )
    for index, datum in enumerate(data):
        missing = [name for name in INPUTS[loss_fn] if name not in datum.inputs]
        if missing:
            raise BadRequestError(
                f"data[{index}].loss_fn_inputs lacks {missing}: {loss_fn} needs "
                f"{list(INPUTS[loss_fn])}"
            )
        targets = datum.inputs["target_tokens"]
        if not np.array_equal(targets[:-1], datum.tokens[1:]):
            raise BadRequestError(
                f"data[{index}].loss_fn_inputs.target_tokens must be model_input shifted by "
                "one (target_tokens[i] == model_input[i + 1]); this server trains next-token "
                "targets only"
            )


def to_batch(data: list[Datum], pad_id: int, meta: dict[str, object]) -> DataProto:
    """The engines' batch of ``data`` (see the module docstring), with its loss inputs."""
    prompts = [[int(datum.tokens[0])] for datum in data]
    responses = [
        [*map(int, datum.tokens[1:]), int(datum.inputs["target_tokens"][-1])]
        if "target_tokens" in datum.inputs
        else [*map(int, datum.tokens[1:]), pad_id]
        for datum in data
    ]
    batch = build_prompt_response_batch(prompts, responses, pad_id, meta_info=dict(meta))
    assert batch.batch is not None
    width = batch.batch["responses"].shape[1]
    batch.batch[ROW] = torch.arange(len(data), dtype=torch.long)
    names = {name for datum in data for name in datum.inputs if name != "target_tokens"}
    for name in sorted(names):
        column = torch.zeros(len(data), width, dtype=torch.float32)
        for row, datum in enumerate(data):
            values = torch.from_numpy(np.asarray(datum.inputs[name], dtype=np.float32))
            column[row, : values.numel()] = values
        batch.batch[input_column(name)] = column
    return batch


def per_datum(log_probs: torch.Tensor, data: list[Datum]) -> list[np.ndarray]:
    """Each datum's ``N`` target log-probs from the ``(B, R)`` response log-probs."""
    return [
        log_probs[row, : datum.tokens.size].detach().float().numpy().copy()
        for row, datum in enumerate(data)
    ]
