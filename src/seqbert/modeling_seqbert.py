"""PyTorch SeqBERT: a BERT-style Transformer encoder as a first-class `transformers` model.

Reading order: embeddings -> attention -> feed-forward -> layers (pre-LN and post-LN) -> stacks -> pooler and LM head
-> `SeqBertPreTrainedModel` -> `SeqBertModel` -> decoder -> task heads -> causal LM -> seq2seq. What surrounds the model
lives in modules of its own, which docs/layout.md lists; those this file imports are copied with it into saved folders.

Shapes in comments: B batch, L sequence length, T tokens computed, S sequences, H hidden_size, N heads, D head size
(H / N), V vocab_size, C num_labels.
"""

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.loss.loss_utils import LOSS_MAPPING, fixed_cross_entropy
from transformers.masking_utils import packed_sequence_mask_function
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    BaseModelOutputWithPooling,
    CausalLMOutputWithCrossAttentions,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    Seq2SeqLMOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, logging
from transformers.utils.generic import TransformersKwargs, can_return_tuple

from .attention_backends import (
    UnpaddedBatch,
    eager_attention_forward,
    labelled_rows,
    plan_layout,
    sdpa_attention_forward,
    span_logits,
    varlen_attention_fits,
    varlen_attention_forward,
)
from .checkpoint_loading import load_pretrained
from .configuration_seqbert import SeqBertConfig
from .convert_bert import from_bert_pretrained
from .decoder_checks import (
    check_decoder_inputs,
    check_decoder_only,
    check_generate_arguments,
    check_layer_inputs,
    check_seq2seq_labels,
    decoder_start_and_pad,
    plan_decoder_reads,
    read_decoder_inputs,
)
from .input_checks import (
    IGNORE_INDEX,
    LABELLED,
    DeferredReads,
    check_answer_positions,
    check_encoder_inputs,
    check_labels,
    check_multiple_choice_inputs,
    check_num_labels,
    check_seqbert_config,
    check_sequence_classification_labels,
    check_vocabulary_size,
    input_batch_shape,
)
from .packed_cpu_linears import PackedCpuLinears
from .peft_integration import register_peft_target_modules_on_import
from .transformers_compat import (
    CACHE_NAME,
    OutputRecorder,
    bidirectional_mask,
    capture_outputs,
    causal_mask,
    either_cache,
)


logger = logging.get_logger(__name__)

# Embeddings -----------------------------------------------------------------------------------------------------------


def sinusoidal_position_embedding(position_ids: torch.Tensor, dim: int) -> torch.Tensor:
    """
    "Attention Is All You Need" §3.5: `PE[pos, 2i] = sin(pos / 10000^(2i/dim))`, `PE[pos, 2i+1] = cos(same)`, for the
    positions asked for (any length). `position_ids` (*S) integers >= 0, `dim` even -> (*S, dim) float32.
    """
    inv_freq = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=position_ids.device) * (-math.log(10000.0) / dim)
    )  # (dim/2,)
    angles = position_ids.to(torch.float32).unsqueeze(-1) * inv_freq  # (*S, dim/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (*S, dim): sin, cos interleaved


def sinusoidal_position_table(num_positions: int, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """
    The first `num_positions` rows of `sinusoidal_position_embedding` as one table.

    Returns:
        `torch.Tensor` of shape `(num_positions, dim)` and dtype `dtype`.
    """
    return sinusoidal_position_embedding(torch.arange(num_positions), dim).to(dtype)


class SeqBertSinusoidalPositionEmbedding(nn.Module):
    """Fixed sinusoidal position vectors, computed from the positions on each call: no parameter, no buffer, and
    no length limit (`max_position_embeddings` does not bind)."""

    def __init__(self, config: SeqBertConfig):
        super().__init__()
        self.dim = config.hidden_size

    def forward(self, position_ids: torch.LongTensor) -> torch.Tensor:
        """`position_ids` (B or 1, L) int64 -> (B or 1, L, H) float32."""
        return sinusoidal_position_embedding(position_ids, self.dim)


class SeqBertEmbeddings(nn.Module):
    """Word + position (+ token type) embeddings, optional sqrt(H) scaling of word embeddings, LayerNorm, dropout."""

    def __init__(self, config: SeqBertConfig):
        super().__init__()
        # A negative pad_token_id means "no pad token" (see SeqBertConfig): no row is reserved, where nn.Embedding
        # would count -1 from the end and freeze the last token's row.
        pad = config.pad_token_id if config.pad_token_id is not None and config.pad_token_id >= 0 else None
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=pad)
        if config.position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        else:
            self.position_embeddings = SeqBertSinusoidalPositionEmbedding(config)
        # type_vocab_size == 0 disables segment embeddings altogether.
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size > 0 else None
        )
        # "Attention Is All You Need" §3.4 multiplies embedding weights by sqrt(d_model); 1.0 leaves BERT exact.
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embedding else 1.0
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        unpadded: UnpaddedBatch | None = None,
    ) -> torch.Tensor:
        """Ids (B, L) int64, or `inputs_embeds` (B, L, H) -> embeddings (B, L, H) in the model's dtype. With
        `unpadded` (the encoder's fast path), the summed embeddings are gathered to the real tokens, (1, T, H), before
        the LayerNorm and dropout: the lookups see BERT's (B, L) grid, so hooks on `word_embeddings` see BERT's
        shapes, and the rest runs on real tokens only."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, L, H)
        seq_length = inputs_embeds.shape[1]
        if position_ids is None:
            position_ids = torch.arange(seq_length, device=inputs_embeds.device).unsqueeze(0)  # (1, L)
        embeddings = inputs_embeds * self.embed_scale if self.embed_scale != 1.0 else inputs_embeds
        # Same order of additions as BERT (word + type, then + position), so converted BERT is bit-for-bit close.
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                embeddings = embeddings + self.token_type_embeddings.weight[0]  # segment 0 everywhere
            else:
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids).to(embeddings.dtype)
        if unpadded is not None:
            embeddings = unpadded.unpad(embeddings)  # (1, T, H)
        return self.dropout(self.layer_norm(embeddings))


# Attention ------------------------------------------------------------------------------------------------------------


class SeqBertAttention(nn.Module):
    """Multi-head scaled dot-product attention with BERT's query, key and value projections (BERT's names: PEFT's
    LoRA default for BERT applies) and an output projection, through the transformers attention interface
    (`config._attn_implementation`). `SeqBertSelfAttention` and `SeqBertCrossAttention` say where keys come from."""

    def __init__(self, config: SeqBertConfig, layer_idx: int | None, is_causal: bool):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        # The sdpa integration reads `module.is_causal` (default True): bidirectional attention must say False.
        self.is_causal = is_causal
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def _split_heads(self, projected: torch.Tensor, unpadded: UnpaddedBatch | None = None) -> torch.Tensor:
        """(B, L, H) -> (B, N, L, D); with `unpadded`, (1, T, H) -> (S, N, L_max, D) in the attention layout, or
        (T, N, D) as they are for variable-length attention (`unpadded.varlen`)."""
        if unpadded is not None and unpadded.varlen:
            return projected.view(-1, self.num_heads, self.head_dim)  # (T, N, D)
        if unpadded is not None:
            projected = unpadded.to_attention_layout(projected)  # (S, L_max, H)
        return projected.view(*projected.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    def _attend(self, query, key, value, attention_mask, unpadded: UnpaddedBatch | None = None, **kwargs):
        """(B, N, L, D) queries and (B, N, S, D) keys/values -> `(output (B, L, H), weights (B, N, L, S) or None)`;
        with `unpadded`, the output is (1, T, H) over the real tokens (the projection skips padding)."""
        attn_output, attn_weights = self.merged_heads(query, key, value, attention_mask, unpadded, **kwargs)
        return self.out_proj(attn_output), attn_weights

    def merged_heads(self, query, key, value, attention_mask, unpadded: UnpaddedBatch | None = None, **kwargs):
        """`_attend` before the output projection: the heads' outputs side by side, (B, L, H) or (1, T, H)."""
        dropout = self.attention_dropout if self.training else 0.0
        if unpadded is not None and unpadded.varlen:  # (T, N, D) each, on CUDA: no layout, no mask
            if varlen_attention_fits(query, key, value, dropout):
                output = varlen_attention_forward(query, key, value, unpadded, dropout, self.scaling)
                return output.view(1, query.shape[0], -1), None
            # Another dtype from a quantized or adapter projection, or a dropout the kernel cannot draw: the tokens
            # are laid out per sequence after all (built once per forward, without a host read), in one dtype, and
            # the output comes back in the queries' dtype, as the kernel's would.
            unpadded, output_dtype = unpadded.attention_fallback(), query.dtype
            dtype = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
            query, key, value = (self._split_heads(x.flatten(1)[None].to(dtype), unpadded) for x in (query, key, value))
            attention_mask = unpadded.sdpa_mask()
        else:
            output_dtype = None
        attention_interface: Callable = eager_attention_forward  # also for a bare config (implementation None)
        if self.config._attn_implementation == "sdpa":
            attention_interface = sdpa_attention_forward  # transformers' own, but for bf16 training on CPU
        elif self.config._attn_implementation != "eager":
            # transformers' `get_interface` raises on an unknown name, and its call in this file is what lets
            # `model.set_attn_implementation(...)` switch a loaded model (transformers reads the modeling source for
            # it); releases before it have only the mapping.
            attention_interface = (
                ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
                if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface")
                else ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
            )
        attn_output, attn_weights = attention_interface(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs
        )  # (B, L, N, D)
        # (B, L, H), by the queries' shape: vLLM's attention function returns the tokens flattened, (B * L, N * D).
        attn_output = attn_output.reshape(query.shape[0], query.shape[2], -1)
        if unpadded is not None:
            attn_output = unpadded.from_attention_layout(attn_output)  # (1, T, H)
        if output_dtype is not None:
            attn_output = attn_output.to(output_dtype)
        return attn_output, attn_weights


class SeqBertSelfAttention(SeqBertAttention):
    """Multi-head self-attention. Bidirectional in the encoder; causal, with a key/value cache, in decoders."""

    def __init__(self, config: SeqBertConfig, layer_idx: int | None = None, is_causal: bool = False):
        super().__init__(config, layer_idx, is_causal)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        unpadded: UnpaddedBatch | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L, H) -> `(output (B, L, H), attention weights (B, N, L, L_total) or None)`. With `past_key_values`
        (decoders, generation), this step's keys/values are appended to the self-attention cache first. With
        `unpadded` (encoder fast path), input and output are (1, T, H) over the real tokens: the projections run on
        those only, and queries/keys/values are laid out one sequence per row just for the attention itself."""
        query, key, value = (
            self._split_heads(projection(hidden_states), unpadded) for projection in (self.query, self.key, self.value)
        )  # 3 x (B, N, L, D)
        if past_key_values is not None:
            cache = (
                past_key_values.self_attention_cache
                if isinstance(past_key_values, EncoderDecoderCache)
                else past_key_values
            )
            key, value = cache.update(key, value, self.layer_idx)  # 2 x (B, N, L_past + L, D)
        return self._attend(query, key, value, attention_mask, unpadded=unpadded, **kwargs)


class SeqBertCrossAttention(SeqBertAttention):
    """
    Decoder-to-encoder multi-head attention ("Attention Is All You Need" §3.2.3): queries from the decoder, keys and
    values from the encoder output. During generation the encoder keys/values are computed on the first step and
    read back from the cross-attention cache afterwards.
    """

    def __init__(self, config: SeqBertConfig, layer_idx: int | None = None):
        super().__init__(config, layer_idx, is_causal=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decoder states (B, L, H) and encoder states (B, S, H) -> `(output (B, L, H), weights (B, N, L, S) or None)`."""
        query = self._split_heads(self.query(hidden_states))  # (B, N, L, D)
        if past_key_values is not None and past_key_values.is_updated.get(self.layer_idx):
            cached = past_key_values.cross_attention_cache.layers[self.layer_idx]
            key, value = cached.keys, cached.values  # 2 x (B, N, S, D), computed on the first step
        else:
            key = self._split_heads(self.key(encoder_hidden_states))  # (B, N, S, D)
            value = self._split_heads(self.value(encoder_hidden_states))
            if past_key_values is not None:
                key, value = past_key_values.cross_attention_cache.update(key, value, self.layer_idx)
                past_key_values.is_updated[self.layer_idx] = True
        return self._attend(query, key, value, attention_mask, **kwargs)


# Feed-forward ---------------------------------------------------------------------------------------------------------


class SeqBertMLP(nn.Module):
    """Position-wise feed-forward: Linear(H -> intermediate), activation (GELU), Linear(intermediate -> H), dropout."""

    def __init__(self, config: SeqBertConfig):
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., H)."""
        return self.dropout(self.down_proj(self.act(self.up_proj(hidden_states))))


# Layers: pre-LN and post-LN share their parameters' names and differ only in where the LayerNorms sit. ----------------


class SeqBertLayer(GradientCheckpointingLayer):
    """Parameters of one self-attention + feed-forward layer: bidirectional in the encoder, causal (`is_causal`) in
    the causal LM. Use `SeqBertPreNormLayer` or `SeqBertPostNormLayer`, which add `forward`."""

    def __init__(self, config: SeqBertConfig, layer_idx: int | None = None, is_causal: bool = False):
        super().__init__()
        self.attention = SeqBertSelfAttention(config, layer_idx=layer_idx, is_causal=is_causal)
        self.attention_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SeqBertMLP(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def _attend(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs) -> torch.Tensor:
        return self.attention_dropout(self.attention(hidden_states, attention_mask, **kwargs)[0])


class SeqBertPreNormLayer(SeqBertLayer):
    """Pre-LN layer (Xiong et al. 2020): `x + Attn(LN(x))`, then `x + FFN(LN(x))`. (B, L, H) -> (B, L, H)."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        hidden_states = hidden_states + self._attend(self.attention_norm(hidden_states), attention_mask, **kwargs)
        return hidden_states + self.mlp(self.mlp_norm(hidden_states))


class SeqBertPostNormLayer(SeqBertLayer):
    """Post-LN layer (BERT; "Attention Is All You Need" §5.4): `LN(x + Attn(x))`, then `LN(x + FFN(x))`."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        hidden_states = self.attention_norm(hidden_states + self._attend(hidden_states, attention_mask, **kwargs))
        return self.mlp_norm(hidden_states + self.mlp(hidden_states))


SEQBERT_LAYER_CLASSES = {"pre": SeqBertPreNormLayer, "post": SeqBertPostNormLayer}


def build_final_layer_norm(config: SeqBertConfig) -> nn.Module:
    """The norm that ends an encoder or decoder stack. Pre-LN leaves the residual stream un-normalised, so the stack
    ends with one LayerNorm; post-LN layers already end on a LayerNorm, so nothing is added (`nn.Identity`)."""
    if config.norm_placement == "pre":
        return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    return nn.Identity()


class SeqBertEncoder(nn.Module):
    """`num_hidden_layers` layers of the configured norm placement; pre-LN adds a final LayerNorm."""

    def __init__(self, config: SeqBertConfig):
        super().__init__()
        layer_class = SEQBERT_LAYER_CLASSES[config.norm_placement]
        self.layers = nn.ModuleList([layer_class(config, layer_idx=i) for i in range(config.num_hidden_layers)])
        self.final_layer_norm = build_final_layer_norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        layer_inputs: list[torch.Tensor] | None = None,
        **kwargs,
    ):
        """(B, L, H) and a backend-specific mask from `masking_utils` -> (B, L, H). A `layer_inputs` list receives the
        hidden states entering each layer (what a `cross_attention_source="same_layer"` decoder reads)."""
        for layer in self.layers:
            if layer_inputs is not None:
                layer_inputs.append(hidden_states)
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return self.final_layer_norm(hidden_states)


class SeqBertDecoderLayer(GradientCheckpointingLayer):
    """Parameters of one decoder layer (causal self-attention, cross-attention, feed-forward, each with its
    LayerNorm). Use `SeqBertPreNormDecoderLayer` or `SeqBertPostNormDecoderLayer`, which add `forward`."""

    def __init__(self, config: SeqBertConfig, layer_idx: int | None = None):
        super().__init__()
        self.self_attention = SeqBertSelfAttention(config, layer_idx=layer_idx, is_causal=True)
        self.self_attention_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.self_attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.cross_attention = SeqBertCrossAttention(config, layer_idx=layer_idx)
        self.cross_attention_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.cross_attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SeqBertMLP(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def _self_attend(self, hidden_states, attention_mask, past_key_values, **kwargs) -> torch.Tensor:
        out = self.self_attention(hidden_states, attention_mask, past_key_values=past_key_values, **kwargs)[0]
        return self.self_attention_dropout(out)

    def _cross_attend(self, hidden_states, encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs):
        out = self.cross_attention(
            hidden_states, encoder_hidden_states, encoder_attention_mask, past_key_values=past_key_values, **kwargs
        )[0]
        return self.cross_attention_dropout(out)


class SeqBertPreNormDecoderLayer(SeqBertDecoderLayer):
    """Pre-LN decoder layer: `x + SelfAttn(LN(x))`, `x + CrossAttn(LN(x), enc)`, `x + FFN(LN(x))`. (B, L, H) -> (B, L, H)."""

    def forward(
        self, x, attention_mask, encoder_hidden_states, encoder_attention_mask=None, past_key_values=None, **kwargs
    ):
        x = x + self._self_attend(self.self_attention_norm(x), attention_mask, past_key_values, **kwargs)
        x = x + self._cross_attend(
            self.cross_attention_norm(x), encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs
        )
        return x + self.mlp(self.mlp_norm(x))


class SeqBertPostNormDecoderLayer(SeqBertDecoderLayer):
    """Post-LN decoder layer (BERT2BERT): `LN(x + SelfAttn(x))`, `LN(x + CrossAttn(x, enc))`, `LN(x + FFN(x))`."""

    def forward(
        self, x, attention_mask, encoder_hidden_states, encoder_attention_mask=None, past_key_values=None, **kwargs
    ):
        x = self.self_attention_norm(x + self._self_attend(x, attention_mask, past_key_values, **kwargs))
        x = self.cross_attention_norm(
            x + self._cross_attend(x, encoder_hidden_states, encoder_attention_mask, past_key_values, **kwargs)
        )
        return self.mlp_norm(x + self.mlp(x))


SEQBERT_DECODER_LAYER_CLASSES = {"pre": SeqBertPreNormDecoderLayer, "post": SeqBertPostNormDecoderLayer}


# Pooler and LM head ---------------------------------------------------------------------------------------------------


class SeqBertPooler(nn.Module):
    """BERT's pooler: tanh(Linear(h_[CLS])). (B, L, H) -> (B, H)."""

    def __init__(self, config: SeqBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))


class SeqBertLMHead(nn.Module):
    """BERT's masked-LM head: Linear, activation, LayerNorm, then a decoder to the vocabulary whose weight is tied
    to the word embeddings. (..., H) -> (..., V)."""

    def __init__(self, config: SeqBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.layer_norm(self.act(self.dense(hidden_states))))


# Pretrained model base ------------------------------------------------------------------------------------------------


def loss_divisor(
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = IGNORE_INDEX,
    labelled: int | None = None,
) -> torch.Tensor | int | None:
    """
    What a cross-entropy's sum over labelled positions is divided by: Trainer's `num_items_in_batch` when given, else
    the number of `labels` that are not `ignore_index` (a scalar int64 tensor: bit for bit PyTorch's mean), or None
    where that number was read on the host (`labelled` > 0: the loss takes PyTorch's mean itself). Never below 1, our
    own choice: where every label is ignored the loss is 0.0, with zero gradients, where BERT's mean is 0 / 0 = NaN.
    """
    if num_items_in_batch is None and labelled is not None:
        return None if labelled > 0 else 1
    if num_items_in_batch is None:
        return (labels != ignore_index).sum().clamp(min=1)
    if torch.is_tensor(num_items_in_batch):
        return num_items_in_batch.clamp(min=1)
    return max(num_items_in_batch, 1)


def span_loss(start_logits, end_logits, start_positions, end_positions, span=None) -> torch.Tensor:
    """BERT's question-answering loss, float32: positions clamped to [0, L] and L ignored (with `span`, a static
    batch's longest sequence, every position from it), the mean of the start and end cross-entropies, each divided by
    `loss_divisor`."""
    ignored = start_logits.shape[1]
    losses = []
    for side_logits, positions in ((start_logits, start_positions), (end_logits, end_positions)):
        positions = positions.reshape(-1).long().clamp(0, ignored)
        if span is not None:
            positions = positions.masked_fill(positions >= span, ignored)
        divisor = loss_divisor(positions, ignore_index=ignored)
        losses.append(fixed_cross_entropy(side_logits.float(), positions, divisor, ignore_index=ignored))
    return (losses[0] + losses[1]) / 2


@torch.compiler.disable
def _call_eagerly(module: nn.Module, *args, **kwargs):
    """`module(*args, **kwargs)`, never compiled (see `SeqBertPreTrainedModel.__call__`)."""
    return nn.Module.__call__(module, *args, **kwargs)


class SeqBertPreTrainedModel(PreTrainedModel):
    """Weight initialisation, attention-backend flags and BERT import shared by every SeqBERT model."""

    config_class = SeqBertConfig
    base_model_prefix = "seqbert"
    supports_gradient_checkpointing = True
    _no_split_modules = [
        "SeqBertEmbeddings",
        "SeqBertPreNormLayer",
        "SeqBertPostNormLayer",
        "SeqBertPreNormDecoderLayer",
        "SeqBertPostNormDecoderLayer",
    ]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": SeqBertLayer, "attentions": SeqBertSelfAttention}
    _bert_conversion_target = "encoder"  # what `from_bert_pretrained` converts into (`convert_bert`)
    # Trainer passes `num_items_in_batch` to the token-level losses, which divide by it (docs/training-at-scale.md);
    # heads whose loss is a mean over their own batch set False.
    accepts_loss_kwargs = True
    # The loss a head computes, as transformers names it (`LOSS_MAPPING`'s keys; "ForMultipleChoice" is ours): a class
    # attribute, so a subclass keeps its head's loss whatever it is called (transformers derives `loss_type` from the
    # class name, which a user's `class Mine(SeqBertForQuestionAnswering)` does not match). None: no loss.
    head_loss_type: str | None = None

    def __init__(self, config: SeqBertConfig, *inputs, **kwargs):
        """
        Raises:
            TypeError: `config` is not a `SeqBertConfig`, or one of its fields has the wrong type.
            ValueError: a field of `config` is out of range (re-checked here: it may have changed since construction).
        """
        check_seqbert_config(config)
        super().__init__(config, *inputs, **kwargs)
        if self.head_loss_type is not None:  # `self.loss_function` follows the head, not the class name
            self.loss_type = self.head_loss_type if self.head_loss_type in LOSS_MAPPING else None

    def __call__(self, *args, **kwargs):
        """`nn.Module.__call__`; compiled (`torch.compile(model)` or `model.compile()`), a batch beyond
        `StaticShapeCollator`'s ladder (`static_layout=False`) runs eagerly, outside the compiled graph."""
        if kwargs.get("static_layout") is False:
            if torch.compiler.is_compiling():
                return _call_eagerly(self, *args, **kwargs)
            if getattr(self, "_compiled_call_impl", None) is not None:  # `model.compile()`: its eager call instead
                return self._call_impl(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def head_loss(self, logits, labels, reads: DeferredReads | None = None, span=None, **kwargs) -> torch.Tensor:
        """
        Every head's loss, float32: transformers' loss function of the head (`self.loss_function`: masked and causal
        LM, sequence and token classification), else the cross-entropy over the rows of `logits` (multiple choice;
        seq2seq, whose labels are not shifted) or `span_loss` (question answering: `logits` and `labels` are the
        start and end pairs). Sums over labelled positions are divided by `loss_divisor`: Trainer's
        `num_items_in_batch` where given, else this batch's labelled positions (counted in the encoder's host read
        where `reads` did: `DeferredReads.count_labelled`).
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        kind = self.head_loss_type
        if kind == "ForQuestionAnswering":
            return span_loss(*logits, *labels, span)
        counted = kwargs.get("shift_labels", labels[:, 1:]) if kind == "ForCausalLM" else labels
        labelled = None if reads is None else reads.value(LABELLED)
        divisor = None if labels.is_floating_point() else loss_divisor(counted, num_items_in_batch, labelled=labelled)
        if kind == "ForSequenceClassification":
            return self.loss_function(labels, logits.float(), self.config, num_items_in_batch=divisor, **kwargs)
        if kind == "ForTokenClassification":
            return self.loss_function(logits, labels, self.config, num_items_in_batch=divisor, **kwargs)
        if kind in ("ForMaskedLM", "ForCausalLM"):
            vocab_size = self.config.vocab_size
            return self.loss_function(logits, labels, vocab_size=vocab_size, num_items_in_batch=divisor, **kwargs)
        return fixed_cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), divisor)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, initializer_range) linear/embedding weights, zero biases, unit LayerNorms (BERT's scheme, via
        `PreTrainedModel._init_weights`)."""
        super()._init_weights(module)
        if isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """
        `PreTrainedModel.resize_token_embeddings`: every word embedding matrix, the tied LM head and
        `config.vocab_size` change together (seq2seq: encoder and decoder alike).

        Raises:
            TypeError: `new_num_tokens` is not an int.
            ValueError: the new size is below 1, or would drop a special token id of the config; nothing is resized.
        """
        check_vocabulary_size(self.config, new_num_tokens, pad_to_multiple_of)
        return super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """
        `PreTrainedModel.from_pretrained`, safetensors weights only unless `use_safetensors=False` (unpickling runs
        code), with clear errors where transformers would fail obscurely or load a partly random model
        (`checkpoint_loading.load_pretrained`).

        Raises:
            ValueError: only pickled weights; seqbert 0.1.0's fused attention projections.
            MismatchedSizesError: (a `RuntimeError` and a `ValueError`) parameters shaped unlike the model's, without
                `ignore_mismatched_sizes=True`.
            OSError: no `config.json`; no safetensors weights; a truncated, corrupt or missing file (named); weights
                holding NaN, infinite or implausibly large values; what `PreTrainedModel.from_pretrained` raises.
        """
        return load_pretrained(cls, super().from_pretrained, pretrained_model_name_or_path, *model_args, **kwargs)

    @classmethod
    def from_bert_pretrained(cls, pretrained_model_name_or_path: str, **kwargs):
        """
        A BERT checkpoint (a Hub name such as `"bert-base-uncased"`, or a local folder) as this class, post-LN, with
        BERT's numbers: any BERT head's checkpoint (a head it lacks is newly initialised and reported),
        `BertLMHeadModel` for the causal LM, an `EncoderDecoderModel` or one BERT on both sides (BERT2BERT, Rothe et
        al. 2020; docs/seq2seq.md) for seq2seq.

        Args:
            pretrained_model_name_or_path (`str` or `os.PathLike`): Hub model id or local folder.
            **kwargs: Hub and loading options as `from_pretrained` takes them, `use_safetensors=False` for pickled
                weights, `cross_attention_init` (a seq2seq warm start: `"self_attention"`, the default, or
                `"random"`), and config overrides (`num_labels=2`, ...).

        Raises:
            ValueError: not a BERT checkpoint; no (safetensors) weights; an override that changes a shape
                (`MismatchedSizesError`); parameters other than a head missing; a seq2seq warm start without a
                tokenizer or `decoder_start_token_id=` / `eos_token_id=`; a bad `cross_attention_init`.
            OSError: the checkpoint cannot be resolved, or a file is damaged (named), or its weights are not finite.
        """
        return from_bert_pretrained(cls, pretrained_model_name_or_path, **kwargs)


# The encoder model ----------------------------------------------------------------------------------------------------


@dataclass
class SeqBertModelOutput(BaseModelOutputWithPooling):
    """`BaseModelOutputWithPooling`, plus `layer_inputs` (B, num_decoder_layers, L, H): on a seq2seq config with
    `cross_attention_source="same_layer"`, the hidden states entering encoder layers `0 .. num_decoder_layers - 1`."""

    layer_inputs: torch.FloatTensor | None = None


class SeqBertModel(SeqBertPreTrainedModel):
    """
    The SeqBERT encoder (`AutoModel`): embeddings, `num_hidden_layers` pre- or post-LN layers, an optional pooler.
    On a seq2seq config it is a seq2seq checkpoint's encoder (no pooler; the decoder's weights are skipped).

    Args:
        config (`SeqBertConfig`): model configuration.
        add_pooling_layer (`bool`, *optional*): build the pooler; defaults to `True`, or `False` on a seq2seq config.
    """

    def __init__(self, config: SeqBertConfig, add_pooling_layer: bool | None = None):
        super().__init__(config)
        if add_pooling_layer is None:
            add_pooling_layer = not config.is_encoder_decoder
        if config.is_encoder_decoder:
            self._keys_to_ignore_on_load_unexpected = [r"^decoder\.", r"^lm_head\."]
        self.embeddings = SeqBertEmbeddings(config)
        self.encoder = SeqBertEncoder(config)
        self.pooler = SeqBertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        deferred_reads: DeferredReads | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SeqBertModelOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, L)`): token ids in `[0, vocab_size)`.
            attention_mask (`torch.Tensor` of shape `(B, L)`, *optional*): 1 for real tokens, 0 for padding.
            token_type_ids (`torch.LongTensor` of shape `(B, L)`, *optional*): segment ids; defaults to 0.
            position_ids (`torch.LongTensor` of shape `(B, L)`, *optional*): defaults to `0 .. L-1`; where they
                restart, a new packed sequence starts (`DataCollatorWithFlattening`; or `cu_seq_lens_q`).
            inputs_embeds (`torch.Tensor` of shape `(B, L, H)`, *optional*): instead of `input_ids`.
            deferred_reads (`DeferredReads`, *optional*): a head's checks and scalars, read in the encoder's one
                host read.
            static_layout (`bool`, *optional*): `StaticShapeCollator`'s batches: True with their layout (`indices`,
                `cu_seqlens`, `max_seqlen`, computed on the CPU), False beyond its ladder. In eager execution the
                layout is checked against `attention_mask` in the one host read; compiled, nothing is read.
            validate_static_layout (`bool`, *optional*): False skips that check in eager execution too.

        Returns:
            `SeqBertModelOutput`: `last_hidden_state` (B, L, H), zero at padding with sdpa (BERT's values with eager
            attention), `pooler_output` (B, H) or None, `layer_inputs` (a `cross_attention_source="same_layer"`
            seq2seq config), `hidden_states` and `attentions` (eager attention) on request.

        Raises:
            TypeError, ValueError: arguments of the wrong type or shape, both or neither of `input_ids` and
                `inputs_embeds`, ids outside the vocabulary or segment range, positions beyond learned ones,
                `cu_seq_lens_q` that does not cover the batch, a static batch's layout unlike its attention mask
                (values are not checked while traced).
        """
        reads = DeferredReads() if deferred_reads is None else deferred_reads  # one host read: checks and layout
        value_checks = []
        check_encoder_inputs(
            self.config, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, value_checks
        )
        reads.checks[:0] = value_checks
        dtype = self.embeddings.layer_norm.weight.dtype
        unpadded, sequence_ids, all_real = plan_layout(
            self.config, input_ids, inputs_embeds, attention_mask, position_ids, reads, kwargs, self.training, dtype
        )
        if all_real and self.config._attn_implementation == "sdpa":
            attention_mask = None  # nothing to mask: no mask to build (transformers would read the host to find out)
        same_layer = self.config.is_encoder_decoder and self.config.cross_attention_source == "same_layer"
        layer_inputs = [] if same_layer else None
        if unpadded is None:
            embedding_output = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, L, H)
            # One mask per forward, in the format the attention backend wants (None when nothing is masked); packed
            # rows add a block-diagonal constraint (each token attends within its own sequence).
            packed = None if sequence_ids is None else packed_sequence_mask_function(sequence_ids)
            mask = bidirectional_mask(self.config, embedding_output, attention_mask, and_mask_function=packed)
            sequence_output = self.encoder(embedding_output, mask, layer_inputs, **kwargs)  # (B, L, H)
            if self.config._attn_implementation == "sdpa" and attention_mask is not None and attention_mask.dim() == 2:
                # Padding positions hold zeros, as on the unpadded path, so traced and eager runs agree everywhere.
                sequence_output = sequence_output * attention_mask[:, :, None].to(sequence_output.dtype)
                if layer_inputs:
                    layer_inputs = [x * attention_mask[:, :, None].to(x.dtype) for x in layer_inputs]
        else:
            sequence_output, layer_inputs = self._encode_unpadded(
                unpadded, input_ids, token_type_ids, position_ids, inputs_embeds, layer_inputs, **kwargs
            )
        pooled_output = self.pooler(sequence_output) if self.pooler is not None else None  # (B, H)
        stacked = torch.stack(layer_inputs[: self.config.num_decoder_layers], dim=1) if layer_inputs else None
        return SeqBertModelOutput(last_hidden_state=sequence_output, pooler_output=pooled_output, layer_inputs=stacked)

    def _encode_unpadded(
        self, unpadded, input_ids, token_type_ids, position_ids, inputs_embeds, layer_inputs, **kwargs
    ):
        """The unpadded path: the T tokens of `unpadded` as (1, T, H) from the embeddings (looked up on BERT's (B, L)
        grid, then gathered) to the last layer, padded back once. Returns `(last_hidden_state (B, L, H), layer_inputs)`,
        zeros at padding."""
        embedding_output = self.embeddings(
            input_ids, token_type_ids, position_ids, inputs_embeds, unpadded
        )  # (1, T, H)
        # Variable-length attention reads `unpadded.cu_seqlens`; the attention layout takes a boolean mask.
        mask = None if unpadded.varlen else unpadded.sdpa_mask()
        sequence_output = unpadded.pad(self.encoder(embedding_output, mask, layer_inputs, unpadded=unpadded, **kwargs))
        if layer_inputs:
            layer_inputs = [unpadded.pad(x) for x in layer_inputs]
        return sequence_output, layer_inputs


# The decoder (used by SeqBertForConditionalGeneration) ----------------------------------------------------------------


class SeqBertDecoder(SeqBertPreTrainedModel):
    """
    A SeqBERT decoder stack: embeddings, causal layers with a key/value cache, a final LayerNorm when pre-LN. With
    `add_cross_attention` (seq2seq, the default): `num_decoder_layers` layers of causal self-attention,
    cross-attention and feed-forward; without (the causal LM, BERT's `BertLMHeadModel`): `num_hidden_layers` causal
    encoder layers.
    """

    _can_record_outputs = {
        "hidden_states": [SeqBertLayer, SeqBertDecoderLayer],
        "attentions": SeqBertSelfAttention,
        "cross_attentions": OutputRecorder(SeqBertCrossAttention, index=1),
    }

    def __init__(self, config: SeqBertConfig, add_cross_attention: bool = True):
        super().__init__(config)
        self.add_cross_attention = add_cross_attention
        self.embeddings = SeqBertEmbeddings(config)
        if add_cross_attention:
            layer_class = SEQBERT_DECODER_LAYER_CLASSES[config.norm_placement]
            layers = [layer_class(config, layer_idx=i) for i in range(config.num_decoder_layers)]
        else:
            layer_class = SEQBERT_LAYER_CLASSES[config.norm_placement]
            layers = [layer_class(config, layer_idx=i, is_causal=True) for i in range(config.num_hidden_layers)]
        self.layers = nn.ModuleList(layers)
        self.final_layer_norm = build_final_layer_norm(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        cache: Cache | None = None,
        deferred_reads: DeferredReads | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, L)`): token ids (the new ones only, when a cache is given).
            attention_mask (`torch.Tensor`, *optional*): `(B, L_past + L)`, 1 for real tokens, or a prepared 4-D mask.
            encoder_hidden_states (`torch.Tensor` of shape `(B, S, H)` or `(B, num_decoder_layers, S, H)`): what the
                cross-attention reads: the encoder output, or `[:, i]` for layer `i` (`cross_attention_source=
                "same_layer"`).
            encoder_attention_mask (`torch.Tensor` of shape `(B, S)`, *optional*): 1 for real source tokens.
            past_key_values / cache (`Cache`, *optional*): the key/value cache (`EncoderDecoderCache` with
                cross-attention); made here with `use_cache` (not under gradient checkpointing).
            position_ids, token_type_ids (`torch.LongTensor` of shape `(B, L)`, *optional*): positions (default
                `L_past ..`) and segment ids (default 0).
            deferred_reads (`DeferredReads`, *optional*): a head's checks, read with the decoder's (`values` set: read
                already, with a seq2seq step's encoder).

        Returns:
            `BaseModelOutputWithPastAndCrossAttentions`: `last_hidden_state` (B, L, H) and the cache.

        Raises:
            TypeError, ValueError: both or neither of `input_ids` / `inputs_embeds`; no `encoder_hidden_states` with
                cross-attention; inputs shaped unlike each other; ids or positions out of range.
        """
        past_key_values = either_cache(past_key_values, cache)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and self.training and torch.is_grad_enabled() and self.layers[0].gradient_checkpointing:
            use_cache, past_key_values = False, None
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        inputs = (input_ids, attention_mask, encoder_hidden_states, encoder_attention_mask, inputs_embeds)
        check_decoder_inputs(self.config, *inputs, position_ids, token_type_ids, past_length, self.add_cross_attention)
        reads = DeferredReads() if deferred_reads is None else deferred_reads  # one host read: checks, mask padding
        attention_mask, causal_skip, encoder_attention_mask, source_skip = read_decoder_inputs(
            self.config, reads, input_ids, attention_mask, encoder_attention_mask, position_ids, token_type_ids,
            self.add_cross_attention, past_key_values is not None,
        )  # fmt: skip
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)
            if self.add_cross_attention:
                past_key_values = EncoderDecoderCache(past_key_values, DynamicCache(config=self.config))
        if inputs_embeds is None:
            inputs_embeds = self.embeddings.word_embeddings(input_ids)  # (B, L, H)
        batch_size, seq_length = inputs_embeds.shape[:2]
        given_positions = position_ids  # the mask builders look for packed rows in given positions only
        if position_ids is None:
            position_ids = torch.arange(past_length, past_length + seq_length, device=inputs_embeds.device).unsqueeze(0)
        hidden_states = self.embeddings(
            inputs_embeds=inputs_embeds, position_ids=position_ids, token_type_ids=token_type_ids
        )  # (B, L, H)

        # The masks once per forward, in the format of the configured attention backend.
        cache = getattr(past_key_values, "self_attention_cache", past_key_values)
        attention_mask = causal_mask(
            self.config, hidden_states, past_length, attention_mask, cache, given_positions, causal_skip
        )
        cross_attention_inputs = ()
        per_layer = encoder_hidden_states is not None and encoder_hidden_states.dim() == 4
        if self.add_cross_attention:
            source = encoder_hidden_states[:, 0] if per_layer else encoder_hidden_states
            encoder_attention_mask = bidirectional_mask(
                self.config, hidden_states, encoder_attention_mask, encoder_hidden_states=source,
                allow_is_bidirectional_skip=source_skip,
            )  # fmt: skip
            cross_attention_inputs = (encoder_hidden_states, encoder_attention_mask)
        for i, layer in enumerate(self.layers):
            if per_layer:  # decoder layer i reads the states entering encoder layer i
                cross_attention_inputs = (encoder_hidden_states[:, i], encoder_attention_mask)
            # Positional arguments, for gradient checkpointing.
            hidden_states = layer(
                hidden_states, attention_mask, *cross_attention_inputs, past_key_values=past_key_values, **kwargs
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=self.final_layer_norm(hidden_states),
            **{CACHE_NAME: past_key_values if use_cache else None},
        )


# Task heads: encode, head, loss ---------------------------------------------------------------------------------------


def _classifier_dropout(config: SeqBertConfig) -> nn.Dropout:
    """BERT's rule: `classifier_dropout` if set, else `hidden_dropout_prob`."""
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


class SeqBertForMaskedLM(SeqBertPreTrainedModel):
    """SeqBERT with BERT's masked-LM head; the decoder weight is tied to the word embeddings."""

    head_loss_type = "ForMaskedLM"

    _tied_weights_keys = {"lm_head.decoder.weight": "seqbert.embeddings.word_embeddings.weight"}

    def __init__(self, config: SeqBertConfig):
        super().__init__(config)
        self.seqbert = SeqBertModel(config, add_pooling_layer=False)
        self.lm_head = SeqBertLMHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput:
        r"""
        Inputs as in `SeqBertModel.forward`, plus `labels` (`torch.LongTensor` of shape `(B, L)`, *optional*): target
        ids in `[0, vocab_size)`, -100 where no loss is taken. Returns `MaskedLMOutput` with `logits` (B, L, V) and the
        cross-entropy `loss` (float32) when `labels` are given. With `config.sparse_prediction` and `labels`, only the M
        labelled positions reach the vocabulary projection: `logits` are (M, V) in row-major order
        (`labelled_rows`; compiled, a static batch gives its `max_predictions` rows, those beyond M ignored).
        """
        reads = DeferredReads()  # the labels are checked in the encoder's one host read
        sparse = labels is not None and self.config.sparse_prediction
        if labels is not None and (shape := input_batch_shape(input_ids, inputs_embeds)) is not None:
            vocab_size = self.config.vocab_size
            labels = check_labels("labels", labels, (*shape, vocab_size), vocab_size, "vocab_size", True, reads.checks)
            reads.count_labelled(labels, sparse or kwargs.get("num_items_in_batch") is None)
        outputs = self.seqbert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, reads, return_dict=True, **kwargs
        )
        hidden_states = outputs.last_hidden_state  # (B, L, H)
        if sparse:
            hidden_states, labels = labelled_rows(hidden_states, labels, reads, kwargs)  # (M, H), (M,)
        logits = self.lm_head(hidden_states)  # (B, L, V), or (M, V) with sparse prediction
        loss = self.head_loss(logits, labels, reads, **kwargs) if labels is not None else None
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class SeqBertForSequenceClassification(SeqBertPreTrainedModel):
    """SeqBERT with a linear classifier on the pooled [CLS] state: regression (`num_labels == 1`), single-label or
    multi-label classification, chosen by `config.problem_type` exactly as BERT does."""

    head_loss_type = "ForSequenceClassification"

    # The loss is a mean over the batch and ignores num_items_in_batch: let Trainer scale it for accumulation.
    accepts_loss_kwargs = False

    def __init__(self, config: SeqBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.seqbert = SeqBertModel(config, add_pooling_layer=True)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutput:
        r"""
        Inputs as in `SeqBertModel.forward`, plus `labels`, *optional*: `(B,)` class ids in `[0, num_labels)` or -100
        (single-label), `(B,)` targets (regression, `num_labels == 1`) or `(B, C)` multi-hot targets (multi-label);
        integer regression and multi-label targets are taken as floats. Returns `SequenceClassifierOutput` with
        `logits` (B, C) and `loss` (float32: cross-entropy, MSE or BCE-with-logits) when `labels` are given.

        Raises:
            TypeError, ValueError: as `SeqBertModel.forward`, and for `labels` that do not fit the problem type.
        """
        reads = DeferredReads()  # the labels are checked in the encoder's one host read
        if labels is not None and (shape := input_batch_shape(input_ids, inputs_embeds)) is not None:
            problem_type = self.config.problem_type
            labels = check_sequence_classification_labels(
                labels, (shape[0], self.num_labels), problem_type, reads.checks
            )
            reads.count_labelled(labels, not labels.is_floating_point() and kwargs.get("num_items_in_batch") is None)
        outputs = self.seqbert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, reads, return_dict=True, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))  # (B, C)
        loss = self.head_loss(logits, labels, reads, **kwargs) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class SeqBertForTokenClassification(SeqBertPreTrainedModel):
    """SeqBERT with a linear classifier on every token (NER, POS tagging)."""

    head_loss_type = "ForTokenClassification"

    def __init__(self, config: SeqBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.seqbert = SeqBertModel(config, add_pooling_layer=False)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TokenClassifierOutput:
        r"""
        Inputs as in `SeqBertModel.forward`, plus `labels` (`torch.LongTensor` of shape `(B, L)`, *optional*): class
        ids in `[0, num_labels)`, -100 where no loss is taken. Returns `TokenClassifierOutput` with `logits` (B, L, C)
        and the cross-entropy `loss` (float32) when `labels` are given.
        """
        reads = DeferredReads()  # the labels are checked in the encoder's one host read
        if labels is not None and (shape := input_batch_shape(input_ids, inputs_embeds)) is not None:
            classes = self.num_labels
            labels = check_labels("labels", labels, (*shape, classes), classes, "num_labels", True, reads.checks)
            reads.count_labelled(labels, kwargs.get("num_items_in_batch") is None)
        outputs = self.seqbert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, reads, return_dict=True, **kwargs
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (B, L, C)
        loss = self.head_loss(logits, labels, reads, **kwargs) if labels is not None else None
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class SeqBertForQuestionAnswering(SeqBertPreTrainedModel):
    """SeqBERT with BERT's extractive-QA head: a linear layer giving span start and end logits per token."""

    head_loss_type = "ForQuestionAnswering"

    accepts_loss_kwargs = False

    def __init__(self, config: SeqBertConfig):
        """Raises `ValueError` unless `config.num_labels == 2` (the start and end logits)."""
        check_num_labels(config, 2, "SeqBertForQuestionAnswering: one start and one end logit per token")
        super().__init__(config)
        self.num_labels = config.num_labels
        self.seqbert = SeqBertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> QuestionAnsweringModelOutput:
        r"""
        Inputs as in `SeqBertModel.forward`, plus `start_positions` / `end_positions` (`torch.LongTensor` of shape
        `(B,)`, *optional*): token indices of the answer span (positions beyond L are ignored, as in BERT). Returns
        `QuestionAnsweringModelOutput` with `start_logits` and `end_logits` (B, L) and the mean of the two
        cross-entropies (float32) as `loss` when both positions are given. A static batch's columns beyond its
        longest sequence hold the dtype's minimum, and positions there are ignored (`span_logits`).

        Raises:
            TypeError, ValueError: as `SeqBertModel.forward`; only one of `start_positions` / `end_positions`;
                positions not integer, not `(B,)`, or negative.
        """
        reads = DeferredReads()  # the positions are checked in the encoder's one host read
        if (shape := input_batch_shape(input_ids, inputs_embeds)) is not None:
            check_answer_positions(start_positions, end_positions, shape[0], reads.checks)
        outputs = self.seqbert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, reads, return_dict=True, **kwargs
        )
        logits, span = span_logits(self.qa_outputs(outputs.last_hidden_state), attention_mask, kwargs)  # (B, L, 2)
        start_logits, end_logits = (t.squeeze(-1).contiguous() for t in logits.split(1, dim=-1))  # 2 x (B, L)
        loss = None
        if start_positions is not None:
            loss = self.head_loss((start_logits, end_logits), (start_positions, end_positions), span=span, **kwargs)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class SeqBertForMultipleChoice(SeqBertPreTrainedModel):
    """SeqBERT scoring each of `num_choices` candidate sequences with a linear layer on its pooled [CLS] state."""

    head_loss_type = "ForMultipleChoice"

    accepts_loss_kwargs = False

    def __init__(self, config: SeqBertConfig):
        super().__init__(config)
        self.seqbert = SeqBertModel(config, add_pooling_layer=True)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MultipleChoiceModelOutput:
        r"""
        Inputs of shape `(B, num_choices, L)` (`inputs_embeds`: `(B, num_choices, L, H)`), plus `labels`
        (`torch.LongTensor` of shape `(B,)`, *optional*): index of the right choice. Returns
        `MultipleChoiceModelOutput` with `logits` (B, num_choices) and the cross-entropy `loss` (float32) when `labels`
        are given.

        Raises:
            TypeError, ValueError: as `SeqBertModel.forward` (inputs not 3-D, embeddings not 4-D, a dimension of 0,
                the other inputs shaped unlike them), and for `labels` not integer, not `(B,)`, or outside
                `[0, num_choices)` (-100 takes no loss).
        """
        check_multiple_choice_inputs(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        batch_size, num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        reads = DeferredReads()  # the labels are checked in the encoder's one host read
        if labels is not None:
            shape = (batch_size, num_choices)
            labels = check_labels("labels", labels, shape, num_choices, "num_choices", True, reads.checks)
            reads.count_labelled(labels)

        def flat(t: torch.Tensor | None, trailing: int) -> torch.Tensor | None:
            return t if t is None else t.reshape(-1, *t.shape[t.dim() - trailing :])  # (B * num_choices, ...)

        outputs = self.seqbert(
            flat(input_ids, 1),
            attention_mask=flat(attention_mask, 1),
            token_type_ids=flat(token_type_ids, 1),
            position_ids=flat(position_ids, 1),
            inputs_embeds=flat(inputs_embeds, 2),
            deferred_reads=reads,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output)).view(-1, num_choices)  # (B, num_choices)
        loss = self.head_loss(logits, labels, reads, **kwargs) if labels is not None else None
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


# Causal language model (decoder-only) ---------------------------------------------------------------------------------


class SeqBertGenerationMixin(GenerationMixin):
    """`GenerationMixin` with `generate` unchanged in arguments and results: its arguments checked first
    (`check_generate_arguments`: `ValueError` / `TypeError` where transformers would fail deep inside), the decode
    steps' small fp32 products on CPU on prepacked oneDNN weights (`PackedCpuLinears`; same ids, logits within ~1e-6)."""

    def generate(self, *args, **kwargs):
        check_generate_arguments(self.config, self.generation_config, args, kwargs)
        with PackedCpuLinears(self):
            return super().generate(*args, **kwargs)


class SeqBertForCausalLM(SeqBertPreTrainedModel, SeqBertGenerationMixin):
    """Decoder-only SeqBERT (`AutoModelForCausalLM`), BERT's `BertLMHeadModel`: causal layers with a key/value cache
    and BERT's LM head tied to the word embeddings; `from_bert_pretrained` loads `BertLMHeadModel` checkpoints."""

    head_loss_type = "ForCausalLM"

    _tied_weights_keys = {"lm_head.decoder.weight": "seqbert.embeddings.word_embeddings.weight"}
    _bert_conversion_target = "causal"

    def __init__(self, config: SeqBertConfig):
        """Raises `ValueError` on a seq2seq config (`is_encoder_decoder`): use `SeqBertForConditionalGeneration`."""
        check_decoder_only(config)
        super().__init__(config)
        self.seqbert = SeqBertDecoder(config, add_cross_attention=False)
        self.lm_head = SeqBertLMHead(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.seqbert.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.seqbert.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithCrossAttentions:
        r"""
        Inputs as in `SeqBertDecoder.forward`, plus `labels` (`torch.LongTensor` of shape `(B, L)`, *optional*): the
        input ids, -100 where no loss is taken (shifted one step left by the loss, as BERT's), and `logits_to_keep`
        (`int` or `torch.Tensor`): logits for the last that many positions (0: all), or these indices. Returns
        `CausalLMOutputWithCrossAttentions`: `logits` (B, L_kept, V), the float32 `loss` with `labels`, the cache.

        Raises:
            TypeError, ValueError: as `SeqBertDecoder.forward`, and for `labels` not integer, shaped unlike the
                inputs or out of range.
        """
        reads = DeferredReads()  # the labels are checked in the decoder's one host read
        if labels is not None:
            use_cache = False
            if (shape := input_batch_shape(input_ids, inputs_embeds)) is not None:
                vocab_size = self.config.vocab_size
                labels = check_labels("labels", labels, (*shape, 1), vocab_size, "vocab_size", True, reads.checks)
        outputs = self.seqbert(
            input_ids,
            attention_mask=attention_mask,
            cache=either_cache(past_key_values, cache),
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            token_type_ids=token_type_ids,
            use_cache=use_cache,
            return_dict=True,
            deferred_reads=reads,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state  # (B, L, H)
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, kept])  # (B, L_kept, V)
        loss = self.head_loss(logits, labels, **kwargs) if labels is not None else None
        return CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            **{CACHE_NAME: getattr(outputs, CACHE_NAME)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# Sequence to sequence -------------------------------------------------------------------------------------------------


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: `labels` (B, T) shifted one step right behind `decoder_start_token_id`, with
    the -100 of ignored positions replaced by `pad_token_id`. Returns (B, T) int64."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def cross_attention_states(config: SeqBertConfig, encoder_outputs) -> torch.Tensor:
    """What the decoder's cross-attention reads: the encoder's `last_hidden_state` (B, S, H), or with
    `cross_attention_source="same_layer"` its `layer_inputs` (B, num_decoder_layers, S, H) (`ValueError` without)."""
    if config.cross_attention_source == "last_layer":
        return encoder_outputs.last_hidden_state
    return check_layer_inputs(getattr(encoder_outputs, "layer_inputs", None))


class SeqBertForConditionalGeneration(SeqBertPreTrainedModel, SeqBertGenerationMixin):
    """
    Encoder-decoder SeqBERT ("Attention Is All You Need" §3.1), `decode(encode(src, src_mask), src_mask, tgt)`:
    `self.seqbert` the encoder (what `AutoModel` loads of a seq2seq checkpoint), `self.decoder`, and BERT's LM head
    tied to the decoder's word embeddings. `generate` keeps an `EncoderDecoderCache` (cross-attention keys and values
    computed once). `from_bert_pretrained` warm-starts both sides from one BERT (BERT2BERT) or converts an
    `EncoderDecoderModel` with BERT on both sides.
    """

    head_loss_type = "ForConditionalGeneration"

    _tied_weights_keys = {"lm_head.decoder.weight": "decoder.embeddings.word_embeddings.weight"}
    _bert_conversion_target = "seq2seq"

    def __init__(self, config: SeqBertConfig):
        """Takes any valid `SeqBertConfig`; one without `is_encoder_decoder=True` is copied with it set (`generate` reads
        it)."""
        if not config.is_encoder_decoder:
            config = copy.deepcopy(config)
            config.is_encoder_decoder = True
        super().__init__(config)
        self.seqbert = SeqBertModel(config, add_pooling_layer=False)
        self.decoder = SeqBertDecoder(config)
        self.lm_head = SeqBertLMHead(config)
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {
                "decoder.embeddings.word_embeddings.weight": "seqbert.embeddings.word_embeddings.weight",
                "lm_head.decoder.weight": "seqbert.embeddings.word_embeddings.weight",
            }
        self.post_init()

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        """The text encoder (`self.seqbert`). SeqBERT has no encoder for another `modality` ("image", "video",
        "audio", which transformers' exporters ask for): then `self`, transformers' answer for "none"."""
        return self.seqbert if modality is None else self

    def get_decoder(self) -> SeqBertDecoder:
        return self.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.seqbert.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.seqbert.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head.decoder = new_embeddings

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True) -> nn.Embedding:
        """transformers resizes the input (encoder) embeddings and the LM head; the decoder's word embeddings are
        resized here to the same size, so `tie_weights` then ties the LM head (and, with
        `share_encoder_decoder_embeddings`, the decoder embeddings) to matrices of the new size."""
        encoder_embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        old = self.decoder.get_input_embeddings()
        new = self._get_resized_embeddings(old, encoder_embeddings.num_embeddings, mean_resizing=mean_resizing)
        new.requires_grad_(old.weight.requires_grad)
        self.decoder.set_input_embeddings(new)
        return encoder_embeddings

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Decoder inputs for teacher forcing (`shift_tokens_right`). Raises `ValueError` without a
        `decoder_start_token_id` or a `pad_token_id` (`decoder_start_and_pad`)."""
        start, pad = decoder_start_and_pad(self.config, self.generation_config, labels)
        return shift_tokens_right(labels, pad, start)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        Args:
            input_ids (`torch.LongTensor` of shape `(B, S)`): source token ids (or `inputs_embeds` (B, S, H)).
            attention_mask, token_type_ids (`torch.Tensor` of shape `(B, S)`, *optional*): the source's.
            decoder_input_ids (`torch.LongTensor` of shape `(B, T)`, *optional*): built from `labels` (shifted right
                behind `decoder_start_token_id`) when omitted.
            decoder_attention_mask (`torch.Tensor` of shape `(B, T)`, *optional*): built with them as
                `EncoderDecoderModel` builds it: 0 where the decoder input is `pad_token_id`.
            encoder_outputs (`BaseModelOutput` or tuple, *optional*): a precomputed encoder output (generation).
            past_key_values / cache (`EncoderDecoderCache`, *optional*): the decoder's cache.
            labels (`torch.LongTensor` of shape `(B, T)`, *optional*): target ids, -100 where no loss is taken.

        Returns:
            `Seq2SeqLMOutput`: `logits` (B, T, V), `loss` (float32 cross-entropy) with `labels`, the cache, and on
            request the decoder's and encoder's hidden states and attentions.

        Raises:
            TypeError, ValueError: as `SeqBertModel.forward` and `SeqBertDecoder.forward`; labels not integer
                `(B, T)` like the decoder inputs, or out of range; neither labels nor decoder inputs; labels without
                decoder inputs and no `decoder_start_token_id` or `pad_token_id`.
        """
        reads = DeferredReads()  # one host read per step: the encoder's, or the decoder's where no encoder runs
        check_seq2seq_labels(self.config, labels, decoder_input_ids, decoder_inputs_embeds, reads.checks)
        if labels is not None:
            labels, use_cache = labels.long(), False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
                if decoder_attention_mask is None:  # EncoderDecoderModel's rule: no attention to a pad-token input
                    decoder_attention_mask = (decoder_input_ids != self.config.pad_token_id).long()
        if encoder_outputs is None:
            # The decoder's checks and mask flags join the labels' in the encoder's read (the decoder reads nothing).
            plan_decoder_reads(
                self.config, reads, decoder_input_ids, decoder_attention_mask, attention_mask, None, None, True
            )
            encoder_outputs = self.seqbert(
                input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                inputs_embeds=inputs_embeds,
                return_dict=True,
                deferred_reads=reads,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, ModelOutput):  # a tuple, as with return_dict=False
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=cross_attention_states(self.config, encoder_outputs),
            encoder_attention_mask=attention_mask,
            cache=either_cache(past_key_values, cache),
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            deferred_reads=reads,
            **kwargs,
        )
        logits = self.lm_head(decoder_outputs.last_hidden_state)  # (B, T, V)
        loss = self.head_loss(logits, labels, **kwargs) if labels is not None else None
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_NAME: getattr(decoder_outputs, CACHE_NAME)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# Saving any of these models copies this file (and the files it imports) into the folder and writes the full
# `auto_map` (see `SeqBertConfig.save_pretrained`), so `trust_remote_code=True` users need no seqbert install.
SeqBertModel.register_for_auto_class("AutoModel")
SeqBertForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")
SeqBertForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
SeqBertForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
SeqBertForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")
SeqBertForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")
SeqBertForCausalLM.register_for_auto_class("AutoModelForCausalLM")
SeqBertForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

# PEFT's default adapter targets for "seqbert" (see `peft_integration`), for package and `trust_remote_code` users alike.
register_peft_target_modules_on_import()

__all__ = [
    "SeqBertPreTrainedModel",
    "SeqBertModel",
    "SeqBertForMaskedLM",
    "SeqBertForSequenceClassification",
    "SeqBertForTokenClassification",
    "SeqBertForQuestionAnswering",
    "SeqBertForMultipleChoice",
    "SeqBertForCausalLM",
    "SeqBertForConditionalGeneration",
    "eager_attention_forward",
    "sinusoidal_position_embedding",
    "sinusoidal_position_table",
]
