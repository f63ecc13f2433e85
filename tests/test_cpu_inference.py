"""`seqbert.optimize_for_cpu_inference`: oneDNN packed linear layers with fused post-ops (fp32, bf16 and int8) and
length-grouped attention, checked against transformers' BertModel on the real MiniLM weights and real text."""

import subprocess
import sys
import textwrap
import warnings
from unittest import mock

import pytest
import torch
from conftest import tiny_config
from transformers import BertForSequenceClassification, BertModel

import seqbert
from seqbert import cpu_inference
from seqbert.cpu_inference import LengthGroups, bf16_linear_available, onednn_available


pytestmark = pytest.mark.skipif(not onednn_available(), reason="needs torch's oneDNN operators on an x86 AVX2 CPU")


def _mean_pooled(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask[..., None].float()
    return (states * weights).sum(1) / weights.sum(1)


@torch.inference_mode()
def test_fp32_optimized_model_computes_bert_on_real_text(minilm_path, tokenizer, rt_texts):
    bert = BertModel.from_pretrained(minilm_path).eval()
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    fast = seqbert.optimize_for_cpu_inference(model)
    assert type(model.encoder.layers[0]).__name__ == "SeqBertPostNormLayer"  # the original is left as it was
    assert type(fast.encoder.layers[0]).__name__ == "OneDnnSeqBertPostNormLayer"
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


@torch.inference_mode()
def test_fp32_optimized_classifier_and_unpadded_batch(minilm_path, tokenizer, rt_texts, tmp_path):
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(minilm_path, num_labels=2).save_pretrained(tmp_path / "cls")
    bert = BertForSequenceClassification.from_pretrained(tmp_path / "cls").eval()
    model = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(tmp_path / "cls").eval()
    fast = seqbert.optimize_for_cpu_inference(model)
    for batch in (
        dict(tokenizer(rt_texts[:16], padding=True, return_tensors="pt")),
        dict(tokenizer(rt_texts[:1], return_tensors="pt")),  # no padding: the padded layout, fused layers alike
    ):
        assert (fast(**batch).logits - bert(**batch).logits).abs().max() <= 1e-5


@torch.inference_mode()
def test_int8_optimized_model_keeps_sentence_embeddings(minilm_path, tokenizer, rt_texts):
    batch = dict(tokenizer(rt_texts[:64], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    bert = BertModel.from_pretrained(minilm_path).eval()
    int8 = seqbert.optimize_for_cpu_inference(seqbert.SeqBertModel.from_bert_pretrained(minilm_path), int8=True)
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
    fast = seqbert.optimize_for_cpu_inference(model)
    assert not any(p.requires_grad for p in fast.parameters())
    with torch.no_grad():
        outputs = fast(**batch, output_hidden_states=True)
        reference = model(**batch, output_hidden_states=True)
    assert len(outputs.hidden_states) == len(reference.hidden_states) == 7
    for ours, theirs in zip(outputs.hidden_states, reference.hidden_states, strict=True):
        assert (ours - theirs)[real].abs().max() <= 1e-5
    # Attention weights are recorded by a hook on the attention module: the layer's own forward runs there.
    eager = seqbert.SeqBertModel.from_bert_pretrained(minilm_path, attn_implementation="eager").eval()
    with torch.no_grad():
        weights = seqbert.optimize_for_cpu_inference(eager)(**batch, output_attentions=True).attentions
        expected = eager(**batch, output_attentions=True).attentions
    assert len(weights) == 6 and all(torch.equal(a, b) for a, b in zip(weights, expected, strict=True))


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


@torch.inference_mode()
def test_written_out_attention_and_the_flash_kernel_both_give_berts_numbers(minilm_path, tokenizer, rt_texts):
    """In fp32 on more than one thread, groups of at most `LengthGroups.max_keys_written_out` keys compute attention
    written out; longer ones, and every group on one thread, use sdpa's flash kernel. On real snippets at 2 threads
    (every group written out), at 1 thread (every group on the kernel) and at 2 threads with the limit at 0, each gives
    BERT's hidden states within the 1e-5 contract, and int8 stays within int8's reach of them (a last-bit change of
    attention can move a rounding of the next layer's quantization, so int8 results are not equal across the ways)."""
    batch = dict(tokenizer(rt_texts[:32], padding=True, return_tensors="pt"))
    real = batch["attention_mask"].bool()
    assert batch["attention_mask"].sum(1).max() <= LengthGroups.max_keys_written_out
    expected = BertModel.from_pretrained(minilm_path).eval()(**batch).last_hidden_state
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    fast, int8 = seqbert.optimize_for_cpu_inference(model), seqbert.optimize_for_cpu_inference(model, int8=True)
    kernel_calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    got, threads = {}, torch.get_num_threads()
    try:
        with mock.patch.object(
            torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: kernel_calls.append(1) or sdpa(*a, **k)
        ):
            for way, count, limit in (("written out", 2, None), ("one thread", 1, None), ("limit 0", 2, 0)):
                torch.set_num_threads(count)
                kernel_calls.clear()
                with mock.patch.object(
                    LengthGroups, "max_keys_written_out", LengthGroups.max_keys_written_out if limit is None else limit
                ):
                    got[way] = fast(**batch).last_hidden_state
                    int8_states = int8(**batch).last_hidden_state
                assert (len(kernel_calls) == 0) == (way == "written out"), (way, len(kernel_calls))
                assert (got[way] - expected)[real].abs().max() <= 1e-5, way
                assert 0 < (int8_states - expected)[real].abs().mean() < 0.2, way
    finally:
        torch.set_num_threads(threads)
    assert (got["written out"] - got["one thread"])[real].abs().max() <= 1e-5


def test_bad_arguments_get_clear_errors(minilm_path):
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path)
    with pytest.raises(TypeError, match="model must be a SeqBERT model"):
        seqbert.optimize_for_cpu_inference(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="int8 must be True or False, got 'yes'"):
        seqbert.optimize_for_cpu_inference(model, int8="yes")
    with pytest.raises(ValueError, match="float32 model on the CPU"):
        seqbert.optimize_for_cpu_inference(model.to(torch.float64))


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
    fast = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)
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
    """Pre-LN (its final LayerNorm in bf16 too) and post-LN: close to the fp32 model. Where bf16 does not apply (an
    additive 4D mask, recorded per-layer outputs) the layers run the model's own fp32 forward, exactly."""
    torch.manual_seed(0)
    model = seqbert.SeqBertModel(tiny_config(norm_placement=norm_placement, hidden_act="gelu")).eval()
    fast = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)
    ids = torch.randint(3, 99, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = mask[2, 3:] = 0
    expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
    got = fast(input_ids=ids, attention_mask=mask).last_hidden_state
    assert 0 < (got - expected)[mask.bool()].abs().max() < 0.1
    additive = torch.zeros(3, 1, 9, 9).masked_fill(~mask.bool()[:, None, None, :], torch.finfo(torch.float32).min)
    assert torch.equal(
        fast(input_ids=ids, attention_mask=additive).last_hidden_state,
        model(input_ids=ids, attention_mask=additive).last_hidden_state,
    )
    recorded = fast(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    reference = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(recorded, reference, strict=True))


@needs_bf16_linear
@torch.inference_mode()
def test_bf16_seq2seq_encoder_hands_fp32_layer_inputs_to_the_decoder(minilm_path, tokenizer, rt_texts):
    """A same_layer BERT2BERT reads the hidden states entering each encoder layer: they come back fp32, and greedy
    generation from the bf16 encoder runs to the same length as from the fp32 one."""
    model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path).eval()
    fast = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)
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
    monkeypatch.setattr(cpu_inference, "bf16_linear_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"needs a CPU on which oneDNN runs bf16: AVX-512 .* capability '"):
        seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)
    if not bf16_linear_available():
        return
    monkeypatch.setattr(cpu_inference, "bf16_linear_available", lambda: True)
    monkeypatch.setattr(cpu_inference, "bf16_instructions_available", lambda: False)
    cpu_inference._warn_no_bf16_instructions.cache_clear()
    with pytest.warns(UserWarning, match="this CPU has no bf16 instructions .* slower than dtype=torch.float32"):
        seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)  # once per process


EMULATED = """
import torch, seqbert
from seqbert.data import minilm_checkpoint_path
from transformers import AutoTokenizer
path = minilm_checkpoint_path()
batch = dict(AutoTokenizer.from_pretrained(path)(TEXTS, padding=True, return_tensors="pt"))
model = seqbert.SeqBertModel.from_bert_pretrained(path).eval()
with torch.inference_mode():
    expected = model(**batch).last_hidden_state
    got = seqbert.optimize_for_cpu_inference(model, dtype=torch.bfloat16)(**batch).last_hidden_state
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
