#!/usr/bin/env python
"""What a compiled int8 decode step would buy (issue 67's open decision): the six decoder layers of the MiniLM
BERT2BERT's int8 copy (`optimize_for_cpu_inference(model, int8=True)`, issue 67's setup) for one decode step, inside
`generate`, written out as one function, and that function compiled, whole or around its attentions. About 100 seconds
on 2 CPU cores (the compilations take about 11 s with an empty inductor cache, 2 s with a warm one).

The four ways, on the same packed int8 weights:

- `in generate`: the copy's own layers inside `generate` (`--batch_size` sources, `--new_tokens` tokens, greedy or
  `--num_beams`), each layer call timed by a forward pre-hook and hook on the layer (hooks on a layer itself do not
  change its path), summed per step over the six layers, median over the decode steps;
- `written out`: the same step as one function of plain torch operators (`decode_step` below: the query/key/value,
  output, cross-attention query and output, feed-forward products on `torch._int_mm` with the quantization's range,
  scale and zero point kept in tensors instead of read on the host; a key/value cache of fixed length written in place,
  masked beyond the current position; post-LN as BERT), eager;
- `compiled`: that function under `torch.compile` (inductor's C++ code for the element-wise work around the products,
  one compilation for all six layers, whose weights are arguments);
- `compiled around the attention`: only its three runs of products between the attentions compiled (the query/key/value
  product; the output product, LayerNorm and cross-attention query; the cross-attention output and the feed-forward),
  the attentions and the cache eager, as a version that keeps transformers' caches would run.

Then `generate` itself, interleaved (`--repeats` rounds), against `EncoderDecoderModel`: the shipped int8 copy, a
copy of it whose decode steps run those compiled products around its own attention and transformers' caches
(`with_compiled_parts`), and, greedy only, one whose decode steps run the whole compiled step on a fixed-length cache
kept beside transformers' (`with_compiled_step`); with the share of the shipped copy's tokens each repeats.

The written-out step is a prototype for timing only: its fp32 scale arithmetic is not the shipped quantizer's (which
computes the scale on the host in float64), and its cache is not transformers' `DynamicCache`. It answers how much
time the operator calls and element-wise passes around the int8 products cost, not what a shipped version would give.

    python scripts/benchmarks/benchmark_compiled_decode_step.py [--threads 2] [--num_beams 1] [--json_file F]
"""

import copy as copy_module
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional

import seqbert
from seqbert.attention_backends import additive_mask
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark_decoder_precisions as setup  # noqa: E402  (next to this script: the issue's model and sources)


@dataclass
class StepArguments:
    threads: int = field(default=2, metadata={"help": "torch threads."})
    batch_size: int = field(default=8, metadata={"help": "Sources per generate call (real Rotten Tomatoes snippets)."})
    num_beams: int = field(default=1, metadata={"help": "1: greedy; more: beam search (rows = batch x beams)."})
    new_tokens: int = field(default=32, metadata={"help": "Tokens generated per sequence (the cache's length)."})
    repeats: int = field(default=7, metadata={"help": "Timed rounds of the written-out steps (median reported)."})
    json_file: str | None = field(default=None, metadata={"help": "Also write the results to this JSON file."})

    def __post_init__(self):
        for name in ("threads", "batch_size", "num_beams", "new_tokens", "repeats"):
            if getattr(self, name) < 1:
                raise ScriptInputError(f"--{name} must be >= 1, got {getattr(self, name)}")


def int8_product(x: torch.Tensor, packed) -> torch.Tensor:
    """A `PackedLinear`'s small int8 product, its quantization kept in tensors: (rows, in) fp32 -> (rows, out) fp32."""
    low = torch.clamp(x.amin(), max=0.0)
    high = torch.clamp(x.amax(), min=0.0)
    scale = torch.clamp((high - low) / 253, min=torch.finfo(torch.float32).tiny)
    zero_point = torch.ceil(-low / scale)
    shifted = torch.round(x * (1.0 / scale) + (zero_point - 128)).to(torch.int8)
    sums = torch._int_mm(shifted, packed.gemm_weight).to(torch.float32)
    return (sums + (128 - zero_point) * packed.gemm_weight_sums) * (packed.weight_scale * scale) + packed.bias


def before_attention(x: torch.Tensor, packed: dict) -> torch.Tensor:
    """The self-attention's query/key/value product: (rows, H) -> (rows, 3H)."""
    return int8_product(x, packed["qkv"])


def between_attentions(attended, x, packed: dict, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """The self-attention's output product, residual and LayerNorm, then the cross-attention's query product."""
    x = functional.layer_norm(int8_product(attended, packed["out_proj"]) + x, (x.shape[-1],), *norm)
    return x, int8_product(x, packed["cross_query"])


def after_attention(attended, x, packed: dict, norm, last_norm) -> torch.Tensor:
    """The cross-attention's output product, residual and LayerNorm, then the feed-forward with its residual and
    LayerNorm."""
    x = functional.layer_norm(int8_product(attended, packed["cross_out_proj"]) + x, (x.shape[-1],), *norm)
    up = functional.gelu(int8_product(x, packed["up_proj"]))
    return functional.layer_norm(int8_product(up, packed["down_proj"]) + x, (x.shape[-1],), *last_norm)


EAGER_PARTS = (before_attention, between_attentions, after_attention)


def decode_step(
    x,
    position,
    self_mask,
    keys,
    values,
    cross_keys_t,
    cross_values,
    cross_mask,
    packed,
    norms,
    heads,
    parts=EAGER_PARTS,
):
    """One post-LN decoder layer for one token per row: x (rows, H); `keys`, `values` (rows x heads, length, D), this
    step's written at `position`; the cross-attention's (rows x heads, D, S) and (rows x heads, S, D). `parts`: the
    three runs of products between the attentions (`EAGER_PARTS`, or those compiled)."""
    rows, hidden = x.shape
    head_dim = hidden // heads
    scaling = 1 / math.sqrt(head_dim)
    query, key, value = parts[0](x, packed).view(rows, 3, heads, head_dim).unbind(1)
    keys.index_copy_(1, position, key.reshape(rows * heads, 1, head_dim))
    values.index_copy_(1, position, value.reshape(rows * heads, 1, head_dim))
    scores = torch.baddbmm(self_mask, query.reshape(rows * heads, 1, head_dim), keys.transpose(1, 2), alpha=scaling)
    attended = torch.bmm(scores.softmax(-1), values).view(rows, hidden)
    x, query = parts[1](attended, x, packed, norms[0])
    scores = torch.baddbmm(cross_mask, query.view(rows * heads, 1, head_dim), cross_keys_t, alpha=scaling)
    attended = torch.bmm(scores.softmax(-1), cross_values).view(rows, hidden)
    return parts[2](attended, x, packed, norms[1], norms[2])


def layer_norms(layer) -> list[tuple]:
    """A decoder layer's three LayerNorms (after self-attention, cross-attention, feed-forward) as `layer_norm`'s
    (weight, bias, eps)."""
    norms = (layer.self_attention_norm, layer.cross_attention_norm, layer.mlp_norm)
    return [(norm.weight, norm.bias, norm.eps) for norm in norms]


def fixed_cache_mask(position: int, max_length: int, rows: int) -> torch.Tensor:
    """The additive self-attention mask of a fixed-length cache (rows, 1, max_length): 0 up to `position`, fp32's
    minimum after it."""
    mask = torch.where(torch.arange(max_length) <= position, 0.0, torch.finfo(torch.float32).min)
    return mask.expand(rows, 1, max_length).contiguous()


def with_compiled_parts(int8_copy, parts):
    """`int8_copy` with its decoder layers' decode steps (one token per row, the cross-attention's keys and values
    cached) running `parts` around the copy's own attention and transformers' caches; every other call as shipped (a
    post-LN seq2seq copy; patched on the layer instances, for timing only)."""
    for layer in int8_copy.decoder.layers:

        def packed_forward(
            x, mask, encoder_states, encoder_mask, cache, kwargs, layer=layer, shipped=layer.packed_forward
        ):
            if x.shape[1] != 1 or cache is None or not cache.is_updated.get(layer.cross_attention.layer_idx):
                return shipped(x, mask, encoder_states, encoder_mask, cache, kwargs)
            rows, _, hidden = x.shape
            x, packed = x.view(rows, hidden), layer._packed
            qkv = parts[0](x, packed).view(rows, 1, 3 * hidden)
            heads, _ = layer.self_attention.heads(qkv, mask, past_key_values=cache, **kwargs)
            norms = layer_norms(layer)
            x, query = parts[1](heads.view(rows, hidden), x, packed, norms[0])
            heads, _ = layer.cross_attention.heads(query.view(rows, 1, hidden), encoder_states, encoder_mask, cache)
            return parts[2](heads.view(rows, hidden), x, packed, *norms[1:]).view(rows, 1, hidden)

        layer.packed_forward = packed_forward
    return int8_copy


def with_compiled_step(int8_copy, step, max_length: int):
    """`int8_copy` (greedy only) with its decoder layers' decode steps run whole by `step` (`decode_step` compiled) on
    a key/value cache of fixed length `max_length` kept beside transformers' (each step's keys and values are also
    appended to transformers' cache, as the shipped layers do, so that `generate` reads the same length); every other
    call as shipped. For timing only: beam search's reordering does not reach the fixed cache."""
    for layer in int8_copy.decoder.layers:

        def packed_forward(
            x, mask, encoder_states, encoder_mask, cache, kwargs, layer=layer, shipped=layer.packed_forward
        ):
            index = layer.cross_attention.layer_idx
            if x.shape[1] != 1 or cache is None or not cache.is_updated.get(index):
                return shipped(x, mask, encoder_states, encoder_mask, cache, kwargs)
            rows, _, hidden = x.shape
            heads = layer.self_attention.num_heads
            head_dim = hidden // heads
            kept = vars(cache).setdefault("benchmark_fixed_cache", {})
            if index not in kept:  # from the first step's keys and values, and the cross-attention's
                past = cache.self_attention_cache.layers[index]
                length = past.keys.shape[2]
                keys, values = (torch.zeros(rows * heads, max_length, head_dim) for _ in range(2))
                keys[:, :length] = past.keys.reshape(rows * heads, length, head_dim)
                values[:, :length] = past.values.reshape(rows * heads, length, head_dim)
                cross = cache.cross_attention_cache.layers[index]
                sources = cross.keys.shape[2]
                cross_keys_t = cross.keys.reshape(rows * heads, sources, head_dim).transpose(1, 2).contiguous()
                cross_values = cross.values.reshape(rows * heads, sources, head_dim)
                cross_mask = torch.zeros(rows * heads, 1, sources)
                if encoder_mask is not None:
                    additive = additive_mask(encoder_mask[:, :, -1:])  # (rows, 1, 1, sources)
                    cross_mask = additive.expand(rows, heads, 1, sources).reshape(rows * heads, 1, sources)
                kept[index] = [keys, values, cross_keys_t, cross_values, cross_mask, length]
            keys, values, cross_keys_t, cross_values, cross_mask, length = kept[index]
            out = step(
                x.view(rows, hidden), torch.tensor([length]), fixed_cache_mask(length, max_length, rows * heads),
                keys, values, cross_keys_t, cross_values, cross_mask, layer._packed, layer_norms(layer), heads,
            )  # fmt: skip
            new = (buffer[:, length].view(rows, heads, 1, head_dim) for buffer in (keys, values))
            cache.self_attention_cache.update(*new, index)
            kept[index][-1] = length + 1
            return out.view(rows, 1, hidden)

        layer.packed_forward = packed_forward
    return int8_copy


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(StepArguments, __doc__), argv)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as folder:
        reference, model, tokenizer = setup.build_seq2seq(folder)
    int8_copy = seqbert.optimize_for_cpu_inference(model, int8=True)
    sources = tokenizer(setup.snippets(args.batch_size), padding=True, return_tensors="pt")
    call = dict(
        **sources, decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, pad_token_id=0,
        max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, num_beams=args.num_beams,
    )  # fmt: skip
    layers = int8_copy.decoder.layers
    starts, layer_seconds = {}, []

    def before(layer, inputs):
        starts[id(layer)] = time.perf_counter()

    def after(layer, inputs, output):
        layer_seconds.append(time.perf_counter() - starts.pop(id(layer)))

    with torch.inference_mode():
        int8_copy.generate(**call)
        handles = [
            hook
            for layer in layers
            for hook in (layer.register_forward_pre_hook(before), layer.register_forward_hook(after))
        ]
        try:
            int8_copy.generate(**call)
        finally:
            for handle in handles:
                handle.remove()
    per_step = [sum(layer_seconds[i : i + len(layers)]) for i in range(len(layers), len(layer_seconds), len(layers))]

    config = int8_copy.config
    heads, hidden = config.num_attention_heads, config.hidden_size
    rows, length = args.batch_size * args.num_beams, args.new_tokens + 1
    source_length = sources["input_ids"].shape[1]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=generator)
    position = torch.tensor([length // 2])
    self_mask = fixed_cache_mask(length // 2, length, rows * heads)
    head_dim = hidden // heads
    per_layer = [  # the arguments of `decode_step` between the mask and `heads`, per layer
        (
            torch.randn(rows * heads, length, head_dim, generator=generator),
            torch.randn(rows * heads, length, head_dim, generator=generator),
            torch.randn(rows * heads, head_dim, source_length, generator=generator),
            torch.randn(rows * heads, source_length, head_dim, generator=generator),
            torch.zeros(rows * heads, 1, source_length),
            layer._packed,
            layer_norms(layer),
        )
        for layer in layers
    ]

    def run(step, parts=EAGER_PARTS):
        out = x
        for arguments in per_layer:
            out = step(out, position, self_mask, *arguments, heads, parts)
        return out

    compiled = torch.compile(decode_step, dynamic=False)
    compiled_parts = tuple(torch.compile(part, dynamic=False) for part in EAGER_PARTS)
    ways = {
        "written out": lambda: run(decode_step),
        "compiled": lambda: run(compiled),
        "compiled around the attention": lambda: run(decode_step, compiled_parts),
    }
    times = {name: [] for name in ways}
    compile_seconds = {}
    with torch.inference_mode():
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            compile_seconds[name] = time.perf_counter() - start
        for _ in range(args.repeats):
            for name, way in ways.items():
                begin = time.perf_counter()
                for _ in range(20):
                    way()
                times[name].append((time.perf_counter() - begin) / 20)
    compiled_copy = with_compiled_parts(copy_module.deepcopy(int8_copy), compiled_parts)
    engines = {"EncoderDecoderModel": reference, "int8 copy": int8_copy, "int8 copy, parts compiled": compiled_copy}
    if args.num_beams == 1:
        whole = with_compiled_step(copy_module.deepcopy(int8_copy), compiled, args.new_tokens + 1)
        engines["int8 copy, step compiled whole"] = whole
    with torch.inference_mode():
        ids = {name: engine.generate(**call) for name, engine in engines.items()}  # the compilation, untimed
        generate_seconds = setup.rounds(
            {name: (lambda engine=engine: engine.generate(**call)) for name, engine in engines.items()}, args.repeats
        )
    generate_ms = {name: 1e3 * statistics.median(values) for name, values in generate_seconds.items()}
    same = {
        name: (ids[name] == ids["int8 copy"]).float().mean().item() for name in engines if name.startswith("int8 copy,")
    }
    results = {
        "arguments": vars(args),
        "generate_ms": generate_ms,
        "generate_spread_ms": {name: [1e3 * min(v), 1e3 * max(v)] for name, v in generate_seconds.items()},
        "generate_speedup_vs_reference": {
            name: generate_ms["EncoderDecoderModel"] / value for name, value in generate_ms.items()
        },
        "same_tokens_as_shipped": same,
        "rows": rows,
        "in_generate_ms_per_step": 1e3 * statistics.median(per_step),
        "in_generate_spread_ms": [1e3 * min(per_step), 1e3 * max(per_step)],
        "ms_per_step": {name: 1e3 * statistics.median(values) for name, values in times.items()},
        "spread_ms": {name: [1e3 * min(values), 1e3 * max(values)] for name, values in times.items()},
        "first_call_seconds": compile_seconds,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_version": torch.__version__,
    }
    ways_text = ", ".join(f"{name} {value:.2f} ms" for name, value in results["ms_per_step"].items())
    print(
        f"six int8 decoder layers, one decode step, {rows} rows, {args.threads} threads: in generate "
        f"{results['in_generate_ms_per_step']:.2f} ms, {ways_text} (first calls, compilation included: "
        + ", ".join(f"{name} {value:.1f} s" for name, value in compile_seconds.items())
        + ")"
    )
    print(
        "generate: "
        + ", ".join(
            f"{name} {value:.1f} ms ({results['generate_speedup_vs_reference'][name]:.2f}x)"
            for name, value in generate_ms.items()
        )
        + "; share of the shipped copy's tokens repeated: "
        + ", ".join(f"{name} {100 * value:.1f} %" for name, value in same.items())
    )
    write_json(args.json_file, results)
    return results


if __name__ == "__main__":
    run_cli(main, script_parser(StepArguments, __doc__))
