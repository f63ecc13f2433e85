"""Static shapes for CUDA graphs: `StaticShapeCollator`, the data collator whose batches a SeqBERT forward and backward
run without reading the host, in a few fixed shapes, so that `torch.compile(mode="reduce-overhead")` captures them in
CUDA graphs, one per shape.

**Why.** On a GPU, a SeqBERT step at fine-tuning sizes waits on the host: as issue 57 reported it from one H100
(2026-11-28), a bf16 forward at batch 32 kept the GPU busy 0.98 ms of its 5.78 ms, and a training step took about 40 ms
for well under 1 ms of arithmetic. The way out is MLPerf BERT's (NVIDIA's MLPerf training implementation: packed
sequences at fixed tensor sizes, `cu_seqlens` padded with empty sequences, the attention's `max_s` fixed, the whole
iteration captured in CUDA graphs, one per shape bucket). A CUDA graph replays fixed kernels on fixed buffers, so the
step may neither read the device from the host (a sync) nor change shape with the data: everything the forward read
from the device (where the real tokens are, how many, the longest sequence, the input checks) is computed here, on
the CPU, before the batch reaches the device, and every shape comes from a short ladder.

**The batch** is the padded batch of its examples, as the task's transformers collator builds it
(`DataCollatorWithPadding`, `DataCollatorForTokenClassification`, `DataCollatorForMultipleChoice`,
`DataCollatorForLanguageModeling`), padded to `max_length` (its `pad_to_multiple_of`): `input_ids` (B, L),
`attention_mask`, `token_type_ids` and the labels exactly as there, one row per example, so that `Trainer` (its batch
size, metrics, gathers across processes) and every other consumer see a padded batch. Beside them it carries its
layout, computed here (`static_layout`): the real tokens in order, rounded up to a bucket's token count T with filler
tokens (filler sequences of at most `max_length` tokens, which attend only to themselves and reach no output), in
`indices` (T,) int64, each token's flat position `b * L + l` (B x L for a filler token, one past the grid);
`cu_seqlens` (S + 1,) int32 offsets of the real sequences, then the filler sequences, then empty ones (an offset
repeated) up to the bucket's S; and `max_seqlen`, the bucket's `max_length` (a bound the attention kernel trusts).
`static_layout=True` tells the model that all of it holds and was checked. The model computes on the T tokens of the
layout and pads its outputs back to (B, L) once: every head answers as on the padded batch, and filler takes part in
no output and no loss. Masked LM with sparse prediction gathers `max_predictions` rows (a bound on the labelled
positions, given with the batch) where the model is compiled, and exactly the labelled rows eagerly (see below).

**Checked, not trusted.** Run eagerly, the model checks a static batch's layout against its attention mask in its one
host read (`StaticLayoutMatches`: right padding, `indices`, `cu_seqlens`, `max_seqlen` at least the longest sequence,
`max_predictions` at least the labelled positions), and names the field and the values where a hand-built batch is
wrong; `validate_static_layout=False` skips that. Compiled (CUDA graphs), it reads nothing: the collator computed the
layout. So a compiled masked LM with sparse prediction returns `max_predictions` rows, the first M those of the
labelled positions, and `copied_logits` (which `Trainer` needs there anyway) keeps those M for the metrics, which
then line up with `labels[labels != -100]` as on any other batch; eagerly the model returns the M rows itself.

**Padding side.** A static batch is right-padded (the pooler reads column 0, and question answering's span ends at the
longest row): the collator pads on the right whatever the tokenizer's `padding_side` (it pads with a right-padding
copy of a left-padding tokenizer), and refuses examples that come padded on the left, in one line.

**The ladder.** A bucket is chosen for each batch as the smallest that holds it. Its sizes trade memory and filler
against the number of graphs: each distinct shape is one more compilation and one more recorded CUDA graph (capture
time, and graph memory that `torch.compile`'s CUDA graph trees share within one pool), while each size step wastes up
to (growth - 1) / growth of the step's arithmetic on filler. Token counts grow geometrically, by `growth` (1.25 by
default: at most 20 % filler, about 10 % on average), rounded up to multiples of 64 (tensor-core tiles, and no
distinct shape for a few tokens more), from 64 to `sequences x max_length`; an epoch of fine-tuning data at a fixed
batch size visits a handful of them (its token counts cluster around the mean). The number of sequence slots is the
batch size rounded up (to a multiple of `batch_size`, or to a power of two from 8), plus enough filler sequences for
the largest fill a bucket can need. Those choices are our own. A batch's shapes are then its bucket's (T, S) and its
(B, L): B changes only for an epoch's last, smaller batch.

**Beyond the ladder.** A sequence longer than `max_length` fits no bucket. Such a batch is laid out as usual (padded
to its longest by the transformers collator of its task) and marked `static_layout=False`: the model runs it eagerly,
outside any compiled graph, so no graph is recorded for it and none replays a stale `max_seqlen`. The collator warns
once.

Not copied into saved model folders (the model needs none of it): it depends on transformers' collators.
"""

import copy
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForMultipleChoice,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerBase,
)

from .configuration_seqbert import SeqBertConfig
from .input_checks import (
    IGNORE_INDEX,
    check_answer_positions,
    check_encoder_inputs,
    check_labels,
    check_sequence_classification_labels,
    read_on_host,
)


# The tasks the collator lays labels out for, by the SeqBERT class that trains on them.
TASKS = {
    "SeqBertModel": "encoder",
    "SeqBertForSequenceClassification": "sequence-classification",
    "SeqBertForTokenClassification": "token-classification",
    "SeqBertForQuestionAnswering": "question-answering",
    "SeqBertForMultipleChoice": "multiple-choice",
    "SeqBertForMaskedLM": "masked-lm",
}
TOKEN_MULTIPLE = 64
FIRST_SEQUENCES = 8


def training_arguments() -> dict:
    """
    What the route asks of `TrainingArguments`, besides `data_collator=StaticShapeCollator(...)`, as a new dict on
    every call (nothing shared that one caller could change for another): `TrainingArguments(out,
    **training_arguments(), ...)`.

    CUDA graphs through the compile flags, and none of the host syncs `Trainer` itself adds to every step (counted by
    the CUDA dry run on transformers 5.24: 2 reads of the loss, `torch.isnan(loss) or torch.isinf(loss)`, under
    `logging_nan_inf_filter`; one blocking copy per input tensor, which waits for the GPU to finish the step before,
    unless accelerate copies without blocking, from the pinned memory `Trainer`'s data loader uses by default). A
    logging step still reads the loss once (`logging_steps`). `Trainer` also needs
    `preprocess_logits_for_metrics=copied_logits` where it evaluates a compiled model (`evaluate` or `predict` before
    `train`: during training it evaluates the model uncompiled).

    Returns:
        `dict`: `torch_compile=True`, `torch_compile_mode="reduce-overhead"`, `logging_nan_inf_filter=False`,
        `accelerator_config={"non_blocking": True}`.
    """
    return {
        "torch_compile": True,
        "torch_compile_mode": "reduce-overhead",
        "logging_nan_inf_filter": False,
        "accelerator_config": {"non_blocking": True},
    }


def __getattr__(name: str):
    """`TRAINING_ARGUMENTS`, the name of earlier releases: `training_arguments()`, a new dict on every access."""
    if name == "TRAINING_ARGUMENTS":
        return training_arguments()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Bucket:
    """
    One static shape.

    Attributes:
        tokens (`int`): T, the row's length.
        sequences (`int`): S, the sequence slots (`cu_seq_lens_q` holds S + 1 offsets), real, filler and empty.
        max_length (`int`): the `max_length_q` every batch of the bucket states: a bound on its longest sequence.
        predictions (`int`, *optional*): masked LM's `max_predictions`, a bound on the labelled positions.
    """

    tokens: int
    sequences: int
    max_length: int
    predictions: int | None = None


def token_ladder(max_tokens: int, growth: float = 1.25, multiple: int = TOKEN_MULTIPLE) -> list[int]:
    """
    Token counts from `multiple` to at least `max_tokens`, each `growth` times the last, rounded up to a multiple of
    `multiple` (see the module docstring for why).

    Raises:
        ValueError: `growth` <= 1, or `max_tokens` or `multiple` < 1.
    """
    if not growth > 1.0:
        raise ValueError(f"growth ({growth}) must be > 1: each token count of the ladder exceeds the last")
    if max_tokens < 1 or multiple < 1:
        raise ValueError(f"max_tokens ({max_tokens}) and multiple ({multiple}) must be at least 1")
    sizes = [multiple]
    while sizes[-1] < max_tokens:
        sizes.append(max(sizes[-1] + multiple, math.ceil(sizes[-1] * growth / multiple) * multiple))
    return sizes


class StaticShapeCollator:
    """
    A data collator for `Trainer` (`data_collator=`) whose batches a SeqBERT model runs with no host read and in a
    few fixed shapes, so that `TrainingArguments(torch_compile=True, torch_compile_mode="reduce-overhead")` (or
    `torch.compile(model, mode="reduce-overhead")` for inference) captures forward and backward in CUDA graphs, one
    per shape. Each batch is the padded batch of its examples (one row per example, padded to `max_length`) with its
    layout computed on the CPU: see the module docstring for the batch, the ladder and what happens beyond it.

    Args:
        tokenizer (`PreTrainedTokenizerBase`): the examples' tokenizer (its pad id pads; masked LM masks with it).
            The batches are padded on the right whatever its `padding_side` (a left-padding tokenizer is copied with
            `padding_side="right"`; the one given is left as it was).
        model (`SeqBertPreTrainedModel` or `SeqBertConfig`): the model the batches are for (a PEFT or compiled wrapper
            of one is fine): its class decides the task's collator, its config bounds the values checked. It is read,
            never changed. A config alone lays out no labels (an encoder's inputs).
        max_length (`int`, *optional*): the width L every batch is padded to, and the longest sequence a bucket holds;
            defaults to the tokenizer's `model_max_length` capped at `max_position_embeddings`. Pass the length you
            truncate to.
        batch_size (`int`, *optional*): the examples per batch (`per_device_train_batch_size`); the sequence slots
            are a multiple of it. None: a power of two from 8.
        growth (`float`): the ratio of consecutive token counts of the ladder (> 1).
        mlm_probability (`float`): masked LM only, where the examples carry no labels: the share of tokens masked,
            by transformers' `DataCollatorForLanguageModeling`.
        prediction_headroom (`float`): masked LM: `max_predictions` is this times `mlm_probability` times the
            bucket's tokens, rounded up to a multiple of 8 (a batch with more labelled tokens takes a larger bucket).

    Features are dicts as a tokenizer returns them (`input_ids`, optional `attention_mask` and `token_type_ids`; padded
    or not, at most `max_length` long) with the task's labels, as the task's transformers collator takes them: `label`
    / `labels` (an int, a float, or a list of 0/1 or floats for multi-label) for sequence classification, `labels` a
    list per token for token classification and masked LM, `start_positions` / `end_positions` for question
    answering, and for multiple choice `input_ids` a list of choices and `label` / `labels` the right one.

    Raises (on construction):
        TypeError: `model` is neither a SeqBERT model nor a `SeqBertConfig`.
        ValueError: `max_length` < 1 or beyond `max_position_embeddings` (learned positions), `batch_size` < 1,
            `growth` <= 1, `mlm_probability` outside (0, 1], `prediction_headroom` < 1.
    Raises (on a call): the errors the model's forward would raise for the same values (ids outside the vocabulary,
        labels outside `num_labels`, ...), named as the forward names them; `ValueError` for an empty batch, an
        example without a real token, or an example that came padded on the left.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        model,
        max_length: int | None = None,
        batch_size: int | None = None,
        growth: float = 1.25,
        mlm_probability: float = 0.15,
        prediction_headroom: float = 1.5,
    ):
        if getattr(tokenizer, "padding_side", "right") != "right":
            # A static batch is right-padded (the pooler reads column 0, a span ends at the longest row): a copy of
            # the tokenizer pads the examples on the right for the task's collator; the caller's is left as it was.
            tokenizer = copy.copy(tokenizer)
            tokenizer.padding_side = "right"
        self.tokenizer = tokenizer
        self.config, self.task = _config_and_task(model)
        limit = self.config.max_position_embeddings
        learned = self.config.position_embedding_type == "learned"
        if max_length is None:
            max_length = min(getattr(tokenizer, "model_max_length", limit) or limit, limit)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {max_length!r}")
        if learned and max_length > limit:
            raise ValueError(
                f"max_length ({max_length}) exceeds max_position_embeddings ({limit}): every position of the padded "
                "batch must have a position embedding"
            )
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be None or an int >= 1, got {batch_size!r}")
        if not 0.0 < mlm_probability <= 1.0:
            raise ValueError(f"mlm_probability ({mlm_probability}) must lie in (0, 1]")
        if prediction_headroom < 1.0:
            raise ValueError(f"prediction_headroom ({prediction_headroom}) must be at least 1")
        token_ladder(1, growth)  # raises on a bad growth
        self.max_length, self.batch_size, self.growth = max_length, batch_size, growth
        self.mlm_probability, self.prediction_headroom = mlm_probability, prediction_headroom
        self.beyond_ladder = 0  # batches that fit no bucket (laid out as usual, run eagerly)

    # ------------------------------------------------------------------------------------------------------------------
    # The ladder
    # ------------------------------------------------------------------------------------------------------------------

    def sequence_slots(self, num_sequences: int) -> int:
        """The real sequence slots of a batch of `num_sequences` (before filler): a multiple of `batch_size`, or a
        power of two from 8."""
        if self.batch_size is not None:
            return self.batch_size * math.ceil(num_sequences / self.batch_size)
        return max(FIRST_SEQUENCES, 1 << (num_sequences - 1).bit_length())

    def ladder(self, num_sequences: int, group: int = 1) -> list[Bucket]:
        """
        The buckets of batches of `num_sequences` sequences (rounded up as `sequence_slots` does, in groups of
        `group`: multiple choice's choices of one question), smallest first: one per token count of `token_ladder` up
        to `slots x max_length`, each with room for the filler sequences its largest fill needs.
        """
        slots = self.sequence_slots(math.ceil(num_sequences / group)) * group
        sizes = token_ladder(slots * self.max_length, self.growth)
        buckets, previous = [], 0
        for tokens in sizes:
            # The fill is below tokens - previous where the token count alone chose the bucket; masked LM may take a
            # larger bucket for its predictions, filled up to all but one token.
            fill = tokens if self.task == "masked-lm" else tokens - previous
            predictions = None
            if self.task == "masked-lm":
                predictions = min(tokens, math.ceil(self.prediction_headroom * self.mlm_probability * tokens / 8) * 8)
                predictions = tokens if tokens == sizes[-1] else predictions
            buckets.append(Bucket(tokens, slots + math.ceil(fill / self.max_length), self.max_length, predictions))
            previous = tokens
        return buckets

    def bucket(self, lengths: Sequence[int], predictions: int = 0, group: int = 1) -> Bucket | None:
        """The smallest bucket that holds sequences of `lengths` (and `predictions` labelled positions, masked LM),
        or None where none does (a sequence longer than `max_length`)."""
        if max(lengths) > self.max_length:
            return None
        total = sum(lengths)
        for bucket in self.ladder(len(lengths), group):
            filler = math.ceil((bucket.tokens - total) / self.max_length)
            if total > bucket.tokens or len(lengths) + filler > bucket.sequences:
                continue
            if bucket.predictions is None or predictions <= bucket.predictions:
                return bucket
        return None

    # ------------------------------------------------------------------------------------------------------------------
    # Batches
    # ------------------------------------------------------------------------------------------------------------------

    def __call__(self, features: list[Mapping]) -> dict:
        """
        Args:
            features (`list[Mapping]`): the examples (see the class docstring).

        Returns:
            `dict`: the padded batch of the task's transformers collator, padded to `max_length`, with its layout and
            `static_layout=True` (see the module docstring); where no bucket holds the examples, the usual padded
            batch (to its longest) with `static_layout=False`.
        """
        if not features:
            raise ValueError("StaticShapeCollator received an empty batch: no example to lay out")
        group = len(features[0]["input_ids"]) if self.task == "multiple-choice" else 1
        widths = [len(feature["input_ids"]) for feature in features]
        if group > 1:
            widths = [len(choice) for feature in features for choice in feature["input_ids"]]
        if max(widths) > self.max_length:
            return self._beyond_ladder(features, max(widths))
        batch = dict(self._collator(pad_to_multiple_of=self.max_length)(features))
        if "attention_mask" not in batch:  # a tokenizer without attention masks: every id is a token
            batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        mask = batch["attention_mask"].reshape(-1, self.max_length)  # (B * num_choices, L)
        _check_right_padded(mask, group)
        lengths = mask.count_nonzero(dim=1).tolist()
        if min(lengths) == 0:
            raise ValueError("StaticShapeCollator received an example without tokens (no real token in input_ids)")
        predictions = int((batch["labels"] != IGNORE_INDEX).sum()) if self.task == "masked-lm" else 0
        bucket = self.bucket(lengths, predictions, group)
        self._check(batch)
        batch.update(static_layout(mask, bucket))
        if self.task == "masked-lm":
            batch["max_predictions"] = bucket.predictions
        return batch

    def _collator(self, pad_to_multiple_of: int | None = None):
        """The task's transformers collator (`pad_to_multiple_of=max_length` pads every batch to `max_length`)."""
        if self.task == "token-classification":
            return DataCollatorForTokenClassification(self.tokenizer, pad_to_multiple_of=pad_to_multiple_of)
        if self.task == "multiple-choice":
            return DataCollatorForMultipleChoice(self.tokenizer, pad_to_multiple_of=pad_to_multiple_of)
        if self.task == "masked-lm":
            return _MaskedLanguageModeling(self, pad_to_multiple_of)
        return DataCollatorWithPadding(self.tokenizer, pad_to_multiple_of=pad_to_multiple_of)

    def _check(self, batch: dict) -> None:
        """The checks the model's forward would read on the device, here on the CPU: the same errors, named as the
        forward names them."""
        checks, config = [], self.config
        input_ids = batch["input_ids"].reshape(-1, self.max_length)
        token_type_ids = batch.get("token_type_ids")
        token_type_ids = None if token_type_ids is None else token_type_ids.reshape(-1, self.max_length)
        mask = batch["attention_mask"].reshape(-1, self.max_length)
        check_encoder_inputs(config, input_ids, mask, token_type_ids, None, None, checks)
        labels = batch.get("labels")
        if self.task in ("token-classification", "masked-lm") and labels is not None:
            classes = (
                (config.num_labels, "num_labels")
                if self.task == "token-classification"
                else (config.vocab_size, "vocab_size")
            )
            check_labels("labels", labels, (*input_ids.shape, classes[0]), *classes, True, checks)
        elif self.task == "sequence-classification" and labels is not None:
            rows = (input_ids.shape[0], config.num_labels)
            check_sequence_classification_labels(labels, rows, config.problem_type, checks)
        elif self.task == "multiple-choice" and labels is not None:
            questions, choices = batch["input_ids"].shape[:2]
            check_labels("labels", labels, (questions, choices), choices, "num_choices", True, checks)
        elif self.task == "question-answering" and "start_positions" in batch:
            check_answer_positions(batch["start_positions"], batch.get("end_positions"), input_ids.shape[0], checks)
        read_on_host(checks)

    def _beyond_ladder(self, features: list[dict], longest: int) -> dict:
        """The usual padded batch of the task's transformers collator, marked `static_layout=False`; warns once."""
        self.beyond_ladder += 1
        if self.beyond_ladder == 1:
            warnings.warn(
                f"StaticShapeCollator: a batch holds a sequence of {longest} tokens, longer than max_length "
                f"({self.max_length}), so it fits no bucket of the ladder: it is padded as usual and runs eagerly, "
                "outside the compiled CUDA graphs (each such batch; this warning is given once). Pass a max_length "
                "at least your longest sequence, or truncate to it when tokenizing.",
                stacklevel=2,
            )
        return {**self._collator()(features), "static_layout": False}


def _check_right_padded(mask: torch.Tensor, group: int) -> None:
    """Raise where an example came padded on the left (a real token after padding in its attention mask)."""
    after_padding = (mask[:, 1:] > mask[:, :-1]).any(1)  # (R,)
    if after_padding.any():
        example = int(after_padding.nonzero()[0]) // group
        raise ValueError(
            f"StaticShapeCollator received example {example} padded on the left (its attention_mask has a real token "
            "after padding): a static batch is right-padded, and the collator pads on the right itself whatever the "
            "tokenizer's padding_side; tokenize without padding, or with padding_side='right'"
        )


class _MaskedLanguageModeling:
    """Masked LM's padded batch: transformers' `DataCollatorForLanguageModeling` (it masks) where the examples carry
    no labels, `DataCollatorForTokenClassification` (labels padded with -100) where they do."""

    def __init__(self, collator: StaticShapeCollator, pad_to_multiple_of: int | None):
        tokenizer = collator.tokenizer
        self.masking = DataCollatorForLanguageModeling(
            tokenizer, mlm_probability=collator.mlm_probability, pad_to_multiple_of=pad_to_multiple_of
        )
        self.labelled = DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to_multiple_of)

    def __call__(self, features: list[Mapping]) -> dict:
        return (self.labelled if "labels" in features[0] else self.masking)(features)


def static_layout(attention_mask: torch.Tensor, bucket: Bucket) -> dict:
    """
    The layout of a padded batch in `bucket`, computed on the CPU (see the module docstring): the real tokens in
    order, then filler tokens up to the bucket's token count, in sequences of at most `max_length`, then empty
    sequences up to its sequence slots.

    Args:
        attention_mask (`torch.Tensor` of shape `(R, L)`): the padded batch's rows (multiple choice: every choice a
            row), 1 for a real token.
        bucket (`Bucket`): a bucket that holds the rows' sequences (`StaticShapeCollator.bucket`).

    Returns:
        `dict`: `indices` (T,) int64, `cu_seqlens` (S + 1,) int32, `max_seqlen` (int) and `static_layout=True`.
    """
    real = attention_mask.reshape(-1).nonzero().squeeze(1)  # (T_real,): flat positions of the real tokens, in order
    lengths = attention_mask.count_nonzero(dim=1).tolist()
    fill = bucket.tokens - real.numel()
    filler = [bucket.max_length] * (fill // bucket.max_length) + (
        [fill % bucket.max_length] if fill % bucket.max_length else []
    )
    offsets = [0]
    for length in [*lengths, *filler]:
        offsets.append(offsets[-1] + length)
    offsets += [bucket.tokens] * (bucket.sequences + 1 - len(offsets))
    outside = torch.full((fill,), attention_mask.numel(), dtype=torch.long)  # one past the grid
    return {
        "indices": torch.cat([real, outside]),
        "cu_seqlens": torch.tensor(offsets, dtype=torch.int32),
        "max_seqlen": bucket.max_length,
        "static_layout": True,
    }


def copied_logits(logits, labels):
    """
    `Trainer(preprocess_logits_for_metrics=copied_logits)`, for `evaluate` and `predict` under CUDA graphs: a copy of
    each batch's logits. A CUDA graph's outputs live in its own buffers, which its next replay overwrites (torch raises
    when such an output is read afterwards), and `Trainer` keeps each batch's logits as the model returned them until
    it concatenates the next batch's.

    Masked LM with sparse prediction (`logits` (P, V) beside `labels` (B, L)) keeps the first M rows, M the labelled
    positions: a compiled static batch gives `max_predictions` rows (`labelled_rows`), and the first M line up with
    `labels[labels != -100]`, as the M rows of any other batch do (one host read per batch, in evaluation only).

    Args:
        logits (`torch.Tensor` or a tuple of them): what `Trainer.prediction_step` took from the model's output.
        labels (`torch.Tensor`, *optional*): the batch's labels.

    Returns:
        The same structure, every tensor copied.
    """
    copied = torch.utils._pytree.tree_map(lambda value: value.clone() if torch.is_tensor(value) else value, logits)
    sparse = torch.is_tensor(copied) and torch.is_tensor(labels) and copied.dim() == labels.dim() == 2
    if sparse and copied.shape != labels.shape:  # (P, V) rows of labelled positions beside (B, L) labels
        return copied[: int((labels != IGNORE_INDEX).sum())]
    return copied


def _config_and_task(model) -> tuple[SeqBertConfig, str]:
    """The config and the task (`TASKS`) of a SeqBERT model or a subclass of one (by the first SeqBERT class of its
    MRO, by name, so that a class loaded from a saved folder with `trust_remote_code` counts too), unwrapped from PEFT,
    `torch.compile` and DDP wrappers; a bare config is the encoder's."""
    if getattr(model, "model_type", None) == SeqBertConfig.model_type:
        return model, "encoder"
    for _ in range(8):
        # By the SeqBERT class the model's class is or derives from: a user's subclass trains on its head's task.
        task = next((TASKS[cls.__name__] for cls in type(model).__mro__ if cls.__name__ in TASKS), None)
        if task is not None:
            return model.config, task
        inner = None
        if hasattr(model, "get_base_model"):
            inner = model.get_base_model()
        inner = (
            inner
            if inner is not None and inner is not model
            else getattr(model, "_orig_mod", getattr(model, "module", None))
        )
        if inner is None:
            break
        model = inner
    raise TypeError(
        f"model must be a SeqBERT model ({', '.join(TASKS)}) or a SeqBertConfig, got {type(model).__name__}"
    )


__all__ = [
    "Bucket",
    "StaticShapeCollator",
    "copied_logits",
    "static_layout",
    "token_ladder",
    "training_arguments",
]
