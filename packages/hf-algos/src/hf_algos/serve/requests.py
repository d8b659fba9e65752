"""JSON request bodies -> typed calls, validated with the tinker SDK's own pydantic models.

A body that does not validate is a :class:`BadRequestError` naming each bad field, so a client
sees ``400 sampling_params.top_p: Input should be a valid number`` and never a traceback.
"""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic
from tinker import types
from transformers import PreTrainedTokenizerBase

from hf_algos.serve.errors import BadRequestError
from hf_algos.serve.models import SampleCall
from hf_algos.trainers.roles.sampling import stop_token_ids
from hf_controller import ConfigurationError
from hf_engines import OptimHyper
from hf_rollout import SamplingConfig

M = TypeVar("M", bound=pydantic.BaseModel)

DEFAULT_MAX_TOKENS = 64
"""``max_tokens`` when a sample request gives none."""


def parse(model: type[M], body: Any) -> M:
    """``body`` validated as ``model``; :class:`BadRequestError` naming the bad fields."""
    if not isinstance(body, dict):
        raise BadRequestError(
            f"the body must be a JSON object ({model.__name__}), got {type(body).__name__}"
        )
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, item['loc'])) or '(body)'}: {item['msg']}"
            for item in error.errors()
        )
        raise BadRequestError(f"invalid {model.__name__}: {problems}") from None


def optim_hyper(request: types.OptimStepRequest) -> OptimHyper:
    """The engine's step parameters from an ``optim_step`` request (Adam only)."""
    params = request.optim_params
    if not isinstance(params, types.AdamParams):
        raise BadRequestError(
            f"optimizer {type(params).__name__} is not supported here; send AdamParams"
        )
    try:
        return OptimHyper(
            learning_rate=params.learning_rate,
            beta1=params.beta1,
            beta2=params.beta2,
            eps=params.eps,
            weight_decay=params.weight_decay,
            grad_clip_norm=params.grad_clip_norm,
        )
    except ValueError as error:
        raise BadRequestError(f"adam_params: {error}") from None


def prompt_tokens(prompt: types.ModelInput) -> list[int]:
    """The token ids of a text-only ``ModelInput``."""
    tokens: list[int] = []
    for index, chunk in enumerate(prompt.chunks):
        if not isinstance(chunk, types.EncodedTextChunk):
            raise BadRequestError(
                f"prompt.chunks[{index}]: {type(chunk).__name__} is not supported (text only)"
            )
        tokens.extend(int(t) for t in chunk.tokens)
    if not tokens:
        raise BadRequestError("prompt is empty: send at least one token")
    return tokens


def stop_ids(tokenizer: PreTrainedTokenizerBase, stop: Any) -> tuple[int, ...]:
    """Token ids that end a sample: ids given as such; a string that is a special token's
    text, that token; any other string, every token containing it."""
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else list(stop)
    ids = {int(item) for item in items if isinstance(item, int)}
    special = dict(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=True))
    texts = [item for item in items if isinstance(item, str)]
    ids |= {special[text] for text in texts if text in special}
    plain = tuple(text for text in texts if text not in special)
    try:
        ids |= set(stop_token_ids(tokenizer, plain))
    except ConfigurationError as error:
        raise BadRequestError(f"sampling_params.stop: {error}") from None
    return tuple(sorted(ids))


def sample_call(request: types.SampleRequest, tokenizer: PreTrainedTokenizerBase) -> SampleCall:
    """The rollout's view of a ``sample`` request."""
    if request.num_samples < 1:
        raise BadRequestError(f"num_samples={request.num_samples} must be >= 1")
    unsupported = {
        "topk_prompt_logprobs": request.topk_prompt_logprobs,
        "topk_sample_logprobs": request.topk_sample_logprobs,
        "prompt_alt_tokens_k": getattr(request, "prompt_alt_tokens_k", 0),
    }
    asked = [name for name, value in unsupported.items() if value]
    if asked or request.target_prompt_logprobs is not None:
        raise BadRequestError(
            f"{asked or ['target_prompt_logprobs']} are not supported by this server"
        )
    params = request.sampling_params
    try:
        sampling = SamplingConfig(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_new_tokens=params.max_tokens or DEFAULT_MAX_TOKENS,
            stop_token_ids=stop_ids(tokenizer, params.stop),
            seed=params.seed,
            greedy=params.temperature == 0,
        )
    except ConfigurationError as error:
        raise BadRequestError(f"sampling_params: {error}") from None
    return SampleCall(
        prompt=prompt_tokens(request.prompt),
        num_samples=request.num_samples,
        sampling=sampling,
        prompt_logprobs=bool(request.prompt_logprobs),
    )
