"""Engines started with an API key (vLLM's --api-key): the tier's key goes upstream on every
call, a wrong or missing one is a clear 502, and a reload swaps it on kept connections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.app import check_settings
from gateway.backends.h1client import ConnectionPool
from gateway.config import ConfigError, Settings, TierSettings, parse_settings, tier_api_key
from tests.helpers import API_KEY, ENGINE_KEY, MODEL, GatewayThread, Ladder, fixed_policy, send

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def keyed_settings(ladder: Ladder, **tier_fields: Any) -> Settings:
    data = ladder.settings().model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    data["resilience"]["health_interval_s"] = 60  # health checks play no part here
    for tier in data["tiers"]:
        tier.update(tier_fields)
    return parse_settings(data)


def test_the_simulator_guards_what_vllm_guards(keyed_ladder: Ladder) -> None:
    sim = keyed_ladder.sims[0]
    body = {**CHAT, "model": sim.served_model_name}
    refused = send("POST", f"{sim.url}/v1/chat/completions", body, key=None)
    assert (refused.status, refused.json()) == (401, {"error": "Unauthorized"})
    wrong = send("POST", f"{sim.url}/v1/chat/completions", body, key="sk-other")
    assert wrong.status == 401
    assert send("GET", f"{sim.url}/v1/models", key=ENGINE_KEY).status == 200
    assert send("POST", f"{sim.url}/v1/chat/completions", body, key=ENGINE_KEY).status == 200
    # Not under /v1: open, as in vLLM.
    assert send("GET", f"{sim.url}/health", key=None).status == 200
    tokenize = {"model": sim.served_model_name, "prompt": "hello there"}
    assert send("POST", f"{sim.url}/tokenize", tokenize, key=None).status == 200


def test_the_tier_key_goes_upstream_and_a_missing_one_is_a_clear_502(keyed_ladder: Ladder) -> None:
    settings = keyed_settings(keyed_ladder, api_key_env="ENGINE_KEY")
    with GatewayThread(
        settings, policy_factory=fixed_policy(0), environ={"ENGINE_KEY": ENGINE_KEY}
    ) as gw:
        reply = send("POST", f"{gw.url}/v1/chat/completions", CHAT)
        assert reply.status == 200, reply.body
        stream = send("POST", f"{gw.url}/v1/chat/completions", {**CHAT, "stream": True})
        assert stream.status == 200 and stream.body.rstrip().endswith(b"data: [DONE]")
    with GatewayThread(keyed_settings(keyed_ladder), policy_factory=fixed_policy(0)) as gw:
        reply = send("POST", f"{gw.url}/v1/chat/completions", CHAT)
        assert reply.status == 502
        error = reply.json()["error"]
        assert "credentials" in error["message"] and "api_key" in error["message"]
        # The client's own key is never what the engine saw refused: it is not echoed.
        assert API_KEY not in reply.body.decode()


def test_a_reload_swaps_the_key_on_kept_connections_and_a_bad_one_is_refused(
    keyed_ladder: Ladder,
) -> None:
    with GatewayThread(
        keyed_settings(keyed_ladder, api_key="sk-wrong"), policy_factory=fixed_policy(0)
    ) as gw:
        assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status == 502
        endpoints = [state for tier in gw.app.runtime.tiers for state in tier.endpoints]
        gw.app.reload(keyed_settings(keyed_ladder, api_key=ENGINE_KEY))
        kept = [state for tier in gw.app.runtime.tiers for state in tier.endpoints]
        assert [id(state) for state in kept] == [id(state) for state in endpoints]
        assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status == 200
        runtime = gw.app.runtime
        with pytest.raises(ConfigError, match=r"\$UNSET_KEY, which is not set"):
            gw.app.reload(keyed_settings(keyed_ladder, api_key_env="UNSET_KEY"))
        assert gw.app.runtime is runtime
        assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status == 200


def test_a_refused_reload_leaves_kept_endpoints_as_they_were(
    keyed_ladder: Ladder, tmp_path: Path
) -> None:
    """Everything a reload builds can still fail after the tiers are built (here the label
    log, the last step): kept endpoints must keep their key, limit and slot queue (the
    queue of the refused configuration's tier would never be waited on)."""
    settings = keyed_settings(keyed_ladder, api_key=ENGINE_KEY, max_inflight_per_endpoint=3)
    with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
        runtime = gw.app.runtime
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        data = settings.model_dump(mode="json")
        data["tenants"][0]["api_keys"] = [API_KEY]
        for tier in data["tiers"]:
            tier.update(api_key="sk-other", max_inflight_per_endpoint=9)
        data["shadow"] = {"rate": 1.0, "label_log": str(blocker / "labels.jsonl")}
        with pytest.raises(ConfigError, match=r"shadow\.label_log"):
            gw.app.reload(parse_settings(data))
        assert gw.app.runtime is runtime
        header = f"authorization: Bearer {ENGINE_KEY}\r\n".encode()
        for tier in runtime.tiers:
            for state in tier.endpoints:
                assert state.owner is tier
                assert state.max_inflight == 3
                assert state.pool.default_headers == header
            assert ENGINE_KEY not in repr(tier)
        assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status == 200


def test_key_settings_are_checked() -> None:
    base = {"name": "t", "precision": "bf16", "endpoints": ["http://127.0.0.1:9/v1"]}
    with pytest.raises(ValueError, match="not both"):
        TierSettings(**base, api_key="k", api_key_env="K")
    for bad in ("two words", "line\r\nx-injected: 1", ""):
        with pytest.raises(ValueError, match="printable ASCII"):
            TierSettings(**base, api_key=bad)
    tier = TierSettings(**base, api_key_env="ENGINE_KEY")
    assert tier_api_key(tier, {"ENGINE_KEY": "sk-1"}) == "sk-1"
    with pytest.raises(ConfigError, match="not set"):
        tier_api_key(tier, {})
    assert tier_api_key(tier, {"ENGINE_KEY": ""}) is None  # vLLM's reading of it
    with pytest.raises(ConfigError, match="printable ASCII"):
        tier_api_key(tier, {"ENGINE_KEY": "sk 1"})
    assert tier_api_key(TierSettings(**base), {}) is None
    assert "sk-secret" not in repr(TierSettings(**base, api_key="sk-secret"))


def test_serve_refuses_a_tier_key_variable_that_is_not_set(keyed_ladder: Ladder) -> None:
    settings = keyed_settings(keyed_ladder, api_key_env="ENGINE_KEY")
    with pytest.raises(ConfigError, match="ENGINE_KEY"):
        check_settings(settings, fixed_policy(0), environ={})
    check_settings(settings, fixed_policy(0), environ={"ENGINE_KEY": ENGINE_KEY})


def test_every_request_from_a_pool_carries_its_default_headers() -> None:
    pool = ConnectionPool("127.0.0.1", 9)
    assert b"authorization" not in pool.render(b"GET", b"/health", b"")
    pool.default_headers = b"authorization: Bearer k\r\n"
    rendered = pool.render(b"POST", b"/v1/x", b"{}", b"x-extra: 1\r\n")
    head, _, body = rendered.partition(b"\r\n\r\n")
    assert body == b"{}"
    assert head.split(b"\r\n")[-2:] == [b"authorization: Bearer k", b"x-extra: 1"]


def test_an_inline_key_is_masked_in_the_admin_view(keyed_ladder: Ladder) -> None:
    data = keyed_settings(keyed_ladder, api_key=ENGINE_KEY).model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    for tier in data["tiers"]:
        tier["api_key"] = ENGINE_KEY
    data["admin"] = {"token": "adm"}
    with GatewayThread(parse_settings(data), policy_factory=fixed_policy(0)) as gw:
        assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status == 200
        shown = send("GET", f"{gw.url}/admin/config", key="adm")
        assert shown.status == 200 and ENGINE_KEY not in shown.body.decode()
        assert {tier["api_key"] for tier in shown.json()["tiers"]} == {"**********"}
