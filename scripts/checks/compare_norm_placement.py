#!/usr/bin/env python
"""Pre-LN against post-LN: the same masked-LM trained twice with a high learning rate and no warm-up. The default run
(two 250-step runs of a 12-layer model) takes about 9 minutes on 2 CPU cores.

Xiong et al. (2020), "On Layer Normalization in the Transformer Architecture", show that post-LN Transformers (BERT's
`LN(x + f(x))`) need a learning-rate warm-up, because the gradients of the layers near the output are large at
initialisation, while pre-LN ones (`x + f(LN(x))`, with a final LayerNorm) train without it. This script trains the
same small SeqBERT masked-LM (same size, data, steps, seed and masking) through `run_mlm.py`'s `main` twice, once
with `--norm_placement pre` and once with `--norm_placement post`, with a high peak learning rate and no warm-up,
then draws both training-loss curves in one figure:

    python scripts/checks/compare_norm_placement.py
    python scripts/checks/compare_norm_placement.py --output_dir runs/norm_placement --learning_rate 5e-3 --max_steps 400

Defaults: 12 layers of hidden size 128 (the problem grows with depth; at 4 layers the two placements trained alike in
short probes), learning rate 3e-3 with linear decay and 0 warm-up steps, 250 steps of 16 blocks of 128 tokens of the
offline Bible text, seed 42, evaluation on the 349 held-out validation blocks; about 10 minutes on 2 CPU cores.

`OUTPUT_DIR/pre/` and `OUTPUT_DIR/post/` receive the two runs (models, metrics, loss curves, cards);
`OUTPUT_DIR/norm_placement_loss.png` the two training-loss curves; `OUTPUT_DIR/norm_placement.json` per placement the
final logged training loss, the mean training loss, the evaluation loss and perplexity, and the wall time of the run.
Any further argument goes to both runs unchanged (e.g. `--max_grad_norm 0` to turn off gradient clipping).
"""

import json
import os
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # run_mlm.py, the example job

import run_mlm  # noqa: E402

from seqbert.script_utils import script_parser, write_json


PLACEMENTS = ("pre", "post")


@dataclass
class ExperimentArguments:
    """The settings both runs share. Arguments not listed here are passed to `run_mlm.py` for both runs."""

    output_dir: str = field(
        default="runs/norm_placement", metadata={"help": "Folder for the two runs, the figure and the JSON summary."}
    )
    learning_rate: float = field(default=3e-3, metadata={"help": "Peak AdamW learning rate (linear decay)."})
    warmup_steps: float = field(default=0, metadata={"help": "Linear warm-up steps (0: none, the point of it)."})
    max_steps: int = field(default=250, metadata={"help": "Optimizer steps of each run."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Training blocks per step."})
    config_overrides: str = field(
        default="num_hidden_layers=12",
        metadata={"help": "SeqBertConfig fields changed from run_mlm.py's small model, for both runs."},
    )
    logging_steps: int = field(default=10, metadata={"help": "Log the training loss every N steps."})
    seed: int = field(default=42, metadata={"help": "Seed of both runs (initialisation, data order, masking)."})

    def __post_init__(self):
        for name in ("max_steps", "per_device_train_batch_size", "logging_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 1")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate ({self.learning_rate}) must be > 0")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be >= 0")


def run_argv(args: ExperimentArguments, norm_placement: str, extra: list[str]) -> list[str]:
    """The `run_mlm.main` arguments of the run with `norm_placement`."""
    return [
        "--output_dir", os.path.join(args.output_dir, norm_placement),
        "--norm_placement", norm_placement,
        "--config_overrides", args.config_overrides,
        "--learning_rate", str(args.learning_rate),
        "--warmup_steps", str(args.warmup_steps),
        "--max_steps", str(args.max_steps),
        "--per_device_train_batch_size", str(args.per_device_train_batch_size),
        "--logging_steps", str(args.logging_steps),
        "--eval_strategy", "no",
        "--seed", str(args.seed),
        *extra,
    ]  # fmt: skip


def training_losses(output_dir: str) -> list[tuple[int, float]]:
    """`(step, training loss)` pairs logged by a run, from its `trainer_state.json`."""
    with open(os.path.join(output_dir, "trainer_state.json"), encoding="utf-8") as f:
        history = json.load(f)["log_history"]
    return [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]


def save_comparison_plot(curves: dict[str, list[tuple[int, float]]], path: str, title: str) -> None:
    """
    Draw several training-loss curves in one PNG (the counterpart of `seqbert.plots.save_loss_curve` for one run).

    Args:
        curves: label -> `(step, loss)` pairs; the loss is a mean masked-LM cross-entropy in nats.
        path: the PNG file to write.
        title: the figure title.
    """
    from matplotlib.figure import Figure  # the object-oriented API needs no pyplot state nor display backend

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for label, points in curves.items():
        if points:
            axes.plot(*zip(*points, strict=True), label=label)
    axes.set_xlabel("step")
    axes.set_ylabel("training masked-LM cross-entropy (nats)")
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    """Run both placements, write the figure and the JSON summary; return the summary."""
    parser = script_parser(ExperimentArguments, __doc__)
    args, extra = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    os.makedirs(args.output_dir, exist_ok=True)

    runs, curves = {}, {}
    for placement in PLACEMENTS:
        start = time.perf_counter()
        metrics = run_mlm.main(run_argv(args, placement, extra))
        wall_time = time.perf_counter() - start
        run_dir = os.path.join(args.output_dir, placement)
        curves[f"{placement}-LN"] = training_losses(run_dir)
        runs[placement] = {
            "final_train_loss": curves[f"{placement}-LN"][-1][1] if curves[f"{placement}-LN"] else None,
            "mean_train_loss": metrics.get("train_loss"),
            "eval_loss": metrics.get("eval_loss"),
            "eval_perplexity": metrics.get("eval_perplexity"),
            "eval_unigram_perplexity": metrics.get("eval_unigram_perplexity"),
            "wall_time_s": round(wall_time, 1),
            "output_dir": run_dir,
        }

    figure = os.path.join(args.output_dir, "norm_placement_loss.png")
    title = textwrap.fill(
        f"pre-LN vs post-LN: {args.config_overrides.replace(',', ', ')}; peak learning rate {args.learning_rate:g}, "
        f"{args.warmup_steps:g} warm-up steps, {args.max_steps} steps of {args.per_device_train_batch_size} blocks, "
        f"seed {args.seed}",
        width=80,
    )
    save_comparison_plot(curves, figure, title)
    summary = {"settings": {**asdict(args), "extra_arguments": extra}, "runs": runs, "figure": figure}
    write_json(os.path.join(args.output_dir, "norm_placement.json"), summary)
    for placement, run in runs.items():
        shown = ("final_train_loss", "eval_loss", "eval_perplexity", "eval_unigram_perplexity", "wall_time_s")
        print(f"{placement}-LN: " + ", ".join(f"{key} {run[key]:.4g}" for key in shown if run[key] is not None))
    print(f"Figure: {figure}; summary: {os.path.join(args.output_dir, 'norm_placement.json')}")
    return summary


if __name__ == "__main__":
    main()
