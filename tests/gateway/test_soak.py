"""Chaos soak, condensed: random traffic over three faulty tiers and reloads, then accounting.

A gateway over three simulated tiers serves a seeded random mix of JSON and streamed chat
and completions requests (n > 1, pinned tiers, four tenants with and without limits,
malformed, oversized and unauthenticated bodies, clients that leave before the headers,
mid-stream or mid-body) while the tiers fail, stall, cut streams, shed load, refuse
connections and restart, and the configuration is reloaded three times (once renaming a
tier, which replaces its endpoint state and pool while requests are in flight on it).

Afterwards everything the gateway accounts for must be back at rest: no endpoint, tier
queue, departure watch or tenant holds a request; no circuit waits on a trial nobody runs;
no task or upstream connection was left behind; every request was recorded, none as a 500,
every error is OpenAI-shaped, and the gateway serves normally again, a limited tenant at its
full concurrency. Focused tests pin the bugs a longer soak found (a client leaving a queue
kept its slot, a reload parked connections on a closed pool or woke the wrong queue, a cut
JSON body counted as a success); this one guards the combinations nobody writes a test
for, where a leak on a rare path would otherwise only show as a slowly stuck gateway.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.backends.circuit import CircuitState
from gateway.config import Settings, parse_settings
from gateway.routing.policy import Decision
from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, Sim

pytestmark = pytest.mark.slow

SEED = 20240611
DURATION_S = 24.0
CONCURRENCY = 12  # clients at once (the soak ran 32; CI machines have two cores)
KEYS = {"default": API_KEY, "lim": "sk-lim", "tight": "sk-tight", "nopin": "sk-nopin"}
PROBABILITIES = (0.7, 0.85, 1.0)
LIM_CONCURRENCY = {0: 6, 1: 4, 2: 8}  # tenant "lim"'s max_concurrency per config variant
CLEAR = {"error_rate": 0.0, "added_latency_s": 0.0, "drop_mid_stream": 0.0, "max_waiting": None}


class RandomPolicy:
    """Routes each request to a random tier the tenant may use."""

    def __init__(self) -> None:
        self.rng = random.Random(SEED + 1)

    def decide(self, request: Any, kind: Any, tenant: Any) -> Decision:
        tier = self.rng.choice(tenant.allowed_tiers)
        return Decision(tier, PROBABILITIES[tier], "random", PROBABILITIES)


def tier_names(variant: int) -> list[str]:
    return ["nvfp4", "w4a16b" if variant == 2 else "w4a16", "bf16"]


def soak_settings(ladder: Ladder, variant: int) -> Settings:
    """Variant 0 is the start; 1 tightens limits; 2 renames the middle tier."""
    names = tier_names(variant)
    max_inflight = [4, 8, 64] if variant == 1 else [6, 12, 64]
    tiers = [
        {
            "name": names[i],
            "precision": sim.precision,
            "endpoints": [f"{sim.url}/v1"],
            "served_model_name": sim.served_model_name,
            "max_inflight_per_endpoint": max_inflight[i],
        }
        for i, sim in enumerate(ladder.sims)
    ]
    lim = {
        "max_concurrency": LIM_CONCURRENCY[variant],
        "requests_per_second": 40,
        "burst": 40,
        "tokens_per_minute": 600_000,
    }
    tight = {
        "max_concurrency": 2,
        "requests_per_second": 8,
        "burst": 8,
        "tokens_per_minute": 30_000,
        "max_body_bytes": 4096,
        "max_tokens": 64,
    }
    return parse_settings(
        {
            "model": MODEL,
            "tiers": tiers,
            "tenants": [
                {"name": "default", "api_keys": [KEYS["default"]]},
                {"name": "lim", "api_keys": [KEYS["lim"]], "limits": lim},
                {
                    "name": "tight",
                    "api_keys": [KEYS["tight"]],
                    "allowed_tiers": names[1:],
                    "degrade_under_saturation": True,
                    "degrade_min_probability": 0.8,
                    "limits": tight,
                },
                {"name": "nopin", "api_keys": [KEYS["nopin"]], "allow_pinning": False},
            ],
            "limits": {"max_body_bytes": 65536},
            "timeouts": {"connect_s": 1.0, "first_byte_s": 2.0, "total_s": 8.0},
            "resilience": {
                "failure_threshold": 3,
                "base_ejection_s": 1.0,
                "max_ejection_s": 3.0,
                "health_interval_s": 0.5,
                "queue_size": 8,
                "queue_timeout_s": 0.5,
                "retry_after_s": 0.5,
            },
        }
    )


# -- clients ------------------------------------------------------------------------------


@dataclass
class Request:
    """One planned client exchange and how the client behaves during it."""

    path: str
    payload: bytes
    headers: dict[str, str]
    desc: str
    mode: str = "full"  # full | leave_early | leave_mid | partial_body
    delay_s: float = 0.0  # leave_early: how long to wait for the first byte
    leave_after: int = 0  # leave_mid: body bytes to read before leaving
    declared_length: int | None = None  # partial_body: more than is sent
    # The gateway answers without reading the body (bad key, oversized): closing with the
    # body unread can reset the connection before the client reads the answer.
    answered_early: bool = False


@dataclass
class Outcome:
    request: Request
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None


def plain_chat(key: str = API_KEY) -> Request:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return Request("/v1/chat/completions", json.dumps(body).encode(), headers, "plain chat")


def random_request(rng: random.Random, names: list[str]) -> Request:
    tenant = rng.choices(list(KEYS), weights=[4, 3, 2, 1])[0]
    headers = {"authorization": f"Bearer {KEYS[tenant]}", "content-type": "application/json"}
    chat = rng.random() < 2 / 3
    stream = rng.random() < 0.5
    body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.choice([4, 16, 48]), "stream": stream}
    text = rng.choice(["hello there", "what is 2+2?", "write a poem " * rng.randint(1, 30)])
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if rng.random() < 0.25:
        body["n"] = rng.choice([2, 3])
    if stream and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    pin = rng.random()
    if pin < 0.15:
        body["model"] = f"{MODEL}@{rng.choice([*names, 'nosuch'])}"
    elif pin < 0.2:
        headers["x-tiergate-tier"] = rng.choice(names)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    desc = f"{tenant} {path} stream={stream} n={body.get('n', 1)} model={body['model']}"
    request = Request(path, json.dumps(body).encode(), headers, desc)

    damage = rng.random()
    if damage < 0.06:
        request.payload = rng.choice(
            [
                b"{not json",
                b"[]",
                b'{"model": 3}',
                b'{"model":"x","messages":"y"}',
                json.dumps({**body, "temperature": "hot"}).encode(),
                json.dumps({**body, "max_tokens": -1}).encode(),
            ]
        )
        request.desc += " malformed"
    elif damage < 0.09:
        request.payload = json.dumps({**body, "pad": "x" * 100_000}).encode()
        request.desc += " oversized"
        request.answered_early = True
    elif damage < 0.10:
        headers["authorization"] = "Bearer sk-wrong"
        request.desc += " bad key"
        request.answered_early = True

    leaving = rng.random()
    if leaving < 0.12:
        request.mode = "leave_early"
        request.delay_s = rng.choice([0.0, 0.01, 0.1, 0.25, 0.4, 1.0])
    elif leaving < 0.22 and stream:
        request.mode = "leave_mid"
        request.leave_after = rng.randint(1, 400)
    elif leaving < 0.24:
        request.mode = "partial_body"
        request.delay_s = 0.05
        request.declared_length = len(request.payload) + 1000
    request.desc += f" ({request.mode})"
    return request


async def exchange(port: int, request: Request, sent: list[int]) -> Outcome:
    """Runs one request over a raw HTTP/1.1 connection, leaving when the plan says."""
    outcome = Outcome(request)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        length = (
            len(request.payload) if request.declared_length is None else request.declared_length
        )
        head = f"POST {request.path} HTTP/1.1\r\nhost: gw\r\ncontent-length: {length}\r\n"
        head += "connection: close\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in request.headers.items())
        writer.write(f"{head}\r\n".encode() + request.payload)
        sent[0] += 1  # the gateway sees (and must record) every request from here on
        await writer.drain()
        if request.mode == "partial_body":
            await asyncio.sleep(request.delay_s)
        elif request.mode == "leave_early":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reader.read(1), request.delay_s)
        elif request.mode == "leave_mid":
            await read_until_body_bytes(reader, request.leave_after)
        else:
            async with asyncio.timeout(20):
                parse_response(await reader.read(), outcome)
    except TimeoutError:
        if request.mode == "full":
            outcome.error = "no complete response within 20 s"
    except ConnectionError as exc:
        if request.mode == "full" and not request.answered_early:
            outcome.error = f"connection error {exc!r}"
    finally:
        writer.close()
    return outcome


async def read_until_body_bytes(reader: asyncio.StreamReader, count: int) -> None:
    data = b""
    async with asyncio.timeout(15):
        while len(data.partition(b"\r\n\r\n")[2]) < count:
            chunk = await reader.read(65536)
            if not chunk:
                return
            data += chunk


def parse_response(data: bytes, outcome: Outcome) -> None:
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not lines[0]:
        outcome.error = "empty response"
        return
    outcome.status = int(lines[0].split()[1])
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        outcome.headers[name.strip().lower()] = value.strip()
    chunked = outcome.headers.get("transfer-encoding") == "chunked"
    outcome.body = dechunk(rest) if chunked else rest


def dechunk(data: bytes) -> bytes:
    parts = []
    while data:
        line, _, rest = data.partition(b"\r\n")
        size = int(line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        parts.append(rest[:size])
        data = rest[size + 2 :]
    return b"".join(parts)


def openai_error(body: bytes) -> bool:
    try:
        obj = json.loads(body)
    except ValueError:
        return False
    error = obj.get("error") if isinstance(obj, dict) else None
    return (
        isinstance(error, dict)
        and isinstance(error.get("message"), str)
        and {"type", "param", "code"} <= error.keys()
    )


def response_problem(outcome: Outcome) -> str | None:
    """What is wrong with a response the client read to its end, if anything."""
    status, body = outcome.status, outcome.body
    if outcome.error or status is None:
        return outcome.error  # None: the client left on purpose
    if status >= 500 and status not in (502, 503, 504):
        return f"status {status}: {body[:300]!r}"
    if status != 200:
        return None if openai_error(body) else f"{status}, not an OpenAI error: {body[:200]!r}"
    if "text/event-stream" in outcome.headers.get("content-type", ""):
        return stream_problem(body)
    try:
        json.loads(body)
    except ValueError:
        return f"200 with a non-JSON body {body[:200]!r}"
    return None


def stream_problem(body: bytes) -> str | None:
    """A stream must end with [DONE], or with an error event when it broke."""
    events = [event.strip() for event in body.split(b"\n\n") if event.strip()]
    if not events:
        return "an empty stream"
    last = events[-1]
    if last == b"data: [DONE]" or openai_error(last.removeprefix(b"data: ")):
        return None
    return f"a stream ending in neither [DONE] nor an error: {last[:200]!r}"


async def traffic(
    port: int, rng: random.Random, names: list[str], sent: list[int], until: float
) -> list[Outcome]:
    """Keeps up to CONCURRENCY random requests going until `until`; `names` may change."""
    slots = asyncio.Semaphore(CONCURRENCY)
    outcomes: list[Outcome] = []

    async def one(request: Request) -> None:
        try:
            outcomes.append(await exchange(port, request, sent))
        except Exception as exc:  # a crashing client is a finding too
            outcomes.append(Outcome(request, error=f"client crashed: {exc!r}"))
        finally:
            slots.release()

    tasks = []
    while time.monotonic() < until:
        await slots.acquire()
        tasks.append(asyncio.create_task(one(random_request(rng, list(names)))))
        await asyncio.sleep(rng.uniform(0, 0.02))
    await asyncio.gather(*tasks)
    return outcomes


# -- the gateway's side -------------------------------------------------------------------


def on_loop(gw: GatewayThread, fn: Callable[[], Any]) -> Any:
    """fn() on the gateway's event loop (its state is not thread-safe), returned here."""
    box: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            box.append(exc)
        done.set()

    assert gw.loop is not None
    gw.loop.call_soon_threadsafe(run)
    assert done.wait(10), "the gateway's event loop did not run a callback within 10 s"
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


@dataclass
class Seen:
    """Every endpoint state, tier and proxy service any configuration used (reloads replace
    them; requests in flight finish on the old ones, which must come to rest too)."""

    endpoints: dict[int, Any] = field(default_factory=dict)
    tiers: dict[int, Any] = field(default_factory=dict)
    services: dict[int, Any] = field(default_factory=dict)

    def record(self, gw: GatewayThread) -> None:
        def collect() -> None:
            runtime = gw.app.runtime
            self.services[id(runtime.service)] = runtime.service
            for tier in runtime.tiers:
                self.tiers[id(tier)] = tier
                for state in tier.endpoints:
                    self.endpoints[id(state)] = state

        on_loop(gw, collect)


def accounting_residue(gw: GatewayThread, seen: Seen) -> list[str]:
    """Requests some counter still holds although no client is connected."""

    def collect() -> list[str]:
        current = {id(state) for tier in gw.app.runtime.tiers for state in tier.endpoints}
        found = []
        for key, state in seen.endpoints.items():
            where = f"endpoint {state.url} (tier {state.tier}"
            where += ")" if key in current else ", replaced by a reload)"
            if state.inflight:
                found.append(f"{where} has inflight={state.inflight}")
            if state.circuit.state is CircuitState.HALF_OPEN and state.circuit.trial_in_flight:
                found.append(f"{where} is stuck half-open with a trial in flight")
            if key not in current and state.pool.idle_connections:
                found.append(f"{where}: its closed pool keeps {state.pool.idle_connections} idle")
        found += [f"tier {t.name} has {t.queued} queued" for t in seen.tiers.values() if t.queued]
        pending = [s._departures.pending for s in seen.services.values()]
        if any(pending):
            found.append(f"departure watches still pending: {pending}")
        inflight = gw.app.admission.inflight
        if any(inflight.values()):
            found.append(f"tenant admission inflight: {inflight}")
        limiters = {
            name: limiter.inflight
            for name, limiter in gw.app.admission._limiters.items()
            if limiter is not None and limiter.inflight
        }
        if limiters:
            found.append(f"tenant limiters inflight: {limiters}")
        return found

    result: list[str] = on_loop(gw, collect)
    return result


def task_census(gw: GatewayThread) -> collections.Counter[str]:
    def census() -> collections.Counter[str]:
        return collections.Counter(
            getattr(task.get_coro(), "__qualname__", "?") for task in asyncio.all_tasks()
        )

    result: collections.Counter[str] = on_loop(gw, census)
    return result


def established_to(ports: list[int]) -> dict[int, int]:
    """ESTABLISHED TCP connections whose remote end is one of `ports` (Linux /proc)."""
    counts = dict.fromkeys(ports, 0)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as handle:
            for line in list(handle)[1:]:
                fields = line.split()
                port = int(fields[2].rsplit(":", 1)[1], 16)
                if port in counts and fields[3] == "01":
                    counts[port] += 1
    return counts


def connection_residue(gw: GatewayThread, ladder: Ladder) -> list[str]:
    """Upstream connections open beyond those idle in the current pools (+1: a health probe)."""

    def idle_by_port() -> dict[int, int]:
        idle: dict[int, int] = collections.Counter()
        for tier in gw.app.runtime.tiers:
            for state in tier.endpoints:
                idle[state.endpoint.port] += state.pool.idle_connections
        return idle

    idle = on_loop(gw, idle_by_port)
    open_now = established_to([sim.port for sim in ladder.sims])
    return [
        f"{count} connections open to {sim.precision}'s sim, the pools hold {idle.get(port, 0)}"
        for sim in ladder.sims
        if (count := open_now[port := sim.port]) > idle.get(port, 0) + 1
    ]


def requests_by_status(gw: GatewayThread) -> collections.Counter[str]:
    gw.flush()
    counts: collections.Counter[str] = collections.Counter()
    for metric in gw.registry.collect():
        for sample in metric.samples:
            if sample.name == "tiergate_requests_total":
                counts[sample.labels["status"]] += int(sample.value)
    return counts


def leftovers(
    gw: GatewayThread, ladder: Ladder, seen: Seen, tasks: collections.Counter[str], sent: int
) -> list[str]:
    found = accounting_residue(gw, seen)
    grown = task_census(gw) - tasks
    if grown:
        found.append(f"tasks left on the gateway's loop: {dict(grown)}")
    recorded = requests_by_status(gw).total()
    if recorded != sent:
        found.append(f"tiergate_requests_total is {recorded}, the clients sent {sent}")
    return found + connection_residue(gw, ladder)


def endpoints_out(gw: GatewayThread) -> list[str]:
    """Current endpoints a request may not be sent to (down, or ejected by their circuit)."""

    def collect() -> list[str]:
        return [
            f"endpoint {state.url} (tier {state.tier}) is out: healthy={state.healthy}, "
            f"circuit {state.circuit.state.name}"
            for tier in gw.app.runtime.tiers
            for state in tier.endpoints
            if not state.usable
        ]

    result: list[str] = on_loop(gw, collect)
    return result


def eventually(check: Callable[[], list[str]], timeout_s: float) -> list[str]:
    """`check()`'s findings once empty, or the last ones after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (found := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


# -- chaos --------------------------------------------------------------------------------


@dataclass
class Soak:
    ladder: Ladder
    gw: GatewayThread
    seen: Seen
    names: list[str]  # the running configuration's tier names (for pinned requests)


Step = Callable[[Soak], None]


def faults(tier: int, **changes: Any) -> Step:
    def step(soak: Soak) -> None:
        with contextlib.suppress(OSError):  # a sim refusing connections refuses this too
            soak.ladder.sims[tier].faults(**changes)

    return step


def restart(tier: int) -> Step:
    def step(soak: Soak) -> None:
        restart_sim(soak.ladder.sims[tier])

    return step


def restart_sim(sim: Sim) -> None:
    sim.stop()
    sim.start()


def reload(variant: int) -> Step:
    def step(soak: Soak) -> None:
        soak.seen.record(soak.gw)
        on_loop(soak.gw, lambda: soak.gw.app.reload(soak_settings(soak.ladder, variant)))
        soak.seen.record(soak.gw)
        soak.names[:] = tier_names(variant)

    return step


# (seconds into the traffic, step); tiers are 0 nvfp4, 1 w4a16, 2 bf16
SCHEDULE: list[tuple[float, Step]] = [
    (1.5, faults(0, error_rate=1.0)),  # its circuit opens; requests escalate
    (3.0, faults(1, added_latency_s=2.5)),  # past first_byte_s: timeouts
    (3.0, faults(2, drop_mid_stream=0.5)),
    (5.0, faults(0, error_rate=0.3, drop_mid_stream=0.5)),
    (5.0, faults(1, added_latency_s=0.0, max_waiting=0)),  # sheds load with 503s
    (6.5, reload(1)),  # tighter tenant and endpoint limits
    (7.5, faults(1, max_waiting=None, refuse_connections=True)),
    (10.0, restart(1)),
    (10.5, faults(1, added_latency_s=0.5)),  # requests in flight on it during the rename
    (12.0, reload(2)),  # renames w4a16: a fresh endpoint state and pool
    (13.0, faults(0, **{**CLEAR, "added_latency_s": 0.5, "max_waiting": 2})),
    (13.0, faults(2, drop_mid_stream=0.0, error_rate=0.3)),
    (15.0, faults(1, added_latency_s=0.0, error_rate=1.0)),
    (17.0, reload(0)),  # and the name back
    (18.0, faults(1, error_rate=0.0, drop_mid_stream=0.5)),
    (19.0, faults(2, error_rate=0.0, added_latency_s=2.5)),
    (21.0, faults(0, error_rate=1.0)),
]


async def chaos(soak: Soak, started: float) -> None:
    for at_s, step in SCHEDULE:
        await asyncio.sleep(max(0.0, started + at_s - time.monotonic()))
        await asyncio.to_thread(step, soak)


def heal(ladder: Ladder) -> None:
    for sim in ladder.sims:
        try:
            sim.faults(**CLEAR)
        except OSError:
            restart_sim(sim)  # it refuses connections, the control request included


async def at_once(requests: list[Request], port: int, sent: list[int]) -> list[Outcome]:
    return list(await asyncio.gather(*(exchange(port, r, sent) for r in requests)))


async def in_turn(requests: list[Request], port: int, sent: list[int]) -> list[Outcome]:
    return [await exchange(port, r, sent) for r in requests]


# -- the test -----------------------------------------------------------------------------


def test_chaos_soak_leaves_nothing_behind() -> None:
    ladder = Ladder.start()
    try:
        with GatewayThread(
            soak_settings(ladder, 0), policy_factory=lambda _s: RandomPolicy()
        ) as gw:
            sent = [0]
            # A few requests first, so that steady background tasks exist before the census.
            asyncio.run(in_turn([plain_chat() for _ in range(6)], gw.port, sent))
            time.sleep(0.5)
            tasks_before = task_census(gw)
            soak = Soak(ladder, gw, Seen(), tier_names(0))
            soak.seen.record(gw)

            async def soak_traffic() -> list[Outcome]:
                started = time.monotonic()
                outcomes, _ = await asyncio.gather(
                    traffic(gw.port, random.Random(SEED), soak.names, sent, started + DURATION_S),
                    chaos(soak, started),
                )
                return outcomes

            outcomes = asyncio.run(soak_traffic())
            soak.seen.record(gw)
            heal(ladder)

            assert len(outcomes) > 300, f"only {len(outcomes)} requests ran"
            problems = [f"{o.request.desc}: {p}" for o in outcomes if (p := response_problem(o))]
            assert not problems, f"{len(problems)} bad responses:\n" + "\n".join(problems[:20])

            residue = eventually(
                lambda: leftovers(gw, ladder, soak.seen, tasks_before, sent[0]), timeout_s=15
            )
            assert not residue, "after the soak:\n" + "\n".join(residue)
            assert requests_by_status(gw)["500"] == 0, "the gateway answered 500"

            # Circuits the last faults opened close again once their ejection ends.
            out = eventually(lambda: endpoints_out(gw), timeout_s=10)
            assert not out, "faults healed, yet:\n" + "\n".join(out)
            replies = asyncio.run(in_turn([plain_chat() for _ in range(10)], gw.port, sent))
            failed = [(r.status, r.body[:200]) for r in replies if r.status != 200]
            assert not failed, f"the gateway no longer serves normally: {failed}"

            conc = LIM_CONCURRENCY[0]
            for sim in ladder.sims:  # so that all of them overlap
                sim.faults(added_latency_s=0.8)
            replies = asyncio.run(
                at_once([plain_chat(KEYS["lim"]) for _ in range(conc)], gw.port, sent)
            )
            failed = [(r.status, r.body[:200]) for r in replies if r.status != 200]
            assert not failed, f"tenant lim cannot run max_concurrency={conc} at once: {failed}"
    finally:
        ladder.stop()
