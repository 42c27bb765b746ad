"""Tokens and hashed n-grams of the last user turn, shared by the batch and the one-request path.

A request's text becomes three groups of distinct grams: words, word bigrams and character
n-grams inside words (padded with spaces, like scikit-learn's `char_wb`). Each distinct gram
has value `group_weight / sqrt(n_words)` in bucket `crc32(gram) mod 2**bits`: presence, not
counts, scaled by the number of distinct words so long and short prompts are comparable.
zlib.crc32 is the same in every process (unlike the built-in `hash()` of a str, which is
salted), and insertion-ordered dicts rather than sets keep the summation order fixed too.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "HEAD_CHARS",
    "TAIL_CHARS",
    "GramSpec",
    "bigram_key",
    "char_grams",
    "clip_text",
    "gram_bucket",
    "tokens",
]

_TOKEN: Final = re.compile(r"\w+")
# Only the head and tail of a very long prompt are read, so one decision stays bounded.
HEAD_CHARS: Final = 6144
TAIL_CHARS: Final = 2048


@dataclass(frozen=True)
class GramSpec:
    """Which grams are hashed, into how many buckets, and how much each group weighs."""

    bits: int = 18
    word_weight: float = 1.0
    bigram_weight: float = 0.7
    char_weight: float = 0.3
    char_min: int = 3
    char_max: int = 5

    def __post_init__(self) -> None:
        if not 8 <= self.bits <= 24:
            raise ValueError("bits must be in [8, 24]")
        if not 1 <= self.char_min <= self.char_max:
            raise ValueError("need 1 <= char_min <= char_max")

    @property
    def n_buckets(self) -> int:
        return 1 << self.bits


def clip_text(text: str) -> str:
    """The head and tail of `text` that the n-grams read."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens of the clipped text."""
    return _TOKEN.findall(clip_text(text).lower())


def bigram_key(first: str, second: str) -> str:
    """The string a bigram is hashed as (the tab cannot occur inside a token)."""
    return f"{first}\t{second}"


def char_grams(word: str, low: int, high: int) -> Iterable[str]:
    """Character n-grams of `" word "`, lengths low..high; every one is yielded, repeats too."""
    padded = f" {word} "
    size = len(padded)
    for n in range(low, high + 1):
        for start in range(size - n + 1):
            yield padded[start : start + n]


def gram_bucket(gram: str, salt: int, mask: int) -> int:
    """Bucket of `gram` in one group; the salt keeps the groups' buckets apart."""
    return zlib.crc32(gram.encode("utf-8"), salt) & mask
