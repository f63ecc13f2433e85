"""The CUDA dry run's harness: seqbert's CUDA code executed on a CPU, on fake CUDA tensors that run torch's real meta
kernels (shapes, dtypes, devices and strides, no values), with the flash-attention kernel's argument contract
mirrored and every host read accounted for. `tests/test_cuda_dry_run.py` runs the flows;
`scripts/benchmarks/estimate_gpu_memory.py` measures GPU memory and FLOPs with it.

What a CPU-only torch build lacks, and who supplies it:

- a CUDA device guard and CUDA hooks, without which fake CUDA tensors cannot be indexed nor differentiated:
  `fake_cuda_shim.cpp`, loaded before torch (`conftest.py`), enabled only inside `FakeGPU`;
- what `torch.cuda` answers about the device (`torch.cuda.is_available`, the compute capability seqbert reads to pick
  the flash path, the random state gradient checkpointing saves, ...): `FakeGPU` answers as one H100 would
  (`FAKE_DEVICE_ANSWERS`), and with that `torch.autocast("cuda")` stays on, as under `Trainer(bf16=True)`;
- the values of host reads: a fake tensor has none. The design reads the host once per forward (the unpadded layout
  and the input checks, `UnpaddedBatch.from_mask`), so the test first runs the same model class and batch on CPU
  tensors (`record_host_reads`: a narrow copy of the model suffices, the reads depend only on the inputs), then serves
  those values, in order, to the fake run (`HostReadServer`). A read the CPU run did not make, or made differently,
  is an error that names where it happened; a read no Python method makes (a `nonzero`, an `.item()` inside a torch
  op) fails inside FakeTensorMode (`DynamicOutputShapeException`, `DataDependentOutputException`).

What the dry run checks (`CudaPathCheck`, a dispatch mode between the model and FakeTensorMode):

- devices: FakeTensorMode raises on an op that mixes CUDA and CPU tensors (`FakeTensorDeviceMismatchError`), and the
  check records every CPU tensor of one or more dimensions created inside the model's forward and backward (a
  `torch.arange` without `device=`, a mask built on the host);
- the kernel: calls of `aten._flash_attention_forward` / `_flash_attention_backward`, each checked against the
  argument contract of torch's CUDA implementation (`mha_varlen_fwd` / `mha_varlen_bwd` in
  `aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`: fp16 / bf16 and one dtype, the last dimension
  contiguous, head size a multiple of 8 up to 256, int32 `cu_seqlens` that are 1-D, contiguous and on the queries'
  device, at least one sequence, no debug mask without dropout); the meta kernels check none of it;
- host reads: the reads served (one per forward or training step by design).

`scaled_dot_product_attention` on fake CUDA tensors would take the math path (a CPU build has no CUDA kernel
selection), so the reference models (transformers' BERT) get what sdpa picks on an H100 in their case
(`GpuSdpaChoice`): the memory-efficient kernel where a mask is given, flash where none is and the dtype is half.

FLOPs (`torch.utils.flop_counter.FlopCounterMode`) and peak memory (`torch.distributed._tools.mem_tracker.MemTracker`)
run inside the same fake GPU (`measure_step`). The flop counter counts a variable-length attention call as if every
sequence were as long as the longest (it cannot read fake `cu_seqlens`); `varlen_flop_formulas` counts the true lengths,
which the test knows from its batch.

Test code, pinned to the torch release of `fake_cuda_shim.PINNED_TORCH`.
"""

import collections
import contextlib
import dataclasses
import traceback
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

# The compute capability the fake GPU reports: an H100's (sm_90), which runs flash-attention.
CAPABILITY = (9, 0)

# The Python methods that read a tensor's value on the host (one GPU sync each).
READ_METHODS = frozenset({"tolist", "item", "__bool__", "__int__", "__float__", "__index__"})

FLASH_FORWARD = aten._flash_attention_forward.default
FLASH_BACKWARD = aten._flash_attention_backward.default
HALF = (torch.float16, torch.bfloat16)


class UnexpectedHostRead(AssertionError):
    """The fake run read the host where the CPU run of the same batch did not (or read something else there)."""


class FlashContractViolation(AssertionError):
    """The flash-attention kernel was called with arguments its CUDA implementation rejects."""


class CudaPathFault(AssertionError):
    """Something the CUDA path must not do: a CPU tensor created inside it, a kernel count other than expected."""


# ----------------------------------------------------------------------------------------------------------------------
# Host reads: recorded on CPU tensors, served to fake ones
# ----------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HostRead:
    """One host read: the method (`tolist`, `item`, ...), the shape of the tensor read, the value it returned, and the
    line of the caller that read it (`file:line function`)."""

    method: str
    shape: tuple[int, ...]
    value: object
    where: str


def _caller() -> str:
    """The innermost frame outside torch and this file: the line that read the host."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("fake_cuda.py"):
            return f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"
    return "?"


class HostReadRecorder(TorchFunctionMode):
    """Records every host read of a run on ordinary (CPU) tensors, in order (`reads`)."""

    def __init__(self):
        super().__init__()
        self.reads: list[HostRead] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", None)
        if name in READ_METHODS and args and isinstance(args[0], torch.Tensor):
            self.reads.append(HostRead(name, tuple(args[0].shape), result, _caller()))
        return result


def _fake_tolist(self):
    """`Tensor.tolist` for a fake tensor through torch-function handling, so that `HostReadServer` sees one read
    (FakeTensor's own `tolist` reads element by element)."""
    return torch.Tensor.tolist(self)


class HostReadServer(TorchFunctionMode):
    """Serves the reads of `recorded` to a fake run, in order (`served`). A read of a fake tensor that does not match
    the next recorded one (method and shape), or comes after the last, raises `UnexpectedHostRead`."""

    def __init__(self, recorded: list[HostRead]):
        super().__init__()
        self.pending = collections.deque(recorded)
        self.served: list[HostRead] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", None)
        if name in READ_METHODS and args and isinstance(args[0], FakeTensor):
            return self._serve(name, args[0])
        return func(*args, **(kwargs or {}))

    def _serve(self, method: str, tensor: torch.Tensor):
        read = HostRead(method, tuple(tensor.shape), None, _caller())
        number = len(self.served) + 1
        if not self.pending:
            raise UnexpectedHostRead(
                f"host read #{number} ({method} of a {tensor.device} tensor of shape {read.shape}) at {read.where}: "
                "the CPU run of the same batch made no more reads"
            )
        expected = self.pending.popleft()
        if (expected.method, expected.shape) != (method, read.shape):
            raise UnexpectedHostRead(
                f"host read #{number} at {read.where} is {method} of shape {read.shape}; the CPU run of the same batch "
                f"read {expected.method} of shape {expected.shape} at {expected.where} there"
            )
        self.served.append(expected)
        return expected.value


def record_host_reads(run) -> list[HostRead]:
    """The host reads of `run()` on CPU tensors, in order."""
    with HostReadRecorder() as recorder:
        run()
    return recorder.reads


# ----------------------------------------------------------------------------------------------------------------------
# The flash-attention contract, kernel counts and devices
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


def check_flash_forward(args, kwargs) -> None:
    """`aten._flash_attention_forward` with cumulative sequence lengths, as `mha_varlen_fwd` checks it."""
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
    for name, maximum in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        _require(isinstance(maximum, int) and maximum > 0, f"{name} must be a positive int, got {maximum!r}")
    _require(0.0 <= dropout_p < 1.0, f"dropout_p must lie in [0, 1), got {dropout_p}")
    _require(not return_debug_mask or dropout_p > 0.0, "return_debug_mask is only supported when dropout_p > 0")


def check_flash_backward(args, kwargs) -> None:
    """`aten._flash_attention_backward` with cumulative sequence lengths, as `mha_varlen_bwd` checks it (the op makes
    the output and its gradient contiguous itself)."""
    grad_out, query, key, value, out, logsumexp, cu_q, cu_k = args[:8]
    _check_heads({"query": query, "key": key, "value": value})
    for name, tensor in (("out", out), ("grad_out", grad_out)):
        _require(tensor.dtype == query.dtype, f"query and {name} must have the same dtype")
        _require(tensor.device.type == "cuda", f"{name} must be on CUDA")
    _require(logsumexp.dtype == torch.float32 and logsumexp.device.type == "cuda", "logsumexp must be fp32 on CUDA")
    _check_cu_seqlens("cu_seqlens_q", cu_q, query)
    _check_cu_seqlens("cu_seqlens_k", cu_k, query)


@dataclasses.dataclass
class PathRecord:
    """What `CudaPathCheck` saw: ops by name (the flash kernel's calls among them)."""

    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def flash_forward(self) -> int:
        return self.ops["aten._flash_attention_forward.default"]

    @property
    def flash_backward(self) -> int:
        return self.ops["aten._flash_attention_backward.default"]


class CudaPathCheck(TorchDispatchMode):
    """Checks every op of the code run inside it (forward and backward): the flash kernel's contract
    (`FlashContractViolation`), and that no tensor of one or more dimensions is created on the CPU (`CudaPathFault`,
    raised where it happens); counts ops by name (`record`)."""

    def __init__(self):
        super().__init__()
        self.record = PathRecord()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is FLASH_FORWARD:
            check_flash_forward(args, kwargs)
        elif func is FLASH_BACKWARD:
            check_flash_backward(args, kwargs)
        result = func(*args, **kwargs)
        self.record.ops[str(func)] += 1
        for output in pytree.tree_leaves(result):
            if isinstance(output, torch.Tensor) and output.device.type == "cpu" and output.dim() > 0:
                raise CudaPathFault(
                    f"a tensor created on the CPU inside the CUDA path: {func} -> cpu tensor of shape "
                    f"{tuple(output.shape)} at {_caller()}"
                )
        return result


# ----------------------------------------------------------------------------------------------------------------------
# What sdpa would pick on the GPU (for the reference models)
# ----------------------------------------------------------------------------------------------------------------------


class GpuSdpaChoice(TorchFunctionMode):
    """`scaled_dot_product_attention` on fake CUDA tensors runs the kernel sdpa picks on an H100 instead of the math
    path: with a mask (or in fp32), the memory-efficient kernel (`aten._scaled_dot_product_efficient_attention`; a
    boolean mask becomes an additive one first, as sdpa converts it); without a mask, in fp16 / bf16, flash
    (`aten._scaled_dot_product_flash_attention`). Counts the calls (`calls`). Newer torch releases may prefer cuDNN's
    attention on sm_90; like these two it keeps no (L, L) matrix for backward."""

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
        if mask is None and query.dtype in HALF:
            self.calls["flash"] += 1
            return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]
        if mask is not None and mask.dtype == torch.bool:  # sdpa's conversion: 0 where True, -inf where False
            mask = torch.zeros_like(mask, dtype=query.dtype).masked_fill(~mask, float("-inf"))
        if mask is not None:
            mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        self.calls["efficient"] += 1
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
    here the CPU tensor is built outside the fake mode and then moved, as the GPU would receive it."""

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


class FakeGPU:
    """
    One fake H100 on a CPU: inside `with FakeGPU() as gpu:`, tensors made on "cuda" are fake tensors that run torch's
    meta kernels; the shim's CUDA hooks are on and `torch.cuda` answers as the device would (`FAKE_DEVICE_ANSWERS`).

    Args:
        host_reads (`list[HostRead]`, *optional*): what the fake run's host reads return, in order
            (`record_host_reads`); none by default, so that any read raises `UnexpectedHostRead`.

    Attributes:
        mode (`FakeTensorMode`): the fake-tensor mode.
        reads (`HostReadServer`): the reads served.
    """

    def __init__(self, host_reads: list[HostRead] | None = None):
        if fake_cuda_shim.unavailable is not None:
            raise RuntimeError(f"the fake GPU is unavailable: {fake_cuda_shim.unavailable}")
        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        self.reads = HostReadServer(host_reads or [])
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "FakeGPU":
        stack = self._stack
        fake_cuda_shim.enable(True)
        stack.callback(fake_cuda_shim.enable, False)
        for name, answer in FAKE_DEVICE_ANSWERS.items():
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


@contextlib.contextmanager
def checked():
    """Run the CUDA path under `CudaPathCheck`; yields its `PathRecord`."""
    with CudaPathCheck() as check:
        yield check.record


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


def measure_training_step(gpu: FakeGPU, model, optimizer, inputs: dict, lengths=None) -> StepCost:
    """
    A training step of `model` on `inputs` (fake CUDA tensors with labels) as `Trainer(bf16=True)` runs it: the
    forward under bf16 autocast, `backward`, `optimizer.step()`, `zero_grad()`, with the optimizer's states already
    allocated (as from the second step on: they are made here by a step on zero gradients). Peak memory by
    `torch.distributed._tools.mem_tracker.MemTracker`, FLOPs by `FlopCounterMode` (`varlen_flop_formulas(lengths)`
    where the variable-length kernel runs). The host reads are served by `gpu`.
    """
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracker = MemTracker()
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
