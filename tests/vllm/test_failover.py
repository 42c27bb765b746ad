"""A vLLM API server is killed mid-stream: the stream ends with an error, later requests
escalate up the ladder, a request pinned to the dead tier gets an OpenAI-shaped error.

It kills the `plain` tier for good, so conftest runs this module after every other test in
tests/vllm.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.helpers import GatewayThread, fixed_policy
from tests.vllm.deployment import Deployment, group_members
from tests.vllm.support import (
    PUBLIC_MODEL,
    EngineScrape,
    client,
    first_event_paused,
    gateway_metric,
    gateway_settings,
    still_generating,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MESSAGES = [{"role": "user", "content": "Tell me a long story about lighthouses."}]
MAX_TOKENS = 900


def first_event(sdk: OpenAI) -> Iterator[Any]:
    """A long greedy stream served by `plain` (the ladder's first tier), once its first
    event reached the client (the gateway can no longer retry it); returns the rest."""
    raw = sdk.chat.completions.with_raw_response.create(
        model=PUBLIC_MODEL,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert raw.headers["x-tiergate-tier"] == "plain"
    chunks = iter(raw.parse())
    assert next(chunks).choices
    return chunks


def test_killed_server_fails_over_up_the_ladder(
    deployment: Deployment, vllm_report: dict[str, Any]
) -> None:
    plain = deployment["plain"]
    settings = gateway_settings(
        deployment,
        resilience={"health_interval_s": 0.5, "failure_threshold": 1, "base_ejection_s": 60},
    )
    with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
        sdk = client(gw)
        warm = sdk.chat.completions.with_raw_response.create(
            model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=4, temperature=0
        )
        assert warm.headers["x-tiergate-tier"] == "plain"

        # Held in the paused engine, the answer cannot end before the kill lands.
        before = EngineScrape.of(plain)
        chunks = first_event_paused(plain, lambda: first_event(sdk))
        frozen = still_generating(plain, before, MAX_TOKENS)
        plain.kill()  # SIGKILL to the API server: the connection drops mid-stream
        received = 1
        try:
            for _ in chunks:
                received += 1
        except openai.APIError as error:
            assert "after the first byte" in error.message
        else:
            pytest.fail(
                f"the stream ended cleanly after {received} chunks, max_tokens {MAX_TOKENS}"
            )
        vllm_report["failover_chunks_before_error"] = received
        vllm_report["failover_generated_when_killed"] = frozen.delta(
            before, "vllm:generation_tokens_total"
        )

        served = sdk.chat.completions.with_raw_response.create(
            model=PUBLIC_MODEL, messages=MESSAGES, max_tokens=4, temperature=0
        )
        assert served.headers["x-tiergate-tier"] == "prefix"
        assert served.parse().choices[0].message.content is not None
        escalations = gateway_metric(gw, "tiergate_escalations_total", from_tier="plain")
        assert escalations >= 1

        with pytest.raises(openai.APIStatusError) as pinned:
            sdk.chat.completions.create(
                model=f"{PUBLIC_MODEL}@plain", messages=MESSAGES, max_tokens=4
            )
        assert pinned.value.status_code in {502, 503}
        assert isinstance(pinned.value.body, dict) and "message" in pinned.value.body

    # vLLM 0.32's engine core and worker outlive a SIGKILLed API server (orphaned, still
    # holding their memory), so a supervisor must stop the whole process group, as here.
    assert plain.process is not None
    orphans = group_members(plain.process.pid)
    vllm_report["failover"] = {"processes_left_after_api_server_kill": len(orphans)}
    plain.terminate()
    assert plain.reap(time.monotonic() + 20) == []
