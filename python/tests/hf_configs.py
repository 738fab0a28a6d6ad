"""Small random configurations of the MoE families the transformers backend covers: built
with from_config (no download), two decoder layers, d = 128 and n = 64 (GPT-OSS: 64 as well),
a 256-token vocabulary. Shared by the CPU and GPU tests of moeblaze.hf."""
import transformers

FAMILIES = ["mixtral", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v3", "qwen3_next"]

_COMMON = dict(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
               pad_token_id=0)


_FAMILY = {
    "mixtral": (transformers.MixtralConfig,
                dict(intermediate_size=64, num_local_experts=8, num_experts_per_tok=2)),
    "qwen3_moe": (transformers.Qwen3MoeConfig,
                  dict(head_dim=32, intermediate_size=256, moe_intermediate_size=64, num_experts=16,
                       num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1)),
    "olmoe": (transformers.OlmoeConfig, dict(intermediate_size=64, num_experts=16, num_experts_per_tok=4)),
    "gpt_oss": (transformers.GptOssConfig,
                dict(head_dim=32, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2, sliding_window=64,
                     layer_types=["sliding_attention", "full_attention"])),
    "deepseek_v3": (transformers.DeepseekV3Config,
                    dict(num_key_value_heads=4, intermediate_size=256, moe_intermediate_size=64, n_routed_experts=16,
                         num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1,
                         routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=64, kv_lora_rank=32,
                         qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, head_dim=16)),
    "qwen3_next": (transformers.Qwen3NextConfig,
                   dict(head_dim=32, intermediate_size=256, moe_intermediate_size=64,
                        shared_expert_intermediate_size=64, num_experts=16, num_experts_per_tok=4,
                        norm_topk_prob=True, decoder_sparse_step=1, layer_types=["linear_attention", "full_attention"],
                        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                        linear_value_head_dim=32)),
}


def small_config(family: str, **overrides):
    """The family's small configuration; overrides replace its fields (e.g. num_hidden_layers=1
    with a matching layer_types)."""
    if family not in _FAMILY:
        raise ValueError(f"unknown family {family}; known: {sorted(_FAMILY)}")
    cls, fields = _FAMILY[family]
    return cls(**{**_COMMON, **fields, **overrides})


def experts_modules(model):
    """The model's experts modules (the ones @use_experts_implementation dispatches)."""
    return [m for m in model.modules() if type(m).__name__.endswith("Experts")]
