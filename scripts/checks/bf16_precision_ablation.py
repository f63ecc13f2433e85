#!/usr/bin/env python
"""Which parts of the bf16 inference path need fp32: the LayerNorm statistics and the attention softmax, each computed
in bf16 instead, on the real MiniLM-L6 weights and real Rotten Tomatoes snippets. About 1 minute on 2 CPU cores.

    python scripts/checks/bf16_precision_ablation.py [--num_texts 256] [--json_file bf16_precision_ablation.json]

`optimize_for_cpu_inference(model, dtype=torch.bfloat16)` keeps hidden states and matrix products in bf16 but
computes LayerNorm statistics and the attention softmax in fp32 (torch's mixed-dtype LayerNorm and CPU flash kernel do
so for bf16 inputs). This script replaces, for the duration of one variant each, `torch.nn.functional.
scaled_dot_product_attention` by a written-out product with the softmax in bf16 (or in fp32, for comparison), and
`nn.LayerNorm.forward` by the same normalization computed in bf16 arithmetic, and reports per variant the largest and
the mean |delta| of the hidden states from transformers' `BertModel` in fp32 on real tokens, and the smallest cosine
similarity of mean-pooled sentence embeddings. Needs a CPU where torch runs bf16 oneDNN linears (AVX-512).
"""

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AutoTokenizer, BertModel

import seqbert
from seqbert.cpu_inference import bf16_linear_available
from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


@dataclass
class AblationArguments:
    num_texts: int = field(default=256, metadata={"help": "Rotten Tomatoes snippets, in batches of 32."})
    json_file: str | None = field(default="bf16_precision_ablation.json", metadata={"help": "Where to write it."})


def _attention(softmax_dtype: torch.dtype):
    """`scaled_dot_product_attention` written out (bf16 scores), with the softmax computed in `softmax_dtype`."""

    def attention(query, key, value, attn_mask=None, scale=None, **kwargs):
        scores = torch.matmul(query, key.transpose(-1, -2)) * scale  # bf16
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        return torch.matmul(scores.to(softmax_dtype).softmax(-1).to(value.dtype), value)

    return attention


def _bf16_layer_norm(original):
    """`nn.LayerNorm.forward` with the mean and variance computed in bf16 arithmetic for bf16 inputs."""

    def forward(self, hidden_states):
        if hidden_states.dtype != torch.bfloat16:
            return original(self, hidden_states)
        mean = hidden_states.mean(-1, keepdim=True)
        variance = ((hidden_states - mean) ** 2).mean(-1, keepdim=True)
        normalized = (hidden_states - mean) * torch.rsqrt(variance + self.eps)
        return normalized * self.weight.to(torch.bfloat16) + self.bias.to(torch.bfloat16)

    return forward


@contextlib.contextmanager
def _variant(attention=None, layer_norm=None):
    saved = nn.functional.scaled_dot_product_attention, nn.LayerNorm.forward
    try:
        if attention is not None:
            nn.functional.scaled_dot_product_attention = attention
        if layer_norm is not None:
            nn.LayerNorm.forward = layer_norm
        yield
    finally:
        nn.functional.scaled_dot_product_attention, nn.LayerNorm.forward = saved


def compare(bert, fast, batches: list[dict]) -> dict[str, float]:
    largest, total, count, cosines = 0.0, 0.0, 0, []
    with torch.inference_mode():
        for batch in batches:
            expected, got = bert(**batch).last_hidden_state, fast(**batch).last_hidden_state
            real = batch["attention_mask"].bool()
            delta = (got - expected)[real].abs()
            largest, total, count = max(largest, delta.max().item()), total + delta.sum().item(), count + delta.numel()
            weights = real[..., None].float()
            pooled = [(states * weights).sum(1) / weights.sum(1) for states in (expected, got)]
            cosines.append(nn.functional.cosine_similarity(*pooled).min().item())
    return {"max_abs_delta": largest, "mean_abs_delta": total / count, "min_cosine": min(cosines)}


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(AblationArguments, __doc__), argv)
    if not bf16_linear_available():
        raise ScriptInputError("this CPU has no bf16 oneDNN linear (it needs AVX-512): nothing to ablate")
    folder = str(minilm_checkpoint_path())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = load_rotten_tomatoes()["validation"]["text"][: args.num_texts]
    batches = [dict(tokenizer(texts[i : i + 32], padding=True, return_tensors="pt")) for i in range(0, len(texts), 32)]
    bert = BertModel.from_pretrained(folder).eval()
    fast = seqbert.optimize_for_cpu_inference(
        seqbert.SeqBertModel.from_bert_pretrained(folder).eval(), dtype=torch.bfloat16
    )
    bf16_norm = _bf16_layer_norm(nn.LayerNorm.forward)
    variants = {
        "shipped: LayerNorm statistics and softmax in fp32 (torch's kernels)": {},
        "written-out attention, softmax in fp32": {"attention": _attention(torch.float32)},
        "softmax in bf16": {"attention": _attention(torch.bfloat16)},
        "LayerNorm statistics in bf16": {"layer_norm": bf16_norm},
        "both in bf16": {"attention": _attention(torch.bfloat16), "layer_norm": bf16_norm},
    }
    results = {}
    for name, replaced in variants.items():
        with _variant(**replaced):
            results[name] = compare(bert, fast, batches)
        row = results[name]
        print(
            f"{name}: max |delta| {row['max_abs_delta']:.4f}, mean |delta| {row['mean_abs_delta']:.5f}, "
            f"min cosine of mean-pooled embeddings {row['min_cosine']:.6f}"
        )
    write_json(args.json_file, results)
    return results


if __name__ == "__main__":
    run_cli(main, script_parser(AblationArguments, __doc__))
