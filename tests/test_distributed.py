"""Training at scale, proven on CPU: `Trainer` under torchrun with 2 gloo processes equals 1 process with the same
global batch; the loss it logs for seqbert is the mean over the global batch, and for transformers' BERT world size
(and accumulation steps) times it; an interrupted run, even one that crashed while writing a checkpoint, resumes to
bit-identical weights.

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
import torch.nn.functional as F
from conftest import SCRIPT_PATHS
from safetensors.torch import load_file
from transformers.trainer_utils import get_last_checkpoint

import seqbert
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


def _equivalence_runs(output_dir: Path) -> list[dict]:
    """Every variant for 4 steps of global batch 8, and classification once more in a plain loop (FSDP2-sharded over 2
    processes, unsharded in 1)."""
    runs = [
        {
            "name": f"{task}-gc{int(gc)}",
            "task": task,
            "gradient_checkpointing": gc,
            "output_dir": str(output_dir),
            "global_batch": 8,
            "max_steps": 4,
        }
        for task, gc in VARIANTS
    ]
    return [*runs, {**runs[0], "name": "classification-fsdp", "fsdp": True, "gradient_checkpointing": False}]


# The runs of the loss tests below: (task, model, Trainer's `average_tokens_across_devices`), `model` as trainer_job's
# `bert`: "transformers" (transformers' BERT head) or "converted" (seqbert's head with the same weights). Both models
# of both tasks with Trainer's default (True); with False, BERT's classification and seqbert's masked-LM head.
LOSS_RUNS = [
    *((task, model, True) for task in ("classification", "mlm") for model in ("transformers", "converted")),
    ("classification", "transformers", False),
    ("mlm", "converted", False),
]


def _loss_run_name(task: str, model: str, average: bool) -> str:
    return f"loss-{task}-{'bert' if model == 'transformers' else 'seqbert'}-{'average' if average else 'local'}"


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> Path:
    """One torchrun launch of 2 gloo processes: the equivalence runs (4 examples a process), then the loss runs, 3
    steps of global batch 8 with `Trainer`'s defaults (trainer_job's `bert` runs)."""
    tmp_path = tmp_path_factory.mktemp("ddp")
    output_dir = tmp_path / "nproc2"
    loss_runs = [
        {
            "name": _loss_run_name(task, model, average),
            "task": task,
            "bert": model,
            "training_args": {"average_tokens_across_devices": average},
            "output_dir": str(output_dir),
            "global_batch": 8,
            "max_steps": 3,
        }
        for task, model, average in LOSS_RUNS
    ]
    _launch(2, [*_equivalence_runs(output_dir), *loss_runs, _static_shapes_run(output_dir)], tmp_path)
    return output_dir


def _static_shapes_run(output_dir: Path) -> dict:
    """The classification equivalence run through the CUDA-graph route: `StaticShapeCollator` and the two compile
    flags users set, with `aot_eager` as the backend (dynamo and AOTAutograd trace forward and backward as for the
    GPU; inductor would only add minutes of CPU code generation, and its CUDA graphs need a GPU)."""
    run = _equivalence_runs(output_dir)[0]
    compile_flags = {
        "torch_compile": True,
        "torch_compile_mode": "reduce-overhead",
        "torch_compile_backend": "aot_eager",
    }
    return {
        **run,
        "name": "classification-static",
        "static_shapes": True,
        "training_args": compile_flags | {"logging_nan_inf_filter": False},
        "predict": PREDICTED,
    }


# The examples the static run evaluates and predicts on after training: 2 processes x batches of 4 take 3 steps, the
# last holding 5 examples (accelerate pads it with repeated ones, and drops those again when gathering).
PREDICTED = 21


@pytest.fixture(scope="module")
def one_and_two_processes(tmp_path_factory, two_processes):
    """The equivalence runs once in 1 process and once in 2 (`two_processes`)."""
    tmp_path = tmp_path_factory.mktemp("one_process")
    _launch(1, _equivalence_runs(tmp_path / "nproc1"), tmp_path)
    return {1: tmp_path / "nproc1", 2: two_processes}


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


def test_the_cuda_graph_route_under_ddp_gives_the_same_losses(two_processes):
    """Two gloo processes, `Trainer` with `StaticShapeCollator` and `torch_compile=True,
    torch_compile_mode="reduce-overhead"` (DDP wrapped, then compiled, as accelerate does it): the losses it logs and
    the weights it ends with are those of the plain run (padded batches, eager), step by step."""
    plain, static = (two_processes / name for name in ("classification-gc0", "classification-static"))
    wrapping = json.loads((static / "rank0.json").read_text())
    assert wrapping["distributed_type"] == "DistributedType.MULTI_CPU", wrapping
    assert wrapping["wrapped_class"] == "OptimizedModule", wrapping
    losses = [
        [entry["loss"] for entry in json.loads((run / "rank0.json").read_text())["log_history"] if "loss" in entry]
        for run in (plain, static)
    ]
    assert len(losses[0]) == 4 and losses[1] == pytest.approx(losses[0], abs=TOLERANCE)
    assert _max_delta(load_file(plain / "rank0.safetensors"), load_file(static / "rank0.safetensors")) <= TOLERANCE


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


WORLD_SIZE = 2


def _logged_steps(folder: Path, processes: int) -> list[dict]:
    """What `Trainer` logged at each step (`loss`, `grad_norm`), the same in every process."""
    logs = [json.loads((folder / f"rank{rank}.json").read_text())["log_history"] for rank in range(processes)]
    steps = [[entry for entry in log if "loss" in entry] for log in logs]
    assert all(log == steps[0] for log in steps)
    return steps[0]


def _references(folder: Path, task: str, model: str, processes: int, loss: str, accumulation: int = 1) -> list[dict]:
    """
    For each optimizer step of a run (`trainer_job.record_steps`), computed here without `Trainer`: the model of
    `task` and `model` loaded with the weights the step began from scores the batches every process trained on in it
    (`processes` x `accumulation` batches), and a plain cross-entropy gives

    - `mean`: the mean over the labelled positions of all of them (the global batch);
    - `mean_of_batch_means`: the mean of the batches' own means;
    - `counts`: each batch's labelled positions;
    - `grad_norm`: the norm of the gradient of `loss` (`"mean"` or `"mean_of_batch_means"`), with `loss` its name.
    """
    tokenizer = trainer_job.AutoTokenizer.from_pretrained(trainer_job.minilm_checkpoint_path())
    reference_model = trainer_job.bert_model(task, tokenizer, model)
    parameters = [p for p in reference_model.parameters() if p.requires_grad]
    recorded = [torch.load(folder / f"rank{rank}_steps.pt") for rank in range(processes)]
    assert len({len(batches) for batches in recorded}) == 1 and len(recorded[0]) % accumulation == 0
    references = []
    for start in range(0, len(recorded[0]), accumulation):
        reference_model.load_state_dict(recorded[0][start]["weights"])
        sums, counts = [], []
        for batches in recorded:
            for recorded_batch in batches[start : start + accumulation]:
                inputs = dict(recorded_batch["batch"])
                labels = inputs.pop("labels")
                logits = reference_model(**inputs).logits
                sums.append(F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="sum"))
                counts.append(int((labels != -100).sum()))
        losses = {
            "mean": sum(sums) / sum(counts),
            "mean_of_batch_means": sum(s / c for s, c in zip(sums, counts, strict=True)) / len(counts),
        }
        grads = torch.autograd.grad(losses[loss], parameters, allow_unused=True)
        grad_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads if g is not None])).item()
        values = {name: value.item() for name, value in losses.items()}
        references.append({**values, "counts": counts, "loss": loss, "grad_norm": grad_norm})
    return references


def _assert_logged(logged: list[dict], references: list[dict], factor: int = 1) -> None:
    """At every step `Trainer` logged `factor` times the reference loss (`_references`' `loss`), and the norm of
    `factor` times its gradient (before clipping)."""
    assert references
    for step, (entry, reference) in enumerate(zip(logged, references, strict=True), start=1):
        assert entry["loss"] == pytest.approx(factor * reference[reference["loss"]], rel=1e-5), (step, entry, reference)
        assert entry["grad_norm"] == pytest.approx(factor * reference["grad_norm"], rel=1e-4), (step, entry, reference)


@pytest.mark.parametrize("task", ["classification", "mlm"])
def test_trainer_logs_seqberts_mean_loss_and_world_size_times_it_for_bert(two_processes, task):
    """
    `Trainer` with its defaults (transformers 5.24: `average_tokens_across_devices=True`, `max_grad_norm=1.0`) under
    DDP, 2 gloo processes of 4 real snippets each, 3 steps: transformers' BERT head and seqbert's, from the same
    weights. transformers passes `num_items_in_batch` (the labelled positions of the global batch) to any model whose
    forward takes `**kwargs`, and multiplies its loss by the number of processes, expecting the model to have divided
    by that global count (DDP then averages the gradients). BERT's heads take `**kwargs` and ignore the count, so their
    loss and gradients come out world-size times the mean. Checked against the mean over the global batch computed
    here from the recorded weights and batches:

    - seqbert logs that mean and the norm of its gradient: the masked-LM head divides by the global count (a token
      mean, also when the processes hold different numbers of masked tokens), the classification head
      (`accepts_loss_kwargs = False`) is a per-batch mean that Trainer leaves alone and DDP averages;
    - BERT logs 2 x the mean of the two processes' means and 2 x its gradient norm (for classification, 4 labels in
      each process, 2 x the mean); at step 1, from the same weights, exactly twice seqbert's loss;
    - with `average_tokens_across_devices=False` (docs/training-at-scale.md) BERT and seqbert both log the mean of the
      processes' means.
    """
    runs = [(model, average) for t, model, average in LOSS_RUNS if t == task]
    bert, seqbert = ("transformers", True), ("converted", True)
    # Each run against the mean it logs: the global batch's (seqbert, Trainer's default) or the processes' own means'.
    losses = {key: "mean" if key == seqbert else "mean_of_batch_means" for key in runs}
    logged, references = {}, {}
    for key in runs:
        folder = two_processes / _loss_run_name(task, *key)
        assert json.loads((folder / "rank1.json").read_text())["wrapped_class"] == "DistributedDataParallel"
        logged[key] = _logged_steps(folder, WORLD_SIZE)
        references[key] = _references(folder, task, key[0], WORLD_SIZE, losses[key])
    # The same weights and batches at step 1 (seqbert's head converted from BERT's): one reference for both.
    assert references[bert][0]["counts"] == references[seqbert][0]["counts"]
    assert references[bert][0]["mean"] == pytest.approx(references[seqbert][0]["mean"], rel=1e-6)
    assert logged[bert][0]["loss"] == pytest.approx(WORLD_SIZE * logged[seqbert][0]["loss"], rel=1e-5)
    _assert_logged(logged[seqbert], references[seqbert])
    _assert_logged(logged[bert], references[bert], factor=WORLD_SIZE)
    if task == "classification":
        # 4 labels in each process: the mean of the processes' means is the mean, and BERT's loss twice it.
        for reference in references[bert] + references["transformers", False]:
            assert reference["counts"] == [4, 4] and reference["mean_of_batch_means"] == pytest.approx(
                reference["mean"], rel=1e-6
            )
        _assert_logged(logged["transformers", False], references["transformers", False])
    else:
        # The processes masked different numbers of tokens at some step, where the token mean seqbert logs differs
        # from the mean of the processes' means.
        uneven = [r for r in references[seqbert] if r["counts"][0] != r["counts"][1]]
        assert uneven and all(abs(r["mean"] / r["mean_of_batch_means"] - 1) > 1e-4 for r in uneven), uneven
        _assert_logged(logged["converted", False], references["converted", False])


def test_trainer_logs_bert_loss_times_the_accumulation_steps(tmp_path):
    """`Trainer` in one process with `gradient_accumulation_steps=2` (2 steps of 2 batches of 4 real snippets),
    transformers' BERT classification head and seqbert's from the same weights, against the mean over each step's 8
    snippets computed here (`_references`). transformers does not divide by the accumulation steps a loss it passed
    `num_items_in_batch` to, so BERT's logged loss and gradients are 2 x the mean (with DDP on top, world size x
    accumulation steps). seqbert's classification head (`accepts_loss_kwargs = False`) leaves the division to
    Trainer, and logs the mean; so does BERT's once given `accepts_loss_kwargs = False` (docs/training-at-scale.md)."""
    runs = {
        "bert": ("transformers", None),
        "bert-accepts-no-loss-kwargs": ("transformers", False),
        "seqbert": ("converted", None),
    }
    logged, references = {}, {}
    for name, (model, accepts_loss_kwargs) in runs.items():
        run = {"name": name, "task": "classification", "bert": model, "global_batch": 4, "max_steps": 2}
        run.update(output_dir=str(tmp_path), training_args={"gradient_accumulation_steps": 2})
        if accepts_loss_kwargs is not None:
            run["accepts_loss_kwargs"] = accepts_loss_kwargs
        trainer_job.train(run)
        logged[name] = _logged_steps(tmp_path / name, 1)
        references[name] = _references(tmp_path / name, "classification", model, 1, "mean", accumulation=2)
        assert all(reference["counts"] == [4, 4] for reference in references[name])
    _assert_logged(logged["bert"], references["bert"], factor=2)
    _assert_logged(logged["bert-accepts-no-loss-kwargs"], references["bert-accepts-no-loss-kwargs"])
    _assert_logged(logged["seqbert"], references["seqbert"])


def test_every_seqbert_model_tells_trainer_whether_its_loss_divides_by_the_count():
    """`Trainer` passes `num_items_in_batch` and scales the loss by the process count for a model whose
    `accepts_loss_kwargs` is True or, without that attribute, whose forward takes `**kwargs`, as every seqbert forward
    does. seqbert sets the attribute itself, so the tests above do not hang on a signature: True where the loss
    divides its sum by the count (the token-level heads; the bare models have no loss), False where it is a mean over
    its own batch."""
    own_mean = {"SeqBertForSequenceClassification", "SeqBertForQuestionAnswering", "SeqBertForMultipleChoice"}
    models = [getattr(seqbert, name) for name in seqbert.__all__]
    models = [
        model for model in models if isinstance(model, type) and issubclass(model, seqbert.SeqBertPreTrainedModel)
    ]
    assert {"SeqBertForMaskedLM", "SeqBertForCausalLM", "SeqBertForConditionalGeneration"} <= {
        m.__name__ for m in models
    }
    for model in models:
        assert any("accepts_loss_kwargs" in vars(cls) for cls in model.__mro__ if cls.__module__.startswith("seqbert."))
        assert model.accepts_loss_kwargs is (model.__name__ not in own_mean), model.__name__


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
    command += ["--use_cpu", "--fsdp"]  # transformers 5's form (`--fsdp full_shard` is deprecated, refused alike)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode != 0
    assert "was given, but accelerate set up MULTI_CPU instead of FSDP" in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_the_cuda_graph_route_under_ddp_evaluates_and_predicts_one_row_per_example(two_processes):
    """After the static run's training, on 2 gloo processes: `Trainer.predict` gives one row per example (21, not
    the 24 of the padded last step, nor one per sequence slot), with and without labels, each the trained model's
    logits on that example in one process (its weights loaded here, the padded batch, eagerly), and `evaluate`'s
    accuracy, from a `compute_metrics` written for BERT, is those logits' accuracy."""
    static = two_processes / "classification-static"
    tokenizer = trainer_job.AutoTokenizer.from_pretrained(trainer_job.minilm_checkpoint_path())
    model, examples = trainer_job.build({"task": "classification"}, tokenizer)
    model.load_state_dict(load_file(static / "rank0.safetensors"))
    examples = examples[:PREDICTED]
    with torch.no_grad():
        logits = model.eval()(**trainer_job.DataCollatorWithPadding(tokenizer)(examples)).logits
    labels = torch.tensor([e["labels"] for e in examples])
    for rank in (0, 1):
        result = torch.load(static / f"rank{rank}_predict.pt")
        assert result["predictions"].shape == result["unlabelled"].shape == (PREDICTED, 2)
        torch.testing.assert_close(result["predictions"], logits, atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(result["unlabelled"], logits, atol=TOLERANCE, rtol=0)
        assert torch.equal(result["label_ids"], labels)
        accuracy = (logits.argmax(-1) == labels).double().mean().item()
        assert result["metrics"]["eval_accuracy"] == pytest.approx(accuracy, abs=1e-9)
