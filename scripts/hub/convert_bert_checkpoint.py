"""Convert a BERT checkpoint (Hub name or local folder) into a SeqBERT folder that `AutoModel*.from_pretrained` loads.
Takes seconds for a checkpoint of BERT-base size, once downloaded.

The folder gets the post-LN SeqBERT config, the renamed weights (safetensors), the BERT tokenizer and, for a
sentence-transformers checkpoint, its modules (`modules.json`, pooling, normalisation, `sentence_bert_config.json`), so
`SentenceTransformer(output_dir, trust_remote_code=True)` gives the original's embeddings. The SeqBERT class is chosen
from the checkpoint's `architectures` entry so every head it has is kept (BertForMaskedLM and BertForPreTraining ->
SeqBertForMaskedLM, BertLMHeadModel -> SeqBertForCausalLM, BertForSequenceClassification ->
SeqBertForSequenceClassification, ...), unless `--model_class` names one.

Usage:
    python scripts/hub/convert_bert_checkpoint.py --bert_model_name_or_path bert-base-uncased --output_dir seqbert-base-uncased
    python scripts/hub/convert_bert_checkpoint.py --bert_model_name_or_path path/to/bert_folder --output_dir out \
        --model_class SeqBertForSequenceClassification --num_labels 2
"""

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field

from transformers import AutoConfig, AutoTokenizer

import seqbert
from seqbert.convert_bert import SEQBERT_CLASS_FOR_BERT_ARCHITECTURE
from seqbert.hub import copy_sentence_transformers_modules
from seqbert.script_utils import script_parser


logger = logging.getLogger(__name__)


@dataclass
class ConversionArguments:
    bert_model_name_or_path: str = field(metadata={"help": "BERT checkpoint: Hub model id or local folder."})
    output_dir: str = field(metadata={"help": "Folder to write the SeqBERT checkpoint to (must not exist yet)."})
    model_class: str | None = field(
        default=None,
        metadata={
            "help": "SeqBERT class to convert into; default: chosen from the checkpoint's architectures.",
            "choices": sorted(set(SEQBERT_CLASS_FOR_BERT_ARCHITECTURE.values())),
        },
    )
    num_labels: int | None = field(default=None, metadata={"help": "Number of labels for a new classification head."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Replace output_dir if it exists."})


def seqbert_class_for(bert_model_name_or_path: str, model_class: str | None) -> type:
    """The SeqBERT class to convert into: `model_class` if given, else the one matching the checkpoint's head."""
    if model_class is None:
        architectures = AutoConfig.from_pretrained(bert_model_name_or_path).architectures or ["BertModel"]
        model_class = SEQBERT_CLASS_FOR_BERT_ARCHITECTURE.get(architectures[0])
        if model_class is None:
            raise ValueError(
                f"architectures[0] ({architectures[0]!r}) of {bert_model_name_or_path!r} has no SeqBERT counterpart; "
                f"pass --model_class (one of {sorted(set(SEQBERT_CLASS_FOR_BERT_ARCHITECTURE.values()))})"
            )
    return getattr(seqbert, model_class)


def convert(args: ConversionArguments) -> str:
    """Write the converted checkpoint to `args.output_dir` atomically (a temporary folder renamed at the end)."""
    if os.path.exists(args.output_dir) and not args.overwrite_output_dir:
        raise ValueError(f"output_dir ({args.output_dir!r}) already exists; pass --overwrite_output_dir to replace it")
    model_class = seqbert_class_for(args.bert_model_name_or_path, args.model_class)
    overrides = {} if args.num_labels is None else {"num_labels": args.num_labels}
    model = model_class.from_bert_pretrained(args.bert_model_name_or_path, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(args.bert_model_name_or_path)
    parent = os.path.dirname(os.path.abspath(args.output_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if model_class is seqbert.SeqBertModel:
            copy_sentence_transformers_modules(args.bert_model_name_or_path, staging)
        if os.path.exists(args.output_dir):
            shutil.rmtree(args.output_dir)
        os.replace(staging, args.output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("wrote %s (%s) to %s", model_class.__name__, args.bert_model_name_or_path, args.output_dir)
    return args.output_dir


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    (args,) = script_parser(ConversionArguments, __doc__).parse_args_into_dataclasses(args=argv)
    convert(args)


if __name__ == "__main__":
    main()
