"""Properties over random tiny configs and inputs (hypothesis): padding invariance, batch invariance, save/load
identity, cached == uncached decoding. The fuzz tests (random inputs, only documented exceptions) are in
tests/test_fuzz.py."""

import copy
import tempfile

import torch
from conftest import ENCODER_HEADS
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbert
from seqbert.transformers_compat import CACHE_NAME


TOLERANCE = 1e-5
VOCAB = 60


@st.composite
def configs(draw, **fixed):
    heads = draw(st.sampled_from([1, 2, 4]))
    fields = dict(
        vocab_size=VOCAB,
        hidden_size=heads * draw(st.sampled_from([4, 8])),
        num_hidden_layers=draw(st.integers(1, 3)),
        num_attention_heads=heads,
        intermediate_size=draw(st.sampled_from([8, 24])),
        max_position_embeddings=24,
        type_vocab_size=draw(st.integers(0, 2)),
        norm_placement=draw(st.sampled_from(["pre", "post"])),
        position_embedding_type=draw(st.sampled_from(["learned", "sinusoidal"])),
        scale_embedding=draw(st.booleans()),
        attn_implementation=draw(st.sampled_from(["eager", "sdpa"])),
    )
    fields.update(fixed)
    return seqbert.SeqBertConfig(**fields)


def _model(model_class, config, seed: int):
    torch.manual_seed(seed)
    return model_class(copy.deepcopy(config)).eval()


def _right_padded(sequences: list[torch.Tensor], length: int, pad_id: int) -> dict:
    ids = torch.full((len(sequences), length), pad_id)
    mask = torch.zeros(len(sequences), length, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1
    return dict(input_ids=ids, attention_mask=mask)


@settings(max_examples=30, deadline=None)
@given(
    config=configs(),
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    extra=st.integers(0, 8),
    pad_id=st.integers(0, VOCAB - 1),
    seed=st.integers(0, 2**16),
)
def test_padding_and_batch_invariance(config, lengths, extra, pad_id, seed):
    """Each sequence alone (no padding at all) gives what it gives inside a right-padded batch of other sequences,
    whatever the pad id and however much padding follows."""
    model = _model(seqbert.SeqBertModel, config, seed)
    generator = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(1, VOCAB, (n,), generator=generator) for n in lengths]
    batch = _right_padded(sequences, max(lengths) + extra, pad_id)
    with torch.no_grad():
        batched = model(**batch).last_hidden_state
        for row, sequence in enumerate(sequences):
            alone = model(sequence[None]).last_hidden_state[0]
            assert (batched[row, : len(sequence)] - alone).abs().max().item() <= TOLERANCE


HEADS = [head for name, head in ENCODER_HEADS.items() if name != "choice"]  # choice takes 3-D inputs


@settings(max_examples=15, deadline=None)
@given(config=configs(), head=st.sampled_from(HEADS), seed=st.integers(0, 2**16))
def test_save_load_identity(config, head, seed):
    """save_pretrained -> from_pretrained gives every tensor bit for bit and the same outputs."""
    model = _model(head, config, seed)
    inputs = dict(input_ids=torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(seed)))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        # The attention backend is a loading choice, not part of the saved config (as in transformers).
        loaded = head.from_pretrained(folder, attn_implementation=model.config._attn_implementation).eval()
    assert loaded.config.to_diff_dict() == model.config.to_diff_dict()
    original, reloaded = model.state_dict(), loaded.state_dict()
    assert original.keys() == reloaded.keys()
    assert all(torch.equal(original[k], reloaded[k]) for k in original)
    with torch.no_grad():
        for a, b in zip(model(**inputs).to_tuple(), loaded(**inputs).to_tuple(), strict=True):
            assert torch.equal(a, b)


@settings(max_examples=15, deadline=None)
@given(
    config=configs(is_encoder_decoder=True, decoder_start_token_id=1, eos_token_id=2),
    num_decoder_layers=st.integers(1, 3),
    source_lengths=st.lists(st.integers(1, 10), min_size=1, max_size=3),
    num_beams=st.sampled_from([1, 3]),
    seed=st.integers(0, 2**16),
)
def test_cached_decoding_equals_uncached(config, num_decoder_layers, source_lengths, num_beams, seed):
    """Generation with the key/value cache gives the same ids as recomputing every step, and the cached step-by-step
    logits equal one full teacher-forced forward."""
    config.num_decoder_layers = num_decoder_layers
    model = _model(seqbert.SeqBertForConditionalGeneration, config, seed)
    generator = torch.Generator().manual_seed(seed)
    source = _right_padded(
        [torch.randint(3, VOCAB, (n,), generator=generator) for n in source_lengths], max(source_lengths), 0
    )
    settings_ = dict(max_new_tokens=8, num_beams=num_beams, do_sample=False)
    with torch.no_grad():
        cached = model.generate(**source, use_cache=True, **settings_)
        uncached = model.generate(**source, use_cache=False, **settings_)
        assert torch.equal(cached, uncached)

        target = torch.randint(3, VOCAB, (len(source_lengths), 7), generator=generator)
        full = model(**source, decoder_input_ids=target).logits
        encoder_outputs = model.get_encoder()(**source)
        past, steps = None, []
        for t in range(target.shape[1]):
            out = model(
                attention_mask=source["attention_mask"],
                encoder_outputs=encoder_outputs,
                decoder_input_ids=target[:, t : t + 1],
                **{CACHE_NAME: past},
                use_cache=True,
            )
            past = getattr(out, CACHE_NAME)
            steps.append(out.logits)
    assert (torch.cat(steps, dim=1) - full).abs().max().item() <= TOLERANCE
