"""vLLM's n-gram (prompt-lookup) proposer and its replay over (prompt, completion) pairs.

Proposer semantics (vLLM 0.33 `v1/spec_decode/ngram_proposer.py`, COST_MODEL.md c.4): take the
longest n in [min_n, max_n] whose last-n suffix re-occurs earlier in the context, the
occurrence ending before the last token; among occurrences of that n take the earliest; draft
up to k following tokens (fewer if the context ends first), clipped to max_model_len - len.
A context shorter than min_n gets no draft.

Two implementations share these semantics. `ngram_propose` is stateless and scans for
candidate starts with `list.index` (O(len) per call: about 7 us when an n-gram hits early,
150 us for a 2k-token miss). `NgramProposer` keeps a first-occurrence index per n, so each
decode step costs O(max_n - min_n) dictionary operations (about 2 us to propose and 4 us to
append); a simulator stepping decode should hold one per request.

Replay (X7): at every completion position the proposer sees prompt + completion[:i]. Per
position we count drafts (`cover`) and first-token hits (`a_cond`), so r_pos = cover * a_cond.
Rounds follow the engine: a round drafts at its first position, accepts the matching prefix of
the draft and emits one more token; the first round is the prefill step, which drafts nothing.
A_sim is tokens per round and r_iid = A^-1(A_sim), the definition of r in COST_MODEL.md a.1;
r_round is the share of rounds whose first draft token was accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.observer.acceptance import inverse_accepted_per_round

__all__ = [
    "NgramCounts",
    "NgramProposer",
    "estimate_r",
    "ngram_propose",
    "replay_pair",
]


def _check_bounds(min_n: int, max_n: int) -> None:
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")


def _draft_budget(length: int, min_n: int, k: int, max_model_len: int | None) -> int:
    if length < min_n:
        return 0
    if max_model_len is not None:
        k = min(k, max_model_len - length)
    return max(k, 0)


def _earliest_occurrence(tokens: list[int] | tuple[int, ...], n: int) -> int:
    # Earliest start j < len - n of the last-n suffix; list.index scans for the suffix's first
    # token at C speed, so only real candidates are compared in Python.
    total = len(tokens)
    suffix = tokens[total - n :]
    first = suffix[0]
    limit = total - n
    j = 0
    while True:
        try:
            j = tokens.index(first, j, limit)
        except ValueError:
            return -1
        if tokens[j : j + n] == suffix:
            return j
        j += 1


def ngram_propose(
    context: Sequence[int],
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int | None = None,
) -> list[int]:
    """The draft vLLM's n-gram proposer makes for `context` (prompt + output so far)."""
    _check_bounds(min_n, max_n)
    total = len(context)
    budget = _draft_budget(total, min_n, k, max_model_len)
    if budget == 0:
        return []
    tokens = context if isinstance(context, list | tuple) else list(context)
    # The first n (from the longest) with an earlier occurrence wins.
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        j = _earliest_occurrence(tokens, n)
        if j >= 0:
            return list(tokens[j + n : j + n + budget])
    return []


class NgramProposer:
    """Incremental proposer: `extend` the context, `propose` the draft for it.

    Memory is one dict entry per distinct n-gram per n in [min_n, max_n].
    """

    def __init__(
        self,
        min_n: int,
        max_n: int,
        k: int,
        max_model_len: int | None = None,
        context: Iterable[int] = (),
    ) -> None:
        _check_bounds(min_n, max_n)
        self.min_n = min_n
        self.max_n = max_n
        self.k = k
        self.max_model_len = max_model_len
        self._tokens: list[int] = []
        # first_start[n - min_n][gram] = earliest start index of that n-gram.
        self._first_start: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n - min_n + 1)]
        self.extend(context)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> Sequence[int]:
        return self._tokens

    def append(self, token: int) -> None:
        toks = self._tokens
        toks.append(token)
        end = len(toks)
        for n in range(self.min_n, min(self.max_n, end) + 1):
            self._first_start[n - self.min_n].setdefault(tuple(toks[end - n :]), end - n)

    def extend(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.append(t)

    def propose(self) -> list[int]:
        """Same result as `ngram_propose(self.tokens, min_n, max_n, k, max_model_len)`."""
        toks = self._tokens
        total = len(toks)
        budget = _draft_budget(total, self.min_n, self.k, self.max_model_len)
        if budget == 0:
            return []
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            start = self._first_start[n - self.min_n][tuple(toks[total - n :])]
            if start < total - n:  # an occurrence before the suffix itself
                return toks[start + n : start + n + budget]
        return []


@dataclass(frozen=True)
class NgramCounts:
    """Additive replay counts; sum them over pairs, then `summary`."""

    positions: int = 0
    drafted_positions: int = 0
    first_hits: int = 0
    rounds: int = 0
    tokens: int = 0
    draft_rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    first_accepted_rounds: int = 0

    def __add__(self, other: NgramCounts) -> NgramCounts:
        return NgramCounts(
            positions=self.positions + other.positions,
            drafted_positions=self.drafted_positions + other.drafted_positions,
            first_hits=self.first_hits + other.first_hits,
            rounds=self.rounds + other.rounds,
            tokens=self.tokens + other.tokens,
            draft_rounds=self.draft_rounds + other.draft_rounds,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
            first_accepted_rounds=self.first_accepted_rounds + other.first_accepted_rounds,
        )

    def __sub__(self, other: NgramCounts) -> NgramCounts:
        return NgramCounts(
            positions=self.positions - other.positions,
            drafted_positions=self.drafted_positions - other.drafted_positions,
            first_hits=self.first_hits - other.first_hits,
            rounds=self.rounds - other.rounds,
            tokens=self.tokens - other.tokens,
            draft_rounds=self.draft_rounds - other.draft_rounds,
            draft_tokens=self.draft_tokens - other.draft_tokens,
            accepted_tokens=self.accepted_tokens - other.accepted_tokens,
            first_accepted_rounds=self.first_accepted_rounds - other.first_accepted_rounds,
        )

    def summary(self, k: int) -> dict[str, float]:
        """r_pos, cover, a_cond, A_sim, r_round, r_iid, rounds (c.4) plus engine-comparable
        coverage_m (drafting rounds / rounds) and accept_rate (accepted / drafted tokens)."""

        def ratio(a: int, b: int) -> float:
            return a / b if b else 0.0

        a_sim = ratio(self.tokens, self.rounds)
        return {
            "r_pos": ratio(self.first_hits, self.positions),
            "cover": ratio(self.drafted_positions, self.positions),
            "a_cond": ratio(self.first_hits, self.drafted_positions),
            "A_sim": a_sim,
            "r_round": ratio(self.first_accepted_rounds, self.rounds),
            "r_iid": inverse_accepted_per_round(a_sim, k) if self.rounds else 0.0,
            "rounds": self.rounds,
            "positions": self.positions,
            "coverage_m": ratio(self.draft_rounds, self.rounds),
            "accept_rate": ratio(self.accepted_tokens, self.draft_tokens),
        }


def replay_pair(
    prompt: Sequence[int], completion: Sequence[int], min_n: int, max_n: int, k: int
) -> NgramCounts:
    """Replays the proposer over one completion; see the module docstring."""
    proposer = NgramProposer(min_n, max_n, k, context=prompt)
    positions = drafted = first_hits = 0
    rounds = draft_rounds = draft_tokens = accepted_total = first_accepted = 0
    next_round = 0
    n = len(completion)
    for i, actual in enumerate(completion):
        draft = proposer.propose()
        positions += 1
        if draft:
            drafted += 1
            first_hits += draft[0] == actual
        if i == next_round:
            # The first token comes from the prefill step, which drafts nothing in vLLM.
            if i == 0:
                draft = []
            accepted = 0
            for proposed in draft:
                if i + accepted >= n or completion[i + accepted] != proposed:
                    break
                accepted += 1
            rounds += 1
            if draft:
                draft_rounds += 1
                draft_tokens += len(draft)
            accepted_total += accepted
            first_accepted += accepted > 0
            # The round emits the accepted tokens plus one sampled token.
            next_round = i + accepted + 1
        proposer.append(actual)
    return NgramCounts(
        positions=positions,
        drafted_positions=drafted,
        first_hits=first_hits,
        rounds=rounds,
        tokens=n,
        draft_rounds=draft_rounds,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted_total,
        first_accepted_rounds=first_accepted,
    )


def estimate_r(
    pairs: Iterable[tuple[Sequence[int], Sequence[int]]], min_n: int, max_n: int, k: int
) -> dict[str, float]:
    """Replays every (prompt ids, completion ids) pair; returns `NgramCounts.summary`."""
    total = NgramCounts()
    for prompt, completion in pairs:
        total = total + replay_pair(prompt, completion, min_n, max_n, k)
    return total.summary(k)
