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


def test_a_token_from_a_file_made_secret_is_read_without_its_newline() -> None:
    """`kubectl create secret --from-file` keeps the file's last newline: the admin API
    answered 401 to the token for good, with no hint."""
    from gateway.config import MetricsSettings, resolve_metrics_token, resolve_secret

    environ = {"TIERGATE_ADMIN_TOKEN": "adm-token\n", "SCRAPE": " scrape-token\r\n"}
    assert resolve_secret(None, "TIERGATE_ADMIN_TOKEN", environ) == "adm-token"
    assert resolve_metrics_token(MetricsSettings(token_env="SCRAPE"), environ) == "scrape-token"


@pytest.mark.parametrize("blank", [" ", "\n", "\t \r\n"])
def test_a_token_of_whitespace_alone_is_refused_not_read_as_none(blank: str) -> None:
    """Trimmed to nothing, it would read as "no token": /metrics open to anyone."""
    from gateway.config import ConfigError, MetricsSettings, resolve_metrics_token, resolve_secret

    with pytest.raises(ConfigError, match=r"\$TOKEN holds only whitespace"):
        resolve_metrics_token(MetricsSettings(token_env="TOKEN"), {"TOKEN": blank})
    with pytest.raises(ConfigError, match=r"\$TOKEN holds only whitespace"):
        resolve_secret(None, "TOKEN", {"TOKEN": blank})
    assert resolve_secret(None, "TOKEN", {"TOKEN": ""}) == ""  # empty: none, as documented
