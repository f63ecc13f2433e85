"""The llama.cpp route for SeqBERT encoders: `save_as_bert`, llama.cpp's own convert_hf_to_gguf.py, llama.cpp.

llama.cpp's converter wants transformers 4.57.6, so this runs in an environment of its own, built once by
scripts/checks/check_llama_cpp.py and cached in ~/.cache/seqbert/venvs: llama.cpp itself from xllamacpp's prebuilt CPU
wheel (nothing is compiled; until 2026-11-26 llama-cpp-python was built from its sdist, 4 to 5 minutes in every fresh
home folder), the converter from llama-cpp-python's sdist (without the package index these tests skip unless the
environment is cached). There, on the real MiniLM weights and 32 real Rotten Tomatoes snippets, the quick checks: the
f32 GGUF file of MiniLM's BERT folder is a mean-pooling `bert` model, llama.cpp tokenizes like the transformers
tokenizer, and its embeddings and per-token hidden states match SeqBERT's. That save_as_bert refuses a pre-LN model in
one line, writing nothing, is tested without llama.cpp in tests/test_export_bert.py
(`test_what_bert_lacks_is_refused_in_one_line`); here the check confirms it for a saved pre-LN folder, where a
llama.cpp user would start.
"""

import check_environments
import check_llama_cpp
import pytest
from conftest import skip_module_without_package_index


VENV_ROOT = check_environments.DEFAULT_VENV_ROOT  # where the checks build their environments
# llama.cpp does not compute BERT exactly even from an f32 GGUF: its GELU is the tanh approximation read from an fp16
# table, where BERT's is the exact erf GELU, which alone moves MiniLM's pooled embeddings by 1.25e-3. Measured: pooled
# max |delta| 1.32e-3 (values up to 1.13), per-token 4.0e-3 (up to 6.07), min cosine 0.9999988; the tolerances, two to
# three times that, are justified at `check_llama_cpp.TOLERANCES`.
F32 = check_llama_cpp.TOLERANCES["f32"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """The quick checks of scripts/checks/check_llama_cpp.py, run once in the llama.cpp environment."""
    if not check_llama_cpp.is_built(VENV_ROOT):
        skip_module_without_package_index(
            f"the {check_llama_cpp.ENVIRONMENT} environment", "python scripts/checks/check_llama_cpp.py --quick"
        )
    return check_llama_cpp.check(VENV_ROOT, tmp_path_factory.mktemp("llama-cpp"), quick=True)


def test_the_gguf_file_is_a_mean_pooling_bert_model(results):
    f32 = results["minilm/gguf-f32"]
    assert "error" not in f32, f32.get("error")
    metadata = f32["metadata"]
    assert metadata["general.architecture"] == "bert"
    assert metadata["tokenizer.ggml.model"] == "bert"  # WordPiece
    # From the folder's sentence-transformers pooling module, which save_as_bert copies next to the BERT weights.
    assert metadata["bert.pooling_type"] == "MEAN"
    assert set(metadata["tensor_types"]) == {"F32"}


def test_llama_cpp_tokenizes_like_the_transformers_tokenizer(results):
    f32 = results["minilm/gguf-f32"]
    assert f32["texts"] == check_llama_cpp.NUM_TEXTS
    assert f32["same_ids"] == f32["texts"], f32["id_mismatches"]


def test_f32_embeddings_match_seqbert(results):
    f32 = results["minilm/gguf-f32"]
    assert f32["max_abs_delta"]["pooled"] <= F32["pooled"]
    assert f32["min_cosine"]["pooled"] >= F32["min_cosine"]


def test_f32_per_token_hidden_states_match_seqbert(results):
    f32 = results["minilm/gguf-f32"]
    assert f32["max_abs_delta"]["hidden"] <= F32["hidden"]
    assert f32["min_cosine"]["hidden"] >= F32["min_cosine"]


def test_embeddings_are_normalized_only_when_asked(results):
    f32 = results["minilm/gguf-f32"]
    # llama.cpp's server with embd_normalize=-1 returns the mean-pooled vectors as they are (the GGUF file keeps no
    # trace of the sentence-transformers Normalize module): their norms are SeqBERT's, not 1; its default is L2.
    for got, want in zip(f32["norms"], f32["reference_norms"], strict=True):
        assert got == pytest.approx(want, rel=1e-3)
    assert min(f32["reference_norms"]) > 1.5
    assert f32["normalized_norms"] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert f32["max_abs_delta"]["normalized"] <= F32["normalized"]


def test_save_as_bert_refuses_a_pre_ln_folder_in_one_line(results):
    refusal = results["pre-ln/save_as_bert"]
    assert refusal["error_type"] == "ValueError"
    assert refusal["message"].startswith(check_llama_cpp.PRE_LN_REFUSAL)
    assert "\n" not in refusal["message"]
    assert refusal["written"] == []
    assert check_llama_cpp.failures(results) == []
