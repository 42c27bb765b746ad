"""One attempt against one endpoint: send, classify the outcome, keep the books, relay.

Bookkeeping per attempt: the endpoint's in-flight count, its circuit breaker (only health
failures count; saturation is load, not sickness; an engine's 5xx is judged by the service,
see `GATEWAY_FAILURES`), the tier's slot queue, and an Attempt on the request record.
Failures before the first byte raise `AttemptFailed`, which the service turns into the next
attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Final

import orjson

from gateway.backends.h1client import (
    UpstreamAborted,
    UpstreamConnectError,
    UpstreamFailure,
    UpstreamProtocolError,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamTooLarge,
)
from gateway.backends.tier import EndpointState, TierBackend, served_name
from gateway.config import TimeoutSettings
from gateway.errors import (
    ServiceUnavailableError,
    TiergateError,
    UpstreamError,
    UpstreamTimeoutError,
)
from gateway.protocol import EndpointKind
from gateway.proxy.events import ExchangeListener
from gateway.proxy.relay import (
    MAX_RESPONSE_BYTES,
    Exchange,
    failure_for_client,
    log_failure,
    relay_body,
    relay_stream,
)
from gateway.proxy.rewrite import ModelRewriter, holds_no_output
from gateway.stats import Attempt

# Upstream statuses that are the client's own mistake: relayed as they are, never retried.
CLIENT_ERRORS: Final = frozenset({400, 413, 422})
SATURATED_STATUSES: Final = frozenset({429, 503})
# The engine refused the gateway itself (vLLM started with --api-key): a configuration error.
CREDENTIALS_REFUSED: Final = frozenset({401, 403})
SATURATED: Final = "saturated"
# The client left while the upstream was still to answer; the gateway aborted the request.
CLIENT_GONE: Final = "client_gone"
# A JSON answer over MAX_RESPONSE_BYTES: the request's doing, not the endpoint's.
TOO_LARGE: Final = "too_large"
# Outcomes that say nothing about the endpoint's health.
DEADLINE: Final = "deadline"  # the request's total_s ran out (see run)
INCONCLUSIVE: Final = frozenset({CLIENT_GONE, SATURATED, TOO_LARGE, DEADLINE})
STATUS_5XX: Final = "status_5xx"
# A proxy's 502 or 504 says the endpoint is unreachable. An engine's own 5xx (500, 501, ...)
# may be this endpoint's fault or this request's: the service judges it by what the next
# endpoint answers (`AttemptFailed.judged_later`), so one poisoned request cannot eject
# every tier.
GATEWAY_FAILURES: Final = frozenset({502, 504})


class AttemptFailed(Exception):
    """The attempt failed before anything reached the client; another may follow."""

    def __init__(
        self,
        outcome: str,
        error: TiergateError,
        *,
        judged_later: bool = False,
        final: bool = False,
    ) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.error = error
        # True: the circuit breaker's verdict waits for the next endpoint's answer.
        self.judged_later = judged_later
        # True: no other endpoint is tried; the client gets `error`.
        self.final = final


class Attempter:
    """Runs attempts for the proxy service."""

    def __init__(
        self,
        timeouts: TimeoutSettings,
        public_model: str,
        listeners: Sequence[ExchangeListener] = (),
    ) -> None:
        self.timeouts = timeouts
        self.public_model = public_model
        self.listeners = listeners
        # Per served model name: a kept endpoint's tier may serve under another name after a
        # reload, and a request admitted before it is answered with the public name it used.
        self._rewriters: dict[str, ModelRewriter] = {}

    def _rewriter(self, served: str) -> ModelRewriter:
        rewriter = self._rewriters.get(served)
        if rewriter is None:
            rewriter = self._rewriters[served] = ModelRewriter(served, self.public_model)
        return rewriter

    async def run(
        self,
        exchange: Exchange,
        tier: TierBackend,
        endpoint: EndpointState,
        current: list[UpstreamResponse],
    ) -> None:
        """Serves the exchange from `endpoint`, or raises AttemptFailed."""
        record = exchange.record
        asked = time.perf_counter()
        # total_s bounds the request, not each attempt: what queueing and earlier attempts
        # spent is gone (a failover after a first-byte timeout restarted the clock). Past
        # it, no endpoint is tried, nor blamed.
        if asked - exchange.started >= self.timeouts.total_s:
            endpoint.slot_freed()  # a slot handed over from the queue goes to the next waiter
            raise _past_deadline()
        served = served_name(tier, endpoint)  # a reload may have renamed it
        endpoint.inflight += 1
        sent_at = endpoint.circuit.on_send()
        for listener in self.listeners:
            listener.upstream_started(tier.name, record.tenant)
        try:
            response, body = await self._send(exchange, served, endpoint, current, asked)
        except AttemptFailed as failure:
            exchange.waited += time.perf_counter() - asked
            endpoint.inflight -= 1
            for listener in self.listeners:
                listener.upstream_finished(tier.name, record.tenant)
            if failure.outcome in INCONCLUSIVE:
                # No verdict on the endpoint's health, but a half-open trial is over (it
                # stayed "in flight" for good after a 429, and the endpoint stayed ejected).
                endpoint.circuit.on_inconclusive(sent_at)
            elif not failure.judged_later:
                endpoint.circuit.on_failure(sent_at)
            endpoint.slot_freed()
            record.attempts.append(Attempt(tier.index, endpoint.url, failure.outcome))
            raise
        exchange.waited += time.perf_counter() - asked
        record.attempts.append(Attempt(tier.index, endpoint.url, "ok"))
        record.served_tier = tier.index
        record.status = response.status
        exchange.tier_name = tier.name
        exchange.rewrite = self._rewriter(served)
        engine_failed = False
        try:
            if body is None:
                engine_failed = await relay_stream(
                    exchange,
                    response,
                    stall_s=self.timeouts.first_byte_s,
                    total_s=self.timeouts.total_s,
                )
            else:
                await relay_body(exchange, response, body)
        finally:
            endpoint.inflight -= 1
            for listener in self.listeners:
                listener.upstream_finished(tier.name, record.tenant)
            if engine_failed:
                endpoint.circuit.on_failure(sent_at)
            else:
                endpoint.circuit.on_success(sent_at)
            response.release()
            endpoint.slot_freed()

    async def _send(
        self,
        exchange: Exchange,
        served: str,
        endpoint: EndpointState,
        current: list[UpstreamResponse],
        asked: float,
    ) -> tuple[UpstreamResponse, bytes | None]:
        """One request up to the response headers, and for an answer that is not a stream up
        to its last byte: nothing has reached the client before that, so a body that fails
        is this attempt's failure and another endpoint may serve. The response joins
        `current` as soon as it is sent, so a client that leaves can abort it. Returns the
        response and its whole body, or None for a stream to relay; classifies every
        failure."""
        remaining = self.timeouts.total_s - (asked - exchange.started)
        upstream = {**exchange.upstream_request, "model": served}
        if exchange.cache_salt is not None:
            upstream["cache_salt"] = exchange.cache_salt
        payload = orjson.dumps(upstream)
        path = endpoint.paths[exchange.kind]
        response: UpstreamResponse | None = None
        sent_from = len(current)  # the pool adds the response once the request is sent
        try:
            response = await endpoint.pool.request(
                endpoint.pool.render(
                    b"POST", path, payload, b"x-request-id: %s\r\n" % exchange.record.request_id
                ),
                first_byte_timeout_s=_first_byte_wait(
                    exchange.record.stream, self.timeouts.first_byte_s, remaining
                ),
                total_timeout_s=remaining,
                started=current,
            )
            status = response.status
            if status < 400 or status in CLIENT_ERRORS:
                if exchange.record.stream and status == 200:
                    _require_a_stream(response)
                    first_byte_left = self.timeouts.first_byte_s - (time.perf_counter() - asked)
                    await _first_event(response, first_byte_left, exchange.kind)
                    return response, None
                return response, await response.read(MAX_RESPONSE_BYTES)
        except UpstreamFailure as exc:
            if response is not None:  # the body failed: this connection is done
                response.abort()
            if isinstance(exc, UpstreamTimeout) and exc.total:
                # The timer that fired was the request's total_s (what queueing and earlier
                # attempts left), not this engine's first-byte time: no verdict on it,
                # unless a JSON answer gave no headers for longer than first_byte_s (its
                # only bound is total_s): a hung engine would never be ejected otherwise.
                silent = time.perf_counter() - asked
                stalled = response is None and silent >= self.timeouts.first_byte_s
                raise _past_deadline(blame=stalled) from None
            # Once the client has left, whatever the abort made of the attempt is its doing;
            # but a connect that failed on its own had sent nothing: no engine had the request.
            gone = exchange.channel.disconnected and len(current) > sent_from
            if not gone and not isinstance(exc, UpstreamAborted):
                log_failure(exchange.record, exc)
            if response is None or gone:
                raise _classified(exc, client_gone=gone) from None
            raise _body_failed(exc, response.status) from None
        response.abort()
        if status in SATURATED_STATUSES:
            saturated = ServiceUnavailableError(f"Upstream is saturated (HTTP {status}).")
            raise AttemptFailed(SATURATED, saturated)
        outcome = STATUS_5XX if status >= 500 else "status_4xx"
        error = UpstreamError(
            f"Upstream refused the gateway's credentials (HTTP {status}): the tier's api_key "
            "or api_key_env must hold the engine's --api-key."
            if status in CREDENTIALS_REFUSED
            else f"Upstream answered HTTP {status}."
        )
        raise AttemptFailed(outcome, error, judged_later=status not in GATEWAY_FAILURES)


async def _first_event(response: UpstreamResponse, wait_s: float, kind: EndpointKind) -> None:
    """Waits for a stream's first bytes of body. vLLM sends a stream's headers before its
    engine has even scheduled the request: an engine that stalls or dies before its first
    event does so after the headers. Nothing has reached the client yet, so that is this
    attempt's failure (first_byte_s bounds it) and another endpoint may serve. What holds no
    output (a keep-alive comment; a Responses stream's opening events, which come as early
    as its headers) does not end the wait."""
    body = response.body_so_far()
    # Unless output came with the headers: then there is no timer to set and cancel.
    if holds_no_output(kind, body):
        try:
            async with asyncio.timeout(wait_s):
                await response.wait_for_body()
                # A full buffer (opening events echo the request's tools and instructions)
                # holds no more until read: the wait ends there, as nothing more could arrive.
                while not response.complete and not response.reading_paused:
                    arrived = response.body_so_far()
                    if not holds_no_output(kind, arrived):
                        break
                    await response.wait_for_body(after=len(arrived))
        except TimeoutError:
            raise UpstreamTimeout("upstream sent no event within first_byte_s") from None
        body = response.body_so_far()
    _require_an_event(response, kind, body)


def _require_a_stream(response: UpstreamResponse) -> None:
    """An answer to a stream request that says it is no event stream (JSON from a proxy or
    engine that ignored `stream`, an HTML page), relayed as one, would reach the client as
    an event stream with no event in it. Nothing reached it yet: another endpoint may serve."""
    media = response.header(b"content-type")
    if media is not None and not media.lower().startswith(b"text/event-stream"):
        shown = media[:64].decode("latin-1")
        raise UpstreamProtocolError(f"upstream answered a stream request with {shown}")


def _require_an_event(response: UpstreamResponse, kind: EndpointKind, body: bytes) -> None:
    """A stream that ended before any output, or whose body is JSON (an answer with no
    content-type that ignored `stream`), answered nothing the client could read as events:
    relayed, it would get a 200 with no answer and no error. Nothing reached it yet, so
    another endpoint may serve. `body` is what has arrived of it."""
    if body[:1] in _JSON_OPENINGS:
        raise UpstreamProtocolError("upstream answered a stream request with JSON")
    if response.complete and holds_no_output(kind, body):
        raise UpstreamProtocolError("upstream ended the stream before its first event")


# No event stream opens with these (an SSE line starts with a field name, a colon or ends).
_JSON_OPENINGS: Final = frozenset((b"{", b"["))


def _first_byte_wait(stream: bool, first_byte_s: float, remaining_s: float) -> float:
    """How long an attempt may wait for the response headers. vLLM sends a JSON answer's
    headers only once its generation has ended, so for a JSON request that wait is the whole
    answer: total_s bounds it, as it bounds a stream's body. first_byte_s there would take
    every answer longer than it for a stalled engine: escalated, generated again up the
    ladder, and counted against each healthy endpoint's circuit."""
    return first_byte_s if stream else remaining_s


def _past_deadline(*, blame: bool = False) -> AttemptFailed:
    """The request's total_s is spent: none is tried next, and no endpoint is to blame
    unless `blame` (the attempt then counts as a timeout against its circuit)."""
    # Not to be retried: the OpenAI SDKs would wait up to total_s again, twice.
    late = UpstreamTimeoutError("The request passed its total_s deadline.", retryable=False)
    return AttemptFailed("timeout" if blame else DEADLINE, late, final=True)


def _body_failed(exc: UpstreamFailure, status: int) -> AttemptFailed:
    """A JSON body that failed after its headers. Only a cut or broken success is tried
    elsewhere: an answer over the size limit is this request's (no endpoint is blamed, none
    retried: each would generate it again), and a refusal (400, 413, 422) was the request's
    answer, however it ended. (A timeout here is the request's deadline, handled before.)"""
    if isinstance(exc, UpstreamTooLarge):
        return AttemptFailed(
            TOO_LARGE,
            UpstreamError(f"The upstream answer is too large: {exc}.", retryable=False),
            final=True,
        )
    failure = _classified(exc)
    if status in CLIENT_ERRORS:
        failure.final = True
    return failure


def _classified(exc: UpstreamFailure, *, client_gone: bool = False) -> AttemptFailed:
    if client_gone or isinstance(exc, UpstreamAborted):
        gone = UpstreamError("The client left before the upstream answered.")
        return AttemptFailed(CLIENT_GONE, gone)
    # Told by `failure_for_client`: the endpoint's address stays in the log.
    told = f"Upstream failed: {failure_for_client(exc)}."
    if isinstance(exc, UpstreamTimeout):
        return AttemptFailed("timeout", UpstreamTimeoutError(told))
    if isinstance(exc, UpstreamConnectError):
        return AttemptFailed("connect_error", UpstreamError(told))
    return AttemptFailed("protocol_error", UpstreamError(told))


__all__ = ["SATURATED", "STATUS_5XX", "AttemptFailed", "Attempter"]
