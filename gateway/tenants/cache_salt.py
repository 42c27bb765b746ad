"""The prefix-cache namespace a request gets at the engines (vLLM's `cache_salt`).

vLLM reuses cached prompt blocks across every request with the same salt, and without one
across all requests. A tenant that reuses another's blocks gets its first token sooner, so
on a GPU its timing tells it which prefixes another tenant sent. An isolated tenant's
requests therefore carry a salt of their own. A client's own salt still splits its tenant's
namespace, as in vLLM, but is hashed under the tenant's name, so no client can name another
tenant's namespace, nor the one of an isolated tenant from a tenant that shares.
"""

from __future__ import annotations

import hashlib
from typing import Final

from gateway.errors import InvalidRequestError

# vLLM 0.32's bounds (`validate_cache_salt`, entrypoints/generate/base/protocol.py): the
# engine refuses anything else with a 400, and so does the gateway, though it sends only a
# digest, so that a client sees the same answer with or without it in front.
MAX_CLIENT_SALT_CHARS: Final = 128
_FORBIDDEN_CHARS: Final = frozenset("@/\\\0")
# Not a character a tenant name may start with: shared tenants' client salts stay apart
# from every isolated tenant's namespace.
_SHARED_NAMESPACE: Final = "*"


def client_salt(value: object) -> str | None:
    """The client's `cache_salt` (None: absent or null), refused as vLLM would refuse it."""
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_CLIENT_SALT_CHARS
        or not _FORBIDDEN_CHARS.isdisjoint(value)
    ):
        raise InvalidRequestError(
            f"'cache_salt' must be a non-empty string of at most {MAX_CLIENT_SALT_CHARS} "
            "characters without '@', '/', '\\' or NUL.",
            param="cache_salt",
        )
    return value


def upstream_cache_salt(tenant: str, isolated: bool, salt: str | None) -> str | None:
    """The salt sent to the engine: the tenant's namespace when it is isolated, the client's
    salt hashed under it. Valid for vLLM: at most 63 + 1 + 32 characters of [A-Za-z0-9_.-:*]."""
    if salt is None:
        return tenant if isolated else None
    digest = hashlib.sha256(salt.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{tenant if isolated else _SHARED_NAMESPACE}:{digest}"


__all__ = ["MAX_CLIENT_SALT_CHARS", "client_salt", "upstream_cache_salt"]
