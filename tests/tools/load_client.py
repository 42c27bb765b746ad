"""A bounded load generator for the load test: N requests at concurrency C, one result each.

Runs in its own process (the gateway under test must not share its GIL). Every request
carries a unique id in the OpenAI `user` field; the output lists (id, status) for every
request, so the test can check that each got exactly one terminal response.
Run: python tests/tools/load_client.py URL KEY REQUESTS CONCURRENCY OUT.json [--stream]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from gateway.backends.h1client import ConnectionPool, UpstreamFailure


async def main(
    url: str, key: str, total: int, concurrency: int, out: Path, *, stream: bool
) -> None:
    parts = urlsplit(url)
    pool = ConnectionPool(
        parts.hostname or "127.0.0.1", parts.port or 80, connect_timeout_s=10, max_idle=concurrency
    )
    results: dict[int, list[int]] = {}
    next_id = iter(range(total))
    auth = f"authorization: Bearer {key}\r\n".encode()

    async def worker() -> None:
        for request_id in next_id:
            body = json.dumps(
                {
                    "model": "qwen3-30b-a3b",
                    "messages": [{"role": "user", "content": f"load test request {request_id}"}],
                    "max_tokens": 4,
                    "user": f"req-{request_id}",
                    "stream": stream,
                }
            ).encode()
            status = -1  # transport failure: no HTTP response at all
            try:
                response = await pool.request(
                    pool.render(b"POST", b"/v1/chat/completions", body, auth),
                    first_byte_timeout_s=60,
                    total_timeout_s=120,
                )
                payload = await response.read(1 << 20)
                response.release()
                status = response.status
                if stream and status == 200 and not payload.rstrip().endswith(b"data: [DONE]"):
                    status = 599  # a stream that ended without [DONE] (an error event)
            except UpstreamFailure:
                pass
            results.setdefault(request_id, []).append(status)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.write_text(
        json.dumps(
            {
                "seconds": time.monotonic() - started,
                "results": {str(k): v for k, v in results.items()},
            }
        )
    )
    pool.close()


if __name__ == "__main__":
    import uvloop

    url, key, total, concurrency, out = sys.argv[1:6]
    uvloop.run(
        main(url, key, int(total), int(concurrency), Path(out), stream="--stream" in sys.argv)
    )
