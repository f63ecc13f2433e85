#!/usr/bin/env python
"""What int8 and bf16 cost a fine-tuned SeqBERT classifier: accuracy, agreement with fp32 and speed of the saved fp32
model and of `seqbert.optimize_for_cpu_inference(model, int8=True)` (int8 encoder linear layers on oneDNN's int8
operators) and `optimize_for_cpu_inference(model, dtype=torch.bfloat16)` (bf16 encoder layers; on CPUs where oneDNN
runs bf16, AVX-512 ones), next to the fp32 `optimize_for_cpu_inference(model)` and to torchao's int8 recipes loaded
by transformers' quantizer (`from_pretrained(folder, quantization_config=TorchAoConfig(...))`: int8 weight-only, and
int8 dynamic activations with int8 weights; where torchao is installed), on the 2,000 held-out Rotten Tomatoes
snippets (offline). About 3 minutes on 2 CPU cores.

    python scripts/examples/run_classification.py --output_dir runs/rt_minilm
    python scripts/benchmarks/evaluate_int8.py --model_dir runs/rt_minilm [--json_file int8.json]

The int8 model is the one the int8 guide gives a user, `from_pretrained` then one call:

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    model = seqbert.optimize_for_cpu_inference(model, int8=True)

All models see the same batches (`--batch_size` snippets, dynamic padding) under `torch.inference_mode`, at
torch's thread count; the timing is the median of `--repeats` passes over all batches, the models interleaved.
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path

import evaluate
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, TorchAoConfig

import seqbert
from seqbert.cpu_inference import bf16_linear_available, int8_weight_levels
from seqbert.data import load_rotten_tomatoes
from seqbert.metrics import ACCURACY_PATH
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_engines import torchao_recipes  # noqa: E402  (next to this script)
from interleaved_timing import interleave, median_and_spread  # noqa: E402


@dataclass
class Int8Arguments:
    model_dir: str = field(
        metadata={"help": "A fine-tuned sequence classifier folder, e.g. the output of run_classification.py."}
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N snippets."})
    batch_size: int = field(default=32, metadata={"help": "Snippets per batch."})
    repeats: int = field(default=3, metadata={"help": "Timed passes over all snippets per model (median shown)."})
    json_file: str | None = field(default=None, metadata={"help": "Also write the results to this JSON file."})

    def __post_init__(self):
        if not (Path(self.model_dir) / "config.json").is_file():
            raise ScriptInputError(f"--model_dir {self.model_dir!r} is not a model folder (it has no config.json)")
        for name in ("batch_size", "repeats", "max_eval_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ScriptInputError(f"--{name} must be >= 1, got {getattr(self, name)}")


@torch.inference_mode()
def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(Int8Arguments, __doc__), argv)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    fp32 = AutoModelForSequenceClassification.from_pretrained(args.model_dir).eval()
    if not isinstance(fp32, seqbert.SeqBertPreTrainedModel):
        raise ScriptInputError(
            f"--model_dir {args.model_dir!r} holds a {type(fp32).__name__}, not a SeqBERT classifier "
            "(optimize_for_cpu_inference takes SeqBERT models; convert BERT with from_bert_pretrained first)"
        )
    snippets = load_rotten_tomatoes()["validation"]
    if args.max_eval_samples is not None:
        snippets = snippets.select(range(min(args.max_eval_samples, len(snippets))))
    texts = list(snippets["text"])
    batches = [
        dict(
            tokenizer(
                texts[start : start + args.batch_size],
                truncation=True,
                max_length=128,
                padding=True,
                return_tensors="pt",
            )
        )
        for start in range(0, len(texts), args.batch_size)
    ]
    # The optimized copies time their kernels on batches like these (`CpuInferencePlan`, recorded below).
    models = {
        "fp32": fp32,
        "fp32_optimized": seqbert.optimize_for_cpu_inference(fp32, example_inputs=batches[0]),
        "int8": seqbert.optimize_for_cpu_inference(fp32, int8=True, example_inputs=batches[0]),
    }
    if bf16_linear_available():
        models["bf16"] = seqbert.optimize_for_cpu_inference(fp32, dtype=torch.bfloat16, example_inputs=batches[0])
    for name, recipe in torchao_recipes().items():
        quantization = TorchAoConfig(recipe)
        models[name] = AutoModelForSequenceClassification.from_pretrained(
            args.model_dir, quantization_config=quantization
        ).eval()
    logits = {name: torch.cat([model(**batch).logits for batch in batches]) for name, model in models.items()}
    seconds = interleave(
        {name: (lambda model=model: [model(**batch) for batch in batches]) for name, model in models.items()},
        args.repeats,
    )
    accuracy = evaluate.load(ACCURACY_PATH)
    results = {"model_dir": args.model_dir, "examples": len(snippets), "threads": torch.get_num_threads()}
    for name in models:
        predictions = logits[name].argmax(-1)
        results[name] = {
            "accuracy": accuracy.compute(predictions=predictions, references=snippets["label"])["accuracy"],
            **median_and_spread(seconds[name]),
        }
        if hasattr(models[name], "cpu_inference_plan"):
            results[name]["plan"] = models[name].cpu_inference_plan.summary()
    # 8-bit weights where this CPU's int8 products are exact, 7-bit where they saturate (no VNNI).
    results["int8_weight_bits"] = 8 if int8_weight_levels() == 127 else 7
    results["accuracy_change_points"] = 100 * (results["int8"]["accuracy"] - results["fp32"]["accuracy"])
    results["same_prediction"] = (logits["fp32"].argmax(-1) == logits["int8"].argmax(-1)).float().mean().item()
    results["max_abs_logit_delta"] = (logits["fp32"] - logits["int8"]).abs().max().item()
    results["int8_speedup"] = results["fp32"]["seconds"] / results["int8"]["seconds"]
    results["int8_speedup_over_fp32_optimized"] = results["fp32_optimized"]["seconds"] / results["int8"]["seconds"]
    # The other precisions, each against fp32 as int8 is above.
    others = [name for name in models if name not in ("fp32", "fp32_optimized", "int8")]
    for name in others:
        results[name].update(
            accuracy_change_points=100 * (results[name]["accuracy"] - results["fp32"]["accuracy"]),
            same_prediction=(logits["fp32"].argmax(-1) == logits[name].argmax(-1)).float().mean().item(),
            max_abs_logit_delta=(logits["fp32"] - logits[name]).abs().max().item(),
            speedup_over_fp32_optimized=results["fp32_optimized"]["seconds"] / results[name]["seconds"],
        )
    print(
        f"{len(snippets)} snippets, {results['threads']} threads, medians of {args.repeats}:\n"
        f"  fp32 accuracy {results['fp32']['accuracy']:.4f}, {results['fp32']['seconds']:.2f} s\n"
        f"  fp32 optimized accuracy {results['fp32_optimized']['accuracy']:.4f}, "
        f"{results['fp32_optimized']['seconds']:.2f} s\n"
        f"  int8 accuracy {results['int8']['accuracy']:.4f}, {results['int8']['seconds']:.2f} s "
        f"({results['int8_speedup']:.2f}x fp32, {results['int8_speedup_over_fp32_optimized']:.2f}x fp32 optimized)\n"
        f"  int8 weights {results['int8_weight_bits']}-bit; plans: "
        + "; ".join(f"{name}: {results[name]['plan']}" for name in models if "plan" in results[name])
        + "\n"
        f"  accuracy change {results['accuracy_change_points']:+.2f} points; same prediction on "
        f"{100 * results['same_prediction']:.1f} % of snippets; max |logit delta| {results['max_abs_logit_delta']:.3f}"
    )
    for name in others:
        row = results[name]
        print(
            f"  {name} accuracy {row['accuracy']:.4f} ({row['accuracy_change_points']:+.2f} points), "
            f"{row['seconds']:.2f} s ({row['speedup_over_fp32_optimized']:.2f}x fp32 optimized); same prediction "
            f"as fp32 on {100 * row['same_prediction']:.1f} %; max |logit delta| {row['max_abs_logit_delta']:.3f}"
        )
    write_json(args.json_file, results)
    return results


if __name__ == "__main__":
    run_cli(main, script_parser(Int8Arguments, __doc__))
