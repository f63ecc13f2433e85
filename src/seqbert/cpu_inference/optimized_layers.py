"""The optimized encoder and its modules: mixins that `optimize_for_cpu_inference` puts on a copy's encoder, its
bidirectional layers, their attention and feed-forward modules and their six linear layers, so that every call of the
copy computes in the precision asked for (fp32, int8 or bf16), whatever the call records or hooks.

How a layer runs (`_OptimizedLayer`; our own arrangement):

- fused, the fast path: query/key/value as one `PackedLinear` call, attention over `LengthGroups` (unpadded batches)
  or the model's own attention on the padded batch, the output projection with the residual added, the feed-forward's
  first product with its activation and its second with the residual added;
- block by block where a hook watches the attention or the feed-forward (transformers records `output_attentions`
  with a forward hook on each attention module, `output_hidden_states` with one on each layer; or a hook of your
  own): that block runs as a call of its module, in the same precision, so that its hooks see its outputs and may
  change them, and its linear layers run packed (one that a hook watches is called as a module in its turn);
- under `torch.compile`, int8 and bf16 layers run eagerly outside the graph (one graph break per layer; oneDNN's int8
  calls quantize each input from its own range, a value read on the host), so `fullgraph=True` raises, naming why;
  fp32 layers are traced as the model's own;
- the model's own fp32 forward where the packed weights cannot serve the call: gradients flowing into the layer,
  inputs on another device or of another dtype, `torch.export` and `torch.jit.trace`. An int8 or bf16 copy says so in
  one warning per reason.
"""

import warnings

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from ..modeling_seqbert import SeqBertEncoder, SeqBertLayer, SeqBertMLP, SeqBertPreNormLayer, SeqBertSelfAttention
from .length_groups import LengthGroups, split_qkv
from .linear_kernels import PackedLinear


try:  # transformers >= 5.2: the recorders are hooks, installed once and kept, idle while no call records outputs
    from transformers.utils.output_capturing import _active_collector as _output_collector
except ImportError:  # transformers 5.0 and 5.1 swap a module's forward for each recording call, no hook
    _output_collector = None


# The linear layers of an encoder layer that `optimize_for_cpu_inference` packs, by role: query/key/value as one
# product, the attention's output projection (+ residual), the feed-forward's first (+ activation) and second
# (+ residual) products.
ROLES = ("qkv", "out_proj", "up_proj", "down_proj")


def layer_linears(layer: SeqBertLayer) -> dict[str, tuple[list[nn.Linear], str | None, bool]]:
    """role (`ROLES`) -> (its linear layers, activation, whether a residual is added)."""
    attention, mlp = layer.attention, layer.mlp
    return {
        "qkv": ([attention.query, attention.key, attention.value], None, False),
        "out_proj": ([attention.out_proj], None, True),
        "up_proj": ([mlp.up_proj], attention.config.hidden_act, False),
        "down_proj": ([mlp.down_proj], None, True),
    }


def pack_layer(
    layer: SeqBertLayer, linear_kernels: dict[str, str], int8: bool, dtype: torch.dtype, small_products: bool = False
) -> dict[str, PackedLinear]:
    """role -> the role's linear layers packed for its kernel in `linear_kernels` (`small_products`: `PackedLinear`'s,
    for a decoder's layers)."""
    return {
        role: PackedLinear(
            linears, int8, dtype, linear_kernels[role], activation, residual=residual, small_products=small_products
        )
        for role, (linears, activation, residual) in layer_linears(layer).items()
    }


def hooked(module: nn.Module) -> bool:
    """Whether calling `module` runs forward hooks or pre-hooks that act on this call: its own
    (`register_forward_hook`, `register_forward_pre_hook`, transformers' output recorders while the call records
    outputs, `_watched`) or global ones (`register_module_forward_hook`)."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return _watched(module)


def _block_hooked(*modules: nn.Module) -> bool:
    """Whether a hook acts on one of `modules` or their children (`hooked`, written out: a decoder calls this three
    times a layer and step, where `hooked` over `children()` took 5 % of an int8 greedy `generate`)."""
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    for module in modules:
        if _watched(module):
            return True
        for child in module._modules.values():
            if child is not None and _watched(child):
                return True
    return False


# Where transformers (from 5.2) defines its output recorders (`_watched`).
_RECORDERS_MODULE = "transformers.utils.output_capturing"


def _watched(module: nn.Module) -> bool:
    """Whether one of `module`'s own hooks (`_forward_hooks`, `_forward_pre_hooks`) acts on this call. transformers
    (from 5.2) installs its output recorders on the first call that records hidden states or attentions and keeps them
    on the modules, where they return at once on every call that records nothing: those do not count then, so that one
    recording call does not send every later call of the copy block by block (slower, and its int8 sums rounded in
    another order than the fused path's, so different ids)."""
    hooks, pre_hooks = module._forward_hooks, module._forward_pre_hooks
    if not (hooks or pre_hooks):
        return False
    if _output_collector is None or _output_collector.get():  # no recorders, or this call records outputs
        return True
    return any(
        getattr(hook, "__module__", None) != _RECORDERS_MODULE for hook in (*hooks.values(), *pre_hooks.values())
    )


def _tracing() -> bool:
    """`torch.export` or `torch.jit.trace` is tracing this call (not `torch.compile`, which may break the graph)."""
    exporting = getattr(torch.compiler, "is_exporting", lambda: False)
    return exporting() or torch.jit.is_tracing()


def _packed_applies(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether packed weights of `dtype` can serve an input: on the CPU, of that dtype, eager (not traced or
    compiled), with no gradient flowing into it."""
    if x.device.type != "cpu" or x.dtype != dtype or torch.compiler.is_compiling() or _tracing():
        return False
    return not (torch.is_grad_enabled() and x.requires_grad)


def _refusal(layer: nn.Module, hidden_states: torch.Tensor) -> str | None:
    """Why the packed weights of `layer` (an optimized layer or LM head: `_packed`, `_cpu_part`) cannot serve this
    call, as the warning says it (None: they can; under `torch.compile` they run outside the graph)."""
    if hidden_states.device.type != "cpu":
        return f"an input is on {hidden_states.device.type}, and the packed weights live on the CPU"
    if hidden_states.dtype not in (torch.float32, next(iter(layer._packed.values())).dtype):
        return f"an input is {hidden_states.dtype}, and the packed layers take float32 inputs"
    if torch.is_grad_enabled() and hidden_states.requires_grad:
        return (
            f"gradients flow into the {layer._cpu_part} (an input that requires grad, with grad enabled), and "
            "oneDNN's packed kernels have no backward"
        )
    if _tracing():
        return (
            "torch.export or torch.jit.trace traces the model, and the packed kernels are not exported (oneDNN's "
            "packed weights, and int8's input scale read on the host at each call)"
        )
    return None


class _OptimizedEncoder(SeqBertEncoder):
    """Mixed into an encoder's class by `optimize_for_cpu_inference`: on the unpadded path it sorts the batch's
    sequences into `LengthGroups` once per forward, for all its layers. Optimized for bf16, it hands its layers bf16
    hidden states where every layer takes the fused path unwatched (`_bf16_between_layers`), runs its final LayerNorm
    on them and hands fp32 back; elsewhere each layer takes and returns fp32 (rounded to bf16 inside), so that what a
    hook or `output_hidden_states` reads is fp32 as every output of the model. The embeddings before it and the pooler
    and heads after it stay fp32."""

    _cpu_dtype: torch.dtype = torch.float32
    _cpu_attention: str = "written_out"
    _cpu_length_groups: int = 4

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, *args, **kwargs):
        if kwargs.get("unpadded") is not None:
            kwargs["length_groups"] = LengthGroups.for_mode(
                kwargs["unpadded"], self._cpu_length_groups, self._cpu_attention
            )
        if not self._bf16_between_layers(hidden_states):
            return super().forward(hidden_states, attention_mask, *args, **kwargs)
        layer_inputs = args[0] if args else kwargs.get("layer_inputs")
        first = 0 if layer_inputs is None else len(layer_inputs)
        output = super().forward(hidden_states.to(torch.bfloat16), attention_mask, *args, **kwargs)
        if layer_inputs is not None:  # what a same_layer seq2seq decoder reads: fp32, as elsewhere
            layer_inputs[first:] = [x.float() for x in layer_inputs[first:]]
        return output.float()

    def _bf16_between_layers(self, hidden_states: torch.Tensor) -> bool:
        """A bf16 encoder passes bf16 between its layers where each is optimized, unhooked and served by its packed
        weights, eagerly."""
        if self._cpu_dtype != torch.bfloat16 or hidden_states.dtype != torch.float32:
            return False
        if torch.compiler.is_compiling():
            return False
        return all(
            isinstance(layer, _OptimizedLayer) and not hooked(layer) and _refusal(layer, hidden_states) is None
            for layer in self.layers
        )


class _OptimizedSelfAttention(SeqBertSelfAttention):
    """Mixed into an optimized layer's attention: called as a module (where a hook watches it), it computes the
    query/key/value product packed (each projection as a module where a hook watches it), attention as the layer's
    fused path does, and the output projection packed; in bf16, attention that would take its softmax in bf16 runs in
    fp32 on the bf16 projections (`merged_heads`)."""

    _packed_qkv: PackedLinear

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        unpadded=None,
        length_groups: LengthGroups | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `SeqBertSelfAttention.forward`, with the layer's `length_groups` (unpadded batches)."""
        packed = self._packed_qkv
        if past_key_values is not None or not _packed_applies(hidden_states, packed.dtype):
            return super().forward(hidden_states, attention_mask, past_key_values, unpadded, **kwargs)
        projections = (self.query, self.key, self.value)
        if any(hooked(projection) for projection in projections):
            qkv = torch.cat([projection(hidden_states) for projection in projections], dim=-1)
        else:
            qkv = packed(hidden_states)  # (B, L, 3H) or, unpadded, (1, T, 3H)
        heads, weights = self.heads(qkv, attention_mask, length_groups, unpadded, **kwargs)
        return self.out_proj(heads), weights

    def heads(
        self,
        qkv: torch.Tensor,
        attention_mask: torch.Tensor | None,
        length_groups: LengthGroups | None,
        unpadded=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Fused query/key/value projections (B, L, 3H), or (1, T, 3H) unpadded -> the heads side by side, (B, L, H)
        or (1, T, H), and the attention weights where the attention implementation returns them (eager)."""
        if length_groups is not None:
            return length_groups.attend(qkv, self), None
        if unpadded is not None:  # laid out one sequence per row, as the model's own attention does
            query, key, value = (self._split_heads(part, unpadded) for part in qkv.chunk(3, dim=-1))
        else:
            query, key, value = split_qkv(qkv, self)  # (B, N, L, D) each
        return self.merged_heads(query, key, value, attention_mask, unpadded, **kwargs)

    def merged_heads(self, query, key, value, attention_mask, unpadded=None, **kwargs):
        """`SeqBertAttention.merged_heads`; in bf16, in fp32 on the bf16 projections unless it is sdpa with a boolean
        mask or none (whose CPU kernel computes its softmax in fp32 for bf16 inputs): eager attention would take its
        softmax in bf16, and an additive fp32 mask does not fit bf16 scores. The heads come back in the projections'
        dtype."""
        dtype = query.dtype
        if dtype == torch.bfloat16 and not _bf16_attention_fits(self, attention_mask):
            query, key, value = query.float(), key.float(), value.float()
        heads, weights = super().merged_heads(query, key, value, attention_mask, unpadded, **kwargs)
        return heads.to(dtype), weights


def _bf16_attention_fits(attention: nn.Module, attention_mask: torch.Tensor | None) -> bool:
    """Whether the padded batch's attention runs on bf16 projections as they are: sdpa with a boolean mask or none."""
    no_float_mask = attention_mask is None or attention_mask.dtype == torch.bool
    return attention.config._attn_implementation == "sdpa" and no_float_mask


class _OptimizedMLP(SeqBertMLP):
    """Mixed into an optimized layer's feed-forward: called as a module (where a hook watches it), its first product
    runs packed with its activation fused (the product and the activation as modules where a hook watches one of
    them), its second packed."""

    _packed_up: PackedLinear

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        packed = self._packed_up
        if not _packed_applies(hidden_states, packed.dtype):
            return super().forward(hidden_states)
        if hooked(self.up_proj) or hooked(self.act):
            intermediate = self.act(self.up_proj(hidden_states))
        else:
            intermediate = packed(hidden_states)
        return self.dropout(self.down_proj(intermediate))


class _OptimizedLinear(nn.Linear):
    """Mixed into the linear layers of an optimized layer: called as a module (where a hook watches it, or by its
    attention or feed-forward module called as one), it computes `x @ W.T + b` on its own weight packed for its role's
    kernel, in its layer's precision (packed on its first such call); elsewhere as `nn.Linear`."""

    _cpu_linear: tuple[bool, torch.dtype, str, bool]  # int8, dtype, kernel, small_products

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        int8, dtype, kernel, small_products = self._cpu_linear
        if not _packed_applies(input, dtype) or self.__dict__.get("_cpu_fp32"):  # the latter: `optimized_decoder`
            return super().forward(input)
        packed = self.__dict__.get("_packed_linear")
        if packed is None:
            packed = self._packed_linear = PackedLinear([self], int8, dtype, kernel, small_products=small_products)
        return packed(input)


class _OptimizedLayer(SeqBertLayer):
    """Mixed into an encoder layer's class by `optimize_for_cpu_inference`: the same computation, with the layer's
    six linear layers as three-plus-three `PackedLinear` calls (query/key/value as one; the output projection with the
    residual added; the feed-forward's first linear with its activation; its second with the residual added), block by
    block where a hook watches a block, outside a compiled graph, or the model's own fp32 forward where the packed
    weights cannot serve the call (see the module docstring). Input and output have the same dtype.

    Attention runs over the encoder's `LengthGroups` on the unpadded path, else the model's own attention on the
    padded batch (in bf16 see `_OptimizedSelfAttention.merged_heads`)."""

    _packed: dict[str, PackedLinear]
    _cpu_precision: str  # "fp32", "int8" or "bf16"
    _cpu_notes: set  # the reasons already warned about, shared by the layers of one optimized copy

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        length_groups = kwargs.pop("length_groups", None)
        refusal = _refusal(self, hidden_states)
        if refusal is None and torch.compiler.is_compiling():
            if self._cpu_precision == "fp32":  # the model's own layer, traced into the graph
                return super().forward(hidden_states, attention_mask, **kwargs)
            return self.outside_the_graph(hidden_states, attention_mask, length_groups, kwargs)
        if refusal is not None:
            if self._cpu_precision != "fp32":
                _warn_once(self, refusal)
            dtype = hidden_states.dtype
            fp32 = hidden_states.float() if dtype == torch.bfloat16 else hidden_states
            return super().forward(fp32, attention_mask, **kwargs).to(dtype)
        return self.packed_forward(hidden_states, attention_mask, length_groups, kwargs)

    def outside_the_graph(self, hidden_states, attention_mask, length_groups, kwargs) -> torch.Tensor:
        """`packed_forward` called eagerly from a `torch.compile`d model (a graph break)."""
        return _outside_the_graph(self, hidden_states, attention_mask, length_groups, kwargs)

    def packed_forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        length_groups: LengthGroups | None,
        kwargs: dict,
    ) -> torch.Tensor:
        """The layer on its packed weights: (B, L, H) or, unpadded, (1, T, H), fp32 or (bf16 layers) bf16 -> the
        same shape and dtype."""
        packed, attention = self._packed, self.attention
        pre_norm = isinstance(self, SeqBertPreNormLayer)
        x = hidden_states.to(packed["qkv"].dtype)
        normed = self.attention_norm(x) if pre_norm else x
        if _block_hooked(attention, self.attention_dropout):  # the attention module, its hooks included
            x = x + self.attention_dropout(attention(normed, attention_mask, length_groups=length_groups, **kwargs)[0])
        else:
            unpadded = kwargs.pop("unpadded", None)
            heads, _ = attention.heads(packed["qkv"](normed), attention_mask, length_groups, unpadded, **kwargs)
            x = packed["out_proj"](heads, residual=x)
        if not pre_norm:
            x = self.attention_norm(x)
        return _feed_forward(self, packed, x, pre_norm).to(hidden_states.dtype)


def _feed_forward(layer: nn.Module, packed: dict, x: torch.Tensor, pre_norm: bool) -> torch.Tensor:
    """A layer's feed-forward block on `x` (the residual stream after attention), as its eager block computes it:
    `mlp_norm` before (pre-LN) or after (post-LN), the packed up and down projections with the residual added inside
    the second, or the layer's own `mlp` module where a hook watches it. Shared by the encoder's and the decoders'
    optimized layers."""
    normed = layer.mlp_norm(x) if pre_norm else x
    if _block_hooked(layer.mlp):
        x = x + layer.mlp(normed)
    else:
        x = packed["down_proj"](packed["up_proj"](normed), residual=x)
    return x if pre_norm else layer.mlp_norm(x)


def _disabled(reason: str):
    """`torch.compiler.disable` with its `reason` (what `fullgraph=True` then raises with), on torch releases that
    take one."""
    try:
        return torch.compiler.disable(reason=reason)
    except TypeError:  # torch before `reason`
        return torch.compiler.disable


@_disabled(
    "optimize_for_cpu_inference's int8 and bf16 encoder layers run eagerly outside the compiled graph: oneDNN's int8 "
    "calls quantize each input from its own range, read on the host. Compile without fullgraph=True (one graph break "
    "per layer), or compile the model itself (fp32)"
)
def _outside_the_graph(layer: _OptimizedLayer, hidden_states, attention_mask, length_groups, kwargs) -> torch.Tensor:
    """An int8 or bf16 layer's packed forward, called from a `torch.compile`d model: run eagerly (a graph break)."""
    return layer.packed_forward(hidden_states, attention_mask, length_groups, kwargs)


_WHY = {
    "int8": "oneDNN's int8 kernels",
    "bf16": "oneDNN's bf16 kernels",
}


# What `_warn_once` calls the optimized modules of each part (`_cpu_part`).
_PARTS = {"encoder": "encoder layers", "decoder": "decoder layers", "LM head": "LM head"}


@torch.compiler.disable
def _warn_once(layer: nn.Module, reason: str) -> None:
    """One warning per optimized copy and reason: the layers (or LM head) run the model's own fp32 forward, and
    why."""
    if reason in layer._cpu_notes:
        return
    layer._cpu_notes.add(reason)
    asked = "int8=True" if layer._cpu_precision == "int8" else "dtype=torch.bfloat16"
    part = _PARTS[layer._cpu_part]
    warnings.warn(
        f"optimize_for_cpu_inference({asked}) copy: {reason}, so its {part} run the model's own fp32 forward "
        f"for such calls instead of {_WHY[layer._cpu_precision]} (said once per copy). Call it on the CPU with "
        "float32 inputs and without gradients to get its precision; to train or export, use the model you optimized",
        UserWarning,
        stacklevel=2,
    )


_OPTIMIZED_CLASSES: dict[tuple[type, type], type] = {}
_ORIGINAL_CLASSES: dict[type, type] = {}


def optimized_class(mixin: type, module_class: type) -> type:
    """The class `mixin` + `module_class`, one per pair (so optimized copies share their classes), named by the
    mixin's `optimized_name` pattern (default "CpuOptimized{}"); `module_class` itself where it is one already."""
    if issubclass(module_class, mixin):
        return module_class
    key = (mixin, module_class)
    if key not in _OPTIMIZED_CLASSES:
        pattern = getattr(mixin, "optimized_name", "CpuOptimized{}")
        name = "CpuOptimizedLinear" if module_class is nn.Linear else pattern.format(module_class.__name__)
        _OPTIMIZED_CLASSES[key] = type(name, (mixin, module_class), {})
        _ORIGINAL_CLASSES[_OPTIMIZED_CLASSES[key]] = module_class
    return _OPTIMIZED_CLASSES[key]


# What `optimize_layer`, `optimize_encoder` and (`optimized_decoder`) `optimize_decoder` add to a module or a model,
# and `restore_original_modules` removes.
OPTIMIZATION_ATTRIBUTES = (
    "_packed", "_packed_qkv", "_packed_up", "_packed_linear", "_cpu_linear", "_cpu_precision", "_cpu_notes",
    "_cpu_dtype", "_cpu_attention", "_cpu_length_groups", "_cpu_part", "_packed_query", "_packed_kv",
    "_reorder_cache", "_cpu_fp32",
)  # fmt: skip


def optimize_layer(
    layer: SeqBertLayer,
    linear_kernels: dict[str, str],
    int8: bool,
    dtype: torch.dtype,
    notes: set | None = None,
    layer_mixin: type | None = None,
    attention_mixin: type | None = None,
    part: str = "encoder",
    small_products: bool = False,
) -> SeqBertLayer:
    """`layer` itself, its linears packed for `linear_kernels` (role -> kernel) and its class, its attention's, its
    feed-forward's and its linear layers' mixed with the optimized ones; `notes`: the set of reasons already warned
    about, shared by the layers of one copy. `layer_mixin` and `attention_mixin` (default `_OptimizedLayer` and
    `_OptimizedSelfAttention`) and `part` ("encoder" or "decoder", what warnings call it) serve the causal layers of
    a decoder (`optimized_decoder`), with `small_products` (`PackedLinear`'s)."""
    packed = pack_layer(layer, linear_kernels, int8, dtype, small_products)
    for role, (linears, _, _) in layer_linears(layer).items():
        for linear in linears:
            linear._cpu_linear = (int8, dtype, linear_kernels[role], small_products)
            linear.__class__ = optimized_class(_OptimizedLinear, type(linear))
    layer.attention._packed_qkv = packed["qkv"]
    layer.attention.__class__ = optimized_class(attention_mixin or _OptimizedSelfAttention, type(layer.attention))
    layer.mlp._packed_up = packed["up_proj"]
    layer.mlp.__class__ = optimized_class(_OptimizedMLP, type(layer.mlp))
    layer._packed = packed
    layer._cpu_precision = precision_name(int8, dtype)
    layer._cpu_notes = set() if notes is None else notes
    layer._cpu_part = part
    layer.__class__ = optimized_class(layer_mixin or _OptimizedLayer, type(layer))
    return layer


def precision_name(int8: bool, dtype: torch.dtype) -> str:
    """ "int8", "fp32" or "bf16"."""
    return "int8" if int8 else {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


def optimize_encoder(
    encoder: SeqBertEncoder,
    linear_kernels: dict[str, str],
    attention: str,
    length_groups: int,
    int8: bool,
    dtype: torch.dtype,
) -> None:
    """`encoder` and its bidirectional layers optimized in place: `linear_kernels` (role -> kernel), the attention
    mode and the number of length groups, as a `CpuInferencePlan` holds them."""
    encoder.__class__ = optimized_class(_OptimizedEncoder, type(encoder))
    encoder._cpu_dtype, encoder._cpu_attention, encoder._cpu_length_groups = dtype, attention, length_groups
    notes: set = set()
    for layer in encoder.layers:
        if isinstance(layer, SeqBertLayer) and not layer.attention.is_causal:
            optimize_layer(layer, linear_kernels, int8, dtype, notes)


def is_optimized(module: nn.Module) -> bool:
    """Whether `module` or one of its modules was optimized by `optimize_for_cpu_inference`."""
    return any(type(child) in _ORIGINAL_CLASSES for child in module.modules())


def restore_original_modules(model: nn.Module) -> None:
    """Undo `optimize_encoder` in place: every optimized module back to its own class, without the packed weights
    and settings it was given."""
    for module in model.modules():
        module.__class__ = _ORIGINAL_CLASSES.get(type(module), type(module))
        for name in OPTIMIZATION_ATTRIBUTES:
            module.__dict__.pop(name, None)


def packed_objects(model: nn.Module) -> list:
    """The packed weights and the containers of them that `optimize_encoder` and `optimize_decoder` attached to
    `model`'s modules (what a copy that is to be restored need not copy). Strings, numbers, tuples and functions are
    left out: a deep copy's memo entry for one would stand for every use of that object in the model (an interned
    string such as "encoder" is the same object wherever it appears)."""
    return [
        module.__dict__[name]
        for module in model.modules()
        for name in OPTIMIZATION_ATTRIBUTES
        if name in module.__dict__ and isinstance(module.__dict__[name], (PackedLinear, dict, set, list))
    ]
