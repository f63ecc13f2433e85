"""SeqBERT's optimum export configs (`seqbert.optimum_export`).

optimum-intel 2.2.0 needs transformers < 5.6, so the exports run in an environment of their own, built once by
scripts/checks/check_optimum.py and cached in ~/.cache/seqbert/venvs (without the package index those tests skip
unless it is cached). There, on real MiniLM weights and real Rotten Tomatoes snippets: the registration fires when
optimum's OpenVINO exporter is imported; `SentenceTransformer(folder, backend="openvino")` exports through
`OVModelForFeatureExtraction` and gives SeqBERT's hidden states and embeddings, and its int8 helper keeps their
direction; `OVModelForSequenceClassification` gives a tiny pre-LN model's logits; a task the folder's head cannot serve
stops in one line; and a folder with the serving files `push_to_hub.py --serving_artifacts` writes loads its
`openvino/` files in `OVModelForFeatureExtraction` without exporting, in a process that cannot import seqbert. Here,
where optimum is not installed: the task check, and that the registration costs nothing.
"""

import importlib.util
import re
import sys

import check_environments
import check_optimum
import pytest
from conftest import TINY, skip_module_without_package_index

import seqbert
from seqbert.optimum_export import (
    EXPORTERS,
    SEQBERT_EXPORT_TASKS,
    TASKS_FOR_ARCHITECTURE,
    check_export_task,
    register_optimum_export_config,
    register_optimum_export_configs_on_import,
)


VENV_ROOT = check_environments.DEFAULT_VENV_ROOT  # where the checks build their environments
OPTIMUM_INSTALLED_HERE = importlib.util.find_spec("optimum") is not None


def saved_config(architecture: str | None) -> seqbert.SeqBertConfig:
    """A config as `save_pretrained` leaves it: `architectures` names the saved class."""
    config = seqbert.SeqBertConfig(**TINY)
    config.architectures = [architecture] if architecture else None
    return config


def test_every_seqbert_model_class_has_its_tasks():
    models = {name for name in seqbert.__all__ if name == "SeqBertModel" or name.startswith("SeqBertFor")}
    assert set(TASKS_FOR_ARCHITECTURE) == models
    assert {task for tasks in TASKS_FOR_ARCHITECTURE.values() for task in tasks} == set(SEQBERT_EXPORT_TASKS)


@pytest.mark.parametrize("architecture", sorted(TASKS_FOR_ARCHITECTURE))
def test_each_head_exports_its_own_task_and_the_encoder(architecture):
    for task in SEQBERT_EXPORT_TASKS:
        if task in TASKS_FOR_ARCHITECTURE[architecture]:
            check_export_task(saved_config(architecture), task)
        else:
            with pytest.raises(ValueError, match=rf"^task \('{task}'\) cannot be exported from a {architecture} "):
                check_export_task(saved_config(architecture), task)


def test_a_task_the_head_cannot_serve_is_refused_in_one_line():
    with pytest.raises(ValueError) as refused:
        check_export_task(saved_config("SeqBertModel"), "text-classification")
    assert str(refused.value) == (
        "task ('text-classification') cannot be exported from a SeqBertModel checkpoint, whose head does not serve it "
        "(it serves only feature-extraction): save the model with the head of that task first"
    )
    with pytest.raises(ValueError, match=r"\(a decoder-only model serves none of them\)"):
        check_export_task(saved_config("SeqBertForCausalLM"), "feature-extraction")
    with pytest.raises(ValueError, match=r"^task \('summarization'\) must be one of the tasks SeqBERT exports: "):
        check_export_task(saved_config("SeqBertForConditionalGeneration"), "summarization")
    with pytest.raises(ValueError, match=r"config.architectures \(\['BertModel'\]\) names no SeqBERT model"):
        check_export_task(saved_config("BertModel"), "feature-extraction")
    for task in SEQBERT_EXPORT_TASKS:  # a config built in memory names no head
        check_export_task(saved_config(None), task)


@pytest.mark.skipif(OPTIMUM_INSTALLED_HERE, reason="optimum is installed here: the optimum environment's tests apply")
def test_without_optimum_registration_costs_nothing_and_asking_names_the_package():
    finders, modules = list(sys.meta_path), set(sys.modules)
    register_optimum_export_configs_on_import()
    assert sys.meta_path == finders
    assert not {name for name in set(sys.modules) - modules if name.startswith("optimum")}
    for exporter, (_, _, package) in EXPORTERS.items():
        needs = re.escape(f"exporter ('{exporter}') needs {package}, which is not installed here (No module named")
        with pytest.raises(ImportError, match=rf"^{needs} 'optimum[.a-z]*'\): pip install '{re.escape(package)}'$"):
            register_optimum_export_config(exporter)
    with pytest.raises(ValueError, match=r"^exporter \('tflite'\) must be one of 'openvino', 'onnx'$"):
        register_optimum_export_config("tflite")


def test_a_failed_registration_warns_instead_of_breaking_the_import_of_optimum():
    # What the import hook runs inside `import optimum...`; here optimum's TasksManager cannot be imported.
    with pytest.warns(UserWarning, match=r"^seqbert could not register its openvino export config with optimum "):
        seqbert.optimum_export._register_after_import("openvino", model_configs=sys.modules[__name__])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The quick checks of scripts/checks/check_optimum.py, run once in the optimum environment."""
    if not check_optimum.is_built(VENV_ROOT):
        skip_module_without_package_index(
            f"the {check_optimum.ENVIRONMENT} environment", "python scripts/checks/check_optimum.py --quick"
        )
    return check_optimum.check(VENV_ROOT, tmp_path_factory.mktemp("optimum"), quick=True)


def test_registration_happens_when_the_openvino_exporter_is_imported(results):
    registration = results["registration"]
    assert registration["optimum imported before registration was asked for"] is False
    assert registration["openvino_config"] == "SeqBertOpenVINOConfig"
    assert registration["openvino_tasks"] == sorted(SEQBERT_EXPORT_TASKS)
    # optimum-onnx, the ONNX exporter, needs transformers < 4.58: it cannot be installed next to SeqBERT.
    assert registration["onnx"].startswith("exporter ('onnx') needs optimum-onnx, which is not installed here")


def test_minilm_through_sentence_transformers_openvino_backend(results):
    minilm = results["minilm/sentence-transformers"]
    assert minilm["exporter_class"] == "OVModelForFeatureExtraction"
    assert minilm["input_names"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert {"openvino/openvino_model.xml", "openvino/openvino_model.bin"} <= set(minilm["saved"])
    for output in ("last_hidden_state", "embeddings"):
        assert minilm["max_abs_delta"][output] <= check_optimum.FP32_TOLERANCE, output
    # OpenVINO's own default precision (bf16 where the CPU has it) keeps the embeddings' direction.
    assert minilm["default_precision_min_cosine"] >= check_optimum.DEFAULT_PRECISION_MIN_COSINE


def test_sentence_transformers_int8_helper(results):
    minilm = results["minilm/sentence-transformers"]
    assert {"openvino/openvino_model_qint8_quantized.xml", "openvino/openvino_model_qint8_quantized.bin"} <= set(
        minilm["saved"]
    )
    assert minilm["int8_min_cosine"] >= check_optimum.INT8_MIN_COSINE


def test_pre_ln_sequence_classification(results):
    tiny = results["tiny-pre/text-classification"]
    assert tiny["input_names"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert tiny["reference_max_abs"]["logits"] > 0
    assert tiny["max_abs_delta"]["logits"] <= check_optimum.FP32_TOLERANCE


def test_serving_files_load_in_optimum_without_seqbert(results):
    # What a Hub user with only the folder runs: OVModelForFeatureExtraction.from_pretrained(folder,
    # subfolder="openvino", trust_remote_code=True), no export=True, in a process without seqbert on its path.
    served = results["minilm/openvino-files-without-seqbert"]
    assert served["import seqbert"] == "No module named 'seqbert'"
    assert served["seqbert_spec"] == "None"
    assert served["seqbert_modules"] == []
    assert served["config_module"] == "transformers_modules"  # the folder's own configuration code
    assert served["loaded_from"] == "openvino"  # the folder's files, not an export
    assert served["input_names"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert served["precision"] == "f32"
    assert served["reference_max_abs"]["last_hidden_state"] > 1
    assert served["max_abs_delta"]["last_hidden_state"] <= check_optimum.FP32_TOLERANCE


def test_optimum_refuses_a_task_the_head_cannot_serve(results):
    message = (
        "task ('text-classification') cannot be exported from a SeqBertModel checkpoint, whose head does not serve it "
        "(it serves only feature-extraction): save the model with the head of that task first"
    )
    # main_export (optimum-cli) creates its output folder before it builds the export config: it stays empty.
    assert results["bad-task"] == {
        "error_type": "ValueError",
        "message": message,
        "main_export_message": message,
        "main_export_left": [],
    }
    assert check_optimum.failures(results) == []
