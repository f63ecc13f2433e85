"""SeqBERT model configuration.

This file is copied verbatim into every saved model folder (``save_pretrained``/``push_to_hub``) so that
``trust_remote_code=True`` users can load the model without installing seqbert: it may import only
``transformers`` and the standard library.
"""

import copy
import math

import transformers
from transformers import PretrainedConfig


# The seqbert release; the package's version (pyproject.toml reads it here, `seqbert.__version__` is it), and saved
# folders record it in config.json as `seqbert_version`.
SEQBERT_VERSION = "0.3.0"
# The oldest transformers release SeqBERT's code runs on; folders are checked against each 5.x release
# (scripts/checks/check_transformers_versions.py).
MIN_TRANSFORMERS_VERSION = "5.0.0"


def check_transformers_version() -> None:
    """
    Raises:
        ImportError: the installed transformers is older than `MIN_TRANSFORMERS_VERSION`; one line that names the
            version needed and how to get it (instead of an import error from inside this code).
    """
    if int(transformers.__version__.split(".")[0]) < int(MIN_TRANSFORMERS_VERSION.split(".")[0]):
        raise ImportError(
            f"SeqBERT models need transformers >= {MIN_TRANSFORMERS_VERSION}, but transformers "
            f"{transformers.__version__} is installed: pip install -U 'transformers>={MIN_TRANSFORMERS_VERSION}'"
        )


check_transformers_version()


NORM_PLACEMENTS = ("pre", "post")
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal")
# What each decoder layer's cross-attention reads: the encoder's output (BERT2BERT) or the encoder layer of its depth.
CROSS_ATTENTION_SOURCES = ("last_layer", "same_layer")

# The `auto_map` that `save_pretrained` writes into config.json, so that `AutoConfig` / `AutoModel*.from_pretrained(
# folder_or_repo, trust_remote_code=True)` find SeqBERT's classes in the code files saved beside the weights.
# Encoder heads fit every SeqBERT config (they load the encoder); `AutoModelForSeq2SeqLM` fits seq2seq configs only,
# `AutoModelForCausalLM` (decoder-only) the others.
ENCODER_AUTO_MAP = {
    "AutoConfig": "configuration_seqbert.SeqBertConfig",
    "AutoModel": "modeling_seqbert.SeqBertModel",
    "AutoModelForMaskedLM": "modeling_seqbert.SeqBertForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_seqbert.SeqBertForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_seqbert.SeqBertForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_seqbert.SeqBertForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_seqbert.SeqBertForMultipleChoice",
}
SEQ2SEQ_AUTO_MAP = {"AutoModelForSeq2SeqLM": "modeling_seqbert.SeqBertForConditionalGeneration"}
CAUSAL_LM_AUTO_MAP = {"AutoModelForCausalLM": "modeling_seqbert.SeqBertForCausalLM"}


def _check_int(name: str, value, minimum: float) -> None:
    """Raise `TypeError`/`ValueError` unless `value` is an int (not a bool) that is at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} ({value}) must be >= {minimum}")


def _check_probability(name: str, value) -> None:
    """Raise unless `value` is a real number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {value!r} of type {type(value).__name__}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} ({value}) must be in [0, 1)")


def _check_positive_float(name: str, value) -> None:
    """Raise unless `value` is a finite real number > 0 (an infinite `initializer_range` makes NaN weights)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {value!r} of type {type(value).__name__}")
    if not 0 < value < math.inf:
        raise ValueError(f"{name} ({value}) must be > 0 and finite")


_SPECIAL_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
# Special ids that must name a real token (the others may be negative: no such token).
_REAL_TOKEN_IDS = ("decoder_start_token_id",)
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def _check_labels(fields: dict) -> None:
    """Check `num_labels` (an int >= 1; None too is refused, which transformers would fail on with a bare
    `TypeError` from `range`) and `problem_type` (None or one of `PROBLEM_TYPES`) where `fields` has them."""
    if "num_labels" in fields:
        _check_int("num_labels", fields["num_labels"], 1)
    problem_type = fields.get("problem_type")
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise ValueError(f"problem_type ({problem_type!r}) must be None or one of {PROBLEM_TYPES}")


class SeqBertConfig(PretrainedConfig):
    r"""
    Configuration of a SeqBERT model: a BERT-style Transformer encoder (and, for
    `SeqBertForConditionalGeneration`, a decoder of the same width).

    Defaults are the bert-base sizes with pre-LayerNorm layers (`norm_placement="pre"`), the placement that
    trains stably without warm-up (Xiong et al. 2020, "On Layer Normalization in the Transformer
    Architecture"). Use `SeqBertConfig.from_bert_config` for the post-LayerNorm equivalent of a BERT
    checkpoint.

    Args:
        vocab_size (`int`, defaults to 30522): number of token ids; ids must lie in `[0, vocab_size)`.
        hidden_size (`int`, defaults to 768): width of embeddings and hidden states.
        num_hidden_layers (`int`, defaults to 12): number of encoder layers.
        num_decoder_layers (`int`, *optional*): number of decoder layers of a seq2seq model; defaults to
            `num_hidden_layers`.
        num_attention_heads (`int`, defaults to 12): attention heads per layer; must divide `hidden_size`.
        intermediate_size (`int`, defaults to 3072): inner width of the feed-forward block.
        hidden_act (`str`, defaults to `"gelu"`): feed-forward activation, a key of `transformers.activations.ACT2FN`.
        hidden_dropout_prob (`float`, defaults to 0.1): dropout on embeddings and on each sub-layer output.
        attention_probs_dropout_prob (`float`, defaults to 0.1): dropout on attention probabilities.
        max_position_embeddings (`int`, defaults to 512): longest sequence the learned position table covers
            (and the size of the precomputed sinusoid table).
        type_vocab_size (`int`, defaults to 2): number of segment (token type) ids; 0 disables the segment embedding.
        initializer_range (`float`, defaults to 0.02): std of the normal init of linear and embedding weights.
        layer_norm_eps (`float`, defaults to 1e-12): LayerNorm epsilon (BERT's value).
        norm_placement (`str`, defaults to `"pre"`): `"pre"`: `x + f(LN(x))` with a final LayerNorm after the last
            layer; `"post"`: `LN(x + f(x))` as in BERT (needed to load BERT weights).
        position_embedding_type (`str`, defaults to `"learned"`): `"learned"` (BERT's table) or `"sinusoidal"`
            (fixed table of "Attention Is All You Need" §3.5).
        scale_embedding (`bool`, defaults to `False`): multiply word embeddings by sqrt(hidden_size) ("Attention Is
            All You Need" §3.4).
        classifier_dropout (`float`, *optional*): dropout before classification heads; defaults to
            `hidden_dropout_prob`, as in BERT.
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id (`int`, *optional*): special token ids,
            each below `vocab_size`. A negative `pad_token_id`, `bos_token_id` or `eos_token_id` means the model has
            no such token, as in transformers (which warns about it): `generate` then never stops early, and no
            embedding row is reserved for padding. `decoder_start_token_id` must be a token id `>= 0`.
        tie_word_embeddings (`bool`, defaults to `True`): tie the LM head decoder to the (decoder's) word embeddings.
        is_encoder_decoder (`bool`, defaults to `False`): `True` for `SeqBertForConditionalGeneration` configs.
        share_encoder_decoder_embeddings (`bool`, defaults to `False`): seq2seq only: the decoder uses the encoder's
            word embedding matrix (and so does the tied LM head). Requires `tie_word_embeddings`. BERT2BERT
            checkpoints keep two matrices (`False`).
        use_cache (`bool`, defaults to `True`): seq2seq only: return the decoder's key/value cache for generation.
        cross_attention_source (`str`, defaults to `"last_layer"`): seq2seq only: what the cross-attention of decoder
            layer `i` reads. `"last_layer"`: the encoder's output, in every decoder layer (transformers'
            `EncoderDecoderModel`, Rothe et al. 2020). `"same_layer"`: the hidden states that enter encoder layer `i`
            (the embeddings for `i = 0`), so a decoder layer warm-started from BERT layer `i` attends over source
            states of the depth it was trained on (in the spirit of He et al. 2018, "Layer-Wise Coordination between
            Encoder and Decoder for Neural Machine Translation"; this pairing is seqbert's own). Needs
            `num_decoder_layers <= num_hidden_layers`. `SeqBertForConditionalGeneration.from_bert_pretrained` uses it.
        sparse_prediction (`bool`, defaults to `False`): `SeqBertForMaskedLM` only: when `labels` are given, score only
            the positions that carry a label (not -100) against the vocabulary, and return `logits` of shape (M, V)
            for those M positions, in row-major order, instead of (B, L, V); the loss and its gradients are those of
            dense scoring up to the order of float sums. "Sparse token prediction" of Geiping & Goldstein 2023, "Cramming: Training a Language
            Model on a Single GPU in One Day", §4.2 (head block); the field name and behaviour are those of transformers'
            `ModernBertConfig.sparse_prediction`. Without `labels` (the fill-mask pipeline) logits stay (B, L, V).
        num_labels (`int`, defaults to 2), problem_type (`str`, *optional*): as in `PretrainedConfig`; `num_labels`
            must be >= 1 and `problem_type` one of `PROBLEM_TYPES` (`SeqBertForQuestionAnswering` needs
            `num_labels == 2`: start and end).

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field has a value outside what is allowed; the message names the field and the value.
    """

    model_type = "seqbert"

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_decoder_layers: int | None = None,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-12,
        norm_placement: str = "pre",
        position_embedding_type: str = "learned",
        scale_embedding: bool = False,
        classifier_dropout: float | None = None,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        decoder_start_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        is_encoder_decoder: bool = False,
        share_encoder_decoder_embeddings: bool = False,
        use_cache: bool = True,
        cross_attention_source: str = "last_layer",
        sparse_prediction: bool = False,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_decoder_layers = num_hidden_layers if num_decoder_layers is None else num_decoder_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.norm_placement = norm_placement
        self.position_embedding_type = position_embedding_type
        self.scale_embedding = scale_embedding
        self.classifier_dropout = classifier_dropout
        self.share_encoder_decoder_embeddings = share_encoder_decoder_embeddings
        self.use_cache = use_cache
        self.cross_attention_source = cross_attention_source
        self.sparse_prediction = sparse_prediction
        # Validate before PretrainedConfig.__init__, whose own checks would fail with less helpful messages.
        self._validate_seqbert(
            tie_word_embeddings=tie_word_embeddings,
            is_encoder_decoder=is_encoder_decoder,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            decoder_start_token_id=decoder_start_token_id,
        )
        _check_labels(kwargs)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            decoder_start_token_id=decoder_start_token_id,
            tie_word_embeddings=tie_word_embeddings,
            is_encoder_decoder=is_encoder_decoder,
            **kwargs,
        )

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs) -> None:
        """
        `PretrainedConfig.save_pretrained`, plus `seqbert_version` (the release writing the folder) and the complete
        `auto_map` (every Auto class that fits this config,
        see `ENCODER_AUTO_MAP`, `SEQ2SEQ_AUTO_MAP`, `CAUSAL_LM_AUTO_MAP`) when the config is saved as remote code (always, for SeqBERT:
        the class is registered for `AutoConfig` below). transformers alone would record only the class being saved,
        and `AutoModel` on such a folder would then fail with "Unrecognized configuration class".
        """
        if self._auto_class is not None:
            self.auto_map = {**(getattr(self, "auto_map", None) or {}), **self.remote_code_auto_map()}
        self.seqbert_version = SEQBERT_VERSION  # which seqbert wrote the folder
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    def remote_code_auto_map(self) -> dict[str, str]:
        """`{Auto class name: "module.Class"}` for every Auto class that can load a model of this config."""
        return {**ENCODER_AUTO_MAP, **(SEQ2SEQ_AUTO_MAP if self.is_encoder_decoder else CAUSAL_LM_AUTO_MAP)}

    def validate(self) -> None:
        """
        Check every field again: `PretrainedConfig`'s own checks, then SeqBERT's (as at construction). Runs in
        `save_pretrained` and when a model is built, so fields changed after construction (`config.hidden_size = 100`,
        `from_pretrained(..., num_attention_heads=5)`) are caught before they shape a model or a saved file.

        Raises:
            TypeError: a field has the wrong type.
            ValueError: a field has a value outside what is allowed; the message names the field and the value.
        """
        if hasattr(PretrainedConfig, "validate"):  # not in transformers 5.0
            super().validate()
        self.validate_seqbert_fields()

    def validate_seqbert_fields(self) -> None:
        """SeqBERT's part of `validate` (without `PretrainedConfig`'s checks): what every SeqBERT model runs on its
        config when it is built. Raises as `validate`."""
        self._validate_seqbert(
            **{name: getattr(self, name) for name in ("tie_word_embeddings", "is_encoder_decoder", *_SPECIAL_TOKEN_IDS)}
        )
        _check_labels({"num_labels": self.num_labels, "problem_type": self.problem_type})

    def _validate_seqbert(self, tie_word_embeddings: bool, is_encoder_decoder: bool, **special_token_ids) -> None:
        """Check every SeqBERT field; raise `TypeError`/`ValueError` naming the field, its value and what is allowed."""
        _check_int("vocab_size", self.vocab_size, 1)
        _check_int("hidden_size", self.hidden_size, 1)
        _check_int("num_hidden_layers", self.num_hidden_layers, 0)
        _check_int("num_decoder_layers", self.num_decoder_layers, 0)
        _check_int("num_attention_heads", self.num_attention_heads, 1)
        _check_int("intermediate_size", self.intermediate_size, 1)
        _check_int("max_position_embeddings", self.max_position_embeddings, 1)
        _check_int("type_vocab_size", self.type_vocab_size, 0)
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        _check_probability("hidden_dropout_prob", self.hidden_dropout_prob)
        _check_probability("attention_probs_dropout_prob", self.attention_probs_dropout_prob)
        if self.classifier_dropout is not None:
            _check_probability("classifier_dropout", self.classifier_dropout)
        _check_positive_float("initializer_range", self.initializer_range)
        _check_positive_float("layer_norm_eps", self.layer_norm_eps)
        if self.norm_placement not in NORM_PLACEMENTS:
            raise ValueError(f"norm_placement ({self.norm_placement!r}) must be one of {NORM_PLACEMENTS}")
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"position_embedding_type ({self.position_embedding_type!r}) must be one of {POSITION_EMBEDDING_TYPES}"
            )
        if self.position_embedding_type == "sinusoidal" and self.hidden_size % 2 != 0:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be even with position_embedding_type='sinusoidal'")
        flags = {
            name: getattr(self, name)
            for name in ("scale_embedding", "share_encoder_decoder_embeddings", "use_cache", "sparse_prediction")
        }
        flags.update(tie_word_embeddings=tie_word_embeddings, is_encoder_decoder=is_encoder_decoder)
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r} of type {type(value).__name__}")
        if is_encoder_decoder and self.num_decoder_layers < 1:
            raise ValueError(
                f"num_decoder_layers ({self.num_decoder_layers}) must be >= 1 when is_encoder_decoder is True: the "
                "decoder reads the encoder only through its layers' cross-attention"
            )
        if self.cross_attention_source not in CROSS_ATTENTION_SOURCES:
            raise ValueError(
                f"cross_attention_source ({self.cross_attention_source!r}) must be one of {CROSS_ATTENTION_SOURCES}"
            )
        if self.cross_attention_source == "same_layer" and self.num_decoder_layers > self.num_hidden_layers:
            raise ValueError(
                f"num_decoder_layers ({self.num_decoder_layers}) must be <= num_hidden_layers "
                f"({self.num_hidden_layers}) with cross_attention_source='same_layer': decoder layer i reads the "
                "input of encoder layer i"
            )
        if self.share_encoder_decoder_embeddings and not is_encoder_decoder:
            raise ValueError(
                "share_encoder_decoder_embeddings (True) requires is_encoder_decoder (False) to be True: only a "
                "seq2seq model has a decoder to share the encoder's word embeddings with"
            )
        if self.share_encoder_decoder_embeddings and not tie_word_embeddings:
            raise ValueError(
                "share_encoder_decoder_embeddings (True) requires tie_word_embeddings (False) to be True: the shared "
                "matrix is tied through the same mechanism as the LM head"
            )
        # Imported here: transformers.activations pulls in torch, which the config module does not otherwise need.
        from transformers.activations import ACT2FN

        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACT2FN:
            raise ValueError(f"hidden_act ({self.hidden_act!r}) must be one of {sorted(ACT2FN)}")
        for name, value in special_token_ids.items():
            if value is None:
                continue
            # A negative pad / bos / eos id means "no such token", as in transformers (whose config validation warns
            # about it, and whose `generate` then never stops early on eos). A decoder start id is fed to the decoder,
            # so it must be a real token.
            _check_int(name, value, 0 if name in _REAL_TOKEN_IDS else -math.inf)
            if value >= self.vocab_size:
                raise ValueError(f"{name} ({value}) must be < vocab_size ({self.vocab_size})")

    def get_text_config(self, decoder=None, encoder=None) -> "SeqBertConfig":
        """As `PretrainedConfig.get_text_config`, but the decoder view of a seq2seq config reports the decoder's depth
        as `num_hidden_layers`, which is what `DynamicCache(config=...)` and `generate` read."""
        config = super().get_text_config(decoder=decoder, encoder=encoder)
        if decoder and not encoder and self.is_encoder_decoder and config.num_hidden_layers != self.num_decoder_layers:
            config = copy.deepcopy(config) if config is self else config
            config.num_hidden_layers = self.num_decoder_layers
        return config

    @classmethod
    def from_bert_config(cls, bert_config, **kwargs) -> "SeqBertConfig":
        """
        The post-LayerNorm SeqBERT configuration equivalent to a `transformers.BertConfig`.

        Args:
            bert_config (`transformers.BertConfig`): the BERT configuration (from `BertConfig.from_pretrained`).
            **kwargs: fields to override (for example `num_labels=2`).

        Returns:
            `SeqBertConfig` with `norm_placement="post"`, learned positions, no embedding scaling, and BERT's
            sizes, dropout, label maps and special token ids.

        Raises:
            ValueError: `bert_config` is not a BERT configuration, or uses a variant SeqBERT does not implement
                (a `position_embedding_type` other than "absolute").
        """
        model_type = getattr(bert_config, "model_type", None)
        if model_type != "bert":
            raise ValueError(
                f"bert_config must be a BERT configuration (model_type 'bert'), got model_type {model_type!r}"
            )
        bert_position_type = getattr(bert_config, "position_embedding_type", "absolute")
        if bert_position_type not in (None, "absolute"):
            raise ValueError(
                f"bert_config.position_embedding_type ({bert_position_type!r}) is not supported; only 'absolute' "
                "BERT position embeddings convert to SeqBERT"
            )
        fields = dict(
            vocab_size=bert_config.vocab_size,
            hidden_size=bert_config.hidden_size,
            num_hidden_layers=bert_config.num_hidden_layers,
            num_attention_heads=bert_config.num_attention_heads,
            intermediate_size=bert_config.intermediate_size,
            hidden_act=bert_config.hidden_act,
            hidden_dropout_prob=bert_config.hidden_dropout_prob,
            attention_probs_dropout_prob=bert_config.attention_probs_dropout_prob,
            max_position_embeddings=bert_config.max_position_embeddings,
            type_vocab_size=bert_config.type_vocab_size,
            initializer_range=bert_config.initializer_range,
            layer_norm_eps=bert_config.layer_norm_eps,
            classifier_dropout=getattr(bert_config, "classifier_dropout", None),
            pad_token_id=bert_config.pad_token_id,
            bos_token_id=getattr(bert_config, "bos_token_id", None),
            eos_token_id=getattr(bert_config, "eos_token_id", None),
            tie_word_embeddings=getattr(bert_config, "tie_word_embeddings", True),
            norm_placement="post",
            position_embedding_type="learned",
            scale_embedding=False,
            id2label=bert_config.id2label,
            label2id=bert_config.label2id,
            problem_type=getattr(bert_config, "problem_type", None),
        )
        if "num_labels" in kwargs:
            # An explicit num_labels replaces BERT's label maps rather than contradicting them.
            fields.pop("id2label")
            fields.pop("label2id")
        fields.update(kwargs)
        return cls(**fields)


# Saving a config (alone or with a model) copies this file into the folder and writes `auto_map`.
SeqBertConfig.register_for_auto_class("AutoConfig")

__all__ = ["SeqBertConfig"]
