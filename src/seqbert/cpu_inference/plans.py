"""Measured plans: which linear kernel each role of an optimized encoder layer runs, how its attention is grouped, and
(fp32) whether the eager layers stay, chosen by timing the candidates on this CPU on the model's own shapes; and the
default plan of each CPU class, which stands wherever the timing gives no clear, trustworthy answer.

How the timing keeps its answer when other processes use the CPU (our own procedure):

- every step times its candidates in interleaved rounds (each round calls each candidate once, in a rotated order),
  and takes each candidate's fastest round: delays from other processes only add time, so the fastest round is the
  estimate least disturbed by them (Chen and Revels 2016, "Robust benchmarking in noisy environments",
  arXiv:1608.04295);
- each step keeps its fastest candidate, and the plan so measured replaces the default plan of this CPU class
  (`DEFAULT_PLANS`) only where the whole layer, timed as it serves, is faster by more than `MARGIN`; a near tie keeps
  the default, on a quiet machine and a loaded one alike. In fp32 the optimized layers replace the eager ones only
  where faster by more than `MARGIN` too;
- the rounds of the layer step are trusted only where they agree: each candidate's fastest quarter of rounds within
  `MAX_SPREAD` of its fastest round, and the process given at least `MIN_CPU_SHARE` of the CPU time its threads could
  use (CPU time over wall time x `capabilities.usable_cpus()`: its threads, at most the cores it may run on and its
  cgroup's CPU quota). Otherwise the result is the default plan of this CPU class, with a warning that says how to pin
  a plan (`plan=`);
- timings in one process run one at a time (a lock), so that two `optimize_for_cpu_inference` calls in two threads
  do not time their candidates against each other; processes are not coordinated.
"""

import copy
import dataclasses
import functools
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch

from ..attention_backends import UnpaddedBatch
from ..modeling_seqbert import SeqBertLayer
from ..transformers_compat import bidirectional_mask
from .capabilities import cgroup_cpu_limit, cpu_class, int8_products_saturate, linear_kernels_available, usable_cpus
from .length_groups import ATTENTION_MODES, LENGTH_GROUPS, LengthGroups
from .linear_kernels import PackedLinear
from .optimized_layers import ROLES, layer_linears, optimize_layer


# How much faster (as a fraction of its time) a layer must be to replace the default plan's layer, or in fp32 the
# eager layer: 10 %. Measured on the 2-core Zen 4 of docs/benchmarks.md (2026-11-28; MiniLM-L6 and bert-base width,
# fp32, int8 and bf16, 1 and 2 threads): the attention layouts a quiet machine ranks first lie within 3 % of each
# other at the layer, while a process spinning on the other of its two cores (virtual CPUs, whose host may share
# more between them than the guest reports) moved one layer's ranking by 9 %; below 10 % a choice follows the load.
MARGIN = 0.10
# The rounds of the layer step agree when each candidate's fastest quarter of rounds lies within 25 % of its fastest
# round (on the quiet Zen 4: 0.4-19 %; at 2 threads beside a spinning process: 28-52 %) ...
MAX_SPREAD = 0.25
# ... and the process had at least 85 % of the CPU time its threads could use (CPU time over wall time x
# `usable_cpus()`, which a cgroup quota below the thread count lowers) while the linear kernels and the layers ran. On the quiet Zen 4 at 2 threads: 0.99-1.0 (waiting OpenMP threads spin), 0.90
# under OMP_WAIT_POLICY=PASSIVE; beside one process spinning on the CPU: 0.62-0.77 (three threads on two cores), less
# under heavier load. At one thread beside it, on the other core: 1.0 (the share cannot see a busy sibling core).
MIN_CPU_SHARE = 0.85
# Rounds per step at least, whatever the time budget: the fastest quarter is then at least the two fastest rounds.
MIN_ROUNDS = 5


@dataclasses.dataclass(frozen=True)
class CpuInferencePlan:
    """
    What an optimized encoder runs: per linear role (`ROLES`) one of `LINEAR_KERNELS`, the attention mode
    (`ATTENTION_MODES`) and the number of length groups (`LENGTH_GROUPS`), or (fp32 only) the eager layers unchanged.

    `optimize_for_cpu_inference` measures one (`measure_plan`) unless given one; `to_dict` / `from_dict` round-trip
    it through JSON, so a choice measured once can be pinned (`plan=`), on this machine or on a fleet of the same CPU.

    Attributes:
        linear_kernels (`dict[str, str]`): role -> kernel.
        attention (`str`): "written_out" or "sdpa" (used on the unpadded path, that is with sdpa attention).
        length_groups (`int`): at most this many length groups per batch.
        eager_layers (`bool`): fp32 only: the copy runs the model's own eager layers (measured faster than the
            optimized ones, or this CPU class's default).
        measurements (`dict`): how the plan was chosen (the fastest round's milliseconds per candidate, the spread of
            the rounds, the CPU share, threads, CPU capability and class, seconds spent, the timing batch, and
            `chosen_by`: "measurement" or why the class's default plan stands; on a copy's plan, `from_cache`: whether
            it was reused from an earlier call in this process); empty for a given plan. Not compared.
    """

    linear_kernels: dict[str, str]
    attention: str = "written_out"
    length_groups: int = 4
    eager_layers: bool = False
    measurements: dict = dataclasses.field(default_factory=dict, compare=False)

    def copy(self) -> "CpuInferencePlan":
        """The same plan with measurements of its own (a deep copy), as each optimized copy holds one."""
        return dataclasses.replace(self, measurements=copy.deepcopy(self.measurements))

    def to_dict(self) -> dict:
        """The plan as plain JSON-ready values (measurements included)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping) -> "CpuInferencePlan":
        """The plan `to_dict` wrote (extra keys refused, measurements optional).

        Raises:
            ValueError: an unknown key, or no `linear_kernels` mapping.
        """
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = set(values) - names
        if unknown or not isinstance(values.get("linear_kernels"), Mapping):
            raise ValueError(
                f"plan must be a CpuInferencePlan or a dict with linear_kernels (a dict of {list(ROLES)}) and "
                f"optionally {sorted(names - {'linear_kernels'})}; got keys {sorted(values)}"
            )
        return cls(**{**values, "linear_kernels": dict(values["linear_kernels"])})

    def summary(self) -> str:
        """One line: the kernels by role, the attention, the groups (what the log and the benchmarks print)."""
        if self.eager_layers:
            return "eager layers (the model's own fp32 layers)"
        kernels = ", ".join(f"{role} {self.linear_kernels[role]}" for role in ROLES)
        return f"{kernels}; attention {self.attention}, {self.length_groups} length group(s)"

    def same_layers(self, other: "CpuInferencePlan") -> bool:
        """Whether `other` runs the same optimized layers (kernels, attention, groups), the eager flag aside."""
        return (self.linear_kernels, self.attention, self.length_groups) == (
            other.linear_kernels,
            other.attention,
            other.length_groups,
        )


class DefaultPlan(NamedTuple):
    """One entry of `DEFAULT_PLANS`: the kernel of every role, the attention mode and groups, whether fp32 keeps the
    eager layers, and where the entry comes from."""

    kernel: str
    attention: str
    length_groups: int
    eager_layers: bool
    source: str


_ZEN4 = "measured on the 2-core AMD EPYC Zen 4 of docs/benchmarks.md (2026-11-28)"
_ZEN3_REPORT = (
    "not measured with this release: the eager layers, as the report on a 2-core AMD EPYC Zen 3 measured oneDNN's fp32 "
    "layers at 0.85x-0.95x the eager model (docs/benchmarks.md, 'Speed by CPU class'), and addmm for the optimized "
    "ones, the fastest kernel of its one per-role measurement (docs/int8.md: bert-base's query/key/value product, "
    "addmm 40.7 ms, oneDNN 43.8 ms, F.linear 58.6 ms at one thread)"
)
_PORTABLE = "not measured: the portable choice (oneDNN, sdpa on every dtype, 4 groups)"
_UNMEASURED_FP32 = "not measured: the eager layers, never slower than the eager model"

# Default plans by CPU class (`capabilities.cpu_class`), precision and threads (1, or 2 for two or more): what the
# timing starts from, and what stands where it cannot be trusted. Classes and precisions without an entry get
# `_FALLBACK`. Only the entries whose source says "measured" were measured on a machine of their class; timings held
# to an older ISA on a newer CPU are instruction semantics, not speed, and set no entry.
DEFAULT_PLANS: dict[str, dict[str, dict[int, DefaultPlan]]] = {
    "avx512_vnni_bf16": {
        "fp32": {threads: DefaultPlan("onednn", "written_out", 8, False, _ZEN4) for threads in (1, 2)},
        "int8": {
            1: DefaultPlan("onednn", "sdpa", 8, False, _ZEN4),
            2: DefaultPlan("onednn", "written_out", 8, False, _ZEN4),
        },
        "bf16": {threads: DefaultPlan("onednn", "sdpa", 8, False, _ZEN4) for threads in (1, 2)},
    },
    "avx2": {
        "fp32": {threads: DefaultPlan("addmm", "written_out", 4, True, _ZEN3_REPORT) for threads in (1, 2)},
    },
}
_FALLBACK = {
    "fp32": DefaultPlan("onednn", "written_out", 4, True, _UNMEASURED_FP32),
    "int8": DefaultPlan("onednn", "sdpa", 4, False, _PORTABLE),
    "bf16": DefaultPlan("onednn", "sdpa", 4, False, _PORTABLE),
}


def _precision(int8: bool, dtype: torch.dtype) -> str:
    return "int8" if int8 else {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


def default_plan(int8: bool = False, dtype: torch.dtype = torch.float32) -> CpuInferencePlan:
    """
    The default plan of this CPU's class (`capabilities.cpu_class`) for a precision at the current thread count, from
    `DEFAULT_PLANS` (else a portable fallback: fp32 keeps the eager layers, int8 and bf16 run oneDNN with sdpa on 4
    length groups). A kernel this CPU or torch build lacks is replaced by the first one it has. Its `measurements`
    say the class, the entry's source and `chosen_by` "default plan".
    """
    precision = _precision(int8, dtype)
    threads = 1 if torch.get_num_threads() == 1 else 2
    entry = DEFAULT_PLANS.get(cpu_class(), {}).get(precision, {}).get(threads, _FALLBACK[precision])
    available = linear_kernels_available(int8, dtype)
    kernel = entry.kernel if entry.kernel in available else available[0]
    attention = entry.attention if precision != "bf16" else "sdpa"  # bf16 groups always run on sdpa
    return CpuInferencePlan(
        dict.fromkeys(ROLES, kernel),
        attention,
        entry.length_groups,
        eager_layers=entry.eager_layers and precision == "fp32",
        measurements={"chosen_by": "default plan", "cpu_class": cpu_class(), "default_source": entry.source},
    )


def default_timing_lengths(num_sequences: int = 32) -> list[int]:
    """Sequence lengths of the batch a plan is timed on when no `example_inputs` are given: `num_sequences` lengths
    from 8 to 64 tokens, median about 28, like the Rotten Tomatoes snippets' (median 26, 95th percentile 47) that the
    docs' serving figures use; 32 sequences, about 970 tokens, as a batch of 32 snippets."""
    return [round(8 + 56 * (i / max(num_sequences - 1, 1)) ** 1.5) for i in range(num_sequences)]


@dataclasses.dataclass
class TimedRounds:
    """Interleaved rounds of candidates (`time_rounds`): each candidate's time per round (ms), and its CPU and wall
    seconds summed over its rounds."""

    milliseconds: dict[str, list[float]]
    cpu_seconds: dict[str, float]
    wall_seconds: dict[str, float]

    def fastest(self, name: str) -> float:
        """The candidate's fastest round, ms: the estimate least disturbed by other processes."""
        return min(self.milliseconds[name])

    def spread(self, name: str) -> float:
        """How far the candidate's fastest quarter of rounds lies above its fastest round, as a fraction of it."""
        times = sorted(self.milliseconds[name])
        return times[len(times) // 4] / times[0] - 1

    def cpu_share(self, names: list[str]) -> float:
        """CPU time of this process over wall time x `usable_cpus()` while `names` ran: about 1 where its threads had
        the cores they could use to themselves (waiting OpenMP threads spin), less where other processes took them."""
        wall = sum(self.wall_seconds[name] for name in names) * usable_cpus()
        return sum(self.cpu_seconds[name] for name in names) / max(wall, 1e-9)


def time_rounds(candidates: dict[str, Callable[[], object]], rounds: int, budget: float) -> TimedRounds:
    """Each candidate called once untimed, then timed over interleaved rounds (each round calls every candidate once,
    round r starting from the r-th): `rounds` rounds, fewer (`MIN_ROUNDS` at least) where they would take more than
    `budget` seconds."""
    names = list(candidates)
    start = time.perf_counter()
    for name in names:
        candidates[name]()
    per_round = time.perf_counter() - start
    rounds = max(MIN_ROUNDS, min(rounds, int(budget / max(per_round, 1e-9))))
    timed = TimedRounds({name: [] for name in names}, dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0))
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            cpu, wall = time.process_time(), time.perf_counter()
            candidates[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            timed.milliseconds[name].append(1000 * wall)
            timed.cpu_seconds[name] += cpu
            timed.wall_seconds[name] += wall
    return timed


def _fastest(times: dict[str, float]) -> str:
    """The candidate with the fastest time (the first of equals)."""
    return min(times, key=times.get)


# Held while a plan is timed: timings in one process run one at a time (reentrant: `measured_plan` holds it around
# its cache look-up and the timing it starts).
_TIMING_LOCK = threading.RLock()


def _one_at_a_time(function: Callable) -> Callable:
    """`function` run under `_TIMING_LOCK`."""

    @functools.wraps(function)
    def locked(*args, **kwargs):
        with _TIMING_LOCK:
            return function(*args, **kwargs)

    return locked


@_one_at_a_time
@torch.inference_mode()
def measure_plan(
    layer: SeqBertLayer,
    int8: bool = False,
    dtype: torch.dtype = torch.float32,
    lengths: list[int] | None = None,
    rounds: int = 10,
    budget: float = 3.0,
    num_layers: int = 1,
) -> CpuInferencePlan:
    """
    Time the implementations an optimized encoder layer can run in this precision, on `layer`'s own shapes, on this
    CPU at the current thread count (`torch.get_num_threads()`), and return the plan to run (see the module docstring
    for how the timing holds up against other processes). Our own procedure:

    1. each linear role (`ROLES`) with each kernel of `linear_kernels_available(int8, dtype)`, with its activation or
       residual, on min(T, 512) random rows (T the real tokens of `lengths`);
    2. with sdpa attention (the unpadded path), attention on the chosen query/key/value product: each
       `ATTENTION_MODES` (bf16: sdpa) with 1, 2, 4 and 8 length groups; other attention implementations run the
       model's own attention on the padded batch, and the plan's attention fields stay the default's;
    3. whole layers, as they serve, in eval mode: the default plan of this CPU class (`default_plan`), the plan of
       steps 1 and 2 (where it differs), and the eager fp32 layer (with the length groups' construction, once per
       forward, shared by `num_layers` layers). The measured plan replaces the default only where faster by more than
       `MARGIN`. fp32 keeps the eager layers (`eager_layers`) unless the optimized ones are faster by more than
       `MARGIN`, so the copy is never slower than the eager model on such batches; int8 and bf16 keep their
       precision and warn where the fp32 eager layer is faster.

    Steps 1 and 2 keep their fastest candidates. Where the rounds disagree (the layers' rounds spread beyond
    `MAX_SPREAD`, or the process given less than `MIN_CPU_SHARE` of its threads' time while the linear kernels or the
    layers ran: then the timing stops there), the default plan stands, with a warning that gives the reason and how
    to pin a plan. All layers of an encoder share their shapes, so one layer is timed for all; the seconds spent are
    in `measurements["seconds"]` (0.3 to 3 s for MiniLM-L6 on the 2-core Zen 4 of docs/benchmarks.md).

    Args:
        layer (`SeqBertLayer`): a bidirectional encoder layer, fp32, on the CPU (not modified, whatever its mode).
        int8, dtype: the precision, as `optimize_for_cpu_inference` takes it.
        lengths (`list[int]`, *optional*): the sequence lengths of the timing batch (default
            `default_timing_lengths()`).
        rounds (`int`): timed rounds per step, at most.
        budget (`float`): seconds the timed rounds should take, about (warm-up calls and `MIN_ROUNDS` come on top).
        num_layers (`int`): the encoder's depth, over which the length groups built once per forward are shared.

    Returns:
        `CpuInferencePlan` with `measurements`: every candidate's fastest round (ms), the layer step's spreads and CPU
        share, the threads, the CPU capability and class, the attention implementation, the batch's tokens and
        sequences, the seconds spent and `chosen_by`.

    Warns:
        UserWarning: the rounds disagreed and the default plan stands; or int8 / bf16 measured slower than the fp32
            eager layer (both times given).
    """
    started = time.perf_counter()
    lengths = lengths or default_timing_lengths()
    layer = copy.deepcopy(layer).eval()  # timed as it serves; the caller's layer keeps its mode
    config = layer.attention.config
    unpadded_path = config._attn_implementation == "sdpa"
    compute_dtype = torch.float32 if int8 else dtype
    default = default_plan(int8, dtype)
    kernels = linear_kernels_available(int8, dtype)
    generator = torch.Generator().manual_seed(0)
    mask = torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]  # (S, L_max)
    unpadded = UnpaddedBatch.from_mask(mask)
    hidden = torch.randn(1, unpadded.num_tokens, config.hidden_size, generator=generator)  # (1, T, H)
    precision = _precision(int8, dtype)
    measurements: dict = {
        "linear_ms": {},
        "attention_ms": {},
        "layer_ms": {},
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_class": default.measurements["cpu_class"],
        "attn_implementation": config._attn_implementation,
        "tokens": unpadded.num_tokens,
        "sequences": len(lengths),
        "default_plan": default.summary(),
        "default_source": default.measurements["default_source"],
    }

    chosen, linear_rounds = {}, []  # 1. linear kernels, by role
    rows = min(unpadded.num_tokens, 512)
    for role, (linears, activation, residual) in layer_linears(layer).items():
        x = torch.randn(rows, linears[0].in_features, generator=generator).to(compute_dtype)
        other = hidden[0, :rows].to(compute_dtype) if residual else None
        packed = {
            kernel: PackedLinear(linears, int8, dtype, kernel, activation, residual=residual) for kernel in kernels
        }
        timed = time_rounds({k: functools.partial(p, x, other) for k, p in packed.items()}, rounds, 0.1 * budget)
        linear_rounds.append(timed)
        times = {kernel: timed.fastest(kernel) for kernel in kernels}
        measurements["linear_ms"][role] = times
        chosen[role] = _fastest(times)
    cpu = sum(sum(timed.cpu_seconds.values()) for timed in linear_rounds)
    wall = sum(sum(timed.wall_seconds.values()) for timed in linear_rounds)
    cpu_share = cpu / max(wall * usable_cpus(), 1e-9)
    if cpu_share < MIN_CPU_SHARE:  # contended already: the rest would measure the load too
        reason = _low_share(cpu_share, "while the linear kernels were timed")
        return _default_stands(default, [reason], measurements, precision, started)

    attention, groups = default.attention, default.length_groups  # 2. attention, on the unpadded path
    if unpadded_path:
        qkv_linears = layer_linears(layer)["qkv"][0]
        qkv = PackedLinear(qkv_linears, int8, dtype, chosen["qkv"])(hidden.to(compute_dtype))
        options = {f"{mode}/{count}": (mode, count) for mode in ATTENTION_MODES for count in LENGTH_GROUPS}
        options = {
            name: (mode, count)
            for name, (mode, count) in options.items()
            if (compute_dtype == torch.float32 or mode == "sdpa") and count <= len(lengths)
        } | {f"{attention}/{groups}": (attention, groups)}
        timed = time_rounds(
            {
                name: functools.partial(_grouped_attention, unpadded, count, mode, qkv, layer)
                for name, (mode, count) in options.items()
            },
            rounds,
            0.15 * budget,
        )
        measurements["attention_ms"] = {name: timed.fastest(name) for name in options}
        attention, groups = options[_fastest(measurements["attention_ms"])]
    measured = CpuInferencePlan(chosen, attention, groups)

    # 3. whole layers as they serve: the default plan's, the measured plan's where it differs, the eager one
    layer_plans = {"default": default} | ({} if measured.same_layers(default) else {"measured": measured})
    layers = {
        name: optimize_layer(copy.deepcopy(layer), plan.linear_kernels, int8, dtype)
        for name, plan in layer_plans.items()
    }
    if unpadded_path:
        group_options = {name: (plan.length_groups, plan.attention) for name, plan in layer_plans.items()}
        candidates = {
            name: functools.partial(
                optimized, hidden.to(compute_dtype), None, length_groups=LengthGroups.for_mode(unpadded, *options)
            )
            for (name, optimized), options in zip(layers.items(), group_options.values(), strict=True)
        }
        candidates["eager"] = functools.partial(layer, hidden, unpadded.sdpa_mask(), unpadded=unpadded)
        for name, options in group_options.items():  # built once per forward, for all layers
            candidates[f"groups/{name}"] = functools.partial(LengthGroups.for_mode, unpadded, *options)
    else:
        padded = torch.randn(len(lengths), max(lengths), config.hidden_size, generator=generator)  # (S, L_max, H)
        padded_mask = bidirectional_mask(config, padded, mask.long())
        candidates = {
            name: functools.partial(optimized, padded.to(compute_dtype), padded_mask)
            for name, optimized in layers.items()
        }
        candidates["eager"] = functools.partial(layer, padded, padded_mask)
    timed = time_rounds(candidates, rounds, 0.45 * budget)
    layer_names = [*layers, "eager"]
    layer_ms = {name: timed.fastest(name) for name in layer_names}
    for name in layers if unpadded_path else ():  # the length groups, built once per forward for all layers
        layer_ms[name] += timed.fastest(f"groups/{name}") / num_layers
    faster = "measured" in layer_ms and layer_ms["measured"] < layer_ms["default"] * (1 - MARGIN)
    best = "measured" if faster else "default"
    spreads = {name: round(timed.spread(name), 3) for name in layer_names}
    cpu_share = timed.cpu_share(layer_names)
    optimized_ms, eager_ms = layer_ms[best], layer_ms["eager"]
    measurements.update(
        layer_ms={"optimized": optimized_ms, "eager": eager_ms},
        layer_candidates_ms=layer_ms,
        layer_spread=spreads,
        cpu_share=round(cpu_share, 3),
        rounds=len(timed.milliseconds["eager"]),
    )
    disagreement = []
    if max(spreads.values()) > MAX_SPREAD:
        disagreement.append(
            f"the fastest quarter of a candidate's rounds spread {max(spreads.values()):.0%} above its fastest "
            f"round, more than {MAX_SPREAD:.0%}"
        )
    if cpu_share < MIN_CPU_SHARE:
        disagreement.append(_low_share(cpu_share, "while the layers were timed"))
    if disagreement:
        return _default_stands(default, disagreement, measurements, precision, started)
    # fp32 runs the optimized layers only where clearly faster than the eager ones: never slower, and a near tie
    # (where a layer's timing and the whole model's can disagree) keeps the model as it is
    eager_layers = precision == "fp32" and not optimized_ms < eager_ms * (1 - MARGIN)
    plan = dataclasses.replace(layer_plans[best], eager_layers=eager_layers)
    measurements["chosen_by"] = "measurement"
    if precision != "fp32" and eager_ms < optimized_ms:
        _warn_slower_than_fp32(precision, optimized_ms, eager_ms, measurements)
    measurements["seconds"] = round(time.perf_counter() - started, 3)
    return dataclasses.replace(plan, measurements=measurements)


def _low_share(cpu_share: float, when: str) -> str:
    usable, quota = usable_cpus(), cgroup_cpu_limit()
    limit = f"; {usable:g} of {torch.get_num_threads()} thread(s) usable" if usable < torch.get_num_threads() else ""
    limit += f", the cgroup's CPU quota is {quota:g} core(s)" if quota is not None else ""
    return (
        f"this process had {cpu_share:.0%} of the CPU time its thread(s) could use {when}, less than "
        f"{MIN_CPU_SHARE:.0%}{limit}"
    )


def _default_stands(
    default: CpuInferencePlan, reasons: list[str], measurements: dict, precision: str, started: float
) -> CpuInferencePlan:
    """The default plan, where the timing rounds disagreed (`reasons`), with a warning saying so and how to pin a
    plan; `measurements` says what was measured and why the default stands."""
    measurements["chosen_by"] = f"default plan: the timing rounds disagreed ({'; '.join(reasons)})"
    measurements["seconds"] = round(time.perf_counter() - started, 3)
    _warn_at_caller(
        f"optimize_for_cpu_inference ({precision}): the timing rounds disagreed ({'; '.join(reasons)}): other "
        "processes are likely using this CPU. Running the default plan of this CPU class instead "
        f"({measurements['cpu_class']}: {default.summary()}; {measurements['default_source']}). To choose the plan "
        "yourself, optimize where the machine is quiet and pin what it measured: "
        "`plan = fast.cpu_inference_plan.to_dict()`, then `optimize_for_cpu_inference(model, ..., plan=plan)`"
    )
    return dataclasses.replace(default, measurements=measurements)


def _warn_slower_than_fp32(precision: str, optimized_ms: float, eager_ms: float, measurements: dict) -> None:
    """The precision asked for measured slower than the fp32 eager layer: say so, with both times and what to do."""
    asked = "int8=True" if precision == "int8" else "dtype=torch.bfloat16"
    _warn_at_caller(
        f"optimize_for_cpu_inference({asked}) measured slower than the fp32 eager model on this CPU: "
        f"{optimized_ms:.2f} ms against {eager_ms:.2f} ms per encoder layer on the timing batch "
        f"({measurements['tokens']} tokens, {measurements['threads']} thread(s), CPU class "
        f"{measurements['cpu_class']}). The copy computes in {precision} as asked. For speed on this CPU use fp32 "
        "(`optimize_for_cpu_inference(model)`, which keeps the eager layers where they are faster)"
        + ("; for int8 here, ONNX Runtime's int8 file (docs/deploy.md)" if precision == "int8" else "")
    )


def _warn_at_caller(message: str) -> None:
    """`warnings.warn(message)` pointed at the first frame outside this package and torch's decorators: the code
    that called `optimize_for_cpu_inference` or `measure_plan`."""
    frame, level = sys._getframe(1), 2
    while frame is not None and (
        frame.f_code.co_filename.startswith(os.path.dirname(__file__))
        or frame.f_code.co_filename.endswith(os.path.join("torch", "utils", "_contextlib.py"))
    ):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


def _grouped_attention(unpadded, groups: int, attention: str, qkv: torch.Tensor, layer: SeqBertLayer) -> torch.Tensor:
    return LengthGroups.for_mode(unpadded, groups, attention).attend(qkv, layer.attention)


# Plans measured in this process, by what they depend on (`plan_key`): optimizing the same shapes again, in the same
# setting, reuses the measurement (a default plan that stood because the rounds disagreed included: it is what this
# class runs, and a later measurement on a quiet machine would choose the same up to `MARGIN`).
_MEASURED_PLANS: dict[tuple, CpuInferencePlan] = {}


def plan_key(layer: SeqBertLayer, int8: bool, dtype: torch.dtype, lengths: list[int], num_layers: int) -> tuple:
    """Everything that changes `measure_plan`'s answer: the precision, the layer's class, shapes and activation, the
    encoder's depth, the attention implementation, the training mode the model was handed in, the timing lengths,
    the threads, the CPU capability and class, the int8 weights' bits per call form and the kernels present."""
    config = layer.attention.config
    shapes = tuple((tuple(linear.weight.shape), linear.bias is not None) for linear in _all_linears(layer))
    weight_bits = tuple(int8_products_saturate(form) for form in ("plain", "gelu", "gelu_tanh", "relu", "add"))
    return (
        int8, dtype, type(layer), shapes, config.num_attention_heads, config.hidden_act, num_layers,
        config._attn_implementation, layer.training, tuple(lengths), torch.get_num_threads(),
        torch.backends.cpu.get_cpu_capability(), cpu_class(), int8 and weight_bits, linear_kernels_available(int8, dtype),
    )  # fmt: skip


def _all_linears(layer: SeqBertLayer) -> list:
    return [linear for linears, _, _ in layer_linears(layer).values() for linear in linears]


def measured_plan(
    layer: SeqBertLayer, int8: bool, dtype: torch.dtype, lengths: list[int], num_layers: int
) -> CpuInferencePlan:
    """`measure_plan`'s answer for this key (`plan_key`), measured once per process (one timing at a time, however
    many threads ask), as a copy of its own: `measurements["from_cache"]` says whether an earlier call measured it."""
    key = plan_key(layer, int8, dtype, lengths, num_layers)
    with _TIMING_LOCK:
        cached = _MEASURED_PLANS.get(key)
        if cached is None:
            cached = _MEASURED_PLANS[key] = measure_plan(layer, int8, dtype, lengths, num_layers=num_layers)
            from_cache = False
        else:
            from_cache = True
    plan = cached.copy()
    plan.measurements["from_cache"] = from_cache
    return plan


def check_plan(plan, int8: bool, dtype: torch.dtype) -> CpuInferencePlan:
    """`plan` (a `CpuInferencePlan` or its `to_dict()`) as a `CpuInferencePlan` this precision and CPU can run.

    Raises:
        TypeError: `plan` is of another type.
        ValueError: a role without a kernel, a kernel this precision or CPU cannot run, an unknown attention mode, a
            length-group count below 1, or the eager (fp32) layers for int8 or bf16.
    """
    if isinstance(plan, Mapping):
        plan = CpuInferencePlan.from_dict(plan)
    if not isinstance(plan, CpuInferencePlan):
        raise TypeError(f"plan must be a CpuInferencePlan, a dict from its to_dict(), or None; got {plan!r}")
    available = linear_kernels_available(int8, dtype)
    precision = _precision(int8, dtype)
    asked = "int8" if int8 else str(dtype).removeprefix("torch.")
    if set(plan.linear_kernels) != set(ROLES):
        raise ValueError(f"plan.linear_kernels must name a kernel for each of {list(ROLES)}, got {plan.linear_kernels}")
    for role, kernel in plan.linear_kernels.items():
        if kernel not in available:
            raise ValueError(
                f"plan.linear_kernels[{role!r}] is {kernel!r}, which {asked} cannot run on this CPU and torch build; "
                f"available: {list(available)}"
            )
    if plan.attention not in ATTENTION_MODES:
        raise ValueError(f"plan.attention is {plan.attention!r}; allowed: {list(ATTENTION_MODES)}")
    if not isinstance(plan.length_groups, int) or plan.length_groups < 1:
        raise ValueError(f"plan.length_groups must be an int >= 1, got {plan.length_groups!r}")
    if plan.eager_layers and precision != "fp32":
        raise ValueError(
            f"plan.eager_layers is True, which runs the fp32 eager layers, but {precision} was asked for: a plan "
            "for int8 or bf16 runs that precision (pass a plan measured for it, or eager_layers=False)"
        )
    return plan
