"""The simulator's tokenizer: words and punctuation, ids from a stable hash.

It only has to be deterministic across processes and cheap; the ids feed the prefix-cache
and n-gram replay exactly as a real tokenizer's ids would.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

VOCAB_SIZE: Final = 50_000
# Words and punctuation; whitespace between them is not a token of its own. A text of only
# whitespace is one token: a real tokenizer spells it with at least one, and a prompt of it
# is no empty prompt.
_PIECE = re.compile(r"\w+|[^\w\s]|\A\s+\Z")


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def piece_texts(text: str) -> list[str]:
    """What each piece adds to `text`: the piece and the whitespace before it, so that the
    texts of the first k pieces join to the text those k tokens spell."""
    texts: list[str] = []
    end = 0
    for match in _PIECE.finditer(text):
        texts.append(text[end : match.end()])
        end = match.end()
    return texts


def token_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % VOCAB_SIZE


def encode(text: str) -> list[int]:
    return [token_id(piece) for piece in _PIECE.findall(text)]


def content_text(content: Any) -> str:
    """Text of an OpenAI message content: a string, a list of parts, or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def chat_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """A ChatML-like rendering: what a chat template would feed the engine."""
    parts = []
    for message in messages:
        parts.append(f"<|im_start|> {message.get('role', 'user')} ")
        parts.append(content_text(message.get("content")))
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, dict) else {}
            parts.append(f" {function.get('name', '')} {function.get('arguments', '')}")
        parts.append(" <|im_end|> ")
    parts.append("<|im_start|> assistant ")
    return "".join(parts)


__all__ = [
    "VOCAB_SIZE",
    "chat_prompt",
    "content_text",
    "encode",
    "piece_texts",
    "pieces",
    "token_id",
]
