"""int8 inference (README, "int8 inference"): torch's dynamic quantization of SeqBERT's linear layers, checked against
the same quantization of transformers' BertModel on the real MiniLM weights and real text, and the script that
measures what it costs a fine-tuned classifier."""

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import BertModel

import seqbert


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import evaluate_int8  # noqa: E402

from seqbert.script_utils import ScriptInputError  # noqa: E402


@torch.inference_mode()
def test_int8_seqbert_tracks_int8_bert_on_real_text(minilm_path, tokenizer, rt_texts):
    batch = dict(tokenizer(rt_texts[:64], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    bert = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    bert_int8, model_int8 = evaluate_int8.quantize_int8(bert), evaluate_int8.quantize_int8(model)

    assert not any(type(module) is torch.nn.Linear for module in model_int8.modules())
    assert any(type(module) is torch.nn.Linear for module in model.modules())  # the fp32 model is left as it was
    expected = bert(**batch).last_hidden_state
    reference_int8 = bert_int8(**batch).last_hidden_state
    got = model_int8(**batch).last_hidden_state
    # int8 moves hidden states by about 1 (of values up to about 10); seqbert's int8 model stays at least as close
    # to BERT's int8 model as that model is to fp32. (Not equal: dynamic quantization scales each activation tensor
    # by its range, and BERT's includes its padding rows.)
    quantization_error = (reference_int8 - expected)[real].abs().max()
    assert 0 < (got - reference_int8)[real].abs().max() <= quantization_error
    # Sentence embeddings (mean over real tokens) keep their direction as well as BERT's int8 model keeps it.
    weights = batch["attention_mask"][..., None].float()
    fp32, theirs, ours = ((states * weights).sum(1) / weights.sum(1) for states in (expected, reference_int8, got))
    cosine = torch.nn.functional.cosine_similarity
    assert cosine(fp32, ours).mean() >= cosine(fp32, theirs).mean() - 0.005
    assert cosine(fp32, ours).min() > 0.95


def test_evaluate_int8_reports_the_trainers_accuracy_for_fp32(classification_run, tmp_path):
    json_file = tmp_path / "int8.json"
    results = evaluate_int8.main(
        [
            "--model_dir",
            str(classification_run),
            "--max_eval_samples",
            "64",
            "--repeats",
            "1",
            "--json_file",
            str(json_file),
        ]
    )
    trainer = json.loads((classification_run / "all_results.json").read_text())
    assert trainer["eval_samples"] == results["examples"] == 64
    assert results["fp32"]["accuracy"] == pytest.approx(trainer["eval_accuracy"])
    assert results["same_prediction"] >= 0.9
    assert results["accuracy_change_points"] == pytest.approx(
        100 * (results["int8"]["accuracy"] - results["fp32"]["accuracy"])
    )
    assert json.loads(json_file.read_text()) == results


def test_evaluate_int8_rejects_a_folder_without_a_model():
    with pytest.raises(ScriptInputError, match="--model_dir 'no/such/folder' is not a model folder"):
        evaluate_int8.main(["--model_dir", "no/such/folder"])


def test_evaluate_int8_rejects_an_empty_batch(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ScriptInputError, match="--batch_size must be >= 1, got 0"):
        evaluate_int8.main(["--model_dir", str(tmp_path), "--batch_size", "0"])
