"""Shadow evaluation end to end with the simulator: labels equal the quality model's truth."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.sim import quality
from router_models.data import load_labels
from router_models.errors import LabelDataError
from router_models.features import DENSE_NAMES
from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, fixed_policy, send

ADMIN = "shadow-admin"
EASY = [f"hello, please translate good morning number {i}" for i in range(10)]
HARD = [
    f"Prove that the algorithm is correct and refactor it ({i}).\n"
    + "def f(x):\n    return x * 2\n" * 30
    for i in range(10)
]


def chat(gw: GatewayThread, content: str) -> str:
    """Sends one chat request; returns its x-request-id."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 24}
    reply = send("POST", f"{gw.url}/v1/chat/completions", body)
    assert reply.status == 200
    return reply.headers["x-request-id"]


def admin(gw: GatewayThread) -> Any:
    return send("GET", f"{gw.url}/admin/shadow", key=ADMIN).json()


def test_shadow_labels_match_the_quality_model(ladder: Ladder, tmp_path: Path) -> None:
    log = tmp_path / "labels.jsonl"
    settings = ladder.settings(
        shadow={"rate": 1.0, "assume_deterministic": True, "label_log": str(log), "min_labels": 5},
        admin={"token": ADMIN},
    )
    data = settings.model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    data["tenants"][0]["shadow_keep_text"] = True
    from gateway.config import parse_settings

    with GatewayThread(
        parse_settings(data), policy_factory=fixed_policy(0, (0.9, 0.95, 1.0))
    ) as gw:
        bf16_before = ladder.sims[2].stats()["requests"]
        request_ids = {chat(gw, content): content for content in EASY + HARD}
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and admin(gw)["tenants"].get("default", {}).get("nvfp4", {}).get("labels", 0) < 20
        ):
            time.sleep(0.2)
        view = admin(gw)["tenants"]["default"]["nvfp4"]
        assert view["labels"] == 20
        truth = [quality.adequate(text, "nvfp4") for text in EASY + HARD]
        assert sum(truth) < 20  # the hard prompts do diverge at nvfp4
        assert view["observed"] == sum(truth) / 20
        assert view["predicted"] == 0.9
        assert ladder.sims[2].stats()["requests"] - bf16_before == 20  # one replay each, on bf16
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(lines) == 20
        by_text = {line["request"]["messages"][0]["content"]: line for line in lines}
        for text, adequate in zip(EASY + HARD, truth, strict=True):
            assert by_text[text]["correct"] == {
                "nvfp4": float(adequate),
                "w4a16": None,
                "bf16": 1.0,
            }
            assert by_text[text]["source"] == "shadow:default"
        # A label's id is the x-request-id its client saw (and the engines logged).
        assert {line["id"]: line["request"]["messages"][0]["content"] for line in lines} == (
            request_ids
        )
        # The log is a label file as it stands: the ladder comes from it, unlabelled tiers are NaN.
        labels_read = load_labels([log])
        assert labels_read.tiers == ("nvfp4", "w4a16", "bf16")
        assert len(labels_read) == 20 and labels_read.skipped_without_text == 0
        nvfp4 = {
            r["messages"][0]["content"]: c
            for r, c in zip(labels_read.requests, labels_read.correct[:, 0], strict=True)
        }
        assert [nvfp4[text] for text in EASY + HARD] == [float(a) for a in truth]
        assert np.isnan(labels_read.correct[:, 1]).all()
        labels = {"tenant": "default", "tier": "nvfp4"}
        assert gw.metric(
            "tiergate_shadow_labels_total", {**labels, "adequate": "false"}
        ) == 20 - sum(truth)
        assert gw.metric("tiergate_calibration_observed_adequacy", labels) == sum(truth) / 20
        # The sums the dashboards divide (they add up over workers and replicas).
        assert gw.metric("tiergate_shadow_predicted_adequacy_total", labels) == pytest.approx(18)
        scored = {**labels, "adequate": "true"}
        assert gw.metric("tiergate_shadow_scored_labels_total", scored) == sum(truth)
        drift = view["observed"] < 0.9 - 0.1
        assert gw.metric("tiergate_calibration_drift", labels) == float(drift)
        # The replays' cost (bf16, cost 1.0 per token) is routing's overspend against the top
        # tier; nvfp4's own answers cost less than the top tier's, so it is all of it.
        shadow_cost = gw.metric("tiergate_shadow_cost_total", {"tenant": "default"})
        assert shadow_cost >= 20 * 2  # 20 replays of a prompt and an answer
        overspend = {"tenant": "default", "baseline": "top_tier"}
        assert gw.metric("tiergate_estimated_overspend_total", overspend) == shadow_cost


def test_without_kept_text_the_log_holds_features_and_no_text(
    ladder: Ladder, tmp_path: Path
) -> None:
    log = tmp_path / "labels.jsonl"
    settings = ladder.settings(
        shadow={"rate": 1.0, "assume_deterministic": True, "label_log": str(log)},
        admin={"token": ADMIN},
    )  # keep_text is off by default
    with GatewayThread(settings, policy_factory=fixed_policy(0, (0.9, 0.95, 1.0))) as gw:
        for content in EASY[:3]:
            chat(gw, content)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
            not log.exists() or len(log.read_text().splitlines()) < 3
        ):
            time.sleep(0.2)
    text = log.read_text()
    assert "translate good morning" not in text  # no request text in the log
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert "request" not in line and "messages" not in line
        assert set(line["features"]) == set(DENSE_NAMES)
    # `router train` reads such a log: its rows are counted as text-free, not malformed.
    with pytest.raises(LabelDataError, match="no rows with request text"):
        load_labels([log])


def test_a_pinned_requests_replay_is_shadow_cost_not_routings_overspend(ladder: Ladder) -> None:
    """The client chose the tier: its replay only collects a label, so routing, which saved
    nothing on it, is not charged for it (review P: 4 pinned requests booked 236 as overspend)."""
    settings = ladder.settings(shadow={"rate": 1.0, "assume_deterministic": True})
    with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
        for content in EASY[:4]:
            body = {
                "model": f"{MODEL}@nvfp4",
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 24,
            }
            assert send("POST", f"{gw.url}/v1/chat/completions", body).status == 200
        labelled = {"tenant": "default", "tier": "nvfp4", "outcome": "labelled"}
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and gw.metric("tiergate_shadow_requests_total", labelled) < 4
        ):
            time.sleep(0.05)
        assert gw.metric("tiergate_shadow_requests_total", labelled) == 4
        assert gw.metric("tiergate_shadow_cost_total", {"tenant": "default"}) >= 4 * 2
        for baseline in ("top_tier", "uniform_floor"):
            overspend = {"tenant": "default", "baseline": baseline}
            assert gw.metric("tiergate_estimated_overspend_total", overspend) == 0


def test_shadow_skips_top_tier_and_respects_rate_zero(ladder: Ladder) -> None:
    settings = ladder.settings(shadow={"rate": 0.0}, admin={"token": ADMIN})
    with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
        before = ladder.sims[2].stats()["requests"]
        for content in EASY[:5]:
            chat(gw, content)
        time.sleep(0.5)
        assert ladder.sims[2].stats()["requests"] == before
        assert admin(gw)["tenants"] == {}


def test_a_reload_with_an_unwritable_label_log_changes_nothing(
    ladder: Ladder, tmp_path: Path
) -> None:
    """The label log is the last thing a configuration can fail on: a reload that asks for
    one where none can be written is refused whole (keys, rates and log stay as they were)."""
    from gateway.config import ConfigError, parse_settings

    log = tmp_path / "labels.jsonl"
    data = ladder.settings(shadow={"rate": 0.5, "label_log": str(log)}).model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with GatewayThread(parse_settings(data), policy_factory=fixed_policy(0)) as gw:
        runtime = gw.app.runtime
        changed = json.loads(json.dumps(data))
        changed["tenants"][0]["api_keys"] = ["sk-other"]
        changed["shadow"] = {"rate": 1.0, "label_log": str(blocker / "labels.jsonl")}
        # Named as `tiergate check` names it, not as "[Errno 17] File exists: '.../a-file'".
        refused = r"shadow\.label_log: label log .*a-file is not a directory"
        with pytest.raises(ConfigError, match=refused):
            gw.app.reload(parse_settings(changed))
        assert gw.app.runtime is runtime
        assert gw.app.shadow.rates == {"default": 0.5}
        assert gw.app.shadow.label_log_for(gw.app.runtime.settings) is runtime.label_log
        assert runtime.label_log is not None and runtime.label_log.path == log
        chat(gw, "hello")  # the old key still serves


def test_a_reload_applies_new_label_log_limits_to_the_open_log(
    ladder: Ladder, tmp_path: Path
) -> None:
    from gateway.config import parse_settings

    log = tmp_path / "labels.jsonl"
    shadow = {"rate": 0.5, "label_log": str(log), "label_log_max_bytes": 2_000_000}
    data = ladder.settings(shadow=shadow).model_dump(mode="json")
    data["tenants"][0]["api_keys"] = [API_KEY]
    with GatewayThread(parse_settings(data), policy_factory=fixed_policy(0)) as gw:
        opened = gw.app.runtime.label_log
        assert opened is not None
        data["shadow"] |= {"label_log_max_bytes": 4096, "label_log_backups": 1}
        gw.app.reload(parse_settings(data))
        assert gw.app.runtime.label_log is opened  # the same file stays open
        for i in range(60):  # ~100 bytes a line: past 4096 the log rotates
            opened.append({"id": f"r{i}", "pad": "x" * 80})
        assert log.stat().st_size <= 4096
        assert (tmp_path / "labels.jsonl.1").exists()
        assert not (tmp_path / "labels.jsonl.2").exists()  # one backup, as reloaded


def test_a_replay_waits_no_longer_than_the_gateways_own_timeouts() -> None:
    """A replay on a stalled top tier fails after `timeouts.total_s`, as a client's request
    would (it waited a hard-coded 300 s, holding a replay slot all the while)."""
    slow = Ladder.start()
    try:
        slow.sims[2].faults(added_latency_s=20.0)  # far past the bound below
        settings = slow.settings(
            shadow={"rate": 1.0}, timeouts={"connect_s": 1.0, "first_byte_s": 0.5, "total_s": 1.0}
        )
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            assert (
                send(
                    "POST",
                    f"{gw.url}/v1/chat/completions",
                    {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4,
                    },
                ).status
                == 200
            )
            labels = {"tenant": "default", "tier": "nvfp4", "outcome": "failed"}
            started = time.monotonic()
            assert gw.settled_metric("tiergate_shadow_requests_total", labels, 1) == 1
            assert time.monotonic() - started < 8.0  # total_s is 1; the stall is 20 s
            assert gw.app.shadow.inflight == 0
    finally:
        slow.stop()


def test_a_replay_picked_from_a_tier_a_reload_replaced_names_the_engines_new_model() -> None:
    """An evaluation holds the tier list it started with; a reload that renames what a kept
    endpoint serves (its engine restarted under another --served-model-name) must not send
    the replay under the old name (the engine's 404 lost the label)."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from gateway.backends.tier import build_tiers, endpoints_by_url
    from gateway.config import parse_settings
    from gateway.metrics import GatewayMetrics
    from gateway.shadow.sampler import ShadowSampler
    from gateway.stats import CompletedExchange
    from tests.helpers import Sim, free_port

    engine = Sim("bf16", free_port(), "renamed").start()
    try:
        data: dict[str, Any] = {
            "model": MODEL,
            "tiers": [
                {  # never asked here
                    "name": "nvfp4",
                    "precision": "nvfp4",
                    "endpoints": [f"http://127.0.0.1:{free_port()}/v1"],
                },
                {
                    "name": "bf16",
                    "precision": "bf16",
                    "endpoints": [f"{engine.url}/v1"],
                    "served_model_name": "old",
                },
            ],
            "tenants": [{"name": "default", "api_keys": [API_KEY]}],
            "shadow": {"rate": 1.0},
        }
        before = parse_settings(data)
        old = build_tiers(before)
        data["tiers"][1]["served_model_name"] = "renamed"
        new = build_tiers(parse_settings(data), endpoints_by_url(old))
        for tier in new:
            tier.adopt_endpoints()  # the reload is installed
        sampler = ShadowSampler(before, GatewayMetrics(CollectorRegistry()), lambda: new)
        exchange = CompletedExchange(
            tenant="default",
            kind="chat",
            tier="nvfp4",
            tier_index=0,
            request={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            body=b"",
            probability=None,
            probabilities=None,
            reason="router",
        )

        async def replay() -> str | None:
            try:
                return await sampler._replay(old[1], exchange)
            finally:
                for tier in new:
                    tier.close()

        assert asyncio.run(replay())
        assert engine.stats()["requests"] == 1
    finally:
        engine.stop()


def test_a_replay_runs_in_its_tenants_prefix_cache_namespace() -> None:
    """The replay reaches the engine in the namespace the tenant's request was served in
    (tenants.cache_salt), never in the client's raw salt nor the shared one."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from gateway.backends.tier import build_tiers
    from gateway.config import parse_settings
    from gateway.metrics import GatewayMetrics
    from gateway.shadow.sampler import ShadowSampler
    from gateway.stats import CompletedExchange
    from tests.fakes import FakeUpstream, Reply

    with FakeUpstream() as engine:
        engine.reply = Reply(body=b'{"id":"x","choices":[{"message":{"content":"ok"}}]}')
        settings = parse_settings(
            {
                "model": MODEL,
                "tiers": [
                    {"name": "nvfp4", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:9/v1"]},
                    {"name": "bf16", "precision": "bf16", "endpoints": [engine.url]},
                ],
                "tenants": [{"name": "default", "api_keys": [API_KEY]}],
                "shadow": {"rate": 1.0},
            }
        )
        tiers = build_tiers(settings)
        for tier in tiers:
            tier.adopt_endpoints()
        sampler = ShadowSampler(settings, GatewayMetrics(CollectorRegistry()), lambda: tiers)
        request = {"messages": [{"role": "user", "content": "hi"}], "cache_salt": "mine"}
        exchange = CompletedExchange(
            "default",
            "chat",
            "nvfp4",
            0,
            request,
            b"",
            None,
            None,
            "router",
            cache_salt="default:0123",
        )

        async def replay() -> str | None:
            try:
                return await sampler._replay(tiers[1], exchange)
            finally:
                for tier in tiers:
                    tier.close()

        assert asyncio.run(replay())
        assert engine.last_json()["cache_salt"] == "default:0123"
