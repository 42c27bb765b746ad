"""Router fixtures: synthetic label sets and one small trained model per session."""

from __future__ import annotations

import pytest

from router_models.data import LabelSet
from router_models.model import RouterModel
from router_models.training import TrainConfig, fit_router
from tests.router_models.synthetic import two_type_labels


@pytest.fixture(scope="session")
def two_type() -> LabelSet:
    labels, _ = two_type_labels(1200, p_easy=0.7, eps=0.02, delta=0.5, seed=1)
    return labels


@pytest.fixture(scope="session")
def three_tier() -> LabelSet:
    labels, _ = two_type_labels(
        900, p_easy=0.6, eps=0.03, delta=0.4, tiers=("nvfp4", "w4a16", "bf16"), seed=2
    )
    return labels


@pytest.fixture(scope="session")
def linear_model(three_tier: LabelSet) -> RouterModel:
    return fit_router(three_tier, TrainConfig(scorer="linear"))


@pytest.fixture(scope="session")
def gbdt_model(three_tier: LabelSet) -> RouterModel:
    params = {"max_iter": 30, "n_inner": 3, "min_samples_leaf": 20}
    return fit_router(three_tier, TrainConfig(scorer="gbdt", scorer_params=params))
