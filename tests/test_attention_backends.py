"""bf16 training on CPU (`Trainer --bf16 --use_cpu`, i.e. `torch.autocast("cpu", dtype=torch.bfloat16)`): the
attention `attention_backends.sdpa_attention_forward` writes out for short keys computes what the readable
reference, `attn_implementation="eager"`, computes under the same autocast, on the real MiniLM weights and real
text; everywhere else it is torch's sdpa, untouched."""

import pytest
import torch

import seqbert
from seqbert import attention_backends


def _classifier(minilm_path, attn_implementation: str, attention_dropout: float = 0.0):
    torch.manual_seed(0)  # the same new classifier head for every model
    return seqbert.SeqBertForSequenceClassification.from_bert_pretrained(
        minilm_path,
        num_labels=2,
        attn_implementation=attn_implementation,
        hidden_dropout_prob=0.0,  # hidden dropout draws per token: the padded and unpadded paths draw differently
        attention_probs_dropout_prob=attention_dropout,
    ).train()


def _step(model, batch: dict, bf16: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: parameter.grad for name, parameter in model.named_parameters()}


@pytest.fixture
def sdpa_calls(monkeypatch) -> list:
    """Counts the calls of torch's scaled_dot_product_attention."""
    calls, original = [], torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(args[0].dtype)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    return calls


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1])
def test_bf16_training_step_equals_the_eager_reference(minilm_path, tokenizer, rt_texts, sdpa_calls, attention_dropout):
    batch = dict(tokenizer(rt_texts[:16], padding=True, return_tensors="pt"))
    batch["labels"] = torch.arange(16) % 2
    assert batch["input_ids"].shape[1] <= attention_backends.MAX_KEYS_WRITTEN_OUT
    eager_loss, eager_grads = _step(_classifier(minilm_path, "eager", attention_dropout), batch, bf16=True)
    loss, grads = _step(_classifier(minilm_path, "sdpa", attention_dropout), batch, bf16=True)
    assert not sdpa_calls  # the written-out product, not torch's kernel
    # The same products in the same precision (with dropout: the same weights dropped, the same random draws); the
    # gradients differ only by the order of sums over 16 x 40 padded rows against the real tokens alone.
    assert loss == eager_loss
    assert max((grads[name] - eager_grads[name]).abs().max() for name in grads) <= 1e-5


def test_sdpa_kernel_everywhere_else(minilm_path, tokenizer, rt_texts, sdpa_calls):
    batch = dict(tokenizer(rt_texts[:4], padding=True, return_tensors="pt"))
    model = _classifier(minilm_path, "sdpa")
    num_layers = model.config.num_hidden_layers
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 inference
        model(**batch)
    assert sdpa_calls == [torch.bfloat16] * num_layers
    sdpa_calls.clear()
    _step(model, batch | {"labels": torch.tensor([0, 1, 0, 1])}, bf16=False)  # fp32 training: bit-identical to BERT
    assert sdpa_calls == [torch.float32] * num_layers
    sdpa_calls.clear()
    long_batch = dict(tokenizer([" ".join(rt_texts[:12])] * 2, truncation=True, max_length=160, return_tensors="pt"))
    assert long_batch["input_ids"].shape[1] > attention_backends.MAX_KEYS_WRITTEN_OUT
    _step(model, long_batch | {"labels": torch.tensor([0, 1])}, bf16=True)  # long keys: the flash kernel is faster
    assert sdpa_calls == [torch.bfloat16] * num_layers


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16 autocast"])
@pytest.mark.parametrize("norm_placement", ["pre", "post"])
def test_the_attention_layouts_gathered_gradient_is_index_selects(
    tokenizer, rt_texts, monkeypatch, bf16, norm_placement
):
    """The unpadded path's moves take their gradient by a gather (`_ToAttentionLayout`: each token's own position)
    and a copy (`_GatherDistinctRows`: the attention layout's and the padded grid's real rows) instead of
    `index_select`'s scatter-add: on real snippets of mixed lengths,
    with dropout drawn alike, every gradient equals the one autograd's own `index_select` backward gives, bit for bit
    (the repeated positions of the layout take exactly zero gradient)."""
    config = seqbert.SeqBertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        norm_placement=norm_placement, num_labels=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = seqbert.SeqBertForSequenceClassification(config).train()  # dropout 0.1, drawn alike (seeded) in both runs
    batch = dict(tokenizer(rt_texts[:12], padding=True, truncation=True, max_length=64, return_tensors="pt"))
    batch["labels"] = torch.arange(12) % 2
    assert not batch["attention_mask"].all()  # padding: the unpadded path and its attention layout
    _, gathered = _step(model, batch, bf16)
    gathered = {name: grad.clone() for name, grad in gathered.items()}
    layout = attention_backends.UnpaddedBatch
    monkeypatch.setattr(
        layout,
        "to_attention_layout",
        lambda self, x: x.squeeze(0).index_select(0, self.attention_sources).view(*self.attention_mask.shape, -1),
    )
    monkeypatch.setattr(
        layout,
        "from_attention_layout",
        lambda self, x: x.reshape(-1, x.shape[-1]).index_select(0, self.attention_indices).unsqueeze(0),
    )
    monkeypatch.setattr(
        layout, "unpad", lambda self, x: x.reshape(-1, *x.shape[2:]).index_select(0, self.indices).unsqueeze(0)
    )
    model.zero_grad()
    _, scattered = _step(model, batch, bf16)
    assert gathered.keys() == scattered.keys()
    for name, grad in gathered.items():
        assert torch.equal(grad, scattered[name]), name
