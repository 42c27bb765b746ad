"""Scorer/calibration splits and cross-validation folds keep a request's rows together."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from router_models.data import LabelSet
from router_models.training import (
    TrainConfig,
    _split,
    cross_validate,
    request_folds,
    request_groups,
    request_key,
)
from tests.router_models.synthetic import two_type_labels


def doubled(labels: LabelSet) -> LabelSet:
    """Every row twice, as `cat labels.jsonl labels.jsonl` gives."""
    both = np.r_[np.arange(len(labels)), np.arange(len(labels))]
    return labels.subset(both)


def keys(labels: LabelSet, rows: np.ndarray) -> set[str]:
    return {request_key(labels.requests[i]) for i in rows}


def test_without_duplicates_the_splits_are_the_row_splits() -> None:
    labels, _ = two_type_labels(300, 0.6, 0.05, 0.5, seed=4)
    groups = request_groups(labels)
    distinct = len({request_key(r) for r in labels.requests})
    assert int(groups.max()) + 1 == distinct
    if distinct == len(labels):
        assert np.array_equal(groups, np.arange(len(labels)))


def test_a_duplicated_request_never_straddles_a_split_or_a_fold() -> None:
    base, _ = two_type_labels(400, 0.6, 0.05, 0.5, seed=5)
    labels = doubled(base)
    score_rows, cal_rows = _split(labels, TrainConfig())
    assert len(score_rows) + len(cal_rows) == len(labels)
    assert not keys(labels, score_rows) & keys(labels, cal_rows)
    for train, test in request_folds(labels, 5, seed=0):
        assert not keys(labels, train) & keys(labels, test)


def test_duplicates_do_not_inflate_cross_validated_auc(shared_data: Path) -> None:
    """The Llama precision set has no signal a router can find (AUC about 0.5). Doubled
    with row-wise folds, every test row's twin trained the scorer: AUC 0.76. By request,
    the doubled file scores like the original."""
    from sklearn.metrics import roc_auc_score

    from router_models.data import load_labels
    from router_models.labels import adequacy

    base = load_labels([shared_data / "labels/mmlu_llama31_8b_precision.jsonl"])
    for labels in (base, doubled(base)):
        cv = cross_validate(labels, TrainConfig(), 5)
        auc = roc_auc_score(adequacy(labels.correct)[:, 0], cv.proba[:, 0])
        assert auc < 0.6, auc
