"""Request ids: unique per request, and telling a client nothing about other traffic."""

from __future__ import annotations

import itertools
import re

from gateway.request_ids import RequestIds


def test_ids_are_unique_and_do_not_count_requests() -> None:
    ids = RequestIds()
    drawn = [ids.new().decode() for _ in range(5000)]
    assert all(re.fullmatch(r"req_[0-9a-f]{24}", i) for i in drawn)
    assert len(set(drawn)) == len(drawn)
    assert len({i[:16] for i in drawn}) == 1  # one prefix per instance
    # A counter would let a client read how many requests the gateway took between two of
    # its own: consecutive ids' tails must not step by a fixed amount.
    tails = [int(i[16:], 16) for i in drawn]
    steps = {b - a for a, b in itertools.pairwise(tails)}
    assert len(steps) > 4000


def test_instances_differ() -> None:
    assert RequestIds().new()[:16] != RequestIds().new()[:16]
