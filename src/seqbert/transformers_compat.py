"""Compatibility with every transformers 5.x release: the names and signatures that changed between 5.0 and now.

Saved SeqBERT folders load on every transformers 5.x release (scripts/checks/check_transformers_versions.py checks them, and
tests/test_transformers_versions.py on the oldest, 5.0.0). What moved between those releases is bridged here, in one
place, so that `modeling_seqbert.py` reads as the model and calls one name for each thing:

- transformers 5.0 and 5.1 kept the output recorder in `utils.generic`, as the decorator `check_model_inputs`
  (`OutputRecorder`, `capture_outputs`);
- the `masking_utils` mask builders took `input_embeds` (later `inputs_embeds`), until 5.3 the query positions
  `cache_position`, and until 5.23 the cache as `past_key_values` (later `cache`); newer ones take
  `allow_is_causal_skip` / `allow_is_bidirectional_skip`, dropped for releases without them (`mask_arguments`);
- from 5.24 the key/value cache is called `cache` in `forward` inputs and output fields, `past_key_values` before
  (`CACHE_NAME`, `either_cache`).

Like the modeling file, which imports it relatively, it is copied into saved model folders for `trust_remote_code=True`
users, so it depends only on torch and transformers.
"""

import functools
import inspect
import warnings
from collections.abc import Callable

import torch
from transformers.cache_utils import Cache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

from .configuration_seqbert import check_transformers_version


# On transformers 4.x, stop with SeqBERT's one-line message (naming the version needed) before an import below fails.
check_transformers_version()
try:
    from transformers.utils.output_capturing import OutputRecorder, capture_outputs
except ImportError:  # transformers < 5.2
    from transformers.utils.generic import OutputRecorder
    from transformers.utils.generic import check_model_inputs as capture_outputs


# The key/value cache: the name transformers gives it in `forward` inputs (what `generate` passes) and output fields.
CACHE_NAME = "cache" if "cache" in CausalLMOutputWithCrossAttentions.__dataclass_fields__ else "past_key_values"


def either_cache(past_key_values: Cache | None, cache: Cache | None) -> Cache | None:
    """The cache a decoder `forward` was given, under either name: `past_key_values` (what `generate` passes until
    transformers 5.23; from 5.24 on, where built-in models take `cache`, it warns as theirs do) or `cache`.
    Raises `ValueError` when both are given."""
    if past_key_values is not None and cache is not None:
        raise ValueError("past_key_values and cache are two names for the same cache: give one of them")
    if past_key_values is not None and CACHE_NAME == "cache":
        warnings.warn(
            "`past_key_values` is deprecated since transformers 5.24: pass the cache as `cache`",
            FutureWarning,
            stacklevel=3,  # the caller of the model's forward
        )
    return past_key_values if cache is None else cache


@functools.cache
def _parameters(function: Callable) -> frozenset[str]:
    """The names of `function`'s parameters (read once per function: a decoder builds its masks every step)."""
    return frozenset(inspect.signature(function).parameters)


def mask_arguments(function: Callable, inputs_embeds: torch.Tensor, past_length: int = 0, **kwargs) -> dict:
    """Keyword arguments for a `masking_utils` mask builder of the installed transformers (see the module
    docstring)."""
    parameters = _parameters(function)
    kwargs["inputs_embeds" if "inputs_embeds" in parameters else "input_embeds"] = inputs_embeds
    if "past_key_values" in kwargs and "cache" in parameters:
        kwargs["cache"] = kwargs.pop("past_key_values")
    for name in ("allow_is_causal_skip", "allow_is_bidirectional_skip"):  # newer releases only; the default is True
        if name in kwargs and name not in parameters:
            kwargs.pop(name)
    if "cache_position" in parameters:
        kwargs["cache_position"] = torch.arange(
            past_length, past_length + inputs_embeds.shape[1], device=inputs_embeds.device
        )
    return kwargs


def bidirectional_mask(config, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs):
    """`masking_utils.create_bidirectional_mask(config, inputs_embeds, attention_mask, **kwargs)` with the installed
    transformers' argument names (`mask_arguments`): the mask in the format the configured attention backend takes."""
    arguments = mask_arguments(
        create_bidirectional_mask, inputs_embeds, config=config, attention_mask=attention_mask, **kwargs
    )
    return create_bidirectional_mask(**arguments)


def causal_mask(config, inputs_embeds: torch.Tensor, past_length: int, attention_mask, cache, position_ids, skip: bool):
    """`masking_utils.create_causal_mask` with the installed transformers' argument names (`mask_arguments`): the
    self-attention cache `cache`, given `position_ids` (where packed rows are looked for), `allow_is_causal_skip`."""
    arguments = mask_arguments(
        create_causal_mask, inputs_embeds, past_length, config=config, attention_mask=attention_mask,
        past_key_values=cache, position_ids=position_ids, allow_is_causal_skip=skip,
    )  # fmt: skip
    return create_causal_mask(**arguments)


__all__ = [
    "CACHE_NAME",
    "OutputRecorder",
    "bidirectional_mask",
    "capture_outputs",
    "causal_mask",
    "either_cache",
    "mask_arguments",
]
