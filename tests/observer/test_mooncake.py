"""The offline regime of the shared Mooncake trace equals a brute-force computation."""

from __future__ import annotations

import json
from bisect import bisect_right
from pathlib import Path
from typing import Any

import pytest

from gateway.observer.offline_regime import ServiceTimeModel, mooncake_regime
from gateway.observer.traces import MooncakeRequest, parse_mooncake


@pytest.fixture(scope="module")
def rows(shared_data: Path) -> list[dict[str, Any]]:
    path = shared_data / "traces" / "mooncake_conversation_trace.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def brute_rho_unbounded(rows: list[dict[str, Any]], block: int = 512) -> float:
    seen: set[int] = set()
    hit = total = 0
    for row in rows:
        for i, h in enumerate(row["hash_ids"]):
            if h not in seen:
                break
            hit += min(block, row["input_length"] - i * block)
        total += row["input_length"]
        seen.update(row["hash_ids"])
    return hit / total


def test_rho_unbounded_equals_brute_force(rows: list[dict[str, Any]]) -> None:
    requests = parse_mooncake(json.dumps(r) for r in rows)
    out = mooncake_regime(requests, block_tokens=512)
    assert out["rho"]["unbounded"] == pytest.approx(brute_rho_unbounded(rows), abs=1e-12)
    assert out["rho"]["unbounded"] == pytest.approx(0.3736, abs=1e-4)
    assert out["rho"]["lru"] == out["rho"]["unbounded"]  # no bound given


def test_lru_bound_lowers_rho(rows: list[dict[str, Any]]) -> None:
    requests = parse_mooncake(json.dumps(r) for r in rows)
    bounded = mooncake_regime(requests, capacity_blocks=2602)["rho"]
    assert 0.0 < bounded["lru"] < bounded["unbounded"]
    huge = mooncake_regime(requests, capacity_blocks=10**9)["rho"]
    assert huge["lru"] == huge["unbounded"]


def test_concurrency_equals_brute_force(rows: list[dict[str, Any]]) -> None:
    service = ServiceTimeModel(prefill_tokens_per_s=10_000, tpot_s=0.025)
    requests = parse_mooncake(json.dumps(r) for r in rows)
    out = mooncake_regime(requests, service=service)["concurrency"]
    spans = [
        (
            r["timestamp"] / 1000,
            r["timestamp"] / 1000 + service.seconds(r["input_length"], r["output_length"]),
        )
        for r in rows
    ]
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    # Little's law: the time-weighted mean is total busy time over the span.
    assert out["mean"] == pytest.approx(sum(e - s for s, e in spans) / (end - start), rel=1e-9)
    # Spot-check the in-flight count at sampled instants against the quantiles' range.
    starts, ends = sorted(s for s, _ in spans), sorted(e for _, e in spans)
    grid = [start + (end - start) * i / 2000 for i in range(2000)]
    counts = sorted(bisect_right(starts, t) - bisect_right(ends, t) for t in grid)
    assert abs(counts[1000] - out["p50"]) <= 2
    assert abs(counts[1900] - out["p95"]) <= 2


def test_a_block_size_that_is_not_the_traces_is_refused() -> None:
    # Hash ids of 512 tokens replayed as 16-token blocks credited 16 tokens per hit block
    # against the whole prompt: rho came out 32 times too low, silently.
    requests = [MooncakeRequest(0.0, 1000, 10, (1, 2)), MooncakeRequest(1.0, 1000, 10, (1, 2))]
    assert mooncake_regime(requests, block_tokens=512)["rho"]["unbounded"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="hash blocks are not 16 tokens"):
        mooncake_regime(requests, block_tokens=16)
