"""Small, exactly repeatable `Trainer` runs of tiny SeqBERT models on real text, for the multi-process and resume tests.

    torchrun --standalone --nproc_per_node N tests/trainer_job.py RUNS.json

RUNS.json is a list of runs, trained one after the other in the same process(es); each is a dict with

- `name`: sub-folder of `output_dir` for this run;
- `task`: `"classification"` (Rotten Tomatoes snippets, `SeqBertForSequenceClassification`), `"seq2seq"` (King James ->
  World English verse pairs, `SeqBertForConditionalGeneration`) or `"mlm"` (snippets, `SeqBertForMaskedLM` with 15 %
  masking);
- `output_dir`, `global_batch` (split evenly over the processes), `max_steps`;
- optional: `gradient_checkpointing` (False), `fsdp` (False; True: not `Trainer`, which accelerate never lets shard
  on CPU, but torch's own FSDP2 `fully_shard` over gloo, one unit per SeqBERT layer, in a plain AdamW loop; with one
  process the same loop runs unsharded), `dropout` (0.0: processes draw different dropout masks, so equivalence
  tests switch it off), `save_steps` (no checkpoints), `resume` (False; True resumes from the last checkpoint),
  `crash_saving_step` (raise while saving the checkpoint of that step, after its weights are written), `eval_steps`
  (evaluate on the first 16 examples every that many steps; default never), `training_args` (more `TrainingArguments`
  keywords), `bert` (None; `"transformers"` trains transformers' `BertForSequenceClassification` / `BertForMaskedLM`
  on a tiny post-LN `BertConfig` drawn from `torch.manual_seed(0)`, `"converted"` the SeqBERT head of the same task
  holding those very weights; both train with plain `transformers.Trainer`, and every process records what each step
  trained on: `record_steps`), `accepts_loss_kwargs` (the model's own; given: set on the model, which `Trainer` then
  reads instead of its forward's signature), `static_shapes` (False; True: classification batches from
  `seqbert.StaticShapeCollator`, the CUDA-graph route, with `training_args` naming the compile flags), `predict` (after
  training, `Trainer.evaluate` with an accuracy `compute_metrics` written for BERT, and `Trainer.predict` with and
  without labels, on the first that many training examples, `per_device_eval_batch_size` 4; every process writes
  `rank{R}_predict.pt`: `metrics`, `predictions`, `label_ids`, `unlabelled` (the predictions without labels)).

Every process writes its final (full, unsharded) weights to `output_dir/name/rank{R}.safetensors`, and to
`rank{R}.json` how it was wrapped (accelerate's `distributed_type`, the wrapped model's class). The model is built from
`torch.manual_seed(0)` on a tiny pre-LN or post-LN config whose vocabulary is the real MiniLM WordPiece tokenizer's.
`rank{R}.json` also holds the run's `log_history` (what `Trainer` logged), and process R of a `bert` run writes the
list `record_steps` fills to `rank{R}_steps.pt`.
"""

import json
import os
import sys

import evaluate
import torch
from safetensors.torch import save_file
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import (
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    DataCollatorForSeq2Seq,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

import seqbert
from seqbert.convert_bert import bert_state_dict_to_seqbert
from seqbert.data import bible_verse_pairs, load_rotten_tomatoes, minilm_checkpoint_path
from seqbert.metrics import ACCURACY_PATH
from seqbert.training import DataCollatorForResumableMasking, SeqBertTrainer


NUM_EXAMPLES = 64
# The units FSDP shards one by one: SeqBERT's layers and embeddings (its `_no_split_modules`).
FSDP_UNITS = seqbert.SeqBertPreTrainedModel._no_split_modules


class SavingCrash(RuntimeError):
    """Raised by `crash_saving_step` runs in the middle of writing a checkpoint."""


# The `bert` runs' models: transformers' BERT head and the SeqBERT head of each task.
BERT_HEADS = {
    "classification": (BertForSequenceClassification, seqbert.SeqBertForSequenceClassification),
    "mlm": (BertForMaskedLM, seqbert.SeqBertForMaskedLM),
    "token-classification": (BertForTokenClassification, seqbert.SeqBertForTokenClassification),
}


def bert_model(task: str, tokenizer, kind: str):
    """A tiny BERT head of `task` from `torch.manual_seed(0)` without dropout: transformers' own (`kind` is
    `"transformers"`) or the SeqBERT head holding the same weights (`"converted"`: post-LN, the same outputs)."""
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=2,
    )
    bert_class, seqbert_class = BERT_HEADS[task]
    torch.manual_seed(0)
    bert = bert_class(config)
    if kind == "transformers":
        return bert
    seqbert_config = seqbert.SeqBertConfig.from_bert_config(config)
    model = seqbert_class(seqbert_config)
    missing, unexpected = model.load_state_dict(bert_state_dict_to_seqbert(bert.state_dict(), seqbert_config), False)
    assert set(missing) <= {"lm_head.decoder.weight"} and not unexpected, (missing, unexpected)  # the tied decoder
    return model


def record_steps(trainer) -> list[dict]:
    """Make `trainer` record each batch this process trains on (one per optimizer step, or `gradient_accumulation_steps`)
    in the list it returns: a dict with `batch`, its tensors, and, on process 0, `weights`, the model's state dict as
    the batch came (DDP keeps the processes' weights equal)."""
    steps = []
    training_step = trainer.training_step

    def recording_training_step(model, inputs, num_items_in_batch=None):
        step = {"batch": {k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)}}
        if trainer.args.process_index == 0:
            step["weights"] = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        steps.append(step)
        return training_step(model, inputs, num_items_in_batch)

    trainer.training_step = recording_training_step
    return steps


def build(run: dict, tokenizer):
    """The model and the tokenized training examples of `run`."""
    config = seqbert.SeqBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=run.get("dropout", 0.0),
        attention_probs_dropout_prob=run.get("dropout", 0.0),
        norm_placement=run.get("norm_placement", "pre"),
        pad_token_id=tokenizer.pad_token_id,
        num_labels=2,
        is_encoder_decoder=run["task"] == "seq2seq",
        decoder_start_token_id=tokenizer.cls_token_id if run["task"] == "seq2seq" else None,
        eos_token_id=tokenizer.sep_token_id if run["task"] == "seq2seq" else None,
    )
    if run["task"] == "seq2seq":
        head = seqbert.SeqBertForConditionalGeneration
        pairs = bible_verse_pairs()[:NUM_EXAMPLES]
        sources, targets = [p[1] for p in pairs], [p[2] for p in pairs]
        encoded = tokenizer(sources, text_target=targets, truncation=True, max_length=32)
        keys = ("input_ids", "attention_mask", "labels")
    else:
        snippets = load_rotten_tomatoes(num_train=NUM_EXAMPLES, num_validation=1)["train"]
        encoded = tokenizer(list(snippets["text"]), truncation=True, max_length=48)
        if run["task"] == "classification":
            head = seqbert.SeqBertForSequenceClassification
            encoded["labels"] = list(snippets["label"])
            keys = ("input_ids", "attention_mask", "labels")
        else:
            head = seqbert.SeqBertForMaskedLM
            keys = ("input_ids", "attention_mask", "special_tokens_mask")
            encoded = tokenizer(list(snippets["text"]), truncation=True, max_length=48, return_special_tokens_mask=True)
    if run.get("bert"):
        model = bert_model(run["task"], tokenizer, run["bert"])
    else:
        torch.manual_seed(0)
        model = head(config)
    if "accepts_loss_kwargs" in run:
        model.accepts_loss_kwargs = run["accepts_loss_kwargs"]
    examples = [dict(zip(keys, values, strict=True)) for values in zip(*(encoded[k] for k in keys), strict=True)]
    return model, examples


def collator(task: str, tokenizer, model, static_shapes: bool = False, batch_size: int | None = None):
    if static_shapes:
        return seqbert.StaticShapeCollator(tokenizer, model, max_length=48, batch_size=batch_size)
    if task == "seq2seq":
        return DataCollatorForSeq2Seq(tokenizer, model=model)
    if task == "mlm":
        return DataCollatorForResumableMasking(tokenizer, mlm_probability=0.15, seed=0)
    return DataCollatorWithPadding(tokenizer)


def save_weights(model, output_dir: str, rank: int, wrapping: dict) -> None:
    """Write the full (unsharded) weights and how the model was wrapped; a collective under FSDP."""
    state = {  # FSDP2 holds each parameter as a DTensor shard: gather the full tensor (a collective, on every rank)
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in model.state_dict().items()
    }
    save_file(state, os.path.join(output_dir, f"rank{rank}.safetensors"))
    with open(os.path.join(output_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(wrapping, f)


def train_fsdp2(run: dict) -> None:
    """The classification run sharded with torch's FSDP2 (`fully_shard` on every `FSDP_UNITS` module and the root)."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    model, examples = build(run, tokenizer)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world_size > 1:
        if not torch.distributed.is_initialized():  # Trainer runs before may have set it up already
            torch.distributed.init_process_group("gloo")
        for module in model.modules():
            if type(module).__name__ in FSDP_UNITS:
                fully_shard(module)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    collate = collator(run["task"], tokenizer, model)
    per_process = run["global_batch"] // world_size
    model.train()
    for step in range(run["max_steps"]):
        batch = examples[step * run["global_batch"] : (step + 1) * run["global_batch"]]
        model(**collate(batch[rank * per_process : (rank + 1) * per_process])).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    output_dir = os.path.join(run["output_dir"], run["name"])
    os.makedirs(output_dir, exist_ok=True)
    wrapping = {"sharded_parameters": sum(isinstance(p, DTensor) for p in model.parameters())}
    save_weights(model, output_dir, rank, {**wrapping, "wrapped_class": type(model).__name__})


def train(run: dict) -> Trainer:
    """Train one run (see the module docstring) and return its trainer; on rank R write `rank{R}.safetensors`."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_checkpoint_path())
    model, examples = build(run, tokenizer)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    output_dir = os.path.join(run["output_dir"], run["name"])
    save_steps = run.get("save_steps")
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=run["global_batch"] // world_size,
        max_steps=run["max_steps"],
        learning_rate=1e-3,
        warmup_steps=0,
        activation_checkpointing=run.get("gradient_checkpointing", False),
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        logging_steps=1,
        eval_strategy="steps" if run.get("eval_steps") else "no",
        eval_steps=run.get("eval_steps"),
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        **run.get("training_args", {}),
    )
    trainer_class = Trainer if run.get("bert") else SeqBertTrainer
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=examples,
        eval_dataset=examples[:16] if run.get("eval_steps") else None,
        processing_class=tokenizer,
        data_collator=collator(
            run["task"], tokenizer, model, run.get("static_shapes", False), run["global_batch"] // world_size
        ),
    )
    crash_step = run.get("crash_saving_step")
    if crash_step is not None:
        save_rng_state = trainer._save_rng_state

        def crashing_save_rng_state(folder):
            if trainer.state.global_step == crash_step:
                raise SavingCrash(f"simulated crash while saving step {crash_step} into {folder}")
            save_rng_state(folder)

        trainer._save_rng_state = crashing_save_rng_state
    steps = record_steps(trainer) if run.get("bert") else None
    trainer.train(resume_from_checkpoint=True if run.get("resume") else None)
    if steps is not None:
        torch.save(steps, os.path.join(output_dir, f"rank{trainer.args.process_index}_steps.pt"))
    if run.get("predict"):
        torch.save(predict(trainer, examples[: run["predict"]]), os.path.join(output_dir, f"rank{rank}_predict.pt"))
    wrapping = {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "wrapped_class": type(trainer.model_wrapped).__name__,
        "gradient_checkpointing": trainer.model.is_activation_checkpointing,
        "log_history": trainer.state.log_history,
    }
    save_weights(trainer.model, output_dir, trainer.args.process_index, wrapping)
    return trainer


def predict(trainer: Trainer, examples: list[dict]) -> dict:
    """What `Trainer.evaluate` and `Trainer.predict` (with and without labels) give on `examples`, on this process."""

    accuracy = evaluate.load(ACCURACY_PATH)

    def compute_metrics(prediction) -> dict[str, float]:  # as BERT's users write it: one row per example
        return accuracy.compute(predictions=prediction.predictions.argmax(-1), references=prediction.label_ids)

    trainer.compute_metrics = compute_metrics
    trainer.args.per_device_eval_batch_size = 4
    labelled = trainer.predict(examples)
    unlabelled = trainer.predict([{k: v for k, v in e.items() if k != "labels"} for e in examples])
    return {
        "metrics": trainer.evaluate(examples),
        "predictions": torch.from_numpy(labelled.predictions),
        "label_ids": torch.from_numpy(labelled.label_ids),
        "unlabelled": torch.from_numpy(unlabelled.predictions),
    }


def main(runs_path: str) -> None:
    with open(runs_path, encoding="utf-8") as f:
        runs = json.load(f)
    for run in runs:  # the FSDP runs last, in the process group the Trainer runs set up
        if not run.get("fsdp"):
            train(run)
    for run in runs:
        if run.get("fsdp"):
            train_fsdp2(run)


if __name__ == "__main__":
    main(sys.argv[1])
