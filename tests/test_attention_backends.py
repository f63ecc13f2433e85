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
