#!/usr/bin/env python
"""How many kernels a forward (and its backward) would launch on a GPU, and how often it reads the host, counted on a
CPU: seqbert in its CUDA configuration against transformers' BERT under sdpa, both holding the same seeded bert-base
weights, on 32 real Rotten Tomatoes snippets (about half padding), in bf16. About 1 minute on 2 CPU cores.

    python scripts/checks/count_launches.py [--num_hidden_layers 12] [--batch_size 32] [--json_file count_launches.json]

Counted with torch's dispatch modes (`LaunchCounter`), so it needs no GPU:

- a *launch* is every aten op that would start a kernel on a GPU: every op but views (`OpOverload.is_view`) and
  allocations (`empty`, `empty_like`, ...), forward and backward alike; an attention kernel counts as one launch
  forward and one backward, as on a GPU, whatever its CPU implementation dispatches (`one_kernel`), with its output
  and gradients laid out in memory as the GPU kernels write them; `scaled_dot_product_attention` given a boolean mask
  also counts the conversion to an additive mask that torch runs before it picks a kernel, on every device (two
  `scalar_tensor` fills and a `where`; on a GPU its memory-efficient kernel may also pad the mask to a multiple of 16
  keys, which is not counted);
- a *host read* is every op that makes a GPU wait for its result: a scalar read (`item`, `bool`, `int`, `tolist`),
  `nonzero`, boolean indexing, `masked_select`, `equal`, `unique`, `repeat_interleave` without `output_size`.

*The CUDA configuration* (`cuda_configuration`): seqbert takes the path it takes on a CUDA GPU that runs
flash-attention (compute capability 8.0 or newer), with torch's flash-attention forward
(`aten._flash_attention_forward`, which has no CPU kernel) stood in for by `FlashAttentionDouble`: the same
mathematics on the CPU, dropout included, counted as one launch. BERT runs as it is; its `scaled_dot_product_attention`
counts as one launch (on a GPU, with a mask and dropout, the memory-efficient kernel).

What is counted is the dispatch on a CPU: a few ops decompose differently on CUDA (dropout is one fused kernel there,
`bernoulli_`, `div_` and `mul` here), equally for both models. The profile section of
`scripts/benchmarks/benchmark_gpu.py` counts real launches and syncs on a GPU.

Rows: one per (head, mode): `SeqBertForSequenceClassification` / `BertForSequenceClassification` (labels),
`SeqBertForTokenClassification` / `BertForTokenClassification` (labels), `SeqBertForMaskedLM` with
`sparse_prediction` / `BertForMaskedLM` (15 % of the real tokens labelled), each a training step (train mode, BERT's
dropout 0.1 in hidden states and attention, forward and backward) and an inference forward (eval mode, no labels,
`SeqBertModel` / `BertModel`). Written to `--json_file` and printed as a table.
"""

import collections
import contextlib
import tempfile
from dataclasses import dataclass, field
from unittest import mock

import pandas as pd
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

import seqbert
from seqbert import attention_backends
from seqbert.data import minilm_checkpoint_path, rotten_tomatoes_path
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser, write_json


aten = torch.ops.aten

# Ops that start no kernel on a GPU besides views: allocations and autograd's bookkeeping.
NOT_LAUNCHES = {
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.detach.default,
    aten._unsafe_view.default,
    aten.lift_fresh.default,
    aten.set_.source_Tensor,
}

# Ops whose result the host waits for on a GPU.
HOST_READS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
}


def _is_host_read(func, args, kwargs) -> bool:
    if func in HOST_READS:
        return True
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None and (len(args) < 2 or args[1] is None)
    if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default):
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ())
    return False


@dataclass
class LaunchCount:
    """What `LaunchCounter` counted: launches by op name, host reads by op name."""

    launches: collections.Counter = field(default_factory=collections.Counter)
    host_reads: collections.Counter = field(default_factory=collections.Counter)
    paused: int = 0

    @property
    def total_launches(self) -> int:
        return sum(self.launches.values())

    @property
    def total_host_reads(self) -> int:
        return sum(self.host_reads.values())


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, count: LaunchCount):
        super().__init__()
        self.count = count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.count.paused:
            if _is_host_read(func, args, kwargs):
                self.count.host_reads[str(func.overloadpacket)] += 1
            elif not func.is_view and func not in NOT_LAUNCHES:
                self.count.launches[str(func.overloadpacket)] += 1
        return func(*args, **kwargs)


class _OneKernel(torch.autograd.Function):
    """Runs `function(*tensors)` with counting paused and counts it as one launch; its backward (recomputed under the
    same random state, so with the same dropout) as one more."""

    @staticmethod
    def forward(ctx, count, name, function, *tensors):
        ctx.count, ctx.name, ctx.function = count, name, function
        ctx.rng_state = torch.get_rng_state()
        ctx.save_for_backward(*tensors)
        count.paused += 1
        try:
            with torch.no_grad():
                output = function(*tensors)
        finally:
            count.paused -= 1
        count.launches[name] += 1
        return output

    @staticmethod
    def backward(ctx, grad_output):
        tensors = ctx.saved_tensors
        ctx.count.paused += 1
        try:
            inputs = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            with torch.enable_grad(), torch.random.fork_rng(devices=[]):
                torch.set_rng_state(ctx.rng_state)
                output = ctx.function(*inputs)
            wanted = [t for t in inputs if t.requires_grad]
            grads = iter(torch.autograd.grad(output, wanted, grad_output, allow_unused=True))
            # Each gradient laid out in memory as its input is, as the GPU kernels write them.
            result = [torch.empty_like(t).copy_(next(grads)) if t.requires_grad else None for t in inputs]
        finally:
            ctx.count.paused -= 1
        ctx.count.launches[ctx.name + "_backward"] += 1
        return (None, None, None, *result)


def one_kernel(count: LaunchCount | None, name: str, function, *tensors):
    """`function(*tensors)`, counted as one launch forward and one backward in `count` (if any)."""
    if count is None:
        return function(*tensors)
    return _OneKernel.apply(count, name, function, *tensors)


class _FunctionCounter(TorchFunctionMode):
    """`tolist` reads the host without dispatching an op on a CPU; sdpa is one kernel on a GPU."""

    def __init__(self, count: LaunchCount):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.tolist and not self.count.paused:
            self.count.host_reads["tolist"] += 1
        if func is torch.nn.functional.scaled_dot_product_attention and not self.count.paused:
            query, key, value, *rest = args
            mask = rest[0] if rest else kwargs.pop("attn_mask", None)
            options = {k: v for k, v in kwargs.items()}
            if mask is not None and mask.dtype == torch.bool:
                # What torch's sdpa does with a boolean mask on every device before it picks a kernel (counted):
                # the additive mask, 0 where True and -inf where False.
                zero, minus_infinity = (torch.scalar_tensor(x, dtype=query.dtype) for x in (0.0, -float("inf")))
                mask = torch.where(mask, zero, minus_infinity)

            def attention(q, k, v, m=mask):
                output = torch.nn.functional.scaled_dot_product_attention(q, k, v, m, *rest[1:], **options)
                # (B, N, L, D) over memory laid out (B, L, N, D), as the GPU's kernels return it (transposing it back
                # is free there), whichever CPU kernel ran
                return output.transpose(1, 2).contiguous().transpose(1, 2)

            return one_kernel(self.count, "scaled_dot_product_attention", attention, query, key, value)
        return func(*args, **kwargs)


@contextlib.contextmanager
def LaunchCounter():
    """Count launches and host reads of everything run inside (see the module docstring); yields a `LaunchCount`."""
    count = LaunchCount()
    with _FunctionCounter(count), _DispatchCounter(count):
        yield count


class FlashAttentionDouble:
    """
    Stands in on a CPU for torch's `aten._flash_attention_forward` with cumulative sequence lengths: softmax(Q Kᵀ ·
    scale) V within each sequence, dropout on the weights (kept ones scaled by 1 / (1 - p), "Dropout", Srivastava et
    al. 2014), as one masked product over all T tokens, in the dtype of the inputs with a float32 softmax. Checks the
    arguments the kernel receives, records the calls (`calls`, `dropouts`) and counts as one launch in `count`.

    Returns, as the kernel does, `(output, logsumexp, rng_state, unused, debug_attn_mask)`; only `output` (T, N, D)
    carries values.
    """

    def __init__(self, count: LaunchCount | None = None, read_arguments: bool = True):
        self.count, self.read_arguments = count, read_arguments
        self.calls, self.dropouts = 0, []

    def __call__(self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, dropout_p, is_causal, debug_mask, **kw):
        assert query.dim() == 3 and query.shape == key.shape == value.shape and query.stride(-1) == 1
        assert query.dtype == key.dtype == value.dtype and not is_causal and not debug_mask
        assert cu_seq_q.dtype == torch.int32 and cu_seq_k is cu_seq_q and max_q == max_k
        if self.read_arguments:  # reading them on the host would break a traced graph and count as a read
            with _paused(self.count):
                assert int(cu_seq_q[-1]) == query.shape[0] and max_q == int(cu_seq_q.diff().max())
        self.calls += 1
        self.dropouts.append(dropout_p)
        scale = kw.get("scale") or query.shape[-1] ** -0.5

        def attention(q, k, v):
            tokens = torch.arange(q.shape[0])
            sequence = torch.searchsorted(cu_seq_q[1:].long(), tokens, right=True)  # (T,)
            allowed = sequence[:, None] == sequence[None, :]  # (T, T)
            q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # (N, T, D)
            weights = (torch.matmul(q, k.transpose(1, 2)) * scale).float().masked_fill(~allowed, float("-inf"))
            weights = torch.nn.functional.dropout(weights.softmax(-1), p=dropout_p)
            return torch.matmul(weights.to(v.dtype), v).transpose(0, 1).contiguous()  # (T, N, D), as the kernel

        output = one_kernel(self.count, "_flash_attention_forward", attention, query, key, value)
        empty = query.new_empty(0)
        return output, empty, empty, empty, empty


@contextlib.contextmanager
def _paused(count: LaunchCount | None):
    if count is not None:
        count.paused += 1
    try:
        yield
    finally:
        if count is not None:
            count.paused -= 1


@contextlib.contextmanager
def cuda_configuration(count: LaunchCount | None = None, read_arguments: bool = True, float32: bool = False):
    """seqbert as on a CUDA GPU that runs flash-attention, on the CPU: the variable-length path is taken wherever it
    would be on such a GPU, with `FlashAttentionDouble` (counting in `count`) for the kernel. With `float32`, the path
    is taken for fp32 too (the real kernel takes fp16 and bf16 only), so that tests can hold it to fp32 tolerances.
    Yields the double."""
    double = FlashAttentionDouble(count, read_arguments)
    dtypes = (torch.float16, torch.bfloat16, torch.float32) if float32 else attention_backends._HALF_PRECISION
    with (
        mock.patch.object(attention_backends, "flash_attention_forward", double),
        mock.patch.object(attention_backends, "runs_flash_attention", lambda device: True),
        mock.patch.object(attention_backends, "_HALF_PRECISION", dtypes),
    ):
        yield double


@dataclass
class CountArguments:
    num_hidden_layers: int = field(default=12, metadata={"help": "Layers of the bert-base-width models."})
    batch_size: int = field(default=32, metadata={"help": "Rotten Tomatoes snippets in the batch."})
    precisions: list[str] = field(
        default_factory=lambda: ["bf16", "autocast"],
        metadata={
            "help": "bf16: the models loaded in bf16; autocast: fp32 weights under torch.autocast(dtype=bfloat16), "
            "what Trainer --bf16 runs.",
            "choices": ["bf16", "autocast"],
            "nargs": "+",
        },
    )
    json_file: str | None = field(default="count_launches.json", metadata={"help": "Where to write the rows."})

    def __post_init__(self):
        for name in ("num_hidden_layers", "batch_size"):
            if getattr(self, name) < 1:
                raise ScriptInputError(f"--{name} ({getattr(self, name)}) must be >= 1")


# (row name, seqbert class, BERT class, extra config of both, labels maker)
HEADS = (
    ("sequence classification", seqbert.SeqBertForSequenceClassification, BertForSequenceClassification),
    ("token classification", seqbert.SeqBertForTokenClassification, BertForTokenClassification),
    ("masked LM (seqbert: sparse prediction)", seqbert.SeqBertForMaskedLM, BertForMaskedLM),
    ("inference forward", seqbert.SeqBertModel, BertModel),
)


def snippet_batch(batch_size: int) -> dict[str, torch.Tensor]:
    """The first `batch_size` Rotten Tomatoes snippets, tokenized and padded to the longest."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    frame = pd.read_csv(rotten_tomatoes_path())
    texts = frame[frame.category.isin(["fresh", "rotten"])].text.tolist()[:batch_size]
    return dict(tokenizer(texts, padding=True, return_tensors="pt"))


def labels_for(name: str, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Seeded labels for the head `name`: a class per snippet, a class per real token, 15 % of real tokens masked."""
    generator = torch.Generator().manual_seed(0)
    mask = batch["attention_mask"].bool()
    if name == "sequence classification":
        return {"labels": torch.randint(0, 2, mask.shape[:1], generator=generator)}
    if name == "token classification":
        return {"labels": torch.randint(0, 2, mask.shape, generator=generator).masked_fill(~mask, -100)}
    if name.startswith("masked LM"):
        chosen = (torch.rand(mask.shape, generator=generator) < 0.15) & mask
        return {"labels": batch["input_ids"].masked_fill(~chosen, -100)}
    return {}


def count(model: torch.nn.Module, batch: dict, labels: dict, seqbert_model: bool, autocast: bool) -> LaunchCount:
    """One forward (and backward, with labels) of `model`, counted, under bf16 autocast or not; seqbert in its CUDA
    configuration."""
    with LaunchCounter() as counted:
        with cuda_configuration(counted) if seqbert_model else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                output = model(**batch, **labels)
            if labels:
                output.loss.backward()
    return counted


def main(argv: list[str] | None = None) -> list[dict]:
    (args,) = parse_arguments(script_parser(CountArguments, __doc__), argv)
    batch = snippet_batch(args.batch_size)
    padding = 1 - batch["attention_mask"].float().mean().item()
    rows = []
    for precision in args.precisions:
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        for name, seqbert_class, bert_class in HEADS:
            with tempfile.TemporaryDirectory() as folder:
                torch.manual_seed(0)
                extra = {"num_labels": 2} if "classification" in name else {}
                bert_class(BertConfig(num_hidden_layers=args.num_hidden_layers, **extra)).save_pretrained(folder)
                bert = bert_class.from_pretrained(folder, attn_implementation="sdpa", dtype=dtype)
                mine = seqbert_class.from_bert_pretrained(folder, dtype=dtype, sparse_prediction=True)
            labels = labels_for(name, batch)
            for model in (bert, mine):
                model.train(bool(labels))
            autocast = precision == "autocast"
            counted = {
                "bert": count(bert, batch, labels, False, autocast),
                "seqbert": count(mine, batch, labels, True, autocast),
            }
            mode = "training step (forward + backward)" if labels else "forward"
            row = {"row": name, "mode": mode, "precision": precision, "padding": padding}
            for side, c in counted.items():
                row[f"{side}_launches"], row[f"{side}_host_reads"] = c.total_launches, c.total_host_reads
                row[f"{side}_host_read_ops"] = dict(c.host_reads)
            rows.append(row)
            print(
                f"{precision:<8} {name:<40} {mode:<36} launches seqbert {row['seqbert_launches']:>5}, BERT "
                f"{row['bert_launches']:>5} | host reads seqbert {row['seqbert_host_reads']}, BERT {row['bert_host_reads']}"
            )
    write_json(args.json_file, {"batch_size": args.batch_size, "layers": args.num_hidden_layers, "rows": rows})
    return rows


if __name__ == "__main__":
    run_cli(main, script_parser(CountArguments, __doc__))
