"""`seqbert.optimize_for_cpu_inference`: oneDNN packed linear layers with fused post-ops (fp32, bf16 and int8) and
length-grouped attention, checked against transformers' BertModel on the real MiniLM weights and real text."""

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from conftest import BusyProcess, pinned_cpu_plan, tiny_config
from transformers import BertForSequenceClassification, BertModel

import seqbert
from seqbert import cpu_inference
from seqbert.cpu_inference import (
    ATTENTION_MODES,
    LENGTH_GROUPS,
    ROLES,
    CpuInferencePlan,
    LengthGroups,
    UnsupportedCpuError,
    bf16_linear_available,
    onednn_x86_operators_available,
    optimized_model,
    plans,
)


needs_onednn = pytest.mark.skipif(
    not onednn_x86_operators_available(), reason="int8 needs torch's oneDNN operators on an x86 CPU"
)


def _mean_pooled(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask[..., None].float()
    return (states * weights).sum(1) / weights.sum(1)


@pytest.mark.cpu_semantics
@torch.inference_mode()
def test_fp32_optimized_model_computes_bert_on_real_text(minilm_path, tokenizer, rt_texts):
    bert = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    fast = seqbert.optimize_for_cpu_inference(model, plan=pinned_cpu_plan())
    assert type(model.encoder.layers[0]).__name__ == "SeqBertPostNormLayer"  # the original is left as it was
    assert type(fast.encoder.layers[0]).__name__ == "CpuOptimizedSeqBertPostNormLayer"
    # Two batches of other sizes and lengths: nothing is prepared per shape.
    for texts in (rt_texts[:32], rt_texts[40:47]):
        batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
        real = batch["attention_mask"].bool()
        assert not real.all()
        expected = bert(**batch).last_hidden_state
        got = fast(**batch).last_hidden_state
        assert 0 < (got - expected)[real].abs().max() <= 1e-5
        assert (got[~real] == 0).all()
        # The default (sdpa, unpadded) runs its products over the T real rows instead of B x L, and a BLAS may split
        # a sum differently for another row count: 0.0 on AMD Zen 4, 2.7e-6 on the 7 snippets with 2 threads of an
        # Intel Xeon with AMX (2026-11-26). Within the parity contract (test_bert_parity holds eager to BERT's eager).
        assert (model(**batch).last_hidden_state - expected)[real].abs().max() <= 1e-5


@pytest.mark.cpu_semantics
@torch.inference_mode()
def test_fp32_optimized_classifier_and_unpadded_batch(minilm_path, tokenizer, rt_texts, tmp_path):
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(minilm_path, num_labels=2).save_pretrained(tmp_path / "cls")
    bert = BertForSequenceClassification.from_pretrained(tmp_path / "cls").eval()
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(tmp_path / "cls").eval()
    fast = seqbert.optimize_for_cpu_inference(model, plan=pinned_cpu_plan())
    for batch in (
        dict(tokenizer(rt_texts[:16], padding=True, return_tensors="pt")),
        dict(tokenizer(rt_texts[:1], return_tensors="pt")),  # no padding: the padded layout, fused layers alike
    ):
        assert (fast(**batch).logits - bert(**batch).logits).abs().max() <= 1e-5


@pytest.mark.cpu_semantics
@needs_onednn
@torch.inference_mode()
def test_int8_optimized_model_keeps_sentence_embeddings(minilm_path, tokenizer, rt_texts):
    batch = dict(tokenizer(rt_texts[:64], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    bert = BertModel.from_pretrained(minilm_path).eval()
    int8 = seqbert.optimize_for_cpu_inference(
        seqbert.SeqBertModel.from_bert_pretrained(minilm_path), int8=True, plan=pinned_cpu_plan(int8=True)
    )
    expected, got = bert(**batch).last_hidden_state, int8(**batch).last_hidden_state
    delta = (got - expected)[real].abs()
    assert 0 < delta.mean() < 0.2  # int8 moves hidden states, as int8 does
    cosine = torch.nn.functional.cosine_similarity(
        _mean_pooled(expected, batch["attention_mask"]), _mean_pooled(got, batch["attention_mask"])
    )
    assert cosine.min() > 0.95


def test_recorded_outputs_and_gradients(minilm_path, tokenizer, rt_texts):
    batch = dict(tokenizer(rt_texts[:4], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    fast = seqbert.optimize_for_cpu_inference(model, plan=pinned_cpu_plan())
    assert not any(p.requires_grad for p in fast.parameters())
    with torch.no_grad():
        outputs = fast(**batch, output_hidden_states=True)
        reference = model(**batch, output_hidden_states=True)
    assert len(outputs.hidden_states) == len(reference.hidden_states) == 7
    for ours, theirs in zip(outputs.hidden_states, reference.hidden_states, strict=True):
        assert (ours - theirs)[real].abs().max() <= 1e-5
    # Attention weights are recorded by a hook on the attention module, which the optimized layer then calls: the
    # weights of its packed projections, within the fp32 contract (tests/test_cpu_call_forms.py: int8 and bf16).
    eager = seqbert.SeqBertModel.from_bert_pretrained(minilm_path, attn_implementation="eager").eval()
    with torch.no_grad():
        weights = seqbert.optimize_for_cpu_inference(eager, plan=pinned_cpu_plan())(
            **batch, output_attentions=True
        ).attentions
        expected = eager(**batch, output_attentions=True).attentions
    assert len(weights) == 6 and all((a - b).abs().max() <= 1e-5 for a, b in zip(weights, expected, strict=True))


@pytest.mark.cpu_semantics
def test_length_groups_cover_every_token_once(tokenizer, rt_texts):
    from seqbert.modeling_seqbert import UnpaddedBatch

    mask = tokenizer(rt_texts[:10], padding=True, return_tensors="pt")["attention_mask"]
    groups = LengthGroups(UnpaddedBatch.from_mask(mask))
    assert groups.rows.unique().numel() == int(mask.sum())
    assert sum(size * width for _, size, width, *_ in groups.groups) == groups.total_rows
    assert groups.total_rows < mask.shape[0] * mask.shape[1]  # less padding than the batch
    for _, size, width, key_mask, key_bias in groups.groups:  # the additive mask: 0 at real keys, fp32's minimum else
        assert key_mask.shape == key_bias.shape == (size, 1, 1, width)
        assert torch.equal(key_bias == 0, key_mask) and (key_bias[~key_mask] == torch.finfo(torch.float32).min).all()


def _plans(kernels: tuple[str, ...]) -> dict[str, CpuInferencePlan]:
    """Every choice `measure_plan` can make, forced one at a time: each linear kernel for all roles, one mixed plan,
    each attention mode with each number of length groups (4 in the others)."""
    plans = {
        f"{kernel} linears": CpuInferencePlan(dict.fromkeys(ROLES, kernel), "written_out", 4) for kernel in kernels
    }
    plans["mixed linears"] = CpuInferencePlan(dict(zip(ROLES, (kernels * 5)[1:5], strict=True)), "sdpa", 4)
    for attention in ATTENTION_MODES:
        for groups in (group for group in LENGTH_GROUPS if group != 4):
            plans[f"{attention} attention, {groups} groups"] = CpuInferencePlan(
                dict.fromkeys(ROLES, kernels[0]), attention, groups
            )
    return plans


@pytest.mark.cpu_semantics
@torch.inference_mode()
def test_every_plan_gives_berts_numbers(minilm_path, tokenizer, rt_texts):
    """Whatever `measure_plan` chooses on a CPU, the copy computes BERT: each linear kernel available here (oneDNN,
    MKL's packed sgemm, addmm on the transposed weight, F.linear), attention written out or on sdpa's kernel, 1 to 8
    length groups, and the eager layers, each forced through `plan=`, within the 1e-5 contract on real snippets
    (padded, and a single row on the padded layout); int8 with each attention choice stays within int8's reach."""
    bert = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    batches = [dict(tokenizer(texts, padding=True, return_tensors="pt")) for texts in (rt_texts[:32], rt_texts[50:51])]
    assert batches[0]["attention_mask"].sum(1).max() <= LengthGroups.written_out_limit  # every group written out
    expected = [bert(**batch).last_hidden_state for batch in batches]
    kernels = cpu_inference.linear_kernels_available()
    plans = _plans(kernels)
    plans["eager layers"] = CpuInferencePlan(dict.fromkeys(ROLES, "linear"), eager_layers=True)
    for name, plan in plans.items():
        fast = seqbert.optimize_for_cpu_inference(model, plan=plan)
        assert fast.cpu_inference_plan == plan
        optimized = type(fast.encoder.layers[0]).__name__.startswith("CpuOptimized")
        assert optimized == (not plan.eager_layers), name
        for batch, reference in zip(batches, expected, strict=True):
            real = batch["attention_mask"].bool()
            assert (fast(**batch).last_hidden_state - reference)[real].abs().max() <= 1e-5, name
    if not onednn_x86_operators_available():
        return
    for name, plan in _plans(("onednn",)).items():
        int8 = seqbert.optimize_for_cpu_inference(model, int8=True, plan=plan)
        real = batches[0]["attention_mask"].bool()
        assert 0 < (int8(**batches[0]).last_hidden_state - expected[0])[real].abs().mean() < 0.2, name


@pytest.mark.cpu_semantics
@needs_onednn
@torch.inference_mode()
def test_int8_computes_in_int8_beside_a_busy_process(minilm_path, tokenizer, rt_texts, monkeypatch):
    """The plan measured while another process spins on the CPU (and, in tests/test_cpu_semantics.py, with torch and
    oneDNN held to AVX2) still computes in int8: hidden states differ from fp32's, within int8's reach."""
    monkeypatch.setattr(plans, "_MEASURED_PLANS", {})  # measured here, not reused from another test
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    batch = dict(tokenizer(rt_texts[:32], padding=True, return_tensors="pt"))
    with BusyProcess(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rounds may disagree beside it: the default plan is int8 too
        int8 = seqbert.optimize_for_cpu_inference(model, int8=True, example_inputs=batch)
    assert not int8.cpu_inference_plan.eager_layers
    assert type(int8.encoder.layers[0]).__name__ == "CpuOptimizedSeqBertPostNormLayer"
    real = batch["attention_mask"].bool()
    expected, got = model(**batch).last_hidden_state, int8(**batch).last_hidden_state
    assert 0 < (got - expected)[real].abs().mean() < 0.2
    cosine = torch.nn.functional.cosine_similarity(
        _mean_pooled(expected, batch["attention_mask"]), _mean_pooled(got, batch["attention_mask"])
    )
    assert cosine.min() > 0.95


@torch.inference_mode()
def test_fp32_runs_where_onednn_or_the_x86_capability_is_missing(minilm_path, tokenizer, rt_texts, monkeypatch):
    """Where oneDNN's x86 operators are missing, or torch reports a CPU that is not x86 (capability "DEFAULT", as on
    aarch64), fp32 is built from torch's generic operators (addmm, F.linear) and equals the eager model within 1e-4
    (1e-5, BERT's contract, in fact); int8 and bf16 raise `UnsupportedCpuError` naming the ONNX Runtime route."""
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    batch = dict(tokenizer(rt_texts[:16], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    expected = model(**batch).last_hidden_state
    for missing in ("operators", "capability"):
        with monkeypatch.context() as patch:
            if missing == "operators":
                patch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
                patch.setattr(torch.backends.mkl, "is_available", lambda: False)
            else:
                patch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
            assert cpu_inference.linear_kernels_available() == ("addmm", "linear")
            fast = seqbert.optimize_for_cpu_inference(model)
            assert set(fast.cpu_inference_plan.linear_kernels.values()) <= {"addmm", "linear"}
            assert (fast(**batch).last_hidden_state - expected)[real].abs().max() <= 1e-5
            with pytest.raises(UnsupportedCpuError, match=r"int8=True\) needs torch's oneDNN .* ONNX Runtime"):
                seqbert.optimize_for_cpu_inference(model, int8=True)
            with pytest.raises(UnsupportedCpuError, match=r"dtype=torch.bfloat16\) needs torch's oneDNN"):
                seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)


def test_bad_arguments_get_clear_errors(minilm_path):
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path)
    with pytest.raises(TypeError, match="model must be a SeqBERT model"):
        seqbert.optimize_for_cpu_inference(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="int8 must be True or False, got 'yes'"):
        seqbert.optimize_for_cpu_inference(model, int8="yes")
    with pytest.raises(ValueError, match="float32 model on the CPU"):
        seqbert.optimize_for_cpu_inference(model.to(torch.float64))
    model = model.float()
    kernels = dict.fromkeys(ROLES, "linear")
    with pytest.raises(TypeError, match="plan must be a CpuInferencePlan, a dict from its to_dict"):
        seqbert.optimize_for_cpu_inference(model, plan="fast")
    with pytest.raises(ValueError, match=r"plan.linear_kernels\['qkv'\] is 'cuda', which float32 cannot run"):
        seqbert.optimize_for_cpu_inference(model, plan=CpuInferencePlan({**kernels, "qkv": "cuda"}))
    with pytest.raises(ValueError, match=r"plan.linear_kernels\['qkv'\] is 'addmm', which int8 cannot run .*"):
        seqbert.optimize_for_cpu_inference(model, int8=True, plan=CpuInferencePlan({**kernels, "qkv": "addmm"}))
    with pytest.raises(ValueError, match="must name a kernel for each of"):
        seqbert.optimize_for_cpu_inference(model, plan={"linear_kernels": {"qkv": "linear"}})
    with pytest.raises(ValueError, match=r"plan.attention is 'flash'; allowed: \['written_out', 'sdpa'\]"):
        seqbert.optimize_for_cpu_inference(model, plan=CpuInferencePlan(kernels, attention="flash"))
    with pytest.raises(ValueError, match="plan.length_groups must be an int >= 1, got 0"):
        seqbert.optimize_for_cpu_inference(model, plan=CpuInferencePlan(kernels, length_groups=0))
    with pytest.raises(ValueError, match=r"got keys \['kernels'\]"):
        seqbert.optimize_for_cpu_inference(model, plan={"kernels": {}})
    with pytest.raises(ValueError, match="example_inputs must be a batch with a .batch, length. attention_mask"):
        seqbert.optimize_for_cpu_inference(model, example_inputs={"input_ids": torch.ones(2, 3, dtype=torch.long)})
    with pytest.raises(ValueError, match="attention_mask has no real token"):
        seqbert.optimize_for_cpu_inference(model, example_inputs={"attention_mask": torch.zeros(2, 3)})


needs_bf16_linear = pytest.mark.skipif(
    not bf16_linear_available(),
    reason="oneDNN has no bf16 linear on this CPU (it needs AVX-512); the refusal is tested",
)


@needs_bf16_linear
@torch.inference_mode()
def test_bf16_optimized_model_tracks_bert_on_real_text(minilm_path, tokenizer, rt_texts):
    """bf16 layers (fp32 accumulation, LayerNorm and softmax) against BERT in fp32 and against the whole model cast to
    bf16 (`.to(torch.bfloat16)`, what a user tries first): outputs fp32, zeros at padding, as close as the cast."""
    bert = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    fast = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16, plan=pinned_cpu_plan(dtype=torch.bfloat16))
    cast = BertModel.from_pretrained(minilm_path, dtype=torch.bfloat16).eval()
    for texts in (rt_texts[:32], rt_texts[40:41]):  # padded (unpadded, length groups) and one row (padded layout)
        batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
        real = batch["attention_mask"].bool()
        expected = bert(**batch).last_hidden_state
        got = fast(**batch).last_hidden_state
        assert got.dtype == torch.float32 and (got[~real] == 0).all()
        ours = (got - expected)[real].abs()
        theirs = (cast(**batch).last_hidden_state.float() - expected)[real].abs()
        assert 0 < ours.max() <= max(theirs.max(), 0.05) and ours.mean() <= 1.5 * theirs.mean(), (ours, theirs)
        cosine = torch.nn.functional.cosine_similarity(
            _mean_pooled(expected, batch["attention_mask"]), _mean_pooled(got, batch["attention_mask"])
        )
        assert cosine.min() > 0.999


@needs_bf16_linear
@pytest.mark.parametrize("norm_placement", ["pre", "post"])
@torch.inference_mode()
def test_bf16_encoder_layers_and_fp32_fallbacks(norm_placement):
    """Pre-LN (its final LayerNorm in bf16 too) and post-LN: close to the fp32 model. An additive 4D mask (the padded
    path) still computes in bf16, its attention in fp32 on the bf16 projections, and the padded result is the
    unpadded one's up to bf16's rounding. Recorded per-layer outputs are the bf16 layers', handed over in fp32."""
    torch.manual_seed(0)
    model = seqbert.SeqBertModel(tiny_config(norm_placement=norm_placement, hidden_act="gelu")).eval()
    fast = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16, plan=pinned_cpu_plan(dtype=torch.bfloat16))
    ids = torch.randint(3, 99, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = mask[2, 3:] = 0
    real = mask.bool()
    expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    got = fast(input_ids=ids, attention_mask=mask).last_hidden_state
    assert 0 < (got - expected)[real].abs().max() < 0.1
    additive = torch.zeros(3, 1, 9, 9).masked_fill(~real[:, None, None, :], torch.finfo(torch.float32).min)
    padded = fast(input_ids=ids, attention_mask=additive).last_hidden_state
    reference = model(input_ids=ids, attention_mask=additive).last_hidden_state
    assert padded.dtype == torch.float32 and 0 < (padded - reference)[real].abs().max() < 0.1
    assert (padded - got)[real].abs().max() < 0.1
    recorded = fast(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    reference = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert torch.equal(recorded[0], reference[0])  # the embeddings, fp32 in both
    for ours, theirs in zip(recorded[1:], reference[1:], strict=True):
        assert ours.dtype == torch.float32 and 0 < (ours - theirs)[real].abs().max() < 0.1


@needs_bf16_linear
@torch.inference_mode()
def test_bf16_computes_in_bf16_with_eager_attention(minilm_path, tokenizer, rt_texts):
    """`dtype=torch.bfloat16` gives bf16 layers whatever the attention implementation: with eager attention (the
    padded batch, an additive mask) the projections are bf16 and attention fp32, as close to BERT as the sdpa model's
    bf16 copy."""
    batch = dict(tokenizer(rt_texts[:16], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    expected = BertModel.from_pretrained(minilm_path).eval()(**batch).last_hidden_state
    deltas = {}
    for name in ("eager", "sdpa"):
        model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path, attn_implementation=name).eval()
        fast = seqbert.optimize_for_cpu_inference(
            model, dtype=torch.bfloat16, plan=pinned_cpu_plan(dtype=torch.bfloat16)
        )
        deltas[name] = (fast(**batch).last_hidden_state - expected)[real].abs()
    assert 0 < deltas["eager"].max() <= 0.1 and deltas["eager"].mean() <= 1.5 * deltas["sdpa"].mean(), deltas


@needs_bf16_linear
@torch.inference_mode()
def test_bf16_seq2seq_encoder_hands_fp32_layer_inputs_to_the_decoder(minilm_path, tokenizer, rt_texts):
    """A same_layer BERT2BERT reads the hidden states entering each encoder layer: they come back fp32, and greedy
    generation from the bf16 encoder runs to the same length as from the fp32 one."""
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path).eval()
    fast = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16, plan=pinned_cpu_plan(dtype=torch.bfloat16))
    batch = dict(tokenizer(rt_texts[:4], padding=True, return_tensors="pt"))
    encoded = fast.get_encoder()(**batch)
    assert encoded.last_hidden_state.dtype == encoded.layer_inputs.dtype == torch.float32
    assert fast.generate(**batch, max_new_tokens=5).shape == model.generate(**batch, max_new_tokens=5).shape


def test_bf16_refused_without_a_bf16_linear_and_warned_without_bf16_instructions(minilm_path, monkeypatch):
    """Choice for CPUs without bf16 (`optimize_for_cpu_inference` docstring): no AVX-512 -> a clear error naming
    the capability; AVX-512 without AVX512_BF16/AMX -> one warning, and oneDNN's emulated bf16 runs."""
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path)
    with pytest.raises(ValueError, match=r"dtype \(torch.float16\) must be torch.float32 or torch.bfloat16"):
        seqbert.optimize_for_cpu_inference(model, dtype=torch.float16)
    with pytest.raises(ValueError, match="int8=True computes in int8 with fp32 outputs"):
        seqbert.optimize_for_cpu_inference(model, int8=True, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="dtype must be a torch.dtype"):
        seqbert.optimize_for_cpu_inference(model, dtype="bfloat16")
    monkeypatch.setattr(optimized_model, "bf16_linear_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"needs a CPU on which oneDNN runs bf16: AVX-512 .* capability '"):
        seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16, plan=pinned_cpu_plan(dtype=torch.bfloat16))
    if not bf16_linear_available():
        return
    monkeypatch.setattr(optimized_model, "bf16_linear_available", lambda: True)
    monkeypatch.setattr(optimized_model, "bf16_instructions_available", lambda: False)
    optimized_model._warn_no_bf16_instructions.cache_clear()
    with pytest.warns(UserWarning, match="this CPU has no bf16 instructions .* slower than dtype=torch.float32"):
        seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16, plan=pinned_cpu_plan(dtype=torch.bfloat16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seqbert.optimize_for_cpu_inference(
            model, dtype=torch.bfloat16, plan=pinned_cpu_plan(dtype=torch.bfloat16)
        )  # once


EMULATED = """
import torch, seqbert
from seqbert.data import minilm_checkpoint_path
from transformers import AutoTokenizer
path = minilm_checkpoint_path()
batch = dict(AutoTokenizer.from_pretrained(path)(TEXTS, padding=True, return_tensors="pt"))
model = seqbert.SeqBertModel.from_bert_pretrained(path).eval()
with torch.inference_mode():
    expected = model(**batch).last_hidden_state
    plan = seqbert.CpuInferencePlan(dict.fromkeys(("qkv", "out_proj", "up_proj", "down_proj"), "onednn"))
    got = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16, plan=plan)(**batch).last_hidden_state
print((got - expected)[batch["attention_mask"].bool()].abs().max().item())
"""


@needs_bf16_linear
def test_bf16_runs_on_avx512_without_bf16_instructions(rt_texts):
    """oneDNN limited to AVX-512 without its bf16 instructions (`ONEDNN_MAX_CPU_ISA=AVX512_CORE`), as on a Skylake or
    Ice Lake Xeon: the emulated path gives bf16's results."""
    code = textwrap.dedent(EMULATED).replace("TEXTS", repr(rt_texts[:8]))
    env = {**__import__("os").environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 0 < float(result.stdout.split()[-1]) < 0.1


def test_the_package_modules_depend_one_way():
    """Each module of `seqbert.cpu_inference` imports only the modules its package docstring lists above it (read
    from the source: every `from .module import`), so that no two of them name each other."""
    import ast
    import re
    from pathlib import Path

    folder = Path(cpu_inference.__file__).parent
    order = re.findall(r"^- `(\w+)`:", cpu_inference.__doc__, flags=re.M)
    assert sorted(order) == sorted(path.stem for path in folder.glob("*.py") if path.stem != "__init__")
    for position, name in enumerate(order):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert imported <= set(order[:position]), (name, imported - set(order[:position]))
