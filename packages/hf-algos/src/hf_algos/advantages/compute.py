"""``compute_advantage``: run a registered estimator on a DataProto."""

from __future__ import annotations

from typing import Any

from hf_algos.advantages.registry import AdvantageEstimator, get_advantage_estimator
from hf_protocol import DataProto, fields


def _check_hyperparameters(estimator: AdvantageEstimator, kwargs: dict[str, Any]) -> None:
    allowed = estimator.hyperparameters
    unknown = sorted(set(kwargs) - set(allowed) - set(estimator.inputs))
    if unknown:
        raise TypeError(
            f"advantage estimator {estimator.name!r} takes no {unknown}; its hyper-parameters "
            f"are {allowed or '(none)'} and it reads {list(estimator.inputs)} from the batch"
        )


def _batch_inputs(
    data: DataProto, estimator: AdvantageEstimator, given: dict[str, Any]
) -> dict[str, Any]:
    """The estimator's batch inputs: from ``given`` if passed, else from ``data``."""
    tensors = data.batch
    # TensorDict refuses `in`; compare against its key list instead.
    held = sorted(tensors.keys()) if tensors is not None else []
    inputs: dict[str, Any] = {}
    for name in estimator.inputs:
        if name in given:
            inputs[name] = given[name]
        elif name == "index":
            if fields.UID not in data.non_tensor_batch:
                raise KeyError(
                    f"advantage estimator {estimator.name!r} groups rows by the non-tensor "
                    "column 'uid' (one id per prompt, repeated for its n responses), which "
                    "the batch lacks; add it in the data loader or pass index=..."
                )
            inputs[name] = data.non_tensor_batch[fields.UID]
        elif tensors is not None and name in held:
            inputs[name] = tensors[name]
        else:
            raise KeyError(
                f"advantage estimator {estimator.name!r} needs batch field {name!r}; the batch "
                f"holds {held}"
            )
    return inputs


def compute_advantage(
    data: DataProto, estimator: str | AdvantageEstimator, **kwargs: Any
) -> DataProto:
    """Run an advantage estimator on the batch ``data``, e.g. ``compute_advantage(batch, "grpo")``.

    ``estimator`` is a registered name (see ``ADVANTAGE_ESTIMATORS``) or an
    :class:`AdvantageEstimator` entry (a trainer looks its estimator up once and passes the
    entry). Reads the estimator's inputs from ``data`` (``token_level_rewards``,
    ``response_mask``, ``values``, ``reward_baselines`` ``(B, R)`` / ``(B,)`` from the
    tensors; the group ``index`` from the non-tensor ``uid``), writes ``advantages`` and
    ``returns`` ``(B, R)`` into ``data`` and returns it. Keyword arguments are
    hyper-parameters; a batch input passed as a keyword overrides the batch. Unknown keywords
    are an error naming the accepted ones. On plain tensors, call the estimator function
    itself (``get_advantage_estimator("gae").fn(token_level_rewards=..., ...)``).
    """
    if not isinstance(data, DataProto):
        raise TypeError(
            f"compute_advantage(batch, estimator, ...) takes a DataProto first, got "
            f"{type(data).__name__}; on tensors call the estimator function, e.g. "
            "get_advantage_estimator('gae').fn(token_level_rewards=..., values=..., "
            "response_mask=...)"
        )
    if isinstance(estimator, AdvantageEstimator):
        chosen = estimator
    else:
        chosen = get_advantage_estimator(estimator)
    _check_hyperparameters(chosen, kwargs)
    inputs = _batch_inputs(data, chosen, kwargs)
    params = {k: v for k, v in kwargs.items() if k not in inputs}
    advantages, returns = chosen.fn(**inputs, **params)
    assert data.batch is not None  # _batch_inputs read tensors from it
    data.batch[fields.ADVANTAGES] = advantages
    data.batch[fields.RETURNS] = returns
    return data
