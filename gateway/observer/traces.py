"""Readers for the traces the offline regime estimator takes.

- Mooncake JSONL: {"timestamp" (ms), "input_length", "output_length", "hash_ids"}; equal
  hash ids mean equal prompt prefixes up to that block (512 tokens in the released traces).
- Azure LLM inference CSV: TIMESTAMP, ContextTokens, GeneratedTokens.
- Chat logs with text: ShareGPT JSON (a list of {"id", "conversations": [{"from", "value"}]})
  or JSONL whose rows carry "messages" ([{"role", "content"}]) or "conversations".

Parsers take lines or text and are pure; `read_trace` is the one function that opens a file.
Text is turned into ids by `WordTokenizer`, a deterministic word-level stand-in for the
model's tokenizer (see its docstring).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

__all__ = [
    "ChatTurn",
    "Conversation",
    "LengthRequest",
    "MooncakeRequest",
    "Trace",
    "TraceFormat",
    "WordTokenizer",
    "detect_format",
    "parse_azure_csv",
    "parse_chat",
    "parse_mooncake",
    "read_trace",
]

TraceFormat = Literal["mooncake", "azure", "chat"]

_ROLE: Final[dict[str, str]] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class LengthRequest:
    """An arrival with its lengths; enough for concurrency under a service-time model."""

    arrival_s: float
    input_length: int
    output_length: int


@dataclass(frozen=True)
class MooncakeRequest(LengthRequest):
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class ChatTurn:
    role: str  # "user", "assistant", "system" or the source's own name
    text: str


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[ChatTurn, ...]


@dataclass(frozen=True)
class Trace:
    """A parsed trace: `requests` for mooncake/azure, `conversations` for chat."""

    format: TraceFormat
    requests: tuple[LengthRequest, ...] = ()
    conversations: tuple[Conversation, ...] = ()


def _finite(row: dict[str, Any], key: str) -> float:
    # json.loads reads Infinity and NaN; neither is a time or a length. Nor is a boolean,
    # which float() would read as 0 or 1.
    if isinstance(row[key], bool):
        raise ValueError(f"{key} is not a number: {row[key]!r}")
    value = float(row[key])
    if not math.isfinite(value):
        raise ValueError(f"{key} is not a finite number: {row[key]!r}")
    return value


def _length(row: dict[str, Any], key: str) -> int:
    value = _finite(row, key)
    if value < 0 or value != int(value):
        raise ValueError(f"{key} is not a token count: {row[key]!r}")
    return int(value)


def parse_mooncake(lines: Iterable[str]) -> list[MooncakeRequest]:
    """Mooncake rows in arrival order (a stable sort keeps ties in file order)."""
    out: list[MooncakeRequest] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(
                MooncakeRequest(
                    arrival_s=_finite(row, "timestamp") / 1000.0,
                    input_length=_length(row, "input_length"),
                    output_length=_length(row, "output_length"),
                    hash_ids=tuple(int(h) for h in row.get("hash_ids", ())),
                )
            )
        except KeyError as exc:
            raise ValueError(f"mooncake line {number}: missing field {exc}") from exc
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # int(inf) overflows; a row nested thousands deep exhausts json's recursion.
            raise ValueError(f"mooncake line {number}: {exc}") from exc
    out.sort(key=lambda r: r.arrival_s)
    return out


def _seconds(stamp: str) -> float:
    # Naive stamps are read as UTC so that no local DST shift enters the differences.
    parsed = datetime.fromisoformat(stamp.strip())
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _count(cells: Sequence[str], header: Sequence[str], column: int) -> int:
    # A negative length would give a negative service time: a wrong concurrency, not an error.
    value = int(cells[column])
    if value < 0:
        raise ValueError(f"{header[column]} is not a token count: {value}")
    return value


def parse_azure_csv(lines: Iterable[str]) -> list[LengthRequest]:
    """Azure rows with arrivals in seconds from the first request."""
    rows = iter(lines)
    header = [h.strip() for h in next(rows, "").split(",")]
    try:
        t_col = header.index("TIMESTAMP")
        in_col = header.index("ContextTokens")
        out_col = header.index("GeneratedTokens")
    except ValueError:
        raise ValueError(f"not an Azure trace header: {header}") from None
    raw: list[tuple[float, int, int]] = []
    for number, line in enumerate(rows, 2):
        if not line.strip():
            continue
        cells = line.split(",")
        try:
            raw.append(
                (
                    _seconds(cells[t_col]),
                    _count(cells, header, in_col),
                    _count(cells, header, out_col),
                )
            )
        except (IndexError, ValueError) as exc:
            raise ValueError(f"azure line {number}: {exc}") from exc
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0] if raw else 0.0
    return [LengthRequest(t - t0, li, lo) for t, li, lo in raw]


def _turns(items: Sequence[Any]) -> tuple[ChatTurn, ...]:
    turns: list[ChatTurn] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        role = str(item.get("role", item.get("from", "user"))).lower()
        text = item.get("content", item.get("value", ""))
        if isinstance(text, list):  # OpenAI content parts
            text = " ".join(str(p.get("text", "")) for p in text if isinstance(p, dict))
        turns.append(ChatTurn(_ROLE.get(role, role), str(text)))
    return tuple(turns)


def _conversation(row: Any, index: int) -> Conversation | None:
    if not isinstance(row, dict):
        return None
    items = row.get("conversations", row.get("messages"))
    if not isinstance(items, list):
        return None
    return Conversation(str(row.get("id", index)), _turns(items))


def _json_lines(text: str) -> list[str]:
    """JSONL rows, split at newlines only: str.splitlines also splits at U+2028 and U+0085,
    which JSON allows raw inside a string (json.dumps(ensure_ascii=False) writes them), so
    a valid row broke in two and the rows after it got a wrong number."""
    return text.split("\n")


def parse_chat(text: str) -> list[Conversation]:
    """ShareGPT JSON (a list) or JSONL rows with `messages` or `conversations`."""
    stripped = text.lstrip()
    rows: list[Any]
    if stripped.startswith("["):
        rows = json.loads(stripped)
    else:
        rows = []
        for number, line in enumerate(_json_lines(text), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError) as exc:  # json's position is within the line
                raise ValueError(f"chat line {number}: {exc}") from exc
    convs = [_conversation(row, i) for i, row in enumerate(rows)]
    return [c for c in convs if c is not None]


def detect_format(path: Path, head: str) -> TraceFormat:
    """Guesses the format from the extension and the first bytes."""
    if path.suffix.lower() == ".csv" or head.startswith("TIMESTAMP"):
        return "azure"
    if '"hash_ids"' in head or '"input_length"' in head:
        return "mooncake"
    if '"conversations"' in head or '"messages"' in head:
        return "chat"
    raise ValueError(f"cannot tell the format of {path}; pass --format")


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; a byte that is not UTF-8 is named with its file and line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}: line {line}: not UTF-8 text ({exc.reason})") from None


def read_trace(path: Path, fmt: TraceFormat | None = None) -> Trace:
    """Reads and parses one trace file; a malformed or empty one raises ValueError naming it."""
    text = _read_text(path)
    kind = fmt or detect_format(path, text[:4096])
    try:
        if kind == "mooncake":
            trace = Trace("mooncake", requests=tuple(parse_mooncake(_json_lines(text))))
        elif kind == "azure":
            trace = Trace("azure", requests=tuple(parse_azure_csv(text.splitlines())))
        else:
            trace = Trace("chat", conversations=tuple(parse_chat(text)))
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
        raise ValueError(f"{path}: {exc}") from exc
    if not trace.requests and not trace.conversations:
        raise ValueError(f"{path}: no requests in this {kind} trace")
    return trace


_WORD: Final = re.compile(r"\w+|[^\w\s]")


class WordTokenizer:
    """Deterministic word-level tokenizer: runs of word characters and single punctuation
    marks, case kept, whitespace dropped. Ids are given in first-seen order, so the same
    texts in the same order always give the same ids. It stands in for the model's BPE when
    only text is available: a word is about 1.3 BPE tokens, so n-gram lengths and block
    sizes measured with it are longer in real tokens, and r and rho are approximations."""

    def __init__(self) -> None:
        self._vocab: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._vocab)

    def encode(self, text: str) -> list[int]:
        vocab = self._vocab
        return [vocab.setdefault(w, len(vocab)) for w in _WORD.findall(text)]
