"""int8 inference (`seqbert.optimize_for_cpu_inference(model, int8=True)`): its 8-bit quantization and int8 linear
layers checked against the dequantized product computed in float64 on the real MiniLM weights and real text, and the
script that measures what int8 costs a fine-tuned classifier."""

import json
import os
from unittest import mock

import evaluate_int8  # noqa: E402
import pytest
import torch
from transformers import BertForSequenceClassification

import seqbert
from seqbert.cpu_inference import (
    INT8_CALL_FORMS,
    INT8_GEMM_FORM,
    CpuInferencePlan,
    PackedLinear,
    bf16_linear_available,
    capabilities,
    int8_products_saturate,
    int8_weight_levels,
    linear_kernels,
    onednn_x86_operators_available,
    quantize_per_tensor_uint8,
)
from seqbert.script_utils import ScriptInputError  # noqa: E402


needs_onednn = pytest.mark.skipif(
    not onednn_x86_operators_available(), reason="needs torch's oneDNN operators on an x86 AVX2 CPU"
)


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


@pytest.mark.cpu_semantics
def test_uint8_quantization_round_trips_within_half_a_step(real_activations):
    _, seen = real_activations
    inputs = (*seen.values(), torch.zeros(3, 4), -seen["up"].abs(), seen["down"].abs(), seen["up"][:5])
    for x in (*inputs, seen["up"].bfloat16()):  # small inputs take another range op, bf16 another rounding
        q, scale, zero_point = quantize_per_tensor_uint8(x)
        assert q.dtype == torch.uint8 and q.shape == x.shape and scale > 0
        assert 0 <= q.min() and q.max() <= 254  # no clamp needed: a step to spare at the top
        error = ((q.double() - zero_point) * scale - x.double()).abs().max().item()
        assert error <= scale * (0.5 + 1e-4)
        assert (q[x == 0] == zero_point).all()  # zero is exact
        shifted = linear_kernels._quantize(x, shifted=True)  # what the decoder's small int8 products read
        assert shifted[0].dtype == torch.int8 and torch.equal(shifted[0].int() + 128, q.int())
        assert shifted[1:] == (scale, zero_point)
    low, high = seen["down"].min().item(), seen["down"].max().item()  # GELU outputs: a range from about -0.17 up
    assert quantize_per_tensor_uint8(seen["down"])[1] == pytest.approx((high - low) / 253)
    for bad in (float("nan"), float("inf")):  # 8 bits cannot hold them: a clear error, not a deep one
        broken = seen["up"].clone()
        broken[3, 7] = bad
        with pytest.raises(ValueError, match=r"int8 layer's input holds NaN or an infinity \(its range is \["):
            quantize_per_tensor_uint8(broken)


def _exact_product(linear: torch.nn.Linear, x: torch.Tensor, levels: int) -> torch.Tensor:
    """The product of the int8 linear's quantized operands, in float64: weights rounded with one scale per output
    feature (absmax / levels), the input to uint8 as `quantize_per_tensor_uint8` gives it, plus the bias."""
    weight = linear.weight.detach().double()
    weight_scale = weight.abs().amax(1, keepdim=True) / levels
    weight_q = torch.round(weight / weight_scale).clamp(-levels, levels)
    q, scale, zero_point = quantize_per_tensor_uint8(x)
    return ((q.double() - zero_point) * scale) @ (weight_q * weight_scale).T + linear.bias.double()


def _call_forms(real_activations) -> dict[str, tuple]:
    """Each int8 call form seqbert uses on MiniLM's first layer, on real inputs: (linear, input, PackedLinear's
    keyword arguments, residual or None, the exact post-op on the exact product)."""
    model, seen = real_activations
    mlp = model.encoder.layers[0].mlp
    return {
        "plain": (mlp.up_proj, seen["up"], {}, None, lambda y: y),
        "gelu": (mlp.up_proj, seen["up"], {"activation": "gelu"}, None, torch.nn.functional.gelu),
        "gelu_tanh": (
            mlp.up_proj, seen["up"], {"activation": "gelu_pytorch_tanh"}, None,
            lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
        ),
        "relu": (mlp.up_proj, seen["up"], {"activation": "relu"}, None, torch.relu),
        # the feed-forward's second product adds the residual, the feed-forward's input
        "add": (mlp.down_proj, seen["down"], {"residual": True}, seen["up"], lambda y: y),
    }  # fmt: skip


@pytest.mark.cpu_semantics
@needs_onednn
def test_int8_linear_is_the_dequantized_product(real_activations):
    """Every int8 call form seqbert uses (plain, each fused activation, the residual add of
    `onednn.qlinear_pointwise.binary`) computes exactly the product of its dequantized operands, on every x86 CPU:
    with 8-bit weights where the form's int8 products are exact (VNNI), with 7-bit ones where they saturate (no VNNI,
    or oneDNN held to AVX2, as the capped run of this file in tests/test_cpu_semantics.py does)."""
    forms = _call_forms(real_activations)
    assert set(forms) == set(INT8_CALL_FORMS)
    for form, (linear, x, options, residual, post_op) in forms.items():
        packed = PackedLinear([linear], int8=True, **options)
        levels = int8_weight_levels(form)
        assert packed.call_form == form and packed.weight_levels == levels
        got = packed(x) if residual is None else packed(x, residual=residual)
        product = _exact_product(linear, x, levels)
        expected = post_op(product) if residual is None else product + residual.double()
        assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max(), form
        # and int8 stays near fp32: within a few percent of the output's range
        fp32 = post_op(linear(x)) if residual is None else linear(x) + residual
        assert (got - fp32).abs().max() <= 0.05 * fp32.abs().max(), form


@pytest.mark.cpu_semantics
@needs_onednn
def test_small_int8_products_are_the_same_dequantized_product(real_activations, monkeypatch):
    """A decode step's few rows (`small_products`, at most `SMALL_INT8_PRODUCT` outputs) go through oneDNN's s8 x s8
    gemm (`torch._int_mm`) with the bias and post-op or residual added after: in every call form, the exact product
    of the same dequantized operands, as oneDNN's int8 linear gives it for the same rows, on every x86 CPU (here with
    the 8-bit or 7-bit weights the form gets; the capped run in tests/test_cpu_semantics.py holds oneDNN to AVX2,
    where the gemm saturates too and 7-bit weights keep it exact). Larger products stay on oneDNN's int8 linear."""
    gemm = mock.Mock(wraps=torch._int_mm)
    monkeypatch.setattr(torch, "_int_mm", gemm)
    for form, (linear, x, options, residual, post_op) in _call_forms(real_activations).items():
        rows = 8  # a greedy step of 8 sources: 8 x 1,536 outputs at most
        x, residual = x[:rows], None if residual is None else residual[:rows]
        small = PackedLinear([linear], int8=True, small_products=True, **options)
        levels = small.weight_levels
        assert small.small_products and levels == min(int8_weight_levels(form), int8_weight_levels(INT8_GEMM_FORM))
        plain = PackedLinear([linear], int8=True, weight_levels=levels, **options)
        calls = gemm.call_count
        got = small(x) if residual is None else small(x, residual=residual)
        assert gemm.call_count == calls + 1, form
        onednn = plain(x) if residual is None else plain(x, residual=residual)
        assert gemm.call_count == calls + 1, form
        product = _exact_product(linear, x, levels)
        expected = post_op(product) if residual is None else product + residual.double()
        assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max(), form
        assert (got - onednn).abs().max() <= 1e-5 * onednn.abs().max(), form
    many = real_activations[1]["up"]  # hundreds of rows x 1,536 outputs: oneDNN's int8 linear
    assert many.shape[0] * 1536 > linear_kernels.SMALL_INT8_PRODUCT
    calls = gemm.call_count
    PackedLinear([real_activations[0].encoder.layers[0].mlp.up_proj], int8=True, small_products=True)(many)
    assert gemm.call_count == calls


@needs_onednn
def test_small_int8_products_stay_on_onednn_where_only_the_gemm_saturates(minilm_path, monkeypatch):
    """Where oneDNN's s8 x s8 gemm saturates and its int8 linear does not, a layer keeps its 8-bit weights and every
    product on the int8 linear, rather than losing a bit of every weight for the small products' speed."""
    monkeypatch.setattr(capabilities, "int8_products_saturate", lambda form=None: form == INT8_GEMM_FORM)
    linear = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).encoder.layers[0].mlp.up_proj
    packed = PackedLinear([linear], int8=True, small_products=True)
    assert packed.weight_levels == 127 and not packed.small_products
    with mock.patch.object(torch, "_int_mm", side_effect=AssertionError("the gemm was called")):
        packed(torch.randn(2, 384))


def _cpu_flags() -> set[str]:
    """The CPU's feature flags as the kernel reports them (Linux), independently of torch and oneDNN."""
    for line in open("/proc/cpuinfo").read().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.cpu_semantics
@needs_onednn
@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads the CPU flags from Linux's /proc/cpuinfo")
def test_saturation_probe_follows_the_instructions_onednn_may_use(real_activations):
    """`int8_products_saturate` says True, in every call form, exactly where oneDNN has no VNNI to use: the CPU lacks
    AVX512_VNNI and AVX-VNNI, or oneDNN is held below them (`ONEDNN_MAX_CPU_ISA=AVX2` or `AVX512_CORE`). Where it
    says True, 8-bit weights really do give wrong products on real activations and weights (the probe is not
    vacuous: in the plain and residual-add forms; the activations' post-ops hide them here, as the 160 saturated
    products of these snippets, held to AVX2, all lie at pre-activations of -5.4 to -3.9, where GELU and ReLU give
    about 0), and the 7-bit weights the CPU gets are exact in every form."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    has_vnni = bool({"avx512_vnni", "avx_vnni"} & _cpu_flags())
    expected = not has_vnni or cap in ("AVX2", "AVX512_CORE")
    assert {form: int8_products_saturate(form) for form in INT8_CALL_FORMS} == dict.fromkeys(INT8_CALL_FORMS, expected)
    assert int8_products_saturate() == expected
    if expected or "avx512_vnni" in _cpu_flags():  # on AVX-VNNI alone oneDNN's gemm may or may not use it
        assert int8_products_saturate(INT8_GEMM_FORM) == expected
    if not expected:
        return
    model, seen = real_activations
    # Each form on the feed-forward's first product, whose inputs (LayerNorm outputs) are large at both ends; the add
    # form takes the GELU outputs, of its output's shape (T, 1536), as the residual.
    linear, x = model.encoder.layers[0].mlp.up_proj, seen["up"]
    for form, (_, _, options, _, post_op) in _call_forms(real_activations).items():
        residual = seen["down"] if form == "add" else None
        errors = {}
        for levels in (127, 63):
            product = _exact_product(linear, x, levels)
            want = post_op(product) if residual is None else product + residual.double()
            packed = PackedLinear([linear], int8=True, weight_levels=levels, **options)
            got = (packed(x) if residual is None else packed(x, residual=residual)).double()
            errors[levels] = ((got - want).abs().max() / want.abs().max()).item()
        assert errors[63] <= 1e-5, (form, errors)
        if form in ("plain", "add"):
            assert errors[127] > 1e-3, (form, errors)


@needs_onednn
def test_a_call_form_that_saturates_alone_falls_back_to_7_bit_weights_alone(minilm_path, monkeypatch):
    """If one int8 call form's products saturate where the others' do not (here the residual add, as a CPU might
    take another kernel for that post-op), the weights of that form, and only those, are quantized to 7 bits: the
    attention's output projection and the feed-forward's second product, which add the residual."""
    monkeypatch.setattr(capabilities, "int8_products_saturate", lambda form=None: form in (None, "add"))
    assert int8_weight_levels() == int8_weight_levels("add") == 63 and int8_weight_levels("plain") == 127
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path)
    plan = CpuInferencePlan(dict.fromkeys(("qkv", "out_proj", "up_proj", "down_proj"), "onednn"))
    packed = seqbert.optimize_for_cpu_inference(model, int8=True, plan=plan).encoder.layers[0]._packed
    assert {role: (linear.call_form, linear.weight_levels) for role, linear in packed.items()} == {
        "qkv": ("plain", 127), "out_proj": ("add", 63), "up_proj": ("gelu", 127), "down_proj": ("add", 63)
    }  # fmt: skip


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
