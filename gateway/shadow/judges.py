"""Judges: is a cheaper tier's answer as good as the reference tier's? Pure functions.

A judge returns True (adequate), False (not adequate) or None (does not apply to this
pair). Answer-level judges (multiple-choice letter, final number) also work when decoding
was stochastic; text judges (exact, normalized) need deterministic decoding. A code-test
hook can be plugged in as `module:function` taking (candidate, reference, request); plug-ins
know what they compare, so they are consulted on stochastic pairs too.
"""

from __future__ import annotations

import importlib
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

Verdict = bool | None
JudgeFn = Callable[[str, str, Mapping[str, Any]], Verdict]

_SPACES = re.compile(r"\s+")
# A minus sign in front of a digit that does not follow a word character: "-5", "x = -5",
# but not the hyphen of "1-5" or "state-of-the-art".
_SIGN = re.compile(r"(?<!\w)[-\u2212](?=\d)")

# Answer-level judges only apply when the reference states a final answer explicitly; a
# letter or a number somewhere in free text is not an answer. Of several statements the
# last one counts (a model that corrects itself means its last word).
_ANSWER_IS = r"\b(?i:answer)\s*(?:(?i:is)\s*:?|:)\s*"
# The keyword in any case, the letter in upper case: after "the answer is", a lower-case
# "a" is far more often the article than option A. A lower-case letter counts only where it
# cannot start a word: in parentheses, or alone at the end of its line. "I" followed by a
# word is the pronoun ("the answer is I think B"): no letter, the next judge decides.
_STATED_LETTER: Final = re.compile(
    _ANSWER_IS + r"(?:\(([A-Ja-j])\)|([A-HJ]|I(?!\s+[a-z]))(?![\w'’])|([a-j])[.)]?[ \t]*$)",
    re.M,
)
_LETTER_LINE: Final = re.compile(r"^[ \t]*\(?([A-J])[).:]?[ \t]*$", re.M)

# One number, exactly: sign, thousands separators, decimals, a fraction, an exponent
# (1.5e3, 2^10, 1.5 x 10^3) or a LaTeX \frac. An exponent is read whole (a cut-off one would
# read 9^99999 as 9) and bounded in `number_value`, so no answer makes the judge compute a
# huge power.
_NUMBER = r"""
    (?P<sign>[-+\u2212])?\$?
    (?:
        \\d?frac\{(?P<numerator>\d+)\}\{(?P<denominator>\d+)\}
      | (?P<mantissa>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)
        (?:
            /(?P<over>\d+)
          | [eE](?P<exp10>[-+]?\d+)
          | \s*(?:\^|\*\*)\s*\{?(?P<power>[-+]?\d+)\}?
          | \s*(?:[x×*]|\\times|\\cdot)\s*10\s*(?:\^|\*\*)\s*\{?(?P<sci>[-+]?\d+)\}?
        )?
    )
    (?!\w)
"""
_NUMBER_TOKEN: Final = re.compile(_NUMBER, re.X)
# A stated answer may be a list ("1, 5 and 7"): the whole list is the answer.
# Every run of spaces has one way to match (no `\s*` before `\s+`): a long run cannot
# make the search backtrack quadratically.
_LIST_SEPARATOR = r"(?:\s*[,;]\s*(?:and\s+)?|\s+and\s+)"
_ANY_NUMBER = re.sub(r"\?P<\w+>", "?:", _NUMBER)  # the same, without its named groups
_STATED_NUMBERS: Final = re.compile(
    rf"(?:{_ANSWER_IS}|\#\#\#\#\s*|\\boxed\{{\s*)"
    rf"(?P<answer>{_ANY_NUMBER}(?:{_LIST_SEPARATOR}{_ANY_NUMBER})*)",
    re.X,
)
_MAX_POWER_DIGITS = 100_000  # digits a power may have before it is not compared
# Answer-level judges read the end of an answer, where it states its result: judging runs on
# the event loop, and a degenerate answer (a 4-bit tier repeating itself) can be long.
ANSWER_TAIL_CHARS: Final = 4096


def normalize(text: str) -> str:
    """Unicode-folded, lower-case, punctuation removed (but not a number's minus sign),
    single-spaced (SQuAD-style)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    signs = {match.start() for match in _SIGN.finditer(folded)}
    stripped = "".join(
        "-" if index in signs else " " if unicodedata.category(ch).startswith("P") else ch
        for index, ch in enumerate(folded)
    )
    return _SPACES.sub(" ", stripped).strip()


def exact(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    return candidate == reference


def normalized(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    return normalize(candidate) == normalize(reference)


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter an answer commits to: the last "answer is X", else the
    last line that is only a letter; None when it states none clearly."""
    text = text[-ANSWER_TAIL_CHARS:]
    stated = list(_STATED_LETTER.finditer(text))
    if stated:
        groups = stated[-1].groups()
        return next(letter for letter in groups if letter).upper()
    lines = _LETTER_LINE.findall(text)
    return str(lines[-1]) if lines else None


def number_value(token: re.Match[str]) -> Fraction | None:
    """The exact value of one `_NUMBER_TOKEN` match; None when it cannot be computed."""
    parts = token.groupdict()
    value: Fraction | None
    try:
        if parts["numerator"] is not None:
            value = Fraction(int(parts["numerator"]), int(parts["denominator"]))
        else:
            value = _mantissa_value(parts)
    except (ValueError, ZeroDivisionError):  # 1/0, or more digits than int() accepts
        return None
    if value is None:
        return None
    return -value if parts["sign"] in ("-", "\u2212") else value


def _mantissa_value(parts: dict[str, str | None]) -> Fraction | None:
    mantissa = str(parts["mantissa"]).replace(",", "")
    value = Fraction(mantissa)
    if parts["over"] is not None:
        return value / int(parts["over"])
    exponent = parts["exp10"] or parts["sci"]
    if exponent is not None:
        return _power(Fraction(10), int(exponent), 1, value)
    if parts["power"] is not None:
        return _power(value, int(parts["power"]), len(mantissa), Fraction(1))
    return value


def _power(base: Fraction, exponent: int, base_digits: int, factor: Fraction) -> Fraction | None:
    """factor * base ** exponent, or None when the result would be too large to compare."""
    if abs(exponent) * base_digits > _MAX_POWER_DIGITS:
        return None
    return factor * base**exponent


def final_numbers(text: str) -> tuple[Fraction, ...] | None:
    """The final answer's numbers, exact ("the answer is 42", "#### 3/4", "\\boxed{2^{10}}",
    "the answer is 1, 5 and 7"); None when the text states no numeric answer."""
    text = text[-ANSWER_TAIL_CHARS:]
    stated = list(_STATED_NUMBERS.finditer(text))
    if not stated:
        return None
    values = [number_value(token) for token in _NUMBER_TOKEN.finditer(stated[-1]["answer"])]
    if not values or any(value is None for value in values):
        return None
    return tuple(value for value in values if value is not None)


def choice(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    expected = choice_letter(reference)
    return None if expected is None else choice_letter(candidate) == expected


def number(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    expected = final_numbers(reference)
    return None if expected is None else final_numbers(candidate) == expected


JUDGES: Final[dict[str, JudgeFn]] = {
    "choice": choice,
    "number": number,
    "normalized": normalized,
    "exact": exact,
}
# Judges that compare answers, not wording: valid when decoding was stochastic.
ANSWER_LEVEL: Final = frozenset({"choice", "number"})


def decides_stochastic(name: str) -> bool:
    """Whether judge `name` is consulted on a pair decoded stochastically: answer-level
    built-ins and plug-ins (which know what they compare), not the text judges."""
    return name in ANSWER_LEVEL or name not in JUDGES


def resolve(name: str) -> JudgeFn:
    """A built-in judge by name, or a plug-in given as `module:function`; ValueError, with
    the reason, for anything else."""
    if name in JUDGES:
        return JUDGES[name]
    module, sep, attr = name.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"unknown judge {name!r}: use one of {sorted(JUDGES)} or module:function")
    try:
        function = getattr(importlib.import_module(module), attr)
    except AttributeError:
        raise ValueError(f"judge {name!r}: {module!r} has no {attr!r}") from None
    except Exception as exc:  # any failure while importing a plug-in is a config error
        raise ValueError(f"judge {name!r}: cannot import {module!r} ({exc})") from None
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

    With stochastic decoding only judges that `decides_stochastic` are consulted: differing
    wording is then not evidence of inadequacy.
    """
    for name in order:
        if not deterministic and not decides_stochastic(name):
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
    "decides_stochastic",
    "final_numbers",
    "judge",
    "normalize",
    "number_value",
    "resolve",
]
