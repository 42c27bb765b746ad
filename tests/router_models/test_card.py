"""The model card says what the model holds."""

from __future__ import annotations

from typing import Any

import pytest

from router_models.card import CardFacts, render_card


def card_of(label: str = "relative", metrics: dict[str, Any] | None = None) -> str:
    """The card of a two-tier linear model with the given label and metrics."""
    return render_card(
        CardFacts(
            title="t",
            tiers=("a", "b"),
            costs=(0.5, 1.0),
            cost_source="given",
            label=label,
            scorer="linear",
            scorer_params={},
            data=[],
            metrics=metrics,
        )
    )


@pytest.mark.parametrize(
    ("label", "calibrated"),
    [("relative", "per non-top tier"), ("absolute", "per tier, the top tier included")],
)
def test_card_names_the_calibrated_tiers_of_its_label(label: str, calibrated: str) -> None:
    # The absolute label calibrates the top tier too (TierCalibration(include_top=True)).
    card = card_of(label)
    assert f"- calibration: one isotonic regression {calibrated}," in card


def test_figures_the_rows_cannot_give_say_why() -> None:
    """Shadow-style rows (one cheaper tier scored per request) give no APGR or CPT: the card
    printed a bare n/a for each, without the evaluation's reason."""
    note = "no row has every tier's score: frontiers, APGR/CPT, tune and the pre-test need complete rows"
    card = card_of(metrics={"n": 40, "per_tier": {}, "note": note})
    assert "| apgr | n/a |" in card and f"Note: {note}." in card
