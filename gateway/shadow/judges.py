"""Judges: is a cheaper tier's answer as good as the reference tier's? Pure functions.

A judge returns True (adequate), False (not adequate) or None (does not apply to this
pair). Answer-level judges (multiple-choice letter, final number) also work when decoding
was stochastic; text judges (exact, normalized) need deterministic decoding. A code-test
hook can be plugged in as `module:function` taking (candidate, reference, request).
"""

from __future__ import annotations

import importlib
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

Verdict = bool | None
JudgeFn = Callable[[str, str, Mapping[str, Any]], Verdict]

_SPACES = re.compile(r"\s+")
# Answer-level judges only apply when the reference states a final answer explicitly; a
# letter or a number somewhere in free text is not an answer.
_CHOICE_PATTERNS: Final = (
    re.compile(r"\banswer\s*(?:is|:)\s*\(?([A-J])\)?(?![A-Za-z])", re.I),
    re.compile(r"^\s*\(?([A-J])[\).:]?\s*$", re.M),
)
_FINAL_NUMBER = re.compile(
    r"(?:\banswer\s*(?:is|:)|####|\\boxed\{)\s*\$?(-?\d[\d,]*(?:\.\d+)?)", re.I
)


def normalize(text: str) -> str:
    """Unicode-folded, lower-case, punctuation removed, single-spaced (SQuAD-style)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    stripped = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in folded)
    return _SPACES.sub(" ", stripped).strip()


def exact(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    return candidate == reference


def normalized(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    return normalize(candidate) == normalize(reference)


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter an answer commits to (the last one stated)."""
    for pattern in _CHOICE_PATTERNS:
        found = pattern.findall(text)
        if found:
            return str(found[-1]).upper()
    return None


def final_number(text: str) -> str | None:
    """The final numeric answer an answer states ("the answer is 42", "#### 42",
    "\\boxed{42}"), normalised (thousands separators, trailing zeros)."""
    found = _FINAL_NUMBER.findall(text)
    if not found:
        return None
    raw = found[-1].replace(",", "")
    try:
        value = float(raw)
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() else repr(value)


def choice(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    expected = choice_letter(reference)
    return None if expected is None else choice_letter(candidate) == expected


def number(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    expected = final_number(reference)
    return None if expected is None else final_number(candidate) == expected


JUDGES: Final[dict[str, JudgeFn]] = {
    "choice": choice,
    "number": number,
    "normalized": normalized,
    "exact": exact,
}
# Judges that compare answers, not wording: valid when decoding was stochastic.
ANSWER_LEVEL: Final = frozenset({"choice", "number"})


def resolve(name: str) -> JudgeFn:
    """A built-in judge by name, or a plug-in given as `module:function`."""
    if name in JUDGES:
        return JUDGES[name]
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"unknown judge {name!r}: use {sorted(JUDGES)} or module:function")
    function = getattr(importlib.import_module(module), attr)
    if not callable(function):
        raise ValueError(f"judge {name!r} is not callable")
    return function  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Judgement:
    adequate: bool
    judge: str


def judge(
    candidate: str,
    reference: str,
    request: Mapping[str, Any],
    order: Sequence[str],
    *,
    deterministic: bool,
) -> Judgement | None:
    """The first applicable judge's verdict, in `order`; None when none applies.

    With stochastic decoding only answer-level judges (and plug-ins, which know what they
    compare) are consulted: differing wording is then not evidence of inadequacy.
    """
    for name in order:
        if not deterministic and name in JUDGES and name not in ANSWER_LEVEL:
            continue
        verdict = resolve(name)(candidate, reference, request)
        if verdict is not None:
            return Judgement(bool(verdict), name)
    return None


__all__ = [
    "ANSWER_LEVEL",
    "JUDGES",
    "Judgement",
    "choice_letter",
    "final_number",
    "judge",
    "normalize",
    "resolve",
]
