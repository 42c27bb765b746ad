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
# No two `\s*` meet (around an optional colon they did): a run of spaces has one way to
# match, so a long one cannot make the search backtrack quadratically.
_ANSWER_IS = r"\b(?i:answer)\s*(?:(?i:is)(?:\s*:)?|:)\s*"
# A letter is a word of its own ("b," but not "because"; not "e.g.").
_ALONE = r"(?![\w'’]|\.\w)"
# The keyword in any case. After "the answer is", a lower-case "a" is far more often the
# article than option A, and "i" the pronoun: those two count only in parentheses or alone
# at the end of their line. "I" followed by a word is the pronoun ("the answer is I think
# B"): no letter, the next judge decides.
_STATED_LETTER: Final = re.compile(
    _ANSWER_IS
    + r"(?:\(([A-Ja-j])\)|([A-HJ]|I(?!\s+[a-z]))"
    + _ALONE
    + r"|([b-hj])"
    + _ALONE
    + r"|([a-j])[.)]?[ \t]*$)",
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
        \\[dt]?frac\s*(?:\{\s*(?P<numerator>\d+)\s*\}|(?P<numerator_digit>\d))
        \s*(?:\{\s*(?P<denominator>\d+)\s*\}|(?P<denominator_digit>\d))
      | (?P<mantissa>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)
        (?:
            /(?P<over>\d+)
          | [eE](?P<exp10>[-+]?\d+)
          | \s*(?:\^|\*\*)\s*\{?(?P<power>[-+]?\d+)\}?
          | \s*(?:[x×*]|\\times|\\cdot)\s*10\s*(?:\^|\*\*)\s*\{?(?P<sci>[-+]?\d+)\}?
        )?
    )
    (?:[^\W\d_]{1,8}(?!\w))?                  # a unit or ordinal glued on: 5cm, 12kg, 7th
    (?!\w|[.:/]\d)                             # not part of a time, version or date
    (?!\s*[-+*/^=×÷]\s*(?:\d|\(|[^\W\d_]\b))   # not the start of an expression: 2x + 3
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
_MAX_POWER_DIGITS = 10_000  # digits a power may have before it is not compared
_MAX_LISTED = 32  # numbers a stated answer may list before it is not compared
# Answer-level judges read the start and the end of a long answer, where answers state their
# result: judging runs on the event loop, and a degenerate answer (a 4-bit tier repeating
# itself) can be long.
ANSWER_EDGE_CHARS: Final = 4096


def answer_region(text: str) -> str:
    """What answer-level judges read: the whole text, or its first and last 4 KB."""
    if len(text) <= 2 * ANSWER_EDGE_CHARS:
        return text
    return f"{text[:ANSWER_EDGE_CHARS]}\n{text[-ANSWER_EDGE_CHARS:]}"


class _PunctuationToSpace(dict[int, str | int]):
    """A `str.translate` table that maps every Unicode punctuation character to a space,
    filled per character on first sight (so the translation runs in C, not a Python loop)."""

    def __missing__(self, codepoint: int) -> str | int:
        mapped: str | int = (
            " " if unicodedata.category(chr(codepoint)).startswith("P") else codepoint
        )
        self[codepoint] = mapped
        return mapped


_PUNCTUATION_TO_SPACE: Final = _PunctuationToSpace()
_KEPT_SIGN: Final = "\x00"  # stands for a number's minus sign while punctuation goes


def normalize(text: str) -> str:
    """Unicode-folded, lower-case, punctuation removed (but not a number's minus sign),
    single-spaced (SQuAD-style)."""
    folded = unicodedata.normalize("NFKC", text).casefold().replace(_KEPT_SIGN, " ")
    marked = _SIGN.sub(_KEPT_SIGN, folded)
    stripped = marked.translate(_PUNCTUATION_TO_SPACE).replace(_KEPT_SIGN, "-")
    return _SPACES.sub(" ", stripped).strip()


def exact(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    return candidate == reference


def normalized(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    return normalize(candidate) == normalize(reference)


def choice_letter(text: str) -> str | None:
    """The multiple-choice letter an answer commits to: the last "answer is X", else the
    last line that is only a letter; None when it states none clearly."""
    text = answer_region(text)
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
        numerator = parts["numerator"] or parts["numerator_digit"]
        if numerator is not None:
            denominator = parts["denominator"] or parts["denominator_digit"]
            value = Fraction(int(numerator), int(str(denominator)))
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
    text = answer_region(text)
    stated = list(_STATED_NUMBERS.finditer(text))
    if not stated:
        return None
    tokens = list(_NUMBER_TOKEN.finditer(stated[-1]["answer"]))
    if len(tokens) > _MAX_LISTED:
        return None
    values = [number_value(token) for token in tokens]
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
