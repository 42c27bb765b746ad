"""`tiergate serve --workers 2`: one socket, two processes, metrics merged across them."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import API_KEY, MODEL, GatewayProcess, Ladder, write_settings


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return str(response.read().decode())


def requests_total(text: str) -> float:
    return sum(
        float(match.group(1))
        for match in re.finditer(
            r'^tiergate_requests_total\{[^}]*status="200"[^}]*\} (\S+)$', text, re.M
        )
    )


@pytest.mark.slow
def test_two_workers_share_the_port_and_the_counters(ladder: Ladder, tmp_path: Path) -> None:
    path = write_settings(tmp_path / "tiergate.yaml", ladder.settings())
    metrics_dir = tmp_path / "metrics"
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    process = GatewayProcess(path, env=env)
    process.argv_extra = ["--workers", "2"]
    with process as gw:
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ).encode()
        for _ in range(40):
            request = urllib.request.Request(
                f"{gw.url}/v1/chat/completions", data=body, method="POST"
            )
            request.add_header("authorization", f"Bearer {API_KEY}")
            request.add_header("content-type", "application/json")
            # A fresh connection each time, so the kernel spreads them over both workers.
            with urllib.request.urlopen(request, timeout=20) as response:
                assert response.status == 200
        # Workers flush their batched counters into the shared files every second.
        deadline = time.monotonic() + 10
        pids = set()
        while len(pids) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = {f.name.split("_")[-1] for f in metrics_dir.glob("counter_*.db")}
        assert len(pids) >= 2, os.listdir(metrics_dir)  # both workers counted requests
        # Whichever worker answers the scrape, it reports the total over all workers.
        deadline = time.monotonic() + 5
        totals = [requests_total(scrape(gw.url)) for _ in range(6)]
        while set(totals) != {40.0} and time.monotonic() < deadline:
            time.sleep(0.1)
            totals = [requests_total(scrape(gw.url)) for _ in range(6)]
        assert set(totals) == {40.0}
