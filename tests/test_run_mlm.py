"""scripts/examples/run_mlm.py on the real offline Bible text: the command line a user runs and the files it promises, the data
it builds (held-out chapters, blocks, masking, the on-disk cache), and continued pretraining of the real MiniLM BERT."""

import collections
import itertools
import json
import math
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
