"""Isotonic tier calibration: monotone in score and along the ladder, clipped, lean == batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.isotonic import IsotonicRegression

from router_models.calibration import TierCalibration


def sample(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    score = rng.normal(size=n)
    cheap = rng.random(n) < 1 / (1 + np.exp(2 * score))
    middle = rng.random(n) < 1 / (1 + np.exp(score - 1))
    return score, np.column_stack([cheap, middle]).astype(float)


def test_monotone_in_score_and_ladder_and_clipped() -> None:
    score, adequate = sample()
    cal = TierCalibration().fit(score, adequate)
    grid = np.linspace(-6, 6, 400)
    proba = cal.predict_proba(grid)
    assert proba.shape == (400, 3)
    assert np.all(np.diff(proba[:, :2], axis=0) <= 1e-12)  # harder -> less likely adequate
    assert np.all(np.diff(proba, axis=1) >= 0)  # up the ladder -> more likely adequate
    assert proba.min() >= 0.0 and proba.max() <= 1.0
    assert np.all(proba[:, -1] == 1.0)


def test_non_top_probability_is_capped_below_one() -> None:
    score = np.linspace(0, 1, 50)
    cal = TierCalibration().fit(score, np.ones((50, 1)))
    top_cheap = cal.predict_proba([-10.0])[0, 0]
    assert top_cheap == pytest.approx(1 - 1 / 52)
    assert cal.predict_one(-10.0)[0] < 1.0


def test_ladder_monotonicity_is_enforced_when_fits_cross() -> None:
    score, adequate = sample()
    flipped = adequate[:, ::-1]  # the dearer tier now looks worse on part of the range
    cal = TierCalibration().fit(score, flipped)
    proba = cal.predict_proba(np.linspace(-3, 3, 100))
    assert np.all(proba[:, 1] >= proba[:, 0])


def test_plain_mode_matches_sklearn_isotonic_regression() -> None:
    score, adequate = sample()
    cal = TierCalibration(centered=False).fit(score, adequate)
    iso = IsotonicRegression(increasing=False, y_min=0.0, y_max=1 - 1 / 2002, out_of_bounds="clip")
    iso.fit(score, adequate[:, 0])
    grid = np.linspace(-4, 4, 301)
    np.testing.assert_allclose(cal.predict_proba(grid)[:, 0], iso.predict(grid), atol=1e-15)


def test_centred_map_keeps_block_means_and_breaks_ties() -> None:
    score, adequate = sample()
    plain = TierCalibration(centered=False).fit(score, adequate)
    centred = TierCalibration().fit(score, adequate)
    # Same mean probability on the calibration data (block means are preserved), more levels.
    p_plain = plain.predict_proba(score)[:, 0]
    p_centred = centred.predict_proba(score)[:, 0]
    assert abs(p_plain.mean() - p_centred.mean()) < 0.005
    assert np.unique(p_centred).size > 3 * np.unique(p_plain).size
    inner = (score > centred.thresholds_x_[0][0]) & (score < centred.thresholds_x_[0][-1])
    order = np.argsort(score[inner])
    assert np.all(np.diff(p_centred[inner][order]) < 0)  # strictly falling between the ends


@settings(max_examples=60, deadline=None)
@given(st.floats(-8, 8, allow_nan=False))
def test_lean_equals_batch(score: float) -> None:
    cal = _fitted()
    assert cal.predict_one(score) == tuple(cal.predict_proba([score])[0])


def test_nan_labels_mean_no_label() -> None:
    score, adequate = sample()
    partial = adequate.copy()
    partial[:1000, 1] = np.nan
    cal = TierCalibration().fit(score, partial)
    assert cal.n_labelled_ == [2000, 1000]


def test_absolute_label_calibrates_the_top_tier() -> None:
    score, adequate = sample()
    cal = TierCalibration(include_top=True).fit(score, adequate)
    assert cal.n_tiers_ == 2
    assert cal.predict_proba([5.0])[0, -1] < 1.0


def test_estimator_contract() -> None:
    cal = TierCalibration(include_top=True)
    assert clone(cal).get_params() == {"include_top": True, "centered": True}
    with pytest.raises(NotFittedError):
        cal.predict_proba([0.0])
    with pytest.raises(ValueError, match="labels must lie"):
        TierCalibration().fit([0.0, 1.0], [[0.5], [2.0]])
    with pytest.raises(ValueError, match="no calibrated tier has at least 2"):
        TierCalibration().fit([0.0, 1.0], [[np.nan], [1.0]])


def test_an_unlabelled_tier_inherits_the_cheaper_map_and_an_unlabelled_cheapest_gets_zero() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=400)
    adequate = (rng.random(400) > 1 / (1 + np.exp(-2 * scores))).astype(float)
    middle_blank = np.c_[adequate, np.full(400, np.nan), adequate]
    cal = TierCalibration().fit(scores, middle_blank)
    proba = cal.predict_proba(scores)
    assert np.array_equal(proba[:, 1], proba[:, 0])
    assert cal.n_labelled_ == [400, 0, 400]
    cheapest_blank = np.c_[np.full(400, np.nan), adequate]
    proba = TierCalibration().fit(scores, cheapest_blank).predict_proba(scores)
    assert (proba[:, 0] == 0.0).all() and proba[:, 1].max() > 0.5


def test_from_thresholds_validates() -> None:
    with pytest.raises(ValueError, match="non-increasing"):
        TierCalibration.from_thresholds([np.array([0.0, 1.0])], [np.array([0.1, 0.9])])


_CACHE: list[TierCalibration] = []


def _fitted() -> TierCalibration:
    if not _CACHE:
        score, adequate = sample()
        _CACHE.append(TierCalibration().fit(score, adequate))
    return _CACHE[0]


def test_a_nan_score_is_never_taken_as_adequate() -> None:
    """A NaN score (a broken feature) must not read as an easy request: every non-top
    tier gets probability 0, on the batch and the per-request path alike."""
    cal = _fitted()
    assert tuple(cal.predict_proba([np.nan])[0]) == (0.0, 0.0, 1.0)
    assert cal.predict_one(float("nan")) == (0.0, 0.0, 1.0)


def test_a_tier_with_one_label_is_treated_as_unlabelled() -> None:
    """One label is no calibration: the tier inherits the cheaper tier's map rather than
    a flat map at that single label (which would be 2/3 everywhere for one success)."""
    score, adequate = sample()
    one = np.full(score.size, np.nan)
    one[0] = 1.0
    cal = TierCalibration().fit(score, np.c_[adequate[:, 0], one])
    proba = cal.predict_proba(score)
    assert np.array_equal(proba[:, 1], proba[:, 0])
    assert cal.n_labelled_ == [2000, 1]
