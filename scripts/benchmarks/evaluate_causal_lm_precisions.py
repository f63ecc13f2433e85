#!/usr/bin/env python
"""What int8 and bf16 cost a causal LM's quality: a `SeqBertForCausalLM` warm-started from the packaged MiniLM-L6
checkpoint (BERT's weights as causal layers, the LM head's transform fresh, its output matrix the word embeddings),
trained `--steps` steps on Rotten Tomatoes text (`seqbert.data.load_rotten_tomatoes_text`'s train split), then scored on
the held-out split in fp32 (the model), and as `seqbert.optimize_for_cpu_inference` copies in fp32, int8 and bf16:
perplexity on the held-out blocks (exp of the mean next-token cross-entropy over every predicted token), each
precision's ratio to the model's, and how many of the model's greedy tokens each copy generates at the same place
(`--num_prompts` held-out snippets cut to their first 8 tokens, `--new_tokens` generated). Offline, about 4 minutes on 2
CPU cores (2026-11-29):

    python scripts/benchmarks/evaluate_causal_lm_precisions.py --json_file docs/results/causal_lm_precisions.json
"""

import math
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoTokenizer

import seqbert
from seqbert.data import load_rotten_tomatoes_text, minilm_checkpoint_path
from seqbert.script_utils import script_parser, write_json


@dataclass
class EvaluationArguments:
    steps: int = field(default=300, metadata={"help": "Training steps (AdamW, linear warm-up and decay)."})
    batch_size: int = field(default=16, metadata={"help": "Blocks per training step."})
    block_size: int = field(default=64, metadata={"help": "Tokens per block (training and held-out)."})
    learning_rate: float = field(default=3e-4, metadata={"help": "Peak learning rate."})
    eval_blocks: int = field(default=256, metadata={"help": "Held-out blocks scored (at most as many as there are)."})
    num_prompts: int = field(default=32, metadata={"help": "Held-out prompts for the greedy agreement."})
    new_tokens: int = field(default=24, metadata={"help": "Greedy tokens generated per prompt."})
    seed: int = field(default=0, metadata={"help": "Seed of the LM head's fresh transform and the batch order."})
    json_file: str | None = field(default=None, metadata={"help": "Also write the results to this JSON file."})


PRECISIONS = {"fp32": {}, "int8": {"int8": True}, "bf16": {"dtype": torch.bfloat16}}


def blocks(texts: list[str], tokenizer, block_size: int) -> torch.Tensor:
    """The texts' tokens (each with [CLS] ... [SEP], as the tokenizer gives them) run together and cut into
    (N, block_size) blocks, the remainder dropped."""
    ids = [token for ids in tokenizer(texts)["input_ids"] for token in ids]
    count = len(ids) // block_size
    return torch.tensor(ids[: count * block_size]).view(count, block_size)


def train(model, train_blocks: torch.Tensor, args: EvaluationArguments) -> list[float]:
    """`args.steps` AdamW steps on random batches of `train_blocks`, the word embeddings (the LM head's output matrix)
    frozen; returns the losses."""
    model.train()
    model.get_input_embeddings().requires_grad_(False)
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=args.learning_rate, weight_decay=0.01)
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (args.steps - step) / (args.steps - warmup)))
    )
    generator = torch.Generator().manual_seed(args.seed)
    losses = []
    for _ in range(args.steps):
        batch = train_blocks[torch.randint(len(train_blocks), (args.batch_size,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@torch.inference_mode()
def perplexity(model, held_out: torch.Tensor, batch_size: int = 32) -> float:
    """exp(mean next-token cross-entropy) over every predicted token of `held_out` (N, L)."""
    total, tokens = 0.0, 0
    for start in range(0, len(held_out), batch_size):
        batch = held_out[start : start + batch_size]
        logits = model(input_ids=batch).logits[:, :-1].float()  # (B, L - 1, V)
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
        tokens += batch[:, 1:].numel()
    return math.exp(total / tokens)


def same_tokens(reference: torch.Tensor, generated: torch.Tensor, prompt_length: int) -> float:
    """The share of `reference`'s generated tokens that `generated` holds at the same place."""
    return (reference[:, prompt_length:] == generated[:, prompt_length:]).float().mean().item()


def main(argv: list[str] | None = None) -> dict:
    (args,) = script_parser(EvaluationArguments, __doc__).parse_args_into_dataclasses(args=argv)
    from benchmark_decoder_precisions import environment  # scripts/benchmarks, beside this script

    start = time.perf_counter()
    path = minilm_checkpoint_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = load_rotten_tomatoes_text()
    train_blocks = blocks(list(text["train"]["text"]), tokenizer, args.block_size)
    held_out = blocks(list(text["validation"]["text"]), tokenizer, args.block_size)[: args.eval_blocks]
    torch.manual_seed(args.seed)
    model = seqbert.SeqBertForCausalLM.from_bert_pretrained(path)
    losses = train(model, train_blocks, args)
    model.eval()

    left = AutoTokenizer.from_pretrained(path, padding_side="left")
    snippets = list(text["validation"]["text"])[: args.num_prompts]
    prompts = left(snippets, padding=True, truncation=True, max_length=8, return_tensors="pt")
    greedy = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        reference_ids = model.generate(**prompts, **greedy)
    results = {
        "model": {"perplexity": perplexity(model, held_out)},
    }
    for name, options in PRECISIONS.items():
        copy = seqbert.optimize_for_cpu_inference(model, **options)
        with torch.inference_mode():
            generated = copy.generate(**prompts, **greedy)
        results[name] = {
            "perplexity": perplexity(copy, held_out),
            "greedy_same_tokens": same_tokens(reference_ids, generated, prompts["input_ids"].shape[1]),
        }
    for name in PRECISIONS:
        results[name]["perplexity_ratio"] = results[name]["perplexity"] / results["model"]["perplexity"]
    report = {
        "what": "SeqBertForCausalLM warm-started from MiniLM-L6, trained on Rotten Tomatoes text; held-out perplexity "
        "and greedy agreement of optimize_for_cpu_inference copies",
        "arguments": vars(args),
        "environment": environment(),
        "train_blocks": len(train_blocks),
        "held_out_blocks": len(held_out),
        "held_out_tokens_predicted": held_out[:, 1:].numel(),
        "first_and_last_train_losses": [sum(losses[:20]) / 20, sum(losses[-20:]) / 20],
        "results": results,
        "seconds": time.perf_counter() - start,
    }
    print(
        f"held-out perplexity ({report['held_out_tokens_predicted']} tokens), model {results['model']['perplexity']:.2f}"
    )
    for name in PRECISIONS:
        row = results[name]
        print(
            f"{name:>5}: perplexity {row['perplexity']:.2f} ({row['perplexity_ratio']:.4f}x the model's), greedy "
            f"tokens the same as the model's: {100 * row['greedy_same_tokens']:.1f} %"
        )
    write_json(args.json_file, report)
    return report


if __name__ == "__main__":
    main()
