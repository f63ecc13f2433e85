"""Trainer classes of the example scripts: transformers' `Trainer` / `Seq2SeqTrainer` with checkpoints that appear
whole or not at all, and a masked-LM collator whose masks survive an interruption.

transformers writes `checkpoint-N/` in place: weights, then optimizer and scheduler, RNG states, then
`trainer_state.json`. A crash in between leaves a `checkpoint-N/` that `get_last_checkpoint` (what
`--resume_from_checkpoint True` uses) picks as the newest one, and whose optimizer state may be missing, which
`Trainer` then skips without a word. Here every file of a checkpoint is written into a staging folder first, and only
a complete checkpoint is renamed to `checkpoint-N` (one `os.replace` of a folder, atomic on POSIX file systems), so
a crash while saving leaves the previous checkpoints as the newest complete ones. Checkpoints are deleted the other
way round (a checkpoint saved again at the same step, those `save_total_limit` rotates out, those
`remove_checkpoints` removes): renamed into the staging folder first, then deleted there, so a crash while deleting
never leaves a partial `checkpoint-N/` either.

Masked-LM masks are drawn from the global torch RNG by `DataCollatorForLanguageModeling`, in the data loader, which
runs ahead of the optimizer (accelerate fetches the next batch early) and, on resume, before the checkpoint's RNG state
is restored: a resumed run masks different tokens than the uninterrupted one. `DataCollatorForResumableMasking` draws
each batch's masks from its own generator seeded by (seed, process, batch number); the trainers here keep that batch
number in step with `global_step`, so an interrupted and resumed run is bit-identical to an uninterrupted one.

Whether a CPU training run gains from bf16 autocast depends on the CPU, not only on its instruction flags: a Zen 4
with AVX512_BF16 trained the default masked-LM model 1.45x faster in bf16, an Intel Xeon with AVX512_BF16 and no AMX
ran a bert-base-width step at 0.73x fp32's speed. `time_training_precisions` times a step of the run's own model and
batch both ways, taking turns, and `choose_training_precision` picks bf16 only where it was clearly and steadily
faster; `TrainingPrecisionRecord` keeps the choice in every checkpoint, so a resumed run trains as the interrupted
one did.
"""

import hashlib
import json
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import SequentialSampler
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    Seq2SeqTrainer,
    Trainer,
    TrainerCallback,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, has_length, sort_checkpoints


# Where checkpoints are assembled before they are renamed into place, and moved to before they are deleted;
# `get_last_checkpoint` never picks it.
STAGING_DIR = ".checkpoint-staging"
# The folder of STAGING_DIR that checkpoints are moved into before they are deleted.
DISCARDED_DIR = "discarded"


@dataclass
class DataCollatorForResumableMasking(DataCollatorForLanguageModeling):
    """
    `DataCollatorForLanguageModeling` (BERT's masking, Devlin et al. 2019 §3.1: `mlm_probability` of the non-special
    tokens are selected; of those `mask_replace_prob` become [MASK], `random_replace_prob` a random token, the rest
    stay) whose masks for batch number `batch_index` of process `process_index` come from a generator seeded by
    `(seed, process_index, batch_index)`, not from the global RNG.

    Used with `SeqBertTrainer` / `SeqBertSeq2SeqTrainer`, which set `batch_index` to `global_step x
    gradient_accumulation_steps` when training (or an epoch) starts, the masks of a batch do not depend on what ran
    before it, so a resumed run masks exactly what the uninterrupted one did. With `dataloader_num_workers > 0` each
    worker numbers its batches as PyTorch hands them out (round robin).

    Args:
        seed (`int`, defaults to 0): base seed of the masks (transformers' `seed` argument, here required).
        batch_index (`int`, defaults to 0): number of the next batch; set by the trainers.
        process_index (`int`, defaults to 0): this process's rank; set by the trainers.
        stage (`str`, defaults to `"train"`): `"eval"` while the trainers evaluate: evaluation batches get masks of
            their own (the same at every evaluation) and leave the training batches' numbering alone.
        padding_free (`bool`, defaults to `False`): put the batch's texts in one row without padding, as
            `DataCollatorWithFlattening` does (`input_ids` and `position_ids` of shape `(1, total_tokens)`, positions
            restarting at 0 for each text, no `attention_mask`), then mask them as above. SeqBERT attends within each
            text of such a row (see `SeqBertModel.forward`).
    """

    seed: int | None = 0
    batch_index: int = 0
    process_index: int = 0
    stage: str = "train"
    padding_free: bool = False
    _worker_calls: int = field(default=0, init=False, repr=False)  # batches this worker's copy has collated

    def create_rng(self, return_tensors=None) -> None:
        """transformers' own generator, seeded by `seed` per process (5.24 makes it when the process has none yet):
        not used, as it would mask a process's first batch unlike every other; `torch_call` sets each batch's."""

    def torch_call(self, examples):
        worker = torch.utils.data.get_worker_info()
        if worker is None:
            index = self.batch_index
        else:  # worker w of n collates batches w, w + n, w + 2n, ... of those handed out after batch_index
            index = self.batch_index + worker.id + self._worker_calls * worker.num_workers
            self._worker_calls += 1
        key = f"{self.seed}:{self.stage}:{self.process_index}:{index}".encode()
        self.generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1)
        self.batch_index += worker is None
        if not self.padding_free:
            return super().torch_call(examples)
        batch = DataCollatorWithFlattening()([{"input_ids": example["input_ids"]} for example in examples])
        special_tokens_mask = None
        if "special_tokens_mask" in examples[0]:
            special_tokens_mask = torch.tensor([[m for example in examples for m in example["special_tokens_mask"]]])
        input_ids, labels = self.torch_mask_tokens(batch["input_ids"], special_tokens_mask=special_tokens_mask)
        return {"input_ids": input_ids, "labels": labels, "position_ids": batch["position_ids"]}


class _MaskingScheduleCallback(TrainerCallback):
    """Keeps a `DataCollatorForResumableMasking`'s batch number in step with the trainer's `global_step`."""

    def __init__(self, collator: DataCollatorForResumableMasking):
        self.collator = collator

    def on_train_begin(self, args, state, control, **kwargs):
        self._sync(args, state)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._sync(args, state)

    def _sync(self, args, state) -> None:
        self.collator.batch_index = state.global_step * args.gradient_accumulation_steps
        self.collator.process_index = args.process_index
        self.collator._worker_calls = 0


class AtomicCheckpointsMixin:
    """Mixin for `transformers.Trainer` subclasses: `checkpoint-N/` is renamed into place only once complete, and a
    `DataCollatorForResumableMasking` is kept in step with `global_step` (and evaluation masks apart from training
    ones)."""

    _staging_root: str | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.data_collator, DataCollatorForResumableMasking):
            self.add_callback(_MaskingScheduleCallback(self.data_collator))

    def evaluate(self, *args, **kwargs):
        collator = self.data_collator
        if not isinstance(collator, DataCollatorForResumableMasking):
            return super().evaluate(*args, **kwargs)
        saved = (collator.stage, collator.batch_index, collator._worker_calls)
        collator.stage, collator.batch_index, collator._worker_calls = "eval", 0, 0
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            collator.stage, collator.batch_index, collator._worker_calls = saved

    def _get_eval_sampler(self, eval_dataset):
        """Evaluation and `predict` in dataset order, whatever `train_sampling_strategy` says. With
        `"group_by_length"`, transformers (checked on 5.23) also draws evaluation batches from a `LengthGroupedSampler`,
        whose shuffled mega-batches put `predict()`'s rows out of dataset order: a script that pairs them with its
        references by position (as `run_seq2seq.py` does) scores the wrong pairs. Several processes: transformers'
        default (None: each process reads its contiguous share)."""
        if eval_dataset is None or not has_length(eval_dataset):
            return None
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return run_dir if self._staging_root is None else os.path.join(run_dir, STAGING_DIR)

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = self._get_output_dir(trial)
        staging_root = os.path.join(run_dir, STAGING_DIR)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save and os.path.isdir(staging_root):
            shutil.rmtree(staging_root)  # what a crashed save left behind
        self.accelerator.wait_for_everyone()
        self._staging_root = staging_root
        try:
            super()._save_checkpoint(model, trial)  # every rank writes its files under staging_root/name
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            staged, final = os.path.join(staging_root, name), os.path.join(run_dir, name)
            best = self.state.best_model_checkpoint
            if best is not None and best.startswith(staging_root):
                # Trainer recorded the staging path of this very checkpoint as the best one: point at the final one.
                self.state.best_model_checkpoint = os.path.join(run_dir, os.path.relpath(best, staging_root))
                self.state.save_to_json(os.path.join(staged, "trainer_state.json"))
            if os.path.isdir(final):  # saved again at the same step (e.g. after a resume): replace it whole
                self._discard([final], staging_root)
            os.replace(staged, final)
            self._discard(self._rotated_out(run_dir), staging_root)
            shutil.rmtree(staging_root, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def _rotated_out(self, run_dir: str) -> list[str]:
        """The checkpoints of `run_dir` that `save_total_limit` drops, chosen as transformers' `rotate_checkpoints`
        chooses them (the oldest, keeping the newest and the best one); it would delete them in place."""
        limit = self.args.save_total_limit
        checkpoints = sort_checkpoints(run_dir, use_mtime=True)
        if limit is None or limit <= 0 or len(checkpoints) <= limit:
            return []
        best = self.state.best_model_checkpoint
        protected = {checkpoints[-1]} | ({str(Path(best))} if best is not None else set())
        unprotected = [checkpoint for checkpoint in checkpoints if checkpoint not in protected]
        return unprotected[: len(checkpoints) - max(limit, len(protected))]

    @staticmethod
    def _discard(checkpoints: list[str], staging_root: str) -> None:
        """Move each of `checkpoints` into `staging_root` (one `os.replace` each), where the caller deletes them."""
        discarded = os.path.join(staging_root, DISCARDED_DIR)
        os.makedirs(discarded, exist_ok=True)
        for number, checkpoint in enumerate(checkpoints):
            os.replace(checkpoint, os.path.join(discarded, f"{number}-{os.path.basename(checkpoint)}"))

    def remove_checkpoints(self) -> list[str]:
        """
        Remove every `checkpoint-N` folder of `output_dir` (what `--overwrite_output_dir` asks before training
        starts over), each renamed into the staging folder before it is deleted, so an interruption leaves each one
        whole or gone. Returns their names (on the saving process; [] on the others).
        """
        run_dir = self.args.output_dir
        removed = []
        if self.args.should_save and os.path.isdir(run_dir):
            checkpoints = sort_checkpoints(run_dir)
            staging_root = os.path.join(run_dir, STAGING_DIR)
            self._discard(checkpoints, staging_root)
            shutil.rmtree(staging_root, ignore_errors=True)
            removed = [os.path.basename(checkpoint) for checkpoint in checkpoints]
        self.accelerator.wait_for_everyone()
        return removed


class SeqBertTrainer(AtomicCheckpointsMixin, Trainer):
    """`transformers.Trainer` whose checkpoints appear whole or not at all (see `AtomicCheckpointsMixin`)."""


class SeqBertSeq2SeqTrainer(AtomicCheckpointsMixin, Seq2SeqTrainer):
    """
    `transformers.Seq2SeqTrainer` whose checkpoints appear whole or not at all (see `AtomicCheckpointsMixin`), and
    whose length-grouped training batches (`train_sampling_strategy="group_by_length"`, `group_by_length=True` before
    transformers 5.10) are grouped by target length.

    transformers groups by the length of `input_ids`, the source. SeqBERT's encoder drops the source's padding before
    its linear layers, but the decoder computes every padded target position, the 30,522-wide LM head included: our
    choice of grouping by `labels` cuts the default KJV -> WEB run's target padding from 13 % to 2 % (its source
    padding rises from 2 % to 13 %, which the encoder skips) and its training time by about 7 %. A dataset with a
    `length` column (`length_column_name`) is grouped by that column, as transformers documents (its 5.24 drops the
    column before the sampler reads it).

    It also predicts on a dataset without labels: transformers' `DataCollatorForSeq2Seq` then writes `labels=None`
    into every batch, which `Seq2SeqTrainer.prediction_step` (5.24) takes for labels and runs a teacher-forced forward
    pass without any; here a `labels` entry that is None is dropped first, so the batch is generated only.
    """

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        if "labels" in inputs and inputs["labels"] is None:
            inputs = {name: value for name, value in inputs.items() if name != "labels"}
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        grouped = getattr(self.args, "train_sampling_strategy", None) == "group_by_length"
        if not (grouped or getattr(self.args, "group_by_length", False) is True) or not has_length(dataset):
            return super()._get_train_sampler(train_dataset)
        length_column = self.args.length_column_name
        if length_column in (getattr(self.train_dataset, "column_names", None) or []):
            lengths = list(self.train_dataset[length_column])
        elif "labels" in (getattr(dataset, "column_names", None) or []):
            lengths = [len(labels) for labels in dataset["labels"]]
        else:
            return super()._get_train_sampler(train_dataset)
        if len(lengths) != len(dataset):
            return super()._get_train_sampler(train_dataset)
        batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
        return LengthGroupedSampler(batch, dataset=dataset, lengths=lengths)


# The precision a training run takes when its user names none: bf16 autocast only where a training step timed on the
# run's own model and batch ran at least MIN_BF16_SPEEDUP times faster than fp32 in at least MIN_BF16_SHARE of the
# rounds (each round times both, so a ratio within a round is taken while the machine runs at one speed). bf16 changes
# the numbers (the default pretraining run reached the same quality both ways), so a tie, or a gain within the spread
# of a few steps on a shared machine, keeps fp32, the reference; so do rounds that disagree, and a timing whose median
# round of one precision ran more than MAX_ROUND_SPREAD times slower than its fastest: then another process held the
# CPU through most rounds, and a few steps cannot tell the precisions apart (on 2 cores beside test runs, with steps 2
# to 10 times slower than alone, the same timing read bf16 at 0.45x to 2.24x fp32 within a minute). A minority of
# disturbed rounds is tolerated: the paired ratios of the others still decide.
MIN_BF16_SPEEDUP = 1.1
MIN_BF16_SHARE = 2 / 3
MAX_ROUND_SPREAD = 1.5
# Fewer rounds than this (the timing stopped at its time limit: steps many times slower than alone) decide nothing.
MIN_TIMED_ROUNDS = 3
# Where a step of the whole batch would pass this many FLOPs (6 x parameters x tokens, forward and backward; an
# overestimate, as the embeddings count in full), the precisions are timed on its first rows only: a step then takes
# about 0.1 to 0.4 s on one or two cores, and the ten steps of the timing a few seconds.
PRECISION_TIMING_FLOPS = 4e10


@dataclass(frozen=True)
class TrainingStepTimes:
    """
    Seconds of one training step (forward and backward, the optimizer left out: it runs on fp32 master weights in both)
    of the same batch in fp32 and under `torch.autocast(dtype=torch.bfloat16)`, round by round, the two precisions
    taking turns (`time_training_precisions`).

    Args:
        fp32: each round's fp32 step, in seconds.
        bf16: each round's bf16-autocast step, in seconds (as many as `fp32`).
        tokens: token positions of the batch the steps ran on (padding included; the batch's first rows where it is
            large, see `timing_rows`).
    """

    fp32: tuple[float, ...]
    bf16: tuple[float, ...]
    tokens: int

    def __post_init__(self):
        if not self.fp32 or len(self.fp32) != len(self.bf16):
            raise ValueError(
                f"fp32 ({len(self.fp32)} rounds) and bf16 ({len(self.bf16)} rounds) must hold the same number of "
                "rounds, at least one"
            )

    @property
    def ratios(self) -> tuple[float, ...]:
        """Each round's fp32 step over its bf16 step: above 1, bf16 was faster in that round."""
        return tuple(fp32 / bf16 for fp32, bf16 in zip(self.fp32, self.bf16, strict=True))

    @property
    def steady(self) -> bool:
        """Whether each precision's median round is within `MAX_ROUND_SPREAD` times its fastest: most rounds ran at
        the speed the machine gives undisturbed."""
        return all(statistics.median(rounds) <= MAX_ROUND_SPREAD * min(rounds) for rounds in (self.fp32, self.bf16))

    @property
    def speedup(self) -> float:
        """The median of the rounds' `ratios`."""
        return statistics.median(self.ratios)

    def summary(self) -> str:
        """Both precisions' median step with its fastest and slowest round, and the rounds' ratios, in one line."""
        ratios = self.ratios
        return (
            f"fp32 {_seconds(self.fp32)}, bf16 autocast {_seconds(self.bf16)} per training step (median "
            f"[fastest-slowest] of {len(ratios)} interleaved rounds on {self.tokens:,} tokens): bf16 {self.speedup:.2f}x "
            f"fp32 [{min(ratios):.2f}-{max(ratios):.2f}], at least {MIN_BF16_SPEEDUP}x in "
            f"{sum(r >= MIN_BF16_SPEEDUP for r in ratios)} of {len(ratios)} rounds"
        )


def _seconds(values) -> str:
    return f"{statistics.median(values):.3f} s [{min(values):.3f}-{max(values):.3f}]"


def timing_rows(model: torch.nn.Module, rows: int, tokens_per_row: int) -> int:
    """How many of a batch's `rows` (each of about `tokens_per_row` tokens) `time_training_precisions` times on: all of
    them, or as many as keep a step under `PRECISION_TIMING_FLOPS` (6 x parameters x tokens), at least one."""
    flops_per_row = 6 * sum(p.numel() for p in model.parameters()) * max(tokens_per_row, 1)
    return max(1, min(rows, int(PRECISION_TIMING_FLOPS // flops_per_row)))


def time_training_precisions(
    model: torch.nn.Module,
    batch: dict,
    rounds: int = 7,
    min_rounds: int = MIN_TIMED_ROUNDS,
    budget_seconds: float = 3.0,
    max_seconds: float = 10.0,
    clock=None,
) -> TrainingStepTimes:
    """
    Time a training step of `model` on `batch` in fp32 and under bf16 autocast on the CPU, the two taking turns (the
    first of a round alternates), after one untimed step of each (the first bf16 call creates oneDNN's primitives).
    Rounds stop after `rounds`, after `min_rounds` once `budget_seconds` of timed steps have passed, or after any
    round once every step so far, the untimed ones included, took `max_seconds` (a machine busy with other work:
    `choose_training_precision` keeps fp32 on fewer than `MIN_TIMED_ROUNDS` rounds).

    The steps run in train mode (dropout as training has it). The model is left as it was: its weights are not
    updated, its gradients are cleared (they must be None before), its train/eval mode is restored, and so is the CPU
    random state that dropout draws from (`torch.random.fork_rng`).

    Args:
        model: the model to train; `model(**batch).loss` is its loss.
        batch: a collated training batch (`labels` included), on the CPU.
        clock: seconds as a float (default `time.perf_counter`); tests give a scripted one.

    Returns:
        `TrainingStepTimes` (`tokens`: the number of `batch["input_ids"]`).

    Raises:
        ValueError: `rounds` or `min_rounds` is below 1, or `min_rounds` above `rounds`; a parameter already holds a
            gradient.
    """
    if not 1 <= min_rounds <= rounds:
        raise ValueError(f"rounds ({rounds}) and min_rounds ({min_rounds}) must satisfy 1 <= min_rounds <= rounds")
    parameters = [p for p in model.parameters() if p.requires_grad]
    if any(p.grad is not None for p in parameters):
        raise ValueError("model already holds gradients: time_training_precisions would overwrite them")
    clock = clock or time.perf_counter

    def step(bf16: bool) -> float:
        start = clock()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.backward()
        for p in parameters:
            p.grad = None
        return clock() - start

    times = {False: [], True: []}
    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[]):
            total = step(False) + step(True)
            timed = 0.0
            for index in range(rounds):
                for bf16 in (False, True) if index % 2 == 0 else (True, False):
                    times[bf16].append(step(bf16))
                    timed += times[bf16][-1]
                if (index + 1 >= min_rounds and timed >= budget_seconds) or total + timed >= max_seconds:
                    break
    finally:
        model.train(was_training)
    return TrainingStepTimes(fp32=tuple(times[False]), bf16=tuple(times[True]), tokens=batch["input_ids"].numel())


def bf16_is_faster(
    times: TrainingStepTimes, min_speedup: float = MIN_BF16_SPEEDUP, min_share: float = MIN_BF16_SHARE
) -> bool:
    """Whether `times` favour bf16 autocast: its step at least `min_speedup` times faster than fp32's in at least
    `min_share` of the rounds."""
    return sum(ratio >= min_speedup for ratio in times.ratios) >= min_share * len(times.ratios)


def choose_training_precision(times: TrainingStepTimes) -> "TrainingPrecisionRecord":
    """bf16 autocast where `times` hold at least `MIN_TIMED_ROUNDS` rounds, are steady (`TrainingStepTimes.steady`)
    and favour it (`bf16_is_faster`), else fp32; the record's reason gives the verdict, the times and the rule."""
    complete = len(times.fp32) >= MIN_TIMED_ROUNDS
    bf16 = complete and times.steady and bf16_is_faster(times)
    if bf16:
        verdict = "bf16 autocast"
    elif not complete:
        verdict = (
            f"fp32 (the timing stopped at its time limit after {len(times.fp32)} of {MIN_TIMED_ROUNDS} rounds, as when "
            "another process holds the CPU; --bf16 True trains in bf16 anyway)"
        )
    elif not times.steady:
        verdict = (
            f"fp32 (the timing was unsteady: most rounds of a precision ran over {MAX_ROUND_SPREAD}x slower than its "
            "fastest, as when another process uses the CPU; --bf16 True trains in bf16 anyway)"
        )
    elif times.speedup >= MIN_BF16_SPEEDUP:
        verdict = "fp32 (the rounds disagree, as when another process uses the CPU; --bf16 True trains in bf16 anyway)"
    else:
        verdict = "fp32"
    return TrainingPrecisionRecord(
        bf16,
        f"{verdict}, timed on this CPU: {times.summary()}. The default is bf16 where a steady timing finds it at least "
        f"{MIN_BF16_SPEEDUP}x faster in {MIN_BF16_SHARE:.0%} of the rounds; --bf16 True or False decides without timing",
    )


class TrainingPrecisionRecord(TrainerCallback, ExportableState):
    """
    Records in every checkpoint's `trainer_state.json` (`stateful_callbacks`) the precision the run trains in and why,
    so a run resumed without naming one takes the interrupted run's instead of measuring anew
    (`recorded_training_precision`).

    Args:
        bf16: whether the run trains under bf16 autocast.
        reason: why, in words (the measurement, the user's flag, ...).
    """

    def __init__(self, bf16: bool, reason: str):
        self.bf16, self.reason = bf16, reason

    def state(self) -> dict:
        return {"args": {"bf16": self.bf16, "reason": self.reason}, "attributes": {}}


def recorded_training_precision(checkpoint: str | None) -> TrainingPrecisionRecord | None:
    """The `TrainingPrecisionRecord` that `checkpoint`'s `trainer_state.json` holds, or None (no checkpoint, or one
    written without the record)."""
    if checkpoint is None:
        return None
    path = Path(checkpoint) / TRAINER_STATE_NAME
    if not path.is_file():
        return None
    saved = json.loads(path.read_text(encoding="utf-8")).get("stateful_callbacks", {})
    record = saved.get(TrainingPrecisionRecord.__name__)
    return None if not isinstance(record, dict) else TrainingPrecisionRecord(**record["args"])
