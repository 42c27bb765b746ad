"""Offline regime (C, rho, r) of a trace: the computation behind `tiergate regime`.

Concurrency. Traces give arrivals and lengths, not completions, so each request is held in
flight for a stated service time S = L_in / prefill_rate + L_out * tpot (no queueing: every
request is served at once, an M/G/infinity reading, so the mean is Little's law lambda * E[S]).
C is then the time-weighted in-flight count over [first arrival, last completion]; p50/p95 are
time-weighted quantiles of that count.

Prefix share. Mooncake traces ship 512-token block hashes (`HashIdCacheReplay`); chat logs are
tokenised with `WordTokenizer` and replayed with vLLM's chained 16-token blocks
(`PrefixCacheReplay`). Conversations are replayed one after another, each turn's prompt being
the whole conversation so far. Azure traces have no content, so rho is null.

Repetitiveness. Chat logs with assistant turns give (prompt, reply) pairs for the n-gram
replay. A log without assistant turns (the shared ShareGPT sample has only user turns) falls
back to replaying each message against the conversation before it, which measures how
repetitive the text is rather than how a model copies; the output says which was used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway.observer.ngram_replay import estimate_r
from gateway.observer.prefix_replay import estimate_rho, estimate_rho_hash_ids
from gateway.observer.traces import (
    Conversation,
    LengthRequest,
    MooncakeRequest,
    Trace,
    WordTokenizer,
)

__all__ = [
    "ConcurrencyStats",
    "ServiceTimeModel",
    "chat_regime",
    "concurrency_stats",
    "length_regime",
    "mooncake_regime",
    "trace_regime",
]


@dataclass(frozen=True)
class ServiceTimeModel:
    """Seconds a request stays in flight: queue_s + L_in / prefill_tokens_per_s + L_out * tpot_s.

    Defaults (10k prompt tokens/s, 25 ms per output token) are a loaded 30B-A3B-class engine;
    they are a stated assumption, not a measurement: pass your engine's TTFT and TPOT."""

    prefill_tokens_per_s: float = 10_000.0
    tpot_s: float = 0.025
    queue_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.prefill_tokens_per_s < math.inf:
            raise ValueError(f"prefill tokens/s must be positive, got {self.prefill_tokens_per_s}")
        if not (0.0 <= self.tpot_s < math.inf and 0.0 <= self.queue_s < math.inf):
            raise ValueError("time per output token and queue time must be >= 0")

    def seconds(self, input_length: float, output_length: float) -> float:
        return self.queue_s + input_length / self.prefill_tokens_per_s + output_length * self.tpot_s


@dataclass(frozen=True)
class ConcurrencyStats:
    """Time-weighted in-flight requests over `span_s` seconds."""

    mean: float
    p50: float
    p95: float
    max: float
    span_s: float


def _weighted_quantile(durations: dict[int, float], total: float, q: float) -> float:
    acc = 0.0
    for level in sorted(durations):
        acc += durations[level]
        if acc >= q * total - 1e-12 * total:
            return float(level)
    return float(max(durations))


def concurrency_stats(intervals: Iterable[tuple[float, float]]) -> ConcurrencyStats:
    """Time-weighted distribution of the number of open [start, end) intervals."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        if end < start:
            raise ValueError("interval ends before it starts")
        events.append((start, 1))
        events.append((end, -1))
    if not events:
        return ConcurrencyStats(0.0, 0.0, 0.0, 0.0, 0.0)
    events.sort()  # at equal times, -1 sorts before +1: departures first
    durations: dict[int, float] = {}
    level, last = 0, events[0][0]
    for t, delta in events:
        if t > last:
            durations[level] = durations.get(level, 0.0) + (t - last)
            last = t
        level += delta
    span = events[-1][0] - events[0][0]
    if span <= 0:
        peak = float(sum(1 for _, d in events if d > 0))
        return ConcurrencyStats(peak, peak, peak, peak, 0.0)
    mean = sum(lv * d for lv, d in durations.items()) / span
    return ConcurrencyStats(
        mean=mean,
        p50=_weighted_quantile(durations, span, 0.50),
        p95=_weighted_quantile(durations, span, 0.95),
        max=float(max(lv for lv, d in durations.items() if d > 0)),
        span_s=span,
    )


def _lengths(requests: Sequence[LengthRequest]) -> dict[str, float | None]:
    if not requests:
        return {"l_in": None, "l_out": None}
    n = len(requests)
    return {
        "l_in": sum(r.input_length for r in requests) / n,
        "l_out": sum(r.output_length for r in requests) / n,
    }


def _null_concurrency() -> dict[str, float | None]:
    return {"mean": None, "p50": None, "p95": None}


def length_regime(
    requests: Sequence[LengthRequest], service: ServiceTimeModel | None = None
) -> dict[str, Any]:
    """Concurrency and mean lengths from arrivals (Azure-style traces)."""
    model = service or ServiceTimeModel()
    stats = concurrency_stats(
        (r.arrival_s, r.arrival_s + model.seconds(r.input_length, r.output_length))
        for r in requests
    )
    return {
        "format": "azure",
        "requests": len(requests),
        "concurrency": asdict(stats),
        "rho": {"unbounded": None, "lru": None},
        "r": None,
        "lengths": _lengths(requests),
        "service_model": asdict(model),
    }


def _check_hash_block(requests: Sequence[MooncakeRequest], block_tokens: int) -> None:
    # A hash id stands for a fixed number of the trace's tokens (512 in Mooncake's releases);
    # replayed with another count, hits and prompt lengths are in different units.
    for r in requests:
        if r.hash_ids and len(r.hash_ids) != math.ceil(r.input_length / block_tokens):
            raise ValueError(
                f"{len(r.hash_ids)} hash ids for a {r.input_length}-token prompt: the trace's "
                f"hash blocks are not {block_tokens} tokens (Mooncake's are 512)"
            )


def mooncake_regime(
    requests: Sequence[MooncakeRequest],
    *,
    block_tokens: int = 512,
    capacity_blocks: int | None = None,
    service: ServiceTimeModel | None = None,
) -> dict[str, Any]:
    """Concurrency as `length_regime`; rho from the hash-id replay in arrival order."""
    _check_hash_block(requests, block_tokens)
    out = length_regime(requests, service)
    rho = estimate_rho_hash_ids(
        ((r.hash_ids, r.input_length) for r in requests), block_tokens, capacity_blocks
    )
    out["format"] = "mooncake"
    out["rho"] = {**rho, "block_tokens": block_tokens, "capacity_blocks": capacity_blocks}
    return out


def _chat_samples(
    conversations: Sequence[Conversation], tokenizer: WordTokenizer
) -> tuple[list[list[int]], list[list[int]], list[tuple[list[int], list[int]]], bool]:
    """Prompts, the reply each got (empty when none followed), the (context, completion)
    pairs to replay for r, and whether those are the log's replies."""
    prompts: list[list[int]] = []
    answers: list[list[int]] = []
    replies: list[tuple[list[int], list[int]]] = []
    every_turn: list[tuple[list[int], list[int]]] = []
    for conv in conversations:
        context: list[int] = []
        for turn in conv.turns:
            # The role marker stands in for the chat template's role tokens.
            ids = tokenizer.encode(f"{turn.role}:") + tokenizer.encode(turn.text)
            if turn.role == "assistant":
                if context:
                    replies.append((list(context), ids))
                if answers and not answers[-1]:
                    answers[-1] = ids
            else:
                prompts.append([*context, *ids])
                answers.append([])
            every_turn.append((list(context), ids))
            context.extend(ids)
    if replies:
        return prompts, answers, replies, True
    return prompts, answers, every_turn, False


def chat_regime(
    conversations: Sequence[Conversation],
    *,
    block_size: int = 16,
    capacity_blocks: int | None = None,
    min_n: int = 2,
    max_n: int = 4,
    k: int = 4,
) -> dict[str, Any]:
    """rho and r of a text chat log under the word-level tokenizer; no timing, so C is null."""
    tokenizer = WordTokenizer()
    prompts, answers, pairs, from_replies = _chat_samples(conversations, tokenizer)
    rho = estimate_rho(prompts, block_size, capacity_blocks, answers)
    r = estimate_r(pairs, min_n, max_n, k)
    source = "assistant replies" if from_replies else "self-replay of messages (no replies)"
    n_pairs = len(pairs)
    return {
        "format": "chat",
        "requests": len(prompts),
        "concurrency": _null_concurrency(),
        "rho": {
            **rho,
            "block_tokens": block_size,
            "capacity_blocks": capacity_blocks,
            "tokenizer": "word",
        },
        "r": {**r, "source": source, "min_n": min_n, "max_n": max_n, "k": k},
        "lengths": {
            "l_in": sum(map(len, prompts)) / len(prompts) if prompts else None,
            # Without replies the "completions" are the messages themselves: no output length.
            "l_out": sum(len(c) for _, c in pairs) / n_pairs if n_pairs and from_replies else None,
        },
        "service_model": None,
    }


def trace_regime(
    trace: Trace,
    *,
    block_tokens: int | None = None,
    capacity_blocks: int | None = None,
    service: ServiceTimeModel | None = None,
    min_n: int = 2,
    max_n: int = 4,
    k: int = 4,
) -> dict[str, Any]:
    """Dispatches on the trace format. `block_tokens` defaults to 512 for Mooncake (its block
    size) and 16 for chat logs (vLLM's)."""
    if trace.format == "mooncake":
        moon = [r for r in trace.requests if isinstance(r, MooncakeRequest)]
        return mooncake_regime(
            moon,
            block_tokens=block_tokens or 512,
            capacity_blocks=capacity_blocks,
            service=service,
        )
    if trace.format == "azure":
        return length_regime(trace.requests, service)
    return chat_regime(
        trace.conversations,
        block_size=block_tokens or 16,
        capacity_blocks=capacity_blocks,
        min_n=min_n,
        max_n=max_n,
        k=k,
    )
