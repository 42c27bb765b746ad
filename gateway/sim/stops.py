"""Stop strings, matched as vLLM's detokenizer matches them (v1/engine/detokenizer.py).

Generation ends at the token that completes a stop string: every token up to that one was
generated (and counts in usage), while the text is cut at the stop string's start, or at its
end with `include_stop_str_in_output`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopCut:
    """An answer ended (or not) by a stop string."""

    texts: list[str]  # what each generated token adds to the text, "" past the cut
    stop: str | None  # the stop string that ended it, None when none occurred

    @property
    def tokens(self) -> int:
        return len(self.texts)


def spaced_texts(pieces: list[str]) -> list[str]:
    """What each piece adds to the simulator's text: pieces are joined by one space."""
    return [piece if index == 0 else " " + piece for index, piece in enumerate(pieces)]


def _earliest_stop(text: str, stops: Iterable[str], after: int = 0) -> tuple[int, str] | None:
    """The stop string that completes earliest in `text` past its first `after` characters
    (ties: list order), and where."""
    found: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop, max(0, after - len(stop) + 1)) if stop else -1
        if at >= 0 and (found is None or at + len(stop) < found[0] + len(found[1])):
            found = (at, stop)
    return found


def cut_at_stop(
    texts: list[str], stops: Iterable[str], *, include_stop: bool = False, min_tokens: int = 0
) -> StopCut:
    """`texts` (each token's text) up to the token that completes the earliest stop string,
    with the text cut where vLLM cuts it. vLLM checks no stop string until `min_tokens`
    tokens are out, so one that completes within them does not count."""
    found = _earliest_stop("".join(texts), stops, after=sum(map(len, texts[:min_tokens])))
    if found is None:
        return StopCut(list(texts), None)
    at, stop = found
    end = at + len(stop)
    keep = end if include_stop else at
    kept: list[str] = []
    start = 0
    for text in texts:
        kept.append(text[: max(0, keep - start)])
        start += len(text)
        if start >= end:  # this token completed the stop string: generation ends here
            break
    return StopCut(kept, stop)


__all__ = ["StopCut", "cut_at_stop", "spaced_texts"]
