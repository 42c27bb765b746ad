"""Tenants' prefix caches at the engines: each isolated tenant in its own namespace (vLLM's
`cache_salt`), so no tenant reuses, or can time, another's cached prompts."""

from __future__ import annotations

import hashlib
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import Settings, parse_settings
from gateway.errors import InvalidRequestError
from gateway.tenants.cache_salt import MAX_CLIENT_SALT_CHARS, client_salt, upstream_cache_salt
from tests.fakes import FakeUpstream, Reply
from tests.helpers import MODEL, GatewayThread, Sim, free_port, send, wait_for

KEYS = {"a": "key-a", "b": "key-b", "shared-1": "key-s1", "shared-2": "key-s2"}
TENANTS = [
    {"name": "a", "api_keys": [KEYS["a"]]},
    {"name": "b", "api_keys": [KEYS["b"]]},
    {"name": "shared-1", "api_keys": [KEYS["shared-1"]], "isolate_prefix_cache": False},
    {"name": "shared-2", "api_keys": [KEYS["shared-2"]], "isolate_prefix_cache": False},
]
# Names a tenant may have (config.Name) and salts vLLM accepts.
TENANT_NAMES = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
CLIENT_SALTS = st.text(min_size=1, max_size=MAX_CLIENT_SALT_CHARS).filter(
    lambda s: not set(s) & set("@/\\\0")
)


def ladder(engine_url: str, served: str) -> Settings:
    """The tenants above over two tiers; the tests pin bf16, on `engine_url`."""
    return parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": "nvfp4", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:9/v1"]},
                {
                    "name": "bf16",
                    "precision": "bf16",
                    "endpoints": [engine_url],
                    "served_model_name": served,
                },
            ],
            "tenants": TENANTS,
        }
    )


PINNED = f"{MODEL}@bf16"


def vllm_accepts(salt: str) -> bool:
    """vLLM's `validate_cache_salt`, as the engine applies it."""
    return 0 < len(salt) <= 128 and not set(salt) & set("@/\\\0")


@given(TENANT_NAMES, TENANT_NAMES, st.none() | CLIENT_SALTS, st.none() | CLIENT_SALTS)
def test_no_two_tenants_share_a_namespace_unless_both_share(
    one: str, other: str, one_salt: str | None, other_salt: str | None
) -> None:
    for isolated in (True, False):
        salt = upstream_cache_salt(one, isolated, one_salt)
        assert salt is None or vllm_accepts(salt)
    mine = upstream_cache_salt(one, True, one_salt)
    if one != other:
        # Whatever salt the other tenant's clients send, isolated or not.
        assert mine != upstream_cache_salt(other, True, other_salt)
        assert mine != upstream_cache_salt(other, False, other_salt)
    if one_salt != other_salt:  # a client's own salt splits its tenant's namespace
        assert mine != upstream_cache_salt(one, True, other_salt)


def test_tenants_that_share_share_only_among_themselves() -> None:
    assert upstream_cache_salt("x", False, None) is None  # vLLM's default namespace
    assert upstream_cache_salt("x", False, "team") == upstream_cache_salt("y", False, "team")
    assert upstream_cache_salt("x", True, None) == "x"
    # A client of a sharing tenant naming an isolated tenant's namespace does not reach it.
    assert upstream_cache_salt("y", False, "x") != "x"
    digest = hashlib.sha256(b"team").hexdigest()[:32]
    assert upstream_cache_salt("x", True, "team") == f"x:{digest}"


@pytest.mark.parametrize("bad", ["", "a/b", "a@b", "back\\slash", "nul\0", "s" * 129, 7, ["s"]])
def test_a_salt_vllm_would_refuse_is_refused_here(bad: object) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        client_salt(bad)
    assert refused.value.param == "cache_salt"
    assert client_salt(None) is None and client_salt("s" * 128) == "s" * 128


@pytest.fixture(scope="module")
def faked() -> Iterator[tuple[FakeUpstream, GatewayThread]]:
    with FakeUpstream() as engine:
        engine.reply = Reply(body=b'{"id":"x","model":"served","choices":[]}')
        settings = ladder(engine.url, "served")
        with GatewayThread(settings) as gw:
            yield engine, gw


def sent_salt(
    faked: tuple[FakeUpstream, GatewayThread], tenant: str, **fields: Any
) -> tuple[int, object]:
    """The status, and the cache_salt the engine got ("absent" when none)."""
    engine, gw = faked
    before = len(engine.received)
    body = {"model": PINNED, "messages": [{"role": "user", "content": "hi"}], **fields}
    reply = send("POST", f"{gw.url}/v1/chat/completions", body, key=KEYS[tenant])
    if len(engine.received) == before:
        return reply.status, "not sent"
    return reply.status, engine.last_json().get("cache_salt", "absent")


def test_each_request_carries_its_tenants_namespace(
    faked: tuple[FakeUpstream, GatewayThread],
) -> None:
    assert sent_salt(faked, "a") == (200, "a")
    assert sent_salt(faked, "b") == (200, "b")
    assert sent_salt(faked, "shared-1") == (200, "absent")
    # A client's own salt stays within its tenant; named after another tenant, it is hashed.
    assert sent_salt(faked, "b", cache_salt="a") == (200, upstream_cache_salt("b", True, "a"))
    assert sent_salt(faked, "shared-1", cache_salt="a") == (
        200,
        upstream_cache_salt("shared-1", False, "a"),
    )


def test_a_malformed_salt_is_a_400_that_reaches_no_engine(
    faked: tuple[FakeUpstream, GatewayThread],
) -> None:
    engine, gw = faked
    forwarded = len(engine.received)
    body = {"model": PINNED, "messages": [{"role": "user", "content": "hi"}], "cache_salt": "a/b"}
    reply = send("POST", f"{gw.url}/v1/chat/completions", body, key=KEYS["a"])
    assert reply.status == 400 and reply.json()["error"]["param"] == "cache_salt"
    assert len(engine.received) == forwarded
    assert sent_salt(faked, "a", cache_salt="") == (400, "not sent")


def prefix_hits(sim: Sim) -> float:
    with urllib.request.urlopen(f"{sim.url}/metrics", timeout=10) as response:
        page = response.read().decode()
    for line in page.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no prefix_cache_hits_total on the page")


def test_an_engine_reuses_a_prompt_only_within_its_namespace() -> None:
    """Through the simulator's prefix cache, which keys blocks by cache_salt as vLLM does."""
    sim = Sim("bf16", free_port(), f"{MODEL}-bf16", extra_args=("--prefix-caching",)).start()
    try:
        settings = ladder(f"{sim.url}/v1", sim.served_model_name)
        prompt = "Reconcile the quarterly ledger line by line. " * 40
        body = {"model": PINNED, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}

        def hits_of(tenant: str) -> float:
            before = prefix_hits(sim)
            url = f"{gw.url}/v1/chat/completions"
            assert send("POST", url, body, key=KEYS[tenant]).status == 200
            return prefix_hits(sim) - before

        with GatewayThread(settings) as gw:
            assert hits_of("a") == 0
            assert hits_of("b") == 0  # a's blocks are not b's
            assert hits_of("a") > 0  # a's own are
            assert hits_of("shared-1") == 0
            assert hits_of("shared-2") > 0  # tenants that share do, among themselves
    finally:
        sim.stop()


def test_the_observers_replay_counts_the_hits_the_engine_counts() -> None:
    """The replay keys each sampled prompt by the namespace its request was served in (the
    proxy hands it on with the exchange): with every request sampled, its hit rate is the
    engine's. In one namespace, b's copies of a's prompts read as hits the engine never had."""
    sim = Sim("bf16", free_port(), f"{MODEL}-bf16", extra_args=("--prefix-caching",)).start()
    try:
        settings = ladder(f"{sim.url}/v1", sim.served_model_name)
        observed = {"sample_rate": 1.0, "scrape_interval_s": 60.0, "plan_interval_s": 60.0}
        settings = parse_settings(
            settings.model_dump(mode="json")
            | {"observer": observed, "admin": {"token": "adm"}}
            | {"tenants": TENANTS}  # the dump masks the keys
        )
        prompts = [f"Reconcile ledger {i} line by line. " * 30 for i in range(2)]
        # The engine looks each of n choices up: the second hits the first's blocks.
        sent = [("a", 0, 1), ("b", 0, 2), ("a", 0, 1), ("shared-1", 1, 1), ("shared-2", 1, 3)]
        sent += [("b", 1, 1)]
        with GatewayThread(settings) as gw:
            for tenant, i, n in sent:
                messages = [{"role": "user", "content": prompts[i]}]
                body = {"model": PINNED, "messages": messages, "max_tokens": 2, "n": n}
                assert (
                    send("POST", f"{gw.url}/v1/chat/completions", body, key=KEYS[tenant]).status
                    == 200
                )

            def view() -> Any:
                return send("GET", f"{gw.url}/admin/regime", key="adm").json()

            assert wait_for(lambda: view()["samples"]["processed"] == len(sent), 10.0)
            replayed = view()["tiers"]["bf16"]["rho"]["lru"]
        hits, queries = prefix_counter(sim, "hits"), prefix_counter(sim, "queries")
        assert 0 < hits < queries
        assert replayed == pytest.approx(hits / queries)
    finally:
        sim.stop()


def prefix_counter(sim: Sim, name: str) -> float:
    for line in sim.metrics_text().splitlines():
        if line.startswith(f"vllm:prefix_cache_{name}_total{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no prefix_cache_{name}_total on the page")
