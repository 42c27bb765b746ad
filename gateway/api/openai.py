"""Thin handlers for the two generation endpoints, on raw ASGI for the hot path.

Authenticate, read and parse the body, admit against the tenant's limits, hand over to the
proxy service, map errors to OpenAI JSON, sink the record. Nothing else happens here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final, NamedTuple

from gateway.coarse_timers import CoarseTimers
from gateway.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    RateLimitError,
    RequestTimeoutError,
    ServiceUnavailableError,
    TiergateError,
    UnsupportedMediaTypeError,
)
from gateway.metrics import UNAUTHENTICATED, GatewayMetrics
from gateway.protocol import EndpointKind, RequestLimits, parse_request
from gateway.proxy.attempts import CLIENT_GONE, DEADLINE
from gateway.proxy.channel import ClientChannel, Receive, Send
from gateway.proxy.service import ProxyService
from gateway.request_ids import HEADER as REQUEST_ID_HEADER
from gateway.request_ids import RequestIds
from gateway.stats import Ladder, RequestRecord
from gateway.tenants.admission import Admission, Ticket
from gateway.tenants.registry import TenantRegistry, several_authorizations

PIN_HEADER = b"x-tiergate-tier"
log = logging.getLogger("tiergate.api")


class GenerationHandler:
    """Serves POST /v1/chat/completions or POST /v1/completions."""

    def __init__(
        self,
        kind: EndpointKind,
        *,
        tenants: TenantRegistry,
        admission: Admission,
        service: ProxyService,
        limits: RequestLimits,
        metrics: GatewayMetrics,
        ladder: Ladder,
        request_ids: RequestIds,
    ) -> None:
        self.kind: EndpointKind = kind
        self.tenants = tenants
        self.admission = admission
        self.service = service
        self.limits = limits
        self.metrics = metrics
        self.ladder = ladder
        self.request_ids = request_ids
        self._body_deadlines = CoarseTimers(limits.body_timeout_s)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        # A client gets as long to take a one-shot answer as it has to send its body.
        channel = ClientChannel(send, receive, self._body_deadlines)
        record = RequestRecord(
            tenant=UNAUTHENTICATED,
            kind=self.kind,
            ladder=self.ladder,
            request_id=self.request_ids.new(),
        )
        ticket: Ticket | None = None
        try:
            authorization, pin, encoding, upgrade, declared, expect = _read_headers(
                scope["headers"]
            )
            tenant = self.tenants.authenticate(authorization)
            record.tenant = tenant.name
            if encoding is not None:
                _refuse_compressed(encoding)
            body_limit = self.admission.body_limit(tenant, self.limits.max_body_bytes)
            if expect and declared is not None and int(declared) > body_limit:
                raise UnsentBodyTooLargeError(body_limit)
            upload_from = time.perf_counter()
            body = await self._read_body(receive, body_limit)
            record.upload_s = time.perf_counter() - upload_from
            record.request_bytes = len(body)
            if not body and upgrade is not None:
                raise BodyLostToUpgradeError(upgrade)
            request = parse_request(self.kind, body, self.limits, body_limit)
            ticket = await self.admission.admit(tenant, request, len(body), self.kind)
            if ticket.hold is not None:  # a slot in Redis, shared with other replicas
                admitted = ticket
                channel.before_finish(
                    lambda: admitted.release(
                        used_tokens(record), at_least=known_cost(record, len(body))
                    )
                )
            header_pin = pin.decode("latin-1").strip() if pin else None
            await self.service.handle(
                self.kind,
                request,
                tenant=tenant,
                header_pin=header_pin,
                channel=channel,
                started=started,
                record=record,
            )
        except TiergateError as exc:
            if isinstance(exc, RateLimitError):
                record.rejected = exc.code
            await _answer_error(channel, record, exc)
        except asyncio.CancelledError:
            if not await _answer_cut_by_shutdown(channel, record):
                raise
        except Exception:
            # A defect in the gateway, never the client's doing: logged with its traceback,
            # counted as a 500 and answered in OpenAI's shape (not the server's plain text).
            log.exception(
                "internal error serving %s request %s", self.kind, record.request_id.decode()
            )
            defect = TiergateError(
                "Internal error in the gateway; it has been logged.", code="internal_error"
            )
            await _answer_error(channel, record, defect)
        finally:
            record.duration_s = time.perf_counter() - started
            channel.close()
            if ticket is not None:
                await ticket.release(used_tokens(record), at_least=known_cost(record, len(body)))
            self.metrics.record(record)

    async def _read_body(self, receive: Receive, limit: int) -> bytes:
        """The whole body, which must arrive within `limits.body_timeout_s`: a client that
        sends headers and then trickles its body, or nothing, would otherwise hold a
        connection and its task for good (slowloris). The deadline is a coarse one (see
        CoarseTimers): a per-request timer costs more than the rest of this read."""
        task = asyncio.current_task()
        assert task is not None  # an ASGI app always runs in a task
        self._body_deadlines.add(task, task.cancel, None)
        parts: list[bytes] = []
        try:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body: bytes = message.get("body", b"")  # the usual case: all at once
                return body
            return await _rest_of_body(receive, message, limit, parts)
        except asyncio.CancelledError:
            if self._body_deadlines.discard(task):
                raise  # not the deadline: a shutdown, or the connection's end
            if task.uncancel():
                raise  # the deadline and another cancel at once: the other one stands
            if sum(map(len, parts)) > limit:
                return b"".join(parts)  # past the limit already: the 413 says more
            raise RequestTimeoutError(
                f"The request body did not arrive within {self._body_deadlines.delay_s:g} s."
            ) from None
        finally:
            self._body_deadlines.discard(task)


class RequestHeaders(NamedTuple):
    authorization: bytes | None
    pin: bytes | None
    encoding: bytes | None  # Content-Encoding
    upgrade: bytes | None
    content_length: bytes | None  # as declared; httptools has checked its digits
    expects_continue: bool  # `Expect: 100-continue`: the body waits for a 100 Continue


# A request the shutdown cut before it was served never reached a tier's answer: safe to
# send again (the SDKs retry a 503), to a replica that is not shutting down.
_SHUTDOWN: Final = ServiceUnavailableError(
    "The gateway shut down before the request was served; send it again.", retry_after_s=1
)


async def _answer_cut_by_shutdown(channel: ClientChannel, record: RequestRecord) -> bool:
    """Past the graceful shutdown's limit the server cancels what still runs, and answers a
    request left without a response by a plain-text 500 without a request id: answered here
    instead, True; False when the response had begun or the client had left."""
    if channel.started or channel.disconnected:
        return False
    await _answer_error(channel, record, _SHUTDOWN, (b"connection", b"close"))
    log.warning(
        "request %s: cut by the shutdown's time limit before it was served",
        record.request_id.decode(),
    )
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()  # answered: the cancellation has done its work
    return True


async def _answer_error(
    channel: ClientChannel,
    record: RequestRecord,
    error: TiergateError,
    *extra: tuple[bytes, bytes],
) -> None:
    """`error` in OpenAI's shape with the request's id, unless the answer had begun."""
    record.status = error.status
    if not channel.started:
        headers = [
            (b"content-type", b"application/json"),
            (REQUEST_ID_HEADER, record.request_id),
            *extra,
            *error.headers(),
        ]
        await channel.respond(error.status, headers, error.body())
        if channel.unread:  # never taken: the client left it, as far as it knows
            record.status = 499
            record.client_disconnected = True


def _read_headers(headers: list[tuple[bytes, bytes]]) -> RequestHeaders:
    """The headers the handler reads; several Authorization headers, or tier pins that
    differ, are refused."""
    authorization = pin = encoding = upgrade = None
    content_length: bytes | None = None
    expects_continue = False
    for name, value in headers:
        if name == b"authorization":
            if authorization is not None:
                raise several_authorizations()
            authorization = value
        elif name == PIN_HEADER:
            if pin is not None and pin.strip() != value.strip():
                raise _conflicting_header_pins(pin, value)
            pin = value
        elif name == b"content-encoding":
            encoding = value
        elif name == b"upgrade":
            upgrade = value
        elif name == b"content-length":
            content_length = value
        elif name == b"expect":
            expects_continue = value.strip().lower() == b"100-continue"
        elif name == b"transfer-encoding" and value.strip().lower() != b"chunked":
            raise _unsupported_transfer_coding(value)
    return RequestHeaders(authorization, pin, encoding, upgrade, content_length, expects_continue)


def _unsupported_transfer_coding(value: bytes) -> InvalidRequestError:
    # The HTTP parser undoes `chunked` only: a body also gzip-coded would be read as JSON.
    # A 400, not HTTP's 501: it is the client's request that the gateway cannot take.
    return InvalidRequestError(
        f"Transfer-Encoding '{value.decode('latin-1')}' is not supported; send the body "
        "uncoded, with Content-Length or 'Transfer-Encoding: chunked' alone.",
        code="unsupported_transfer_encoding",
    )


def _conflicting_header_pins(first: bytes, second: bytes) -> InvalidRequestError:
    # Like a model suffix that contradicts the header (400 conflicting_pins): which of two
    # headers counts differs between servers and proxies, so the gateway picks neither.
    shown = [value.decode("latin-1").strip() for value in (first, second)]
    return InvalidRequestError(
        f"Two x-tiergate-tier headers pin different tiers: '{shown[0]}' and '{shown[1]}'.",
        code="conflicting_pins",
    )


class BodyLostToUpgradeError(InvalidRequestError):
    """httptools takes any `Connection: Upgrade` request for a protocol switch: it ends the
    message at its headers and uvicorn drops the body that follows, so a valid request
    sent by `curl --http2` (`Upgrade: h2c`) arrived empty and was told its body was empty.
    What is left of the body on the connection would be read as the next request: close it."""

    def __init__(self, upgrade: bytes) -> None:
        protocol = upgrade.decode("latin-1")
        super().__init__(
            f"The request body was lost: the gateway speaks HTTP/1.1 only and cannot take "
            f"'Upgrade: {protocol}' with a body. Send the request without the Upgrade header "
            "(curl: without --http2).",
            code="upgrade_not_supported",
        )

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"connection", b"close")]


class UnsentBodyTooLargeError(PayloadTooLargeError):
    """A client that sent `Expect: 100-continue` (curl does past 1 KiB) with a Content-Length
    over the limit gets its 413 instead of "100 Continue": it was asked to upload the whole
    body, all of it read (the limit and 16 MiB more) only to be refused. A client that sends
    its body without waiting is answered once it is read, as before: refused with the body
    still arriving, a connection closed after the answer (`Connection: close`) would reset
    and lose the 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"Request body is larger than the limit of {limit} bytes.")

    def headers(self) -> list[tuple[bytes, bytes]]:
        # The body is unsent and may never come: kept alive, the connection would read the
        # client's next request as that body.
        return [(b"connection", b"close")]


def _refuse_compressed(encoding: bytes) -> None:
    """A body sent with a Content-Encoding is refused, not parsed: read as JSON, a gzip
    body was answered "not valid UTF-8" and a plain one labelled gzip was served."""
    if encoding.strip().lower() not in (b"", b"identity"):
        shown = encoding.decode("latin-1")
        raise UnsupportedMediaTypeError(
            f"Content-Encoding '{shown}' is not supported; send the JSON body uncompressed."
        )


async def _rest_of_body(
    receive: Receive, message: dict[str, Any], limit: int, parts: list[bytes]
) -> bytes:
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            raise InvalidRequestError("The client closed the connection mid-request.")
        chunk = message.get("body", b"")
        size += len(chunk)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)
        if size > limit:
            # Past the limit parse_request answers 413. The rest is read and dropped first:
            # closing a socket with unread data sends a reset, and a client still sending
            # its body then loses the 413 to "connection reset by peer".
            await _drain(receive, DRAIN_BYTES)
            return b"".join(parts)
        message = await receive()


# How much of an oversized body is read and dropped so the client can read its 413.
DRAIN_BYTES = 16 * 1024 * 1024


async def _drain(receive: Receive, budget: int) -> None:
    while budget > 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def used_tokens(record: RequestRecord) -> int | None:
    """Tokens to charge the tenant: what the serving tier reported, nothing if none served
    or the engine refused the request.

    None (the admission estimate stays charged) when a tier served without reporting usage:
    a stream the client left before its closing usage event has still cost tokens. So has
    a JSON request whose client left while the engine generated its answer, or whose
    total_s ran out while it did (vLLM sends a JSON answer's headers only at its end):
    refunded, a tenant could have the engine generate for free.
    """
    if record.served_tier is None:
        generated = any(
            attempt.outcome == CLIENT_GONE or (attempt.outcome == DEADLINE and not record.stream)
            for attempt in record.attempts
        )
        return None if generated else 0  # nothing served
    if record.status != 200 and not record.client_disconnected:
        return 0  # the engine refused the request (its 400 is relayed)
    used = record.prompt_tokens + record.completion_tokens
    return used if used else None


# Events of a stream that carry no generated token: a chat's role and finish events, a
# Responses stream's opening events (created, in progress, item and part added).
UNCOUNTED_EVENTS: Final = 4


def known_cost(record: RequestRecord, body_bytes: int) -> int:
    """What a request is known to have cost when its usage never came (a stream the client
    left): its prompt's estimate and a token per relayed event past the few that carry none.
    Without it, a stream left before its usage event was charged only its admission estimate
    (256 completion tokens without max_tokens) however many tokens the client had read."""
    return body_bytes // 4 + max(0, record.streamed_events - UNCOUNTED_EVENTS)


__all__ = ["GenerationHandler", "known_cost", "used_tokens"]
