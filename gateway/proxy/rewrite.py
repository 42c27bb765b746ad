"""Byte-level edits of upstream bodies: the public model name, usage, SSE event framing.

Responses are relayed as bytes. Re-encoding every SSE chunk through a JSON parser would
cost more than the rest of the hop, so the only edit (the `model` field) is a byte
replacement. It is safe because inside a JSON string every `"` is escaped, so the byte
sequence `"model":"<name>"` can only be the object key itself.
"""

from __future__ import annotations

import re
from typing import Final, TypeGuard

import orjson

from gateway.protocol import EndpointKind

_USAGE_KEY: Final = b'"usage":'
_EVENT_END: Final = b"\n\n"


class ModelRewriter:
    """Replaces the served model name with the public one in JSON bytes."""

    __slots__ = ("_pairs",)

    def __init__(self, served: str, public: str) -> None:
        served_json = orjson.dumps(served)
        public_json = orjson.dumps(public)
        self._pairs: tuple[tuple[bytes, bytes], ...] = (
            ()
            if served == public
            else (
                (b'"model":' + served_json, b'"model":' + public_json),
                (b'"model": ' + served_json, b'"model": ' + public_json),
            )
        )

    def __call__(self, data: bytes) -> bytes:
        for old, new in self._pairs:
            if old in data:
                data = data.replace(old, new)
        return data


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and value >= 0


def usage_counts(body: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from a response or chunk carrying a usage object
    (a Responses API usage names them input_tokens and output_tokens)."""
    start = body.rfind(_USAGE_KEY)
    if start < 0:
        return None
    start += len(_USAGE_KEY)
    # The usage object is short and nests at most a level or two (token details): try each
    # closing brace in turn and let the C parser decide, instead of scanning bytes in Python.
    end = start
    for _ in range(4):
        end = body.find(b"}", end) + 1
        if end <= 0:
            return None
        try:
            usage = orjson.loads(body[start:end])
        except orjson.JSONDecodeError:
            continue
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if prompt is None and completion is None:
            prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        # A negative count is no count: the Prometheus counters it feeds refuse to go down,
        # and the failed increment lost the batch and stopped the gateway's flush timer.
        if _is_count(prompt) and _is_count(completion):
            return prompt, completion
        return None
    return None


class SSEBuffer:
    """Re-cuts an upstream byte stream at SSE event boundaries.

    TCP reads split events anywhere; every edit here needs whole events. Whole events pass
    through in one piece, so the common case (one read = one event) costs a suffix check.
    An event that spans many reads (megabytes: a Responses `response.completed` echoes the
    whole answer) is kept as its pieces and joined once whole: joining the held bytes again
    at every read, and searching them again, would cost time quadratic in its size.
    """

    __slots__ = ("_after_cr", "_pending", "held")

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the incomplete event's pieces, none empty
        self._after_cr = False  # the last read ended in CR: a LF opening the next is its pair
        self.held = 0  # bytes of the incomplete event (the caller bounds it)

    def feed(self, data: bytes) -> bytes:
        """Complete events available so far (possibly empty); keeps the incomplete tail."""
        if self._after_cr and data:
            self._after_cr = False
            if data.startswith(b"\n"):
                data = data[1:]
        if b"\r" in data:  # one memchr; JSON escapes CR, so a raw one ends a line
            # A CR ends its line at once (a CR-framed event is not held for the next read);
            # if the read split a CRLF, the next read's leading LF is dropped.
            self._after_cr = data.endswith(b"\r")
            data = _lf_lines(data)
        pending = self._pending
        if not pending and data.endswith(_EVENT_END):
            return data
        end = data.rfind(_EVENT_END) + 2  # 1: none in this read
        if end < 2:
            # Only the new bytes are searched: the held ones hold no event end, but one
            # split by the read is their last LF and this read's first.
            if not (pending and data.startswith(b"\n") and pending[-1].endswith(b"\n")):
                if data:
                    pending.append(data)
                    self.held += len(data)
                return b""
            end = 1
        pending.append(data[:end])
        whole = b"".join(pending)
        pending.clear()
        self.held = len(data) - end
        if self.held:
            pending.append(data[end:])
        return whole

    def flush(self) -> bytes:
        data = b"".join(self._pending)
        self._pending.clear()
        self.held = 0
        return data


# A Responses stream's own event types (`"type":"response.<what>"`; no object inside an
# event has a type of that form), or its `event: response.<what>` line: vLLM writes the
# type last in the data, after an echo of the request's tools and instructions, so an
# opening event that came in pieces is known by its first line alone. vLLM sends the
# opening two before the engine has even scheduled the request, so they say nothing about
# when the answer starts.
_RESPONSES_EVENT_TYPE: Final = re.compile(
    rb'"type":\s*"response\.([a-z_.]+)"|^event:[ \t]*response\.([a-z_.]+)(?=[ \t]*[\r\n])',
    re.MULTILINE,
)
_OPENING_EVENTS: Final = frozenset((b"created", b"in_progress"))


# An SSE comment line (a keep-alive such as `: ping`, which some OpenAI-compatible servers
# send while a request waits; vLLM sends none). A lone CR ends a line too, and `^` only
# sees an LF's.
_COMMENT_LINE: Final = re.compile(rb"(?:^|(?<=\r)):[^\r\n]*(?:\r\n|\r|\n|$)", re.MULTILINE)
# The first bytes of what may hold no output: a comment, or a blank line before one.
_NO_OUTPUT_OPENINGS: Final = frozenset((b":", b"\n", b"\r"))


def holds_no_output(kind: EndpointKind, events: bytes) -> bool:
    """Whether `events` hold no output yet: nothing but SSE comments and, on a Responses
    stream, its opening events (`response.created`, `response.in_progress`). A keep-alive
    says the server is up, not that the answer has started: it neither sets the first-token
    time nor ends the first-byte wait."""
    if kind != "responses" and events[:1] not in _NO_OUTPUT_OPENINGS:
        return not events  # the common case, a data line first: decided without a scan
    rest = _COMMENT_LINE.sub(b"", events)
    if not rest.strip():
        return True
    if kind != "responses":
        return False
    types = [data or line for data, line in _RESPONSES_EVENT_TYPE.findall(rest)]
    return bool(types) and _OPENING_EVENTS.issuperset(types)


def _lf_lines(data: bytes) -> bytes:
    """SSE lines may end in CRLF, LF or CR; relayed, they all end in LF (vLLM's framing),
    so events are cut, and usage found, the same way whatever the upstream framed them with."""
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


# A usage-only chunk's empty choices, as compact JSON writes it and with a space after the
# colon (Python's json.dumps), as the usage key is looked for both ways.
_EMPTY_CHOICES: Final = (b'"choices":[]', b'"choices": []')


def _first_of(data: bytes, needles: tuple[bytes, ...], start: int = 0) -> int:
    """Where the first of `needles` occurs in `data` from `start`; -1 when none does."""
    found = [at for at in (data.find(needle, start) for needle in needles) if at >= 0]
    return min(found, default=-1)


def split_usage_event(events: bytes) -> tuple[bytes, bytes]:
    """Separates the usage-only event (`"choices":[]` with a usage object) from the rest.

    Used when the gateway itself asked upstream for usage: the client did not, so the event
    it did not ask for is removed and only the counts are kept.
    """
    start = _first_of(events, _EMPTY_CHOICES)
    while start >= 0:
        event_start = events.rfind(_EVENT_END, 0, start)
        event_start = 0 if event_start < 0 else event_start + 2
        event_end = events.find(_EVENT_END, start)
        event_end = len(events) if event_end < 0 else event_end + 2
        event = events[event_start:event_end]
        # An empty-choices event without usage (one before the usage event in the same
        # read) is not the one to take out: look on past it.
        if _USAGE_KEY + b"{" in event.replace(b": {", b":{"):
            return events[:event_start] + events[event_end:], event
        start = _first_of(events, _EMPTY_CHOICES, event_end)
    return events, b""


__all__ = [
    "ModelRewriter",
    "SSEBuffer",
    "holds_no_output",
    "split_usage_event",
    "usage_counts",
]
