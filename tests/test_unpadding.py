"""The unpadded encoder (sdpa's fast path: only real tokens go through embeddings, projections, feed-forward and
LayerNorms) against the padded eager reference, on random tiny configs and random padding (hypothesis), on real
weights and text, in training, and under torch.compile."""

import pytest
import torch
from conftest import sdpa_and_eager_pair, unpadded_layout
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BertModel

import seqbert
from seqbert.modeling_seqbert import UnpaddedBatch


TOLERANCE = 1e-5


@st.composite
def padded_batches(draw):
    config = seqbert.SeqBertConfig(
        vocab_size=50,
        hidden_size=draw(st.sampled_from([8, 16, 24])),
        num_hidden_layers=draw(st.integers(1, 3)),
        num_attention_heads=draw(st.sampled_from([1, 2, 4])),
        intermediate_size=draw(st.sampled_from([8, 32])),
        max_position_embeddings=32,
        type_vocab_size=draw(st.integers(0, 2)),
        norm_placement=draw(st.sampled_from(["pre", "post"])),
        position_embedding_type=draw(st.sampled_from(["learned", "sinusoidal"])),
    )
    lengths = draw(st.lists(st.integers(1, 16), min_size=1, max_size=5))
    seq_len = max(lengths) + draw(st.integers(0, 3))
    left = draw(st.booleans())
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        if left:
            mask[row, seq_len - length :] = 1
        else:
            mask[row, :length] = 1
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    input_ids = torch.randint(1, 50, mask.shape, generator=generator)
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    if config.type_vocab_size > 0:
        inputs["token_type_ids"] = torch.randint(0, config.type_vocab_size, mask.shape, generator=generator)
    return config, inputs


@settings(max_examples=40, deadline=None)
@given(padded_batches())
def test_unpadded_equals_padded_reference_on_real_tokens(batch):
    config, inputs = batch
    fast, reference = sdpa_and_eager_pair(config)
    mask = inputs["attention_mask"].bool()
    assert unpadded_layout(fast, inputs) is not None or bool(mask.all())
    with torch.no_grad():
        out, ref = fast(**inputs), reference(**inputs)
    assert (out.last_hidden_state - ref.last_hidden_state)[mask].abs().max().item() <= TOLERANCE
    assert torch.all(out.last_hidden_state[~mask] == 0)  # padding rows are zeros, never NaN
    if bool(mask[:, 0].all()):  # the pooler reads position 0; BERT's output there is garbage for left padding
        assert (out.pooler_output - ref.pooler_output).abs().max().item() <= TOLERANCE


def test_unpadded_batch_round_trip():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 1, 1]])
    unpadded = UnpaddedBatch.from_mask(mask)
    values = torch.arange(9.0).view(3, 3, 1)
    assert unpadded.unpad(values).flatten().tolist() == [0.0, 1.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert torch.equal(unpadded.pad(unpadded.unpad(values)), values * mask.unsqueeze(-1))


def test_training_step_unpadded_matches_padded(tiny_batch_config):
    """Loss and every gradient of a classifier agree between the fast and the reference path."""
    config, inputs = tiny_batch_config
    fast, reference = sdpa_and_eager_pair(config, seqbert.SeqBertForSequenceClassification)
    labels = torch.tensor([0, 1, 1])
    losses = []
    for model in (fast, reference):
        model.train()
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) <= TOLERANCE
    for (name, p), q in zip(fast.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max().item() <= TOLERANCE, name


@pytest.fixture
def tiny_batch_config():
    config = seqbert.SeqBertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1] * 12, [1] * 5 + [0] * 7, [1] * 9 + [0] * 3])
    return config, {"input_ids": torch.randint(1, 60, (3, 12), generator=generator), "attention_mask": mask}


def test_real_weights_and_text_match_bert(minilm_path, tokenizer, rt_texts):
    """MiniLM on 32 real snippets, dynamically padded: the unpadded path equals transformers' BertModel."""
    reference = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    batch = tokenizer(rt_texts[:32], padding=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    assert 0.2 < 1 - mask.float().mean().item()  # a real share of padding, so the fast path matters
    assert unpadded_layout(model, batch) is not None
    with torch.no_grad():
        out, ref = model(**batch), reference(**batch)
    assert (out.last_hidden_state - ref.last_hidden_state)[mask].abs().max().item() <= TOLERANCE
    assert (out.pooler_output - ref.pooler_output).abs().max().item() <= TOLERANCE


def test_hidden_states_requests_take_the_padded_path(tiny_batch_config):
    config, inputs = tiny_batch_config
    fast, reference = sdpa_and_eager_pair(config)
    assert unpadded_layout(fast, inputs, output_hidden_states=True) is None
    with torch.no_grad():
        out = fast(**inputs, output_hidden_states=True)
        ref = reference(**inputs, output_hidden_states=True)
    mask = inputs["attention_mask"].bool()
    for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert (a - b)[mask].abs().max().item() <= TOLERANCE


def test_torch_compile_matches_eager(tiny_batch_config):
    config, inputs = tiny_batch_config
    fast, _ = sdpa_and_eager_pair(config)
    compiled = torch.compile(fast)
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected = fast(**inputs).last_hidden_state
        got = compiled(**inputs).last_hidden_state
        dense = compiled(input_ids=inputs["input_ids"]).last_hidden_state  # the padded path compiles too
    assert (got - expected)[mask].abs().max().item() <= TOLERANCE
    assert (dense - fast(input_ids=inputs["input_ids"]).last_hidden_state).abs().max().item() <= TOLERANCE
