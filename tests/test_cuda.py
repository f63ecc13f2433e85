"""SeqBERT on a CUDA GPU: BERT's numbers in fp32, fp16 and bf16 (sdpa's unpadded path and eager), finite fully padded
rows, sdpa's memory-efficient kernel against its math kernel, packed rows, a bf16 autocast training step, and
torch.compile with static-cache generation. The weights are seeded bert-base-width BERT checkpoints (4 layers), the
inputs real Rotten Tomatoes snippets.

Half-precision tolerances are not fixed numbers: SeqBERT may differ from BERT by at most twice what BERT's own eager
and sdpa implementations differ from each other in that dtype, plus a small floor.

These tests need a CUDA GPU and are skipped without one (CI has none). Up to 2026-11-23 no GPU has been available to
the project, so they have not run on one yet; their fp32, compile and packing code was run on CPU by a throwaway copy."""

import copy

import pytest
import torch
from conftest import bert_base_width_config
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import BertForMaskedLM, BertModel, DataCollatorWithFlattening

import seqbert


pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CI and this machine have none)"
)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory, tokenizer):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bert_base_width")
    BertForMaskedLM(bert_base_width_config()).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def batch(tokenizer, rt_texts):
    encoded = tokenizer(rt_texts[:32], padding=True, return_tensors="pt")
    assert (encoded["attention_mask"] == 0).float().mean() > 0.3
    return {k: v.cuda() for k, v in encoded.items()}


def _max_delta(a, b, mask):
    return (a.float() - b.float())[mask.bool()].abs().max().item()


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_bert_numbers_in_each_dtype(bert_folder, batch, dtype_name):
    dtype = DTYPES[dtype_name]
    outputs = {}
    for implementation in ("eager", "sdpa"):
        bert = BertModel.from_pretrained(bert_folder, dtype=dtype, attn_implementation=implementation)
        mine = seqbert.SeqBertModel.from_bert_pretrained(bert_folder, dtype=dtype, attn_implementation=implementation)
        with torch.no_grad():
            outputs["bert", implementation] = bert.cuda().eval()(**batch).last_hidden_state
            outputs["mine", implementation] = mine.cuda().eval()(**batch).last_hidden_state
    mask = batch["attention_mask"]
    bert_spread = _max_delta(outputs["bert", "eager"], outputs["bert", "sdpa"], mask)
    for implementation in ("eager", "sdpa"):
        delta = _max_delta(outputs["mine", implementation], outputs["bert", implementation], mask)
        assert delta <= 2 * bert_spread + FLOOR[dtype], (implementation, delta, bert_spread)
        assert torch.isfinite(outputs["mine", implementation]).all()


@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_fully_padded_rows_stay_finite(bert_folder, batch, dtype_name, implementation):
    model = seqbert.SeqBertModel.from_bert_pretrained(
        bert_folder, dtype=DTYPES[dtype_name], attn_implementation=implementation
    )
    inputs = {k: v[:4].clone() for k, v in batch.items()}
    inputs["attention_mask"][1] = 0
    with torch.no_grad():
        out = model.cuda().eval()(**inputs)
    assert torch.isfinite(out.last_hidden_state).all() and torch.isfinite(out.pooler_output).all()


def test_sdpa_memory_efficient_kernel_matches_the_math_kernel(bert_folder, batch):
    model = seqbert.SeqBertModel.from_bert_pretrained(bert_folder, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        with sdpa_kernel([SDPBackend.MATH]):
            expected = model(**batch).last_hidden_state
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            got = model(**batch).last_hidden_state
    assert _max_delta(got, expected, batch["attention_mask"]) <= 5e-2


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_packed_rows_equal_the_padded_batch(bert_folder, tokenizer, rt_texts, dtype_name):
    dtype = DTYPES[dtype_name]
    model = seqbert.SeqBertModel.from_bert_pretrained(bert_folder, dtype=dtype).cuda().eval()
    features = [{"input_ids": tokenizer(text)["input_ids"]} for text in rt_texts[:16]]
    padded = tokenizer.pad(features, return_tensors="pt")
    packed = DataCollatorWithFlattening()(features)
    packed.pop("labels")
    with torch.no_grad():
        expected = model(**{k: v.cuda() for k, v in padded.items()}).last_hidden_state
        got = model(**{k: v.cuda() for k, v in packed.items()}).last_hidden_state
    delta = (got[0].float() - expected[padded["attention_mask"].bool().cuda()].float()).abs().max().item()
    assert delta <= FLOOR[dtype] * 5


def test_bf16_autocast_training_step_tracks_bert(bert_folder, batch):
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    losses = {}
    for name, model in (
        ("bert", BertForMaskedLM.from_pretrained(bert_folder, hidden_dropout_prob=0.0)),
        ("mine", seqbert.SeqBertForMaskedLM.from_bert_pretrained(bert_folder, hidden_dropout_prob=0.0)),
    ):
        model = model.cuda().train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        losses[name] = loss.item()
    assert abs(losses["mine"] - losses["bert"]) <= 0.02 * abs(losses["bert"]), losses


def test_compiled_encoder_and_static_cache_generation(bert_folder, batch):
    model = seqbert.SeqBertModel.from_bert_pretrained(bert_folder).cuda().eval()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        expected = model(**batch).last_hidden_state
        got = compiled(**batch).last_hidden_state
    assert (got - expected).abs().max().item() <= 1e-4  # zeros at padding on both paths: the whole tensor agrees
    torch.manual_seed(0)
    causal = seqbert.SeqBertForCausalLM.from_bert_pretrained(bert_folder).cuda().eval()
    prompts = {k: v[:4, :12] for k, v in batch.items() if k != "token_type_ids"}
    prompts["attention_mask"] = torch.ones_like(prompts["attention_mask"])
    dynamic = causal.generate(**prompts, max_new_tokens=8, do_sample=False)
    compiled_causal = copy.deepcopy(causal)
    compiled_causal.forward = torch.compile(compiled_causal.forward)
    static = compiled_causal.generate(**prompts, max_new_tokens=8, do_sample=False, cache_implementation="static")
    assert torch.equal(static, dynamic)
