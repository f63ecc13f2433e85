"""Checks of the arguments of SeqBERT's `forward` and `generate`: a bad argument raises `ValueError` or `TypeError`
naming it, never an `IndexError` or a torch `RuntimeError` from deep inside the model.

The models call these before (or, for labels, next to) their computation, so that `modeling_seqbert.py` keeps only
the model itself. Also here: `eager_execution`, which says whether values may be read on the host (checks and the
unpadded fast path skip that under `torch.compile` and tracing); `DeferredCheck` and `read_on_host`, which let the
encoder read all its value checks and its unpadded layout in one host read (one sync on a GPU); and
`packed_sequence_ids`, which says (and checks) where packed sequences start in a row.

Imported relatively by `modeling_seqbert.py`, so it is copied into saved model folders for `trust_remote_code=True`
users and depends only on torch and transformers.
"""

from dataclasses import dataclass, field

import torch
from transformers.masking_utils import find_packed_sequence_indices

from .configuration_seqbert import SeqBertConfig


# Label value that takes no loss (`CrossEntropyLoss`'s `ignore_index`, as in BERT and the transformers collators).
IGNORE_INDEX = -100


def eager_execution() -> bool:
    """Whether the forward runs eagerly, so it may read tensor values on the host: not while `torch.compile`,
    `torch.export` or `torch.jit` trace it, nor while a CUDA graph is captured. Reading values (ids within range,
    where the real tokens are) costs one host sync each and would break a traced graph, so traced code checks only
    types and shapes and takes the padded path."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def check_tensor(name: str, value, kind: str, ndims: tuple[int, ...], meaning: str) -> None:
    """
    Raise unless `value` is a tensor of the `kind` ("integer" ids: int64 or int32, which embedding lookups take;
    "float" values; "any") with one of `ndims` dimensions.

    Raises:
        TypeError: `value` is not a `torch.Tensor`, or its dtype is not of the `kind`.
        ValueError: wrong number of dimensions; the message gives the expected layout `meaning`, e.g. "(B, L)".
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {meaning}, got {type(value).__name__}")
    if kind == "integer" and value.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer ids (torch.long or torch.int32), got dtype {value.dtype}")
    if kind == "float" and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if value.dim() not in ndims:
        raise ValueError(f"{name} must have shape {meaning}, got shape {tuple(value.shape)}")


def check_shape(name: str, value: torch.Tensor, expected: tuple[int, ...], meaning: str, broadcast: bool = False):
    """Raise `ValueError` unless `value.shape == expected` (with `broadcast`, a 1 may stand for any size)."""
    shape = tuple(value.shape)
    fits = len(shape) == len(expected) and all(
        got == want or (broadcast and got == 1) for got, want in zip(shape, expected, strict=True)
    )
    if not fits:
        raise ValueError(f"{name} has shape {shape}, but it must be {expected} {meaning}")


def check_ids_in_range(
    name: str, ids: torch.Tensor, high: int | None, high_name: str = "", ignore_index: bool = False
) -> None:
    """
    Raise `ValueError` unless every value of the integer tensor `ids` lies in `[0, high)` (`[0, inf)` when `high` is
    None), or equals `IGNORE_INDEX` with `ignore_index`. One host sync; skipped while compiling or tracing (see
    `eager_execution`).
    """
    if not eager_execution() or ids.numel() == 0:
        return
    limit = torch.iinfo(torch.int64).max if high is None else high
    low_value, high_value = torch.stack(torch.aminmax(ids)).tolist()
    if low_value >= 0 and high_value < limit:
        return
    valid = (ids >= 0) & (ids < limit)
    if ignore_index:
        valid |= ids == IGNORE_INDEX
    if bool(valid.all()):
        return
    bad = (~valid).nonzero()[0]
    allowed = ">= 0" if high is None else f"[0, {high_name}={high})"
    allowed += f" or {IGNORE_INDEX} (no loss)" if ignore_index else ""
    raise ValueError(f"{name} holds {ids[tuple(bad)].item()} at index {tuple(bad.tolist())}; allowed: {allowed}")


class DeferredCheck:
    """
    A check of input values whose host read is deferred, so that several checks (and the encoder's unpadded layout)
    share one read: one sync on a GPU instead of one each (see `read_on_host`). The values that decide it are computed
    on the device (`tensors`, as few kernels as it takes) and judged on the host once read (`passes`).
    """

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """0-dim integer or boolean tensors on the checked tensor's device whose values decide the check."""
        raise NotImplementedError

    def passes(self, values: list[int]) -> bool:
        """Whether the check passes, given the values of `tensors()` in order."""
        raise NotImplementedError

    def raise_error(self) -> None:
        """Raise the check's error, naming the argument, the value and what is allowed (reads values on the host)."""
        raise NotImplementedError


@dataclass(frozen=True)
class IdsInRange(DeferredCheck):
    """`check_ids_in_range(name, ids, high, high_name, ignore_index)`, deferred: the smallest and largest id are read
    (one `aminmax`), and compared on the host."""

    name: str
    ids: torch.Tensor
    high: int | None
    high_name: str = ""
    ignore_index: bool = False

    def tensors(self) -> tuple[torch.Tensor, ...]:
        if self.ids.numel() == 0:
            return ()
        ids = self.ids
        if self.ignore_index:  # IGNORE_INDEX counts as 0, which is always allowed
            ids = ids.masked_fill(ids == IGNORE_INDEX, 0)
        return tuple(torch.aminmax(ids))

    def passes(self, values: list[int]) -> bool:
        if not values:
            return True
        low, high = values
        return low >= 0 and (self.high is None or high < self.high)

    def raise_error(self) -> None:
        check_ids_in_range(self.name, self.ids, self.high, self.high_name, self.ignore_index)


@dataclass(frozen=True)
class MultiHot(DeferredCheck):
    """The targets of multi-label classification lie in [0, 1]."""

    labels: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        if self.labels.dtype == torch.bool or self.labels.numel() == 0:
            return ()
        return (((self.labels >= 0) & (self.labels <= 1)).all(),)

    def passes(self, values: list[int]) -> bool:
        return all(values)

    def raise_error(self) -> None:
        raise ValueError("labels of multi-label classification must be multi-hot targets in [0, 1]")


@dataclass(frozen=True)
class NoSegmentIds(DeferredCheck):
    """`token_type_ids` are all 0, for a model without segment embeddings (`type_vocab_size=0`)."""

    token_type_ids: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.token_type_ids.any(),)

    def passes(self, values: list[int]) -> bool:
        return not any(values)

    def raise_error(self) -> None:
        raise ValueError(
            "token_type_ids holds non-zero segment ids, but the model has no segment embeddings "
            "(type_vocab_size=0): drop token_type_ids"
        )


@dataclass(frozen=True)
class CumulativeLengthsCover(DeferredCheck):
    """`cu_seq_lens_q` (the flattening collator's cumulative lengths) runs from 0 to the number of tokens."""

    cu_seq_lens: torch.Tensor
    batch_size: int
    seq_len: int

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.cu_seq_lens[0], self.cu_seq_lens[-1]

    def passes(self, values: list[int]) -> bool:
        return values == [0, self.batch_size * self.seq_len]

    def raise_error(self) -> None:
        first, last = self.cu_seq_lens[[0, -1]].tolist()
        raise ValueError(
            f"cu_seq_lens_q runs from {first} to {last}, but it must run from 0 to the number of tokens "
            f"{self.batch_size * self.seq_len} (batch_size {self.batch_size} x sequence_length {self.seq_len})"
        )


@dataclass
class DeferredReads:
    """
    What a caller of `SeqBertModel.forward` (a task head) has the encoder read on the host in its one read, before the
    encoder runs: checks of its own arguments (labels) and 0-dim integer tensors (sparse masked-LM's count of labelled
    positions), so that a training step reads the host once (one sync on a GPU). The encoder fills `values`, the
    values of `scalars` in order; it stays None while `torch.compile` or tracing runs the forward (nothing is read
    then, and `scalars` must stay empty: see `eager_execution`).

    Attributes:
        checks (`list[DeferredCheck]`): checked in order, after the encoder's own input checks.
        scalars (`list[torch.Tensor]`): 0-dim integer or boolean tensors on the inputs' device.
        values (`list[int]`, *optional*): their values, once read.
        named (`dict[str, int]`): the index in `scalars` of each scalar added by name (`add_scalar`).
    """

    checks: list[DeferredCheck] = field(default_factory=list)
    scalars: list[torch.Tensor] = field(default_factory=list)
    values: list[int] | None = None
    named: dict[str, int] = field(default_factory=dict)

    def add_scalar(self, name: str, value: torch.Tensor) -> None:
        """Read the 0-dim integer or boolean tensor `value` too, under `name` (see `value`)."""
        self.named[name] = len(self.scalars)
        self.scalars.append(value)

    def value(self, name: str) -> int | None:
        """What was read for the scalar `name`: None where none was added under that name, or nothing was read."""
        if self.values is None or name not in self.named:
            return None
        return self.values[self.named[name]]

    def count_labelled(self, labels: torch.Tensor, needed: bool = True) -> None:
        """Read the number of labelled positions (`labels` != -100) too, as `LABELLED`, where `needed` and values can be
        read (eager execution): a head's loss then takes PyTorch's mean reduction over them (no division of its own),
        and sparse prediction gathers that many rows."""
        if needed and eager_execution():
            self.add_scalar(LABELLED, (labels != IGNORE_INDEX).sum())


# The name of `DeferredReads.count_labelled`'s scalar.
LABELLED = "labelled"


def read_on_host(checks, scalars=()) -> list[int]:
    """
    Read what decides every check of `checks` and the 0-dim integer or boolean tensors `scalars` to the host in one
    read (`torch.stack`, which promotes them to one integer dtype, then `tolist`): one sync on a GPU, whatever their
    number. Skipped under `torch.compile` and tracing (see `eager_execution`), where nothing is read and `scalars` must
    be empty.

    Args:
        checks (`Sequence[DeferredCheck]`): checked in order; the first that fails raises its error.
        scalars (`Sequence[torch.Tensor]`): 0-dim tensors on one device.

    Returns:
        `list[int]`: the values of `scalars`.

    Raises:
        ValueError, TypeError: a check of `checks` fails.
    """
    if not eager_execution():
        if scalars:
            raise RuntimeError("read_on_host cannot read scalars while tracing")
        return []
    groups = [check.tensors() for check in checks]
    values = [value for group in groups for value in group] + list(scalars)
    if not values:
        return []
    device = values[-1].device
    host = [int(value) for value in torch.stack([value.to(device) for value in values]).tolist()]
    start = 0
    for check, group in zip(checks, groups, strict=True):
        if not check.passes(host[start : start + len(group)]):
            check.raise_error()
        start += len(group)
    return host[start:]


def _check_ids_or_embeds(
    config: SeqBertConfig,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    ids_name: str,
    embeds_name: str,
    length_name: str,
) -> tuple[int, int, str]:
    """Check that exactly one of `input_ids` (B, L) integer and `inputs_embeds` (B, L, H) float is given, with
    B, L >= 1 (named `ids_name` / `embeds_name` in messages); return B, L and the name of the one given."""
    if (input_ids is None) == (inputs_embeds is None):
        given = "both" if input_ids is not None else "neither"
        raise ValueError(f"Specify exactly one of {ids_name} or {embeds_name}; got {given}")
    if input_ids is not None:
        check_tensor(ids_name, input_ids, "integer", (2,), f"(batch_size, {length_name})")
        (batch_size, seq_len), name = input_ids.shape, ids_name
    else:
        width = config.hidden_size
        check_tensor(embeds_name, inputs_embeds, "float", (3,), f"(batch_size, {length_name}, {width})")
        if inputs_embeds.shape[-1] != width:
            raise ValueError(f"{embeds_name} has width {inputs_embeds.shape[-1]}, but hidden_size is {width}")
        (batch_size, seq_len), name = inputs_embeds.shape[:2], embeds_name
    if batch_size == 0 or seq_len == 0:
        raise ValueError(f"{name} has shape {tuple((batch_size, seq_len))}: need at least one sequence of one token")
    return batch_size, seq_len, name


def check_encoder_inputs(
    config: SeqBertConfig,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    deferred: list[DeferredCheck] | None = None,
) -> None:
    """The checks of `SeqBertModel.forward` (see its Raises section). With a `deferred` list, the checks that read
    values on the host are appended to it instead of run (run them with `read_on_host`)."""

    def in_range(name: str, ids: torch.Tensor, high: int | None, high_name: str = "") -> None:
        if deferred is None:
            check_ids_in_range(name, ids, high, high_name)
        else:
            deferred.append(IdsInRange(name, ids, high, high_name))

    batch_size, seq_len, name = _check_ids_or_embeds(
        config, input_ids, inputs_embeds, "input_ids", "inputs_embeds", "sequence_length"
    )
    learned = config.position_embedding_type == "learned"
    if learned and position_ids is None and seq_len > config.max_position_embeddings:
        raise ValueError(
            f"{name} has sequence length {seq_len}, but the learned position embeddings cover "
            f"max_position_embeddings={config.max_position_embeddings} positions: truncate the input (tokenizer "
            f"truncation=True, max_length={config.max_position_embeddings}); sinusoidal positions have no limit"
        )
    if attention_mask is not None:
        check_tensor("attention_mask", attention_mask, "any", (2, 4), "(batch_size, sequence_length)")
        if attention_mask.dim() == 2:
            check_shape("attention_mask", attention_mask, (batch_size, seq_len), f"like {name}")
        else:
            check_shape(
                "attention_mask", attention_mask, (batch_size, 1, seq_len, seq_len), "(4D mask)", broadcast=True
            )
            if not (attention_mask.dtype == torch.bool or attention_mask.is_floating_point()):
                raise TypeError(
                    f"attention_mask is a prepared 4D mask of dtype {attention_mask.dtype}: give it as bool (True: "
                    "attend) or float (added to the scores: 0 to attend, the dtype's minimum not to), or give the "
                    "(batch_size, sequence_length) mask of 1s and 0s"
                )
    if token_type_ids is not None:
        check_tensor("token_type_ids", token_type_ids, "integer", (2,), "(batch_size, sequence_length)")
        check_shape("token_type_ids", token_type_ids, (batch_size, seq_len), f"like {name}", broadcast=True)
        if config.type_vocab_size > 0:
            in_range("token_type_ids", token_type_ids, config.type_vocab_size, "type_vocab_size")
        elif deferred is not None:
            deferred.append(NoSegmentIds(token_type_ids))
        elif eager_execution():
            read_on_host([NoSegmentIds(token_type_ids)])
    if position_ids is not None:
        check_tensor("position_ids", position_ids, "integer", (2,), "(batch_size, sequence_length)")
        check_shape("position_ids", position_ids, (batch_size, seq_len), f"like {name}", broadcast=True)
        if learned:
            in_range("position_ids", position_ids, config.max_position_embeddings, "max_position_embeddings")
        else:
            in_range("position_ids", position_ids, None)
    if input_ids is not None:
        in_range("input_ids", input_ids, config.vocab_size, "vocab_size")


def packed_sequence_ids(
    config: SeqBertConfig,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    kwargs: dict,
    deferred: list[DeferredCheck] | None = None,
) -> torch.Tensor | None:
    """
    Which sequence each token belongs to when rows are packed (several sequences in one row, as
    `DataCollatorWithFlattening` builds them): a `(B, L)` integer tensor whose value changes along a row where a new
    sequence starts; None for ordinary rows.

    The boundaries come from `cu_seq_lens_q` in `kwargs` when given (cumulative lengths over the flattened batch),
    else from `position_ids`: a step other than +1 along a row starts a new sequence (transformers'
    `find_packed_sequence_indices`, which returns None when no row restarts, and always returns the ids when traced).

    With a `deferred` list (the unpadded encoder, which reads everything in one host read), nothing is read on the
    host here: the check of `cu_seq_lens_q` is appended to it, and `position_ids` always give ids (unchanged along
    ordinary rows), whether any row restarts is read with the layout (`UnpaddedBatch.packed`).

    Raises:
        TypeError: `cu_seq_lens_q` is not an integer tensor.
        ValueError: `cu_seq_lens_q` is not 1-D, or does not run from 0 to the number of tokens B * L; packed rows
            under flash-attention without `cu_seq_lens_q` (transformers' flash path reads the boundaries only there).
    """
    batch_size, seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is not None:
        check_tensor("cu_seq_lens_q", cu_seq_lens, "integer", (1,), "(num_sequences + 1,)")
        check = CumulativeLengthsCover(cu_seq_lens, batch_size, seq_len)
        if deferred is not None:
            deferred.append(check)
        else:
            read_on_host([check])
        tokens = torch.arange(batch_size * seq_len, device=cu_seq_lens.device)
        return torch.searchsorted(cu_seq_lens[1:].long(), tokens, right=True).view(batch_size, seq_len)
    if position_ids is None:
        return None
    if deferred is not None:  # find_packed_sequence_indices' numbering, without its host read
        steps = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1)
        return (steps != 1).cumsum(-1).expand(batch_size, seq_len)
    sequence_ids = find_packed_sequence_indices(position_ids)
    if config._attn_implementation.startswith("flash"):
        if sequence_ids is not None and eager_execution():
            raise ValueError(
                "position_ids restart inside a row (packed sequences), but flash-attention reads sequence "
                "boundaries only from cu_seq_lens_q/cu_seq_lens_k: pass them (DataCollatorWithFlattening("
                "return_flash_attn_kwargs=True)), or use attn_implementation='sdpa' or 'eager'"
            )
        return None
    return None if sequence_ids is None else sequence_ids.expand(batch_size, seq_len)


# What a static batch (`static_layout=True`) carries besides a padded batch's tensors: its layout, computed on the CPU.
STATIC_LAYOUT_KEYS = ("indices", "cu_seqlens", "max_seqlen")


def check_static_layout(kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """
    The layout a static batch carries (`static_layout=True`, as `StaticShapeCollator` builds it: a padded batch
    (B, L), plus `indices` (T,) int64, the flat position `b * L + l` of each token of the layout, B x L for a filler
    token; `cu_seqlens` (S + 1,) int32 offsets from 0 to T; `max_seqlen`, an int bound on the longest sequence),
    taken out of `kwargs` and checked by type and shape only: the collator computed and checked the values on the
    CPU. Eagerly, `plan_layout` also checks the values against the attention mask (`StaticLayoutMatches`).

    Returns:
        `(indices, cu_seqlens, max_seqlen)`.

    Raises:
        TypeError: `indices` is not an int64 tensor, `cu_seqlens` not an int32 one, or `max_seqlen` not an int.
        ValueError: one of the three is missing, `indices` is not 1-D, `cu_seqlens` is not 1-D with at least 2
            offsets, or `max_seqlen` < 1.
    """
    indices, cu_seqlens, max_seqlen = (kwargs.pop(key, None) for key in STATIC_LAYOUT_KEYS)
    if indices is None or cu_seqlens is None or max_seqlen is None:
        given = {"indices": indices, "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen}
        missing = ", ".join(name for name, value in given.items() if value is None)
        raise ValueError(
            f"static_layout=True needs indices, cu_seqlens and max_seqlen (the layout computed with the batch); "
            f"{missing} missing: build the batch with seqbert.StaticShapeCollator"
        )
    check_tensor("indices", indices, "any", (1,), "(num_tokens,)")
    if indices.dtype != torch.int64:
        raise TypeError(f"indices must be int64 (flat grid positions), got {indices.dtype}")
    check_tensor("cu_seqlens", cu_seqlens, "any", (1,), "(num_sequences + 1,)")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.numel() < 2:
        raise TypeError(
            f"cu_seqlens must be int32 with at least 2 offsets (the variable-length kernel's type), got "
            f"{cu_seqlens.dtype} with {cu_seqlens.numel()}"
        )
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
        raise TypeError(f"max_seqlen must be an int (a static bound, known on the host), got {max_seqlen!r}")
    if max_seqlen < 1:
        raise ValueError(f"max_seqlen ({max_seqlen}) must be at least 1")
    return indices, cu_seqlens, max_seqlen


@dataclass(frozen=True)
class StaticLayoutMatches(DeferredCheck):
    """
    A static batch's layout is the one `StaticShapeCollator` computes from its attention mask (`static_layout`): the
    rows are right-padded (a real token never follows padding: the pooler reads column 0, and question answering's
    span ends at the longest row); `indices` lists the real tokens' flat positions in order, then B x L for each
    filler token; `cu_seqlens` runs from 0 to T, never decreasing, its first B sequences the rows' lengths; and
    `max_seqlen` is at least the longest sequence (a smaller bound truncates it in the variable-length kernel).
    Deferred, so that it joins the encoder's one host read (`validate_static_layout`, on in eager execution).
    """

    attention_mask: torch.Tensor  # (B, L), 1 or True at a real token
    indices: torch.Tensor  # (T,) int64
    cu_seqlens: torch.Tensor  # (S + 1,) int32
    max_seqlen: int

    def conditions(self) -> dict[str, torch.Tensor]:
        """Each field's condition, a 0-dim boolean tensor, by the field's name."""
        mask = self.attention_mask != 0  # (B, L)
        batch_size, seq_len = mask.shape
        grid = batch_size * seq_len
        lengths = mask.sum(1)  # (B,)
        real = lengths.sum()
        indices, offsets = self.indices, self.cu_seqlens.long()
        slot = torch.arange(indices.numel(), device=indices.device)
        points_at_real = (indices >= 0) & (indices < grid) & mask.reshape(-1)[indices.clamp(0, grid - 1)]
        rising = torch.nn.functional.pad(indices.diff() > 0, (1, 0), value=True)
        listed = torch.where(slot < real, points_at_real & rising, indices == grid)
        sizes = offsets.diff()  # (S,)
        rows = sizes[:batch_size]
        return {
            "attention_mask": ~(mask[:, 1:] & ~mask[:, :-1]).any(),
            "indices": (real <= indices.numel()) & listed.all(),
            "cu_seqlens": (offsets[0] == 0)
            & (offsets[-1] == indices.numel())
            & (sizes >= 0).all()
            & (rows.numel() == batch_size)
            & (rows == lengths[: rows.numel()]).all(),
            "max_seqlen": sizes.max() <= self.max_seqlen,
        }

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.conditions().values())

    def passes(self, values: list[int]) -> bool:
        return all(values)

    def raise_error(self) -> None:
        failed = next(name for name, holds in self.conditions().items() if not holds)
        mask = self.attention_mask != 0
        lengths = mask.sum(1).tolist()
        how = "(validate_static_layout=False skips this check)"
        if failed == "attention_mask":
            row = int((mask[:, 1:] & ~mask[:, :-1]).any(1).nonzero()[0])
            raise ValueError(
                f"attention_mask of a static batch (static_layout=True) has a real token after padding in row {row}: "
                "a static batch is right-padded (StaticShapeCollator pads on the right whatever the tokenizer's "
                f"padding_side) {how}"
            )
        if failed == "indices":
            raise ValueError(
                f"indices ({self.indices.numel()} entries) do not list the attention mask's {sum(lengths)} real "
                f"tokens' flat positions in order followed by {mask.numel()} (B x L) for each filler token "
                f"{how}; got {self.indices.tolist()[:16]}{' ...' if self.indices.numel() > 16 else ''}"
            )
        if failed == "cu_seqlens":
            raise ValueError(
                f"cu_seqlens {self.cu_seqlens.tolist()} must run from 0 to the layout's {self.indices.numel()} tokens, "
                f"never decreasing, its first {len(lengths)} sequences the rows' lengths {lengths} {how}"
            )
        longest = int(self.cu_seqlens.long().diff().max())
        raise ValueError(
            f"max_seqlen ({self.max_seqlen}) is below the layout's longest sequence ({longest}): attention would "
            f"truncate it; max_seqlen must be at least {longest} {how}"
        )


def _in_range(
    deferred: list[DeferredCheck] | None,
    name: str,
    ids: torch.Tensor,
    high: int | None,
    high_name: str = "",
    ignore_index: bool = False,
) -> None:
    """`check_ids_in_range` now, or appended to `deferred` (an `IdsInRange`) when a list is given."""
    if deferred is None:
        check_ids_in_range(name, ids, high, high_name, ignore_index=ignore_index)
    else:
        deferred.append(IdsInRange(name, ids, high, high_name, ignore_index))


def check_seqbert_config(config) -> None:
    """
    A model's `config`, checked as every SeqBERT model's `__init__` checks it: a `SeqBertConfig` (by `model_type`, not
    `isinstance`: remote-code loading may import the config class from another copy of the module) whose fields are
    valid now (they may have changed since construction).

    Raises:
        TypeError: `config` is not a `SeqBertConfig`, or one of its fields has the wrong type.
        ValueError: a field is out of range.
    """
    if getattr(config, "model_type", None) != SeqBertConfig.model_type:
        raise TypeError(f"config must be a SeqBertConfig, got {type(config).__name__}")
    config.validate_seqbert_fields()


def check_vocabulary_size(config: SeqBertConfig, new_num_tokens, pad_to_multiple_of) -> None:
    """
    The size `resize_token_embeddings(new_num_tokens, pad_to_multiple_of)` asks for, against the config.

    Raises:
        TypeError: `new_num_tokens` is neither None nor an int.
        ValueError: the size is below 1, or would drop a special token id (`pad_token_id`, `bos_token_id`,
            `eos_token_id`, `decoder_start_token_id`).
    """
    if new_num_tokens is not None and (isinstance(new_num_tokens, bool) or not isinstance(new_num_tokens, int)):
        raise TypeError(
            f"new_num_tokens must be an int or None, got {new_num_tokens!r} of type {type(new_num_tokens).__name__}"
        )
    size = config.vocab_size if new_num_tokens is None else new_num_tokens
    if isinstance(pad_to_multiple_of, int) and pad_to_multiple_of > 0:
        size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
    if size < 1:
        raise ValueError(f"new_num_tokens ({new_num_tokens}) must be >= 1")
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        token_id = getattr(config, name, None)
        if token_id is not None and token_id >= size:
            raise ValueError(
                f"new_num_tokens ({new_num_tokens}) would drop {name} ({token_id}): the vocabulary must keep ids "
                f"up to {token_id}; change config.{name} first, or keep at least {token_id + 1} tokens"
            )


def check_num_labels(config: SeqBertConfig, expected: int, why: str) -> None:
    """Raise `ValueError` unless `config.num_labels == expected`; `why` names the model and the reason."""
    if config.num_labels != expected:
        raise ValueError(f"num_labels ({config.num_labels}) must be {expected} for {why}")


def input_batch_shape(input_ids, inputs_embeds) -> tuple[int, int] | None:
    """(B, L) of the encoder's inputs, when exactly one of `input_ids` (B, L) and `inputs_embeds` (B, L, H) is a tensor
    with that many dimensions; else None (the encoder's own checks then raise, naming the problem)."""
    if (input_ids is None) == (inputs_embeds is None):
        return None
    given, ndim = (input_ids, 2) if input_ids is not None else (inputs_embeds, 3)
    if not isinstance(given, torch.Tensor) or given.dim() != ndim:
        return None
    return tuple(given.shape[:2])


def check_labels(
    name: str,
    labels,
    logits_shape: tuple[int, ...],
    num_classes: int,
    classes_name: str,
    ignore_index: bool = True,
    deferred: list[DeferredCheck] | None = None,
) -> torch.Tensor:
    """
    Raise unless `labels` are integer class ids shaped like `logits_shape` without its class dimension, each in
    `[0, num_classes)` or `IGNORE_INDEX`. Raises `TypeError` (not a tensor, not integer) or `ValueError`. Returns
    them as int64, which the cross-entropy takes. With a `deferred` list, the check of the values (a host read) is
    appended to it instead of run (see `DeferredReads`).
    """
    expected = tuple(logits_shape[:-1])
    meaning = f"(the logits' shape {tuple(logits_shape)} without the class dimension)"
    check_tensor(name, labels, "integer", (len(expected),), str(expected))
    check_shape(name, labels, expected, meaning)
    _in_range(deferred, name, labels, num_classes, classes_name, ignore_index=ignore_index)
    return labels.long()


def check_sequence_classification_labels(
    labels, logits_shape: tuple[int, ...], problem_type: str | None, deferred: list[DeferredCheck] | None = None
) -> torch.Tensor:
    """
    The `labels` of `SeqBertForSequenceClassification.forward`, checked against the problem type (`problem_type` of
    the config, else inferred as `ForSequenceClassificationLoss` does) and converted to the dtype its loss needs:
    int64 class ids for single-label classification, float targets otherwise. See that `forward` for what raises.
    With a `deferred` list, the checks of values are appended to it instead of run (see `DeferredReads`).
    """
    batch_size, num_labels = logits_shape
    check_tensor("labels", labels, "any", (1, 2), f"({batch_size},) or ({batch_size}, {num_labels})")
    integer = not (labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool)
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        else:
            problem_type = "single_label_classification" if integer else "multi_label_classification"
    per_example = ((batch_size,), (batch_size, 1))
    if problem_type == "single_label_classification":
        check_tensor("labels", labels, "integer", (1, 2), f"({batch_size},)")
        if tuple(labels.shape) not in per_example:
            raise ValueError(
                f"labels has shape {tuple(labels.shape)}, but single-label classification takes one class id per "
                f"example: ({batch_size},)"
            )
        _in_range(deferred, "labels", labels, num_labels, "num_labels", ignore_index=True)
        return labels.long()
    if problem_type == "regression" and num_labels == 1:
        if tuple(labels.shape) not in per_example:
            raise ValueError(
                f"labels has shape {tuple(labels.shape)}, but regression with num_labels=1 takes one target per "
                f"example: ({batch_size},)"
            )
    else:
        check_shape("labels", labels, (batch_size, num_labels), f"({problem_type}: one value per class)")
    if problem_type == "multi_label_classification":
        if deferred is not None:
            deferred.append(MultiHot(labels))
        else:
            read_on_host([MultiHot(labels)])
    return labels.float()


def check_answer_positions(
    start_positions: torch.Tensor | None,
    end_positions: torch.Tensor | None,
    batch_size: int,
    deferred: list[DeferredCheck] | None = None,
) -> None:
    """
    The answer-span positions of `SeqBertForQuestionAnswering.forward`: both or neither given, each integer of
    shape `(batch_size,)` (or `(batch_size, 1)`) and non-negative (positions beyond the sequence are allowed: the loss
    ignores them, as BERT's does). With a `deferred` list, the checks of values are appended to it instead of run.

    Raises:
        TypeError: a position tensor is not a tensor or not integer.
        ValueError: only one of the two is given, or one is shaped otherwise or holds a negative position.
    """
    if (start_positions is None) != (end_positions is None):
        given = "start_positions" if start_positions is not None else "end_positions"
        raise ValueError(f"only {given} was given: the QA loss needs both start_positions and end_positions")
    if start_positions is None:
        return
    for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
        check_tensor(name, positions, "integer", (1, 2), f"({batch_size},)")
        if tuple(positions.shape) not in ((batch_size,), (batch_size, 1)):
            raise ValueError(f"{name} has shape {tuple(positions.shape)}, but it must be ({batch_size},)")
        _in_range(deferred, name, positions, None)


def check_multiple_choice_inputs(
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
) -> None:
    """
    The inputs of `SeqBertForMultipleChoice.forward` before they are flattened to one sequence per choice: exactly one
    of `input_ids` (B, num_choices, L) integer and `inputs_embeds` (B, num_choices, L, H) float, no dimension of 0, and
    the other inputs shaped (B, num_choices, L) like them. The flattened inputs then go through `SeqBertModel`'s checks.

    Raises:
        TypeError: an input is not a tensor, ids are not integers, or `inputs_embeds` is not floating-point.
        ValueError: both or neither of `input_ids` and `inputs_embeds`; a wrong number of dimensions, an empty one, or
            another input shaped unlike them.
    """
    if (input_ids is None) == (inputs_embeds is None):
        given = "both" if input_ids is not None else "neither"
        raise ValueError(f"Specify exactly one of input_ids or inputs_embeds; got {given}")
    if input_ids is not None:
        check_tensor("input_ids", input_ids, "integer", (3,), "(batch_size, num_choices, sequence_length)")
        name, reference = "input_ids", input_ids
    else:
        check_tensor("inputs_embeds", inputs_embeds, "float", (4,), "(batch_size, num_choices, sequence_length, H)")
        name, reference = "inputs_embeds", inputs_embeds
    choices_shape = tuple(reference.shape[:3])  # (B, num_choices, L)
    if 0 in choices_shape:
        raise ValueError(
            f"{name} has shape {tuple(reference.shape)}: need at least one example, one choice and one token "
            "(batch_size, num_choices, sequence_length >= 1)"
        )
    for other_name, other in (
        ("attention_mask", attention_mask),
        ("token_type_ids", token_type_ids),
        ("position_ids", position_ids),
    ):
        if other is not None:
            check_tensor(other_name, other, "any", (3,), "(batch_size, num_choices, sequence_length)")
            check_shape(other_name, other, choices_shape, f"like {name}")
