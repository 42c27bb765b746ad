"""Tokens and hashed n-grams of the last user turn, shared by the batch and the one-request path.

A request's text becomes three groups of distinct grams: words, word bigrams and character
n-grams inside words (padded with spaces, like scikit-learn's `char_wb`). Each distinct gram
has value `group_weight / sqrt(n_words)` in bucket `crc32(gram) mod 2**bits`: presence, not
counts, scaled by the number of distinct words so long and short prompts are comparable.
zlib.crc32 is the same in every process (unlike the built-in `hash()` of a str, which is
salted), and insertion-ordered dicts rather than sets keep the summation order fixed too.
"""

from __future__ import annotations

import math
import string
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BIGRAM_SALT",
    "CHAR_SALT",
    "HEAD_CHARS",
    "TAIL_CHARS",
    "WORD_SALT",
    "GramSpec",
    "bigram_key",
    "char_gram_buckets",
    "char_grams",
    "clip_text",
    "digit_token_count",
    "gram_bucket",
    "tokens",
]

# Tokens are what is left between whitespace once ASCII punctuation (except "_") and common
# typographic punctuation become spaces: one C-level translate and split, about 2.5x faster
# than re.findall(r"\w+") on MMLU-sized prompts. Non-ASCII letters stay inside tokens.
_WIDE_SEPARATORS: Final = "\u00a0\u2013\u2014\u2018\u2019\u201c\u201d\u2026\u00ab\u00bb\u00b7\u2022"
_SEPARATORS: Final = str.maketrans(
    dict.fromkeys([c for c in string.punctuation if c != "_"] + list(_WIDE_SEPARATORS), " ")
)
# The same mapping for ASCII text as a 256-byte table: bytes.translate with a table is a plain
# C loop, about 3x faster than str.translate with a dict on MMLU-sized prompts.
_ASCII_FOLD: Final = bytes(
    ord(" ")
    if chr(b) in string.punctuation and chr(b) != "_"
    else ord(chr(b).lower())
    if chr(b) in string.ascii_uppercase
    else b
    for b in range(256)
)
_ASCII_DIGITS: Final = string.digits.encode("ascii")
# Only the head and tail of a very long prompt are read, so one decision stays bounded.
HEAD_CHARS: Final = 6144
TAIL_CHARS: Final = 2048


@dataclass(frozen=True)
class GramSpec:
    """Which grams are hashed, into how many buckets, and how much each group weighs."""

    bits: int = 18
    word_weight: float = 1.0
    # Bigrams cost ~40 us per MMLU prompt on the lean path (a tuple key per pair, a cache of
    # ~100k pairs) for about +0.003 APGR, within noise: off by default.
    bigram_weight: float = 0.0
    char_weight: float = 0.3
    char_min: int = 3
    char_max: int = 5

    def __post_init__(self) -> None:
        # A spec read from a tampered model.json must fail here, at load, not on every request.
        for name in ("bits", "char_min", "char_max"):
            if type(getattr(self, name)) is not int:
                raise ValueError(f"{name} must be an integer")
        for name in ("word_weight", "bigram_weight", "char_weight"):
            weight = getattr(self, name)
            if type(weight) not in (int, float) or not math.isfinite(weight):
                raise ValueError(f"{name} must be a finite number")
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
    """Lower-cased word tokens of the clipped text (see `_SEPARATORS`)."""
    clipped = clip_text(text)
    if clipped.isascii():  # O(1): CPython stores the flag; one translate also lower-cases
        return clipped.encode("ascii").translate(_ASCII_FOLD).decode("ascii").split()
    # ASCII bytes never occur inside a multi-byte UTF-8 sequence, so the byte table is safe on
    # UTF-8 too; the few non-ASCII separators are replaced only when present (~4x faster than
    # str.translate with `_SEPARATORS`, which gives the same tokens).
    # surrogatepass: a lone surrogate (valid in JSON read by the json module) survives as is.
    folded = (
        clipped.lower()
        .encode("utf-8", "surrogatepass")
        .translate(_ASCII_FOLD)
        .decode("utf-8", "surrogatepass")
    )
    for separator in _WIDE_SEPARATORS:
        if separator in folded:
            folded = folded.replace(separator, " ")
    return folded.split()


def digit_token_count(clipped: str, words: Sequence[str]) -> int:
    """How many of `words` (the `tokens` of the clipped text `clipped`) are all digits, as
    `str.isdigit` counts them."""
    if clipped.isascii():
        # Deleting the digits while folding makes exactly the all-digit tokens vanish: one C
        # pass instead of an isdigit call per token (the only digits in ASCII are 0-9).
        kept = clipped.encode("ascii").translate(_ASCII_FOLD, _ASCII_DIGITS).split()
        return len(words) - len(kept)
    return sum(map(str.isdigit, words))


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


def char_gram_buckets(word: str, low: int, high: int, mask: int) -> list[int]:
    """`gram_bucket(g, CHAR_SALT, mask)` of every `char_grams(word, low, high)`, in order.
    An ASCII word is encoded once and its grams hashed as byte slices (a character is a
    byte there): a third less time per new word than encoding each gram."""
    padded = f" {word} "
    if not padded.isascii():
        return [gram_bucket(g, CHAR_SALT, mask) for g in char_grams(word, low, high)]
    raw = padded.encode("ascii")
    size, crc = len(raw), zlib.crc32
    return [
        crc(raw[start : start + n], CHAR_SALT) & mask
        for n in range(low, high + 1)
        for start in range(size - n + 1)
    ]


# crc32 start values that keep the three gram groups in different buckets.
WORD_SALT: Final = 0
BIGRAM_SALT: Final = 0x9E3779B9
CHAR_SALT: Final = 0x85EBCA6B


def gram_bucket(gram: str, salt: int, mask: int) -> int:
    """Bucket of `gram` in one group; the salt keeps the groups' buckets apart.

    surrogatepass: a lone surrogate (label files read by the json module may hold one) hashes
    like any other character instead of failing; valid text encodes exactly as plain UTF-8.
    """
    return zlib.crc32(gram.encode("utf-8", "surrogatepass"), salt) & mask
