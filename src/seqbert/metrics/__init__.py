"""Local `evaluate` metric modules, loadable with `evaluate.load(path)` without the Hugging Face Hub.

Each metric is a standalone script (it imports only `datasets`, `evaluate` and its computing library), because
`evaluate.load` copies the file into its own modules cache before importing it.
"""

from pathlib import Path


# `evaluate.load(ACCURACY_PATH)` gives the accuracy metric, computed by `sklearn.metrics.accuracy_score`.
ACCURACY_PATH = str(Path(__file__).with_name("accuracy.py"))

__all__ = ["ACCURACY_PATH"]
