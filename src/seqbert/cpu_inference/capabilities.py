"""What this CPU and torch build can do for `optimize_for_cpu_inference`: the instruction set ATen dispatches, the
linear kernels present, whether oneDNN's int8 products saturate in each call form seqbert uses, and the CPU class that
the default plans (`plans.DEFAULT_PLANS`) are kept for.

Everything here is read from torch or measured on the CPU, never assumed from the machine the code was written on:
CPU flags cannot see an ISA cap such as `ONEDNN_MAX_CPU_ISA=AVX2`, which changes what oneDNN computes.
"""

import functools
import os

import torch


class UnsupportedCpuError(RuntimeError):
    """This CPU or torch build cannot run the precision asked of `optimize_for_cpu_inference` (the message names what
    is missing and the route that works here)."""


def aten_dispatches_avx2_or_better() -> bool:
    """Whether ATen dispatches its CPU kernels at AVX2 or better: `torch.backends.cpu.get_cpu_capability()` reports
    "AVX2" or "AVX512", which only x86 CPUs with AVX2 do ("DEFAULT", "NO AVX", "SVE256", "ZVECTOR", ... elsewhere, and
    "AVX2" under `ATEN_CPU_CAPABILITY=avx2` on a newer x86 CPU). The oneDNN and MKL kernels below were measured only
    there."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX")


def onednn_x86_operators_available() -> bool:
    """Whether this torch has oneDNN's linear operators (fp32, bf16 and int8: `mkldnn._reorder_linear_weight`,
    `mkldnn._linear_pointwise`, `onednn.qlinear_prepack`, `onednn.qlinear_pointwise`), oneDNN is built in, and ATen
    dispatches AVX2 or better (`aten_dispatches_avx2_or_better`): the x86 CPUs where they were measured."""
    try:
        ops = (
            torch.ops.mkldnn._reorder_linear_weight,
            torch.ops.mkldnn._linear_pointwise,
            torch.ops.onednn.qlinear_prepack,
            torch.ops.onednn.qlinear_pointwise,
        )
    except (AttributeError, RuntimeError):
        return False
    return all(ops) and torch.backends.mkldnn.is_available() and aten_dispatches_avx2_or_better()


def mkl_linear_available() -> bool:
    """Whether this torch has MKL's packed linear (`torch.ops.mkl._mkl_linear`, x86 builds with MKL) and ATen
    dispatches AVX2 or better."""
    try:
        ops = (torch.ops.mkl._mkl_reorder_linear_weight, torch.ops.mkl._mkl_linear)
    except (AttributeError, RuntimeError):
        return False
    return all(ops) and torch.backends.mkl.is_available() and aten_dispatches_avx2_or_better()


def bf16_instructions_available() -> bool:
    """Whether the CPU computes bf16 products in hardware: AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake and
    Sapphire Rapids and later) or AMX (Sapphire Rapids and later). Without them oneDNN emulates bf16 on AVX-512, which
    is slower than fp32."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def bf16_linear_available() -> bool:
    """Whether torch's oneDNN linear runs bf16 on this CPU at all: it needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT
    (`mkldnn._reorder_linear_weight` refuses bf16 otherwise, as on AVX2-only CPUs such as AMD Zen 3)."""
    return onednn_x86_operators_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def linear_kernels_available(int8: bool = False, dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The linear kernels (`linear_kernels.LINEAR_KERNELS`) this CPU and torch build can run for a precision, in order
    of preference: int8 and bf16 only oneDNN's; fp32 also MKL's packed sgemm where present and torch's generic `addmm`
    and `linear`, which run on every CPU."""
    if int8 or dtype != torch.float32:
        return ("onednn",) if onednn_x86_operators_available() else ()
    present = (("onednn", onednn_x86_operators_available()), ("mkl", mkl_linear_available()))
    return tuple(name for name, available in present if available) + ("addmm", "linear")


# The forms in which seqbert calls oneDNN's int8 linear (`linear_kernels.PackedLinear`), by name: each hidden_act's
# fused post-op on `onednn.qlinear_pointwise` as (post-op, algorithm), and "add", `onednn.qlinear_pointwise.binary`
# adding the residual (the attention's output projection and the feed-forward's second product). oneDNN may pick
# another kernel for another post-op, so each form is probed on its own (`int8_products_saturate`).
INT8_CALL_FORMS = {
    "plain": ("none", ""),  # the query/key/value product
    "gelu": ("gelu", "none"),  # the feed-forward's first product with exact (erf) GELU, BERT's
    "gelu_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "add": ("add", ""),
}

# The form in which seqbert calls oneDNN's s8 x s8 -> s32 gemm (`torch._int_mm`): the int8 kernel of small products
# (`linear_kernels.SMALL_INT8_PRODUCT`), its input the uint8 activations less 128, its output the exact int32 sums.
INT8_GEMM_FORM = "int_mm"

# The probe's shapes (rows, depth, features): depth x 254 x 127 < 2^24, so the exact sums are exact in fp32 too.
_PROBE_SHAPES = ((1, 64, 16), (16, 256, 64), (128, 512, 96))


@functools.cache
def int8_products_saturate(form: str | None = None) -> bool:
    """
    Whether oneDNN's u8 x s8 products on this CPU add pairs of products in saturating int16 before the int32 sum, in
    the call form `form` (one of `INT8_CALL_FORMS`, or `INT8_GEMM_FORM`, its s8 x s8 gemm, which shifts the
    activations to u8 by 128 inside), or in any of the `INT8_CALL_FORMS` (`form=None`).

    Without VNNI (AVX2 CPUs such as AMD Zen 3 and Intel before Ice Lake server / Alder Lake; AVX-512 CPUs before
    Cascade Lake; any CPU under `ONEDNN_MAX_CPU_ISA=AVX2`), oneDNN multiplies u8 by s8 with `vpmaddubsw`, which sums
    adjacent pairs of products in int16 and saturates at 32,767: 255 x 127 x 2 = 64,770 does not fit, so large
    activations times large weights come out wrong, silently (oneDNN's developer guide, "Nuances of int8
    computations"). VNNI's `vpdpbusd` sums in int32 and does not saturate.

    Measured, not assumed from CPU flags (which cannot see oneDNN's ISA cap): products whose pairs overflow int16
    (every activation 254, every weight 127) through oneDNN's int8 linear, called as seqbert calls it in that form (a
    bias, fp32 output, the form's post-op or residual add), at three shapes, against the exact sum within 1e-5 of it
    (saturation halves it). Once per process and form (about 5 ms each).

    Raises:
        ValueError: `form` is not one of `INT8_CALL_FORMS` nor `INT8_GEMM_FORM`.
    """
    if form is None:
        return any(int8_products_saturate(name) for name in INT8_CALL_FORMS)
    if form not in INT8_CALL_FORMS and form != INT8_GEMM_FORM:
        raise ValueError(f"form ({form!r}) must be one of {[*INT8_CALL_FORMS, INT8_GEMM_FORM]} or None")
    if not onednn_x86_operators_available():
        return False
    if form == INT8_GEMM_FORM:
        return _gemm_products_saturate()
    post_op, algorithm = INT8_CALL_FORMS[form]
    for rows, depth, features in _PROBE_SHAPES:
        activations = torch.full((rows, depth), 254, dtype=torch.uint8)
        weight = torch.ops.onednn.qlinear_prepack(torch.full((features, depth), 127, dtype=torch.int8), None)
        operands = (activations, 1.0, 0, weight, torch.ones(features), torch.zeros(features, dtype=torch.int64))
        bias = torch.zeros(features)
        expected = torch.full((rows, features), 254.0 * 127 * depth)
        if form == "add":
            residual = torch.arange(rows * features, dtype=torch.float32).view(rows, features)
            out = torch.ops.onednn.qlinear_pointwise.binary(
                *operands, residual, bias, 1.0, 0, torch.float32, 1.0, 0, "add", 1.0, "none", [], ""
            )
            expected = expected + residual
        else:  # GELU and ReLU leave these large positive sums as they are
            out = torch.ops.onednn.qlinear_pointwise(
                *operands, bias, 1.0, 0, torch.float32, post_op, [], algorithm
            )  # fmt: skip
        if not torch.allclose(out, expected, rtol=1e-5, atol=0):
            return True
    return False


def _gemm_products_saturate() -> bool:
    """`int8_products_saturate(INT8_GEMM_FORM)`: `torch._int_mm` of activations at both ends of what seqbert hands it
    (126 and -128, the uint8 activations 254 and 0 less 128; a row of each) by weights of 127, at the probe's shapes,
    against the exact int32 sums."""
    for rows, depth, features in _PROBE_SHAPES:
        activations = torch.full((rows + 1, depth), 126, dtype=torch.int8)
        activations[1::2] = -128
        weight = torch.full((depth, features), 127, dtype=torch.int8)
        if not torch.equal(torch._int_mm(activations, weight), activations.int() @ weight.int()):
            return True
    return False


def int8_weight_levels(form: str | None = None) -> int:
    """
    The largest quantized weight magnitude for int8 calls of form `form` (one of `INT8_CALL_FORMS` or
    `INT8_GEMM_FORM`; None: every one of `INT8_CALL_FORMS`) on this CPU: 127 (8-bit weights) where the form's int8
    products are exact, 63 (7-bit weights) where they saturate (`int8_products_saturate`), form by form, so a form
    that saturates where another does not falls back alone.

    With weights in [-63, 63] a pair of products is at most 254 x 63 x 2 = 32,004, inside int16, so the products are
    exact again on every x86 CPU. 7-bit weights, rather than 7-bit activations as PyTorch's x86 quantization does with
    `reduce_range`, because they cost less accuracy (`scripts/checks/compare_int8_methods.py`, MiniLM-L6 on 64 real
    Rotten Tomatoes snippets, int8 hidden states against fp32: mean |delta| 0.0372 with exact 8-bit products, 0.0398
    with 7-bit weights, 0.0721 with 7-bit activations; min per-token cosine 0.965, 0.945 and 0.884): one scale per
    output feature absorbs a lost weight bit better than one scale per tensor absorbs a lost activation bit. OpenVINO's
    post-training quantization offers the same remedy for the same saturation (7-bit weights, 8-bit activations).
    Capping each same-sign pair of weights instead (|w_2i| + |w_2i+1| <= 128, 8-bit elsewhere) measured worse (mean
    0.0443, min cosine 0.920): it cuts the largest weights hardest.

    Raises:
        ValueError: `form` is not one of `INT8_CALL_FORMS` nor `INT8_GEMM_FORM`.
    """
    return 63 if int8_products_saturate(form) else 127


def cpu_class() -> str:
    """
    The class of this CPU, as the default plans (`plans.DEFAULT_PLANS`) are kept: from the capability ATen dispatches
    and what the CPU computes, not from its name.

    - "avx512_amx": AVX-512 with AMX tiles (Intel Sapphire Rapids and later);
    - "avx512_vnni_bf16": AVX-512 with exact int8 products (VNNI) and AVX512_BF16 (AMD Zen 4 and Zen 5, Intel Cooper
      Lake);
    - "avx512_vnni": AVX-512 with exact int8 products, no bf16 instructions (Intel Cascade Lake, Ice Lake);
    - "avx512": AVX-512 whose int8 products saturate (Intel Skylake-SP, or oneDNN held to `AVX512_CORE`);
    - "avx2_vnni": AVX2 with exact int8 products (AVX-VNNI: Intel Alder Lake and later laptops);
    - "avx2": AVX2 whose int8 products saturate (AMD Zen 2 and 3, Intel before Alder Lake; any x86 CPU held to AVX2
      with `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`);
    - "other": no oneDNN x86 operators (aarch64, other architectures, builds without oneDNN).
    """
    if not onednn_x86_operators_available():
        return "other"
    saturate = int8_products_saturate()
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        if saturate:
            return "avx512"
        if torch.cpu._is_amx_tile_supported():
            return "avx512_amx"
        return "avx512_vnni_bf16" if bf16_instructions_available() else "avx512_vnni"
    return "avx2" if saturate else "avx2_vnni"


def cgroup_cpu_limit(root: str = "/") -> float | None:
    """
    The CPU time this process may use per second of wall time under its cgroup's CPU quota, in cores (1.5: one and a
    half cores), or None where no quota is set (or no cgroup file system is mounted: not Linux).

    Read as the kernel documents it (Documentation/admin-guide/cgroup-v2.rst, `cpu.max`: "$MAX $PERIOD", "max" for
    none; cgroup v1's CFS bandwidth control, `cpu.cfs_quota_us` / `cpu.cfs_period_us`, -1 for none): the process's
    cgroup from `/proc/self/cgroup`, where its CPU controller is mounted from `/proc/self/mountinfo`, then the
    smallest quota from that cgroup up to the mount's root, as a limit set on a parent binds its children. Container
    runtimes set it (`docker run --cpus=1.5`, Kubernetes CPU limits); Go's `uber-go/automaxprocs` and the JVM read the
    same files to size their thread pools.

    Args:
        root (`str`): the file system root the paths are read under (a folder holding `proc/` and `sys/`, for tests).
    """
    mounts = _cgroup_cpu_mounts(root)
    limits = []
    for line in _read(root, "proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        version = 2 if controllers == "" else 1 if "cpu" in controllers.split(",") else None
        if version is None or version not in mounts:
            continue
        mount_root, mount_point = mounts[version]
        relative = path[len(mount_root) :] if path.startswith(mount_root) else path
        folder = os.path.normpath(os.path.join(mount_point, relative.lstrip("/")))
        while True:  # the process's cgroup, then each parent up to the mount point
            limits.append(_cgroup_quota(root, folder, version))
            if folder == os.path.normpath(mount_point):
                break
            folder = os.path.dirname(folder)
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


def _read(root: str, path: str) -> str:
    try:
        with open(os.path.join(root, path.lstrip("/"))) as file:
            return file.read()
    except OSError:
        return ""


def _cgroup_cpu_mounts(root: str) -> dict[int, tuple[str, str]]:
    """cgroup version -> (the mounted cgroup's root, its mount point): cgroup2, or cgroup v1 with the cpu controller
    (`proc(5)`, `/proc/self/mountinfo`: fields 4 and 5, then after " - " the type and the super options)."""
    mounts = {}
    for line in _read(root, "proc/self/mountinfo").splitlines():
        before, separator, after = line.partition(" - ")
        fields, described = before.split(), after.split()
        if not separator or len(fields) < 5 or len(described) < 3:
            continue
        if described[0] == "cgroup2":
            mounts.setdefault(2, (fields[3], fields[4]))
        elif described[0] == "cgroup" and "cpu" in described[2].split(","):
            mounts.setdefault(1, (fields[3], fields[4]))
    return mounts


def _cgroup_quota(root: str, folder: str, version: int) -> float | None:
    """One cgroup's CPU quota in cores, or None where it sets none."""
    if version == 2:
        values = _read(root, os.path.join(folder, "cpu.max")).split()
        if len(values) != 2 or values[0] == "max":
            return None
        quota, period = values
    else:
        quota = _read(root, os.path.join(folder, "cpu.cfs_quota_us")).strip()
        period = _read(root, os.path.join(folder, "cpu.cfs_period_us")).strip()
    try:
        quota, period = int(quota), int(period)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus() -> float:
    """How many cores this process's threads can keep busy at once: `torch.get_num_threads()`, at most the cores it
    may run on (`os.sched_getaffinity`) and its cgroup's CPU quota (`cgroup_cpu_limit`), in cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    return min(torch.get_num_threads(), cores, quota if quota is not None else float("inf"))
