"""BERT2BERT: exact conversion of transformers EncoderDecoderModel checkpoints (BERT encoder and decoder) and the
BERT warm start, against EncoderDecoderModel itself, on real text."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, BertConfig, BertModel, EncoderDecoderConfig, EncoderDecoderModel
from transformers.modeling_outputs import BaseModelOutput

import seqbert


TOLERANCE = 1e-4


def save_bert2bert(model: EncoderDecoderModel, tokenizer, folder):
    model.config.decoder_start_token_id = tokenizer.cls_token_id
    model.config.eos_token_id = tokenizer.sep_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def seeded_bert2bert(tmp_path_factory, tokenizer):
    """A seeded random BERT2BERT (MiniLM widths; encoder 2 layers, decoder 3) saved like a downloaded one."""
    encoder = BertConfig(hidden_size=384, num_hidden_layers=2, num_attention_heads=12, intermediate_size=1536)
    decoder = BertConfig(
        hidden_size=384,
        num_hidden_layers=3,
        num_attention_heads=12,
        intermediate_size=1536,
        is_decoder=True,
        add_cross_attention=True,
    )
    torch.manual_seed(0)
    model = EncoderDecoderModel(EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder))
    return save_bert2bert(model, tokenizer, tmp_path_factory.mktemp("bert2bert"))


@pytest.fixture(scope="module")
def minilm_bert2bert(tmp_path_factory, tokenizer, minilm_path):
    """BERT2BERT warm-started by transformers from the real MiniLM weights on both sides (cross-attention seeded)."""
    torch.manual_seed(0)
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(str(minilm_path), str(minilm_path))
    return save_bert2bert(model, tokenizer, tmp_path_factory.mktemp("minilm2minilm"))


@pytest.fixture(scope="module")
def pairs(tokenizer, rt_texts):
    """Real snippets as sources and (other) real snippets as targets, both padded."""
    source = tokenizer(rt_texts[:6], padding=True, return_tensors="pt")
    target = tokenizer(rt_texts[6:12], padding=True, return_tensors="pt")
    labels = target.input_ids.masked_fill(target.attention_mask == 0, -100)
    return source, labels


@pytest.mark.parametrize("checkpoint", ["seeded_bert2bert", "minilm_bert2bert"])
def test_encoder_decoder_model_converts_exactly(request, checkpoint, pairs, tokenizer):
    folder = request.getfixturevalue(checkpoint)
    reference = EncoderDecoderModel.from_pretrained(folder).eval()
    model, info = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(folder, output_loading_info=True)
    model.eval()
    assert not info["missing_keys"], info
    # EncoderDecoderModel's BERT encoder carries a pooler the seq2seq model does not use: reported, not hidden.
    assert set(info["unexpected_keys"]) <= {"seqbert.pooler.dense.weight", "seqbert.pooler.dense.bias"}
    assert model.config.decoder_start_token_id == tokenizer.cls_token_id
    assert model.config.num_decoder_layers == reference.config.decoder.num_hidden_layers

    source, labels = pairs
    with torch.no_grad():
        ref = reference(**source, labels=labels)
        out = model(**source, labels=labels)
    assert (out.logits - ref.logits).abs().max().item() <= TOLERANCE
    assert abs(out.loss.item() - ref.loss.item()) <= TOLERANCE

    ids = dict(decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, pad_token_id=0)
    for generation in (dict(do_sample=False), dict(num_beams=4), dict(num_beams=4, num_return_sequences=2)):
        expected = reference.generate(**source, max_new_tokens=16, **ids, **generation)
        assert torch.equal(model.generate(**source, max_new_tokens=16, **generation), expected), generation


# The parity contract of BERT's classes (docs/testing.md): BERT2BERT's encoder sums its products over the padded batch,
# SeqBERT's over the real tokens. Measured 0.0 here (2026-11-26, AMD EPYC Zen 4).
PARITY = 1e-5


@pytest.mark.parametrize("padding", ["-100", "pad token"])
def test_labels_give_bert2berts_loss_and_logits_however_they_are_padded(minilm_bert2bert, tokenizer, rt_texts, padding):
    """Given `labels` and no `decoder_attention_mask`, the decoder's mask is what `EncoderDecoderModel` builds from
    the decoder inputs (`!= pad_token_id`): labels padded with -100 (DataCollatorForSeq2Seq's default) or with the
    pad token (a tokenizer's `input_ids` used as they are) give BERT2BERT's loss and logits."""
    source = tokenizer(rt_texts[:6], padding=True, return_tensors="pt")
    target = tokenizer(rt_texts[6:12], padding=True, return_tensors="pt")
    labels = target.input_ids  # padded with the pad token
    if padding == "-100":
        labels = labels.masked_fill(target.attention_mask == 0, -100)
    reference = EncoderDecoderModel.from_pretrained(minilm_bert2bert).eval()
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_bert2bert).eval()
    with torch.no_grad():
        expected, got = reference(**source, labels=labels), model(**source, labels=labels)
    assert (got.logits - expected.logits).abs().max().item() <= PARITY
    assert abs(got.loss.item() - expected.loss.item()) <= PARITY


def test_seq2seq_trainer_gives_bert2berts_losses_with_pad_token_labels(minilm_bert2bert, tokenizer, rt_texts, tmp_path):
    """Two `Seq2SeqTrainer` steps on labels padded with the pad token (`DataCollatorForSeq2Seq(label_pad_token_id=
    pad)`), dropout off in both models (BERT draws its masks over padding, SeqBERT's encoder over real tokens)."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    features = [
        {"input_ids": tokenizer(source)["input_ids"], "labels": tokenizer(target)["input_ids"]}
        for source, target in zip(rt_texts[:8], rt_texts[8:16], strict=True)
    ]
    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    config = EncoderDecoderConfig.from_pretrained(minilm_bert2bert)
    for side in (config.encoder, config.decoder):
        side.update(no_dropout)
    losses = {}
    for name, model in (
        ("bert2bert", EncoderDecoderModel.from_pretrained(minilm_bert2bert, config=config)),
        ("seqbert", seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_bert2bert, **no_dropout)),
    ):
        arguments = Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / name), per_device_train_batch_size=4, max_steps=2, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
        )  # fmt: skip
        collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=tokenizer.pad_token_id)
        trainer = Seq2SeqTrainer(model, arguments, train_dataset=features, data_collator=collator)
        trainer.train()
        losses[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses["seqbert"]) == 2
    assert losses["seqbert"] == pytest.approx(losses["bert2bert"], abs=PARITY), losses


CROSS_ATTENTION_NAMES = (
    "cross_attention.query.weight", "cross_attention.query.bias", "cross_attention.key.weight",
    "cross_attention.key.bias", "cross_attention.value.weight", "cross_attention.value.bias",
    "cross_attention.out_proj.weight", "cross_attention.out_proj.bias",
    "cross_attention_norm.weight", "cross_attention_norm.bias",
)  # fmt: skip


def test_warm_start_from_bert_matches_transformers_bert2bert(minilm_path, minilm_bert2bert, pairs):
    model, info = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(
        minilm_path, cross_attention_init="random", cross_attention_source="last_layer", output_loading_info=True
    )
    assert model.config.cross_attention_source == "last_layer"  # what EncoderDecoderModel's decoder reads
    # Cross-attention (and the LM head transform, which MiniLM has not) are new, and reported as such.
    missing = info["missing_keys"]
    assert {k for k in missing if "cross_attention" in k} == {
        f"decoder.layers.{i}.{name}" for i in range(6) for name in CROSS_ATTENTION_NAMES
    }
    assert {k for k in missing if "cross_attention" not in k} == {
        "lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight", "lm_head.layer_norm.bias", "lm_head.decoder.bias"
    }  # fmt: skip
    assert model.config.is_encoder_decoder and model.config.decoder_start_token_id == 101

    # Every warm-started weight equals what transformers' BERT2BERT warm start put in the same place.
    reference = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_bert2bert)
    expected = reference.state_dict()
    for name, tensor in model.state_dict().items():
        if name not in missing and name != "lm_head.decoder.weight":
            assert torch.equal(tensor, expected[name]), name
    # ... and the encoder and decoder are separate copies.
    assert model.decoder.embeddings.word_embeddings.weight is not model.seqbert.embeddings.word_embeddings.weight
    source, _ = pairs
    with torch.no_grad():
        torch.testing.assert_close(
            model.get_encoder()(**source).last_hidden_state,
            reference.get_encoder()(**source).last_hidden_state,
            rtol=0,
            atol=0,
        )


def test_default_warm_start_copies_each_layers_bert_self_attention_into_cross_attention(minilm_path, pairs):
    model, info = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path, output_loading_info=True)
    assert not [k for k in info["missing_keys"] if "cross_attention" in k], info["missing_keys"]
    bert = BertModel.from_pretrained(minilm_path).state_dict()
    bert_names = {
        "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
        "out_proj": "attention.output.dense", "norm": "attention.output.LayerNorm",
    }  # fmt: skip
    for i, layer in enumerate(model.decoder.layers):
        for name, module in (
            ("query", layer.cross_attention.query),
            ("key", layer.cross_attention.key),
            ("value", layer.cross_attention.value),
            ("out_proj", layer.cross_attention.out_proj),
            ("norm", layer.cross_attention_norm),
        ):
            for kind in ("weight", "bias"):
                expected = bert[f"encoder.layer.{i}.{bert_names[name]}.{kind}"]
                assert torch.equal(getattr(module, kind), expected), (i, name, kind)
        # Copies, not shared tensors: training cross-attention leaves self-attention (and the encoder) alone.
        assert layer.cross_attention.query.weight.data_ptr() != layer.self_attention.query.weight.data_ptr()
    # The rest is the plain BERT2BERT warm start.
    random_init = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(
        minilm_path, cross_attention_init="random"
    )
    expected = random_init.state_dict()
    for name, tensor in model.state_dict().items():
        if "cross_attention" not in name and not name.startswith("lm_head.") or name == "lm_head.decoder.weight":
            assert torch.equal(tensor, expected[name]), name
    source, labels = pairs
    with torch.no_grad():
        assert torch.isfinite(model(**source, labels=labels).loss)


@pytest.mark.parametrize("source", ["same_layer", "last_layer"])
def test_each_decoder_layer_cross_attends_to_the_encoder_states_its_config_names(minilm_path, pairs, source):
    """The default warm start (`same_layer`): decoder layer i's cross-attention keys and values are computed from the
    hidden states entering BERT layer i, as transformers' own `BertModel` returns them (`hidden_states[i]`);
    `last_layer`: from BERT's output, in every layer (BERT2BERT)."""
    kwargs = {} if source == "same_layer" else {"cross_attention_source": source}
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path, **kwargs).eval()
    assert model.config.cross_attention_source == source
    bert = BertModel.from_pretrained(minilm_path).eval()
    (source_batch, labels), seen = pairs, {}
    hooks = [
        getattr(layer.cross_attention, projection).register_forward_hook(
            lambda module, args, output, key=(i, projection): seen.__setitem__(key, args[0])
        )
        for i, layer in enumerate(model.decoder.layers)
        for projection in ("key", "value")
    ]
    with torch.no_grad():
        model(**source_batch, labels=labels)
        expected = bert(**source_batch, output_hidden_states=True).hidden_states
    for hook in hooks:
        hook.remove()
    real = source_batch.attention_mask.bool()
    for (i, projection), states in seen.items():
        reference = expected[i] if source == "same_layer" else expected[-1]
        # The parity contract, 1e-5: the encoder's products run over the real tokens only, and a BLAS may sum them
        # in another order than over BERT's padded batch (4.0e-6 on a 2-thread Intel Xeon with AMX; 2e-6 held on Zen 4).
        delta = (states[real] - reference[real]).abs().max().item()
        assert delta <= 1e-5, (i, projection, delta)
    assert len(seen) == 2 * model.config.num_decoder_layers


def test_same_layer_cross_attention_generates_with_cache_beams_and_after_saving(minilm_path, pairs, tmp_path):
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path).eval()
    source, _ = pairs
    greedy = model.generate(**source, max_new_tokens=6)
    assert torch.equal(greedy, model.generate(**source, max_new_tokens=6, use_cache=False))
    beams = model.generate(**source, max_new_tokens=6, num_beams=3, num_return_sequences=2)
    assert beams.shape[0] == 2 * source.input_ids.shape[0]
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.cross_attention_source == "same_layer"
    assert torch.equal(reloaded.generate(**source, max_new_tokens=6), greedy)
    # Encoder outputs without the per-layer states cannot feed this decoder: a clear error, not a wrong result.
    last = BaseModelOutput(last_hidden_state=model.get_encoder()(**source).last_hidden_state)
    with pytest.raises(ValueError, match=r"encoder_outputs has no layer_inputs.*'same_layer'"):
        model(encoder_outputs=last, attention_mask=source.attention_mask, decoder_input_ids=greedy)


def test_cross_attention_init_is_checked(minilm_path, seeded_bert2bert):
    with pytest.raises(ValueError, match=r"cross_attention_init \('copy'\) must be one of 'self_attention', 'random'"):
        seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path, cross_attention_init="copy")
    with pytest.raises(ValueError, match=r"cross_attention_init \('random'\) only applies to a seq2seq warm start"):
        seqbert.SeqBertForSequenceClassification.from_bert_pretrained(minilm_path, cross_attention_init="random")
    with pytest.raises(
        ValueError, match=r"only applies to a seq2seq warm start from a plain BERT checkpoint.*'encoder-decoder'"
    ):
        seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(seeded_bert2bert, cross_attention_init="random")


def test_mismatched_encoder_and_decoder_sizes_are_rejected(tmp_path, tokenizer):
    encoder = BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128)
    decoder = BertConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=96,
        is_decoder=True,
        add_cross_attention=True,
    )
    save_bert2bert(
        EncoderDecoderModel(EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)), tokenizer, tmp_path
    )
    with pytest.raises(
        ValueError, match=r"encoder intermediate_size \(128\) differs from decoder intermediate_size \(96\)"
    ):
        seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(tmp_path)


def test_encoder_only_classes_reject_bert2bert_checkpoints(seeded_bert2bert):
    with pytest.raises(ValueError, match="'encoder-decoder' checkpoint, not BERT"):
        seqbert.SeqBertModel.from_bert_pretrained(seeded_bert2bert)
