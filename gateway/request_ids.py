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
import random
from typing import Final

HEADER: Final = b"x-request-id"


class RequestIds:
    """`req_` + 12 random hex digits per instance + 12 random hex digits per request.

    Not a counter: the ids one client sees would tell it how many requests the gateway took
    in between (other tenants' traffic). `random.getrandbits` (about 0.1 us) is not a secret
    generator, and needs not be: an id proves nothing, it only has to be unique, which two
    ids of one instance fail with odds of about n^2 / 2^49 for n requests, and only matters
    while both are in flight (vLLM aborts by id)."""

    __slots__ = ("_draw", "_prefix")

    def __init__(self) -> None:
        self._prefix = b"req_" + binascii.hexlify(os.urandom(6))
        self._draw = random.Random(os.urandom(16)).getrandbits

    def new(self) -> bytes:
        return b"%s%012x" % (self._prefix, self._draw(48))


__all__ = ["HEADER", "RequestIds"]
