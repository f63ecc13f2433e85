"""scripts/run_classification.py end to end on the real offline data (a small slice, one epoch): the command line a
user runs, the files it promises, and a model that loads back through the Auto class with the same predictions."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import seqbert
from seqbert.data import load_rotten_tomatoes


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("run") / "rt"
    command = [
        sys.executable,
        str(ROOT / "scripts" / "run_classification.py"),
        "--output_dir",
        str(output_dir),
        "--max_train_samples",
        "96",
        "--max_eval_samples",
        "64",
        "--num_train_epochs",
        "1",
        "--logging_steps",
        "1",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")  # proves the default path never needs the Hub
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return output_dir, result


def test_writes_results_model_tokenizer_and_loss_curve(small_run):
    output_dir, _ = small_run
    results = json.loads((output_dir / "all_results.json").read_text())
    assert 0.0 <= results["eval_accuracy"] <= 1.0
    assert results["train_samples"] == 96 and results["eval_samples"] == 64
    for name in ("config.json", "model.safetensors", "tokenizer.json", "loss_curve.png", "trainer_state.json"):
        assert (output_dir / name).exists(), name
    assert (output_dir / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_saved_model_loads_through_the_auto_class_and_reproduces_the_accuracy(small_run):
    output_dir, _ = small_run
    model = AutoModelForSequenceClassification.from_pretrained(output_dir).eval()
    assert type(model) is seqbert.SeqBertForSequenceClassification
    assert model.config.id2label == {0: "rotten", 1: "fresh"} and model.config.norm_placement == "post"
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    validation = load_rotten_tomatoes()["validation"].select(range(64))  # what the script evaluated on
    with torch.no_grad():
        batch = tokenizer(list(validation["text"]), padding=True, truncation=True, max_length=128, return_tensors="pt")
        predictions = model(**batch).logits.argmax(-1)
    accuracy = (predictions == torch.tensor(list(validation["label"]))).float().mean().item()
    results = json.loads((output_dir / "all_results.json").read_text())
    assert accuracy == pytest.approx(results["eval_accuracy"], abs=1e-9)
