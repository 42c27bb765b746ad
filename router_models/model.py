"""`RouterModel`: a fitted scorer plus its tier calibration, the object the gateway holds.

Two paths give the same numbers. The hot path (`score_one`, `predict_proba_one`) reads one
OpenAI request body with plain Python: request view, tokens, dense features, the lean scorer's
cached weights and `bisect` on the isotonic breakpoints; no numpy or scikit-learn call. The batch
path (`score`, `predict_proba`) builds feature matrices for training and evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from router_models.features import dense_features
from router_models.isotonic_maps import IsotonicMaps
from router_models.labels import LABELS, Label, routing_proba, routing_proba_one
from router_models.lean import LeanScorer
from router_models.ngrams import GramSpec, tokens
from router_models.request import view_request

if TYPE_CHECKING:
    from router_models.scorers import Scorer
    from router_models.vectorize import FeatureMatrix

__all__ = ["DeferredScorer", "RouterModel", "default_model_path"]


@dataclass(frozen=True, slots=True)
class DeferredScorer:
    """A saved scorer, rebuilt (importing scikit-learn and SciPy) on first use of the batch
    path; serving needs only the lean scorer, which is built at load."""

    name: str
    load: Callable[[], Scorer]


def default_model_path() -> Path:
    """Directory of the model that ships inside the package."""
    return Path(__file__).resolve().parent / "default_model"


class RouterModel:
    """Difficulty scorer + per-tier isotonic calibration over a ladder of tiers, cheapest first.

    `predict_proba_one(request)[k]` is the calibrated probability that tier k is adequate for
    the request (relative label: its answer is as good as the top tier's), monotone
    non-decreasing along the ladder and within [0, 1]; the top tier's is 1.0 under the relative
    label. Thread-safe for concurrent reads: the lean caches only ever gain or drop whole entries.
    """

    __slots__ = ("_calibration", "_label", "_lean", "_metadata", "_scorer", "_spec", "_tiers")

    def __init__(
        self,
        tiers: Sequence[str],
        scorer: Scorer | DeferredScorer,
        calibration: IsotonicMaps,
        spec: GramSpec,
        *,
        label: Label = "relative",
        metadata: Mapping[str, Any] | None = None,
        _lean: LeanScorer | None = None,
    ) -> None:
        # A str is a sequence too: "abc" would become the ladder a, b, c.
        if isinstance(tiers, str) or not all(isinstance(t, str) and t for t in tiers):
            raise ValueError("tiers must be a list of tier names")
        if len(tiers) < 2 or len(set(tiers)) != len(tiers):
            raise ValueError("a ladder needs at least two distinct tiers")
        if label not in LABELS:
            raise ValueError(f"unknown label {label!r}")
        if calibration.n_tiers_ != len(tiers):
            raise ValueError(
                f"calibration covers {calibration.n_tiers_} tiers, the ladder has {len(tiers)}"
            )
        if calibration.include_top != (label == "absolute"):
            raise ValueError("the calibration's include_top must match the label")
        self._tiers = tuple(tiers)
        self._scorer = scorer
        self._calibration = calibration
        self._spec = spec
        self._label: Label = label
        self._metadata = dict(metadata or {})
        if _lean is None:
            _lean = self.scorer.lean(spec)
        self._lean = _lean

    # -- what the model is ------------------------------------------------------------------
    @property
    def tiers(self) -> tuple[str, ...]:
        """The ladder the model was trained on, cheapest first."""
        return self._tiers

    @property
    def label(self) -> Label:
        return self._label

    @property
    def scorer(self) -> Scorer:
        if isinstance(self._scorer, DeferredScorer):
            self._scorer = self._scorer.load()
        return self._scorer

    @property
    def calibration(self) -> IsotonicMaps:
        return self._calibration

    @property
    def spec(self) -> GramSpec:
        return self._spec

    @property
    def metadata(self) -> Mapping[str, Any]:
        """Training facts (sources, counts, metrics) recorded with the model."""
        return self._metadata

    # -- hot path ---------------------------------------------------------------------------
    def score_one(self, request: Mapping[str, Any], kind: str | None = None) -> float:
        """Raw difficulty score of one OpenAI request body (higher = harder); `kind` is the
        endpoint it came to (`view_request`)."""
        view = view_request(request, kind)
        words = tokens(view.text)
        distinct = dict.fromkeys(words)
        return self._lean.score(words, distinct, dense_features(view, words, distinct))

    def predict_proba_one(self, request: Mapping[str, Any]) -> tuple[float, ...]:
        """Calibrated P(tier k adequate) for every tier, cheapest first."""
        return self._calibration.predict_one(self.score_one(request))

    def routing_proba_one(self, score: float) -> tuple[float, ...]:
        """What routing compares with thresholds for a request of this score (see
        `labels.routing_proba`: the calibrated probabilities under the relative label)."""
        proba = self._calibration.predict_one(score)
        # The hot path: the usual (relative) label pays no further call.
        return proba if self._label == "relative" else routing_proba_one(proba, self._label)

    # -- batch path -------------------------------------------------------------------------
    def features(
        self, requests: Sequence[Mapping[str, Any]], progress: Callable[[int], None] | None = None
    ) -> FeatureMatrix:
        from router_models.vectorize import featurize

        return featurize(requests, self._spec, progress)

    def score(self, requests: Sequence[Mapping[str, Any]]) -> NDArray[np.float64]:
        """(n,) difficulty scores."""
        return self.scorer.score(self.features(requests))

    def predict_proba(self, requests: Sequence[Mapping[str, Any]]) -> NDArray[np.float64]:
        """(n, K) calibrated probabilities, the batch twin of `predict_proba_one`."""
        return self._calibration.predict_proba(self.score(requests))

    def routing_proba(self, scores: NDArray[np.float64]) -> NDArray[np.float64]:
        """(n, K) routing probabilities for these scores, the batch twin of `routing_proba_one`."""
        return routing_proba(self._calibration.predict_proba(scores), self._label)

    # -- variants and persistence -----------------------------------------------------------
    def with_calibration(
        self, calibration: IsotonicMaps, tiers: Sequence[str] | None = None
    ) -> RouterModel:
        """The same scorer (and warm caches) with new calibrators, e.g. refitted online; with
        `tiers`, for the ladder the calibrators were fitted on (a gateway's own tiers). Shadow
        labels are relative: calibrators without the top tier make a relative-label model."""
        return RouterModel(
            self._tiers if tiers is None else tiers,
            self._scorer,
            calibration,
            self._spec,
            label="absolute" if calibration.include_top else "relative",
            metadata=self._metadata,
            _lean=self._lean,
        )

    def with_metadata(self, **updates: Any) -> RouterModel:
        """A copy whose metadata has `updates` merged in."""
        return RouterModel(
            self._tiers,
            self._scorer,
            self._calibration,
            self._spec,
            label=self._label,
            metadata={**self._metadata, **updates},
            _lean=self._lean,
        )

    def save(self, path: str | Path) -> Path:
        """Write the model directory (JSON + npz; see model_io)."""
        from router_models.model_io import save_model

        return save_model(self, path)

    @classmethod
    def load(cls, path: str | Path) -> RouterModel:
        """Read a model directory written by `save`; never unpickles anything."""
        from router_models.model_io import load_model

        return load_model(path)

    def __repr__(self) -> str:
        return f"RouterModel(tiers={self._tiers}, scorer={self._scorer.name}, label={self._label})"
