"""The ``native`` backend: batched sampling in pure torch over a transformers causal LM.

It is the embedded default on CPU and the reference the other backends are checked against.
One ``generate`` call runs one prefill forward over the prompts, copies each prompt's cache
row for its ``n`` samples (GRPO's group shares one prefill), then one
forward per new token over a KV cache (a lean Llama-family or Gemma 3 forward over a
preallocated cache, or the transformers forward over a ``DynamicCache``); sampling is
batched tensor ops, rows that hit a stop token stop being counted, rows are dropped from the
cache once many have finished, and the loop ends as soon as every row has.

``engine_kwargs`` options:

* ``attn_implementation`` (str, default ``"sdpa"``): passed to transformers.
* ``lean_forward`` (bool, default ``True``): run Llama-family models (llama, qwen2, qwen3,
  mistral) through :mod:`~hf_rollout.backends.fast_decoder` and Gemma 3 (``gemma3_text``)
  through :mod:`~hf_rollout.backends.gemma_decoder`, the same maths with far less Python
  per step; other models, or ``False``, use the transformers forward over a
  ``DynamicCache`` (sliding-window layers included). The engine logs which, once.
* ``compact_fraction`` (float, default ``0.5``): drop finished rows from the KV cache when at
  least this fraction of the active rows has finished (``1.0`` never drops).

Prefix reuse (``RolloutConfig.prefix_cache_rows`` > 0, for multi-turn episodes): the engine
keeps the keys and values of the last ``prefix_cache_rows`` sequences it generated, and a
prompt that starts with one of them prefills only its new tokens on top of them (see
:mod:`~hf_rollout.backends.prefix_cache`). Only models whose layers are all full attention
support it (a sliding window counts columns, which the reused layout moves); for others,
Gemma 3 included, it is off, with a warning.
The kept cache is dropped by ``update_weights``, ``sleep`` and ``shutdown``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from hf_controller import ConfigurationError
from hf_protocol import DataProto
from hf_protocol.routing import ROUTED_EXPERTS, routers
from hf_rollout.backends.fast_decoder import LlamaFamilyDecoder, supports
from hf_rollout.backends.gemma_decoder import GEMMA_MODEL_TYPES, Gemma3Decoder, gemma_supports
from hf_rollout.backends.prefix_cache import (
    PastKV,
    PrefixCache,
    counts_from_zero,
    prefill_layout,
)
from hf_rollout.backends.routing_trace import RoutingStepper
from hf_rollout.backends.steppers import (
    LeanDecoder,
    LeanStepper,
    Stepper,
    TransformersStepper,
    transformers_can_reuse,
)
from hf_rollout.base import (
    build_rollout_output,
    check_prompt_lengths,
    read_prompts,
    stop_ids_for,
)
from hf_rollout.config import RolloutConfig, SamplingConfig
from hf_rollout.sampling import RowStreams, prompt_seeds, sample_next_tokens

_KWARGS = {"attn_implementation", "compact_fraction", "lean_forward"}
_LOG = logging.getLogger(__name__)


def load_causal_lm(config: RolloutConfig) -> PreTrainedModel:
    """The model of ``config``: ``from_pretrained`` on a local path, or random from a dict."""
    attn = config.engine_kwargs.get("attn_implementation", "sdpa")
    if config.model_path is not None:
        model = AutoModelForCausalLM.from_pretrained(
            config.model_path,
            dtype=config.torch_dtype,
            attn_implementation=attn,
            trust_remote_code=config.trust_remote_code,
        )
    else:
        options = dict(config.model_config or {})
        hf_config = AutoConfig.for_model(options.pop("model_type"), **options)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            model = AutoModelForCausalLM.from_config(
                hf_config, dtype=config.torch_dtype, attn_implementation=attn
            )
    model.eval().requires_grad_(False)
    return model


def model_eos_ids(model: PreTrainedModel) -> list[int]:
    """The eos id(s) of the model's generation config (else its config); may be empty."""
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, list | tuple) else [int(eos)]


def copy_named_tensors(
    model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]
) -> int:
    """Copy each ``(name, full tensor)`` into the model's state of that name; return the count.

    Names are those of ``model.state_dict()`` (tied weights answer to both of their names).
    An unknown name or a shape mismatch is an error.
    """
    targets = model.state_dict(keep_vars=True)
    count = 0
    for name, tensor in named_tensors:
        target = targets.get(name)
        if target is None:
            known = sorted(targets)
            raise KeyError(
                f"update_weights: the rollout model has no tensor {name!r}; names must match "
                f"the Hugging Face state_dict, e.g. {known[:4]} ({len(known)} in all)"
            )
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the rollout model "
                f"expects {tuple(target.shape)}; are both sides the same architecture?"
            )
        if not _same_memory(target, tensor):  # a weight channel may have loaded it in place
            with torch.no_grad():
                target.data.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
        count += 1
    return count


def _same_memory(target: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is ``target``'s own memory, same dtype and layout (a no-op copy)."""
    return (
        tensor.data_ptr() == target.data_ptr()
        and tensor.dtype == target.dtype
        and tensor.device == target.device
        and tensor.stride() == target.stride()
    )


def weight_destinations(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``state_dict()`` name -> the model's own tensor (``.data``, no autograd), the
    destinations a weight channel can receive straight into (tied weights under each name)."""
    return {name: t.data for name, t in model.state_dict(keep_vars=True).items()}


def _lean_decoder(model: torch.nn.Module, config: RolloutConfig) -> LeanDecoder | None:
    """The lean decoder of ``model`` where it has one and ``lean_forward`` is on, else
    ``None`` (the transformers forward); logs which path the model takes, once."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    reason = "lean_forward is off"
    if config.engine_kwargs.get("lean_forward", True):
        if model_type in GEMMA_MODEL_TYPES:
            reason = gemma_supports(model.config) or ""
        else:
            reason = supports(model, config.max_model_len) or ""
    if reason:
        _LOG.info(
            "native rollout: %s through the transformers forward (no lean decoder: %s)",
            model_type,
            reason,
        )
        return None
    _LOG.info("native rollout: %s through the lean decoder", model_type)
    if model_type in GEMMA_MODEL_TYPES:
        return Gemma3Decoder(model, config.max_model_len)
    return LlamaFamilyDecoder(model, config.max_model_len)


class NativeRollout:
    """A :class:`~hf_rollout.RolloutEngine` in pure torch over a transformers model."""

    def __init__(self, config: RolloutConfig) -> None:
        unknown = sorted(set(config.engine_kwargs) - _KWARGS)
        if unknown:
            raise ConfigurationError(
                f"native rollout: unknown engine_kwargs {unknown}; valid are {sorted(_KWARGS)}"
            )
        self.config = config
        self.device = config.resolve_device()
        model = load_causal_lm(config)
        self.eos_ids = model_eos_ids(model)
        self.hf_config = model.config
        self.model: torch.nn.Module = model.to(self.device)  # type: ignore[arg-type]
        self.pad_token_id = self._resolve_pad_id()
        self.compact_fraction = float(config.engine_kwargs.get("compact_fraction", 0.5))
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.asleep = False
        self.closed = False
        self.records_routing = bool(routers(self.model))
        self._trace: RoutingStepper | None = None
        self.decoder = _lean_decoder(self.model, config)
        self.prefix_cache: PrefixCache | None = None
        if config.prefix_cache_rows > 0:
            # The kept rows of a sliding-window model cannot be re-laid out (the window
            # counts columns), so only full-attention models reuse prefixes.
            if isinstance(self.decoder, LlamaFamilyDecoder) or (
                self.decoder is None and transformers_can_reuse(self.hf_config)
            ):
                self.prefix_cache = PrefixCache(config.prefix_cache_rows)
            else:
                _LOG.warning(
                    "native rollout: prefix_cache_rows=%d ignored: the cache of model_type "
                    "%r has layers other than full attention; every prompt is prefilled whole",
                    config.prefix_cache_rows,
                    getattr(self.hf_config, "model_type", None),
                )

    def _resolve_pad_id(self) -> int:
        if self.config.pad_token_id is not None:
            return self.config.pad_token_id
        pad = getattr(self.hf_config, "pad_token_id", None)
        if pad is not None:
            return int(pad)
        return self.eos_ids[0] if self.eos_ids else 0

    # ------------------------------------------------------------------ generation

    @torch.no_grad()  # not inference_mode: outputs must be usable in autograd later
    def generate(self, prompts: DataProto, sampling: SamplingConfig) -> DataProto:
        """Sample ``sampling.n`` responses per prompt (see ``hf_rollout.build_rollout_output``)."""
        if self.closed:
            raise RuntimeError("native rollout was shut down; build a new engine")
        if self.asleep:
            raise RuntimeError("native rollout is asleep; call wake_up() before generate()")
        prompt_tensors = read_prompts(prompts, self.pad_token_id)
        input_ids, attention_mask, _ = prompt_tensors
        longest = check_prompt_lengths(attention_mask, self.config.max_model_len)
        rows = input_ids.shape[0] * sampling.n
        if rows == 0:
            empty = torch.zeros((0, 0), dtype=torch.long)
            return build_rollout_output(
                prompts, prompt_tensors, empty, empty, empty.float(), sampling.n,
                sampling.effective_temperature, self.pad_token_id,
            )  # fmt: skip
        budget = min(sampling.max_new_tokens, self.config.max_model_len - longest)
        uniforms = self._uniforms(prompts, sampling, input_ids.shape[0], rows)
        self._trace = None
        if self.prefix_cache is None or not counts_from_zero(attention_mask, prompt_tensors[2]):
            ids, mask, pos = self._dense_prefill(prompt_tensors)
            tokens, mask, log_probs, _ = self._decode(
                ids, mask, pos, sampling, budget, uniforms, repeat=sampling.n
            )
        else:
            tokens, mask, log_probs = self._decode_reusing(
                prompt_tensors, sampling, budget, uniforms
            )
        output = build_rollout_output(
            prompts, prompt_tensors, tokens.cpu(), mask.cpu(), log_probs.cpu(), sampling.n,
            sampling.effective_temperature, self.pad_token_id,
        )  # fmt: skip
        if self._trace is not None:  # a mixture of experts, decoded without a prefix cache
            routed = self._trace.routing(tokens.shape[1], input_ids.shape[1])
            output = output.union(DataProto.from_dict(tensors={ROUTED_EXPERTS: routed}))
        return output

    def _uniforms(
        self, prompts: DataProto, sampling: SamplingConfig, prompt_rows: int, rows: int
    ) -> Callable[[], torch.Tensor]:
        """Each decode step's ``(rows,)`` uniform draws: with a request seed, one stream per
        prompt row (:class:`~hf_rollout.sampling.RowStreams` of
        :func:`~hf_rollout.sampling.prompt_seeds`, so a row samples the same whichever worker
        and batch it is in); without one, the engine's own generator."""
        if sampling.seed is not None:
            seeds = prompt_seeds(prompts, sampling.seed, prompt_rows)
            return RowStreams(seeds, sampling.n, self.device).uniform
        generator = self.generator
        return lambda: torch.rand(rows, generator=generator, device=self.device)

    def _dense_prefill(
        self, prompt_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prompt tensors ``(B, P)`` on the engine's device, without the columns that
        are padding in every row (they cost compute and change nothing)."""
        attention_mask = prompt_tensors[1]
        keep_from = int((attention_mask.sum(dim=0) > 0).long().argmax())
        ids, mask, pos = (t[:, keep_from:].to(self.device) for t in prompt_tensors)
        return ids, mask, pos

    def _decode_reusing(
        self,
        prompt_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        sampling: SamplingConfig,
        budget: int,
        uniforms: Callable[[], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_decode` with prefix reuse: prompts that extend kept sequences prefill only
        their new tokens; every generated sequence is kept afterwards."""
        cache = self.prefix_cache
        assert cache is not None
        input_ids, attention_mask, _ = prompt_tensors
        prompts = [
            ids[real.bool()].tolist() for ids, real in zip(input_ids, attention_mask, strict=True)
        ]
        found = cache.lookup(prompts)
        rows = [prompt for prompt in prompts for _ in range(sampling.n)]
        past: PastKV | None = None
        if any(reused for _, reused in found):
            found = [hit for hit in found for _ in range(sampling.n)]
            layout = prefill_layout(cache, rows, found, self.pad_token_id)
            cache.discard([key for key, reused in found if reused])
            ids, mask, pos = layout.input_ids, layout.attention_mask, layout.position_ids
            past = layout.past
            repeat = 1
        else:
            ids, mask, pos = self._dense_prefill(prompt_tensors)
            repeat = sampling.n
        tokens, out_mask, log_probs, snapshots = self._decode(
            ids, mask, pos, sampling, budget, uniforms, past=past, keep=True, repeat=repeat
        )
        lengths = out_mask.sum(dim=1).tolist()
        for out_rows, snapshot in snapshots:
            # The last sampled token of a row was never fed, so it has no keys and values.
            sequences = [
                rows[row] + tokens[row, : lengths[row] - 1].tolist() for row in out_rows.tolist()
            ]
            cache.add_rows(sequences, snapshot)
        return tokens, out_mask, log_probs

    def _stepper(self, capacity: int, past: PastKV | None = None) -> Stepper:
        if self.decoder is not None:
            return LeanStepper(self.decoder, capacity)
        stepper = TransformersStepper(self.model, self.hf_config)
        if self.records_routing and past is None:
            # Each token's experts go into the output (routed_experts) for router replay.
            self._trace = RoutingStepper(stepper, self.model)
            return self._trace
        return stepper

    def _decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        sampling: SamplingConfig,
        budget: int,
        uniforms: Callable[[], torch.Tensor],
        past: PastKV | None = None,
        keep: bool = False,
        repeat: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, PastKV]]]:
        """The decode loop; returns ``(B * repeat, R)`` tokens, response mask and log-probs,
        and with ``keep`` the cache of every row as ``(output rows, snapshot)`` pairs.

        ``past`` are reused keys and values the prompts continue (``attention_mask`` then
        covers them too). ``repeat``: each prompt row is sampled that many times (its
        copies consecutive); the prompt is prefilled once and its cache row copied, so the
        ``n`` samples of GRPO share one prefill instead of ``n``."""
        rows = input_ids.shape[0] * repeat
        stop_ids = torch.tensor(stop_ids_for(sampling, self.eos_ids), device=self.device)
        out_tokens = torch.full((rows, budget), self.pad_token_id, device=self.device)
        out_mask = torch.zeros((rows, budget), dtype=torch.long, device=self.device)
        out_log_probs = torch.zeros((rows, budget), dtype=torch.float32, device=self.device)
        active = torch.arange(rows, device=self.device)  # output row of each cache row
        finished = torch.zeros(rows, dtype=torch.bool, device=self.device)
        stepper = self._stepper(attention_mask.shape[1] + budget, past)
        snapshots: list[tuple[torch.Tensor, PastKV]] = []
        next_pos = (position_ids[:, -1] + 1).repeat_interleave(repeat)
        logits = stepper.prefill(input_ids, attention_mask, position_ids, past)
        if repeat > 1:
            logits = logits.repeat_interleave(repeat, dim=0)
            stepper.repeat_rows(repeat)
        steps = budget
        for step in range(budget):
            uniform = None
            if not sampling.is_greedy:  # drawn for every row, so compaction keeps streams
                uniform = uniforms()[active]
            tokens, log_probs = sample_next_tokens(logits, sampling, uniform)
            # Rows finished earlier (not yet compacted away) keep decoding; mask them out.
            out_tokens[active, step] = tokens.masked_fill(finished, self.pad_token_id)
            out_mask[active, step] = (~finished).long()
            out_log_probs[active, step] = log_probs.masked_fill(finished, 0.0)
            finished = finished | torch.isin(tokens, stop_ids)
            n_finished = int(finished.sum())
            if n_finished == len(active) or step + 1 == budget:
                steps = step + 1
                break
            if n_finished and n_finished >= self.compact_fraction * len(active):
                if keep:  # finished rows leave the cache: save theirs first
                    done = finished.nonzero().flatten()
                    snapshots.append((active[done], stepper.snapshot(done)))
                kept = (~finished).nonzero().flatten()
                stepper.keep_rows(kept)
                active, tokens, finished = active[kept], tokens[kept], finished[kept]
                next_pos = next_pos[kept]
            logits = stepper.step(tokens, next_pos)
            next_pos = next_pos + 1
        if keep:
            snapshots.append((active, stepper.snapshot(torch.arange(len(active)))))
        return out_tokens[:, :steps], out_mask[:, :steps], out_log_probs[:, :steps], snapshots

    def reseed(self, seed: int) -> None:
        """Restart the sampling generator from ``seed`` (a worker passes ``seed + rank``)."""
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    # ------------------------------------------------------------------ weights and memory

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full tensors named as in the Hugging Face ``state_dict()`` (allowed asleep).

        Drops the kept prefix cache: its keys and values belong to the old weights. A pair
        whose tensor is already the model's own (see :meth:`weight_destinations`) costs no
        copy.
        """
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        copy_named_tensors(self.model, named_tensors)

    def weight_destinations(self) -> dict[str, torch.Tensor]:
        """The model's tensors by ``state_dict()`` name, for a caller that loads straight
        into them; then ``update_weights`` skips them. (The weight channel no longer does:
        it stages a push whole before loading it, so a failed push changes nothing.)"""
        return weight_destinations(self.model)

    def sleep(self) -> None:
        """Free generation memory; on an accelerator the weights also move to host memory.

        The decoding KV cache lives only inside ``generate`` (the stepper that holds it is a
        local of ``_decode``); sleep drops the kept prefix cache (sequences kept for reuse)
        and the lean forward's rotary tables. On CPU the weights stay where they are.
        """
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        if self.asleep:
            return
        if self.decoder is not None:
            self.decoder.release_tables()
        if self.device.type != "cpu":
            self.model.to("cpu")
            torch.cuda.empty_cache()
        self.asleep = True

    def wake_up(self) -> None:
        """Restore what :meth:`sleep` freed."""
        if not self.asleep:
            return
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.asleep = False

    def shutdown(self) -> None:
        """Drop the model; the engine is unusable afterwards."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        del self.model
        self.closed = True

    def __repr__(self) -> str:
        name: Any = self.config.model_path or (self.config.model_config or {}).get("model_type")
        state = "closed" if self.closed else "asleep" if self.asleep else "awake"
        return f"NativeRollout(model={name!r}, device={self.device}, {state})"
