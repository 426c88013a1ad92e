# shellcheck shell=bash
# Megatron model arguments for Qwen3-8B, written from its Hugging Face config.json:
#   num_hidden_layers 36, hidden_size 4096, intermediate_size 12288, num_attention_heads 32,
#   num_key_value_heads 8, head_dim 128, vocab_size 151936, rope_theta 1000000, rms_norm_eps 1e-6,
#   hidden_act silu (SwiGLU), attention_bias false, tie_word_embeddings false, q/k RMSNorm per head.
# slime checks these against --hf-checkpoint at start-up; scripts/lib/check_hf_config.py checks them
# before anything starts. Read by the training launch (strands_slime/launch/inputs.py) and sourced by
# scripts/convert_qwen3_8b.sh.

# shellcheck disable=SC2034  # MODEL_ARGS is read by the scripts that source this file.
MODEL_ARGS=(
    --swiglu
    --num-layers 36
    --hidden-size 4096
    --ffn-hidden-size 12288
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --use-rotary-position-embeddings
    --rotary-base 1000000
    --disable-bias-linear
    --normalization RMSNorm
    --norm-epsilon 1e-6
    --qk-layernorm
    --vocab-size 151936
    --untie-embeddings-and-output-weights
)
