"""Numerics on padding and large logits, on the real MiniLM weights and real text: fully padded rows stay finite
(eager, sdpa padded and unpadded; fp32, fp16, bf16), padding never changes real tokens, losses do not overflow.

transformers' BERT under sdpa has returned NaN for fully padded rows in half precision (transformers issue 31035);
these tests pin SeqBERT's behaviour down."""

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers.loss.loss_utils import ForQuestionAnsweringLoss

import seqbert


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Largest |difference| on real tokens between a batch with and without an extra fully padded row, by dtype: the
# padded row changes nothing, but half precision rounds differently once the batch is laid out otherwise.
ROW_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-1}
# The three attention paths: eager (the padded reference), sdpa unpadded (fast path), sdpa padded (taken when hidden
# states are requested).
PATHS = {
    "eager": ("eager", False),
    "sdpa-unpadded": ("sdpa", False),
    "sdpa-padded": ("sdpa", True),
}


@pytest.fixture(scope="module")
def encoder(minilm_path):
    return seqbert.SeqBertForTokenClassification.from_bert_pretrained(minilm_path, num_labels=3).eval()


@pytest.fixture(scope="module")
def bert2bert(minilm_path):
    return seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path).eval()


@pytest.fixture(scope="module")
def snippets(tokenizer, rt_texts):
    return dict(tokenizer(rt_texts[10:13], padding=True, truncation=True, max_length=24, return_tensors="pt"))


def _variant(model, attn_implementation: str, dtype: torch.dtype):
    model = copy.deepcopy(model).to(dtype)
    model.set_attn_implementation(attn_implementation)
    return model


def _with_fully_padded_row(inputs: dict, row: int = 1) -> dict:
    """`inputs` with a row inserted at `row` whose attention mask is all zeros (a batch filler, as uneven batches in
    distributed evaluation produce)."""
    out = {}
    for name, tensor in inputs.items():
        filler = torch.zeros_like(tensor[:1]) if name == "attention_mask" else tensor[:1]
        out[name] = torch.cat([tensor[:row], filler, tensor[row:]])
    return out


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("path", PATHS)
def test_fully_padded_rows_are_finite_and_change_nothing(encoder, snippets, path, dtype_name):
    attn_implementation, hidden_states = PATHS[path]
    dtype = DTYPES[dtype_name]
    model = _variant(encoder, attn_implementation, dtype)
    with torch.no_grad():
        padded = model(**_with_fully_padded_row(snippets), output_hidden_states=hidden_states)
        plain = model(**snippets, output_hidden_states=hidden_states)
    assert torch.isfinite(padded.logits).all()
    if hidden_states:
        assert all(torch.isfinite(h).all() for h in padded.hidden_states)
    real = snippets["attention_mask"].bool()
    kept = torch.cat([padded.logits[:1], padded.logits[2:]])
    assert (kept - plain.logits)[real].abs().max().item() <= ROW_TOLERANCE[dtype]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_fully_padded_source_and_target_rows_are_finite_in_seq2seq(
    bert2bert, tokenizer, attn_implementation, dtype_name
):
    model = _variant(bert2bert, attn_implementation, DTYPES[dtype_name])
    source = tokenizer(["And God said, Let there be light.", "Jesus wept."], padding=True, return_tensors="pt")
    target = tokenizer(["And God said, Let there be light!", "Jesus wept!"], padding=True, return_tensors="pt")
    source_mask = source.attention_mask.clone()
    source_mask[1] = 0  # the second source is all padding
    target_mask = target.attention_mask.clone()
    target_mask[0] = 0  # the first target is all padding
    with torch.no_grad():
        out = model(
            input_ids=source.input_ids,
            attention_mask=source_mask,
            decoder_input_ids=target.input_ids,
            decoder_attention_mask=target_mask,
            output_hidden_states=True,
        )
        generated = model.generate(input_ids=source.input_ids, attention_mask=source_mask, max_new_tokens=5)
    assert torch.isfinite(out.logits).all()
    assert all(torch.isfinite(h).all() for h in (*out.encoder_hidden_states, *out.decoder_hidden_states))
    assert generated.shape[0] == 2


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_pad_id_and_amount_of_padding_do_not_change_real_tokens(encoder, snippets, attn_implementation):
    model = _variant(encoder, attn_implementation, torch.float32)
    real = snippets["attention_mask"].bool()
    with torch.no_grad():
        reference = model(**snippets).logits
        for pad_id, extra in [(0, 0), (1037, 0), (0, 9), (2023, 9), (7, 40)]:
            inputs = {k: torch.nn.functional.pad(v, (0, extra)) for k, v in snippets.items()}
            inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, pad_id)
            logits = model(**inputs).logits[:, : real.shape[1]]
            assert (logits - reference)[real].abs().max().item() <= 1e-5, (pad_id, extra)


def test_left_padding_with_position_ids_equals_right_padding(encoder, snippets):
    """Positions are token indices, as in BERT; left-padded batches give the right-padded outputs once their
    position_ids count real tokens only."""
    real = snippets["attention_mask"].bool()
    lengths = real.sum(1)
    left = {
        k: torch.stack([v[i].roll(int(real.shape[1] - n)) for i, n in enumerate(lengths)]) for k, v in snippets.items()
    }
    position_ids = (left["attention_mask"].cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        right_out = encoder(**snippets).logits
        left_out = encoder(**left, position_ids=position_ids).logits
    for i, n in enumerate(lengths.tolist()):
        assert (left_out[i, real.shape[1] - n :] - right_out[i, :n]).abs().max().item() <= 1e-5


def test_target_padding_does_not_change_real_target_tokens(bert2bert, tokenizer):
    source = tokenizer(["In the beginning God created the heaven and the earth."], return_tensors="pt")
    target = tokenizer(["In the beginning, God created the heavens and the earth."], return_tensors="pt").input_ids
    with torch.no_grad():
        reference = bert2bert(**source, decoder_input_ids=target).logits
        padded = torch.nn.functional.pad(target, (0, 7), value=4242)
        mask = (torch.arange(padded.shape[1]) < target.shape[1]).long()[None]
        logits = bert2bert(**source, decoder_input_ids=padded, decoder_attention_mask=mask).logits
    assert (logits[:, : target.shape[1]] - reference).abs().max().item() <= 1e-5


# --------------------------------------------------------------------------------------------------------------------
# Losses on large logits
# --------------------------------------------------------------------------------------------------------------------


def _scale_(model, linear: torch.nn.Linear, inputs: dict, largest: float = 2e4) -> None:
    """Scale the head's `linear` layer so the largest |logit| on `inputs` is about `largest` (in float32)."""
    with torch.no_grad():
        out = model.eval()(**inputs)
        logits = out.logits if hasattr(out, "logits") else torch.stack([out.start_logits, out.end_logits])
        factor = largest / logits.abs().max().item()
        linear.weight.mul_(factor)
        linear.bias.mul_(factor)


@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
def test_losses_do_not_overflow_on_large_logits(minilm_path, snippets, dtype_name):
    """Logits of 1e4 to 2e4 (squares far beyond fp16's 65504): every loss is finite and matches float64 arithmetic on the
    same logits (the independent reference)."""
    dtype = DTYPES[dtype_name]
    f64 = torch.nn.functional
    batch_size, seq_len = snippets["input_ids"].shape
    torch.manual_seed(0)

    regression = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(minilm_path, num_labels=1)
    _scale_(regression, regression.classifier, snippets, largest=1e4)
    out = regression.eval().to(dtype)(**snippets, labels=torch.zeros(batch_size))
    expected = out.logits.double().squeeze(-1).pow(2).mean()
    assert out.logits.abs().max().item() > 300  # so a half-precision square would overflow
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    assert abs(out.loss.item() - expected.item()) <= 1e-3 * expected.item()

    cases = []
    classifier = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(minilm_path, num_labels=3)
    _scale_(classifier, classifier.classifier, snippets)
    labels = torch.tensor([0, 1, 2])
    cases.append((classifier, dict(labels=labels), lambda out: f64.cross_entropy(out.logits.double(), labels)))

    token = seqbert.SeqBertForTokenClassification.from_bert_pretrained(minilm_path, num_labels=3)
    _scale_(token, token.classifier, snippets)
    token_labels = torch.randint(0, 3, (batch_size, seq_len)).masked_fill(snippets["attention_mask"] == 0, -100)
    cases.append(
        (token, dict(labels=token_labels), lambda out: f64.cross_entropy(out.logits.double().flatten(0, 1), token_labels.flatten()))
    )  # fmt: skip

    qa = seqbert.SeqBertForQuestionAnswering.from_bert_pretrained(minilm_path)
    _scale_(qa, qa.qa_outputs, snippets)
    starts, ends = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])

    def qa_reference(out):
        return (
            f64.cross_entropy(out.start_logits.double(), starts) + f64.cross_entropy(out.end_logits.double(), ends)
        ) / 2

    cases.append((qa, dict(start_positions=starts, end_positions=ends), qa_reference))

    mlm = seqbert.SeqBertForMaskedLM.from_bert_pretrained(minilm_path, tie_word_embeddings=False)
    _scale_(mlm, mlm.lm_head.decoder, snippets)
    mlm_labels = torch.full((batch_size, seq_len), -100)
    mlm_labels[:, 1] = snippets["input_ids"][:, 1]
    cases.append(
        (mlm, dict(labels=mlm_labels), lambda out: f64.cross_entropy(out.logits.double().flatten(0, 1), mlm_labels.flatten()))
    )  # fmt: skip

    for model, labels_kwargs, reference in cases:
        out = model.eval().to(dtype)(**snippets, **labels_kwargs)
        logits = out.logits if hasattr(out, "logits") else out.start_logits
        assert logits.abs().max().item() > 1000, type(model).__name__
        expected = reference(out).item()
        assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss), type(model).__name__
        assert abs(out.loss.item() - expected) <= 1e-3 * max(expected, 1.0), (type(model).__name__, out.loss, expected)


# --------------------------------------------------------------------------------------------------------------------
# Losses when every label is ignored
# --------------------------------------------------------------------------------------------------------------------


def _loss_cases(ids, mask):
    """(head, model class, config overrides, call kwargs with every label ignored, with some labels, reference loss
    of the logits for the labelled call) for every head that takes a cross-entropy."""
    batch, length = ids.shape
    some = ids.masked_fill(torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) < 0.5, -100)
    some[0, 0] = ids[0, 0]  # at least one labelled position
    ignored = torch.full_like(ids, -100)
    classes = torch.tensor([1, -100, 0][:batch])
    ce = F.cross_entropy  # the independent reference: PyTorch's mean over labelled positions
    return [
        ("mlm", seqbert.SeqBertForMaskedLM, {}, dict(labels=ignored), dict(labels=some),
         lambda out: ce(out.logits.flatten(0, 1), some.flatten())),
        ("token", seqbert.SeqBertForTokenClassification, {"num_labels": 3}, dict(labels=ignored),
         dict(labels=some.clamp(max=2).masked_fill(some == -100, -100)),
         lambda out: ce(out.logits.flatten(0, 1), some.clamp(max=2).masked_fill(some == -100, -100).flatten())),
        ("cls", seqbert.SeqBertForSequenceClassification, {"num_labels": 2},
         dict(labels=torch.full((batch,), -100)), dict(labels=classes), lambda out: ce(out.logits, classes)),
        ("choice", seqbert.SeqBertForMultipleChoice, {}, dict(labels=torch.full((batch,), -100)), dict(labels=classes),
         lambda out: ce(out.logits, classes)),
        ("qa", seqbert.SeqBertForQuestionAnswering, {},
         dict(start_positions=torch.full((batch,), length + 3), end_positions=torch.full((batch,), length)),
         dict(start_positions=torch.tensor([2, length + 5, 1][:batch]), end_positions=torch.tensor([4, 3, 9][:batch])),
         lambda out: ForQuestionAnsweringLoss(out.start_logits, out.end_logits, torch.tensor([2, length + 5, 1][:batch]),
                                              torch.tensor([4, 3, 9][:batch]))),
        ("causal", seqbert.SeqBertForCausalLM, {}, dict(labels=ignored[:, :1], input_ids=ids[:, :1],
                                                        attention_mask=mask[:, :1]),
         # Next-token labels padded with -100 at the end, as transformers' ForCausalLMLoss lays them out (5.24).
         dict(labels=some), lambda out: ce(out.logits.flatten(0, 1), F.pad(some[:, 1:], (0, 1), value=-100).flatten())),
        ("seq2seq", seqbert.SeqBertForConditionalGeneration, {"is_encoder_decoder": True, "decoder_start_token_id": 101},
         dict(labels=ignored), dict(labels=some), lambda out: ce(out.logits.flatten(0, 1), some.flatten())),
    ]  # fmt: skip


@pytest.mark.parametrize("head", ["mlm", "token", "cls", "choice", "qa", "causal", "seq2seq"])
def test_a_batch_whose_labels_are_all_ignored_has_loss_zero_and_zero_gradients(minilm_path, snippets, head):
    """Found by the fuzzing: QA positions all beyond the sequence gave a NaN loss (so does BERT: a mean over no
    positions is 0 / 0). Every head now returns 0.0, the sum over no labelled positions, with zero gradients, so such
    a batch cannot poison training (seqbert's choice: see `loss_divisor`); with labels it still equals the mean."""
    ids, mask = snippets["input_ids"], snippets["attention_mask"]
    name, model_class, overrides, all_ignored, labelled, reference = next(
        case for case in _loss_cases(ids, mask) if case[0] == head
    )
    torch.manual_seed(0)
    model = model_class.from_bert_pretrained(minilm_path, **overrides).eval()
    inputs = dict(input_ids=ids, attention_mask=mask)
    if head == "choice":
        inputs = {k: v[:, None].expand(-1, 2, -1) for k, v in inputs.items()}
    call = {**inputs, **all_ignored}
    if head == "choice":
        call.update({k: v[:, None].expand(-1, 2, -1) for k, v in all_ignored.items() if k != "labels"})
    out = model(**call)
    assert out.loss.item() == 0.0
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    # Trainer's num_items_in_batch of 0 (nothing labelled in the accumulated batch) gives 0.0 as well.
    if head in ("mlm", "token", "causal", "seq2seq"):
        assert model(**call, num_items_in_batch=torch.tensor(0)).loss.item() == 0.0
    with torch.no_grad():
        out = model(**inputs, **labelled)
        assert torch.equal(out.loss, reference(out).float())
