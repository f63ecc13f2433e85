"""Parity with transformers' own BERT classes on real weights and real text (fp32, max |delta| on real tokens).

- the packaged MiniLM-L6 BertModel checkpoint (real pretrained weights) on padded Rotten Tomatoes snippets;
- BertForMaskedLM / BertForPreTraining / BertForSequenceClassification / BertForTokenClassification /
  BertForQuestionAnswering with seeded random bert-base-width weights saved to temporary folders, fed real sentence
  pairs (so token_type_ids take both values) with padding;
- bert-base-uncased itself whenever it is in the local Hugging Face cache or at $SEQBERT_BERT_BASE_UNCASED.
"""

import os
import shutil

import pytest
import torch
from safetensors import safe_open
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

import seqbert


TOLERANCE = 1e-5


def max_delta_on_real_tokens(a: torch.Tensor, b: torch.Tensor, attention_mask: torch.Tensor) -> float:
    real = attention_mask.bool()
    return (a[real] - b[real]).abs().max().item()


@pytest.fixture(scope="module")
def padded_snippets(tokenizer, rt_texts):
    """48 real snippets of very different lengths in one padded batch."""
    texts = rt_texts[:48]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    assert (batch.attention_mask == 0).float().mean() > 0.3  # mostly padding, as real batches are
    return batch


@pytest.fixture(scope="module")
def sentence_pairs(tokenizer, rt_texts):
    """Real snippet pairs: token_type_ids are 0 on the first snippet and 1 on the second; ragged padding."""
    batch = tokenizer(rt_texts[100:112], rt_texts[200:212], padding=True, return_tensors="pt")
    assert batch.token_type_ids.max() == 1 and (batch.attention_mask == 0).any()
    return batch


def test_minilm_base_model_parity(minilm_path, padded_snippets):
    reference = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    assert model.config.norm_placement == "post"
    with torch.no_grad():
        ref = reference(**padded_snippets, output_hidden_states=True)
        out = model(**padded_snippets, output_hidden_states=True)
    assert (
        max_delta_on_real_tokens(out.last_hidden_state, ref.last_hidden_state, padded_snippets.attention_mask)
        <= TOLERANCE
    )
    assert (out.pooler_output - ref.pooler_output).abs().max().item() <= TOLERANCE
    assert len(out.hidden_states) == len(ref.hidden_states) == 7
    for mine, theirs in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert max_delta_on_real_tokens(mine, theirs, padded_snippets.attention_mask) <= TOLERANCE


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_minilm_parity_per_attention_backend(minilm_path, padded_snippets, attn_implementation):
    reference = BertModel.from_pretrained(minilm_path, attn_implementation=attn_implementation).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path, attn_implementation=attn_implementation).eval()
    assert model.config._attn_implementation == attn_implementation
    with torch.no_grad():
        delta = max_delta_on_real_tokens(
            model(**padded_snippets).last_hidden_state,
            reference(**padded_snippets).last_hidden_state,
            padded_snippets.attention_mask,
        )
    assert delta <= TOLERANCE


HEAD_PAIRS = [
    (BertForMaskedLM, seqbert.SeqBertForMaskedLM, ("logits",)),
    (BertForSequenceClassification, seqbert.SeqBertForSequenceClassification, ("logits",)),
    (BertForTokenClassification, seqbert.SeqBertForTokenClassification, ("logits",)),
    (BertForQuestionAnswering, seqbert.SeqBertForQuestionAnswering, ("start_logits", "end_logits")),
]


def labels_for(bert_class, batch):
    g = torch.Generator().manual_seed(0)
    n, length = batch.input_ids.shape
    # Labels on real tokens only: outputs at padding are not part of the parity contract (BERT computes values there
    # from nothing meaningful; seqbert's unpadded sdpa path leaves them zero).
    if bert_class is BertForMaskedLM:
        unlabelled = (torch.rand(n, length, generator=g) > 0.15) | (batch.attention_mask == 0)
        return {"labels": batch.input_ids.masked_fill(unlabelled, -100)}
    if bert_class is BertForSequenceClassification:
        return {"labels": torch.randint(0, 3, (n,), generator=g)}
    if bert_class is BertForTokenClassification:
        return {"labels": torch.randint(0, 5, (n, length), generator=g).masked_fill(batch.attention_mask == 0, -100)}
    real_lengths = batch.attention_mask.sum(1)
    return {
        "start_positions": (torch.rand(n, generator=g) * real_lengths).long(),
        "end_positions": (torch.rand(n, generator=g) * real_lengths).long(),
    }


@pytest.mark.parametrize("bert_class,seqbert_class,fields", HEAD_PAIRS, ids=lambda x: getattr(x, "__name__", ""))
def test_head_parity_with_token_types_and_padding(bert_checkpoints, sentence_pairs, bert_class, seqbert_class, fields):
    folder = bert_checkpoints[bert_class.__name__]
    reference = bert_class.from_pretrained(folder).eval()
    model, info = seqbert_class.from_bert_pretrained(folder, output_loading_info=True)
    model.eval()
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    labels = labels_for(bert_class, sentence_pairs)
    with torch.no_grad():
        ref = reference(**sentence_pairs, **labels)
        out = model(**sentence_pairs, **labels)
    for field in fields:
        mine, theirs = getattr(out, field), getattr(ref, field)
        if mine.dim() >= 2 and mine.shape[:2] == sentence_pairs.attention_mask.shape:
            delta = max_delta_on_real_tokens(mine, theirs, sentence_pairs.attention_mask)
        else:
            delta = (mine - theirs).abs().max().item()
        assert delta <= TOLERANCE, (field, delta)
    # BERT's QA loss normalises start/end over padding positions too, whose logits the unpadded sdpa path does not
    # compute; the padded eager reference keeps BERT's loss exactly, for every head.
    if bert_class is not BertForQuestionAnswering:
        assert abs(out.loss.item() - ref.loss.item()) <= TOLERANCE
    eager = seqbert_class.from_bert_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        assert abs(eager(**sentence_pairs, **labels).loss.item() - ref.loss.item()) <= TOLERANCE


def test_pretraining_checkpoint_loads_into_masked_lm(bert_checkpoints, sentence_pairs):
    folder = bert_checkpoints["BertForPreTraining"]
    reference = BertForPreTraining.from_pretrained(folder).eval()
    model, info = seqbert.SeqBertForMaskedLM.from_bert_pretrained(folder, output_loading_info=True)
    model.eval()
    # The next-sentence head and the pooler have no place in a masked LM: reported, as BertForMaskedLM reports them.
    assert set(info["unexpected_keys"]) == {
        "cls.seq_relationship.weight",
        "cls.seq_relationship.bias",
        "seqbert.pooler.dense.weight",
        "seqbert.pooler.dense.bias",
    }
    assert not info["missing_keys"]
    with torch.no_grad():
        delta = max_delta_on_real_tokens(
            model(**sentence_pairs).logits, reference(**sentence_pairs).prediction_logits, sentence_pairs.attention_mask
        )
    assert delta <= TOLERANCE


def test_base_checkpoint_into_a_head_reports_the_new_head(minilm_path):
    model, info = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(
        minilm_path, num_labels=2, output_loading_info=True
    )
    assert set(info["missing_keys"]) == {"classifier.weight", "classifier.bias"}
    assert not info["unexpected_keys"]
    assert model.config.num_labels == 2 and model.config.norm_placement == "post"


def test_every_non_head_parameter_comes_from_the_checkpoint(minilm_path):
    """Converting BERT must not leave any encoder parameter at its random initialisation."""
    reference = BertModel.from_pretrained(minilm_path)
    model, info = seqbert.SeqBertModel.from_bert_pretrained(minilm_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ref = reference.state_dict()
    mine = model.state_dict()
    assert len(mine) == len([k for k in ref if k != "embeddings.position_ids"])
    for projection in ("query", "key", "value"):
        expected = ref[f"encoder.layer.0.attention.self.{projection}.weight"]
        assert torch.equal(mine[f"encoder.layers.0.attention.{projection}.weight"], expected)
    assert torch.equal(mine["embeddings.layer_norm.weight"], ref["embeddings.LayerNorm.weight"])
    assert torch.equal(mine["encoder.layers.5.mlp_norm.bias"], ref["encoder.layer.5.output.LayerNorm.bias"])


def test_pytorch_bin_and_sharded_checkpoints(bert_checkpoints, sentence_pairs, tmp_path):
    source = bert_checkpoints["BertForSequenceClassification"]
    reference = BertForSequenceClassification.from_pretrained(source).eval()
    # PyTorch pickle format, as older Hub checkpoints are stored.
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    reference.config.save_pretrained(bin_folder)
    torch.save(reference.state_dict(), bin_folder / "pytorch_model.bin")
    # Sharded safetensors with an index file.
    sharded = tmp_path / "sharded"
    reference.save_pretrained(sharded, max_shard_size="20MB")
    assert (sharded / "model.safetensors.index.json").exists()
    # Pickled weights are read only on explicit request.
    with pytest.raises(ValueError, match=r"only pickled PyTorch weights.*use_safetensors=False"):
        seqbert.SeqBertForSequenceClassification.from_bert_pretrained(bin_folder)
    with torch.no_grad():
        expected = reference(**sentence_pairs).logits
        for folder, options in ((bin_folder, {"use_safetensors": False}), (sharded, {})):
            model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(folder, **options).eval()
            assert (model(**sentence_pairs).logits - expected).abs().max().item() <= TOLERANCE


def test_save_then_auto_load_is_bit_exact_with_seqbert_key_names(minilm_path, padded_snippets, tmp_path):
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "encoder.layers.0.attention.query.weight" in keys
    assert not any("LayerNorm" in k or "attention.self" in k or k.startswith("bert.") for k in keys), keys
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert type(loaded) is seqbert.SeqBertModel and loaded.config.norm_placement == "post"
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(**padded_snippets).last_hidden_state, model(**padded_snippets).last_hidden_state, rtol=0, atol=0
        )


def test_masked_lm_round_trip_through_auto_class(bert_checkpoints, sentence_pairs, tmp_path):
    model = seqbert.SeqBertForMaskedLM.from_bert_pretrained(bert_checkpoints["BertForMaskedLM"]).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**sentence_pairs).logits, model(**sentence_pairs).logits, rtol=0, atol=0)


def test_non_bert_checkpoint_is_rejected(tmp_path):
    model = seqbert.SeqBertModel(
        seqbert.SeqBertConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37, vocab_size=99
        )
    )
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'seqbert' checkpoint, not BERT"):
        seqbert.SeqBertModel.from_bert_pretrained(tmp_path)


def test_bert_folder_without_weights_is_rejected(minilm_path, tmp_path):
    shutil.copy(minilm_path / "config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match="has no BERT weights"):
        seqbert.SeqBertModel.from_bert_pretrained(tmp_path)


def _bert_base_uncased_location():
    """A local bert-base-uncased: $SEQBERT_BERT_BASE_UNCASED, or the Hugging Face cache (never downloads)."""
    path = os.environ.get("SEQBERT_BERT_BASE_UNCASED")
    if path:
        return path
    from huggingface_hub import try_to_load_from_cache

    for repo in ("google-bert/bert-base-uncased", "bert-base-uncased"):
        if isinstance(try_to_load_from_cache(repo, "config.json"), str):
            return repo
    return None


@pytest.mark.skipif(
    _bert_base_uncased_location() is None,
    reason="bert-base-uncased is not in the local Hugging Face cache and SEQBERT_BERT_BASE_UNCASED is unset "
    "(no package ships it and this machine has no Hub access)",
)
def test_bert_base_uncased_masked_lm_parity(tokenizer, rt_texts, monkeypatch):
    location = _bert_base_uncased_location()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    batch = tokenizer(rt_texts[:16], padding=True, return_tensors="pt")
    reference = BertForMaskedLM.from_pretrained(location).eval()
    model = seqbert.SeqBertForMaskedLM.from_bert_pretrained(location).eval()
    with torch.no_grad():
        delta = max_delta_on_real_tokens(model(**batch).logits, reference(**batch).logits, batch.attention_mask)
    assert delta <= TOLERANCE


def test_hub_name_resolves_through_the_hugging_face_cache(bert_checkpoints, sentence_pairs, tmp_path):
    """A Hub model id goes through huggingface_hub's cache layout (here pre-filled, as after a download)."""
    source = bert_checkpoints["BertForSequenceClassification"]
    snapshot = tmp_path / "models--someone--bert-test" / "snapshots" / "0123456789abcdef"
    shutil.copytree(source, snapshot)
    (tmp_path / "models--someone--bert-test" / "refs").mkdir()
    (tmp_path / "models--someone--bert-test" / "refs" / "main").write_text("0123456789abcdef")
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(
        "someone/bert-test", cache_dir=tmp_path, local_files_only=True
    ).eval()
    reference = BertForSequenceClassification.from_pretrained(source).eval()
    with torch.no_grad():
        assert (model(**sentence_pairs).logits - reference(**sentence_pairs).logits).abs().max().item() <= TOLERANCE
