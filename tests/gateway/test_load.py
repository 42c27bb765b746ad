"""Bounded load: 20,000 requests at concurrency 256, one tier killed midway.

Every request must get exactly one terminal response: none lost, none duplicated, and the
gateway's own request counter must agree with the client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import API_KEY, REPO, GatewayThread, Ladder, fixed_policy

pytestmark = pytest.mark.slow

REQUESTS = 20_000
CONCURRENCY = 256


def test_tier_killed_midway_loses_nothing(tmp_path: Path) -> None:
    ladder = Ladder.start(extra_args=("--time-scale", "0.2"))
    try:
        settings = ladder.settings(
            observer={"sample_rate": 0.05},
            resilience={"health_interval_s": 0.5, "queue_timeout_s": 10.0},
            timeouts={"connect_s": 2.0, "first_byte_s": 30.0, "total_s": 60.0},
        )
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            out = tmp_path / "results.json"
            client = subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / "tests" / "tools" / "load_client.py"),
                    gw.url,
                    API_KEY,
                    str(REQUESTS),
                    str(CONCURRENCY),
                    str(out),
                ],
                cwd=REPO,
            )
            # Kill the cheapest tier (where the policy sends everything) once a third is done.
            killer = threading.Thread(target=_kill_when, args=(gw, ladder, REQUESTS // 3))
            killer.start()
            assert client.wait(timeout=600) == 0
            killer.join()
            data = json.loads(out.read_text())
            results = data["results"]
            assert sorted(int(k) for k in results) == list(range(REQUESTS))  # none lost
            assert all(len(statuses) == 1 for statuses in results.values())  # none duplicated
            statuses = [s[0] for s in results.values()]
            failed = [s for s in statuses if s != 200]
            # Requests in flight on the killed tier were retried up the ladder before their
            # first byte; nothing should fail.
            assert failed == [], {s: failed.count(s) for s in set(failed)}
            served = sum(
                gw.metric(
                    "tiergate_requests_total",
                    {"tenant": "default", "tier": t, "endpoint": "chat", "status": "200"},
                )
                for t in ("nvfp4", "w4a16", "bf16")
            )
            assert served == REQUESTS
            assert (
                gw.metric(
                    "tiergate_requests_total",
                    {"tenant": "default", "tier": "w4a16", "endpoint": "chat", "status": "200"},
                )
                > 0
            )
            print(
                f"\n{REQUESTS} requests at c={CONCURRENCY} in {data['seconds']:.1f}s, one tier killed midway: all 200"
            )
    finally:
        ladder.stop()


def _kill_when(gw: GatewayThread, ladder: Ladder, done: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (
            gw.metric(
                "tiergate_requests_total",
                {"tenant": "default", "tier": "nvfp4", "endpoint": "chat", "status": "200"},
            )
            >= done
        ):
            break
        time.sleep(0.2)
    process = ladder.sims[0].process
    assert process is not None
    process.kill()  # SIGKILL: no graceful drain, connections cut mid-request
