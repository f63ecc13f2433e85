"""Attention for mixed-precision training on CPU: what `attn_implementation="sdpa"` runs in `SeqBertAttention`.

`torch.nn.functional.scaled_dot_product_attention` on a CPU picks its flash kernel for bf16 / fp16 inputs without
dropout, and its math kernel with dropout. For the short sequences of fine-tuning (tens of tokens) the flash
kernel's backward is slow: under `torch.autocast("cpu", dtype=torch.bfloat16)` (what `Trainer --bf16` runs on a CPU)
a bert-base layer's attention forward and backward took 40 ms there for 32 sequences of 48 tokens, against 11 ms for
the same product written out as two bf16 matrix products around a fp32 softmax (2026-11-25, AMD EPYC Zen 4 with
AVX512_BF16, 2 threads, torch 2.13.0; `scripts/benchmarks/benchmark.py` measures the whole training step). From
about 256 keys on, the flash kernel is as fast or faster. So, where gradients flow in reduced precision on a CPU and
the keys are at most `MAX_KEYS_WRITTEN_OUT`, `sdpa_attention_forward` computes exactly what `eager_attention_forward`
(the modeling file's reference) computes under autocast: the scores Q Kᵀ · scaling in bf16, the softmax in fp32,
dropout on the weights, their product with V in bf16 ("Attention Is All You Need" §3.2.1). Everywhere else (fp32,
inference, CUDA, long inputs, causal attention given without a mask) it is transformers' own sdpa function unchanged,
so fp32 results stay bit-identical to BERT's. Choosing the written-out product by length is our own trick; the
threshold is a measurement on the machine above, not a law.

Copied into saved model folders with the modeling file, which imports it relatively: it depends only on torch and
transformers.
"""

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward as transformers_sdpa_attention_forward


# The longest key length for which the written-out product replaces the flash kernel (see the module docstring).
MAX_KEYS_WRITTEN_OUT = 128

_REDUCED_PRECISION = (torch.bfloat16, torch.float16)


def _writes_out(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, is_causal: bool, position_bias
) -> bool:
    """Whether `sdpa_attention_forward` takes the written-out product (see the module docstring)."""
    if query.device.type != "cpu" or query.dtype not in _REDUCED_PRECISION or key.shape[2] > MAX_KEYS_WRITTEN_OUT:
        return False
    if not torch.is_grad_enabled() or not (query.requires_grad or key.requires_grad or value.requires_grad):
        return False
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if attention_mask is None:  # sdpa would apply the causal flag itself
        return not is_causal
    return attention_mask.dtype == torch.bool and position_bias is None


def sdpa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """
    transformers' `sdpa_attention_forward`, with the written-out product for reduced-precision CPU training on short
    keys (see the module docstring).

    Args:
        module (`nn.Module`): the attention module (its `is_causal` and `training` are read).
        query, key, value (`torch.Tensor`): (B, N, L_q, D), (B, N, L_k, D), (B, N, L_k, D), any float dtype.
        attention_mask (`torch.Tensor`, *optional*): a boolean mask broadcastable to (B, N, L_q, L_k), True where
            attention is allowed (as `masking_utils` builds it for sdpa), or an additive float mask.
        dropout (`float`): dropout probability on the attention weights.
        scaling (`float`, *optional*): usually D ** -0.5 (None: sdpa's default, the same).

    Returns:
        `(attn_output, None)`: (B, L_q, N, D) in the dtype of `value`.
    """
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal  # as transformers' sdpa reads it
    if not _writes_out(query, key, value, attention_mask, is_causal, kwargs.get("position_bias")):
        return transformers_sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, N, L_q, L_k), bf16 / fp16
    attn_weights = attn_weights.float()
    if attention_mask is not None:  # the additive mask's minimum, as eager_attention_forward's masks carry
        attn_weights = attn_weights.masked_fill(~attention_mask, torch.finfo(torch.float32).min)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)  # fp32
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights.to(value.dtype), value)  # (B, N, L_q, D)
    return attn_output.transpose(1, 2).contiguous(), None


__all__ = ["MAX_KEYS_WRITTEN_OUT", "sdpa_attention_forward"]
