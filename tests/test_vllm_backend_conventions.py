"""vLLM's Transformers modeling backend, as it runs an encoder-only (pooling) model, emulated on the CPU: vLLM's wheel
needs CUDA, so the backend itself cannot run here. Each check names the vLLM source it comes from (vllm-project/vllm,
read at the commits given; line numbers drift, so by name):

- docs/models/supported_models.md, "Custom models" and "Writing custom models": `config.json` holds
  `auto_map.AutoModel`; `kwargs` are passed down from the base model to the attention; `is_causal = False` on the
  attention of an encoder-only model; attention is called through `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`;
  the model sets `_supports_attention_backend = True` (what `PreTrainedModel.is_backend_compatible()` returns).
- vllm/model_executor/models/transformers/base.py (03bf3c92), `Base`: `_patch_config` sets
  `text_config._attn_implementation = "vllm"`; `__init__` builds the base model with `AutoModel.from_config`, swaps
  `get_input_embeddings()` for its own `VocabParallelEmbedding` with `set_input_embeddings` (scaling the lookup only
  when that module has an `embed_scale`) and loads the weights itself; `_decorate_for_torch_compile` compiles the
  `forward` of the class `get_decoder()` returns, `input_ids` dim 1 and `position_ids` dim -1 dynamic (with
  `fullgraph=True` unless `VLLM_TEST_DYNAMO_FULLGRAPH_CAPTURE=0`, vllm/compilation/wrapper.py); `_get_attn_cls` takes a
  text-only model (`config.get_text_config()` is the config) with any module whose `is_causal` is False for an
  encoder-only model (non-causal attention); `create_attention_instances` makes one attention layer per index
  `0 .. num_hidden_layers - 1`; `forward` calls the model once with `input_ids` `(1, N)` (all scheduled sequences
  flattened), `position_ids` `(1, N)`, no attention mask, `use_cache=False`, `attention_instances=...`,
  `return_dict=False`, and keeps `outputs[0][0]`.
- vllm/model_executor/models/transformers/__init__.py, `vllm_attention_forward` (registered as "vllm"): reads
  `attention_instances[module.layer_idx]`, ignores `attention_mask`, takes the `scaling` keyword as the softmax scale,
  flattens queries/keys/values `(1, heads, N, head_dim)` to `(N, heads * head_dim)` and returns the output in that
  flattened shape (`Attention.forward`, vllm/model_executor/layers/attention/attention.py, ends
  `return output.view(-1, hidden_size)`). `EncoderOnlyAttention` (encoder_only_attention.py) sets `causal = False` in
  its metadata, from which the kernel also takes the sequence boundaries.
- vllm/model_executor/models/transformers/legacy.py (0e8b4840), `LegacyMixin.forward` (in `TransformersEmbeddingModel`
  and `TransformersForSequenceClassification`): when the config has `type_vocab_size > 0` and the model's `forward`
  takes `token_type_ids`, it always passes them, `(1, N)` int32, zeros unless the request gave segment ids. The model
  runner's `input_ids` buffer is int32 and `positions` int64 (vllm/v1/worker/gpu_model_runner.py).

Tolerance: every token of the flattened batch matches the padded batch within `TOLERANCE` = 1e-5 (absolute, float32);
measured max |delta| on six Rotten Tomatoes snippets (153 tokens): MiniLM 2.1e-6 against sdpa and 2.6e-6 against eager,
the tiny pre-LN model 4.8e-7 against both.
"""

import copy
import json

import pytest
import torch
from conftest import tiny_config
from torch import nn
from transformers import AttentionInterface, AutoModel

import seqbert
from seqbert.data import load_rotten_tomatoes
from seqbert.modeling_seqbert import SeqBertSelfAttention


TOLERANCE = 1e-5
ATTENTION = "vllm_like"


@torch.library.custom_op("seqbert_vllm_test::varlen_attention", mutates_args=())
def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_heads: int,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """vLLM's attention kernel in miniature: (N, heads * D) queries/keys/values of all sequences flattened, each
    sequence `cu_seqlens[s] .. cu_seqlens[s + 1]` attending only within itself -> (N, heads * D). An opaque custom
    op, as vLLM's `unified_attention_with_output`, so `torch.compile` traces around it."""
    tokens = query.shape[0]
    q, k, v = (x.view(tokens, num_heads, -1).transpose(0, 1) for x in (query, key, value))  # 3 x (heads, N, D)
    output = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        output[:, start:end] = nn.functional.scaled_dot_product_attention(
            q[:, start:end], k[:, start:end], v[:, start:end], is_causal=causal, scale=scale
        )
    return output.transpose(0, 1).reshape(tokens, -1)  # (N, heads * D)


@varlen_attention.register_fake
def _(query, key, value, cu_seqlens, num_heads, scale, causal):
    return torch.empty_like(query)


class PackedAttention:
    """One layer's attention as vLLM's `Attention` / `EncoderOnlyAttention` holds it: the batch's sequence boundaries
    (vLLM's attention metadata) and causality are the backend's, not the model's; the scale is set by the call."""

    def __init__(self, num_heads: int, cu_seqlens: torch.Tensor, causal: bool):
        self.num_heads, self.cu_seqlens, self.causal = num_heads, cu_seqlens, causal
        self.scale = None
        self.masks_seen = []

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return torch.ops.seqbert_vllm_test.varlen_attention(
            query, key, value, self.cu_seqlens, self.num_heads, self.scale, self.causal
        )


def vllm_like_attention_forward(
    module, query, key, value, attention_mask, scaling=None, attention_instances=None, **kwargs
):
    """What vLLM registers as `ALL_ATTENTION_FUNCTIONS["vllm"]` (`vllm_attention_forward`): the layer by
    `module.layer_idx`, the mask ignored, (1, heads, N, D) -> (N, heads * D) in and out."""
    layer = attention_instances[module.layer_idx]
    if not torch.compiler.is_compiling():
        layer.masks_seen.append(attention_mask)
    if scaling is not None:
        layer.scale = float(scaling)
    tokens = query.shape[-2]
    query, key, value = (x.transpose(1, 2).reshape(tokens, -1) for x in (query, key, value))
    return layer.forward(query, key, value), None


class VocabEmbedding(nn.Module):
    """Stands in for vLLM's `VocabParallelEmbedding`: an embedding module that is not an `nn.Embedding`."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(input_ids, self.weight)


class VllmLikeBackend:
    """vLLM's `Base` + `LegacyMixin` around a SeqBERT base model, with the same weights as `reference`."""

    def __init__(self, reference: seqbert.SeqBertModel):
        config = copy.deepcopy(reference.config)
        config._attn_implementation = ATTENTION  # Base._patch_config
        self.model = AutoModel.from_config(config).eval()  # Base.__init__ (on the meta device there)
        self.model.load_state_dict(reference.state_dict())  # Base.load_weights
        self.model.set_input_embeddings(VocabEmbedding(self.model.get_input_embeddings().weight))
        # Base._get_attn_cls: a text-only model with any non-causal module is encoder-only.
        is_encoder = any(not getattr(module, "is_causal", True) for module in self.model.modules())
        self.encoder_only = is_encoder and config.get_text_config() is config
        self.last_layers: dict[int, PackedAttention] = {}

    def inputs(self, token_ids: list[list[int]], segment_ids: bool = True, one_sequence: bool = False) -> dict:
        """Base.forward's (and LegacyMixin.forward's) arguments for `token_ids`, all sequences flattened in one row."""
        lengths = torch.tensor([len(ids) for ids in token_ids])
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        if one_sequence:  # metadata that treats the whole row as one sequence
            cu_seqlens = cu_seqlens[[0, -1]]
        config = self.model.config
        self.last_layers = {
            i: PackedAttention(config.num_attention_heads, cu_seqlens, causal=not self.encoder_only)
            for i in range(config.num_hidden_layers)
        }
        inputs = dict(
            input_ids=torch.tensor([t for ids in token_ids for t in ids], dtype=torch.int32)[None],  # (1, N)
            inputs_embeds=None,
            use_cache=False,
            position_ids=torch.cat([torch.arange(length) for length in lengths.tolist()])[None],  # (1, N) int64
            attention_instances=self.last_layers,
            return_dict=False,
        )
        if segment_ids:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])  # (1, N) int32, LegacyMixin
        return inputs

    def __call__(self, token_ids: list[list[int]], **kwargs) -> torch.Tensor:
        """(N, H): the last hidden state of every token of every sequence, in order."""
        with torch.no_grad():
            return self.model(**self.inputs(token_ids, **kwargs))[0][0]


@pytest.fixture(scope="module", autouse=True)
def vllm_like_attention():
    """Registered once, as vLLM registers "vllm" on import (the name stays registered for the session)."""
    AttentionInterface.register(ATTENTION, vllm_like_attention_forward)


@pytest.fixture(scope="module")
def texts():
    return list(load_rotten_tomatoes(num_train=0, num_validation=6)["validation"]["text"])


@pytest.fixture(scope="module")
def cases(minilm_path, tokenizer, texts):
    """By name: the converted MiniLM, or a seeded tiny pre-LN model with scaled embeddings; its vLLM-like copy; the
    texts' token ids (at most 48 tokens, within the tiny model's positions)."""
    torch.manual_seed(0)
    config = tiny_config(norm_placement="pre", scale_embedding=True, vocab_size=tokenizer.vocab_size)
    references = {
        "minilm": seqbert.SeqBertModel.from_bert_pretrained(minilm_path),
        "tiny-pre-ln": AutoModel.from_config(config),
    }
    token_ids = tokenizer(texts, truncation=True, max_length=48)["input_ids"]
    return {name: (model.eval(), VllmLikeBackend(model), token_ids) for name, model in references.items()}


@pytest.fixture(params=["minilm", "tiny-pre-ln"])
def case(request, cases):
    return cases[request.param]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_flattened_batch_matches_padded_batch(case, tokenizer, implementation):
    """Base.forward's call (one (1, N) row, positions restarting at 0 per text, no mask, the backend's own attention)
    gives every token what the padded batch gives it."""
    reference, backend, token_ids = case
    reference = copy.deepcopy(reference)
    reference.set_attn_implementation(implementation)
    assert reference.config._attn_implementation == implementation
    padded = tokenizer.pad({"input_ids": token_ids}, return_tensors="pt")
    with torch.no_grad():
        expected = reference(**padded).last_hidden_state[padded["attention_mask"].bool()]  # (N, H)
    got = backend(token_ids)
    assert got.shape == expected.shape == (sum(map(len, token_ids)), reference.config.hidden_size)
    assert (got - expected).abs().max().item() <= TOLERANCE
    head_dim = reference.config.hidden_size // reference.config.num_attention_heads
    for layer in backend.last_layers.values():  # every layer went through the registered function, once
        assert layer.masks_seen == [None]  # no O(N^2) mask was built for it
        assert layer.scale == head_dim**-0.5


def test_boundaries_come_from_the_backend(case):
    """With metadata that makes the row one sequence the outputs change: the emulated backend, not the model,
    decides where sequences end, as in vLLM."""
    _, backend, token_ids = case
    assert (backend(token_ids, one_sequence=True) - backend(token_ids)).abs().max().item() > 100 * TOLERANCE


def test_absent_token_type_ids_mean_segment_zero(case):
    """LegacyMixin passes int32 zeros; without them SeqBERT adds segment 0's embedding: the same numbers."""
    _, backend, token_ids = case
    assert torch.equal(backend(token_ids, segment_ids=False), backend(token_ids, segment_ids=True))


def test_attention_modules_follow_the_conventions(case):
    """One attention module per layer, `layer_idx` = its layer's index (the key of `attention_instances`),
    `is_causal` False, so vLLM picks encoder-only (non-causal) attention; the class is backend-compatible."""
    _, backend, _ = case
    model = backend.model
    attentions = [m for m in model.modules() if isinstance(m, SeqBertSelfAttention)]
    assert [m.layer_idx for m in attentions] == list(range(model.config.num_hidden_layers))
    assert all(m.is_causal is False for m in attentions)
    assert backend.encoder_only
    assert type(model).is_backend_compatible()
    assert model.config._attn_implementation == ATTENTION


def test_model_parts_vllm_reads(case, tmp_path):
    """`get_input_embeddings` / `set_input_embeddings` round-trip vLLM's replacement, and the embedding module has no
    `embed_scale` (SeqBERT scales after the lookup, so vLLM must not scale it as well: the tiny model scales, and its
    flattened outputs match above); `get_decoder()` is the model itself (the class vLLM compiles); the config is its
    own text config; a saved folder's `config.json` maps `AutoModel` to `SeqBertModel` in a module file saved next to
    it (what `trust_remote_code` loading needs)."""
    reference, backend, _ = case
    model = backend.model
    assert isinstance(model.get_input_embeddings(), VocabEmbedding)
    assert getattr(reference.get_input_embeddings(), "embed_scale", None) is None
    assert model.get_decoder() is model
    assert model.config.get_text_config() is model.config
    reference.save_pretrained(tmp_path)
    module_name, class_name = json.loads((tmp_path / "config.json").read_text())["auto_map"]["AutoModel"].split(".")
    assert class_name == "SeqBertModel" and (tmp_path / f"{module_name}.py").is_file()


def test_full_graph_compile(cases):
    """vLLM compiles the base model's `forward` with `fullgraph=True`, `input_ids` dim 1 and `position_ids` dim -1
    dynamic: the trace has no graph break, keeps the length dynamic and gives the eager outputs. On the tiny model
    (tracing MiniLM's six layers costs more and exercises the same code)."""
    _, backend, token_ids = cases["tiny-pre-ln"]
    torch._dynamo.reset()
    compiled = torch.compile(backend.model, fullgraph=True, backend="eager")
    for ids in (token_ids, token_ids[:3]):  # two lengths N (mark_dynamic raises if the trace fixes N)
        inputs = backend.inputs(ids)
        for name in ("input_ids", "position_ids", "token_type_ids"):
            # vLLM marks the first two only; a token_type_ids of static length specializes N in transformers'
            # BertModel as well (its embeddings add the two), so it is marked here too.
            torch._dynamo.mark_dynamic(inputs[name], 1)
        with torch.no_grad():
            got = compiled(**inputs)[0][0]
        assert (got - backend(ids)).abs().max().item() <= TOLERANCE
    torch._dynamo.reset()
