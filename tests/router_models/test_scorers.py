"""Scorers: estimator contract, lean path == batch path == scikit-learn, state round trip."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from router_models import lean as lean_module
from router_models.data import LabelSet
from router_models.features import dense_features
from router_models.labels import difficulty
from router_models.lean import LeanLinear
from router_models.model import RouterModel
from router_models.ngrams import GramSpec, tokens
from router_models.request import view_request
from router_models.scorers import SCORERS, GBDTScorer, LinearScorer, make_scorer, scorer_from_state
from router_models.vectorize import FeatureMatrix, featurize


def lean_scores(model: RouterModel, labels: LabelSet) -> np.ndarray:
    return np.array([model.score_one(r) for r in labels.requests])


@pytest.mark.parametrize("fixture", ["linear_model", "gbdt_model"])
def test_lean_equals_batch(
    fixture: str, request: pytest.FixtureRequest, three_tier: LabelSet
) -> None:
    model: RouterModel = request.getfixturevalue(fixture)
    batch = model.score(three_tier.requests)
    lean = lean_scores(model, three_tier)
    np.testing.assert_allclose(lean, batch, rtol=1e-9, atol=1e-12)
    # Second pass runs on warm caches and must not drift.
    np.testing.assert_allclose(lean_scores(model, three_tier), lean, rtol=0, atol=0)


def test_batch_equals_sklearn_estimators(
    linear_model: RouterModel, gbdt_model: RouterModel, three_tier: LabelSet
) -> None:
    lin = linear_model.scorer
    assert isinstance(lin, LinearScorer)
    feats = linear_model.features(three_tier.requests)
    np.testing.assert_allclose(
        lin.score(feats), lin.estimator_.predict(lin._design(feats)), atol=1e-12
    )
    gb = gbdt_model.scorer
    assert isinstance(gb, GBDTScorer)
    np.testing.assert_allclose(
        gb.score(feats), gb.estimator_.predict(gb.stacked(feats)), atol=1e-12
    )


def test_probabilities_lean_equal_batch(linear_model: RouterModel, three_tier: LabelSet) -> None:
    batch = linear_model.predict_proba(three_tier.requests[:200])
    lean = np.array([linear_model.predict_proba_one(r) for r in three_tier.requests[:200]])
    np.testing.assert_allclose(lean, batch, atol=1e-12)


def test_scorer_ranks_hard_requests_higher(linear_model: RouterModel, three_tier: LabelSet) -> None:
    hard = np.array(["```" in r["messages"][0]["content"] for r in three_tier.requests])
    score = linear_model.score(three_tier.requests)
    assert score[hard].mean() > score[~hard].mean() + 0.1


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_estimator_contract(name: str) -> None:
    scorer = make_scorer(name)
    assert clone(scorer).get_params() == scorer.get_params()
    assert not any(k.endswith("_") for k in vars(scorer))  # __init__ only stores parameters
    spec = GramSpec(bits=12)
    feats = featurize([{"prompt": "x"}], spec)
    with pytest.raises(NotFittedError):
        scorer.score(feats)


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_state_round_trip(name: str, three_tier: LabelSet) -> None:
    spec = GramSpec(bits=14)
    feats = featurize(three_tier.requests, spec)
    y = difficulty(three_tier.correct)
    params = {"max_iter": 20, "n_inner": 2} if name == "gbdt" else {}
    scorer = make_scorer(name, **params).fit(feats, y)
    meta, arrays = scorer.get_state()
    again = scorer_from_state(name, scorer.get_params(), meta, arrays)
    np.testing.assert_array_equal(again.score(feats), scorer.score(feats))
    lean = again.lean(spec)
    view = view_request(three_tier.requests[0])
    words = tokens(view.text)
    distinct = dict.fromkeys(words)
    one = lean.score(words, distinct, dense_features(view, words, distinct))
    assert one == pytest.approx(scorer.score(feats)[0], rel=1e-9)


def test_lean_caches_are_bounded_in_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    # CACHE_LIMIT entries alone did not bound memory: one-word prompts of 6,144 characters
    # filled the word cache at ~24 KiB an entry (3 GiB at the limit).
    monkeypatch.setattr(lean_module, "CACHE_CHARS", 1000)
    spec = GramSpec(bits=10, bigram_weight=0.5)
    lean = LeanLinear(spec, np.random.default_rng(0).normal(size=spec.n_buckets), 0.0, [], [])
    for i in range(20):
        words = [f"{i}" + "x" * 300, "short", f"{i}" + "y" * 300]
        cold = lean.text_score(words)
        assert lean.text_score(words) == cold  # a warm cache scores alike
        assert sum(map(len, lean._words)) <= 1000 + 2 * 303
        assert sum(len(a) + len(b) for a, b in lean._pairs) <= 1000 + 2 * 303 + 2 * 5


def test_unknown_scorer_and_bad_target() -> None:
    with pytest.raises(ValueError, match="unknown scorer"):
        make_scorer("bert")
    feats = featurize([{"prompt": "a"}, {"prompt": "b"}], GramSpec(bits=10))
    with pytest.raises(ValueError, match="finite"):
        LinearScorer().fit(feats, [0.0, np.nan])


def test_gbdt_inner_folds_keep_duplicated_requests_together(
    three_tier: LabelSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every request twice: a twin on the training side of an inner fold would give its row an
    # in-sample text score, which the trees would then learn to trust.
    twice = [r for r in three_tier.requests[:60] for _ in range(2)]
    feats = featurize(twice, GramSpec(bits=12))
    y = np.repeat(difficulty(three_tier.correct[:60]), 2)
    seen: list[tuple[set[bytes], set[bytes]]] = []

    def key(f: FeatureMatrix) -> set[bytes]:  # a row's dense features and hashed grams
        grams = f.grams.toarray()
        return {f.dense[i].tobytes() + grams[i].tobytes() for i in range(len(f.dense))}

    class Recording(LinearScorer):
        def fit(self, features, y, sample_weight=None):  # type: ignore[no-untyped-def]
            seen.append((key(features), set()))
            return super().fit(features, y, sample_weight)

        def score(self, features):  # type: ignore[no-untyped-def]
            if seen and not seen[-1][1]:
                seen[-1][1].update(key(features))
            return super().score(features)

    monkeypatch.setattr(GBDTScorer, "_text_model", lambda self: Recording(alpha=20.0, n_bins=0))
    GBDTScorer(n_inner=3, max_iter=5).fit(feats, y)
    inner = seen[:3]  # the last fit is the shipped text model, on every row
    assert all(test for _, test in inner)
    assert all(not (train & test) for train, test in inner)


def test_a_prompt_with_more_new_words_than_the_cache_holds_scores_as_when_cold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Filling the missing words empties a full cache; the score must not depend on it.
    spec = GramSpec(bits=10)
    coef = np.random.default_rng(1).normal(size=spec.n_buckets)
    words = [f"word{i}" for i in range(12)]
    expected = LeanLinear(spec, coef, 0.0, [], []).text_score(words)
    monkeypatch.setattr(lean_module, "CACHE_LIMIT", 5)
    lean = LeanLinear(spec, coef, 0.0, [], [])
    lean.text_score(words[:3])  # some words cached, the rest missing
    assert lean.text_score(words) == pytest.approx(expected, rel=1e-12)
    assert len(lean._words) <= 5
