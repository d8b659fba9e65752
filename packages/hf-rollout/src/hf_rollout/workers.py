"""``RolloutWorker``: a rollout engine as one rank of an SPMD worker group."""

from __future__ import annotations

import dataclasses
import time

import torch

from hf_controller import Dispatch, Worker, register, release_host_memory
from hf_protocol import DataProto, fields, left_pad
from hf_rollout.base import RolloutEngine, pad_responses_to
from hf_rollout.config import RolloutConfig, SamplingConfig
from hf_rollout.multiturn.agent import AgentRollout
from hf_rollout.registry import build_rollout
from hf_rollout.weight_sync.channel import DEFAULT_TIMEOUT_S
from hf_rollout.weight_sync.receiver import WeightReceiver, fused_actor_weights
from hf_rollout.weight_sync.wire import NamedTensors, named_pairs

__all__ = ["NamedTensors", "RolloutWorker", "request_sampling"]


class RolloutWorker(Worker):
    """Generation as a worker role; the backend is chosen by ``config.backend``.

    ``generate_sequences`` samples as ``prompts.meta_info["sampling"]`` says: a
    :class:`SamplingConfig`, the very object the driver built (it pickles through Ray as
    it is). A request without one samples with ``SamplingConfig()``'s defaults (one sample,
    temperature 1, at most 32 new tokens); anything else is an error
    (:func:`request_sampling`).

    Responses are right-padded to ``max_new_tokens`` so the shards of all ranks have one
    width; raw token-list prompts are left-padded to ``meta_info["max_prompt_length"]``
    when given (set it when several ranks get raw prompts, for the same reason). Per-call
    seeds (of requests without a ``prompt_index`` column) and the engine's generator are
    offset by the rank, so ranks draw differently.

    In the ``separate`` placement the weights arrive over a :class:`~hf_rollout.WeightChannel`
    (:meth:`join_weight_channel` once, then :meth:`receive_weights` per sync, issued
    non-blocking by the driver together with the actor's send); the weight methods delegate
    to a :class:`~hf_rollout.weight_sync.WeightReceiver` (:mod:`hf_rollout.weight_sync`).
    """

    def __init__(self, config: RolloutConfig) -> None:
        super().__init__()
        self.config = config
        self._engine: RolloutEngine | None = None
        self._weights = WeightReceiver("RolloutWorker")
        self._agent: AgentRollout | None = None

    @property
    def engine(self) -> RolloutEngine:
        """The rollout engine; an error names the fix before ``init_model``."""
        if self._engine is None:
            raise RuntimeError("RolloutWorker: call init_model() before using the engine")
        return self._engine

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the engine named by ``config.backend`` (and, with ``config.multi_turn``,
        the environment factory and tokenizer of its episodes)."""
        if self.config.multi_turn is not None:  # a bad environment fails before the model loads
            self._agent = AgentRollout.from_config(self.config.multi_turn)
        self._engine = build_rollout(self.config)
        reseed = getattr(self._engine, "reseed", None)
        if callable(reseed):
            reseed(self.config.seed + self.rank)

    def _sampling_for(self, prompts: DataProto) -> SamplingConfig:
        """This rank's sampling: the request's. A request without a
        :data:`~hf_protocol.fields.PROMPT_INDEX` column gets its seed offset by the rank (its
        rows are numbered from 0 on every rank); with it, the engine seeds each row from its
        index, and the samples do not depend on the number of workers."""
        sampling = request_sampling(prompts)
        indexed = prompts.batch is not None and fields.PROMPT_INDEX in prompts.batch
        if sampling.seed is not None and not indexed:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + self.rank)
        return sampling

    def _pad_raw_prompts(self, prompts: DataProto) -> DataProto:
        has_ids = prompts.batch is not None and fields.INPUT_IDS in prompts.batch
        width = prompts.meta_info.get(fields.MAX_PROMPT_LENGTH)
        if has_ids or width is None or fields.RAW_PROMPT_IDS not in prompts.non_tensor_batch:
            return prompts
        pad = getattr(self.engine, "pad_token_id", self.config.pad_token_id or 0)
        raw = [list(map(int, ids)) for ids in prompts.non_tensor_batch[fields.RAW_PROMPT_IDS]]
        # A longer prompt widens the batch rather than failing here: the engine's length
        # check reports a prompt that leaves no room to generate.
        longest = max(map(len, raw), default=0)
        ids, mask, pos = left_pad(raw, pad, max(int(width), longest))
        tensors = {fields.INPUT_IDS: ids, fields.ATTENTION_MASK: mask, fields.POSITION_IDS: pos}
        return DataProto.from_dict(tensors, prompts.non_tensor_batch, prompts.meta_info)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sampled responses for this rank's prompts (fields of ``build_rollout_output``),
        with ``meta_info["metrics"]`` ``rollout/generate_s`` and ``rollout/response_length``
        (model tokens: ``response_mask`` 1), and ``rollout_policy_version`` ``(B, R)``: the
        policy version of the weights that generated them (the one the last complete push
        delivered, :attr:`~hf_rollout.weight_sync.WeightReceiver.version`).

        With ``config.multi_turn`` each sample is an episode of the agent loop
        (:class:`~hf_rollout.multiturn.agent.AgentRollout`): ``sampling.max_new_tokens`` bounds its
        whole response, model and environment tokens, and the output has the columns
        ``num_turns``, ``tool_calls``, ``env_reward`` and ``env_error``."""
        sampling = self._sampling_for(prompts)
        pad = int(getattr(self.engine, "pad_token_id", self.config.pad_token_id or 0))
        start = time.perf_counter()
        if self._agent is not None:
            output = self._agent.generate(
                self.engine, self._pad_raw_prompts(prompts), sampling, pad
            )
        else:
            output = self.engine.generate(self._pad_raw_prompts(prompts), sampling)
        elapsed = time.perf_counter() - start
        output = pad_responses_to(output, sampling.max_new_tokens, pad)
        assert output.batch is not None
        responses = output.batch[fields.RESPONSES]
        output.batch[fields.ROLLOUT_POLICY_VERSION] = torch.full_like(
            responses, self._weights.version, dtype=torch.long
        )
        lengths = output.batch[fields.RESPONSE_MASK].sum(dim=-1).float()
        output.meta_info[fields.METRICS] = {
            "rollout/generate_s": elapsed,
            "rollout/response_length": float(lengths.mean()) if len(lengths) else 0.0,
        }
        return output

    @register(Dispatch.ONE_TO_ALL)
    def update_weights(
        self, named_tensors: NamedTensors | None = None, version: int | None = None
    ) -> None:
        """Load ``(name, full tensor)`` pairs (or a name -> tensor mapping) as policy
        ``version`` (``None``: one more than the version held).

        With no argument, the weights come from the fused ``actor`` role in this process
        (``create_colocated_worker_cls_fused``): its ``iter_full_params()`` is collective,
        so every rank takes part.
        """
        if named_tensors is None:
            named_tensors = fused_actor_weights(getattr(self, "fused_workers", None))
        self.engine.update_weights(named_pairs(named_tensors))
        self._weights.loaded(version)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_channel(
        self,
        host: str,
        port: int,
        world_size: int,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        deadline_s: float | None = None,
    ) -> None:
        """Join the actor's weight channel at ``host:port`` as channel rank ``1 + rank``.

        A rendezvous: the driver issues it together with the actor's join and waits for
        both (non-blocking, so the driver gets object refs that resolve to ``None``).
        """
        self._weights.join(host, port, self.rank, world_size, device, timeout_s, deadline_s)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self) -> None:
        """Load one push from the weight channel into the engine's ``update_weights``, once
        it arrived whole and verified (a failed push leaves the weights and the version as
        they were); issued together with the actor's ``send_weights``."""
        self._weights.receive_into(lambda: self.engine)

    @register(Dispatch.ONE_TO_ALL)
    def close_weight_channel(self) -> None:
        """Leave the weight channel, if joined."""
        self._weights.close()

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self) -> None:
        """Free the engine's generation memory (e.g. while the fused actor trains), and on a
        CPU give what it freed back to the system (:func:`~hf_controller.release_host_memory`)."""
        self.engine.sleep()
        release_host_memory()

    @register(Dispatch.ONE_TO_ALL)
    def wake_up(self) -> None:
        """Restore what :meth:`sleep` freed."""
        self.engine.wake_up()

    @register(Dispatch.ONE_TO_ALL)
    def shutdown(self) -> None:
        """Release the engine and leave the weight channel."""
        self.close_weight_channel()
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


def request_sampling(prompts: DataProto) -> SamplingConfig:
    """``prompts.meta_info["sampling"]``, or ``SamplingConfig()`` when the request has none.

    Raises ``TypeError`` naming the fix when it is not a :class:`SamplingConfig` (e.g. a
    dict of its fields, which older callers sent).
    """
    sampling = prompts.meta_info.get(fields.SAMPLING)
    if sampling is None:
        return SamplingConfig()
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(
            f'meta_info["sampling"] must be a hf_rollout.SamplingConfig, got '
            f"{type(sampling).__name__} {sampling!r:.120}; send the config object itself, "
            f'e.g. prompts.meta_info["sampling"] = SamplingConfig(n=4, max_new_tokens=256)'
        )
    return sampling
