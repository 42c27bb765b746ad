"""Real vLLM keeps tenants' prefix caches apart under the salts the gateway sends."""

from __future__ import annotations

import uuid

import pytest
from openai import OpenAI

from tests.helpers import GatewayThread
from tests.vllm.deployment import Deployment
from tests.vllm.support import PUBLIC_MODEL, EngineScrape, gateway_settings, settled_scrape

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

KEYS = {"a": "key-tenant-a", "b": "key-tenant-b"}


def test_a_tenant_never_hits_another_tenants_cached_prompt(deployment: Deployment) -> None:
    """The prefix tier caches a's prompt; b's identical one hits none of its blocks, a's
    second one does (vLLM hashes the salt into the first block, kv_cache_utils.py)."""
    engine = deployment.servers["prefix"]
    tenants = [{"name": name, "api_keys": [key]} for name, key in KEYS.items()]
    system = {"role": "system", "content": f"[{uuid.uuid4()}] " + "Keep the ledger tidy. " * 60}
    messages = [system, {"role": "user", "content": "total it"}]
    with GatewayThread(gateway_settings(deployment, tenants=tenants)) as gw:

        def hits(tenant: str) -> float:
            sdk = OpenAI(base_url=f"{gw.url}/v1", api_key=KEYS[tenant], max_retries=0)
            before = EngineScrape.of(engine)
            sdk.chat.completions.create(
                model=f"{PUBLIC_MODEL}@prefix", messages=messages, max_tokens=2, temperature=0
            )
            after = settled_scrape(engine, before, 1)
            return after.delta(before, "vllm:prefix_cache_hits_total")

        assert hits("a") == 0
        assert hits("b") == 0
        assert hits("a") > 0
