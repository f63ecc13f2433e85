"""CTranslate2 integration: a loader that lets CTranslate2's own converter convert SeqBERT encoder folders.

`ctranslate2.converters.TransformersConverter(folder).convert(output_dir)` picks a loader by the class name of the
folder's config (`config.__class__.__name__`, so "SeqBertConfig" whether the class comes from the installed package or
from the folder's remote code) among those registered with `ctranslate2.converters.transformers.register_loader`.
`SeqBertLoader` is CTranslate2's `BertLoader` (vocabulary and config handling reused) with SeqBERT's parameter names,
and it fills CTranslate2's `TransformerEncoderSpec` for every SeqBERT encoder:

- post-LN (`pre_norm=False`, as BERT) and pre-LN (`pre_norm=True`, whose final LayerNorm is the spec's `layer_norm`);
- learned positions (the table) and sinusoidal ones (seqbert's own sinusoids, written as a table of
  `max_position_embeddings` rows: the converted model takes sequences up to that length);
- `scale_embedding` (sqrt(hidden_size) folded into the word embedding table: CTranslate2 would scale the sum of word
  and segment embeddings, SeqBERT scales the word embeddings only);
- with or without segment embeddings (`type_vocab_size` 0), with or without the BERT pooler.

Any folder whose encoder `AutoModel` loads converts: `SeqBertModel`, the encoder heads (`SeqBertForMaskedLM`,
`SeqBertFor{Sequence,Token}Classification`, `SeqBertForQuestionAnswering`, `SeqBertForMultipleChoice`) and the
encoder of a `SeqBertForConditionalGeneration`. CTranslate2's encoder model returns `last_hidden_state` and, when the
checkpoint has a pooler, `pooler_output`; it has no slot for the heads (LM head, classifiers), so those are not
converted (as CTranslate2's own `BertLoader` does for BERT heads). A folder without pooler weights (masked LM, token
classification, question answering, seq2seq) converts without a pooler rather than with a random one.

Registration costs nothing where CTranslate2 is not installed: `register_ctranslate2_loader_on_import()` registers the
loader right after `ctranslate2.converters.transformers` is first imported (at once if it already was), the way
`peft_integration` adds SeqBERT's PEFT targets. `main` is `ct2-transformers-converter` with the loader registered (the
stock command runs in a process that never imports seqbert): `python -c "from seqbert.ctranslate2_loader import main;
main()" --model FOLDER --output_dir OUT` (not `python -m`: the package imports this module first, and runpy warns).
"""

import functools
import importlib
import importlib.util
import sys

import torch
from transformers import AutoModel

from .peft_integration import AfterImport


CTRANSLATE2_MODULE = "ctranslate2.converters.transformers"
# The key CTranslate2's TransformersConverter looks loaders up by: the config's class name.
SEQBERT_CONFIG_NAME = "SeqBertConfig"
# Head classes whose encoder is built with BERT's pooler (`add_pooling_layer=True`), so their folders carry its weights.
_ARCHITECTURES_WITH_POOLER = ("SeqBertModel", "SeqBertForSequenceClassification", "SeqBertForMultipleChoice")
# Decoder-only: causal self-attention and no encoder, which CTranslate2's encoder spec cannot express.
_DECODER_ONLY_ARCHITECTURES = ("SeqBertForCausalLM",)


def _import_ctranslate2_converters():
    """`ctranslate2.converters.transformers`, or one `ImportError` line naming the install command."""
    if importlib.util.find_spec("ctranslate2") is None:
        raise ImportError("CTranslate2 conversion needs ctranslate2, which is not installed: pip install ctranslate2")
    # Not an import statement: seqbert imports this file whether or not ctranslate2 is installed.
    return importlib.import_module(CTRANSLATE2_MODULE)


def check_ctranslate2_convertible(config, supported_activations) -> None:
    """
    Refuse a SeqBERT config that CTranslate2's Transformer encoder cannot compute.

    Args:
        config (`SeqBertConfig`): the folder's configuration (the package's class or the folder's remote-code copy).
        supported_activations (`dict`): the `hidden_act` names CTranslate2's converter maps to its activations
            (`ctranslate2.converters.transformers._SUPPORTED_ACTIVATIONS`).

    Raises:
        ValueError: one line naming the field, its value and what CTranslate2 lacks: a decoder-only
            `SeqBertForCausalLM` folder, `num_hidden_layers` 0, or a `hidden_act` CTranslate2 does not implement.
    """
    architectures = getattr(config, "architectures", None) or []
    decoder_only = [name for name in architectures if name in _DECODER_ONLY_ARCHITECTURES]
    if decoder_only:
        raise ValueError(
            f"config.architectures ({architectures}) is a decoder-only model: CTranslate2's encoder has no causal "
            "self-attention and its decoder no BERT LM head; only SeqBERT encoders (SeqBertModel and the encoder "
            "heads) convert"
        )
    if config.num_hidden_layers < 1:
        raise ValueError(
            f"num_hidden_layers ({config.num_hidden_layers}) must be >= 1: CTranslate2's encoder needs at least one layer"
        )
    if config.hidden_act not in supported_activations:
        raise ValueError(
            f"hidden_act ({config.hidden_act!r}) has no CTranslate2 activation; CTranslate2 implements "
            f"{sorted(supported_activations)}"
        )


class _SeqBertEncoderCheckpoint:
    """What CTranslate2's converter calls `from_pretrained` on (through `SeqBertLoader.get_model_class`): the encoder
    of a SeqBERT folder (`SeqBertModel`), loaded with `AutoModel` as `AutoModel.from_pretrained(folder)` loads it,
    with its pooler only when the checkpoint has one."""

    @staticmethod
    def from_pretrained(pretrained_model_name_or_path, config, **kwargs):
        """
        Args:
            pretrained_model_name_or_path (`str` or `os.PathLike`): the folder (or Hub name) the converter was given.
            config (`SeqBertConfig`): its configuration, as the converter loaded it.
            **kwargs: what the converter passes on to `from_pretrained` (`dtype`, `trust_remote_code`, `revision`,
                `low_cpu_mem_usage`).

        Returns:
            `SeqBertModel`: the encoder, with `pooler` None when the checkpoint holds no pooler weights.

        Raises:
            ValueError: the checkpoint lacks encoder weights (it is not a SeqBERT encoder checkpoint); the message
                names the folder and the first missing parameters.
        """
        architectures = getattr(config, "architectures", None) or []
        with_pooler = not architectures or any(name in _ARCHITECTURES_WITH_POOLER for name in architectures)
        model, loading_info = AutoModel.from_pretrained(
            pretrained_model_name_or_path,
            config=config,
            add_pooling_layer=with_pooler and not config.is_encoder_decoder,
            output_loading_info=True,
            **kwargs,
        )
        missing = sorted(loading_info["missing_keys"])
        missing_encoder = [name for name in missing if not name.startswith("pooler.")]
        if missing_encoder:
            raise ValueError(
                f"{pretrained_model_name_or_path} holds no weights for {len(missing_encoder)} SeqBertModel parameters "
                f"(first: {missing_encoder[:3]}): it is not a SeqBERT encoder checkpoint"
            )
        if missing:  # only the pooler: a folder saved without one (a SeqBertModel built with add_pooling_layer=False)
            model.pooler = None
        return model


@functools.cache
def seqbert_loader_class(ct2_transformers):
    """
    The CTranslate2 loader class for SeqBERT, built on the given `ctranslate2.converters.transformers` module (a
    subclass of its `BertLoader`; defined here because this file must import without ctranslate2).

    Returns:
        `type`: `SeqBertLoader`, to register with `ct2_transformers.register_loader("SeqBertConfig")`.
    """
    from ctranslate2.converters import utils
    from ctranslate2.specs import common_spec, transformer_spec

    class SeqBertLoader(ct2_transformers.BertLoader):
        """CTranslate2's `BertLoader` for SeqBERT encoders: `TransformerEncoderSpec` with `pre_norm` from
        `norm_placement`, the encoder and pooler weights under SeqBERT's names. Vocabulary (the folder's tokenizer,
        padded with `<extra_id_N>` up to `vocab_size`) and config (`unk_token`, `layer_norm_epsilon`) as BERT's."""

        @property
        def architecture_name(self):
            # The converter looks this name up in `transformers` before `get_model_class` replaces the class.
            return "AutoModel"

        def get_model_class(self, config, default_class):
            check_ctranslate2_convertible(config, ct2_transformers._SUPPORTED_ACTIVATIONS)
            return _SeqBertEncoderCheckpoint

        def get_model_spec(self, model):
            config, embeddings = model.config, model.embeddings
            with_token_types = embeddings.token_type_embeddings is not None
            encoder_spec = transformer_spec.TransformerEncoderSpec(
                config.num_hidden_layers,
                config.num_attention_heads,
                pre_norm=config.norm_placement == "pre",  # pre-LN: the spec's `layer_norm` is the final LayerNorm
                activation=ct2_transformers._SUPPORTED_ACTIVATIONS[config.hidden_act],
                num_source_embeddings=2 if with_token_types else 1,
                embeddings_merge=common_spec.EmbeddingsMerge.ADD,
                layernorm_embedding=True,
            )
            spec = transformer_spec.TransformerEncoderModelSpec(
                encoder_spec, pooling_layer=model.pooler is not None, pooling_activation=common_spec.Activation.Tanh
            )

            # CTranslate2 computes (word + segment) * scale + position; SeqBERT computes word * scale + segment +
            # position. Scaling the word table instead gives SeqBERT's sum (the same float multiply per element).
            spec.encoder.scale_embeddings = False
            spec.encoder.embeddings[0].weight = embeddings.word_embeddings.weight * embeddings.embed_scale
            if with_token_types:
                self.set_embeddings(spec.encoder.embeddings[1], embeddings.token_type_embeddings)
            if config.position_embedding_type == "learned":
                self.set_position_encodings(spec.encoder.position_encodings, embeddings.position_embeddings)
            else:  # SeqBERT's sinusoids as a table; CTranslate2's own sinusoids are laid out differently
                positions = torch.arange(config.max_position_embeddings).unsqueeze(0)  # (1, max_position_embeddings)
                spec.encoder.position_encodings.encodings = embeddings.position_embeddings(positions)[0]  # (P, H)
            self.set_layer_norm(spec.encoder.layernorm_embedding, embeddings.layer_norm)

            for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers, strict=True):
                attention = layer.attention
                qkv = [common_spec.LinearSpec() for _ in range(3)]
                for linear_spec, linear in zip(qkv, (attention.query, attention.key, attention.value), strict=True):
                    self.set_linear(linear_spec, linear)
                utils.fuse_linear(layer_spec.self_attention.linear[0], qkv)
                self.set_linear(layer_spec.self_attention.linear[1], attention.out_proj)
                self.set_layer_norm(layer_spec.self_attention.layer_norm, layer.attention_norm)
                self.set_linear(layer_spec.ffn.linear_0, layer.mlp.up_proj)
                self.set_linear(layer_spec.ffn.linear_1, layer.mlp.down_proj)
                self.set_layer_norm(layer_spec.ffn.layer_norm, layer.mlp_norm)
            if config.norm_placement == "pre":
                self.set_layer_norm(spec.encoder.layer_norm, model.encoder.final_layer_norm)

            if model.pooler is not None:
                self.set_linear(spec.pooler_dense, model.pooler.dense)
            return spec

    return SeqBertLoader


def register_ctranslate2_loader(ct2_transformers=None):
    """
    Register `SeqBertLoader` with CTranslate2, so `ctranslate2.converters.TransformersConverter` converts SeqBERT
    folders. `register_ctranslate2_loader_on_import` runs it when seqbert is imported and CTranslate2 is installed;
    calling it again changes nothing.

    Args:
        ct2_transformers (module, *optional*): `ctranslate2.converters.transformers`; imported when None.

    Returns:
        module: `ctranslate2.converters.transformers`, with "SeqBertConfig" in its loaders.

    Raises:
        ImportError: ctranslate2 is not installed (one line with the install command).
    """
    if ct2_transformers is None:
        ct2_transformers = _import_ctranslate2_converters()
    ct2_transformers.register_loader(SEQBERT_CONFIG_NAME)(seqbert_loader_class(ct2_transformers))
    return ct2_transformers


def register_ctranslate2_loader_on_import() -> None:
    """Run `register_ctranslate2_loader` now if `ctranslate2.converters.transformers` was already imported, else
    right after it is first imported (when ctranslate2 is installed at all; nothing is imported here)."""
    if CTRANSLATE2_MODULE in sys.modules:
        register_ctranslate2_loader(sys.modules[CTRANSLATE2_MODULE])
    elif importlib.util.find_spec("ctranslate2") is not None:
        sys.meta_path.insert(0, AfterImport(CTRANSLATE2_MODULE, register_ctranslate2_loader))


def main() -> None:
    """
    `ct2-transformers-converter` (CTranslate2's command line, same arguments) with the SeqBERT loader registered.

    Usage:
        python -c "from seqbert.ctranslate2_loader import main; main()" --model SEQBERT_FOLDER \
            --output_dir CT2_FOLDER [--quantization int8] [--force]

    Raises:
        ImportError: ctranslate2 is not installed.
        RuntimeError: `--output_dir` exists and `--force` is not given (CTranslate2's own check).
    """
    register_ctranslate2_loader().main()


if __name__ == "__main__":
    main()
