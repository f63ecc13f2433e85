"""int8 inference (`seqbert.optimize_for_cpu_inference(model, int8=True)`): its 8-bit quantization and int8 linear
layers checked against the dequantized product computed in float64 on the real MiniLM weights and real text, and the
script that measures what int8 costs a fine-tuned classifier."""

import json

import evaluate_int8  # noqa: E402
import pytest
import torch
from transformers import BertForSequenceClassification

import seqbert
from seqbert.cpu_inference import PackedLinear, bf16_linear_available, onednn_available, quantize_per_tensor_uint8
from seqbert.script_utils import ScriptInputError  # noqa: E402


needs_onednn = pytest.mark.skipif(not onednn_available(), reason="needs torch's oneDNN operators on an x86 AVX2 CPU")


@pytest.fixture(scope="module")
def real_activations(minilm_path, tokenizer, rt_texts):
    """The inputs of MiniLM's first feed-forward layer (after its LayerNorm) and of its down projection (after
    GELU), on 32 real snippets: (T, 384) and (T, 1536) fp32, real tokens only."""
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    seen = {}
    mlp = model.encoder.layers[0].mlp

    def record(name):
        def hook(module, args):
            seen[name] = args[0].reshape(-1, module.in_features).clone()

        return hook

    mlp.up_proj.register_forward_pre_hook(record("up"))
    mlp.down_proj.register_forward_pre_hook(record("down"))
    with torch.no_grad():
        model(**tokenizer(rt_texts[:32], padding=True, return_tensors="pt"))
    return model, seen


def test_uint8_quantization_round_trips_within_half_a_step(real_activations):
    _, seen = real_activations
    for x in (*seen.values(), torch.zeros(3, 4), -seen["up"].abs(), seen["down"].abs()):
        q, scale, zero_point = quantize_per_tensor_uint8(x)
        assert q.dtype == torch.uint8 and q.shape == x.shape and scale > 0
        assert 0 <= q.min() and q.max() <= 254  # no clamp needed: a step to spare at the top
        error = ((q.double() - zero_point) * scale - x.double()).abs().max().item()
        assert error <= scale * (0.5 + 1e-4)
        assert (q[x == 0] == zero_point).all()  # zero is exact
    low, high = seen["down"].min().item(), seen["down"].max().item()  # GELU outputs: a range from about -0.17 up
    assert quantize_per_tensor_uint8(seen["down"])[1] == pytest.approx((high - low) / 253)


@needs_onednn
def test_int8_linear_is_the_dequantized_product(real_activations):
    model, seen = real_activations
    mlp = model.encoder.layers[0].mlp
    for linear, x in ((mlp.up_proj, seen["up"]), (mlp.down_proj, seen["down"])):
        packed = PackedLinear([linear], int8=True)
        got = packed(x)
        # The reference, in float64: weights rounded to int8 with one scale per output feature (absmax / 127), the
        # input to uint8 as quantize_per_tensor_uint8 gives it, then the product of the dequantized operands.
        weight = linear.weight.detach().double()
        weight_scale = weight.abs().amax(1, keepdim=True) / 127
        weight_q = torch.round(weight / weight_scale).clamp(-127, 127)
        q, scale, zero_point = quantize_per_tensor_uint8(x)
        expected = ((q.double() - zero_point) * scale) @ (weight_q * weight_scale).T + linear.bias.double()
        assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()
        # and int8 stays near fp32: within a few percent of the output's range
        assert (got - linear(x)).abs().max() <= 0.05 * linear(x).abs().max()
        gelu = packed(x, activation=("gelu", "none"))  # the fused post-op is exact GELU of the same product
        assert (gelu.double() - torch.nn.functional.gelu(expected)).abs().max() <= 1e-5 * expected.abs().max()


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
    assert results["fp32_optimized"]["accuracy"] == pytest.approx(results["fp32"]["accuracy"])
    assert results["accuracy_change_points"] == pytest.approx(
        100 * (results["int8"]["accuracy"] - results["fp32"]["accuracy"])
    )
    if bf16_linear_available():
        assert results["bf16"]["same_prediction"] >= 0.9
        assert results["bf16"]["accuracy_change_points"] == pytest.approx(
            100 * (results["bf16"]["accuracy"] - results["fp32"]["accuracy"])
        )
    assert json.loads(json_file.read_text()) == results


def test_evaluate_int8_rejects_a_folder_without_a_model():
    with pytest.raises(ScriptInputError, match="--model_dir 'no/such/folder' is not a model folder"):
        evaluate_int8.main(["--model_dir", "no/such/folder"])


def test_evaluate_int8_rejects_an_empty_batch(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ScriptInputError, match="--batch_size must be >= 1, got 0"):
        evaluate_int8.main(["--model_dir", str(tmp_path), "--batch_size", "0"])


def test_evaluate_int8_rejects_a_model_that_is_not_seqbert(minilm_path, tmp_path):
    BertForSequenceClassification.from_pretrained(minilm_path, num_labels=2).save_pretrained(tmp_path)
    with pytest.raises(ScriptInputError, match="holds a BertForSequenceClassification, not a SeqBERT classifier"):
        evaluate_int8.main(["--model_dir", str(tmp_path)])
