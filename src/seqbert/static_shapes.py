"""Static shapes for CUDA graphs: `StaticShapeCollator`, the data collator whose batches a SeqBERT forward and backward
run without reading the host, in a few fixed shapes, so that `torch.compile(mode="reduce-overhead")` captures them in
CUDA graphs, one per shape.

**Why.** On a GPU, a SeqBERT step at fine-tuning sizes waits on the host: as issue 57 reported it from one H100
(2026-11-28), a bf16 forward at batch 32 kept the GPU busy 0.98 ms of its 5.78 ms, and a training step took about 40 ms
for well under 1 ms of arithmetic. The way out is MLPerf BERT's (NVIDIA's MLPerf training implementation: packed sequences at fixed tensor
sizes, `cu_seqlens` padded with empty sequences, the attention's `max_s` fixed, labels of padding ignored, the whole
iteration captured in CUDA graphs, one per shape bucket). A CUDA graph replays fixed kernels on fixed buffers, so the
step may neither read the device from the host (a sync) nor change shape with the data: everything the forward read
from the device (where the real tokens are, how many, the longest sequence, the input checks) is computed here, on
the CPU, before the batch reaches the device, and every shape comes from a short ladder.

**The batch.** The examples are flattened into one row, as transformers' `DataCollatorWithFlattening` does (which
builds the row here): `input_ids` (1, T) with `position_ids` restarting at 0 for every sequence, `cu_seq_lens_q` /
`cu_seq_lens_k` (S + 1 int32 offsets) and `max_length_q` / `max_length_k` (an int). Then it is rounded up to its
bucket (`Bucket`): T to the bucket's token count, the rest filled with filler sequences (the tokenizer's pad id, each
at most `max_length` long, labels ignored); S to the bucket's number of sequences with empty ones (an offset
repeated); `max_length_q` to the bucket's `max_length` (a bound the kernel trusts: at least the longest sequence).
`static_layout=True` tells the model that all of it holds and was checked. The heads answer per sequence slot:
sequence classification and multiple choice pool each sequence's first token (a fixed-size gather), question answering
lays each sequence's logits out in a row, masked LM with sparse prediction gathers `max_predictions` rows. Filler
slots carry ignored labels: -100 for class ids and positions beyond `max_length`, NaN for float targets.

**The ladder.** A bucket is chosen for each batch as the smallest that holds it. Its sizes trade memory and padding
against the number of graphs: each distinct shape is one more compilation and one more recorded CUDA graph (capture
time, and graph memory that `torch.compile`'s CUDA graph trees share within one pool), while each size step wastes up
to (growth - 1) / growth of the step's arithmetic on filler. Token counts grow geometrically, by `growth` (1.25 by
default: at most 20 % filler, about 10 % on average), rounded up to multiples of 64 (tensor-core tiles, and no
distinct shape for a few tokens more), from 64 to `sequences x max_length`; an epoch of fine-tuning data at a fixed
batch size visits a handful of them (its token counts cluster around the mean). The number of sequences is the batch
size rounded up (to a multiple of `batch_size`, or to a power of two from 8), plus enough filler sequences for the
largest fill a bucket can need. Those choices are our own.

**Beyond the ladder.** A sequence longer than `max_length` fits no bucket. Such a batch is laid out as usual (padded
by the transformers collator of its task) and marked `static_layout=False`: the model runs it eagerly, outside any
compiled graph, so no graph is recorded for it and none replays a stale `max_seqlen`. The collator warns once.

Not copied into saved model folders (the model needs none of it): it depends on transformers' collators.
"""

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForMultipleChoice,
    DataCollatorForTokenClassification,
    DataCollatorWithFlattening,
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
    per shape. See the module docstring for the batch, the ladder and what happens beyond it.

    Args:
        tokenizer (`PreTrainedTokenizerBase`): the examples' tokenizer (its pad id fills; masked LM masks with it).
        model (`SeqBertPreTrainedModel` or `SeqBertConfig`): the model the batches are for (a PEFT or compiled wrapper
            of one is fine): its class decides how labels are laid out, its config bounds the values checked. A
            config alone lays out no labels (an encoder's inputs).
        max_length (`int`, *optional*): the longest sequence a bucket holds, `max_length_q` of every batch; defaults
            to the tokenizer's `model_max_length` capped at `max_position_embeddings`. Pass the length you truncate to.
        batch_size (`int`, *optional*): the examples per batch (`per_device_train_batch_size`); the sequence slots
            are a multiple of it. None: a power of two from 8.
        growth (`float`): the ratio of consecutive token counts of the ladder (> 1).
        mlm_probability (`float`): masked LM only, where the examples carry no labels: the share of tokens masked,
            by transformers' `DataCollatorForLanguageModeling`.
        prediction_headroom (`float`): masked LM: `max_predictions` is this times `mlm_probability` times the
            bucket's tokens, rounded up to a multiple of 8 (a batch with more labelled tokens takes a larger bucket).

    Features are dicts as a tokenizer returns them (`input_ids`, optional `token_type_ids`; an `attention_mask` is
    read as all ones: pass examples unpadded) with the task's labels: `label` / `labels` (an int, a float, or a list
    of floats for multi-label) for sequence classification, `labels` a list per token for token classification and
    masked LM, `start_positions` / `end_positions` for question answering, and for multiple choice `input_ids` a list
    of choices and `label` / `labels` the right one.

    Raises (on construction):
        TypeError: `model` is neither a SeqBERT model nor a `SeqBertConfig`.
        ValueError: `max_length` < 1 or beyond `max_position_embeddings` (learned positions), `batch_size` < 1,
            `growth` <= 1, `mlm_probability` outside (0, 1], `prediction_headroom` < 1.
    Raises (on a call): the errors the model's forward would raise for the same values (ids outside the vocabulary,
        labels outside `num_labels`, ...), named as the forward names them; `ValueError` for an empty batch.
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
                f"max_length ({max_length}) exceeds max_position_embeddings ({limit}): filler and real positions "
                "must have position embeddings"
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
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.flattening = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)
        self.masking = (
            DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability)
            if self.task == "masked-lm"
            else None
        )
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
        The buckets of batches of `num_sequences` sequences (rounded up as `sequence_slots` does), smallest first:
        one per token count of `token_ladder` up to `slots x max_length`, each with room for the filler sequences
        its largest fill needs (`group`: the slots come in groups of that many, multiple choice's choices).
        """
        slots = self.sequence_slots(math.ceil(num_sequences / group)) * group
        sizes = token_ladder(slots * self.max_length, self.growth)
        buckets, previous = [], 0
        for tokens in sizes:
            # The fill is below tokens - previous where the token count alone chose the bucket; masked LM may take a
            # larger bucket for its predictions, filled up to all but one token.
            fill = tokens if self.task == "masked-lm" else tokens - previous
            filler = math.ceil(fill / self.max_length)
            predictions = None
            if self.task == "masked-lm":
                predictions = min(tokens, math.ceil(self.prediction_headroom * self.mlm_probability * tokens / 8) * 8)
                predictions = tokens if tokens == sizes[-1] else predictions
            sequences = slots + group * math.ceil(filler / group)
            buckets.append(Bucket(tokens, sequences, self.max_length, predictions))
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
            `dict`: a static batch (`static_layout=True`) of the smallest bucket that holds the examples, or the
            usual padded batch of the task's transformers collator with `static_layout=False` where none does.
        """
        if not features:
            raise ValueError("StaticShapeCollator received an empty batch: no example to lay out")
        for feature in features:
            mask = feature.get("attention_mask")
            if mask is not None and 0 in _flat_values(mask):
                raise ValueError(
                    "StaticShapeCollator takes examples unpadded (it packs them itself), but an example's "
                    "attention_mask holds 0: tokenize without padding (padding=False, the default)"
                )
        group = 1
        if self.task == "multiple-choice":
            group = len(features[0]["input_ids"])
            lengths = [len(choice) for feature in features for choice in feature["input_ids"]]
        else:
            lengths = [len(feature["input_ids"]) for feature in features]
        if min(lengths) == 0:
            raise ValueError("StaticShapeCollator received an example without tokens (input_ids of length 0)")
        row = self._flattened(features, group)
        predictions = 0
        if self.task == "masked-lm" and "labels" not in row:
            row["input_ids"], row["labels"] = self._masked(row["input_ids"], lengths)
        if self.task == "masked-lm":
            predictions = int((row["labels"] != IGNORE_INDEX).sum())
        bucket = self.bucket(lengths, predictions, group)
        if bucket is None:
            return self._beyond_ladder(features, lengths)
        batch = self._filled(row, lengths, bucket, group)
        self._check(batch, len(lengths), group)
        return batch

    def _flattened(self, features: list[dict], group: int) -> dict:
        """The examples as one row (transformers' `DataCollatorWithFlattening`), with the labels of the task; not yet
        rounded up."""
        sequence_labels = {}
        if self.task in ("sequence-classification", "multiple-choice", "question-answering"):
            for key in ("label", "labels", "start_positions", "end_positions"):
                if key in features[0]:
                    sequence_labels["labels" if key == "label" else key] = [feature[key] for feature in features]
        if self.task == "multiple-choice":
            features = [
                {key: value[i] for key, value in feature.items() if key in ("input_ids", "token_type_ids")}
                for feature in features
                for i in range(group)
            ]
        token_labels = self.task in ("token-classification", "masked-lm") and "labels" in features[0]
        flat = self.flattening(
            [{"input_ids": f["input_ids"], **({"labels": f["labels"]} if token_labels else {})} for f in features]
        )
        row = {"input_ids": flat["input_ids"], "position_ids": flat["position_ids"]}
        if "token_type_ids" in features[0]:
            row["token_type_ids"] = torch.tensor([[t for f in features for t in _as_list(f["token_type_ids"])]])
        if token_labels:  # the flattening collator puts its separator on each first token: the labels as given
            row["labels"] = torch.tensor([[t for f in features for t in _as_list(f["labels"])]])
        for key, values in sequence_labels.items():
            row[key] = torch.tensor(
                [_as_list(v) if isinstance(v, (list, tuple)) or torch.is_tensor(v) else v for v in values]
            )
        return row

    def _masked(self, input_ids: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked LM's inputs and labels for the row, by transformers' masking (special tokens never masked)."""
        special = torch.tensor(
            [self.tokenizer.get_special_tokens_mask(input_ids[0].tolist(), already_has_special_tokens=True)]
        )
        return self.masking.torch_mask_tokens(input_ids.clone(), special_tokens_mask=special)

    def _filled(self, row: dict, lengths: list[int], bucket: Bucket, group: int) -> dict:
        """The row rounded up to `bucket`: filler sequences of at most `max_length` tokens, then empty sequences."""
        fill = bucket.tokens - sum(lengths)
        filler = [self.max_length] * (fill // self.max_length) + (
            [fill % self.max_length] if fill % self.max_length else []
        )
        offsets = [0]
        for length in [*lengths, *filler]:
            offsets.append(offsets[-1] + length)
        offsets += [bucket.tokens] * (bucket.sequences + 1 - len(offsets))
        cu_seq_lens = torch.tensor(offsets, dtype=torch.int32)
        filler_positions = torch.cat([torch.arange(n) for n in filler]) if filler else torch.zeros(0, dtype=torch.long)
        batch = {
            "input_ids": torch.cat([row["input_ids"], torch.full((1, fill), self.pad_token_id)], dim=1),
            "position_ids": torch.cat([row["position_ids"], filler_positions[None]], dim=1),
        }
        if "token_type_ids" in row:
            batch["token_type_ids"] = torch.cat([row["token_type_ids"], torch.zeros(1, fill, dtype=torch.long)], dim=1)
        slots = bucket.sequences - len(lengths)
        for key, values in row.items():
            if key in batch:
                continue
            if key == "labels" and values.dim() == 2 and self.task in ("token-classification", "masked-lm"):
                batch[key] = torch.cat([values, torch.full((1, fill), IGNORE_INDEX)], dim=1)
            elif key in ("start_positions", "end_positions"):
                batch[key] = torch.cat([values.long(), torch.full((slots,), self.max_length)])
            elif values.is_floating_point():  # regression or multi-label targets: NaN takes no loss
                batch[key] = torch.cat([values.float(), torch.full((slots, *values.shape[1:]), math.nan)])
            else:  # class ids (a question's for multiple choice)
                batch[key] = torch.cat([values.long(), torch.full((slots // group,), IGNORE_INDEX)])
        batch.update(
            cu_seq_lens_q=cu_seq_lens,
            cu_seq_lens_k=cu_seq_lens,
            max_length_q=bucket.max_length,
            max_length_k=bucket.max_length,
            static_layout=True,
        )
        if bucket.predictions is not None:
            batch["max_predictions"] = bucket.predictions
        if self.task == "multiple-choice":
            batch["num_choices"] = group
        return batch

    def _check(self, batch: dict, num_sequences: int, group: int) -> None:
        """The checks the model's forward would read on the device, here on the CPU: the same errors, named as the
        forward names them."""
        checks = []
        check_encoder_inputs(
            self.config, batch["input_ids"], None, batch.get("token_type_ids"), batch["position_ids"], None, checks
        )
        config = self.config
        if self.task in ("token-classification", "masked-lm") and "labels" in batch:
            classes = (
                (config.num_labels, "num_labels")
                if self.task == "token-classification"
                else (config.vocab_size, "vocab_size")
            )
            check_labels("labels", batch["labels"], (*batch["input_ids"].shape, classes[0]), *classes, True, checks)
        elif self.task == "sequence-classification" and "labels" in batch:
            real = batch["labels"][:num_sequences]
            check_sequence_classification_labels(real, (num_sequences, config.num_labels), config.problem_type, checks)
            if config.problem_type is None:  # as the loss would set it on the first step, which would then recompile
                integer = not real.is_floating_point()
                config.problem_type = (
                    "regression"
                    if config.num_labels == 1
                    else "single_label_classification"
                    if integer
                    else "multi_label_classification"
                )
        elif self.task == "multiple-choice" and "labels" in batch:
            questions = num_sequences // group
            check_labels("labels", batch["labels"][:questions], (questions, group), group, "num_choices", True, checks)
        elif self.task == "question-answering" and "start_positions" in batch:
            check_answer_positions(
                batch["start_positions"], batch["end_positions"], len(batch["start_positions"]), checks
            )
        read_on_host(checks)

    def _beyond_ladder(self, features: list[dict], lengths: list[int]) -> dict:
        """The usual padded batch of the task's transformers collator, marked `static_layout=False`; warns once."""
        self.beyond_ladder += 1
        if self.beyond_ladder == 1:
            warnings.warn(
                f"StaticShapeCollator: a batch holds a sequence of {max(lengths)} tokens, longer than max_length "
                f"({self.max_length}), so it fits no bucket of the ladder: it is padded as usual and runs eagerly, "
                "outside the compiled CUDA graphs (each such batch; this warning is given once). Pass a max_length "
                "at least your longest sequence, or truncate to it when tokenizing.",
                stacklevel=2,
            )
        if self.task == "token-classification":
            batch = DataCollatorForTokenClassification(self.tokenizer)(features)
        elif self.task == "masked-lm":
            batch = DataCollatorForLanguageModeling(self.tokenizer, mlm_probability=self.mlm_probability)(features)
        elif self.task == "multiple-choice":
            batch = DataCollatorForMultipleChoice(self.tokenizer)(features)
        else:
            batch = DataCollatorWithPadding(self.tokenizer)(features)
        return {**batch, "static_layout": False}


def _as_list(value) -> list:
    return value.tolist() if torch.is_tensor(value) else list(value)


def _flat_values(value) -> list:
    """The values of a (possibly nested) list or tensor, flattened."""
    if torch.is_tensor(value):
        return value.reshape(-1).tolist()
    return [v for item in value for v in _flat_values(item)] if isinstance(value, (list, tuple)) else [value]


def _config_and_task(model) -> tuple[SeqBertConfig, str]:
    """The config and the task (`TASKS`) of a SeqBERT model, unwrapped from PEFT, `torch.compile` and DDP wrappers;
    a bare config is the encoder's."""
    if getattr(model, "model_type", None) == SeqBertConfig.model_type:
        return model, "encoder"
    for _ in range(8):
        name = type(model).__name__
        if name in TASKS:
            return model.config, TASKS[name]
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


__all__ = ["Bucket", "StaticShapeCollator", "token_ladder"]
