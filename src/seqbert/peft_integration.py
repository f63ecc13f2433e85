"""PEFT integration: SeqBERT's default adapter targets in peft's tables, registered when peft is imported.

PEFT picks the modules an adapter targets by default from tables keyed by `model_type` (`peft.utils.constants`: LoRA
adapts BERT's ["query", "value"]). SeqBERT gets BERT's entries under its own names, so `LoraConfig(task_type=...)`
without `target_modules` adapts queries and values, as it does for BERT. BERT's "output.dense" matches both the
attention output and the feed-forward output; SeqBERT calls them `out_proj` and `down_proj`.

An integration with another library, not part of the model, so it sits apart from `modeling_seqbert.py`. The modeling
file imports it relatively and calls `register_peft_target_modules_on_import()` when it is imported, so the entries are
there for users of the package and for `trust_remote_code=True` users of a saved folder (which carries this file)
alike. peft stays optional: it is imported by name only (transformers' remote-code loader requires every package that
a modeling file's import statements name), and only when the user imports it.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


_BERT_TO_SEQBERT_MODULES = {
    "query": ["query"],
    "key": ["key"],
    "value": ["value"],
    "output.dense": ["out_proj", "down_proj"],
}


def register_peft_target_modules(constants=None) -> None:
    """
    Add `"seqbert"` to every PEFT table of default target modules that has a `"bert"` entry, with SeqBERT's module
    names for BERT's. Runs by itself when `peft.utils.constants` is imported (or at once, if it already was), so
    users never call it; calling it again changes nothing.

    Args:
        constants (module, *optional*): `peft.utils.constants`; imported when None.
    """
    if constants is None:
        # Not an import statement: transformers' remote-code loader requires every package a modeling file imports.
        constants = importlib.import_module("peft.utils.constants")
    for name, table in vars(constants).items():
        if not (name.startswith("TRANSFORMERS_MODELS_TO_") and isinstance(table, dict)):
            continue
        bert_modules = table.get("bert")
        if isinstance(bert_modules, list) and all(module in _BERT_TO_SEQBERT_MODULES for module in bert_modules):
            table.setdefault("seqbert", [m for module in bert_modules for m in _BERT_TO_SEQBERT_MODULES[module]])


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs `callback(module)` right after `module_name` is first imported: a post-import hook, which importlib lacks.
    It finds the real module spec through the other finders and wraps its loader's `exec_module`. Shared by the
    integrations that register SeqBERT with an optional library when that library is imported (peft here,
    CTranslate2 in `ctranslate2_loader`, optimum in `optimum_export`); it lives in this file because this one is
    copied into saved folders."""

    def __init__(self, module_name: str, callback: Callable):
        self.module_name, self.callback = module_name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_callback(module):
                exec_module(module)
                self.callback(module)

            spec.loader.exec_module = exec_then_callback
        return spec


def register_peft_target_modules_on_import() -> None:
    """Run `register_peft_target_modules` now if `peft.utils.constants` was already imported, else right after it is
    first imported (when peft is installed at all). `modeling_seqbert` calls it once, on import."""
    if "peft.utils.constants" in sys.modules:
        register_peft_target_modules(sys.modules["peft.utils.constants"])
    elif importlib.util.find_spec("peft") is not None:
        sys.meta_path.insert(0, AfterImport("peft.utils.constants", register_peft_target_modules))
