"""Checks of the decoders' arguments (`SeqBertDecoder`, the causal LM and the seq2seq model) and of `generate`: a bad
argument raises `ValueError` or `TypeError` naming it, never an error from deep inside transformers or torch. The
decoder's value checks and whether its masks have padding are read on the host in one read (`read_decoder_inputs`).

Imported relatively by `modeling_seqbert.py`, so it is copied into saved model folders and depends only on torch and
transformers.
"""

import copy

import torch
from transformers.generation import GenerationConfig

from .configuration_seqbert import SeqBertConfig
from .input_checks import (
    IGNORE_INDEX,
    DeferredReads,
    IdsInRange,
    _check_ids_or_embeds,
    check_shape,
    check_tensor,
    eager_execution,
    read_on_host,
)


# How SeqBertDecoder's arguments are named in messages: as SeqBertForConditionalGeneration.forward calls them (with
# cross-attention), or as SeqBertForCausalLM.forward does (without).
DECODER_ARGUMENT_NAMES = {
    True: dict(
        ids="decoder_input_ids", embeds="decoder_inputs_embeds", mask="decoder_attention_mask", length="target_length"
    ),
    False: dict(ids="input_ids", embeds="inputs_embeds", mask="attention_mask", length="sequence_length"),
}


def check_decoder_inputs(
    config: SeqBertConfig,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    encoder_hidden_states: torch.Tensor | None,
    encoder_attention_mask: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    past_length: int,
    cross_attention: bool,
) -> None:
    """The checks of `SeqBertDecoder.forward`, naming the arguments as the model that calls it does
    (`DECODER_ARGUMENT_NAMES`); `encoder_hidden_states` are required with `cross_attention`."""
    names = DECODER_ARGUMENT_NAMES[cross_attention]
    batch_size, seq_len, name = _check_ids_or_embeds(
        config, input_ids, inputs_embeds, names["ids"], names["embeds"], names["length"]
    )
    total = past_length + seq_len
    learned = config.position_embedding_type == "learned"
    if position_ids is not None:
        check_tensor("position_ids", position_ids, "integer", (2,), f"(batch_size, {names['length']})")
        check_shape("position_ids", position_ids, (batch_size, seq_len), f"like {name}", broadcast=True)
    elif learned and total > config.max_position_embeddings:
        raise ValueError(
            f"the decoder reached position {total - 1} ({past_length} cached + {seq_len} new tokens), but the learned "
            f"position embeddings cover max_position_embeddings={config.max_position_embeddings} positions: shorten "
            f"the {names['length'].replace('_', ' ')} (or max_length / max_new_tokens of generate)"
        )
    if token_type_ids is not None:
        check_tensor("token_type_ids", token_type_ids, "integer", (2,), f"(batch_size, {names['length']})")
        check_shape("token_type_ids", token_type_ids, (batch_size, seq_len), f"like {name}", broadcast=True)
    if attention_mask is not None:
        meaning = f"(batch_size, past + {names['length']})"
        check_tensor(names["mask"], attention_mask, "any", (2, 4), meaning)
        if attention_mask.dim() == 2:
            check_shape(names["mask"], attention_mask, (batch_size, total), meaning)
        elif attention_mask.shape[-1] < total:
            raise ValueError(
                f"{names['mask']} is a prepared 4D mask over {attention_mask.shape[-1]} key positions, but the decoder "
                f"attends to {total} ({past_length} cached + {seq_len} new)"
            )
        else:
            expected = (batch_size, 1, seq_len, attention_mask.shape[-1])
            check_shape(names["mask"], attention_mask, expected, "(4D mask)", broadcast=True)
    if cross_attention:
        if encoder_hidden_states is None:
            raise ValueError("the decoder needs encoder_hidden_states (encoder_outputs): it attends to the source")
        meaning = "(batch_size, source_length, H), or (batch_size, num_decoder_layers, source_length, H)"
        check_tensor("encoder_hidden_states", encoder_hidden_states, "float", (3, 4), meaning)
        source_length = encoder_hidden_states.shape[-2]
        layers = (config.num_decoder_layers,) if encoder_hidden_states.dim() == 4 else ()
        check_shape(
            "encoder_hidden_states",
            encoder_hidden_states,
            (batch_size, *layers, source_length, config.hidden_size),
            f"(the {name} batch size, {'num_decoder_layers, ' if layers else ''}source_length, hidden_size)",
        )
        if encoder_attention_mask is not None:
            check_tensor("attention_mask", encoder_attention_mask, "any", (2,), "(batch_size, source_length)")
            check_shape("attention_mask", encoder_attention_mask, (batch_size, source_length), "like the source")


# The scalars `plan_decoder_reads` adds: whether the decoder's own 2-D mask, and the source's, mark every position real.
MASK_ALL_REAL = "decoder attention_mask all real"
SOURCE_MASK_ALL_REAL = "encoder attention_mask all real"


def plan_decoder_reads(
    config: SeqBertConfig,
    reads: DeferredReads,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    encoder_attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    cross_attention: bool,
) -> None:
    """
    Add to `reads` what `SeqBertDecoder.forward` reads on the host: the value checks of its ids, positions and segment
    ids (named as the calling model names them, `DECODER_ARGUMENT_NAMES`), and whether its 2-D attention mask and,
    with cross-attention, the source's 2-D mask are all real tokens (`MASK_ALL_REAL`, `SOURCE_MASK_ALL_REAL`; eager
    execution only). The decoder reads them in one host read with its caller's checks, or
    `SeqBertForConditionalGeneration` has the encoder read them with its own: one read per training or generation
    step. The types of the tensors read are checked first, so that a wrong one raises naming it.

    Raises:
        TypeError, ValueError: an id tensor that is not integer, or a tensor with the wrong number of dimensions.
    """
    names = DECODER_ARGUMENT_NAMES[cross_attention]
    length = f"(batch_size, {names['length']})"
    if input_ids is not None:
        check_tensor(names["ids"], input_ids, "integer", (2,), length)
        reads.checks.append(IdsInRange(names["ids"], input_ids, config.vocab_size, "vocab_size"))
    if position_ids is not None:
        check_tensor("position_ids", position_ids, "integer", (2,), length)
        limit = config.max_position_embeddings if config.position_embedding_type == "learned" else None
        reads.checks.append(IdsInRange("position_ids", position_ids, limit, "max_position_embeddings"))
    if token_type_ids is not None:
        check_tensor("token_type_ids", token_type_ids, "integer", (2,), length)
        types = max(config.type_vocab_size, 1)
        reads.checks.append(IdsInRange("token_type_ids", token_type_ids, types, "type_vocab_size"))
    if not eager_execution():
        return
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        reads.add_scalar(MASK_ALL_REAL, attention_mask.all())
    if cross_attention and isinstance(encoder_attention_mask, torch.Tensor) and encoder_attention_mask.dim() == 2:
        reads.add_scalar(SOURCE_MASK_ALL_REAL, encoder_attention_mask.all())


# Generation settings that transformers' `generate` uses without checking: counts below their minimum end in a
# ZeroDivisionError or a tensor of negative size, token ids outside the vocabulary in an IndexError deep inside a
# logits processor, or (`pad_token_id`) in sequences that hold ids the model does not have.
GENERATE_MINIMUMS = {"num_beams": 1, "num_return_sequences": 1, "num_beam_groups": 1, "top_k": 0}
# transformers' convention for "no such token": a negative `eos_token_id` never matches (generation runs to the
# maximum length; `generate` warns "`eos_token_id` should consist of positive integers"), a negative `pad_token_id`
# is never written while no sequence ends early (`GenerationConfig.validate` warns about it), and a negative
# `bos_token_id` is never read while a prompt is given. transformers' own generation tests use `-1` for the first two.
# The other ids are indices into the scores or the embedding, where -1 would silently mean the last token.
GENERATE_OPTIONAL_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")
GENERATE_TOKEN_IDS = (
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
    "begin_suppress_tokens",
    "bad_words_ids",
)


def check_generate_arguments(config: SeqBertConfig, default: GenerationConfig, args: tuple, kwargs: dict) -> None:
    """
    The checks of `generate` (its `args` and `kwargs` as given) that transformers leaves out: the prompt / source
    `inputs` (`input_ids`) must not be empty, and the generation settings in force (`generation_config`, else the
    model's `default`, updated by `kwargs`, as `generate` merges them) must have counts of at least
    `GENERATE_MINIMUMS` and token ids (`GENERATE_TOKEN_IDS`, single ids or nested lists) in `[0, vocab_size)`;
    `pad_token_id`, `bos_token_id` and `eos_token_id` may also be negative, transformers' "no such token"
    (`GENERATE_OPTIONAL_TOKEN_IDS`), which it warns about and this accepts.

    Raises:
        ValueError: the inputs have an empty dimension; a count is below its minimum; a token id lies outside the
            vocabulary (the message names the setting, its value and the allowed range).
        TypeError: a count or token id is not an int.
    """
    inputs = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
    if isinstance(inputs, torch.Tensor) and 0 in inputs.shape:
        raise ValueError(
            f"input_ids has shape {tuple(inputs.shape)}: generate needs at least one sequence of at least one token "
            "(a causal LM given no input_ids starts from bos_token_id)"
        )
    given = args[1] if len(args) > 1 else kwargs.get("generation_config")
    settings = copy.deepcopy(given if given is not None else default)
    settings.update(**{name: value for name, value in kwargs.items() if hasattr(settings, name)})
    for name, minimum in GENERATE_MINIMUMS.items():
        value = getattr(settings, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
        if value < minimum:
            raise ValueError(f"{name} ({value}) must be >= {minimum}")
    for name in GENERATE_TOKEN_IDS:
        value = getattr(settings, name, None)
        pending = [value]
        while pending:
            item = pending.pop()
            if item is None:
                continue
            if isinstance(item, (list, tuple)):
                pending.extend(item)
            elif isinstance(item, torch.Tensor):
                pending.extend(item.reshape(-1).tolist())
            elif isinstance(item, bool) or not isinstance(item, int):
                raise TypeError(f"{name} ({value!r}) must hold int token ids, got {item!r}")
            elif item < 0 and name in GENERATE_OPTIONAL_TOKEN_IDS:
                continue  # "no such token" (see GENERATE_OPTIONAL_TOKEN_IDS); transformers warns
            elif not 0 <= item < config.vocab_size:
                allowed = " (or negative: no such token)" if name in GENERATE_OPTIONAL_TOKEN_IDS else ""
                raise ValueError(
                    f"{name} ({value!r}) holds {item}, but token ids must lie in [0, vocab_size={config.vocab_size})"
                    + allowed
                )


def mask_after_read(
    mask: torch.Tensor | None, all_real: int | None, may_drop: bool
) -> tuple[torch.Tensor | None, bool]:
    """
    The 2-D `mask` a decoder hands transformers' mask builder, once its one host read says whether every position is
    real (`all_real`, from `plan_decoder_reads`; None: not read). transformers' builders read the host themselves to
    find out whether a mask can be skipped; after the decoder's read they need not.

    Args:
        mask (`torch.Tensor`, *optional*): the mask as given.
        all_real (`int`, *optional*): whether it marks every position real.
        may_drop (`bool`): whether an all-real mask may be replaced by None (transformers reads given
            `position_ids` for packed rows where no mask is given and no cache: there it stays).

    Returns:
        `(mask, skip_allowed)`: None for an all-real mask that may go (nothing to build, nothing to read), and
        `skip_allowed` False where the builder must build the mask without reading whether it could skip it (its
        `allow_is_causal_skip` / `allow_is_bidirectional_skip`).
    """
    if all_real is None:
        return mask, True
    if all_real and may_drop:
        return None, True
    return mask, False


def read_decoder_inputs(
    config: SeqBertConfig,
    reads: DeferredReads,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    encoder_attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    cross_attention: bool,
    cached: bool,
) -> tuple[torch.Tensor | None, bool, torch.Tensor | None, bool]:
    """
    `SeqBertDecoder`'s one host read: its value checks, a head's (`reads`), and whether its masks have padding
    (`plan_decoder_reads`); or, where `reads.values` is set, the encoder's read of a seq2seq step that planned them.

    Returns:
        `(attention_mask, causal_skip, encoder_attention_mask, source_skip)`: each mask as `mask_after_read` keeps it
        (None where all real, so that none is built and transformers reads nothing to find out).
    """
    if reads.values is None:
        plan_decoder_reads(
            config,
            reads,
            input_ids,
            attention_mask,
            encoder_attention_mask,
            position_ids,
            token_type_ids,
            cross_attention,
        )
        reads.values = read_on_host(reads.checks, reads.scalars) if eager_execution() else None
    # (an all-real mask with given positions stays for training: without it, transformers looks for packed rows)
    attention_mask, causal_skip = mask_after_read(
        attention_mask, reads.value(MASK_ALL_REAL), position_ids is None or cached
    )
    encoder_attention_mask, source_skip = mask_after_read(
        encoder_attention_mask, reads.value(SOURCE_MASK_ALL_REAL), True
    )
    return attention_mask, causal_skip, encoder_attention_mask, source_skip


def check_seq2seq_labels(config: SeqBertConfig, labels, decoder_input_ids, decoder_inputs_embeds, checks: list):
    """
    `SeqBertForConditionalGeneration`'s labels (the value check appended to `checks`, read with the encoder's read).

    Raises:
        TypeError: `labels` are not an integer tensor.
        ValueError: no decoder inputs and no labels; labels shaped unlike the decoder inputs `(B, T)`.
    """
    if labels is not None:
        check_tensor("labels", labels, "integer", (2,), "(batch_size, target_length)")
        checks.append(IdsInRange("labels", labels, config.vocab_size, "vocab_size", ignore_index=True))
    if decoder_input_ids is None and decoder_inputs_embeds is None and labels is None:
        raise ValueError(
            "SeqBertForConditionalGeneration needs decoder inputs: pass labels (teacher forcing builds "
            "decoder_input_ids from them), decoder_input_ids or decoder_inputs_embeds, or call generate()"
        )
    target = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
    if labels is not None and target is not None:
        check_shape("labels", labels, tuple(target.shape[:2]), "like the decoder inputs (batch_size, target_length)")


def decoder_start_and_pad(config: SeqBertConfig, generation_config, labels: torch.Tensor) -> tuple[int, int]:
    """
    The `decoder_start_token_id` (the config's, else the generation config's) and `pad_token_id` that teacher forcing
    builds decoder inputs with (the pad token stands in for -100).

    Raises:
        ValueError: no `decoder_start_token_id` (None or negative), no `pad_token_id`, or a negative one (no pad
            token) while the labels hold -100.
    """
    start = config.decoder_start_token_id
    if start is None:
        start = generation_config.decoder_start_token_id
    pad = config.pad_token_id
    needs_pad = pad is None or (pad < 0 and eager_execution() and bool((labels == IGNORE_INDEX).any()))
    for name, value, missing in (
        ("decoder_start_token_id", start, start is None or start < 0),
        ("pad_token_id", pad, needs_pad),
    ):
        if missing:
            raise ValueError(
                f"config.{name} is {value}, but building decoder_input_ids from labels needs a token id there "
                f"(decoder inputs are the labels shifted right behind decoder_start_token_id, with pad_token_id "
                f"for -100): set config.{name} (for BERT2BERT: the tokenizer's [CLS] / [PAD] id) or pass "
                "decoder_input_ids"
            )
    return start, pad


def check_decoder_only(config: SeqBertConfig) -> None:
    """Raise `ValueError` on a seq2seq config (`is_encoder_decoder`), which `SeqBertForCausalLM` cannot build."""
    if config.is_encoder_decoder:
        raise ValueError(
            "SeqBertForCausalLM is decoder-only, but config.is_encoder_decoder is True: use "
            "SeqBertForConditionalGeneration (AutoModelForSeq2SeqLM) for a seq2seq config"
        )


def check_layer_inputs(layer_inputs: torch.Tensor | None) -> torch.Tensor:
    """An encoder output's `layer_inputs`, which a `cross_attention_source="same_layer"` decoder reads; `ValueError`
    where they are missing."""
    if layer_inputs is None:
        raise ValueError(
            "encoder_outputs has no layer_inputs, but this model's cross_attention_source is 'same_layer': decoder "
            "layer i reads the input of encoder layer i. Pass the whole output of model.get_encoder()(...) "
            "(a SeqBertModelOutput), not only its last_hidden_state"
        )
    return layer_inputs
