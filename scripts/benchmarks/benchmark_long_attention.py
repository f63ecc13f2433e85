#!/usr/bin/env python
"""Inductor's CPU attention on long inputs (issue 39): `seqbert.optimize_for_cpu_inference` in bf16 and int8, its
attention as it ships (torch's CPU flash kernel per length group) and compiled by `torch.compile` in a few ways, each
against OpenVINO at its default precision, interleaved. About 5 minutes on 2 quiet CPU cores (2026-11-26, 2 threads).

    python scripts/benchmarks/benchmark_long_attention.py [--repeats 5] [--threads 2] [--output_file long_attention.json]

Workload: the first `--num_batches * --batch_size` convention speeches truncated at `--length` tokens, batches of
`--batch_size` padded to their longest (`benchmark.long_batches`), on MiniLM-L6 (real weights) and a seeded
bert-base-width `BertModel` with 4 layers (`benchmark.bert_base_folders`). Contenders, per model:

- `openvino_default`: OpenVINO compiled with no precision hint (`benchmark_engines.openvino_engine(precision=None)`,
  bf16 on CPUs with AVX512_BF16 or AMX; the precision it chose is read back);
- `seqbert_bf16` / `seqbert_int8`: `optimize_for_cpu_inference(model, dtype=torch.bfloat16)` / `(model, int8=True)`
  as the package ships them; attention is `LengthGroups.attend`, torch's `scaled_dot_product_attention` (its CPU
  flash kernel) per length group, in bf16 / fp32;
- `+compiled_sdpa`: the same per-group attention (layout, `scaled_dot_product_attention`, heads side by side) compiled
  by `torch.compile(dynamic=True)`: inductor lowers SDPA on the CPU to the same aten flash kernel, so this measures
  what compiling the glue around it gives;
- `+flex_packed`: `torch.nn.attention.flex_attention.flex_attention` compiled by `torch.compile(dynamic=True)`
  (inductor's C++ CPU flex-attention template), over the batch's real tokens as one (1, N, T, D) sequence with a
  document mask from the unpadded batch's sequence ids (`UnpaddedBatch.token_sequence`; `create_block_mask` once per
  forward, shared by the layers, counted in the timing): no gather into a padded layout, and whole blocks across two
  documents skipped;
- `+flex_groups`: the same flex attention per length group (the layout of `LengthGroups`) with a key-padding mask.

The compiled variants are built here from seqbert's public pieces (an optimized layer whose `length_groups` is
wrapped so that its `attend` runs the variant); the package itself has no compiled-attention option. Every contender
runs all batches per call; contenders run in turn, round after round (`interleaved_timing.interleave`), so a busy
spell of a shared machine falls on all of them; the first call of each (compilation included) and one more warm-up
round are left out. Reported: real (non-padding) tokens per second, median and fastest/slowest of `--repeats`, the
ratio to OpenVINO's default (of the medians, and the lowest/highest ratio within a round), the compile time (the
first call less a warm call: on the first batch, on the other batches, whose token counts differ, and on a batch cut
at 3/4 of `--length`: the recompiles), max |delta| on real tokens from the uncompiled optimized model of the same
precision and from transformers' `BertModel` in fp32, and the 1-minute load average around the rounds. Inductor
compiles into a fresh cache folder, so compile times are cold ones. It needs the `integrations` extra (OpenVINO) and
a C++ compiler for inductor. torch's 2-thread OpenMP regions slow down several times over when another process holds
a core; on a busy machine compare at `--threads 1`.
"""

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from transformers import AutoTokenizer, BertModel

import seqbert
from seqbert.cpu_inference import LengthGroups, bf16_linear_available, onednn_available
from seqbert.data import minilm_checkpoint_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchmark  # noqa: E402  (next to this script)
import benchmark_engines  # noqa: E402
from interleaved_timing import interleave, median_and_spread, timed  # noqa: E402


MODELS = ("minilm", "bert_base_4_layers")
VARIANTS = ("compiled_sdpa", "flex_packed", "flex_groups")
PRECISIONS = ("bf16", "int8")


@dataclass
class LongAttentionArguments:
    repeats: int = field(default=5, metadata={"help": "Interleaved timed rounds (median and spread shown)."})
    threads: int = field(default=2, metadata={"help": "Threads of every contender (torch and OpenVINO)."})
    length: int = field(default=512, metadata={"help": "Tokens the speeches are truncated at."})
    num_batches: int = field(default=3, metadata={"help": "Batches per timed call."})
    batch_size: int = field(default=8, metadata={"help": "Speeches per batch."})
    models: list[str] = field(
        default_factory=lambda: list(MODELS), metadata={"help": f"Models to run, of {', '.join(MODELS)}."}
    )
    variants: list[str] = field(
        default_factory=lambda: list(VARIANTS),
        metadata={"help": f"Compiled attention variants to time, of {', '.join(VARIANTS)}."},
    )
    precisions: list[str] = field(
        default_factory=lambda: list(PRECISIONS), metadata={"help": f"seqbert precisions, of {', '.join(PRECISIONS)}."}
    )
    output_file: str | None = field(default=None, metadata={"help": "Where to write the results as JSON."})

    def __post_init__(self):
        for name, chosen, allowed in (
            ("models", self.models, MODELS),
            ("variants", self.variants, VARIANTS),
            ("precisions", self.precisions, PRECISIONS),
        ):
            unknown = [value for value in chosen if value not in allowed]
            if unknown or not chosen and name != "variants":
                raise ScriptInputError(f"--{name} takes some of {', '.join(allowed)}; got {chosen}")
        for name in ("repeats", "threads", "length", "num_batches", "batch_size"):
            if getattr(self, name) < 1:
                raise ScriptInputError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.length < 2:
            raise ScriptInputError(f"--length must hold [CLS] and [SEP] (at least 2), got {self.length}")


# ---------------------------------------------------------------------------------------------------------------------
# The compiled attention variants: (length_groups, unpadded, qkv (1, T, 3H), attention module) -> heads (1, T, H).


def _split_heads(qkv: torch.Tensor, num_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, L, 3H) fused projections -> query, key, value, each (B, N, L, D) (strided views)."""
    return qkv.view(*qkv.shape[:2], 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)


def _group_attention(num_heads: int, head_dim: int, scale: float) -> Callable:
    """One length group as `LengthGroups.attend` computes it: (S_g, L_g, 3H) block and (S_g, 1, 1, L_g) key mask ->
    (S_g, L_g, H). Head counts and scale are closed over, so that `torch.compile(dynamic=True)` keeps them constant."""

    def attend(block: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        query, key, value = _split_heads(block, num_heads, head_dim)
        heads = nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=key_mask, scale=scale)
        return heads.transpose(1, 2).reshape(*block.shape[:2], num_heads * head_dim)  # (S_g, L_g, H)

    return attend


def _flex(num_heads: int, head_dim: int, scale: float) -> Callable:
    """flex attention at a fixed scale: query, key, value (B, N, L, D) and a block mask -> (B, N, L, D). Compiled with
    static shapes: under `dynamic=True` inductor's CPU flex template (torch 2.13) puts its block sizes into the C++ code
    by replacing a size variable's name as plain text, which also hits longer names starting with it, and a process
    compiling both flex variants failed ("'cur_qSplitSize8' was not declared")."""

    def attend(query, key, value, block_mask):
        return flex_attention(query, key, value, block_mask=block_mask, scale=scale)

    return attend


class AttentionVariant:
    """One compiled way of computing the optimized model's attention, with its own `torch.compile` caches (one per
    contender, so that each one's compile time is its own; one compiled function per head shape)."""

    def __init__(self, name: str):
        self.name = name
        self.compiled: dict[tuple[int, int, float], Callable] = {}

    def compiled_for(self, attention) -> Callable:
        shape = (attention.num_heads, attention.head_dim, attention.scaling)
        if shape not in self.compiled:
            if self.name == "compiled_sdpa":
                self.compiled[shape] = torch.compile(_group_attention(*shape), dynamic=True)
            else:  # static shapes: one compile per new shape (see `_flex`)
                self.compiled[shape] = torch.compile(_flex(*shape), dynamic=False)
        return self.compiled[shape]

    def __call__(self, groups: LengthGroups, unpadded, qkv: torch.Tensor, attention) -> torch.Tensor:
        num_heads, head_dim, hidden = attention.num_heads, attention.head_dim, qkv.shape[-1] // 3
        compiled = self.compiled_for(attention)
        if self.name == "flex_packed":
            if not hasattr(groups, "document_mask"):  # once per forward, for every layer
                sequence = unpadded.token_sequence  # (T,)

                def same_document(b, h, q_idx, kv_idx):
                    return sequence[q_idx] == sequence[kv_idx]

                total = sequence.shape[0]
                groups.document_mask = create_block_mask(same_document, None, None, total, total, device="cpu")
            query, key, value = _split_heads(qkv, num_heads, head_dim)  # (1, N, T, D) each
            heads = compiled(query, key, value, groups.document_mask)  # (1, N, T, D)
            return heads.transpose(1, 2).reshape(1, -1, hidden)
        laid_out = torch.index_select(qkv[0], 0, groups.sources)  # (total_rows, 3H)
        output = qkv.new_empty(groups.total_rows, hidden)
        if self.name == "flex_groups" and not hasattr(groups, "padding_masks"):  # once per forward
            groups.padding_masks = [_padding_block_mask(key_mask) for *_, key_mask in groups.groups]
        for index, (first_row, size, width, key_mask) in enumerate(groups.groups):
            block = laid_out[first_row : first_row + size * width].view(size, width, 3 * hidden)
            if self.name == "compiled_sdpa":
                heads = compiled(block, key_mask)
            else:
                query, key, value = _split_heads(block, num_heads, head_dim)
                heads = compiled(query, key, value, groups.padding_masks[index])
                heads = heads.transpose(1, 2).reshape(size, width, hidden)
            output[first_row : first_row + size * width].view(size, width, hidden).copy_(heads)
        return torch.index_select(output, 0, groups.rows).unsqueeze(0)


def _padding_block_mask(key_mask: torch.Tensor):
    """flex attention's mask of one length group: key `kv_idx` of sequence `b` is real. `key_mask` (S_g, 1, 1, L_g)."""
    lengths = key_mask[:, 0, 0].sum(-1)  # (S_g,)

    def real_key(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    size, width = key_mask.shape[0], key_mask.shape[-1]
    return create_block_mask(real_key, size, None, width, width, device="cpu")


class _VariantGroups:
    """A `LengthGroups` whose `attend` runs an `AttentionVariant` instead of the shipped attention."""

    def __init__(self, groups: LengthGroups, unpadded, variant: AttentionVariant):
        self.groups, self.unpadded, self.variant = groups, unpadded, variant

    def attend(self, qkv: torch.Tensor, attention) -> torch.Tensor:
        return self.variant(self.groups, self.unpadded, qkv, attention)


class _VariantLayer:
    """Mixed into an optimized encoder layer's class: the layer as optimized, its attention by `self._variant`."""

    _variant: AttentionVariant

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        groups = kwargs.get("length_groups")
        if groups is not None:
            kwargs["length_groups"] = _VariantGroups(groups, kwargs.get("unpadded"), self._variant)
        return super().forward(hidden_states, attention_mask, **kwargs)


def with_attention_variant(optimized: nn.Module, variant: AttentionVariant) -> nn.Module:
    """`optimized` (from `optimize_for_cpu_inference`, not copied: its packed weights are shared) with its encoder
    layers' attention computed by `variant`: a shallow copy of the module tree whose layers get a mixed-in class."""
    model = _shallow_module_copy(optimized)
    for module in model.modules():
        if hasattr(module, "_packed"):
            module.__class__ = type(f"Variant{type(module).__name__}", (_VariantLayer, type(module)), {})
            module._variant = variant
    return model


def _shallow_module_copy(module: nn.Module) -> nn.Module:
    """A copy of the module tree sharing parameters, buffers and other attributes with `module`."""
    copied = module.__class__.__new__(module.__class__)
    copied.__dict__ = dict(module.__dict__)
    copied._modules = {
        name: None if child is None else _shallow_module_copy(child) for name, child in module._modules.items()
    }
    return copied


# ---------------------------------------------------------------------------------------------------------------------


def _max_delta(got: list[torch.Tensor], expected: list[torch.Tensor], batches: list[dict]) -> float:
    """Max |got - expected| over the real tokens of every batch."""
    return max(
        (a.float() - b.float())[batch["attention_mask"].bool()].abs().max().item()
        for a, b, batch in zip(got, expected, batches, strict=True)
    )


@torch.inference_mode()
def run_model(name: str, folder: str, batches: list[dict], other: dict, args: LongAttentionArguments) -> dict:
    """Every contender on one model: timings on `batches`, compile times (`other`: a batch of another length, for the
    recompile) and deltas."""
    inputs = [{key: batch[key] for key in benchmark_engines.ONNX_INPUTS} for batch in batches]
    new_length = {key: other[key] for key in benchmark_engines.ONNX_INPUTS}
    # What the compile times are taken on: the first batch, the other batches (other token counts), a new length.
    compile_runs = {"first_batch": inputs[:1], "other_batches": inputs[1:], "new_length": [new_length]}
    real_tokens = sum(int(batch["attention_mask"].sum()) for batch in batches)
    bert = BertModel.from_pretrained(folder, add_pooling_layer=False).eval()
    reference = [bert(**batch).last_hidden_state for batch in inputs]
    model = seqbert.SeqBertModel.from_bert_pretrained(folder, add_pooling_layer=False).eval()

    openvino = benchmark_engines.openvino_engine(bert, inputs[0], args.threads, precision=None)
    calls = [openvino.prepare(batch) for batch in inputs]
    workers: dict[str, Callable[[], object]] = {"openvino_default": lambda calls=calls: [call() for call in calls]}
    outputs = {"openvino_default": [openvino.padded(call(), batch) for call, batch in zip(calls, inputs, strict=True)]}
    precision = {"openvino_default": openvino.precision}
    compile_seconds, base_of = {}, {}
    for chosen in args.precisions:
        if chosen == "bf16" and not bf16_linear_available():
            print(f"{name}: skipping bf16, oneDNN runs no bf16 linear on this CPU")
            continue
        kwargs = {"dtype": torch.bfloat16} if chosen == "bf16" else {"int8": True}
        optimized = seqbert.optimize_for_cpu_inference(model, **kwargs)
        contenders = {f"seqbert_{chosen}": optimized}
        for variant in args.variants:
            contenders[f"seqbert_{chosen}+{variant}"] = with_attention_variant(optimized, AttentionVariant(variant))
        for label, contender in contenders.items():
            if label != f"seqbert_{chosen}":  # compile: the first batch, the other batches, a batch of new length
                compile_seconds[label] = {  # each run twice, in this order: first call, then warm call
                    f"{run}_{call}_call_s": timed(lambda c=contender, b=run_batches: [c(**batch) for batch in b])
                    for run, run_batches in compile_runs.items()
                    for call in ("first", "warm")
                }
            outputs[label] = [contender(**batch).last_hidden_state for batch in inputs]
            workers[label] = lambda contender=contender: [contender(**batch) for batch in inputs]
            precision[label] = chosen
            base_of[label] = f"seqbert_{chosen}"

    interleave(workers, 1)  # warm-up round, not counted
    load_before = os.getloadavg()[0]
    times = interleave(workers, args.repeats)
    load_after = os.getloadavg()[0]
    ov = times["openvino_default"]
    rows = {}
    for label, seconds in times.items():
        summary = median_and_spread(seconds)
        fastest, slowest = summary["spread_seconds"]
        per_round = [o / s for o, s in zip(ov, seconds, strict=True)]
        rows[label] = {
            "precision": precision[label],
            "tokens_per_s": real_tokens / summary["seconds"],
            "tokens_per_s_spread": [real_tokens / slowest, real_tokens / fastest],
            **summary,
            "vs_openvino_default": statistics.median(ov) / summary["seconds"],
            "vs_openvino_default_per_round": [min(per_round), max(per_round)],
            "max_abs_delta_vs_bert_fp32": _max_delta(outputs[label], reference, inputs),
        }
        if label in base_of and label != base_of[label]:
            rows[label]["max_abs_delta_vs_uncompiled"] = _max_delta(outputs[label], outputs[base_of[label]], inputs)
        if label in compile_seconds:
            rows[label]["compile"] = compile_seconds[label]
    padding = 1 - real_tokens / sum(batch["attention_mask"].numel() for batch in batches)
    return {
        "model": name,
        "real_tokens": real_tokens,
        "padding_fraction": padding,
        "load_average_1min": [load_before, load_after],  # other processes on the machine, before and after the rounds
        "contenders": rows,
    }


def print_table(result: dict, args: LongAttentionArguments) -> None:
    print(
        f"\n{result['model']}, {args.num_batches} batches of {args.batch_size} x {args.length} tokens "
        f"({result['real_tokens']} real, {result['padding_fraction']:.0%} padding), {args.threads} threads, "
        f"medians of {args.repeats} interleaved rounds; 1-minute load average {result['load_average_1min'][0]:.1f} "
        f"before the rounds, {result['load_average_1min'][1]:.1f} after"
    )
    print(
        "| contender | precision | real tokens/s | fastest / slowest | vs OpenVINO default | per-round ratio range "
        "| compile s: first call, other batches, new length | max abs delta vs uncompiled | max abs delta vs BertModel fp32 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, row in result["contenders"].items():
        low, high = row["tokens_per_s_spread"]
        per_low, per_high = row["vs_openvino_default_per_round"]
        compiled = row.get("compile", {})
        compile_cell = ""
        if compiled:  # first-call time less the warm call's: what compiling added
            compile_cell = " / ".join(
                f"{max(0.0, compiled[f'{what}_first_call_s'] - compiled[f'{what}_warm_call_s']):.1f}"
                for what in ("first_batch", "other_batches", "new_length")
            )
        uncompiled = f"{row['max_abs_delta_vs_uncompiled']:.2e}" if "max_abs_delta_vs_uncompiled" in row else ""
        print(
            f"| {label} | {row['precision']} | {row['tokens_per_s']:,.0f} | {low:,.0f} / {high:,.0f} "
            f"| {row['vs_openvino_default']:.2f}x | {per_low:.2f}-{per_high:.2f}x | {compile_cell} "
            f"| {uncompiled} | {row['max_abs_delta_vs_bert_fp32']:.3f} |"
        )


def main(argv: list[str] | None = None) -> dict:
    (args,) = parse_arguments(script_parser(LongAttentionArguments, __doc__), argv)
    if not onednn_available():
        raise ScriptInputError(
            "optimize_for_cpu_inference needs torch's oneDNN operators on an x86 CPU with AVX2 or better; this CPU "
            f"reports capability {torch.backends.cpu.get_cpu_capability()!r}"
        )
    cpu = {**benchmark.cpu_description(), "cores": os.cpu_count(), "torch": torch.__version__}
    print(
        f"CPU: {cpu['model_name']}, {cpu['cores']} cores; avx512_bf16 {cpu['avx512_bf16']}, amx flags "
        f"{' '.join(cpu['amx']) or 'none'}; torch {cpu['torch']}, capability {cpu['torch_cpu_capability']}"
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    batches = benchmark.long_batches(tokenizer, args.length, args.num_batches, args.batch_size)
    other = benchmark.long_batches(tokenizer, max(2, args.length * 3 // 4), 1, args.batch_size)[0]  # recompiles
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    recompile_limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 256  # flex attention compiles once per shape (see `_flex`)
    results = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "arguments": vars(args), "models": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")  # cold compiles
            folders = {"minilm": str(minilm_checkpoint_path())}
            if "bert_base_4_layers" in args.models:
                folders["bert_base_4_layers"] = benchmark.bert_base_folders(tmp)[1]
            for name in args.models:
                torch.manual_seed(0)
                result = run_model(name, folders[name], batches, other, args)
                results["models"].append(result)
                print_table(result, args)
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.config.recompile_limit = recompile_limit
        if cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    write_json(args.output_file, results)
    return results


if __name__ == "__main__":
    run_cli(main, script_parser(LongAttentionArguments, __doc__))
