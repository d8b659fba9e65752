"""Building a megatron-core ``GPTModel`` from a Hugging Face Llama / Qwen2 / Qwen3 config."""

from __future__ import annotations

from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import ModuleSpec, TransformerConfig
from torch.nn import functional
from transformers import PretrainedConfig

from hf_engines.config import MegatronConfig, ModelConfig
from hf_engines.megatron.cpu_compat import tensor_cuda_stays_on_cpu
from hf_engines.megatron.moe import allow_router_without_transformer_engine


def _rope_theta(hf_config: PretrainedConfig) -> float:
    """RoPE base of ``hf_config``; only the default (unscaled) RoPE is converted."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(
            f"rope_type={rope_type!r} is not supported by the Megatron engine (only 'default' "
            "RoPE); use backend='fsdp' for this model"
        )
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def head_dim(hf_config: PretrainedConfig) -> int:
    """Per-head channels: ``head_dim`` when the config sets it, else hidden / heads."""
    value = getattr(hf_config, "head_dim", None)
    return int(value or hf_config.hidden_size // hf_config.num_attention_heads)


def transformer_config(
    hf_config: PretrainedConfig, parallel: MegatronConfig, dtype: torch.dtype
) -> TransformerConfig:
    """The megatron ``TransformerConfig`` equal to a Llama / Qwen2 / Qwen3 HF config.

    Dropout is off (these models train without it) and every fused CUDA kernel is off, so
    the same config runs on the CPU.
    """
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf_config.hidden_act!r} is not supported (only 'silu')")
    model_type = hf_config.model_type
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads or hf_config.num_attention_heads,
        kv_channels=head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=functional.silu,
        add_bias_linear=False,
        add_qkv_bias=model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        qk_layernorm=model_type in ("qwen3", "qwen3_moe"),
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=getattr(hf_config, "initializer_range", 0.02),
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        attention_softmax_in_fp32=True,
        use_cpu_initialization=True,
        perform_initialization=False,  # weights always come from the HF model
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        **moe_config(hf_config, parallel),
    )


def moe_config(hf_config: PretrainedConfig, parallel: MegatronConfig) -> dict[str, Any]:
    """``TransformerConfig`` fields for a Qwen3-MoE config's routed experts ({} when dense).

    The router is Qwen3's: a softmax over all experts, then the top-k (renormalised when
    ``norm_topk_prob``); no load-balancing loss, no token dropping. Tokens go to the
    experts' ranks with the ``allgather`` dispatcher (it runs on the CPU too).
    """
    experts = int(getattr(hf_config, "num_experts", None) or 0)
    if experts == 0:
        return {}
    allow_router_without_transformer_engine()
    sparse_step = int(getattr(hf_config, "decoder_sparse_step", 1))
    if sparse_step != 1 or getattr(hf_config, "mlp_only_layers", None):
        raise ValueError(
            f"decoder_sparse_step={sparse_step}, mlp_only_layers="
            f"{hf_config.mlp_only_layers!r}: the Megatron engine converts MoE models whose every "
            "layer is a MoE layer only; use backend='fsdp' for this model"
        )
    norm = bool(getattr(hf_config, "norm_topk_prob", False))
    return {
        "num_moe_experts": experts,
        "moe_router_topk": int(hf_config.num_experts_per_tok),
        "moe_ffn_hidden_size": int(hf_config.moe_intermediate_size),
        "expert_model_parallel_size": parallel.expert_model_parallel_size,
        "moe_token_dispatcher_type": "allgather",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        # top-k of the logits then a softmax over k == renormalised top-k of the softmax
        "moe_router_pre_softmax": not norm,
        "moe_grouped_gemm": False,
    }


def layer_spec(config: TransformerConfig, choice: str, device: torch.device) -> ModuleSpec:
    """Megatron's local layer spec, or the Transformer Engine one when asked / available."""
    use_te = choice == "transformer_engine"
    if choice == "auto" and device.type == "cuda":
        try:
            import transformer_engine  # noqa: F401

            use_te = True
        except ImportError:
            use_te = False
    if use_te:
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=config.num_moe_experts, qk_layernorm=config.qk_layernorm
        )
    return get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts,
        qk_layernorm=config.qk_layernorm,
        normalization="RMSNorm",
    )


class ValueHead(torch.nn.Module):
    """A replicated ``hidden -> 1`` projection standing in for GPTModel's output layer.

    It takes the output layer's call signature and mirrors transformers'
    ``*ForTokenClassification`` ``score`` layer (``nn.Linear(hidden, 1)``, with bias).
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))

    def forward(
        self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None
    ) -> tuple[torch.Tensor, None]:
        """``(s, b, h) -> ((s, b, 1), None)``, as megatron's output layer returns."""
        return functional.linear(hidden, self.weight, self.bias), None


def build_gpt_model(
    hf_config: PretrainedConfig,
    model: ModelConfig,
    parallel: MegatronConfig,
    device: torch.device,
) -> GPTModel:
    """This rank's ``GPTModel`` stage (weights uninitialised; load them with the converter).

    Logits come back gathered over tensor-parallel ranks (``parallel_output=False``). With
    ``model.head == "value"`` the output layer is a :class:`ValueHead`.
    """
    dtype = getattr(torch, model.dtype)
    config = transformer_config(hf_config, parallel, dtype)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False)) and model.head == "causal_lm"
    # Pipeline stages with tied embeddings: megatron moves the shared copy with .cuda().
    with tensor_cuda_stays_on_cpu():
        gpt = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(config, parallel.layer_spec, device),
            vocab_size=hf_config.vocab_size,
            max_sequence_length=hf_config.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            parallel_output=False,
            share_embeddings_and_output_weights=tied,
            position_embedding_type="rope",
            rotary_base=int(_rope_theta(hf_config)),
        )
    if model.head == "value" and gpt.post_process:
        gpt.output_layer = ValueHead(config.hidden_size, dtype)
    return gpt.to(device)
