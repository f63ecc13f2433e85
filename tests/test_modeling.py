"""Every variant (norm_placement x position_embedding_type x scale_embedding) through the same checks, on tiny
configs: shapes, losses against torch's own loss functions, backward, padding and batch invariance, eager == sdpa,
gradient checkpointing, output options and save/load through the Auto classes."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import BATCH, LENGTH, random_inputs, tiny_config
from transformers import (
    AttentionInterface,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import seqbert
from seqbert.modeling_seqbert import sinusoidal_position_table


HEAD_CLASSES = [
    (seqbert.SeqBertModel, AutoModel),
    (seqbert.SeqBertForMaskedLM, AutoModelForMaskedLM),
    (seqbert.SeqBertForSequenceClassification, AutoModelForSequenceClassification),
    (seqbert.SeqBertForTokenClassification, AutoModelForTokenClassification),
    (seqbert.SeqBertForQuestionAnswering, AutoModelForQuestionAnswering),
    (seqbert.SeqBertForMultipleChoice, AutoModelForMultipleChoice),
]
NUM_CHOICES = 3


def build(model_class, config, attn_implementation=None):
    if attn_implementation is not None:
        config = seqbert.SeqBertConfig(**config.to_dict(), attn_implementation=attn_implementation)
    torch.manual_seed(0)
    return model_class(config).eval()


def main_output(model, out):
    """The tensor that a head's users read: hidden states, logits, or the QA start logits."""
    if isinstance(model, seqbert.SeqBertModel):
        return out.last_hidden_state
    if isinstance(model, seqbert.SeqBertForQuestionAnswering):
        return torch.stack([out.start_logits, out.end_logits], dim=-1)
    return out.logits


def inputs_for(model, config, **kwargs):
    inputs = random_inputs(config, **kwargs)
    if isinstance(model, seqbert.SeqBertForMultipleChoice):
        inputs = {k: v[: 4 * NUM_CHOICES].view(4, NUM_CHOICES, -1) for k, v in random_inputs(config, batch=12).items()}
    return inputs


def test_sinusoid_table_matches_the_paper_formula():
    table = sinusoidal_position_table(50, 16, dtype=torch.float64)
    for pos in range(50):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_positions_are_a_buffer_not_a_parameter():
    model = build(seqbert.SeqBertModel, tiny_config(position_embedding_type="sinusoidal"))
    assert not any("position" in name for name, _ in model.named_parameters())
    assert "embeddings.position_embeddings.table" not in model.state_dict()


def test_norm_placement_builds_the_layer_and_final_norm(variant_config):
    model = build(seqbert.SeqBertModel, variant_config)
    expected = {
        "pre": seqbert.modeling_seqbert.SeqBertPreNormLayer,
        "post": seqbert.modeling_seqbert.SeqBertPostNormLayer,
    }
    assert all(type(layer) is expected[variant_config.norm_placement] for layer in model.encoder.layers)
    has_final_norm = isinstance(model.encoder.final_layer_norm, torch.nn.LayerNorm)
    assert has_final_norm == (variant_config.norm_placement == "pre")


def test_pre_and_post_layer_compute_their_formulas():
    """The two layer kinds, against their formulas written out with the layer's own sub-modules."""
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    x = torch.randn(2, 5, config.hidden_size)
    for placement in ("pre", "post"):
        layer = seqbert.modeling_seqbert.SEQBERT_LAYER_CLASSES[placement](config).eval()
        if placement == "pre":
            h = x + layer.attention(layer.attention_norm(x))[0]
            expected = h + layer.mlp(layer.mlp_norm(h))
        else:
            h = layer.attention_norm(x + layer.attention(x)[0])
            expected = layer.mlp_norm(h + layer.mlp(h))
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)


@pytest.mark.parametrize("model_class", [c for c, _ in HEAD_CLASSES], ids=lambda c: c.__name__)
def test_forward_shapes(model_class, variant_config):
    model = build(model_class, variant_config)
    inputs = inputs_for(model, variant_config)
    out = model(**inputs)
    b, length = inputs["input_ids"].shape[0], inputs["input_ids"].shape[-1]
    expected = {
        seqbert.SeqBertModel: (b, length, variant_config.hidden_size),
        seqbert.SeqBertForMaskedLM: (b, length, variant_config.vocab_size),
        seqbert.SeqBertForSequenceClassification: (b, variant_config.num_labels),
        seqbert.SeqBertForTokenClassification: (b, length, variant_config.num_labels),
        seqbert.SeqBertForQuestionAnswering: (b, length, 2),
        seqbert.SeqBertForMultipleChoice: (b, NUM_CHOICES),
    }[model_class]
    assert main_output(model, out).shape == expected
    assert torch.isfinite(main_output(model, out)).all()
    if model_class is seqbert.SeqBertModel:
        assert out.pooler_output.shape == (b, variant_config.hidden_size)


def _labels_and_reference_loss(model, config, inputs, out_fn):
    """Labels for `model` and the loss computed independently with torch.nn.functional on the model's logits."""
    g = torch.Generator().manual_seed(1)
    ids = inputs["input_ids"]
    if isinstance(model, seqbert.SeqBertForMaskedLM):
        labels = torch.randint(0, config.vocab_size, ids.shape, generator=g).masked_fill(
            inputs["attention_mask"] == 0, -100
        )
        return {"labels": labels}, lambda o: F.cross_entropy(
            o.logits.reshape(-1, config.vocab_size), labels.reshape(-1)
        )
    if isinstance(model, seqbert.SeqBertForSequenceClassification):
        labels = torch.randint(0, config.num_labels, (ids.shape[0],), generator=g)
        return {"labels": labels}, lambda o: F.cross_entropy(o.logits, labels)
    if isinstance(model, seqbert.SeqBertForTokenClassification):
        labels = torch.randint(0, config.num_labels, ids.shape, generator=g).masked_fill(
            inputs["attention_mask"] == 0, -100
        )
        return {"labels": labels}, lambda o: F.cross_entropy(
            o.logits.reshape(-1, config.num_labels), labels.reshape(-1)
        )
    if isinstance(model, seqbert.SeqBertForQuestionAnswering):
        start = torch.randint(0, ids.shape[1], (ids.shape[0],), generator=g)
        end = torch.randint(0, ids.shape[1], (ids.shape[0],), generator=g)
        return {
            "start_positions": start,
            "end_positions": end,
        }, lambda o: (F.cross_entropy(o.start_logits, start) + F.cross_entropy(o.end_logits, end)) / 2
    if isinstance(model, seqbert.SeqBertForMultipleChoice):
        labels = torch.randint(0, NUM_CHOICES, (ids.shape[0],), generator=g)
        return {"labels": labels}, lambda o: F.cross_entropy(o.logits, labels)
    raise AssertionError(type(model))


@pytest.mark.parametrize("model_class", [c for c, _ in HEAD_CLASSES[1:]], ids=lambda c: c.__name__)
def test_loss_and_backward(model_class, variant_config):
    model = build(model_class, variant_config).train()
    inputs = inputs_for(model, variant_config)
    labels, reference = _labels_and_reference_loss(model, variant_config, inputs, None)
    torch.manual_seed(3)
    out = model(**inputs, **labels)
    assert out.loss.ndim == 0
    torch.testing.assert_close(out.loss, reference(out), rtol=1e-6, atol=1e-6)
    out.loss.backward()
    unused = {"seqbert.pooler.dense.weight", "seqbert.pooler.dense.bias"}
    if model_class is seqbert.SeqBertForMultipleChoice:
        unused.add("classifier.bias")  # a bias shared by all choices cancels in the softmax over choices: zero grad
    if model_class is seqbert.SeqBertForQuestionAnswering:
        unused.add("qa_outputs.bias")  # likewise over positions: zero up to rounding
    for name, param in model.named_parameters():
        if name in unused:
            continue
        if name == "seqbert.embeddings.token_type_embeddings.weight" or name.endswith("word_embeddings.weight"):
            assert param.grad is not None and param.grad.abs().sum() > 0, name
            continue
        assert param.grad is not None and torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("problem_type", ["regression", "single_label_classification", "multi_label_classification"])
def test_sequence_classification_problem_types(problem_type):
    num_labels = 1 if problem_type == "regression" else 3
    model = build(seqbert.SeqBertForSequenceClassification, tiny_config(num_labels=num_labels))
    inputs = random_inputs(model.config)
    g = torch.Generator().manual_seed(0)
    if problem_type == "regression":
        labels = torch.randn(BATCH, generator=g)
        reference = lambda logits: F.mse_loss(logits.squeeze(), labels)
    elif problem_type == "single_label_classification":
        labels = torch.randint(0, 3, (BATCH,), generator=g)
        reference = lambda logits: F.cross_entropy(logits, labels)
    else:
        labels = torch.randint(0, 2, (BATCH, 3), generator=g).float()
        reference = lambda logits: F.binary_cross_entropy_with_logits(logits, labels)
    out = model(**inputs, labels=labels)
    assert model.config.problem_type == problem_type  # inferred exactly as BERT infers it
    torch.testing.assert_close(out.loss, reference(out.logits))


@pytest.mark.parametrize("model_class", [c for c, _ in HEAD_CLASSES], ids=lambda c: c.__name__)
def test_extra_padding_never_changes_real_tokens(model_class, variant_config):
    model = build(model_class, variant_config)
    inputs = inputs_for(model, variant_config)
    extra = {k: F.pad(v, (0, 5), value=0) for k, v in inputs.items()}  # 5 more pad positions on every row
    with torch.no_grad():
        short, long = main_output(model, model(**inputs)), main_output(model, model(**extra))
    if short.dim() >= 3 or (short.dim() == 2 and isinstance(model, seqbert.SeqBertForTokenClassification)):
        real = inputs["attention_mask"].bool()
        torch.testing.assert_close(long[:, : short.shape[1]][real], short[real], rtol=0, atol=1e-5)
    elif isinstance(model, seqbert.SeqBertForQuestionAnswering):
        real = inputs["attention_mask"].bool()
        torch.testing.assert_close(long[:, : short.shape[1]][real], short[real], rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(long, short, rtol=0, atol=1e-5)


def test_batch_invariance(variant_config):
    model = build(seqbert.SeqBertForTokenClassification, variant_config)
    inputs = random_inputs(variant_config)
    with torch.no_grad():
        batched = model(**inputs).logits
        for i in range(BATCH):
            n = int(inputs["attention_mask"][i].sum())
            alone = model(**{k: v[i : i + 1, :n] for k, v in inputs.items()}).logits
            torch.testing.assert_close(alone[0], batched[i, :n], rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_class", [c for c, _ in HEAD_CLASSES], ids=lambda c: c.__name__)
def test_eager_equals_sdpa(model_class, variant_config):
    eager = build(model_class, variant_config, attn_implementation="eager")
    sdpa = build(model_class, variant_config, attn_implementation="sdpa")
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    sdpa.load_state_dict(eager.state_dict())
    for pad_rows in (True, False):  # without padding sdpa gets no mask: it must still not turn causal
        inputs = inputs_for(eager, variant_config, pad_rows=pad_rows)
        with torch.no_grad():
            a, b = main_output(eager, eager(**inputs)), main_output(sdpa, sdpa(**inputs))
        if "attention_mask" in inputs and a.dim() >= 2 and a.shape[:2] == inputs["attention_mask"].shape:
            real = inputs["attention_mask"].bool()
            a, b = a[real], b[real]
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_class,auto_class", HEAD_CLASSES, ids=lambda c: c.__name__)
def test_save_and_auto_load_round_trip_is_bit_exact(model_class, auto_class, variant_config, tmp_path):
    model = build(model_class, variant_config)
    model.save_pretrained(tmp_path)
    loaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is model_class
    inputs = inputs_for(model, variant_config)
    with torch.no_grad():
        torch.testing.assert_close(
            main_output(loaded, loaded(**inputs)), main_output(model, model(**inputs)), rtol=0, atol=0
        )
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_masked_lm_decoder_is_tied_to_word_embeddings(tmp_path):
    model = build(seqbert.SeqBertForMaskedLM, tiny_config())
    assert model.lm_head.decoder.weight is model.seqbert.embeddings.word_embeddings.weight
    model.save_pretrained(tmp_path)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert loaded.lm_head.decoder.weight is loaded.seqbert.embeddings.word_embeddings.weight


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(variant_config):
    config = variant_config.__class__(
        **{**variant_config.to_dict(), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    )
    plain = build(seqbert.SeqBertForSequenceClassification, config).train()
    checkpointed = build(seqbert.SeqBertForSequenceClassification, config).train()
    checkpointed.activation_checkpointing_enable()
    assert checkpointed.is_activation_checkpointing
    assert all(layer.gradient_checkpointing for layer in checkpointed.seqbert.encoder.layers)
    inputs = random_inputs(config)
    labels = torch.randint(0, 2, (BATCH,))
    losses = []
    for model in (plain, checkpointed):
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=0)
    for (name, p), (_, q) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7, msg=name)


def test_hidden_states_attentions_and_tuple_output():
    config = tiny_config()
    model = build(seqbert.SeqBertModel, config, attn_implementation="eager")
    inputs = random_inputs(config)
    out = model(**inputs, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == config.num_hidden_layers + 1
    assert all(h.shape == (BATCH, LENGTH, config.hidden_size) for h in out.hidden_states)
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state, rtol=0, atol=0)
    assert len(out.attentions) == config.num_hidden_layers
    assert all(a.shape == (BATCH, config.num_attention_heads, LENGTH, LENGTH) for a in out.attentions)
    # attention rows sum to 1 and never look at padding
    probs = out.attentions[0]
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))
    pad = inputs["attention_mask"] == 0
    assert probs.masked_select(pad[:, None, None, :].expand_as(probs)).abs().max() == 0

    as_tuple = model(**inputs, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], out.last_hidden_state)
    clf = build(seqbert.SeqBertForSequenceClassification, config)
    clf_tuple = clf(**inputs, labels=torch.zeros(BATCH, dtype=torch.long), return_dict=False)
    assert isinstance(clf_tuple, tuple) and clf_tuple[0].ndim == 0 and clf_tuple[1].shape == (BATCH, 2)


def test_set_attn_implementation_switches_a_loaded_model():
    """`model.set_attn_implementation` as on transformers' own models: the implementation the layers call changes."""
    config = tiny_config()
    model = build(seqbert.SeqBertModel, config, attn_implementation="sdpa")
    inputs = random_inputs(config)
    # No padding: a new implementation name gets the mask format transformers picks for it, which is not the point.
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])
    calls = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        calls.append(module.layer_idx)
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("seqbert_test_spy", spy)
    model.set_attn_implementation("seqbert_test_spy")
    assert model.config._attn_implementation == "seqbert_test_spy"
    with torch.no_grad():
        spied = model(**inputs).last_hidden_state
    assert calls == list(range(config.num_hidden_layers))
    model.set_attn_implementation("eager")  # eager returns the attention weights, sdpa does not
    assert model(**inputs, output_attentions=True).attentions[0] is not None
    torch.testing.assert_close(model(**inputs).last_hidden_state, spied, rtol=0, atol=1e-5)


def test_token_type_embedding_can_be_disabled():
    config = tiny_config(type_vocab_size=0)
    model = build(seqbert.SeqBertModel, config)
    assert model.embeddings.token_type_embeddings is None
    inputs = random_inputs(config)
    inputs.pop("token_type_ids")
    assert model(**inputs).last_hidden_state.shape == (BATCH, LENGTH, config.hidden_size)


def test_scale_embedding_multiplies_word_embeddings_by_sqrt_hidden_size():
    plain = build(seqbert.SeqBertModel, tiny_config(hidden_dropout_prob=0.0))
    scaled = build(seqbert.SeqBertModel, tiny_config(hidden_dropout_prob=0.0, scale_embedding=True))
    scaled.load_state_dict(plain.state_dict())
    ids = torch.tensor([[5, 6, 7]])
    words = plain.embeddings.word_embeddings(ids)
    expected_scaled = plain.embeddings(inputs_embeds=words * math.sqrt(32))
    torch.testing.assert_close(scaled.embeddings(ids), expected_scaled, rtol=0, atol=1e-6)


def test_inputs_embeds_equals_input_ids():
    model = build(seqbert.SeqBertModel, tiny_config())
    inputs = random_inputs(model.config)
    embeds = model.get_input_embeddings()(inputs["input_ids"])
    with torch.no_grad():
        a = model(**inputs).last_hidden_state
        b = model(
            inputs_embeds=embeds, attention_mask=inputs["attention_mask"], token_type_ids=inputs["token_type_ids"]
        ).last_hidden_state
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model(input_ids=inputs["input_ids"], inputs_embeds=embeds)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model(attention_mask=inputs["attention_mask"])
