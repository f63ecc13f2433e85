"""Training at scale, proven on CPU: `Trainer` under torchrun with 2 gloo processes equals 1 process with the same
global batch; an interrupted run, even one that crashed while writing a checkpoint, resumes to bit-identical weights.

The runs are tiny SeqBERT models on real text (tests/trainer_job.py): Rotten Tomatoes snippets for classification
and masked-LM, King James -> World English verse pairs for seq2seq.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SCRIPT_PATHS
from safetensors.torch import load_file
from transformers.trainer_utils import get_last_checkpoint

from seqbert.training import STAGING_DIR


sys.path.insert(0, str(Path(__file__).parent))
import trainer_job  # noqa: E402


TOLERANCE = 1e-5
VARIANTS = [
    (task, gradient_checkpointing) for task in ("classification", "seq2seq") for gradient_checkpointing in (False, True)
]


def _launch(nproc: int, runs: list[dict], tmp_path: Path) -> None:
    spec = tmp_path / f"runs_{nproc}.json"
    spec.write_text(json.dumps(runs))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    command += [str(Path(__file__).parent / "trainer_job.py"), str(spec)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


@pytest.fixture(scope="module")
def one_and_two_processes(tmp_path_factory):
    """Every variant trained for 4 steps of global batch 8: once in 1 process, once in 2 (4 examples each)."""
    tmp_path = tmp_path_factory.mktemp("ddp")
    outputs = {}
    for nproc in (1, 2):
        runs = [
            {
                "name": f"{task}-gc{int(gc)}",
                "task": task,
                "gradient_checkpointing": gc,
                "output_dir": str(tmp_path / f"nproc{nproc}"),
                "global_batch": 8,
                "max_steps": 4,
            }
            for task, gc in VARIANTS
        ]
        # Classification once more in a plain loop: FSDP2-sharded over 2 processes, unsharded in 1.
        runs.append({**runs[0], "name": "classification-fsdp", "fsdp": True, "gradient_checkpointing": False})
        _launch(nproc, runs, tmp_path)
        outputs[nproc] = tmp_path / f"nproc{nproc}"
    return outputs


def _max_delta(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("task, gradient_checkpointing", VARIANTS, ids=[f"{t}-gc{int(g)}" for t, g in VARIANTS])
def test_two_processes_end_with_the_weights_of_one(one_and_two_processes, task, gradient_checkpointing):
    name = f"{task}-gc{int(gradient_checkpointing)}"
    for nproc, rank in ((1, 0), (2, 0), (2, 1)):
        wrapping = json.loads((one_and_two_processes[nproc] / name / f"rank{rank}.json").read_text())
        assert wrapping["gradient_checkpointing"] is gradient_checkpointing, wrapping
    single = load_file(one_and_two_processes[1] / name / "rank0.safetensors")
    rank0 = load_file(one_and_two_processes[2] / name / "rank0.safetensors")
    rank1 = load_file(one_and_two_processes[2] / name / "rank1.safetensors")
    initial = trainer_job.build(
        {"task": task}, trainer_job.AutoTokenizer.from_pretrained(trainer_job.minilm_checkpoint_path())
    )[0]
    # Training moved the weights (so the comparison means something) ...
    assert _max_delta(single, {k: v.detach() for k, v in initial.state_dict().items()}) > 1e-3
    # ... and both ranks hold the same weights, equal to the single process's.
    assert _max_delta(rank0, rank1) == 0.0
    assert _max_delta(single, rank0) <= TOLERANCE


def test_fsdp2_over_two_processes_ends_with_the_weights_of_one(one_and_two_processes):
    """torch's FSDP2 over gloo with SeqBERT's layers as units (Trainer cannot: accelerate enables FSDP only on
    accelerators, see test_scripts_refuse_fsdp_that_accelerate_ignores)."""
    folder = one_and_two_processes[2] / "classification-fsdp"
    wrapping = json.loads((folder / "rank0.json").read_text())
    assert wrapping["wrapped_class"] == "FSDPSeqBertForSequenceClassification", wrapping
    assert wrapping["sharded_parameters"] == len(load_file(folder / "rank0.safetensors")), wrapping  # every one
    single = load_file(one_and_two_processes[1] / "classification-fsdp" / "rank0.safetensors")
    rank0, rank1 = load_file(folder / "rank0.safetensors"), load_file(folder / "rank1.safetensors")
    assert _max_delta(rank0, rank1) == 0.0
    assert _max_delta(single, rank0) <= TOLERANCE


def test_ddp_runs_really_were_data_parallel(one_and_two_processes):
    wrapping = json.loads((one_and_two_processes[2] / "classification-gc0" / "rank1.json").read_text())
    assert wrapping["distributed_type"] == "DistributedType.MULTI_CPU" and wrapping["wrapped_class"] == (
        "DistributedDataParallel"
    ), wrapping


def test_gradient_checkpointing_changes_nothing(one_and_two_processes):
    for task in ("classification", "seq2seq"):
        plain = load_file(one_and_two_processes[2] / f"{task}-gc0" / "rank0.safetensors")
        checkpointed = load_file(one_and_two_processes[2] / f"{task}-gc1" / "rank0.safetensors")
        assert _max_delta(plain, checkpointed) <= TOLERANCE, task


@pytest.mark.parametrize("task", ["classification", "mlm"])
def test_resume_after_a_crash_while_saving_is_bit_identical(task, tmp_path):
    """6 steps with dropout on, checkpoints every 2 steps and an evaluation every 3; the second run crashes while
    writing checkpoint-4 (after its weights), is resumed with `resume_from_checkpoint=True`, and must end with exactly
    the uninterrupted weights."""
    base = {"task": task, "global_batch": 8, "max_steps": 6, "save_steps": 2, "dropout": 0.1, "eval_steps": 3}
    trainer_job.train({**base, "name": "straight", "output_dir": str(tmp_path)})
    crashed = {**base, "name": "crashed", "output_dir": str(tmp_path)}
    with pytest.raises(trainer_job.SavingCrash):
        trainer_job.train({**crashed, "crash_saving_step": 4})
    folder = tmp_path / "crashed"
    # The crash left no checkpoint-4: the newest checkpoint is the last complete one.
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-2"]
    assert get_last_checkpoint(folder) == str(folder / "checkpoint-2")
    trainer = trainer_job.train({**crashed, "resume": True})
    assert trainer.state.global_step == 6
    assert not (folder / STAGING_DIR).exists()
    straight = load_file(tmp_path / "straight" / "rank0.safetensors")
    resumed = load_file(folder / "rank0.safetensors")
    for key, value in straight.items():
        assert torch.equal(resumed[key], value), key
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_scripts_refuse_fsdp_that_accelerate_ignores(tmp_path):
    """accelerate enables FSDP only on accelerators: 2 CPU processes with `--fsdp` would silently train with DDP."""
    script = SCRIPT_PATHS["run_classification.py"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    command += ["--output_dir", str(tmp_path / "out"), "--max_train_samples", "8", "--max_eval_samples", "8"]
    command += ["--use_cpu", "--fsdp", "full_shard"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode != 0
    assert "was given, but accelerate set up MULTI_CPU instead of FSDP" in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "out" / "model.safetensors").exists()
