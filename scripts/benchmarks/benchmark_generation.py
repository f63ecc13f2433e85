"""Time generation of SeqBertForConditionalGeneration with and without the KV cache, next to transformers'
EncoderDecoderModel holding the identical BERT2BERT weights, in one process, interleaved, fp32, on real verse pairs.
The default run takes about 2 minutes on 2 CPU cores.

The model is the MiniLM BERT2BERT warm start (6 + 6 layers, hidden 384) with its cross-attention seeded; the inputs are
`--batch_size` King James verses from the test split. Each configuration generates `--new_tokens` tokens exactly
(`min_new_tokens` = `max_new_tokens`), `--repeats` times, in the order reference, seqbert, reference, seqbert, ...;
the table shows medians. Token ids of seqbert and the reference are compared on every run.

Usage:
    python scripts/benchmarks/benchmark_generation.py [--batch_size 8] [--new_tokens 32] [--repeats 3] [--json_file out.json]
"""

import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoTokenizer, EncoderDecoderModel

import seqbert
from seqbert.data import load_bible_pairs, minilm_checkpoint_path
from seqbert.script_utils import script_parser, write_json


@dataclass
class BenchmarkArguments:
    batch_size: int = field(default=8, metadata={"help": "Sources per generate call."})
    new_tokens: int = field(default=32, metadata={"help": "Tokens generated per sequence."})
    repeats: int = field(default=3, metadata={"help": "Timed repetitions of each configuration (median reported)."})
    json_file: str | None = field(default=None, metadata={"help": "Also write the rows to this JSON file."})


@torch.no_grad()
def main(argv: list[str] | None = None) -> list[dict]:
    (args,) = script_parser(BenchmarkArguments, __doc__).parse_args_into_dataclasses(args=argv)
    minilm = str(minilm_checkpoint_path())
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    torch.manual_seed(0)
    reference = EncoderDecoderModel.from_encoder_decoder_pretrained(minilm, minilm).eval()
    with tempfile.TemporaryDirectory() as folder:
        reference.config.decoder_start_token_id = tokenizer.cls_token_id
        reference.config.eos_token_id = tokenizer.sep_token_id
        reference.config.pad_token_id = tokenizer.pad_token_id
        reference.save_pretrained(folder)
        model = seqbert.SeqBertForConditionalGeneration.from_bert_pretrained(folder).eval()
    sources = list(load_bible_pairs()["test"]["source"][: args.batch_size])
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    ids = dict(decoder_start_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, pad_token_id=0)
    length = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)

    rows = []
    for name, generation in (("greedy", dict(do_sample=False)), ("beam-4", dict(num_beams=4))):
        for use_cache in (True, False):
            times = {"EncoderDecoderModel": [], "seqbert": []}
            identical = True
            for _ in range(args.repeats):
                outputs = {}
                for label, m in (("EncoderDecoderModel", reference), ("seqbert", model)):
                    start = time.perf_counter()
                    outputs[label] = m.generate(**batch, use_cache=use_cache, **ids, **length, **generation)
                    times[label].append(time.perf_counter() - start)
                identical &= torch.equal(outputs["EncoderDecoderModel"], outputs["seqbert"])
            median = {k: statistics.median(v) for k, v in times.items()}
            rows.append(
                dict(
                    decoding=name,
                    use_cache=use_cache,
                    reference_s=median["EncoderDecoderModel"],
                    seqbert_s=median["seqbert"],
                    speedup_vs_reference=median["EncoderDecoderModel"] / median["seqbert"],
                    identical_ids=identical,
                )
            )
    for decoding in ("greedy", "beam-4"):
        cached, uncached = (
            next(r for r in rows if r["decoding"] == decoding and r["use_cache"] is c) for c in (True, False)
        )
        cached["seqbert_cache_speedup"] = uncached["seqbert_s"] / cached["seqbert_s"]

    print(
        f"batch {args.batch_size}, {args.new_tokens} new tokens, median of {args.repeats}, {torch.get_num_threads()} threads"
    )
    print(f"{'decoding':<8} {'cache':<6} {'EncoderDecoderModel s':>22} {'seqbert s':>10} {'ratio':>6} {'same ids':>9}")
    for r in rows:
        print(
            f"{r['decoding']:<8} {str(r['use_cache']):<6} {r['reference_s']:>22.2f} {r['seqbert_s']:>10.2f} "
            f"{r['speedup_vs_reference']:>6.2f} {str(r['identical_ids']):>9}"
        )
    for r in rows:
        if "seqbert_cache_speedup" in r:
            print(
                f"seqbert {r['decoding']}: cached generation is {r['seqbert_cache_speedup']:.2f}x faster than uncached"
            )
    write_json(args.json_file, rows)
    return rows


if __name__ == "__main__":
    main()
