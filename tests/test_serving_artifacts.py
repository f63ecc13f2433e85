"""Serving files inside a saved folder (`seqbert.serving_artifacts`): `onnx/model.onnx`, its int8 and fused versions
and `openvino/openvino_model.xml`, with the input and output names text-embeddings-inference, optimum and
sentence-transformers use. Each file is run by its engine alone (an ONNX Runtime session or an OpenVINO compiled
model, no seqbert code) on real text in a padded batch of another shape than the traced one, against seqbert's own
outputs: the real MiniLM weights (post-LN) and a tiny seeded pre-LN model. Also `push_to_hub.py --serving_artifacts`,
and the bad inputs, which leave the folder as it was."""

import collections
import json
import shutil
import sys

import onnx
import onnxruntime
import openvino
import push_to_hub  # noqa: E402  (scripts/hub, on sys.path by conftest)
import pytest
import torch
from conftest import random_inputs, tiny_config
from hub_recorder import record_hub_requests

import seqbert
from seqbert.hub import upload_files, write_model_card
from seqbert.serving_artifacts import (
    INPUT_NAMES,
    ONNX_INT8_PATH,
    ONNX_OPTIMIZED_PATH,
    ONNX_PATH,
    OPENVINO_PATH,
    TASKS,
    save_serving_artifacts,
)


TOLERANCE = 1e-4  # fp32 engines against seqbert (measured: about 5e-6 on MiniLM)


def run_onnx(path, batch: dict) -> dict[str, torch.Tensor]:
    """The graph at `path` in an ONNX Runtime session of its own, fed the inputs it declares, as TEI feeds them."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: batch[i.name].numpy() for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return {name: torch.from_numpy(value) for name, value in zip(names, session.run(None, feed), strict=True)}


def run_openvino(path, batch: dict) -> dict[str, torch.Tensor]:
    """The OpenVINO model at `path` compiled for the CPU in f32, its outputs by name."""
    compiled = openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled({i.get_any_name(): batch[i.get_any_name()].numpy() for i in compiled.inputs})
    return {o.get_any_name(): torch.from_numpy(results[o].copy()) for o in compiled.outputs}


def max_delta(got: torch.Tensor, expected: torch.Tensor, real: torch.Tensor | None = None) -> float:
    delta = (got - expected).abs()
    return (delta[real] if real is not None else delta).max().item()


def files_under(folder) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def save_folder(model, folder, tokenizer=None):
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def minilm_export(tmp_path_factory, minilm_path, tokenizer):
    """The real MiniLM encoder saved with its tokenizer, and every file written into its folder (one export)."""
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    folder = save_folder(model, tmp_path_factory.mktemp("minilm") / "model", tokenizer)
    artifacts = save_serving_artifacts(folder, model, optimize=True)
    return folder, model, artifacts


@pytest.fixture(scope="module")
def real_batch(tokenizer, rt_texts) -> dict[str, torch.Tensor]:
    batch = dict(tokenizer(rt_texts[:12], padding=True, return_tensors="pt"))  # not the traced shape, (2, 8)
    assert not batch["attention_mask"].bool().all()
    return batch


def test_files_sit_where_the_engines_look(minilm_export):
    folder, _, artifacts = minilm_export
    written = {ONNX_PATH, ONNX_INT8_PATH, ONNX_OPTIMIZED_PATH, OPENVINO_PATH, OPENVINO_PATH.replace(".xml", ".bin")}
    assert written <= files_under(folder)
    assert not (folder / ".cache").exists()  # the staging folder is gone
    assert {p for p in files_under(folder) if p.startswith(("onnx/", "openvino/"))} == written  # one file each
    assert artifacts.task == "feature-extraction"
    assert set(artifacts.files) == {"onnx", "onnx_int8", "onnx_optimized", "openvino"}
    assert all(delta <= TOLERANCE for delta in artifacts.max_abs_delta.values()), artifacts.max_abs_delta


def test_graphs_have_the_names_dtypes_and_dynamic_axes_the_loaders_use(minilm_export):
    folder, _, _ = minilm_export
    for path in (ONNX_PATH, ONNX_INT8_PATH, ONNX_OPTIMIZED_PATH):
        session = onnxruntime.InferenceSession(str(folder / path), providers=["CPUExecutionProvider"])
        inputs = {i.name: (i.type, i.shape) for i in session.get_inputs()}
        assert inputs == dict.fromkeys(INPUT_NAMES, ("tensor(int64)", ["batch_size", "sequence_length"])), path
        outputs = {o.name: (o.type, o.shape) for o in session.get_outputs()}
        assert outputs == {"last_hidden_state": ("tensor(float)", ["batch_size", "sequence_length", 384])}, path
    model = openvino.Core().read_model(str(folder / OPENVINO_PATH))
    assert {i.get_any_name(): str(i.get_partial_shape()) for i in model.inputs} == dict.fromkeys(INPUT_NAMES, "[?,?]")
    assert [(o.get_any_name(), str(o.get_partial_shape())) for o in model.outputs] == [
        ("last_hidden_state", "[?,?,384]")
    ]
    # Self-contained files: TEI downloads `onnx/model.onnx` and only an `onnx/model.onnx_data` besides.
    for path in (ONNX_PATH, ONNX_INT8_PATH, ONNX_OPTIMIZED_PATH):
        graph = onnx.load(str(folder / path), load_external_data=False).graph
        assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in graph.initializer), path


@torch.inference_mode()
def test_onnxruntime_alone_gives_seqberts_hidden_states_on_real_text(minilm_export, real_batch, tokenizer, rt_texts):
    folder, model, _ = minilm_export
    real = real_batch["attention_mask"].bool()
    got = run_onnx(folder / ONNX_PATH, real_batch)["last_hidden_state"]
    assert got.shape == (*real.shape, 384)
    assert max_delta(got, model(**real_batch).last_hidden_state, real) <= TOLERANCE
    # One text (TEI sends a batch of one unpadded), and TEI's health check: one token, id 0.
    one = torch.ones(1, 1, dtype=torch.long)
    health = {"input_ids": 0 * one, "attention_mask": one, "token_type_ids": 0 * one}
    for batch in (dict(tokenizer(rt_texts[20:21], return_tensors="pt")), health):
        got = run_onnx(folder / ONNX_PATH, batch)["last_hidden_state"]
        assert max_delta(got, model(**batch).last_hidden_state) <= TOLERANCE


@torch.inference_mode()
def test_openvino_compiles_the_xml_and_gives_seqberts_hidden_states(minilm_export, real_batch):
    folder, model, _ = minilm_export
    got = run_openvino(folder / OPENVINO_PATH, real_batch)["last_hidden_state"]
    real = real_batch["attention_mask"].bool()
    assert max_delta(got, model(**real_batch).last_hidden_state, real) <= TOLERANCE


@torch.inference_mode()
def test_int8_graph_is_quantized_and_stays_within_int8_reach(minilm_export, real_batch):
    """Dynamic int8 (per-channel weights) moves MiniLM's hidden states as int8 does (measured: mean |delta| 0.04, max
    0.5); mean-pooled sentence embeddings keep a cosine similarity of at least 0.98 with fp32's."""
    folder, model, _ = minilm_export
    ops = collections.Counter(node.op_type for node in onnx.load(str(folder / ONNX_INT8_PATH)).graph.node)
    assert ops["MatMulInteger"] == 36  # the six projections of each of the 6 layers
    assert (folder / ONNX_INT8_PATH).stat().st_size < (folder / ONNX_PATH).stat().st_size / 3
    real = real_batch["attention_mask"].bool()
    got = run_onnx(folder / ONNX_INT8_PATH, real_batch)["last_hidden_state"]
    expected = model(**real_batch).last_hidden_state
    assert 0 < (got - expected)[real].abs().mean() < 0.1

    def embedding(hidden):
        return torch.nn.functional.normalize((hidden * real[..., None]).sum(1) / real.sum(1, keepdim=True), dim=-1)

    assert (embedding(got) * embedding(expected)).sum(-1).min() > 0.98


@torch.inference_mode()
def test_optimized_graph_is_fused_for_onnxruntime_and_still_matches(minilm_export, real_batch):
    folder, model, artifacts = minilm_export
    ops = collections.Counter(node.op_type for node in onnx.load(str(folder / ONNX_OPTIMIZED_PATH)).graph.node)
    assert ops["Attention"] == ops["BiasGelu"] == 6 and ops["SkipLayerNormalization"] == 12
    assert ops["Softmax"] == ops["Erf"] == 0
    assert artifacts.fusions["attention"] == 6
    got = run_onnx(folder / ONNX_OPTIMIZED_PATH, real_batch)["last_hidden_state"]
    real = real_batch["attention_mask"].bool()
    assert max_delta(got, model(**real_batch).last_hidden_state, real) <= TOLERANCE


def tiny_pre_ln(model_class, seed=0, **overrides):
    """A seeded tiny pre-LN model (with the real tokenizer's vocabulary where it reads real text). Weights drawn with
    std 0.5 rather than 0.02, so that its logits spread over a few units, as a trained head's do, and a tolerance of
    1e-4 on them means something (with 0.02 they stay under 0.01)."""
    torch.manual_seed(seed)
    return model_class(tiny_config(norm_placement="pre", initializer_range=0.5, **overrides)).eval()


RUN_INFO = {
    "model_name": "tiny pre-LN classifier",
    "summary": "A seeded tiny pre-LN SeqBERT classifier for the serving tests.",
    "dataset": {"type": "rotten_tomatoes", "name": "Rotten Tomatoes"},
    "results": [],
    "recipe": {"training": "none (seeded weights)"},
    "command": "tests/test_serving_artifacts.py",
}


@pytest.fixture(scope="module")
def pushed(tmp_path_factory, tokenizer):
    """A tiny pre-LN classifier folder ready to push, pushed with `--serving_artifacts onnx openvino` to the fake Hub."""
    model = tiny_pre_ln(
        seqbert.SeqBertForSequenceClassification,
        vocab_size=tokenizer.vocab_size,
        max_position_embeddings=128,
        num_labels=3,
    )
    folder = save_folder(model, tmp_path_factory.mktemp("pushed") / "model", tokenizer)
    write_model_card(folder, RUN_INFO)
    argv = ["--model_dir", str(folder), "--repo_id", "someone/tiny", "--serving_artifacts", "onnx", "openvino"]
    with record_hub_requests() as hub:
        assert push_to_hub.main(argv) == 0
    return folder, model, hub


def test_push_writes_the_serving_files_and_uploads_them(pushed, capsys):
    folder, _, hub = pushed
    upload, _ = hub.commits
    binary = {ONNX_PATH, ONNX_INT8_PATH, OPENVINO_PATH.replace(".xml", ".bin")}
    assert {*binary, OPENVINO_PATH} <= set(upload["files"]) and binary <= set(upload["lfs_files"])
    assert upload["files"] == dict(upload_files(folder))  # the whole folder, nothing staged left over
    assert not any(path.startswith(".cache") for path in upload["files"])


def test_the_pushed_card_says_what_loads_the_serving_files_without_seqbert(pushed):
    _, _, hub = pushed
    _, card = hub.commits  # the card rendered after the files were written
    text = card["contents"]["README.md"].decode()
    assert "## Serving without seqbert" in text
    assert f"- `{ONNX_PATH}`, `{ONNX_INT8_PATH}`: ONNX Runtime, and text-embeddings-inference" in text
    assert f"- `{OPENVINO_PATH}` (weights in the `.bin` beside it): OpenVINO" in text
    assert 'from_pretrained(repo_id, subfolder="openvino", trust_remote_code=True)' in text
    assert "`export=True`, sentence-transformers' `backend=\"openvino\"` exporting, and CTranslate2's converter" in text


@torch.inference_mode()
def test_pre_ln_classifier_logits_in_onnxruntime_and_openvino(pushed, real_batch):
    folder, model, _ = pushed
    expected = model(**real_batch).logits  # (12, 3)
    for got in (run_onnx(folder / ONNX_PATH, real_batch), run_openvino(folder / OPENVINO_PATH, real_batch)):
        assert list(got) == ["logits"] and got["logits"].shape == expected.shape
        assert max_delta(got["logits"], expected) <= TOLERANCE


@torch.inference_mode()
def test_feature_extraction_of_a_head_replaces_every_earlier_file(pushed, real_batch, tmp_path):
    """The pre-LN head's encoder (its final LayerNorm included) exported again for embeddings, ONNX only: the
    classifier's files, int8 and OpenVINO included, are gone."""
    source, model, _ = pushed
    folder = shutil.copytree(source, tmp_path / "model")
    artifacts = save_serving_artifacts(folder, task="feature-extraction", engines=["onnx"], int8=False)
    assert {p for p in files_under(folder) if p.startswith(("onnx/", "openvino/", ".cache/"))} == {ONNX_PATH}
    assert artifacts.task == "feature-extraction" and set(artifacts.files) == {"onnx"}
    got = run_onnx(folder / ONNX_PATH, real_batch)
    assert list(got) == ["last_hidden_state"]
    real = real_batch["attention_mask"].bool()
    assert max_delta(got["last_hidden_state"], model.seqbert(**real_batch).last_hidden_state, real) <= TOLERANCE


@pytest.mark.parametrize(
    "model_class, overrides",
    [(seqbert.SeqBertForQuestionAnswering, {"type_vocab_size": 0}), (seqbert.SeqBertForMultipleChoice, {})],
    ids=["question-answering-without-segments", "multiple-choice"],
)
@torch.inference_mode()
def test_heads_export_their_outputs_by_name(model_class, overrides, tmp_path):
    """Two outputs (question answering; with no segment embedding, so no `token_type_ids` input, which TEI and
    optimum then do not feed) and 3-D inputs (multiple choice). Fill-mask is checked against the model inside every
    export of `tiny_folder` below, text classification and feature extraction above."""
    model = tiny_pre_ln(model_class, **overrides)
    folder = save_folder(model, tmp_path / "model")
    artifacts = save_serving_artifacts(folder, model, engines=["onnx"], int8=False)
    inputs = random_inputs(model.config, batch=6, length=9, seed=3)
    if model_class is seqbert.SeqBertForMultipleChoice:
        inputs = {name: value.view(3, 2, 9) for name, value in inputs.items()}
    if model.config.type_vocab_size == 0:
        del inputs["token_type_ids"]
    got = run_onnx(folder / ONNX_PATH, inputs)
    assert tuple(got) == TASKS[artifacts.task]
    expected = model(**inputs)
    for name, value in got.items():
        assert value.shape == expected[name].shape and max_delta(value, expected[name]) <= TOLERANCE, name


# ----------------------------------------------------------------------------------------------------------------------
# Bad input: one line naming the argument and what is allowed; the folder is left as it was.


@pytest.fixture
def tiny_folder(tmp_path):
    model = tiny_pre_ln(seqbert.SeqBertForMaskedLM)
    return save_folder(model, tmp_path / "model"), model


def assert_untouched(folder, before: set[str]):
    assert files_under(folder) == before and not (folder / ".cache").exists()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"task": "text-classification"}, ValueError, "task ('text-classification') cannot be served by the model in"),
        ({"task": "summarization"}, ValueError, "allowed 'fill-mask', 'feature-extraction'"),
        (
            {"engines": ["tensorrt"]},
            ValueError,
            "engines (['tensorrt']) must be a non-empty list of engines out of 'onnx', 'openvino'",
        ),
        ({"engines": "onnx"}, ValueError, "engines ('onnx') must be a non-empty list"),
        ({"engines": []}, ValueError, "engines ([]) must be a non-empty list"),
    ],
    ids=["task-of-another-head", "unknown-task", "unknown-engine", "engine-string", "no-engine"],
)
def test_bad_task_or_engine_is_refused_before_any_work(tiny_folder, kwargs, error, message):
    folder, _ = tiny_folder
    before = files_under(folder)
    with pytest.raises(error) as raised:
        save_serving_artifacts(folder, **kwargs)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert_untouched(folder, before)


def test_an_engine_that_is_not_installed_is_named(tiny_folder, monkeypatch):
    folder, _ = tiny_folder
    before = files_under(folder)
    monkeypatch.setitem(sys.modules, "openvino", None)  # what `import openvino` meets without the package
    with pytest.raises(ImportError) as raised:
        save_serving_artifacts(folder)
    message = str(raised.value)
    assert "engines (['onnx', 'openvino']) asks for 'openvino', which needs the openvino package" in message
    assert "pip install openvino" in message and "(allowed: 'onnx', 'openvino')" in message and "\n" not in message
    assert_untouched(folder, before)


def test_a_folder_holding_another_model_is_refused(tiny_folder, tmp_path):
    folder, model = tiny_folder
    before = files_under(folder)
    holds = f"model_dir ({str(folder)!r}) holds another model "
    cases = [
        (tiny_pre_ln(seqbert.SeqBertForMaskedLM, seed=1), holds + "(its weight "),
        (
            tiny_pre_ln(seqbert.SeqBertForMaskedLM, hidden_act="relu"),
            holds + "(its config differs from model's in ['hidden_act'])",
        ),
        (tiny_pre_ln(seqbert.SeqBertModel), holds + "(a SeqBertForMaskedLM, where model is a SeqBertModel)"),
        (model.to(torch.bfloat16), "model has ['torch.bfloat16'] parameters: the exported files are float32"),
    ]
    for other, message in cases:
        with pytest.raises(ValueError) as raised:
            save_serving_artifacts(folder, other)
        assert message in str(raised.value) and "\n" not in str(raised.value)
    assert_untouched(folder, before)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"model_dir \('.*empty'\) holds no saved model \(no config.json\)"):
        save_serving_artifacts(empty)
    (empty / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match=r"model_dir \('.*empty'\) holds a 'bert' model, not a 'seqbert' one"):
        save_serving_artifacts(empty)
    assert files_under(empty) == {"config.json"}


def test_a_decoder_has_no_serving_export(tmp_path):
    folder = save_folder(tiny_pre_ln(seqbert.SeqBertForCausalLM), tmp_path / "model")
    with pytest.raises(
        ValueError, match=r"the model in model_dir \(.*\) is a SeqBertForCausalLM, which has no serving"
    ):
        save_serving_artifacts(folder)
    assert not (folder / "onnx").exists()


def test_a_failing_engine_leaves_the_earlier_files_in_place(tiny_folder, monkeypatch):
    """OpenVINO's conversion fails after the ONNX file was written and checked: nothing is moved into the folder,
    whose earlier `onnx/` stays as it was."""
    folder, _ = tiny_folder
    (folder / "onnx").mkdir()
    (folder / ONNX_PATH).write_bytes(b"an earlier export")
    before = files_under(folder)

    def fail(*args, **kwargs):
        raise RuntimeError("conversion failed")

    monkeypatch.setattr(openvino, "convert_model", fail)
    with pytest.raises(RuntimeError, match="conversion failed"):
        save_serving_artifacts(folder, int8=False)
    assert_untouched(folder, before)
    assert (folder / ONNX_PATH).read_bytes() == b"an earlier export"


def test_push_names_its_own_options_on_bad_serving_input(pushed, monkeypatch, capsys):
    folder, _, _ = pushed
    before = files_under(folder)
    cases = [
        (["--serving_artifacts", "tensorrt"], "error: serving_artifacts (['tensorrt']) must be a non-empty list"),
        (["--serving_artifacts", "onnx", "--serving_task", "fill-mask"], "error: serving_task ('fill-mask') cannot be"),
        (["--serving_task", "feature-extraction"], "error: serving_artifacts ([]) must be a non-empty list"),
    ]
    for extra, message in cases:
        with record_hub_requests() as hub:
            status = push_to_hub.main(["--model_dir", str(folder), "--repo_id", "someone/tiny", *extra])
        assert status == 1 and hub.commits == []
        assert message in capsys.readouterr().err
    assert files_under(folder) == before
