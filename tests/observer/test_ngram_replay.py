"""The n-gram proposer and its replay against brute-force references."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observer.acceptance import accepted_per_round, inverse_accepted_per_round
from gateway.observer.ngram_replay import (
    NgramCounts,
    NgramProposer,
    estimate_r,
    ngram_propose,
    replay_pair,
)


def brute_propose(
    ctx: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int | None = None
) -> list[int]:
    """The c.4 definition, literally: longest n, earliest occurrence ending before the end."""
    total = len(ctx)
    if total < min_n:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - total)
    if k <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        if n > total - 1:
            continue
        suffix = list(ctx[total - n :])
        for j in range(total - n):
            if list(ctx[j : j + n]) == suffix:
                return list(ctx[j + n : j + n + k])
    return []


def brute_replay(
    prompt: Sequence[int], completion: Sequence[int], min_n: int, max_n: int, k: int
) -> dict[str, float]:
    """Round-by-round and position-by-position replay with the brute-force proposer."""
    positions = drafted = hits = 0
    for i, actual in enumerate(completion):
        draft = brute_propose([*prompt, *completion[:i]], min_n, max_n, k)
        positions += 1
        drafted += bool(draft)
        hits += bool(draft) and draft[0] == actual
    i = rounds = first = 0
    while i < len(completion):
        # The first token is the prefill step's, with no draft.
        draft = brute_propose([*prompt, *completion[:i]], min_n, max_n, k) if i else []
        accepted = 0
        while (
            accepted < len(draft)
            and i + accepted < len(completion)
            and draft[accepted] == completion[i + accepted]
        ):
            accepted += 1
        rounds += 1
        first += accepted > 0
        i += accepted + 1
    a_sim = len(completion) / rounds if rounds else 0.0
    return {
        "rounds": rounds,
        "cover": drafted / positions if positions else 0.0,
        "r_pos": hits / positions if positions else 0.0,
        "r_round": first / rounds if rounds else 0.0,
        "A_sim": a_sim,
    }


contexts = st.lists(st.integers(0, 5), max_size=40)
bounds = st.integers(1, 5).flatmap(lambda lo: st.tuples(st.just(lo), st.integers(lo, 6)))


@given(ctx=contexts, mn_mx=bounds, k=st.integers(1, 6), extra=st.none() | st.integers(-2, 6))
@settings(max_examples=400, deadline=None)
def test_propose_equals_brute_force(
    ctx: list[int], mn_mx: tuple[int, int], k: int, extra: int | None
) -> None:
    mn, mx = mn_mx
    mml = None if extra is None else len(ctx) + extra
    expected = brute_propose(ctx, mn, mx, k, mml)
    assert ngram_propose(ctx, mn, mx, k, mml) == expected
    assert ngram_propose(tuple(ctx), mn, mx, k, mml) == expected
    assert NgramProposer(mn, mx, k, mml, ctx).propose() == expected


def test_many_random_contexts_like_c4() -> None:
    # c.4: vocab 2-20, min_n 1-5, max_n <= 6, k 1-6, with and without the max_model_len clip.
    rng = random.Random(4)
    for _ in range(3000):
        vocab, length = rng.randint(2, 20), rng.randint(0, 60)
        ctx = [rng.randrange(vocab) for _ in range(length)]
        mn = rng.randint(1, 5)
        mx, k = rng.randint(mn, 6), rng.randint(1, 6)
        mml = rng.choice([None, length + rng.randint(-2, 6)])
        assert ngram_propose(ctx, mn, mx, k, mml) == brute_propose(ctx, mn, mx, k, mml)


def test_incremental_matches_stateless_while_growing() -> None:
    rng = random.Random(7)
    proposer = NgramProposer(2, 4, 5)
    seq: list[int] = []
    for _ in range(400):
        assert proposer.propose() == ngram_propose(seq, 2, 4, 5)
        t = rng.randrange(6)
        seq.append(t)
        proposer.append(t)
    assert list(proposer.tokens) == seq and len(proposer) == 400


def test_semantics_examples() -> None:
    # Longest n wins over a later shorter match; the earliest occurrence of it is used.
    assert ngram_propose([1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 1, 3, 2) == [9, 2]
    # Overlapping occurrences count, as in vLLM (a run of one token).
    assert ngram_propose([5, 5, 5, 5], 2, 3, 3) == [5]
    assert ngram_propose([1, 2], 3, 4, 2) == []  # shorter than min_n
    assert ngram_propose([1, 2, 1, 2], 1, 2, 4, max_model_len=4) == []  # no room left
    assert ngram_propose([1, 2, 3, 1, 2], 2, 2, 4) == [3, 1, 2]  # runs to the end
    with pytest.raises(ValueError):
        ngram_propose([1], 0, 2, 1)


@given(
    prompt=st.lists(st.integers(0, 3), max_size=15),
    completion=st.lists(st.integers(0, 3), max_size=25),
    mn_mx=bounds,
    k=st.integers(1, 5),
)
@settings(max_examples=150, deadline=None)
def test_replay_equals_brute_force(
    prompt: list[int], completion: list[int], mn_mx: tuple[int, int], k: int
) -> None:
    mn, mx = mn_mx
    got = replay_pair(prompt, completion, mn, mx, k).summary(k)
    want = brute_replay(prompt, completion, mn, mx, k)
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key
    assert got["r_pos"] == pytest.approx(got["cover"] * got["a_cond"])
    if completion:
        assert accepted_per_round(got["r_iid"], k) == pytest.approx(got["A_sim"], abs=1e-9)


def test_estimate_r_sums_pairs() -> None:
    rng = random.Random(3)
    pairs = []
    for _ in range(20):
        prompt = [rng.randrange(50) for _ in range(200)]
        completion: list[int] = []
        while len(completion) < 120:  # copy spans from the prompt, then noise
            if rng.random() < 0.5:
                s = rng.randrange(180)
                completion += prompt[s : s + rng.randint(3, 15)]
            else:
                completion += [rng.randrange(50) for _ in range(rng.randint(1, 6))]
        pairs.append((prompt, completion[:120]))
    out = estimate_r(pairs, 2, 4, 4)
    total = NgramCounts()
    for p, c in pairs:
        total = total + replay_pair(p, c, 2, 4, 4)
    assert out == total.summary(4)
    assert out["rounds"] == total.rounds and out["positions"] == 20 * 120
    # Bursty copying: per-position r overstates the i.i.d.-equivalent r (X7).
    assert out["r_round"] < out["r_iid"] < out["r_pos"]
    assert out["r_iid"] == pytest.approx(inverse_accepted_per_round(out["A_sim"], 4))
    assert (total - total) == NgramCounts()


def test_empty_replay() -> None:
    out = estimate_r([], 2, 4, 4)
    assert out["rounds"] == 0 and out["r_iid"] == 0.0


def test_the_first_round_is_the_prefill_and_drafts_nothing() -> None:
    """vLLM's first token comes from the prefill step: the replay's first round neither
    drafts nor accepts, though the prompt alone would propose the right continuation."""
    prompt, completion = [1, 2, 3, 1, 2], [3, 1, 2, 3]
    assert ngram_propose(prompt, 2, 2, 4) == [3, 1, 2]
    counts = replay_pair(prompt, completion, 2, 2, 4)
    assert counts.first_hits == 4  # per position, position 0 still counts (r_pos)
    assert counts.rounds == 2 and counts.draft_rounds == 1  # [3], then [1, 2, 3] accepted whole
    assert counts.accepted_tokens == 3
