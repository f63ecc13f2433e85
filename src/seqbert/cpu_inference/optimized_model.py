"""`optimize_for_cpu_inference`: the checks of its arguments and of this CPU, the plan (given, or measured once per
process), and the optimized copy of the model."""

import copy
import functools
import warnings
from collections.abc import Mapping

import torch
from torch import nn
from transformers.utils import logging

from ..modeling_seqbert import (
    SeqBertDecoder,
    SeqBertEncoder,
    SeqBertForCausalLM,
    SeqBertForConditionalGeneration,
    SeqBertLayer,
    SeqBertPreTrainedModel,
)
from .capabilities import (
    UnsupportedCpuError,
    bf16_instructions_available,
    bf16_linear_available,
    linear_kernels_available,
    onednn_x86_operators_available,
)
from .optimized_decoder import optimize_decoder, optimize_lm_head, reorder_self_attention_cache
from .optimized_layers import is_optimized, optimize_encoder, packed_objects, restore_original_modules
from .plans import CpuInferencePlan, check_plan, default_plan, default_timing_lengths, measured_plan


logger = logging.get_logger("seqbert.cpu_inference")


def optimize_for_cpu_inference(
    model: SeqBertPreTrainedModel,
    int8: bool = False,
    dtype: torch.dtype = torch.float32,
    plan: CpuInferencePlan | Mapping | None = None,
    example_inputs: Mapping | None = None,
) -> SeqBertPreTrainedModel:
    """
    A copy of `model` for CPU inference whose encoder layers run prepacked linear layers with fused post-ops and
    length-grouped attention (our own combination of torch's oneDNN, MKL and generic operators), and whose decoder
    layers and LM head (`SeqBertForConditionalGeneration`, `SeqBertForCausalLM`) run prepacked linear layers with
    their key/value cache, in the precision asked for:

    - query, key and value projections as one matrix product, laid out for attention with one copy instead of three;
    - bias + activation fused into the feed-forward's first product, and the residual added inside the output
      projection and the feed-forward's second product (oneDNN's eltwise and binary post-ops; after the product on
      the other kernels);
    - attention per group of similar lengths (`LengthGroups`).

    The precision is the caller's; the kernels are the plan's. `int8=True` always gives int8 layers and
    `dtype=torch.bfloat16` always bf16 layers: the plan chooses only among kernels and attention of that precision.
    Which ones run is measured on this CPU, at the current thread count, on the model's own shapes (`measure_plan`:
    each linear kernel per role, attention written out or on sdpa, 1 to 8 length groups, then the optimized layer
    against the eager one), in a few seconds, starting from the default plan of this CPU class and keeping it unless
    another is clearly faster, so that the plan does not follow the load of the machine; where the timing rounds
    disagree (other processes using the CPU), the class's default plan stands, with a warning. The choice is logged at
    INFO level (transformers' logging, `seqbert.cpu_inference`) and kept as the copy's `cpu_inference_plan`; pass it
    back as `plan=` (or its `to_dict()`) to skip the timing and get the same choice. In fp32, where the eager layers
    measure faster, the copy keeps them; int8 or bf16 measured slower than the fp32 eager model warns once, with both
    times. Measurements are cached per process by everything that changes them (`plans.plan_key`: precision, shapes,
    attention implementation, training mode, threads, CPU capability and class), timed one at a time however many
    threads call, and each copy holds a plan of its own (`measurements["from_cache"]` and the log say whether it was
    reused).

    The precision holds in every call form (`optimized_layers`): recorded per-layer outputs (`output_hidden_states`,
    `output_attentions`: transformers' recorders read the optimized layers' outputs, in fp32), forward hooks on a layer,
    its attention, its feed-forward or one of their linear layers (the watched block runs as a call of its module, in
    the same precision, so a hook sees its outputs and may change them), recorder hooks that transformers left on
    `model` before it was optimized or on the copy after a recording call (idle, they change nothing: a call that
    records nothing runs the fused layers), and `torch.compile` (int8 and bf16 layers run eagerly outside the graph, a
    graph break per layer; with `fullgraph=True` compiling raises, naming why). Where the packed weights cannot serve a
    call (gradients flowing into the encoder, inputs off the CPU or of another dtype, `torch.export`, `torch.jit.trace`)
    the layers run the model's own fp32 forward, and an int8 or bf16 copy says so in one warning per reason. Attention,
    LayerNorms, embeddings and the encoder models' heads run as in `model`. Any batch size or length runs without
    further preparation.

    The decoder half (`optimized_decoder`): the decoder layers of a seq2seq or causal LM model (causal self-attention
    with its query/key/value as one product, cross-attention with its keys and values of the encoder output as one
    product computed once per `generate`, feed-forward; the residual adds and the activation fused) and the LM head
    (its transform with the activation fused, the vocabulary projection) compute in the precision asked for, on
    oneDNN's kernels (the only ones int8 and bf16 have; in fp32 the layout `PackedCpuLinears` measured fastest for
    decode steps). `generate` runs on them with the dynamic or static key/value cache and beam search as the model
    does; a seq2seq copy reorders only the self-attention cache between beam steps (the cross-attention cache holds
    the same keys and values for every beam of a source). Their call forms keep the precision as the encoder's do. A
    model without encoder layers (a causal LM) is not timed: its `cpu_inference_plan` is this CPU's default plan. fp32
    decoders where oneDNN's x86 operators are missing run as in `model`. An optimized copy given as `model` is optimized afresh from its
    fp32 weights, as the model it was made from would be; `copy.deepcopy` of a copy packs the copied weights anew.

    fp32 results differ from the eager model in the last bits (the kernels sum in another order): within 1e-5 of
    BERT's hidden states on real text, whichever kernels the plan holds. fp32 runs on every CPU: where oneDNN's x86
    operators are missing (non-x86 CPUs such as AWS Graviton or Apple silicon, or builds without oneDNN) the plan
    chooses among torch's generic `addmm` and `linear`.

    With `int8=True` the linear layers of the encoder, the decoder and the LM head compute in int8 through oneDNN (x86 only; weights per output feature,
    activations per call; see `PackedLinear`), which moves hidden states as int8 does
    (`scripts/benchmarks/evaluate_int8.py` measures the accuracy a fine-tuned classifier keeps). On CPUs whose int8
    products saturate in a call form seqbert uses (no VNNI: AVX2 CPUs such as AMD Zen 3), the weights of that form are
    quantized to 7 bits so that the products stay exact (`int8_weight_levels`).

    With `dtype=torch.bfloat16` the encoder and decoder layers and the LM head compute in bf16 (Kalamkar et al. 2019, "A Study of BFLOAT16 for
    Deep Learning Training"): weights rounded to bf16 once, hidden states bf16 between the encoder's layers (handed
    over in fp32 where a hook or recorder watches a layer, the values still bf16's), every
    matrix product accumulated in fp32 inside oneDNN, LayerNorm statistics and the attention softmax computed in fp32
    (torch's mixed-dtype LayerNorm and its CPU flash attention do so for bf16 inputs; other attention, eager or with
    an additive mask, runs in fp32 on the bf16 projections), and the embeddings, pooler and heads in fp32 as before,
    so outputs are fp32. On CPUs with AVX512_BF16 or AMX-BF16 this is the fast path. On other AVX-512 CPUs oneDNN
    emulates bf16, slower than fp32, and a warning says so (`bf16_instructions_available`); on CPUs without AVX-512
    torch has no bf16 oneDNN linear, and this raises (`bf16_linear_available`). The decoder's key/value cache holds
    bf16 keys and values then; its hidden states enter and leave each decoder layer in fp32, and logits are fp32.

    The copy is for inference: its parameters do not require grad. Its packed weights follow its weights: a call after
    they changed (`load_state_dict` into the copy, an in-place edit, a replaced parameter) packs the changed layers
    again first, in the same precision and plan (the kernels were timed for the shapes, not the values).
    `save_pretrained` of the copy writes the ordinary fp32 weights. The copy keeps its fp32 weights beside the packed
    ones: they serve the calls the packed weights cannot (gradients, `torch.export`), `save_pretrained`, and optimizing
    the copy again (int8 adds a quarter of the fp32 weights' bytes, bf16 half, fp32 a full second copy).

    Args:
        model (`SeqBertPreTrainedModel`): any SeqBERT model with an encoder or a decoder, on the CPU in float32, in
            either mode; left unchanged.
        int8 (`bool`): compute the linear layers in int8.
        dtype (`torch.dtype`): `torch.float32` (default) or `torch.bfloat16`, what the encoder and decoder layers
            compute in (not with `int8=True`).
        plan (`CpuInferencePlan` or `dict`, *optional*): run this plan instead of measuring one.
        example_inputs (`Mapping`, *optional*): a batch like those that will be served (the tokenizer's output); its
            `attention_mask` gives the lengths the plan is timed on (default `default_timing_lengths()`).

    Returns:
        `SeqBertPreTrainedModel`: the optimized copy, in eval mode, with `cpu_inference_plan` set.

    Raises:
        TypeError: `model` is not a SeqBERT model, `int8` is not a bool, `dtype` not a `torch.dtype`, or `plan` of
            another type.
        ValueError: `dtype` is neither float32 nor bfloat16, or bfloat16 with `int8=True`; `model` is not on the CPU
            in float32, has neither encoder nor decoder layers, or its linear layers are wrapped (PEFT adapters: merge
            them first with `merge_and_unload()`); `plan` names a kernel this precision or CPU cannot run, an unknown
            attention mode, or the eager layers for int8 or bf16; `example_inputs` has no usable `attention_mask`.
        UnsupportedCpuError: int8 or bf16 where this CPU or torch build lacks oneDNN's x86 operators (the message
            names the ONNX Runtime route of docs/deploy.md), or bf16 where oneDNN has no bf16 linear (AVX-512 or
            AVX-NE-CONVERT is needed).

    Warns:
        UserWarning: the timing rounds disagreed and this CPU class's default plan runs; int8 or bf16 measured slower
            than the fp32 eager model (once per measurement); bf16 on a CPU without bf16 instructions (once). The
            copy, when called: int8 or bf16 layers run the model's own fp32 forward for a call their packed weights
            cannot serve (once per copy and reason).
    """
    if not isinstance(model, SeqBertPreTrainedModel):
        raise TypeError(f"model must be a SeqBERT model (SeqBertPreTrainedModel), got {type(model).__name__}")
    if not isinstance(int8, bool):
        raise TypeError(f"int8 must be True or False, got {int8!r}")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype (torch.float32 or torch.bfloat16), got {dtype!r}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype ({dtype}) must be torch.float32 or torch.bfloat16")
    if int8 and dtype != torch.float32:
        raise ValueError(f"int8=True computes in int8 with fp32 outputs: leave dtype at torch.float32, got {dtype}")
    copied = is_optimized(model)
    if copied:  # an optimized copy: optimized again from its own fp32 weights, as the model it was made from
        model = _unoptimized_copy(model)
    for name, parameter in model.named_parameters():
        if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
            raise ValueError(
                f"optimize_for_cpu_inference needs a float32 model on the CPU; parameter {name!r} is "
                f"{parameter.dtype} on {parameter.device}"
            )
    encoders = [  # each encoder's bidirectional layers, by name
        [
            (name, layer)
            for name, layer in encoder.layers.named_children()
            if isinstance(layer, SeqBertLayer) and not layer.attention.is_causal
        ]
        for encoder in model.modules()
        if isinstance(encoder, SeqBertEncoder)
    ]
    encoders = [layers for layers in encoders if layers]
    layers = [pair for encoder_layers in encoders for pair in encoder_layers]
    decoded = _decoder_parts(model)
    if not layers and not decoded:
        raise ValueError(f"{type(model).__name__} has no encoder or decoder layers to optimize")
    for name, layer in [(f"layer {name}", layer) for name, layer in layers] + decoded:
        for child_name, child in layer.named_modules():
            if child_name.rsplit(".", 1)[-1] in _PACKED_LINEAR_NAMES and type(child) is not nn.Linear:
                raise ValueError(
                    f"{name}'s {child_name} is a {type(child).__name__}, not a plain nn.Linear (a PEFT adapter?); "
                    "merge adapters into the weights first (`merge_and_unload()`)"
                )
    _check_cpu(int8, dtype)
    lengths = _example_lengths(example_inputs)
    if plan is None and not layers:  # a decoder only: its kernels are fixed, there is no encoder layer to time
        plan = default_plan(int8, dtype)
        plan.measurements.update(chosen_by="default plan: no encoder layers to time", from_cache=False)
    elif plan is None:
        plan = measured_plan(encoders[0][0][1], int8, dtype, lengths, len(encoders[0]))
        measured = plan.measurements
        when = (
            f"reused from this process's cache (the same key was timed earlier, in {measured['seconds']} s)"
            if measured["from_cache"]
            else f"measured in {measured['seconds']} s"
        )
        logger.info(
            f"optimize_for_cpu_inference({'int8' if int8 else dtype}): {plan.summary()}; chosen by "
            f"{measured['chosen_by']}; {when} at {measured['threads']} thread(s), CPU capability "
            f"{measured['cpu_capability']}, class {measured['cpu_class']}"
        )
    else:
        plan = check_plan(plan, int8, dtype).copy()
    optimized = (model if copied else copy.deepcopy(model)).eval().requires_grad_(False)
    optimized.cpu_inference_plan = plan
    if not plan.eager_layers:
        for encoder in (module for module in optimized.modules() if isinstance(module, SeqBertEncoder)):
            optimize_encoder(encoder, plan.linear_kernels, plan.attention, plan.length_groups, int8, dtype)
    kernel = "onednn" if "onednn" in linear_kernels_available(int8, dtype) else None
    decoders = [module for module in optimized.modules() if isinstance(module, SeqBertDecoder)]
    if decoders and kernel is not None:  # else (fp32 without oneDNN) the decoder runs as in `model`
        notes: set = set()
        for decoder in decoders:
            optimize_decoder(decoder, kernel, int8, dtype, notes)
        if isinstance(optimized, _GENERATION_MODELS):
            optimize_lm_head(optimized.lm_head, optimized.config.hidden_act, kernel, int8, dtype, notes)
        if any(decoder.add_cross_attention for decoder in decoders):
            optimized._reorder_cache = reorder_self_attention_cache
    return optimized


# The generation models, whose LM head `optimize_for_cpu_inference` optimizes with their decoder.
_GENERATION_MODELS = (SeqBertForCausalLM, SeqBertForConditionalGeneration)
# The names of the linear layers an optimized copy packs (PEFT adapters there are refused).
_PACKED_LINEAR_NAMES = ("query", "key", "value", "out_proj", "up_proj", "down_proj", "dense", "decoder")


def _decoder_parts(model: SeqBertPreTrainedModel) -> list[tuple[str, nn.Module]]:
    """The decoder layers of `model` and the LM head of a generation model, by the name an error gives them."""
    parts = [
        (f"decoder layer {name}", layer)
        for decoder in model.modules()
        if isinstance(decoder, SeqBertDecoder)
        for name, layer in decoder.layers.named_children()
    ]
    if parts and isinstance(model, _GENERATION_MODELS):
        parts.append(("the LM head", model.lm_head))
    return parts


def _unoptimized_copy(model: SeqBertPreTrainedModel) -> SeqBertPreTrainedModel:
    """A deep copy of an optimized copy, its modules back to their own classes: its packed weights are not copied
    (the copy is optimized afresh), nor its plan."""
    memo = {id(packed): None for packed in packed_objects(model)}
    plain = copy.deepcopy(model, memo)
    restore_original_modules(plain)
    plain.__dict__.pop("cpu_inference_plan", None)
    return plain


def _check_cpu(int8: bool, dtype: torch.dtype) -> None:
    """UnsupportedCpuError where this CPU or torch build cannot run the precision asked for; a warning where bf16 runs
    emulated."""
    capability = torch.backends.cpu.get_cpu_capability()
    if (int8 or dtype == torch.bfloat16) and not onednn_x86_operators_available():
        precision = "int8=True" if int8 else "dtype=torch.bfloat16"
        raise UnsupportedCpuError(
            f"optimize_for_cpu_inference({precision}) needs torch's oneDNN operators on an x86 CPU with AVX2 or "
            f"better; this CPU and torch build have none (CPU capability {capability!r}, oneDNN available "
            f"{torch.backends.mkldnn.is_available()}). fp32 (the default) runs here on torch's generic operators. For "
            "int8 on this CPU use ONNX Runtime: seqbert.serving_artifacts.save_serving_artifacts(folder) writes "
            "onnx/model_qint8_quantized.onnx, ONNX Runtime's dynamic int8 quantization of the model (docs/deploy.md, "
            "'ONNX and OpenVINO files in the folder')"
        )
    if dtype == torch.bfloat16 and not bf16_linear_available():
        raise UnsupportedCpuError(
            "optimize_for_cpu_inference(dtype=torch.bfloat16) needs a CPU on which oneDNN runs bf16: AVX-512 (BW, "
            "VL, DQ) or AVX-NE-CONVERT, best with AVX512_BF16 or AMX; this CPU has neither (torch reports capability "
            f"{capability!r}): use dtype=torch.float32, or int8=True"
        )
    if dtype == torch.bfloat16 and not bf16_instructions_available():
        _warn_no_bf16_instructions()


def _example_lengths(example_inputs: Mapping | None) -> list[int]:
    """The real lengths of `example_inputs`' sequences (rows with no real token left out), or the default ones."""
    if example_inputs is None:
        return default_timing_lengths()
    mask = example_inputs.get("attention_mask") if isinstance(example_inputs, Mapping) else None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError(
            "example_inputs must be a batch with a (batch, length) attention_mask tensor, as the tokenizer returns "
            f"with return_tensors='pt'; got {type(example_inputs).__name__} with attention_mask "
            f"{None if mask is None else getattr(mask, 'shape', type(mask).__name__)}"
        )
    lengths = [length for length in mask.sum(1).tolist() if length > 0]
    if not lengths:
        raise ValueError("example_inputs' attention_mask has no real token (every entry 0)")
    return lengths


@functools.cache
def _warn_no_bf16_instructions() -> None:
    """Once per process: bf16 was asked for on a CPU without bf16 instructions."""
    warnings.warn(
        "optimize_for_cpu_inference(dtype=torch.bfloat16): this CPU has no bf16 instructions (AVX512_BF16 or "
        f"AMX-BF16; torch reports CPU capability {torch.backends.cpu.get_cpu_capability()!r}), so oneDNN emulates "
        "bf16 and it runs slower than dtype=torch.float32 here; results are still bf16's",
        stacklevel=4,
    )
