"""The model card says what the model holds."""

from __future__ import annotations

import pytest

from router_models.card import CardFacts, render_card


@pytest.mark.parametrize(
    ("label", "calibrated"),
    [("relative", "per non-top tier"), ("absolute", "per tier, the top tier included")],
)
def test_card_names_the_calibrated_tiers_of_its_label(label: str, calibrated: str) -> None:
    # The absolute label calibrates the top tier too (TierCalibration(include_top=True)).
    card = render_card(
        CardFacts(
            title="t",
            tiers=("a", "b"),
            costs=(0.5, 1.0),
            cost_source="given",
            label=label,
            scorer="linear",
            scorer_params={},
            data=[],
        )
    )
    assert f"- calibration: one isotonic regression {calibrated}," in card
