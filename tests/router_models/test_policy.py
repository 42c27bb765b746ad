"""decide(): cheapest tier clearing its threshold, else the top; pure and total."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router_models.policy import decide, uniform_thresholds

probs = st.lists(st.floats(0, 1), min_size=2, max_size=6)


@given(probs, st.data())
def test_decide_is_the_first_tier_clearing_its_threshold(
    p: list[float], data: st.DataObject
) -> None:
    t = data.draw(st.lists(st.floats(0, 1), min_size=len(p) - 1, max_size=len(p) - 1))
    k = decide(p, t)
    assert 0 <= k < len(p)
    assert all(p[j] < t[j] for j in range(k))
    if k < len(p) - 1:
        assert p[k] >= t[k]


@given(probs)
def test_zero_thresholds_pick_the_cheapest_and_raised_ones_the_top(p: list[float]) -> None:
    assert decide(p, [0.0] * (len(p) - 1)) == 0
    assert decide([min(x, 0.999) for x in p], [1.0] * (len(p) - 1)) == len(p) - 1


@given(probs, st.data())
def test_raising_a_threshold_never_moves_a_request_down(
    p: list[float], data: st.DataObject
) -> None:
    t = data.draw(st.lists(st.floats(0, 1), min_size=len(p) - 1, max_size=len(p) - 1))
    j = data.draw(st.integers(0, len(p) - 2))
    raised = list(t)
    raised[j] = min(1.0, t[j] + 0.1)
    assert decide(p, raised) >= decide(p, t)


def test_uniform_thresholds_send_everything_to_one_tier() -> None:
    for tier in range(3):
        t = uniform_thresholds(tier, 3)
        assert decide([0.99, 0.995, 1.0], t) == tier
        assert decide([0.0, 0.0, 1.0], t) == tier


def test_errors() -> None:
    for tier in (-1, 3):  # not on a ladder of 3
        with pytest.raises(ValueError, match="not on a ladder"):
            uniform_thresholds(tier, 3)
    with pytest.raises(ValueError):
        decide([0.5, 1.0, 1.0], [0.5])
    assert decide([1.0], []) == 0
