"""The servers run the planner's flags, the engines confirm them, and the gateway's
/admin/plan reports them as running, with drift computed against its recommendation."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from gateway.live.observer import flags_from_args, flags_from_snapshot
from gateway.planner.params import settings_from_mapping
from gateway.planner.vllm_args import vllm_serve_args
from tests.vllm.deployment import ENGINE_API_KEY, Deployment, planned_args
from tests.vllm.support import (
    ENGINE_HEADERS,
    PUBLIC_MODEL,
    EngineScrape,
    admin_get,
    client,
    gateway_metric,
    gateway_settings,
    observed_gateway,
    wait_for,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

FLAGS = {"speculative": "speculative_decoding", "prefix_caching": "prefix_caching"}


def test_servers_run_the_planners_arguments(deployment: Deployment) -> None:
    planner = settings_from_mapping(deployment.planner)
    for server in deployment.servers.values():
        planned = planned_args(server.spec, planner)
        assert server.planned == planned
        # The served argv is the planner's list (checkpoint as --model) plus local flags
        # that decide none of the planner's toggles.
        assert server.served_args[: len(planned) + 1] == ["--model", *planned]
        local = set(server.served_args[len(planned) + 1 :])
        assert not local & {"--enable-prefix-caching", "--no-enable-prefix-caching"}
        assert not local & {"--speculative-config", "-sc", "--block-size", "--dtype"}


def test_engines_confirm_the_flags(deployment: Deployment) -> None:
    serve = settings_from_mapping(deployment.planner).serve
    for name, server in deployment.servers.items():
        scrape = EngineScrape.of(server)
        cache = scrape.labels("vllm:cache_config_info")
        assert cache["enable_prefix_caching"] == str(server.spec.prefix_caching), name
        assert int(cache["block_size"]) == serve.block_size, name
        assert cache["cache_dtype"] == serve.kv_cache_dtype, name
        assert float(cache["gpu_memory_utilization"]) == serve.gpu_memory_utilization, name
        # Spec-decode counters exist only where the engine speculates, one per draft slot.
        assert scrape.has("vllm:spec_decode_num_drafts_total") == server.spec.speculative, name
        positions = {
            dict(labels)["position"]
            for metric, labels, _ in scrape.samples
            if metric == "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        }
        assert positions == ({"0", "1", "2", "3"} if server.spec.speculative else set()), name
        # What the gateway reads off the page equals what it reads off the flags.
        running = flags_from_snapshot(scrape.snapshot).as_tuple()
        assert running == flags_from_args(server.served_args).as_tuple(), name
        assert running == (server.spec.speculative, server.spec.prefix_caching), name


def test_max_model_len_is_the_planners_context(deployment: Deployment) -> None:
    for server in deployment.servers.values():
        models = urllib.request.Request(f"{server.url}/v1/models", headers=ENGINE_HEADERS)
        with urllib.request.urlopen(models, timeout=10) as response:
            card = json.loads(response.read())["data"][0]
        assert card["id"] == server.served_model_name
        assert card["max_model_len"] == deployment.planner["cost"]["l_ctx"]


def plan_after_traffic(deployment: Deployment, **overrides: Any) -> dict[str, Any]:
    """/admin/plan?refresh=1 and the drift gauges after a few requests through every tier."""
    with observed_gateway(deployment, **overrides) as gw:
        sdk = client(gw)
        for tier in deployment.servers:
            for i in range(3):
                sdk.chat.completions.create(
                    model=f"{PUBLIC_MODEL}@{tier}",
                    messages=[{"role": "user", "content": f"flags check {i}"}],
                    max_tokens=8,
                    temperature=0,
                )

        def planned() -> dict[str, Any] | None:
            tiers = admin_get(gw, "/admin/plan?refresh=1")["tiers"]
            return tiers if all("recommended" in entry for entry in tiers.values()) else None

        tiers = wait_for(planned, "a recommendation for every tier")
        gauges = {
            (tier, flag): gateway_metric(gw, "tiergate_flag_drift", tier=tier, flag=flag)
            for tier in tiers
            for flag in FLAGS.values()
        }
    return {"tiers": tiers, "drift_gauges": gauges}


@pytest.mark.parametrize("source", ["vllm_args", "scrape"])
def test_admin_plan_shows_running_flags_and_drift(deployment: Deployment, source: str) -> None:
    overrides: dict[str, Any] = {}
    if source == "scrape":
        # Without vllm_args the observer reads the running flags off each engine's page.
        data = gateway_settings(deployment).model_dump(mode="json")
        overrides["tiers"] = [
            {**tier, "vllm_args": None, "api_key": ENGINE_API_KEY} for tier in data["tiers"]
        ]
    planner = settings_from_mapping(deployment.planner)
    result = plan_after_traffic(deployment, **overrides)
    for name, server in deployment.servers.items():
        entry = result["tiers"][name]
        running = entry["running"]
        assert running == {
            "speculative": server.spec.speculative,
            "prefix_caching": server.spec.prefix_caching,
        }, name
        recommended = entry["recommended"]
        assert recommended["precision"] == server.spec.precision
        # The recommendation's argv is the planner's for the recommended toggles.
        assert recommended["vllm_args"] == vllm_serve_args(
            server.spec.precision,
            speculative=recommended["speculative"],
            prefix_caching=recommended["prefix_caching"],
            model=planner.model,
            cost=planner.cost,
            serve=planner.serve,
        )
        for key, flag in FLAGS.items():
            drift = running[key] != recommended[key]
            assert entry["drift"][key] == drift, (name, key)
            assert result["drift_gauges"][(name, flag)] == float(drift), (name, flag)
