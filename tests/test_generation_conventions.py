"""transformers' generation conventions, as its own generation tests (tests/generation/test_utils.py, not in the sdist
that tests/transformers_common_tests.py reads) use them, on SeqBERT against transformers' BERT2BERT
(`EncoderDecoderModel` warm-started from the real MiniLM weights, converted exactly) and BART:

- a negative `eos_token_id` / `pad_token_id` means "no such token": generation runs to the maximum length, with the
  warnings transformers gives for its own models, never an error;
- assisted decoding with a draft model (`assistant_model=`) gives greedy search's ids;
- `generate` continued from the `past_key_values` it returned gives the ids of one longer call.
"""

import logging

import pytest
import torch
from conftest import tiny_config
from transformers import BartConfig, BertLMHeadModel, EncoderDecoderModel
from transformers.utils import logging as hf_logging

import seqbert


NEW_TOKENS = 6


@pytest.fixture(scope="module")
def bert2bert_pair(tmp_path_factory, tokenizer, minilm_path):
    """transformers' BERT2BERT warm-started from MiniLM (cross-attention seeded) and its exact SeqBERT conversion."""
    torch.manual_seed(0)
    reference = EncoderDecoderModel.from_encoder_decoder_pretrained(str(minilm_path), str(minilm_path))
    special = dict(decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, pad_token_id=0)
    for config in (reference.config, reference.generation_config):
        for name, value in special.items():
            setattr(config, name, value)
    folder = tmp_path_factory.mktemp("bert2bert")
    reference.save_pretrained(folder)
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(folder)
    return reference.eval(), model.eval()


@pytest.fixture(scope="module")
def source(tokenizer, rt_texts):
    return tokenizer(rt_texts[:3], padding=True, return_tensors="pt")


def _generate(model, source, **kwargs):
    with torch.no_grad():
        return model.generate(**source, do_sample=False, **kwargs)


@pytest.fixture
def transformers_warnings(caplog):
    """transformers' log records (its warnings go through `logging`, propagated here for the test only)."""
    hf_logging.enable_propagation()
    caplog.set_level(logging.WARNING, logger="transformers")
    yield caplog
    hf_logging.disable_propagation()


def test_a_negative_eos_and_pad_token_id_mean_no_such_token(bert2bert_pair, source, transformers_warnings):
    """eos_token_id=-1 (and pad_token_id=-1), as transformers' generation tests pass them: both models generate the
    same ids to the full length, and transformers warns for SeqBERT as for its own BERT2BERT."""
    reference, model = bert2bert_pair
    ids = dict(eos_token_id=-1, pad_token_id=-1, max_new_tokens=NEW_TOKENS)
    for name, generator in (("bert2bert", reference), ("seqbert", model)):
        transformers_warnings.clear()
        sequences = _generate(generator, source, **ids)
        assert sequences.shape == (3, 1 + NEW_TOKENS), name  # never stopped early
        warnings = [r.getMessage() for r in transformers_warnings.records]
        assert any("`eos_token_id` should consist of positive integers" in w for w in warnings), (name, warnings)
        if name == "bert2bert":
            expected = sequences
    assert torch.equal(sequences, expected)
    for beams in ({"num_beams": 3}, {"num_beams": 3, "num_return_sequences": 2}):
        assert torch.equal(_generate(model, source, **ids, **beams), _generate(reference, source, **ids, **beams))


def test_a_config_may_say_it_has_no_eos_or_pad_token(transformers_warnings):
    """As BartConfig: negative pad / bos / eos ids are accepted with transformers' config warning; no embedding row
    is reserved for a negative pad id (nn.Embedding would count it from the end)."""
    # transformers warns once per message, which names the vocabulary size: a size of each model's own.
    BartConfig(vocab_size=97, eos_token_id=-1, pad_token_id=-1, bos_token_id=-1)
    config = tiny_config(
        vocab_size=98, is_encoder_decoder=True, decoder_start_token_id=1, eos_token_id=-1, pad_token_id=-1,
        bos_token_id=-1,
    )  # fmt: skip
    assert (config.eos_token_id, config.pad_token_id, config.bos_token_id) == (-1, -1, -1)
    warned = {r.getMessage() for r in transformers_warnings.records}
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        for vocab in (97, 98):
            expected = (
                f"Model config: {name} must be `None` or an integer within the vocabulary (between 0 and {vocab - 1})"
            )
            assert any(w.startswith(expected) for w in warned), (name, vocab, warned)
    model = seqbert.SeqBertForConditionalGeneration(config).eval()
    assert model.get_input_embeddings().padding_idx is None
    torch.manual_seed(0)
    sequences = _generate(model, {"input_ids": torch.randint(3, 98, (2, 5))}, max_new_tokens=4)
    assert sequences.shape == (2, 5)
    # What would index the scores or the embedding is still refused: -1 would mean the last token there.
    with pytest.raises(ValueError, match=r"decoder_start_token_id \(-1\) must be >= 0"):
        tiny_config(is_encoder_decoder=True, decoder_start_token_id=-1)
    with pytest.raises(ValueError, match=r"forced_eos_token_id \(-1\) holds -1"):
        model.generate(torch.randint(3, 98, (2, 5)), max_new_tokens=2, forced_eos_token_id=-1)
    # Teacher forcing cannot stand a missing pad token in for the -100 of ignored labels.
    with pytest.raises(ValueError, match=r"config.pad_token_id is -1, but building decoder_input_ids from labels"):
        model(input_ids=torch.randint(3, 98, (2, 5)), labels=torch.tensor([[5, 6, -100], [5, 6, 7]]))
    assert model(input_ids=torch.randint(3, 98, (2, 5)), labels=torch.tensor([[5, 6, 7], [5, 6, 7]])).loss.isfinite()


@pytest.mark.parametrize("draft", ["same", "smaller"])
def test_assisted_decoding_gives_greedy_ids(bert2bert_pair, source, draft):
    """`assistant_model=` with the model itself ("same", every draft token accepted) or a smaller random SeqBERT of
    the same vocabulary ("smaller", most rejected): the ids of greedy search, as for transformers' BERT2BERT."""
    reference, model = bert2bert_pair
    if draft == "same":
        assistants = (reference, model)
    else:
        torch.manual_seed(0)
        config = seqbert.SeqBertConfig(
            vocab_size=model.config.vocab_size, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=128, is_encoder_decoder=True, decoder_start_token_id=model.config.decoder_start_token_id,
            eos_token_id=model.config.eos_token_id,
        )  # fmt: skip
        small = seqbert.SeqBertForConditionalGeneration(config).eval()
        assistants = (small, small)
    ids = dict(eos_token_id=-1, pad_token_id=0, max_new_tokens=NEW_TOKENS)
    greedy = _generate(model, _first(source), **ids)
    assert torch.equal(greedy, _generate(reference, _first(source), **ids))
    for generator, assistant in zip((reference, model), assistants, strict=True):
        assisted = _generate(generator, _first(source), assistant_model=assistant, **ids)
        assert torch.equal(assisted, greedy), type(generator).__name__


def _first(source) -> dict:
    """The first example: transformers' assisted decoding takes batch size 1."""
    return {key: value[:1] for key, value in source.items()}


def test_assisted_sampling_runs_with_a_draft_model(bert2bert_pair, source):
    """`do_sample=True` with a draft model (transformers' speculative sampling): valid ids of the full length."""
    _, model = bert2bert_pair
    torch.manual_seed(0)
    with torch.no_grad():
        sequences = model.generate(
            **_first(source), assistant_model=model, do_sample=True, eos_token_id=-1, max_new_tokens=NEW_TOKENS
        )
    assert sequences.shape == (1, 1 + NEW_TOKENS)
    assert 0 <= sequences.min() and sequences.max() < model.config.vocab_size


def test_generate_continues_from_returned_past_key_values(bert2bert_pair, source):
    """Generate 3 tokens, then 1 more from the returned cache and sequences (transformers' own test of this): the ids
    of one 4-token call, for SeqBERT as for BERT2BERT, and a continued cache equal to BERT2BERT's."""
    reference, model = bert2bert_pair
    ids = dict(eos_token_id=-1, pad_token_id=0, return_dict_in_generate=True)
    caches = []
    for generator in (reference, model):
        whole = _generate(generator, source, max_new_tokens=4, **ids)
        first = _generate(generator, source, max_new_tokens=3, **ids)
        continued = _generate(
            generator,
            source,
            decoder_input_ids=first.sequences,
            past_key_values=first.past_key_values,
            max_new_tokens=1,
            **ids,
        )
        assert torch.equal(continued.sequences, whole.sequences), type(generator).__name__
        caches.append(continued.past_key_values.self_attention_cache)
        if generator is reference:
            expected = whole.sequences
    assert torch.equal(whole.sequences, expected)
    # The continued cache holds what BERT2BERT's holds (transformers' generate decides which positions it keeps).
    for got, want in zip(caches[1].layers, caches[0].layers, strict=True):
        torch.testing.assert_close(got.keys, want.keys, rtol=0, atol=1e-4)
        torch.testing.assert_close(got.values, want.values, rtol=0, atol=1e-4)


def test_causal_lm_continues_from_returned_past_key_values(tokenizer, rt_texts, minilm_path, tmp_path):
    """The same (3 tokens, then 1) for the decoder-only model: BertLMHeadModel (MiniLM body, seeded head) and its
    SeqBertForCausalLM conversion, each continued from its own returned cache, both giving the ids of one call."""
    torch.manual_seed(0)
    reference = BertLMHeadModel.from_pretrained(minilm_path, is_decoder=True)
    reference.save_pretrained(tmp_path)
    model = seqbert.SeqBertForCausalLM.from_bert_pretrained(tmp_path).eval()
    prompt = dict(tokenizer(rt_texts[:1], return_tensors="pt"))
    prompt.pop("token_type_ids")
    ids = dict(eos_token_id=-1, pad_token_id=0, return_dict_in_generate=True)
    for generator in (reference.eval(), model):
        whole = _generate(generator, prompt, max_new_tokens=4, **ids)
        first = _generate(generator, prompt, max_new_tokens=3, **ids)
        continued = _generate(
            generator,
            {"input_ids": first.sequences, "attention_mask": torch.ones_like(first.sequences)},
            past_key_values=first.past_key_values,
            max_new_tokens=1,
            **ids,
        )
        assert torch.equal(continued.sequences, whole.sequences), type(generator).__name__
        if generator is reference:
            expected = whole.sequences
    assert torch.equal(whole.sequences, expected)
