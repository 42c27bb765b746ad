"""A fixed, fast fake OpenAI backend for overhead benchmarks (one uvloop process).

Answers every POST with the same chat completion, or, when the body asks for a stream, with
16 content events, a usage event and [DONE] as separate HTTP chunks, written back to back or,
when the body carries `"user":"paced"`, one per millisecond. Serves GET /health and
an empty GET /metrics so a gateway's health checks and scrapes are satisfied.
Run: python benchmarks/fake_backend.py PORT
"""

from __future__ import annotations

import asyncio
import sys

import httptools
import orjson
import uvloop

MODEL = "bench-model"
BODY = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello there, friend"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "total_tokens": 28, "completion_tokens": 16},
    }
)
JSON_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
    % (len(BODY), BODY)
)


def _event(payload: dict[str, object]) -> bytes:
    data = b"data: " + orjson.dumps(payload) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
CHUNK = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
STREAM_EVENTS = [
    _event(
        {
            **CHUNK,
            "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None}],
        }
    )
    for i in range(16)
]
STREAM_TAIL = (
    _event(
        {
            **CHUNK,
            "choices": [],
            "usage": {"prompt_tokens": 12, "total_tokens": 28, "completion_tokens": 16},
        }
    )
    + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
)
# A stream request whose body carries `"user":"paced"` gets its events spaced in time.
PACED = (b'"user":"paced"', b'"user": "paced"')
PACE_S = 0.001
HEALTH = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
EMPTY_METRICS = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 0\r\n\r\n"


class Backend(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)
        self.body = bytearray()
        self.url = b""

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()  # type: ignore[attr-defined]

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        method, url, body = self.parser.get_method(), self.url, bytes(self.body)
        self.url, self.body = b"", bytearray()
        write = self.transport.write  # type: ignore[attr-defined]
        if method == b"GET":
            write(EMPTY_METRICS if url.startswith(b"/metrics") else HEALTH)
        elif b'"stream":true' in body or b'"stream": true' in body:
            write(STREAM_HEAD)
            if PACED[0] in body or PACED[1] in body:
                # One event per millisecond, as a decoding engine emits them: each reaches
                # the proxy in its own read.
                later = asyncio.get_running_loop().call_later
                for i, event in enumerate([*STREAM_EVENTS, STREAM_TAIL]):
                    later((i + 1) * PACE_S, self._write_open, event)
                return
            for event in STREAM_EVENTS:
                write(event)
            write(STREAM_TAIL)
        else:
            write(JSON_RESPONSE)

    def _write_open(self, data: bytes) -> None:
        if not self.transport.is_closing():  # type: ignore[attr-defined]
            self.transport.write(data)  # type: ignore[attr-defined]


async def main(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(
        Backend, "127.0.0.1", port, backlog=4096
    )
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
