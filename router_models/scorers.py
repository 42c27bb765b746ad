"""Difficulty scorers: scikit-learn estimators from request features to one score per request.

Every scorer follows scikit-learn's contract (`__init__` stores parameters, `fit` returns self,
fitted state ends in `_`, `check_is_fitted` before use), takes a `FeatureMatrix`, learns the
difficulty target of `labels.difficulty` (higher = harder) and offers three more things:
`lean()`, the allocation-light one-request path; `get_state()`, its fitted state as JSON-able
numbers plus numpy arrays (the only thing saved: never a pickle); and `from_state()`.

- `linear` (default): ridge regression (or logistic regression on the soft target) over hashed
  word, bigram and character grams plus one-hot quantile bins of the dense features, a
  piecewise-constant additive model that costs one `bisect` per feature at routing time.
- `gbdt`: gradient-boosted trees (HistGradientBoosting) over the dense features and the linear
  text score; the text score it trains on is out-of-fold (folds keep rows with identical
  features together), so the trees never see a text score that was fitted on the same row or
  on a duplicate of it (stacking without leakage).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal, Self

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.utils.validation import check_is_fitted

from router_models.folds import grouped_kfold
from router_models.lean import (
    LeanLinear,
    LeanScorer,
    LeanTrees,
    TreeArrays,
    linear_state,
    text_arrays,
    tree_state,
)
from router_models.ngrams import GramSpec
from router_models.vectorize import FeatureMatrix

__all__ = [
    "SCORERS",
    "GBDTScorer",
    "LinearScorer",
    "Scorer",
    "make_scorer",
    "scorer_from_state",
]

Arrays = dict[str, NDArray[Any]]


class Scorer(BaseEstimator, ABC):  # type: ignore[misc]
    """One abstract scoring method; the registry below holds the implementations."""

    name: ClassVar[str]

    @abstractmethod
    def fit(
        self, features: FeatureMatrix, y: ArrayLike, sample_weight: ArrayLike | None = None
    ) -> Self:
        """Learn the difficulty target `y` (in [-1, 1]); returns self."""

    @abstractmethod
    def score(self, features: FeatureMatrix) -> NDArray[np.float64]:
        """(n,) difficulty scores, higher = harder."""

    @abstractmethod
    def lean(self, spec: GramSpec) -> LeanScorer:
        """The one-request path with the same numbers as `score`."""

    @abstractmethod
    def get_state(self) -> tuple[dict[str, Any], Arrays]:
        """Fitted state as JSON-able metadata plus named numpy arrays."""

    @classmethod
    @abstractmethod
    def from_state(cls, params: Mapping[str, Any], meta: Mapping[str, Any], arrays: Arrays) -> Self:
        """A fitted scorer from `get_params()`, `get_state()` and nothing else."""


class LinearScorer(Scorer):
    """Linear model on hashed grams and binned dense features.

    Parameters
    ----------
    alpha: L2 penalty (ridge alpha; logistic C = 1/alpha).
    loss: "squared" (ridge on the difficulty) or "logistic" (soft labels (1 + y) / 2).
    n_bins: quantile bins per dense feature; 0 leaves the dense features out.
    bin_weight: value of an active bin column (its scale against the grams' penalty).
    """

    name: ClassVar[str] = "linear"

    def __init__(
        self,
        *,
        alpha: float = 20.0,
        loss: Literal["squared", "logistic"] = "squared",
        n_bins: int = 8,
        bin_weight: float = 0.3,
        max_iter: int = 2000,
    ) -> None:
        self.alpha = alpha
        self.loss = loss
        self.n_bins = n_bins
        self.bin_weight = bin_weight
        self.max_iter = max_iter

    def fit(
        self, features: FeatureMatrix, y: ArrayLike, sample_weight: ArrayLike | None = None
    ) -> Self:
        target = _target(y, features)
        weight = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if self.alpha <= 0:
            raise ValueError("alpha must be positive")
        if self.n_bins < 0 or self.n_bins == 1:
            raise ValueError("n_bins must be 0 (no dense features) or at least 2")
        self.bin_edges_ = _bin_edges(features.dense, self.n_bins)
        x = self._design(features)
        if self.loss == "squared":
            ridge = Ridge(alpha=self.alpha, max_iter=self.max_iter, tol=1e-6)
            ridge.fit(x, target, sample_weight=weight)
            coef, intercept = np.asarray(ridge.coef_, dtype=np.float64), float(ridge.intercept_)
            self.estimator_: BaseEstimator = ridge
        elif self.loss == "logistic":
            soft = np.clip((1.0 + target) / 2.0, 0.0, 1.0)
            n = soft.shape[0]
            base = np.ones(n) if weight is None else weight
            logit = LogisticRegression(C=1.0 / self.alpha, max_iter=self.max_iter)
            logit.fit(
                sp.vstack([x, x]).tocsr(),
                np.r_[np.ones(n), np.zeros(n)],
                sample_weight=np.r_[base * soft, base * (1.0 - soft)],
            )
            coef, intercept = logit.coef_[0].astype(np.float64), float(logit.intercept_[0])
            self.estimator_ = logit
        else:
            raise ValueError(f"unknown loss {self.loss!r}")
        n_grams = features.grams.shape[1]
        self.gram_coef_ = coef[:n_grams].copy()
        self.bin_coef_ = self._split_bins(coef[n_grams:])
        self.intercept_ = intercept
        return self

    def score(self, features: FeatureMatrix) -> NDArray[np.float64]:
        check_is_fitted(self, "gram_coef_")
        if features.grams.shape[1] != self.gram_coef_.shape[0]:
            raise ValueError("features were hashed with a different number of buckets")
        out = np.asarray(features.grams @ self.gram_coef_, dtype=np.float64) + self.intercept_
        for j, (edges, weights) in enumerate(zip(self.bin_edges_, self.bin_coef_, strict=True)):
            out += weights[np.searchsorted(edges, features.dense[:, j], side="right")]
        return out

    def lean(self, spec: GramSpec) -> LeanLinear:
        check_is_fitted(self, "gram_coef_")
        return LeanLinear(spec, self.gram_coef_, self.intercept_, self.bin_edges_, self.bin_coef_)

    def get_state(self) -> tuple[dict[str, Any], Arrays]:
        check_is_fitted(self, "gram_coef_")
        arrays: Arrays = {"gram_coef": self.gram_coef_}
        for j, (edges, weights) in enumerate(zip(self.bin_edges_, self.bin_coef_, strict=True)):
            arrays[f"bin_edges_{j}"] = edges
            arrays[f"bin_coef_{j}"] = weights
        return {"intercept": self.intercept_, "n_dense": len(self.bin_edges_)}, arrays

    @classmethod
    def from_state(cls, params: Mapping[str, Any], meta: Mapping[str, Any], arrays: Arrays) -> Self:
        scorer = cls(**params)
        state = linear_state(meta, arrays)
        scorer.gram_coef_ = state.gram_coef
        scorer.intercept_ = state.intercept
        scorer.bin_edges_ = state.bin_edges
        scorer.bin_coef_ = state.bin_coef
        return scorer

    def _design(self, features: FeatureMatrix) -> sp.csr_matrix:
        blocks: list[sp.spmatrix] = [features.grams]
        n = features.dense.shape[0]
        for j, edges in enumerate(self.bin_edges_):
            if edges.size:
                col = np.searchsorted(edges, features.dense[:, j], side="right")
                onehot = sp.csr_matrix(
                    (np.full(n, self.bin_weight), (np.arange(n), col)), shape=(n, edges.size + 1)
                )
                blocks.append(onehot)
        return sp.hstack(blocks, format="csr")

    def _split_bins(self, coef: NDArray[np.float64]) -> list[NDArray[np.float64]]:
        weights: list[NDArray[np.float64]] = []
        at = 0
        for edges in self.bin_edges_:
            if edges.size:
                width = edges.size + 1
                weights.append(self.bin_weight * coef[at : at + width])
                at += width
            else:
                weights.append(np.zeros(1))
        return weights


class GBDTScorer(Scorer):
    """Boosted trees on `[out-of-fold linear text score, *dense features]`."""

    name: ClassVar[str] = "gbdt"

    def __init__(
        self,
        *,
        text_alpha: float = 20.0,
        n_inner: int = 5,
        max_iter: int = 200,
        learning_rate: float = 0.05,
        max_leaf_nodes: int = 15,
        min_samples_leaf: int = 50,
        l2_regularization: float = 0.0,
        random_state: int = 0,
    ) -> None:
        self.text_alpha = text_alpha
        self.n_inner = n_inner
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
        self.random_state = random_state

    def fit(
        self, features: FeatureMatrix, y: ArrayLike, sample_weight: ArrayLike | None = None
    ) -> Self:
        target = _target(y, features)
        weight = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        n = target.shape[0]
        if self.n_inner < 2 or n < 2 * self.n_inner:
            raise ValueError(f"need n_inner >= 2 and at least {2 * self.n_inner} rows")
        oof = np.empty(n, dtype=np.float64)
        for train, test in _grouped_folds(features, self.n_inner, self.random_state):
            inner = self._text_model().fit(
                _rows(features, train), target[train], None if weight is None else weight[train]
            )
            oof[test] = inner.score(_rows(features, test))
        trees = HistGradientBoostingRegressor(
            max_iter=self.max_iter,
            learning_rate=self.learning_rate,
            max_leaf_nodes=self.max_leaf_nodes,
            min_samples_leaf=self.min_samples_leaf,
            l2_regularization=self.l2_regularization,
            early_stopping=False,
            random_state=self.random_state,
        )
        trees.fit(np.column_stack([oof, features.dense]), target, sample_weight=weight)
        self.estimator_: HistGradientBoostingRegressor = trees
        self.trees_ = _flatten(trees)
        self.text_ = self._text_model().fit(features, target, weight)
        return self

    def score(self, features: FeatureMatrix) -> NDArray[np.float64]:
        check_is_fitted(self, "trees_")
        return self.trees_.predict(self.stacked(features))

    def stacked(self, features: FeatureMatrix) -> NDArray[np.float64]:
        """What the trees read: the text score, then the dense features."""
        check_is_fitted(self, "trees_")
        return np.column_stack([self.text_.score(features), features.dense])

    def lean(self, spec: GramSpec) -> LeanTrees:
        check_is_fitted(self, "trees_")
        return LeanTrees(self.text_.lean(spec), self.trees_)

    def get_state(self) -> tuple[dict[str, Any], Arrays]:
        check_is_fitted(self, "trees_")
        text_meta, text_arrays = self.text_.get_state()
        arrays: Arrays = {f"text_{k}": v for k, v in text_arrays.items()}
        arrays.update({f"tree_{k}": v for k, v in self.trees_.arrays().items()})
        meta = {"baseline": self.trees_.baseline, "text": text_meta}
        return meta, arrays

    @classmethod
    def from_state(cls, params: Mapping[str, Any], meta: Mapping[str, Any], arrays: Arrays) -> Self:
        scorer = cls(**params)
        scorer.text_ = LinearScorer.from_state(
            scorer._text_params(), meta["text"], text_arrays(arrays)
        )
        scorer.trees_ = tree_state(meta, arrays)
        return scorer

    def _text_params(self) -> dict[str, Any]:
        return {"alpha": self.text_alpha, "n_bins": 0}

    def _text_model(self) -> LinearScorer:
        return LinearScorer(**self._text_params())


SCORERS: Final[Mapping[str, type[Scorer]]] = {
    LinearScorer.name: LinearScorer,
    GBDTScorer.name: GBDTScorer,
}


def make_scorer(name: str, **params: Any) -> Scorer:
    """A new, unfitted scorer from the registry."""
    try:
        cls = SCORERS[name]
    except KeyError:
        raise ValueError(f"unknown scorer {name!r}; choose from {', '.join(SCORERS)}") from None
    return cls(**params)


def scorer_from_state(
    name: str, params: Mapping[str, Any], meta: Mapping[str, Any], arrays: Arrays
) -> Scorer:
    """A fitted scorer rebuilt from what `get_state` saved."""
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}")
    return SCORERS[name].from_state(params, meta, arrays)


def _target(y: ArrayLike, features: FeatureMatrix) -> NDArray[np.float64]:
    target = np.asarray(y, dtype=np.float64).reshape(-1)
    if target.shape[0] != features.dense.shape[0]:
        raise ValueError("y and features differ in length")
    if not np.all(np.isfinite(target)):
        raise ValueError("the difficulty target must be finite (drop unlabelled rows first)")
    return target


def _rows(features: FeatureMatrix, index: NDArray[np.intp]) -> FeatureMatrix:
    return FeatureMatrix(features.dense[index], features.grams[index])


def _grouped_folds(
    features: FeatureMatrix, k: int, seed: int
) -> list[tuple[NDArray[np.intp], NDArray[np.intp]]]:
    """Shuffled K-fold that keeps rows with identical features (a duplicated request) in one
    fold: a twin on the training side would give its row an in-sample text score."""
    grams = features.grams.tocsr()
    grams.sort_indices()
    index: dict[tuple[bytes, bytes, bytes], int] = {}
    groups = np.asarray(
        [
            index.setdefault(
                (
                    features.dense[i].tobytes(),
                    grams.indices[grams.indptr[i] : grams.indptr[i + 1]].tobytes(),
                    grams.data[grams.indptr[i] : grams.indptr[i + 1]].tobytes(),
                ),
                len(index),
            )
            for i in range(features.dense.shape[0])
        ],
        dtype=np.intp,
    )
    if len(index) < k:
        raise ValueError(f"need at least {k} distinct requests for {k} inner folds")
    return grouped_kfold(groups, k, seed)


def _bin_edges(dense: NDArray[np.float64], n_bins: int) -> list[NDArray[np.float64]]:
    """Inner quantile edges per column (none for a constant column or when n_bins is 0)."""
    if n_bins == 0:
        return [np.empty(0) for _ in range(dense.shape[1])]
    qs = np.arange(1, n_bins) / n_bins
    edges = []
    for j in range(dense.shape[1]):
        col = dense[:, j]
        inner = np.unique(np.quantile(col, qs, method="inverted_cdf"))
        # An edge at or below the minimum would leave the first bin empty.
        edges.append(inner[inner > col.min()].astype(np.float64))
    return edges


def _flatten(model: HistGradientBoostingRegressor) -> TreeArrays:
    """Every tree's nodes back to back, children re-indexed into the flat arrays."""
    parts: dict[str, list[NDArray[Any]]] = {
        k: [] for k in ("feature", "threshold", "left", "right", "is_leaf", "missing", "value")
    }
    roots: list[int] = []
    offset = 0
    for iteration in model._predictors:
        nodes = iteration[0].nodes
        roots.append(offset)
        parts["feature"].append(nodes["feature_idx"].astype(np.int64))
        parts["threshold"].append(nodes["num_threshold"].astype(np.float64))
        parts["left"].append(nodes["left"].astype(np.int64) + offset)
        parts["right"].append(nodes["right"].astype(np.int64) + offset)
        parts["is_leaf"].append(nodes["is_leaf"].astype(np.bool_))
        parts["missing"].append(nodes["missing_go_to_left"].astype(np.bool_))
        parts["value"].append(nodes["value"].astype(np.float64))
        offset += nodes.shape[0]
    return TreeArrays(
        roots=np.asarray(roots, dtype=np.int64),
        feature=np.concatenate(parts["feature"]),
        threshold=np.concatenate(parts["threshold"]),
        left=np.concatenate(parts["left"]),
        right=np.concatenate(parts["right"]),
        is_leaf=np.concatenate(parts["is_leaf"]),
        missing_left=np.concatenate(parts["missing"]),
        value=np.concatenate(parts["value"]),
        baseline=float(np.asarray(model._baseline_prediction).reshape(-1)[0]),
    )
