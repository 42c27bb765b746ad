"""What a ticket's release gives back to its tenant's limits: the slot once, and the tokens
the request is known to have used."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import InvalidRequestError, RateLimitError
from gateway.tenants.admission import Admission, Ticket
from gateway.tenants.registry import Tenant
from tests.gateway.tenants.test_limits import registry_with


def _admission(limits: dict[str, object]) -> tuple[Admission, Tenant]:
    tenant = registry_with(limits).tenants["t"]
    admission = Admission()
    admission.configure({"t": tenant})
    return admission, tenant


def _admit(admission: Admission, tenant: Tenant, max_tokens: int) -> Ticket:
    return asyncio.run(admission.admit(tenant, {"max_tokens": max_tokens}, 0, "chat"))


def test_a_ticket_released_twice_gives_its_slot_back_once() -> None:
    admission, tenant = _admission({"max_concurrency": 2})
    first = _admit(admission, tenant, 10)
    _admit(admission, tenant, 10)
    asyncio.run(first.release(5))
    asyncio.run(first.release(5))
    assert admission.inflight["t"] == 1
    _admit(admission, tenant, 10)
    with pytest.raises(RateLimitError, match="concurrent"):
        _admit(admission, tenant, 10)


def test_a_release_without_usage_charges_what_the_stream_is_known_to_have_cost() -> None:
    """No usage arrived, but the relayed events show 900 tokens: 900 are charged, not the
    100 estimated, so 200 more no longer fit a budget of 1,000."""
    admission, tenant = _admission({"tokens_per_minute": 1000})
    ticket = _admit(admission, tenant, 100)
    asyncio.run(ticket.release(None, at_least=900))
    assert admission.inflight["t"] == 0
    with pytest.raises(RateLimitError, match="tokens per minute"):
        _admit(admission, tenant, 200)


def test_reported_usage_is_charged_even_below_what_the_stream_suggested() -> None:
    """Usage the engine reported is the charge: `at_least` only stands in for a missing one."""
    admission, tenant = _admission({"tokens_per_minute": 1000})
    ticket = _admit(admission, tenant, 100)
    asyncio.run(ticket.release(50, at_least=900))
    _admit(admission, tenant, 800)  # 50 used: 950 left


def test_requests_in_flight_are_counted_per_tenant() -> None:
    admission, tenant = _admission({})
    tickets = [_admit(admission, tenant, 10) for _ in range(3)]
    assert admission.inflight["t"] == 3
    asyncio.run(tickets[0].release(5))
    assert admission.inflight["t"] == 2


def _capped(cap: int) -> tuple[Admission, Tenant]:
    return _admission({"max_tokens": cap, "tokens_per_minute": 100_000})


def test_a_capped_key_may_ask_for_its_cap_and_no_more() -> None:
    admission, tenant = _capped(50)
    _admit(admission, tenant, 50)
    with pytest.raises(InvalidRequestError, match="at most 50") as caught:
        _admit(admission, tenant, 51)
    assert caught.value.code == "max_tokens_exceeded"


def test_the_cap_set_on_an_unbounded_request_is_what_it_is_estimated_at() -> None:
    admission, tenant = _capped(30)
    request: dict[str, object] = {"messages": []}
    ticket = asyncio.run(admission.admit(tenant, request, 400, "chat"))
    assert request["max_tokens"] == 30
    assert ticket.estimate == 400 // 4 + 30


def test_a_capped_key_may_not_give_a_responses_request_built_in_tools() -> None:
    """The engine runs them over several turns, each up to max_output_tokens."""
    admission, tenant = _capped(50)
    request: dict[str, Any] = {
        "input": "hi",
        "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}],
    }
    with pytest.raises(InvalidRequestError, match="web_search") as caught:
        asyncio.run(admission.admit(tenant, request, 10, "responses"))
    assert caught.value.param == "tools"
    functions_only: dict[str, Any] = {"input": "hi", "tools": [{"type": "function", "name": "f"}]}
    asyncio.run(admission.admit(tenant, functions_only, 10, "responses"))
