"""Accuracy as a local `evaluate` metric module, so that `evaluate.load` works without the Hugging Face Hub.

`evaluate.load("accuracy")` fetches its script from the Hub. This file is the same metric, computed by
`sklearn.metrics.accuracy_score`, loadable from its path:

    import evaluate
    from seqbert.metrics import ACCURACY_PATH

    accuracy = evaluate.load(ACCURACY_PATH)  # or evaluate.load("path/to/seqbert/metrics/accuracy.py")
    accuracy.compute(predictions=[0, 1, 1], references=[0, 1, 0])  # {'accuracy': 0.666...}

`evaluate.load` copies this file into its modules cache and imports it there, so it imports only `datasets`,
`evaluate` and `sklearn` (no relative imports).
"""

import datasets
import evaluate
from sklearn.metrics import accuracy_score


_DESCRIPTION = """
Accuracy is the proportion of correct predictions among all predictions:
Accuracy = (TP + TN) / (TP + TN + FP + FN). Computed by `sklearn.metrics.accuracy_score`.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): predicted label ids.
    references (`list` of `int`): ground-truth label ids.
    normalize (`bool`, defaults to `True`): if `False`, return the number of correct predictions instead of the
        fraction.
    sample_weight (`list` of `float`, optional): per-example weights.

Returns:
    `dict` with one key, `accuracy` (`float`): the fraction (or, with `normalize=False`, the count) of correct
    predictions.

Examples:
    >>> accuracy = evaluate.load("path/to/seqbert/metrics/accuracy.py")
    >>> accuracy.compute(references=[0, 1, 2, 0, 1, 2], predictions=[0, 1, 1, 2, 1, 0])
    {'accuracy': 0.5}
"""

_CITATION = """
@article{scikit-learn,
  title={Scikit-learn: Machine Learning in {P}ython},
  author={Pedregosa, F. and Varoquaux, G. and Gramfort, A. and Michel, V. and Thirion, B. and Grisel, O. and
          Blondel, M. and Prettenhofer, P. and Weiss, R. and Dubourg, V. and Vanderplas, J. and Passos, A. and
          Cournapeau, D. and Brucher, M. and Perrot, M. and Duchesnay, E.},
  journal={Journal of Machine Learning Research},
  volume={12},
  pages={2825--2830},
  year={2011}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    """Accuracy of label-id predictions, computed by `sklearn.metrics.accuracy_score`."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}),
            reference_urls=["https://scikit-learn.org/stable/modules/generated/sklearn.metrics.accuracy_score.html"],
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        return {
            "accuracy": float(accuracy_score(references, predictions, normalize=normalize, sample_weight=sample_weight))
        }
