"""Fitting a `RouterModel`: scorer on one split, isotonic calibration on rows it never saw.

`fit_router` holds out `calibration_fraction` of the rows for the calibrators (the scorer is
trained on the rest), or with `calibration="crossfit"` scores every row with a scorer trained on
the other `calibration_folds - 1` folds, fits the calibrators on those out-of-fold scores and
then trains the shipped scorer on all rows (scikit-learn's `CalibratedClassifierCV(ensemble=
False)` recipe): no calibration score comes from a scorer that saw its row, and the scorer gets
all the data, at the price of `calibration_folds + 1` scorer fits and a small mismatch (the final
scorer is a little sharper than the fold scorers whose scores were calibrated).

With `scorer_labels` the scorer is trained on a different data set and every row of `labels`
calibrates it; rows of `scorer_labels` whose request text also occurs in `labels` are dropped
first, so no calibration request was seen by the scorer. That is how the default model joins a
large cross-model set (difficulty signal) with the small same-checkpoint precision set (what
"adequate" means for precision tiers).

`cross_validate` runs the whole recipe per fold and returns out-of-fold probabilities.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from router_models.calibration import TierCalibration
from router_models.data import LabelSet
from router_models.folds import grouped_kfold
from router_models.labels import Label, adequacy, difficulty
from router_models.model import RouterModel
from router_models.ngrams import GramSpec
from router_models.request import view_request
from router_models.scorers import Scorer, make_scorer
from router_models.vectorize import FeatureMatrix, featurize

__all__ = [
    "CrossValidation",
    "TrainConfig",
    "calibrate",
    "cross_validate",
    "fit_router",
    "fit_scorer_elsewhere",
    "request_key",
    "unseen_rows",
]

Progress = Callable[[int], None]


@dataclass(frozen=True)
class TrainConfig:
    """How to train: scorer name and parameters, label, calibration split, hashing, seed."""

    scorer: str = "linear"
    scorer_params: Mapping[str, Any] = field(default_factory=dict)
    label: Label = "relative"
    calibration: Literal["holdout", "crossfit"] = "holdout"
    calibration_fraction: float = 0.25
    calibration_folds: int = 5
    spec: GramSpec = field(default_factory=GramSpec)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.05 <= self.calibration_fraction <= 0.8:
            raise ValueError("calibration_fraction must be in [0.05, 0.8]")
        if self.calibration not in ("holdout", "crossfit"):
            raise ValueError(f"unknown calibration {self.calibration!r}: holdout or crossfit")
        if self.calibration_folds < 2:
            raise ValueError("calibration_folds must be at least 2")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["scorer_params"] = dict(self.scorer_params)
        return out


@dataclass(frozen=True)
class CrossValidation:
    """Out-of-fold results: every row predicted by a model that never trained on it."""

    proba: NDArray[np.float64]  # (n, K)
    score: NDArray[np.float64]  # (n,)
    fold: NDArray[np.int64]  # (n,) fold index of each row


def request_key(request: Mapping[str, Any]) -> str:
    """Identity of a request for de-duplication: its routed text and system prompt."""
    view = view_request(request)
    return json.dumps([view.system_text, view.text])


def fit_router(
    labels: LabelSet,
    config: TrainConfig | None = None,
    *,
    features: FeatureMatrix | None = None,
    scorer_labels: LabelSet | None = None,
    progress: Progress | None = None,
) -> RouterModel:
    """Train a router on `labels` (and optionally a separate scorer set); see module doc."""
    cfg = config or TrainConfig()
    feats = features if features is not None else featurize(labels.requests, cfg.spec, progress)
    if scorer_labels is not None:
        scorer = fit_scorer_elsewhere(scorer_labels, labels, cfg, progress)
        return calibrate(scorer, labels, cfg, feats)
    if cfg.calibration == "crossfit":
        return _fit_crossfit(labels, cfg, feats)
    score_rows, cal_rows = _split(labels, cfg)
    target = difficulty(labels.correct[score_rows], cfg.label)
    scorer = _fit_scorer(cfg, _rows(feats, score_rows), target)
    return calibrate(scorer, labels, cfg, feats, cal_rows)


def _fit_crossfit(labels: LabelSet, cfg: TrainConfig, feats: FeatureMatrix) -> RouterModel:
    target = difficulty(labels.correct, cfg.label)
    oof = np.empty(len(labels), dtype=np.float64)
    for train, test in request_folds(labels, cfg.calibration_folds, cfg.seed + 1):
        oof[test] = _fit_scorer(cfg, _rows(feats, train), target[train]).score(_rows(feats, test))
    scorer = _fit_scorer(cfg, feats, target)
    calibration = TierCalibration(include_top=cfg.label == "absolute").fit(
        oof, adequacy(labels.correct, cfg.label)
    )
    metadata = {
        "config": cfg.as_dict(),
        "calibration_rows": len(labels),
        "calibration_source": (
            f"out-of-fold scores ({cfg.calibration_folds} folds); the shipped scorer is "
            "refitted on every row"
        ),
    }
    return RouterModel(
        labels.tiers, scorer, calibration, cfg.spec, label=cfg.label, metadata=metadata
    )


def fit_scorer_elsewhere(
    scorer_labels: LabelSet,
    labels: LabelSet,
    config: TrainConfig,
    progress: Progress | None = None,
) -> Scorer:
    """A scorer trained on `scorer_labels` minus every request that also occurs in `labels`."""
    subset = scorer_labels.subset(unseen_rows(scorer_labels, labels))
    feats = featurize(subset.requests, config.spec, progress)
    return _fit_scorer(config, feats, difficulty(subset.correct, config.label))


def calibrate(
    scorer: Scorer,
    labels: LabelSet,
    config: TrainConfig,
    features: FeatureMatrix,
    rows: NDArray[np.intp] | None = None,
) -> RouterModel:
    """Fit the calibrators of a fitted `scorer` on `rows` of `labels` (default: all rows)."""
    cal_rows = np.arange(len(labels)) if rows is None else rows
    calibration = TierCalibration(include_top=config.label == "absolute").fit(
        scorer.score(_rows(features, cal_rows)), adequacy(labels.correct[cal_rows], config.label)
    )
    metadata = {
        "config": config.as_dict(),
        "calibration_rows": len(cal_rows),
        "calibration_source": (
            "every row (the scorer was trained on a separate data set)"
            if rows is None
            else "a held-out split the scorer never trained on"
        ),
    }
    return RouterModel(
        labels.tiers, scorer, calibration, config.spec, label=config.label, metadata=metadata
    )


def _fit_scorer(
    config: TrainConfig, features: FeatureMatrix, target: NDArray[np.float64]
) -> Scorer:
    usable = np.flatnonzero(np.isfinite(target))
    if usable.size < 10:
        raise ValueError("fewer than 10 rows with a difficulty label to train the scorer on")
    scorer = make_scorer(config.scorer, **config.scorer_params)
    return scorer.fit(_rows(features, usable), target[usable])


def cross_validate(
    labels: LabelSet,
    config: TrainConfig | None = None,
    k: int = 5,
    *,
    features: FeatureMatrix | None = None,
    scorer_labels: LabelSet | None = None,
    scorer: Scorer | None = None,
    on_fold: Callable[[int], None] | None = None,
) -> CrossValidation:
    """K-fold: train the full recipe on k-1 folds, predict the held-out fold.

    With `scorer_labels` (or an already fitted `scorer` trained without these requests) only
    the calibrators are fitted per fold.
    """
    cfg = config or TrainConfig()
    if not 2 <= k <= len(labels):
        raise ValueError(f"--cv needs 2 <= K <= rows ({len(labels)}), got {k}")
    feats = features if features is not None else featurize(labels.requests, cfg.spec)
    # A separate scorer set is fitted once, without any request of `labels` (train or test).
    shared = scorer
    if shared is None and scorer_labels is not None:
        shared = fit_scorer_elsewhere(scorer_labels, labels, cfg)
    proba = np.empty((len(labels), len(labels.tiers)), dtype=np.float64)
    score = np.empty(len(labels), dtype=np.float64)
    fold_of = np.empty(len(labels), dtype=np.int64)
    for i, (train, test) in enumerate(request_folds(labels, k, cfg.seed)):
        train_labels, train_feats = labels.subset(train), _rows(feats, train)
        if shared is None:
            model = fit_router(train_labels, cfg, features=train_feats)
        else:
            model = calibrate(shared, train_labels, cfg, train_feats)
        score[test] = model.scorer.score(_rows(feats, test))
        proba[test] = model.calibration.predict_proba(score[test])
        fold_of[test] = i
        if on_fold is not None:
            on_fold(i)
    return CrossValidation(proba, score, fold_of)


def request_groups(labels: LabelSet) -> NDArray[np.intp]:
    """Per row, the index of its request (`request_key`) in order of first appearance.

    Splits and folds keep a request's rows together: a duplicated prompt on both sides would
    let calibration or a test fold see what the scorer trained on. Without duplicates every
    row is its own group and the splits are exactly the row splits.
    """
    index: dict[str, int] = {}
    return np.asarray(
        [index.setdefault(request_key(r), len(index)) for r in labels.requests], dtype=np.intp
    )


def request_folds(
    labels: LabelSet, k: int, seed: int
) -> Iterator[tuple[NDArray[np.intp], NDArray[np.intp]]]:
    """Shuffled K-fold (train rows, test rows) over requests rather than rows."""
    groups = request_groups(labels)
    n_groups = int(groups.max()) + 1 if groups.size else 0
    if n_groups < k:
        raise ValueError(f"--cv {k} needs at least {k} distinct requests, the data has {n_groups}")
    yield from grouped_kfold(groups, k, seed)


def _split(labels: LabelSet, cfg: TrainConfig) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """(scorer rows, calibration rows), a random split of the requests (`request_groups`)."""
    groups = request_groups(labels)
    n = int(groups.max()) + 1 if groups.size else 0
    n_cal = round(cfg.calibration_fraction * n)
    if n_cal < 2 or n - n_cal < 10:
        raise ValueError(
            f"{n} request(s) are too few to split into scorer and calibration sets (at "
            f"--calibration-fraction {cfg.calibration_fraction:g}: at least 10 for the scorer "
            "and 2 for calibration)"
        )
    order = np.random.default_rng(cfg.seed).permutation(n)
    calibration = np.isin(groups, order[:n_cal])
    return np.flatnonzero(~calibration), np.flatnonzero(calibration)


def unseen_rows(scorer_labels: LabelSet, labels: LabelSet) -> NDArray[np.intp]:
    """Rows of `scorer_labels` whose request does not occur in `labels`."""
    seen = {request_key(r) for r in labels.requests}
    return np.asarray(
        [i for i, r in enumerate(scorer_labels.requests) if request_key(r) not in seen],
        dtype=np.intp,
    )


def _rows(features: FeatureMatrix, index: Sequence[int] | NDArray[np.intp]) -> FeatureMatrix:
    idx = np.asarray(index, dtype=np.intp)
    return FeatureMatrix(features.dense[idx], features.grams[idx])
