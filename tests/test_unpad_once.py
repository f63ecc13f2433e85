"""The unpad-once bookkeeping (`UnpaddedBatch.from_mask`: one host read for the layout and the input checks) and the
variable-length attention path, on CPU.

- The layout (`cu_seqlens`, `max_seqlen`, which sequence each token is in, packing, the per-sequence attention layout)
  against a plain Python walk over the mask, on random masks with holes, left padding, fully padded rows and packed
  rows (hypothesis, derandomized in CI).
- The variable-length path wired through the model: torch's `varlen_attn` runs only on CUDA, so here it is replaced by
  a test double that computes the same thing another way (one block-diagonal sdpa over all T tokens, sequences read
  from `cu_seqlens`). The model must then give the padded eager reference's numbers, outputs and gradients, for
  padded batches (token types, positions), packed rows and fully padded rows. The double also checks the arguments
  the kernel receives (int32 `cu_seqlens`, the true `max_seqlen`, (T, N, D) contiguous heads).
- The unpadded forward under `torch._dynamo.explain`: at most one graph break, which is the same property as at
  most one host sync per forward (every host read breaks a graph), checked without a GPU.
"""

import pytest
import torch
from conftest import sdpa_and_eager_pair, unpadded_layout
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DataCollatorWithFlattening, DataCollatorWithPadding

import seqbert
from seqbert import attention_backends, input_checks
from seqbert import modeling_seqbert as modeling
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


class VarlenDouble:
    """Stands in for `torch.nn.attention.varlen.varlen_attn` on CPU: softmax(Q Kᵀ / sqrt(D)) V within each sequence,
    as one sdpa over all T tokens with a block-diagonal mask built from `cu_seqlens` (independent of the attention
    layout the fallback uses). Records the calls and checks their arguments."""

    def __init__(self, read_arguments: bool = True):
        self.calls, self.read_arguments = 0, read_arguments  # reading them on the host would break a traced graph

    def __call__(self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        assert query.dim() == 3 and query.shape == key.shape == value.shape and query.stride(-1) == 1
        assert cu_seq_q.dtype == torch.int32 and cu_seq_k is cu_seq_q and max_q == max_k
        if self.read_arguments:
            assert int(cu_seq_q[-1]) == query.shape[0] and max_q == int(cu_seq_q.diff().max())
        self.calls += 1
        tokens = torch.arange(query.shape[0])
        sequence = torch.searchsorted(cu_seq_q[1:].long(), tokens, right=True)  # (T,)
        allowed = sequence[:, None] == sequence[None, :]  # (T, T)
        heads = [x.transpose(0, 1)[None] for x in (query, key, value)]  # (1, N, T, D)
        return torch.nn.functional.scaled_dot_product_attention(*heads, attn_mask=allowed)[0].transpose(0, 1)


@pytest.fixture
def varlen(monkeypatch) -> VarlenDouble:
    """The variable-length path taken on CPU, through the double."""
    double = VarlenDouble()
    monkeypatch.setattr(attention_backends, "varlen_attn", double)
    monkeypatch.setattr(modeling, "varlen_attention_applies", lambda *args: True)
    return double


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


def test_varlen_path_trains_like_the_reference(varlen):
    config = seqbert.SeqBertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    fast, reference = sdpa_and_eager_pair(config, seqbert.SeqBertForSequenceClassification)
    mask = torch.tensor([[1] * 7 + [0] * 3, [1] * 10, [1] * 2 + [0] * 8])
    inputs = {"input_ids": torch.randint(1, 60, mask.shape, generator=torch.Generator().manual_seed(1))}
    for model in (fast, reference):
        model.train()
        model(**inputs, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss.backward()
    assert varlen.calls == config.num_hidden_layers  # the sdpa model only
    for (name, p), q in zip(fast.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max().item() <= TOLERANCE, name


def test_varlen_applies_only_where_the_kernel_runs(monkeypatch):
    applies = attention_backends.varlen_attention_applies
    cuda = torch.device("cuda", 0)
    for device, dtype, head_dim, dropout in [
        (torch.device("cpu"), torch.bfloat16, 64, 0.0),  # no CPU kernel
        (cuda, torch.float32, 64, 0.0),  # flash takes fp16 / bf16 only
        (cuda, torch.bfloat16, 64, 0.1),  # varlen_attn has no dropout
        (cuda, torch.bfloat16, 12, 0.0),  # head size not a multiple of 8
        (cuda, torch.bfloat16, 512, 0.0),  # beyond flash's 256
    ]:
        assert not applies(device, dtype, head_dim, dropout), (device, dtype, head_dim, dropout)
    monkeypatch.setattr(attention_backends, "_runs_flash_attention", lambda index: True)  # an Ampere-or-newer GPU
    assert applies(cuda, torch.bfloat16, 64, 0.0) and applies(cuda, torch.float16, 32, 0.0)
    with sdpa_kernel([SDPBackend.MATH]):  # flash switched off by the user: sdpa on the attention layout instead
        assert not applies(cuda, torch.bfloat16, 64, 0.0)
    monkeypatch.setattr(attention_backends, "_runs_flash_attention", lambda index: False)  # a Turing or Volta GPU
    assert not applies(cuda, torch.bfloat16, 64, 0.0)


# ----------------------------------------------------------------------------------------------------------------------
# One host read per forward, checked as one graph break
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["attention layout", "varlen"])
def test_unpadded_forward_has_at_most_one_graph_break(monkeypatch, path):
    if path == "varlen":
        monkeypatch.setattr(attention_backends, "varlen_attn", VarlenDouble(read_arguments=False))
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
            layout = layout.__class__(**{**layout.__dict__, "varlen": True})
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
