"""The upstream requests of one exchange: every one is aborted once its client has left."""

from __future__ import annotations

from gateway.backends.h1client import UpstreamResponse
from gateway.proxy.service import _UpstreamRequests


class _Response:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def _response() -> tuple[UpstreamResponse, _Response]:
    fake = _Response()
    return fake, fake  # type: ignore[return-value]


def test_a_request_sent_after_the_client_left_is_aborted_too() -> None:
    current = _UpstreamRequests()
    before, before_fake = _response()
    current.append(before)
    assert not before_fake.aborted
    current.abort_all()
    assert before_fake.aborted
    # Sent while the leaving was being noticed (the h1client appends once it has sent).
    after, after_fake = _response()
    current.append(after)
    assert after_fake.aborted and len(current) == 2
