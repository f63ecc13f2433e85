"""Export and compile with the default attention (sdpa) on padded batches, for the encoder, every head, the causal LM
and the seq2seq model: `torch.export` with a dynamic batch and length, `torch.onnx.export(dynamo=True)` run in
onnxruntime on other shapes, `torch.compile(fullgraph=True)` and default compile without graph breaks, transformers'
own exporters, and `generate` with a static cache and a compiled forward.

Traced code cannot take the unpadded path (its shapes depend on the mask's values): it runs the padded path, whose
outputs at padding positions are zeros too, so the whole tensors of eager and traced runs agree, padding included."""

import copy

import onnxruntime
import pytest
import torch
import torch._dynamo.testing
from conftest import ENCODER_HEADS, random_inputs, tiny_config
from transformers.exporters import DynamoConfig, DynamoExporter
from transformers.exporters.utils import decompose_for_generation

import seqbert


TOLERANCE = 1e-5
ONNX_TOLERANCE = 1e-4
NUM_CHOICES = 2
HEADS = [*ENCODER_HEADS.values(), seqbert.SeqBertForCausalLM, seqbert.SeqBertForConditionalGeneration]


def build(model_class, norm_placement="post"):
    seq2seq = model_class is seqbert.SeqBertForConditionalGeneration
    extra = dict(is_encoder_decoder=True, decoder_start_token_id=2, eos_token_id=3) if seq2seq else {}
    torch.manual_seed(0)
    return model_class(tiny_config(norm_placement=norm_placement, **extra)).eval()


def inputs_and_shapes(model_class, batch, length, seed):
    """Padded inputs for the class (3-D for multiple choice, decoder inputs for seq2seq) and their dynamic axes."""
    inputs = random_inputs(tiny_config(), batch=batch, length=length, seed=seed)
    size, sequence = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=64)
    axes = {0: size, 1: sequence}
    if model_class is seqbert.SeqBertForMultipleChoice:
        inputs = {k: v.view(batch // NUM_CHOICES, NUM_CHOICES, length) for k, v in inputs.items()}
        axes = {0: size, 2: sequence}
    if model_class is seqbert.SeqBertForCausalLM:
        del inputs["token_type_ids"]
    shapes = {name: axes for name in inputs}
    if model_class is seqbert.SeqBertForConditionalGeneration:
        inputs["decoder_input_ids"] = inputs["input_ids"][:, : length - 2].clone()
        shapes["decoder_input_ids"] = {0: size, 1: torch.export.Dim("target", min=2, max=64)}
    return inputs, shapes


def outputs_of(output) -> dict[str, torch.Tensor]:
    return {k: v for k, v in output.items() if isinstance(v, torch.Tensor)}


def assert_same_outputs(got, expected, tolerance=TOLERANCE):
    got, expected = outputs_of(got), outputs_of(expected)
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert (torch.as_tensor(got[name]) - value).abs().max().item() <= tolerance, name


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
@pytest.mark.parametrize("model_class", HEADS, ids=lambda c: c.__name__)
def test_torch_export_with_dynamic_batch_and_length(model_class, norm_placement):
    model = build(model_class, norm_placement)
    sample, shapes = inputs_and_shapes(model_class, batch=4, length=7, seed=0)
    kwargs = {"use_cache": False} if model.can_generate() else {}
    program = torch.export.export(
        model, args=(), kwargs={**sample, **kwargs}, dynamic_shapes={**shapes, **dict.fromkeys(kwargs)}
    )
    other, _ = inputs_and_shapes(model_class, batch=6, length=11, seed=1)  # other batch size and length
    assert (other["attention_mask"] == 0).any()
    with torch.no_grad():
        assert_same_outputs(program.module()(**other, **kwargs), model(**other, **kwargs))


@pytest.mark.parametrize("model_class", HEADS, ids=lambda c: c.__name__)
def test_compile_fullgraph_and_no_graph_breaks(model_class):
    """Dynamo captures each model as one graph (`fullgraph=True` raises at a graph break, naming its reason; the
    eager backend runs the graph as traced, counted by dynamo's `CompileCounter`); inductor compiles the main job's
    head and the seq2seq model to the same numbers."""
    model = build(model_class)
    sample, _ = inputs_and_shapes(model_class, batch=4, length=7, seed=0)
    torch._dynamo.reset()
    inductor = model_class in (seqbert.SeqBertForSequenceClassification, seqbert.SeqBertForConditionalGeneration)
    counter = torch._dynamo.testing.CompileCounter()  # runs the graph as traced, like the eager backend
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if inductor else counter)
    with torch.no_grad():
        assert_same_outputs(compiled(**sample), model(**sample))
    assert inductor or counter.frame_count == 1


def _run_onnx(model, sample, shapes, other, tmp_path):
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, args=(), kwargs=sample, dynamic_shapes=shapes, dynamo=True, f=str(path), verbose=False)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {name: other[name].numpy() for name in names})


def test_onnx_export_of_the_real_encoder_runs_in_onnxruntime_on_other_shapes(
    minilm_path, tokenizer, rt_texts, tmp_path
):
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    sample = dict(tokenizer(rt_texts[:4], padding=True, return_tensors="pt"))
    size, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=512)
    shapes = {name: {0: size, 1: length} for name in sample}
    other = dict(tokenizer(rt_texts[10:22], padding=True, return_tensors="pt"))  # 12 snippets, another length
    assert other["input_ids"].shape != sample["input_ids"].shape
    hidden, pooled = _run_onnx(model, sample, shapes, other, tmp_path)
    with torch.no_grad():
        expected = model(**other)
    real = other["attention_mask"].bool()
    assert (torch.from_numpy(hidden) - expected.last_hidden_state)[real].abs().max().item() <= ONNX_TOLERANCE
    assert (torch.from_numpy(pooled) - expected.pooler_output).abs().max().item() <= ONNX_TOLERANCE


@pytest.mark.parametrize("model_class", HEADS[1:], ids=lambda c: c.__name__)
def test_onnx_export_of_every_head_runs_in_onnxruntime(model_class, tmp_path):
    model = build(model_class)
    sample, shapes = inputs_and_shapes(model_class, batch=4, length=7, seed=0)
    other, _ = inputs_and_shapes(model_class, batch=6, length=11, seed=1)
    if model.can_generate():
        model.config.use_cache = False  # the exported graph returns logits only
    got = _run_onnx(model, sample, shapes, other, tmp_path)
    with torch.no_grad():
        expected = [v for v in outputs_of(model(**other)).values()]
    assert len(got) == len(expected)
    for value, reference in zip(got, expected, strict=True):
        assert (torch.from_numpy(value) - reference).abs().max().item() <= ONNX_TOLERANCE


@pytest.mark.parametrize("model_class", [seqbert.SeqBertForConditionalGeneration, seqbert.SeqBertForCausalLM])
def test_static_cache_and_compiled_forward_generate_the_same_ids(model_class):
    """The static cache gives the dynamic cache's ids, greedy and beam; so does the forward compiled on it. Compiled
    with the `aot_eager` backend: dynamo and AOTAutograd trace the cached decoding as for inductor, whose code
    generation (seconds per graph on 2 cores, recompiled in every fresh clone) `test_compile_fullgraph_and_no_graph_breaks`
    covers on the same models."""
    model = build(model_class, "pre")
    inputs = random_inputs(model.config, batch=4, length=7, seed=0)
    del inputs["token_type_ids"]
    if model_class is seqbert.SeqBertForCausalLM:  # decoder-only generation continues left-padded prompts
        inputs["attention_mask"] = inputs["attention_mask"].flip(1)
        inputs["input_ids"] = inputs["input_ids"].flip(1)
    options = dict(max_new_tokens=6, pad_token_id=0, eos_token_id=3)
    for extra in ({}, {"num_beams": 3}):
        expected = model.generate(**inputs, **options, **extra)
        static = model.generate(**inputs, **options, cache_implementation="static", **extra)
        assert torch.equal(static, expected), extra
    compiled = copy.deepcopy(model)
    compiled.forward = torch.compile(compiled.forward, backend="aot_eager")
    expected = model.generate(**inputs, **options)
    assert torch.equal(compiled.generate(**inputs, **options, cache_implementation="static"), expected)


def test_transformers_exporters(minilm_path, tokenizer, rt_texts):
    """transformers' DynamoExporter: the encoder as one graph on other shapes, and the seq2seq model decomposed for
    generation (prefill and decode graphs), each equal to the eager model on the inputs generate feeds it."""
    encoder = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    sample = dict(tokenizer(rt_texts[:4], padding=True, return_tensors="pt"))
    other = dict(tokenizer(rt_texts[10:16], padding=True, return_tensors="pt"))
    exported = DynamoExporter().export(encoder, sample, DynamoConfig(dynamic=True))
    with torch.no_grad():
        assert_same_outputs(exported(**other), encoder(**other))

    torch.manual_seed(0)
    seq2seq = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(minilm_path).eval()
    stages = decompose_for_generation(seq2seq, sample)
    assert set(stages) == {"prefill", "decode"}
    exported = DynamoExporter().export_for_generation(seq2seq, sample, DynamoConfig(dynamic=True))
    for name, (module, inputs) in stages.items():
        graph_inputs = {k: v for k, v in inputs.items() if not isinstance(v, bool | None)}  # flags are traced in
        with torch.no_grad():
            expected = module(**copy.deepcopy(inputs)).logits
            got = exported.runners[name](**copy.deepcopy(graph_inputs)).logits
        assert (got - expected).abs().max().item() <= TOLERANCE, name
