"""SeqBertConfig: defaults, Auto registration, serialisation, validation messages, BERT equivalence."""

import pytest
from transformers import AutoConfig, BertConfig

import seqbert


def test_defaults_are_bert_base_sizes_with_pre_ln():
    config = seqbert.SeqBertConfig()
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (30522, 768, 12)
    assert (config.num_attention_heads, config.intermediate_size, config.max_position_embeddings) == (12, 3072, 512)
    assert config.norm_placement == "pre" and config.position_embedding_type == "learned"
    assert config.scale_embedding is False and config.num_decoder_layers == 12


def test_auto_config_for_model_and_round_trip(tmp_path):
    config = AutoConfig.for_model("seqbert", num_hidden_layers=4, norm_placement="post")
    assert isinstance(config, seqbert.SeqBertConfig) and config.num_hidden_layers == 4
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, seqbert.SeqBertConfig)
    assert loaded.to_diff_dict() == config.to_diff_dict()


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(hidden_size=770), ValueError, r"hidden_size \(770\) must be divisible by num_attention_heads \(12\)"),
        (dict(norm_placement="middle"), ValueError, r"norm_placement \('middle'\) must be one of \('pre', 'post'\)"),
        (dict(position_embedding_type="rotary"), ValueError, r"position_embedding_type \('rotary'\) must be one of"),
        (dict(hidden_dropout_prob=1.0), ValueError, r"hidden_dropout_prob \(1.0\) must be in \[0, 1\)"),
        (dict(attention_probs_dropout_prob=-0.1), ValueError, r"attention_probs_dropout_prob \(-0.1\) must be in"),
        (dict(classifier_dropout=2), ValueError, r"classifier_dropout \(2\) must be in"),
        (dict(vocab_size=0), ValueError, r"vocab_size \(0\) must be >= 1"),
        (dict(vocab_size=10.5), TypeError, r"vocab_size must be an int, got 10.5"),
        (dict(num_hidden_layers=True), TypeError, r"num_hidden_layers must be an int"),
        (dict(type_vocab_size=-1), ValueError, r"type_vocab_size \(-1\) must be >= 0"),
        (dict(layer_norm_eps=0), ValueError, r"layer_norm_eps \(0\) must be > 0"),
        (dict(initializer_range=-1.0), ValueError, r"initializer_range \(-1.0\) must be > 0"),
        # Found by the fuzz campaign: an infinite std initialised NaN weights.
        (dict(initializer_range=float("inf")), ValueError, r"initializer_range \(inf\) must be > 0 and finite"),
        (dict(layer_norm_eps=float("nan")), ValueError, r"layer_norm_eps \(nan\) must be > 0 and finite"),
        (dict(hidden_act="gleu"), ValueError, r"hidden_act \('gleu'\) must be one of"),
        (dict(scale_embedding="yes"), TypeError, r"scale_embedding must be a bool"),
        (dict(pad_token_id=30522), ValueError, r"pad_token_id \(30522\) must be < vocab_size \(30522\)"),
        (dict(max_position_embeddings=0), ValueError, r"max_position_embeddings \(0\) must be >= 1"),
        (
            dict(
                hidden_size=30,
                num_attention_heads=3,
                position_embedding_type="sinusoidal",
                intermediate_size=8,
                hidden_act="relu",
                num_decoder_layers=-1,
            ),
            ValueError,
            r"num_decoder_layers \(-1\)",
        ),
        (
            dict(hidden_size=33, num_attention_heads=3, position_embedding_type="sinusoidal"),
            ValueError,
            r"hidden_size \(33\) must be even",
        ),
    ],
)
def test_bad_values_name_the_field_and_what_is_allowed(kwargs, error, message):
    with pytest.raises(error, match=message):
        seqbert.SeqBertConfig(**kwargs)


def test_from_bert_config_is_post_ln_with_bert_sizes(minilm_path):
    bert = BertConfig.from_pretrained(minilm_path)
    config = seqbert.SeqBertConfig.from_bert_config(bert)
    assert (
        config.norm_placement == "post" and config.position_embedding_type == "learned" and not config.scale_embedding
    )
    for name in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "pad_token_id",
    ):
        assert getattr(config, name) == getattr(bert, name), name
    assert seqbert.SeqBertConfig.from_bert_config(bert, num_labels=3).num_labels == 3


def test_from_bert_config_rejects_other_configs():
    with pytest.raises(ValueError, match="must be a BERT configuration"):
        seqbert.SeqBertConfig.from_bert_config(seqbert.SeqBertConfig())
    with pytest.raises(ValueError, match="position_embedding_type \\('relative_key'\\) is not supported"):
        seqbert.SeqBertConfig.from_bert_config(BertConfig(position_embedding_type="relative_key"))


def test_cross_attention_source_is_checked():
    with pytest.raises(
        ValueError, match=r"cross_attention_source \('first_layer'\) must be one of \('last_layer', 'same_layer'\)"
    ):
        seqbert.SeqBertConfig(is_encoder_decoder=True, cross_attention_source="first_layer")
    with pytest.raises(
        ValueError,
        match=r"num_decoder_layers \(4\) must be <= num_hidden_layers \(3\) with cross_attention_source='same_layer'",
    ):
        seqbert.SeqBertConfig(
            num_hidden_layers=3, num_decoder_layers=4, is_encoder_decoder=True, cross_attention_source="same_layer"
        )
    assert seqbert.SeqBertConfig(is_encoder_decoder=True).cross_attention_source == "last_layer"
