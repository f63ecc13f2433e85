"""PackedCpuLinears, under which `generate` runs: small CPU fp32 matrix products on prepacked oneDNN weights, with
`F.linear`'s results (to rounding) on real MiniLM weights and hidden states, and nothing left behind on exit.
Generated ids against transformers' own models are checked in test_bert2bert.py and test_causal_lm.py."""

import copy

import pytest
import torch
from torch import nn

import seqbert
from seqbert.packed_cpu_linears import _ONEDNN_LINEAR, PackedCpuLinears


pytestmark = pytest.mark.skipif(
    not _ONEDNN_LINEAR, reason="this torch build or CPU has no oneDNN packed linear: PackedCpuLinears changes nothing"
)


@pytest.fixture(scope="module")
def model(minilm_path):
    """BERT2BERT warm-started from the real MiniLM weights (the decoder's cross-attention seeded)."""
    torch.manual_seed(0)
    return seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(str(minilm_path)).eval()


@pytest.fixture(scope="module")
def hidden_states(model, tokenizer, rt_texts):
    """Real encoder states: the [CLS] state of 8 Rotten Tomatoes snippets and all states of the first, (8, 384)."""
    batch = tokenizer(rt_texts[:8], padding=True, return_tensors="pt")
    with torch.no_grad():
        states = model.seqbert(**batch).last_hidden_state
    return states[:, 0], states[0]


def twice(context: PackedCpuLinears, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The second call: the first of each weight runs F.linear and only marks it for packing."""
    module(x)
    return module(x)


def is_packed(context: PackedCpuLinears, module: nn.Linear) -> bool:
    return module in context.packed and context.packed[module][1] is not None


@torch.no_grad()
def test_small_batches_run_packed_with_f_linear_numbers(model, hidden_states):
    cls_states, _ = hidden_states
    layer = model.decoder.layers[0].mlp.up_proj
    vocabulary = model.lm_head.decoder
    many = cls_states.repeat(13, 1)  # 104 rows
    with PackedCpuLinears(model) as context:
        small = twice(context, layer, cls_states)
        assert is_packed(context, layer)
        logits = twice(context, vocabulary, cls_states)
        assert is_packed(context, vocabulary)
        logits_many = vocabulary(many)  # a vocabulary projection stays packed up to 512 rows
        single = twice(context, layer, cls_states[:1])  # one row: MKL's matrix-vector path, exactly F.linear
        large = layer(many)  # over 32 rows: exactly F.linear
    expected = nn.functional.linear(cls_states, layer.weight, layer.bias)
    torch.testing.assert_close(small, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(small, expected)  # it did take another kernel
    expected_logits = nn.functional.linear(cls_states, vocabulary.weight, vocabulary.bias)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(logits_many, expected_logits.repeat(13, 1), rtol=1e-5, atol=1e-4)
    assert torch.equal(logits.argmax(-1), expected_logits.argmax(-1))
    assert torch.equal(single, nn.functional.linear(cls_states[:1], layer.weight, layer.bias))
    assert torch.equal(large, nn.functional.linear(many, layer.weight, layer.bias))


def test_training_calls_and_disabled_onednn_run_f_linear_exactly(model, hidden_states):
    cls_states, _ = hidden_states
    layer = model.decoder.layers[0].mlp.up_proj
    with PackedCpuLinears(model) as context:
        with torch.enable_grad():
            trained = twice(context, layer, cls_states)
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
            disabled = twice(context, layer, cls_states)
        assert not is_packed(context, layer)
    assert trained.grad_fn is not None
    with torch.no_grad():
        expected = nn.functional.linear(cls_states, layer.weight, layer.bias)
    assert torch.equal(trained.detach(), expected)
    assert torch.equal(disabled, expected)


@torch.no_grad()
def test_exit_restores_the_modules_and_drops_the_packed_weights(model, hidden_states):
    cls_states, _ = hidden_states
    layer = model.decoder.layers[1].self_attention.query
    with PackedCpuLinears(model) as context:
        assert "forward" in vars(layer)
        twice(context, layer, cls_states)
        assert is_packed(context, layer)
    assert not context.packed
    assert not [name for name, module in model.named_modules() if "forward" in vars(module)]
    copy.deepcopy(model)  # a packed oneDNN tensor cannot be deep-copied: none may stay on the model


@torch.no_grad()
def test_weights_changed_between_calls_are_read_afresh(hidden_states):
    """Packed weights live for one `with` block: a change through `.data` (which bumps no version counter, as a
    merged LoRA adapter's does) is seen by the next block."""
    cls_states, _ = hidden_states
    torch.manual_seed(0)
    layer = nn.Linear(384, 384)
    with PackedCpuLinears(layer) as context:
        before = twice(context, layer, cls_states)
    layer.weight.data += 0.01
    with PackedCpuLinears(layer) as context:
        after = twice(context, layer, cls_states)
        assert is_packed(context, layer)
    torch.testing.assert_close(after, nn.functional.linear(cls_states, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert (after - before).abs().max() > 1e-3  # far above the 1e-6 rounding of the packed path


@torch.no_grad()
def test_a_module_with_its_own_forward_is_left_alone(hidden_states):
    """accelerate's hooks (or a `generate` already running in another thread) set an instance `forward`."""
    cls_states, _ = hidden_states
    layer = nn.Linear(384, 384)
    own_forward = layer.forward
    layer.forward = own_forward
    with PackedCpuLinears(layer) as context:
        twice(context, layer, cls_states)
        assert layer.forward is own_forward and not context.packed
    assert layer.forward is own_forward


def test_generate_runs_its_decode_steps_packed(model, tokenizer, rt_texts, monkeypatch):
    packed_modules = []
    exit_ = PackedCpuLinears.__exit__

    def record_then_exit(self, *exc_info):
        packed_modules.extend(module for module in self.packed if is_packed(self, module))
        return exit_(self, *exc_info)

    monkeypatch.setattr(PackedCpuLinears, "__exit__", record_then_exit)
    source = tokenizer(rt_texts[:4], padding=True, return_tensors="pt")
    generated = model.generate(**source, max_new_tokens=6, min_new_tokens=6)
    assert generated.shape == (4, 7)
    decoder_linears = {m for m in model.decoder.modules() if isinstance(m, nn.Linear)}
    # Every decoder projection but the cross-attention keys and values (computed once, over the source) and the
    # vocabulary projection ran packed.
    cross_kv = {m for layer in model.decoder.layers for m in (layer.cross_attention.key, layer.cross_attention.value)}
    assert set(packed_modules) == (decoder_linears - cross_kv) | {model.lm_head.dense, model.lm_head.decoder}


def test_weights_made_in_inference_mode(hidden_states):
    """A model loaded under `torch.inference_mode()` has inference-tensor weights, which keep no version counter."""
    cls_states, _ = hidden_states
    with torch.inference_mode():
        torch.manual_seed(0)
        layer = nn.Linear(384, 384)
        with PackedCpuLinears(layer) as context:
            out = twice(context, layer, cls_states)
            assert is_packed(context, layer)
        torch.testing.assert_close(
            out, nn.functional.linear(cls_states, layer.weight, layer.bias), rtol=1e-5, atol=1e-5
        )
