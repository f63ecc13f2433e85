"""`seqbert.optimize_for_cpu_inference`: oneDNN packed linear layers with fused post-ops (fp32 and int8) and
length-grouped attention, checked against transformers' BertModel on the real MiniLM weights and real text."""

import pytest
import torch
from transformers import BertForSequenceClassification, BertModel

import seqbert
from seqbert.cpu_inference import LengthGroups, onednn_available


pytestmark = pytest.mark.skipif(not onednn_available(), reason="needs torch's oneDNN operators on an x86 AVX2 CPU")


def _mean_pooled(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask[..., None].float()
    return (states * weights).sum(1) / weights.sum(1)


@torch.inference_mode()
def test_fp32_optimized_model_computes_bert_on_real_text(minilm_path, tokenizer, rt_texts):
    bert = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    fast = seqbert.optimize_for_cpu_inference(model)
    assert type(model.encoder.layers[0]).__name__ == "SeqBertPostNormLayer"  # the original is left as it was
    assert type(fast.encoder.layers[0]).__name__ == "OneDnnSeqBertPostNormLayer"
    # Two batches of other sizes and lengths: nothing is prepared per shape.
    for texts in (rt_texts[:32], rt_texts[40:47]):
        batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
        real = batch["attention_mask"].bool()
        assert not real.all()
        expected = bert(**batch).last_hidden_state
        got = fast(**batch).last_hidden_state
        assert 0 < (got - expected)[real].abs().max() <= 1e-5
        assert (got[~real] == 0).all()
        assert (model(**batch).last_hidden_state - expected)[real].abs().max() == 0  # the default stays exact


@torch.inference_mode()
def test_fp32_optimized_classifier_and_unpadded_batch(minilm_path, tokenizer, rt_texts, tmp_path):
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(minilm_path, num_labels=2).save_pretrained(tmp_path / "cls")
    bert = BertForSequenceClassification.from_pretrained(tmp_path / "cls").eval()
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(tmp_path / "cls").eval()
    fast = seqbert.optimize_for_cpu_inference(model)
    for batch in (
        dict(tokenizer(rt_texts[:16], padding=True, return_tensors="pt")),
        dict(tokenizer(rt_texts[:1], return_tensors="pt")),  # no padding: the padded layout, fused layers alike
    ):
        assert (fast(**batch).logits - bert(**batch).logits).abs().max() <= 1e-5


@torch.inference_mode()
def test_int8_optimized_model_keeps_sentence_embeddings(minilm_path, tokenizer, rt_texts):
    batch = dict(tokenizer(rt_texts[:64], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    bert = BertModel.from_pretrained(minilm_path).eval()
    int8 = seqbert.optimize_for_cpu_inference(seqbert.SeqBertModel.from_bert_pretrained(minilm_path), int8=True)
    expected, got = bert(**batch).last_hidden_state, int8(**batch).last_hidden_state
    delta = (got - expected)[real].abs()
    assert 0 < delta.mean() < 0.2  # int8 moves hidden states, as int8 does
    cosine = torch.nn.functional.cosine_similarity(
        _mean_pooled(expected, batch["attention_mask"]), _mean_pooled(got, batch["attention_mask"])
    )
    assert cosine.min() > 0.95


def test_recorded_outputs_and_gradients(minilm_path, tokenizer, rt_texts):
    batch = dict(tokenizer(rt_texts[:4], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    fast = seqbert.optimize_for_cpu_inference(model)
    assert not any(p.requires_grad for p in fast.parameters())
    with torch.no_grad():
        outputs = fast(**batch, output_hidden_states=True)
        reference = model(**batch, output_hidden_states=True)
    assert len(outputs.hidden_states) == len(reference.hidden_states) == 7
    for ours, theirs in zip(outputs.hidden_states, reference.hidden_states, strict=True):
        assert (ours - theirs)[real].abs().max() <= 1e-5
    # Attention weights are recorded by a hook on the attention module: the layer's own forward runs there.
    eager = seqbert.SeqBertModel.from_bert_pretrained(minilm_path, attn_implementation="eager").eval()
    with torch.no_grad():
        weights = seqbert.optimize_for_cpu_inference(eager)(**batch, output_attentions=True).attentions
        expected = eager(**batch, output_attentions=True).attentions
    assert len(weights) == 6 and all(torch.equal(a, b) for a, b in zip(weights, expected, strict=True))


def test_length_groups_cover_every_token_once(tokenizer, rt_texts):
    from seqbert.modeling_seqbert import UnpaddedBatch

    mask = tokenizer(rt_texts[:10], padding=True, return_tensors="pt")["attention_mask"]
    groups = LengthGroups(UnpaddedBatch.from_mask(mask))
    assert groups.rows.unique().numel() == int(mask.sum())
    assert sum(size * width for _, size, width, _ in groups.groups) == groups.total_rows
    assert groups.total_rows < mask.shape[0] * mask.shape[1]  # less padding than the batch


def test_bad_arguments_get_clear_errors(minilm_path):
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path)
    with pytest.raises(TypeError, match="model must be a SeqBERT model"):
        seqbert.optimize_for_cpu_inference(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="int8 must be True or False, got 'yes'"):
        seqbert.optimize_for_cpu_inference(model, int8="yes")
    with pytest.raises(ValueError, match="float32 model on the CPU"):
        seqbert.optimize_for_cpu_inference(model.to(torch.float64))
