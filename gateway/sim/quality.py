"""The simulator's quality model: when does a cheaper precision's answer diverge?

Every prompt gets a difficulty d in [0, 1], a stated function of its surface features:

    d = clip(0.10
             + 0.30 * min(1, ln(1 + words) / ln(1 + 2000))      # longer prompts are harder
             + 0.15 * [code fence or code keywords]
             + 0.15 * [math markers: equations, \\frac, "prove", "integral", digits op digits]
             + 0.20 * [hard task cues: prove, refactor, optimi[sz]e, debug, derive, algorithm,
                       concurren*, multi-file]
             - 0.10 * [easy task cues: translate, summari[sz]e, format, list, hello, hi]
             + jitter,  0, 1)

where jitter is uniform in [-0.15, 0.15], drawn from a CRC-32 of the prompt text (so it is
fixed per prompt but not predictable from the features: the irreducible noise a router
meets on real traffic). A tier at precision p answers exactly like the reference (bf16)
tier when d <= LEVEL[p], and diverges from it otherwise. BF16 and FP16 never diverge.
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Final

from gateway.precision import Precision

LEVEL: Final[dict[Precision, float]] = {
    "bf16": math.inf,
    "fp16": math.inf,
    "fp8": 0.80,
    "w4a16": 0.62,
    "nvfp4": 0.55,
}

_CODE = re.compile(
    r"```|\bdef |\bclass |\bfunction\b|\breturn\b|#include|\bimport \w|=>|;\s*$", re.M
)
_MATH = re.compile(
    r"\d\s*[-+*/^=]\s*\d|\\frac|\\sum|\bintegral\b|\bprove\b|\btheorem\b|\bequation\b|\bsolve\b",
    re.I,
)
_HARD = re.compile(
    r"\b(prove|refactor|optimi[sz]e|debug|derive|algorithm|concurren\w*|multi-file"
    r"|race condition)\b",
    re.I,
)
_EASY = re.compile(r"\b(translate|summari[sz]e|format|list|hello|hi|thanks)\b", re.I)


def difficulty(text: str) -> float:
    words = len(text.split())
    score = 0.10 + 0.30 * min(1.0, math.log1p(words) / math.log1p(2000))
    if _CODE.search(text):
        score += 0.15
    if _MATH.search(text):
        score += 0.15
    if _HARD.search(text):
        score += 0.20
    if _EASY.search(text):
        score -= 0.10
    jitter = (zlib.crc32(text.encode()) % 10_000) / 10_000 * 0.30 - 0.15
    return min(1.0, max(0.0, score + jitter))


def diverges(text: str, precision: Precision) -> bool:
    """True when a tier at `precision` answers this prompt differently from bf16."""
    return difficulty(text) > LEVEL[precision]


def adequate(text: str, precision: Precision) -> bool:
    """The simulator's ground truth for routing labels: same answer as the reference."""
    return not diverges(text, precision)


__all__ = ["LEVEL", "adequate", "difficulty", "diverges"]
