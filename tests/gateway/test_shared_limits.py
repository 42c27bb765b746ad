"""Tenant limits shared by two gateway replicas through a real Redis server."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import MODEL, GatewayThread, Ladder, free_port, require_binary, send


@pytest.fixture()
def redis_url(tmp_path: Path) -> Iterator[str]:
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
    yield f"redis://127.0.0.1:{port}/0"
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
