"""transformers' own model tests (`ModelTesterMixin`, `ConfigTester`, from the sdist of the installed transformers:
see tests/transformers_common_tests.py) against every SeqBERT class, pre-LN and post-LN, with testers in the style of
transformers' `BertModelTester` (vocab 99, hidden 32, 2 layers, 4 heads, intermediate 37, batch 13, length 7).

The mixin finds each class's task (labels, multiple-choice inputs) by its name in transformers'
`MODEL_FOR_*_MAPPING_NAMES`; SeqBERT's classes are added there for these tests only. Each skipped common test says why
in `SKIPS`."""

import unittest

import pytest
import torch
import transformers
import transformers_common_tests
from conftest import ENCODER_HEADS, skip_module_without_package_index
from transformers.models.auto import modeling_auto

import seqbert


if not transformers_common_tests.is_cached():
    skip_module_without_package_index(
        f"transformers' own model tests (the transformers {transformers.__version__} sdist)",
        "python tests/transformers_common_tests.py",
    )
test_modeling_common, test_configuration_common = transformers_common_tests.load()
ModelTesterMixin = test_modeling_common.ModelTesterMixin
ConfigTester = test_configuration_common.ConfigTester
ids_tensor, random_attention_mask = test_modeling_common.ids_tensor, test_modeling_common.random_attention_mask

# transformers' task tables, by class name, as the mixin reads them.
TASK_TABLES = {
    "MODEL_MAPPING_NAMES": "SeqBertModel",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": "SeqBertForMaskedLM",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "SeqBertForSequenceClassification",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": "SeqBertForTokenClassification",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": "SeqBertForQuestionAnswering",
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": "SeqBertForMultipleChoice",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "SeqBertForCausalLM",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES": "SeqBertForConditionalGeneration",
}

# Common tests that do not apply to SeqBERT, each with the reason.
SKIPS = {
    "test_generation_tester_mixin_inheritance": (
        "transformers' generation tests (tests/generation/) are not in its sdist; generate is tested against "
        "EncoderDecoderModel and BertLMHeadModel ids in test_bert2bert.py, test_causal_lm.py and test_export.py, "
        "and transformers' generation conventions in test_generation_conventions.py"
    ),
}


@pytest.fixture(autouse=True, scope="module")
def seqbert_in_transformers_task_tables():
    with pytest.MonkeyPatch.context() as patch:
        for table, class_name in TASK_TABLES.items():
            patch.setitem(getattr(modeling_auto, table), seqbert.SeqBertConfig.model_type, class_name)
        yield


class SeqBertModelTester:
    """Tiny configs and random inputs for the encoder heads and the causal LM, as `BertModelTester` builds them."""

    def __init__(
        self,
        parent,
        norm_placement: str,
        batch_size=13,
        seq_length=7,
        is_training=True,
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        type_vocab_size=16,
        num_labels=3,
        num_choices=4,
    ):
        self.parent = parent
        self.norm_placement = norm_placement
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.num_labels = num_labels
        self.num_choices = num_choices

    def get_config(self, **overrides) -> seqbert.SeqBertConfig:
        fields = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_dropout_prob=self.hidden_dropout_prob,
            attention_probs_dropout_prob=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            type_vocab_size=self.type_vocab_size,
            norm_placement=self.norm_placement,
        )
        return seqbert.SeqBertConfig(**{**fields, **overrides})

    def prepare_config_and_inputs_for_common(self):
        inputs = {
            "input_ids": ids_tensor([self.batch_size, self.seq_length], self.vocab_size),
            "token_type_ids": ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size),
            "attention_mask": random_attention_mask([self.batch_size, self.seq_length]),
        }
        return self.get_config(), inputs


class SeqBertSeq2SeqModelTester(SeqBertModelTester):
    """The same sizes for SeqBertForConditionalGeneration, with decoder inputs as long as the source (as
    `BartModelTester`: the mixin builds seq2seq labels and decoder masks of the source's length)."""

    def __init__(self, parent, norm_placement: str):
        super().__init__(parent, norm_placement)
        self.decoder_seq_length = self.encoder_seq_length = self.seq_length

    def get_config(self, **overrides) -> seqbert.SeqBertConfig:
        fields = dict(is_encoder_decoder=True, decoder_start_token_id=2, eos_token_id=3, bos_token_id=1)
        return super().get_config(**{**fields, **overrides})

    def prepare_config_and_inputs_for_common(self):
        config, inputs = super().prepare_config_and_inputs_for_common()
        inputs["decoder_input_ids"] = ids_tensor([self.batch_size, self.decoder_seq_length], self.vocab_size)
        inputs["decoder_attention_mask"] = torch.ones(self.batch_size, self.decoder_seq_length, dtype=torch.long)
        return config, inputs


class _SeqBertCommonTests(ModelTesterMixin):
    norm_placement = "pre"
    model_tester_class = SeqBertModelTester
    all_model_classes = (*ENCODER_HEADS.values(), seqbert.SeqBertForCausalLM)

    def setUp(self):
        self.model_tester = self.model_tester_class(self, self.norm_placement)
        # BERT's tester passes hidden_size=37; SeqBertConfig checks that the 12 default heads divide hidden_size.
        self.config_tester = ConfigTester(self, config_class=seqbert.SeqBertConfig, hidden_size=36)
        reason = SKIPS.get(self._testMethodName.split("_0")[0]) or SKIPS.get(self._testMethodName)
        if reason:
            self.skipTest(reason)

    def test_config(self):
        self.config_tester.run_common_tests()


class SeqBertPreLNModelTest(_SeqBertCommonTests, unittest.TestCase):
    norm_placement = "pre"


class SeqBertPostLNModelTest(_SeqBertCommonTests, unittest.TestCase):
    norm_placement = "post"


class _SeqBertSeq2SeqCommonTests(_SeqBertCommonTests):
    model_tester_class = SeqBertSeq2SeqModelTester
    all_model_classes = (seqbert.SeqBertForConditionalGeneration,)
    is_encoder_decoder = True


class SeqBertPreLNSeq2SeqModelTest(_SeqBertSeq2SeqCommonTests, unittest.TestCase):
    norm_placement = "pre"


class SeqBertPostLNSeq2SeqModelTest(_SeqBertSeq2SeqCommonTests, unittest.TestCase):
    norm_placement = "post"
