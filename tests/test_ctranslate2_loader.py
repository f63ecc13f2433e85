"""CTranslate2's own converter (`ctranslate2.converters.TransformersConverter`, no subclass) converts SeqBERT folders
through the loader of `seqbert.ctranslate2_loader`: the real MiniLM weights (post-LN) and tiny pre-LN / sinusoidal /
scaled / head folders give seqbert's `last_hidden_state` and `pooler_output` on real text in `ctranslate2.Encoder`
(fp32, within CTranslate2's own test tolerance), int8 stays close, and what the encoder spec cannot express is refused
before any output folder is written."""

import filecmp
import importlib
import json
import sys

import ctranslate2
import numpy as np
import pytest
import torch
from ctranslate2.converters import TransformersConverter
from transformers import AutoModel

import seqbert
from seqbert import ctranslate2_loader


# CTranslate2's own encoder test (python/tests/test_transformers.py::test_transformers_encoder) compares with
# np.testing.assert_array_almost_equal(decimal=5): |delta| < 1.5e-5.
FP32_TOLERANCE = 1.5e-5
# Tiny models: the transformers tester sizes, with the real uncased vocabulary so that they read real text.
TINY = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, max_position_embeddings=64
)
TINY_FOLDERS = {
    # name: (model class, config fields beyond TINY)
    "pre": (seqbert.SeqBertModel, dict(norm_placement="pre")),
    "pre-sinusoidal-scaled-no-segments": (
        seqbert.SeqBertModel,
        dict(norm_placement="pre", position_embedding_type="sinusoidal", scale_embedding=True, type_vocab_size=0),
    ),
    "post-sinusoidal-scaled": (
        seqbert.SeqBertModel,
        dict(norm_placement="post", position_embedding_type="sinusoidal", scale_embedding=True),
    ),
    "pre-masked-lm": (seqbert.SeqBertForMaskedLM, dict(norm_placement="pre")),  # no pooler in the checkpoint
    "pre-classification": (seqbert.SeqBertForSequenceClassification, dict(norm_placement="pre", num_labels=3)),
    # The encoder of a seq2seq folder (what AutoModel loads from it; no pooler).
    "post-seq2seq": (
        seqbert.SeqBertForConditionalGeneration,
        dict(norm_placement="post", is_encoder_decoder=True, num_decoder_layers=1, decoder_start_token_id=101),
    ),
}
# Folders whose checkpoint holds no pooler weights.
WITHOUT_POOLER = ("pre-masked-lm", "post-seq2seq")


@pytest.fixture(scope="module", autouse=True)
def registered():
    """The loader, registered as `seqbert/__init__.py` registers it (idempotent)."""
    ctranslate2_loader.register_ctranslate2_loader()


def encoder(path, compute_type="float32") -> ctranslate2.Encoder:
    """`ctranslate2.Encoder` on CPU with torch's own thread count: CTranslate2 sets its threads with OpenMP's
    `omp_set_num_threads`, which reaches the OpenMP runtime torch computes with."""
    return ctranslate2.Encoder(
        str(path), device="cpu", compute_type=compute_type, intra_threads=torch.get_num_threads()
    )


def ct2_forward(engine: ctranslate2.Encoder, batch: dict):
    """The encoder on each row's real ids (and segment ids, when `batch` has them), as lists (CTranslate2's API) ->
    last_hidden_state (B, longest, H) and pooler_output (B, H) or None, as float32 tensors."""
    real = batch["attention_mask"].bool()
    ids = [row[keep].tolist() for row, keep in zip(batch["input_ids"], real, strict=True)]
    segments = None
    if "token_type_ids" in batch:
        segments = [row[keep].tolist() for row, keep in zip(batch["token_type_ids"], real, strict=True)]
    output = engine.forward_batch(ids, token_type_ids=segments)
    pooled = None if output.pooler_output is None else torch.from_numpy(np.array(output.pooler_output))
    return torch.from_numpy(np.array(output.last_hidden_state)), pooled


def max_deltas(model, ct2_folder, batch, compute_type="float32"):
    """max |CTranslate2 - seqbert| over the real tokens of last_hidden_state, and over pooler_output (None when the
    converted model has no pooler), with `model` (seqbert's `AutoModel` on the converted folder) as the reference.
    CTranslate2 gets segment ids when `batch` has them."""
    with torch.inference_mode():
        expected = model(**batch)
    hidden, pooled = ct2_forward(encoder(ct2_folder, compute_type), batch)
    real = batch["attention_mask"].bool()
    assert hidden.shape == expected.last_hidden_state.shape  # right padding: the longest row is the batch length
    hidden_delta = (hidden[real] - expected.last_hidden_state[real]).abs().max().item()
    pooler_delta = None if pooled is None else (pooled - expected.pooler_output).abs().max().item()
    return hidden_delta, pooler_delta


@pytest.fixture(scope="module")
def minilm(tmp_path_factory, minilm_path, tokenizer):
    """The real MiniLM BERT weights as a seqbert folder (post-LN `SeqBertModel`, with the tokenizer), that folder
    converted by CTranslate2 to fp32 and to int8 weights, and seqbert's model loaded from it (the reference)."""
    root = tmp_path_factory.mktemp("ct2_minilm")
    seqbert.SeqBertModel.from_bert_pretrained(minilm_path).save_pretrained(root / "seqbert")
    tokenizer.save_pretrained(root / "seqbert")
    converter = TransformersConverter(str(root / "seqbert"))
    converter.convert(str(root / "ct2"))
    converter.convert(str(root / "ct2-int8"), quantization="int8")
    return root, AutoModel.from_pretrained(root / "seqbert").eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer):
    """Each of `TINY_FOLDERS` with random weights (seed 0) saved with the tokenizer, and converted by CTranslate2."""
    root = tmp_path_factory.mktemp("ct2_tiny")
    for name, (model_class, fields) in TINY_FOLDERS.items():
        torch.manual_seed(0)
        config = seqbert.SeqBertConfig(vocab_size=tokenizer.vocab_size, **TINY, **fields)
        model_class(config).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        TransformersConverter(str(root / name)).convert(str(root / f"{name}-ct2"))
    return root


@pytest.mark.parametrize("pairs", [False, True], ids=["sentences", "sentence-pairs"])
def test_minilm_matches_seqbert_on_real_text(minilm, tokenizer, rt_texts, pairs):
    root, model = minilm
    texts = rt_texts[:8]
    if pairs:  # segment ids 0 and 1, given to both
        batch = dict(tokenizer(texts[:4], texts[4:], padding=True, return_tensors="pt"))
        assert batch["token_type_ids"].any()
    else:  # no segment ids: CTranslate2 and seqbert both default to segment 0
        batch = dict(tokenizer(texts, padding=True, return_tensors="pt", return_token_type_ids=False))
    assert not batch["attention_mask"].bool().all()  # padded rows
    hidden_delta, pooler_delta = max_deltas(model, root / "ct2", batch)
    assert hidden_delta < FP32_TOLERANCE and pooler_delta < FP32_TOLERANCE


@pytest.mark.parametrize("name", TINY_FOLDERS)
def test_tiny_folders_match_seqbert_on_real_text(tiny, tokenizer, rt_texts, name):
    texts = rt_texts[8:14]
    if TINY_FOLDERS[name][1].get("type_vocab_size", 2) > 0:
        batch = dict(tokenizer(texts[:3], texts[3:], padding=True, return_tensors="pt"))
    else:  # no segment embeddings: no segment ids
        batch = dict(tokenizer(texts, padding=True, return_tensors="pt", return_token_type_ids=False))
    without_pooler = name in WITHOUT_POOLER
    model = AutoModel.from_pretrained(tiny / name, add_pooling_layer=not without_pooler).eval()
    assert type(model) is seqbert.SeqBertModel
    hidden_delta, pooler_delta = max_deltas(model, tiny / f"{name}-ct2", batch)
    assert hidden_delta < FP32_TOLERANCE
    if without_pooler:  # converts without a pooler, not with a randomly initialised one
        assert pooler_delta is None
    else:
        assert pooler_delta < FP32_TOLERANCE


def test_sinusoidal_table_covers_max_position_embeddings(tiny):
    # seqbert computes sinusoids for any length; the converted table has max_position_embeddings (64) rows, and
    # CTranslate2 refuses longer inputs with its own error.
    engine = encoder(tiny / "post-sinusoidal-scaled-ct2")
    assert np.array(engine.forward_batch([[101] + [2023] * 62 + [102]]).last_hidden_state).shape == (1, 64, 32)
    with pytest.raises(RuntimeError, match="No position encodings are defined for positions >= 64"):
        engine.forward_batch([[101] + [2023] * 63 + [102]])


def test_int8_stays_close_to_fp32_on_real_text(minilm, tokenizer, rt_texts):
    root, model = minilm
    batch = dict(tokenizer(rt_texts[:8], padding=True, return_tensors="pt"))
    with torch.inference_mode():
        expected = model(**batch)
    hidden, pooled = ct2_forward(encoder(root / "ct2-int8", "int8"), batch)
    real = batch["attention_mask"].bool()
    # Mean-pooled sentence embeddings (how MiniLM is used) and the pooler keep their direction; tokens move by int8
    # rounding. Measured on a 2-core x86 CPU: cosine >= 0.9958 (mean-pooled) and >= 0.9954 (pooler), max |delta|
    # 0.20 on hidden states up to 5.8 (mean 0.02), 0.019 on the pooler. The bounds leave room for other int8 kernels.
    mask = real.unsqueeze(-1).float()
    mean_expected = (expected.last_hidden_state * mask).sum(1) / mask.sum(1)
    mean_got = (hidden * mask).sum(1) / mask.sum(1)
    assert torch.nn.functional.cosine_similarity(mean_got, mean_expected).min() > 0.99
    assert torch.nn.functional.cosine_similarity(pooled, expected.pooler_output).min() > 0.99
    assert 0 < (hidden[real] - expected.last_hidden_state[real]).abs().max() < 0.5


def test_command_line_is_ctranslate2s_with_the_loader(tiny, tmp_path, monkeypatch):
    output_dir = tmp_path / "cli-ct2"
    argv = ["ctranslate2_loader", "--model", str(tiny / "pre"), "--output_dir", str(output_dir)]
    monkeypatch.setattr(sys, "argv", argv)
    ctranslate2_loader.main()
    assert filecmp.cmp(output_dir / "model.bin", tiny / "pre-ct2" / "model.bin", shallow=False)


def test_trust_remote_code_converts_the_same(tiny, tmp_path):
    TransformersConverter(str(tiny / "pre"), trust_remote_code=True).convert(str(tmp_path / "ct2"))
    assert filecmp.cmp(tmp_path / "ct2" / "model.bin", tiny / "pre-ct2" / "model.bin", shallow=False)


def test_loader_registers_when_ctranslate2_is_imported_after_seqbert(monkeypatch):
    # A process that imported seqbert before CTranslate2's converter: the hook registers the loader on that import.
    # The converter module is imported afresh here; monkeypatch puts the original back afterwards.
    name = ctranslate2_loader.CTRANSLATE2_MODULE
    original = sys.modules[name]
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(ctranslate2.converters, "transformers", original)
    ctranslate2_loader.register_ctranslate2_loader_on_import()
    assert name not in sys.modules
    fresh = importlib.import_module(name)
    assert fresh is not original  # executed again: its loader table held only CTranslate2's own before the hook
    loader = fresh._MODEL_LOADERS["SeqBertConfig"]
    assert isinstance(loader, fresh.BertLoader) and loader.architecture_name == "AutoModel"


def _folder(root, name, model_class, **fields):
    torch.manual_seed(0)
    folder = root / name
    model_class(seqbert.SeqBertConfig(vocab_size=99, **{**TINY, **fields})).save_pretrained(folder)
    return folder


def test_what_ctranslate2_cannot_express_is_refused_before_writing(tmp_path):
    causal = _folder(tmp_path, "causal", seqbert.SeqBertForCausalLM)
    unnamed = _folder(tmp_path, "causal-without-architectures", seqbert.SeqBertForCausalLM)
    config = json.loads((unnamed / "config.json").read_text())
    del config["architectures"]
    (unnamed / "config.json").write_text(json.dumps(config))
    cases = {
        causal: r"config.architectures \(\['SeqBertForCausalLM'\]\) is a decoder-only model",
        unnamed: r"holds no weights for \d+ SeqBertModel parameters .*: it is not a SeqBERT encoder checkpoint",
        _folder(tmp_path, "tanh", seqbert.SeqBertModel, hidden_act="tanh"): r"hidden_act \('tanh'\) has no CTranslate2",
        _folder(tmp_path, "no-layers", seqbert.SeqBertModel, num_hidden_layers=0): r"num_hidden_layers \(0\) must be",
    }
    for folder, message in cases.items():
        output_dir = tmp_path / f"{folder.name}-ct2"
        with pytest.raises(ValueError, match=message):
            TransformersConverter(str(folder)).convert(str(output_dir))
        assert not output_dir.exists(), folder.name


def test_existing_output_folder_is_kept_unless_forced(tiny, tmp_path):
    output_dir = tmp_path / "ct2"
    output_dir.mkdir()
    (output_dir / "model.bin").write_bytes(b"another model")
    with pytest.raises(RuntimeError, match="already exists, use --force to override"):
        TransformersConverter(str(tiny / "pre")).convert(str(output_dir))
    assert (output_dir / "model.bin").read_bytes() == b"another model"
    TransformersConverter(str(tiny / "pre")).convert(str(output_dir), force=True)
    assert filecmp.cmp(output_dir / "model.bin", tiny / "pre-ct2" / "model.bin", shallow=False)


def test_without_ctranslate2_registration_costs_nothing_and_conversion_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if not installed: importlib finds no spec
    hooks = list(sys.meta_path)
    monkeypatch.delitem(sys.modules, ctranslate2_loader.CTRANSLATE2_MODULE)
    ctranslate2_loader.register_ctranslate2_loader_on_import()
    assert sys.meta_path == hooks
    with pytest.raises(ImportError, match=r"needs ctranslate2, which is not installed: pip install ctranslate2"):
        ctranslate2_loader.register_ctranslate2_loader()
