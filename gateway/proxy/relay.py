"""Relaying an upstream answer to the client: a whole JSON body, or an SSE stream.

Both paths rewrite only the model name, read token usage on the way, and stamp the
x-tiergate-* headers. A stream that fails after its first byte ends with an OpenAI-style
error event: the client always learns that the answer is incomplete.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from gateway.backends.h1client import (
    UpstreamConnectError,
    UpstreamFailure,
    UpstreamProtocolError,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamTooLarge,
)
from gateway.errors import UpstreamError, engine_refusal, error_event, responses_error_event
from gateway.protocol import EndpointKind
from gateway.proxy.channel import ClientChannel
from gateway.proxy.rewrite import (
    SSEBuffer,
    holds_no_output,
    split_usage_event,
    usage_counts,
)
from gateway.request_ids import HEADER as REQUEST_ID_HEADER
from gateway.routing.policy import Decision
from gateway.stats import RequestRecord

MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
_USAGE_MARKERS: Final = (b'"usage":{', b'"usage": {')
# An engine's own error mid-stream: vLLM yields `data: {"error": ...}` (then [DONE]) when
# generation fails after the headers; a Responses stream names an `error` event. Inside a
# JSON string `"` is escaped and a newline cannot occur, so neither can be content. The
# space after a field's colon is optional in SSE (other servers leave it out).
_ENGINE_ERROR_MARKERS: Final = (
    b'data: {"error"',
    b"event: error\n",
    b'data:{"error"',
    b"event:error\n",
)
_JSON_OPENINGS: Final = (b"{", b"[")
_DONE: Final = b"[DONE]"
_SEQUENCE_KEY: Final = b'"sequence_number":'
_SEQUENCE_VALUE: Final = re.compile(rb" *(\d+)")
_COMMENT: Final = ord(":")  # an SSE line that begins with a colon is a comment
# What the last events of a whole stream hold: chat and completions streams end with
# `data: [DONE]`; a Responses stream (no [DONE]) with its terminal event. A stream that ends
# without one broke off, however cleanly its connection closed.
_END_MARKERS: Final[dict[EndpointKind, tuple[bytes, ...]]] = {
    "chat": (b"data: [DONE]", b"data:[DONE]"),
    "completions": (b"data: [DONE]", b"data:[DONE]"),
    "responses": (b"response.completed", b"response.incomplete", b"response.failed"),
}
# How long past the request's total_s a stream may wait on its client to read: the
# upstream's own timer cuts the stream at total_s, and this leaves a slow reader the time
# to take the error event that says so.
UNREAD_GRACE_S: Final = 2.0
log = logging.getLogger("tiergate.proxy")


def failure_for_client(exc: UpstreamFailure) -> str:
    """What a client is told of an upstream failure. Timeouts and connection errors name the
    endpoint's host and port, the deployment's inside, which no tenant is to read: only
    their kind is told. The whole message goes to the log (`log_failure`)."""
    if isinstance(exc, UpstreamTimeout):
        return "the request passed its total_s deadline" if exc.total else "the upstream timed out"
    if isinstance(exc, UpstreamConnectError):
        return "the upstream is unreachable"
    return str(exc)


def log_failure(record: RequestRecord, exc: UpstreamFailure) -> None:
    log.warning("request %s: upstream failure: %s", record.request_id.decode(), exc)


def _identity(data: bytes) -> bytes:
    return data


@dataclass(slots=True)
class Exchange:
    """One client request on its way through the proxy."""

    kind: EndpointKind
    request: dict[str, Any]
    decision: Decision
    channel: ClientChannel
    started: float
    record: RequestRecord
    upstream_request: dict[str, Any] = field(default_factory=dict)
    cache_salt: str | None = None  # the engines' prefix-cache namespace (tenants.cache_salt)
    strip_usage: bool = False  # the gateway, not the client, asked upstream for usage
    waited: float = 0.0  # seconds spent waiting on the upstream
    tier_name: str = ""
    rewrite: Callable[[bytes], bytes] = _identity
    captured: list[bytes] | None = None  # the relayed bytes, kept only for sampled requests

    def __post_init__(self) -> None:
        if not self.upstream_request:
            self.upstream_request = self.request

    def headers(self, content_type: bytes) -> list[tuple[bytes, bytes]]:
        # The gateway's own time: not the upstream's, nor the client's upload of its body.
        overhead = time.perf_counter() - self.started - self.waited - self.record.upload_s
        self.record.overhead_s = overhead
        headers = [
            (b"content-type", content_type),
            (b"x-tiergate-tier", self.tier_name.encode()),
            (b"x-tiergate-overhead-ms", b"%.3f" % (overhead * 1000)),
            (REQUEST_ID_HEADER, self.record.request_id),
        ]
        probability = self.served_probability()
        if probability is not None:  # None: the request pinned its tier, nothing was decided
            headers.append((b"x-tiergate-p", b"%.4f" % probability))
        return headers

    def served_probability(self) -> float | None:
        """P(adequate) of the tier that serves, which x-tiergate-tier names: after a failover
        or a degraded answer that is not the decided tier, whose probability would be
        another tier's."""
        decision, served = self.decision, self.record.served_tier
        if served is None or served == decision.tier:
            return decision.probability
        if decision.probabilities is None:  # a policy that gave the decided tier's alone
            return None
        return decision.probabilities[served]


async def relay_body(exchange: Exchange, response: UpstreamResponse, data: bytes) -> None:
    """Relays a whole answer (its body already read by the attempt)."""
    data = exchange.rewrite(data)
    record = exchange.record
    status = response.status
    if status >= 400:  # the engine refused the request (attempts relay no other error)
        data, content_type = engine_refusal(status, data), b"application/json"
    else:
        if status == 200:
            counts = usage_counts(data)
            if counts is not None:
                record.prompt_tokens, record.completion_tokens = counts
        content_type = response.header(b"content-type") or b"application/json"
    if exchange.captured is not None:
        exchange.captured.append(data)
    await exchange.channel.respond(status, exchange.headers(content_type), data)
    if exchange.channel.unread:
        _client_left(record)  # it never took the answer: no 200, and no sample of it
        log.warning(
            "request %s: answer dropped: its client had not read the earlier answers on its "
            "connection",
            record.request_id.decode(),
        )


async def relay_stream(
    exchange: Exchange, response: UpstreamResponse, stall_s: float, total_s: float | None = None
) -> bool:
    """Relays an SSE stream; True when it failed through the engine's fault. A cut by the
    request's own total_s is not, unless the engine had been silent for `stall_s` (longer
    than it may take to a first token): then it stalled.

    A client that stops reading (its socket open) blocks every write to it, and nothing
    would end the exchange: its endpoint slot and tenant concurrency slot would be held for
    good. `total_s` bounds the writes too: past it (and `UNREAD_GRACE_S`) the stream ends."""
    left = None if total_s is None else exchange.started + total_s - time.perf_counter()
    try:
        async with asyncio.timeout(None if left is None else left + UNREAD_GRACE_S):
            return await _relay_events(exchange, response, stall_s)
    except TimeoutError:
        response.abort()
        exchange.record.error_after_first_byte = True
        log.warning(
            "request %s: stream cut: its client had not read it by total_s",
            exchange.record.request_id.decode(),
        )
        return False


async def _relay_events(exchange: Exchange, response: UpstreamResponse, stall_s: float) -> bool:
    channel, record = exchange.channel, exchange.record
    headers = exchange.headers(b"text/event-stream; charset=utf-8")
    headers.append((b"cache-control", b"no-cache"))
    await channel.start(200, headers)
    buffer = SSEBuffer()
    last_read = time.perf_counter()
    # The last events relayed: a Responses error event numbers itself after them (a
    # keep-alive comment relayed since numbers nothing).
    sent = b""
    try:
        async for chunk in response:
            last_read = time.perf_counter()
            events = buffer.feed(chunk)
            if not events:
                if buffer.held > MAX_RESPONSE_BYTES:  # an event that never ends
                    raise UpstreamTooLarge(f"an event over {MAX_RESPONSE_BYTES} bytes")
                continue
            events = _outgoing(exchange, events)
            if events:
                sent = _last_events(events, sent)
                await channel.body(events, more=True)
            if channel.disconnected:
                _client_left(record)
                response.abort()
                return False
        tail = buffer.flush()  # an upstream that ended without a blank line
        if tail:
            tail = _outgoing(exchange, _ended(tail))
        if tail:
            sent = _last_events(tail, sent)
            await channel.body(tail, more=True)
        if not record.error_after_first_byte and not any(
            marker in sent for marker in _END_MARKERS[exchange.kind]
        ):
            raise UpstreamProtocolError("the upstream ended the stream before its last event")
        await channel.body(b"", more=False)
        return record.error_after_first_byte  # set here only by an engine's error event
    except UpstreamFailure as exc:
        if channel.disconnected:  # the client left (and the upstream was aborted for it)
            _client_left(record)
            return False
        record.error_after_first_byte = True
        log_failure(record, exc)
        failure = UpstreamError(
            f"The upstream stream failed after the first byte: {failure_for_client(exc)}"
        )
        if exchange.kind == "responses":
            event = responses_error_event(failure, _last_sequence_number(sent) + 1)
        else:
            event = error_event(failure)
        await channel.body(event, more=False)
        # Past the headers only total_s can time out.
        return not isinstance(exc, UpstreamTimeout) or time.perf_counter() - last_read >= stall_s


def _last_events(events: bytes, sent: bytes) -> bytes:
    """The last events relayed, once `events` are: keep-alive comments alone do not count,
    unless they hold a Responses event (scanned only when the batch begins with a comment:
    a scan of every batch costs about 0.4 us)."""
    return events if events[0] != _COMMENT or _SEQUENCE_KEY in events else sent


def _ended(tail: bytes) -> bytes:
    """The last event of an upstream that ended without its blank line, with that line: an
    SSE client dispatches no event before it (the OpenAI SDKs dropped the last chunk, its
    finish_reason or usage with it). An event whose JSON is cut short is no event but a
    stream that broke off: the client is told, as of any upstream failure."""
    data = b"\n".join(
        line[5:].removeprefix(b" ") for line in tail.split(b"\n") if line.startswith(b"data:")
    )
    if data[:1] in _JSON_OPENINGS and data != _DONE:
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError("the upstream ended the stream mid-event") from None
    return tail + (b"\n" if tail.endswith(b"\n") else b"\n\n")


def _last_sequence_number(events: bytes) -> int:
    """The `sequence_number` of the last Responses event in `events`; -1 when none is."""
    at = events.rfind(_SEQUENCE_KEY)
    number = _SEQUENCE_VALUE.match(events, at + len(_SEQUENCE_KEY)) if at >= 0 else None
    return int(number.group(1)) if number else -1


def _outgoing(exchange: Exchange, events: bytes) -> bytes:
    """What a batch of whole events becomes for the client (usage the gateway asked for
    taken out, the public model name in); notes TTFT, usage and an engine's error event."""
    record = exchange.record
    if record.ttft_s is None and not holds_no_output(exchange.kind, events):
        record.ttft_s = time.perf_counter() - exchange.started
    # One scan for what both markers hold, most events have neither (about 0.4 us a scan).
    if b"error" in events and any(marker in events for marker in _ENGINE_ERROR_MARKERS):
        # Relayed as it is (already OpenAI's shape), but no success: a stream error, and
        # the engine's failure.
        record.error_after_first_byte = True
    if _USAGE_MARKERS[0] in events or _USAGE_MARKERS[1] in events:
        events = _take_usage(events, exchange.strip_usage, record)
    if events:
        events = exchange.rewrite(events)
        if exchange.captured is not None:
            exchange.captured.append(events)
        record.streamed_events += events.count(b"\n\n")
    return events


def _client_left(record: RequestRecord) -> None:
    """A stream whose client left, or an answer it never took: counted as a departure (499,
    as a JSON request left waiting is), not as a 200 and not as a stream that failed."""
    record.client_disconnected = True
    record.status = 499


def _take_usage(events: bytes, strip_usage: bool, record: RequestRecord) -> bytes:
    counts = None
    if strip_usage:
        events, usage_event = split_usage_event(events)
        counts = usage_counts(usage_event) if usage_event else None
    if counts is None:
        counts = usage_counts(events)
    if counts is not None:
        record.prompt_tokens, record.completion_tokens = counts
    return events


__all__ = [
    "MAX_RESPONSE_BYTES",
    "Exchange",
    "failure_for_client",
    "log_failure",
    "relay_body",
    "relay_stream",
]
