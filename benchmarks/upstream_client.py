"""The upstream HTTP client on the hot path: the gateway's own against aiohttp's.

The lean pass-through (`benchmarks/lean_proxy.py`) is run twice in one process, once on the
gateway's client (`gateway/backends/h1client.py`: httptools, pooled keep-alive connections)
and once on aiohttp's pooled `ClientSession`, against the fixed fake backend. Each variant's
ASGI app is called directly (no server, no load generator: what is left is the app and its
upstream hop), one request at a time, in interleaved blocks so the host's drifting speed
reaches both alike; the median block's CPU time per request is reported, JSON and stream.

Usage: python benchmarks/upstream_client.py [--rounds 12] [--block 400]
Writes benchmarks/results/upstream_client.{json,md}. A reported figure, not a test.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
import yarl

from gateway.backends.h1client import ConnectionPool

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))
from lean_proxy import make_aiohttp_app, make_app  # noqa: E402
from overhead import (  # noqa: E402
    CHAT,
    STREAM,
    block_arguments,
    fake_backend,
    stamped,
    write_results,
)


def scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-type", b"application/json")],
    }


async def call(app: Any, body: bytes) -> None:
    """One request through the app (whose receive is called once); fails on anything but 200."""
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope(), receive, send)
    if status != [200]:
        raise RuntimeError(f"request failed: {status}")


async def measure(backend_port: int, rounds: int, block: int) -> dict[str, Any]:
    # aiohttp set up for a proxy's hop, not left at its defaults: no cookie jar, no
    # decompression, the target URL parsed once.
    connector = aiohttp.TCPConnector(limit=100, keepalive_timeout=60)
    async with aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False
    ) as session:
        target = yarl.URL(f"http://127.0.0.1:{backend_port}/v1/chat/completions")
        apps = {
            "h1client (the gateway's)": make_app(ConnectionPool("127.0.0.1", backend_port)),
            "aiohttp ClientSession": make_aiohttp_app(session, target),
        }
        bodies = {"JSON": json.dumps(CHAT).encode(), "16-chunk stream": json.dumps(STREAM).encode()}
        for app in apps.values():  # warm the pools
            for body in bodies.values():
                for _ in range(200):
                    await call(app, body)
        blocks: dict[str, dict[str, list[float]]] = {
            kind: {name: [] for name in apps} for kind in bodies
        }
        for round_no in range(rounds):
            order = list(apps.items())
            if round_no % 2:  # alternate which client goes first in a round
                order.reverse()
            for kind, body in bodies.items():
                for name, app in order:
                    begin = time.process_time()
                    for _ in range(block):
                        await call(app, body)
                    blocks[kind][name].append((time.process_time() - begin) / block * 1e6)
    return {
        "us_per_request": {
            kind: {name: statistics.median(xs) for name, xs in per.items()}
            for kind, per in blocks.items()
        },
        "blocks_us": blocks,
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"Measured {results['date']} on {results['machine']}: the lean pass-through's ASGI app "
        f"called in one process, {results['rounds']} interleaved rounds of {results['block']} "
        "requests per variant, median block (CPU time of the app and its upstream hop).",
        "",
        "| upstream client | CPU us per JSON request | CPU us per 16-chunk stream |",
        "|---|---|---|",
    ]
    per = results["us_per_request"]
    for name in per["JSON"]:
        lines.append(f"| {name} | {per['JSON'][name]:.1f} | {per['16-chunk stream'][name]:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    args = block_arguments(__doc__ or "", RESULTS)
    with fake_backend() as backend_port:
        results = stamped(uvloop.run(measure(backend_port, args.rounds, args.block)), args)
    write_results(args.out, "upstream_client", results, markdown(results))


if __name__ == "__main__":
    main()
