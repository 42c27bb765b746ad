"""The one exception tree of the gateway, rendered as OpenAI-shaped error JSON at the edge.

    TiergateError                      500 server_error (never raised for a client's mistake)
    ├── InvalidRequestError            400 invalid_request_error
    │   ├── NotFoundError              404 (unknown model, tier or path)
    │   ├── MethodNotAllowedError      405
    │   ├── PayloadTooLargeError       413
    │   ├── UnsupportedMediaTypeError  415 (a compressed request body)
    │   └── RequestTimeoutError        408 (a request body that does not arrive in time)
    ├── AuthenticationError            401 authentication_error
    ├── PermissionDeniedError          403 permission_error
    ├── RateLimitError                 429 rate_limit_error (+ Retry-After)
    └── UpstreamError                  502 upstream_error (every tier failed before the first byte)
        ├── ServiceUnavailableError    503 (no healthy tier)
        └── UpstreamTimeoutError       504

Every error renders to `{"error": {"message", "type", "param", "code"}}`, the shape the
OpenAI SDK parses into its own exception classes.
"""

from __future__ import annotations

import math
from typing import Final

import orjson


class TiergateError(Exception):
    """Base class; `status` and `type` are class attributes, `code` may be per instance."""

    status: int = 500
    type: str = "server_error"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def to_dict(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        return orjson.dumps(self.to_dict())

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers this error carries (Retry-After for 429)."""
        return []


class InvalidRequestError(TiergateError):
    status = 400
    type = "invalid_request_error"


class NotFoundError(InvalidRequestError):
    status = 404
    default_code = "not_found"


class MethodNotAllowedError(InvalidRequestError):
    status = 405
    default_code = "method_not_allowed"


class PayloadTooLargeError(InvalidRequestError):
    status = 413
    default_code = "payload_too_large"


class UnsupportedMediaTypeError(InvalidRequestError):
    status = 415
    default_code = "unsupported_media_type"


class RequestTimeoutError(InvalidRequestError):
    status = 408
    default_code = "request_timeout"

    def headers(self) -> list[tuple[bytes, bytes]]:
        # The connection ends with it (RFC 9110: a 408 means the server stopped waiting).
        # Kept alive, the rest of the body still counted as this request's: a client that
        # trickled it on held the connection for good (each byte stops uvicorn's keep-alive
        # timer), and one that sent its next request had it read as that body.
        return [(b"connection", b"close")]


class AuthenticationError(TiergateError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(TiergateError):
    status = 403
    type = "permission_error"
    default_code = "permission_denied"


# The longest wait a refusal names. A limit the configuration allows (requests_per_second:
# 1e-307) makes a wait whose milliseconds overflow to infinity, which no header can carry.
MAX_RETRY_AFTER_S: Final = 365 * 24 * 3600.0


def _retry_after(seconds: float | None) -> list[tuple[bytes, bytes]]:
    if seconds is None:
        return []
    seconds = min(seconds, MAX_RETRY_AFTER_S)
    # Retry-After takes whole seconds, rounded up so clients never retry too early. The
    # OpenAI SDKs read retry-after-ms first: with it they wait 0.2 s, not 1 s, for a slot of
    # a 5-per-second limit.
    return [
        (b"retry-after", str(max(1, math.ceil(seconds))).encode()),
        (b"retry-after-ms", str(max(1, math.ceil(seconds * 1000.0))).encode()),
    ]


class RateLimitError(TiergateError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float = 1.0,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message, param=param, code=code)
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return _retry_after(self.retry_after_s)


class UpstreamError(TiergateError):
    status = 502
    type = "upstream_error"
    default_code = "upstream_failed"

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = True,
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message, param=param, code=code)
        self.retryable = retryable

    def headers(self) -> list[tuple[bytes, bytes]]:
        # The OpenAI SDKs retry every 5xx unless told otherwise; a failure that the request
        # itself causes would only fail alike again, on every tier, once per retry.
        return [] if self.retryable else [(b"x-should-retry", b"false")]


class ServiceUnavailableError(UpstreamError):
    status = 503
    default_code = "service_unavailable"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return _retry_after(self.retry_after_s)


class UpstreamTimeoutError(UpstreamError):
    status = 504
    default_code = "upstream_timeout"


# The refusals an engine may answer a request with; each is relayed in the gateway's shape.
_ENGINE_REFUSALS: dict[int, type[InvalidRequestError]] = {
    400: InvalidRequestError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
}
_MAX_PLAIN_MESSAGE: Final = 1000


def engine_refusal(status: int, body: bytes) -> bytes:
    """An engine's refusal (400, 413, 422) of a request, in the shape the gateway's own
    refusals have. vLLM answers `{"error": {"message", "type": "BadRequestError", "param",
    "code": 400}}` (older releases: those fields at the top level, beside `"object":
    "error"`); a client that switches on `type` or `code` should not meet two conventions
    behind one API. The engine's message and param are kept; a body that is not such JSON
    becomes the message."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    fields = parsed.get("error", parsed) if isinstance(parsed, dict) else None
    if not isinstance(fields, dict):
        fields = {}
    message = fields.get("message")
    if not isinstance(message, str) or not message:
        # Cut before decoding: the body may be megabytes of an HTML error page.
        text = body[: 4 * _MAX_PLAIN_MESSAGE].decode("utf-8", "replace").strip()
        text = text[:_MAX_PLAIN_MESSAGE]
        message = text or f"The engine refused the request (HTTP {status})."
    param, code = fields.get("param"), fields.get("code")
    refusal = _ENGINE_REFUSALS.get(status, InvalidRequestError)(
        message,
        param=param if isinstance(param, str) else None,
        # vLLM repeats the HTTP status as an int code; only a named code says more.
        code=code if isinstance(code, str) else None,
    )
    return refusal.body()


def error_event(exc: TiergateError) -> bytes:
    """An SSE event carrying an error, sent when a stream fails after its first byte."""
    return b"data: " + exc.body() + b"\n\n"


def responses_error_event(exc: TiergateError, sequence_number: int) -> bytes:
    """`error_event` for a Responses stream, whose events are typed: OpenAI's `error`
    event (type, code, message, param, sequence_number), which clients that dispatch on
    the event type handle; the SDK yields it as a ResponseErrorEvent."""
    event = {
        "type": "error",
        "code": exc.code or exc.type,
        "message": exc.message,
        "param": exc.param,
        "sequence_number": sequence_number,
    }
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


__all__ = [
    "AuthenticationError",
    "InvalidRequestError",
    "MethodNotAllowedError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "RequestTimeoutError",
    "ServiceUnavailableError",
    "TiergateError",
    "UnsupportedMediaTypeError",
    "UpstreamError",
    "UpstreamTimeoutError",
    "engine_refusal",
    "error_event",
    "responses_error_event",
]
