"""Bad input at forward time and bad configs: each raises ValueError / TypeError naming the argument (or field), its
value and what is allowed, never an IndexError or a RuntimeError from inside torch.

Forward checks run on the real MiniLM weights (converted BERT) and real tokenized review snippets."""

import copy
import re

import pytest
import torch
from conftest import ENCODER_HEADS, tiny_config

import seqbert


@pytest.fixture(scope="module")
def batch(tokenizer, rt_texts):
    """Two real snippets, padded to the longer one (16 tokens at most)."""
    return dict(tokenizer(rt_texts[:2], padding=True, truncation=True, max_length=16, return_tensors="pt"))


@pytest.fixture(scope="module")
def models(minilm_path):
    """The real MiniLM checkpoint in every encoder head (eval mode)."""
    return {name: cls.from_bert_pretrained(minilm_path).eval() for name, cls in ENCODER_HEADS.items()}


def _with(batch, **changes):
    out = {k: v.clone() for k, v in batch.items()}
    out.update(changes)
    return {k: v for k, v in out.items() if v is not None}


def _set(tensor, index, value):
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


def _expect(error, message, call):
    with pytest.raises(error, match=message) as caught:
        with torch.no_grad():
            call()
    assert type(caught.value) is error  # not a subclass such as IndexError from deep inside torch
    return caught.value


# (case id, model, inputs built from the real batch, error, message regex)
ENCODER_CASES = [
    ("id-above-vocab", "model", lambda b: _with(b, input_ids=_set(b["input_ids"], (0, 3), 30522)),
     ValueError, r"input_ids holds 30522 at index \(0, 3\); allowed: \[0, vocab_size=30522\)"),
    ("negative-id", "cls", lambda b: _with(b, input_ids=_set(b["input_ids"], (1, 1), -1)),
     ValueError, r"input_ids holds -1 at index \(1, 1\); allowed: \[0, vocab_size=30522\)"),
    ("token-type-above-type-vocab", "model", lambda b: _with(b, token_type_ids=_set(b["token_type_ids"], (0, 2), 2)),
     ValueError, r"token_type_ids holds 2 at index \(0, 2\); allowed: \[0, type_vocab_size=2\)"),
    ("too-long-for-learned-positions", "model",
     lambda b: dict(input_ids=torch.full((1, 513), 1000), attention_mask=torch.ones(1, 513, dtype=torch.long)),
     ValueError, r"input_ids has sequence length 513, but the learned position embeddings cover "
                 r"max_position_embeddings=512 positions"),
    ("position-id-beyond-table", "model", lambda b: _with(b, position_ids=_set(torch.arange(16).expand(2, 16), (0, 0), 512)),
     ValueError, r"position_ids holds 512 at index \(0, 0\); allowed: \[0, max_position_embeddings=512\)"),
    ("mask-longer-than-ids", "model", lambda b: _with(b, attention_mask=torch.ones(2, 17, dtype=torch.long)),
     ValueError, r"attention_mask has shape \(2, 17\), but it must be \(2, 16\) like input_ids"),
    ("mask-other-batch", "cls", lambda b: _with(b, attention_mask=b["attention_mask"][:1]),
     ValueError, r"attention_mask has shape \(1, 16\), but it must be \(2, 16\)"),
    ("mask-1d", "model", lambda b: _with(b, attention_mask=b["attention_mask"][0]),
     ValueError, r"attention_mask must have shape \(batch_size, sequence_length\), got shape \(16,\)"),
    ("token-types-shorter", "model", lambda b: _with(b, token_type_ids=b["token_type_ids"][:, :5]),
     ValueError, r"token_type_ids has shape \(2, 5\), but it must be \(2, 16\) like input_ids"),
    ("float-ids", "model", lambda b: _with(b, input_ids=b["input_ids"].float()),
     TypeError, r"input_ids must hold integer ids \(torch.long or torch.int32\), got dtype torch.float32"),
    ("bool-ids", "model", lambda b: _with(b, input_ids=b["input_ids"] > 0),
     TypeError, r"input_ids must hold integer ids \(torch.long or torch.int32\), got dtype torch.bool"),
    ("list-ids", "model", lambda b: dict(input_ids=b["input_ids"].tolist()),
     TypeError, r"input_ids must be a torch.Tensor of shape \(batch_size, sequence_length\), got list"),
    ("1d-ids", "model", lambda b: dict(input_ids=b["input_ids"][0]),
     ValueError, r"input_ids must have shape \(batch_size, sequence_length\), got shape \(16,\)"),
    ("empty-batch", "model", lambda b: dict(input_ids=b["input_ids"][:0]),
     ValueError, r"input_ids has shape \(0, 16\): need at least one sequence of one token"),
    ("both-ids-and-embeds", "cls", lambda b: _with(b, inputs_embeds=torch.zeros(2, 16, 384)),
     ValueError, r"Specify exactly one of input_ids or inputs_embeds; got both"),
    ("neither-ids-nor-embeds", "mlm", lambda b: _with(b, input_ids=None),
     ValueError, r"Specify exactly one of input_ids or inputs_embeds; got neither"),
    ("embeds-wrong-width", "model", lambda b: dict(inputs_embeds=torch.zeros(2, 16, 383)),
     ValueError, r"inputs_embeds has width 383, but hidden_size is 384"),
    ("integer-embeds", "model", lambda b: dict(inputs_embeds=torch.zeros(2, 16, 384, dtype=torch.long)),
     TypeError, r"inputs_embeds must be a floating-point tensor, got dtype torch.int64"),
    # labels
    ("class-label-above-num-labels", "cls", lambda b: _with(b, labels=torch.tensor([1, 2])),
     ValueError, r"labels holds 2 at index \(1,\); allowed: \[0, num_labels=2\) or -100 \(no loss\)"),
    ("class-label-negative", "cls", lambda b: _with(b, labels=torch.tensor([-1, 0])),
     ValueError, r"labels holds -1 at index \(0,\)"),
    ("class-labels-per-token", "cls", lambda b: _with(b, labels=torch.zeros(2, 16, dtype=torch.long)),
     ValueError, r"labels has shape \(2, 16\), but single-label classification takes one class id per example: \(2,\)"),
    ("class-labels-other-batch", "cls", lambda b: _with(b, labels=torch.zeros(3, dtype=torch.long)),
     ValueError, r"labels has shape \(3,\), but single-label classification takes one class id per example: \(2,\)"),
    ("token-labels-shorter", "token", lambda b: _with(b, labels=torch.zeros(2, 15, dtype=torch.long)),
     ValueError, r"labels has shape \(2, 15\), but it must be \(2, 16\)"),
    ("token-label-above-num-labels", "token", lambda b: _with(b, labels=_set(torch.zeros(2, 16, dtype=torch.long), (1, 4), 7)),
     ValueError, r"labels holds 7 at index \(1, 4\); allowed: \[0, num_labels=2\) or -100"),
    ("mlm-labels-per-sequence", "mlm", lambda b: _with(b, labels=torch.zeros(2, dtype=torch.long)),
     ValueError, r"labels must have shape \(2, 16\), got shape \(2,\)"),
    ("mlm-label-above-vocab", "mlm", lambda b: _with(b, labels=_set(torch.full((2, 16), -100), (0, 5), 40000)),
     ValueError, r"labels holds 40000 at index \(0, 5\); allowed: \[0, vocab_size=30522\) or -100"),
    ("float-class-labels-for-token-classification", "token", lambda b: _with(b, labels=torch.zeros(2, 16)),
     TypeError, r"labels must hold integer ids \(torch.long or torch.int32\), got dtype torch.float32"),
    ("qa-only-start", "qa", lambda b: _with(b, start_positions=torch.tensor([1, 2])),
     ValueError, r"only start_positions was given: the QA loss needs both start_positions and end_positions"),
    ("qa-negative-end", "qa", lambda b: _with(b, start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, -4])),
     ValueError, r"end_positions holds -4 at index \(1,\); allowed: >= 0"),
    ("qa-positions-per-token", "qa",
     lambda b: _with(b, start_positions=torch.zeros(2, 16, dtype=torch.long), end_positions=torch.zeros(2, 16, dtype=torch.long)),
     ValueError, r"start_positions has shape \(2, 16\), but it must be \(2,\)"),
    ("choice-2d-ids", "choice", lambda b: dict(input_ids=b["input_ids"]),
     ValueError, r"input_ids must have shape \(batch_size, num_choices, sequence_length\), got shape \(2, 16\)"),
    ("choice-mask-unlike-ids", "choice",
     lambda b: dict(input_ids=b["input_ids"][None], attention_mask=b["attention_mask"][None, :, :8]),
     ValueError, r"attention_mask has shape \(1, 2, 8\), but it must be \(1, 2, 16\) like input_ids"),
    ("choice-label-above-num-choices", "choice", lambda b: dict(input_ids=b["input_ids"][None], labels=torch.tensor([2])),
     ValueError, r"labels holds 2 at index \(0,\); allowed: \[0, num_choices=2\) or -100"),
]  # fmt: skip


@pytest.mark.parametrize("case", ENCODER_CASES, ids=[case[0] for case in ENCODER_CASES])
def test_bad_encoder_input_names_the_argument(models, batch, case):
    _, model_name, make_inputs, error, message = case
    inputs = make_inputs(batch)
    _expect(error, message, lambda: models[model_name](**inputs))


def test_the_same_inputs_without_the_defect_run(models, batch):
    """The real batch itself is accepted by every head, with labels of every kind (so the cases above fail only on
    their defect)."""
    with torch.no_grad():
        assert models["model"](**batch).last_hidden_state.shape == (2, 16, 384)
        assert models["cls"](**batch, labels=torch.tensor([1, -100])).loss.isfinite()
        assert models["token"](**batch, labels=torch.ones(2, 16, dtype=torch.long)).loss.isfinite()
        assert models["mlm"](**batch, labels=_set(torch.full((2, 16), -100), (0, 5), 30521)).loss.isfinite()
        qa = models["qa"](**batch, start_positions=torch.tensor([1, 40]), end_positions=torch.tensor([[3], [40]]))
        assert qa.loss.isfinite()  # a position beyond the sequence is ignored, as in BERT
        choice = {k: v[None] for k, v in batch.items()}
        assert models["choice"](**choice, labels=torch.tensor([1])).loss.isfinite()


def test_sequence_classification_labels_follow_the_problem_type(models, batch):
    model = copy.deepcopy(models["cls"])
    model.config.problem_type = "multi_label_classification"
    with torch.no_grad():
        assert model(**batch, labels=torch.tensor([[1, 0], [1, 1]])).loss.isfinite()  # int multi-hot -> float
        _expect(
            ValueError,
            r"labels has shape \(2,\), but it must be \(2, 2\) \(multi_label_classification",
            lambda: model(**batch, labels=torch.tensor([1, 0])),
        )
        _expect(
            ValueError,
            r"multi-hot targets in \[0, 1\]",
            lambda: model(**batch, labels=torch.tensor([[2.0, 0.0], [1.0, 0.0]])),
        )
    regression = seqbert.SeqBertForSequenceClassification(tiny_config(num_labels=1)).eval()
    ids = torch.randint(1, 99, (3, 5))
    with torch.no_grad():
        assert regression(ids, labels=torch.tensor([1, 5, 3])).loss.isfinite()  # int targets -> float, as intended
        _expect(ValueError, r"labels has shape \(3, 2\), but regression with num_labels=1 takes one target per example: \(3,\)",
                lambda: regression(ids, labels=torch.zeros(3, 2)))  # fmt: skip


def test_sinusoidal_positions_extend_past_max_position_embeddings():
    """With sinusoidal positions `max_position_embeddings` does not bind: a model whose table size says 8 runs 20
    tokens and gives exactly what the same weights give with a size of 64."""
    torch.manual_seed(0)
    short = seqbert.SeqBertModel(tiny_config(position_embedding_type="sinusoidal", max_position_embeddings=8)).eval()
    long = seqbert.SeqBertModel(tiny_config(position_embedding_type="sinusoidal", max_position_embeddings=64)).eval()
    long.load_state_dict(short.state_dict())
    ids = torch.randint(1, 99, (2, 20))
    with torch.no_grad():
        out = short(ids).last_hidden_state
        assert torch.equal(out, long(ids).last_hidden_state) and out.isfinite().all()
        _expect(ValueError, r"position_ids holds -1 at index \(0, 0\); allowed: >= 0",
                lambda: short(ids, position_ids=_set(torch.arange(20)[None], (0, 0), -1)))  # fmt: skip


def test_segment_ids_without_segment_embeddings():
    model = seqbert.SeqBertModel(tiny_config(type_vocab_size=0)).eval()
    ids = torch.randint(1, 99, (2, 6))
    with torch.no_grad():
        zeros = model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state  # what tokenizers return: fine
        assert torch.equal(zeros, model(ids).last_hidden_state)
        _expect(ValueError, r"token_type_ids holds non-zero segment ids, but the model has no segment embeddings "
                r"\(type_vocab_size=0\)", lambda: model(ids, token_type_ids=torch.ones_like(ids)))  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Seq2seq
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert2bert(minilm_path):
    """MiniLM warm-started into encoder and decoder (BERT2BERT), decoding from [CLS] to [SEP]."""
    return seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path).eval()


@pytest.fixture(scope="module")
def pair(tokenizer):
    source = tokenizer(["In the beginning God created the heaven and the earth."], return_tensors="pt")
    target = tokenizer(["In the beginning, God created the heavens and the earth."], return_tensors="pt").input_ids
    return dict(source), target


SEQ2SEQ_CASES = [
    ("no-decoder-inputs-no-labels", lambda s, t: dict(s),
     ValueError, r"SeqBertForConditionalGeneration needs decoder inputs: pass labels"),
    ("label-above-vocab", lambda s, t: dict(s, labels=_set(t, (0, 2), 30522)),
     ValueError, r"labels holds 30522 at index \(0, 2\); allowed: \[0, vocab_size=30522\) or -100"),
    ("float-labels", lambda s, t: dict(s, labels=t.float()),
     TypeError, r"labels must hold integer ids \(torch.long or torch.int32\), got dtype torch.float32"),
    ("labels-unlike-decoder-inputs", lambda s, t: dict(s, labels=t, decoder_input_ids=t[:, :-1]),
     ValueError, r"labels has shape \(1, 14\), but it must be \(1, 13\) like the decoder inputs"),
    ("decoder-id-above-vocab", lambda s, t: dict(s, decoder_input_ids=_set(t, (0, 1), 99999)),
     ValueError, r"decoder_input_ids holds 99999 at index \(0, 1\); allowed: \[0, vocab_size=30522\)"),
    ("decoder-mask-unlike-ids", lambda s, t: dict(s, decoder_input_ids=t, decoder_attention_mask=torch.ones(1, 3)),
     ValueError, r"decoder_attention_mask has shape \(1, 3\), but it must be \(1, 14\)"),
    ("source-mask-unlike-ids", lambda s, t: dict(s, attention_mask=s["attention_mask"][:, 1:], labels=t),
     ValueError, r"attention_mask has shape \(1, 12\), but it must be \(1, 13\) like input_ids"),
    ("target-too-long", lambda s, t: dict(s, decoder_input_ids=torch.full((1, 513), 1000)),
     ValueError, r"the decoder reached position 512 \(0 cached \+ 513 new tokens\), but the learned position "
                 r"embeddings cover max_position_embeddings=512"),
    ("both-decoder-ids-and-embeds", lambda s, t: dict(s, decoder_input_ids=t, decoder_inputs_embeds=torch.zeros(1, 16, 384)),
     ValueError, r"Specify exactly one of decoder_input_ids or decoder_inputs_embeds; got both"),
]  # fmt: skip


@pytest.mark.parametrize("case", SEQ2SEQ_CASES, ids=[case[0] for case in SEQ2SEQ_CASES])
def test_bad_seq2seq_input_names_the_argument(bert2bert, pair, case):
    _, make_inputs, error, message = case
    inputs = make_inputs(*pair)
    _expect(error, message, lambda: bert2bert(**inputs))


def test_seq2seq_labels_need_a_decoder_start_token(bert2bert, pair):
    source, target = pair
    model = copy.deepcopy(bert2bert)
    with torch.no_grad():
        assert model(**source, labels=target).loss.isfinite()
        model.config.decoder_start_token_id = None
        model.generation_config.decoder_start_token_id = None
        _expect(ValueError, r"config.decoder_start_token_id is None, but building decoder_input_ids from labels needs "
                r"a token id there", lambda: model(**source, labels=target))  # fmt: skip
        assert model(**source, decoder_input_ids=target).logits.isfinite().all()  # explicit inputs need no start id


def test_generation_past_the_position_table_fails_clearly():
    config = tiny_config(is_encoder_decoder=True, max_position_embeddings=12, decoder_start_token_id=2, eos_token_id=3)
    model = seqbert.SeqBertForConditionalGeneration(config).eval()
    source = torch.randint(4, 99, (1, 6))
    # The decoder reads start + 11 generated tokens (positions 0..11); the 12th generated token is never fed back.
    assert model.generate(source, max_new_tokens=12, min_new_tokens=12).shape == (1, 13)
    _expect(ValueError, r"the decoder reached position 12 \(12 cached \+ 1 new tokens\), but the learned position "
            r"embeddings cover max_position_embeddings=12 positions", lambda: model.generate(source, max_new_tokens=13,
            min_new_tokens=13))  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Config validation (construction, models built on a config changed afterwards, save_pretrained)
# --------------------------------------------------------------------------------------------------------------------

CONFIG_CASES = [
    (dict(num_labels=0), ValueError, r"num_labels \(0\) must be >= 1"),
    (dict(problem_type="ranking"), ValueError, r"problem_type \('ranking'\) must be None or one of \('regression'"),
    (dict(is_encoder_decoder="yes"), TypeError, r"is_encoder_decoder must be a bool, got 'yes' of type str"),
    (dict(tie_word_embeddings=1), TypeError, r"tie_word_embeddings must be a bool, got 1 of type int"),
    (dict(use_cache=None), TypeError, r"use_cache must be a bool, got None"),
    (dict(is_encoder_decoder=True, num_decoder_layers=0), ValueError,
     r"num_decoder_layers \(0\) must be >= 1 when is_encoder_decoder is True"),
    (dict(share_encoder_decoder_embeddings=True), ValueError,
     r"share_encoder_decoder_embeddings \(True\) requires is_encoder_decoder \(False\) to be True"),
    (dict(is_encoder_decoder=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=False), ValueError,
     r"share_encoder_decoder_embeddings \(True\) requires tie_word_embeddings \(False\) to be True"),
    (dict(is_encoder_decoder=True, decoder_start_token_id=99), ValueError,
     r"decoder_start_token_id \(99\) must be < vocab_size \(99\)"),
    (dict(is_encoder_decoder=True, decoder_start_token_id=-1), ValueError, r"decoder_start_token_id \(-1\) must be >= 0"),
    (dict(num_decoder_layers=2.0), TypeError, r"num_decoder_layers must be an int, got 2.0"),
    (dict(intermediate_size="37"), TypeError, r"intermediate_size must be an int, got '37' of type str"),
    # Found by the config fuzzing: transformers itself fails on it with a bare TypeError from range().
    (dict(num_labels=None), TypeError, r"num_labels must be an int, got None of type NoneType"),
]  # fmt: skip


@pytest.mark.parametrize("kwargs,error,message", CONFIG_CASES, ids=[re.sub(r"\W", "", str(c[0])) for c in CONFIG_CASES])
def test_bad_config_fields_name_the_field(kwargs, error, message):
    _expect(error, message, lambda: tiny_config(**kwargs))


def test_a_config_changed_after_construction_is_checked_when_a_model_is_built_or_saved(tmp_path):
    config = tiny_config()
    config.num_attention_heads = 5
    for build in (seqbert.SeqBertModel, seqbert.SeqBertForMaskedLM):
        _expect(
            ValueError, r"hidden_size \(32\) must be divisible by num_attention_heads \(5\)", lambda b=build: b(config)
        )
    _expect(ValueError, r"hidden_size \(32\) must be divisible", lambda: config.save_pretrained(tmp_path / "saved"))
    assert not (tmp_path / "saved" / "config.json").exists()
    _expect(TypeError, r"config must be a SeqBertConfig, got BertConfig",
            lambda: seqbert.SeqBertModel(__import__("transformers").BertConfig()))  # fmt: skip


def test_question_answering_needs_two_labels():
    _expect(ValueError, r"num_labels \(3\) must be 2 for SeqBertForQuestionAnswering: one start and one end logit",
            lambda: seqbert.SeqBertForQuestionAnswering(tiny_config(num_labels=3)))  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Faults the fuzzing found (tests/test_fuzz.py): each now fails clearly
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1, 0), (1, 0, 4), (0, 2, 4)])
def test_multiple_choice_with_an_empty_dimension(models, shape):
    """(1, 1, 0) raised `cannot reshape tensor of 0 elements` from the multiple-choice forward's flattening."""
    _expect(ValueError, re.escape(f"input_ids has shape {shape}: need at least one example, one choice and one token"),
            lambda: models["choice"](input_ids=torch.zeros(shape, dtype=torch.long)))  # fmt: skip


GENERATE_CASES = [
    ("empty-prompt", dict(input_ids=torch.zeros(2, 0, dtype=torch.long)),
     r"input_ids has shape \(2, 0\): generate needs at least one sequence of at least one token"),
    ("no-beams", dict(num_beams=0), r"num_beams \(0\) must be >= 1"),
    ("negative-beams", dict(num_beams=-1), r"num_beams \(-1\) must be >= 1"),
    ("no-return-sequences", dict(num_return_sequences=0), r"num_return_sequences \(0\) must be >= 1"),
    ("eos-beyond-vocab", dict(eos_token_id=[3, 1000000]),
     r"eos_token_id \(\[3, 1000000\]\) holds 1000000, but token ids must lie in \[0, vocab_size=99\)"),
    ("pad-beyond-vocab", dict(pad_token_id=99), r"pad_token_id \(99\) holds 99, but token ids must lie in"),
    ("negative-forced-eos", dict(forced_eos_token_id=-1), r"forced_eos_token_id \(-1\) holds -1"),
    ("bad-word-beyond-vocab", dict(bad_words_ids=[[5], [7, 120]]), r"bad_words_ids \(\[\[5\], \[7, 120\]\]\) holds 120"),
    ("float-eos", dict(eos_token_id=2.0), r"eos_token_id \(2.0\) must hold int token ids, got 2.0"),
]  # fmt: skip


@pytest.mark.parametrize("head", ["seq2seq", "causal"])
@pytest.mark.parametrize("case", GENERATE_CASES, ids=[case[0] for case in GENERATE_CASES])
def test_bad_generate_arguments_fail_clearly(head, case):
    """Found by the generate fuzzing: transformers uses these settings unchecked, and ended in an IndexError (token
    ids outside the vocabulary, an empty prompt), a ZeroDivisionError or a negative tensor size (num_beams), or
    sequences holding an id the model does not have (pad_token_id)."""
    _, kwargs, message = case
    torch.manual_seed(0)
    if head == "seq2seq":
        config = tiny_config(is_encoder_decoder=True, decoder_start_token_id=1, eos_token_id=2)
        model = seqbert.SeqBertForConditionalGeneration(config).eval()
    else:
        model = seqbert.SeqBertForCausalLM(tiny_config(eos_token_id=2)).eval()
    valid = dict(input_ids=torch.randint(3, 99, (2, 5)), max_new_tokens=3)
    error = TypeError if "float" in case[0] else ValueError
    _expect(error, message, lambda: model.generate(**{**valid, **kwargs}))
    with torch.no_grad():  # the same call without the defect generates
        assert model.generate(**valid).shape[0] == 2
