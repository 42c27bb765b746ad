"""Where the gateway's per-request CPU goes: one component stubbed at a time, in one process.

The gateway's ASGI app is called directly (no HTTP server, no client: what is left is the app
and its upstream hop) against the fixed fake backend, one request at a time. Blocks of
requests run with one component replaced by a no-op, interleaved round by round so that the
host's drifting speed hits every variant alike; the median block per variant is reported,
and what a component costs is the baseline's median minus its stubbed median. The lean
pass-through (`benchmarks/lean_proxy.py`, same upstream client) is measured the same way.

Components: the router's score (`RouterModel.score_one`; the decision itself is kept),
validation (`protocol._plainly_valid`), metrics (`GatewayMetrics.record`) and the regime
observer's in-flight events (`LiveObserver.upstream_started/finished`; the time its drain
spends per event is reported too).

Usage: python benchmarks/overhead_breakdown.py [--rounds 12] [--block 400]
Writes benchmarks/results/overhead_breakdown.{json,md}. A reported figure, not a test.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

from gateway import metrics, protocol
from gateway.app import build_app
from gateway.backends.h1client import ConnectionPool
from gateway.config import load_settings
from gateway.live import observer
from gateway.routing.factory import build_policy
from router_models.model import RouterModel

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))
from lean_proxy import make_app  # noqa: E402
from overhead import (  # noqa: E402
    CHAT,
    KEY,
    block_arguments,
    fake_backend,
    gateway_config,
    stamped,
    write_results,
)

BODY = json.dumps(CHAT).encode()
Handler = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
# variant -> (owner, attribute, no-op) replaced for that variant's blocks
STUBS: dict[str, list[tuple[Any, str, Any]]] = {
    "router score": [(RouterModel, "score_one", lambda self, request, kind=None: 0.0)],
    "validation": [(protocol, "_plainly_valid", lambda kind, data: True)],
    "metrics": [(metrics.GatewayMetrics, "record", lambda self, record: None)],
    "observer events": [
        (observer.LiveObserver, "upstream_started", lambda self, tier, tenant: None),
        (observer.LiveObserver, "upstream_finished", lambda self, tier, tenant: None),
    ],
}


def scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"bench"),
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {KEY}".encode()),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8000),
    }


async def call(app: Handler, never: asyncio.Future[None]) -> None:
    """One request through the app; fails loudly on anything but 200."""
    delivered = False
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await never  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope(), receive, send)
    if sent[0].get("status") != 200:
        raise RuntimeError(f"request failed: {sent}")


async def measure(config: Path, backend_port: int, rounds: int, block: int) -> dict[str, Any]:
    app = build_app(load_settings(config), policy_factory=build_policy, config_path=config)
    lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started: list[dict[str, Any]] = []

    async def lifespan_send(message: dict[str, Any]) -> None:
        started.append(message)

    await lifespan.put({"type": "lifespan.startup"})
    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan.get, lifespan_send)
    )
    while not started:
        await asyncio.sleep(0.01)
    drained = [0.0, 0]
    real_drain = observer.LiveObserver.drain_events

    def timed_drain(self: observer.LiveObserver) -> None:
        events = len(self._events)
        begin = time.process_time()
        real_drain(self)
        drained[0] += time.process_time() - begin
        drained[1] += events

    observer.LiveObserver.drain_events = timed_drain  # type: ignore[method-assign]
    originals = {
        name: [(owner, attr, getattr(owner, attr)) for owner, attr, _ in stubs]
        for name, stubs in STUBS.items()
    }
    lean = make_app(ConnectionPool("127.0.0.1", backend_port))
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for _ in range(1000):  # warm caches, pools and the word cache
        await call(app, never)
        await call(lean, never)
    variants = ["tiergate", *STUBS, "lean pass-through"]
    blocks: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name in variants:
            for owner, attr, stub in STUBS.get(name, []):
                setattr(owner, attr, stub)
            target = lean if name == "lean pass-through" else app
            begin = time.process_time()
            for _ in range(block):
                await call(target, never)
            blocks[name].append((time.process_time() - begin) / block * 1e6)
            for owner, attr, real in originals.get(name, []):
                setattr(owner, attr, real)
    observer.LiveObserver.drain_events = real_drain  # type: ignore[method-assign]
    await lifespan.put({"type": "lifespan.shutdown"})
    await task
    base = statistics.median(blocks["tiergate"])
    return {
        "us_per_request": {name: statistics.median(xs) for name, xs in blocks.items()},
        "component_us": {name: base - statistics.median(blocks[name]) for name in STUBS},
        "blocks_us": blocks,
        "observer_drain_us_per_event": drained[0] / max(drained[1], 1) * 1e6,
    }


def markdown(results: dict[str, Any]) -> str:
    per = results["us_per_request"]
    lines = [
        f"Measured {results['date']} on {results['machine']}: the ASGI app called in one "
        f"process, {results['rounds']} interleaved rounds of {results['block']} requests per "
        "variant, median block (CPU time).",
        "",
        "| variant | CPU us per request | component's cost (tiergate minus variant) |",
        "|---|---|---|",
        f"| tiergate, everything on | {per['tiergate']:.1f} | |",
    ]
    for name, cost in results["component_us"].items():
        lines.append(f"| {name} stubbed | {per[name]:.1f} | {cost:.1f} |")
    lines += [
        f"| lean pass-through | {per['lean pass-through']:.1f} | |",
        "",
        f"The observer's background drain spends {results['observer_drain_us_per_event']:.2f} "
        "us per in-flight event (two per request). Run-to-run noise on this shared machine is "
        "about +-15 us per variant.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = block_arguments(__doc__ or "", RESULTS)
    with fake_backend() as backend_port, tempfile.TemporaryDirectory() as tmp:
        config = gateway_config(Path(tmp) / "tiergate.yaml", backend_port)
        results = uvloop.run(measure(config, backend_port, args.rounds, args.block))
    results = stamped(results, args)
    write_results(args.out, "overhead_breakdown", results, markdown(results))


if __name__ == "__main__":
    main()
