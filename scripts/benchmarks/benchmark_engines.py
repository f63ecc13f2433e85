"""
The engines a user could run instead of seqbert for BERT inference on a CPU, each built from the same BERT
checkpoint, for `scripts/benchmarks/benchmark.py`. Every engine is an `Engine`: called on a `batch` (`input_ids`,
`token_type_ids` and `attention_mask`, (B, L) tensors) it returns the last hidden state (B, L, H) as an fp32
`torch.Tensor`, with whatever the engine leaves at padding positions, so compare on real tokens only. For timing,
`Engine.prepare(batch)` turns the batch into the engine's own input once (numpy arrays, CTranslate2's ragged id lists,
as a user's tokenizer call would give them), and returns the call that is timed: the engine's run on that input and
nothing else.

- `transformers`: `BertModel` itself (sdpa attention), the reference for every delta.
- `nested_tensor`: torch's `nn.TransformerEncoder` fast path with nested tensors (`enable_nested_tensor=True`), the
  same weights in `nn.TransformerEncoderLayer`s (BERT's post-LN, exact GELU); this is what optimum's
  BetterTransformer did for BERT. BERT's embeddings (`BertModel.embeddings`) feed it.
- `onnxruntime`: `BertModel` exported by `torch.onnx.export` and fused by onnxruntime's transformer optimizer
  (`onnxruntime.transformers.optimizer.optimize_model(model_type="bert")`), CPU execution provider. The export uses
  the TorchScript exporter (`dynamo=False`) and eager attention: that is the graph whose attention and embedding
  patterns the optimizer fuses (EmbedLayerNormalization, Attention, BiasGelu, SkipLayerNormalization). The dynamo
  exporter's graph gets only the GELU and LayerNorm fusions (onnxruntime 1.32), so it would be a weaker contender.
- `onnxruntime_int8`: that fused graph after onnxruntime's dynamic quantization
  (`onnxruntime.quantization.quantize_dynamic`, int8 weights), the recipe of onnxruntime's BERT quantization guide.
- `ctranslate2` / `ctranslate2_int8`: CTranslate2's `Encoder` on the checkpoint converted by its own
  `TransformersConverter` (float32, or `quantization="int8"` with `compute_type="int8"`), fed ragged batches (each
  sequence's real ids and segment ids only), as its API takes them.
- `openvino`: `openvino.convert_model` of `BertModel` with dynamic batch and length, compiled for the CPU with the f32
  inference precision hint; `openvino_default`: the same model compiled with no hint, as sentence-transformers'
  `backend="openvino"` and optimum-intel compile it: bf16 on CPUs with AVX512_BF16 or AMX, f32 elsewhere (the
  precision it chose is read back from the compiled model).
- `transformers_bf16`: `BertModel` loaded in bf16 (`dtype=torch.bfloat16`).
- seqbert's own engines are `torch_engine`s of `SeqBertModel` and of `seqbert.optimize_for_cpu_inference` (fp32,
  bf16 and int8).
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ctranslate2
import numpy as np
import onnx
import onnxruntime
import openvino
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.optimizer import optimize_model
from torch import nn
from transformers import BertModel
from transformers.utils import is_torchao_available


@dataclass
class Engine:
    """
    One contender. `prepare(batch)` returns the timed call: the engine run on its own form of `batch` (built here,
    untimed); `padded(output, batch)` turns what that call returned into the (B, L, H) fp32 hidden states.
    """

    prepare: Callable[[dict], Callable[[], object]]
    padded: Callable[[object, dict], torch.Tensor]
    precision: str = "fp32"  # what the engine computes in, read back from the engine where it chooses

    def __call__(self, batch: dict) -> torch.Tensor:
        return self.padded(self.prepare(batch)(), batch)


class NestedTensorBert(nn.Module):
    """
    A `BertModel`'s embeddings and encoder layers as `nn.TransformerEncoder`, so that inference takes torch's fused
    fast path over nested tensors (padding dropped inside the encoder). Output (B, L, H), zeros at padding.
    """

    def __init__(self, bert: BertModel):
        super().__init__()
        config = bert.config
        self.embeddings = bert.embeddings
        layer = nn.TransformerEncoderLayer(
            config.hidden_size,
            config.num_attention_heads,
            config.intermediate_size,
            dropout=0.0,
            activation="gelu",  # exact (erf) GELU, BERT's `hidden_act="gelu"`
            layer_norm_eps=config.layer_norm_eps,
            batch_first=True,
            norm_first=False,
        )
        self.encoder = nn.TransformerEncoder(layer, config.num_hidden_layers, enable_nested_tensor=True)
        for ours, theirs in zip(self.encoder.layers, bert.encoder.layer, strict=True):
            attention = theirs.attention
            projections = (attention.self.query, attention.self.key, attention.self.value)
            with torch.no_grad():
                ours.self_attn.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
                ours.self_attn.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
                ours.self_attn.out_proj.load_state_dict(attention.output.dense.state_dict())
                ours.norm1.load_state_dict(attention.output.LayerNorm.state_dict())
                ours.linear1.load_state_dict(theirs.intermediate.dense.state_dict())
                ours.linear2.load_state_dict(theirs.output.dense.state_dict())
                ours.norm2.load_state_dict(theirs.output.LayerNorm.state_dict())
        self.eval()

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "nested tensors are in prototype stage"
            return self.encoder(hidden, src_key_padding_mask=~attention_mask.bool())


class _LastHiddenState(nn.Module):
    """`BertModel` with positional inputs and one output, for the TorchScript ONNX exporter."""

    def __init__(self, bert: BertModel):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]


ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def export_fused_onnx(bert_folder: str, sample: dict, folder: Path) -> tuple[Path, Path, dict]:
    """
    Export the BERT checkpoint at `bert_folder` to ONNX (dynamic batch and length), fuse it with onnxruntime's BERT
    optimizer and quantize the fused graph to int8. Returns the fp32 and int8 paths and the fused operator counts.
    """
    bert = BertModel.from_pretrained(bert_folder, attn_implementation="eager", add_pooling_layer=False).eval()
    exported, fused, int8 = folder / "bert.onnx", folder / "bert_fused.onnx", folder / "bert_fused_int8.onnx"
    args = tuple(sample[name] for name in ONNX_INPUTS)
    axes = {name: {0: "batch", 1: "length"} for name in (*ONNX_INPUTS, "last_hidden_state")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            _LastHiddenState(bert),
            args,
            str(exported),
            input_names=list(ONNX_INPUTS),
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    config = bert.config
    optimized = optimize_model(
        str(exported), model_type="bert", num_heads=config.num_attention_heads, hidden_size=config.hidden_size
    )
    optimized.save_model_to_file(str(fused))
    fused_ops = {name: count for name, count in optimized.get_fused_operator_statistics().items() if count}
    # Shape inference cannot type the outputs of the fused (com.microsoft) operators; they are all fp32.
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    quantize_dynamic(str(fused), str(int8), weight_type=QuantType.QInt8, extra_options=extra)
    return fused, int8, fused_ops


def onnxruntime_session(path: Path, threads: int, profile_prefix: str | None = None) -> onnxruntime.InferenceSession:
    """An onnxruntime CPU session on `path`, all graph optimizations on, with `threads` intra-op threads and one
    inter-op thread; with `profile_prefix`, onnxruntime's own profiler writes its events to a JSON file of that
    prefix (`end_profiling()` returns its path)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnxruntime_engine(path: Path, threads: int, precision: str = "fp32") -> Engine:
    """An onnxruntime CPU session on `path` with `threads` intra-op threads (and one inter-op thread); `precision`
    labels the graph ("fp32", or "int8" for the quantized one)."""
    session = onnxruntime_session(path, threads)

    def prepare(batch: dict) -> Callable[[], object]:
        feed = {name: np.ascontiguousarray(batch[name].numpy(), dtype=np.int64) for name in ONNX_INPUTS}
        return lambda: session.run(None, feed)

    return Engine(prepare, lambda output, batch: torch.from_numpy(output[0]), precision)


def torchao_recipes() -> dict:
    """torchao's int8 recipes a user with a torchao recipe applies through transformers' `TorchAoConfig`, by row name:
    int8 weight-only, then int8 dynamic activations with int8 weights (per-token activation scales, per-channel weight
    scales). Empty where torchao is not installed (`pip install torchao`)."""
    if not is_torchao_available():
        return {}
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    return {
        "torchao_int8_weight_only": Int8WeightOnlyConfig(),
        "torchao_int8_dynamic": Int8DynamicActivationInt8WeightConfig(),
    }


def torch_engine(model: nn.Module, precision: str = "fp32") -> Engine:
    """`model(**batch)`'s first output (`last_hidden_state`, as fp32) for seqbert and transformers models; the tensor
    itself for `NestedTensorBert`. `precision` labels what the model computes in."""

    def prepare(batch: dict) -> Callable[[], object]:
        inputs = {name: batch[name] for name in ONNX_INPUTS}
        return lambda: model(**inputs)

    return Engine(
        prepare, lambda output, batch: (output if isinstance(output, torch.Tensor) else output[0]).float(), precision
    )


class _Bert5Converter(ctranslate2.converters.TransformersConverter):
    """CTranslate2's converter for a BERT checkpoint under transformers 5, whose `BertConfig` no longer has the
    `position_embedding_type` that CTranslate2 4.8.5's BERT loader asserts is "absolute" (BERT's only kind)."""

    def load_model(self, model_class, model_name_or_path, **kwargs):
        model = super().load_model(model_class, model_name_or_path, **kwargs)
        if not hasattr(model.config, "position_embedding_type"):
            model.config.position_embedding_type = "absolute"
        return model


def convert_ctranslate2(bert_folder: str, folder: Path, quantization: str) -> Path:
    """The BERT checkpoint at `bert_folder` (with its tokenizer) converted to CTranslate2 ("float32" or "int8")."""
    output = folder / f"ctranslate2_{quantization}"
    _Bert5Converter(bert_folder).convert(str(output), quantization=quantization, force=True)
    return output


def ctranslate2_engine(path: Path, compute_type: str, threads: int) -> Engine:
    """CTranslate2's `Encoder` on `path` with `threads` intra-op threads, fed each sequence's real ids and segment ids
    as lists (its API's form, what a tokenizer returns); the timed call ends with its hidden states as a numpy array.

    CTranslate2 sets its intra-op threads with OpenMP's `omp_set_num_threads`, which reaches the OpenMP runtime torch
    computes with: building an `Encoder` left torch on `threads` threads, and on a Sapphire Rapids Xeon MKL sums a
    matrix product in another order at another thread count, so later torch results moved in the last bits. torch's
    thread count is put back after."""
    torch_threads = torch.get_num_threads()
    encoder = ctranslate2.Encoder(str(path), device="cpu", compute_type=compute_type, intra_threads=threads)
    if torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)

    def prepare(batch: dict) -> Callable[[], object]:
        real = batch["attention_mask"].bool()
        ids = [row[keep].tolist() for row, keep in zip(batch["input_ids"], real, strict=True)]
        types = [row[keep].tolist() for row, keep in zip(batch["token_type_ids"], real, strict=True)]
        return lambda: np.asarray(encoder.forward_batch(ids, token_type_ids=types).last_hidden_state)

    def padded(output, batch: dict) -> torch.Tensor:
        states = torch.from_numpy(np.array(output))  # (B, longest real length, H)
        result = states.new_zeros(*batch["attention_mask"].shape, states.shape[-1])
        result[:, : states.shape[1]] = states
        return result

    return Engine(prepare, padded, "int8" if compute_type == "int8" else "fp32")


def convert_openvino(bert: BertModel, sample: dict) -> "openvino.Model":
    """`bert` converted by OpenVINO (`openvino.convert_model`, traced on `sample`), its inputs made dynamic in batch and
    length."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings
        model = openvino.convert_model(bert, example_input={name: sample[name] for name in ONNX_INPUTS})
    for model_input in model.inputs:
        model_input.get_node().set_partial_shape(openvino.PartialShape([-1, -1]))
    model.validate_nodes_and_infer_types()
    return model


def openvino_engine(bert: BertModel, sample: dict, threads: int, precision: str | None = "f32") -> Engine:
    """`BertModel` converted by OpenVINO (dynamic batch and length) and compiled for the CPU with the inference
    precision hint `precision` ("f32"), or with none (`None`: OpenVINO's default for the CPU). The engine's
    `precision` is the one the compiled model reports (`INFERENCE_PRECISION_HINT`)."""
    model = convert_openvino(bert, sample)
    config = {"INFERENCE_NUM_THREADS": threads}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = openvino.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")  # an openvino.Type: "f32", "bf16", "f16"
    chosen = {"f32": "fp32", "f16": "fp16"}.get(hint.to_string(), hint.to_string())

    def prepare(batch: dict) -> Callable[[], object]:
        feed = {name: batch[name].numpy() for name in ONNX_INPUTS}
        return lambda: request.infer(feed)[compiled.output(0)]

    return Engine(prepare, lambda output, batch: torch.from_numpy(output.copy()), chosen)
