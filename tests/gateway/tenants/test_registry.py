from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_settings
from gateway.errors import AuthenticationError
from gateway.tenants.registry import TenantRegistry, hash_key


def settings(tenants: list[dict[str, object]]):  # type: ignore[no-untyped-def]
    return parse_settings(
        {
            "model": "m",
            "tiers": [
                {"name": "a", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:1/v1"]},
                {"name": "b", "precision": "w4a16", "endpoints": ["http://127.0.0.1:2/v1"]},
                {"name": "c", "precision": "bf16", "endpoints": ["http://127.0.0.1:3/v1"]},
            ],
            "tenants": tenants,
        }
    )


def test_plain_hashed_and_env_keys_resolve() -> None:
    registry = TenantRegistry(
        settings(
            [
                {"name": "plain", "api_keys": ["sk-plain"]},
                {"name": "hashed", "api_keys": [hash_key("sk-hashed")]},
                {"name": "env", "api_keys_env": "ENV_KEYS"},
            ]
        ),
        environ={"ENV_KEYS": "sk-env1, sk-env2"},
    )
    assert registry.authenticate(b"Bearer sk-plain").name == "plain"
    assert registry.authenticate(b"Bearer sk-hashed").name == "hashed"
    assert registry.authenticate(b"bearer sk-env2").name == "env"
    with pytest.raises(AuthenticationError):
        registry.authenticate(b"Bearer sha256:" + hash_key("sk-hashed")[7:].encode())


def test_an_upper_case_hash_prefix_is_a_hashed_key() -> None:
    """`SHA256:<hex>` was taken as a plain key that no client would ever send, and a plain
    copy of the key in another tenant went unnoticed."""
    upper = "SHA256:" + hash_key("sk-hashed")[7:]
    registry = TenantRegistry(settings([{"name": "hashed", "api_keys": [upper]}]))
    assert registry.authenticate(b"Bearer sk-hashed").name == "hashed"
    with pytest.raises(ValueError, match="configured for both 'one' and 'two'"):
        TenantRegistry(
            settings(
                [{"name": "one", "api_keys": [upper]}, {"name": "two", "api_keys": ["sk-hashed"]}]
            )
        )


def test_a_configured_key_with_surrounding_whitespace_still_resolves() -> None:
    """A header's key is read without its surrounding whitespace (HTTP strips it anyway),
    so a key configured with some, say a YAML block scalar's newline, must match it."""
    registry = TenantRegistry(settings([{"name": "padded", "api_keys": [" sk-padded\n"]}]))
    assert registry.authenticate(b"Bearer sk-padded").name == "padded"


def test_allowed_tiers_and_thresholds_resolve_to_indices() -> None:
    registry = TenantRegistry(
        settings(
            [
                {
                    "name": "t",
                    "api_keys": ["k"],
                    "allowed_tiers": ["c", "b"],
                    "thresholds": {"a": 0.3},
                }
            ]
        )
    )
    tenant = registry.tenants["t"]
    assert tenant.allowed_tiers == (1, 2)
    assert tenant.top_tier == 2
    assert tenant.thresholds == (0.3, 0.8)


def test_one_key_for_two_tenants_is_rejected() -> None:
    with pytest.raises(ValueError, match="both"):
        TenantRegistry(
            settings([{"name": "x", "api_keys": ["k"]}, {"name": "y", "api_keys": ["k"]}])
        )


def test_keys_never_stored_in_plaintext() -> None:
    registry = TenantRegistry(settings([{"name": "t", "api_keys": ["sk-secret-value"]}]))
    assert "sk-secret-value" not in repr(registry.__dict__)


@pytest.mark.parametrize(
    ("tenant", "environ", "fragment"),
    [
        ({"api_keys": ["sha256:" + "z" * 64]}, {}, "'sha256:' followed by 64 hex digits"),
        ({"api_keys": ["sha256:abc"]}, {}, "'sha256:' followed by 64 hex digits"),
        # Valid hex of the wrong length is no SHA-256 digest: it could never match a key.
        ({"api_keys": ["sha256:abcd"]}, {}, "'sha256:' followed by 64 hex digits"),
        ({"api_keys": [" "]}, {}, "an API key is empty"),
        ({"api_keys_env": "NOT_SET_ANYWHERE"}, {}, "$NOT_SET_ANYWHERE, which is not set"),
    ],
)
def test_a_key_that_cannot_serve_is_refused_naming_the_tenant(
    tenant: dict[str, object], environ: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        TenantRegistry(settings([{"name": "broken", **tenant}]), environ=environ)
    assert "tenant broken" in str(caught.value) and fragment in str(caught.value)


def test_an_empty_key_variable_is_a_tenant_with_no_keys_not_an_error() -> None:
    registry = TenantRegistry(
        settings([{"name": "off", "api_keys_env": "KEYS"}, {"name": "on", "api_keys": ["k"]}]),
        environ={"KEYS": ""},
    )
    with pytest.raises(AuthenticationError):
        registry.authenticate(b"Bearer ")
    assert registry.authenticate(b"Bearer k").name == "on"


def test_a_tenant_may_list_its_own_key_twice() -> None:
    """Rotating a key's stored form (plain to hashed) lists it twice for a while: only a
    key shared by two tenants is ambiguous."""
    registry = TenantRegistry(settings([{"name": "t", "api_keys": ["k", hash_key("k")]}]))
    assert registry.authenticate(b"Bearer k").name == "t"


def test_whitespace_around_the_presented_key_is_ignored() -> None:
    registry = TenantRegistry(settings([{"name": "t", "api_keys": ["k"]}]))
    assert registry.authenticate(b"Bearer  k ").name == "t"
