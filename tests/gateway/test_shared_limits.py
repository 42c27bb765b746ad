"""Tenant limits shared by two gateway replicas through a real Redis server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import MODEL, GatewayThread, Ladder, free_port, require_binary, send


@pytest.fixture()
def redis_url(redis_server: tuple[str, subprocess.Popen[bytes]]) -> str:
    return redis_server[0]


@pytest.fixture()
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    binary = require_binary("redis-server")
    port = free_port()
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    import socket

    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0", process
    os.kill(process.pid, signal.SIGCONT)  # a test that stalled it may have failed midway
    process.terminate()
    process.wait(10)


def settings(ladder: Ladder, url: str, limits: dict[str, Any]) -> Any:
    data = ladder.settings().model_dump(mode="json")
    data["tenants"] = [{"name": "shared", "api_keys": ["sk-shared"], "limits": limits}]
    data["shared_limits"] = {"redis_url": url}
    from gateway.config import parse_settings

    return parse_settings(data)


def chat(gw: GatewayThread) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return send("POST", f"{gw.url}/v1/chat/completions", body, key="sk-shared", timeout=20).status


def test_two_replicas_share_one_budget(ladder: Ladder, redis_url: str) -> None:
    config = settings(ladder, redis_url, {"requests_per_second": 0.2, "burst": 4})
    with GatewayThread(config) as first, GatewayThread(config) as second:
        statuses = [chat(gw) for _ in range(4) for gw in (first, second)]
        # One bucket of 4 across both replicas (it refills one request per 5 s).
        assert statuses.count(200) == 4 and statuses.count(429) == 4


def test_shared_concurrency_slots_are_released(ladder: Ladder, redis_url: str) -> None:
    config = settings(ladder, redis_url, {"max_concurrency": 1})
    with GatewayThread(config) as first, GatewayThread(config) as second:
        # Sequential requests never overlap: every one finds the single slot free again, also
        # on the other replica right after the answer (the slot goes back before its last byte).
        assert [chat(gw) for gw in (first, second) * 20] == [200] * 40


def slow_responses_stream(events: int) -> Any:
    """An upstream Responses stream of `events` deltas, 0.05 s apart."""
    from tests.fakes import Reply

    delta = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n'
    return Reply(pieces=[delta] * events, piece_interval_s=0.05, content_type=b"text/event-stream")


def one_slot_shared(upstream_url: str, redis_url: str) -> Any:
    """Two tiers on `upstream_url`; tenant `shared` (key sk-shared) may run one request at a
    time, counted in Redis."""
    from gateway.config import parse_settings

    return parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": tier, "precision": tier, "endpoints": [upstream_url]}
                for tier in ("w4a16", "bf16")
            ],
            "tenants": [
                {"name": "shared", "api_keys": ["sk-shared"], "limits": {"max_concurrency": 1}}
            ],
            "shared_limits": {"redis_url": redis_url},
        }
    )


def read_cut_stream(url: str) -> None:
    """Reads a Responses stream that the gateway's shutdown cuts short."""
    body = {"model": MODEL, "input": "hi", "stream": True}
    with contextlib.suppress(http.client.HTTPException):  # the cut: no last chunk
        send("POST", url, body, key="sk-shared", timeout=20)


def test_a_stream_cut_by_the_shutdown_gives_its_shared_slot_back(redis_url: str) -> None:
    """Past the graceful shutdown's limit a stream's task is cancelled, and the event loop's
    close cancels its release to Redis again: the slot stayed taken for the longest request
    (900 s), and every other replica refused the tenant for that long."""
    import redis

    from tests.fakes import FakeUpstream

    with FakeUpstream(slow_responses_stream(60)) as upstream:
        gw = GatewayThread(one_slot_shared(upstream.url, redis_url))
        gw.server.config.timeout_graceful_shutdown = 1
        with gw:
            reader = threading.Thread(target=read_cut_stream, args=(f"{gw.url}/v1/responses",))
            reader.start()
            inflight = redis.Redis.from_url(redis_url)
            deadline = time.monotonic() + 5
            while inflight.zcard("tiergate:shared:inflight") == 0:
                assert time.monotonic() < deadline, "the stream never took its slot"
                time.sleep(0.05)
        reader.join(10)
        assert inflight.zcard("tiergate:shared:inflight") == 0


def test_an_admission_run_late_by_a_stalled_redis_gives_its_slot_back(
    redis_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """Redis stalls (a slow fork, a pause): the admission times out and the replica admits
    locally, but Redis runs the queued script when it resumes. Its concurrency slot must
    not then lock the tenant out for the longest request (900 s by default)."""
    import redis.asyncio

    from gateway.errors import RateLimitError
    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    url, process = redis_server

    async def scenario() -> None:
        client = redis.asyncio.from_url(url, socket_timeout=0.2, socket_connect_timeout=0.2)
        limiter = SharedLimiter(client, "stalled", TenantLimits(max_concurrency=1))
        # A connection already open and the script loaded, as on a replica serving traffic.
        await limiter.release(await limiter.admit(10), 10, 10)
        os.kill(process.pid, signal.SIGSTOP)
        try:
            assert await limiter.admit(10) is None  # timed out: admitted by the local limits
        finally:
            os.kill(process.pid, signal.SIGCONT)
        await limiter.release(None, 10, 10)
        deadline = time.monotonic() + 5
        hold = None
        while hold is None and time.monotonic() < deadline:
            try:
                hold = await limiter.admit(10)
            except RateLimitError:  # the late admission's slot, until it is removed
                await asyncio.sleep(0.1)
        assert hold is not None
        await client.aclose()

    asyncio.run(scenario())


def test_a_slot_whose_release_failed_is_given_back_once_redis_answers(redis_url: str) -> None:
    """The release of a shared admission fails (Redis unreachable for a moment): its slot
    stayed in Redis and refused the tenant's next request for the longest request (900 s)."""
    import redis.asyncio

    from gateway.errors import RateLimitError
    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    async def unreachable(**_: object) -> None:
        raise redis.exceptions.ConnectionError("Connection refused")

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limiter = SharedLimiter(client, "cut", TenantLimits(max_concurrency=1))
        hold = await limiter.admit(10)
        assert hold is not None
        release, limiter._release = limiter._release, unreachable
        await limiter.release(hold, 10, 10)
        limiter._release = release  # Redis answers again
        deadline = time.monotonic() + 5
        again = None
        while again is None and time.monotonic() < deadline:
            try:
                again = await limiter.admit(10)
            except RateLimitError:  # the slot, until it is removed in the background
                await asyncio.sleep(0.1)
        assert again is not None
        await client.aclose()

    asyncio.run(scenario())


def test_a_burst_below_one_request_admits_as_the_local_limiter_does(redis_url: str) -> None:
    """burst 0.5 at 2 per second: in process a full bucket admits a request (as a token
    budget smaller than a request does); the shared script refused every request."""
    import redis.asyncio

    from gateway.errors import RateLimitError
    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limiter = SharedLimiter(client, "half", TenantLimits(requests_per_second=2, burst=0.5))
        assert await limiter.admit(1) is not None
        with pytest.raises(RateLimitError):
            await limiter.admit(1)  # the bucket refills for 0.5 s first
        await asyncio.sleep(0.6)
        assert await limiter.admit(1) is not None
        await client.aclose()

    asyncio.run(scenario())


def test_a_token_debt_longer_than_an_hour_is_kept_until_paid_back(redis_url: str) -> None:
    """A request that used 100 times the per-minute budget owes 99 minutes, as in process;
    the bucket's key expired after an hour and the tenant came back to a full budget."""
    import redis.asyncio

    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limiter = SharedLimiter(client, "deep", TenantLimits(tokens_per_minute=1000))
        hold = await limiter.admit(500)
        await limiter.release(hold, 500, used_tokens=100_000)
        level = float(await client.hget("tiergate:deep:tpm", "level") or 0)
        payback_s = (1000 - level) / (1000 / 60)
        assert payback_s > 5900
        assert await client.ttl("tiergate:deep:tpm") >= payback_s
        await client.aclose()

    asyncio.run(scenario())


def test_unreachable_redis_falls_back_to_local_limits(ladder: Ladder) -> None:
    config = settings(
        ladder, f"redis://127.0.0.1:{free_port()}/0", {"requests_per_second": 0.2, "burst": 2}
    )
    with GatewayThread(config) as gw:
        assert [chat(gw) for _ in range(3)] == [200, 200, 429]


def test_a_redis_url_without_the_redis_package_is_a_config_error(
    ladder: Ladder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image built without the redis extra, given TIERGATE_REDIS_URL: one clear error
    naming the extra, not an ImportError traceback in a restarting pod."""
    import sys

    from gateway.app import build_app
    from gateway.config import ConfigError

    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis.asyncio` now fails
    config = settings(ladder, "redis://127.0.0.1:6379/0", {"requests_per_second": 1})
    with pytest.raises(ConfigError, match=r"pip install 'tiergate\[redis\]'"):
        build_app(config, environ={})


def test_after_a_failure_admissions_keep_to_the_local_limits_for_a_while() -> None:
    """A stalled Redis costs each admission that asks it the socket timeout (about 0.5 s):
    after one fails, the replica admits by its own limits for REDIS_RETRY_S, then asks
    Redis again."""
    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import REDIS_RETRY_S, SharedLimiter

    asked: list[int] = []

    class Stalled:
        def register_script(self, _: str) -> Any:
            async def script(**_: object) -> None:
                asked.append(1)
                raise TimeoutError("Timeout reading from socket")

            return script

    now = [100.0]
    limiter = SharedLimiter(
        Stalled(), "t", TenantLimits(requests_per_second=100.0), clock=lambda: now[0]
    )

    async def scenario() -> None:
        for _ in range(5):
            assert await limiter.admit(10) is None  # admitted by the local limits
        assert len(asked) == 1
        now[0] += REDIS_RETRY_S + 0.01
        assert await limiter.admit(10) is None
        assert len(asked) == 2
        assert limiter.local.inflight == 6

    asyncio.run(scenario())


def test_a_redis_clock_stepped_back_does_not_drain_the_buckets(redis_url: str) -> None:
    """Redis' TIME is a wall clock: after it steps back (NTP, a failover to a replica whose
    clock is behind) a bucket's `updated` lies in the future. The refill went negative: a
    bucket holding 9 of 10 requests refused the tenant for the whole step (Retry-After 59 s),
    and a token budget's release drained it as well."""
    import redis.asyncio

    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limits = TenantLimits(requests_per_second=10, burst=10, tokens_per_minute=600)
        limiter = SharedLimiter(client, "skewed", limits)
        hold = await limiter.admit(100)
        seconds, micros = await client.time()
        ahead = seconds + micros / 1e6 + 60  # written by a clock 60 s ahead of this one
        for kind in ("rps", "tpm"):
            await client.hset(f"tiergate:skewed:{kind}", "updated", ahead)
        await limiter.release(hold, 100, used_tokens=50)  # 50 tokens back: 550 left
        assert float(await client.hget("tiergate:skewed:tpm", "level") or 0) == 550
        await client.hset("tiergate:skewed:tpm", "updated", ahead)
        assert await limiter.admit(100) is not None
        await client.aclose()

    asyncio.run(scenario())


def test_a_shared_tickets_release_corrects_the_charge_with_its_usage(redis_url: str) -> None:
    """An estimate of 600 that used 100 gives 500 back to the shared budget, as in process."""
    import redis.asyncio

    from gateway.errors import RateLimitError
    from gateway.tenants.admission import Admission
    from tests.gateway.tenants.test_limits import registry_with

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        tenant = registry_with({"tokens_per_minute": 1000}).tenants["t"]
        admission = Admission(client)
        admission.configure({"t": tenant})
        ticket = await admission.admit(tenant, {"max_tokens": 600}, 0, "chat")
        await ticket.release(100)
        await admission.admit(tenant, {"max_tokens": 800}, 0, "chat")
        with pytest.raises(RateLimitError, match="tokens per minute"):
            await admission.admit(tenant, {"max_tokens": 800}, 0, "chat")
        await client.aclose()

    asyncio.run(scenario())


def test_a_dead_holders_slot_is_freed_a_lease_after_its_last_renewal(redis_url: str) -> None:
    """A replica or worker killed while it holds a slot (kill -9, an OOM kill) never releases
    it: the slot stayed for the longest request (timeouts.total_s, 900 s by default) and the
    tenant got 429 on every replica meanwhile. It now goes once its lease is not renewed."""
    import redis.asyncio

    from gateway.errors import RateLimitError
    from gateway.tenants.admission import Admission
    from tests.gateway.tenants.test_limits import registry_with

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        tenant = registry_with({"max_concurrency": 1}).tenants["t"]
        dying, other = Admission(client, lease_s=0.4), Admission(client, lease_s=0.4)
        for admission in (dying, other):
            admission.configure({"t": tenant})
        renewing = asyncio.get_running_loop().create_task(dying.keep_leases())
        await dying.admit(tenant, {"max_tokens": 10}, 0, "chat")
        await asyncio.sleep(1.0)  # renewed past two leases
        with pytest.raises(RateLimitError, match="concurrent"):
            await other.admit(tenant, {"max_tokens": 10}, 0, "chat")
        renewing.cancel()  # the holder dies: no renewal, no release
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        dead_at = time.monotonic()
        ticket = None
        while ticket is None:
            assert time.monotonic() - dead_at < 3.0, "the dead holder's slot was never freed"
            try:
                ticket = await other.admit(tenant, {"max_tokens": 10}, 0, "chat")
            except RateLimitError:
                await asyncio.sleep(0.05)
        await ticket.release(10)
        await client.aclose()

    asyncio.run(scenario())


def test_a_live_stream_keeps_its_shared_slot_past_the_lease(redis_url: str) -> None:
    """The gateway renews the leases of the slots it holds while their requests run: a
    stream longer than the lease still counts against its tenant on every replica."""
    import redis

    from tests.fakes import FakeUpstream

    with FakeUpstream(slow_responses_stream(80)) as upstream:
        gw = GatewayThread(one_slot_shared(upstream.url, redis_url))
        gw.app.admission.lease_s = 0.4
        gw.app.admission.configure(gw.app.runtime.tenants.tenants)  # as a reload passes it on
        with gw:
            body = {"model": MODEL, "input": "hi", "stream": True}
            url = f"{gw.url}/v1/responses"
            reader = threading.Thread(
                target=send, args=("POST", url, body), kwargs={"key": "sk-shared"}
            )
            reader.start()
            inflight = redis.Redis.from_url(redis_url)

            def slots() -> list[tuple[bytes, float]]:
                """The tenant's slots in Redis, scored by their last renewal."""
                found: Any = inflight.zrange("tiergate:shared:inflight", 0, -1, withscores=True)
                return [(slot, score) for slot, score in found]

            deadline = time.monotonic() + 5
            while not (taken := slots()):
                assert time.monotonic() < deadline, "the stream never took its slot"
                time.sleep(0.05)
            time.sleep(1.2)  # three leases into a 4 s stream
            assert send("POST", url, body, key="sk-shared", timeout=20).status == 429
            [(slot, renewed_at)] = slots()  # renewed every 0.1 s, on Redis' clock
            assert slot == taken[0][0] and renewed_at > taken[0][1] + 0.8
            reader.join(10)
            assert inflight.zcard("tiergate:shared:inflight") == 0


def test_a_renewal_round_that_began_before_a_release_does_not_bring_the_slot_back(
    redis_url: str,
) -> None:
    """A round reads the holds, the request's release reaches Redis, then the round's
    renewal: it must update only the slots still there, or the released slot would count
    against the tenant for another lease."""
    import redis.asyncio

    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limiter = SharedLimiter(client, "raced", TenantLimits(max_concurrency=1))
        hold = await limiter.admit(10)
        assert hold is not None
        released = asyncio.Event()
        renew_script = limiter._renew

        async def after_the_release(**kwargs: Any) -> Any:
            await released.wait()
            return await renew_script(**kwargs)

        limiter._renew = after_the_release
        renewing = asyncio.get_running_loop().create_task(limiter.renew())
        await asyncio.sleep(0)  # the round has read the hold
        await limiter.release(hold, 10, 10)
        released.set()
        await renewing
        assert await client.zcard("tiergate:raced:inflight") == 0
        await client.aclose()

    asyncio.run(scenario())


def test_a_failed_renewal_round_is_logged_and_the_next_one_renews(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis unreachable for a round: the renewal task must outlive it (had it ended, every
    slot this process holds would be pruned a lease later while its requests still run)."""
    import redis.asyncio

    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter, renew_leases

    async def unreachable(**_: object) -> None:
        raise redis.exceptions.ConnectionError("Connection refused")

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limiter = SharedLimiter(client, "flaky", TenantLimits(max_concurrency=1))
        assert await limiter.admit(10) is not None

        async def lease_renewed_at() -> float:
            slots: Any = await client.zrange("tiergate:flaky:inflight", 0, -1, withscores=True)
            return float(slots[0][1])

        taken_at = await lease_renewed_at()
        renew, limiter._renew = limiter._renew, unreachable
        await renew_leases([limiter])  # logs, does not raise
        assert "renewing the concurrency slots of 1 tenants failed" in caplog.text
        limiter._renew = renew
        await asyncio.sleep(0.05)
        await renew_leases([limiter])
        assert await lease_renewed_at() > taken_at
        await client.aclose()

    asyncio.run(scenario())


def test_a_slot_taken_before_a_reload_that_changed_the_limits_is_still_renewed(
    redis_url: str,
) -> None:
    """A reload that changes a tenant's limits gives it a new limiter; the tickets in flight
    release into the old one, which must keep renewing their slots until they do."""
    import redis.asyncio

    from gateway.errors import RateLimitError
    from gateway.tenants.admission import Admission
    from tests.gateway.tenants.test_limits import registry_with

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        admission = Admission(client, lease_s=0.4)
        admission.configure(registry_with({"max_concurrency": 1}).tenants)
        renewing = asyncio.get_running_loop().create_task(admission.keep_leases())
        before = registry_with({"max_concurrency": 1}).tenants["t"]
        early = await admission.admit(before, {"max_tokens": 10}, 0, "chat")
        after = registry_with({"max_concurrency": 2}).tenants
        admission.configure(after)
        await asyncio.sleep(1.0)  # past two leases
        await admission.admit(after["t"], {"max_tokens": 10}, 0, "chat")
        with pytest.raises(RateLimitError, match="concurrent"):
            await admission.admit(after["t"], {"max_tokens": 10}, 0, "chat")
        await early.release(10)
        await asyncio.sleep(0.25)  # two rounds: the old limiter holds nothing more to renew
        assert admission._replaced == []  # not kept, one more each reload, for good
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        await client.aclose()

    asyncio.run(scenario())


async def _redis_now(client: Any) -> float:
    seconds, micros = await client.time()
    return float(seconds) + float(micros) / 1e6


def test_a_slot_is_pruned_exactly_once_its_lease_has_lapsed(redis_url: str) -> None:
    """An admission counts a slot renewed within the last lease and prunes one renewed
    before it: neither a dead holder's slot kept for longer, nor a live one's dropped."""
    import redis.asyncio

    from gateway.errors import RateLimitError
    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limiter = SharedLimiter(client, "aged", TenantLimits(max_concurrency=1), lease_s=20.0)
        key = "tiergate:aged:inflight"
        await client.zadd(key, {"other-replicas": await _redis_now(client) - 19.0})
        with pytest.raises(RateLimitError, match="concurrent"):
            await limiter.admit(10)  # still counted: its holder may be alive
        await client.zadd(key, {"other-replicas": await _redis_now(client) - 21.0})
        assert await limiter.admit(10) is not None  # a lease lapsed: pruned
        assert await client.zscore(key, "other-replicas") is None
        await client.aclose()

    asyncio.run(scenario())


def test_a_renewal_keeps_the_slot_set_from_expiring(redis_url: str) -> None:
    """The set of slots expires a minute past a lease without admissions; a renewal must
    push that back, or a stream longer than it lost its slot with the key and the tenant
    got one request more than its limit on every replica."""
    import redis.asyncio

    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limiter = SharedLimiter(client, "long", TenantLimits(max_concurrency=1), lease_s=20.0)
        assert await limiter.admit(10) is not None
        await client.expire("tiergate:long:inflight", 5)  # as if admitted 75 s ago
        await limiter.renew()
        assert await client.ttl("tiergate:long:inflight") > 60
        await client.aclose()

    asyncio.run(scenario())


def test_only_slots_still_taken_and_younger_than_the_longest_request_are_renewed(
    redis_url: str,
) -> None:
    """A released hold, a hold of a tenant without a concurrency limit (it takes no slot)
    and one older than timeouts.total_s (a release a bug lost) are not renewed: each would
    cost every round a longer script call, and the last would hold its slot for good. The
    limit is the one at admission: a reload that lowers total_s does not end the leases of
    requests that may still run under the old one."""
    import redis.asyncio

    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        now = [100.0]
        limiter = SharedLimiter(
            client,
            "held",
            TenantLimits(max_concurrency=2),
            max_request_s=60.0,
            clock=lambda: now[0],
        )
        hold = await limiter.admit(10)
        assert hold is not None and limiter.holds
        await limiter.release(hold, 10, 10)
        assert not limiter.holds
        unlimited = SharedLimiter(client, "free", TenantLimits(requests_per_second=100.0))
        assert await unlimited.admit(10) is not None and not unlimited.holds

        assert await limiter.admit(10) is not None
        key = "tiergate:held:inflight"
        [(_, taken_at)] = await client.zrange(key, 0, -1, withscores=True)
        await asyncio.sleep(0.05)
        now[0] += 59.0
        await limiter.renew()
        [(_, renewed_at)] = await client.zrange(key, 0, -1, withscores=True)
        assert renewed_at > taken_at and limiter.holds
        limiter.max_request_s = 1.0  # a reload lowers total_s: this request keeps its own
        await asyncio.sleep(0.05)
        await limiter.renew()
        [(_, kept_at)] = await client.zrange(key, 0, -1, withscores=True)
        assert kept_at > renewed_at and limiter.holds
        now[0] += 2.0  # 61 s: past the longest request at its admission
        await asyncio.sleep(0.05)
        await limiter.renew()
        [(_, last_renewed_at)] = await client.zrange(key, 0, -1, withscores=True)
        assert last_renewed_at == kept_at and not limiter.holds
        await client.aclose()

    asyncio.run(scenario())


def test_a_holder_renews_its_slots_several_times_a_lease(redis_url: str) -> None:
    """Renewed once a lease, a slot is a lease old just before each renewal: an admission
    on another replica then prunes it while its request still runs, and the tenant gets
    one request more than its limit. Renewed every quarter lease, every tenant's slot
    never comes near."""
    import redis.asyncio

    from gateway.tenants.admission import Admission
    from tests.gateway.tenants.test_limits import registry_with

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        first = registry_with({"max_concurrency": 1}).tenants["t"]
        tenants = {"t": first, "u": dataclasses.replace(first, name="u")}  # two tenants
        admission = Admission(client, lease_s=0.4)
        admission.configure(tenants)
        renewing = asyncio.get_running_loop().create_task(admission.keep_leases())
        tickets = [
            await admission.admit(tenant, {"max_tokens": 10}, 0, "chat")
            for tenant in tenants.values()
        ]
        oldest = 0.0
        for _ in range(60):  # 1.2 s, three leases
            await asyncio.sleep(0.02)
            for name in tenants:
                slots: Any = await client.zrange(
                    f"tiergate:{name}:inflight", 0, -1, withscores=True
                )
                [(_, renewed_at)] = slots
                oldest = max(oldest, await _redis_now(client) - renewed_at)
        assert oldest < 0.3, f"a slot went {oldest:.2f} s unrenewed with a 0.4 s lease"
        for ticket in tickets:
            await ticket.release(10)
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing
        await client.aclose()

    asyncio.run(scenario())


def test_a_release_cancelled_again_while_under_way_still_reaches_redis(redis_url: str) -> None:
    """A cut request's task may be cancelled once more while its release runs (anyio
    cancels a task in a cancelled scope at each await until it leaves): the release goes on
    in a task of its own, which the shutdown waits for, or the slot stayed taken on every
    replica for a lease after the request had ended."""
    import redis.asyncio

    from gateway.tenants.admission import Admission
    from tests.gateway.tenants.test_limits import registry_with

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        tenant = registry_with({"max_concurrency": 1}).tenants["t"]
        admission = Admission(client)
        admission.configure({"t": tenant})
        limiter: Any = admission._limiters["t"]
        release_script = limiter._release

        async def slow_release(**kwargs: Any) -> Any:
            await asyncio.sleep(0.2)  # Redis slow to answer: the second cancel comes first
            return await release_script(**kwargs)

        limiter._release = slow_release

        async def request() -> None:
            ticket = await admission.admit(tenant, {"max_tokens": 10}, 0, "chat")
            try:
                await asyncio.sleep(10)  # streaming when the shutdown cuts it
            finally:
                await ticket.release(10)

        task = asyncio.get_running_loop().create_task(request())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.05)  # its release is under way
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await admission.settle()
        assert await client.zcard("tiergate:t:inflight") == 0
        await client.aclose()

    asyncio.run(scenario())


def test_a_renewal_round_renews_every_tenants_slots(redis_url: str) -> None:
    """One round renews the slots of every tenant this process holds some for, not only
    the first one's: the others' would be pruned a lease later while their requests run."""
    import redis.asyncio

    from gateway.tenants.limits import TenantLimits
    from gateway.tenants.shared_limits import SharedLimiter, renew_leases

    async def scenario() -> None:
        client = redis.asyncio.from_url(redis_url)
        limiters = [
            SharedLimiter(client, tenant, TenantLimits(max_concurrency=1))
            for tenant in ("first", "second")
        ]
        for limiter in limiters:
            assert await limiter.admit(10) is not None
        taken: Any = [
            await client.zrange(f"tiergate:{tenant}:inflight", 0, -1, withscores=True)
            for tenant in ("first", "second")
        ]
        await asyncio.sleep(0.05)
        await renew_leases(limiters)
        for tenant, [(_, taken_at)] in zip(("first", "second"), taken, strict=True):
            slots: Any = await client.zrange(f"tiergate:{tenant}:inflight", 0, -1, withscores=True)
            [(_, renewed_at)] = slots
            assert renewed_at > taken_at, tenant
        await client.aclose()

    asyncio.run(scenario())


def test_a_shutdown_with_no_release_under_way_settles_at_once() -> None:
    """`settle` runs at every shutdown, before the metrics are flushed and the tiers
    closed: with nothing to wait for it must return, not raise (asyncio.wait refuses an
    empty set), or the rest of the shutdown was skipped."""
    from gateway.tenants.admission import Admission

    asyncio.run(asyncio.wait_for(Admission().settle(), 1.0))
