"""The contenders of scripts/benchmarks/benchmark.py compute BERT: each engine built from the real MiniLM checkpoint gives
transformers' BertModel hidden states on real text (so the speed table compares like with like), and the fast paths
it claims are the ones taken. CTranslate2's and OpenVINO's contenders are a `benchmark_run` test, run on demand
(`python -m pytest -m benchmark_run`; about 25 s of CPU): seqbert's own CTranslate2 and OpenVINO routes have tests of
their own in the default run (test_ctranslate2_loader.py, test_export_bert.py)."""

import benchmark_engines  # noqa: E402
import pytest
import torch
from transformers import BertModel

import seqbert
from seqbert.cpu_inference import bf16_instructions_available


@torch.inference_mode()
def test_every_engine_computes_bert_on_real_text(minilm_path, tokenizer, rt_texts, tmp_path):
    batch = dict(tokenizer(rt_texts[:32], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    assert not real.all()  # a padded batch, as the benchmark's
    bert = BertModel.from_pretrained(minilm_path).eval()
    expected = bert(**batch).last_hidden_state

    nested = benchmark_engines.NestedTensorBert(bert)(**batch)
    assert (nested[~real] == 0).all()  # the nested-tensor fast path ran: it pads its output with zeros
    assert (nested - expected)[real].abs().max() < 1e-5

    fp32_path, int8_path, fused = benchmark_engines.export_fused_onnx(str(minilm_path), batch, tmp_path)
    assert fused["Attention"] == fused["BiasGelu"] == 6 and fused["EmbedLayerNormalization"] == 1
    other = dict(tokenizer(rt_texts[32:40], padding=True, return_tensors="pt"))  # another batch and length
    for inputs in (batch, other):
        got = benchmark_engines.onnxruntime_engine(fp32_path, threads=1)(inputs)
        reference = bert(**inputs).last_hidden_state
        assert (got - reference)[inputs["attention_mask"].bool()].abs().max() < 1e-4

    # The int8 engines stay within int8's reach of fp32, each with its own quantization.
    int8 = seqbert.optimize_for_cpu_inference(seqbert.SeqBertModel.from_bert_pretrained(minilm_path), int8=True)
    for engine in (
        benchmark_engines.onnxruntime_engine(int8_path, threads=1),
        benchmark_engines.torch_engine(int8),
    ):
        delta = (engine(batch) - expected)[real].abs()
        assert 0 < delta.mean() < 0.2


@torch.inference_mode()
@pytest.mark.benchmark_run
def test_ctranslate2_and_openvino_compute_bert_on_real_text(minilm_path, tokenizer, rt_texts, tmp_path):
    bert = BertModel.from_pretrained(minilm_path).eval()
    batch = dict(tokenizer(rt_texts[:32], padding=True, return_tensors="pt"))
    other = dict(tokenizer(rt_texts[32:40], padding=True, return_tensors="pt"))  # another batch and length
    fp32 = benchmark_engines.convert_ctranslate2(str(minilm_path), tmp_path, "float32")
    int8 = benchmark_engines.convert_ctranslate2(str(minilm_path), tmp_path, "int8")
    engines = {
        "ctranslate2": benchmark_engines.ctranslate2_engine(fp32, "float32", threads=1),
        "openvino": benchmark_engines.openvino_engine(bert, batch, threads=1),
    }
    assert engines["openvino"].precision == "fp32" and engines["ctranslate2"].precision == "fp32"
    # With no hint OpenVINO picks bf16 where the CPU has bf16 instructions, f32 elsewhere; the engine reports it.
    default = benchmark_engines.openvino_engine(bert, batch, threads=1, precision=None)
    assert default.precision == ("bf16" if bf16_instructions_available() else "fp32")
    expected = bert(**batch).last_hidden_state
    tolerance = 0.1 if default.precision == "bf16" else 1e-4
    assert (default(batch) - expected)[batch["attention_mask"].bool()].abs().max() < tolerance
    for inputs in (batch, other):
        real = inputs["attention_mask"].bool()
        expected = bert(**inputs).last_hidden_state
        for name, engine in engines.items():
            got = engine(inputs)
            assert got.shape == expected.shape, name
            assert (got - expected)[real].abs().max() < 1e-4, name
        delta = (benchmark_engines.ctranslate2_engine(int8, "int8", threads=1)(inputs) - expected)[real].abs()
        assert 0 < delta.mean() < 0.2
