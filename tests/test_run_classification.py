"""scripts/examples/run_classification.py end to end on the real offline data (a small slice, one epoch): the command line a
user runs, the files it promises, and a model that loads back through the Auto class with the same predictions."""

import json
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import seqbert
from seqbert.data import load_rotten_tomatoes


def test_writes_results_model_tokenizer_and_loss_curve(classification_run):
    output_dir = classification_run
    results = json.loads((output_dir / "all_results.json").read_text())
    assert 0.0 <= results["eval_accuracy"] <= 1.0
    assert results["train_samples"] == 96 and results["eval_samples"] == 64
    for name in ("config.json", "model.safetensors", "tokenizer.json", "loss_curve.png", "trainer_state.json"):
        assert (output_dir / name).exists(), name
    assert (output_dir / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_saved_model_loads_through_the_auto_class_and_reproduces_the_accuracy(classification_run):
    output_dir = classification_run
    model = AutoModelForSequenceClassification.from_pretrained(output_dir).eval()
    assert type(model) is seqbert.SeqBertForSequenceClassification
    assert model.config.id2label == {0: "rotten", 1: "fresh"} and model.config.norm_placement == "post"
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    validation = load_rotten_tomatoes()["validation"].select(range(64))  # what the script evaluated on
    with torch.no_grad():
        batch = tokenizer(list(validation["text"]), padding=True, truncation=True, max_length=128, return_tensors="pt")
        predictions = model(**batch).logits.argmax(-1)
    accuracy = (predictions == torch.tensor(list(validation["label"]))).float().mean().item()
    results = json.loads((output_dir / "all_results.json").read_text())
    assert accuracy == pytest.approx(results["eval_accuracy"], abs=1e-9)


def test_static_shapes_evaluate_to_the_same_accuracy(classification_run, tmp_path):
    """`--static_shapes` (the CUDA-graph route's collator): the saved classifier evaluated on the same 64 snippets, in
    static batches (one row per example, as the padded batches), scores the accuracy and loss the run reported, with
    the route's settings of Trainer (no per-step host read)."""
    import run_classification

    seen = {}
    evaluate = run_classification.SeqBertTrainer.evaluate

    def evaluating(trainer, *args, **kwargs):
        seen.update(
            filter=trainer.args.logging_nan_inf_filter, non_blocking=trainer.args.accelerator_config.non_blocking
        )
        return evaluate(trainer, *args, **kwargs)

    with mock.patch.object(run_classification.SeqBertTrainer, "evaluate", evaluating):
        metrics = run_classification.main(
        [
            "--model_name_or_path", str(classification_run), "--no_do_train", "--max_eval_samples", "64",
            "--static_shapes", "--output_dir", str(tmp_path / "static"), "--report_to", "none",
            ]
        )  # fmt: skip
    results = json.loads((classification_run / "all_results.json").read_text())
    assert metrics["eval_accuracy"] == pytest.approx(results["eval_accuracy"], abs=1e-9)
    assert metrics["eval_loss"] == pytest.approx(results["eval_loss"], abs=1e-5)
    assert metrics["eval_samples"] == 64 and seen == {"filter": False, "non_blocking": True}


@pytest.mark.parametrize(
    "mode, steps", [("reduce-overhead", 2), ("max-autotune-no-cudagraphs", 2), ("reduce-overhead", 1)]
)
def test_gradient_accumulation_under_cuda_graphs_is_refused(mode, steps):
    """With `--static_shapes` on a GPU, accumulating gradients under CUDA graphs stops with a message naming the two
    arguments and what to do; any other mode, or one batch a step, goes on."""
    import run_classification

    from seqbert.script_utils import ScriptInputError

    args = SimpleNamespace(
        gradient_accumulation_steps=steps,
        torch_compile_mode=mode,
        device=torch.device("cuda"),
        per_device_train_batch_size=16,
    )
    if mode == "reduce-overhead" and steps > 1:
        with pytest.raises(ScriptInputError, match=r"gradient_accumulation_steps \(2\) with --torch_compile_mode re"):
            run_classification.check_cuda_graph_accumulation(args)
    else:
        run_classification.check_cuda_graph_accumulation(args)


@pytest.mark.parametrize(
    "given, expected",
    [
        ([], (False, True)),
        (["--logging_nan_inf_filter", "True"], (True, True)),
        (["--accelerator_config", '{"non_blocking": false}'], (False, False)),
    ],
    ids=["defaults", "filter-given", "copies-given"],
)
def test_static_shapes_keeps_a_flag_the_user_set(tmp_path, given, expected):
    """`--static_shapes` turns Trainer's per-step host reads off by default (`training_arguments()` less the compile
    flags), and a flag given on the command line keeps its value; without `--static_shapes` Trainer's defaults hold."""
    import run_classification

    def settings(argv):
        _, _, args, _, _ = run_classification.parse_and_check([*argv, "--output_dir", str(tmp_path)])
        return args.logging_nan_inf_filter, args.accelerator_config.non_blocking

    assert settings(["--static_shapes", *given]) == expected
    assert settings([]) == (True, False)  # Trainer's own defaults
