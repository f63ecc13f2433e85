"""scripts/examples/run_seq2seq.py end to end on the real offline verse pairs (a small slice), and the data split it uses."""

import json

import numpy as np
import pytest
import sacrebleu
import torch
from transformers import AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer

import seqbert
from seqbert.data import load_bible_pairs


def test_bible_split_is_deterministic_and_reproduces_the_copy_baseline():
    pairs = load_bible_pairs()
    assert (len(pairs["train"]), len(pairs["validation"]), len(pairs["test"])) == (28599, 500, 2000)
    ids = [set(pairs[s]["verse_id"]) for s in ("train", "validation", "test")]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    test = pairs["test"]
    # ../shared/DATA.md: copying the KJV source scores 47.9 BLEU / 70.0 chrF on 2,000 pairs shuffled this way.
    copy = sacrebleu.corpus_bleu(list(test["source"]), [list(test["target"])]).score
    assert copy == pytest.approx(47.9, abs=0.05)
    assert load_bible_pairs()["test"]["verse_id"] == test["verse_id"]


def test_writes_scores_model_tokenizer_predictions_and_loss_curve(seq2seq_run):
    results = json.loads((seq2seq_run / "all_results.json").read_text())
    for key in ("predict_bleu", "predict_chrf", "copy_baseline_bleu", "copy_baseline_chrf", "predict_bleu_uncased"):
        assert 0.0 <= results[key] <= 100.0, key
    assert results["train_samples"] == 32 and results["predict_samples"] == 16
    predictions = (seq2seq_run / "generated_predictions.txt").read_text().splitlines()
    assert len(predictions) == 16
    test = load_bible_pairs()["test"].select(range(16))
    expected = sacrebleu.corpus_bleu(predictions, [list(test["target"])]).score
    assert results["predict_bleu"] == pytest.approx(expected)
    copy = sacrebleu.corpus_bleu(list(test["source"]), [list(test["target"])]).score
    assert results["copy_baseline_bleu"] == pytest.approx(copy)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "loss_curve.png", "generation_config.json"):
        assert (seq2seq_run / name).exists(), name
    # The card says how the scores compare with copying (32 training pairs: below it).
    card = " ".join((seq2seq_run / "README.md").read_text().split())
    assert (
        f"On the 16 test pairs it scores {results['predict_bleu']:.1f} BLEU and {results['predict_chrf']:.1f} chrF, "
        f"not above the {copy:.1f} BLEU and not above the {results['copy_baseline_chrf']:.1f} chrF of copying"
    ) in card


def test_saved_folder_loads_as_seq2seq_and_as_encoder(seq2seq_run):
    model = AutoModelForSeq2SeqLM.from_pretrained(seq2seq_run).eval()
    assert type(model) is seqbert.SeqBertForConditionalGeneration and model.config.norm_placement == "post"
    tokenizer = AutoTokenizer.from_pretrained(seq2seq_run)
    batch = tokenizer(["In the beginning God created the heaven and the earth."], return_tensors="pt")
    generated = model.generate(**batch, max_new_tokens=8)
    assert generated[0, 0].item() == tokenizer.cls_token_id
    encoder = AutoModel.from_pretrained(seq2seq_run).eval()
    assert type(encoder) is seqbert.SeqBertModel
    with torch.no_grad():
        torch.testing.assert_close(
            encoder(**batch).last_hidden_state, model.get_encoder()(**batch).last_hidden_state, rtol=0, atol=0
        )


def test_labels_leave_the_decoder_start_token_to_the_decoder_input(tokenizer):
    """BERT's tokenizer opens each target with [CLS], which is also the decoder start: the labels drop it, so the
    decoder reads `[CLS] w1 ... wn` and predicts `w1 ... wn [SEP]` (no "[CLS] follows [CLS]" to learn)."""
    import run_seq2seq

    pairs = load_bible_pairs()["train"].select(range(4))
    batch = {"source": list(pairs["source"]), "target": list(pairs["target"])}
    encoded = run_seq2seq.tokenize_pairs(batch, tokenizer, run_seq2seq.DataArguments(), tokenizer.cls_token_id)
    for labels, target in zip(encoded["labels"], batch["target"], strict=True):
        ids = tokenizer(target)["input_ids"]
        assert ids[0] == tokenizer.cls_token_id and labels == ids[1:] and labels[-1] == tokenizer.sep_token_id
        decoder_input = seqbert.modeling_seqbert.shift_tokens_right(
            torch.tensor([labels]), tokenizer.pad_token_id, tokenizer.cls_token_id
        )[0].tolist()
        assert decoder_input == ids[:-1]  # [CLS] w1 ... wn
    assert encoded["input_ids"] == tokenizer(batch["source"], truncation=True, max_length=128)["input_ids"]
    # A decoder start the tokenizer does not put first leaves the targets whole.
    other = run_seq2seq.tokenize_pairs(batch, tokenizer, run_seq2seq.DataArguments(), tokenizer.sep_token_id)
    assert other["labels"] == tokenizer(batch["target"])["input_ids"]


def test_test_verses_are_generated_longest_first_and_returned_in_their_order(tokenizer):
    """`predict_longest_first` hands the trainer the test sources (without labels: no teacher-forced loss pass) sorted
    by length, longest first, and puts the predictions back in the dataset's order: here a stand-in trainer
    "predicts" each source's own ids."""
    import run_seq2seq
    from transformers.trainer_utils import PredictionOutput

    test = load_bible_pairs()["test"].select(range(24))
    dataset = test.map(
        lambda batch: tokenizer(batch["source"], truncation=True, max_length=128), batched=True
    ).select_columns(["input_ids"])
    dataset = dataset.add_column("labels", dataset["input_ids"])

    class EchoTrainer:
        def predict(self, data, metric_key_prefix):
            self.columns = data.column_names
            self.lengths = [len(ids) for ids in data["input_ids"]]
            width = max(self.lengths)
            rows = [ids + [-100] * (width - len(ids)) for ids in data["input_ids"]]
            return PredictionOutput(predictions=np.array(rows), label_ids=None, metrics={})

    trainer = EchoTrainer()
    _, predictions = run_seq2seq.predict_longest_first(trainer, dataset)
    assert trainer.lengths == sorted(trainer.lengths, reverse=True) and len(set(trainer.lengths)) > 1
    assert trainer.columns == ["input_ids"]
    for row, ids in zip(predictions, dataset["input_ids"], strict=True):
        assert row[: len(ids)].tolist() == ids and (row[len(ids) :] == -100).all()


def test_recasing_restores_the_casing_of_a_lower_cased_copy(tokenizer):
    """The King James source, lower-cased and round-tripped through MiniLM's uncased tokenizer (what a model that
    copies perfectly would generate), re-cased by `make_recaser`, scores within 0.5 BLEU of the untouched source."""
    import run_seq2seq

    pairs = load_bible_pairs()
    recase = run_seq2seq.make_recaser(list(pairs["train"]["target"]))
    test = pairs["test"].select(range(400))
    sources, references = list(test["source"]), [list(test["target"])]
    decoded = tokenizer.batch_decode(tokenizer(sources)["input_ids"], skip_special_tokens=True)
    assert all(text == text.lower() for text in decoded)
    recased = [recase(text, source) for text, source in zip(decoded, sources, strict=True)]
    copy = sacrebleu.corpus_bleu(sources, references).score
    assert sacrebleu.corpus_bleu(recased, references).score == pytest.approx(copy, abs=0.5)
    assert sacrebleu.corpus_bleu(decoded, references).score < copy - 5  # lower case alone loses 8 BLEU here
    # A name the truecaser never saw takes the source's casing; sentence starts are upper-cased.
    assert (
        recase("and zorobabel went up. then he slept", "And Zorobabel went up.")
        == "And Zorobabel went up. Then he slept"
    )


def test_predict_keeps_dataset_order_with_length_grouped_training_batches(tokenizer, tmp_path):
    """With `train_sampling_strategy="group_by_length"` transformers' Trainer also draws evaluation batches from a
    shuffled `LengthGroupedSampler`; seqbert's trainers evaluate and predict in dataset order, which `run_seq2seq.py`
    relies on to pair predictions with references."""
    import datasets
    from transformers import DataCollatorWithPadding, TrainingArguments

    from seqbert.training import SeqBertTrainer

    torch.manual_seed(0)
    config = seqbert.SeqBertConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, num_labels=1
    )
    texts = list(load_bible_pairs()["test"].select(range(64))["source"])
    rows = tokenizer(texts, truncation=True, max_length=64)
    dataset = datasets.Dataset.from_dict({**rows, "labels": [float(i) for i in range(len(texts))]})
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=8, train_sampling_strategy="group_by_length",
        report_to="none", use_cpu=True, dataloader_pin_memory=False,
    )  # fmt: skip
    trainer = SeqBertTrainer(
        model=seqbert.SeqBertForSequenceClassification(config).eval(),
        args=args,
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    output = trainer.predict(dataset)
    assert output.label_ids.tolist() == dataset["labels"]
    with torch.no_grad():
        first = trainer.model(input_ids=torch.tensor([rows["input_ids"][0]])).logits
    torch.testing.assert_close(torch.from_numpy(output.predictions[:1]), first, rtol=0, atol=1e-5)


def test_training_batches_are_grouped_by_target_length(tokenizer, tmp_path):
    """`SeqBertSeq2SeqTrainer` groups length-grouped training batches by the targets (`labels`), the side whose padding
    the decoder computes, or by a `length` column when the dataset has one; on the real verse pairs that leaves far
    less target padding than transformers' grouping by source length."""
    import datasets
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

    from seqbert.training import SeqBertSeq2SeqTrainer

    pairs = load_bible_pairs()["train"].select(range(512))
    rows = tokenizer(list(pairs["source"]), truncation=True, max_length=128)
    rows["labels"] = tokenizer(text_target=list(pairs["target"]), truncation=True, max_length=128)["input_ids"]
    dataset = datasets.Dataset.from_dict(dict(rows))
    config = seqbert.SeqBertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, is_encoder_decoder=True, decoder_start_token_id=tokenizer.cls_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = seqbert.SeqBertForConditionalGeneration(config)

    def target_padding(trainer) -> float:
        torch.manual_seed(0)
        order = list(trainer._get_train_sampler())
        lengths = [len(dataset[i]["labels"]) for i in order]
        batches = [lengths[start : start + 8] for start in range(0, len(lengths), 8)]
        return 1 - sum(map(sum, batches)) / sum(max(batch) * len(batch) for batch in batches)

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, train_sampling_strategy="group_by_length",
        report_to="none", use_cpu=True,
    )  # fmt: skip
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    ours = SeqBertSeq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    assert ours._get_train_sampler().lengths == [len(labels) for labels in dataset["labels"]]
    from transformers import Seq2SeqTrainer

    theirs = Seq2SeqTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    ours_padding, theirs_padding = target_padding(ours), target_padding(theirs)
    assert 2 * ours_padding < theirs_padding, (ours_padding, theirs_padding)  # by source, targets vary in a batch
    with_column = dataset.add_column("length", list(range(len(dataset))))
    ours = SeqBertSeq2SeqTrainer(model=model, args=args, train_dataset=with_column, data_collator=collator)
    assert ours._get_train_sampler().lengths == list(range(len(dataset)))


def test_predict_generates_for_sources_without_labels(tokenizer, tmp_path):
    """transformers' `DataCollatorForSeq2Seq` writes `labels=None` into unlabelled batches, which its
    `Seq2SeqTrainer.prediction_step` takes for labels (a teacher-forced pass without any: the model raises);
    `SeqBertSeq2SeqTrainer` generates for them."""
    import datasets
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    from seqbert.training import SeqBertSeq2SeqTrainer

    sources = tokenizer(list(load_bible_pairs()["test"].select(range(8))["source"]), truncation=True, max_length=32)
    dataset = datasets.Dataset.from_dict({"input_ids": sources["input_ids"]})
    config = seqbert.SeqBertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, is_encoder_decoder=True, decoder_start_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = seqbert.SeqBertForConditionalGeneration(config).eval()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_eval_batch_size=4, predict_with_generate=True,
        generation_max_length=6, report_to="none", use_cpu=True,
    )  # fmt: skip
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    output = SeqBertSeq2SeqTrainer(model=model, args=args, data_collator=collator).predict(dataset)
    assert output.predictions.shape[0] == 8 and output.label_ids is None
    with torch.no_grad():
        first = model.generate(torch.tensor([sources["input_ids"][0]]), max_length=6)
    assert output.predictions[0, : first.shape[1]].tolist() == first[0].tolist()
    with pytest.raises(ValueError, match="needs decoder inputs"):
        Seq2SeqTrainer(model=model, args=args, data_collator=collator).predict(dataset)


def test_scores_the_test_split_with_cpu_inference_copies(seq2seq_run, tmp_path):
    """`--cpu_inference_precisions` generates the test split again with `optimize_for_cpu_inference` copies of the
    model and scores each beside it: the fp32 copy repeats the model's tokens and BLEU exactly, int8 and bf16 their
    own; each with its generation time. A value that is no precision is refused, naming it."""
    import run_seq2seq

    metrics = run_seq2seq.main(
        [
            "--model_name_or_path", str(seq2seq_run), "--no_do_train", "--max_predict_samples", "8",
            "--generation_max_length", "16", "--truecase", "False", "--output_dir", str(tmp_path),
            "--cpu_inference_precisions", "fp32", "int8", "bf16",
        ]
    )  # fmt: skip
    assert metrics["predict_fp32_same_tokens"] == 1.0 and metrics["predict_fp32_bleu"] == metrics["predict_bleu"]
    for precision in ("int8", "bf16"):
        assert 0.0 < metrics[f"predict_{precision}_same_tokens"] <= 1.0
        assert 0.0 <= metrics[f"predict_{precision}_bleu_uncased"] <= 100.0
        assert metrics[f"predict_{precision}_runtime"] > 0
    assert json.loads((tmp_path / "all_results.json").read_text())["predict_int8_chrf"] == metrics["predict_int8_chrf"]
    with pytest.raises(run_seq2seq.ScriptInputError, match=r"cpu_inference_precisions \(\['fp16'\]\) must be among"):
        run_seq2seq.parse_and_check(["--output_dir", str(tmp_path / "other"), "--cpu_inference_precisions", "fp16"])
