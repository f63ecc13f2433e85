"""Print the fp32 parity of SeqBERT converted from BERT against transformers' own BERT classes, as a table. Takes
about 1.5 minutes on 2 CPU cores.

Rows: the packaged MiniLM-L6 BertModel checkpoint (real weights) on padded Rotten Tomatoes snippets, per attention
backend, pooler included; and each BERT head class with seeded random bert-base-uncased-sized weights (12 layers,
hidden 768) saved to a temporary folder, fed real snippet pairs (token_type_ids 0 and 1) with padding (the causal
`BertLMHeadModel` too, into `SeqBertForCausalLM`). The figure
is max |delta| over real (non-pad) positions. The same checks, with 4-layer heads, are asserted by
tests/test_bert_parity.py; this script is the measurement behind the docs' parity table.

Usage:
    python scripts/checks/parity_report.py [--num_snippets 48] [--json_file parity.json]
"""

import tempfile
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertLMHeadModel,
    BertModel,
)

import seqbert
from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.script_utils import script_parser, write_json


@dataclass
class ReportArguments:
    num_snippets: int = field(default=48, metadata={"help": "Rotten Tomatoes snippets per padded batch."})
    json_file: str | None = field(default=None, metadata={"help": "Also write the rows to this JSON file."})


def max_delta(mine: torch.Tensor, theirs: torch.Tensor, attention_mask: torch.Tensor) -> float:
    """max |mine - theirs| over real tokens when the outputs are per token, else over everything."""
    if mine.dim() >= 2 and mine.shape[:2] == attention_mask.shape:
        real = attention_mask.bool()
        mine, theirs = mine[real], theirs[real]
    return (mine - theirs).abs().max().item()


@torch.no_grad()
def main(argv: list[str] | None = None) -> list[dict]:
    (args,) = script_parser(ReportArguments, __doc__).parse_args_into_dataclasses(args=argv)
    minilm = minilm_checkpoint_path()
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    texts = list(load_rotten_tomatoes()["train"]["text"])
    n = args.num_snippets
    single = tokenizer(texts[:n], padding=True, return_tensors="pt")
    pairs = tokenizer(texts[n : 2 * n], texts[2 * n : 3 * n], padding=True, return_tensors="pt")
    rows = []

    for backend in ("eager", "sdpa"):
        reference = BertModel.from_pretrained(minilm, attn_implementation=backend).eval()
        model = seqbert.SeqBertModel.from_bert_pretrained(minilm, attn_implementation=backend).eval()
        ref, out = reference(**single), model(**single)
        rows.append(
            dict(
                checkpoint="MiniLM-L6 (real weights)",
                reference="BertModel",
                attention=backend,
                last_hidden_state=max_delta(out.last_hidden_state, ref.last_hidden_state, single.attention_mask),
                pooler_output=max_delta(out.pooler_output, ref.pooler_output, single.attention_mask),
            )
        )

    heads = [
        (BertForMaskedLM, seqbert.SeqBertForMaskedLM, {}, ("logits",)),
        (BertForSequenceClassification, seqbert.SeqBertForSequenceClassification, {"num_labels": 3}, ("logits",)),
        (BertForTokenClassification, seqbert.SeqBertForTokenClassification, {"num_labels": 5}, ("logits",)),
        (BertForQuestionAnswering, seqbert.SeqBertForQuestionAnswering, {}, ("start_logits", "end_logits")),
        (BertLMHeadModel, seqbert.SeqBertForCausalLM, {"is_decoder": True}, ("logits",)),
    ]
    for bert_class, seqbert_class, kwargs, fields in heads:
        with tempfile.TemporaryDirectory() as folder:
            torch.manual_seed(0)
            bert_class(BertConfig(**kwargs)).save_pretrained(folder)
            reference = bert_class.from_pretrained(folder).eval()
            model = seqbert_class.from_bert_pretrained(folder).eval()
        ref, out = reference(**pairs), model(**pairs)
        row = dict(checkpoint="seeded bert-base size", reference=bert_class.__name__, attention="sdpa")
        row.update({f: max_delta(getattr(out, f), getattr(ref, f), pairs.attention_mask) for f in fields})
        rows.append(row)

    for row in rows:
        figures = ", ".join(f"{k} {v:.2e}" for k, v in row.items() if isinstance(v, float))
        print(f"{row['checkpoint']:<26} {row['reference']:<32} {row['attention']:<6} max|delta|: {figures}")
    write_json(args.json_file, rows)
    return rows


if __name__ == "__main__":
    main()
