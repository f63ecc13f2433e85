"""The CUDA-graph route as users take it (issue 66 items 2-4 and 6): tokenizers that pad on the left, hand-built static
batches, pre-LN and post-LN models, question answering on contexts of mixed lengths on the route's own (sdpa) path,
`model.compile()`, and the route's `Trainer` settings.

The oracle here is seqbert's own padded batch (the task's transformers collator, padded to the longest example) on the
same seeded weights: BERT is the oracle of `test_static_shapes.py` for post-LN, but it has no pre-LN form, and BERT's
padding positions differ from seqbert's sdpa path by design (BERT computes pad tokens, sdpa leaves them at zero;
docs/fine-tuning.md). A static batch is right-padded: a left-padding tokenizer gives the same batch as a right-padding
one, and a batch padded on the left is refused in one line.
"""

import pytest
import torch
from conftest import tiny_bert_vocab_config
from transformers import (
    AutoTokenizer,
    DataCollatorForMultipleChoice,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
)

import seqbert
from seqbert import static_shapes
from seqbert.static_shapes import StaticShapeCollator, copied_logits


SNIPPETS = 8
MAX_LENGTH = 64
# fp32, the same weights: the static batch and the padded batch both compute on the real tokens, in buckets of other
# sizes, so sums may run in other orders (measured here: within 1e-6).
TOLERANCE = 1e-5
GRADIENT_TOLERANCE = 1e-5  # relative to each parameter's largest gradient
GRADIENT_FLOOR = 1e-7  # a key bias and the span bias have zero gradients in exact arithmetic


@pytest.fixture(scope="module")
def features(tokenizer, rt_texts) -> list[dict]:
    """Real snippets of mixed lengths (7 to 40 tokens), unpadded, with segment ids."""
    features = [dict(tokenizer(text, truncation=True, max_length=MAX_LENGTH)) for text in rt_texts[:SNIPPETS]]
    lengths = [len(f["input_ids"]) for f in features]
    assert min(lengths) < max(lengths) // 2
    return features


@pytest.fixture(scope="module")
def left_tokenizer(minilm_path):
    """The same tokenizer, padding on the left (as one that also serves a decoder is often set)."""
    return AutoTokenizer.from_pretrained(minilm_path, padding_side="left")


def _examples(task: str, features: list[dict]) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    if task == "sequence":
        return [{**f, "label": i % 3} for i, f in enumerate(features)]
    if task == "token":
        return [
            {**f, "labels": torch.randint(0, 5, (len(f["input_ids"]),), generator=generator).tolist()} for f in features
        ]
    if task == "qa":
        return [{**f, "start_positions": 1, "end_positions": len(f["input_ids"]) - 2} for f in features]
    if task == "choice":
        return [
            {"input_ids": [a["input_ids"], b["input_ids"]], "token_type_ids": [a["token_type_ids"], b["token_type_ids"]],
             "label": q % 2}
            for q, (a, b) in enumerate(zip(features[::2], features[1::2], strict=True))
        ]  # fmt: skip
    if task.startswith("mlm"):  # every third token labelled (a fixed masking)
        return [{**f, "labels": [t if i % 3 == 1 else -100 for i, t in enumerate(f["input_ids"])]} for f in features]
    if task == "encoder":
        return list(features)
    raise AssertionError(task)


# task: (model class, config overrides)
TASKS = {
    "sequence": (seqbert.SeqBertForSequenceClassification, dict(num_labels=3)),
    "token": (seqbert.SeqBertForTokenClassification, dict(num_labels=5)),
    "qa": (seqbert.SeqBertForQuestionAnswering, {}),
    "choice": (seqbert.SeqBertForMultipleChoice, {}),
    "mlm-dense": (seqbert.SeqBertForMaskedLM, {}),
    "mlm-sparse": (seqbert.SeqBertForMaskedLM, dict(sparse_prediction=True)),
    "encoder": (seqbert.SeqBertModel, {}),
}


def _model(task: str, norm_placement: str = "post"):
    model_class, overrides = TASKS[task]
    torch.manual_seed(0)
    return model_class(tiny_bert_vocab_config(norm_placement=norm_placement, **overrides)).train()


def _padded(tokenizer, task: str, examples: list[dict]) -> dict:
    """seqbert's own padded batch: the task's transformers collator, padded to the longest example."""
    if task == "token" or task.startswith("mlm"):
        return dict(DataCollatorForTokenClassification(tokenizer)(examples))
    if task == "choice":
        return dict(DataCollatorForMultipleChoice(tokenizer)(examples))
    return dict(DataCollatorWithPadding(tokenizer)(examples))


def _run(model, batch: dict):
    """Forward and backward: `(output, gradients)`; the encoder's 'loss' is the sum of squares of its last hidden state
    projected on a fixed direction (a plain sum of LayerNorm outputs has gradients of round-off size)."""
    model.zero_grad()
    output = model(**batch)
    loss = getattr(output, "loss", None)
    if loss is None:
        direction = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0))
        loss = (output.last_hidden_state @ direction).square().sum()
    loss.backward()
    return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _check_gradients(grads: dict, reference: dict) -> None:
    assert grads.keys() == reference.keys() and grads
    for name, grad in grads.items():
        bound = GRADIENT_TOLERANCE * reference[name].abs().max() + GRADIENT_FLOOR
        assert (grad - reference[name]).abs().max() <= bound, name


def _check_outputs(task: str, static_output, padded_output, padded: dict) -> None:
    """The static batch's outputs equal the padded batch's, one row per example (on the real tokens where per token;
    question answering: the static batch's columns beyond the longest sequence hold the dtype's minimum)."""
    if task == "sequence" or task == "choice":
        torch.testing.assert_close(static_output.logits, padded_output.logits, atol=TOLERANCE, rtol=0)
    elif task == "qa":
        width = padded["input_ids"].shape[1]
        for side in ("start_logits", "end_logits"):
            mine, theirs = getattr(static_output, side), getattr(padded_output, side)
            torch.testing.assert_close(mine[:, :width], theirs, atol=TOLERANCE, rtol=0)
            assert (mine[:, width:] == torch.finfo(mine.dtype).min).all()
    elif task == "mlm-sparse":  # eagerly, one row per labelled position
        torch.testing.assert_close(static_output.logits, padded_output.logits, atol=TOLERANCE, rtol=0)
    else:  # (B, L, ...) on the real tokens
        name = "last_hidden_state" if task == "encoder" else "logits"
        mine, theirs = getattr(static_output, name), getattr(padded_output, name)
        real = padded["attention_mask"].bool()
        torch.testing.assert_close(mine[:, : real.shape[1]][real], theirs[real], atol=TOLERANCE, rtol=0)
    if getattr(padded_output, "loss", None) is not None:
        torch.testing.assert_close(static_output.loss, padded_output.loss, atol=TOLERANCE, rtol=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# Pre-LN and post-LN on the route, every head (question answering: contexts of mixed lengths, the sdpa path)
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
@pytest.mark.parametrize("task", list(TASKS))
def test_the_route_answers_as_the_padded_batch(tokenizer, features, task, norm_placement):
    """Every head, pre-LN (the package's default) and post-LN, sdpa (the route's own path: `plan_layout` takes the
    static layout), on real snippets of mixed lengths: outputs, loss and gradients of the static batch equal those
    of seqbert's padded batch of the same examples."""
    model = _model(task, norm_placement)
    assert model.config._attn_implementation == "sdpa"
    examples = _examples(task, features)
    config = model.config if task == "encoder" else model
    static = StaticShapeCollator(tokenizer, config, max_length=MAX_LENGTH)(examples)
    padded = _padded(tokenizer, task, examples)
    assert static["static_layout"] is True and padded["input_ids"].shape[-1] < MAX_LENGTH
    static_output, static_grads = _run(model, static)
    padded_output, padded_grads = _run(model, padded)
    _check_outputs(task, static_output, padded_output, padded)
    _check_gradients(static_grads, padded_grads)


# ----------------------------------------------------------------------------------------------------------------------
# Left padding
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["sequence", "token", "qa", "choice", "mlm-dense", "encoder"])
def test_a_left_padding_tokenizer_gives_the_right_padded_batch(tokenizer, left_tokenizer, features, task):
    """The collator pads on the right whatever the tokenizer's `padding_side`: the batch of a left-padding tokenizer is
    the right-padding one's, tensor for tensor, and the model answers on it as on the padded batch (the report: the
    pooler read a pad position as [CLS], a loss of exactly ln 2). The caller's tokenizer is left as it was."""
    model = _model(task)
    config = model.config if task == "encoder" else model
    examples = _examples(task, features)
    left = StaticShapeCollator(left_tokenizer, config, max_length=MAX_LENGTH)(examples)
    right = StaticShapeCollator(tokenizer, config, max_length=MAX_LENGTH)(examples)
    assert left_tokenizer.padding_side == "left"
    assert left.keys() == right.keys()
    for key, value in left.items():
        assert torch.equal(value, right[key]) if torch.is_tensor(value) else value == right[key], key
    padded = _padded(tokenizer, task, examples)
    with torch.no_grad():
        _check_outputs(task, model(**left), model(**padded), padded)


def test_examples_padded_on_the_left_are_refused(left_tokenizer, features):
    """Examples that come padded on the left (tokenized with `padding="max_length"` by a left-padding tokenizer) are
    refused in one line naming the example and what to do."""
    model = _model("sequence")
    texts = [left_tokenizer.decode(f["input_ids"][1:-1]) for f in features[:3]]
    padded = [dict(left_tokenizer(t, padding="max_length", max_length=MAX_LENGTH)) | {"label": 0} for t in texts]
    with pytest.raises(ValueError, match=r"example 0 padded on the left .*padding_side='right'"):
        StaticShapeCollator(left_tokenizer, model, max_length=MAX_LENGTH)(padded)


# ----------------------------------------------------------------------------------------------------------------------
# Hand-built static batches: checked eagerly, nothing silently dropped
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlm_batch(tokenizer, features) -> dict:
    model = _model("mlm-sparse")
    return StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH)(_examples("mlm-sparse", features))


def test_a_hand_built_layout_unlike_its_mask_is_refused_naming_the_field(mlm_batch):
    """Eagerly, the layout is checked against the attention mask (`StaticLayoutMatches`) in the forward's one host
    read: each planted fault is named with its values (`validate_static_layout=False`, or compiled, trusts the
    batch: `test_static_shapes.py` shows it reads nothing then)."""
    model = _model("mlm-dense")
    batch = dict(mlm_batch)
    batch.pop("max_predictions")
    longest = int(batch["cu_seqlens"].diff().max())  # filler sequences included
    with pytest.raises(ValueError, match=rf"max_seqlen \(7\) is below the layout's longest sequence \({longest}\)"):
        model(**(batch | {"max_seqlen": 7}))
    swapped = batch["indices"].clone()
    swapped[[1, 2]] = swapped[[2, 1]]
    with pytest.raises(ValueError, match=r"indices \(\d+ entries\) do not list the attention mask's \d+ real tokens"):
        model(**(batch | {"indices": swapped}))
    offsets = batch["cu_seqlens"].clone()
    offsets[1] += 1
    with pytest.raises(ValueError, match=r"cu_seqlens \[0, \d+, .*its first 8 sequences the rows' lengths"):
        model(**(batch | {"cu_seqlens": offsets}))
    left = {
        k: v.flip(-1) if k in ("input_ids", "attention_mask", "token_type_ids", "labels") else v
        for k, v in batch.items()
    }
    with pytest.raises(ValueError, match=r"attention_mask of a static batch .* real token after padding in row 0"):
        model(**left)


def test_max_predictions_below_the_labelled_positions_is_refused(mlm_batch):
    """A hand-built sparse masked-LM batch whose `max_predictions` is below its labelled positions would drop loss
    terms: refused, naming both numbers."""
    model = _model("mlm-sparse")
    labelled = int((mlm_batch["labels"] != -100).sum())
    with pytest.raises(ValueError, match=rf"max_predictions \(8\) is below the static batch's {labelled} labelled"):
        model(**(mlm_batch | {"max_predictions": 8}))


def test_sparse_masked_lm_rows_line_up_with_the_labels(tokenizer, features, mlm_batch):
    """Eagerly, a static batch gives one row per labelled position, the non-static sparse path's rows. Unvalidated
    (as compiled: nothing read) it gives `max_predictions` rows, and `copied_logits` (Trainer's
    `preprocess_logits_for_metrics` on the route) keeps the first M, the same rows."""
    model = _model("mlm-sparse").eval()
    labels = mlm_batch["labels"]
    labelled = int((labels != -100).sum())
    padded = _padded(tokenizer, "mlm-sparse", _examples("mlm-sparse", features))
    with torch.no_grad():
        eager = model(**mlm_batch).logits
        unvalidated = model(**mlm_batch, validate_static_layout=False).logits
        reference = model(**padded).logits
    assert eager.shape == reference.shape == (labelled, 30522)
    torch.testing.assert_close(eager, reference, atol=TOLERANCE, rtol=0)
    assert unvalidated.shape == (mlm_batch["max_predictions"], 30522) and mlm_batch["max_predictions"] > labelled
    kept = copied_logits(unvalidated, labels)
    torch.testing.assert_close(kept, eager, atol=0, rtol=0)
    assert copied_logits(eager, labels).shape == eager.shape  # already M rows: unchanged
    multi_label = torch.randn(4, 3)
    assert copied_logits(multi_label, (multi_label > 0).long()).shape == (4, 3)  # same shapes: not sparse rows


# ----------------------------------------------------------------------------------------------------------------------
# No shared mutable state
# ----------------------------------------------------------------------------------------------------------------------


def test_model_compile_runs_a_batch_beyond_the_ladder_eagerly(tokenizer, features):
    """`model.compile()` (which compiles inside `nn.Module.__call__`) takes a batch beyond the ladder outside the graph,
    as `torch.compile(model)` does: no graph holds an op, and the eager model's outputs."""
    model = _model("sequence").eval()
    reference = _model("sequence").eval()
    collator = StaticShapeCollator(tokenizer, model, max_length=16)
    with pytest.warns(UserWarning, match="longer than max_length"):
        batch = collator(_examples("sequence", features))
    assert batch["static_layout"] is False
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    model.compile(backend=counter)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, reference(**batch).logits, atol=0, rtol=0)
        static = StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH)(_examples("sequence", features))
        model(**static)  # a batch of the ladder is compiled
    assert counter.frame_count >= 1 and counter.op_count > 0
    counter.clear()
    with torch.no_grad():
        model(**batch)
    assert counter.frame_count == 0 and counter.op_count == 0


def test_the_route_training_arguments_are_a_new_dict_every_time():
    """What one caller changes in the route's `Trainer` settings reaches no other caller."""
    first = static_shapes.training_arguments()
    first["logging_nan_inf_filter"] = True
    first["accelerator_config"]["non_blocking"] = False
    again = static_shapes.training_arguments()
    assert again["logging_nan_inf_filter"] is False and again["accelerator_config"] == {"non_blocking": True}
    assert static_shapes.TRAINING_ARGUMENTS == again and static_shapes.TRAINING_ARGUMENTS is not again
