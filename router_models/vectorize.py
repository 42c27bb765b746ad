"""The batch path: many requests -> a dense feature matrix and a sparse hashed-gram matrix.

Training and evaluation use this path; `lean.py` computes the same numbers for one request
without building any matrix. Both call the same `tokens`, `char_gram_buckets` and
`gram_bucket`, so the two agree to floating-point rounding (tests/router_models/test_scorers.py
checks it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from router_models.features import DENSE_NAMES, dense_features
from router_models.ngrams import (
    BIGRAM_SALT,
    CHAR_SALT,
    WORD_SALT,
    GramSpec,
    bigram_key,
    char_gram_buckets,
    gram_bucket,
    tokens,
)
from router_models.request import view_request

__all__ = ["BIGRAM_SALT", "CHAR_SALT", "WORD_SALT", "FeatureMatrix", "GramHasher", "featurize"]


class FeatureMatrix(NamedTuple):
    """Dense features (n, len(DENSE_NAMES)) and hashed grams (n, 2**bits), row-aligned."""

    dense: NDArray[np.float64]
    grams: sp.csr_matrix


class GramHasher:
    """Bucket lookups with a per-word memo, so each distinct word is hashed once per batch."""

    def __init__(self, spec: GramSpec) -> None:
        self.spec = spec
        self._mask = spec.n_buckets - 1
        self._words: dict[str, tuple[int, ...]] = {}

    def word_buckets(self, word: str) -> tuple[int, ...]:
        """Bucket of the word itself, then the buckets of its character n-grams."""
        found = self._words.get(word)
        if found is None:
            spec, mask = self.spec, self._mask
            chars = char_gram_buckets(word, spec.char_min, spec.char_max, mask)
            found = (gram_bucket(word, WORD_SALT, mask), *chars)
            self._words[word] = found
        return found

    def bigram_bucket(self, first: str, second: str) -> int:
        return gram_bucket(bigram_key(first, second), BIGRAM_SALT, self._mask)

    def row(self, text: str) -> tuple[list[int], list[float]]:
        """Column indices and values of one text's hashed grams (repeated indices add up)."""
        spec = self.spec
        toks = tokens(text)
        words = dict.fromkeys(toks)
        if not words:
            return [], []
        scale = 1.0 / math.sqrt(len(words))
        w_word, w_char = spec.word_weight * scale, spec.char_weight * scale
        cols: list[int] = []
        vals: list[float] = []
        for word in words:
            buckets = self.word_buckets(word)
            cols.extend(buckets)
            vals.append(w_word)
            vals.extend([w_char] * (len(buckets) - 1))
        if spec.bigram_weight:
            w_bigram = spec.bigram_weight * scale
            for first, second in dict.fromkeys(pairwise(toks)):
                cols.append(self.bigram_bucket(first, second))
                vals.append(w_bigram)
        return cols, vals


def featurize(
    requests: Sequence[Mapping[str, Any]],
    spec: GramSpec,
    progress: Callable[[int], None] | None = None,
) -> FeatureMatrix:
    """Features of every request; `progress(k)` is called after each block of k requests."""
    hasher = GramHasher(spec)
    dense = np.empty((len(requests), len(DENSE_NAMES)), dtype=np.float64)
    indptr = [0]
    indices: list[int] = []
    data: list[float] = []
    block = 512
    for i, request in enumerate(requests):
        view = view_request(request)
        dense[i] = dense_features(view, tokens(view.text))
        cols, vals = hasher.row(view.text)
        indices.extend(cols)
        data.extend(vals)
        indptr.append(len(indices))
        if progress is not None and (i + 1) % block == 0:
            progress(block)
    if progress is not None and len(requests) % block:
        progress(len(requests) % block)
    grams = sp.csr_matrix(
        (np.asarray(data, dtype=np.float64), np.asarray(indices, dtype=np.int64), indptr),
        shape=(len(requests), spec.n_buckets),
    )
    grams.sum_duplicates()
    return FeatureMatrix(dense, grams)
