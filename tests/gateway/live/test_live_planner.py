"""The live planning loop in one process, fed chosen regimes: its advice rests on evidence
and is measured against the flags the tier runs with (hysteresis, confirmations, drift)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.backends.tier import TierBackend
from gateway.cli.plan_cmd import tier_regimes_from_gateway
from gateway.config import Settings, parse_settings
from gateway.live import upstream
from gateway.live.observer import LiveObserver, RunningFlags, Sample, agreed_flags
from gateway.metrics import GatewayMetrics
from gateway.observer.regime import (
    ConcurrencySummary,
    RegimeReport,
    RegimeTracker,
    RhoSummary,
    RSummary,
)
from gateway.planner.planner import Planner, TierConfig

TIER = "bf16"


def report(rho: float | None, r: float | None) -> RegimeReport:
    """32 requests in flight; rho and r as given (None: nothing measured them)."""
    return RegimeReport(
        tier=TIER,
        tenant="*",
        precision=TIER,
        now=0.0,
        window_s=60.0,
        concurrency=ConcurrencySummary(32.0, None, None, None, None),
        rho=RhoSummary(None, rho, None, 0, None),
        r=RSummary(r, None, None, None, None, 0, None, None, r_reference=r),
        l_in=None,
        l_out=None,
    )


class Loop:
    """A LiveObserver over one bf16 tier running without speculation, with prefix caching."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        settings, tier = self.config(["--enable-prefix-caching"])
        self.registry = CollectorRegistry()
        self.tiers = [tier]
        self.now = 0.0
        self.observer = LiveObserver(
            settings, GatewayMetrics(self.registry), lambda: self.tiers, clock=lambda: self.now
        )
        self.observer.configure(settings)
        self.regime = report(None, None)
        monkeypatch.setattr(RegimeTracker, "report", lambda _tracker, _tier, _now: self.regime)

    @staticmethod
    def config(vllm_args: list[str] | None) -> tuple[Settings, TierBackend]:
        settings = parse_settings(
            {
                "model": "m",
                "tiers": [
                    {"name": "nvfp4", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:8/v1"]},
                    {
                        "name": TIER,
                        "precision": TIER,
                        "endpoints": ["http://127.0.0.1:9/v1"],
                        "vllm_args": vllm_args,
                    },
                ],
                "tenants": [{"name": "default", "api_keys": ["k"]}],
                "planner": {"policy": {"dwell_s": 0, "confirmations": 2, "hysteresis": 0.05}},
            }
        )
        return settings, TierBackend(1, TIER, settings.tiers[1], "m")  # the only one observed

    def reload(self, vllm_args: list[str] | None) -> None:
        settings, tier = self.config(vllm_args)
        self.tiers = [tier]
        self.observer.configure(settings)

    def plan(self, rho: float | None, r: float | None) -> dict[str, Any]:
        self.now += 60.0
        self.regime = report(rho, r)
        self.observer.plan_once()
        entry: dict[str, Any] = self.observer.plan_view()[TIER]
        return entry

    def gauge(self, name: str, flag: str) -> float | None:
        return self.registry.get_sample_value(name, {"tier": TIER, "flag": flag})


def test_an_unmeasured_rho_keeps_prefix_caching_as_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = Loop(monkeypatch)
    # Copy-heavy traffic (r 0.9) whose prompts no sampled request measured yet: a stand-in
    # rho of 0 would advise turning the running prefix cache off; it stays on.
    first = loop.plan(None, 0.9)
    assert first["regime"]["rho"] is None and first["regime"]["r"] == 0.9
    assert first["candidate"]["prefix_caching"] is True
    assert any("not measured yet" in r for r in first["candidate"]["reasons"])
    assert loop.gauge("tiergate_flag_drift", "prefix_caching") == 0.0
    # Speculation pays on r 0.9, but one evaluation is not yet two confirmations: the advice
    # is what runs, and nothing drifts.
    assert first["action"] == "pending"
    assert first["candidate"]["speculative"] is True
    assert first["recommended"]["speculative"] is False
    assert first["recommended"]["reasons"][0].startswith("held: confirmation 1/2")
    # The held advice's own reason says why it is off although r is above r*.
    (held,) = [r for r in first["recommended"]["reasons"] if r.startswith("speculation")]
    assert held.startswith("speculation off as it runs: r 0.900 >")
    assert held.endswith("would turn it on here; held")
    assert loop.gauge("tiergate_flag_recommended", "speculative_decoding") == 0.0
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 0.0
    # Confirmed: the advice is to speculate, the running flags drift from it, and the
    # advice stands at the next evaluation (the tier has not been restarted).
    for _ in range(2):
        confirmed = loop.plan(None, 0.9)
        assert confirmed["action"] == "switch" and "candidate" not in confirmed
        assert confirmed["recommended"]["speculative"] is True
        assert confirmed["drift"] == {"speculative": True, "prefix_caching": False}
        assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 1.0
    # Measured: rho 0 now is evidence, and the cache goes off with the same confirmations.
    measured = loop.plan(0.0, 0.9)
    assert measured["regime"]["rho"] == 0.0
    assert measured["action"] == "pending"
    assert measured["candidate"]["prefix_caching"] is False


def test_an_unmeasured_r_keeps_speculation_as_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = Loop(monkeypatch)
    loop.reload(["--speculative-config", '{"method": "ngram"}', "--enable-prefix-caching"])
    entry = loop.plan(0.0, None)  # prompts measured (nothing shared), no answer sampled yet
    assert entry["regime"]["r"] is None and entry["regime"]["rho"] == 0.0
    # rho 0 is evidence: the cache goes off after confirmations; speculation stays on.
    assert entry["candidate"]["speculative"] is True
    assert entry["candidate"]["prefix_caching"] is False
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 0.0


def test_a_reload_that_restarts_the_tier_is_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = Loop(monkeypatch)
    for _ in range(2):
        advised = loop.plan(None, 0.9)
    assert advised["action"] == "switch" and advised["drift"]["speculative"] is True
    # The operator applies the advice and reloads the gateway with the new arguments.
    loop.reload(["--speculative-config", '{"method": "ngram"}', "--enable-prefix-caching"])
    applied = loop.plan(None, 0.9)
    assert applied["running"] == {"speculative": True, "prefix_caching": True}
    assert applied["action"] == "hold" and "candidate" not in applied
    assert applied["drift"] == {"speculative": False, "prefix_caching": False}
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 0.0


def test_regime_view_tells_plan_from_gateway_what_the_tier_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`/admin/regime` carries each tier's running flags, so `plan --from-gateway` plans
    against them (its reasons say what keeping them would cost) as the live planner does."""
    loop = Loop(monkeypatch)
    loop.reload(["--speculative-config", '{"method": "ngram"}', "--enable-prefix-caching"])
    loop.plan(0.5, 0.2)
    view = loop.observer.regime_view()
    assert view["tiers"][TIER]["current"] == {"speculative": True, "prefix_caching": True}
    planned = tier_regimes_from_gateway(view)[TIER]
    assert planned.regime is not None
    assert planned.current == TierConfig("bf16", speculative=True, prefix_caching=True)
    loop.reload(None)  # neither flag known (no vllm_args, nothing scraped): nothing to compare
    assert loop.observer.regime_view()["tiers"][TIER]["current"] is None


def test_the_flag_an_engine_shows_is_followed_while_the_other_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No vllm_args, and an engine without `cache_config_info`: its metrics show speculation
    off (no spec-decode counters) but not prefix caching. Advice to speculate that nobody
    applies stays a switch, with the flag drifting, at every evaluation; before, the planner
    waited for both flags and took its own advice as applied ("hold")."""
    loop = Loop(monkeypatch)
    loop.reload(None)
    url = "http://127.0.0.1:9/v1"
    loop.tiers[0].endpoints[:] = stand_ins([url])

    async def get(_endpoint: Any, _path: bytes) -> bytes:
        return _metrics_page(1000.0, 0.0, 4.0)

    monkeypatch.setattr(upstream, "get", get)
    asyncio.run(loop.observer.scrape_once())
    entries = [loop.plan(None, 0.9) for _ in range(4)]
    assert entries[-1]["running"] == {"speculative": False, "prefix_caching": None}
    assert [entry["action"] for entry in entries] == ["initial", "pending", "switch", "switch"]
    assert entries[-1]["recommended"]["speculative"] is True
    assert entries[-1]["drift"]["speculative"] is True
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 1.0


def test_with_neither_flag_seen_the_planner_takes_its_own_advice_as_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No vllm_args and no engine metrics: nothing to follow, so the planner plans as offline
    and, once its advice is confirmed, takes it as applied (hold), not as drift forever."""
    loop = Loop(monkeypatch)
    loop.reload(None)
    # First no repetition (no speculation advised), then copy-heavy traffic.
    entries = [loop.plan(None, 0.0)] + [loop.plan(None, 0.9) for _ in range(3)]
    assert entries[-1]["running"] == {"speculative": None, "prefix_caching": None}
    assert [entry["action"] for entry in entries] == ["initial", "pending", "switch", "hold"]
    assert entries[-1]["recommended"]["speculative"] is True


def test_replicas_that_disagree_leave_the_flag_unknown() -> None:
    on, off = RunningFlags(True, True), RunningFlags(False, True)
    assert agreed_flags([on, on]).as_tuple() == (True, True)
    assert agreed_flags([on, off]).as_tuple() == (None, True)
    assert agreed_flags([]).as_tuple() == (None, None)


def stand_ins(urls: list[str]) -> list[Any]:
    """Stand-ins for the endpoint states the proxy builds (only the URL and health are read)."""
    return [SimpleNamespace(endpoint=SimpleNamespace(url=url), healthy=True) for url in urls]


def observer_over(
    tiers: list[dict[str, Any]], planner: dict[str, Any], clock: Callable[[], float] = lambda: 100.0
) -> LiveObserver:
    """A LiveObserver over the given tiers and planner settings."""
    settings = parse_settings(
        {
            "model": "m",
            "tiers": tiers,
            "tenants": [{"name": "default", "api_keys": ["k"]}],
            "planner": planner,
        }
    )
    backends = [TierBackend(i, t.name, t, "m") for i, t in enumerate(settings.tiers)]
    observer = LiveObserver(
        settings, GatewayMetrics(CollectorRegistry()), lambda: backends, clock=clock
    )
    observer.configure(settings)
    return observer


def tier(name: str, precision: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "precision": precision,
        "endpoints": [f"http://127.0.0.1:{port}/v1"],
        "vllm_args": ["--enable-prefix-caching"],
    }


def busy(_tracker: RegimeTracker, name: str, _now: float) -> RegimeReport:
    return RegimeReport(
        tier=name,
        tenant="*",
        precision=None,
        now=100.0,
        window_s=300.0,
        concurrency=ConcurrencySummary(32.0, None, None, None, None),
        rho=RhoSummary(None, 0.5, None, 1000, None),
        r=RSummary(0.5, None, None, None, None, 100, None, None, r_reference=0.5),
        l_in=None,
        l_out=None,
    )


def test_a_tier_whose_weights_do_not_fit_does_not_stop_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At u = 0.3 BF16's 61 GB of weights exceed the 57.6 GB budget (K = 0). That raised
    ZeroDivisionError out of plan_once, and no later tier was planned."""
    monkeypatch.setattr(RegimeTracker, "report", busy)
    # bf16 is listed first (so a cost override keeps the ladder cheapest first): a failure
    # there must not stop the tiers after it.
    observer = observer_over(
        [{**tier("big", "bf16", 8), "cost": 0.2}, tier("small", "nvfp4", 9)],
        {"cost": {"gpu_memory_fraction": 0.3}},
    )
    observer.plan_once()
    view = observer.plan_view()
    assert "weights do not fit" in view["big"]["note"] and "recommended" not in view["big"]
    assert view["small"]["recommended"]["precision"] == "nvfp4"


def test_one_tier_failing_is_noted_and_the_others_still_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(RegimeTracker, "report", busy)
    observer = observer_over([{**tier("a", "bf16", 8), "cost": 0.2}, tier("b", "nvfp4", 9)], {})
    original = Planner.step

    def step(planner: Planner, now: float, regime: Any) -> Any:
        if planner.candidates == ("bf16",):
            raise RuntimeError("boom")
        return original(planner, now, regime)

    monkeypatch.setattr(Planner, "step", step)
    observer.plan_once()
    view = observer.plan_view()
    assert view["a"]["note"] == "planning failed: boom"
    assert view["b"]["recommended"]["precision"] == "nvfp4"


@pytest.mark.parametrize(
    "planner",
    [
        {"cost": {"q_min": 0.99}},  # NVFP4's Q 0.980 is below this floor
        {"hardware": "h200", "policy": {"require_native_compute": True}},  # Marlin on SM90
    ],
    ids=["quality-floor", "native-compute"],
)
def test_a_live_tiers_precision_is_fixed_so_only_its_toggles_are_planned(
    monkeypatch: pytest.MonkeyPatch, planner: dict[str, Any]
) -> None:
    """The ladder fixes a tier's precision; the precision filters used to leave an NVFP4
    tier at "no feasible precision" forever (`plan --from-gateway` plans it with q_min 0)."""
    monkeypatch.setattr(RegimeTracker, "report", busy)
    observer = observer_over([tier("cheap", "nvfp4", 8), tier("strong", "bf16", 9)], planner)
    observer.plan_once()
    entry = observer.plan_view()["cheap"]
    assert "no feasible precision" not in entry["note"]
    assert entry["recommended"]["precision"] == "nvfp4"


def _metrics_page(queries: float, hits: float, running: float) -> bytes:
    return (
        f'vllm:num_requests_running{{model_name="m",engine="0"}} {running}\n'
        f'vllm:prefix_cache_queries_total{{model_name="m",engine="0"}} {queries}\n'
        f'vllm:prefix_cache_hits_total{{model_name="m",engine="0"}} {hits}\n'
    ).encode()


def test_scrapes_are_diffed_per_replica_and_c_is_per_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replicas of one tier, each adding 1000 prefix queries and 500 hits per scrape
    (true rho 0.5); 20 requests in flight through the gateway, 10 per replica (the engines
    see 4 running at each scrape instant)."""
    now = [100.0]
    replicas = ["http://127.0.0.1:8/v1", "http://127.0.0.1:9/v1"]
    observer = observer_over(
        [{**tier("nv", "nvfp4", 8), "endpoints": replicas}, tier("x", "bf16", 7)],
        {},
        clock=lambda: now[0],
    )
    counters = {"http://127.0.0.1:8/v1": [1e6, 1e5], "http://127.0.0.1:9/v1": [2e6, 1.6e6]}

    async def get(endpoint: Any, _path: bytes) -> bytes:
        queries, hits = counters[endpoint.endpoint.url]
        return _metrics_page(queries, hits, 4.0)

    monkeypatch.setattr(upstream, "get", get)
    backend = next(b for b in observer.tiers() if b.name == "nv")
    backend.endpoints[:] = stand_ins(replicas)
    for _ in range(20):
        observer.upstream_started("nv", "default")
    for _ in range(4):
        for values in counters.values():
            values[0] += 1000.0
            values[1] += 500.0
        now[0] += 15.0
        asyncio.run(observer.scrape_once())
    doc = observer.regime_view()["tiers"]["nv"]
    assert doc["rho"]["engine"] == pytest.approx(0.5)
    assert doc["concurrency"]["endpoints"] == 2
    observer.plan_once()
    assert observer.plan_view()["nv"]["regime"]["concurrency"] == pytest.approx(10.0)


def test_a_tier_gone_idle_stops_reporting_drift(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drift is judged at the observed regime: once the window holds no traffic there is
    none, so the alert on it must not keep firing on the last busy window's advice."""
    loop = Loop(monkeypatch)
    for _ in range(3):
        loop.plan(None, 0.9)
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 1.0
    loop.regime = RegimeReport(
        tier=TIER,
        tenant="*",
        precision=TIER,
        now=0.0,
        window_s=60.0,
        concurrency=ConcurrencySummary(None, None, None, None, None),
        rho=RhoSummary(None, None, None, 0, None),
        r=RSummary(None, None, None, None, None, 0, None, None),
        l_in=None,
        l_out=None,
    )
    loop.now += 60.0
    loop.observer.plan_once()
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 0.0
    assert loop.gauge("tiergate_flag_drift", "prefix_caching") == 0.0
    assert loop.gauge("tiergate_flag_recommended", "speculative_decoding") == 1.0  # advice kept
    assert loop.observer.plan_view()[TIER]["note"] == "no traffic in the window"


def test_a_sampled_chat_is_tokenized_with_its_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's prompt is the chat template over messages and tools; the replay must
    tokenize the same, or a shared tool schema never shows in rho."""
    observer = observer_over([tier("nv", "nvfp4", 8), tier("x", "bf16", 7)], {})
    backend = next(b for b in observer.tiers() if b.name == "nv")
    endpoint: Any = SimpleNamespace(endpoint=SimpleNamespace(url="u"), healthy=True)
    backend.endpoints[:] = [endpoint]  # a stand-in: only the health is read
    queries: list[dict[str, Any]] = []

    async def tokenize(_endpoint: Any, query: dict[str, Any]) -> list[int]:
        queries.append(query)
        return [1, 2, 3]

    monkeypatch.setattr(upstream, "tokenize", tokenize)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    request = {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": tools,
        "chat_template_kwargs": {"enable_thinking": False},
        "temperature": 0.0,
    }
    asyncio.run(observer.process(Sample("nv", "default", request, b"", 1.0)))
    assert queries[0]["tools"] == tools
    assert queries[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "temperature" not in queries[0]


def test_a_sampled_completion_is_tokenized_from_its_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A completions body's stray `messages`, which vLLM ignores, is not what the replay
    tokenizes."""
    observer = observer_over([tier("nv", "nvfp4", 8), tier("x", "bf16", 7)], {})
    backend = next(b for b in observer.tiers() if b.name == "nv")
    endpoint: Any = SimpleNamespace(endpoint=SimpleNamespace(url="u"), healthy=True)
    backend.endpoints[:] = [endpoint]
    queries: list[dict[str, Any]] = []

    async def tokenize(_endpoint: Any, query: dict[str, Any]) -> list[int]:
        queries.append(query)
        return [1, 2, 3]

    monkeypatch.setattr(upstream, "tokenize", tokenize)
    request = {"prompt": "Once upon a time", "messages": [{"role": "user", "content": "hi"}]}
    sample = Sample("nv", "default", request, b"", 1.0, kind="completions")
    asyncio.run(observer.process(sample))
    assert queries[0]["prompt"] == "Once upon a time"
    assert "messages" not in queries[0]


def test_a_sampled_answer_is_cached_in_its_requests_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the engine caches an answer's full blocks under the request's cache_salt, the
    replay does: the tenant's next turn hits them, another namespace's copy does not."""
    observer = observer_over([tier("nv", "nvfp4", 8), tier("x", "bf16", 7)], {})
    backend = next(b for b in observer.tiers() if b.name == "nv")
    endpoint: Any = SimpleNamespace(endpoint=SimpleNamespace(url="u"), healthy=True)
    backend.endpoints[:] = [endpoint]
    prompt, answer = list(range(100, 132)), list(range(200, 217))  # 2 blocks; 1 more

    async def tokenize(_endpoint: Any, _query: dict[str, Any]) -> list[int]:
        return answer  # only the answer's text is tokenized: the prompts are token ids

    monkeypatch.setattr(upstream, "tokenize", tokenize)
    body = b'{"choices": [{"index": 0, "text": "the answer"}]}'
    turn = [*prompt, *answer, 1]

    def sampled(tokens: list[int], salt: str, at: float) -> None:
        request = {"prompt": tokens}
        sample = Sample("nv", salt, request, body, at, kind="completions", cache_salt=salt)
        asyncio.run(observer.process(sample))

    sampled(prompt, "a", 0.0)
    sampled(turn, "b", 1.0)  # a's blocks are not b's
    sampled(turn, "a", 2.0)  # a's own, its answer's block included
    tracker = observer._states["nv"].tracker
    assert tracker.report("nv", 3.0, tenant="b").rho.unbounded == 0.0
    assert tracker.report("nv", 3.0, tenant="a").rho.unbounded == pytest.approx(48 / (32 + 50))


def test_the_knee_comes_from_the_kv_blocks_the_engines_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """b.2 item 4: K = num_gpu_blocks x block_size / L_ctx from cache_config_info, the least
    of the tier's replicas, instead of the memory estimate; /admin/regime shows it for
    `plan --from-gateway`, and an engine restarted with another budget replans."""
    replicas = ["http://127.0.0.1:8/v1", "http://127.0.0.1:9/v1"]
    observer = observer_over(
        [{**tier("nv", "nvfp4", 8), "endpoints": replicas}, tier("x", "bf16", 7)], {}
    )
    blocks = {replicas[0]: 6400, replicas[1]: 3200}  # x 16 tokens / 4096 (L_ctx): K 25, 12

    async def get(endpoint: Any, _path: bytes) -> bytes:
        info = (
            'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
            f'num_gpu_blocks="{blocks[endpoint.endpoint.url]}"}} 1.0\n'
        )
        return _metrics_page(1e6, 1e5, 4.0) + info.encode()

    monkeypatch.setattr(upstream, "get", get)
    monkeypatch.setattr(RegimeTracker, "report", busy)  # 32 in flight: above either knee
    backend = next(b for b in observer.tiers() if b.name == "nv")
    backend.endpoints[:] = stand_ins(replicas)
    observer.plan_once()
    estimated = observer.plan_view()["nv"]["recommended"]["knee"]
    assert estimated > 25  # the memory estimate of an NVFP4 30B on a B200 (438)
    asyncio.run(observer.scrape_once())
    observer.plan_once()
    view = observer.plan_view()["nv"]
    assert view["engine_kv_capacity_tokens"] == 3200 * 16
    assert view["recommended"]["knee"] == 12 and view["recommended"]["b_eff"] == 12.0
    regime = observer.regime_view()["tiers"]["nv"]
    assert regime["engine_kv_capacity_tokens"] == regime["kv_capacity_tokens"] == 3200 * 16
    assert observer.regime_view()["hardware"] == "b200"  # where that capacity holds
    blocks[replicas[1]] = 9600  # restarted with more memory: the other replica bounds it
    asyncio.run(observer.scrape_once())
    observer.plan_once()
    assert observer.plan_view()["nv"]["recommended"]["knee"] == 25


def test_a_replica_missing_a_scrape_keeps_the_tiers_kv_capacity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """K is the least replica's: the smaller one missing a scrape (busy, restarting) must not
    raise it to the other's, nor reset the planner's confirmations on every such miss."""
    replicas = ["http://127.0.0.1:8/v1", "http://127.0.0.1:9/v1"]
    observer = observer_over(
        [{**tier("nv", "nvfp4", 8), "endpoints": replicas}, tier("x", "bf16", 7)], {}
    )
    blocks = {replicas[0]: 6400, replicas[1]: 3200}
    answering = set(replicas)

    async def get(endpoint: Any, _path: bytes) -> bytes | None:
        url = endpoint.endpoint.url
        if url not in blocks or url not in answering:
            return None
        info = (
            'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
            f'num_gpu_blocks="{blocks[url]}"}} 1.0\n'
        )
        return _metrics_page(1e6, 1e5, 4.0) + info.encode()

    monkeypatch.setattr(upstream, "get", get)
    backend = next(b for b in observer.tiers() if b.name == "nv")
    backend.endpoints[:] = stand_ins(replicas)
    asyncio.run(observer.scrape_once())
    planner = observer._states["nv"].planner
    reconfigured: list[object] = []
    monkeypatch.setattr(planner, "reconfigure", reconfigured.append)
    answering.discard(replicas[1])
    asyncio.run(observer.scrape_once())
    assert observer.plan_view()["nv"]["engine_kv_capacity_tokens"] == 3200 * 16
    answering.add(replicas[1])
    asyncio.run(observer.scrape_once())
    assert reconfigured == []


def test_each_engine_scrape_is_counted_by_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine whose counters never reach the observer shows in
    tiergate_engine_scrapes_total, not only as a regime without engine figures."""
    page = _metrics_page(1e6, 1e5, 4.0)
    pages: dict[str, bytes | None] = {
        "ok": page,
        "failed": None,
        "unparsable": b"<html>Service Unavailable</html>",
        "not utf-8": b"\xff\xfe" + page,
        "no_model": page.replace(b'model_name="m"', b'model_name="another-model"'),
    }
    replicas = {f"http://127.0.0.1:{port}/v1": case for port, case in enumerate(pages, 1)}
    observer = observer_over(
        [{**tier("nv", "nvfp4", 8), "endpoints": list(replicas)}, tier("x", "bf16", 7)], {}
    )

    async def get(endpoint: Any, _path: bytes) -> bytes | None:
        return pages[replicas[endpoint.endpoint.url]]

    monkeypatch.setattr(upstream, "get", get)
    backend = next(b for b in observer.tiers() if b.name == "nv")
    backend.endpoints[:] = stand_ins(replicas)
    asyncio.run(observer.scrape_once())
    asyncio.run(observer.scrape_once())
    expected = {"ok": "ok", "failed": "failed", "unparsable": "unparsable"}
    expected |= {"not utf-8": "unparsable", "no_model": "no_model"}
    for url, case in replicas.items():
        for outcome in ("ok", "failed", "unparsable", "no_model"):
            labels = {"tier": "nv", "endpoint": url, "outcome": outcome}
            counted = observer.metrics.registry.get_sample_value(
                "tiergate_engine_scrapes_total", labels
            )
            assert counted == (2.0 if outcome == expected[case] else None), (case, outcome)


def test_a_reload_that_removes_every_reporting_replica_returns_k_to_the_estimate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The KV capacity of replicas a reload removed bounds nothing any more: until the new
    ones report, K comes from the memory estimate again."""
    old, new = "http://127.0.0.1:8/v1", "http://127.0.0.1:6/v1"
    observer = observer_over([tier("nv", "nvfp4", 8), tier("x", "bf16", 7)], {})

    async def get(endpoint: Any, _path: bytes) -> bytes | None:
        info = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="3200"} 1.0\n'
        return (
            _metrics_page(1e6, 1e5, 4.0) + info.encode() if endpoint.endpoint.url == old else None
        )

    monkeypatch.setattr(upstream, "get", get)
    monkeypatch.setattr(RegimeTracker, "report", busy)
    backends = observer.tiers()
    backends[0].endpoints[:] = [SimpleNamespace(endpoint=SimpleNamespace(url=old), healthy=True)]
    asyncio.run(observer.scrape_once())
    observer.plan_once()
    assert observer.plan_view()["nv"]["recommended"]["knee"] == 12
    settings = parse_settings(
        {
            "model": "m",
            "tiers": [{**tier("nv", "nvfp4", 6), "endpoints": [new]}, tier("x", "bf16", 7)],
            "tenants": [{"name": "default", "api_keys": ["k"]}],
        }
    )
    assert isinstance(backends, list)
    backends[:] = [TierBackend(i, t.name, t, "m") for i, t in enumerate(settings.tiers)]
    observer.configure(settings)
    observer.plan_once()
    view = observer.plan_view()["nv"]
    assert view["engine_kv_capacity_tokens"] is None
    assert view["recommended"]["knee"] == 438  # the estimate: NVFP4 30B on a B200


def test_a_reload_applies_its_plan_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planning and scraping tasks read their interval once, when started: a reload that
    changed plan_interval_s (here from 0.02 s to an hour) kept planning at the old pace."""
    loop = Loop(monkeypatch)
    plans: list[float] = []
    monkeypatch.setattr(loop.observer, "plan_once", lambda: plans.append(loop.now))

    async def nothing() -> None:
        return None

    monkeypatch.setattr(loop.observer, "scrape_once", nothing)

    def with_interval(seconds: float) -> Settings:
        data = loop.observer.settings.model_dump(mode="json")
        data["observer"]["plan_interval_s"] = seconds
        return parse_settings(data)

    async def main() -> None:
        loop.observer.configure(with_interval(0.02))
        tasks = loop.observer.start()
        await asyncio.sleep(0.1)
        assert plans
        loop.observer.configure(with_interval(3600.0))
        await asyncio.sleep(0.05)  # the sleep begun under 0.02 s runs out
        planned = len(plans)
        await asyncio.sleep(0.2)
        assert len(plans) == planned
        # Shortened again: the hour's sleep under way re-reads it (within periods.RECHECK_S).
        loop.observer.configure(with_interval(0.02))
        await asyncio.sleep(1.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert len(plans) > planned

    asyncio.run(main())


def test_a_flag_replicas_disagree_on_leaves_no_stale_running_or_drift_gauge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replicas, neither speculating: advice to speculate drifts. One replica is then
    restarted with speculation (a rolling restart): the flag is unknown, as /admin/plan says
    (null); the gauges used to keep saying "runs off, drifts"."""
    loop = Loop(monkeypatch)
    loop.reload(None)
    replicas = ["http://127.0.0.1:8/v1", "http://127.0.0.1:9/v1"]
    loop.tiers[0].endpoints[:] = stand_ins(replicas)
    speculating: set[str] = set()

    async def get(endpoint: Any, _path: bytes) -> bytes:
        page = _metrics_page(1000.0, 0.0, 4.0)
        if endpoint.endpoint.url in speculating:
            page += b'vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 10\n'
        return page

    monkeypatch.setattr(upstream, "get", get)
    asyncio.run(loop.observer.scrape_once())
    for _ in range(3):
        entry = loop.plan(None, 0.9)
    assert entry["drift"]["speculative"] is True
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") == 1.0
    speculating.add(replicas[1])
    asyncio.run(loop.observer.scrape_once())
    entry = loop.plan(None, 0.9)
    assert entry["running"]["speculative"] is None and entry["drift"]["speculative"] is None
    assert loop.gauge("tiergate_flag_running", "speculative_decoding") is None
    assert loop.gauge("tiergate_flag_drift", "speculative_decoding") is None
    cpt = "tiergate_planner_expected_cost_per_token_seconds"
    assert loop.registry.get_sample_value(cpt, {"tier": TIER, "config": "running"}) is None


def test_replicas_that_disagree_on_a_flag_leave_no_running_cost_nor_current_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both replicas cache prefixes and neither speculates: the running configuration's cost
    is exported and `/admin/regime` names it. One replica restarted with speculation makes
    the tier's speculation unknown: the cost of "what runs" and the configuration that
    `plan --from-gateway` would keep are then unknown too, not the last known ones."""
    loop = Loop(monkeypatch)
    loop.reload(None)
    replicas = ["http://127.0.0.1:8/v1", "http://127.0.0.1:9/v1"]
    loop.tiers[0].endpoints[:] = stand_ins(replicas)
    speculating: set[str] = set()
    info = b'vllm:cache_config_info{block_size="16",enable_prefix_caching="True"} 1.0\n'

    async def get(endpoint: Any, _path: bytes) -> bytes:
        page = _metrics_page(1000.0, 0.0, 4.0) + info
        if endpoint.endpoint.url in speculating:
            page += b'vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 10\n'
        return page

    monkeypatch.setattr(upstream, "get", get)
    cpt = "tiergate_planner_expected_cost_per_token_seconds"
    asyncio.run(loop.observer.scrape_once())
    loop.plan(0.5, 0.2)
    assert loop.registry.get_sample_value(cpt, {"tier": TIER, "config": "running"}) is not None
    current = loop.observer.regime_view()["tiers"][TIER]["current"]
    assert current == {"speculative": False, "prefix_caching": True}
    speculating.add(replicas[1])
    asyncio.run(loop.observer.scrape_once())
    entry = loop.plan(0.5, 0.2)
    assert entry["running"] == {"speculative": None, "prefix_caching": True}
    assert loop.registry.get_sample_value(cpt, {"tier": TIER, "config": "running"}) is None
    assert loop.observer.regime_view()["tiers"][TIER]["current"] is None
