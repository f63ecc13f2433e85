#!/usr/bin/env python
"""Print the figures of the docs' PEFT, embeddings, export and packing pages, measured on the real MiniLM weights
and real Rotten Tomatoes snippets (about 1 minute on 2 CPU cores, offline):

    python scripts/checks/ecosystem_report.py

- PEFT: LoRA parameters of the default `LoraConfig(task_type="SEQ_CLS")` on SeqBERT and on BERT; a BERT recipe
  (`target_modules=["query", "value"]`, r=4, 3 AdamW steps) trained on both: the largest loss and logit differences.
- sentence-transformers: the converted MiniLM against the original, max |delta| of 64 embeddings.
- Export: `torch.export` (dynamic batch and length) and `torch.onnx.export(dynamo=True)` run in onnxruntime on
  another batch than the traced one, and `torch.compile(fullgraph=True)`: max |delta| against eager on real tokens;
  graph breaks of default compile.
- Packing: `DataCollatorWithFlattening` rows against the padded batch, per attention implementation and head.
- Causal LM: a seeded `BertLMHeadModel` checkpoint (bert-base width, 4 layers) converted; logits and greedy ids.
"""

import logging
import tempfile
import warnings
from dataclasses import dataclass

import onnxruntime
import torch
from peft import LoraConfig, get_peft_model
from sentence_transformers import SentenceTransformer
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    BertLMHeadModel,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
)
from transformers.utils import logging as hf_logging

import seqbert
from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.hub import copy_sentence_transformers_modules
from seqbert.script_utils import script_parser


def lora_report(path, tokenizer, texts) -> None:
    counts = []
    for model in (
        seqbert.SeqBertForSequenceClassification.from_bert_pretrained(path, num_labels=2),
        BertForSequenceClassification.from_pretrained(path, num_labels=2),
    ):
        model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS"))
        counts.append(sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n))
    print(f"default LoRA (SEQ_CLS): {counts[0]:,} LoRA parameters on SeqBERT, {counts[1]:,} on BERT")

    batch = dict(tokenizer(texts[:16], padding=True, return_tensors="pt"))
    labels = torch.tensor([i % 2 for i in range(16)])
    bert = BertForSequenceClassification.from_pretrained(path, num_labels=2, hidden_dropout_prob=0.0)
    mine = seqbert.SeqBertForSequenceClassification.from_bert_pretrained(path, num_labels=2, hidden_dropout_prob=0.0)
    mine.classifier.load_state_dict(bert.classifier.state_dict())
    losses, logits = [], []
    for model in (bert, mine):
        torch.manual_seed(0)
        model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"]))
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        steps = []
        for _ in range(3):
            loss = model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.append(loss.item())
        losses.append(steps)
        with torch.no_grad():
            logits.append(model.eval()(**batch).logits)
    loss_delta = max(abs(a - b) for a, b in zip(*losses, strict=True))
    print(
        f"BERT LoRA recipe, 3 steps: max |loss delta| {loss_delta:.1e}, max |logit delta| after training "
        f"{(logits[0] - logits[1]).abs().max().item():.1e}"
    )


def embeddings_report(path, texts) -> None:
    with tempfile.TemporaryDirectory() as folder:
        seqbert.SeqBertModel.from_bert_pretrained(path).save_pretrained(folder)
        AutoTokenizer.from_pretrained(path).save_pretrained(folder)
        copy_sentence_transformers_modules(str(path), folder)
        converted = SentenceTransformer(folder, device="cpu", trust_remote_code=True)
        original = SentenceTransformer(str(path), device="cpu")
        delta = converted.encode(texts[:64], convert_to_tensor=True) - original.encode(
            texts[:64], convert_to_tensor=True
        )
    print(f"sentence-transformers, 64 snippets: max |embedding delta| {delta.abs().max().item():.1e}")


def export_report(path, tokenizer, texts) -> None:
    model = seqbert.SeqBertModel.from_bert_pretrained(path).eval()
    sample = dict(tokenizer(texts[:4], padding=True, return_tensors="pt"))
    other = dict(tokenizer(texts[100:132], padding=True, return_tensors="pt"))
    real = other["attention_mask"].bool()
    batch, length = torch.export.Dim("batch", min=1, max=256), torch.export.Dim("length", min=2, max=512)
    shapes = {name: {0: batch, 1: length} for name in sample}
    with torch.no_grad():
        expected = model(**other).last_hidden_state
        program = torch.export.export(model, args=(), kwargs=sample, dynamic_shapes=shapes)
        exported = program.module()(**other).last_hidden_state
        compiled = torch.compile(model, fullgraph=True)(**other).last_hidden_state
    with tempfile.TemporaryDirectory() as folder:
        torch.onnx.export(
            model, args=(), kwargs=sample, dynamic_shapes=shapes, dynamo=True, f=f"{folder}/m.onnx", verbose=False
        )
        session = onnxruntime.InferenceSession(f"{folder}/m.onnx", providers=["CPUExecutionProvider"])
        hidden = session.run(None, {i.name: other[i.name].numpy() for i in session.get_inputs()})[0]
    torch._dynamo.reset()
    breaks = torch._dynamo.explain(model)(**other).graph_break_count
    rows = {
        f"torch.export (traced on {' x '.join(map(str, sample['input_ids'].shape))}, run on "
        f"{' x '.join(map(str, other['input_ids'].shape))})": (exported - expected).abs().max().item(),
        "padding included": (exported - expected)[~real].abs().max().item(),
        "torch.onnx.export(dynamo=True) in onnxruntime": (torch.from_numpy(hidden) - expected)[real].abs().max().item(),
        "torch.compile(fullgraph=True)": (compiled - expected)[real].abs().max().item(),
    }
    for name, delta in rows.items():
        print(f"{name}: max |delta| {delta:.1e}")
    print(f"default torch.compile graph breaks: {breaks}")


def packing_report(path, tokenizer, texts) -> None:
    features = [{"input_ids": tokenizer(text)["input_ids"]} for text in texts[:32]]
    padded = DataCollatorWithPadding(tokenizer)(features)
    real = padded["attention_mask"].bool()
    for implementation in ("sdpa", "eager"):
        for model_class in (seqbert.SeqBertModel, seqbert.SeqBertForMaskedLM, seqbert.SeqBertForTokenClassification):
            torch.manual_seed(0)
            model = model_class.from_bert_pretrained(path, num_labels=5, attn_implementation=implementation).eval()
            for flash_kwargs in (False, True):
                packed = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)(features)
                packed.pop("labels")
                with torch.no_grad():
                    expected, got = model(**padded)[0][real], model(**packed)[0][0]
                print(
                    f"packed vs padded, {implementation}, {model_class.__name__}, "
                    f"{'cu_seq_lens' if flash_kwargs else 'position_ids'}: max |delta| "
                    f"{(got - expected).abs().max().item():.1e}"
                )


def causal_lm_report(tokenizer, texts) -> None:
    torch.manual_seed(0)
    reference = BertLMHeadModel(BertConfig(is_decoder=True, num_hidden_layers=4)).eval()
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        model = seqbert.SeqBertForCausalLM.from_bert_pretrained(folder).eval()
    batch = dict(tokenizer(texts[:8], padding=True, return_tensors="pt"))
    with torch.no_grad():
        delta = (model(**batch).logits - reference(**batch).logits)[batch["attention_mask"].bool()].abs().max().item()
    same = torch.equal(model.generate(**batch, max_new_tokens=16), reference.generate(**batch, max_new_tokens=16))
    print(f"SeqBertForCausalLM vs BertLMHeadModel: max |logit delta| {delta:.1e}, greedy ids identical: {same}")


@dataclass
class ReportArguments:
    """No options: the report measures fixed workloads."""


def main(argv: list[str] | None = None) -> None:
    script_parser(ReportArguments, __doc__).parse_args_into_dataclasses(args=argv)
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    logging.getLogger("torch").setLevel(logging.ERROR)
    path = minilm_checkpoint_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = list(load_rotten_tomatoes()["validation"]["text"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    lora_report(path, tokenizer, texts)
    embeddings_report(path, texts)
    export_report(path, tokenizer, texts)
    packing_report(path, tokenizer, texts)
    causal_lm_report(tokenizer, texts)


if __name__ == "__main__":
    main()
