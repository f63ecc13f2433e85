"""Plumbing the example scripts share: argument parsing and the command-line entry point, logging set-up, a
multi-process launch check, where training starts (a new run, or the resume of an interrupted one: `resume_point`),
local data files, and the checks that turn bad input into a clear message before anything is written to
`--output_dir`."""

import argparse
import ctypes
import ctypes.util
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
import transformers
from transformers import AutoConfig, AutoTokenizer, HfArgumentParser, PretrainedConfig, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import SaveStrategy, get_last_checkpoint
from transformers.training_args import ParallelMode

from .hub import write_model_card
from .plots import save_loss_curve
from .training import STAGING_DIR


if TYPE_CHECKING:  # imported where used: the GPU benchmark parses its arguments here on machines without datasets
    import datasets


logger = logging.getLogger(__name__)


@dataclass
class ScriptTrainingDefaults:
    """
    `TrainingArguments` defaults that every example script shares. Mix it in before the transformers class
    (`class MyArguments(ScriptTrainingDefaults, TrainingArguments)`): dataclass inheritance keeps each field where
    `TrainingArguments` puts it and only changes its default, and every field can still be set on the command line.
    """

    logging_steps: float = field(default=10, metadata={"help": "Log the training loss every N steps."})
    save_strategy: SaveStrategy | str = field(
        default="no", metadata={"help": "When to save checkpoints: no, steps, epoch or best. The final model is saved."}
    )
    ddp_find_unused_parameters: bool | None = field(
        default=False,
        metadata={"help": "DDP: look for parameters without gradient each step. SeqBERT heads use all of theirs."},
    )
    # Same type, in the same order, as in TrainingArguments: HfArgumentParser reads the first non-None member.
    report_to: None | str | list[str] = field(
        default="none", metadata={"help": "Integrations to report to (tensorboard, wandb, ...), or none."}
    )
    # Pinned host memory speeds up copies to an accelerator; without one, torch only warns, for every data loader.
    dataloader_pin_memory: bool = field(
        default=torch.accelerator.is_available(),
        metadata={"help": "Pin data-loader memory (default: where an accelerator is present)."},
    )
    # transformers 5 dropped this field of TrainingArguments; its example scripts used it as the scripts here do.
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Train from the start even though output_dir holds checkpoints or an earlier run's model: its "
            "checkpoints are removed when training starts and its files overwritten. Without it, training resumes "
            "from the newest checkpoint in output_dir (see --resume_from_checkpoint)."
        },
    )


# File types that `--train_file` / `--validation_file` / `--test_file` accept.
DATA_FILE_EXTENSIONS = ("csv", "json", "jsonl")

# The `datasets` loader of each data file type (`load_data_files`); `txt` (one text a line) is for run_mlm.py only.
DATA_FILE_LOADERS = {"csv": "csv", "json": "json", "jsonl": "json", "txt": "text"}


class ScriptInputError(ValueError):
    """
    Bad command-line arguments or input data (a missing or empty data file, a column the data lacks, a length the
    model cannot take, ...), found before anything is written to `--output_dir`. The message names the argument, its
    value and what is allowed. Called from Python, a script's `main` raises it (it is a `ValueError`); on the command
    line `run_cli` prints it as a one-line usage error without a traceback. A message with line breaks (one quoting
    transformers' or datasets' own, say) is joined into one line.
    """

    def __init__(self, message: str):
        super().__init__(re.sub(r"\s*\n\s*", " ", str(message).strip()))


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after each argument's help (HfArgumentParser's own choice), the description's lines as written."""


def script_parser(dataclass_types, docstring: str) -> HfArgumentParser:
    """
    The `HfArgumentParser` of a script, whose `--help` starts with the first paragraph of the script's `docstring`:
    what the script does and how long its default run takes.
    """
    description = docstring.strip().split("\n\n")[0]
    # A one-line usage: argparse's own lists every option first (over a hundred lines with TrainingArguments).
    return HfArgumentParser(
        dataclass_types, usage="%(prog)s [--option value ...]", description=description, formatter_class=_HelpFormatter
    )


def parse_arguments(parser: HfArgumentParser, argv: list[str] | None, defaults: dict | None = None) -> tuple:
    """
    The dataclasses of `parser`, from `argv` (else the command line; a single `.json` command-line argument is read
    with `parser.parse_json_file`). `defaults` (field name -> value) replace the dataclasses' defaults, for a
    command line (argparse's `set_defaults`) and a JSON file (its values win) alike.

    Raises:
        ScriptInputError: a dataclass rejected a value (the scripts' `__post_init__` checks, `TrainingArguments`'),
            or an argument is unknown to `parser` (an option it lacks, or a word left over after an option's value).
            (argparse itself still exits with status 2 on a malformed value.)
    """
    try:
        if argv is None and len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
            with open(os.path.abspath(sys.argv[1]), encoding="utf-8") as file:
                return parser.parse_dict({**(defaults or {}), **json.load(file)})
        parser.set_defaults(**(defaults or {}))
        *parsed, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    except ScriptInputError:
        raise
    except ValueError as error:
        raise ScriptInputError(str(error)) from error
    except OverflowError as error:  # TrainingArguments turned an infinite float into an int (`--logging_steps inf`)
        words = sys.argv[1:] if argv is None else argv
        infinite = [
            f"{option} ({value})" for option, value in zip(words, words[1:], strict=False) if _is_infinite(value)
        ]
        raise ScriptInputError(f"{', '.join(infinite) or 'an argument'} must be a finite number ({error})") from error
    if remaining:
        raise ScriptInputError(
            f"unrecognized arguments {remaining}: each argument is an option of this script followed by its value "
            f"(--name value; see --help for the options)"
        )
    return tuple(parsed)


def _is_infinite(word: str) -> bool:
    """Whether the command-line word `word` reads as an infinite float ('inf', '-Infinity', '1e999', ...)."""
    try:
        return math.isinf(float(word))
    except ValueError:
        return False


def run_cli(main: Callable[[], object], parser: argparse.ArgumentParser) -> None:
    """
    The command-line entry point of a script: run `main()`; a `ScriptInputError` becomes `PROG: error: MESSAGE` on
    stderr and exit status 2, argparse's convention for usage errors (without the usage text, which for
    `TrainingArguments` runs to a hundred lines). Other exceptions propagate with their traceback: they are bugs or
    failures, not bad input.
    """
    try:
        main()
    except ScriptInputError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


# mallopt(3) parameters of glibc (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def reuse_freed_memory(threshold: int = 1 << 30) -> bool:
    """
    Make glibc's allocator keep freed memory for reuse rather than hand it back to the operating system: the training
    scripts call this first, from the command line only.

    glibc serves an allocation above its mmap threshold (adaptive, at most 32 MiB on 64-bit Linux) with a fresh
    `mmap` and unmaps it on free. A training step allocates several tensors of that size (a 30,522 x 384 word
    embedding gradient is 47 MB; so are the logits over the vocabulary of a batch and their gradient), so each step
    page-faults them in again. With the mmap and trim thresholds raised (`mallopt` `M_MMAP_THRESHOLD` and
    `M_TRIM_THRESHOLD`) they are reused: a step of `run_seq2seq.py`'s default model falls from 679 to 560 ms on 2
    cores (2026-11-25, 20 batches of 8 verse pairs, median). The process's resident memory then stays near its peak
    between steps, which a training loop reaches at every step anyway. PyTorch's CPU performance guide gets the same
    effect by preloading jemalloc or tcmalloc; this needs nothing installed.

    Args:
        threshold (`int`, defaults to 1 GiB): the new mmap threshold in bytes; the trim threshold is set to twice it.

    Returns:
        `bool`: True when glibc took both settings; False where the C library is not glibc (macOS, Windows, musl),
        which are left as they are.
    """
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * threshold))


def setup_logging(training_args: TrainingArguments, logger: logging.Logger) -> None:
    """Log to stdout at the process's log level (`--log_level`, quieter on non-main ranks), for the script's
    `logger`, the shared helpers here, transformers and datasets, as transformers' example scripts do."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    logging.getLogger(__name__).setLevel(log_level)
    import datasets

    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    logger.info(
        f"Process rank: {training_args.process_index}, device: {training_args.device}, n_gpu: {training_args.n_gpu}, "
        f"distributed training: {training_args.parallel_mode == ParallelMode.DISTRIBUTED}"
    )


def check_distributed_launch(training_args: TrainingArguments) -> None:
    """
    Raise `ScriptInputError` (a `ValueError`) when the script was started as several processes (torchrun, accelerate
    launch) but transformers did not set up distributed training, so that each process would train alone on all the
    data (with transformers 5 on a machine without GPU this happens unless `--use_cpu` is given); or when FSDP was
    asked for on the CPU, where accelerate never sets it up (`fsdp_requested`; `check_fsdp` checks the trainer too).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and training_args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise ScriptInputError(
            f"launched as {world_size} processes (WORLD_SIZE={world_size}) but transformers set up "
            f"parallel_mode={training_args.parallel_mode.value!r}, so each process would train alone on all the data: "
            "on a machine without GPU add --use_cpu (DDP over CPU processes with the gloo backend)"
        )
    asked = fsdp_requested(training_args)
    if asked is not None and training_args.device.type == "cpu":
        state = getattr(training_args, "distributed_state", None)
        distributed_type = getattr(getattr(state, "distributed_type", None), "value", "no distributed training")
        raise ScriptInputError(_fsdp_refusal(asked, distributed_type))


def fsdp_requested(training_args: TrainingArguments) -> str | None:
    """
    How FSDP was asked for, as the scripts' messages name it, or None where it was not:

    - `--fsdp` (`fsdp=True`), transformers 5's form, its settings in `--fsdp_config` (a JSON file or dict);
    - the older string or list forms (`--fsdp full_shard`, `--fsdp "full_shard auto_wrap"`), which transformers 5.24
      still accepts with a deprecation warning: it moves them into `fsdp_config` and sets `fsdp=True`, so they read
      as `--fsdp` here (on releases that keep them as given, they are named as given);
    - an accelerate FSDP config (`accelerate launch --config_file fsdp.yaml`), which sets `ACCELERATE_USE_FSDP=true`.
    """
    fsdp = training_args.fsdp
    if fsdp is True:
        return "--fsdp"
    if fsdp:  # a string or list transformers kept as given
        return f"--fsdp {' '.join(str(getattr(option, 'value', option)) for option in _as_list(fsdp))!r}"
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "an accelerate FSDP config (ACCELERATE_USE_FSDP=true)"
    return None


def _as_list(value) -> list:
    return value.split() if isinstance(value, str) else list(value)


def _fsdp_refusal(asked: str, distributed_type: str) -> str:
    return (
        f"{asked} was given, but accelerate set up {distributed_type} instead of FSDP: FSDP needs several accelerator "
        "processes (e.g. `accelerate launch --config_file scripts/examples/accelerate/fsdp.yaml ...`, or `torchrun "
        "... --fsdp --fsdp_config CONFIG.json` on GPUs); on CPU use DDP (torchrun ... --use_cpu) without --fsdp"
    )


def check_fsdp(trainer) -> None:
    """
    Raise `ScriptInputError` (a `ValueError`) when FSDP was asked for (`fsdp_requested`: `--fsdp`, its older string
    forms, or an accelerate FSDP config) but accelerate did not set it up. accelerate enables FSDP only on accelerators
    (GPU, XPU, NPU, ...): on CPU processes it silently trains with DDP instead.
    """
    asked = fsdp_requested(trainer.args)
    if asked is not None and not trainer.is_fsdp_enabled:
        raise ScriptInputError(_fsdp_refusal(asked, trainer.accelerator.distributed_type.value))


# Values of `--resume_from_checkpoint` (any case) that ask for the newest checkpoint in `--output_dir`.
NEWEST_CHECKPOINT_VALUES = ("true", "latest")

# What `train_and_save` leaves in `--output_dir` besides checkpoints: the model's config, the trainer state and the
# merged metrics. A new run would overwrite them, so without a checkpoint to resume from it needs
# `--overwrite_output_dir` (transformers' example scripts refused any non-empty folder; other files are left alone).
RUN_OUTPUT_FILES = ("config.json", TRAINER_STATE_NAME, "all_results.json")


@dataclass(frozen=True)
class ResumePoint:
    """
    Where training starts (`resume_point`): from `checkpoint`, or from the start when it is None.

    Args:
        checkpoint (`str` or `None`): the checkpoint folder to resume from.
        reason (`str`): why, for the log line (`message`).
        start_over (`bool`): `--overwrite_output_dir`: `train_and_save` removes the checkpoints of `output_dir`
            before training, so that an interruption of the new run never resumes from an old one.
    """

    checkpoint: str | None
    reason: str
    start_over: bool = False

    @property
    def message(self) -> str:
        """One line: which checkpoint training resumes from and why, or why it starts from the beginning."""
        if self.checkpoint is None:
            return f"Training from the start: {self.reason}"
        return f"Resuming training from checkpoint {self.checkpoint}: {self.reason}"


def check_checkpoint(argument: str, path: str) -> None:
    """
    Check that `path`, the value of the argument `argument`, is a complete Trainer checkpoint folder: it has
    `trainer_state.json`, which `Trainer` writes last, and is not inside the staging folder where
    `seqbert.training`'s trainers assemble a checkpoint before renaming it into place.

    Raises:
        ScriptInputError: `path` does not exist, is not a folder, is a checkpoint still being assembled, or lacks
            `trainer_state.json`.
    """
    allowed = (
        "give a checkpoint folder (OUTPUT_DIR/checkpoint-N), True or latest for the newest checkpoint in "
        "output_dir, or leave the argument out (training resumes from output_dir's newest checkpoint if it has one; "
        "--overwrite_output_dir starts over)"
    )
    if not os.path.isdir(path):
        problem = "is not a folder" if os.path.exists(path) else "does not exist"
        raise ScriptInputError(f"{argument} ({path!r}) {problem}: {allowed}")
    if STAGING_DIR in os.path.normpath(os.path.abspath(path)).split(os.sep):
        raise ScriptInputError(
            f"{argument} ({path!r}) is inside {STAGING_DIR}, where a checkpoint is assembled before it is renamed "
            f"into place, so it may be incomplete: {allowed}"
        )
    if not os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)):
        raise ScriptInputError(
            f"{argument} ({path!r}) is not a complete Trainer checkpoint: it has no {TRAINER_STATE_NAME}, which "
            f"Trainer writes last; {allowed}"
        )


def newest_checkpoint(output_dir: str) -> str | None:
    """
    The newest checkpoint in `output_dir` (`transformers.trainer_utils.get_last_checkpoint`: the `checkpoint-N`
    folder of the highest N), or None when there is none or `output_dir` does not exist. `seqbert.training`'s trainers
    rename a checkpoint into place only once complete (and move one out of the way before deleting it), so a run
    killed at any moment leaves only complete `checkpoint-N` folders; a partial one left by some other program is
    refused rather than resumed from.

    Raises:
        ScriptInputError: the newest checkpoint is incomplete (`check_checkpoint`).
    """
    if not os.path.isdir(output_dir):
        return None
    checkpoint = get_last_checkpoint(output_dir)
    if checkpoint is not None:
        check_checkpoint(f"the newest checkpoint of output_dir ({output_dir!r})", checkpoint)
    return checkpoint


def resume_point(training_args: TrainingArguments) -> ResumePoint:
    """
    Where training starts, from `--resume_from_checkpoint`, `--overwrite_output_dir` and what `--output_dir` holds,
    as users restart a run that was stopped (even with `kill -9`): the same command, with or without
    `--resume_from_checkpoint`, resumes from the newest complete checkpoint.

    - `--resume_from_checkpoint PATH`: that checkpoint (`check_checkpoint`);
    - `--resume_from_checkpoint True` (or `latest`, any case): the newest checkpoint in `output_dir`
      (`newest_checkpoint`);
    - neither flag: the newest checkpoint in `output_dir` if it has one (what transformers' example scripts do), else
      the start; refused when `output_dir` holds an earlier run's model or results (`RUN_OUTPUT_FILES`) but no
      checkpoint;
    - `--overwrite_output_dir`: the start (`train_and_save` then removes `output_dir`'s checkpoints).

    Sets `training_args.resume_from_checkpoint` to the checkpoint (or None). Reads `output_dir`, writes nothing.
    Without `do_train` nothing is resumed.

    Raises:
        ScriptInputError: `output_dir` is a file or an empty string; `--resume_from_checkpoint` is not a complete
            checkpoint folder, asks for the newest checkpoint of an `output_dir` without one, is combined with
            `--overwrite_output_dir`, or is given without `do_train`; `output_dir` holds an earlier run's model or
            results and no checkpoint, and `--overwrite_output_dir` is not given; the newest checkpoint in
            `output_dir` is incomplete.
    """
    flag, output_dir = training_args.resume_from_checkpoint, training_args.output_dir
    if not output_dir:
        raise ScriptInputError(f"output_dir ({output_dir!r}) must be the path of a folder (new or existing)")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ScriptInputError(f"output_dir ({output_dir!r}) is a file: give the path of a folder (new or existing)")
    if not training_args.do_train:
        if flag is not None:
            raise ScriptInputError(f"resume_from_checkpoint ({flag!r}) resumes training, but do_train is False")
        training_args.resume_from_checkpoint = None
        return ResumePoint(None, "no training (do_train False)")
    if training_args.overwrite_output_dir:
        if flag is not None:
            raise ScriptInputError(
                f"resume_from_checkpoint ({flag!r}) resumes a run, but overwrite_output_dir (True) starts over: give "
                "one of them"
            )
        return ResumePoint(None, "--overwrite_output_dir starts over", start_over=True)
    if flag is None:
        checkpoint = newest_checkpoint(output_dir)
        if checkpoint is not None:
            reason = (
                f"the newest checkpoint found in output_dir ({output_dir!r}), as no --resume_from_checkpoint was "
                "given (--overwrite_output_dir starts over instead)"
            )
            training_args.resume_from_checkpoint = checkpoint
            return ResumePoint(checkpoint, reason)
        earlier = [name for name in RUN_OUTPUT_FILES if os.path.isfile(os.path.join(output_dir, name))]
        if earlier:
            raise ScriptInputError(
                f"output_dir ({output_dir!r}) holds an earlier run's {', '.join(earlier)} and no checkpoint to resume "
                "from: pass --overwrite_output_dir to train again and overwrite them, or choose another output_dir"
            )
        return ResumePoint(None, f"no checkpoint in output_dir ({output_dir!r})")
    if flag.lower() in NEWEST_CHECKPOINT_VALUES:
        checkpoint = newest_checkpoint(output_dir)
        if checkpoint is None:
            raise ScriptInputError(
                f"resume_from_checkpoint ({flag!r}) resumes from the newest checkpoint in output_dir ({output_dir!r}), "
                "but it has no checkpoint-N folder: give a checkpoint folder, or leave the argument out to start a "
                "new run"
            )
        training_args.resume_from_checkpoint = checkpoint
        return ResumePoint(checkpoint, f"the newest checkpoint in output_dir, as --resume_from_checkpoint {flag} asks")
    check_checkpoint("resume_from_checkpoint", flag)
    return ResumePoint(flag, "given by --resume_from_checkpoint")


def train_and_save(trainer, train_dataset, start: ResumePoint) -> dict[str, float]:
    """
    Train from `start` (`resume_point`: a checkpoint, logged in one line, or the beginning; with
    `start.start_over`, `output_dir`'s checkpoints are removed first), then save the model (and, as
    `processing_class`, the tokenizer), the train metrics (`train_results.json`, merged into `all_results.json`) and
    the trainer state, as transformers' example scripts do. Returns the train metrics with `train_samples`.
    """
    if start.start_over:
        removed = trainer.remove_checkpoints()
        if removed and trainer.is_world_process_zero():
            logger.warning(f"{start.reason}: removed the {len(removed)} checkpoint(s) of output_dir: {removed}")
    if start.checkpoint is not None and trainer.is_world_process_zero():
        # A warning, so that it shows at the scripts' default log level: the run continues an earlier one.
        logger.warning(start.message)
    result = trainer.train(resume_from_checkpoint=start.checkpoint)
    metrics = dict(result.metrics, train_samples=len(train_dataset))
    trainer.save_model()
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def write_json(path: str | None, data) -> None:
    """Write `data` to `path` as indented JSON with a final newline (the scripts' `--json_file`); nothing when `path`
    is None."""
    if path is None:
        return
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def log_and_save_metrics(trainer, split: str, metrics: dict[str, float]) -> dict[str, float]:
    """Log `metrics` and write them to `output_dir/{split}_results.json` (merged into `all_results.json`), as
    transformers' example scripts do after each stage. Returns `metrics`."""
    trainer.log_metrics(split, metrics)
    trainer.save_metrics(split, metrics)
    return metrics


def finish_run(
    trainer,
    metrics: dict[str, float],
    card_info: Callable[[], dict],
    summary_keys: list[str],
    number_format: str = ".4g",
    ylabel: str = "cross-entropy loss",
) -> None:
    """
    The end of every training script, on the main process only: `output_dir/loss_curve.png` from the trainer's log
    history, the model card `README.md` from `card_info()` when the run trained, and one `Done: ...` line on stdout
    with the `summary_keys` of `metrics` that the run computed.
    """
    if not trainer.is_world_process_zero():
        return
    output_dir = trainer.args.output_dir
    loss_curve = os.path.join(output_dir, "loss_curve.png")
    save_loss_curve(trainer.state.log_history, loss_curve, ylabel=ylabel)
    logger.info(f"Loss curve written to {loss_curve}")
    if trainer.args.do_train:
        logger.info(f"Model card written to {write_model_card(output_dir, card_info())}")
    summary = ", ".join(f"{key} = {metrics[key]:{number_format}}" for key in summary_keys if key in metrics)
    print(f"Done: {summary or 'no scores computed'}; model, metrics and loss curve in {output_dir}")


def _load_pretrained(auto_class, what: str, argument: str, name_or_path: str, cache_dir: str | None):
    """`auto_class.from_pretrained(name_or_path)`, with transformers' failure turned into a `ScriptInputError` that
    names the argument `argument` and quotes transformers' reason."""
    try:
        return auto_class.from_pretrained(name_or_path, cache_dir=cache_dir)
    except (OSError, ValueError, KeyError) as error:
        raise ScriptInputError(
            f"{argument} ({name_or_path!r}) must be a model folder or Hub model id with a {what} transformers can "
            f"load: {error}"
        ) from error


def load_config(argument: str, name_or_path: str, cache_dir: str | None = None) -> PretrainedConfig:
    """
    `AutoConfig.from_pretrained(name_or_path)`, the model named by the argument `argument` (e.g.
    `model_name_or_path`).

    Raises:
        ScriptInputError: transformers cannot load a config from `name_or_path` (no such folder or Hub model, no
            `config.json`, a model type it does not know, ...); the message names the argument and quotes
            transformers' reason.
    """
    return _load_pretrained(AutoConfig, "config", argument, name_or_path, cache_dir)


def load_tokenizer(argument: str, name_or_path: str, cache_dir: str | None = None):
    """
    `AutoTokenizer.from_pretrained(name_or_path)`, the tokenizer named by the argument `argument`.

    Raises:
        ScriptInputError: transformers cannot load a tokenizer from `name_or_path`; the message names the argument
            and quotes transformers' reason.
    """
    return _load_pretrained(AutoTokenizer, "tokenizer", argument, name_or_path, cache_dir)


def check_data_file(name: str, path: str | None, extensions: tuple[str, ...] = DATA_FILE_EXTENSIONS) -> None:
    """
    Check the data file argument `name` (e.g. `train_file`) unless `path` is None.

    Raises:
        ScriptInputError: `path` does not end in `.EXT` for one of `extensions`, does not exist, is not a file, or is
            empty (0 bytes).
    """
    if path is None:
        return
    allowed = ", ".join("." + extension for extension in extensions)
    if path.rsplit(".", 1)[-1] not in extensions:
        raise ScriptInputError(f"{name} ({path!r}) must end in one of {allowed}")
    if not os.path.isfile(path):
        problem = "is not a file" if os.path.exists(path) else "does not exist"
        raise ScriptInputError(f"{name} ({path!r}) {problem}: give the path of an existing {allowed} file")
    if os.path.getsize(path) == 0:
        raise ScriptInputError(f"{name} ({path!r}) is empty: it must hold at least one example")


@dataclass
class DataSourceArguments:
    """
    The data fields the training scripts share: a Hub dataset or local files (never both), and each split cut to its
    first N examples. Each script subclasses it with its own columns and lengths (a subclass may redefine a field to
    reword its help); `__post_init__` checks the shared fields, and a subclass that adds checks calls it first.

    Raises:
        ValueError: `dataset_name` given together with a data file, or a `max_*_samples` below 1 (argparse
            reports it as a usage error naming the argument).
        ScriptInputError: a data file that is missing, empty, or has another extension (`check_data_file`).
    """

    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset name for `datasets.load_dataset`."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration name of `dataset_name`."})
    train_file: str | None = field(default=None, metadata={"help": "A csv or json(l) file of training examples."})
    validation_file: str | None = field(
        default=None, metadata={"help": "A csv or json(l) file of validation examples."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N validation examples."})

    # The data file fields and the `max_*_samples` fields of the script, and the extensions its files may have.
    FILE_FIELDS: ClassVar[tuple[str, ...]] = ("train_file", "validation_file")
    SAMPLE_FIELDS: ClassVar[tuple[str, ...]] = ("max_train_samples", "max_eval_samples")
    FILE_EXTENSIONS: ClassVar[tuple[str, ...]] = DATA_FILE_EXTENSIONS

    def __post_init__(self):
        files = {name: getattr(self, name) for name in self.FILE_FIELDS}
        if self.dataset_name is not None and any(path is not None for path in files.values()):
            given = ", ".join(f"{name} ({path!r})" for name, path in files.items() if path is not None)
            raise ValueError(
                f"dataset_name ({self.dataset_name!r}) cannot be combined with {given}: give either a Hub dataset or "
                "local files"
            )
        for name, path in files.items():
            check_data_file(name, path, extensions=self.FILE_EXTENSIONS)
        stages = " / ".join(f"--{name.replace('max_', 'do_').replace('_samples', '')}" for name in self.SAMPLE_FIELDS)
        for name in self.SAMPLE_FIELDS:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} ({value}) must be >= 1 (to skip a stage, use {stages} False)")


def load_data_files(files: dict[str, str], cache_dir: str | None = None) -> "datasets.DatasetDict":
    """
    Splits from local files (`{"train": path, ...}`, each given as the argument `{split}_file`), each read with
    `datasets.load_dataset` and the loader of its type (`DATA_FILE_LOADERS`: csv, json / jsonl, txt).

    Raises:
        ScriptInputError: `datasets` cannot read a file, or reads no example from it (e.g. a csv file with only a
            header row, a jsonl file of blank lines); the message names the argument, the path and the reason.
    """
    import datasets

    raw = datasets.DatasetDict()
    for split, path in files.items():
        loader = DATA_FILE_LOADERS[path.rsplit(".", 1)[-1]]
        try:
            raw[split] = datasets.load_dataset(loader, data_files={split: path}, split=split, cache_dir=cache_dir)
        except datasets.exceptions.DatasetGenerationError as error:
            # A parse error, wrapped in a message that does not say what went wrong: its cause does.
            raise ScriptInputError(
                f"{split}_file ({path!r}) could not be read by datasets' {loader} loader: {error.__cause__ or error}"
            ) from error
        except ValueError as error:
            # How datasets refuses a split without rows: 'Instruction "train" corresponds to no data!'.
            raise ScriptInputError(
                f"{split}_file ({path!r}) holds no example that datasets' {loader} loader can read ({error}): it "
                "must hold at least one"
            ) from error
        if len(raw[split]) == 0:
            raise ScriptInputError(f"{split}_file ({path!r}) holds no example: it must hold at least one")
    return raw


def check_splits(raw: "datasets.DatasetDict", required: dict[str, str]) -> None:
    """
    Check that `raw` has each split of `required` (`{split: the argument that needs it}`, e.g.
    `{"train": "do_train"}`) and that none of them is empty.

    Raises:
        ScriptInputError: a required split is missing (the message names the argument and `--{split}_file`), or
            has no rows.
    """
    for split, needed_by in required.items():
        if split not in raw:
            raise ScriptInputError(
                f"{needed_by} (True) needs a {split} split, but the data has only {list(raw)}: give --{split}_file, "
                f"or {needed_by} False"
            )
        if len(raw[split]) == 0:
            raise ScriptInputError(f"the {split} split of the data has no rows, but {needed_by} (True) needs some")


def check_columns(raw: "datasets.DatasetDict", columns: dict[str, str]) -> None:
    """
    Check that every split of `raw` has each column of `columns` (`{argument: column}`, e.g.
    `{"text_column": "text"}`).

    Raises:
        ScriptInputError: a split lacks a column; the message names the argument, the column and the split's columns.
    """
    for split, dataset in raw.items():
        for argument, column in columns.items():
            if column not in dataset.column_names:
                raise ScriptInputError(
                    f"{argument} ({column!r}) is not a column of the {split} split: its columns are "
                    f"{dataset.column_names}"
                )


def position_limit(config: PretrainedConfig) -> int | None:
    """
    The longest sequence (in tokens) a model of `config` can take, or None when it has no such limit or this
    function does not know it: `max_position_embeddings` for BERT (`model_type` "bert", a learned position table)
    and for SeqBERT with `position_embedding_type` "learned"; None for SeqBERT with sinusoidal positions (they extend
    to any length) and for other model types.
    """
    if config.model_type == "bert":
        return config.max_position_embeddings
    if config.model_type == "seqbert" and config.position_embedding_type == "learned":
        return config.max_position_embeddings
    return None


def check_max_length(name: str, value: int | None, config: PretrainedConfig, model: str, hint: str = "") -> None:
    """
    Check the length argument `name` (e.g. `max_seq_length`) against the position limit of `config`
    (`position_limit`); `model` says in the message which model that is (e.g. "the model 'bert-base-uncased'"), and
    `hint` is added to its end. A `value` of None is not checked.

    Raises:
        ScriptInputError: `value` is above the limit; the message names the argument, the value and the limit.
    """
    limit = position_limit(config)
    if value is not None and limit is not None and value > limit:
        raise ScriptInputError(
            f"{name} ({value}) must be at most {limit}: {model} has learned position embeddings for "
            f"max_position_embeddings ({limit}) positions{hint}"
        )
