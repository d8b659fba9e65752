"""The ``sglang`` backend: SGLang's offline ``sglang.Engine`` behind the rollout interface.

SGLang needs a CUDA GPU (its PyPI build depends on CUDA packages and its own torch); on a
machine without one this module imports but building the backend fails in SGLang.

Prompts go in as token ids (``skip_tokenizer_init=True``: a model directory needs no
tokenizer). Each prompt is sent ``n`` times as ``n`` requests, so the output order is the
contract's (each prompt's samples in a row) whatever SGLang does with its own ``n``.
Stopping is explicit, as in the other backends: ``ignore_eos=True`` plus the stop ids of
:func:`hf_rollout.stop_ids_for` as ``stop_token_ids``.

Log-probs: SGLang returns the log-prob of each sampled token under the distribution it
sampled from (after temperature; after top-k / top-p truncation when those are on). With
top-k and top-p off that is ``log_softmax(logits / T)``, as in the native backend.

Seeds: ``SamplingConfig.seed`` is passed as SGLang's per-request ``sampling_seed`` (``seed +
sample index``); SGLang applies it only when the engine runs with
``enable_deterministic_inference=True`` (pass it in ``engine_kwargs``).

Weights: :meth:`SGLangRollout.update_weights` hands tensors to
``Engine.update_weights_from_tensor`` in buckets of ``weight_bucket_bytes``. That is SGLang's
in-place path: it serialises the tensors with ``torch.multiprocessing``'s pickler for its own
scheduler processes (CUDA tensors travel as IPC handles, not copies); nothing leaves the
machine.

Sleep: :meth:`SGLangRollout.sleep` calls ``release_memory_occupation`` (KV cache and
weights), :meth:`SGLangRollout.wake_up` ``resume_memory_occupation``; both need the engine
started with ``enable_memory_saver=True``, which this backend sets unless ``engine_kwargs``
says otherwise.

``engine_kwargs`` options (all others go to ``sglang.Engine`` unchanged, e.g. ``tp_size``,
``mem_fraction_static``):

* ``weight_bucket_bytes`` (int, default 512 MiB): tensors per ``update_weights_from_tensor``
  call, by size.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from hf_controller import ConfigurationError
from hf_protocol import DataProto
from hf_rollout.backends.vllm import (
    in_vocab,
    model_eos_ids_from_dir,
    model_vocab_size_from_dir,
    pad_id_for_dir,
)
from hf_rollout.base import (
    build_output_from_samples,
    check_prompt_lengths,
    read_prompts,
    stop_ids_for,
)
from hf_rollout.config import RolloutConfig, SamplingConfig
from hf_rollout.sampling import prompt_seeds, row_seed

logger = logging.getLogger(__name__)

MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
"""SGLang's memory kinds that sleep releases (``GPU_MEMORY_ALL_TYPES``)."""
_RESERVED = {"model_path", "skip_tokenizer_init", "dtype", "context_length", "random_seed"}


def sglang_sampling_params(
    sampling: SamplingConfig, stop_ids: Sequence[int], max_tokens: int, seed: int | None
) -> dict[str, Any]:
    """The SGLang sampling-params dict of one request (one sample)."""
    greedy = sampling.is_greedy
    params: dict[str, Any] = {
        "n": 1,
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_p": 1.0 if greedy else sampling.top_p,
        "top_k": -1 if greedy else sampling.top_k,
        "max_new_tokens": max_tokens,
        "stop_token_ids": list(stop_ids),
        "ignore_eos": True,
        "skip_special_tokens": False,
    }
    if seed is not None:
        params["sampling_seed"] = seed
    return params


def tensor_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``(name, tensor)`` pairs into lists of at most ``bucket_bytes`` (one if larger)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        tensor = tensor.detach()
        if bucket and size + tensor.nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += tensor.nbytes
    if bucket:
        yield bucket


def sample_tokens_and_log_probs(result: dict[str, Any]) -> tuple[list[int], list[float]]:
    """The generated ids and their log-probs from one SGLang result dict."""
    tokens = [int(t) for t in result["output_ids"]]
    entries = result["meta_info"].get("output_token_logprobs") or []
    # Each entry is (log-prob, token id, text or None).
    log_probs = [float(entry[0]) for entry in entries[: len(tokens)]]
    if len(log_probs) != len(tokens):
        raise RuntimeError(
            f"SGLang returned {len(log_probs)} log-probs for {len(tokens)} tokens; the request "
            "must set return_logprob=True"
        )
    return tokens, log_probs


class SGLangRollout:
    """A :class:`~hf_rollout.RolloutEngine` over SGLang's offline ``Engine`` (GPU only)."""

    def __init__(self, config: RolloutConfig) -> None:
        if config.model_path is None:
            raise ConfigurationError(
                "sglang rollout needs RolloutConfig.model_path (a local HF directory); "
                "model_config (random init) is served by the native and vllm backends"
            )
        kwargs = dict(config.engine_kwargs)
        reserved = sorted(_RESERVED & set(kwargs))
        if reserved:
            raise ConfigurationError(
                f"sglang rollout: engine_kwargs {reserved} are set from RolloutConfig fields; "
                "set model_path, dtype, max_model_len, seed there instead"
            )
        self.config = config
        self._bucket_bytes = int(kwargs.pop("weight_bucket_bytes", 512 << 20))
        self.eos_ids = model_eos_ids_from_dir(config.model_path)
        self.vocab_size = model_vocab_size_from_dir(config.model_path)
        self.pad_token_id = pad_id_for_dir(config.pad_token_id, config.model_path, self.eos_ids)
        import sglang

        options: dict[str, Any] = {"enable_memory_saver": True, "log_level": "error"}
        options.update(kwargs)
        options.update(
            model_path=config.model_path,
            skip_tokenizer_init=True,
            dtype=config.dtype,
            context_length=config.max_model_len,
            random_seed=config.seed,
        )
        self.engine = sglang.Engine(**options)
        self.asleep = False
        self._released: set[str] = set()
        self.closed = False

    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Sample ``sampling.n`` responses per prompt (see ``hf_rollout.build_rollout_output``)."""
        if self.closed:
            raise RuntimeError("sglang rollout was shut down; build a new engine")
        if self.asleep:
            raise RuntimeError("sglang rollout is asleep; call wake_up() before generate()")
        prompt_tensors = read_prompts(prompts, self.pad_token_id)
        input_ids, attention_mask, _ = prompt_tensors
        longest = check_prompt_lengths(attention_mask, self.config.max_model_len)
        if input_ids.shape[0] == 0:
            return build_output_from_samples(
                prompts, prompt_tensors, [], [], sampling, self.pad_token_id
            )
        budget = min(sampling.max_new_tokens, self.config.max_model_len - longest)
        stop_ids = in_vocab(stop_ids_for(sampling, self.eos_ids), self.vocab_size)
        requests: list[list[int]] = []
        params: list[dict[str, Any]] = []
        rows = input_ids.shape[0]
        row_seeds = None if sampling.seed is None else prompt_seeds(prompts, sampling.seed, rows)
        for row, (ids, mask) in enumerate(zip(input_ids, attention_mask, strict=True)):
            tokens = ids[mask.bool()].tolist()
            for sample in range(sampling.n):
                # per prompt row (its index in the whole request) and sample
                seed = None if row_seeds is None else row_seed(row_seeds[row], sample)
                requests.append(tokens)
                params.append(sglang_sampling_params(sampling, stop_ids, budget, seed))
        results = self.engine.generate(
            input_ids=requests, sampling_params=params, return_logprob=True
        )
        samples, log_probs = zip(*(sample_tokens_and_log_probs(r) for r in results), strict=True)
        return build_output_from_samples(
            prompts, prompt_tensors, samples, log_probs, sampling, self.pad_token_id
        )

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load tensors named as in the Hugging Face ``state_dict()`` into the engine in place.

        Allowed while asleep: the weights' memory is resumed first (the KV cache stays
        released until ``wake_up``).
        """
        if self.closed:
            raise RuntimeError("sglang rollout was shut down; build a new engine")
        if "weights" in self._released:
            self.engine.resume_memory_occupation(tags=["weights"])
            self._released.remove("weights")
        buckets = list(tensor_buckets(named_tensors, self._bucket_bytes))
        for index, bucket in enumerate(buckets):
            self.engine.update_weights_from_tensor(bucket, flush_cache=index == len(buckets) - 1)

    def sleep(self) -> None:
        """Release the KV cache and the weights' GPU memory."""
        if self.closed or self.asleep:
            return
        self.engine.release_memory_occupation(tags=list(MEMORY_TAGS))
        self._released = set(MEMORY_TAGS)
        self.asleep = True

    def wake_up(self) -> None:
        """Restore what :meth:`sleep` released."""
        if self.closed or not self.asleep:
            return
        if self._released:
            self.engine.resume_memory_occupation(tags=sorted(self._released))
        self._released = set()
        self.asleep = False

    def shutdown(self) -> None:
        """Stop the engine's processes."""
        if self.closed:
            return
        self.closed = True
        self.engine.shutdown()
