"""Request ids: one per generation request, made by the gateway, never taken from a client.

The id goes back to the client as `x-request-id` (the OpenAI SDKs expose it as `_request_id`)
and upstream as `x-request-id`, which vLLM makes the base of its own request id and of the
completion's `id` (`chatcmpl-<id>`): one id ties a client's report to the engine's logs.
A client's own `x-request-id` is not passed on: vLLM aborts every request that shares the id
of one whose client left, so an id one tenant chose could cancel another tenant's request.
"""

from __future__ import annotations

import binascii
import os
from typing import Final

HEADER: Final = b"x-request-id"


class RequestIds:
    """`req_` + 12 random hex digits per instance + 12 random hex digits per request.

    Not a counter, nor a seeded generator whose state a client could rebuild from the ids it
    collects: either would tell it how many requests the gateway took between two of its
    own (other tenants' traffic). `os.urandom` costs about 0.1 us more than a Mersenne
    Twister draw here. Two ids of one instance collide with odds of about n^2 / 2^49 for n
    requests, which matters only while both are in flight (vLLM aborts by id)."""

    __slots__ = ("_prefix",)

    def __init__(self) -> None:
        self._prefix = b"req_" + binascii.hexlify(os.urandom(6))

    def new(self) -> bytes:
        return self._prefix + binascii.hexlify(os.urandom(6))


__all__ = ["HEADER", "RequestIds"]
