"""TLS for https tier endpoints: one verifying client context per tier."""

from __future__ import annotations

import functools
import ssl
from pathlib import Path

from gateway.config import ConfigError, TierSettings
from gateway.file_stamp import FileStamp, file_stamp

# A file as the context cache sees it: its path and stamp, so a rewritten or replaced file
# is read again.
FileState = tuple[str, FileStamp] | None


def tier_tls_context(tier: TierSettings) -> ssl.SSLContext | None:
    """The context the tier's https endpoints are reached with (certificate and host name
    verified, against `tls_ca_file` or the system's trust store; the gateway's own
    certificate when `tls_cert_file` is set); None without https endpoints. The same files,
    unchanged, give the same context, so a reload keeps the connections made with it; changed
    ones give a new context, and the pool stops reusing connections made with the old.
    Raises ConfigError for a file that cannot be used."""
    if not any(endpoint.scheme == "https" for endpoint in tier.parsed_endpoints):
        return None
    try:
        return _context(
            _state(tier.tls_ca_file), _state(tier.tls_cert_file), _state(tier.tls_key_file)
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tier {tier.name}: a TLS file cannot be used: {exc}") from None


def _state(path: Path | None) -> FileState:
    if path is None:
        return None
    return str(path), file_stamp(path)


@functools.lru_cache(maxsize=32)
def _context(ca: FileState, cert: FileState, key: FileState) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=None if ca is None else ca[0])
    if cert is not None:
        context.load_cert_chain(cert[0], None if key is None else key[0])
    return context


__all__ = ["tier_tls_context"]
