"""Plumbing the example scripts share: logging set-up, a multi-process launch check, and local data files."""

import logging
import os
import sys
from dataclasses import dataclass, field

import datasets
import transformers
from transformers import TrainingArguments
from transformers.trainer_utils import SaveStrategy
from transformers.training_args import ParallelMode


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


# File types that `--train_file` / `--validation_file` / `--test_file` accept.
DATA_FILE_EXTENSIONS = ("csv", "json", "jsonl")


def setup_logging(training_args: TrainingArguments, logger: logging.Logger) -> None:
    """Log to stdout at the process's log level (`--log_level`, quieter on non-main ranks), for the script's
    `logger`, transformers and datasets, as transformers' example scripts do."""
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    logger.warning(
        f"Process rank: {training_args.process_index}, device: {training_args.device}, n_gpu: {training_args.n_gpu}, "
        f"distributed training: {training_args.parallel_mode == ParallelMode.DISTRIBUTED}"
    )


def check_distributed_launch(training_args: TrainingArguments) -> None:
    """
    Raise `ValueError` when the script was started as several processes (torchrun, accelerate launch) but transformers
    did not set up distributed training, so that each process would train alone on all the data (with transformers 5
    on a machine without GPU this happens unless `--use_cpu` is given).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and training_args.parallel_mode != ParallelMode.DISTRIBUTED:
        raise ValueError(
            f"launched as {world_size} processes (WORLD_SIZE={world_size}) but transformers set up "
            f"parallel_mode={training_args.parallel_mode.value!r}, so each process would train alone on all the data: "
            "on a machine without GPU add --use_cpu (DDP over CPU processes with the gloo backend)"
        )


def check_fsdp(trainer) -> None:
    """
    Raise `ValueError` when FSDP was asked for (`--fsdp`, or an accelerate FSDP config, which sets
    `ACCELERATE_USE_FSDP=true`) but accelerate did not set it up. accelerate enables FSDP only on accelerators (GPU,
    XPU, NPU, ...): on CPU processes it silently trains with DDP instead.
    """
    from_config = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if (trainer.args.fsdp or from_config) and not trainer.is_fsdp_enabled:
        asked = (
            f"fsdp ({trainer.args.fsdp!r})" if trainer.args.fsdp else "an accelerate FSDP config (ACCELERATE_USE_FSDP)"
        )
        raise ValueError(
            f"{asked} was given, but accelerate set up {trainer.accelerator.distributed_type.value} "
            "instead of FSDP: FSDP needs several accelerator processes (e.g. `accelerate launch --config_file "
            "scripts/accelerate/fsdp.yaml ...` on GPUs); on CPU use DDP (torchrun ... --use_cpu) without --fsdp"
        )


def check_data_file(name: str, path: str | None) -> None:
    """Raise `ValueError` naming the argument unless `path` is None or ends in one of `DATA_FILE_EXTENSIONS`."""
    if path is not None and path.rsplit(".", 1)[-1] not in DATA_FILE_EXTENSIONS:
        raise ValueError(f"{name} ({path!r}) must end in one of {['.' + ext for ext in DATA_FILE_EXTENSIONS]}")


def load_data_files(files: dict[str, str], cache_dir: str | None = None) -> datasets.DatasetDict:
    """Splits from local csv / json / jsonl files (`{"train": path, ...}`) with `datasets.load_dataset`."""
    extension = next(iter(files.values())).rsplit(".", 1)[-1]
    builder = "json" if extension in ("json", "jsonl") else extension
    return datasets.load_dataset(builder, data_files=files, cache_dir=cache_dir)
