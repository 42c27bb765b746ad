"""Tier costs from precision names, explicit --costs, and the ladder default."""

from __future__ import annotations

import pytest

from router_models.costs import CostSource, default_costs, parse_costs, precision_cost
from router_models.errors import TierError


@pytest.mark.parametrize(
    ("name", "cost"),
    [
        ("bf16", 1.0),
        ("FP16", 1.0),
        ("fp8", 0.5),
        ("w4a16", 0.25),
        ("nvfp4", 0.25),
        ("q4_k_m", 0.25),
        ("q8_0", 0.5),
        ("q6_k", 0.375),
        ("int8", 0.5),
        ("awq", 0.25),
        ("fp32", 2.0),
        ("mixtral_8x7b", None),
        ("gpt4_1106", None),
    ],
)
def test_precision_names(name: str, cost: float | None) -> None:
    assert precision_cost(name) == cost


def test_defaults() -> None:
    assert default_costs(("q4_k_m", "q8_0", "fp16")) == ((0.25, 0.5, 1.0), CostSource.PRECISION)
    assert default_costs(("mixtral", "gpt4")) == ((0.5, 1.0), CostSource.LADDER_DEFAULT)
    with pytest.raises(TierError, match="cheapest first"):
        default_costs(("bf16", "nvfp4"))
    assert default_costs(("nvfp4", "w4a16", "bf16"))[0] == (0.25, 0.25, 1.0)


def test_parse_costs() -> None:
    assert parse_costs("b=0.5, a=0.25,c=1", ("a", "b", "c")) == (0.25, 0.5, 1.0)
    for bad, fragment in [
        ("a=0.25,b=x,c=1", "not a number"),
        ("a=0.25,c=1", "missing: b"),
        ("a=1,b=0.5,c=2", "cheapest first"),
        ("a=1,b=1,c=1", "must cost more"),
        ("a=0.25,b=0.5,c=1,d=2", "unknown: d"),
        ("a0.25", "name=value"),
        ("a=0,b=0.5,c=1", "positive"),
    ]:
        with pytest.raises(TierError, match=fragment):
            parse_costs(bad, ("a", "b", "c"))
