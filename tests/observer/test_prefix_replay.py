"""Chained block-hash replay of vLLM's prefix cache against brute force."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observer.prefix_replay import (
    HashIdCacheReplay,
    PrefixCacheReplay,
    block_hashes,
    estimate_rho,
)


def test_c4_self_test_rho() -> None:
    # 50 prompts of 1024 tokens sharing the first 512: every prompt after the first hits 512.
    rng = random.Random(0)
    shared = [rng.randrange(1000) for _ in range(512)]
    prompts = [shared + [rng.randrange(1000) for _ in range(512)] for _ in range(50)]
    assert estimate_rho(prompts, 16, None) == {"unbounded": 0.49, "lru": 0.49}


def test_max_cache_hit_length_keeps_one_token() -> None:
    cache = PrefixCacheReplay(16)
    prompt = list(range(32))
    assert cache.lookup_and_insert(prompt) == 0
    # Same 32 tokens: only (32 - 1) // 16 = 1 block may hit.
    assert cache.lookup_and_insert(prompt) == 16
    assert cache.lookup_and_insert([*prompt, 99]) == 32
    assert (cache.hits, cache.queries, cache.requests) == (48, 97, 3)


def test_chain_breaks_at_first_difference() -> None:
    cache = PrefixCacheReplay(4)
    cache.lookup_and_insert([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0])
    # Second block differs: the third block's equal tokens do not hit (chained hashes).
    assert cache.lookup([1, 2, 3, 4, 0, 0, 0, 0, 9, 10, 11, 12, 0]) == 4
    assert block_hashes([1, 2, 3, 4], 4) != block_hashes([1, 2, 3, 4], 4, extra_key=7)


def test_lru_evicts_tail_blocks_first() -> None:
    cache = PrefixCacheReplay(2, capacity_blocks=3)
    cache.lookup_and_insert([1, 1, 2, 2, 3, 3])  # blocks A B C; A most recent
    cache.lookup_and_insert([9, 9, 0])  # block D evicts the LRU block, C (the tail)
    assert cache.cached_blocks == 3
    assert cache.lookup([1, 1, 2, 2, 3, 3, 0]) == 4  # A and B survive, C is gone
    cache.set_capacity(1)
    assert cache.cached_blocks == 1


def test_generated_tokens_complete_blocks() -> None:
    cache = PrefixCacheReplay(4)
    cache.lookup_and_insert([1, 2, 3], generated_ids=[4, 5, 6, 7, 8, 9])
    # Computed tokens: 3 + 6 - 1 = 8, two full blocks.
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8


def brute_rho(prompts: list[list[int]], block: int, capacity: int | None) -> float:
    """A list-based LRU of full prefixes (tuples), vLLM's lookup rule, tail-first eviction."""
    lru: list[tuple[int, ...]] = []  # least recent first
    hits = queries = 0
    for p in prompts:
        n_full = len(p) // block
        limit = (len(p) - 1) // block if p else 0
        run = 0
        while run < limit and tuple(p[: (run + 1) * block]) in lru:
            run += 1
        hits += run * block
        queries += len(p)
        for b in range(n_full, 0, -1):
            key = tuple(p[: b * block])
            if key in lru:
                lru.remove(key)
            lru.append(key)
        while capacity is not None and len(lru) > capacity:
            lru.pop(0)
    return hits / queries if queries else 0.0


@given(
    prompts=st.lists(st.lists(st.integers(0, 2), max_size=14), max_size=12),
    block=st.integers(1, 4),
    capacity=st.none() | st.integers(0, 8),
)
@settings(max_examples=200, deadline=None)
def test_replay_equals_brute_force(
    prompts: list[list[int]], block: int, capacity: int | None
) -> None:
    got = estimate_rho(prompts, block, capacity)
    assert got["unbounded"] == pytest.approx(brute_rho(prompts, block, None))
    assert got["lru"] == pytest.approx(brute_rho(prompts, block, capacity))


def test_hash_is_deterministic_across_processes() -> None:
    code = (
        "from gateway.observer.prefix_replay import block_hashes;"
        "print(block_hashes(list(range(64)), 16))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


def test_hash_id_replay_definition() -> None:
    cache = HashIdCacheReplay(block_tokens=4)
    assert cache.lookup_and_insert([1, 2, 3], 10) == 0
    assert cache.lookup_and_insert([1, 2, 7], 10) == 8  # stops at the first unseen block
    assert cache.lookup_and_insert([1, 2, 3], 10) == 10  # last block covers the remainder
    assert cache.hit_rate == pytest.approx(18 / 30)
