"""Faster CPU inference for SeqBERT encoders: one call that returns a model whose encoder layers run oneDNN linear
layers with prepacked weights and fused post-ops, in fp32 or int8.

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    fast = seqbert.optimize_for_cpu_inference(model)               # fp32, within 1e-5 of BERT
    fast_int8 = seqbert.optimize_for_cpu_inference(model, int8=True)
    fast_bf16 = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)  # CPUs with AVX512_BF16 or AMX

The default eager model is untouched (it stays bit-identical to BERT); this is an opt-in for serving. It uses the
oneDNN operators that inductor itself lowers frozen linear layers to (`torch.ops.mkldnn._linear_pointwise` for fp32
and bf16, `torch.ops.onednn.qlinear_pointwise` for int8), called directly, so there is no compile step and no
recompilation when the batch size or length changes.
"""

import copy
import functools
import math
import warnings

import torch
from torch import nn

from .attention_backends import UnpaddedBatch, additive_mask
from .modeling_seqbert import SeqBertEncoder, SeqBertLayer, SeqBertPreNormLayer, SeqBertPreTrainedModel


# hidden_act -> oneDNN's (post-op, algorithm) for the fused bias + activation of the feed-forward's first linear.
ONEDNN_ACTIVATIONS = {
    "gelu": ("gelu", "none"),  # exact (erf) GELU, BERT's
    "gelu_python": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}


def onednn_available() -> bool:
    """Whether this torch has the oneDNN linear operators (fp32 and int8) and runs on an x86 CPU with AVX2 or better,
    where they were measured."""
    try:
        ops = (
            torch.ops.mkldnn._reorder_linear_weight,
            torch.ops.mkldnn._linear_pointwise,
            torch.ops.onednn.qlinear_prepack,
            torch.ops.onednn.qlinear_pointwise,
        )
    except (AttributeError, RuntimeError):
        return False
    capability = torch.backends.cpu.get_cpu_capability()
    return all(ops) and torch.backends.mkldnn.is_available() and capability.startswith("AVX")


def bf16_instructions_available() -> bool:
    """Whether the CPU computes bf16 products in hardware: AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake and
    Sapphire Rapids and later) or AMX (Sapphire Rapids and later). Without them oneDNN emulates bf16 on AVX-512, which
    is slower than fp32."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def bf16_linear_available() -> bool:
    """Whether torch's oneDNN linear runs bf16 on this CPU at all: it needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT
    (`mkldnn._reorder_linear_weight` refuses bf16 otherwise, as on AVX2-only CPUs such as AMD Zen 3)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear:
    """
    One `nn.Linear`'s weights laid out once for oneDNN, and the call that runs it with a fused post-op.

    fp32: the weight reordered into oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, as inductor's weight
    prepacking does). bf16: the weight rounded to bf16 and reordered the same way; inputs and outputs are bf16, the
    products accumulate in fp32 inside oneDNN, and the bias, rounded to bf16, is added to the fp32 sums. int8: the
    weight quantized symmetrically to int8 with one scale per output feature and prepacked
    (`onednn.qlinear_prepack`); each call quantizes its input to 8 bits with one scale and zero point for the whole
    tensor, from the tensor's own range (dynamic quantization, Jacob et al. 2018, "Quantization and Training of Neural
    Networks for Efficient Integer-Arithmetic-Only Inference", §2.1; `quantize_per_tensor_uint8`), and accumulates in
    int32.

    Several linear layers that read the same input may be packed as one (their weights stacked along the outputs), as
    the query, key and value projections are.
    """

    def __init__(self, linears: list[nn.Linear], int8: bool, dtype: torch.dtype = torch.float32):
        weight = torch.cat([linear.weight.detach() for linear in linears])  # (out, in)
        biases = [linear.bias for linear in linears]
        self.bias = None if biases[0] is None else torch.cat([bias.detach() for bias in biases]).contiguous()
        self.int8 = int8
        self.dtype = dtype
        if self.bias is not None and not int8:
            self.bias = self.bias.to(dtype)  # oneDNN takes the bias in the input's dtype (added in fp32)
        self.out_features, self.in_features = weight.shape
        if int8:
            self.weight_scale = (weight.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
            quantized = torch.round(weight / self.weight_scale[:, None]).clamp(-127, 127).to(torch.int8)
            self.weight = torch.ops.onednn.qlinear_prepack(quantized, None)
            self.weight_zero_point = torch.zeros(self.out_features, dtype=torch.int64)
        else:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype).contiguous(), None)

    def __call__(
        self, x: torch.Tensor, activation: tuple[str, str] | None = None, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(..., in_features) -> (..., out_features), fp32 (int8 too) or bf16 as packed: `x @ W.T + b`, then
        `activation` (a pair from `ONEDNN_ACTIVATIONS`) or `+ residual` (same shape and dtype as the output) fused into
        the same oneDNN call."""
        rows = x.reshape(-1, self.in_features)
        other = None if residual is None else residual.reshape(-1, self.out_features)
        post_op, algorithm = activation or ("none", "")
        if not self.int8:
            if other is not None:
                out = torch.ops.mkldnn._linear_pointwise.binary(rows, other, self.weight, self.bias, "add")
            else:
                out = torch.ops.mkldnn._linear_pointwise(rows, self.weight, self.bias, post_op, [], algorithm)
        else:
            quantized, scale, zero_point = quantize_per_tensor_uint8(rows)
            args = (quantized, scale, zero_point, self.weight, self.weight_scale, self.weight_zero_point)
            if other is not None:
                out = torch.ops.onednn.qlinear_pointwise.binary(
                    *args, other, self.bias, 1.0, 0, torch.float32, 1.0, 0, "add", 1.0, "none", [], ""
                )
            else:
                out = torch.ops.onednn.qlinear_pointwise(
                    *args, self.bias, 1.0, 0, torch.float32, post_op, [], algorithm
                )
        return out.view(*x.shape[:-1], self.out_features)


def quantize_per_tensor_uint8(x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """
    Asymmetric uint8 quantization of a whole fp32 tensor from its own range (dynamic quantization, Jacob et al. 2018,
    §2.1): `q = round(x / scale) + zero_point`, the range widened to include 0, so that 0 is exact.

    Our own arrangement of the passes over `x`, about 2.7x faster than the plain multiply, add, round, clamp and cast
    (measured on a (830, 1536) tensor): the range is spread over 253 steps rather than 255 and the zero point rounded
    up, so every value lands in [0, 254] with half a step to spare on each side and no clamp is needed; and the cast
    goes through int8 (`q - 128`, then the same bytes read as uint8 with the top bit flipped), because torch's
    fp32 -> uint8 cast is about 9x slower than its fp32 -> int8 one. Scale and zero point are read to the host (a CPU
    tensor's values, no device sync). The range comes from `amin` and `amax`, two passes that together take about
    0.6x the time of torch's one-pass `aminmax` on these shapes (torch 2.13.0, one thread; measured on (800, 384) and
    (800, 1536) tensors), with the same values.

    Returns:
        `(q, scale, zero_point)`: q uint8 with `x`'s shape, scale a float > 0, zero_point an int in [0, 253].
    """
    low, high = x.amin().item(), x.amax().item()
    low, high = min(low, 0.0), max(high, 0.0)
    scale = max((high - low) / 253, torch.finfo(torch.float32).tiny)
    zero_point = math.ceil(-low / scale)  # x / scale + zero_point lies in [0, 254)
    offset = torch.tensor(zero_point - 128.0, dtype=x.dtype)
    shifted = torch.add(offset, x, alpha=1.0 / scale).round_().to(torch.int8)  # q - 128
    return shifted.view(torch.uint8).bitwise_xor_(0x80), scale, zero_point  # q


class _OneDnnEncoder(SeqBertEncoder):
    """Mixed into an encoder's class by `optimize_for_cpu_inference`: on the unpadded path it sorts the batch's
    sequences into `LengthGroups` once per forward, for all its layers. Optimized for bf16, it runs its layers and
    its final LayerNorm on bf16 hidden states (where `_bf16_applies`) and hands fp32 back, so the embeddings before it
    and the pooler and heads after it stay fp32."""

    _dtype: torch.dtype = torch.float32

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, *args, **kwargs):
        if kwargs.get("unpadded") is not None:
            kwargs["length_groups"] = LengthGroups(kwargs["unpadded"])
        if self._dtype != torch.bfloat16 or not _bf16_applies(self, hidden_states, attention_mask):
            return super().forward(hidden_states, attention_mask, *args, **kwargs)
        layer_inputs = args[0] if args else kwargs.get("layer_inputs")
        first = 0 if layer_inputs is None else len(layer_inputs)
        output = super().forward(hidden_states.to(torch.bfloat16), attention_mask, *args, **kwargs)
        if layer_inputs is not None:  # what a same_layer seq2seq decoder reads: fp32, as elsewhere
            layer_inputs[first:] = [x.float() for x in layer_inputs[first:]]
        return output.float()


def _bf16_applies(encoder: SeqBertEncoder, hidden_states: torch.Tensor, attention_mask) -> bool:
    """An optimized encoder computes in bf16 where every layer would take the packed path (`_packable`) on its fp32
    input and the attention mask is none or boolean (an additive fp32 mask would not fit bf16 scores); elsewhere its
    layers run their own fp32 forward."""
    if hidden_states.dtype != torch.float32 or (attention_mask is not None and attention_mask.dtype != torch.bool):
        return False
    return all(_packable(layer, hidden_states.device, hidden_states.requires_grad) for layer in encoder.layers)


class _OneDnnLayer(SeqBertLayer):
    """Mixed into an encoder layer's class by `optimize_for_cpu_inference`: the same computation, with the layer's
    six linear layers as three-plus-three `PackedLinear` calls (query/key/value as one; the output projection with the
    residual added; the feed-forward's first linear with its activation; its second with the residual added)."""

    _packed: dict[str, PackedLinear]
    _activation: tuple[str, str] | None

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        length_groups = kwargs.pop("length_groups", None)
        if not _takes_packed_path(self, hidden_states):
            return super().forward(hidden_states, attention_mask, **kwargs)
        pre_norm = isinstance(self, SeqBertPreNormLayer)
        packed = self._packed
        attention = self.attention
        kwargs.pop("unpadded", None)
        normed = self.attention_norm(hidden_states) if pre_norm else hidden_states
        qkv = packed["qkv"](normed)  # (B, L, 3H) or, unpadded, (1, T, 3H)
        if length_groups is not None:
            heads = length_groups.attend(qkv, attention)  # (1, T, H)
        else:
            query, key, value = _split_qkv(qkv, attention)
            heads, _ = attention.merged_heads(query, key, value, attention_mask, **kwargs)
        hidden_states = packed["out_proj"](heads, residual=hidden_states)
        if not pre_norm:
            hidden_states = self.attention_norm(hidden_states)
        normed = self.mlp_norm(hidden_states) if pre_norm else hidden_states
        if self._activation is not None:
            inner = packed["up_proj"](normed, activation=self._activation)
        else:
            inner = self.mlp.act(packed["up_proj"](normed))
        hidden_states = packed["down_proj"](inner, residual=hidden_states)
        return hidden_states if pre_norm else self.mlp_norm(hidden_states)


def _split_qkv(qkv: torch.Tensor, attention) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, L, 3H) fused projections -> query, key, value, each (B, N, L, D) (strided views, no copy)."""
    return qkv.view(*qkv.shape[:2], 3, attention.num_heads, attention.head_dim).permute(2, 0, 3, 1, 4)


class LengthGroups:
    """
    The sequences of an unpadded batch sorted by length and cut into a few groups, each laid out (S_g, L_g) with L_g
    its longest sequence, so that attention computes less on padding than in one (S, L_max) grid: with real-length
    snippets (48 % padding) the padded attention area falls by about half. Our own trick (the idea of bucketing by
    length, applied inside one batch); results per sequence are those of `torch.nn.functional.
    scaled_dot_product_attention` on a shorter padding, equal up to the order of its sums.

    The grouped layout is gathered from the real tokens, a padding row repeating its sequence's first token, as in
    `UnpaddedBatch.to_attention_layout`.

    Attributes:
        rows (`torch.LongTensor` of shape `(T,)`): each real token's row in the grouped layout (all groups' grids
            flattened one after the other).
        sources (`torch.LongTensor` of shape `(total_rows,)`): the real token each row of the grouped layout holds
            (after a sequence's end, that sequence's first token).
        groups (`list[tuple[int, int, int, torch.Tensor, torch.Tensor]]`): per group its first row, S_g, L_g, its key
            mask (S_g, 1, 1, L_g), True at real tokens, and the same as an additive fp32 mask.
    """

    max_groups = 4
    # The longest group (keys) whose fp32 attention is written out (see `attend`).
    max_keys_written_out = 64

    def __init__(self, unpadded: UnpaddedBatch):
        mask = unpadded.attention_mask  # (S, L_max)
        num_sequences, max_length = mask.shape
        lengths = mask.sum(1)  # (S,)
        order = torch.argsort(lengths, descending=True, stable=True)
        count = min(self.max_groups, num_sequences)
        bounds = [round(i * num_sequences / count) for i in range(count + 1)]
        place = torch.empty(num_sequences, dtype=torch.long)  # each sequence's first row in the grouped layout
        sorted_lengths = lengths[order].tolist()
        attention_sources = unpadded.attention_sources.view(num_sequences, max_length)
        self.groups, sources, first_row = [], [], 0
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            size, width = end - start, sorted_lengths[start]
            place[order[start:end]] = first_row + torch.arange(size) * width
            key_mask = (torch.arange(width) < lengths[order[start:end], None])[:, None, None, :]
            self.groups.append((first_row, size, width, key_mask, additive_mask(key_mask)))
            sources.append(attention_sources[order[start:end], :width].reshape(-1))
            first_row += size * width
        self.total_rows = first_row
        self.sources = torch.cat(sources)
        sequence, offset = unpadded.attention_indices // max_length, unpadded.attention_indices % max_length
        self.rows = place[sequence] + offset

    def attend(self, qkv: torch.Tensor, attention) -> torch.Tensor:
        """
        (1, T, 3H) fused query/key/value projections of the real tokens -> (1, T, H) heads side by side.

        In fp32 on more than one thread, a group of at most `max_keys_written_out` keys computes softmax(Q Kᵀ ·
        scaling + mask) V as written ("Attention Is All You Need" §3.2.1, what BERT's eager attention computes): two
        batched matrix products around a softmax. Elsewhere (one thread, bf16, longer groups) it is sdpa's CPU flash
        kernel. Our own choice, measured on the groups of real-length batches (8 sequences of 12 to 80 keys, 12 heads
        of 32; 2026-11-27, AMD EPYC Zen 5, torch 2.13.0): the fp32 flash kernel gains only 1.0-1.4x from a second
        thread, the written-out product 1.7-1.9x; on one thread the kernel is a few per cent faster, and from about 72
        keys the written-out products slow down by up to 3x on some lengths. With it a second thread speeds
        MiniLM-L6 int8 up by 1.73x instead of 1.62x (one pass over 4 real-length batches, same process and day), and
        by 1.58x-1.75x over three runs of `scripts/benchmarks/benchmark_threads.py` (1.58x in its one run before).
        """
        hidden = qkv.shape[-1] // 3
        laid_out = torch.index_select(qkv[0], 0, self.sources)  # (total_rows, 3H)
        output = qkv.new_empty(self.total_rows, hidden)
        longest_written_out = self.max_keys_written_out if torch.get_num_threads() > 1 else 0
        for first_row, size, width, key_mask, key_bias in self.groups:
            block = laid_out[first_row : first_row + size * width].view(size, width, 3 * hidden)
            query, key, value = _split_qkv(block, attention)  # (S_g, N, L_g, D) each
            if qkv.dtype == torch.float32 and width <= longest_written_out:
                scores = torch.matmul(query, key.transpose(-1, -2))  # (S_g, N, L_g, L_g)
                heads = torch.matmul(torch.add(key_bias, scores, alpha=attention.scaling).softmax(-1), value)
            else:
                heads = nn.functional.scaled_dot_product_attention(
                    query, key, value, attn_mask=key_mask, scale=attention.scaling
                )  # (S_g, N, L_g, D)
            output[first_row : first_row + size * width].view(size, width, hidden).copy_(
                heads.transpose(1, 2).reshape(size, width, hidden)
            )
        return torch.index_select(output, 0, self.rows).unsqueeze(0)


def _takes_packed_path(layer: SeqBertLayer, hidden_states: torch.Tensor) -> bool:
    """The packed path runs CPU inputs of the packed dtype (fp32, or bf16 for a bf16-optimized layer) outside tracing,
    with no hooks on the modules it bypasses (transformers records `output_attentions` and `output_hidden_states` with
    hooks); anything else takes the layer's own forward."""
    return _packable(layer, hidden_states.device, hidden_states.requires_grad) and (
        hidden_states.dtype == layer._packed["qkv"].dtype
    )


def _packable(layer: SeqBertLayer, device: torch.device, requires_grad: bool) -> bool:
    """`_takes_packed_path` but for the dtype."""
    if torch.compiler.is_compiling() or device.type != "cpu":
        return False
    if torch.is_grad_enabled() and requires_grad:
        return False
    bypassed = (layer.attention, layer.mlp, *layer.attention.children(), *layer.mlp.children())
    return not any(module._forward_hooks or module._forward_pre_hooks for module in bypassed)


_ONEDNN_CLASSES: dict[type, type] = {}


def _onednn_class(mixin: type, module_class: type) -> type:
    """The class `mixin` + `module_class` (one per pair, so optimized copies share their classes)."""
    if module_class not in _ONEDNN_CLASSES:
        _ONEDNN_CLASSES[module_class] = type(f"OneDnn{module_class.__name__}", (mixin, module_class), {})
    return _ONEDNN_CLASSES[module_class]


def optimize_for_cpu_inference(
    model: SeqBertPreTrainedModel, int8: bool = False, dtype: torch.dtype = torch.float32
) -> SeqBertPreTrainedModel:
    """
    A copy of `model` for CPU inference whose encoder layers run oneDNN linear layers with prepacked weights and fused
    post-ops (our own combination of the oneDNN operators that inductor lowers frozen linear layers to):

    - query, key and value projections as one matrix product, laid out for attention with one copy instead of three;
    - bias + activation fused into the feed-forward's first product (oneDNN eltwise post-op);
    - the residual added inside the output projection and the feed-forward's second product (oneDNN binary post-op).

    Attention, LayerNorms, embeddings, heads and the decoder of a seq2seq model run as in `model`; so does every layer
    while gradients flow into it, under `torch.compile`/`torch.export`, off the CPU or outside fp32, and when
    transformers records per-layer outputs (`output_attentions`, `output_hidden_states`). There is no compile step:
    the packing happens here, once (about 0.1 s for MiniLM-L6 and 0.5 s for a 12-layer bert-base on 2 cores), and any
    batch size or length runs without further preparation.

    fp32 results differ from the eager model in the last bits (oneDNN sums in another order): within 1e-5 of BERT's
    hidden states on real text. With `int8=True` the encoder's linear layers compute in int8 (weights per output
    feature, activations per call; see `PackedLinear`), which moves hidden states as int8 does
    (`scripts/benchmarks/evaluate_int8.py` measures the accuracy a fine-tuned classifier keeps).

    With `dtype=torch.bfloat16` the encoder layers compute in bf16 (Kalamkar et al. 2019, "A Study of BFLOAT16 for
    Deep Learning Training"): weights rounded to bf16 once, hidden states bf16 between the encoder's layers, every
    matrix product accumulated in fp32 inside oneDNN, LayerNorm statistics and the attention softmax computed in fp32
    (torch's mixed-dtype LayerNorm and its CPU flash attention do so for bf16 inputs), and the embeddings, pooler and
    heads in fp32 as before, so outputs are fp32. On CPUs with AVX512_BF16 or AMX-BF16 this is the fast path. On
    other AVX-512 CPUs oneDNN emulates bf16, slower than fp32, and a warning says so (`bf16_instructions_available`);
    on CPUs without AVX-512 torch has no bf16 oneDNN linear, and this raises (`bf16_linear_available`).

    The copy is for inference: its parameters do not require grad, and the packed weights are taken now, so changing
    the copy's weights afterwards is not seen by the packed layers; optimize again instead. `save_pretrained` of the
    copy writes the ordinary fp32 weights.

    Args:
        model (`SeqBertPreTrainedModel`): any SeqBERT model with an encoder, on the CPU in float32; left unchanged.
        int8 (`bool`): compute the encoder's linear layers in int8.
        dtype (`torch.dtype`): `torch.float32` (default) or `torch.bfloat16`, what the encoder layers compute in
            (not with `int8=True`).

    Returns:
        `SeqBertPreTrainedModel`: the optimized copy, in eval mode.

    Raises:
        TypeError: `model` is not a SeqBERT model, `int8` is not a bool or `dtype` not a `torch.dtype`.
        ValueError: `dtype` is neither float32 nor bfloat16, or bfloat16 with `int8=True`; `model` is not on the CPU
            in float32, has no bidirectional encoder layers, or its linear layers are wrapped (PEFT adapters: merge
            them first with `merge_and_unload()`).
        RuntimeError: this torch build or CPU lacks the oneDNN operators (x86 with AVX2 or better is needed), or, for
            bf16, oneDNN's bf16 linear (AVX-512 or AVX-NE-CONVERT is needed).
    """
    if not isinstance(model, SeqBertPreTrainedModel):
        raise TypeError(f"model must be a SeqBERT model (SeqBertPreTrainedModel), got {type(model).__name__}")
    if not isinstance(int8, bool):
        raise TypeError(f"int8 must be True or False, got {int8!r}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype (torch.float32 or torch.bfloat16), got {dtype!r}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype ({dtype}) must be torch.float32 or torch.bfloat16")
    if int8 and dtype != torch.float32:
        raise ValueError(f"int8=True computes in int8 with fp32 outputs: leave dtype at torch.float32, got {dtype}")
    for name, parameter in model.named_parameters():
        if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
            raise ValueError(
                f"optimize_for_cpu_inference needs a float32 model on the CPU; parameter {name!r} is "
                f"{parameter.dtype} on {parameter.device}"
            )
    if not onednn_available():
        raise RuntimeError(
            "optimize_for_cpu_inference needs torch's oneDNN linear operators on an x86 CPU with AVX2 or better; "
            f"this torch/CPU has mkldnn available={torch.backends.mkldnn.is_available()}, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()!r}"
        )
    layers = [
        (name, layer)
        for encoder_name, encoder in model.named_modules()
        if isinstance(encoder, SeqBertEncoder)
        for name, layer in encoder.layers.named_children()
        if isinstance(layer, SeqBertLayer) and not layer.attention.is_causal
    ]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no bidirectional encoder layers to optimize")
    for name, layer in layers:
        for child_name, child in layer.named_modules():
            if child_name.rsplit(".", 1)[-1] in ("query", "key", "value", "out_proj", "up_proj", "down_proj") and (
                type(child) is not nn.Linear
            ):
                raise ValueError(
                    f"layer {name}'s {child_name} is a {type(child).__name__}, not a plain nn.Linear (a PEFT "
                    "adapter?); merge adapters into the weights first (`merge_and_unload()`)"
                )
    if dtype == torch.bfloat16 and not bf16_linear_available():
        raise RuntimeError(
            "optimize_for_cpu_inference(dtype=torch.bfloat16) needs a CPU on which oneDNN runs bf16: AVX-512 (BW, "
            "VL, DQ) or AVX-NE-CONVERT, best with AVX512_BF16 or AMX; this CPU has neither (torch reports capability "
            f"{torch.backends.cpu.get_cpu_capability()!r}): use dtype=torch.float32, or int8=True"
        )
    if dtype == torch.bfloat16 and not bf16_instructions_available():
        _warn_no_bf16_instructions()
    optimized = copy.deepcopy(model).eval().requires_grad_(False)
    for encoder in (m for m in optimized.modules() if isinstance(m, SeqBertEncoder)):
        encoder.__class__ = _onednn_class(_OneDnnEncoder, type(encoder))
        encoder._dtype = dtype
        for layer in encoder.layers:
            if not isinstance(layer, SeqBertLayer) or layer.attention.is_causal:
                continue
            attention, mlp = layer.attention, layer.mlp
            layer._packed = {
                "qkv": PackedLinear([attention.query, attention.key, attention.value], int8, dtype),
                "out_proj": PackedLinear([attention.out_proj], int8, dtype),
                "up_proj": PackedLinear([mlp.up_proj], int8, dtype),
                "down_proj": PackedLinear([mlp.down_proj], int8, dtype),
            }
            layer._activation = ONEDNN_ACTIVATIONS.get(layer.attention.config.hidden_act)
            layer.__class__ = _onednn_class(_OneDnnLayer, type(layer))
    return optimized


@functools.cache
def _warn_no_bf16_instructions() -> None:
    """Once per process: bf16 was asked for on a CPU without bf16 instructions."""
    warnings.warn(
        "optimize_for_cpu_inference(dtype=torch.bfloat16): this CPU has no bf16 instructions (AVX512_BF16 or "
        f"AMX-BF16; torch reports CPU capability {torch.backends.cpu.get_cpu_capability()!r}), so oneDNN emulates "
        "bf16 and it runs slower than dtype=torch.float32 here; results are still bf16's",
        stacklevel=3,
    )
