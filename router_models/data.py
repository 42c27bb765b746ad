"""Label files: one JSON object per line, plain or gzip-compressed (see shared/data/MANIFEST.md).

```
{"id": "...", "messages": [...] | "prompt": ..., "correct": {"<tier>": score in [0,1] | null, ...},
 "source": "..."}
```
The request the router sees is the row's `request` object when present, else the row without
its label fields (`id`, `correct`, `source`). A `null` score means "no label for this tier" and
becomes NaN. Rows that carry only precomputed `features` (the gateway's shadow log when the
tenant does not keep text) have nothing a scorer can read; they are skipped and counted. Every
other problem is reported as a `LabelDataError` naming the file and the line.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router_models.errors import LabelDataError

__all__ = ["LABEL_FIELDS", "LabelSet", "load_labels", "parse_tiers"]

# Row keys that carry labels rather than request content.
LABEL_FIELDS = frozenset({"id", "correct", "source"})


@dataclass(frozen=True)
class LabelSet:
    """Requests with per-tier scores; `correct[i, k]` is request i's score at tier k (NaN: none)."""

    tiers: tuple[str, ...]
    requests: tuple[Mapping[str, Any], ...]
    correct: NDArray[np.float64]
    ids: tuple[str, ...]
    sources: Mapping[str, int] = field(default_factory=dict)
    files: Mapping[str, int] = field(default_factory=dict)
    skipped_without_text: int = 0

    def __post_init__(self) -> None:
        if self.correct.shape != (len(self.requests), len(self.tiers)):
            raise ValueError("correct must have shape (len(requests), len(tiers))")
        if len(self.ids) != len(self.requests):
            raise ValueError("ids and requests differ in length")

    def __len__(self) -> int:
        return len(self.requests)

    def subset(self, index: Sequence[int] | NDArray[np.intp]) -> LabelSet:
        """Rows `index`, in that order (sources and files describe the whole set)."""
        idx = np.asarray(index, dtype=np.intp)
        return LabelSet(
            tiers=self.tiers,
            requests=tuple(self.requests[i] for i in idx),
            correct=self.correct[idx],
            ids=tuple(self.ids[i] for i in idx),
            sources=self.sources,
            files=self.files,
            skipped_without_text=self.skipped_without_text,
        )


def parse_tiers(text: str) -> tuple[str, ...]:
    """`"a,b,c"` -> `("a", "b", "c")`; at least two distinct, non-empty names."""
    tiers = tuple(t.strip() for t in text.split(","))
    if len(tiers) < 2 or any(not t for t in tiers):
        raise ValueError(f"need at least two comma-separated tier names, got {text!r}")
    if len(set(tiers)) != len(tiers):
        raise ValueError(f"tier names repeat in {text!r}")
    return tiers


def load_labels(paths: Sequence[str | Path], tiers: Sequence[str] | None = None) -> LabelSet:
    """Read and validate label files into one `LabelSet` over `tiers` (default: the first row's)."""
    if not paths:
        raise ValueError("no label files given")
    ladder: tuple[str, ...] | None = tuple(tiers) if tiers is not None else None
    # Read from the first row, the ladder must then be every row's: a tier that only later
    # rows add would otherwise be dropped without a word.
    inferred_at: tuple[str, int] | None = None
    requests: list[Mapping[str, Any]] = []
    ids: list[str] = []
    scores: list[list[float]] = []
    sources: Counter[str] = Counter()
    files: dict[str, int] = {}
    skipped = 0
    for path in paths:
        name = str(path)
        before = len(requests)
        for line_no, row in _rows(Path(path)):
            if ladder is None:
                ladder = _ladder_from_row(name, line_no, row)
                inferred_at = (name, line_no)
            if inferred_at is not None:
                _check_same_ladder(name, line_no, row, ladder, inferred_at)
            if _features_only(row):
                skipped += 1
                continue
            request, row_scores = _parse_row(name, line_no, row, ladder)
            requests.append(request)
            scores.append(row_scores)
            ids.append(str(row.get("id", f"{Path(name).name}:{line_no}")))
            sources[str(row.get("source", "unknown"))] += 1
        if len(requests) == before:
            what = "rows with request text" if skipped else "label rows (empty file)"
            raise LabelDataError(name, f"no {what}")
        files[name] = files.get(name, 0) + len(requests) - before  # a file given twice
    assert ladder is not None  # at least one row was read
    correct = np.asarray(scores, dtype=np.float64).reshape(len(requests), len(ladder))
    return LabelSet(ladder, tuple(requests), correct, tuple(ids), dict(sources), files, skipped)


def _features_only(row: Mapping[str, Any]) -> bool:
    return (
        "features" in row
        and row.get("messages") is None
        and row.get("prompt") is None
        and row.get("request") is None
    )


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    name = str(path)
    if path.is_dir():
        raise LabelDataError(name, "is a directory, not a label file")
    if not path.exists():  # a pipe (`<(zcat ...)`) or a device is read like a file
        raise LabelDataError(name, "no such file")
    opener = gzip.open if _gzipped(path) else open
    line_no = 0
    try:
        # Bytes, decoded one line at a time: a text stream decodes ahead in 8 KB chunks, so a
        # bad byte would be reported lines before the line that holds it.
        with opener(path, "rb") as handle:
            for line_no, raw in enumerate(handle, start=1):
                # A byte order mark (Windows tools write one) leads the first line only.
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise LabelDataError(name, f"invalid JSON ({exc.msg})", line_no) from None
                except (ValueError, RecursionError) as exc:  # a huge integer, deep nesting
                    raise LabelDataError(name, f"invalid JSON ({exc})", line_no) from None
                if not isinstance(row, dict):
                    raise LabelDataError(name, "a row must be a JSON object", line_no)
                yield line_no, row
    except UnicodeDecodeError as exc:
        raise LabelDataError(name, f"not UTF-8 text ({exc.reason})", line_no) from None
    except (OSError, EOFError, zlib.error) as exc:
        raise LabelDataError(name, f"cannot read: {exc}", line_no + 1) from None


# How JSON names what `json.loads` turned into these types.
_JSON_KINDS = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}

# Every gzip stream starts with these two bytes (RFC 1952).
_GZIP_MAGIC = b"\x1f\x8b"


def _gzipped(path: Path) -> bool:
    """By name (any case: `.GZ` too), else by the magic bytes of a regular file: a gzip file
    named `.jsonl` was reported as "not UTF-8 text" on line 1. A pipe is never sniffed, as
    the bytes read to look would be lost to the reader."""
    if path.name.lower().endswith(".gz"):
        return True
    if not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(2) == _GZIP_MAGIC
    except OSError:
        return False  # the read that follows reports it, with the file's name


def _ladder_from_row(name: str, line_no: int, row: Mapping[str, Any]) -> tuple[str, ...]:
    correct = row.get("correct")
    if not isinstance(correct, dict) or len(correct) < 2:
        raise LabelDataError(name, "'correct' must map at least two tiers to scores", line_no)
    return tuple(str(t) for t in correct)


def _check_same_ladder(
    name: str,
    line_no: int,
    row: Mapping[str, Any],
    ladder: Sequence[str],
    inferred_at: tuple[str, int],
) -> None:
    correct = row.get("correct")
    if not isinstance(correct, dict):
        return  # _parse_row names this
    extra = [str(t) for t in correct if t not in ladder]
    if extra:
        where = f"{Path(inferred_at[0]).name}:{inferred_at[1]}"
        raise LabelDataError(
            name,
            f"tier(s) {', '.join(extra)} are not in the ladder read from {where} "
            f"({', '.join(ladder)}); pass --tiers to choose the ladder",
            line_no,
        )


def _parse_row(
    name: str, line_no: int, row: Mapping[str, Any], ladder: Sequence[str]
) -> tuple[Mapping[str, Any], list[float]]:
    correct = row.get("correct")
    if correct is None:
        raise LabelDataError(name, "missing 'correct' object", line_no)
    if not isinstance(correct, dict):  # a list of scores says nothing of which tier is which
        kind = _JSON_KINDS.get(type(correct), "value")
        raise LabelDataError(
            name, f"'correct' must be an object of tier: score, got a JSON {kind}", line_no
        )
    missing = [t for t in ladder if t not in correct]
    if missing:
        have = ", ".join(map(str, correct)) or "none"
        raise LabelDataError(
            name, f"tier(s) {', '.join(missing)} missing from 'correct' (has: {have})", line_no
        )
    row_scores = [_score(name, line_no, tier, correct[tier]) for tier in ladder]
    request = row["request"] if isinstance(row.get("request"), dict) else row
    if "request" in row and not isinstance(row["request"], dict):
        raise LabelDataError(name, "'request' must be a JSON object", line_no)
    _check_request(name, line_no, request)
    if request is row:
        request = {k: v for k, v in row.items() if k not in LABEL_FIELDS}
    return request, row_scores


def _score(name: str, line_no: int, tier: str, value: Any) -> float:
    if value is None:
        return math.nan
    if not isinstance(value, int | float):
        raise LabelDataError(name, f"score for tier {tier!r} is not a number: {value!r}", line_no)
    try:
        score = float(value)
    except OverflowError:  # an integer too large for a float (JSON allows any length)
        score = math.inf
    if not 0.0 <= score <= 1.0:  # also rejects NaN
        raise LabelDataError(name, f"score for tier {tier!r} is outside [0, 1]: {value!r}", line_no)
    return score


def _check_request(name: str, line_no: int, request: Mapping[str, Any]) -> None:
    messages = request.get("messages")
    prompt = request.get("prompt")
    if messages is None and prompt is None:
        raise LabelDataError(name, "row has neither 'messages' nor 'prompt'", line_no)
    if messages is not None and (
        not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages)
    ):
        raise LabelDataError(name, "'messages' must be a list of objects", line_no)
    if prompt is not None and not isinstance(prompt, str | list):
        raise LabelDataError(name, "'prompt' must be a string or a list", line_no)
