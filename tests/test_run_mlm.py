"""scripts/examples/run_mlm.py on the real offline Bible text: the command line a user runs and the files it promises, the data
it builds (held-out chapters, blocks, masking, the on-disk cache), and continued pretraining of the real MiniLM BERT."""

import collections
import itertools
import json
import math
import statistics
from pathlib import Path

import pytest
import run_mlm  # noqa: E402
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForMaskedLM, AutoTokenizer

import seqbert
from seqbert.data import group_texts, load_bible_text, minilm_checkpoint_path


TINY_OVERRIDES = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=37"
BLOCK = 64  # --max_seq_length of the `mlm_run` fixture
NUM_BIBLE_VERSES = 31099  # verses both translations have (../shared/DATA.md)


def cache_dir_of(run_dir: Path) -> Path:
    return run_dir.parent / "datasets_cache"


@pytest.fixture(scope="module")
def run_tokenizer():
    """The tokenizer as the `mlm_run` command loads it under HF_HUB_OFFLINE=1: transformers then records
    `local_files_only=True` in it, which `datasets` hashes into the cache key of the tokenization."""
    return AutoTokenizer.from_pretrained(str(minilm_checkpoint_path()), local_files_only=True)


def token_stream(tokenizer, texts: list[str]) -> dict[str, list[int]]:
    """The texts tokenized one by one with special tokens and concatenated: what the blocks must cut up."""
    encoded = tokenizer(texts, return_special_tokens_mask=True)
    return {name: list(itertools.chain.from_iterable(encoded[name])) for name in encoded}


def test_bible_text_holds_out_whole_chapters_in_both_versions(mlm_run):
    raw = load_bible_text(cache_dir=cache_dir_of(mlm_run))
    rows = {split: raw[split].to_list() for split in ("train", "validation")}
    assert len(rows["train"]) + len(rows["validation"]) == 2 * NUM_BIBLE_VERSES
    ids = {split: {row["verse_id"] for row in split_rows} for split, split_rows in rows.items()}
    assert len(ids["train"] | ids["validation"]) == NUM_BIBLE_VERSES
    assert not ids["train"] & ids["validation"]
    for split_rows in rows.values():  # every verse twice in its split: King James and World English
        assert collections.Counter(row["version"] for row in split_rows) == {
            "kjv": len(split_rows) // 2,
            "web": len(split_rows) // 2,
        }
        assert {(row["verse_id"], row["version"]) for row in split_rows} == {
            (row["verse_id"], version) for row in split_rows for version in ("kjv", "web")
        }
    chapters = {split: {verse_id // 1000 for verse_id in split_ids} for split, split_ids in ids.items()}
    assert len(chapters["validation"]) == 25 and not chapters["train"] & chapters["validation"]
    assert not any("[" in row["text"] or "]" in row["text"] for split_rows in rows.values() for row in split_rows)
    # Deterministic: the same split when built again from scratch in another folder.
    assert (
        load_bible_text(cache_dir=mlm_run.parent / "rebuilt")["validation"]["verse_id"] == raw["validation"]["verse_id"]
    )


def test_group_texts_cuts_the_token_stream_into_full_blocks_in_order(mlm_run, tokenizer):
    texts = load_bible_text(cache_dir=cache_dir_of(mlm_run))["train"]["text"][:300]
    encoded = tokenizer(texts, return_special_tokens_mask=True)
    stream = token_stream(tokenizer, texts)
    for block_size in (7, 64):
        blocks = group_texts(dict(encoded), block_size)
        assert set(blocks) == set(encoded)
        usable = len(stream["input_ids"]) // block_size * block_size
        for name, column in blocks.items():
            assert all(len(block) == block_size for block in column)
            assert list(itertools.chain.from_iterable(column)) == stream[name][:usable]
    with pytest.raises(ValueError, match="block_size"):
        group_texts(dict(encoded), 0)


def test_blocks_of_the_run_are_the_start_of_each_split_token_stream(mlm_run, run_tokenizer):
    tokenizer = run_tokenizer
    raw = load_bible_text(cache_dir=cache_dir_of(mlm_run))
    blocks = run_mlm.tokenize_and_group(raw, tokenizer, "text", BLOCK)
    for split in ("train", "validation"):
        assert all(len(ids) == BLOCK for ids in blocks[split]["input_ids"])
        # The first map batch holds 1,000 verses, far more than 20 blocks: the blocks are the stream, in order.
        stream = token_stream(tokenizer, raw[split]["text"][:100])
        first = blocks[split].select(range(20))
        for name in ("input_ids", "special_tokens_mask", "attention_mask"):
            assert list(itertools.chain.from_iterable(first[name])) == stream[name][: 20 * BLOCK]


def test_tokenization_cache_written_by_the_command_line_run_is_reused(mlm_run):
    cache_dir = cache_dir_of(mlm_run)
    before = {path: path.stat().st_mtime_ns for path in cache_dir.rglob("*") if path.is_file()}
    # A fresh tokenizer, loaded as in a new run.
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_checkpoint_path()), local_files_only=True)
    blocks = run_mlm.tokenize_and_group(load_bible_text(cache_dir=cache_dir), tokenizer, "text", BLOCK)
    after = {path: path.stat().st_mtime_ns for path in cache_dir.rglob("*") if path.is_file()}
    assert after == before  # nothing tokenized or grouped again
    finished = (mlm_run / "all_results.json").stat().st_mtime_ns
    for split in ("train", "validation"):
        files = [Path(entry["filename"]) for entry in blocks[split].cache_files]
        assert files and all(path in before and before[path] < finished for path in files)  # written by the run


def test_masking_picks_15_percent_of_ordinary_tokens_80_10_10(mlm_run, run_tokenizer):
    tokenizer = run_tokenizer
    blocks = run_mlm.tokenize_and_group(load_bible_text(cache_dir=cache_dir_of(mlm_run)), tokenizer, "text", BLOCK)
    examples = blocks["train"].select(range(1000)).to_list()
    batch = run_mlm.masking_collator(tokenizer, mlm_probability=0.15, seed=0)(examples)
    original = torch.tensor([example["input_ids"] for example in examples])
    special = torch.tensor([example["special_tokens_mask"] for example in examples]).bool()
    inputs, labels = batch["input_ids"], batch["labels"]
    picked = labels != -100

    assert special.any() and not picked[special].any() and torch.equal(inputs[special], original[special])
    assert torch.equal(labels[picked], original[picked])  # labels: the original id where picked, -100 elsewhere
    assert torch.equal(inputs[~picked], original[~picked])  # only picked tokens change

    def within_5_sigma(count: int, total: int, p: float) -> bool:
        return abs(count / total - p) <= 5 * math.sqrt(p * (1 - p) / total)

    ordinary = int((~special).sum())
    assert ordinary > 50_000
    assert within_5_sigma(int(picked.sum()), ordinary, 0.15)
    n_picked = int(picked.sum())
    masked = int((inputs[picked] == tokenizer.mask_token_id).sum())
    kept = int((inputs[picked] == original[picked]).sum())
    replaced = n_picked - masked - kept
    assert within_5_sigma(masked, n_picked, 0.8)
    assert within_5_sigma(kept, n_picked, 0.1)  # (a random draw equal to the original, p = 1/30522, counts here)
    assert within_5_sigma(replaced, n_picked, 0.1)


def test_command_line_run_writes_model_tokenizer_metrics_loss_curve_and_card(mlm_run, tokenizer):
    results = json.loads((mlm_run / "all_results.json").read_text())
    assert results["train_samples"] == 64 and results["eval_samples"] == 32
    assert results["eval_perplexity"] == pytest.approx(math.exp(results["eval_loss"]), rel=1e-9)
    assert 0.0 <= results["eval_accuracy"] <= 1.0
    for name in ("config.json", "model.safetensors", "tokenizer.json", "trainer_state.json", "README.md"):
        assert (mlm_run / name).is_file(), name
    assert (mlm_run / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The unigram baseline, recomputed here from the tokens of the 64 training and 32 validation blocks.
    raw = load_bible_text(cache_dir=cache_dir_of(mlm_run))
    train, validation = (token_stream(tokenizer, raw[split]["text"][:300]) for split in ("train", "validation"))

    def ordinary(stream, n):
        return [t for t, s in zip(stream["input_ids"][:n], stream["special_tokens_mask"][:n], strict=True) if not s]

    counts = collections.Counter(ordinary(train, 64 * BLOCK))
    total = sum(counts.values()) + len(tokenizer)
    eval_tokens = ordinary(validation, 32 * BLOCK)
    expected = math.exp(-sum(math.log((counts[t] + 1) / total) for t in eval_tokens) / len(eval_tokens))
    assert results["eval_unigram_perplexity"] == pytest.approx(expected, rel=1e-6)

    history = json.loads((mlm_run / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    # The output bias starts at the log unigram frequencies: the first loss is far below that of a uniform guess.
    assert losses[0] < math.log(len(tokenizer)) - 1.0

    model = AutoModelForMaskedLM.from_pretrained(mlm_run)
    assert type(model) is seqbert.SeqBertForMaskedLM
    config = model.config
    assert (config.norm_placement, config.hidden_size, config.num_hidden_layers) == ("pre", 32, 2)
    assert config.vocab_size == len(tokenizer) and config.pad_token_id == tokenizer.pad_token_id

    card = ModelCard.load(mlm_run / "README.md")
    assert card.data.pipeline_tag == "fill-mask"
    metrics = {m.metric_type: m.metric_value for m in card.data.eval_results}
    assert metrics["perplexity"] == pytest.approx(results["eval_perplexity"])
    assert "unigram" in card.text


def test_continued_pretraining_of_the_minilm_bert_checkpoint_on_a_text_file(mlm_run, tmp_path):
    verses = load_bible_text(cache_dir=cache_dir_of(mlm_run))["validation"]["text"][:400]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(verses) + "\n", encoding="utf-8")
    output_dir = tmp_path / "minilm_mlm"
    metrics = run_mlm.main(
        [
            "--model_name_or_path", str(minilm_checkpoint_path()), "--output_dir", str(output_dir),
            "--train_file", str(corpus), "--validation_split_percentage", "10", "--max_seq_length", str(BLOCK),
            "--max_train_samples", "8", "--max_eval_samples", "8", "--max_steps", "2",
            "--per_device_train_batch_size", "4", "--eval_strategy", "no", "--learning_rate", "5e-5",
            "--cache_dir", str(tmp_path / "cache"),
        ]
    )  # fmt: skip
    assert metrics["train_samples"] == 8 and metrics["eval_samples"] == 8
    assert math.isfinite(metrics["eval_perplexity"])
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]), rel=1e-9)
    model = AutoModelForMaskedLM.from_pretrained(output_dir)
    assert type(model) is seqbert.SeqBertForMaskedLM
    assert (model.config.norm_placement, model.config.hidden_size, model.config.num_hidden_layers) == ("post", 384, 6)
    assert ModelCard.load(output_dir / "README.md").data.base_model == "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.parametrize("enabled", [True, False])
def test_unigram_bias_init_starts_the_output_bias_at_log_frequencies(enabled, mlm_run, tmp_path, tokenizer):
    verses = load_bible_text(cache_dir=cache_dir_of(mlm_run))["validation"]["text"][:200]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(verses) + "\n", encoding="utf-8")
    output_dir = tmp_path / "run"
    run_mlm.main(
        [
            "--train_file", str(corpus), "--validation_split_percentage", "10", "--config_overrides", TINY_OVERRIDES,
            "--max_seq_length", str(BLOCK), "--max_steps", "1", "--learning_rate", "0", "--eval_strategy", "no",
            "--do_eval", "False", "--unigram_bias_init", str(enabled), "--output_dir", str(output_dir),
            "--cache_dir", str(tmp_path / "cache"), "--tokenizer_name", str(minilm_checkpoint_path()),
        ]
    )  # fmt: skip
    bias = AutoModelForMaskedLM.from_pretrained(output_dir).get_output_embeddings().bias.detach()
    if not enabled:
        assert torch.count_nonzero(bias) == 0  # BERT's init (learning rate 0 leaves it as it was)
        return
    # Training rows: the verses after the first 10% (validation); their blocks: the whole blocks of the stream.
    stream = token_stream(tokenizer, verses[20:])
    usable = len(stream["input_ids"]) // BLOCK * BLOCK
    ids = [
        t for t, s in zip(stream["input_ids"][:usable], stream["special_tokens_mask"][:usable], strict=True) if not s
    ]
    counts = collections.Counter(ids)
    total = len(ids) + len(tokenizer)
    expected = torch.tensor([math.log((counts[i] + 1) / total) for i in range(len(tokenizer))])
    torch.testing.assert_close(bias, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["--norm_placement", "middle"], "norm_placement"),
        (["--model_name_or_path", "some/bert", "--config_overrides", "hidden_size=64"], "config_overrides"),
        (["--model_name_or_path", "some/bert", "--norm_placement", "post"], "norm_placement"),
        (["--mlm_probability", "1.5"], "mlm_probability"),
        (["--max_seq_length", "1"], "max_seq_length"),
        (["--train_file", "corpus.parquet"], "train_file"),
        (["--validation_split_percentage", "100"], "validation_split_percentage"),
    ],
)
def test_bad_arguments_raise_a_value_error_naming_them(argv, name, tmp_path):
    with pytest.raises(ValueError, match=name):
        run_mlm.main([*argv, "--output_dir", str(tmp_path)])


@pytest.mark.parametrize("overrides", ["hidden_sizes=64", "hidden_size", "hidden_size=30", "vocab_size=100"])
def test_bad_config_overrides_raise_a_value_error_naming_them(overrides, tokenizer):
    with pytest.raises(ValueError, match="config_overrides"):
        run_mlm.scratch_config(tokenizer, "pre", overrides)


def test_config_overrides_and_norm_placement_shape_the_new_model(tokenizer):
    config = run_mlm.scratch_config(tokenizer, "post", TINY_OVERRIDES + ",position_embedding_type=sinusoidal")
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (32, 2, 37)
    assert (config.norm_placement, config.position_embedding_type) == ("post", "sinusoidal")
    assert config.vocab_size == len(tokenizer) and config.pad_token_id == tokenizer.pad_token_id


def test_padding_free_batches_pack_whole_verses_and_train_like_padded_ones(mlm_run, tmp_path, tokenizer):
    """`--padding_free`: each verse a sequence, a batch one row without padding. The collator's rows are the verses
    end to end, positions restart at each verse, and the masked-LM loss of a packed batch equals the loss of the
    same masked verses padded (SeqBERT attends within each verse)."""
    verses = load_bible_text(cache_dir=cache_dir_of(mlm_run))["validation"]["text"][:120]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(verses) + "\n", encoding="utf-8")
    examples = [
        {k: v for k, v in tokenizer(text, return_special_tokens_mask=True).items() if k != "token_type_ids"}
        for text in verses[:6]
    ]
    collator = run_mlm.masking_collator(tokenizer, seed=0, padding_free=True)
    packed = collator(examples)
    assert set(packed) == {"input_ids", "labels", "position_ids"} and packed["input_ids"].shape[0] == 1
    lengths = [len(example["input_ids"]) for example in examples]
    assert packed["position_ids"][0].tolist() == [i for n in lengths for i in range(n)]
    masked = packed["labels"][0] != -100
    original = torch.tensor([i for example in examples for i in example["input_ids"]])
    assert torch.equal(packed["labels"][0][masked], original[masked]) and masked.any()

    torch.manual_seed(0)
    model = seqbert.SeqBertForMaskedLM(run_mlm.scratch_config(tokenizer, config_overrides=TINY_OVERRIDES)).eval()
    rows = torch.split(packed["input_ids"][0], lengths)
    row_labels = torch.split(packed["labels"][0], lengths)
    width = max(lengths)
    padded = {
        "input_ids": torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows]),
        "attention_mask": torch.stack([torch.arange(width) < len(r) for r in rows]).long(),
        "labels": torch.stack([torch.nn.functional.pad(r, (0, width - len(r)), value=-100) for r in row_labels]),
    }
    with torch.no_grad():
        assert model(**packed).loss.item() == pytest.approx(model(**padded).loss.item(), abs=1e-5)

    metrics = run_mlm.main(
        [
            "--train_file", str(corpus), "--validation_split_percentage", "10", "--config_overrides", TINY_OVERRIDES,
            "--padding_free", "--max_seq_length", str(BLOCK), "--max_steps", "3", "--eval_strategy", "no",
            "--per_device_train_batch_size", "8", "--output_dir", str(tmp_path / "run"),
            "--cache_dir", str(tmp_path / "cache"),
        ]
    )  # fmt: skip
    assert metrics["eval_samples"] == 12 and math.isfinite(metrics["eval_perplexity"])  # one sample a verse
    card = ModelCard.load(tmp_path / "run" / "README.md")
    assert "packed into one row without padding" in card.text


@pytest.mark.parametrize("source", ["command line", "json file"])
def test_continued_pretraining_takes_its_own_recipe_and_explicit_options_win(source, tmp_path, monkeypatch):
    """With --model_name_or_path the defaults are run_mlm.CONTINUED_PRETRAINING (a learning rate for a pretrained
    model, BERT's masking), from scratch they stay the from-scratch recipe; an option given explicitly wins."""

    def parsed(arguments: dict) -> tuple:
        if source == "command line":
            return run_mlm.parse_and_check([f"--{k}={v}" for k, v in arguments.items()])[:3]
        path = tmp_path / "args.json"
        path.write_text(json.dumps(arguments))
        monkeypatch.setattr("sys.argv", ["run_mlm.py", str(path)])
        return run_mlm.parse_and_check(None)[:3]

    def recipe(model_args, data_args, training_args) -> dict:
        return {
            "learning_rate": training_args.learning_rate,
            "mlm_probability": data_args.mlm_probability,
            "max_steps": training_args.max_steps,
            "eval_steps": training_args.eval_steps,
        }

    checkpoint = {"model_name_or_path": str(minilm_checkpoint_path()), "output_dir": str(tmp_path / "continued")}
    assert recipe(*parsed(checkpoint)) == run_mlm.CONTINUED_PRETRAINING
    assert recipe(*parsed({**checkpoint, "learning_rate": 2e-3}))["learning_rate"] == 2e-3
    scratch = recipe(*parsed({"output_dir": str(tmp_path / "scratch")}))
    assert scratch == {"learning_rate": 2e-3, "mlm_probability": 0.3, "max_steps": 6000, "eval_steps": 1000}


# The training precision: timed on this CPU unless --bf16 is given (run_mlm.training_precision). The steps are real
# (fp32 and bf16 autocast on a real model and batch); only the clock is scripted, so the choice is deterministic.


class StepClock:
    """A clock for `time_training_precisions` under which each timed step lasts `seconds(bf16, round)` and each of the
    two warm-up steps `warmup`: the model's forward records whether it ran under bf16 autocast (and in train mode), and
    the step's end reads that record."""

    def __init__(self, model, seconds, warmup: float = 0.0):
        self.seconds, self.warmup, self.now, self.reads, self.ran = seconds, warmup, 0.0, 0, []
        self.hook = model.register_forward_pre_hook(self._record)

    def _record(self, module, args):
        bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        self.ran.append((bf16, module.training))

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # the end of a step: the first two are the warm-ups, then rounds of two
            ended = self.reads // 2
            self.now += self.warmup if ended <= 2 else self.seconds(self.ran[-1][0], (ended - 3) // 2)
        return self.now


def per_round(fp32: list[float] | float, bf16: list[float] | float):
    """`StepClock` seconds: fp32 steps of `fp32` s, bf16 steps of `bf16` s; a list gives each round's."""

    def seconds(is_bf16: bool, round_index: int) -> float:
        chosen = bf16 if is_bf16 else fp32
        return chosen[round_index] if isinstance(chosen, list) else chosen

    return seconds


def scripted_timing(monkeypatch, seconds, warmup: float = 0.0) -> list[StepClock]:
    """Make run_mlm's timing run its real steps under a `StepClock` of `seconds`; returns the clocks it used."""
    real, clocks = run_mlm.time_training_precisions, []

    def timed(model, batch, **kwargs):
        clocks.append(StepClock(model, seconds, warmup))
        try:
            return real(model, batch, clock=clocks[-1], **kwargs)
        finally:
            clocks[-1].hook.remove()

    monkeypatch.setattr(run_mlm, "time_training_precisions", timed)
    return clocks


def tiny_batch(tokenizer, rows: int = 4, length: int = 24) -> dict:
    generator = torch.Generator().manual_seed(0)
    examples = [
        {
            "input_ids": torch.randint(1000, 2000, (length,), generator=generator).tolist(),
            "special_tokens_mask": [0] * length,
        }
        for _ in range(rows)
    ]
    return run_mlm.masking_collator(tokenizer, 0.3, seed=0)(examples)


def test_time_training_precisions_takes_turns_and_leaves_the_model_as_it_was(tokenizer):
    from seqbert.training import time_training_precisions

    torch.manual_seed(0)
    model = seqbert.SeqBertForMaskedLM(run_mlm.scratch_config(tokenizer, config_overrides=TINY_OVERRIDES)).eval()
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    batch, rng = tiny_batch(tokenizer), torch.get_rng_state()

    clock = StepClock(model, per_round(1.0, [0.5, 0.8, 0.4, 0.6]))
    times = time_training_precisions(model, batch, rounds=7, min_rounds=3, budget_seconds=6.0, clock=clock)
    clock.hook.remove()
    # Warm-up fp32 and bf16, then rounds whose first step alternates; every step in train mode, bf16 under autocast.
    order = [bf16 for bf16, _ in clock.ran]
    assert order == [False, True, False, True, True, False, False, True, True, False]
    assert all(training for _, training in clock.ran)
    # Rounds go on past min_rounds until the budget is spent: 1.5 + 1.8 + 1.4 = 4.7 s after 3, 6.3 s after 4.
    assert times.fp32 == pytest.approx((1.0, 1.0, 1.0, 1.0)) and times.bf16 == pytest.approx((0.5, 0.8, 0.4, 0.6))
    assert times.ratios == pytest.approx((2.0, 1.25, 2.5, 1 / 0.6)) and times.tokens == batch["input_ids"].numel()
    # The model as it was: weights, no gradients, eval mode; and the random state dropout draws from.
    assert all(torch.equal(value, weights[name]) for name, value in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and not model.training
    assert torch.equal(torch.get_rng_state(), rng)

    next(model.parameters()).grad = torch.zeros_like(next(model.parameters()))
    with pytest.raises(ValueError, match="already holds gradients"):
        time_training_precisions(model, batch)
    with pytest.raises(ValueError, match=r"rounds \(2\) and min_rounds \(3\)"):
        time_training_precisions(model, batch, rounds=2)


@pytest.mark.parametrize(
    ("ratios", "verdict", "fp32"),
    [
        ((1.45, 1.45, 1.45), "bf16 autocast", None),  # the default model, Zen 4 with AVX512_BF16 (docs/fine-tuning.md)
        ((0.73, 0.73, 0.73), "fp32", None),  # bert-base width, Xeon with AVX512_BF16 and no AMX (issue 58)
        ((1.05, 1.05, 1.05), "fp32", None),  # faster, but within what a few steps on a shared machine spread
        ((1.5, 1.5, 1.05), "bf16 autocast", None),  # two rounds of three
        ((1.2, 1.2, 1.2, 0.95, 0.95, 0.95, 1.2), "fp32 (the rounds disagree", None),  # median 1.2, in 4 rounds of 7
        ((1.5, 1.5, 1.5), "fp32 (the timing was unsteady", (0.2, 0.34, 0.34)),  # most rounds 1.7x the fastest
        ((1.5, 1.5, 1.5), "bf16 autocast", (0.2, 0.2, 0.34)),  # one disturbed round of three
    ],
)
def test_bf16_is_the_default_where_steady_rounds_find_it_clearly_faster(ratios, verdict, fp32):
    from seqbert.training import TrainingStepTimes, bf16_is_faster, choose_training_precision

    fp32 = fp32 or tuple(0.2 for _ in ratios)
    times = TrainingStepTimes(fp32=fp32, bf16=tuple(f / r for f, r in zip(fp32, ratios, strict=True)), tokens=2048)
    record = choose_training_precision(times)
    assert record.bf16 is (verdict == "bf16 autocast") and record.reason.startswith(verdict)
    assert bf16_is_faster(times) is (sum(r >= 1.1 for r in ratios) >= 2 / 3 * len(ratios))
    assert (
        f"timed on this CPU: fp32 {statistics.median(fp32):.3f} s [{min(fp32):.3f}-{max(fp32):.3f}], " in record.reason
    )
    assert f"bf16 {statistics.median(ratios):.2f}x fp32 [{min(ratios):.2f}-{max(ratios):.2f}]" in record.reason
    with pytest.raises(ValueError, match=r"fp32 \(2 rounds\) and bf16 \(1 rounds\)"):
        TrainingStepTimes(fp32=(1.0, 1.0), bf16=(1.0,), tokens=1)


def bible_corpus(mlm_run, tmp_path: Path, verses: int = 200) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(load_bible_text(cache_dir=cache_dir_of(mlm_run))["validation"]["text"][:verses]) + "\n")
    return corpus


@pytest.mark.parametrize(("bf16_seconds", "chosen"), [(0.69, True), (1.37, False)])  # bf16 1.45x and 0.73x fp32
def test_the_run_trains_in_the_precision_its_timed_steps_favour(
    bf16_seconds, chosen, mlm_run, tmp_path, caplog, monkeypatch
):
    clocks = scripted_timing(monkeypatch, per_round(1.0, bf16_seconds))
    output_dir = tmp_path / "run"
    run_mlm.main(
        [
            "--train_file", str(bible_corpus(mlm_run, tmp_path)), "--validation_split_percentage", "10",
            "--config_overrides", TINY_OVERRIDES, "--tokenizer_name", str(minilm_checkpoint_path()),
            "--max_seq_length", str(BLOCK), "--max_steps", "2", "--eval_strategy", "no", "--do_eval", "False",
            "--output_dir", str(output_dir), "--cache_dir", str(tmp_path / "cache"),
        ]
    )  # fmt: skip
    # Timed once, on the run's model and batch: 3 rounds (1 s steps spend the 3 s budget), each precision run for real.
    (clock,) = clocks
    assert [bf16 for bf16, _ in clock.ran] == [False, True, False, True, True, False, False, True]
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Training precision: ")]
    assert len(lines) == 1, lines
    verdict = "bf16 autocast" if chosen else "fp32"
    assert lines[0].startswith(f"Training precision: {verdict}, timed on this CPU: fp32 1.000 s [1.000-1.000], ")
    assert f"bf16 autocast {bf16_seconds:.3f} s" in lines[0] and f"bf16 {1 / bf16_seconds:.2f}x fp32" in lines[0]
    # What the run trained in: its card, and the record a resumed run reads, without timing again.
    assert f"| precision | {'bf16 mixed' if chosen else 'fp32'} |" in (output_dir / "README.md").read_text()
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["TrainingPrecisionRecord"]["args"]["bf16"] is chosen
    args = run_mlm.parse_and_check(["--output_dir", str(tmp_path / "resumed")])[2]
    resumed = run_mlm.training_precision(args, None, [{}], None, BLOCK, str(output_dir))
    assert resumed.bf16 is chosen and resumed.reason.startswith(f"as the interrupted run in {output_dir}: {verdict}")
    assert len(clocks) == 1


def timed_precision(tokenizer, tmp_path: Path):
    """`run_mlm.training_precision` of a run with the default arguments, timed on a tiny model and 16 examples."""
    torch.manual_seed(0)
    model = seqbert.SeqBertForMaskedLM(run_mlm.scratch_config(tokenizer, config_overrides=TINY_OVERRIDES))
    examples = [{"input_ids": [101, *range(2000, 2022), 102], "special_tokens_mask": [1, *[0] * 22, 1]}] * 16
    args = run_mlm.parse_and_check(["--output_dir", str(tmp_path)])[2]
    return run_mlm.training_precision(args, model, examples, run_mlm.masking_collator(tokenizer, 0.3, 42), 24, None)


def test_an_unsteady_timing_keeps_fp32_and_says_so(tokenizer, tmp_path, monkeypatch):
    """Another process holds the CPU through most rounds: 5 of 7 run 3x slower than the fastest, in both precisions.
    Every round has bf16 1.67x faster, yet the timing is too unsteady to decide, so the run keeps fp32."""
    slow = [1, 3, 3, 3, 1, 3, 3]
    clocks = scripted_timing(monkeypatch, per_round([0.1 * f for f in slow], [0.06 * f for f in slow]))
    record = timed_precision(tokenizer, tmp_path)
    assert len(clocks[0].ran) == 2 + 2 * 7  # the fast steps never spend the budget: all 7 rounds
    assert record.bf16 is False
    assert record.reason.startswith("fp32 (the timing was unsteady: most rounds of a precision ran over 1.5x slower")
    assert "fp32 0.300 s [0.100-0.300], bf16 autocast 0.180 s [0.060-0.180]" in record.reason
    assert "bf16 1.67x fp32 [1.67-1.67], at least 1.1x in 7 of 7 rounds" in record.reason


def test_a_timing_that_runs_past_its_limit_keeps_fp32(tokenizer, tmp_path, monkeypatch):
    """Steps many times slower than alone (another process holding the CPU): the warm-ups take 4 s each and a round
    2 s, so the timing stops at its 10 s limit after one round, however much faster bf16 read there."""
    clocks = scripted_timing(monkeypatch, per_round(1.5, 0.5), warmup=4.0)
    record = timed_precision(tokenizer, tmp_path)
    assert len(clocks[0].ran) == 2 + 2 and record.bf16 is False
    assert record.reason.startswith("fp32 (the timing stopped at its time limit after 1 of 3 rounds")
    assert "bf16 3.00x fp32" in record.reason


@pytest.mark.parametrize("flag", ["True", "False"])
def test_an_explicit_bf16_flag_wins_without_timing(flag, tmp_path, monkeypatch):
    def not_timed(*args, **kwargs):
        raise AssertionError("timed although --bf16 was given")

    monkeypatch.setattr(run_mlm, "time_training_precisions", not_timed)
    defaults = run_mlm.parse_and_check(["--output_dir", str(tmp_path)])[2]
    assert defaults.bf16 is None and defaults.use_cpu is (not torch.accelerator.is_available())  # None: timed at start
    # A checkpoint that records the other precision: the flag wins over it too.
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    recorded = {"TrainingPrecisionRecord": {"args": {"bf16": flag != "True", "reason": "timed"}, "attributes": {}}}
    (checkpoint / "trainer_state.json").write_text(json.dumps({"stateful_callbacks": recorded}))
    args = run_mlm.parse_and_check(["--output_dir", str(tmp_path / "new"), "--bf16", flag])[2]
    record = run_mlm.training_precision(args, None, [{}], None, BLOCK, str(checkpoint))
    assert record.bf16 is (flag == "True") and record.reason == f"--bf16 {flag} given"
    without_flag = run_mlm.training_precision(defaults, None, [{}], None, BLOCK, str(checkpoint))
    assert without_flag.bf16 is (flag != "True")


def test_a_seeded_run_repeats_its_trained_tokenizer_and_losses(mlm_run, tmp_path):
    """The same command twice (same seed, precision and datasets cache): the same trained WordPiece vocabulary, byte
    for byte, and the same losses. `tokenizers`' trainer alone numbers tokens differently at every training
    (huggingface/tokenizers#1794), so the first run keeps its vocabulary in the datasets cache and the second reads it.
    """
    corpus = bible_corpus(mlm_run, tmp_path)

    def run(name: str) -> tuple[Path, dict]:
        output_dir = tmp_path / name
        metrics = run_mlm.main(
            [
                "--train_file", str(corpus), "--validation_split_percentage", "10", "--config_overrides", TINY_OVERRIDES,
                "--tokenizer_vocab_size", "500", "--max_seq_length", str(BLOCK), "--max_steps", "3", "--logging_steps",
                "1", "--eval_strategy", "no", "--bf16", "False", "--output_dir", str(output_dir),
                "--cache_dir", str(tmp_path / "cache"),
            ]
        )  # fmt: skip
        return output_dir, metrics

    (first, first_metrics), (second, second_metrics) = run("first"), run("second")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert len(AutoTokenizer.from_pretrained(second)) == 500

    def losses(output_dir: Path) -> list[float]:
        history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
        return [entry["loss"] for entry in history if "loss" in entry]

    assert len(losses(first)) == 3 and losses(first) == losses(second)
    for name in ("train_loss", "eval_loss", "eval_unigram_perplexity"):
        assert first_metrics[name] == second_metrics[name], name
    assert len(list((tmp_path / "cache" / run_mlm.TRAINED_TOKENIZERS_FOLDER).iterdir())) == 1
