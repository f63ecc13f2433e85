"""The CUDA dry run's harness: seqbert's CUDA code executed on a CPU, on fake CUDA tensors that run torch's real meta
kernels (shapes, dtypes, devices and strides, no values), with the flash-attention kernel's argument contract
mirrored, what the kernel trusts checked, and every host sync accounted for. `tests/test_cuda_dry_run.py` runs the
flows; `scripts/benchmarks/estimate_gpu_memory.py` measures GPU memory and FLOPs with it.

What a CPU-only torch build lacks, and who supplies it:

- a CUDA device guard and CUDA hooks, without which fake CUDA tensors cannot be indexed nor differentiated:
  `fake_cuda_shim.cpp`, loaded before torch (`conftest.py`), enabled only inside `FakeGPU`;
- what `torch.cuda` answers about the device (`torch.cuda.is_available`, the compute capability seqbert reads to pick
  the flash path, the random state gradient checkpointing saves, ...): `FakeGPU` answers as one H100 would
  (`FAKE_DEVICE_ANSWERS`; another compute capability on request), and with that `torch.autocast("cuda")` stays on,
  as under `Trainer(bf16=True)`;
- the values of host reads: a fake tensor has none. The design reads the host once per forward (the unpadded layout
  and the input checks, `UnpaddedBatch.from_mask`), so the test first runs the same model class and batch on CPU
  tensors (`record_host_reads`: a narrow copy of the model suffices, the reads depend only on the inputs), then serves
  those values, in order, to the fake run (`HostReadServer`). A read the CPU run did not make, or made elsewhere
  (another call site, `call_site()`), or of another method or shape, is an error that names where it happened; a read
  no Python method makes (a `nonzero`, an `.item()` inside a torch op) fails inside FakeTensorMode
  (`DynamicOutputShapeException`, `DataDependentOutputException`).

What the dry run checks (`CudaPathCheck`, a dispatch mode between the model and FakeTensorMode):

- devices: FakeTensorMode raises on an op that mixes CUDA and CPU tensors (`FakeTensorDeviceMismatchError`), and the
  check records every CPU tensor of one or more dimensions created inside the model's forward and backward (a
  `torch.arange` without `device=`, a mask built on the host);
- the kernel's contract: calls of `aten._flash_attention_forward` / `_flash_attention_backward`, each checked against
  the argument contract of torch's CUDA implementation (`mha_varlen_fwd` / `mha_varlen_bwd` in
  `aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`: fp16 / bf16 and one dtype, the last dimension
  contiguous, head size a multiple of 8 up to 256, int32 `cu_seqlens` that are 1-D, contiguous and on the queries'
  device, at least one sequence, no debug mask without dropout); the meta kernels check none of it;
- what the kernel trusts (`SequenceLayout`): it reads neither the number of tokens T nor `max_seqlen` from
  `cu_seqlens`, it takes them as given, and a `max_seqlen` one too small gives wrong results without an error. So
  every call's T (the queries' and keys' first dimension), S (`cu_seqlens` holds S + 1 offsets) and
  `max_seqlen_q` / `max_seqlen_k` must equal the batch's, computed here from the batch's attention mask (or
  `position_ids` / `cu_seq_lens_q` for packed rows) by the harness itself, not by the code under test;
- host syncs (`HostSync`): every read of a CUDA tensor's value (`.tolist()`, `.item()`, `bool()`, ..., 0-dim tensors
  included), every copy from the device to the host (`.cpu()`, `.to("cpu")`, `copy_` into a CPU tensor, 0-dim
  tensors included: the host waits for the GPU to finish what it was given), every blocking copy from the host to the
  device (`torch.tensor(data, device="cuda")`, `.to("cuda")`: torch's CUDA copy synchronizes the stream after a
  blocking copy, `copy_kernel_cuda`), and `torch.cuda.synchronize()`. One per forward or training step by design.

`scaled_dot_product_attention` on fake CUDA tensors would take the math path (a CPU build has no CUDA kernel
selection), so sdpa's calls get the kernel sdpa picks on the fake GPU in their case (`GpuSdpaChoice`, after torch's
`sdp_utils.cpp`): flash where no mask is given, the dtype is half, the device is sm80 or newer and the head size at
most 256; else the memory-efficient kernel where the head size is aligned for the device's matrix products; else the
math path. The reference models (transformers' BERT), seqbert's decoder and its fallback from the variable-length
kernel run there.

FLOPs (`torch.utils.flop_counter.FlopCounterMode`) and peak memory (`torch.distributed._tools.mem_tracker.MemTracker`)
run inside the same fake GPU (`measure_step`). The flop counter counts a variable-length attention call as if every
sequence were as long as the longest (it cannot read fake `cu_seqlens`); `varlen_flop_formulas` counts the true lengths,
which the test knows from its batch.

Test code, pinned to the torch release of `fake_cuda_shim.PINNED_TORCH`.
"""

import collections
import contextlib
import dataclasses
import sys
import warnings
from pathlib import Path
from unittest import mock

import fake_cuda_shim
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.distributed._tools.mem_tracker import MemTracker
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode
from transformers.utils import import_utils as transformers_imports


aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[1]
# seqbert's package: a host read's call site starts at the outermost frame inside it (`call_site`).
SEQBERT_SOURCE = str(ROOT / "src" / "seqbert") + "/"

# The compute capability the fake GPU reports by default: an H100's (sm_90), which runs flash-attention.
CAPABILITY = (9, 0)

# The Python methods that read a tensor's value on the host (one GPU sync each on a CUDA tensor).
READ_METHODS = frozenset({"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "__complex__"})

FLASH_FORWARD = aten._flash_attention_forward.default
FLASH_BACKWARD = aten._flash_attention_backward.default
HALF = (torch.float16, torch.bfloat16)


class UnexpectedHostRead(AssertionError):
    """The fake run read the host where the CPU run of the same batch did not (or read something else there)."""


class FlashContractViolation(AssertionError):
    """The flash-attention kernel was called with arguments its CUDA implementation rejects."""


class LayoutMismatch(AssertionError):
    """The flash-attention kernel was given a number of tokens, of sequences or a `max_seqlen` other than the batch's:
    arguments it accepts and trusts, and computes wrong results with (or reads out of bounds)."""


class CudaPathFault(AssertionError):
    """Something the CUDA path must not do: a CPU tensor created inside it, a kernel count other than expected."""


# ----------------------------------------------------------------------------------------------------------------------
# Host reads: recorded on CPU tensors, served to fake ones; host syncs counted
# ----------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HostRead:
    """One host read: the method (`tolist`, `item`, ...), the shape of the tensor read, the value it returned, the line
    that read it (`where`, `file:line function`) and its call site (`site`, `call_site()`), by which a replayed read is
    matched."""

    method: str
    shape: tuple[int, ...]
    value: object
    where: str
    site: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class HostSync:
    """One point where the host waits for the GPU: a read of a CUDA tensor's value (`kind` is the method: `tolist`,
    `item`, ...), a copy between host and device (`"device-to-host copy"`, `"host-to-device copy"`) or
    `"torch.cuda.synchronize"`; the shape of the tensor (`()` for a synchronize) and the line (`file:line function`)."""

    kind: str
    shape: tuple[int, ...]
    where: str


def _frames() -> list[tuple[str, int, str]]:
    """The calling stack as `(file, line, function)`, outermost first, less torch's frames and this file's (mode
    handlers and dispatch, which differ between a run on CPU tensors and one on fake CUDA tensors)."""
    frames, frame = [], sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if "/torch/" not in filename and filename != __file__:
            frames.append((filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames[::-1]


def _short(frame: tuple[str, int, str]) -> str:
    return f"{Path(frame[0]).name}:{frame[1]} {frame[2]}"


def _caller() -> str:
    """The innermost frame outside torch and this file: the line that did it (`file:line function`)."""
    frames = _frames()
    return _short(frames[-1]) if frames else "?"


def call_site() -> tuple[str, ...]:
    """
    Where the caller is, as a replayed host read must match it: the chain of frames from the outermost one inside
    seqbert's package (`SEQBERT_SOURCE`, less the scripts' helpers: `_in_the_model_code`) to the innermost one outside torch and this harness, each `file:line
    function`, whatever seqbert calls included (transformers, a test's planted function). Every read of seqbert's goes
    through one helper (`input_checks.read_on_host`), whose line alone would not tell two reads apart; the chain does.
    The test's own frames, which call the model from one line in the CPU run and another in the fake run, lie outside
    it. Where no seqbert frame is on the stack (a reference model, transformers' BERT): the innermost frame alone.
    """
    frames = _frames()
    inside = [i for i, (filename, _, _) in enumerate(frames) if _in_the_model_code(filename)]
    chain = frames[inside[0] :] if inside else frames[-1:]
    return tuple(f"{filename}:{line} {name}" for filename, line, name in chain)


def _in_the_model_code(filename: str) -> bool:
    """A file of seqbert's package other than the scripts' helpers (`script_utils.py`: `run_cli` calls a script's
    `main()`, whose own frames, and lines, differ between the CPU run and the fake one)."""
    return filename.startswith(SEQBERT_SOURCE) and not filename.endswith("/script_utils.py")


def describe_site(site: tuple[str, ...]) -> str:
    """A call site (`call_site()`) for a message: file names, lines and functions, outermost first."""
    return " > ".join(Path(frame).name for frame in site) or "?"


class HostReadRecorder(TorchFunctionMode):
    """Records every host read of a run on ordinary (CPU) tensors, in order (`reads`), with its call site."""

    def __init__(self):
        super().__init__()
        self.reads: list[HostRead] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", None)
        if name in READ_METHODS and args and isinstance(args[0], torch.Tensor):
            self.reads.append(HostRead(name, tuple(args[0].shape), result, _caller(), call_site()))
        return result


def _fake_tolist(self):
    """`Tensor.tolist` for a fake tensor through torch-function handling, so that `HostReadServer` sees one read
    (FakeTensor's own `tolist` reads element by element)."""
    return torch.Tensor.tolist(self)


class HostReadServer(TorchFunctionMode):
    """
    Serves the reads of `recorded` to a fake run, in order (`served`). A read of a fake tensor must match the next
    recorded one by method, shape and call site (`call_site()`: the same line of the same seqbert function, reached
    the same way); one that does not, or comes after the last, raises `UnexpectedHostRead`. A read of a fake CUDA
    tensor is a host sync, appended to `syncs`; a read of a fake CPU tensor is served but syncs nothing itself (the
    device-to-host copy that made the tensor did, and `CudaPathCheck` counts that).
    """

    def __init__(self, recorded: list[HostRead], syncs: list[HostSync] | None = None):
        super().__init__()
        self.pending = collections.deque(recorded)
        self.served: list[HostRead] = []
        self.syncs: list[HostSync] = [] if syncs is None else syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", None)
        if name in READ_METHODS and args and isinstance(args[0], FakeTensor):
            return self._serve(name, args[0])
        return func(*args, **(kwargs or {}))

    def _serve(self, method: str, tensor: torch.Tensor):
        read = HostRead(method, tuple(tensor.shape), None, _caller(), call_site())
        number = len(self.served) + 1
        if not self.pending:
            raise UnexpectedHostRead(
                f"host read #{number} ({method} of a {tensor.device} tensor of shape {read.shape}) at "
                f"{describe_site(read.site)}: the CPU run of the same batch made no more reads"
            )
        expected = self.pending.popleft()
        if (expected.method, expected.shape, expected.site) != (method, read.shape, read.site):
            raise UnexpectedHostRead(
                f"host read #{number} is {method} of a {tensor.device} tensor of shape {read.shape} at "
                f"{describe_site(read.site)}; the CPU run of the same batch read {expected.method} of shape "
                f"{expected.shape} at {describe_site(expected.site)} there"
            )
        self.served.append(expected)
        if tensor.device.type == "cuda":
            self.syncs.append(HostSync(method, read.shape, read.where))
        return expected.value


def record_host_reads(run) -> list[HostRead]:
    """The host reads of `run()` on CPU tensors, in order."""
    with HostReadRecorder() as recorder:
        run()
    return recorder.reads


# ----------------------------------------------------------------------------------------------------------------------
# What the kernel trusts: the batch's sequences
# ----------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SequenceLayout:
    """
    The sequences of a batch as the variable-length kernel must be told them, computed by the harness from the batch
    itself (`of_batch`), independently of the code under test.

    A static batch (`static_layout=True`, `StaticShapeCollator`'s) is told to the kernel as its layout states it: its
    `cu_seqlens` (the real sequences, whose lengths must be the attention mask's rows', then filler and empty slots)
    and the bound `max_seqlen`, which must be at least its longest sequence (the kernel does not check:
    `check_layout` does).

    Attributes:
        lengths (`tuple[int, ...]`): the real tokens of each non-empty sequence, in input order (of a static batch:
            every slot's, 0 for an empty one).
        source (`str`): what they were computed from, for messages.
        bound (`int`, *optional*): a static batch's stated `max_seqlen`.
    """

    lengths: tuple[int, ...]
    source: str
    bound: int | None = None

    @property
    def num_tokens(self) -> int:
        """T, the number of real tokens."""
        return sum(self.lengths)

    @property
    def num_sequences(self) -> int:
        """S, the number of sequences that hold a real token."""
        return len(self.lengths)

    @property
    def max_seqlen(self) -> int:
        """The longest sequence's length (a static batch: its stated bound)."""
        return max(self.lengths, default=0) if self.bound is None else self.bound

    @property
    def cu_seqlens(self) -> list[int]:
        """The S + 1 cumulative lengths, from 0 to T."""
        offsets = [0]
        for length in self.lengths:
            offsets.append(offsets[-1] + length)
        return offsets

    @classmethod
    def of_batch(cls, batch: dict) -> "SequenceLayout":
        """
        The sequences of a model's inputs `batch` (CPU tensors), in plain Python: the real tokens of each row
        (`attention_mask` != 0; all where no mask is given), a row of (B, ..., L) inputs (multiple choice) flattened
        to (B·..., L); for packed rows a new sequence also starts where `cu_seq_lens_q` (offsets over the flattened
        batch) has an offset, else where `position_ids` do not step by +1 (`DataCollatorWithFlattening` restarts them
        at 0). Rows and sequences without a real token are dropped, as the kernel is not told of them.
        """
        reference = batch["input_ids"] if batch.get("input_ids") is not None else batch["inputs_embeds"][..., 0]
        if batch.get("static_layout"):
            offsets = batch["cu_seqlens"].tolist()
            lengths = tuple(end - start for start, end in zip(offsets, offsets[1:], strict=False))
            mask = batch["attention_mask"]
            real = (mask.reshape(-1, mask.shape[-1]) != 0).sum(1).tolist()
            if list(lengths[: len(real)]) != real:
                raise LayoutMismatch(
                    f"the static batch's cu_seqlens start with sequences of {list(lengths[: len(real)])} tokens, but "
                    f"its attention_mask has rows of {real} real tokens"
                )
            return cls(lengths, "static layout (cu_seqlens, max_seqlen)", batch["max_seqlen"])
        length = reference.shape[-1]
        rows = reference.reshape(-1, length).shape[0]
        mask = batch.get("attention_mask")
        real = [[True] * length] * rows if mask is None else (mask.reshape(-1, length) != 0).tolist()
        starts = [[column == 0 for column in range(length)] for _ in range(rows)]
        source = "attention_mask" if mask is not None else "all tokens real"
        if batch.get("cu_seq_lens_q") is not None:
            for offset in batch["cu_seq_lens_q"].tolist():
                if offset < rows * length:
                    starts[offset // length][offset % length] = True
            source += " and cu_seq_lens_q"
        elif batch.get("position_ids") is not None:
            positions = batch["position_ids"].expand(reference.shape).reshape(-1, length).tolist()
            for row, values in enumerate(positions):
                for column in range(1, length):
                    starts[row][column] = values[column] != values[column - 1] + 1
            source += " and position_ids"
        lengths = []
        for row in range(rows):
            for column in range(length):
                if starts[row][column]:
                    lengths.append(0)
                lengths[-1] += real[row][column]
        return cls(tuple(n for n in lengths if n > 0), source)


def check_layout(layout: "SequenceLayout", call: str, query, key, cu_q, cu_k, max_q, max_k) -> None:
    """The variable-length kernel's call `call` against the batch's `layout`: T (the queries' and keys' first
    dimension), S (`cu_seqlens_q` / `cu_seqlens_k` hold S + 1 offsets) and `max_seqlen_q` / `max_seqlen_k` (the
    longest sequence), as the kernel trusts them (`LayoutMismatch`)."""
    checks = (  # (what the call was given, its value, the batch's)
        ("T (query.shape[0])", query.shape[0], layout.num_tokens),
        ("T (key.shape[0])", key.shape[0], layout.num_tokens),
        ("S (cu_seqlens_q.numel() - 1)", cu_q.numel() - 1, layout.num_sequences),
        ("S (cu_seqlens_k.numel() - 1)", cu_k.numel() - 1, layout.num_sequences),
        ("max_seqlen_q", max_q, layout.max_seqlen),
        ("max_seqlen_k", max_k, layout.max_seqlen),
    )
    longest = max(layout.lengths, default=0)
    if layout.bound is not None and layout.bound < longest:
        raise LayoutMismatch(
            f"{call} was given max_seqlen = {max_q}, the static batch's bound ({layout.source}), but the batch holds a "
            f"sequence of {longest} tokens: the kernel would compute part of it only"
        )
    for name, value, expected in checks:
        if value != expected:
            raise LayoutMismatch(
                f"{call} was given {name} = {value}; the batch ({layout.source}) has {expected} "
                f"(T = {layout.num_tokens} real tokens in S = {layout.num_sequences} sequences, the longest "
                f"{layout.max_seqlen})"
            )


# ----------------------------------------------------------------------------------------------------------------------
# The flash-attention contract, kernel counts, devices and host syncs
# ----------------------------------------------------------------------------------------------------------------------


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise FlashContractViolation(message)


def _check_cu_seqlens(name: str, cu_seqlens, query: torch.Tensor) -> None:
    _require(isinstance(cu_seqlens, torch.Tensor), f"{name} must be given (variable-length call)")
    _require(cu_seqlens.dtype == torch.int32, f"{name} must have dtype int32, got {cu_seqlens.dtype}")
    _require(cu_seqlens.device == query.device, f"{name} must be on {query.device}, got {cu_seqlens.device}")
    _require(cu_seqlens.dim() == 1 and cu_seqlens.is_contiguous(), f"{name} must be 1-D and contiguous")
    _require(cu_seqlens.numel() >= 2, f"{name} must hold at least one sequence (batch size must be positive)")


def _check_heads(tensors: dict[str, torch.Tensor], dtype_of: str = "query") -> None:
    dtype = tensors[dtype_of].dtype
    _require(dtype in HALF, f"FlashAttention only supports fp16 and bf16, got {dtype}")
    for name, tensor in tensors.items():
        _require(tensor.dtype == dtype, f"{dtype_of} and {name} must have the same dtype ({dtype}, {tensor.dtype})")
        _require(tensor.device.type == "cuda", f"{name} must be on CUDA, got {tensor.device}")
        _require(tensor.stride(-1) == 1, f"{name} must have a contiguous last dimension (stride {tensor.stride()})")


def _check_max_seqlen(max_q, max_k) -> None:
    for name, maximum in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        _require(
            isinstance(maximum, int) and not isinstance(maximum, bool) and maximum > 0,
            f"{name} must be a positive int, got {maximum!r}",
        )


def check_flash_forward(args, kwargs, layout: SequenceLayout | None = None) -> None:
    """`aten._flash_attention_forward` with cumulative sequence lengths, as `mha_varlen_fwd` checks it, and against
    the batch's `layout` where given (`check_layout`)."""
    query, key, value, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask = args[:10]
    _check_heads({"query": query, "key": key, "value": value})
    _check_cu_seqlens("cu_seqlens_q", cu_q, query)
    _check_cu_seqlens("cu_seqlens_k", cu_k, query)
    _require(cu_q.shape == cu_k.shape, "cu_seqlens_q and cu_seqlens_k must have the same shape (batch_size + 1)")
    _require(query.dim() == 3 and key.dim() == 3, f"query must be (total, heads, head_size), got {tuple(query.shape)}")
    head_size = query.shape[-1]
    _require(head_size % 8 == 0 and head_size <= 256, f"head size must be a multiple of 8 up to 256, got {head_size}")
    _require(query.shape[1] % key.shape[1] == 0, "heads of key/value must divide the heads of query")
    _require(
        key.shape == value.shape and key.shape[2] == head_size, "key and value must be (total_k, heads, head_size)"
    )
    _check_max_seqlen(max_q, max_k)
    _require(0.0 <= dropout_p < 1.0, f"dropout_p must lie in [0, 1), got {dropout_p}")
    _require(not return_debug_mask or dropout_p > 0.0, "return_debug_mask is only supported when dropout_p > 0")
    if layout is not None:
        check_layout(layout, "the flash kernel (forward)", query, key, cu_q, cu_k, max_q, max_k)


def check_flash_backward(args, kwargs, layout: SequenceLayout | None = None) -> None:
    """`aten._flash_attention_backward` with cumulative sequence lengths, as `mha_varlen_bwd` checks it (the op makes
    the output and its gradient contiguous itself), and against the batch's `layout` where given."""
    grad_out, query, key, value, out, logsumexp, cu_q, cu_k, max_q, max_k = args[:10]
    _check_heads({"query": query, "key": key, "value": value})
    for name, tensor in (("out", out), ("grad_out", grad_out)):
        _require(tensor.dtype == query.dtype, f"query and {name} must have the same dtype")
        _require(tensor.device.type == "cuda", f"{name} must be on CUDA")
    _require(logsumexp.dtype == torch.float32 and logsumexp.device.type == "cuda", "logsumexp must be fp32 on CUDA")
    _check_cu_seqlens("cu_seqlens_q", cu_q, query)
    _check_cu_seqlens("cu_seqlens_k", cu_k, query)
    _check_max_seqlen(max_q, max_k)
    if layout is not None:
        check_layout(layout, "the flash kernel (backward)", query, key, cu_q, cu_k, max_q, max_k)


@dataclasses.dataclass
class PathRecord:
    """What `CudaPathCheck` saw: ops by name (the flash kernel's calls among them) and the host syncs (`syncs`, the
    fake GPU's: the reads served of CUDA tensors and the copies between host and device, in order)."""

    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    syncs: list[HostSync] = dataclasses.field(default_factory=list)

    @property
    def flash_forward(self) -> int:
        return self.ops["aten._flash_attention_forward.default"]

    @property
    def flash_backward(self) -> int:
        return self.ops["aten._flash_attention_backward.default"]


# The ops that copy between devices: `_to_copy` (`.to`, `.cpu()`, `.cuda()`) and `copy_`.
COPY_OPS = (aten._to_copy.default, aten.copy_.default)


def _copy_sync(func, args, kwargs, result) -> HostSync | None:
    """The host sync a copy between host and device is: every device-to-host copy (the host waits for the values, or
    must before it reads them); a host-to-device copy unless `non_blocking` (torch's CUDA copy synchronizes the stream
    after a blocking one). None for a copy that stays on one device."""
    if func is aten._to_copy.default:
        source, target = args[0], result
    else:
        target, source = args[0], args[1]
    if not isinstance(source, torch.Tensor) or source.device.type == target.device.type:
        return None
    non_blocking = kwargs.get("non_blocking", args[2] if func is aten.copy_.default and len(args) > 2 else False)
    if source.device.type == "cuda" and target.device.type == "cpu":
        return HostSync("device-to-host copy", tuple(source.shape), _caller())
    if source.device.type == "cpu" and target.device.type == "cuda" and not non_blocking:
        return HostSync("host-to-device copy", tuple(source.shape), _caller())
    return None


class CudaPathCheck(TorchDispatchMode):
    """Checks every op of the code run inside it (forward and backward): the flash kernel's contract
    (`FlashContractViolation`) and, with `layout`, the sequences it is told (`LayoutMismatch`); that no tensor of one
    or more dimensions is created on the CPU (`CudaPathFault`, raised where it happens) other than by a copy from the
    device (a host sync, appended to `syncs` with every other copy between host and device that syncs); counts ops by
    name (`record`)."""

    def __init__(self, syncs: list[HostSync] | None = None, layout: SequenceLayout | None = None):
        super().__init__()
        self.record = PathRecord(syncs=[] if syncs is None else syncs)
        self.layout = layout

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is FLASH_FORWARD:
            check_flash_forward(args, kwargs, self.layout)
        elif func is FLASH_BACKWARD:
            check_flash_backward(args, kwargs, self.layout)
        result = func(*args, **kwargs)
        self.record.ops[str(func)] += 1
        if func in COPY_OPS:
            sync = _copy_sync(func, args, kwargs, result)
            if sync is not None:
                self.record.syncs.append(sync)
                return result
        for output in pytree.tree_leaves(result):
            if isinstance(output, torch.Tensor) and output.device.type == "cpu" and output.dim() > 0:
                raise CudaPathFault(
                    f"a tensor created on the CPU inside the CUDA path: {func} -> cpu tensor of shape "
                    f"{tuple(output.shape)} at {_caller()}"
                )
        return result


# ----------------------------------------------------------------------------------------------------------------------
# What sdpa would pick on the GPU
# ----------------------------------------------------------------------------------------------------------------------


def sdpa_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask, is_causal: bool) -> str:
    """
    The kernel `scaled_dot_product_attention` picks for these (B, N, L, D) CUDA inputs on the fake GPU's compute
    capability, after torch's `select_sdp_backend` (`aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`), cuDNN's
    attention left out: "flash" (no mask, fp16 / bf16, sm80 to sm121, one head size up to 256, causal only where
    queries and keys are as many), else "efficient" (sm50 to sm121, head sizes a multiple of
    `minimum_gemm_alignment`: 8 in fp16 / bf16 from sm70, 4 in fp32 from sm80, else 1), else "math".
    """
    capability = tuple(torch.cuda.get_device_capability())
    half = query.dtype in HALF
    size = query.shape[-1]
    same_size = size == key.shape[-1] == value.shape[-1]
    square = not is_causal or query.shape[-2] == key.shape[-2]
    if mask is None and half and (8, 0) <= capability <= (12, 1) and same_size and size <= 256 and square:
        return "flash"
    alignment = 8 if half and capability[0] >= 7 else 4 if capability[0] >= 8 else 1
    aligned = size == key.shape[-1] and size % alignment == 0 and value.shape[-1] % alignment == 0
    if (5, 0) <= capability <= (12, 1) and aligned:
        return "efficient"
    return "math"


class GpuSdpaChoice(TorchFunctionMode):
    """`scaled_dot_product_attention` on fake CUDA tensors runs the kernel sdpa picks on the fake GPU (`sdpa_kernel`)
    instead of the math path: flash (`aten._scaled_dot_product_flash_attention`), the memory-efficient kernel
    (`aten._scaled_dot_product_efficient_attention`; a boolean mask becomes an additive one first, as sdpa converts
    it), or the math path where neither applies. Counts the calls by kernel (`calls`). Newer torch releases may prefer
    cuDNN's attention on sm_90; like flash and the memory-efficient kernel it keeps no (L, L) matrix for backward."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is not torch.nn.functional.scaled_dot_product_attention or args[0].device.type != "cuda":
            return func(*args, **kwargs)
        query, key, value = args[:3]
        names = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        options = dict(zip(names, args[3:], strict=False)) | kwargs
        mask, dropout_p = options.get("attn_mask"), options.get("dropout_p", 0.0)
        is_causal, scale = options.get("is_causal", False), options.get("scale")
        kernel = sdpa_kernel(query, key, value, mask, is_causal)
        self.calls[kernel] += 1
        if kernel == "flash":
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]
        if kernel == "math":
            return func(*args, **kwargs)
        if mask is not None and mask.dtype == torch.bool:  # sdpa's conversion: 0 where True, -inf where False
            mask = torch.zeros_like(mask, dtype=query.dtype).masked_fill(~mask, float("-inf"))
        if mask is not None:
            mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, mask, grad, dropout_p, is_causal, scale=scale
        )[0]


# ----------------------------------------------------------------------------------------------------------------------
# The fake GPU
# ----------------------------------------------------------------------------------------------------------------------


class CudaDataConstructors(TorchFunctionMode):
    """`torch.tensor(data, device="cuda")` (and `as_tensor`, `asarray`) on the fake GPU: torch builds the data on the
    CPU and copies it with Python dispatch excluded, which a CPU build cannot do for CUDA even inside FakeTensorMode;
    here the CPU tensor is built outside the fake mode and then moved, as the GPU would receive it (a blocking
    host-to-device copy, which `CudaPathCheck` counts as a host sync)."""

    FUNCTIONS = (torch.tensor, torch.as_tensor, torch.asarray)

    def __init__(self, mode: FakeTensorMode):
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func not in self.FUNCTIONS or device is None or torch.device(device).type != "cuda":
            return func(*args, **kwargs)
        with _disable_current_modes():  # neither fake nor checked: the data the host hands over
            data = self.mode.from_tensor(func(*args, **{**kwargs, "device": "cpu"}))
        return data.to(device)


def _rng_state(device=None) -> torch.Tensor:
    return torch.zeros(16, dtype=torch.uint8)


# What torch.cuda answers inside FakeGPU, as one H100 would (a CPU build of torch has no answer: each raises there).
# `FakeGPU` answers `get_device_capability` with its own capability and counts `synchronize` as a host sync.
FAKE_DEVICE_ANSWERS = {
    "is_available": lambda: True,
    "device_count": lambda: 1,
    "current_device": lambda: 0,
    "get_device_capability": lambda device=None: CAPABILITY,
    "is_bf16_supported": lambda including_emulation=True: True,
    "is_current_stream_capturing": lambda: False,
    "get_rng_state": _rng_state,
    "set_rng_state": lambda state, device="cuda": None,
    "device": lambda device: contextlib.nullcontext(),
}


def _clear_device_caches() -> None:
    """Forget what seqbert cached about the GPU (whether its compute capability runs flash-attention, per device
    index): each fake GPU may report another capability."""
    backends = sys.modules.get("seqbert.attention_backends")
    if backends is not None:
        backends._capability_runs_flash_attention.cache_clear()


class FakeGPU:
    """
    One fake GPU on a CPU, an H100 by default: inside `with FakeGPU() as gpu:`, tensors made on "cuda" are fake
    tensors that run torch's meta kernels; the shim's CUDA hooks are on and `torch.cuda` answers as the device would
    (`FAKE_DEVICE_ANSWERS`).

    Args:
        host_reads (`list[HostRead]`, *optional*): what the fake run's host reads return, in order
            (`record_host_reads`); none by default, so that any read raises `UnexpectedHostRead`.
        capability (`tuple[int, int]`, *optional*): the compute capability reported (default `CAPABILITY`, sm_90).

    Attributes:
        mode (`FakeTensorMode`): the fake-tensor mode.
        reads (`HostReadServer`): the reads served.
        syncs (`list[HostSync]`): every host sync, in order: the reads of CUDA tensors served, the copies between
            host and device inside `checked()`, `torch.cuda.synchronize()`.
    """

    def __init__(self, host_reads: list[HostRead] | None = None, capability: tuple[int, int] = CAPABILITY):
        if fake_cuda_shim.unavailable is not None:
            raise RuntimeError(f"the fake GPU is unavailable: {fake_cuda_shim.unavailable}")
        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        self.capability = tuple(capability)
        self.syncs: list[HostSync] = []
        self.reads = HostReadServer(host_reads or [], self.syncs)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "FakeGPU":
        stack = self._stack
        fake_cuda_shim.enable(True)
        stack.callback(fake_cuda_shim.enable, False)
        _clear_device_caches()
        stack.callback(_clear_device_caches)
        answers = FAKE_DEVICE_ANSWERS | {
            "get_device_capability": lambda device=None: self.capability,
            "synchronize": self._synchronize,
        }
        for name, answer in answers.items():
            stack.enter_context(mock.patch.object(torch.cuda, name, answer))
        stack.enter_context(mock.patch.object(FakeTensor, "tolist", _fake_tolist))
        # transformers takes fake tensors for a trace (`is_tracing`) and then skips its own host reads; on the GPU
        # these tensors are real.
        stack.enter_context(mock.patch.object(transformers_imports, "is_fake_tensor", lambda x: False))
        stack.enter_context(self.mode)
        stack.enter_context(self.reads)
        stack.enter_context(CudaDataConstructors(self.mode))
        return self

    def __exit__(self, *exc) -> bool:
        return self._stack.__exit__(*exc)

    def _synchronize(self, device=None) -> None:
        self.syncs.append(HostSync("torch.cuda.synchronize", (), _caller()))

    @contextlib.contextmanager
    def checked(self, layout: SequenceLayout | None = None):
        """Run the CUDA path under `CudaPathCheck`, its host syncs counted in `syncs` and the kernel's calls checked
        against `layout` (the batch's sequences, `SequenceLayout.of_batch`) where given; yields its `PathRecord`."""
        with CudaPathCheck(self.syncs, layout) as check:
            yield check.record

    def tensor(self, value: torch.Tensor) -> torch.Tensor:
        """A fake CUDA copy of the CPU tensor `value` (same dtype, shape and strides)."""
        return self.mode.from_tensor(value).to("cuda")

    def tensors(self, batch: dict) -> dict:
        """`tensor` of each tensor value of `batch`."""
        return {k: self.tensor(v) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def model(self, model_class, config, dtype: torch.dtype = torch.float32, **kwargs):
        """`model_class(config, **kwargs)` on the fake GPU, its parameters in `dtype`, tied as transformers ties them
        (a fake tensor holds no values, so none are loaded). Built on the meta device and moved: torch builds
        `torch.tensor` data on the CPU, which a CPU build cannot move to CUDA even inside FakeTensorMode."""
        with unset_fake_temporarily(), torch.device("meta"), _default_dtype(dtype):
            model = model_class(config, **kwargs)  # real meta tensors: fake ones could not be swapped for CUDA ones
        self.mode.allow_non_fake_inputs = True
        try:
            model.to_empty(device="cuda")
        finally:
            self.mode.allow_non_fake_inputs = False
        model.tie_weights()  # `to_empty` gives each module its own copy of a shared parameter
        return model

    @contextlib.contextmanager
    def autocast(self, dtype: torch.dtype = torch.bfloat16):
        """`torch.autocast("cuda", dtype)`, on: what `Trainer(bf16=True)` wraps the forward in on a GPU. (torch turns
        CUDA autocast off with a warning where `torch.cuda.is_available()` is False; here it is True.)"""
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # autocast must not switch itself off
            context = torch.autocast("cuda", dtype=dtype)
        with context:
            assert torch.is_autocast_enabled("cuda")
            yield


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


# ----------------------------------------------------------------------------------------------------------------------
# GPU memory and FLOPs of a training step
# ----------------------------------------------------------------------------------------------------------------------


def varlen_flop_formulas(lengths) -> dict:
    """`FlopCounterMode` formulas for the variable-length flash kernel, forward and backward, with the batch's true
    sequence lengths `lengths` (torch's own formulas take every sequence as long as the longest where `cu_seqlens` are
    fake): torch's per-sequence sdpa counts (`sdpa_flop_count`, `sdpa_backward_flop_count`), summed."""

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        heads, dim = query.shape[1:]
        return sum(flop_counter.sdpa_flop_count(*[(1, heads, n, dim)] * 3) for n in lengths)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        heads, dim = query.shape[1:]
        return sum(flop_counter.sdpa_backward_flop_count(*[(1, heads, n, dim)] * 4) for n in lengths)

    forward._get_raw = backward._get_raw = True
    return {aten._flash_attention_forward: forward, aten._flash_attention_backward: backward}


# MemTracker's kinds of memory, as the tables name them.
MEMORY_KINDS = {
    "Parameter": "parameters",
    "Gradient": "gradients",
    "Optstate": "optimizer states",
    "Activation": "activations",
    "Temp": "backward temporaries",
}


@dataclasses.dataclass
class StepCost:
    """
    What a training step costs on the fake GPU.

    Attributes:
        peak_bytes (`int`): the most CUDA memory held by tensors at once during the step, in the caching allocator's
            512-byte blocks, the optimizer's states included (a step after the first, as in a training run).
        at_peak (`dict[str, int]`): bytes by kind at that peak (`MEMORY_KINDS`).
        flops (`int`): matmul FLOPs of the step, forward and backward (`FlopCounterMode`).
    """

    peak_bytes: int
    at_peak: dict[str, int]
    flops: int


def measure_training_step(
    gpu: FakeGPU, model, optimizer, inputs: dict, lengths=None, tracker: MemTracker | None = None
) -> StepCost:
    """
    A training step of `model` on `inputs` (fake CUDA tensors with labels) as `Trainer(bf16=True)` runs it: the
    forward under bf16 autocast, `backward`, `optimizer.step()`, `zero_grad()`, with the optimizer's states already
    allocated (as from the second step on: they are made here by a step on zero gradients). Peak memory by `tracker`
    (a new `torch.distributed._tools.mem_tracker.MemTracker` by default; `estimate_gpu_memory.py` passes one that also
    counts the attention kernels' workspaces), FLOPs by `FlopCounterMode` (`varlen_flop_formulas(lengths)` where the
    variable-length kernel runs). The host reads are served by `gpu`.
    """
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracker = MemTracker() if tracker is None else tracker
    tracker.track_external(model, optimizer)
    custom = varlen_flop_formulas(lengths) if lengths is not None else {}
    with warnings.catch_warnings(), tracker, FlopCounterMode(display=False, custom_mapping=custom) as flops:
        warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)  # MemTracker on BERT's hooks
        with gpu.autocast():
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = _cuda_snapshot(tracker)
    kinds = {getattr(kind, "value", kind): size for kind, size in peak.items()}
    return StepCost(
        peak_bytes=peak["Total"],
        at_peak={name: kinds.get(kind, 0) for kind, name in MEMORY_KINDS.items()},
        flops=flops.get_total_flops(),
    )


def _cuda_snapshot(tracker: MemTracker) -> dict:
    snapshot = tracker.get_tracker_snapshot("peak")
    return next(value for device, value in snapshot.items() if device.type == "cuda")
