#!/usr/bin/env python
"""Pre-LN against post-LN without warm-up: the same masked-LM trained at several learning rates and seeds with each
placement, to find the learning rate at which post-LN fails while pre-LN trains. The default grid (3 learning rates x
2 placements x 3 seeds of a 12-layer model) takes about 12 minutes on 2 CPU cores.

Xiong et al. (2020), "On Layer Normalization in the Transformer Architecture" (ICML; §3, Figure 3 and §4), show that
post-LN Transformers (BERT's `LN(x + f(x))`) need a learning-rate warm-up, because the expected gradients of the
parameters near the output are large at initialisation, while pre-LN ones (`x + f(LN(x))`, with a final LayerNorm)
train without it and at higher learning rates. This script trains the same small SeqBERT masked-LM (same size, data,
steps and masking) through `run_mlm.py`'s `main` for every learning rate x placement x seed, with no warm-up, and
sorts every run by its evaluation perplexity against the context-free (unigram) baseline that the output bias starts
from (`run_mlm.py --unigram_bias_init`):

- **diverged**: the evaluation loss is not finite, or above the baseline's;
- **stalled**: the evaluation perplexity is above `trained_below` (default 0.9) times the baseline's: the model
  learned (almost) nothing beyond word frequencies;
- **trained**: otherwise.

    python scripts/checks/compare_norm_placement.py
    python scripts/checks/compare_norm_placement.py --learning_rates 1e-3 3e-3 --seeds 42 1 2 3 4 --max_steps 400

Defaults: 12 layers of hidden size 128 (the problem grows with depth; at 4 layers the two placements trained alike in
short probes), peak learning rates 3e-4, 1e-3 and 3e-3 with linear decay and 0 warm-up steps, seeds 42, 1 and 2, 200
steps of 16 blocks of 64 tokens of the offline Bible text with MiniLM's tokenizer (30,522 tokens), evaluation on 64 held-out blocks.

`OUTPUT_DIR/<placement>_lr<rate>_seed<seed>/` receive the runs (models, metrics, loss curves, cards);
`OUTPUT_DIR/norm_placement.png` one figure: the evaluation perplexity over the baseline's against the learning rate
(every seed a point, the median a line), and the training-loss curves of every seed at the learning rate that
separates the placements (else the highest); `OUTPUT_DIR/norm_placement.json` every run's figures and verdict, each
placement's verdicts per learning rate, and the separating learning rate (`null` when none in the grid separates
them). Any further argument goes to every run unchanged (e.g. `--max_grad_norm 0` to turn off gradient clipping).
"""

import itertools
import json
import math
import os
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # run_mlm.py, the example job

import run_mlm  # noqa: E402

from seqbert.data import minilm_checkpoint_path
from seqbert.script_utils import script_parser, write_json


PLACEMENTS = ("pre", "post")
VERDICTS = ("trained", "stalled", "diverged")


@dataclass
class ExperimentArguments:
    """The grid and the settings every run shares. Arguments not listed here are passed to `run_mlm.py` unchanged."""

    output_dir: str = field(
        default="runs/norm_placement", metadata={"help": "Folder for the runs, the figure and the JSON summary."}
    )
    learning_rates: list[float] = field(
        default_factory=lambda: [3e-4, 1e-3, 3e-3], metadata={"help": "Peak AdamW learning rates (linear decay)."}
    )
    seeds: list[int] = field(
        default_factory=lambda: [42, 1, 2],
        metadata={"help": "Seeds of the runs at each point (initialisation, data order, masking)."},
    )
    warmup_steps: float = field(default=0, metadata={"help": "Linear warm-up steps (0: none, the point of it)."})
    max_steps: int = field(default=200, metadata={"help": "Optimizer steps of each run."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Training blocks per step."})
    max_seq_length: int = field(default=64, metadata={"help": "Tokens per block."})
    max_eval_samples: int = field(default=64, metadata={"help": "Held-out blocks each run is evaluated on."})
    config_overrides: str = field(
        default="num_hidden_layers=12",
        metadata={"help": "SeqBertConfig fields changed from run_mlm.py's small model, for every run."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "Tokenizer of every run (default: MiniLM's uncased WordPiece, offline), so that no run trains a "
            "vocabulary of its own and all share one unigram baseline."
        },
    )
    trained_below: float = field(
        default=0.9,
        metadata={"help": "A run trained if its evaluation perplexity is below this share of the unigram baseline's."},
    )
    logging_steps: int = field(default=10, metadata={"help": "Log the training loss every N steps."})

    def __post_init__(self):
        for name in ("max_steps", "per_device_train_batch_size", "max_seq_length", "max_eval_samples", "logging_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 1")
        for name in ("learning_rates", "seeds"):
            if not getattr(self, name):
                raise ValueError(f"{name} must list at least one value")
        if any(rate <= 0 for rate in self.learning_rates):
            raise ValueError(f"learning_rates ({self.learning_rates}) must all be > 0")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be >= 0")
        if not 0 < self.trained_below < 1:
            raise ValueError(f"trained_below ({self.trained_below}) must be in (0, 1) exclusive")


def run_name(norm_placement: str, learning_rate: float, seed: int) -> str:
    """The folder name of one run under `output_dir`."""
    return f"{norm_placement}_lr{learning_rate:g}_seed{seed}"


def run_argv(args: ExperimentArguments, norm_placement: str, learning_rate: float, seed: int, extra: list[str]):
    """The `run_mlm.main` arguments of one run."""
    return [
        "--output_dir", os.path.join(args.output_dir, run_name(norm_placement, learning_rate, seed)),
        "--overwrite_output_dir",
        "--norm_placement", norm_placement,
        "--config_overrides", args.config_overrides,
        "--tokenizer_name", args.tokenizer_name or str(minilm_checkpoint_path()),
        "--learning_rate", str(learning_rate),
        "--warmup_steps", str(args.warmup_steps),
        "--max_steps", str(args.max_steps),
        "--per_device_train_batch_size", str(args.per_device_train_batch_size),
        "--max_seq_length", str(args.max_seq_length),
        "--max_eval_samples", str(args.max_eval_samples),
        "--logging_steps", str(args.logging_steps),
        "--eval_strategy", "no",
        "--seed", str(seed),
        *extra,
    ]  # fmt: skip


def verdict(eval_loss: float | None, unigram_perplexity: float, trained_below: float) -> str:
    """
    `"diverged"` (the evaluation loss is missing, not finite, or above the unigram baseline's log perplexity),
    `"stalled"` (the perplexity exp(eval_loss) is at least `trained_below` times the baseline's) or `"trained"`.
    """
    if eval_loss is None or not math.isfinite(eval_loss) or eval_loss > math.log(unigram_perplexity):
        return "diverged"
    return "trained" if math.exp(eval_loss) < trained_below * unigram_perplexity else "stalled"


def separating_learning_rate(verdicts: dict[str, dict[float, list[str]]]) -> float | None:
    """The lowest learning rate at which every pre-LN seed trained and no post-LN seed did; None if there is none."""
    for rate in sorted(verdicts["pre"]):
        if all(v == "trained" for v in verdicts["pre"][rate]) and "trained" not in verdicts["post"][rate]:
            return rate
    return None


def training_losses(output_dir: str) -> list[tuple[int, float]]:
    """`(step, training loss)` pairs logged by a run, from its `trainer_state.json`."""
    with open(os.path.join(output_dir, "trainer_state.json"), encoding="utf-8") as f:
        history = json.load(f)["log_history"]
    return [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]


def save_grid_plot(runs: list[dict], curves: dict[str, list[tuple[int, float]]], path: str, title: str) -> None:
    """
    One PNG with two panels: left, every run's evaluation perplexity over its unigram baseline's against the learning
    rate (log scales; each seed a point, the median per placement a line, 1 the baseline); right, the training-loss
    curves in `curves`.

    Args:
        runs: the summary's runs (`norm_placement`, `learning_rate`, `perplexity_over_unigram`).
        curves: label -> `(step, loss)` pairs; the loss is a mean masked-LM cross-entropy in nats.
        path: the PNG file to write.
        title: the figure title.
    """
    import statistics

    from matplotlib.figure import Figure  # the object-oriented API needs no pyplot state nor display backend

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    grid, losses = figure.subplots(1, 2)
    for placement, color in zip(PLACEMENTS, ("tab:blue", "tab:red"), strict=True):
        mine = [run for run in runs if run["norm_placement"] == placement]
        finite = [run for run in mine if math.isfinite(run["perplexity_over_unigram"])]
        grid.scatter(
            [run["learning_rate"] for run in finite],
            [run["perplexity_over_unigram"] for run in finite],
            color=color,
            alpha=0.6,
        )
        rates = sorted({run["learning_rate"] for run in finite})
        medians = [
            statistics.median(run["perplexity_over_unigram"] for run in finite if run["learning_rate"] == rate)
            for rate in rates
        ]
        grid.plot(rates, medians, color=color, label=f"{placement}-LN (median of seeds)")
    grid.axhline(1.0, color="gray", linestyle="--", label="unigram baseline")
    grid.set_xscale("log")
    grid.set_yscale("log")
    grid.set_xlabel("peak learning rate (no warm-up)")
    grid.set_ylabel("eval perplexity / unigram perplexity")
    grid.grid(alpha=0.3, which="both")
    grid.legend(fontsize=8)
    for label, points in curves.items():
        if points:
            color = "tab:blue" if label.startswith("pre") else "tab:red"
            losses.plot(*zip(*points, strict=True), label=label, color=color, alpha=0.7)
    losses.set_xlabel("step")
    losses.set_ylabel("training masked-LM cross-entropy (nats)")
    losses.grid(alpha=0.3)
    if any(curves.values()):
        losses.legend(fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    """Run the grid, write the figure and the JSON summary; return the summary."""
    parser = script_parser(ExperimentArguments, __doc__)
    args, extra = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    os.makedirs(args.output_dir, exist_ok=True)

    runs = []
    verdicts = {placement: {rate: [] for rate in args.learning_rates} for placement in PLACEMENTS}
    for rate, placement, seed in itertools.product(args.learning_rates, PLACEMENTS, args.seeds):
        start = time.perf_counter()
        metrics = run_mlm.main(run_argv(args, placement, rate, seed, extra))
        run_dir = os.path.join(args.output_dir, run_name(placement, rate, seed))
        unigram = metrics["eval_unigram_perplexity"]
        eval_loss = metrics.get("eval_loss")
        run = {
            "norm_placement": placement,
            "learning_rate": rate,
            "seed": seed,
            "verdict": verdict(eval_loss, unigram, args.trained_below),
            "eval_loss": eval_loss,
            "eval_perplexity": metrics.get("eval_perplexity"),
            "eval_unigram_perplexity": unigram,
            "perplexity_over_unigram": math.exp(eval_loss) / unigram
            if eval_loss is not None and math.isfinite(eval_loss)
            else math.inf,
            "final_train_loss": (training_losses(run_dir) or [(0, None)])[-1][1],
            "wall_time_s": round(time.perf_counter() - start, 1),
            "output_dir": run_dir,
        }
        runs.append(run)
        verdicts[placement][rate].append(run["verdict"])
        print(
            f"{placement}-LN lr {rate:g} seed {seed}: {run['verdict']}, eval perplexity {run['eval_perplexity']:.4g} "
            f"(unigram {unigram:.4g}), {run['wall_time_s']} s",
            flush=True,
        )

    separating = separating_learning_rate(verdicts)
    shown = separating if separating is not None else max(args.learning_rates)
    curves = {
        f"{placement}-LN seed {seed}": training_losses(os.path.join(args.output_dir, run_name(placement, shown, seed)))
        for placement in PLACEMENTS
        for seed in args.seeds
    }
    figure = os.path.join(args.output_dir, "norm_placement.png")
    title = textwrap.fill(
        f"pre-LN vs post-LN without warm-up: {args.config_overrides.replace(',', ', ')}, {args.max_steps} steps of "
        f"{args.per_device_train_batch_size} x {args.max_seq_length} tokens, seeds {args.seeds}; right: training loss "
        f"at learning rate {shown:g}"
        + (" (separates them)" if separating is not None else " (the highest; no rate separates them)"),
        width=140,
    )
    save_grid_plot(runs, curves, figure, title)
    summary = {
        "settings": {**asdict(args), "extra_arguments": extra},
        "verdicts": {
            placement: {f"{rate:g}": v for rate, v in by_rate.items()} for placement, by_rate in verdicts.items()
        },
        "separating_learning_rate": separating,
        "runs": runs,
        "figure": figure,
    }
    write_json(os.path.join(args.output_dir, "norm_placement.json"), summary)
    for placement, by_rate in verdicts.items():
        print(f"{placement}-LN: " + "; ".join(f"lr {rate:g}: {', '.join(v)}" for rate, v in by_rate.items()))
    print(
        f"Separating learning rate: {separating:g}"
        if separating is not None
        else "No learning rate of the grid separates the placements."
    )
    print(f"Figure: {figure}; summary: {os.path.join(args.output_dir, 'norm_placement.json')}")
    return summary


if __name__ == "__main__":
    main()
