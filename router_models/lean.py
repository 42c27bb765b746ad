"""The one-request path: a fitted scorer's weights as plain floats, dicts and lists.

scikit-learn's per-call overhead (input validation, array allocation) is about 100 us, twice the
whole routing budget, so one request never touches an estimator. The linear part keeps bounded
caches from a word (or word pair) to its total weight, so a warm request costs one dict lookup
per distinct word and pair; dense features go through `bisect` on the bin edges; trees are
walked on flat lists. Every number equals the batch path's to floating-point rounding.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import filterfalse, pairwise
from operator import itemgetter
from typing import Any, Final, NamedTuple, Protocol

import numpy as np
from numpy.typing import NDArray

from router_models.features import DENSE_NAMES
from router_models.ngrams import (
    BIGRAM_SALT,
    WORD_SALT,
    GramSpec,
    bigram_key,
    char_gram_buckets,
    gram_bucket,
)

__all__ = [
    "CACHE_CHARS",
    "CACHE_LIMIT",
    "LeanLinear",
    "LeanScorer",
    "LeanTrees",
    "LinearState",
    "TreeArrays",
    "lean_from_state",
    "linear_state",
    "text_arrays",
    "tree_state",
]

# Entries per cache before it is emptied: bounds memory under adversarial vocabularies.
CACHE_LIMIT: Final = 1 << 17
# Characters of keys per cache before it is emptied: entries alone do not bound memory, since a
# word may be 8,192 characters (one-word prompts of 6,144 filled 3 GiB at CACHE_LIMIT). Natural
# text, about 7 characters a word, reaches CACHE_LIMIT first.
CACHE_CHARS: Final = 1 << 23


class LeanScorer(Protocol):
    """Difficulty score of one request from its word tokens and dense features.

    `distinct` is `dict.fromkeys(words)`: the caller builds it once for features and scorer.
    """

    def score(
        self, words: Sequence[str], distinct: Mapping[str, None], dense: Sequence[float]
    ) -> float: ...


class LeanLinear:
    """`intercept + grams . coef + sum of per-bin weights`, one request at a time."""

    def __init__(
        self,
        spec: GramSpec,
        gram_coef: NDArray[np.float64],
        intercept: float,
        bin_edges: Sequence[NDArray[np.float64]],
        bin_coef: Sequence[NDArray[np.float64]],
    ) -> None:
        if np.ndim(gram_coef) != 1:  # else the size below could match while the shape does not
            raise ValueError(
                f"gram weights must be one-dimensional, got shape {np.shape(gram_coef)}"
            )
        if np.shape(gram_coef) != (spec.n_buckets,):
            raise ValueError(
                f"{np.size(gram_coef)} gram weights, but the gram spec hashes into "
                f"{spec.n_buckets} buckets"
            )
        self._spec = spec
        self._mask = spec.n_buckets - 1
        # array('d') indexes to a Python float ~4x faster than a numpy scalar (cache misses).
        self._coef = array("d", np.asarray(gram_coef, dtype=np.float64).tobytes())
        self._intercept = float(intercept)
        # Only features with at least one edge can change the score. They are read with one
        # itemgetter and binned with map(bisect_right, ...): C-level loops, no Python loop.
        used = [j for j, edges in enumerate(bin_edges) if edges.size]
        self._edges: list[list[float]] = [bin_edges[j].tolist() for j in used]
        self._weights: list[list[float]] = [bin_coef[j].tolist() for j in used]
        self._pick: Callable[[Sequence[float]], tuple[float, ...]] = _picker(used)
        self._constant = sum(
            float(weights[0])
            for edges, weights in zip(bin_edges, bin_coef, strict=True)
            if not edges.size
        )
        self._words: dict[str, float] = {}
        self._pairs: dict[tuple[str, str], float] = {}
        self._word_chars = self._pair_chars = 0  # characters of the caches' keys

    def score(
        self, words: Sequence[str], distinct: Mapping[str, None], dense: Sequence[float]
    ) -> float:
        total = self._intercept + self._constant + self.text_score(words, distinct)
        bins = map(bisect_right, self._edges, self._pick(dense))
        return total + sum(map(list.__getitem__, self._weights, bins))

    def offset(self) -> float:
        """The score of a request with no words and all-zero bins (intercept + constants)."""
        return self._intercept + self._constant

    def text_score(self, words: Sequence[str], distinct: Mapping[str, None] | None = None) -> float:
        """The hashed-gram part of the score."""
        if distinct is None:
            distinct = dict.fromkeys(words)
        if not distinct:
            return 0.0
        cache = self._words
        try:
            total = sum(map(cache.__getitem__, distinct))
        except KeyError:
            # Fill only the missing words, then sum in C again: about 4 us less per prompt
            # with a new word than a Python call per word (MMLU, caches warm on other prompts).
            for word in filterfalse(cache.__contains__, distinct):
                self._word(word)
            try:
                total = sum(map(cache.__getitem__, distinct))
            except KeyError:  # filling emptied the cache (CACHE_LIMIT or CACHE_CHARS)
                total = sum(self._word(w) for w in distinct)
        if self._spec.bigram_weight:
            pairs = dict.fromkeys(pairwise(words))
            pair_cache = self._pairs
            try:
                total += sum(map(pair_cache.__getitem__, pairs))
            except KeyError:
                total += sum(self._pair(p) for p in pairs)
        return total / math.sqrt(len(distinct))

    def _word(self, word: str) -> float:
        found = self._words.get(word)
        if found is None:
            spec, coef, mask = self._spec, self._coef, self._mask
            chars = sum(
                map(coef.__getitem__, char_gram_buckets(word, spec.char_min, spec.char_max, mask))
            )
            found = spec.word_weight * coef[gram_bucket(word, WORD_SALT, mask)]
            found += spec.char_weight * chars
            if len(self._words) >= CACHE_LIMIT or self._word_chars >= CACHE_CHARS:
                self._words.clear()
                self._word_chars = 0
            self._words[word] = found
            self._word_chars += len(word)
        return found

    def _pair(self, pair: tuple[str, str]) -> float:
        found = self._pairs.get(pair)
        if found is None:
            bucket = gram_bucket(bigram_key(*pair), BIGRAM_SALT, self._mask)
            found = self._spec.bigram_weight * self._coef[bucket]
            if len(self._pairs) >= CACHE_LIMIT or self._pair_chars >= CACHE_CHARS:
                self._pairs.clear()
                self._pair_chars = 0
            self._pairs[pair] = found
            self._pair_chars += len(pair[0]) + len(pair[1])
        return found


def _picker(indices: Sequence[int]) -> Callable[[Sequence[float]], tuple[float, ...]]:
    """`dense -> tuple(dense[j] for j in indices)`, as one C call (itemgetter)."""
    if not indices:
        return lambda dense: ()
    if len(indices) == 1:
        (only,) = indices
        return lambda dense: (dense[only],)
    getter: Callable[[Sequence[float]], tuple[float, ...]] = itemgetter(*indices)
    return getter


class TreeArrays:
    """Boosted trees flattened into parallel arrays (every tree's nodes back to back)."""

    def __init__(
        self,
        *,
        roots: NDArray[np.int64],
        feature: NDArray[np.int64],
        threshold: NDArray[np.float64],
        left: NDArray[np.int64],
        right: NDArray[np.int64],
        is_leaf: NDArray[np.bool_],
        missing_left: NDArray[np.bool_],
        value: NDArray[np.float64],
        baseline: float,
        n_features: int | None = None,
    ) -> None:
        n = feature.shape[0]
        for name, arr in (("threshold", threshold), ("left", left), ("right", right)):
            if arr.shape != (n,):
                raise ValueError(f"tree array {name} has shape {arr.shape}, expected ({n},)")
        if is_leaf.shape != (n,) or missing_left.shape != (n,) or value.shape != (n,):
            raise ValueError("tree arrays differ in length")
        inner = ~is_leaf
        if roots.size and (roots.min() < 0 or roots.max() >= n):
            raise ValueError("tree roots out of range")
        # Children come after their parent (scikit-learn numbers nodes depth first), which
        # also rules out cycles: every walk from a root ends at a leaf.
        parent = np.flatnonzero(inner)
        if np.any(
            (left[inner] <= parent)
            | (left[inner] >= n)
            | (right[inner] <= parent)
            | (right[inner] >= n)
        ):
            raise ValueError("tree children out of range")
        if n_features is not None and np.any((feature[inner] < 0) | (feature[inner] >= n_features)):
            raise ValueError(f"tree features out of range (the trees read {n_features})")
        self.roots = roots
        self.feature = feature
        self.threshold = threshold
        self.left = left
        self.right = right
        self.is_leaf = is_leaf
        self.missing_left = missing_left
        self.value = value
        self.baseline = float(baseline)

    def predict(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Batch prediction, the same rule as scikit-learn's HistGradientBoosting predictor."""
        out = np.full(x.shape[0], self.baseline, dtype=np.float64)
        rows = np.arange(x.shape[0])
        for root in self.roots:
            node = np.full(x.shape[0], root, dtype=np.int64)
            active = ~self.is_leaf[node]
            while active.any():
                at = node[active]
                v = x[rows[active], self.feature[at]]
                go_left = np.where(np.isnan(v), self.missing_left[at], v <= self.threshold[at])
                node[active] = np.where(go_left, self.left[at], self.right[at])
                active = ~self.is_leaf[node]
            out += self.value[node]
        return out

    def arrays(self) -> dict[str, NDArray[np.generic]]:
        return {
            "roots": self.roots,
            "feature": self.feature,
            "threshold": self.threshold,
            "left": self.left,
            "right": self.right,
            "is_leaf": self.is_leaf,
            "missing_left": self.missing_left,
            "value": self.value,
        }


class LeanTrees:
    """Boosted trees over `[text score, *dense]`, walked on Python lists."""

    def __init__(self, text: LeanLinear, trees: TreeArrays) -> None:
        self._text = text
        self._text_offset = text.offset()
        self._roots = trees.roots.tolist()
        self._feature = trees.feature.tolist()
        self._threshold = trees.threshold.tolist()
        self._left = trees.left.tolist()
        self._right = trees.right.tolist()
        self._leaf = trees.is_leaf.tolist()
        self._missing_left = trees.missing_left.tolist()
        self._value = trees.value.tolist()
        self._baseline = trees.baseline

    def score(
        self, words: Sequence[str], distinct: Mapping[str, None], dense: Sequence[float]
    ) -> float:
        x = [self._text.text_score(words, distinct) + self._text_offset, *dense]
        feature, threshold, leaf = self._feature, self._threshold, self._leaf
        left, right, missing_left = self._left, self._right, self._missing_left
        total = self._baseline
        for root in self._roots:
            node = root
            while not leaf[node]:
                v = x[feature[node]]
                # NaN compares false, so it goes right unless the tree sends missing values left.
                if v <= threshold[node] or (missing_left[node] and math.isnan(v)):
                    node = left[node]
                else:
                    node = right[node]
            total += self._value[node]
        return total


# -- rebuilding from a saved model's state (what model_io stores; no scikit-learn) ----------
Arrays = Mapping[str, NDArray[Any]]


class LinearState(NamedTuple):
    gram_coef: NDArray[np.float64]
    intercept: float
    bin_edges: list[NDArray[np.float64]]
    bin_coef: list[NDArray[np.float64]]


def linear_state(meta: Mapping[str, Any], arrays: Arrays) -> LinearState:
    """The linear scorer's saved state, validated."""
    n_dense = int(meta["n_dense"])
    if n_dense != len(DENSE_NAMES):
        raise ValueError(f"{n_dense} dense features, this code computes {len(DENSE_NAMES)}")
    edges = [np.asarray(arrays[f"bin_edges_{j}"], dtype=np.float64) for j in range(n_dense)]
    coef = [np.asarray(arrays[f"bin_coef_{j}"], dtype=np.float64) for j in range(n_dense)]
    for e, w in zip(edges, coef, strict=True):
        if w.shape != (e.size + 1,):
            raise ValueError("each dense feature needs one weight per bin")
    gram_coef = np.asarray(arrays["gram_coef"], dtype=np.float64)
    return LinearState(gram_coef, float(meta["intercept"]), edges, coef)


def tree_state(meta: Mapping[str, Any], arrays: Arrays) -> TreeArrays:
    """The boosted trees' saved state (keys `tree_*`), validated."""

    def tree(name: str, dtype: type[np.generic]) -> NDArray[Any]:
        return np.asarray(arrays[f"tree_{name}"], dtype=dtype)

    return TreeArrays(
        roots=tree("roots", np.int64),
        feature=tree("feature", np.int64),
        threshold=tree("threshold", np.float64),
        left=tree("left", np.int64),
        right=tree("right", np.int64),
        is_leaf=tree("is_leaf", np.bool_),
        missing_left=tree("missing_left", np.bool_),
        value=tree("value", np.float64),
        baseline=float(meta["baseline"]),
        n_features=1 + len(DENSE_NAMES),  # the text score, then the dense features
    )


def text_arrays(arrays: Arrays) -> dict[str, NDArray[Any]]:
    """The trees' text model's arrays (keys `text_*`, prefix removed)."""
    return {k[5:]: v for k, v in arrays.items() if k.startswith("text_")}


def lean_from_state(
    name: str, spec: GramSpec, meta: Mapping[str, Any], arrays: Arrays
) -> LeanScorer:
    """The one-request path of a saved scorer (`linear` or `gbdt`), straight from its state."""
    if name == "linear":
        return LeanLinear(spec, *linear_state(meta, arrays))
    if name == "gbdt":
        text = LeanLinear(spec, *linear_state(meta["text"], text_arrays(arrays)))
        return LeanTrees(text, tree_state(meta, arrays))
    raise ValueError(f"unknown scorer {name!r}")
