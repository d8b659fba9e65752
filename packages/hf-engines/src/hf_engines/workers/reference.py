"""``ReferenceWorker``: log-probs of the frozen reference policy (for the KL term)."""

from __future__ import annotations

from hf_controller import register
from hf_engines.config import EngineConfig
from hf_engines.workers.base import ENGINE_DISPATCH, EngineWorker, check_head
from hf_protocol import DataProto, fields


class ReferenceWorker(EngineWorker):
    """A causal-LM engine that never trains; it only scores responses."""

    def __init__(self, config: EngineConfig) -> None:
        check_head("ReferenceWorker", config, "causal_lm")
        super().__init__(config)

    @register(ENGINE_DISPATCH)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` ``(B, R)`` at ``meta_info["temperature"]`` (default 1.0)."""
        temperature = float(data.meta_info.get(fields.TEMPERATURE, 1.0))
        log_probs, _ = self.engine.compute_log_prob(data, temperature)
        return DataProto.from_dict(tensors={fields.REF_LOG_PROB: log_probs})
