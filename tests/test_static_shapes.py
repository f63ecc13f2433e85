"""`StaticShapeCollator`: batches in a few fixed shapes, whose forward and backward read nothing on the host, for CUDA
graphs (`torch.compile(mode="reduce-overhead")`). Checked on the CPU, where no GPU is:

- the oracle is transformers' own BERT classes, holding the real MiniLM weights (their heads seeded), converted into
  seqbert: on real Rotten Tomatoes snippets, the static batch gives one row per example with BERT's logits (on real
  tokens), loss and gradients, in fp32, for every head `Trainer` trains and every problem type and label dtype
  (single-label, integer and float regression, multi-label with integer and float targets, token classification,
  question answering with contexts shorter than the bucket, multiple choice, masked LM dense and sparse), and the
  collator leaves the model and its config as they were;
- an epoch of the main job's data (2,000 Rotten Tomatoes snippets, batch 32, 128 tokens) takes at most the ladder's
  number of distinct shapes, each a bucket of the ladder;
- `torch.compile(fullgraph=True, dynamic=False)` of a tiny model's training step compiles at most once per bucket over
  that epoch (dynamo's own counters), and not at all again in a second pass;
- a batch beyond the ladder is padded as usual, warned about once, and run eagerly by a compiled model (no graph);
- planted faults fail: a shape outside the ladder reaching a graph, a forward that reads the host.

What `Trainer` does with these batches (train, evaluate, predict, accumulation, resume, DDP) is `test_static_route.py`;
the host reads and the flash kernel's arguments on a GPU are checked by the CUDA dry run (`test_cuda_dry_run.py`).
"""

import math
import warnings
from dataclasses import replace
from unittest import mock

import pytest
import torch
from conftest import RecordingBackend, host_reads, tiny_bert_vocab_config
from transformers import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    DataCollatorWithPadding,
)

import seqbert
from seqbert import attention_backends, decoder_checks, input_checks
from seqbert.convert_bert import bert_state_dict_to_seqbert
from seqbert.data import load_rotten_tomatoes
from seqbert.static_shapes import Bucket, StaticShapeCollator, token_ladder


SNIPPETS = 12
MAX_LENGTH = 64  # the static batches' width: every snippet here is shorter (7 to 40 tokens)
# fp32 on the same weights: the static batch computes on the real tokens only, BERT on the padded grid, so sums run in
# other orders (measured: logits and losses within 1e-6, gradients within 1e-5 relative).
LOGITS_TOLERANCE = 1e-5
GRADIENT_TOLERANCE = 1e-4  # relative to the largest gradient of each parameter
GRADIENT_FLOOR = (
    1e-7  # absolute: a key bias and the span bias have zero gradients in exact arithmetic (a softmax shift)
)


def _pair(model_class, config):
    torch.manual_seed(0)
    return model_class(config).train()


@pytest.fixture(scope="module")
def features(tokenizer, rt_texts) -> list[dict]:
    """12 real snippets, tokenized unpadded (7 to 40 tokens), with segment ids."""
    features = [dict(tokenizer(text, truncation=True, max_length=MAX_LENGTH)) for text in rt_texts[:SNIPPETS]]
    lengths = [len(f["input_ids"]) for f in features]
    assert min(lengths) < max(lengths) // 2 and max(lengths) < MAX_LENGTH
    return features


# ----------------------------------------------------------------------------------------------------------------------
# BERT as the oracle
# ----------------------------------------------------------------------------------------------------------------------


class Oracle:
    """transformers' BERT class of a head, holding the MiniLM weights (a seeded head, no dropout), and the seqbert
    class of that head with the same weights (`from_bert_pretrained` of BERT's saved folder); both in train mode."""

    def __init__(self, bert_class, seqbert_class, minilm_path, folder, **config):
        torch.manual_seed(0)
        settings = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **config)
        self.bert = bert_class.from_pretrained(minilm_path, **settings).train()
        self.bert.save_pretrained(folder)
        self.model = seqbert_class.from_bert_pretrained(folder, **settings).train()

    def run(self, static: dict, bert_batch: dict | None = None):
        """The static batch through seqbert and (`bert_batch`, by default the static batch's padded tensors) through
        BERT, forward and backward: `(output, bert_output, gradients, bert_gradients)`, BERT's gradients under
        seqbert's names."""
        bert_batch = {k: v for k, v in static.items() if k in BERT_KEYS} if bert_batch is None else bert_batch
        outputs, grads = [], []
        for model, batch in ((self.model, static), (self.bert, bert_batch)):
            model.zero_grad()
            output = model(**batch)
            output.loss.backward()
            outputs.append(output)
            grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
        grads[1] = bert_state_dict_to_seqbert(grads[1], self.model.config)
        return outputs[0], outputs[1], grads[0], grads[1]


# What a padded batch holds (BERT's inputs): the static batch's layout is seqbert's alone.
BERT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "labels", "start_positions", "end_positions")


@pytest.fixture(scope="module")
def oracles(minilm_path, tmp_path_factory):
    """Oracles by name, built on first use."""
    built = {}

    def get(name: str, bert_class, seqbert_class, **config) -> Oracle:
        if name not in built:
            built[name] = Oracle(bert_class, seqbert_class, minilm_path, tmp_path_factory.mktemp(name), **config)
        return built[name]

    return get


def check_gradients(grads: dict, bert_grads: dict) -> None:
    """The same parameters got a gradient, each within `GRADIENT_TOLERANCE` of BERT's, relative to its largest (plus
    `GRADIENT_FLOOR`)."""
    assert grads.keys() == bert_grads.keys() and grads
    for name, grad in grads.items():
        bound = GRADIENT_TOLERANCE * bert_grads[name].abs().max() + GRADIENT_FLOOR
        assert (grad - bert_grads[name]).abs().max() <= bound, name


def check_on_real_tokens(mine: torch.Tensor, bert: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """(B, L, ...) outputs equal on the real tokens (BERT computes values at padding too, from pad tokens)."""
    assert mine.shape[:2] == attention_mask.shape
    real = attention_mask.bool()
    torch.testing.assert_close(mine[real], bert[real], atol=LOGITS_TOLERANCE, rtol=0)


def check_loss(mine: torch.Tensor, bert: torch.Tensor) -> None:
    torch.testing.assert_close(mine, bert, atol=LOGITS_TOLERANCE, rtol=1e-6)


SEQUENCE_PROBLEMS = {
    # name: (num_labels, problem_type set in the config, labels for example i, BERT's labels from ours)
    "single_label": (3, None, lambda i, g: -100 if i == 3 else int(torch.randint(0, 3, (), generator=g)), None),
    "regression_float": (1, None, lambda i, g: float(torch.randn((), generator=g)), None),
    "regression_int": (1, None, lambda i, g: int(torch.randint(0, 5, (), generator=g)), None),
    "multi_label_float": (
        3,
        None,
        lambda i, g: (torch.rand(3, generator=g) < 0.5).float().tolist(),
        None,
    ),
    # Integer multi-hot targets need the problem type (transformers infers single-label from integer labels); BERT's
    # BCE loss takes float targets: ours convert them.
    "multi_label_int": (
        3,
        "multi_label_classification",
        lambda i, g: (torch.rand(3, generator=g) < 0.5).long().tolist(),
        lambda labels: labels.float(),
    ),
}


@pytest.mark.parametrize("problem", list(SEQUENCE_PROBLEMS))
def test_sequence_classification_is_berts(oracles, tokenizer, features, problem):
    num_labels, problem_type, label, bert_labels = SEQUENCE_PROBLEMS[problem]
    generator = torch.Generator().manual_seed(0)
    examples = [{**f, "label": label(i, generator)} for i, f in enumerate(features)]
    oracle = oracles(
        f"sequence-{num_labels}",
        BertForSequenceClassification,
        seqbert.SeqBertForSequenceClassification,
        num_labels=num_labels,
    )
    # Both models infer the problem type from the first labels they see: each run starts from this one's.
    oracle.model.config.problem_type = oracle.bert.config.problem_type = problem_type
    before = oracle.model.config.to_dict()
    static = StaticShapeCollator(tokenizer, oracle.model, max_length=MAX_LENGTH)(examples)
    assert oracle.model.config.to_dict() == before  # the collator leaves the model's config as it was
    assert static["static_layout"] is True and static["input_ids"].shape == (SNIPPETS, MAX_LENGTH)
    bert_batch = {k: v for k, v in static.items() if k in BERT_KEYS}
    if bert_labels is not None:
        bert_batch["labels"] = bert_labels(bert_batch["labels"])
    output, bert_output, grads, bert_grads = oracle.run(static, bert_batch)
    assert output.logits.shape == (SNIPPETS, num_labels)
    torch.testing.assert_close(output.logits, bert_output.logits, atol=LOGITS_TOLERANCE, rtol=0)
    check_loss(output.loss, bert_output.loss)
    check_gradients(grads, bert_grads)
    assert oracle.model.config.problem_type == oracle.bert.config.problem_type  # inferred alike where it was None


def test_token_classification_is_berts(oracles, tokenizer, features):
    generator = torch.Generator().manual_seed(1)
    examples = []
    for f in features:
        labels = torch.randint(0, 5, (len(f["input_ids"]),), generator=generator)
        labels[0] = labels[-1] = -100  # [CLS] and [SEP], as word-aligned labels leave them
        examples.append({**f, "labels": labels.tolist()})
    oracle = oracles("token", BertForTokenClassification, seqbert.SeqBertForTokenClassification, num_labels=5)
    static = StaticShapeCollator(tokenizer, oracle.model, max_length=MAX_LENGTH)(examples)
    assert static["labels"].shape == (SNIPPETS, MAX_LENGTH)
    output, bert_output, grads, bert_grads = oracle.run(static)
    assert output.logits.shape == (SNIPPETS, MAX_LENGTH, 5)
    check_on_real_tokens(output.logits, bert_output.logits, static["attention_mask"])
    check_loss(output.loss, bert_output.loss)
    check_gradients(grads, bert_grads)


def _answers(features, longest_for: int | None = None) -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    examples = []
    for f in features:
        start = int(torch.randint(1, len(f["input_ids"]) - 1, (), generator=generator))
        examples.append({**f, "start_positions": start, "end_positions": min(start + 2, len(f["input_ids"]) - 1)})
    return examples


@pytest.fixture(scope="module")
def equal_length_snippets(tokenizer, rt_texts) -> list[dict]:
    """8 real snippets of one length (the commonest among the first 400), far shorter than the bucket's width."""
    encoded = [dict(tokenizer(text, truncation=True, max_length=MAX_LENGTH)) for text in rt_texts[:400]]
    lengths = [len(e["input_ids"]) for e in encoded]
    common = max(set(lengths), key=lengths.count)
    same = [e for e in encoded if len(e["input_ids"]) == common][:8]
    assert len(same) == 8 and common < MAX_LENGTH // 2
    return same


def test_question_answering_on_contexts_shorter_than_the_bucket_is_berts(oracles, tokenizer, equal_length_snippets):
    """Contexts of one length, far shorter than the bucket's width: BERT's dynamically padded batch has no padding,
    so its loss spans exactly the contexts' positions; the static batch's columns beyond them take no probability."""
    oracle = oracles("qa", BertForQuestionAnswering, seqbert.SeqBertForQuestionAnswering)
    examples = _answers(equal_length_snippets)
    examples[2]["end_positions"] = MAX_LENGTH - 3  # beyond the contexts but inside the bucket: ignored, as by BERT
    static = StaticShapeCollator(tokenizer, oracle.model, max_length=MAX_LENGTH)(examples)
    padded = DataCollatorWithPadding(tokenizer)(examples)  # the contexts' own length: what BERT trains on
    assert padded["attention_mask"].all() and static["input_ids"].shape == (8, MAX_LENGTH)
    output, bert_output, grads, bert_grads = oracle.run(static, dict(padded))
    length = padded["input_ids"].shape[1]
    for side in ("start_logits", "end_logits"):
        mine = getattr(output, side)
        assert mine.shape == (8, MAX_LENGTH)
        torch.testing.assert_close(mine[:, :length], getattr(bert_output, side), atol=LOGITS_TOLERANCE, rtol=0)
        assert (mine[:, length:] == torch.finfo(mine.dtype).min).all()  # columns BERT's batch does not have
    check_loss(output.loss, bert_output.loss)
    check_gradients(grads, bert_grads)


def test_question_answering_on_contexts_of_mixed_lengths(oracles, tokenizer, features):
    """Contexts of 7 to 40 tokens: the static batch answers as BERT's dynamically padded batch (to the longest)
    answers. The eager reference, which computes padding positions as BERT does, gives BERT's loss and gradients;
    sdpa gives BERT's logits on the real tokens (its padding positions hold zeros, so BERT's loss, whose softmax spans
    the padding positions up to the longest context, differs there: the same as on the padded path)."""
    examples = _answers(features)
    longest = max(len(f["input_ids"]) for f in features)
    examples[5]["start_positions"] = longest + 3  # beyond every context: ignored
    oracle = oracles("qa", BertForQuestionAnswering, seqbert.SeqBertForQuestionAnswering)
    static = StaticShapeCollator(tokenizer, oracle.model, max_length=MAX_LENGTH)(examples)
    padded = dict(DataCollatorWithPadding(tokenizer)(examples))
    output, bert_output, _, _ = oracle.run(static, padded)
    for side in ("start_logits", "end_logits"):
        mine, theirs = getattr(output, side), getattr(bert_output, side)
        check_on_real_tokens(mine[:, :longest, None], theirs[:, :, None], padded["attention_mask"])
        assert (mine[:, longest:] == torch.finfo(mine.dtype).min).all()
    eager = oracles(
        "qa-eager", BertForQuestionAnswering, seqbert.SeqBertForQuestionAnswering, attn_implementation="eager"
    )
    output, bert_output, grads, bert_grads = eager.run(static, padded)
    for side in ("start_logits", "end_logits"):
        mine, theirs = getattr(output, side), getattr(bert_output, side)
        torch.testing.assert_close(mine[:, :longest], theirs, atol=LOGITS_TOLERANCE, rtol=0)
    check_loss(output.loss, bert_output.loss)
    check_gradients(grads, bert_grads)


def test_multiple_choice_is_berts(oracles, tokenizer, features):
    """Six questions of two choices each (consecutive snippets)."""
    examples = [
        {
            "input_ids": [features[2 * q]["input_ids"], features[2 * q + 1]["input_ids"]],
            "token_type_ids": [features[2 * q]["token_type_ids"], features[2 * q + 1]["token_type_ids"]],
            "label": q % 2,
        }
        for q in range(SNIPPETS // 2)
    ]
    oracle = oracles("choice", BertForMultipleChoice, seqbert.SeqBertForMultipleChoice)
    static = StaticShapeCollator(tokenizer, oracle.model, max_length=MAX_LENGTH)(examples)
    assert static["input_ids"].shape == (SNIPPETS // 2, 2, MAX_LENGTH)
    output, bert_output, grads, bert_grads = oracle.run(static)
    assert output.logits.shape == (SNIPPETS // 2, 2)
    torch.testing.assert_close(output.logits, bert_output.logits, atol=LOGITS_TOLERANCE, rtol=0)
    check_loss(output.loss, bert_output.loss)
    check_gradients(grads, bert_grads)


@pytest.mark.parametrize("sparse_prediction", [False, True], ids=["dense", "sparse"])
def test_masked_lm_is_berts(oracles, tokenizer, features, sparse_prediction):
    """transformers' masking (the collator's `DataCollatorForLanguageModeling`); BERT scores every position, the
    sparse head the labelled ones only: eagerly (the layout validated, the labelled positions counted in its read)
    exactly one row per labelled position, as on any other batch."""
    oracle = oracles("mlm", BertForMaskedLM, seqbert.SeqBertForMaskedLM)
    oracle.model.config.sparse_prediction = sparse_prediction
    torch.manual_seed(4)
    static = StaticShapeCollator(tokenizer, oracle.model, max_length=MAX_LENGTH, mlm_probability=0.3)(features)
    labelled = static["labels"] != -100
    assert 0 < int(labelled.sum()) <= static["max_predictions"]
    output, bert_output, grads, bert_grads = oracle.run(static)
    if sparse_prediction:
        assert output.logits.shape == (int(labelled.sum()), 30522)
        torch.testing.assert_close(output.logits, bert_output.logits[labelled], atol=LOGITS_TOLERANCE, rtol=0)
    else:
        check_on_real_tokens(output.logits, bert_output.logits, static["attention_mask"])
    check_loss(output.loss, bert_output.loss)
    check_gradients(grads, bert_grads)


def test_the_encoder_is_berts(minilm_path, tokenizer, features):
    """`SeqBertModel` on a static batch of a config's collator: `last_hidden_state` (B, L, H) and `pooler_output`
    (B, H), one row per example, BertModel's on the real tokens."""
    bert = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    static = StaticShapeCollator(tokenizer, model.config, max_length=MAX_LENGTH)(features)
    with torch.no_grad():
        output = model(**static)
        bert_output = bert(**{k: v for k, v in static.items() if k in BERT_KEYS})
    check_on_real_tokens(output.last_hidden_state, bert_output.last_hidden_state, static["attention_mask"])
    torch.testing.assert_close(output.pooler_output, bert_output.pooler_output, atol=LOGITS_TOLERANCE, rtol=0)


def test_the_collator_leaves_a_model_without_a_problem_type_as_it_was(tokenizer, features):
    """The collator reads the config (its checks follow the problem type the loss would infer) and writes nothing:
    the model infers the problem type at its first loss, as BERT does."""
    model = _pair(seqbert.SeqBertForSequenceClassification, tiny_bert_vocab_config(num_labels=3))
    before = model.config.to_dict()
    batch = StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH)([{**f, "label": 1} for f in features])
    assert model.config.to_dict() == before and model.config.problem_type is None
    model(**batch)
    assert model.config.problem_type == "single_label_classification"


def test_a_static_batch_reads_the_host_once_eagerly_and_not_at_all_unvalidated(tokenizer, features):
    """Eagerly, the forward and backward of a static batch read the host once (the layout validated with the input
    checks, `StaticLayoutMatches`); with `validate_static_layout=False` they never call `read_on_host`, as compiled."""
    model = _pair(seqbert.SeqBertForSequenceClassification, tiny_bert_vocab_config(num_labels=2))
    batch = StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH)([{**f, "label": 1} for f in features])
    for validate, reads in ((True, 1), (False, 0)):
        with mock.patch.object(attention_backends, "read_on_host", wraps=attention_backends.read_on_host) as read:
            with (
                mock.patch.object(input_checks, "read_on_host", read),
                mock.patch.object(decoder_checks, "read_on_host", read),
            ):
                model(**batch, validate_static_layout=validate).loss.backward()
        assert read.call_count == reads
        if validate:
            checks = read.call_args.args[0]
            assert any(isinstance(check, input_checks.StaticLayoutMatches) for check in checks)


# ----------------------------------------------------------------------------------------------------------------------
# The ladder over an epoch of the main job's data
# ----------------------------------------------------------------------------------------------------------------------

BATCH = 32
MAIN_JOB_LENGTH = 128


@pytest.fixture(scope="module")
def main_job_epoch(tokenizer) -> list[list[dict]]:
    """The main job's training data (`run_classification.py`'s defaults: 2,000 Rotten Tomatoes snippets, truncated to
    128 tokens) in batches of 32, in file order."""
    train = load_rotten_tomatoes()["train"]
    encoded = tokenizer(list(train["text"]), truncation=True, max_length=MAIN_JOB_LENGTH)
    examples = [
        {"input_ids": ids, "token_type_ids": types, "label": label}
        for ids, types, label in zip(encoded["input_ids"], encoded["token_type_ids"], train["label"], strict=True)
    ]
    return [examples[start : start + BATCH] for start in range(0, len(examples), BATCH)]


def _shape(batch: dict) -> tuple[int, int]:
    """A static batch's bucket: (T, S)."""
    return batch["indices"].numel(), batch["cu_seqlens"].numel() - 1


def _shapes(batch: dict) -> tuple[int, ...]:
    """Every size a static batch's graph depends on: (T, S, B, L)."""
    return (*_shape(batch), *batch["input_ids"].shape)


def test_the_ladder_grows_geometrically():
    assert token_ladder(1000) == [64, 128, 192, 256, 320, 448, 576, 768, 960, 1216]
    with pytest.raises(ValueError, match=r"growth \(1.0\) must be > 1"):
        token_ladder(1000, growth=1.0)


def test_an_epoch_takes_at_most_the_ladders_shapes(tokenizer, main_job_epoch):
    collator = StaticShapeCollator(
        tokenizer, tiny_bert_vocab_config(num_labels=2), max_length=MAIN_JOB_LENGTH, batch_size=BATCH
    )
    ladder = {(bucket.tokens, bucket.sequences) for bucket in collator.ladder(BATCH)}
    batches = [collator(batch) for batch in main_job_epoch]
    shapes = [_shape(batch) for batch in batches]
    assert set(shapes) <= ladder
    # The epoch's 63 batches (the last of 16 snippets) visit a handful of buckets: about 860 tokens a batch.
    assert len(set(shapes)) <= 5, sorted(set(shapes))
    assert {batch["input_ids"].shape for batch in batches} == {(BATCH, 128), (16, 128)}
    padding = sum(t for t, _ in shapes) / sum(len(e["input_ids"]) for batch in main_job_epoch for e in batch) - 1
    assert padding < 0.25


def check_compiled_shapes(batches: list[dict], ladder: list[Bucket], step, backend: RecordingBackend) -> dict[str, int]:
    """Runs `step` (compiled with `backend`) over `batches` and returns dynamo's counters: raises `AssertionError`
    where a batch's shape is not a bucket of `ladder` (it would reach a compiled graph of its own), where the step
    compiled more than once per distinct shape (a guard on a value that changes from batch to batch would recompile),
    or where a captured graph reads the host."""
    allowed = {(bucket.tokens, bucket.sequences) for bucket in ladder}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    backend.graphs.clear()
    for batch in batches:
        if _shape(batch) not in allowed:
            raise AssertionError(
                f"a batch of shape {_shape(batch)} reached the compiled step; the ladder has {sorted(allowed)}"
            )
        step(batch)
    first = dict(torch._dynamo.utils.counters["stats"])
    shapes = {_shapes(batch) for batch in batches}
    if first["unique_graphs"] > len(shapes):
        raise AssertionError(f"{first['unique_graphs']} graphs compiled for {len(shapes)} shapes")
    reads = host_reads(backend.graphs)
    if reads:
        raise AssertionError(f"the captured step reads the host: {reads}")
    return first


@pytest.fixture(scope="module")
def compiled_epoch(tokenizer, main_job_epoch):
    """The epoch through the collator, and a tiny sequence classifier (one head: the CPU's attention layout is the
    step's cost) whose training step (forward, loss, backward) is compiled with `fullgraph=True, dynamic=False`
    (AOTAutograd traces the backward; `aot_eager` runs the traced graphs without generating code). Its problem type
    is set, as the route's recipe sets it: a model that infers it at its first loss compiles once more."""
    config = tiny_bert_vocab_config(num_labels=2, num_attention_heads=1, problem_type="single_label_classification")
    model = _pair(seqbert.SeqBertForSequenceClassification, config)
    collator = StaticShapeCollator(tokenizer, model, max_length=MAIN_JOB_LENGTH, batch_size=BATCH)
    batches = [collator(batch) for batch in main_job_epoch]
    backend = RecordingBackend()
    forward = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)

    def step(batch):
        loss = forward(**batch).loss
        loss.backward()
        return loss

    return batches, collator.ladder(BATCH), step, backend


def test_a_compiled_training_step_compiles_once_per_shape(compiled_epoch):
    batches, ladder, step, backend = compiled_epoch
    counters = check_compiled_shapes(batches, ladder, step, backend)
    assert counters["unique_graphs"] == len({_shapes(b) for b in batches}) >= 3
    assert not torch._dynamo.utils.counters["graph_break"]


def test_a_shape_outside_the_ladder_reaching_the_graph_fails(compiled_epoch):
    """Planted: a static batch one filler token longer than its bucket (a collator that rounded wrongly)."""
    batches, ladder, step, backend = compiled_epoch
    wrong = dict(batches[0])
    wrong["indices"] = torch.cat([wrong["indices"], wrong["indices"][-1:]])
    with pytest.raises(AssertionError, match="reached the compiled step"):
        check_compiled_shapes([batches[0], wrong], ladder, step, backend)


def test_a_host_read_in_the_step_fails(compiled_epoch):
    """Planted: the forward reads `max_seqlen` from the device (`.item()`, as the plain path's one read does) instead
    of taking the batch's bound. Captured into the graph it would be a sync on a GPU (and no CUDA graph): the check
    finds it; where its value sets a shape, dynamo refuses the data-dependent shape in a full graph. The CUDA dry run
    counts the same read as a host sync."""
    batches, ladder, step, backend = compiled_epoch
    original = attention_backends.attention_layout

    def reading(unpadded, **kwargs):
        return original(replace(unpadded, max_seqlen=int(unpadded.cu_seqlens.diff().max().item())), **kwargs)

    with mock.patch.object(attention_backends, "attention_layout", reading):
        with pytest.raises((AssertionError, torch._dynamo.exc.UserError), match="reads the host|data-dependent"):
            check_compiled_shapes(batches[:1], ladder, step, backend)

    def reading_aside(unpadded, **kwargs):
        bound = unpadded.max_seqlen + 0 * int(unpadded.cu_seqlens[-1].item())
        return original(replace(unpadded, max_seqlen=bound), **kwargs)

    with mock.patch.object(attention_backends, "attention_layout", reading_aside):
        with pytest.raises(AssertionError, match=r"the captured step reads the host: \['item'\]"):
            check_compiled_shapes(batches[:1], ladder, step, backend)


def stand_in_flash_attention(query, key, value, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, debug, scale=None):
    """What `aten._flash_attention_forward` computes (no dropout), from the same arguments, with torch's CPU sdpa on
    a block-diagonal mask built from `cu_q` on the device: the CUDA branch's stand-in on a CPU. `max_q` / `max_k` must
    be ints, as the kernel takes them (a traced value would make them symbolic)."""
    assert type(max_q) is int and type(max_k) is int and max_q == max_k and not dropout_p
    tokens = torch.arange(query.shape[0])
    sequence = torch.searchsorted(cu_q[1:].long(), tokens, right=True)
    mask = sequence[:, None] == sequence[None, :]  # (T, T)
    q, k, v = (x.transpose(0, 1)[None] for x in (query, key, value))  # (1, N, T, D)
    output = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return (output[0].transpose(0, 1),)  # (T, N, D)


def test_the_cuda_branch_compiles_in_one_graph_per_shape(compiled_epoch, tokenizer, features):
    """The GPU path (variable-length attention on `cu_seqlens`, no attention layout), forced on the CPU with a stand-in
    for the flash kernel: compiled with `fullgraph=True, dynamic=False`, a training step compiles once per shape and
    its captured graphs read nothing on the host (over two buckets of the epoch); its logits are the padded batch's."""
    batches, ladder, _, _ = compiled_epoch
    first_of_each = {_shape(batch): batch for batch in reversed(batches)}
    batches = list(first_of_each.values())[:2]
    model = _pair(
        seqbert.SeqBertForSequenceClassification,
        tiny_bert_vocab_config(num_labels=2, problem_type="single_label_classification"),
    )
    backend = RecordingBackend()
    forward = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)

    def step(batch):
        forward(**batch).loss.backward()

    with (
        mock.patch.object(attention_backends, "varlen_attention_applies", lambda *args: True),
        mock.patch.object(seqbert.modeling_seqbert, "varlen_attention_fits", lambda *args: True),
        mock.patch.object(attention_backends, "flash_attention_forward", stand_in_flash_attention),
    ):
        counters = check_compiled_shapes(batches, ladder, step, backend)
        assert counters["unique_graphs"] == len({_shapes(b) for b in batches})
        examples = [{**f, "label": 1} for f in features]
        static = StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH)(examples)
        with torch.no_grad():
            logits = forward(**static).logits
    with torch.no_grad():
        plain = model(**DataCollatorWithPadding(tokenizer)(examples)).logits
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------------------------------------
# Beyond the ladder, and bad input
# ----------------------------------------------------------------------------------------------------------------------


def test_a_batch_beyond_the_ladder_runs_eagerly_with_one_warning(tokenizer, features):
    """Snippets longer than `max_length`: padded as usual, marked `static_layout=False`, one warning for two such
    batches; a compiled model runs them outside its graph (no graph holds an op), with the eager model's outputs."""
    model = _pair(seqbert.SeqBertForSequenceClassification, tiny_bert_vocab_config(num_labels=2)).eval()
    examples = [{**f, "label": 1} for f in features]
    collator = StaticShapeCollator(tokenizer, model, max_length=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = [collator(examples[:6]), collator(examples[6:])]
    assert [str(w.message).count("longer than max_length (16)") for w in caught] == [1]
    assert collator.beyond_ladder == 2 and all(b["static_layout"] is False and "attention_mask" in b for b in batches)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    with torch.no_grad():
        for batch in batches:
            torch.testing.assert_close(compiled(**batch).logits, model(**batch).logits, atol=0, rtol=0)
    assert counter.op_count == 0


def test_examples_padded_up_to_max_length_are_taken_as_they_are(tokenizer, features):
    """Examples tokenized with `padding="max_length"` (as run_qa.py does) give the batch of the unpadded ones."""
    model = _pair(seqbert.SeqBertForSequenceClassification, tiny_bert_vocab_config(num_labels=2))
    collator = StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH)
    texts = [tokenizer.decode(f["input_ids"][1:-1]) for f in features[:4]]
    padded = [dict(tokenizer(t, padding="max_length", max_length=MAX_LENGTH)) | {"label": 0} for t in texts]
    unpadded = [dict(tokenizer(t)) | {"label": 0} for t in texts]
    a, b = collator(padded), collator(unpadded)
    assert a.keys() == b.keys()
    for key, value in a.items():
        assert torch.equal(value, b[key]) if torch.is_tensor(value) else value == b[key], key


def test_the_collator_raises_what_the_forward_raises(tokenizer, features):
    model = _pair(seqbert.SeqBertForSequenceClassification, tiny_bert_vocab_config(num_labels=2))
    collator = StaticShapeCollator(tokenizer, model, max_length=MAX_LENGTH)
    with pytest.raises(ValueError, match=r"labels holds 7 at index \(1,\); allowed: \[0, num_labels=2\) or -100"):
        collator([{**features[0], "label": 0}, {**features[1], "label": 7}])
    with pytest.raises(ValueError, match=r"input_ids holds 40000 at index \(0, 1\); allowed: \[0, vocab_size=30522\)"):
        collator([{"input_ids": [101, 40000, 102], "token_type_ids": [0, 0, 0], "label": 0}])
    with pytest.raises(ValueError, match="an example without tokens"):
        collator([{"input_ids": [0, 0], "attention_mask": [0, 0], "label": 0}])
    with pytest.raises(ValueError, match="empty batch"):
        collator([])
    with pytest.raises(TypeError, match="must be a SeqBERT model"):
        StaticShapeCollator(tokenizer, torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"max_length \(512\) exceeds max_position_embeddings \(128\)"):
        StaticShapeCollator(tokenizer, model, max_length=512)


def test_the_forward_refuses_an_incomplete_static_batch(tokenizer, features):
    model = _pair(seqbert.SeqBertModel, tiny_bert_vocab_config())
    batch = StaticShapeCollator(tokenizer, model.config, max_length=MAX_LENGTH)(features)
    with pytest.raises(ValueError, match="static_layout=True needs indices, cu_seqlens and max_seqlen.*max_seqlen mis"):
        model(**{k: v for k, v in batch.items() if k != "max_seqlen"})
    with pytest.raises(TypeError, match="cu_seqlens must be int32"):
        model(**(batch | {"cu_seqlens": batch["cu_seqlens"].long()}))
    with pytest.raises(TypeError, match="indices must be int64"):
        model(**(batch | {"indices": batch["indices"].int()}))
    with pytest.raises(TypeError, match="max_seqlen must be an int"):
        model(**(batch | {"max_seqlen": torch.tensor(64)}))
    mlm = _pair(seqbert.SeqBertForMaskedLM, tiny_bert_vocab_config(sparse_prediction=True))
    labels = batch["input_ids"].masked_fill(batch["input_ids"] != 101, -100)
    with pytest.raises(ValueError, match="needs max_predictions"):
        mlm(**batch, labels=labels)


def test_buckets_hold_their_fill(tokenizer):
    """Every bucket has room for the filler sequences its largest fill needs, and the chosen bucket is the smallest
    that holds the batch."""
    collator = StaticShapeCollator(tokenizer, tiny_bert_vocab_config(), max_length=32, batch_size=4)
    ladder = collator.ladder(4)
    previous = 0
    for bucket in ladder:
        assert bucket.sequences >= 4 + math.ceil((bucket.tokens - previous) / 32)
        previous = bucket.tokens
    assert collator.bucket([32, 32, 32, 32]) == ladder[1]  # 128 tokens
    assert collator.bucket([32, 32, 32, 33]) is None
    assert collator.bucket([1]).tokens == 64
