"""TLS for https tier endpoints: one verifying client context per tier."""

from __future__ import annotations

import ssl

from gateway.config import ConfigError, TierSettings


def tier_tls_context(tier: TierSettings) -> ssl.SSLContext | None:
    """The context the tier's https endpoints are reached with (certificate and host name
    verified, against `tls_ca_file` or the system's trust store); None without https
    endpoints. Raises ConfigError for a CA file that cannot be read."""
    if not any(endpoint.scheme == "https" for endpoint in tier.parsed_endpoints):
        return None
    try:
        return ssl.create_default_context(
            cafile=None if tier.tls_ca_file is None else str(tier.tls_ca_file)
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"tier {tier.name}: tls_ca_file {tier.tls_ca_file} cannot be used: {exc}"
        ) from None


__all__ = ["tier_tls_context"]
