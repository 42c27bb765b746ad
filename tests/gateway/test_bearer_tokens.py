"""The admin and metrics tokens as a client sends them: the header's bytes."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from gateway.api.routes import bearer_matches


def request_with(*authorizations: bytes) -> Request:
    headers = [(b"authorization", value) for value in authorizations]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


@pytest.mark.parametrize("token", ["admin-token", "jeton-d'accès-é", "トークン"])
def test_a_token_matches_the_utf8_bytes_a_client_sends(token: str) -> None:
    # A token beyond ASCII was compared with the header read as latin-1 and re-encoded as
    # UTF-8: it never matched, and the admin API stayed locked to its own operator.
    assert bearer_matches(request_with(b"Bearer " + token.encode()), token)
    assert not bearer_matches(request_with(b"Bearer " + token.encode() + b"x"), token)


@pytest.mark.parametrize(
    "authorizations",
    [(), (b"Bearer",), (b"Bearer ",), (b"Basic admin-token",), (b"Bearer \xff",)],
)
def test_anything_but_the_token_is_refused(authorizations: tuple[bytes, ...]) -> None:
    assert not bearer_matches(request_with(*authorizations), "admin-token")


def test_two_authorization_headers_are_refused_even_when_one_matches() -> None:
    assert not bearer_matches(request_with(b"Bearer admin-token", b"Bearer x"), "admin-token")
