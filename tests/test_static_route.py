"""The CUDA-graph route (`seqbert.StaticShapeCollator` as `Trainer`'s `data_collator`) as a drop-in for everything
`Trainer` does, with transformers' BERT as the oracle: a tiny post-LN BERT drawn from `torch.manual_seed(0)`, and the
seqbert head holding the same weights (`tests/trainer_job.py`'s `bert_model`), on real Rotten Tomatoes snippets. BERT
runs `Trainer` with the padded batches of `DataCollatorWithPadding`; seqbert the route's static batches. Checked, in
one process on the CPU:

- training: the losses `Trainer` logs and the weights it ends with are BERT's, also with gradient accumulation, and
  under `TrainingArguments(torch_compile=True)` (dynamo with Trainer's own `dynamic=None`, AOTAutograd, `aot_eager` in
  place of inductor; its graphs hold no host read);
- evaluation and prediction, eager and compiled: a `compute_metrics` written for BERT gives BERT's metrics and
  `eval_loss`; `predict` gives one row per example, BERT's, with and without labels, token classification included;
- resuming from a checkpoint ends with the weights of the run that was not interrupted.

Evaluation and prediction under DDP (2 gloo processes) are `test_distributed.py`'s; what the route costs the host per
step on a GPU is the CUDA dry run's (`test_cuda_dry_run.py`).
"""

import sys
from pathlib import Path
from unittest import mock

import evaluate
import numpy as np
import pytest
import torch
from conftest import RecordingBackend, host_reads
from transformers import (
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

import seqbert
from seqbert.convert_bert import bert_state_dict_to_seqbert
from seqbert.data import load_rotten_tomatoes
from seqbert.metrics import ACCURACY_PATH
from seqbert.static_shapes import copied_logits


sys.path.insert(0, str(Path(__file__).parent))
import trainer_job  # noqa: E402


MAX_LENGTH = 48
BATCH = 8
TOLERANCE = 1e-5  # fp32, the same weights: sums over other orders (the static batch's real tokens, BERT's grid)


@pytest.fixture(scope="module")
def snippets(tokenizer) -> dict[str, list[dict]]:
    """40 training and 21 evaluation snippets (an evaluation batch of 8 leaves 5), truncated to 48 tokens, unpadded."""
    data = load_rotten_tomatoes(num_train=40, num_validation=21)
    splits = {}
    for split, rows in (("train", data["train"]), ("eval", data["validation"])):
        encoded = tokenizer(list(rows["text"]), truncation=True, max_length=MAX_LENGTH)
        splits[split] = [
            {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "label": label}
            for ids, types, mask, label in zip(
                encoded["input_ids"], encoded["token_type_ids"], encoded["attention_mask"], rows["label"], strict=True
            )
        ]
    return splits


def accuracy_for_bert(prediction) -> dict[str, float]:
    """A `compute_metrics` as BERT's users write it: one prediction row per example, no filtering."""
    return ACCURACY.compute(predictions=np.argmax(prediction.predictions, axis=-1), references=prediction.label_ids)


ACCURACY = evaluate.load(ACCURACY_PATH)


def _arguments(output_dir: Path, **overrides) -> TrainingArguments:
    settings = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        max_steps=5,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    return TrainingArguments(**(settings | overrides))


def _trainers(tokenizer, tmp_path, snippets, task="classification", bert_args=None, **args) -> tuple[Trainer, Trainer]:
    """`Trainer`s of BERT (padded batches) and of seqbert with the same weights (the route's static batches)."""
    bert = trainer_job.bert_model(task, tokenizer, "transformers")
    model = trainer_job.bert_model(task, tokenizer, "converted")
    static = seqbert.StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH, batch_size=BATCH)
    common = dict(train_dataset=snippets["train"], eval_dataset=snippets["eval"], compute_metrics=accuracy_for_bert)
    return (
        Trainer(
            model=bert,
            args=_arguments(tmp_path / "bert", **(bert_args or {})),
            data_collator=DataCollatorWithPadding(tokenizer),
            **common,
        ),
        Trainer(model=model, args=_arguments(tmp_path / "seqbert", **args), data_collator=static, **common),
    )


def _weights(trainer: Trainer, seqbert_config) -> dict[str, torch.Tensor]:
    """The trained weights under seqbert's names."""
    state = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    return (
        state
        if isinstance(trainer.model, seqbert.SeqBertPreTrainedModel)
        else bert_state_dict_to_seqbert(state, seqbert_config)
    )


def _losses(trainer: Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def check_same_training(bert: Trainer, route: Trainer) -> None:
    assert _losses(route) == pytest.approx(_losses(bert), abs=TOLERANCE) and len(_losses(bert)) == 5
    mine, theirs = _weights(route, route.model.config), _weights(bert, route.model.config)
    assert mine.keys() == theirs.keys()
    assert max((mine[k] - theirs[k]).abs().max().item() for k in mine) <= TOLERANCE


@pytest.mark.parametrize("accumulation", [1, 2], ids=["one batch a step", "two batches a step"])
def test_training_is_berts(tokenizer, tmp_path, snippets, accumulation):
    """5 optimizer steps of 8 examples (with accumulation, 2 batches of 4 a step): the losses and weights of BERT's
    steps of 8 examples. (BERT itself is no oracle for accumulation in transformers 5.x: its heads take `**kwargs`,
    so `Trainer` leaves the scaling to a loss that ignores `num_items_in_batch`, and logs and steps on the sum of the
    micro-batches' means: docs/training-at-scale.md.)"""
    args = dict(per_device_train_batch_size=BATCH // accumulation, gradient_accumulation_steps=accumulation)
    bert, route = _trainers(tokenizer, tmp_path, snippets, **args)
    bert.train()
    route.train()
    check_same_training(bert, route)


def _recording_aot_eager():
    """A `RecordingBackend` registered as "aot_eager", what `TrainingArguments(torch_compile_backend="aot_eager")`
    compiles with: `(its graphs, the patch that registers it)`."""
    backend = RecordingBackend()
    return backend.graphs, mock.patch.dict(torch._dynamo.backends.registry._COMPILER_FNS, {"aot_eager": backend})


COMPILE = dict(torch_compile=True, torch_compile_backend="aot_eager", torch_compile_mode="reduce-overhead")


def test_compiled_training_is_berts_and_reads_nothing(tokenizer, tmp_path, snippets):
    """`TrainingArguments(torch_compile=True, torch_compile_mode="reduce-overhead")` as the recipe sets them (its
    problem type set, `logging_nan_inf_filter` off): Trainer compiles with `dynamic=None`, so after the first shape
    dynamo traces the changing sizes as symbols; over 5 steps of 3 shapes, at most 3 graphs, none reading the host,
    and BERT's losses and weights."""
    bert, route = _trainers(tokenizer, tmp_path, snippets, logging_nan_inf_filter=False, **COMPILE)
    route.model.config.problem_type = bert.model.config.problem_type = "single_label_classification"
    graphs, recording = _recording_aot_eager()
    torch._dynamo.reset()
    with recording:
        route.train()
    bert.train()
    check_same_training(bert, route)
    assert type(route.model_wrapped).__name__ == "OptimizedModule"
    assert 1 <= len(graphs) <= 3 and not host_reads(graphs), (len(graphs), host_reads(graphs))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_evaluate_and_predict_are_berts(tokenizer, tmp_path, snippets, compiled):
    """Before any training (so a compiled `Trainer` compiles its evaluation model, with `dynamic=None`):
    `evaluate` with a `compute_metrics` written for BERT gives BERT's metrics and `eval_loss`; `predict` one row per
    example (21: batches of 8, 8 and 5), BERT's, with labels and without."""
    bert, route = _trainers(tokenizer, tmp_path, snippets, **(COMPILE if compiled else {}))
    route.preprocess_logits_for_metrics = copied_logits  # under CUDA graphs, out of the graph's buffers
    graphs, recording = _recording_aot_eager()
    torch._dynamo.reset()
    with recording:
        metrics, prediction = route.evaluate(), route.predict(snippets["eval"])
        unlabelled = route.predict([{k: v for k, v in e.items() if k != "label"} for e in snippets["eval"]])
    if compiled:
        assert type(route.model_wrapped).__name__ == "OptimizedModule" and graphs and not host_reads(graphs)
    else:
        assert not graphs
    bert_metrics, bert_prediction = bert.evaluate(), bert.predict(snippets["eval"])
    assert metrics["eval_accuracy"] == bert_metrics["eval_accuracy"]
    assert metrics["eval_loss"] == pytest.approx(bert_metrics["eval_loss"], abs=TOLERANCE)
    assert prediction.predictions.shape == bert_prediction.predictions.shape == (21, 2)
    np.testing.assert_allclose(prediction.predictions, bert_prediction.predictions, atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(prediction.label_ids, bert_prediction.label_ids)
    assert unlabelled.label_ids is None and unlabelled.predictions.shape == (21, 2)
    np.testing.assert_allclose(unlabelled.predictions, bert_prediction.predictions, atol=TOLERANCE, rtol=0)


def test_token_classification_predicts_one_row_per_sentence(tokenizer, tmp_path, snippets):
    """`Trainer.predict` of a token classifier: (21, 48, 2), one row per sentence, as a seqeval-style metric iterates
    them (per row, the labelled positions); at every labelled position BERT's logits (BERT's rows are as wide as its
    longest batch, padded with -100 between batches)."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for e in snippets["eval"]:
        labels = torch.randint(0, 2, (len(e["input_ids"]),), generator=generator)
        labels[0] = labels[-1] = -100
        examples.append({k: v for k, v in e.items() if k != "label"} | {"labels": labels.tolist()})
    bert = trainer_job.bert_model("token-classification", tokenizer, "transformers")
    model = trainer_job.bert_model("token-classification", tokenizer, "converted")
    route = Trainer(
        model=model,
        args=_arguments(tmp_path / "seqbert"),
        data_collator=seqbert.StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH, batch_size=BATCH),
    )
    reference = Trainer(
        model=bert, args=_arguments(tmp_path / "bert"), data_collator=DataCollatorForTokenClassification(tokenizer)
    )
    prediction, bert_prediction = route.predict(examples), reference.predict(examples)
    assert prediction.predictions.shape == (21, MAX_LENGTH, 2) and prediction.label_ids.shape == (21, MAX_LENGTH)
    assert prediction.metrics["test_loss"] == pytest.approx(bert_prediction.metrics["test_loss"], abs=TOLERANCE)
    for row, example in enumerate(examples):
        labelled = np.array(example["labels"]) != -100
        width = len(example["labels"])
        np.testing.assert_array_equal(
            prediction.label_ids[row, :width][labelled], np.array(example["labels"])[labelled]
        )
        np.testing.assert_allclose(
            prediction.predictions[row, :width][labelled],
            bert_prediction.predictions[row, :width][labelled],
            atol=TOLERANCE,
            rtol=0,
        )


def test_resuming_from_a_checkpoint_ends_where_the_uninterrupted_run_ends(tokenizer, tmp_path, snippets):
    """5 steps with a checkpoint every 2; a new `Trainer` resumed from the checkpoint of step 2 ends with the weights
    of the run that was not interrupted (the data order and the RNG come back with the checkpoint)."""
    _, whole = _trainers(tokenizer, tmp_path / "whole", snippets, save_strategy="steps", save_steps=2)
    whole.train()
    _, resumed = _trainers(tokenizer, tmp_path / "resumed", snippets)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "seqbert" / "checkpoint-2"))
    assert resumed.state.global_step == 5
    mine, theirs = _weights(resumed, resumed.model.config), _weights(whole, whole.model.config)
    assert max((mine[k] - theirs[k]).abs().max().item() for k in mine) == 0.0
