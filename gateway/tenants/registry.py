"""Tenants at run time: who a key belongs to and what that tenant may do.

Keys are kept only as SHA-256 digests; a presented key is hashed and looked up, so the
plaintext never sits in memory longer than the request that carried it, and is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.config import ConfigError, Settings, TenantSettings, tenant_keys
from gateway.errors import AuthenticationError

_HASH_PREFIX = "sha256:"


def hash_key(key: str) -> str:
    """The stored form of an API key: `sha256:<hex>`."""
    return _HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant's resolved policy; tier references are indices into the ladder."""

    name: str
    allowed_tiers: tuple[int, ...]  # ascending: cheapest first
    allow_pinning: bool
    thresholds: tuple[float, ...] | None  # per ladder tier but the top; None: router default
    alpha: float | None
    settings: TenantSettings

    @property
    def top_tier(self) -> int:
        return self.allowed_tiers[-1]

    def allows(self, tier: int) -> bool:
        return tier in self.allowed_tiers


def allowed_tier_indices(tenant: TenantSettings, names: Sequence[str]) -> tuple[int, ...]:
    """Ladder indices of the tiers a tenant may use, cheapest first (all when it sets none)."""
    if tenant.allowed_tiers is None:
        return tuple(range(len(names)))
    return tuple(sorted(names.index(name) for name in tenant.allowed_tiers))


def build_tenant(tenant: TenantSettings, settings: Settings) -> Tenant:
    names = [tier.name for tier in settings.tiers]
    allowed = allowed_tier_indices(tenant, names)
    thresholds = None
    if tenant.thresholds is not None:
        default = settings.router.default_threshold
        thresholds = tuple(tenant.thresholds.get(name, default) for name in names[:-1])
    return Tenant(
        name=tenant.name,
        allowed_tiers=allowed,
        allow_pinning=tenant.allow_pinning,
        thresholds=thresholds,
        alpha=tenant.alpha,
        settings=tenant,
    )


class TenantRegistry:
    """Maps presented API keys to tenants."""

    def __init__(self, settings: Settings, environ: Mapping[str, str] | None = None) -> None:
        # Bucketed by a digest prefix; the full digest is then compared in constant time.
        self._by_prefix: dict[bytes, list[tuple[bytes, Tenant]]] = {}
        self.tenants: dict[str, Tenant] = {}
        for tenant_settings in settings.tenants:
            tenant = build_tenant(tenant_settings, settings)
            self.tenants[tenant.name] = tenant
            for key in tenant_keys(tenant_settings, environ):
                try:
                    digest = _digest_of_configured(key)
                except ValueError as exc:
                    raise ConfigError(f"tenant {tenant.name}: {exc}") from None
                owner = self._lookup(digest)
                if owner is not None and owner.name != tenant.name:
                    raise ValueError(
                        f"an API key is configured for both {owner.name!r} and {tenant.name!r}"
                    )
                self._by_prefix.setdefault(digest[:8], []).append((digest, tenant))

    @property
    def names(self) -> Sequence[str]:
        return list(self.tenants)

    def authenticate(self, authorization: bytes | None) -> Tenant:
        """Resolves an `Authorization: Bearer <key>` header value; raises 401 otherwise."""
        if not authorization:
            raise AuthenticationError(
                "Missing API key: send it as 'Authorization: Bearer <key>'.",
                code="missing_api_key",
            )
        scheme, _, key = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not key.strip():
            raise AuthenticationError("Malformed Authorization header; expected 'Bearer <key>'.")
        tenant = self._lookup(hashlib.sha256(key.strip()).digest())
        if tenant is None:
            raise AuthenticationError("Incorrect API key provided.")
        return tenant

    def _lookup(self, digest: bytes) -> Tenant | None:
        # The bucket lookup can only leak a prefix of SHA-256(key), which says nothing
        # usable about the key; the full comparison is constant-time.
        found = None
        for known, tenant in self._by_prefix.get(digest[:8], ()):
            if hmac.compare_digest(known, digest):
                found = tenant
        return found


def several_authorizations() -> AuthenticationError:
    """The refusal of a request with more than one Authorization header: servers and proxies
    disagree on which one counts, so the gateway counts none."""
    return AuthenticationError(
        "Send one Authorization header, not several.", code="several_authorization_headers"
    )


def one_authorization(values: Sequence[bytes]) -> bytes | None:
    """The value of the one Authorization header among `values` (None: there is none)."""
    if len(values) > 1:
        raise several_authorizations()
    return values[0] if values else None


def _digest_of_configured(key: str) -> bytes:
    if not key.strip():
        raise ValueError("an API key is empty")
    if key[: len(_HASH_PREFIX)].lower() == _HASH_PREFIX:  # `SHA256:` is no plain key either
        hexdigest = key[len(_HASH_PREFIX) :]
        try:
            if len(hexdigest) == 64:
                return bytes.fromhex(hexdigest)
        except ValueError:
            pass
        raise ValueError("a hashed API key must be 'sha256:' followed by 64 hex digits")
    # A presented key loses its surrounding whitespace (`authenticate`), as keys from
    # `api_keys_env` do: a configured one that kept it could never match.
    return hashlib.sha256(key.strip().encode()).digest()


__all__ = [
    "Tenant",
    "TenantRegistry",
    "build_tenant",
    "hash_key",
    "one_authorization",
    "several_authorizations",
]
