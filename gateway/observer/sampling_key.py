"""Consistent (hash-based) sampling for the prefix-cache replay, after SHARDS (FAST 2015).

A replay that sees only sampled requests caches only their blocks. Sampling requests by an
independent coin leaves most turns of a conversation unsampled, so a sampled turn rarely
finds its earlier turns cached and rho comes out several times too low. Sampling by a stable
hash of what the requests sharing a prefix have in common replays a sampled group whole; the
replay's LRU capacity is then scaled by the rate (`scaled_capacity`), since the sampled
groups fill the same share of the engine's cache.

The key of a request is its conversation's root, the same at every turn:

- chat: the system/developer messages before the first user message, and that user
  message. Each text is keyed by its first and last `TEXT_EDGE` characters, so the cost does
  not grow with a long system prompt, and conversations under one long shared system prompt
  still differ (by their first user message);
- completions: the first `PROMPT_HEAD` characters of the prompt, or its first
  `PROMPT_HEAD_IDS` token ids (a later turn's prompt is longer, so only its head is shared).

Limit: requests whose roots agree on what the key reads (a completions prefix longer than
`PROMPT_HEAD` shared by all of them, chat roots that differ only in the middle of a long
text, or that differ only in images) share one key and are sampled all or nothing. Turns of
a conversation that reach different `--workers` are sampled by each worker alike, but each
replays only its own share.

The hash is a 32-bit BLAKE2b of the UTF-8 key: stable across processes and restarts, unlike
Python's salted `hash`, and spread evenly even over keys that differ in a digit or two (CRC-32,
a little cheaper, sampled 1.2% of 3,000 such keys at a rate of 1.8%).
Key and hash take about 3 us per ShareGPT chat request (timeit, 2026-11-30).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Final

__all__ = [
    "HASH_RANGE",
    "PROMPT_HEAD",
    "PROMPT_HEAD_IDS",
    "TEXT_EDGE",
    "ArrivalRate",
    "budget_rate",
    "hash_key",
    "held_rate",
    "is_sampled",
    "request_key_hash",
    "sampling_key",
    "scaled_capacity",
]

HASH_RANGE: Final = 1 << 32
TEXT_EDGE: Final = 512  # characters kept from each end of a chat root text
PROMPT_HEAD: Final = 1024  # characters of a completions prompt
PROMPT_HEAD_IDS: Final = 256  # token ids of a completions prompt (about 1024 characters)
ROOT_ROLES: Final = frozenset({"system", "developer"})
# Budget rates step down by 2^(-1/4) (~16%): the threshold, and with it the set of sampled
# conversations and the replay's capacity, changes only when the arrival rate moves by a step.
_STEPS_PER_HALVING: Final = 4


def _edges(text: str) -> str:
    if len(text) <= 2 * TEXT_EDGE:
        return text
    return text[:TEXT_EDGE] + text[-TEXT_EDGE:]


def _content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _chat_root(messages: list[Any]) -> str:
    pieces: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ROOT_ROLES or role == "user":
            pieces.append(f"{role}\x00{_edges(_content_text(message.get('content')))}")
        if role == "user":  # later messages differ from turn to turn
            break
    return "\x01".join(pieces)


def _prompt_head(prompt: Any) -> str:
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a list of prompts: choice 0's, as the replay takes it
    if isinstance(prompt, str):
        return prompt[:PROMPT_HEAD]
    if isinstance(prompt, list):
        return ",".join(map(str, prompt[:PROMPT_HEAD_IDS]))
    return ""


def sampling_key(request: dict[str, Any], kind: str | None = None) -> str:
    """The part of a request that every request sharing its prefix has (module docstring).
    `kind` is the endpoint it came to: the engine reads a chat body's `messages` and a
    completions body's `prompt`, whatever else the body holds. Without it, the body's own
    fields tell."""
    messages = request.get("messages")
    if kind == "chat" or (kind is None and isinstance(messages, list)):
        return "chat\x02" + _chat_root(messages if isinstance(messages, list) else [])
    return "prompt\x02" + _prompt_head(request.get("prompt"))


def hash_key(key: str) -> int:
    """A stable 32-bit hash of `key`."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def request_key_hash(request: dict[str, Any], kind: str | None = None) -> int:
    return hash_key(sampling_key(request, kind))


def is_sampled(key_hash: int, rate: float) -> bool:
    """Whether a key is in the sample at `rate`; the samples at a lower rate are a subset."""
    return key_hash < rate * HASH_RANGE


def budget_rate(sample_rate: float, arrivals_per_s: float, max_samples_per_s: float) -> float:
    """The highest rate sample_rate * 2^(-k/4), k >= 0, whose expected samples per second
    fit `max_samples_per_s` at `arrivals_per_s`: the budget lowers the threshold instead of
    dropping samples at random, which would break consistency."""
    if sample_rate <= 0.0 or arrivals_per_s * sample_rate <= max_samples_per_s:
        return sample_rate
    ratio = max_samples_per_s / (arrivals_per_s * sample_rate)
    steps = math.ceil(-math.log2(ratio) * _STEPS_PER_HALVING - 1e-9)
    return sample_rate * math.pow(2.0, -steps / _STEPS_PER_HALVING)


def held_rate(
    current: float, sample_rate: float, arrivals_per_s: float, max_samples_per_s: float
) -> float:
    """`budget_rate` with hysteresis: the rate drops as soon as the budget needs it, but
    rises only once the higher rate would still fit a step more traffic. Without it, an
    arrival rate near a step's boundary flipped the threshold every few seconds (Poisson
    noise in the EWMA), sampling the conversations between the two steps on some turns only
    and evicting from the LRU replay at every drop."""
    needed = budget_rate(sample_rate, arrivals_per_s, max_samples_per_s)
    if needed <= current:
        return needed
    one_step_more = arrivals_per_s * math.pow(2.0, 1.0 / _STEPS_PER_HALVING)
    return max(current, budget_rate(sample_rate, one_step_more, max_samples_per_s))


def scaled_capacity(capacity_blocks: int | None, rate: float) -> int | None:
    """The LRU bound for a replay of a `rate` sample: the sampled groups hold about `rate`
    of the engine's cache (SHARDS); at least one block."""
    if capacity_blocks is None or rate >= 1.0:
        return capacity_blocks
    return max(1, round(capacity_blocks * rate))


class ArrivalRate:
    """Requests per second: counted over periods of `period_s`, then folded into an EWMA
    with time constant `tau_s`, so the request path only adds one and compares a time. It
    starts from 0: a burst of a second or two, which the token bucket absorbs, does not lower
    the sampling rate; traffic sustained for a few `tau_s` does."""

    def __init__(self, period_s: float = 1.0, tau_s: float = 5.0) -> None:
        self.period_s = period_s
        self.tau_s = tau_s
        self.per_s = 0.0
        self._start: float | None = None
        self._count = 0

    def arrived(self, now: float) -> bool:
        """Counts one arrival; True when the estimate was updated."""
        start = self._start
        if start is None:
            self._start, self._count = now, 1
            return False
        elapsed = now - start
        if elapsed < self.period_s:
            self._count += 1
            return False
        observed = self._count / elapsed
        # A long idle gap weighs as the many periods it spans.
        self.per_s += (1.0 - math.exp(-elapsed / self.tau_s)) * (observed - self.per_s)
        self._start, self._count = now, 1
        return True
