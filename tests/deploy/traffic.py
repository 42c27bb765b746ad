"""Traffic for the dashboards test: what a day at the gateway looks like, in a few seconds.

One wave sends, through the gateway and with the official SDK where a client would use it:
routed chat and completions (streamed and not) for two tenants, requests pinned to every tier
(model suffix and header), a rate-limited tenant over its limit, client mistakes (invalid
JSON, unknown model, wrong key), a tier answering 5xx, a stream cut mid-way, and a client
that hangs up mid-stream. Faults are switched on for one request and off again, so every
wave is the same.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import openai

from tests.helpers import API_KEY, MODEL, Ladder, http_json

BATCH_KEY: Final = "sk-test-batch"
CAPPED_KEY: Final = "sk-test-capped"
LOAD_KEY: Final = "sk-test-load"
# A shared system prompt (prefix-cache hits) and repetitive text (n-gram drafts accepted).
SYSTEM: Final = "You are a careful assistant for the tiergate test suite. " * 8
REPEAT: Final = "the quick brown fox jumps over the lazy dog and the quick brown fox " * 6


def tenants() -> list[dict[str, Any]]:
    """default: all tiers; batch: never the top tier, no pins; capped: rate-limited; load:
    the background streams (apart, so they do not dilute the others' error ratios)."""
    return [
        # An accuracy floor too, so a routed request served above it shows up as overspend.
        {"name": "default", "api_keys": [API_KEY], "alpha": 0.95},
        {
            "name": "batch",
            "api_keys": [BATCH_KEY],
            "allowed_tiers": ["nvfp4", "w4a16"],
            "allow_pinning": False,
            # An accuracy floor: the router derives thresholds and the uniform-floor baseline.
            "alpha": 0.9,
        },
        {
            "name": "capped",
            "api_keys": [CAPPED_KEY],
            "limits": {"requests_per_second": 0.2, "burst": 1},
        },
        {"name": "load", "api_keys": [LOAD_KEY]},
    ]


@dataclass
class Traffic:
    gateway_url: str
    ladder: Ladder

    def _client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateway_url}/v1", api_key=key, max_retries=0)

    def _sim(self, tier: str) -> Any:
        return next(sim for sim in self.ladder.sims if sim.precision == tier)

    @contextlib.contextmanager
    def _fault(self, tier: str, **faults: Any) -> Iterator[None]:
        sim = self._sim(tier)
        status, before = http_json("GET", f"{sim.url}/sim/faults")
        assert status == 200, before
        sim.faults(**faults)
        try:
            yield
        finally:
            sim.faults(**{name: before[name] for name in faults})

    @contextlib.contextmanager
    def background_load(self) -> Iterator[None]:
        """Back-to-back streams pinned to each tier, so engine scrapes find requests running
        (the observer takes C from the engines)."""
        stop = threading.Event()

        def loop(tier: str) -> None:
            with self._client(LOAD_KEY) as client:
                while not stop.is_set():
                    # The faults a wave injects hit these streams too.
                    with contextlib.suppress(openai.APIError):
                        for _ in client.chat.completions.create(
                            model=f"{MODEL}@{tier}",
                            messages=self._messages(REPEAT),
                            max_tokens=128,
                            stream=True,
                        ):
                            pass

        workers = [
            threading.Thread(target=loop, args=(sim.precision,), daemon=True)
            for sim in self.ladder.sims
        ]
        for worker in workers:
            worker.start()
        try:
            yield
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=30)

    def wave(self) -> None:
        default, batch, capped = (self._client(k) for k in (API_KEY, BATCH_KEY, CAPPED_KEY))
        try:
            self._routed(default)
            self._routed(batch)
            self._pinned(default)
            self._over_limit(capped)
            self._mistakes()
            self._failures(default)
            self._disconnect()
        finally:
            for client in (default, batch, capped):
                client.close()

    @staticmethod
    def _messages(text: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]

    def _routed(self, client: openai.OpenAI) -> None:
        client.chat.completions.create(
            model=MODEL, messages=self._messages("What is a precision tier?"), max_tokens=24
        )
        stream = client.chat.completions.create(
            model=MODEL, messages=self._messages(REPEAT), max_tokens=48, stream=True
        )
        for _ in stream:
            pass
        client.completions.create(model=MODEL, prompt=SYSTEM + REPEAT, max_tokens=24)

    def _pinned(self, client: openai.OpenAI) -> None:
        for sim in self.ladder.sims:
            stream = client.chat.completions.create(
                model=f"{MODEL}@{sim.precision}",
                messages=self._messages(REPEAT),
                max_tokens=32,
                stream=True,
                stream_options={"include_usage": True},
            )
            for _ in stream:
                pass
            client.chat.completions.create(
                model=MODEL,
                messages=self._messages("Summarise: " + REPEAT),
                max_tokens=16,
                extra_headers={"x-tiergate-tier": sim.precision},
            )

    def _over_limit(self, client: openai.OpenAI) -> None:
        # One request per five seconds with a burst of one: the second and third get 429.
        for _ in range(3):
            with contextlib.suppress(openai.RateLimitError):
                client.chat.completions.create(
                    model=MODEL, messages=self._messages("hi"), max_tokens=8
                )

    def _mistakes(self) -> None:
        url = f"{self.gateway_url}/v1/chat/completions"
        auth = {"authorization": f"Bearer {API_KEY}"}
        request = urllib_post(url, b"{not json", auth)
        assert request == 400, request
        status, _ = http_json("POST", url, {"model": "no-such-model", "messages": []}, auth)
        assert status in {400, 404}, status
        status, _ = http_json(
            "POST", url, {"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
            {"authorization": "Bearer sk-wrong"},
        )  # fmt: skip
        assert status == 401, status

    def _failures(self, client: openai.OpenAI) -> None:
        with self._fault("nvfp4", error_rate=1.0):
            for _ in range(2):
                with contextlib.suppress(openai.APIStatusError):
                    client.chat.completions.create(
                        model=f"{MODEL}@nvfp4", messages=self._messages("fail"), max_tokens=8
                    )
            # An easy routed request: where routing picks nvfp4, it escalates up the ladder.
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
            with self._fault("w4a16", error_rate=1.0):
                # Both cheaper tiers fail: the top tier serves a routed request, which is
                # overspend against the tenant's uniform floor (pins never count there).
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
                )
        with self._fault("w4a16", drop_mid_stream=1.0, drop_after_chunks=2):
            stream = client.chat.completions.create(
                model=f"{MODEL}@w4a16", messages=self._messages(REPEAT), max_tokens=64, stream=True
            )
            with contextlib.suppress(openai.APIError):
                for _ in stream:
                    pass

    def _disconnect(self) -> None:
        """A client that reads the first bytes of a long stream and hangs up."""
        host, port = self.gateway_url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        body = {
            "model": f"{MODEL}@bf16",
            "messages": self._messages(REPEAT),
            "max_tokens": 512,
            "stream": True,
        }
        connection.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"},
        )
        response = connection.getresponse()
        assert response.status == 200, response.status
        response.read1(64)
        connection.sock.close()  # type: ignore[union-attr]
        connection.close()


def urllib_post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POSTs raw bytes (invalid JSON cannot go through the SDK); returns the status."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=body, method="POST", headers={**headers, "content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        exc.close()
        return int(exc.code)


__all__ = ["BATCH_KEY", "CAPPED_KEY", "LOAD_KEY", "Traffic", "tenants"]
