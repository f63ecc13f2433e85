"""Load saved SeqBERT folders the way a Hub user does: `trust_remote_code=True`, with seqbert NOT importable.

Run in a separate process by the tests (tests/conftest.py `run_without_seqbert`) and, with other transformers
releases, by scripts/checks/check_transformers_versions.py:

    python scripts/hub/load_without_seqbert.py JOBS.json OUTPUT.safetensors

It needs only torch and transformers (sentence-transformers and peft for the `embed` and `lora` jobs, accelerate for
`resume`).

Before anything else an import hook makes `import seqbert` (and every `seqbert.*`) fail, so the only SeqBERT code this
process can run is the code saved in the folders. Each job of JOBS.json (a list) is one of:

- `{"name", "mode": "forward", "folder", "auto_class", "inputs"}`: load with `transformers.<auto_class>`, run a forward
  pass on the tensors of the `inputs` safetensors file, and store every tensor field of the output as `name.field`;
- `{"name", "mode": "generate", "folder", "auto_class", "inputs", "generate_kwargs"}`: `transformers.<auto_class>`
  (`AutoModelForSeq2SeqLM` or `AutoModelForCausalLM`) and `generate`, stored as `name.sequences`;
- `{"name", "mode": "tokenize", "folder", "texts"}`: `transformers.AutoTokenizer` on the folder with
  `trust_remote_code=True` (AutoTokenizer reads config.json through AutoConfig first, which without it asks whether to
  run the folder's code) and on its declared class (`tokenizer_config.json`'s `tokenizer_class`, which needs no
  config); stores the ids of each as `name.input_ids` and `name.class_input_ids`;
- `{"name", "mode": "embed", "folder", "texts"}`: `sentence_transformers.SentenceTransformer` on the folder and
  `encode(texts)`, stored as `name.embeddings`;
- `{"name", "mode": "lora", "folder"}`: import peft first, then load the folder with
  `AutoModelForSequenceClassification` and wrap it in the default `LoraConfig(task_type="SEQ_CLS")`; stores the number
  of LoRA parameters per adapted module kind as `name.<kind>`;
- `{"name", "mode": "resume", "folder", "checkpoint", "texts", "labels", "max_steps", "output_dir"}`: load the
  classifier from a Trainer checkpoint, resume `Trainer` from it up to `max_steps` and `save_model` to `output_dir`;
  stores the final step as `name.global_step`.

Loaded classes must come from `transformers_modules` (the dynamic-module cache), which the job output also checks.
"""

import importlib.abc
import importlib.util
import os
import sys


class _NoSeqbert(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] == "seqbert":
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked: this process must not use seqbert)")
        return None


sys.meta_path.insert(0, _NoSeqbert())
# Python puts this script's folder first on the path; its `accelerate/` (launch configs, no package) would pass for the
# accelerate package where that is not installed.
sys.path = [entry for entry in sys.path if os.path.abspath(entry or ".") != os.path.dirname(os.path.abspath(__file__))]

import json  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402


def _check_remote(model) -> None:
    module = type(model).__module__
    if not module.startswith("transformers_modules."):
        raise AssertionError(f"{type(model).__name__} came from {module}, not from the folder's code")


def forward(job) -> dict[str, torch.Tensor]:
    auto_class = getattr(transformers, job["auto_class"])
    model = auto_class.from_pretrained(job["folder"], trust_remote_code=True).eval()
    _check_remote(model)
    with torch.no_grad():
        output = model(**load_file(job["inputs"]))
    return {f"{job['name']}.{key}": value for key, value in output.items() if isinstance(value, torch.Tensor)}


def generate(job) -> dict[str, torch.Tensor]:
    auto_class = getattr(transformers, job["auto_class"])
    model = auto_class.from_pretrained(job["folder"], trust_remote_code=True).eval()
    _check_remote(model)
    with torch.no_grad():
        sequences = model.generate(**load_file(job["inputs"]), **job["generate_kwargs"])
    return {f"{job['name']}.sequences": sequences}


def tokenize(job) -> dict[str, torch.Tensor]:
    auto = transformers.AutoTokenizer.from_pretrained(job["folder"], trust_remote_code=True)
    with open(os.path.join(job["folder"], "tokenizer_config.json"), encoding="utf-8") as f:
        declared = getattr(transformers, json.load(f)["tokenizer_class"])
    direct = declared.from_pretrained(job["folder"])
    return {
        f"{job['name']}.input_ids": auto(job["texts"], padding=True, return_tensors="pt")["input_ids"],
        f"{job['name']}.class_input_ids": direct(job["texts"], padding=True, return_tensors="pt")["input_ids"],
    }


def embed(job) -> dict[str, torch.Tensor]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(job["folder"], device="cpu", trust_remote_code=True)
    _check_remote(model[0].auto_model)
    return {f"{job['name']}.embeddings": model.encode(job["texts"], convert_to_tensor=True)}


def lora(job) -> dict[str, torch.Tensor]:
    from peft import LoraConfig, get_peft_model  # before the model code is loaded

    model = transformers.AutoModelForSequenceClassification.from_pretrained(job["folder"], trust_remote_code=True)
    _check_remote(model)
    model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS"))
    counts: dict[str, int] = {}
    for name, parameter in model.named_parameters():
        if ".lora_" in name:
            kind = name.split(".lora_")[0].rsplit(".", 1)[-1]
            counts[kind] = counts.get(kind, 0) + parameter.numel()
    return {f"{job['name']}.{kind}": torch.tensor(count) for kind, count in counts.items()}


def resume(job) -> dict[str, torch.Tensor]:
    checkpoint = job["checkpoint"]
    # AutoTokenizer reads config.json through AutoConfig, so it too needs trust_remote_code (else it prompts).
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint, trust_remote_code=True)
    _check_remote(model)
    encoded = tokenizer(job["texts"], truncation=True, max_length=64)
    train = [
        {"input_ids": ids, "attention_mask": mask, "labels": label}
        for ids, mask, label in zip(encoded["input_ids"], encoded["attention_mask"], job["labels"], strict=True)
    ]
    args = transformers.TrainingArguments(
        output_dir=job["output_dir"],
        max_steps=job["max_steps"],
        per_device_train_batch_size=8,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
    )
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    return {f"{job['name']}.global_step": torch.tensor(trainer.state.global_step)}


def main(jobs_path: str, output_path: str) -> None:
    assert importlib.util.find_spec("transformers") is not None
    try:
        import seqbert  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("seqbert is importable: this process must not have it")
    with open(jobs_path, encoding="utf-8") as f:
        jobs = json.load(f)
    outputs = {}
    for job in jobs:
        modes = {
            "forward": forward,
            "generate": generate,
            "tokenize": tokenize,
            "embed": embed,
            "lora": lora,
            "resume": resume,
        }
        outputs.update(modes[job["mode"]](job))
    save_file({key: value.contiguous() for key, value in outputs.items()}, output_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
