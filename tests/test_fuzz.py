"""Fuzz tests (hypothesis) over the surface users reach: every head's forward on random shapes, dtypes and values;
`generate` of both generation models with random keyword arguments; `SeqBertConfig.from_dict` on random field values;
and `from_pretrained` of damaged saved folders. Each case must end in a documented exception whose message names what
is wrong, or in a correct result with finite values: never a deep torch error, an `IndexError` or a NaN.

In README's test command these run the deterministic "ci" profile (tests/conftest.py): the same examples every run.
The long campaign draws new ones on every run, over 20,000 examples with tests/test_fuzz_scripts.py (see the testing
docs):

    SEQBERT_HYPOTHESIS_PROFILE=campaign python -m pytest -m fuzz -p no:cacheprovider --hypothesis-show-statistics

Each test records what it drew and how it ended with `hypothesis.event`, which those statistics list.
"""

import json
import os
import shutil
import tempfile

import pytest
import torch
from conftest import ENCODER_HEADS, fuzz_examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import seqbert
from seqbert.checkpoint_loading import MismatchedSizesError


pytestmark = pytest.mark.fuzz

VOCAB = 60
FUZZ_CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=12,
    type_vocab_size=2,
    decoder_start_token_id=1,
    eos_token_id=2,
)
FUZZ_HEADS = {**ENCODER_HEADS, "seq2seq": seqbert.SeqBertForConditionalGeneration}
FUZZ_MODELS = {}


def _fuzz_model(head: str, attn_implementation: str, position_embedding_type: str):
    """One seeded tiny model per (head, attention backend, position type), built once per process. The strategies
    draw these keys, not models, so that a failing example prints as a few words."""
    key = (head, attn_implementation, position_embedding_type)
    if key not in FUZZ_MODELS:
        config = seqbert.SeqBertConfig(
            **FUZZ_CONFIG,
            is_encoder_decoder=head == "seq2seq",
            attn_implementation=attn_implementation,
            position_embedding_type=position_embedding_type,
        )
        model_class = seqbert.SeqBertForCausalLM if head == "causal" else FUZZ_HEADS[head]
        torch.manual_seed(0)
        FUZZ_MODELS[key] = model_class(config).eval()
    return FUZZ_MODELS[key]


def _assert_finite(outputs, context) -> None:
    for value in outputs:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            assert torch.isfinite(value).all(), context


# --------------------------------------------------------------------------------------------------------------------
# Forward: random shapes, dtypes and values; only ValueError / TypeError may come out
# --------------------------------------------------------------------------------------------------------------------

DTYPES = [torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.float32, torch.float16]


@st.composite
def fuzz_tensors(draw, shape, valid=(0, VOCAB - 1), dtypes=DTYPES):
    """A tensor shaped like `shape` most of the time (else one dimension changed, added or dropped), int64 most of the
    time (else a random dtype), with values in the `valid` range most of the time (else 3 beyond it either side)."""
    shape = list(shape)
    change = draw(st.sampled_from(["keep"] * 15 + ["resize", "add", "drop"]))
    if change == "resize" and shape:
        shape[draw(st.integers(0, len(shape) - 1))] = draw(st.integers(0, 14))
    elif change == "add":
        shape.append(draw(st.integers(1, 3)))
    elif change == "drop" and shape:
        shape.pop()
    dtype = draw(st.sampled_from([dtypes[0]] * 20 + dtypes))
    low, high = valid
    if draw(st.integers(0, 5)) == 0:
        low, high = low - 3, high + 3
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    values = torch.randint(low, high + 1, shape, generator=generator)
    if dtype in (torch.uint8, torch.bool):
        values = values.clamp(min=0)
    return values.to(dtype)


@st.composite
def fuzz_calls(draw):
    head = draw(st.sampled_from(list(FUZZ_HEADS)))
    model = (head, draw(st.sampled_from(["eager", "sdpa"])), draw(st.sampled_from(["learned", "sinusoidal"])))
    batch_size, seq_len = draw(st.integers(1, 3)), draw(st.integers(1, 14))  # 13 and 14 exceed the learned table
    shape = (batch_size, draw(st.integers(1, 3)), seq_len) if head == "choice" else (batch_size, seq_len)
    ids_dtypes = DTYPES  # mostly int64 and valid values (see fuzz_tensors), so the valid paths are fuzzed too
    kwargs = {"input_ids": draw(fuzz_tensors(shape, dtypes=ids_dtypes))}
    masks = [torch.int64, torch.bool, torch.float32]
    if draw(st.booleans()):
        kwargs["attention_mask"] = draw(fuzz_tensors(shape, valid=(0, 1), dtypes=masks))
    if draw(st.booleans()):
        kwargs["token_type_ids"] = draw(fuzz_tensors(shape, valid=(0, 1), dtypes=ids_dtypes))
    if draw(st.booleans()) and head != "seq2seq":
        kwargs["position_ids"] = draw(fuzz_tensors(shape, valid=(0, 11), dtypes=ids_dtypes))
    if draw(st.booleans()) and head == "model":  # embeddings instead of ids
        kwargs["inputs_embeds"] = draw(fuzz_tensors((*shape, 16), dtypes=[torch.float32, torch.int64]))
        if draw(st.booleans()):
            del kwargs["input_ids"]
    if head == "seq2seq":
        kwargs.pop("token_type_ids", None)
        target_shape = (batch_size, draw(st.integers(1, 14)))
        if draw(st.booleans()):
            kwargs["labels"] = draw(fuzz_tensors(target_shape, dtypes=ids_dtypes))
        if draw(st.booleans()):
            kwargs["decoder_input_ids"] = draw(fuzz_tensors(target_shape, dtypes=ids_dtypes))
        if draw(st.booleans()):
            kwargs["decoder_attention_mask"] = draw(fuzz_tensors(target_shape, valid=(0, 1), dtypes=masks))
    elif draw(st.booleans()):
        label_shapes = {
            "mlm": shape,
            "token": shape,
            "cls": (batch_size,),
            "choice": (batch_size,),
            "qa": (batch_size,),
            "model": None,
        }
        if label_shapes[head] is not None:
            labels = draw(fuzz_tensors(label_shapes[head], valid=(0, 1), dtypes=ids_dtypes))
            if head == "qa":
                kwargs["start_positions"] = labels
                if draw(st.booleans()):
                    kwargs["end_positions"] = labels.flip(0)
            else:
                kwargs["labels"] = labels
    return head, model, kwargs


@settings(max_examples=fuzz_examples(ci=300, campaign=9000), suppress_health_check=[HealthCheck.too_slow])
@given(fuzz_calls())
def test_fuzz_forward_only_documented_exceptions(call):
    head, model_key, kwargs = call
    model = _fuzz_model(*model_key)
    event(f"head: {head}")
    try:
        with torch.no_grad():
            out = model(**kwargs)
    except (ValueError, TypeError) as error:
        event(f"outcome: {type(error).__name__}")
        message = str(error)
        assert any(name in message for name in (*kwargs, "input", "decoder", "labels", "position")), message
        return
    event("outcome: ran")
    _assert_finite(out.to_tuple(), (head, {k: (v.dtype, tuple(v.shape)) for k, v in kwargs.items()}))


# --------------------------------------------------------------------------------------------------------------------
# generate: random keyword arguments on the seq2seq model and the causal LM
# --------------------------------------------------------------------------------------------------------------------

# A token id drawn for a generate argument: valid most of the time, else beyond the vocabulary or negative.
token_ids = st.one_of(st.integers(0, VOCAB - 1), st.integers(0, VOCAB - 1), st.sampled_from([-1, VOCAB, 10**6]))


@st.composite
def generate_calls(draw):
    head = draw(st.sampled_from(["seq2seq", "causal"]))
    model = (head, draw(st.sampled_from(["eager", "sdpa"])), draw(st.sampled_from(["learned", "sinusoidal"])))
    batch_size, length = draw(st.integers(1, 3)), draw(st.integers(0, 8))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    inputs = {"input_ids": torch.randint(3, VOCAB, (batch_size, length), generator=generator)}
    if draw(st.booleans()) and length > 1:  # right padding for seq2seq sources, left padding for causal prompts
        lengths = torch.randint(1, length + 1, (batch_size,), generator=generator)
        positions = torch.arange(length)[None, :]
        real = positions < lengths[:, None] if head == "seq2seq" else positions >= length - lengths[:, None]
        inputs["attention_mask"] = real.long()
        inputs["input_ids"] = inputs["input_ids"].masked_fill(~real, 0)
    options = {
        "max_new_tokens": st.integers(-1, 12),
        "max_length": st.integers(-1, 20),
        "min_new_tokens": st.integers(-1, 6),
        "min_length": st.integers(-1, 10),
        "num_beams": st.integers(-1, 4),
        "num_return_sequences": st.integers(0, 4),
        "do_sample": st.booleans(),
        "temperature": st.sampled_from([0.0, 0.5, 1.0, 1.7, -1.0]),
        "top_k": st.integers(-1, 10),
        "top_p": st.sampled_from([0.0, 0.3, 0.9, 1.0, 1.5]),
        "repetition_penalty": st.sampled_from([0.0, 0.8, 1.0, 1.3, -1.0]),
        "no_repeat_ngram_size": st.integers(0, 3),
        "length_penalty": st.sampled_from([-1.0, 0.0, 1.0, 2.0]),
        "early_stopping": st.booleans(),
        "use_cache": st.booleans(),
        "eos_token_id": st.one_of(token_ids, st.lists(token_ids, min_size=1, max_size=2)),
        "pad_token_id": token_ids,
        "bos_token_id": token_ids,
        "bad_words_ids": st.lists(st.lists(token_ids, min_size=1, max_size=2), min_size=1, max_size=2),
        "suppress_tokens": st.lists(token_ids, min_size=1, max_size=2),
        "begin_suppress_tokens": st.lists(token_ids, min_size=1, max_size=2),
        "forced_eos_token_id": token_ids,
        "output_scores": st.booleans(),
    }
    if head == "seq2seq":
        options["decoder_start_token_id"] = token_ids
        options["forced_bos_token_id"] = token_ids
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=6, unique=True))
    kwargs = {name: draw(options[name]) for name in chosen}
    if kwargs.get("output_scores"):
        kwargs["return_dict_in_generate"] = True
    if "max_new_tokens" not in kwargs and "max_length" not in kwargs:
        kwargs["max_new_tokens"] = draw(st.integers(1, 6))  # keep the default run short
    return head, model, inputs, kwargs


@settings(max_examples=fuzz_examples(ci=80, campaign=6000), suppress_health_check=[HealthCheck.too_slow])
@given(generate_calls())
def test_fuzz_generate_only_documented_exceptions(call):
    """`generate` with random lengths, beams, sampling settings and token ids (valid, beyond the vocabulary,
    negative): a `ValueError` / `TypeError` naming what is wrong, or sequences of valid token ids with finite scores."""
    head, model_key, inputs, kwargs = call
    model = _fuzz_model(*model_key)
    event(f"head: {head}")
    event(f"arguments: {len(kwargs)}")
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            out = model.generate(**inputs, **kwargs)
    except (ValueError, TypeError) as error:
        event(f"outcome: {type(error).__name__}")
        assert str(error).strip(), "an exception without a message"
        return
    event("outcome: ran")
    sequences = out.sequences if kwargs.get("return_dict_in_generate") else out
    assert sequences.dtype == torch.long
    assert sequences.shape[0] == inputs["input_ids"].shape[0] * kwargs.get("num_return_sequences", 1)
    valid = (sequences >= 0) & (sequences < VOCAB)
    # transformers writes the pad id (else the first eos id) after a sequence ends: a negative one ("no such token",
    # accepted as transformers accepts it) can stand there.
    for name in ("pad_token_id", "eos_token_id"):
        for token in kwargs.get(name) if isinstance(kwargs.get(name), list) else [kwargs.get(name)]:
            if isinstance(token, int) and token < 0:
                valid |= sequences == token
    assert bool(valid.all()), (kwargs, sequences)
    for scores in getattr(out, "scores", None) or ():
        assert not torch.isnan(scores).any(), kwargs  # -inf marks tokens a logits processor ruled out


# --------------------------------------------------------------------------------------------------------------------
# SeqBertConfig.from_dict on random field values
# --------------------------------------------------------------------------------------------------------------------

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.5, -0.1, 1e-12, float("nan"), float("inf")]),
    st.sampled_from(["", "pre", "post", "learned", "sinusoidal", "gelu", "relu", "last_layer", "same_layer", "x"]),
    st.lists(st.integers(0, 3), max_size=2),
)
# The fields, each with values that are mostly plausible, so that valid configs (and the models they build) are
# fuzzed too; ANY_VALUE covers wrong types and out-of-range values.
CONFIG_FIELDS = {
    "vocab_size": st.integers(1, 70),
    "hidden_size": st.sampled_from([4, 8, 16, 24]),
    "num_hidden_layers": st.integers(0, 3),
    "num_decoder_layers": st.integers(0, 3),
    "num_attention_heads": st.sampled_from([1, 2, 3, 4]),
    "intermediate_size": st.integers(1, 40),
    "hidden_act": st.sampled_from(["gelu", "relu", "gelu_new", "silu", "tanh"]),
    "hidden_dropout_prob": st.sampled_from([0.0, 0.1, 0.5]),
    "attention_probs_dropout_prob": st.sampled_from([0.0, 0.1, 0.5]),
    "max_position_embeddings": st.integers(1, 40),
    "type_vocab_size": st.integers(0, 3),
    "initializer_range": st.sampled_from([0.002, 0.02, 0.2]),
    "layer_norm_eps": st.sampled_from([1e-12, 1e-5, 0.1]),
    "norm_placement": st.sampled_from(["pre", "post"]),
    "position_embedding_type": st.sampled_from(["learned", "sinusoidal"]),
    "scale_embedding": st.booleans(),
    "classifier_dropout": st.sampled_from([None, 0.0, 0.3]),
    "pad_token_id": st.integers(0, 5),
    "bos_token_id": st.integers(0, 5),
    "eos_token_id": st.integers(0, 5),
    "decoder_start_token_id": st.integers(0, 5),
    "tie_word_embeddings": st.booleans(),
    "is_encoder_decoder": st.booleans(),
    "share_encoder_decoder_embeddings": st.booleans(),
    "use_cache": st.booleans(),
    "cross_attention_source": st.sampled_from(["last_layer", "same_layer"]),
    "num_labels": st.integers(1, 4),
    "problem_type": st.sampled_from([None, "regression", "single_label_classification", "multi_label_classification"]),
}


@st.composite
def config_dicts(draw):
    chosen = draw(st.lists(st.sampled_from(sorted(CONFIG_FIELDS)), min_size=1, max_size=10, unique=True))
    fields = {}
    for name in chosen:
        fields[name] = draw(ANY_VALUE) if draw(st.integers(0, 4)) == 0 else draw(CONFIG_FIELDS[name])
    # Small sizes unless a field says otherwise, so that building and running the model stays fast.
    small = dict(vocab_size=70, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
    return {**small, **fields}


@settings(max_examples=fuzz_examples(ci=120, campaign=3000))
@given(config_dicts())
def test_fuzz_config_from_dict(fields):
    """`SeqBertConfig.from_dict` either raises a `TypeError` / `ValueError` that names a field it was given, or gives
    a config that survives a `to_dict` round trip. Each model class then either refuses it at construction with a
    `ValueError` naming the config field to change (the seq2seq model, say, on `num_decoder_layers=0`), or builds and
    runs a forward pass (and, for the generation models, one `generate` step) with finite outputs."""
    try:
        config = seqbert.SeqBertConfig.from_dict(dict(fields))
    except (TypeError, ValueError) as error:
        event(f"config: {type(error).__name__}")
        assert any(name in str(error) for name in fields), (fields, str(error))
        return
    event("config: accepted")
    assert seqbert.SeqBertConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    heads = dict(ENCODER_HEADS)
    heads["seq2seq"] = seqbert.SeqBertForConditionalGeneration
    if not config.is_encoder_decoder:
        heads["causal"] = seqbert.SeqBertForCausalLM
    if config.num_labels != 2:
        del heads["qa"]
    length = min(config.max_position_embeddings, 5)
    ids = torch.randint(0, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(0))
    for name, head in heads.items():
        torch.manual_seed(0)
        try:
            model = head(config).eval()
        except ValueError as error:  # a class that cannot use the config refuses it, naming the field to change
            event(f"refused by {name}")
            assert any(field in str(error) for field in seqbert.SeqBertConfig().to_dict()), str(error)
            continue
        inputs = {"input_ids": ids[:, None] if name == "choice" else ids}
        if name == "seq2seq":
            inputs["decoder_input_ids"] = ids[:, :2]
        with torch.no_grad():
            _assert_finite(model(**inputs).to_tuple(), (name, fields))
            if name in ("seq2seq", "causal") and (name == "causal" or config.decoder_start_token_id is not None):
                model.generate(ids[:, : max(1, length - 1)], max_new_tokens=1, do_sample=False)


# --------------------------------------------------------------------------------------------------------------------
# Damaged saved folders
# --------------------------------------------------------------------------------------------------------------------

LOADING_ERRORS = (OSError, ValueError, TypeError, MismatchedSizesError)


SAVED_STATE = {}  # the saved classifier's state dict (kept out of the fixture value, which hypothesis prints)


@pytest.fixture(scope="module")
def saved_folders():
    """A tiny classifier saved whole and sharded (one shard per layer or so); its state dict goes to SAVED_STATE."""
    torch.manual_seed(0)
    config = seqbert.SeqBertConfig(**{**FUZZ_CONFIG, "num_labels": 3})
    model = seqbert.SeqBertForSequenceClassification(config).eval()
    root = tempfile.mkdtemp(prefix="seqbert-fuzz-")
    folders = {"whole": os.path.join(root, "whole"), "sharded": os.path.join(root, "sharded")}
    model.save_pretrained(folders["whole"])
    model.save_pretrained(folders["sharded"], max_shard_size="8KB")
    SAVED_STATE.update(model.state_dict())
    yield folders
    shutil.rmtree(root)


DAMAGES = ["truncate", "flip_bytes", "config_garbage", "config_field", "delete_file", "index_points_nowhere"]


@st.composite
def damages(draw):
    return dict(
        layout=draw(st.sampled_from(["whole", "sharded"])),
        kind=draw(st.sampled_from(DAMAGES)),
        file_choice=draw(st.integers(0, 2**16)),
        fraction=draw(st.floats(0.0, 1.0)),
        flips=draw(st.integers(1, 8)),
        seed=draw(st.integers(0, 2**16)),
        field=draw(st.sampled_from(sorted(CONFIG_FIELDS))),
        value=draw(ANY_VALUE),
    )


def _damage(folder: str, damage: dict) -> str:
    """Apply `damage` to the saved `folder` in place; returns the name of the file it damaged."""
    files = sorted(f for f in os.listdir(folder) if f.endswith((".safetensors", ".json")))
    weights = [f for f in files if f.endswith(".safetensors")]
    kind, generator = damage["kind"], torch.Generator().manual_seed(damage["seed"])
    if kind in ("config_garbage", "config_field"):
        name = "config.json"
    elif kind == "index_points_nowhere":
        name = "model.safetensors.index.json" if "model.safetensors.index.json" in files else "config.json"
    elif kind == "delete_file":
        name = files[damage["file_choice"] % len(files)]
    else:
        name = weights[damage["file_choice"] % len(weights)]
    path = os.path.join(folder, name)
    data = open(path, "rb").read()
    if kind == "truncate":
        data = data[: int(len(data) * damage["fraction"])]
    elif kind == "flip_bytes":
        data = bytearray(data)
        for position in torch.randint(0, len(data), (damage["flips"],), generator=generator).tolist():
            data[position] ^= 1 << int(torch.randint(0, 8, (), generator=generator))
        data = bytes(data)
    elif kind == "config_garbage":
        data = data[: int(len(data) * damage["fraction"])] + b"\x00{]"
    elif kind == "config_field":
        fields = json.loads(data)
        fields[damage["field"]] = damage["value"]
        data = json.dumps(fields, allow_nan=True).encode()
    elif kind == "index_points_nowhere":
        index = json.loads(data)
        if "weight_map" in index:
            key = sorted(index["weight_map"])[damage["file_choice"] % len(index["weight_map"])]
            index["weight_map"][key] = "model-99999-of-99999.safetensors"
        data = json.dumps(index).encode()
    if kind == "delete_file":
        os.remove(path)
    else:
        open(path, "wb").write(data)
    return name


@settings(max_examples=fuzz_examples(ci=60, campaign=2000))
@given(damages())
def test_fuzz_damaged_folder(saved_folders, damage):
    """`from_pretrained` of a saved folder with one damaged file (truncated at a random byte, random bits flipped, a
    corrupt or changed `config.json`, a deleted file, an index entry pointing at a missing shard) raises a documented
    error, or loads a model whose weights and outputs are finite; a model loaded from undamaged weight files equals
    the saved one exactly. (safetensors files carry no checksum: flipped bits inside tensor data that leave finite
    values cannot be detected, so the test asks for finite, not equal, weights when a weights file was changed.)"""
    folders, saved = saved_folders, SAVED_STATE
    event(f"damage: {damage['kind']} ({damage['layout']})")
    with tempfile.TemporaryDirectory() as root:
        folder = os.path.join(root, "model")
        shutil.copytree(folders[damage["layout"]], folder)
        name = _damage(folder, damage)
        try:
            model = seqbert.SeqBertForSequenceClassification.from_pretrained(folder).eval()
        except LOADING_ERRORS as error:
            event(f"outcome: {type(error).__name__}")
            message = str(error)
            # Names the damaged file, the folder, or (a readable config with a bad value) the field.
            assert name in message or folder in message or damage["field"] in message, (damage, message)
            return
    event("outcome: loaded")
    state = model.state_dict()
    assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point()), damage
    if damage["kind"] in ("config_garbage", "config_field") and state.keys() == saved.keys():
        if all(state[k].shape == saved[k].shape for k in state):
            assert all(torch.equal(state[k], saved[k]) for k in state), damage
    length = min(model.config.max_position_embeddings, 6)
    ids = torch.randint(0, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _assert_finite(model(ids).to_tuple(), damage)
