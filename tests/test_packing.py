"""Packed batches: `DataCollatorWithFlattening` puts several sequences in one row, with `position_ids` restarting at 0
(and, on request, `cu_seq_lens_*`). Every sequence must get what it gets in an ordinary padded batch, on sdpa (the
unpadded path lays each sequence out in a row of its own) and eager (a block-diagonal mask), for the encoder, the
masked LM and token classification; traced code (torch.compile) takes the masked path and agrees."""

import copy

import pytest
import torch
from transformers import DataCollatorWithFlattening, DataCollatorWithPadding

import seqbert
from seqbert.modeling_seqbert import UnpaddedBatch


TOLERANCE = 1e-5
HEADS = [seqbert.SeqBertModel, seqbert.SeqBertForMaskedLM, seqbert.SeqBertForTokenClassification]


@pytest.fixture(scope="module")
def features(tokenizer, rt_texts):
    """12 real snippets of different lengths, tokenized without padding (what a packing collator receives)."""
    return [{"input_ids": tokenizer(text)["input_ids"]} for text in rt_texts[40:52]]


@pytest.fixture(scope="module")
def models(minilm_path):
    """MiniLM in each head (heads seeded), once per attention implementation."""
    loaded = {}
    for model_class in HEADS:
        torch.manual_seed(0)
        model = model_class.from_bert_pretrained(minilm_path, num_labels=5).eval()
        for implementation in ("sdpa", "eager"):
            copy_ = copy.deepcopy(model)
            copy_.set_attn_implementation(implementation)
            loaded[model_class, implementation] = copy_
    return loaded


def _main_output(output):
    return output.last_hidden_state if "last_hidden_state" in output else output.logits


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("model_class", HEADS, ids=lambda c: c.__name__)
def test_packed_rows_give_each_sequence_its_padded_batch_output(
    models, tokenizer, features, model_class, implementation, flash_kwargs
):
    model = models[model_class, implementation]
    padded = DataCollatorWithPadding(tokenizer)(features)
    packed = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)(features)
    packed.pop("labels")  # the collator's next-token labels; these heads take none here
    assert packed["input_ids"].shape[0] == 1 and "attention_mask" not in packed
    with torch.no_grad():
        expected = _main_output(model(**padded))[padded["attention_mask"].bool()]  # (T, ...) real tokens, in order
        got = _main_output(model(**packed))[0]
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOLERANCE * max(1.0, expected.abs().max().item())


def test_packing_is_not_one_long_sequence(models, features):
    """The same row without position_ids is one sequence: the outputs differ, so the boundaries really are used."""
    model = models[seqbert.SeqBertModel, "sdpa"]
    packed = DataCollatorWithFlattening()(features)
    with torch.no_grad():
        separate = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).last_hidden_state
        joined = model(input_ids=packed["input_ids"]).last_hidden_state
    assert (separate - joined).abs().max().item() > 0.1


def test_position_ids_mark_boundaries_in_padded_rows_too(models, tokenizer, features):
    """Two packed rows with padding after them: boundaries come from position_ids, padding from the mask."""
    model = models[seqbert.SeqBertModel, "sdpa"]
    rows = [features[0]["input_ids"] + features[1]["input_ids"], features[2]["input_ids"]]
    positions = [
        list(range(len(features[0]["input_ids"]))) + list(range(len(features[1]["input_ids"]))),
        list(range(len(features[2]["input_ids"]))),
    ]
    width = max(map(len, rows))
    input_ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    position_ids = torch.tensor([row + [0] * (width - len(row)) for row in positions])
    attention_mask = (torch.arange(width)[None, :] < torch.tensor([[len(r)] for r in rows])).long()
    padded = DataCollatorWithPadding(tokenizer)(features[:3])
    with torch.no_grad():
        expected = model(**padded).last_hidden_state[padded["attention_mask"].bool()]
        got = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    assert (got[attention_mask.bool()] - expected).abs().max().item() <= TOLERANCE
    assert torch.all(got[~attention_mask.bool()] == 0)


def test_compiled_packed_forward_matches_eager(models, features):
    """torch.compile cannot take the data-dependent unpadded path: it builds the block-diagonal mask instead."""
    model = models[seqbert.SeqBertForTokenClassification, "sdpa"]
    packed = DataCollatorWithFlattening()(features)
    packed.pop("labels")
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        expected = model(**packed).logits
        got = compiled(**packed).logits
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_unpadded_batch_lays_each_packed_sequence_out_in_its_own_row():
    layout = UnpaddedBatch.from_mask(None, torch.tensor([[0, 0, 1, 1, 1, 2]]))
    values = torch.arange(6.0).view(1, 6, 1)
    laid_out = layout.to_attention_layout(values)
    # After a sequence's end its first token again: masked out as a key, its output never read as a query.
    assert laid_out[..., 0].tolist() == [[0.0, 1.0, 0.0], [2.0, 3.0, 4.0], [5.0, 5.0, 5.0]]
    assert layout.attention_mask.tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    assert torch.equal(layout.from_attention_layout(laid_out), values)


def test_bad_cu_seq_lens_and_flash_without_boundaries_fail_clearly(models, features):
    model = models[seqbert.SeqBertModel, "sdpa"]
    packed = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features)
    total = packed["input_ids"].shape[1]
    with pytest.raises(ValueError, match=rf"cu_seq_lens_q runs from 0 to {total - 1}, but it must run from 0 to"):
        model(input_ids=packed["input_ids"], cu_seq_lens_q=torch.tensor([0, 5, total - 1], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"cu_seq_lens_q must hold integer ids"):
        model(input_ids=packed["input_ids"], cu_seq_lens_q=torch.tensor([0.0, float(total)]))
    flash = copy.deepcopy(model)
    flash.config._attn_implementation = "flash_attention_2"  # only the boundary check runs before attention
    with pytest.raises(ValueError, match=r"flash-attention reads sequence boundaries only from cu_seq_lens_q"):
        flash(input_ids=packed["input_ids"], position_ids=packed["position_ids"])
