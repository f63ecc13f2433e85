"""seqbert: a BERT-style Transformer encoder as first-class Hugging Face `transformers` model code.

Importing the package registers `SeqBertConfig` and every SeqBERT model with the transformers Auto classes, so
`AutoConfig.for_model("seqbert")`, `AutoModel.from_pretrained(folder)`, `AutoModelForSeq2SeqLM` and `pipeline(...)` work on SeqBERT folders.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_seqbert import SEQBERT_VERSION, SeqBertConfig
from .cpu_inference import CpuInferencePlan, UnsupportedCpuError, optimize_for_cpu_inference
from .ctranslate2_loader import register_ctranslate2_loader_on_import
from .modeling_seqbert import (
    SeqBertForCausalLM,
    SeqBertForConditionalGeneration,
    SeqBertForMaskedLM,
    SeqBertForMultipleChoice,
    SeqBertForQuestionAnswering,
    SeqBertForSequenceClassification,
    SeqBertForTokenClassification,
    SeqBertModel,
    SeqBertPreTrainedModel,
)
from .optimum_export import register_optimum_export_configs_on_import
from .static_shapes import StaticShapeCollator


__version__ = SEQBERT_VERSION

AUTO_CLASSES = {
    AutoModel: SeqBertModel,
    AutoModelForMaskedLM: SeqBertForMaskedLM,
    AutoModelForSequenceClassification: SeqBertForSequenceClassification,
    AutoModelForTokenClassification: SeqBertForTokenClassification,
    AutoModelForQuestionAnswering: SeqBertForQuestionAnswering,
    AutoModelForMultipleChoice: SeqBertForMultipleChoice,
    AutoModelForCausalLM: SeqBertForCausalLM,
    AutoModelForSeq2SeqLM: SeqBertForConditionalGeneration,
}

AutoConfig.register(SeqBertConfig.model_type, SeqBertConfig, exist_ok=True)
for _auto_class, _model_class in AUTO_CLASSES.items():
    _auto_class.register(SeqBertConfig, _model_class, exist_ok=True)

# Serving engines learn SeqBERT when they are imported (nothing happens where they are not installed).
register_ctranslate2_loader_on_import()
register_optimum_export_configs_on_import()

__all__ = [
    "SeqBertConfig",
    "SeqBertPreTrainedModel",
    "SeqBertModel",
    "SeqBertForMaskedLM",
    "SeqBertForSequenceClassification",
    "SeqBertForTokenClassification",
    "SeqBertForQuestionAnswering",
    "SeqBertForMultipleChoice",
    "SeqBertForCausalLM",
    "SeqBertForConditionalGeneration",
    "optimize_for_cpu_inference",
    "CpuInferencePlan",
    "UnsupportedCpuError",
    "StaticShapeCollator",
]
