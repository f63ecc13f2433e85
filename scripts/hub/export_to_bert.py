"""Export a post-LN SeqBERT folder as a plain transformers BERT folder (BertModel, BertForMaskedLM, ...) with its
tokenizer, which BERT-only engines load as it is: stock CTranslate2, OpenVINO, ONNX Runtime, TEI, vLLM's BERT. Takes
seconds for a model of BERT-base size.

The BERT class is the one of the SeqBERT folder's head (`architectures` in its config.json), or `BertModel` with
`--task feature-extraction`. Outputs are those of the SeqBERT model (max |delta| 0.0 in fp32), and a SeqBERT model made
from BERT exports back to the same tensors, bit for bit. A pre-LN model, sinusoidal positions or scaled embeddings have
no BERT equivalent and are refused.

Usage:
    python scripts/hub/export_to_bert.py --model_name_or_path seqbert-folder --output_dir bert-folder
    python scripts/hub/export_to_bert.py --model_name_or_path seqbert-classifier --output_dir bert-encoder \
        --task feature-extraction --tokenizer_name_or_path path/to/tokenizer
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path

from seqbert.export_bert import TASKS, save_as_bert
from seqbert.script_utils import ScriptInputError, parse_arguments, run_cli, script_parser


logger = logging.getLogger(__name__)


@dataclass
class ExportArguments:
    model_name_or_path: str = field(metadata={"help": "SeqBERT folder (or Hub id) to export."})
    output_dir: str = field(metadata={"help": "BERT folder to write (new or empty, unless --overwrite_output_dir)."})
    task: str | None = field(
        default=None,
        metadata={
            "help": "What the BERT model serves: default the SeqBERT head's own task; feature-extraction exports the "
            "encoder alone (BertModel).",
            "choices": list(TASKS),
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer to save with the model; default: the SeqBERT folder's own."}
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace output_dir if it holds a model (a folder without one never is)."}
    )


def main(argv: list[str] | None = None) -> Path:
    """
    Parse `argv` (else the command line) and write the BERT folder.

    Returns:
        `Path`: the BERT folder.

    Raises:
        ScriptInputError: the folder is not a SeqBERT encoder that BERT can express, the task is not one its head
            serves, or `--output_dir` holds another model or other files (`seqbert.export_bert.save_as_bert`); one
            line, printed without a traceback on the command line. Nothing is written.
    """
    (args,) = parse_arguments(script_parser(ExportArguments, __doc__), argv)
    try:
        output_dir = save_as_bert(
            args.model_name_or_path,
            args.output_dir,
            tokenizer=args.tokenizer_name_or_path,
            task=args.task,
            overwrite=args.overwrite_output_dir,
        )
    except ValueError as error:
        raise ScriptInputError(str(error)) from error
    logger.info("wrote the BERT export of %s to %s", args.model_name_or_path, output_dir)
    return output_dir


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run_cli(main, script_parser(ExportArguments, __doc__))
