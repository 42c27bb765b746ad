"""Fault-injection matrix against simulated tiers: each fault, its documented outcome.

docs/reliability.md lists the same rows; keep them in step.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.backends.circuit import CircuitState
from tests.helpers import (
    API_KEY,
    MODEL,
    GatewayThread,
    Ladder,
    Sim,
    fixed_policy,
    free_port,
    send,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fault_ladder() -> Iterator[Ladder]:
    ladder = Ladder.start()
    yield ladder
    ladder.stop()


@pytest.fixture(autouse=True)
def healthy(fault_ladder: Ladder) -> Iterator[None]:
    yield
    for sim in fault_ladder.sims:
        if sim.process is not None:
            try:
                sim.faults(
                    error_rate=0.0, added_latency_s=0.0, drop_mid_stream=0.0, max_waiting=None
                )
            except OSError:
                sim.stop()  # it refuses connections, the control request included: restart it
        if sim.process is None:
            sim.start()


def settings(ladder: Ladder, **overrides: Any):  # type: ignore[no-untyped-def]
    base = {
        "timeouts": {"connect_s": 1.0, "first_byte_s": 1.0, "total_s": 10.0},
        "resilience": {
            "health_interval_s": 60,
            "failure_threshold": 3,
            "base_ejection_s": 30,
            "queue_timeout_s": 0.5,
        },
    }
    base.update(overrides)
    return ladder.settings(**base)


def chat(
    gw: GatewayThread, *, stream: bool = False, model: str = MODEL, max_tokens: int = 8
) -> tuple[int, dict[str, str], bytes]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    reply = send("POST", f"{gw.url}/v1/chat/completions", body)
    return reply.status, reply.headers, reply.body


def attempts(gw: GatewayThread, tier: str, outcome: str) -> float:
    """Attempts with this outcome on any endpoint of the tier, once the request is recorded."""

    def total() -> float:
        gw.flush()
        return sum(
            sample.value
            for metric in gw.registry.collect()
            for sample in metric.samples
            if sample.name == "tiergate_upstream_attempts_total"
            and sample.labels["tier"] == tier
            and sample.labels["outcome"] == outcome
        )

    deadline = time.monotonic() + 2
    while total() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return total()


def test_tier_down_escalates_up_the_ladder(fault_ladder: Ladder) -> None:
    nvfp4 = fault_ladder.sims[0]
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        nvfp4.stop()
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "w4a16"
        assert attempts(gw, "nvfp4", "connect_error") == 1
        escalations = gw.settled_metric(
            "tiergate_escalations_total",
            {
                "tenant": "default",
                "from_tier": "nvfp4",
                "to_tier": "w4a16",
                "reason": "connect_error",
            },
            1,
        )
        assert escalations == 1


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_after_a_failover_the_probability_header_is_the_serving_tiers(
    fault_ladder: Ladder, stream: bool
) -> None:
    """x-tiergate-p goes with x-tiergate-tier: the tier that served, not the one decided."""
    fault_ladder.sims[0].faults(error_rate=1.0)
    policy = fixed_policy(0, (0.7, 0.9, 1.0))
    with GatewayThread(settings(fault_ladder), policy_factory=policy) as gw:
        status, headers, _ = chat(gw, stream=stream)
        assert status == 200 and headers["x-tiergate-tier"] == "w4a16"
        assert headers["x-tiergate-p"] == "0.9000"


def test_slow_tier_times_out_then_escalates(fault_ladder: Ladder) -> None:
    # A stall far past the bound below: a loaded host may take a second or two more.
    fault_ladder.sims[0].faults(added_latency_s=6.0)
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        started = time.monotonic()
        status, headers, _ = chat(gw, stream=True)
        assert status == 200 and headers["x-tiergate-tier"] == "w4a16"
        assert time.monotonic() - started < 4.0  # first_byte_s = 1, not the 6 s stall
        assert attempts(gw, "nvfp4", "timeout") == 1


def test_a_json_answer_longer_than_first_byte_s_is_no_stall() -> None:
    """vLLM sends a JSON answer's headers when its generation ends: an answer that takes
    longer than first_byte_s (1 s) is served by its tier, not escalated, and no circuit
    counts it (before, such requests ejected every healthy tier)."""
    slow = Ladder.start(extra_args=("--time-scale", "20"))  # 600 tokens take seconds
    try:
        with GatewayThread(settings(slow), policy_factory=fixed_policy(0)) as gw:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 600,
                "ignore_eos": True,
            }
            started = time.monotonic()
            reply = send("POST", f"{gw.url}/v1/chat/completions", body)
            assert reply.status == 200 and reply.headers["x-tiergate-tier"] == "nvfp4"
            assert time.monotonic() - started > 1.0  # longer than first_byte_s
            assert json.loads(reply.body)["usage"]["completion_tokens"] == 600
            assert attempts(gw, "nvfp4", "ok") == 1
            circuits = [e.circuit for t in gw.app.runtime.tiers for e in t.endpoints]
            assert [c.consecutive_failures for c in circuits] == [0, 0, 0]
    finally:
        slow.stop()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_a_client_leaving_before_the_first_byte_aborts_the_upstream(
    fault_ladder: Ladder, stream: bool
) -> None:
    """A request whose client leaves while the tier has not answered yet: the gateway drops
    the upstream request (it waited for the headers, holding the tenant's slot and the
    engine's), blames no endpoint and tries no other tier. A JSON request is watched once it
    has waited JSON_WATCH_DELAY_S (0.2 s, noticed by 0.3 s), as vLLM answers one only when it is done."""
    import http.client

    fault_ladder.sims[0].faults(added_latency_s=3.0)
    data = settings(fault_ladder, timeouts={"connect_s": 1.0, "first_byte_s": 10.0}).model_dump(
        mode="json"
    )
    data["tenants"][0]["api_keys"] = [API_KEY]
    data["tenants"][0]["limits"] = {"max_concurrency": 1}
    from gateway.config import parse_settings

    with GatewayThread(parse_settings(data), policy_factory=fixed_policy(0)) as gw:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"authorization": f"Bearer {API_KEY}", "content-type": "application/json"},
        )
        time.sleep(0.4)  # sent, still waiting for the first byte
        conn.close()
        assert attempts(gw, "nvfp4", "client_gone") == 1
        fault_ladder.sims[0].faults(added_latency_s=0.0)
        started = time.monotonic()
        status, headers, _ = chat(gw)  # the slot is free again, long before the 3 s stall
        assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"  # not a 429
        assert time.monotonic() - started < 2.9
        assert attempts(gw, "w4a16", "client_gone") + attempts(gw, "w4a16", "ok") == 0


def test_5xx_burst_escalates_and_opens_the_circuit(fault_ladder: Ladder) -> None:
    nvfp4 = fault_ladder.sims[0]
    nvfp4.faults(error_rate=1.0)
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        for _ in range(3):
            status, headers, _ = chat(gw)
            assert status == 200 and headers["x-tiergate-tier"] == "w4a16"
        seen = nvfp4.stats()["requests"]
        for _ in range(3):
            status, headers, _ = chat(gw)
            assert status == 200 and headers["x-tiergate-tier"] == "w4a16"
        assert nvfp4.stats()["requests"] == seen  # ejected: not even tried
        assert attempts(gw, "nvfp4", "status_5xx") == 3
        with urllib.request.urlopen(f"{gw.url}/ready", timeout=5) as response:
            ready = json.loads(response.read())  # ready: other tiers serve
        assert ready["ready"] is True and ready["tiers"]["nvfp4"] is False
        assert (
            gw.metric_at_least(
                "tiergate_circuit_state", {"tier": "nvfp4", "endpoint": f"{nvfp4.url}/v1"}, 2
            )
            == 2
        )


def test_a_request_every_engine_fails_on_ejects_nobody(fault_ladder: Ladder) -> None:
    """An engine 500 on every endpoint tried blames the request, not the endpoints: the
    client gets one clear 502 and no circuit opens however often it is sent (one client's
    poisoned request must not take the tiers down)."""
    for sim in fault_ladder.sims:
        sim.faults(error_rate=1.0)
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        for _ in range(6):  # twice the failure threshold
            status, _, body = chat(gw)
            assert status == 502
            assert "none is blamed" in json.loads(body)["error"]["message"]
        for tier in ("nvfp4", "w4a16", "bf16"):
            assert attempts(gw, tier, "status_5xx") == 6
        for sim in fault_ladder.sims:
            sim.faults(error_rate=0.0)
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"  # still in service


def test_the_openai_sdk_does_not_retry_a_request_every_engine_fails_on(
    fault_ladder: Ladder,
) -> None:
    """The SDK retries every 5xx unless `x-should-retry: false` says not to; a request that
    failed alike on every endpoint would fail alike again, once per tier and per retry."""
    from openai import InternalServerError, OpenAI

    for sim in fault_ladder.sims:
        sim.faults(error_rate=1.0)
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        client = OpenAI(base_url=f"{gw.url}/v1", api_key=API_KEY, max_retries=2, timeout=20)
        with pytest.raises(InternalServerError) as raised:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8
            )
        assert raised.value.status_code == 502
        assert raised.value.response.headers["x-should-retry"] == "false"
        for tier in ("nvfp4", "w4a16", "bf16"):
            assert attempts(gw, tier, "status_5xx") == 1  # one try per tier, no SDK retry


def test_two_broken_tiers_are_ejected_while_the_top_serves(fault_ladder: Ladder) -> None:
    """Engine 500s from two tiers while the top tier serves the same requests: the 500s were
    the endpoints' own, so their circuits count them and open."""
    for sim in fault_ladder.sims[:2]:
        sim.faults(error_rate=1.0)
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        for _ in range(3):  # the failure threshold
            status, headers, _ = chat(gw)
            assert status == 200 and headers["x-tiergate-tier"] == "bf16"
        seen = [sim.stats()["requests"] for sim in fault_ladder.sims[:2]]
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "bf16"
        assert [sim.stats()["requests"] for sim in fault_ladder.sims[:2]] == seen  # ejected


def test_a_dropped_responses_stream_ends_with_the_error_event_the_sdk_knows(
    fault_ladder: Ladder,
) -> None:
    """The official SDK reads the gateway's last event as a ResponseErrorEvent (type
    `error`), the event an OpenAI Responses stream ends with when it fails."""
    from openai import OpenAI
    from openai.types.responses import ResponseErrorEvent

    # Past its first output: a stream cut before it fails over to the next tier instead.
    fault_ladder.sims[0].faults(drop_mid_stream=1.0, drop_after_chunks=5)
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        client = OpenAI(base_url=f"{gw.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)
        events = list(
            client.responses.create(model=MODEL, input="hello", max_output_tokens=50, stream=True)
        )
        assert events[0].type == "response.created"  # the stream had started
        last = events[-1]
        assert isinstance(last, ResponseErrorEvent) and last.code == "upstream_failed"
        assert last.sequence_number == events[-2].sequence_number + 1
        labels = {"tenant": "default", "tier": "nvfp4"}
        assert gw.settled_metric("tiergate_stream_errors_total", labels, 1) == 1


def test_drop_mid_stream_ends_with_an_error_event(fault_ladder: Ladder) -> None:
    fault_ladder.sims[0].faults(drop_mid_stream=1.0)
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        status, headers, body = chat(gw, stream=True, max_tokens=50)
        assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"
        events = [e for e in body.split(b"\n\n") if e]
        assert events[0].startswith(b'data: {"id"')  # the stream had started
        last = json.loads(events[-1].removeprefix(b"data: "))
        assert last["error"]["type"] == "upstream_error"
        assert b"[DONE]" not in body
        assert (
            gw.settled_metric(
                "tiergate_stream_errors_total", {"tenant": "default", "tier": "nvfp4"}, 1
            )
            == 1
        )
        # A stream cut after its first byte is the endpoint's failure: its circuit counts it.
        assert gw.app.runtime.tiers[0].endpoints[0].circuit.consecutive_failures == 1
        # Its usage never came: no cost was counted, and the gap is shown, not hidden.
        labels = {"tenant": "default", "tier": "nvfp4"}
        assert gw.settled_metric("tiergate_unmetered_requests_total", labels, 1) == 1
        assert gw.metric("tiergate_estimated_cost_total", labels) == 0
        status, headers, _ = chat(gw, max_tokens=5)  # a whole JSON answer reports usage
        assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"
        deadline = time.monotonic() + 5  # recorded just after the last byte is sent
        while time.monotonic() < deadline and not gw.metric("tiergate_prompt_tokens_total", labels):
            time.sleep(0.01)
        assert gw.metric("tiergate_prompt_tokens_total", labels) > 0
        assert gw.metric("tiergate_unmetered_requests_total", labels) == 1


def test_refused_connections_escalate(fault_ladder: Ladder) -> None:
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        # After start-up, so the failure is met by a request, not by the health check.
        fault_ladder.sims[0].faults(refuse_connections=True)
        time.sleep(0.2)  # the simulator drops the connections it holds, pooled ones too
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "w4a16"
        assert attempts(gw, "nvfp4", "connect_error") >= 1


def test_a_saturated_half_open_trial_does_not_keep_the_endpoint_out(
    fault_ladder: Ladder,
) -> None:
    """The one half-open trial after an ejection meets a full engine (503): no verdict, but
    the trial is over, so the next request may try again (the trial stayed 'in flight' for
    good and the endpoint stayed ejected)."""
    nvfp4 = fault_ladder.sims[0]
    resilience = {"health_interval_s": 60, "failure_threshold": 3, "base_ejection_s": 0.5}
    with GatewayThread(
        settings(fault_ladder, resilience=resilience), policy_factory=fixed_policy(0)
    ) as gw:
        nvfp4.faults(error_rate=1.0)
        for _ in range(3):
            assert chat(gw)[1]["x-tiergate-tier"] == "w4a16"  # escalated; ejected after 3
        nvfp4.faults(error_rate=0.0, max_waiting=0)  # answers 503 at once
        # The third failure opens the circuit once w4a16's answer is sent, so the 0.5 s
        # ejection starts a moment after the client has it: wait for its end, not 0.6 s.
        circuit = gw.app.runtime.tiers[0].endpoints[0].circuit
        assert wait_for(lambda: circuit.observed_state is CircuitState.HALF_OPEN)
        assert chat(gw)[1]["x-tiergate-tier"] == "w4a16"
        assert attempts(gw, "nvfp4", "saturated") == 1
        nvfp4.faults(max_waiting=None)
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"


def test_saturated_tier_escalates_and_all_saturated_is_429(fault_ladder: Ladder) -> None:
    for sim in fault_ladder.sims[:2]:
        sim.faults(max_waiting=0)  # answers 503 at once
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "bf16"
        assert attempts(gw, "nvfp4", "saturated") == 1 and attempts(gw, "w4a16", "saturated") == 1
        fault_ladder.sims[2].faults(max_waiting=0)
        started = time.monotonic()
        status, headers, body = chat(gw)
        assert status == 429 and headers["retry-after"] == "1"
        assert headers["retry-after-ms"] == "1000"
        assert json.loads(body)["error"]["code"] == "tiers_saturated"
        assert time.monotonic() - started < 3  # bounded wait, no hang
        assert (
            gw.settled_metric(
                "tiergate_rejections_total", {"tenant": "default", "reason": "tiers_saturated"}, 1
            )
            == 1
        )


def test_pinned_request_does_not_escalate(fault_ladder: Ladder) -> None:
    fault_ladder.sims[0].faults(error_rate=1.0)
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        status, _, body = chat(gw, model=f"{MODEL}@nvfp4")
        assert status == 502
        assert json.loads(body)["error"]["type"] == "upstream_error"


def test_second_endpoint_of_the_same_tier_is_tried_first(fault_ladder: Ladder) -> None:
    spare = Sim("nvfp4", free_port(), f"{MODEL}-nvfp4").start()
    try:
        data = settings(fault_ladder).model_dump(mode="json")
        data["tiers"][0]["endpoints"] = [f"http://127.0.0.1:{free_port()}/v1", f"{spare.url}/v1"]
        data["tenants"][0]["api_keys"] = [API_KEY]
        from gateway.config import parse_settings

        with GatewayThread(parse_settings(data), policy_factory=fixed_policy(0)) as gw:
            status, headers, _ = chat(gw)
            assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"
            assert spare.stats()["requests"] == 1
    finally:
        spare.stop()


def test_degrade_under_saturation_respects_the_floor(fault_ladder: Ladder) -> None:
    for sim in fault_ladder.sims[1:]:
        sim.faults(max_waiting=0)
    probabilities = (0.7, 0.9, 1.0)
    data = settings(fault_ladder).model_dump(mode="json")
    data["tenants"][0].update(
        api_keys=[API_KEY], degrade_under_saturation=True, degrade_min_probability=0.6
    )
    from gateway.config import parse_settings

    with GatewayThread(parse_settings(data), policy_factory=fixed_policy(1, probabilities)) as gw:
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"
        assert headers["x-tiergate-p"] == "0.7000"  # the served tier's, not w4a16's 0.9
    data["tenants"][0]["degrade_min_probability"] = 0.8  # nvfp4's 0.7 no longer qualifies
    with GatewayThread(parse_settings(data), policy_factory=fixed_policy(1, probabilities)) as gw:
        status, _, _ = chat(gw)
        assert status == 429


def one_slot_each(ladder: Ladder, queue_timeout_s: float):  # type: ignore[no-untyped-def]
    """One request in flight per endpoint, a queue of `queue_timeout_s`, health checks off."""
    from gateway.config import parse_settings

    resilience = {"queue_timeout_s": queue_timeout_s, "health_interval_s": 60}
    data = settings(ladder, resilience=resilience).model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    for tier in data["tiers"]:
        tier["max_inflight_per_endpoint"] = 1
    return parse_settings(data)


def test_full_tier_queues_briefly_instead_of_failing(fault_ladder: Ladder) -> None:
    fault_ladder.sims[2].faults(added_latency_s=0.5)
    from concurrent.futures import ThreadPoolExecutor

    with (
        GatewayThread(one_slot_each(fault_ladder, 5.0), policy_factory=fixed_policy(2)) as gw,
        ThreadPoolExecutor(3) as pool,
    ):
        results = list(pool.map(lambda _: chat(gw), range(3)))
        assert [status for status, _, _ in results] == [200, 200, 200]
        assert all(headers["x-tiergate-tier"] == "bf16" for _, headers, _ in results)


def test_a_request_whose_tier_has_no_usable_endpoint_queues_where_a_slot_can_free(
    fault_ladder: Ladder,
) -> None:
    """Routed to w4a16, which is out (health checks failed), while bf16's only slot is
    busy: it waits in bf16's queue and is served when that slot frees. It waited in
    w4a16's, which no slot ever frees, and got a 429 after the whole queue_timeout_s."""
    from concurrent.futures import ThreadPoolExecutor

    fault_ladder.sims[2].faults(added_latency_s=0.6)
    with (
        GatewayThread(one_slot_each(fault_ladder, 3.0), policy_factory=fixed_policy(1)) as gw,
        ThreadPoolExecutor(1) as pool,
    ):
        time.sleep(0.3)  # the first health round is over
        gw.app.runtime.tiers[1].endpoints[0].healthy = False
        bf16 = gw.app.runtime.tiers[2].endpoints[0]
        holder = pool.submit(chat, gw)  # bf16's only slot, for 0.6 s
        assert wait_for(lambda: bf16.inflight == 1)  # else this request takes the slot
        started = time.monotonic()
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "bf16"  # not the queue's 429
        assert time.monotonic() - started < 2.9  # its queue_timeout_s is 3
        assert holder.result()[0] == 200


def test_a_slot_whose_endpoint_is_ejected_before_the_waiter_runs_is_not_used(
    fault_ladder: Ladder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue hands bf16's slot over, and in that loop turn the endpoint's circuit opens.
    Sent anyway, the request's success closed the circuit without a half-open trial (and
    the endpoint ran past its one slot): the waiter gives the slot back and, with no other
    endpoint, gets the queue's 429."""
    from concurrent.futures import ThreadPoolExecutor

    from gateway.backends.tier import EndpointState, TierBackend

    async def handed_then_ejected(
        self: TierBackend, timeout_s: float, left: object = None
    ) -> EndpointState:
        state = self.endpoints[0]
        while state.circuit.state is not CircuitState.OPEN:
            state.circuit.on_failure()  # another request's failures, in the same turn
        return state

    fault_ladder.sims[2].faults(added_latency_s=0.6)
    with (
        GatewayThread(one_slot_each(fault_ladder, 3.0), policy_factory=fixed_policy(2)) as gw,
        ThreadPoolExecutor(1) as pool,
    ):
        bf16 = gw.app.runtime.tiers[2].endpoints[0]
        holder = pool.submit(chat, gw)  # bf16's only slot, for 0.6 s
        assert wait_for(lambda: bf16.inflight == 1)  # else this request takes the slot
        before = fault_ladder.sims[2].stats()["requests"]
        monkeypatch.setattr(TierBackend, "wait_for_slot", handed_then_ejected)
        status, _, _ = chat(gw)
        assert status == 429  # nothing else could serve it
        assert bf16.circuit.state is CircuitState.OPEN  # no success closed it
        assert fault_ladder.sims[2].stats()["requests"] == before  # and nothing was sent
        assert holder.result()[0] == 200


def chat_sent(gw: GatewayThread, model: str) -> Any:
    """An http.client connection whose chat request has been sent, its answer not read:
    the test decides when to read it, or to leave."""
    import http.client

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    connection = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
    return connection


def test_a_client_that_leaves_while_queued_is_never_sent_upstream(fault_ladder: Ladder) -> None:
    """A JSON request waiting in a full tier's queue whose client leaves: when the slot
    frees, it is not sent (it was, and held the engine and the tenant's slot for nobody)."""
    data = settings(
        fault_ladder,
        resilience={"queue_timeout_s": 5.0, "health_interval_s": 60},
        timeouts={"connect_s": 1.0, "first_byte_s": 5.0, "total_s": 10.0},
    ).model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    data["tenants"][0]["limits"] = {"max_concurrency": 2}
    for tier in data["tiers"]:
        tier["max_inflight_per_endpoint"] = 1
    nvfp4 = fault_ladder.sims[0]
    from gateway.config import parse_settings

    with GatewayThread(parse_settings(data), policy_factory=fixed_policy(0)) as gw:
        before = nvfp4.stats()["requests"]
        nvfp4.faults(added_latency_s=1.0)
        first = chat_sent(gw, f"{MODEL}@nvfp4")
        endpoint, admission = gw.app.runtime.tiers[0].endpoints[0], gw.app.admission
        assert wait_for(lambda: endpoint.inflight == 1)  # the first request holds the only slot
        queued = chat_sent(gw, f"{MODEL}@nvfp4")
        time.sleep(0.4)  # queued, and watched for leaving (after JSON_WATCH_DELAY_S)
        queued.close()
        assert first.getresponse().status == 200
        first.close()
        time.sleep(0.5)  # when the queued request would have gone upstream
        assert nvfp4.stats()["requests"] - before == 1
        # Both requests give their slots back just after their last byte: a leak stays 1.
        assert wait_for(lambda: endpoint.inflight == 0 and admission.inflight["default"] == 0)
        # Counted as a departure although no tier served it.
        left = {"tenant": "default", "tier": "_none"}
        assert gw.settled_metric("tiergate_client_disconnects_total", left, 1) == 1
        assert gw.metric("tiergate_unmetered_requests_total", left) == 0  # no tier served it


def test_a_client_that_leaves_a_json_request_the_engine_has_counts_it_unmetered_there(
    fault_ladder: Ladder,
) -> None:
    """The engine generated for it until the abort, and its usage never came: the tier
    that began to serve it is named, and the request counts as unmetered there (a stream
    left the same way already was; the JSON one went to tier `_none`, in no cost)."""
    nvfp4 = fault_ladder.sims[0]
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        before = nvfp4.stats()["requests"]
        nvfp4.faults(added_latency_s=3.0)
        client = chat_sent(gw, MODEL)
        assert wait_for(lambda: nvfp4.stats()["requests"] == before + 1)  # the engine has it
        time.sleep(0.4)  # past JSON_WATCH_DELAY_S: the gateway watches for the departure
        client.close()
        left = {"tenant": "default", "tier": "nvfp4"}
        assert gw.settled_metric("tiergate_client_disconnects_total", left, 1) == 1
        assert gw.metric("tiergate_unmetered_requests_total", left) == 1
        requests = {**left, "endpoint": "chat", "status": "499"}
        assert gw.metric("tiergate_requests_total", requests) == 1


def test_a_client_that_leaves_after_a_failover_counts_at_the_tier_that_had_it(
    fault_ladder: Ladder,
) -> None:
    """The decided tier refused the connection and the next one had the request when the
    client left: the 499 and its unmetered generation are that next tier's, not the one
    that never had it."""
    import http.client

    nvfp4, w4a16 = fault_ladder.sims[0], fault_ladder.sims[1]
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    with GatewayThread(settings(fault_ladder), policy_factory=fixed_policy(0)) as gw:
        nvfp4.faults(refuse_connections=True)
        time.sleep(0.2)  # the simulator drops the connections it holds, pooled ones too
        before = w4a16.stats()["requests"]
        w4a16.faults(added_latency_s=3.0)
        client = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
        client.request("POST", "/v1/chat/completions", body=body, headers=headers)
        assert wait_for(lambda: w4a16.stats()["requests"] == before + 1)  # w4a16 has it
        time.sleep(0.4)  # past JSON_WATCH_DELAY_S: the gateway watches for the departure
        client.close()
        left = {"tenant": "default", "tier": "w4a16"}
        assert gw.settled_metric("tiergate_client_disconnects_total", left, 1) == 1
        assert gw.metric("tiergate_unmetered_requests_total", left) == 1
        never_had_it = {"tenant": "default", "tier": "nvfp4"}
        assert gw.metric("tiergate_client_disconnects_total", never_had_it) == 0


def test_a_slot_freed_by_a_request_from_before_a_reload_wakes_the_queue(
    fault_ladder: Ladder,
) -> None:
    """A reload builds new tiers; a request that started before it frees its slot on the
    endpoint, whose queue is now the new tier's (it woke the old tier's, where nobody waits,
    and the queued request waited out queue_timeout_s for a 429)."""
    fault_ladder.sims[2].faults(added_latency_s=0.5)
    from concurrent.futures import ThreadPoolExecutor

    config = one_slot_each(fault_ladder, 4.0)
    with (
        GatewayThread(config, policy_factory=fixed_policy(2)) as gw,
        ThreadPoolExecutor(1) as pool,
    ):
        first = pool.submit(chat, gw)
        time.sleep(0.2)  # the first request holds the only slot
        gw.loop.call_soon_threadsafe(gw.app.reload, one_slot_each(fault_ladder, 4.0))
        time.sleep(0.05)
        status, headers, _ = chat(gw)  # queues on the reloaded tier
        assert first.result()[0] == 200
        assert status == 200 and headers["x-tiergate-tier"] == "bf16"


def test_a_request_queued_before_a_reload_is_woken_by_the_slot_freed_after_it(
    fault_ladder: Ladder,
) -> None:
    """A request queued on a tier that a reload replaces: the slot freed after the reload
    wakes the new tier's queue, where it now waits (it stayed on the old one, which nothing
    wakes any more, and waited out queue_timeout_s for a 429 beside a free slot)."""
    fault_ladder.sims[2].faults(added_latency_s=0.6)
    from concurrent.futures import ThreadPoolExecutor

    config = one_slot_each(fault_ladder, 4.0)
    with (
        GatewayThread(config, policy_factory=fixed_policy(2)) as gw,
        ThreadPoolExecutor(2) as pool,
    ):
        first = pool.submit(chat, gw)
        time.sleep(0.2)  # the first request holds the only slot
        started = time.monotonic()
        queued = pool.submit(chat, gw)  # queues on the running tier
        time.sleep(0.1)
        assert gw.loop is not None
        gw.loop.call_soon_threadsafe(gw.app.reload, one_slot_each(fault_ladder, 4.0))
        assert first.result()[0] == 200
        status, headers, _ = queued.result()
        assert status == 200 and headers["x-tiergate-tier"] == "bf16"
        assert time.monotonic() - started < 3.0


def test_a_request_queued_across_a_reload_goes_out_under_the_tiers_new_served_name(
    fault_ladder: Ladder,
) -> None:
    """A reload moves a tier to an engine serving another `--served-model-name`: a request
    queued before it is handed the new engine's slot and sent under the new tier's name,
    answered under the public one (it went out under the old name and got a 404)."""
    from concurrent.futures import ThreadPoolExecutor

    from gateway.config import parse_settings

    fault_ladder.sims[2].faults(added_latency_s=0.6)
    moved = one_slot_each(fault_ladder, 4.0).model_dump(mode="json")
    engine = Sim("bf16", free_port(), "bf16-renamed").start()
    moved["tiers"][2].update(endpoints=[f"{engine.url}/v1"], served_model_name="bf16-renamed")
    try:
        with (
            GatewayThread(one_slot_each(fault_ladder, 4.0), policy_factory=fixed_policy(2)) as gw,
            ThreadPoolExecutor(2) as pool,
        ):
            first = pool.submit(chat, gw)
            time.sleep(0.2)  # the first request holds the only slot
            queued = pool.submit(chat, gw)
            time.sleep(0.1)
            assert gw.loop is not None
            gw.loop.call_soon_threadsafe(gw.app.reload, parse_settings(moved))
            assert first.result()[0] == 200
            status, headers, body = queued.result()
            assert status == 200 and headers["x-tiergate-tier"] == "bf16", body
            assert json.loads(body)["model"] == MODEL
            assert engine.stats()["requests"] == 1
    finally:
        engine.stop()


def test_ready_is_503_while_no_tier_is_usable() -> None:
    from gateway.config import parse_settings

    nowhere = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]  # nothing listens
    config = parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": "nvfp4", "precision": "nvfp4", "endpoints": [nowhere[0]]},
                {"name": "bf16", "precision": "bf16", "endpoints": [nowhere[1]]},
            ],
            "tenants": [{"name": "t", "api_keys": [API_KEY]}],
            "resilience": {"health_interval_s": 0.2},
        }
    )

    def ready() -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"{gw.url}/ready", timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    with GatewayThread(config, policy_factory=fixed_policy(0)) as gw:
        deadline = time.monotonic() + 5
        while ready()[0] != 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready() == (503, {"ready": False, "tiers": {"nvfp4": False, "bf16": False}})


def test_health_checks_take_endpoints_out_and_back(fault_ladder: Ladder) -> None:
    data = settings(fault_ladder, resilience={"health_interval_s": 0.2}).model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    from gateway.config import parse_settings

    nvfp4 = fault_ladder.sims[0]
    labels = {"tier": "nvfp4", "endpoint": f"{nvfp4.url}/v1"}

    def wait_for(value: float) -> float:
        deadline = time.monotonic() + 5
        while gw.metric("tiergate_backend_up", labels) != value and time.monotonic() < deadline:
            time.sleep(0.05)
        return gw.metric("tiergate_backend_up", labels)

    with GatewayThread(parse_settings(data), policy_factory=fixed_policy(0)) as gw:
        assert wait_for(1.0) == 1.0
        nvfp4.stop()
        assert wait_for(0.0) == 0.0
        status, headers, _ = chat(gw)  # not even attempted: the health check took it out
        assert status == 200 and headers["x-tiergate-tier"] == "w4a16"
        assert attempts(gw, "nvfp4", "connect_error") == 0
        escalation = {"tenant": "default", "from_tier": "nvfp4", "to_tier": "w4a16"}
        assert (
            gw.settled_metric(
                "tiergate_escalations_total", {**escalation, "reason": "unavailable"}, 1
            )
            == 1
        )
        assert gw.metric("tiergate_escalations_total", {**escalation, "reason": "ok"}) == 0
        with urllib.request.urlopen(f"{gw.url}/ready", timeout=5) as response:
            assert json.loads(response.read())["tiers"]["nvfp4"] is False
        nvfp4.start()
        assert wait_for(1.0) == 1.0
        status, headers, _ = chat(gw)
        assert status == 200 and headers["x-tiergate-tier"] == "nvfp4"


def test_no_healthy_endpoint_is_503_with_retry_after() -> None:
    # Every tier points at a closed port: the start-up health check takes them all out.
    from gateway.config import parse_settings

    data = {
        "model": MODEL,
        "tiers": [
            {"name": p, "precision": p, "endpoints": [f"http://127.0.0.1:{free_port()}/v1"]}
            for p in ("nvfp4", "bf16")
        ],
        "tenants": [{"name": "default", "api_keys": [API_KEY]}],
        "resilience": {"health_interval_s": 60, "retry_after_s": 3},
    }
    with GatewayThread(parse_settings(data)) as gw:
        status, headers, body = chat(gw)
    assert status == 503, body
    assert headers["retry-after"] == "3" and headers["retry-after-ms"] == "3000"
    assert json.loads(body)["error"]["code"] == "service_unavailable"


def test_total_s_bounds_the_request_not_each_attempt() -> None:
    """A first-byte timeout on nvfp4 (2 s) then a long stream on w4a16: the stream ends at
    total_s from the request's start (it ran a whole total_s more), and being cut by the
    request's own deadline is not counted against w4a16's engine."""
    slow = Ladder.start(extra_args=("--time-scale", "20"))  # a stream of many seconds
    try:
        slow.sims[0].faults(added_latency_s=3.0)
        timeouts = {"connect_s": 1.0, "first_byte_s": 2.0, "total_s": 3.0}
        with GatewayThread(settings(slow, timeouts=timeouts), policy_factory=fixed_policy(0)) as gw:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 4000,
                "ignore_eos": True,
                "stream": True,
            }
            started = time.monotonic()
            reply = send("POST", f"{gw.url}/v1/chat/completions", body)
            elapsed = time.monotonic() - started
            assert reply.status == 200 and reply.headers["x-tiergate-tier"] == "w4a16"
            events = [e for e in reply.body.split(b"\n\n") if e]
            last = json.loads(events[-1].removeprefix(b"data: "))
            assert "total" in last["error"]["message"], last
            # 2 s on nvfp4 + the 1 s left, where a per-attempt total_s would take 2 + 3
            assert 2.9 < elapsed < 4.4
            # The circuit hears of the stream's end after its last byte: read it once the
            # stream error is counted (the gateway's last step), or a 1 would be missed.
            labels = {"tenant": "default", "tier": "w4a16"}
            assert gw.metric_at_least("tiergate_stream_errors_total", labels, 1) == 1
            assert gw.app.runtime.tiers[1].endpoints[0].circuit.consecutive_failures == 0
    finally:
        slow.stop()
