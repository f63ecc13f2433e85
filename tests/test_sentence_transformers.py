"""sentence-transformers on a converted checkpoint: the packaged MiniLM is a sentence-transformers model (mean pooling,
Normalize, max_seq_length 256). `convert_bert_checkpoint.py` keeps its modules, so `SentenceTransformer(folder,
trust_remote_code=True)` gives the original's embeddings, with seqbert installed and in a process without it."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import SCRIPT_PATHS, run_without_seqbert
from sentence_transformers import SentenceTransformer

import seqbert


TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def converted(minilm_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("st") / "minilm-seqbert"
    command = [
        sys.executable, str(SCRIPT_PATHS["convert_bert_checkpoint.py"]),
        "--bert_model_name_or_path", str(minilm_path), "--output_dir", str(folder),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    return folder


def test_conversion_keeps_the_sentence_transformers_modules(minilm_path, converted):
    for name in (
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "1_Pooling/config.json",
    ):
        assert (converted / name).read_bytes() == (minilm_path / name).read_bytes(), name
    modules = json.loads((converted / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((converted / "config.json").read_text())["model_type"] == "seqbert"


def test_embeddings_equal_the_original_models(minilm_path, converted, rt_texts):
    texts = rt_texts[:64] + [" ".join(rt_texts[64:120])]  # one text longer than max_seq_length (256 tokens)
    original = SentenceTransformer(str(minilm_path), device="cpu")
    model = SentenceTransformer(str(converted), device="cpu", trust_remote_code=True)
    assert type(model[0].auto_model) is seqbert.SeqBertModel
    assert model.max_seq_length == original.max_seq_length == 256
    expected = original.encode(texts, convert_to_tensor=True, batch_size=16)
    got = model.encode(texts, convert_to_tensor=True, batch_size=16)
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(texts)), atol=1e-5)  # Normalize is there
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_embeddings_without_seqbert_installed(minilm_path, converted, rt_texts, tmp_path):
    texts = rt_texts[:8]
    expected = SentenceTransformer(str(minilm_path), device="cpu").encode(texts, convert_to_tensor=True)
    outputs = run_without_seqbert([{"name": "st", "mode": "embed", "folder": str(converted), "texts": texts}], tmp_path)
    assert (outputs["st.embeddings"] - expected).abs().max().item() <= TOLERANCE


def test_a_plain_bert_checkpoint_gets_no_sentence_transformers_files(bert_checkpoints, tmp_path):
    """In-process (`main`): the `converted` fixture runs the command as users do."""
    import convert_bert_checkpoint  # scripts/hub, on sys.path by conftest

    folder = tmp_path / "plain"
    convert_bert_checkpoint.main(
        [
            "--bert_model_name_or_path", str(bert_checkpoints["BertForMaskedLM"]), "--output_dir", str(folder),
            "--model_class", "SeqBertModel",
        ]
    )  # fmt: skip
    assert not (folder / "modules.json").exists()
