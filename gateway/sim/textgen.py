"""Deterministic answers for the simulator.

An answer is a function of the prompt, the request's `seed`, the choice index and, through
the quality model, the tier's precision: a tier that does not diverge returns exactly the
reference tier's answer. Answers copy spans of the prompt at a rate set by the prompt's
kind (edit and code requests copy a lot), which is what makes n-gram speculation pay on
some traffic and not on other traffic, as on a real engine.
"""

from __future__ import annotations

import random
import re
import zlib
from typing import Final

from gateway.precision import Precision
from gateway.sim.quality import diverges

_WORD_TEXT: Final = """
the of and to in is that for it as with was on be by at this are from or have an they
which one you had not but what all were when we there can more if no out so said use each
she do how their will up other about many then them these some her would make like him
into time has look two write go see number way could people than first water been call who
oil its now find long down day did get come made may part over new sound take only little
work know place year live me back give most very after thing our just name good sentence
man think say great where help through much before line right too mean old any same tell
boy follow came want show also around form three small set put end does another well large
must big even such because turn here why ask went men read need land different home us
move try kind hand picture again change off play spell air away animal house point page
letter mother answer found study still learn should value function return result list
index model tier cache token batch layer vector
"""
WORDS: Final = tuple(_WORD_TEXT.split())
_COPY_CUES = re.compile(
    r"```|\b(rewrite|edit|fix|refactor|repeat|copy|quote|rename|update)\b", re.I
)
# [ \t]*, not \s*: \s* crosses newlines from every line start (quadratic on a prompt of them);
# re.M tries each later line start anyway, so the matches are the same.
_CHOICES = re.compile(r"^[ \t]*\(?([A-D])[\).:]\s", re.M)
_MATHY = re.compile(r"\d\s*[-+*/^=]\s*\d|\bsolve\b|\bhow many\b|\bcompute\b", re.I)
LETTERS: Final = "ABCD"


def _seed(prompt: str, request_seed: int | None, choice: int) -> int:
    base = zlib.crc32(prompt.encode())
    if request_seed is not None:
        base ^= (request_seed * 2654435761) & 0xFFFFFFFF
    return base + 7919 * choice


def copy_rate(prompt: str) -> float:
    return 0.65 if _COPY_CUES.search(prompt) else 0.08


def _fill(rng: random.Random, source: list[str], length: int, rate: float) -> list[str]:
    out: list[str] = []
    while len(out) < length:
        if len(source) > 8 and rng.random() < rate:
            start = rng.randrange(len(source) - 4)
            out.extend(source[start : start + rng.randint(4, 16)])
        else:
            out.append(WORDS[rng.randrange(len(WORDS))])
    return out[:length]


def _final_answer(prompt: str, seed: int, diverged: bool) -> list[str]:
    if len(set(_CHOICES.findall(prompt))) >= 2:
        index = seed % 4
        if diverged:
            index = (index + 1 + (seed >> 4) % 3) % 4
        return ["Answer", ":", LETTERS[index]]
    if _MATHY.search(prompt):
        number = seed % 997
        if diverged:
            number += 1 + (seed >> 5) % 50
        return ["The", "answer", "is", str(number), "."]
    return []


def answer(
    prompt: str,
    prompt_pieces: list[str],
    precision: Precision,
    *,
    request_seed: int | None = None,
    choice: int = 0,
    length: int | None = None,
) -> list[str]:
    """The answer's pieces (tokens): at its natural length, or `length` when given
    (what `ignore_eos` asks for), before any max_tokens cut."""
    seed = _seed(prompt, request_seed, choice)
    rng = random.Random(seed)
    natural = 24 + rng.randrange(200)
    length = natural if length is None else max(1, length)
    rate = copy_rate(prompt)
    body = _fill(rng, prompt_pieces, length, rate)
    diverged = diverges(prompt, precision)
    if diverged:
        # Same first few tokens as the reference, then a different continuation and final
        # answer: the divergence shows even in a short completion.
        cut = min(3, length // 4)
        other = random.Random(seed ^ 0x5BD1E995 ^ zlib.crc32(precision.encode()))
        body = body[:cut] + _fill(other, prompt_pieces, length - cut, rate)
    return body + _final_answer(prompt, seed, diverged)


def detokenize(pieces: list[str]) -> str:
    return " ".join(pieces)


__all__ = ["WORDS", "answer", "copy_rate", "detokenize"]
