"""SeqBertForCausalLM: BERT's `BertLMHeadModel` as a decoder-only SeqBERT. Parity with transformers on a seeded
BertLMHeadModel checkpoint (logits, loss, greedy and beam ids, left and right padding), the Auto class, the
text-generation pipeline, the key/value cache against full recomputation for every variant, and clear errors."""

import contextlib

import pytest
import torch
from conftest import VARIANTS, tiny_config, variant_id
from transformers import AutoModelForCausalLM, AutoTokenizer, BertConfig, BertLMHeadModel, pipeline

import seqbert
from seqbert.transformers_compat import CACHE_NAME


TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def bert_lm_head(tmp_path_factory, tokenizer):
    """A seeded BertLMHeadModel (is_decoder=True, 4 layers of bert-base width) saved with the real uncased tokenizer."""
    torch.manual_seed(0)
    reference = BertLMHeadModel(BertConfig(is_decoder=True, num_hidden_layers=4)).eval()
    folder = tmp_path_factory.mktemp("bert_lm_head")
    reference.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, reference


@pytest.fixture(scope="module")
def converted(bert_lm_head):
    folder, _ = bert_lm_head
    model, info = seqbert.SeqBertForCausalLM.from_bert_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return model.eval()


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_bert_lm_head_checkpoint_gives_bert_logits_loss_and_ids(
    bert_lm_head, converted, tokenizer, rt_texts, padding_side
):
    _, reference = bert_lm_head
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path, padding_side=padding_side)
    batch = tokenizer(rt_texts[:6], padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        expected, got = reference(**batch, labels=labels), converted(**batch, labels=labels)
    assert (got.logits - expected.logits)[real].abs().max().item() <= TOLERANCE
    assert abs(got.loss.item() - expected.loss.item()) <= TOLERANCE
    for options in ({"do_sample": False}, {"num_beams": 3}):
        ids = reference.generate(**batch, max_new_tokens=12, **options)
        assert torch.equal(converted.generate(**batch, max_new_tokens=12, **options), ids), options


def test_auto_class_from_config_and_the_text_generation_pipeline(converted, bert_lm_head, tmp_path):
    config = seqbert.SeqBertConfig(**tiny_config().to_dict())
    assert type(AutoModelForCausalLM.from_config(config)) is seqbert.SeqBertForCausalLM
    folder, _ = bert_lm_head
    assert converted.name_or_path == str(folder)  # from_bert_pretrained records where the weights came from
    converted.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path))
    assert type(generator.model) is seqbert.SeqBertForCausalLM
    inputs = generator.tokenizer("the film is", return_tensors="pt")
    expected = converted.generate(**inputs, max_new_tokens=5, do_sample=False)[0].tolist()
    got = generator("the film is", max_new_tokens=5, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    assert got == expected


@pytest.mark.parametrize("name", ["past_key_values", "cache"])
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_cached_decoding_equals_full_recomputation(variant, name):
    """Step-by-step decoding with the cache, given under either of its names (`cache` is what transformers >= 5.24's
    `generate` passes, `past_key_values` what earlier releases pass), equals the full forward."""
    torch.manual_seed(0)
    model = seqbert.SeqBertForCausalLM(tiny_config(**variant)).eval()
    ids = torch.randint(1, 99, (3, 9))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        step = model(ids[:, :5], use_cache=True)
        cache, logits = getattr(step, CACHE_NAME), [step.logits]
        for position in range(5, 9):
            # From transformers 5.24 on, the old name warns as built-in models do.
            old = name == "past_key_values" and CACHE_NAME == "cache"
            with pytest.warns(FutureWarning, match="past_key_values") if old else contextlib.nullcontext():
                step = model(ids[:, position : position + 1], **{name: cache}, use_cache=True)
            cache = getattr(step, CACHE_NAME)
            logits.append(step.logits)
    assert (torch.cat(logits, dim=1) - full).abs().max().item() <= TOLERANCE


def test_cache_under_both_names_is_refused():
    model = seqbert.SeqBertForCausalLM(tiny_config()).eval()
    cache = getattr(model(torch.tensor([[5, 6]]), use_cache=True), CACHE_NAME)
    with pytest.raises(ValueError, match="past_key_values and cache are two names for the same cache"):
        model(torch.tensor([[7]]), past_key_values=cache, cache=cache)


def test_gradient_checkpointing_training_keeps_no_cache():
    """Training with gradient checkpointing builds no cache even with `use_cache=True` (the backward replay of a layer
    would write it twice), on every transformers release whatever name its checkpointing wrapper clears; the
    gradients equal those without checkpointing."""
    torch.manual_seed(0)
    model = seqbert.SeqBertForCausalLM(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    ids = torch.randint(1, 99, (2, 6))
    model.train()
    plain = model(ids, labels=ids, use_cache=False)
    plain.loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.activation_checkpointing_enable()
    outputs = model.seqbert(ids, use_cache=True)
    assert getattr(outputs, CACHE_NAME) is None
    model(ids, labels=ids).loss.backward()
    for name, grad in expected.items():
        assert torch.equal(dict(model.named_parameters())[name].grad, grad), name


def test_causal_lm_is_causal():
    torch.manual_seed(0)
    model = seqbert.SeqBertForCausalLM(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    ids = torch.randint(1, 99, (2, 8))
    changed = ids.clone()
    changed[:, 5:] = torch.randint(1, 99, (2, 3))
    with torch.no_grad():
        a, b = model(ids).logits, model(changed).logits
    assert torch.equal(a[:, :5], b[:, :5]) and not torch.equal(a[:, 5:], b[:, 5:])


def test_bad_configs_and_inputs_fail_clearly():
    with pytest.raises(ValueError, match=r"SeqBertForCausalLM is decoder-only, but config.is_encoder_decoder is True"):
        seqbert.SeqBertForCausalLM(tiny_config(is_encoder_decoder=True, decoder_start_token_id=2))
    model = seqbert.SeqBertForCausalLM(tiny_config()).eval()
    with pytest.raises(ValueError, match=r"input_ids holds 99 at index \(0, 1\); allowed: \[0, vocab_size=99\)"):
        model(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 3\), but it must be \(1, 2\)"):
        model(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"labels has shape \(1, 3\), but it must be \(1, 2\)"):
        model(torch.tensor([[1, 2]]), labels=torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match=r"the decoder reached position 64 .* max_position_embeddings=64"):
        model(torch.randint(1, 99, (1, 65)))
