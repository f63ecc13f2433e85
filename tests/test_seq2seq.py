"""SeqBertForConditionalGeneration on tiny configs of every variant: loss, generation with and without cache,
incremental decoding against teacher forcing, causality, source-padding invariance, save/load, the encoder through
AutoModel, shared embeddings, output options, and a pre-LN model that learns a task from scratch."""

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, VARIANTS, variant_id
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.cache_utils import EncoderDecoderCache

import seqbert
from seqbert.transformers_compat import CACHE_NAME


PAD, START, EOS = 0, 1, 2


def seq2seq_config(**overrides) -> seqbert.SeqBertConfig:
    fields = dict(
        TINY,
        num_decoder_layers=3,  # deliberately not num_hidden_layers (2): caches must follow the decoder's depth
        is_encoder_decoder=True,
        pad_token_id=PAD,
        decoder_start_token_id=START,
        eos_token_id=EOS,
    )
    return seqbert.SeqBertConfig(**{**fields, **overrides})


@pytest.fixture(params=VARIANTS, ids=variant_id)
def model(request):
    torch.manual_seed(0)
    return seqbert.SeqBertForConditionalGeneration(seq2seq_config(**request.param)).eval()


def source_batch(batch=5, length=9, seed=0):
    """Random source ids in [3, vocab) with ragged right padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TINY["vocab_size"], (batch, length), generator=g)
    lengths = torch.tensor([length, 3, 7, 1, 5][:batch])
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return ids.masked_fill(mask == 0, PAD), mask


def test_loss_is_cross_entropy_on_right_shifted_labels(model):
    src, mask = source_batch()
    labels = torch.randint(3, TINY["vocab_size"], (5, 6), generator=torch.Generator().manual_seed(1))
    labels[1, 4:] = -100
    out = model(input_ids=src, attention_mask=mask, labels=labels)
    assert out.logits.shape == (5, 6, TINY["vocab_size"])
    torch.testing.assert_close(
        out.loss, F.cross_entropy(out.logits.reshape(-1, TINY["vocab_size"]), labels.reshape(-1))
    )
    decoder_inputs = torch.cat([torch.full((5, 1), START), labels[:, :-1].masked_fill(labels[:, :-1] == -100, PAD)], 1)
    explicit = model(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_inputs)
    real = labels != -100
    torch.testing.assert_close(explicit.logits[real], out.logits[real], rtol=0, atol=1e-6)
    # Labels sliced out of a wider tensor (not contiguous, e.g. `ids[:, 1:]`) give the same loss.
    wide = torch.cat([torch.full((5, 1), START), labels], 1)
    sliced = model(input_ids=src, attention_mask=mask, labels=wide[:, 1:])
    torch.testing.assert_close(sliced.loss, out.loss, rtol=0, atol=0)
    model.train()
    model(input_ids=src, attention_mask=mask, labels=labels).loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert no_grad == [], no_grad


@pytest.mark.parametrize(
    "generation", [dict(do_sample=False), dict(num_beams=3, num_return_sequences=2)], ids=["greedy", "beam"]
)
def test_cached_and_uncached_generation_give_identical_ids(model, generation):
    src, mask = source_batch()
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, **generation)
    cached = model.generate(src, attention_mask=mask, use_cache=True, **kwargs)
    uncached = model.generate(src, attention_mask=mask, use_cache=False, **kwargs)
    assert cached.shape == (src.shape[0] * generation.get("num_return_sequences", 1), 9)
    assert torch.equal(cached, uncached)


def test_sampling_and_return_sequences(model):
    src, mask = source_batch()
    torch.manual_seed(0)
    first = model.generate(src, attention_mask=mask, do_sample=True, top_k=10, max_new_tokens=6, num_return_sequences=3)
    torch.manual_seed(0)
    second = model.generate(
        src, attention_mask=mask, do_sample=True, top_k=10, max_new_tokens=6, num_return_sequences=3
    )
    assert first.shape[0] == 15 and torch.equal(first, second)
    assert (first[:, 0] == START).all()


def test_step_by_step_cached_logits_equal_teacher_forcing(model):
    src, mask = source_batch()
    decoder_ids = torch.randint(3, TINY["vocab_size"], (5, 7), generator=torch.Generator().manual_seed(2))
    decoder_ids[:, 0] = START
    with torch.no_grad():
        full = model(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        cache = None
        for t in range(decoder_ids.shape[1]):
            step = model(
                encoder_outputs=encoder_outputs,
                attention_mask=mask,
                decoder_input_ids=decoder_ids[:, t : t + 1],
                **{CACHE_NAME: cache},
                use_cache=True,
            )
            cache = getattr(step, CACHE_NAME)
            assert isinstance(cache, EncoderDecoderCache) and cache.get_seq_length() == t + 1
            torch.testing.assert_close(step.logits[:, 0], full[:, t], rtol=0, atol=1e-5)
    assert len(cache.self_attention_cache.layers) == model.config.num_decoder_layers


def test_later_decoder_tokens_never_change_earlier_logits(model):
    src, mask = source_batch()
    decoder_ids = torch.randint(3, TINY["vocab_size"], (5, 6), generator=torch.Generator().manual_seed(3))
    changed = decoder_ids.clone()
    changed[:, 4:] = torch.randint(3, TINY["vocab_size"], (5, 2), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a = model(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        b = model(input_ids=src, attention_mask=mask, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :4], b[:, :4], rtol=0, atol=0)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_source_padding_never_changes_the_result(model):
    src, mask = source_batch()
    padded_src, padded_mask = F.pad(src, (0, 6), value=PAD), F.pad(mask, (0, 6), value=0)
    decoder_ids = torch.randint(3, TINY["vocab_size"], (5, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a = model(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        b = model(input_ids=padded_src, attention_mask=padded_mask, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    kwargs = dict(max_new_tokens=8, num_beams=2)
    assert torch.equal(
        model.generate(src, attention_mask=mask, **kwargs),
        model.generate(padded_src, attention_mask=padded_mask, **kwargs),
    )
    # and a row alone gives what it gives in the batch
    alone = model.generate(src[1:2, :3], attention_mask=mask[1:2, :3], max_new_tokens=8)
    assert torch.equal(alone[0], model.generate(src, attention_mask=mask, max_new_tokens=8)[1])


def test_save_load_round_trip_and_auto_classes(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is seqbert.SeqBertForConditionalGeneration
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    src, mask = source_batch()
    assert torch.equal(
        loaded.generate(src, attention_mask=mask, max_new_tokens=6),
        model.generate(src, attention_mask=mask, max_new_tokens=6),
    )
    assert loaded.lm_head.decoder.weight is loaded.decoder.embeddings.word_embeddings.weight


def test_auto_model_on_a_seq2seq_folder_is_the_encoder(model, tmp_path):
    model.save_pretrained(tmp_path)
    encoder, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert type(encoder) is seqbert.SeqBertModel and encoder.pooler is None
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for name, tensor in encoder.state_dict().items():
        assert torch.equal(tensor, model.seqbert.state_dict()[name]), name
    src, mask = source_batch()
    with torch.no_grad():
        torch.testing.assert_close(
            encoder.eval()(input_ids=src, attention_mask=mask).last_hidden_state,
            model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state,
            rtol=0,
            atol=0,
        )


def test_shared_encoder_decoder_embeddings(tmp_path):
    shared = seqbert.SeqBertForConditionalGeneration(seq2seq_config(share_encoder_decoder_embeddings=True))
    words = shared.seqbert.embeddings.word_embeddings.weight
    assert shared.decoder.embeddings.word_embeddings.weight is words and shared.lm_head.decoder.weight is words
    separate = seqbert.SeqBertForConditionalGeneration(seq2seq_config())
    assert separate.decoder.embeddings.word_embeddings.weight is not separate.seqbert.embeddings.word_embeddings.weight
    assert sum(p.numel() for p in shared.parameters()) == sum(p.numel() for p in separate.parameters()) - words.numel()
    shared.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert loaded.decoder.embeddings.word_embeddings.weight is loaded.seqbert.embeddings.word_embeddings.weight
    assert torch.equal(loaded.seqbert.embeddings.word_embeddings.weight, words)
    with pytest.raises(ValueError, match="share_encoder_decoder_embeddings \\(True\\) requires tie_word_embeddings"):
        seq2seq_config(share_encoder_decoder_embeddings=True, tie_word_embeddings=False)


def test_hidden_states_attentions_and_tuples():
    torch.manual_seed(0)
    model = seqbert.SeqBertForConditionalGeneration(seq2seq_config(attn_implementation="eager")).eval()
    src, mask = source_batch()
    decoder_ids = torch.full((5, 4), 7)
    out = model(
        input_ids=src,
        attention_mask=mask,
        decoder_input_ids=decoder_ids,
        output_hidden_states=True,
        output_attentions=True,
    )
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 4
    assert len(out.encoder_attentions) == 2 and len(out.decoder_attentions) == 3 and len(out.cross_attentions) == 3
    assert out.decoder_attentions[0].shape == (5, 4, 4, 4) and out.cross_attentions[0].shape == (5, 4, 4, 9)
    assert torch.triu(out.decoder_attentions[0], diagonal=1).abs().max() == 0  # causal
    assert out.cross_attentions[0][1, :, :, 3:].abs().max() == 0  # source padding is never attended
    as_tuple = model(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_ids, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], out.logits)


def test_eager_equals_sdpa_for_seq2seq():
    torch.manual_seed(0)
    eager = seqbert.SeqBertForConditionalGeneration(seq2seq_config(attn_implementation="eager")).eval()
    sdpa = seqbert.SeqBertForConditionalGeneration(seq2seq_config(attn_implementation="sdpa")).eval()
    sdpa.load_state_dict(eager.state_dict())
    src, mask = source_batch()
    decoder_ids = torch.randint(3, TINY["vocab_size"], (5, 6), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        a = eager(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        b = sdpa(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert torch.equal(
        eager.generate(src, attention_mask=mask, max_new_tokens=6),
        sdpa.generate(src, attention_mask=mask, max_new_tokens=6),
    )


def test_pre_ln_sinusoidal_model_learns_to_reverse_sequences_from_scratch():
    torch.manual_seed(0)
    config = seqbert.SeqBertConfig(
        vocab_size=20, hidden_size=64, num_hidden_layers=2, num_decoder_layers=2, num_attention_heads=4,
        intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=16,
        type_vocab_size=0, norm_placement="pre", position_embedding_type="sinusoidal", scale_embedding=True,
        is_encoder_decoder=True, pad_token_id=PAD, decoder_start_token_id=START, eos_token_id=EOS,
    )  # fmt: skip
    model = seqbert.SeqBertForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def reversal_task(n, generator=None):
        src = torch.randint(3, 20, (n, 6), generator=generator)
        return src, torch.cat([src.flip(1), torch.full((n, 1), EOS)], dim=1)

    for _ in range(200):
        src, target = reversal_task(64)
        loss = model(input_ids=src, labels=target).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.02
    model.eval()
    src, target = reversal_task(100, torch.Generator().manual_seed(123))  # sequences it has not seen
    generated = model.generate(src, max_new_tokens=8, do_sample=False)
    assert torch.equal(generated[:, 1:8], target)


def test_pooled_heads_keep_their_pooler_on_a_seq2seq_config():
    """Sequence classification on a seq2seq config still pools [CLS]; only the bare encoder drops the pooler."""
    config = seq2seq_config()
    src, mask = source_batch()
    for head in (seqbert.SeqBertForSequenceClassification(config), seqbert.SeqBertForMultipleChoice(config)):
        assert head.seqbert.pooler is not None
    logits = seqbert.SeqBertForSequenceClassification(config).eval()(input_ids=src, attention_mask=mask).logits
    assert logits.shape == (5, 2)
    assert seqbert.SeqBertModel(config).pooler is None


@pytest.mark.parametrize("shared", [False, True], ids=["own_decoder_embeddings", "shared_embeddings"])
def test_resize_token_embeddings_resizes_every_side_together(shared, tmp_path):
    torch.manual_seed(0)
    model = seqbert.SeqBertForConditionalGeneration(seq2seq_config(share_encoder_decoder_embeddings=shared)).eval()
    old = {name: p.detach().clone() for name, p in model.named_parameters() if "word_embeddings" in name}
    model.resize_token_embeddings(120, mean_resizing=False)
    encoder, decoder = model.seqbert.embeddings.word_embeddings, model.decoder.embeddings.word_embeddings
    assert model.config.vocab_size == 120
    assert encoder.num_embeddings == decoder.num_embeddings == model.lm_head.decoder.out_features == 120
    assert model.lm_head.decoder.bias.shape == (120,)
    assert model.lm_head.decoder.weight is decoder.weight  # still tied
    assert (decoder.weight is encoder.weight) == shared
    for name, weight in old.items():  # the old rows are kept
        assert torch.equal(dict(model.named_parameters())[name][: TINY["vocab_size"]], weight), name
    new_ids = torch.tensor([[START, 110, 119]])
    out = model(
        input_ids=torch.tensor([[5, 115, 7]]), decoder_input_ids=new_ids, labels=torch.tensor([[110, 119, EOS]])
    )
    assert out.logits.shape == (1, 3, 120) and torch.isfinite(out.loss)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=torch.tensor([[5, 115]]), decoder_input_ids=new_ids).logits,
                           model(input_ids=torch.tensor([[5, 115]]), decoder_input_ids=new_ids).logits)  # fmt: skip


def test_resize_token_embeddings_refuses_to_drop_special_tokens():
    model = seqbert.SeqBertForConditionalGeneration(seq2seq_config(eos_token_id=50))
    with pytest.raises(ValueError, match=r"new_num_tokens \(40\) would drop eos_token_id \(50\)"):
        model.resize_token_embeddings(40)
    with pytest.raises(TypeError, match=r"new_num_tokens must be an int or None, got 40.0"):
        model.resize_token_embeddings(40.0)
    assert model.config.vocab_size == TINY["vocab_size"]  # nothing was resized


@pytest.mark.parametrize("build", ["auto_from_config", "constructor"])
def test_a_config_without_is_encoder_decoder_builds_a_working_seq2seq_model(build):
    """`AutoConfig.for_model("seqbert", ...)` and `SeqBertConfig(...)` keep `is_encoder_decoder=False` (what encoders
    need). The seq2seq model built from such a config used to fail in generate's first step with its own "needs
    decoder inputs ... or call generate()" message; now it takes a copy with the flag set, and gives exactly what the
    same weights give under an explicit seq2seq config. The caller's config object is left as it was."""
    fields = dict(TINY, pad_token_id=PAD, decoder_start_token_id=START, eos_token_id=EOS)
    if build == "auto_from_config":
        config = AutoConfig.for_model("seqbert", **fields)
        model = AutoModelForSeq2SeqLM.from_config(config)
    else:
        config = seqbert.SeqBertConfig(**fields)
        model = seqbert.SeqBertForConditionalGeneration(config)
    assert config.is_encoder_decoder is False and model.config.is_encoder_decoder is True
    reference = seqbert.SeqBertForConditionalGeneration(seq2seq_config(num_decoder_layers=TINY["num_hidden_layers"]))
    reference.load_state_dict(model.state_dict())
    model.eval(), reference.eval()
    ids, mask = source_batch()
    with torch.no_grad():
        generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, num_beams=2)
        assert torch.equal(
            generated, reference.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, num_beams=2)
        )
