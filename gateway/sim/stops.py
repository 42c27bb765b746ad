"""Stop strings, matched as vLLM matches them: anywhere in the generated text."""

from __future__ import annotations

from collections.abc import Iterable


def cut_at_stop(pieces: list[str], stops: Iterable[str]) -> tuple[list[str], str | None]:
    """The pieces whose text ends where the earliest stop string begins, and that string
    (None when none occurs). A piece the match begins inside is kept up to the match, so the
    text is the generated text before the stop string, as vLLM returns it."""
    text = " ".join(pieces)
    found: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop) if stop else -1
        if at >= 0 and (found is None or at < found[0]):
            found = (at, stop)
    if found is None:
        return pieces, None
    at, stop = found
    kept: list[str] = []
    start = 0
    for piece in pieces:
        if start + len(piece) > at:
            if at > start or (at == start and kept):  # "" keeps a space the match follows
                kept.append(text[start:at])
            break
        kept.append(piece)
        start += len(piece) + 1  # the space before the next piece
    return kept, stop


__all__ = ["cut_at_stop"]
