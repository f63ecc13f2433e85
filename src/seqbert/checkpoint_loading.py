"""Loading SeqBERT checkpoints: what `SeqBertPreTrainedModel.from_pretrained` does around transformers' loader, and the
clear errors for checkpoints that are missing, damaged or do not fit the model.

transformers loads a truncated safetensors file, a broken index or a pickled `.bin` with errors from deep inside its
loader, or silently (a pickled file runs code; a checkpoint whose shapes differ is loaded with `ignore_mismatched_sizes`
only). `load_pretrained` refuses pickled weights unless asked, names the damaged file, names the config fields behind
mismatched shapes (`MismatchedSizesError`), refuses seqbert 0.1.0's fused attention projections and weights holding
NaN or infinite values. `convert_bert.py` loads BERT checkpoints on top of it.

Copied next to `modeling_seqbert.py` into saved model folders (the modeling file imports it relatively): it depends
only on torch, safetensors and transformers.
"""

import json
import os
import re
import zipfile

import torch
from safetensors import safe_open
from transformers import PretrainedConfig
from transformers.utils import cached_file


# Weight files in the order transformers' own loader prefers them. Pickled `.bin` files are read only on request
# (`use_safetensors=False`): unpickling a file from an untrusted source can run code.
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def load_pretrained(cls, load, pretrained_model_name_or_path, *model_args, use_safetensors=None, **kwargs):
    """
    `SeqBertPreTrainedModel.from_pretrained`: transformers' loader (`load`, `PreTrainedModel.from_pretrained` bound to
    `cls`), safetensors only unless `use_safetensors=False`, with the errors of the module docstring (see that method
    for what raises).
    """
    path = pretrained_model_name_or_path
    ignore_mismatched_sizes = kwargs.pop("ignore_mismatched_sizes", False)
    output_loading_info = kwargs.pop("output_loading_info", False)
    safetensors_only = use_safetensors is None and path is not None
    if path is not None and kwargs.get("config") is None and not model_args:
        problem = missing_config_problem(path, **kwargs)
        if problem is not None:
            raise OSError(problem)
    if safetensors_only:
        refuse_pickled_weights(path, kwargs.get("subfolder", ""))
    try:
        # Mismatched shapes are let through here and checked below, for a message that names the config fields.
        model, loading_info = load(
            path,
            *model_args,
            use_safetensors=True if safetensors_only else use_safetensors,
            ignore_mismatched_sizes=True,
            output_loading_info=True,
            **kwargs,
        )
    except Exception as error:
        if safetensors_only and isinstance(error, OSError) and "cannot be loaded with `safetensors`" in str(error):
            raise OSError(
                f"pretrained_model_name_or_path ({str(path)!r}) has no safetensors weights; seqbert does not load "
                "pickled pytorch_model.bin files by default because unpickling can run code: pass "
                "use_safetensors=False if you trust the repository"
            ) from error
        # A raw safetensors/JSON/torch error from a damaged file: name the file instead.
        problem = None if path is None else find_checkpoint_problem(path, use_safetensors, **kwargs)
        if problem is None:
            raise
        raise OSError(problem) from error
    where = f"{cls.__name__}.from_pretrained({str(path)!r})"
    if loading_info["mismatched_keys"] and not ignore_mismatched_sizes:
        checkpoint = None if path is None else checkpoint_config_dict(path, **kwargs)
        raise mismatched_sizes_error(loading_info["mismatched_keys"], model.config, checkpoint, where)
    error = fused_attention_error(loading_info["unexpected_keys"], where)
    if error is None and path is not None:  # (from_bert_pretrained checks its own weights, path None here)
        error = non_finite_weights_error(model, where)
    if error is not None:
        raise error
    if model.config.tie_word_embeddings:
        # transformers 5.3 marks the tied LM head of remote code as initialised before it lists the missing keys,
        # then leaves it untied, on the meta device (with a warning that both matrices were in the checkpoint).
        model.tie_weights()
    return (model, loading_info) if output_loading_info else model


# seqbert 0.1.0 fused each attention's projections: `qkv_proj` (self-attention: query, key, value) and, in the
# decoder's cross-attention, `q_proj` and `kv_proj` (key, value), concatenated along the output dimension.
_FUSED_ATTENTION = re.compile(r"^(.*)\.(qkv_proj|kv_proj|q_proj)\.(weight|bias)$")


def fused_attention_error(unexpected_keys, where: str) -> ValueError | None:
    """The error for a checkpoint whose unexpected keys are seqbert 0.1.0's fused attention projections (the model's
    query, key and value would keep their random initialisation), or None when there are none."""
    fused = sorted(key for key in unexpected_keys if _FUSED_ATTENTION.match(key))
    if not fused:
        return None
    return ValueError(
        f"{where}: the checkpoint stores fused attention projections ({_listed(fused)}), the layout of seqbert 0.1.0; "
        "this version keeps BERT's separate query, key and value, which would keep their random initialisation. "
        "Split them once with seqbert.convert_bert.split_fused_attention on the checkpoint's state dict and save it "
        "again"
    )


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoint files: clear errors for missing, truncated or corrupt ones
# ----------------------------------------------------------------------------------------------------------------------

_REDOWNLOAD = (
    "re-download it (with force_download=True for a Hub model) or, if you made it, save it again with save_pretrained"
)
# Hub options that only locate files: used to inspect a checkpoint that failed to load, without downloading anything.
_LOCATE_KWARGS = ("cache_dir", "revision", "subfolder")


def _corrupt(path, detail: str) -> str:
    return f"{path} is truncated or corrupt ({detail}): {_REDOWNLOAD}"


def safetensors_file_problem(path) -> str | None:
    """
    Why the safetensors file at `path` cannot be read, or `None` when it opens. Reads only the header, with
    `safetensors.safe_open`, which checks that the header is well-formed and describes exactly the bytes the file
    holds: a truncated file (a download or copy cut short), an empty file or a garbled header fail.

    Returns:
        `str | None`: a sentence naming the file, what is wrong and what to do (re-download or save again).
    """
    try:
        with safe_open(path, framework="pt"):
            pass
    except Exception as error:  # safetensors_rust.SafetensorError, OSError
        return _corrupt(path, str(error))
    return None


def _pickle_file_problem(path) -> str | None:
    """What can be seen wrong in a pickled weights file without unpickling it: empty, or a `torch.save` zip archive
    that is cut short or fails its checksums."""
    if os.path.getsize(path) == 0:
        return _corrupt(path, "0 bytes")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        return None  # the legacy (pre-zip) torch.save format: nothing to check without unpickling
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError):
        return _corrupt(path, "a torch.save zip archive whose end is missing")
    return _corrupt(path, f"archive member {bad} fails its checksum") if bad is not None else None


def weights_file_problem(path) -> str | None:
    """`safetensors_file_problem` for `.safetensors` files, else what can be checked of a pickled file."""
    return safetensors_file_problem(path) if str(path).endswith(".safetensors") else _pickle_file_problem(path)


# Largest weight magnitude a loaded checkpoint may hold. Trained BERT-family weights stay far below it (the MiniLM
# checkpoint's largest is 7.9); a bit flipped in the top two exponent bits of a float32 weight multiplies it by 2^64 or
# more, and such values overflow to inf / NaN in the forward pass. (Our own bound: a plausibility check, no standard.)
MAX_WEIGHT_MAGNITUDE = 1e8


def non_finite_weights_error(model: torch.nn.Module, where: str) -> OSError | None:
    """
    An `OSError` naming the parameters of a just-loaded `model` that hold NaN, infinite or implausibly large values
    (magnitude above `MAX_WEIGHT_MAGNITUDE`), or `None` when all are fine (or on the meta device, not loaded yet).
    Quantized weights (tensor subclasses of torchao or quanto) are checked through their dequantized values.
    A released or saved checkpoint never holds such values: they mean a damaged weights file (safetensors files carry
    no checksum, so a bit flipped inside the tensor data shows only through the value it makes; smaller changes cannot
    be detected) or a checkpoint saved after training diverged. Loading it would only give NaN outputs later. One host
    sync per device.

    Args:
        model: the loaded model.
        where: the call, for the message (e.g. `"SeqBertModel.from_pretrained('folder')"`).
    """
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in model.named_parameters():
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            # A quantizer's tensor subclass (torchao's Int8Tensor, quanto's QTensor), which may implement no `abs`:
            # checked through the float values it stands for. One that cannot give them back is not checked here; a
            # quantizer writes its weights from finite ones (bitsandbytes' Int8Params is a plain int8 parameter).
            try:
                tensor = tensor.dequantize()
            except (AttributeError, NotImplementedError, RuntimeError, TypeError):
                continue
        if tensor.is_floating_point() and tensor.device.type != "meta":
            by_device.setdefault(tensor.device, []).append((name, tensor))
    bad = []
    for tensors in by_device.values():
        # abs() <= bound is False for NaN, so one comparison covers NaN, inf and huge values.
        fine = torch.stack([(tensor.abs() <= MAX_WEIGHT_MAGNITUDE).all() for _, tensor in tensors]).tolist()
        bad += [name for (name, _), ok in zip(tensors, fine, strict=True) if not ok]
    if not bad:
        return None
    return OSError(
        f"{where}: the loaded weights hold NaN, infinite or implausibly large (above {MAX_WEIGHT_MAGNITUDE:g}) values in "
        f"{_listed(bad)}. A weights file is damaged (a bit flipped inside it: {_REDOWNLOAD}), or the checkpoint was "
        "saved after training diverged"
    )


def _json_problem(path) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            json.load(f)
    except ValueError as error:  # json.JSONDecodeError and UnicodeDecodeError
        return _corrupt(path, f"not valid JSON: {error}")
    return None


def _index_shards(index_path) -> list[str]:
    """The shard file names a `*.index.json` weight index lists; `OSError` when the index is unreadable."""
    problem = _json_problem(index_path)
    if problem is not None:
        raise OSError(problem)
    with open(index_path, encoding="utf-8") as f:
        index = json.load(f)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise OSError(_corrupt(index_path, "it has no weight_map naming the shard files"))
    return sorted(set(weight_map.values()))


def _missing_shard(index_path, shard: str) -> str:
    return (
        f"{index_path} names the weight file {shard}, which is missing from {os.path.dirname(index_path)}: the "
        f"checkpoint is incomplete; {_REDOWNLOAD}"
    )


def missing_config_problem(name_or_path, **hub_kwargs) -> str | None:
    """
    Before loading a model from a local folder without an explicit `config=`: a sentence naming the missing
    `config.json`, or `None` when it is there (or `name_or_path` is not a local folder, a Hub name whose files
    transformers resolves itself).

    transformers' `PretrainedConfig.from_pretrained` returns a default config for a folder without `config.json`, so
    the model would be built at the default sizes and the weights then reported as a shape mismatch (or, where the
    sizes happen to fit, loaded into a model of the wrong kind).
    """
    subfolder = hub_kwargs.get("subfolder") or ""
    folder = os.path.join(str(name_or_path), subfolder)
    if not os.path.isdir(folder) or os.path.isfile(os.path.join(folder, "config.json")):
        return None
    present = sorted(os.listdir(folder))
    return (
        f"pretrained_model_name_or_path ({str(name_or_path)!r}) has no config.json"
        + (f" in subfolder {subfolder!r}" if subfolder else "")
        + f" (it holds: {', '.join(present[:8]) + (', ...' if len(present) > 8 else '') or 'nothing'}): the model's "
        "sizes and kind are read from it. Copy config.json back from where the folder came from, save the model "
        "again with save_pretrained, or pass config= explicitly"
    )


def find_checkpoint_problem(
    name_or_path, use_safetensors: bool | None = None, weights: bool = True, **hub_kwargs
) -> str | None:
    """
    After a failed load, the first file of the checkpoint that explains it: `config.json` that is not valid JSON, a
    weight index that is not valid JSON or names a shard that is not in the (local) folder, or a truncated or corrupt
    weights file (see `safetensors_file_problem`).

    Looks only at files already on disk (a local folder, or the Hugging Face cache for a Hub name): never downloads,
    never raises.

    Args:
        name_or_path: Hub model id or local folder.
        use_safetensors: `False` also inspects pickled `pytorch_model.bin` files.
        weights: also inspect the weight index and weight files (else `config.json` only).
        **hub_kwargs: `cache_dir`, `revision`, `subfolder` locate the files; other options are ignored.

    Returns:
        `str | None`: a sentence naming the file, what is wrong and what to do, or `None` if no file explains it.
    """
    kwargs = {k: v for k, v in hub_kwargs.items() if k in _LOCATE_KWARGS and v is not None}
    local_folder = os.path.isdir(os.path.join(str(name_or_path), kwargs.get("subfolder") or ""))

    def local(filename):
        return cached_file(
            name_or_path,
            filename,
            local_files_only=True,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **kwargs,
        )

    try:
        config = local("config.json")
        if config is not None and (problem := _json_problem(config)) is not None:
            return problem
        if not weights:
            return None
        for filename in SAFETENSORS_FILES + (PICKLE_FILES if use_safetensors is False else ()):
            resolved = local(filename)
            if resolved is None:
                continue
            if not filename.endswith(".index.json"):
                return weights_file_problem(resolved)
            try:
                shards = _index_shards(resolved)
            except OSError as error:
                return str(error)
            for shard in shards:
                shard_path = local(shard)
                if shard_path is None:
                    if local_folder:
                        return _missing_shard(resolved, shard)
                    continue  # a Hub repository: transformers downloads what the cache lacks
                if (problem := weights_file_problem(shard_path)) is not None:
                    return problem
            return None
    except Exception:  # a diagnosis only: the caller re-raises its original error
        return None
    return None


# File names that mark pickled PyTorch weights, which are read only with an explicit `use_safetensors=False`.
_PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def refuse_pickled_weights(name_or_path, subfolder: str = "") -> None:
    """Raise `ValueError` when the local folder or file `name_or_path` has only pickled weights (no safetensors)."""
    path = os.path.join(str(name_or_path), subfolder) if subfolder else str(name_or_path)
    if os.path.isdir(path):
        if any(f.endswith(".safetensors") or f.endswith(".safetensors.index.json") for f in os.listdir(path)):
            return
        pickled = [name for name in PICKLE_FILES if os.path.isfile(os.path.join(path, name))]
    else:
        pickled = [path] if os.path.isfile(path) and path.endswith(_PICKLED_SUFFIXES) else []
    if pickled:
        raise ValueError(
            f"pretrained_model_name_or_path ({str(name_or_path)!r}) holds only pickled PyTorch weights ({pickled[0]}), "
            "which seqbert does not load by default because unpickling can run code: pass use_safetensors=False if "
            "you trust the file, then `save_pretrained` writes safetensors"
        )


# ----------------------------------------------------------------------------------------------------------------------
# Checking what loaded: shape mismatches and parameters left at their random initialisation
# ----------------------------------------------------------------------------------------------------------------------

# How many parameter names an error message lists before "(and N more)".
_LISTED = 5
# Config fields that set each parameter's shape (first matching pattern wins).
_SHAPE_FIELDS = (
    (re.compile(r"word_embeddings\.|^lm_head\.decoder\."), ("vocab_size", "hidden_size")),
    (re.compile(r"position_embeddings\."), ("max_position_embeddings", "hidden_size")),
    (re.compile(r"token_type_embeddings\."), ("type_vocab_size", "hidden_size")),
    (re.compile(r"\.mlp\.(up|down)_proj\."), ("intermediate_size", "hidden_size")),
    (re.compile(r"^(classifier|qa_outputs)\."), ("num_labels", "hidden_size")),
    (re.compile(r""), ("hidden_size",)),
)
_SHAPE_FIELD_NAMES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "num_labels",
)


def _listed(names: list[str]) -> str:
    more = f" (and {len(names) - _LISTED} more)" if len(names) > _LISTED else ""
    return ", ".join(names[:_LISTED]) + more


def _shape_field_values(config) -> dict:
    """The shape-setting fields of a config object or a `config.json` dict (`None` where absent)."""
    if config is None:
        return {}
    if isinstance(config, dict):
        values = {field: config.get(field) for field in _SHAPE_FIELD_NAMES}
        if config.get("id2label"):
            values["num_labels"] = len(config["id2label"])
        return values
    return {field: getattr(config, field, None) for field in _SHAPE_FIELD_NAMES}


def checkpoint_config_dict(name_or_path, **hub_kwargs) -> dict | None:
    """The checkpoint's `config.json` as a dict (from disk or the Hub cache only), or `None` if it cannot be read."""
    kwargs = {k: v for k, v in hub_kwargs.items() if k in _LOCATE_KWARGS and v is not None}
    try:
        config, _ = PretrainedConfig.get_config_dict(name_or_path, local_files_only=True, **kwargs)
    except Exception:  # only used to word an error message
        return None
    return config


class MismatchedSizesError(RuntimeError, ValueError):
    """
    Checkpoint parameters have another shape than the model's. A `RuntimeError`, as transformers raises for a size
    mismatch in `from_pretrained` (code that catches that keeps working), and a `ValueError`, since a config value
    (an override, or a `config=` that does not fit the checkpoint) is its usual cause.
    """


def mismatched_sizes_error(mismatched_keys, config, checkpoint_config, where: str) -> MismatchedSizesError:
    """
    The `MismatchedSizesError` for parameters whose checkpoint shape differs from the model's.

    Args:
        mismatched_keys: `(name, checkpoint shape, model shape)` triples, as in transformers' loading info.
        config: the model's config.
        checkpoint_config: the checkpoint's config (object or `config.json` dict), or `None` if unknown; fields whose
            values differ from `config`'s are named as the likely cause.
        where: the call, for the message (e.g. `"SeqBertModel.from_pretrained('folder')"`).
    """
    rows = sorted((name, tuple(ckpt), tuple(model)) for name, ckpt, model in mismatched_keys)
    shown = [f"{name}: checkpoint {ckpt} vs model {model}" for name, ckpt, model in rows]
    fields = dict.fromkeys(
        field for name, _, _ in rows for field in next(f for p, f in _SHAPE_FIELDS if p.search(name))
    )
    model_values, checkpoint_values = _shape_field_values(config), _shape_field_values(checkpoint_config)
    differing = [
        field
        for field in fields
        if checkpoint_values.get(field) is not None and checkpoint_values[field] != model_values.get(field)
    ]
    if differing:
        cause = ", ".join(
            f"{field}={model_values[field]!r} (the checkpoint's config has {checkpoint_values[field]!r})"
            for field in differing
        )
    else:
        cause = "the config fields these shapes come from: " + ", ".join(
            f"{field}={model_values.get(field)!r}" for field in fields
        )
    return MismatchedSizesError(
        f"{where}: {len(rows)} parameter(s) of the checkpoint have another shape than in the model built from the "
        f"config: {'; '.join(shown[:_LISTED])}{f' (and {len(rows) - _LISTED} more)' if len(rows) > _LISTED else ''}. "
        f"Likely cause: {cause}. Pretrained weights load only into the sizes they were trained with: drop the "
        "override (or the config=) that changes them, or pass ignore_mismatched_sizes=True to initialise these "
        "parameters randomly instead (e.g. for a classifier with another number of labels)"
    )
