"""TLS for https tier endpoints: one verifying client context per tier."""

from __future__ import annotations

import functools
import os
import ssl

from gateway.config import ConfigError, TierSettings


def tier_tls_context(tier: TierSettings) -> ssl.SSLContext | None:
    """The context the tier's https endpoints are reached with (certificate and host name
    verified, against `tls_ca_file` or the system's trust store); None without https
    endpoints. The same CA file, unchanged, gives the same context, so a reload keeps the
    connections verified with it; a changed one gives a new context, and the pool stops
    reusing connections verified with the old. Raises ConfigError for a CA file that cannot
    be read."""
    if not any(endpoint.scheme == "https" for endpoint in tier.parsed_endpoints):
        return None
    ca_file = tier.tls_ca_file
    try:
        if ca_file is None:
            return _context(None, 0, 0)
        stat = os.stat(ca_file)
        return _context(str(ca_file), stat.st_mtime_ns, stat.st_size)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"tier {tier.name}: tls_ca_file {ca_file} cannot be used: {exc}"
        ) from None


@functools.lru_cache(maxsize=32)
def _context(ca_file: str | None, mtime_ns: int, size: int) -> ssl.SSLContext:
    # mtime and size are part of the key only so that a rewritten file is read again.
    return ssl.create_default_context(cafile=ca_file)


__all__ = ["tier_tls_context"]
