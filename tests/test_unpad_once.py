"""The unpad-once bookkeeping (`UnpaddedBatch.from_mask`: one host read for the layout and the input checks) and the
variable-length attention path, on CPU.

- The layout (`cu_seqlens`, `max_seqlen`, which sequence each token is in, packing, the per-sequence attention layout)
  against a plain Python walk over the mask, on random masks with holes, left padding, fully padded rows and packed
  rows (hypothesis, derandomized in CI).
- The variable-length path wired through the model: torch's flash-attention kernel runs only on CUDA, so here
  `aten._flash_attention_forward` is replaced by a stand-in that computes the same thing another way, dropout
  included (`scripts/checks/count_launches.py`: one masked product over all T tokens, sequences read from
  `cu_seqlens`), and seqbert is put in its CUDA configuration (`cuda_configuration`). The model must then give the
  padded eager reference's numbers, outputs and gradients, for padded batches (token types, positions), packed rows
  and fully padded rows; training draws attention dropout inside the kernel (the module's own probability), redraws
  it under gradient checkpointing, and a projection in another dtype falls back to the per-sequence layout without a
  host read. The stand-in also checks the arguments the kernel receives (int32 `cu_seqlens`, the true `max_seqlen`,
  (T, N, D) contiguous heads). Which torch op is taken (its schema probed at import) and where the kernel applies.
- One host read per forward, checked as at most one graph break under `torch._dynamo.explain` (every host read breaks
  a graph), and per fine-tuning step, counted op by op (`count_launches.LaunchCounter`), with fewer kernel launches
  than transformers' BERT under sdpa for the sequence-classification, token-classification and sparse masked-LM heads,
  and no more host reads than BERT in a `Trainer` step.
"""

import dataclasses
from types import SimpleNamespace
from unittest import mock

import count_launches
import pytest
import torch
from conftest import check_attention_dropout, sdpa_and_eager_pair, unpadded_layout
from count_launches import FlashAttentionDouble, LaunchCounter, cuda_configuration
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
)

import seqbert
from seqbert import attention_backends, input_checks
from seqbert.attention_backends import UnpaddedBatch


TOLERANCE = 1e-5


def _reference_layout(mask: torch.Tensor, sequence_ids: torch.Tensor | None):
    """Walk the (B, L) mask in Python: the flat positions of the real tokens and, per sequence, its tokens (0 .. T-1).
    A sequence starts at a row's first real token and, in packed rows, where the id of two real neighbours differs."""
    positions, sequences, packed = [], [], False
    batch_size, seq_len = mask.shape
    for b in range(batch_size):
        previous_id, row_sequences = None, 0
        for position in range(seq_len):
            if not mask[b, position]:
                continue
            sequence_id = None if sequence_ids is None else int(sequence_ids[b, position])
            if row_sequences == 0 or sequence_id != previous_id:
                sequences.append([])
                row_sequences += 1
            sequences[-1].append(len(positions))
            positions.append(b * seq_len + position)
            previous_id = sequence_id
        packed = packed or row_sequences > 1
    return positions, sequences, packed


@st.composite
def masks(draw):
    batch_size, seq_len = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    cells = st.lists(st.booleans(), min_size=seq_len, max_size=seq_len)
    mask = torch.tensor(draw(st.lists(cells, min_size=batch_size, max_size=batch_size)))
    sequence_ids = None
    if draw(st.booleans()):  # packed rows: ids that restart along a row, as find_packed_sequence_indices numbers
        steps = st.lists(st.integers(0, 1), min_size=seq_len, max_size=seq_len)
        rows = draw(st.lists(steps, min_size=batch_size, max_size=batch_size))
        sequence_ids = torch.tensor(rows).cumsum(-1)
    return mask, sequence_ids


@settings(max_examples=200, deadline=None)
@given(masks())
def test_layout_equals_a_walk_over_the_mask(case):
    mask, sequence_ids = case
    if sequence_ids is None and not mask.any():
        mask[0, 0] = True  # from_mask is not asked for an empty layout without sequences
    positions, sequences, packed = _reference_layout(mask, sequence_ids)
    layout = UnpaddedBatch.from_mask(mask, sequence_ids)
    lengths = [len(s) for s in sequences]
    assert layout.indices.tolist() == positions
    assert layout.cu_seqlens.dtype == torch.int32
    assert layout.cu_seqlens.tolist() == [0] + torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist()
    assert layout.max_seqlen == max(lengths, default=0)
    assert layout.packed == packed and layout.num_tokens == len(positions)
    assert layout.token_sequence.tolist() == [s for s, tokens in enumerate(sequences) for _ in tokens]
    # The attention layout: sequence s in row s from column 0; after its end, its first token again.
    for s, tokens in enumerate(sequences):
        row = layout.attention_sources.view(len(sequences), -1)[s].tolist()
        assert row == tokens + [tokens[0]] * (layout.max_seqlen - len(tokens))
        assert layout.attention_mask[s].tolist() == [k < len(tokens) for k in range(layout.max_seqlen)]
        assert layout.attention_indices[tokens].tolist() == [s * layout.max_seqlen + k for k in range(len(tokens))]


def test_layout_without_attention_layout_builds_it_on_request():
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0], [0, 1, 1, 0]])
    bare = UnpaddedBatch.from_mask(mask, attention_layout=False)
    assert bare.attention_mask is None and bare.attention_sources is None and not bare.varlen
    full = bare.with_attention_layout()
    assert torch.equal(full.attention_sources, UnpaddedBatch.from_mask(mask).attention_sources)
    assert full.cu_seqlens.tolist() == [0, 3, 5] and full.max_seqlen == 3  # the fully padded row has no sequence


def test_the_layout_and_the_input_checks_are_read_together(monkeypatch):
    reads = []
    original = input_checks.read_on_host
    monkeypatch.setattr(attention_backends, "read_on_host", lambda *a: reads.append(a) or original(*a))
    ids = torch.tensor([[5, 7, 0], [5, 99, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    UnpaddedBatch.from_mask(mask, checks=(input_checks.IdsInRange("input_ids", ids, 100, "vocab_size"),))
    assert len(reads) == 1
    with pytest.raises(ValueError, match=r"input_ids holds 99 at index \(1, 1\); allowed: \[0, vocab_size=60\)"):
        UnpaddedBatch.from_mask(mask, checks=(input_checks.IdsInRange("input_ids", ids, 60, "vocab_size"),))


# ----------------------------------------------------------------------------------------------------------------------
# The variable-length path, with a CPU test double of torch's kernel
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def varlen():
    """The variable-length path taken on CPU (fp32 included, for tight tolerances), through the stand-in of torch's
    flash-attention kernel (`count_launches.FlashAttentionDouble`, which checks the arguments the kernel gets)."""
    with cuda_configuration(float32=True) as double:
        yield double


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal"])
def test_varlen_path_gives_the_eager_reference_on_padded_batches(varlen, norm_placement, position_embedding_type):
    config = seqbert.SeqBertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=32,
        norm_placement=norm_placement,
        position_embedding_type=position_embedding_type,
    )
    fast, reference = sdpa_and_eager_pair(config)
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [0] * 9, [0] * 3 + [1] * 6])  # right, fully and left padded
    inputs = {
        "input_ids": torch.randint(1, 60, mask.shape, generator=generator),
        "attention_mask": mask,
        "token_type_ids": torch.randint(0, 2, mask.shape, generator=generator),
    }
    assert unpadded_layout(fast, inputs).varlen
    with torch.no_grad():
        got, expected = fast(**inputs), reference(**inputs)
    real = mask.bool()
    assert varlen.calls == config.num_hidden_layers
    assert (got.last_hidden_state - expected.last_hidden_state)[real].abs().max().item() <= TOLERANCE
    assert torch.all(got.last_hidden_state[~real] == 0)


def test_varlen_path_on_packed_rows_and_real_weights(varlen, minilm_path, tokenizer, rt_texts):
    model = seqbert.SeqBertForTokenClassification.from_bert_pretrained(minilm_path, num_labels=3).eval()
    features = [{"input_ids": tokenizer(text)["input_ids"]} for text in rt_texts[40:52]]
    padded = DataCollatorWithPadding(tokenizer)(features)
    packed = DataCollatorWithFlattening()(features)
    packed.pop("labels")
    with torch.no_grad():
        expected = model(**padded).logits[padded["attention_mask"].bool()]
        got = model(**packed).logits[0]
    assert varlen.calls == 2 * model.config.num_hidden_layers
    assert (got - expected).abs().max().item() <= TOLERANCE


def _tiny_classifier(**overrides):
    config = seqbert.SeqBertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=2,
        **overrides,
    )
    return sdpa_and_eager_pair(config, seqbert.SeqBertForSequenceClassification)


def test_varlen_path_trains_like_the_reference(varlen):
    fast, reference = _tiny_classifier(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    mask = torch.tensor([[1] * 7 + [0] * 3, [1] * 10, [1] * 2 + [0] * 8])
    inputs = {"input_ids": torch.randint(1, 60, mask.shape, generator=torch.Generator().manual_seed(1))}
    for model in (fast, reference):
        model.train()
        model(**inputs, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss.backward()
    assert varlen.calls == fast.config.num_hidden_layers  # the sdpa model only
    for (name, p), q in zip(fast.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max().item() <= TOLERANCE, name


def test_varlen_applies_only_where_the_kernel_runs(monkeypatch):
    applies = attention_backends.varlen_attention_applies
    cuda = torch.device("cuda", 0)
    for device, dtype, head_dim in [
        (torch.device("cpu"), torch.bfloat16, 64),  # no CPU kernel
        (cuda, torch.float32, 64),  # flash takes fp16 / bf16 only
        (cuda, torch.bfloat16, 12),  # head size not a multiple of 8
        (cuda, torch.bfloat16, 512),  # beyond flash's 256
    ]:
        assert not applies(device, dtype, head_dim, 0.0), (device, dtype, head_dim)
    monkeypatch.setattr(attention_backends, "_capability_runs_flash_attention", lambda index: True)  # Ampere or newer
    assert applies(cuda, torch.bfloat16, 64, 0.0) and applies(cuda, torch.float16, 32, 0.1)  # dropout in the kernel
    with sdpa_kernel([SDPBackend.MATH]):  # flash switched off by the user: sdpa on the attention layout instead
        assert not applies(cuda, torch.bfloat16, 64, 0.0)
    monkeypatch.setattr(torch.version, "hip", "6.4")  # a ROCm build: its flash kernels are not tested with seqbert
    assert not applies(cuda, torch.bfloat16, 64, 0.0)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(attention_backends, "flash_attention_forward", None)  # a torch whose op has another schema
    assert applies(cuda, torch.bfloat16, 64, 0.0)  # varlen_attn, without dropout
    assert not applies(cuda, torch.bfloat16, 64, 0.1)
    monkeypatch.setattr(attention_backends, "_capability_runs_flash_attention", lambda index: False)  # Turing, Volta
    assert not applies(cuda, torch.bfloat16, 64, 0.0)


def _schema(arguments, returns=("output",)):
    argument = lambda name, kwarg_only=False, default=False: SimpleNamespace(  # noqa: E731
        name=name, kwarg_only=kwarg_only, has_default_value=lambda: default
    )
    positional = [argument(name) for name in attention_backends.FLASH_ATTENTION_ARGUMENTS]
    keywords = [argument(name, True, default) for name, default in arguments]
    return SimpleNamespace(arguments=positional + keywords, returns=[SimpleNamespace(name=r) for r in returns])


def test_the_flash_attention_op_is_taken_only_with_the_probed_schema():
    assert attention_backends.flash_attention_forward is torch.ops.aten._flash_attention_forward.default
    fits = attention_backends.flash_attention_schema_fits
    assert fits(torch.ops.aten._flash_attention_forward.default._schema)  # this torch's
    assert fits(_schema([("scale", True), ("window_size_left", True)]))
    assert not fits(_schema([("window_size_left", True)]))  # no scale
    assert not fits(_schema([("scale", True), ("block_table", False)]))  # a new argument without default
    assert not fits(_schema([("scale", True)], returns=("softmax_logsumexp", "output")))
    reordered = _schema([("scale", True)])
    reordered.arguments[7], reordered.arguments[8] = reordered.arguments[8], reordered.arguments[7]
    assert not fits(reordered)  # dropout_p no longer the eighth positional argument


def test_training_draws_attention_dropout_inside_the_kernel():
    fast, _ = _tiny_classifier(attention_probs_dropout_prob=0.1)
    mask = torch.tensor([[1] * 7 + [0] * 3, [1] * 10, [1] * 2 + [0] * 8])
    inputs = {"input_ids": torch.randint(1, 60, mask.shape, generator=torch.Generator().manual_seed(1))}
    fast.seqbert.encoder.layers[1].attention.attention_dropout = 0.25  # the module's own value, not the config's
    with cuda_configuration(float32=True) as kernel:
        assert unpadded_layout(fast.train().seqbert, {**inputs, "attention_mask": mask}).varlen  # no attention layout
        fast(**inputs, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss.backward()
        assert kernel.dropouts == [0.1, 0.25]
        fast.eval()(**inputs, attention_mask=mask)
        assert kernel.dropouts[2:] == [0.0, 0.0]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fast.parameters() if p.requires_grad)


def test_dropout_statistics_of_the_variable_length_path():
    """The statistical check that tests/test_cuda.py runs on torch's kernel, here on the CPU stand-in: the dropped
    fraction, the output's expectation and the mask backward sees (`conftest.check_attention_dropout`)."""
    with cuda_configuration(float32=True):
        check_attention_dropout(torch.device("cpu"), torch.float32, 0.1, sequences=16)


def test_without_the_dropout_op_training_lays_tokens_out_per_sequence(monkeypatch):
    fast, _ = _tiny_classifier(attention_probs_dropout_prob=0.1)
    inputs = {"input_ids": torch.randint(1, 60, (2, 6)), "attention_mask": torch.tensor([[1] * 6, [1] * 3 + [0] * 3])}
    with cuda_configuration(float32=True):
        monkeypatch.setattr(attention_backends, "flash_attention_forward", None)
        assert not unpadded_layout(fast.train().seqbert, inputs).varlen
        assert unpadded_layout(fast.eval().seqbert, inputs).varlen  # inference: torch's varlen_attn


def test_a_projection_in_another_dtype_falls_back_to_the_attention_layout_without_a_host_read():
    """A quantized or adapter projection returning another dtype than the others: the kernel is not called with it;
    that layer's attention runs on the per-sequence layout, built once per forward, with no host read."""
    fast, reference = _tiny_classifier(attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    fast.to(torch.bfloat16).seqbert.encoder.layers[0].attention.value.register_forward_hook(
        lambda m, a, out: out.float()
    )
    reference.to(torch.bfloat16)  # without the hook: the eager reference, like BERT's sdpa, takes one dtype only
    mask = torch.tensor([[1] * 7 + [0] * 3, [1] * 10, [1] * 2 + [0] * 8])
    inputs = {"input_ids": torch.randint(1, 60, mask.shape, generator=torch.Generator().manual_seed(1))}
    built = []
    original = UnpaddedBatch.with_attention_layout
    with (
        LaunchCounter() as counted,
        cuda_configuration(counted) as kernel,
        mock.patch.object(UnpaddedBatch, "with_attention_layout", lambda self: built.append(1) or original(self)),
    ):
        got = fast(**inputs, attention_mask=mask).logits
    assert kernel.calls == 1 and len(built) == 1  # layer 0 fell back, layer 1 ran the kernel
    assert counted.total_host_reads == 1, counted.host_reads
    expected = reference(**inputs, attention_mask=mask).logits
    assert (got.float() - expected.float()).abs().max().item() <= 2e-2


# ----------------------------------------------------------------------------------------------------------------------
# One host read per forward, checked as one graph break
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["attention layout", "varlen"])
def test_unpadded_forward_has_at_most_one_graph_break(monkeypatch, path):
    if path == "varlen":
        monkeypatch.setattr(attention_backends, "flash_attention_forward", FlashAttentionDouble(read_arguments=False))
        monkeypatch.setattr(attention_backends, "runs_flash_attention", lambda device: True)
        monkeypatch.setattr(attention_backends, "_HALF_PRECISION", (torch.float32,))
    # The value checks run under dynamo too (they are skipped while compiling), so their reads are counted.
    monkeypatch.setattr(input_checks, "eager_execution", lambda: True)
    config = seqbert.SeqBertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48
    )
    model = seqbert.SeqBertModel(config).eval()
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [0] * 3 + [1] * 6])
    input_ids = torch.randint(1, 60, mask.shape, generator=torch.Generator().manual_seed(0))
    token_type_ids = torch.zeros_like(input_ids)

    def unpadded_forward(input_ids, attention_mask, token_type_ids):
        checks = []
        input_checks.check_encoder_inputs(config, input_ids, attention_mask, token_type_ids, None, None, checks)
        layout = UnpaddedBatch.from_mask(attention_mask, None, tuple(checks), attention_layout=path != "varlen")
        if path == "varlen":
            layout = dataclasses.replace(layout, varlen=True)
        return model._encode_unpadded(layout, input_ids, token_type_ids, None, None, None)[0]

    torch._dynamo.reset()
    with torch.no_grad():
        explanation = torch._dynamo.explain(unpadded_forward)(input_ids, mask, token_type_ids)
        expected = model(input_ids=input_ids, attention_mask=mask, token_type_ids=token_type_ids).last_hidden_state
        got = unpadded_forward(input_ids, mask, token_type_ids)
    torch._dynamo.reset()
    # One place breaks the graph: the host read. (dynamo splits every frame on the call stack there and may report the
    # same break twice, so the places are counted, not the graphs.)
    places = {(reason.user_stack[-1].name, reason.user_stack[-1].lineno) for reason in explanation.break_reasons}
    assert len(places) <= 1 and {name for name, _ in places} <= {"read_on_host"}, explanation.break_reasons
    assert (got - expected).abs().max().item() <= TOLERANCE


# ----------------------------------------------------------------------------------------------------------------------
# A fine-tuning step: one host read, fewer kernel launches than BERT (counted on CPU in the CUDA configuration)
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def snippet_batch(tokenizer, rt_texts):
    """32 real snippets padded to the longest (about half padding), as a fine-tuning batch."""
    batch = dict(tokenizer(rt_texts[:32], padding=True, return_tensors="pt"))
    assert (batch["attention_mask"] == 0).float().mean() > 0.3
    return batch


@pytest.mark.parametrize(
    "head",
    [
        ("sequence classification", seqbert.SeqBertForSequenceClassification, BertForSequenceClassification),
        ("token classification", seqbert.SeqBertForTokenClassification, BertForTokenClassification),
        ("masked LM (seqbert: sparse prediction)", seqbert.SeqBertForMaskedLM, BertForMaskedLM),
    ],
    ids=["sequence", "token", "sparse-mlm"],
)
def test_a_training_step_reads_the_host_once_and_launches_fewer_kernels_than_bert(minilm_path, snippet_batch, head):
    """Forward and backward of a bf16 training step (labels, train mode, BERT's dropout 0.1 in attention and hidden
    states) on the real MiniLM-L6 weights, seqbert in its CUDA configuration, counted op by op
    (`count_launches.LaunchCounter`): one host read, against BERT's one, and fewer launches than transformers' BERT
    under sdpa with the same weights and batch."""
    name, seqbert_class, bert_class = head
    extra = {"num_labels": 2} if "classification" in name else {}
    torch.manual_seed(0)
    bert = bert_class.from_pretrained(minilm_path, dtype=torch.bfloat16, attn_implementation="sdpa", **extra)
    mine = seqbert_class.from_bert_pretrained(minilm_path, dtype=torch.bfloat16, sparse_prediction=True, **extra)
    assert mine.config.attention_probs_dropout_prob == 0.1 == bert.config.attention_probs_dropout_prob
    labels = count_launches.labels_for(name, snippet_batch)
    counted = {}
    for side, model in (("bert", bert), ("seqbert", mine)):
        counted[side] = count_launches.count(model.train(), snippet_batch, labels, side == "seqbert", autocast=False)
    assert counted["seqbert"].total_host_reads == 1, counted["seqbert"].host_reads
    assert counted["bert"].total_host_reads == 1, counted["bert"].host_reads
    assert counted["seqbert"].launches["_flash_attention_forward"] == mine.config.num_hidden_layers  # dropout inside
    assert counted["seqbert"].total_launches < counted["bert"].total_launches, (
        counted["seqbert"].total_launches,
        counted["bert"].total_launches,
    )


def test_gradient_checkpointing_redraws_the_same_attention_dropout():
    """Checkpointed layers run their forward again in backward, under the random state they first ran with: the
    kernel (here its stand-in) draws the same attention dropout, so loss and gradients equal the plain step's."""
    fast, _ = _tiny_classifier(attention_probs_dropout_prob=0.3)
    mask = torch.tensor([[1] * 7 + [0] * 3, [1] * 10, [1] * 2 + [0] * 8])
    inputs = {"input_ids": torch.randint(1, 60, mask.shape, generator=torch.Generator().manual_seed(1))}
    steps = []
    with cuda_configuration(float32=True) as kernel:
        for checkpointing in (False, True):
            fast.activation_checkpointing_enable() if checkpointing else fast.activation_checkpointing_disable()
            fast.zero_grad(set_to_none=True)
            torch.manual_seed(0)
            loss = fast.train()(**inputs, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss
            loss.backward()
            steps.append((loss.item(), [p.grad.clone() for p in fast.parameters()]))
    assert kernel.calls == 2 * 2 + 2  # the checkpointed step runs each layer's attention twice
    assert steps[0][0] == steps[1][0]
    for plain, checkpointed in zip(steps[0][1], steps[1][1], strict=True):
        torch.testing.assert_close(checkpointed, plain, rtol=1e-6, atol=1e-7)


def test_a_trainer_step_reads_the_host_no_more_than_berts(minilm_path, tokenizer, rt_texts, tmp_path):
    """Two `Trainer` steps with labels and BERT's dropout, counted op by op (`count_launches.LaunchCounter`; seqbert
    in its CUDA configuration): Trainer reads the host itself (the loss it logs, the gradient norm), the same for both
    models; seqbert adds no read beyond BERT's."""
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    features = [{**tokenizer(text), "labels": i % 2} for i, text in enumerate(rt_texts[:16])]
    reads = {}
    for name, load in (
        ("bert", lambda: BertForSequenceClassification.from_pretrained(minilm_path, num_labels=2)),
        ("seqbert", lambda: seqbert.SeqBertForSequenceClassification.from_bert_pretrained(minilm_path, num_labels=2)),
    ):
        torch.manual_seed(0)
        arguments = TrainingArguments(
            output_dir=str(tmp_path / name), per_device_train_batch_size=8, max_steps=2, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        )  # fmt: skip
        trainer = Trainer(load(), arguments, train_dataset=features, data_collator=DataCollatorWithPadding(tokenizer))
        with LaunchCounter() as counted, cuda_configuration(counted, float32=True):
            trainer.train()
        reads[name] = counted.total_host_reads
    assert reads["seqbert"] <= reads["bert"], reads
