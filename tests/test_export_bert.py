"""Back to BERT (`seqbert.export_bert`, `scripts/hub/export_to_bert.py`): a post-LN SeqBERT encoder as the transformers
BERT class, in memory and as a saved folder, and that folder in the engines that only know BERT.

- the real MiniLM-L6 weights (BertModel) on padded Rotten Tomatoes snippets: BERT -> SeqBERT -> BERT gives every tensor
  back bit for bit, and the exported model's outputs equal SeqBERT's exactly (eager attention on both sides: the same
  computation; sdpa measured too);
- seeded random bert-base-width BertForMaskedLM (tied decoder), BertForSequenceClassification,
  BertForTokenClassification and BertForQuestionAnswering folders (conftest's `bert_checkpoints`) fed real sentence
  pairs, and tiny BertForMultipleChoice / untied BertForMaskedLM folders;
- the exported MiniLM folder in stock CTranslate2 (its own `TransformersConverter`, no subclass), ONNX Runtime
  (`torch.onnx.export(dynamo=True)`) and OpenVINO (`openvino.convert_model` of that ONNX file), against SeqBERT's
  outputs within each engine's fp32 tolerance;
- what BERT lacks (pre-LN, sinusoidal positions, scaled embeddings, a final LayerNorm, decoders), tasks a head cannot
  serve and output folders that hold something else are refused in one line, with nothing written.
"""

import json
import os
import warnings

import numpy as np
import pytest
import torch
from conftest import TINY, tiny_config
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

import seqbert
from seqbert.export_bert import bert_config_from_seqbert, save_as_bert, to_bert
from seqbert.hub import copy_sentence_transformers_modules
from seqbert.script_utils import ScriptInputError, run_cli


# fp32 engines sum in other orders than torch (fused attention, other GEMM kernels): their usual agreement with the
# PyTorch model on real text is 1e-5 to 1e-4 (measured here: up to 8e-6).
ENGINE_TOLERANCE = 1e-4
# seqbert's sdpa path drops padding before the linear layers; BERT's keeps it (see tests/test_bert_parity.py).
SDPA_TOLERANCE = 1e-5
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def max_delta_on_real_tokens(a: torch.Tensor, b: torch.Tensor, attention_mask: torch.Tensor) -> float:
    real = attention_mask.bool()
    return (a[real] - b[real]).abs().max().item()


def assert_same_tensors(expected: dict, got: dict) -> None:
    assert sorted(got) == sorted(expected)
    different = [key for key in expected if not torch.equal(expected[key], got[key])]
    assert not different, different


def assert_same_config(expected, got) -> None:
    """Every field of the BERT config back, plus BERT's position_embedding_type (which CTranslate2 reads)."""
    ignored = ("_name_or_path", "architectures", "dtype")  # where the model came from and was saved as
    expected = {k: v for k, v in expected.to_dict().items() if k not in ignored}
    got = {k: v for k, v in got.to_dict().items() if k not in ignored}
    assert {**expected, "position_embedding_type": "absolute"} == got


def staging_leftovers(folder) -> list[str]:
    return [name for name in os.listdir(folder) if name.startswith(".")]


@pytest.fixture(scope="module")
def snippets(tokenizer, rt_texts):
    """16 real snippets of different lengths, padded."""
    batch = tokenizer(rt_texts[:16], padding=True, return_tensors="pt")
    assert (batch.attention_mask == 0).any()
    return dict(batch)


@pytest.fixture(scope="module")
def sentence_pairs(tokenizer, rt_texts):
    """Real snippet pairs (token_type_ids 0 and 1), ragged padding."""
    batch = tokenizer(rt_texts[100:108], rt_texts[200:208], padding=True, return_tensors="pt")
    assert batch.token_type_ids.max() == 1 and (batch.attention_mask == 0).any()
    return dict(batch)


@pytest.fixture(scope="module")
def minilm_seqbert(minilm_path):
    return seqbert.SeqBertModel.from_bert_pretrained(minilm_path, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def minilm_outputs(minilm_seqbert, snippets):
    with torch.no_grad():
        return minilm_seqbert(**snippets)


@pytest.fixture(scope="module")
def exported_minilm(minilm_path, minilm_seqbert, tokenizer, tmp_path_factory):
    """The MiniLM SeqBERT folder (with its tokenizer and sentence-transformers modules) exported by the command-line
    script, in process. Returns the BERT folder."""
    import export_to_bert  # scripts/hub, on sys.path via conftest

    root = tmp_path_factory.mktemp("export")
    source = root / "minilm-seqbert"
    minilm_seqbert.save_pretrained(source)
    tokenizer.save_pretrained(source)
    copy_sentence_transformers_modules(str(minilm_path), source)
    output = export_to_bert.main(["--model_name_or_path", str(source), "--output_dir", str(root / "minilm-bert")])
    assert staging_leftovers(root) == []
    return output


def test_minilm_exports_bit_for_bit(minilm_path, minilm_seqbert, minilm_outputs, snippets):
    reference = BertModel.from_pretrained(minilm_path)
    bert = to_bert(minilm_seqbert)
    assert type(bert) is BertModel and bert.pooler is not None and not bert.training
    assert bert.config._attn_implementation == "eager"
    assert_same_tensors(reference.state_dict(), bert.state_dict())
    with torch.no_grad():
        out = bert(**snippets)
    mask = snippets["attention_mask"]
    assert max_delta_on_real_tokens(out.last_hidden_state, minilm_outputs.last_hidden_state, mask) == 0.0
    assert torch.equal(out.pooler_output, minilm_outputs.pooler_output)
    # The default attention (sdpa) on both sides: seqbert's unpadded fast path against BERT's padded one.
    sdpa = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    bert = to_bert(sdpa)
    assert bert.config._attn_implementation == "sdpa"
    with torch.no_grad():
        expected, got = sdpa(**snippets), bert(**snippets)
    assert max_delta_on_real_tokens(got.last_hidden_state, expected.last_hidden_state, mask) <= SDPA_TOLERANCE
    assert (got.pooler_output - expected.pooler_output).abs().max().item() <= SDPA_TOLERANCE


def test_exported_folder_is_plain_bert(minilm_path, exported_minilm, minilm_outputs, snippets):
    config = json.loads((exported_minilm / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"]
    assert config["position_embedding_type"] == "absolute"  # what CTranslate2's BERT loader asserts
    assert "auto_map" not in config and "seqbert_version" not in config
    assert not list(exported_minilm.glob("*.py"))
    assert (exported_minilm / "tokenizer.json").is_file()
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):  # TEI reads the pooling here
        assert (exported_minilm / name).read_bytes() == (minilm_path / name).read_bytes(), name
    bert, info = BertModel.from_pretrained(exported_minilm, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        out = bert.eval()(**snippets)
    mask = snippets["attention_mask"]
    assert max_delta_on_real_tokens(out.last_hidden_state, minilm_outputs.last_hidden_state, mask) == 0.0
    assert torch.equal(out.pooler_output, minilm_outputs.pooler_output)


def test_sentence_transformers_loads_the_exported_folder_as_bert(minilm_path, exported_minilm, rt_texts):
    """Without trust_remote_code: the folder is plain BERT, with the original's pooling and normalisation."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    original = sentence_transformers.SentenceTransformer(str(minilm_path), device="cpu")
    exported = sentence_transformers.SentenceTransformer(str(exported_minilm), device="cpu")
    assert type(exported[0].auto_model) is BertModel
    texts = rt_texts[:8]
    assert torch.equal(exported.encode(texts, convert_to_tensor=True), original.encode(texts, convert_to_tensor=True))


HEADS = [
    (BertForMaskedLM, seqbert.SeqBertForMaskedLM, ("logits",)),
    (BertForSequenceClassification, seqbert.SeqBertForSequenceClassification, ("logits",)),
    (BertForTokenClassification, seqbert.SeqBertForTokenClassification, ("logits",)),
    (BertForQuestionAnswering, seqbert.SeqBertForQuestionAnswering, ("start_logits", "end_logits")),
]


def assert_same_outputs(expected, got, fields, attention_mask) -> None:
    for field in fields:
        a, b = getattr(expected, field), getattr(got, field)
        if a.dim() >= 2 and a.shape[:2] == attention_mask.shape:
            delta = max_delta_on_real_tokens(a, b, attention_mask)
        else:
            delta = (a - b).abs().max().item()
        assert delta == 0.0, (field, delta)


@pytest.mark.parametrize("bert_class,seqbert_class,fields", HEADS, ids=lambda x: getattr(x, "__name__", ""))
def test_heads_round_trip(bert_checkpoints, sentence_pairs, bert_class, seqbert_class, fields):
    folder = bert_checkpoints[bert_class.__name__]
    model = seqbert_class.from_bert_pretrained(folder, attn_implementation="eager").eval()
    bert = to_bert(model)
    assert type(bert) is bert_class
    reference = bert_class.from_pretrained(folder)
    assert_same_tensors(reference.state_dict(), bert.state_dict())
    assert_same_config(reference.config, bert.config)
    if bert_class is BertForMaskedLM:  # tied, as in the checkpoint
        assert bert.cls.predictions.decoder.weight is bert.bert.embeddings.word_embeddings.weight
    with torch.no_grad():
        assert_same_outputs(model(**sentence_pairs), bert(**sentence_pairs), fields, sentence_pairs["attention_mask"])
        if bert_class is BertForSequenceClassification:  # the encoder alone, with the pooler the head reads
            encoder = to_bert(model, task="feature-extraction")
            assert type(encoder) is BertModel and encoder.pooler is not None
            assert_same_outputs(
                model.seqbert(**sentence_pairs),
                encoder(**sentence_pairs),
                ("last_hidden_state", "pooler_output"),
                sentence_pairs["attention_mask"],
            )


@pytest.mark.parametrize(
    "bert_class,seqbert_class,config",
    [
        (  # fields away from their defaults come back too
            BertForMultipleChoice,
            seqbert.SeqBertForMultipleChoice,
            {"classifier_dropout": 0.2, "hidden_act": "gelu_new", "layer_norm_eps": 1e-7, "bos_token_id": 2},
        ),
        (BertForMaskedLM, seqbert.SeqBertForMaskedLM, {"tie_word_embeddings": False}),
    ],
    ids=["multiple-choice", "masked-lm-untied"],
)
def test_tiny_heads_round_trip_through_a_folder(tmp_path, bert_class, seqbert_class, config, caplog):
    torch.manual_seed(0)
    original = bert_class(BertConfig(**TINY, **config))
    original.save_pretrained(tmp_path / "bert")
    model = seqbert_class.from_bert_pretrained(tmp_path / "bert", attn_implementation="eager").eval()
    output = save_as_bert(model, tmp_path / "exported")  # the BERT folder has no tokenizer: a warning says so
    assert "gets no tokenizer" in caplog.text
    bert, info = bert_class.from_pretrained(output, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info
    assert_same_tensors(original.state_dict(), bert.state_dict())
    assert_same_config(original.config, bert.config)
    if not config.get("tie_word_embeddings", True):
        assert not torch.equal(bert.cls.predictions.decoder.weight, bert.bert.embeddings.word_embeddings.weight)
    g = torch.Generator().manual_seed(0)
    shape = (3, 4, 7) if bert_class is BertForMultipleChoice else (3, 7)
    inputs = {
        "input_ids": torch.randint(1, TINY["vocab_size"], shape, generator=g),
        "attention_mask": torch.ones(shape, dtype=torch.long).index_fill(-1, torch.tensor([5, 6]), 0),
    }
    with torch.no_grad():
        expected, got = model(**inputs).logits, bert.eval()(**inputs).logits
    if bert_class is BertForMaskedLM:
        expected, got = expected[:, :5], got[:, :5]  # the real tokens
    assert torch.equal(got, expected)


def test_values_only_seqbert_has_are_expressed_exactly():
    """No segment embedding (type_vocab_size 0) becomes one all-zero segment row; a negative pad_token_id ("no pad
    token") becomes BERT's None."""
    torch.manual_seed(0)
    config = tiny_config(norm_placement="post", type_vocab_size=0, pad_token_id=-1, attn_implementation="eager")
    model = seqbert.SeqBertModel(config).eval()
    bert = to_bert(model)
    assert bert.config.type_vocab_size == 1 and bert.config.pad_token_id is None
    assert bert.embeddings.word_embeddings.padding_idx is None
    assert torch.equal(bert.embeddings.token_type_embeddings.weight, torch.zeros(1, TINY["hidden_size"]))
    input_ids = torch.randint(0, TINY["vocab_size"], (4, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(bert(input_ids).last_hidden_state, model(input_ids).last_hidden_state)


def _post(**overrides):
    return tiny_config(norm_placement="post", **overrides)


def _with_final_layer_norm():
    model = seqbert.SeqBertModel(_post())
    model.encoder.final_layer_norm = nn.LayerNorm(TINY["hidden_size"])
    return model


REFUSED = {
    "pre-ln": (lambda: seqbert.SeqBertModel(tiny_config()), r"norm_placement='pre' \(BERT has post-LN layers only"),
    "sinusoidal": (
        lambda: seqbert.SeqBertForMaskedLM(_post(position_embedding_type="sinusoidal")),
        r"position_embedding_type='sinusoidal' \(BERT has a learned position table only",
    ),
    "scaled": (
        lambda: seqbert.SeqBertModel(_post(scale_embedding=True)),
        r"scale_embedding=True \(BERT does not scale word embeddings",
    ),
    "final-layer-norm": (_with_final_layer_norm, r"weights that BERT has no place for: seqbert\.encoder\.final_layer"),
    "causal-lm": (lambda: seqbert.SeqBertForCausalLM(_post()), "BERT is an encoder only, with no causal decoder"),
    "seq2seq": (
        lambda: seqbert.SeqBertForConditionalGeneration(
            _post(is_encoder_decoder=True, decoder_start_token_id=1, eos_token_id=2)
        ),
        "BERT is an encoder only, with no causal decoder and no decoder over an encoder",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_bert_lacks_is_refused_in_one_line(case, tmp_path):
    build, message = REFUSED[case]
    model = build()
    refusal = r"^model \(SeqBert\w+\) cannot be exported to BERT: .*"
    with pytest.raises(ValueError, match=refusal + message) as error:
        to_bert(model)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=message):
        save_as_bert(model, tmp_path / "out")
    assert os.listdir(tmp_path) == []  # nothing written, no staging folder left


def test_config_and_arguments_bert_cannot_take():
    with pytest.raises(ValueError, match=r"^config \(SeqBertConfig\) cannot be expressed as a BertConfig: norm_pl"):
        bert_config_from_seqbert(tiny_config())
    with pytest.raises(TypeError, match=r"model must be a SeqBERT model \(SeqBertPreTrainedModel\), got BertModel"):
        to_bert(BertModel(BertConfig(**TINY)))
    model = seqbert.SeqBertForSequenceClassification(_post())
    with pytest.raises(ValueError, match=r"^task \('fill-mask'\) cannot be served by SeqBertForSequenceClassification: "
                       r"its head serves 'text-classification'"):  # fmt: skip
        to_bert(model, task="fill-mask")
    with pytest.raises(ValueError, match=r"task \('translation'\) .*\(TASKS: 'feature-extraction', 'fill-mask'"):
        to_bert(model, task="translation")


def test_peft_adapters_must_be_merged_first():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = seqbert.SeqBertForSequenceClassification(_post(attn_implementation="eager")).eval()
    adapted = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", init_lora_weights=False))
    with pytest.raises(TypeError, match=r"got PeftModel\w*: merge its adapters first with merge_and_unload\(\)"):
        to_bert(adapted)
    with pytest.raises(ValueError, match=r"no place for: .*\.base_layer\..*merge it first with merge_and_unload\(\)"):
        to_bert(adapted.base_model.model)
    input_ids = torch.randint(1, TINY["vocab_size"], (3, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapter_logits = adapted(input_ids=input_ids).logits
        merged = adapted.merge_and_unload()
        expected = merged(input_ids).logits
        assert torch.equal(to_bert(merged)(input_ids).logits, expected)
    assert (expected - adapter_logits).abs().max().item() <= 1e-6  # W + BA against Wx + BAx: rounding only


@pytest.fixture
def tiny_seqbert_folder(tmp_path):
    folder = tmp_path / "seqbert"
    seqbert.SeqBertModel(_post()).save_pretrained(folder)
    return folder


def test_output_dir_that_holds_something_else_is_refused(tmp_path, tiny_seqbert_folder):
    other = tmp_path / "other-model"
    BertConfig(hidden_size=64, num_attention_heads=4).save_pretrained(other)
    (other / "weights.txt").write_text("keep me")
    before = {path.name: path.read_bytes() for path in other.iterdir()}
    with pytest.raises(ValueError, match=r"output_dir \('.*other-model'\) already holds a model \(config\.json of "
                       r"model_type 'bert'\): .* pass overwrite=True"):  # fmt: skip
        save_as_bert(tiny_seqbert_folder, other)
    assert {path.name: path.read_bytes() for path in other.iterdir()} == before
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("x")
    with pytest.raises(ValueError, match=r"output_dir \('.*notes'\) is not empty and holds no model \(todo\.txt\)"):
        save_as_bert(tiny_seqbert_folder, notes, overwrite=True)
    with pytest.raises(ValueError, match=r"output_dir \('.*todo\.txt'\) is a file"):
        save_as_bert(tiny_seqbert_folder, notes / "todo.txt")
    with pytest.raises(ValueError, match=r"output_dir \('.*seqbert'\) is the SeqBERT folder being exported"):
        save_as_bert(tiny_seqbert_folder, tiny_seqbert_folder, overwrite=True)
    with pytest.raises(ValueError, match=r"model_or_path \('.*other-model'\) is a 'bert' model \(it is already BERT\)"):
        save_as_bert(other, tmp_path / "new")
    with pytest.raises(ValueError, match=r"^tokenizer \('.*notes'\): its tokenizer cannot be loaded \(") as error:
        save_as_bert(tiny_seqbert_folder, tmp_path / "new", tokenizer=notes)
    assert "\n" not in str(error.value)
    assert staging_leftovers(tmp_path) == [] and not (tmp_path / "new").exists()
    # With overwrite=True a folder that holds a model is replaced as a whole.
    save_as_bert(tiny_seqbert_folder, other, overwrite=True)
    assert sorted(path.name for path in other.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((other / "config.json").read_text())["hidden_size"] == TINY["hidden_size"]
    assert staging_leftovers(tmp_path) == []


def test_command_line_reports_bad_input_in_one_line(tmp_path, capsys):
    import export_to_bert

    folder = tmp_path / "pre-ln"
    seqbert.SeqBertModel(tiny_config()).save_pretrained(folder)
    argv = ["--model_name_or_path", str(folder), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ScriptInputError, match=r"model \(SeqBertModel\) cannot be exported to BERT: norm_placement"):
        export_to_bert.main(argv)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: export_to_bert.main(argv), export_to_bert.script_parser(export_to_bert.ExportArguments, ""))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert (
        error.count("\n") == 1
        and ": error: model (SeqBertModel) cannot be exported to BERT: norm_placement='pre'" in error
    )
    assert not (tmp_path / "out").exists() and staging_leftovers(tmp_path) == []


# ----------------------------------------------------------------------------------------------------------------------
# The exported folder in engines that know BERT only
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_file(exported_minilm, snippets):
    """The exported folder's BertModel through torch's ONNX exporter (dynamo), batch and length dynamic."""
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    bert = BertModel.from_pretrained(exported_minilm).eval()
    path = exported_minilm.parent / "minilm-bert.onnx"
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    sample = {name: snippets[name][:2] for name in ONNX_INPUTS}  # a shape other than the one compared below
    with warnings.catch_warnings():
        # The shared batch/length dimensions, named once per input; a deprecation inside torch.export.
        warnings.filterwarnings("ignore", message="# The axis name")
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        torch.onnx.export(
            bert,
            kwargs=sample,
            f=str(path),
            dynamo=True,
            input_names=list(ONNX_INPUTS),
            output_names=["last_hidden_state", "pooler_output"],
            dynamic_shapes={name: {0: batch, 1: length} for name in ONNX_INPUTS},
            verbose=False,
        )
    return path


def assert_engine_matches(last_hidden_state, pooler_output, expected, attention_mask) -> None:
    last_hidden_state, pooler_output = torch.as_tensor(last_hidden_state), torch.as_tensor(pooler_output)
    assert max_delta_on_real_tokens(last_hidden_state, expected.last_hidden_state, attention_mask) <= ENGINE_TOLERANCE
    assert (pooler_output - expected.pooler_output).abs().max().item() <= ENGINE_TOLERANCE


def test_onnxruntime_runs_the_exported_model(onnx_file, minilm_outputs, snippets):
    benchmark_engines = pytest.importorskip("benchmark_engines", reason="needs onnxruntime, openvino, ctranslate2")
    session = benchmark_engines.onnxruntime_session(onnx_file, threads=1)
    assert [i.name for i in session.get_inputs()] == list(ONNX_INPUTS)
    last_hidden_state, pooler_output = session.run(None, {name: snippets[name].numpy() for name in ONNX_INPUTS})
    assert_engine_matches(last_hidden_state, pooler_output, minilm_outputs, snippets["attention_mask"])


def test_openvino_runs_the_exported_model(onnx_file, minilm_outputs, snippets):
    openvino = pytest.importorskip("openvino")
    compiled = openvino.Core().compile_model(
        openvino.convert_model(onnx_file), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}
    )
    result = compiled.create_infer_request().infer({name: snippets[name].numpy() for name in ONNX_INPUTS})
    outputs = {output.get_any_name(): result[output].copy() for output in compiled.outputs}
    assert_engine_matches(
        outputs["last_hidden_state"], outputs["pooler_output"], minilm_outputs, snippets["attention_mask"]
    )


def test_stock_ctranslate2_converts_and_runs_the_exported_folder(exported_minilm, minilm_outputs, snippets):
    ctranslate2 = pytest.importorskip("ctranslate2")
    converted = exported_minilm.parent / "minilm-ct2"
    ctranslate2.converters.TransformersConverter(str(exported_minilm)).convert(str(converted))
    torch_threads = torch.get_num_threads()
    encoder = ctranslate2.Encoder(str(converted), device="cpu", compute_type="float32", intra_threads=1)
    torch.set_num_threads(torch_threads)  # CTranslate2 sets OpenMP's thread count, which torch shares
    real = snippets["attention_mask"].bool()
    ids = [row[keep].tolist() for row, keep in zip(snippets["input_ids"], real, strict=True)]
    types = [row[keep].tolist() for row, keep in zip(snippets["token_type_ids"], real, strict=True)]
    output = encoder.forward_batch(ids, token_type_ids=types)
    states = torch.from_numpy(np.array(output.last_hidden_state))  # (B, longest real length, H)
    padded = states.new_zeros(*real.shape, states.shape[-1])
    padded[:, : states.shape[1]] = states
    assert_engine_matches(padded, np.array(output.pooler_output), minilm_outputs, snippets["attention_mask"])
