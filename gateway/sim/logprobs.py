"""Log-probabilities for simulated tokens, in vLLM's chat and completions shapes.

The values are made up but consistent: a function of the token and its position, the sampled
token is the most likely one, and the listed alternatives never take more than the rest of
the probability mass. A client that parses logprobs gets well-formed, plausible numbers.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

from gateway.sim import tokenizer
from gateway.sim.textgen import WORDS


def _token_text(piece: str, position: int) -> str:
    """The token as it appears in the answer: pieces after the first carry their space."""
    return piece if position == 0 else " " + piece


def _ranked(
    piece: str, position: int, top: int, spelled: str | None = None
) -> list[tuple[str, float]]:
    """The sampled token (as `spelled`, else as its piece after a space) and `top - 1`
    alternatives, most likely first."""
    token = _token_text(piece, position) if spelled is None else spelled
    spread = zlib.crc32(f"{position}\0{piece}".encode())
    chosen = 0.5 + 0.49 * (spread % 1000) / 1000  # probability in [0.5, 0.99)
    ranked = [(token, math.log(chosen))]
    rest, share = 1.0 - chosen, 0.5
    for k in range(1, top):
        word = WORDS[(spread + 7919 * k) % len(WORDS)]
        alternative = word if position == 0 else " " + word
        if alternative == token:
            alternative = alternative.upper()
        ranked.append((alternative, math.log(rest * share)))
        share /= 2.0
    return ranked


def _utf8(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(
    pieces: list[str], start: int, top: int, spelled: list[str] | None = None
) -> dict[str, Any]:
    """`choices[].logprobs` of a chat answer for `pieces`, the first at position `start`
    (`spelled`: how each is spelled, when not as its piece after a space)."""
    content = []
    for offset, piece in enumerate(pieces):
        ranked = _ranked(piece, start + offset, max(top, 1), _spelling(spelled, offset))
        token, logprob = ranked[0]
        content.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": _utf8(token),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": _utf8(t)} for t, lp in ranked[:top]
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    pieces: list[str], start: int, top: int, text_offset: int, spelled: list[str] | None = None
) -> dict[str, Any]:
    """`choices[].logprobs` of a completion for `pieces`, the first at position `start` and at
    character `text_offset` of the generated text. Every position lists the `top` most likely
    tokens, the sampled one first (and that one alone when `top` is 0)."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    offsets: list[int] = []
    for offset, piece in enumerate(pieces):
        ranked = _ranked(piece, start + offset, max(top, 1), _spelling(spelled, offset))
        token, logprob = ranked[0]
        tokens.append(token)
        token_logprobs.append(logprob)
        top_logprobs.append(dict(ranked[: max(top, 1)]))
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def _spelling(spelled: list[str] | None, offset: int) -> str | None:
    return None if spelled is None else spelled[offset]


def echoed_logprobs(
    prompt: str, top: int, generated: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`choices[].logprobs` of a completion that echoes its prompt: the prompt's tokens first
    (they spell it from offset 0; the first has no logprob, as nothing precedes it), then
    the `generated` entries, whose offsets count from the end of the prompt."""
    echoed: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "top_logprobs": []}
    echoed["tokens"] = tokenizer.piece_texts(prompt)
    offset = 0
    for position, token in enumerate(echoed["tokens"]):
        ranked = _ranked(token, 0, max(top, 1))  # position 0: the token as it is
        echoed["text_offset"].append(offset)
        echoed["token_logprobs"].append(None if position == 0 else ranked[0][1])
        echoed["top_logprobs"].append(None if position == 0 else dict(ranked[: max(top, 1)]))
        offset += len(token)
    if generated is not None:
        for key in ("tokens", "token_logprobs", "top_logprobs"):
            echoed[key] += generated[key]
        echoed["text_offset"] += [len(prompt) + at for at in generated["text_offset"]]
    return echoed


def prompt_logprob_map(prompt: str, top: int) -> list[dict[str, dict[str, Any]] | None]:
    """A choice's `prompt_logprobs` when the prompt's were asked for (echo with logprobs):
    per prompt token, its id's logprob, rank and text (None for the first), as vLLM lists
    them."""
    echoed = echoed_logprobs(prompt, top)
    entries: list[dict[str, dict[str, Any]] | None] = [None]
    for token, logprob in zip(echoed["tokens"][1:], echoed["token_logprobs"][1:], strict=True):
        entry = {"logprob": logprob, "rank": 1, "decoded_token": token}
        entries.append({str(tokenizer.token_id(token.strip())): entry})
    return entries


__all__ = ["chat_logprobs", "completion_logprobs", "echoed_logprobs", "prompt_logprob_map"]
