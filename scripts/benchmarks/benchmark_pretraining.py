#!/usr/bin/env python
"""seqbert's pretraining recipe against transformers' own `BertForMaskedLM` trained for the same wall time, on the
same data with the same tokenizer. The default run takes about 20 minutes on 2 CPU cores (twice run_mlm.py's default
training time); with `--seqbert_run` (a finished run_mlm.py folder) only BERT's half.

    python scripts/benchmarks/benchmark_pretraining.py [--output_dir runs/benchmark_pretraining] [-- RUN_MLM_ARGS ...]
    python scripts/benchmarks/benchmark_pretraining.py --seqbert_run runs/mlm_bible [-- RUN_MLM_ARGS it ran with]

1. seqbert: `scripts/examples/run_mlm.py` with its defaults (plus any run_mlm arguments given after `--`), into
   `OUTPUT_DIR/seqbert`. Its training time (`train_runtime`) is the budget.
2. transformers: a `BertForMaskedLM` of the same size (hidden size, layers, heads, feed-forward width, vocabulary: the
   tokenizer the seqbert run saved, trained or not) with `BertConfig`'s other defaults (post-LN, dropout 0.1), trained
   with the recipe of transformers' `examples/pytorch/language-modeling/run_mlm.py` at its defaults: `Trainer`,
   `DataCollatorForLanguageModeling` (15 % masking), AdamW at learning rate 5e-5 with linear decay and no warm-up,
   batches of 8 blocks, 3 epochs; on the same blocks of the same text. It stops when its training time reaches the
   budget (a `TrainerCallback`), so both train for the same wall time.
3. Both are evaluated on the same validation blocks with the same masks (seqbert's seeded masking collator at the
   run's `--mlm_probability`, batch 64).

Printed and written to `--json_file`: per model its training seconds, optimizer steps, training tokens per second
(blocks x block length / training seconds), eval loss and perplexity, masked-token accuracy, and the unigram
perplexity of the tokenizer (the context-free baseline both are measured against).
"""

import functools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import evaluate
import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from seqbert.metrics import ACCURACY_PATH
from seqbert.script_utils import parse_arguments, run_cli, script_parser, write_json
from seqbert.training import SeqBertTrainer


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import run_mlm  # noqa: E402  (the example job)


@dataclass
class PretrainingBenchmarkArguments:
    output_dir: str = field(
        default="runs/benchmark_pretraining", metadata={"help": "Folder of the two runs (seqbert/, bert/)."}
    )
    json_file: str | None = field(
        default="benchmark_pretraining.json", metadata={"help": "Where to write the results."}
    )
    # transformers' run_mlm.py defaults (TrainingArguments' own, and its example's batch size)
    seqbert_run: str | None = field(
        default=None,
        metadata={
            "help": "A finished run_mlm.py output folder (all_results.json, trainer_state.json, tokenizer) to measure "
            "BERT against instead of running run_mlm.py again; give the run_mlm arguments it ran with after --."
        },
    )
    bert_learning_rate: float = field(default=5e-5, metadata={"help": "transformers' recipe: TrainingArguments' lr."})
    bert_batch_size: int = field(default=8, metadata={"help": "transformers' recipe: per_device_train_batch_size."})
    bert_num_train_epochs: float = field(default=3.0, metadata={"help": "transformers' recipe: num_train_epochs."})


class StopAfter(TrainerCallback):
    """Stops training once `seconds` of training (from `on_train_begin`) have passed, at the end of a step."""

    def __init__(self, seconds: float):
        self.seconds, self.start = seconds, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.start >= self.seconds:
            control.should_training_stop = True


def train_bert(args, seqbert_dir: Path, blocks, budget: float, seed: int) -> dict:
    """transformers' recipe for a `BertForMaskedLM` the size of the seqbert run's model; see the module docstring."""
    tokenizer = AutoTokenizer.from_pretrained(seqbert_dir)
    size = json.loads((seqbert_dir / "config.json").read_text())
    config = BertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        **{name: size[name] for name in ("hidden_size", "num_hidden_layers", "num_attention_heads")},
        intermediate_size=size["intermediate_size"],
        max_position_embeddings=size["max_position_embeddings"],
    )
    torch.manual_seed(seed)
    model = BertForMaskedLM(config)
    training_args = TrainingArguments(
        output_dir=str(Path(args.output_dir) / "bert"),
        per_device_train_batch_size=args.bert_batch_size,
        learning_rate=args.bert_learning_rate,
        num_train_epochs=args.bert_num_train_epochs,
        seed=seed,
        save_strategy="no",
        report_to=[],
        logging_steps=50,
        use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=blocks["train"],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
        callbacks=[StopAfter(budget)],
    )
    metrics = trainer.train().metrics
    metrics["global_step"] = trainer.state.global_step
    metrics["train_batch_size"] = args.bert_batch_size
    return {"model": model, "tokenizer": tokenizer, "train": metrics}


def evaluate_masked_lm(
    model, tokenizer, blocks, output_dir: Path, seed: int, mlm_probability: float
) -> dict[str, float]:
    """
    Eval loss and masked-token accuracy with seqbert's seeded masks (batches of 64) at `mlm_probability`, as
    `run_mlm.py` evaluates: the same masks as the seqbert run's evaluation.
    """
    args = TrainingArguments(
        output_dir=str(output_dir), per_device_eval_batch_size=64, report_to=[], use_cpu=not torch.cuda.is_available()
    )
    trainer = SeqBertTrainer(
        model=model,
        args=args,
        eval_dataset=blocks["validation"],
        data_collator=run_mlm.masking_collator(tokenizer, mlm_probability, seed),
        compute_metrics=functools.partial(run_mlm.masked_token_accuracy, evaluate.load(ACCURACY_PATH)),
        preprocess_logits_for_metrics=run_mlm.preprocess_logits_for_metrics,
    )
    return trainer.evaluate()


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    own, run_mlm_argv = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    (args,) = parse_arguments(script_parser(PretrainingBenchmarkArguments, __doc__), own)
    if args.seqbert_run is None:
        seqbert_dir = Path(args.output_dir) / "seqbert"
        seqbert_metrics = run_mlm.main(["--output_dir", str(seqbert_dir), "--overwrite_output_dir", *run_mlm_argv])
    else:
        seqbert_dir = Path(args.seqbert_run)
        seqbert_metrics = json.loads((seqbert_dir / "all_results.json").read_text())
    state = json.loads((seqbert_dir / "trainer_state.json").read_text())
    budget = seqbert_metrics["train_runtime"]
    model_args, data_args, training_args = run_mlm.make_parser().parse_args_into_dataclasses(
        ["--output_dir", str(seqbert_dir), *run_mlm_argv]
    )
    tokenizer = AutoTokenizer.from_pretrained(seqbert_dir)
    raw = run_mlm.load_raw_datasets(data_args, model_args.cache_dir)
    blocks = run_mlm.tokenize_and_group(
        raw, tokenizer, data_args.text_column, data_args.max_seq_length, line_by_line=data_args.line_by_line
    )
    bert = train_bert(args, seqbert_dir, blocks, budget, training_args.seed)
    bert_eval = evaluate_masked_lm(
        bert["model"], tokenizer, blocks, Path(args.output_dir) / "bert", training_args.seed, data_args.mlm_probability
    )
    block = data_args.max_seq_length
    rows = {
        "seqbert": {
            "train_seconds": budget,
            "steps": state["global_step"],
            "train_tokens_per_s": state["global_step"] * state["train_batch_size"] * block / budget,
            "eval_loss": seqbert_metrics["eval_loss"],
            "eval_accuracy": seqbert_metrics["eval_accuracy"],
        },
        "transformers_BertForMaskedLM": {
            "train_seconds": bert["train"]["train_runtime"],
            "steps": bert["train"]["global_step"],
            "train_tokens_per_s": bert["train"]["global_step"]
            * args.bert_batch_size
            * block
            / bert["train"]["train_runtime"],
            "eval_loss": bert_eval["eval_loss"],
            "eval_accuracy": bert_eval["eval_accuracy"],
        },
    }
    unigram = seqbert_metrics.get("eval_unigram_perplexity")
    for name, row in rows.items():
        row["eval_perplexity"] = run_mlm.perplexity(row["eval_loss"])
        print(
            f"{name}: {row['train_seconds']:.0f} s of training, {row['steps']} steps, "
            f"{row['train_tokens_per_s']:,.0f} training tokens/s, eval loss {row['eval_loss']:.3f} "
            f"(perplexity {row['eval_perplexity']:.1f}), masked-token accuracy {row['eval_accuracy']:.3f}"
        )
    print(f"unigram baseline of the tokenizer: perplexity {unigram:.1f}")
    results = {"rows": rows, "unigram_perplexity": unigram, "run_mlm_arguments": run_mlm_argv}
    write_json(args.json_file, results)
    return results


if __name__ == "__main__":
    run_cli(main, script_parser(PretrainingBenchmarkArguments, __doc__))
