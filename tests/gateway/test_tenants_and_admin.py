"""Tenant limits and isolation, and the admin API's separate token."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from openai import OpenAI
from openai._base_client import SyncAPIClient

from gateway import __version__
from gateway.config import MetricsSettings, parse_settings
from gateway.tenants.registry import hash_key
from router_models import router_build
from tests.helpers import MODEL, GatewayThread, Ladder, send

ADMIN = "admin-secret-token"


def settings(ladder: Ladder) -> Any:
    data = ladder.settings().model_dump(mode="json")
    data["tenants"] = [
        {
            "name": "alpha",
            "api_keys": [hash_key("sk-alpha")],
            "limits": {"requests_per_second": 2, "burst": 2},
        },
        {
            "name": "beta",
            "api_keys": ["sk-beta"],
            "allowed_tiers": ["nvfp4", "w4a16"],
            "limits": {"max_tokens": 16},
        },
        {
            "name": "gamma",
            "api_keys": ["sk-gamma"],
            "allow_pinning": False,
            "limits": {"max_body_bytes": 2048, "tokens_per_minute": 600},
        },
    ]
    data["admin"] = {"token": ADMIN}
    return parse_settings(data)


def call(
    gw: GatewayThread,
    key: str | None,
    body: Any,
    path: str = "/v1/chat/completions",
    method: str = "POST",
) -> tuple[int, dict[str, str], Any]:
    reply = send(method, f"{gw.url}{path}", body, key=key, timeout=20)
    return reply.status, reply.headers, reply.json()


def chat(max_tokens: int | None = 4, model: str = MODEL, content: str = "hi") -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


@pytest.fixture(scope="module")
def gw(ladder: Ladder) -> Any:
    with GatewayThread(settings(ladder)) as running:
        yield running


def test_requests_per_second_limit_answers_429_with_retry_after(gw: GatewayThread) -> None:
    statuses = [call(gw, "sk-alpha", chat())[0] for _ in range(3)]
    assert statuses[:2] == [200, 200] and statuses[2] == 429
    status, headers, body = call(gw, "sk-alpha", chat())
    assert status == 429 and int(headers["retry-after"]) >= 1
    assert body["error"]["type"] == "rate_limit_error"
    time.sleep(1.1)
    assert call(gw, "sk-alpha", chat())[0] == 200
    assert call(gw, "sk-beta", chat())[0] == 200  # another tenant's budget is its own


def test_the_openai_sdk_retries_after_the_exact_wait(
    gw: GatewayThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK reads retry-after-ms before Retry-After: over alpha's 2 requests per second it
    waits at most 0.5 s and then succeeds, where whole seconds alone would make it wait 1 s."""
    waits: list[float] = []
    computed = SyncAPIClient._calculate_retry_timeout

    def recorded(client: SyncAPIClient[Any, Any], *args: Any, **kwargs: Any) -> float:
        wait = computed(client, *args, **kwargs)
        waits.append(wait)
        return wait

    monkeypatch.setattr(SyncAPIClient, "_calculate_retry_timeout", recorded)
    while call(gw, "sk-alpha", chat())[0] != 429:  # alpha's burst is spent
        pass
    client = OpenAI(base_url=f"{gw.url}/v1", api_key="sk-alpha", max_retries=3, timeout=20)
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert completion.choices[0].message.content
    assert waits and all(0.0 < wait <= 0.5 for wait in waits), waits


def test_max_tokens_cap(gw: GatewayThread, ladder: Ladder) -> None:
    status, _, body = call(gw, "sk-beta", chat(max_tokens=100))
    assert status == 400 and body["error"]["param"] == "max_tokens"
    status, _, body = call(gw, "sk-beta", chat(max_tokens=None))
    assert status == 200 and body["usage"]["completion_tokens"] <= 16  # the cap was applied


def test_tenant_tier_restrictions_and_pinning(gw: GatewayThread) -> None:
    status, headers, _ = call(gw, "sk-beta", chat())
    assert status == 200 and headers["x-tiergate-tier"] == "w4a16"  # beta's top allowed tier
    status, _, body = call(gw, "sk-beta", chat(model=f"{MODEL}@bf16"))
    assert status == 403 and body["error"]["type"] == "permission_error"
    status, _, body = call(gw, "sk-gamma", chat(model=f"{MODEL}@nvfp4"))
    assert status == 403
    _, _, models = call(gw, "sk-beta", None, "/v1/models", "GET")
    assert [m["id"] for m in models["data"]] == [MODEL, f"{MODEL}@nvfp4", f"{MODEL}@w4a16"]
    _, _, models = call(gw, "sk-gamma", None, "/v1/models", "GET")
    assert [m["id"] for m in models["data"]] == [MODEL]
    # An unknown tier names the tiers this tenant may use, not the others.
    status, _, body = call(gw, "sk-beta", chat(model=f"{MODEL}@fp2"))
    assert status == 404 and "['nvfp4', 'w4a16']" in body["error"]["message"]
    assert "bf16" not in body["error"]["message"]
    # A tenant that may not pin learns that, whatever tier it names.
    status, _, body = call(gw, "sk-gamma", chat(model=f"{MODEL}@fp2"))
    assert status == 403 and "may not pin" in body["error"]["message"]


def test_tenant_body_limit_and_token_budget(gw: GatewayThread) -> None:
    status, _, _ = call(gw, "sk-gamma", chat(content="x" * 3000))
    assert status == 413
    # 600 tokens per minute, charged from the real usage: one request really using ~520
    # tokens leaves too little for a second asking for 200.
    status, _, body = call(gw, "sk-gamma", {**chat(max_tokens=500), "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 500
    status, headers, body = call(gw, "sk-gamma", chat(max_tokens=200))
    assert status == 429 and body["error"]["code"] == "token_limit_exceeded"
    assert int(headers["retry-after"]) >= 10
    assert call(gw, "sk-gamma", chat(max_tokens=5))[0] == 200  # a small one still fits


def test_admin_requires_its_own_token(gw: GatewayThread) -> None:
    for key in (None, "sk-beta", "wrong"):
        status, _, body = call(gw, key, None, "/admin/config", "GET")
        assert status == 401 and body["error"]["type"] == "authentication_error"
    status, _, config = call(gw, ADMIN, None, "/admin/config", "GET")
    assert status == 200
    text = json.dumps(config)
    assert "sk-beta" not in text and "sk-gamma" not in text and ADMIN not in text
    status, _, tenants = call(gw, ADMIN, None, "/admin/tenants", "GET")
    assert status == 200 and set(tenants) == {"alpha", "beta", "gamma"}
    status, _, backends = call(gw, ADMIN, None, "/admin/backends", "GET")
    assert status == 200 and set(backends) == {"nvfp4", "w4a16", "bf16"}


def test_admin_disabled_without_a_token(ladder: Ladder) -> None:
    with GatewayThread(ladder.settings()) as gw:
        status, _, body = call(gw, "anything", None, "/admin/config", "GET")
        assert status == 403 and "disabled" in body["error"]["message"]


def test_metrics_token_guards_the_exposition(ladder: Ladder) -> None:
    guarded = settings(ladder).model_copy(update={"metrics": MetricsSettings(token="scrape-me")})
    with GatewayThread(guarded) as gw:
        for key in (None, "sk-beta", ADMIN, "scrape-me-not"):
            reply = send("GET", f"{gw.url}/metrics", key=key)
            assert reply.status == 401 and b"tiergate_" not in reply.body
            assert reply.json()["error"]["message"] == "A valid metrics token is required."
        reply = send("GET", f"{gw.url}/metrics", key="scrape-me")
        assert reply.status == 200 and b"tiergate_requests_total" in reply.body
        status, _, config = call(gw, ADMIN, None, "/admin/config", "GET")
        assert status == 200 and "scrape-me" not in json.dumps(config)
        gw.app.reload(guarded.model_copy(update={"metrics": MetricsSettings()}))  # open again
        assert send("GET", f"{gw.url}/metrics", key=None).status == 200


def test_a_metrics_token_env_named_but_unset_is_refused(ladder: Ladder) -> None:
    """The file asks for a token from a variable nobody exported: /metrics would be open
    to anyone. Refused as an unset tier key is; the default name, unset, leaves it open."""
    from gateway.app import check_settings
    from gateway.config import ConfigError
    from gateway.routing.factory import build_policy

    named = settings(ladder).model_copy(
        update={"metrics": MetricsSettings(token_env="SCRAPE_TOKEN")}
    )
    with pytest.raises(ConfigError, match=r"SCRAPE_TOKEN, which is not set"):
        check_settings(named, build_policy, environ={})
    check_settings(named, build_policy, environ={"SCRAPE_TOKEN": "t"})
    check_settings(settings(ladder), build_policy, environ={})  # the default: open
    with GatewayThread(settings(ladder)) as gw:
        with pytest.raises(ConfigError):
            gw.app.reload(named)  # and a reload to it keeps the running configuration
        assert send("GET", f"{gw.url}/metrics", key=None).status == 200


def test_keys_never_reach_metrics(gw: GatewayThread) -> None:
    with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert "tiergate_requests_total" in text
    for secret in ("sk-alpha", "sk-beta", "sk-gamma", ADMIN):
        assert secret not in text


def test_build_info_names_the_router_build(gw: GatewayThread) -> None:
    with urllib.request.urlopen(f"{gw.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    build = router_build()
    assert build == "python"  # tests run on the source; tests/router_models/test_compiled.py
    assert f'tiergate_build_info{{router_build="{build}",version="{__version__}"}} 1.0' in text


def test_a_request_the_engine_refuses_costs_no_tokens(ladder: Ladder) -> None:
    """The engine's 400 (max_tokens beyond the context) is relayed, and the admission
    estimate is refunded: nothing was generated. (Kept charged, it turned a tenant's own
    over-long requests into 429s for the minute.)"""
    data = ladder.settings().model_dump(mode="json")
    data["tenants"] = [
        {"name": "t", "api_keys": ["sk-t"], "limits": {"tokens_per_minute": 100_000}}
    ]
    with GatewayThread(parse_settings(data)) as running:
        for _ in range(4):  # each is estimated at about 40k tokens
            status, _, body = call(running, "sk-t", chat(max_tokens=40_000))
            assert status == 400, body
            assert "cannot be greater than max_model_len" in body["error"]["message"]
