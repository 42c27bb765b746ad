"""Hot reload (admin, SIGHUP, file watch) and graceful shutdown, on a real child process."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings, parse_settings
from tests.helpers import API_KEY, MODEL, GatewayProcess, Ladder, send, wait_for, write_settings

ADMIN = "reload-admin-token"


def post(url: str, body: Any, key: str = API_KEY, timeout: float = 30) -> tuple[int, bytes]:
    reply = send("POST", url, body, key=key, timeout=timeout)
    return reply.status, reply.body


def chat(url: str, key: str = API_KEY) -> int:
    return post(
        f"{url}/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        key,
    )[0]


def config(ladder: Ladder, path: Path, keys: list[str]) -> Path:
    data = ladder.settings().model_dump(mode="json")
    data["tenants"] = [{"name": "default", "api_keys": keys}]
    data["admin"] = {"token": ADMIN}
    from gateway.config import parse_settings

    return write_settings(path, parse_settings(data))


def unreachable_tiers(top_port: int, **sections: Any) -> Settings:
    """Tier a on 127.0.0.1:9 and tier b on `top_port` (nothing listens on either), one
    tenant, and the given configuration sections: for reloads that never send a request."""
    return parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": "a", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:9/v1"]},
                {
                    "name": "b",
                    "precision": "bf16",
                    "endpoints": [f"http://127.0.0.1:{top_port}/v1"],
                },
            ],
            "tenants": [{"name": "t", "api_keys": [API_KEY]}],
            **sections,
        }
    )


def test_reload_by_admin_sighup_and_file_watch(ladder: Ladder, tmp_path: Path) -> None:
    path = config(ladder, tmp_path / "tiergate.yaml", [API_KEY])
    with GatewayProcess(path) as gw:
        assert chat(gw.url) == 200 and chat(gw.url, "sk-new") == 401
        # 1. an invalid file is refused; the running configuration keeps serving
        path.write_text(path.read_text().replace("precision: w4a16", "precision: w9a9"))
        status, body = post(f"{gw.url}/admin/reload", {}, ADMIN)
        assert status == 400 and b"tiers.1.precision" in body
        assert chat(gw.url) == 200
        # 2. a valid file through the admin API
        config(ladder, path, [API_KEY, "sk-new"])
        status, body = post(f"{gw.url}/admin/reload", {}, ADMIN)
        assert status == 200 and chat(gw.url, "sk-new") == 200
        assert json.loads(body)["restart_needed"] == []
        # 3. SIGHUP
        config(ladder, path, ["sk-hup"])
        assert gw.process is not None
        gw.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while chat(gw.url, "sk-hup") != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert chat(gw.url, "sk-hup") == 200 and chat(gw.url) == 401
        # 4. the file watch picks a change up by itself
        time.sleep(1.1)  # a distinct mtime
        config(ladder, path, ["sk-watched"])
        deadline = time.monotonic() + 10
        while chat(gw.url, "sk-watched") != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert chat(gw.url, "sk-watched") == 200


def test_a_reload_that_cannot_load_the_router_is_refused_by_every_trigger(
    ladder: Ladder, tmp_path: Path
) -> None:
    import yaml

    path = config(ladder, tmp_path / "tiergate.yaml", [API_KEY])
    log = tmp_path / "gateway.log"
    with GatewayProcess(path, log_path=log) as gw:
        broken = yaml.safe_load(path.read_text())
        broken["router"] = {"model_dir": str(tmp_path / "no-such-model")}
        time.sleep(1.1)  # a distinct mtime, so the file watch sees this write too
        path.write_text(yaml.safe_dump(broken))
        status, body = post(f"{gw.url}/admin/reload", {}, ADMIN)
        assert status == 400 and b"no-such-model" in body
        assert gw.process is not None
        gw.process.send_signal(signal.SIGHUP)
        assert chat(gw.url) == 200
        # The file watch refused it too (it looks once a second: a fixed 1.5 s could end
        # before it did on a slow machine) and lives on: the next valid edit arrives by itself.
        assert wait_for(lambda: log.read_text().count("configuration reload refused") >= 3, 10)
        config(ladder, path, ["sk-after"])
        deadline = time.monotonic() + 10
        while chat(gw.url, "sk-after") != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert chat(gw.url, "sk-after") == 200
    text = log.read_text()
    # admin call, SIGHUP and file watch: one log line each, no traceback
    assert text.count("configuration reload refused") >= 3, text
    assert "Traceback" not in text


def test_reload_under_load_loses_nothing(ladder: Ladder, tmp_path: Path) -> None:
    path = config(ladder, tmp_path / "tiergate.yaml", [API_KEY])
    with GatewayProcess(path) as gw:
        results: list[int] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                results.append(chat(gw.url))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        for i in range(6):
            config(ladder, path, [API_KEY, f"sk-extra-{i}"])
            assert post(f"{gw.url}/admin/reload", {}, ADMIN)[0] == 200
            time.sleep(0.2)
        stop.set()
        for thread in threads:
            thread.join()
        assert len(results) > 20
        assert set(results) == {200}


def test_graceful_shutdown_finishes_streams_in_flight(tmp_path: Path) -> None:
    slow = Ladder.start(extra_args=("--time-scale", "20"))
    try:
        path = config(slow, tmp_path / "tiergate.yaml", [API_KEY])
        with GatewayProcess(path) as gw:
            assert gw.process is not None
            request = urllib.request.Request(
                f"{gw.url}/v1/chat/completions",
                data=json.dumps(
                    {
                        "model": MODEL,
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 60,
                        "stream": True,
                    }
                ).encode(),
                method="POST",
            )
            request.add_header("authorization", f"Bearer {API_KEY}")
            request.add_header("content-type", "application/json")
            response = urllib.request.urlopen(request, timeout=60)
            first = response.readline()
            assert first.startswith(b"data: ")
            gw.process.send_signal(signal.SIGTERM)  # mid-stream
            rest = response.read()
            assert rest.rstrip().endswith(b"data: [DONE]")  # the stream ran to its end
            assert gw.process.wait(timeout=30) == 0
            with pytest.raises(OSError):
                urllib.request.urlopen(f"{gw.url}/health", timeout=2)  # no longer accepting
    finally:
        slow.stop()


def test_a_reload_that_changes_the_limit_store_is_refused() -> None:
    """The Redis client of shared limits is built at start: a reload that adds, removes or
    moves it is refused whole (it was accepted, shown by /admin/config, and not applied),
    while the request timeout a reload changes reaches the limiters built from then on."""
    from gateway.app import build_app
    from gateway.config import ConfigError

    def settings(**extra: Any) -> Any:
        return unreachable_tiers(9, **extra)

    app = build_app(settings(), environ={})
    running = app.runtime
    with pytest.raises(ConfigError, match="shared_limits cannot change"):
        app.reload(settings(shared_limits={"redis_url": "redis://127.0.0.1:1/0"}))
    assert app.runtime is running and app.admission.redis is None
    app.reload(settings(timeouts={"total_s": 60}))
    assert app.admission.max_request_s == 60
    # The sockets are bound at start: a new server block waits for a restart, and the
    # running settings (what /admin/config shows) keep the one that serves.
    app.reload(settings(server={"port": 9999, "workers": 3}, timeouts={"total_s": 30}))
    assert app.runtime.settings.server == settings().server
    assert app.admission.max_request_s == 30
    assert app.restart_needed == ("server",)  # what POST /admin/reload answers
    app.reload(settings(timeouts={"total_s": 30}))
    assert app.restart_needed == ()


def test_an_unchanged_endpoint_keeps_its_health_and_circuit_across_a_reload() -> None:
    """A failing engine is not given a clean slate by an unrelated edit: the endpoint's
    state (pool, health, circuit) carries over; a changed endpoint starts afresh."""
    from gateway.app import build_app

    def settings(top_port: int, total_s: float) -> Any:
        return unreachable_tiers(top_port, timeouts={"total_s": total_s})

    app = build_app(settings(10, 900), environ={})
    kept, moved = (tier.endpoints[0] for tier in app.runtime.tiers)
    for state in (kept, moved):
        state.healthy = False
        state.circuit.on_failure()
    app.reload(settings(11, 60))  # tier b moves; tier a only sees a new timeout
    again, fresh = (tier.endpoints[0] for tier in app.runtime.tiers)
    assert again is kept and not again.healthy and again.circuit.consecutive_failures == 1
    assert fresh is not moved and fresh.healthy and fresh.circuit.consecutive_failures == 0


def test_an_engine_standing_in_for_two_tiers_keeps_both_states_across_a_reload() -> None:
    """One engine under two tiers (a single vLLM tried as a ladder) has a state in each. The
    states were kept by URL alone, so a reload gave one tier the other's state and the other
    a fresh one: its circuit, health and in-flight count were lost."""
    from gateway.app import build_app

    app = build_app(unreachable_tiers(9), environ={})
    first = [tier.endpoints[0] for tier in app.runtime.tiers]
    assert first[0] is not first[1]
    first[1].healthy = False
    first[1].circuit.on_failure()
    first[1].inflight = 3
    app.reload(unreachable_tiers(9, timeouts={"total_s": 60}))
    assert [tier.endpoints[0] for tier in app.runtime.tiers] == first
    assert not first[1].healthy and first[1].inflight == 3 and first[0].inflight == 0
    # Renamed, a tier keeps its engine's state by the URL alone.
    data = unreachable_tiers(9).model_dump(mode="json")
    data["tiers"][1]["name"] = "b2"
    app.reload(parse_settings(data))
    assert [tier.endpoints[0] for tier in app.runtime.tiers] == first
    # Both renamed at once: each keeps a state of its own (the second took a fresh one, its
    # in-flight count lost, when the first orphan was already kept).
    app = build_app(unreachable_tiers(9), environ={})
    first = [tier.endpoints[0] for tier in app.runtime.tiers]
    data["tiers"][0]["name"] = "a2"
    app.reload(parse_settings(data))
    assert [tier.endpoints[0] for tier in app.runtime.tiers] == first


def test_a_reload_applies_its_resilience_and_connect_timeout_to_kept_endpoints() -> None:
    """An unchanged endpoint keeps its circuit's state, not the old thresholds: a reload that
    lowers failure_threshold (or changes the ejection times or connect_s) applies to it."""
    from gateway.app import build_app

    def settings(threshold: int, ejection_s: float, connect_s: float) -> Any:
        resilience = {
            "failure_threshold": threshold,
            "base_ejection_s": ejection_s,
            "max_ejection_s": 10 * ejection_s,
        }
        return unreachable_tiers(10, timeouts={"connect_s": connect_s}, resilience=resilience)

    app = build_app(settings(5, 5.0, 3.0), environ={})
    kept = app.runtime.tiers[0].endpoints[0]
    app.reload(settings(1, 30.0, 1.0))
    assert app.runtime.tiers[0].endpoints[0] is kept
    circuit = kept.circuit
    assert (circuit.failure_threshold, circuit.base_ejection_s, circuit.max_ejection_s) == (
        1,
        30.0,
        300.0,
    )
    assert kept.pool.connect_timeout_s == 1.0
    kept.circuit.on_failure()
    assert kept.circuit_state == 2  # one failure now ejects it


def test_a_reload_applies_its_health_interval() -> None:
    from gateway.app import build_app

    def settings(interval_s: float) -> Any:
        return unreachable_tiers(10, resilience={"health_interval_s": interval_s})

    app = build_app(settings(60.0), environ={})
    assert app.health.interval_s == 60.0
    app.reload(settings(2.0))
    assert app.health.interval_s == 2.0


def test_a_reload_that_shortens_a_period_applies_it_to_the_sleep_under_way() -> None:
    """The health checks (like the observer's scrapes and plans and the recalibration) slept
    out the period read before the reload: from 600 s to 0.2 s, the next check came up to
    600 s later."""
    import asyncio

    from gateway.app import build_app

    def settings(interval_s: float) -> Any:
        return unreachable_tiers(10, resilience={"health_interval_s": interval_s})

    async def main() -> None:
        app = build_app(settings(600.0), environ={})
        checks = asyncio.Queue[None]()

        async def check_once() -> None:
            checks.put_nowait(None)

        app.health.check_once = check_once  # type: ignore[method-assign]
        running = asyncio.ensure_future(app.health.run())
        await checks.get()
        app.reload(settings(0.2))
        try:
            await asyncio.wait_for(checks.get(), 3.0)
        finally:
            running.cancel()

    asyncio.run(main())


def test_a_reload_that_adds_room_serves_the_requests_queued_before_it() -> None:
    """A request queued on a full tier is handed the room a reload adds (a higher limit here,
    or a new endpoint) at once: it waited for a request to end, or out its queue_timeout_s
    for a 429, while the endpoint had free slots."""
    import asyncio

    from gateway.app import build_app

    def settings(limit: int) -> Any:
        data = unreachable_tiers(10).model_dump(mode="json")
        data["tiers"][0]["max_inflight_per_endpoint"] = limit
        data["tenants"][0]["api_keys"] = [API_KEY]
        return parse_settings(data)

    async def main() -> None:
        app = build_app(settings(1), environ={})
        endpoint = app.runtime.tiers[0].endpoints[0]
        endpoint.inflight = 1
        waiting = asyncio.ensure_future(app.runtime.tiers[0].wait_for_slot(5.0))
        await asyncio.sleep(0.01)
        app.reload(settings(4))
        assert await asyncio.wait_for(waiting, 1.0) is endpoint

    asyncio.run(main())


def test_a_renamed_tier_keeps_its_engines_in_flight_count() -> None:
    """A reload that renames a tier, its engine's URL unchanged, built a fresh endpoint state
    with nothing in flight: new requests went out past max_inflight_per_endpoint while the
    engine still ran the old ones, and the in-flight gauge read 0."""
    from gateway.app import build_app

    def settings(name: str) -> Any:
        data = unreachable_tiers(10).model_dump(mode="json")
        data["tiers"][0]["name"] = name
        data["tiers"][0]["max_inflight_per_endpoint"] = 1
        return parse_settings(data)

    app = build_app(settings("cheap"), environ={})
    endpoint = app.runtime.tiers[0].endpoints[0]
    endpoint.inflight = 1
    app.reload(settings("renamed"))
    kept = app.runtime.tiers[0].endpoints[0]
    assert kept is endpoint and kept.tier == "renamed" and kept.saturated
    assert kept.owner is app.runtime.tiers[0]


def test_a_request_queued_on_a_renamed_tier_gets_the_slot_its_engine_frees() -> None:
    """The renamed tier's kept endpoint hands its freed slots to the new tier: the requests
    queued on the old one were never woken, and waited out queue_timeout_s for a 429."""
    import asyncio

    from gateway.app import build_app

    def settings(name: str) -> Any:
        data = unreachable_tiers(10).model_dump(mode="json")
        data["tiers"][0]["name"] = name
        data["tiers"][0]["max_inflight_per_endpoint"] = 1
        return parse_settings(data)

    async def main() -> None:
        app = build_app(settings("cheap"), environ={})
        endpoint = app.runtime.tiers[0].endpoints[0]
        endpoint.inflight = 1
        waiting = asyncio.ensure_future(app.runtime.tiers[0].wait_for_slot(5.0))
        await asyncio.sleep(0.01)
        app.reload(settings("renamed"))
        endpoint.inflight = 0  # the request the engine was running ends
        endpoint.slot_freed()
        assert await asyncio.wait_for(waiting, 1.0) is endpoint

    asyncio.run(main())


def test_requests_queued_on_two_merged_tiers_get_their_engines_freed_slots() -> None:
    """Tiers x and y become one tier z with both engines: z took x's queue, and y's engine's
    freed slots went to z too, so the requests queued on y were never woken and waited out
    queue_timeout_s for a 429 while both engines had room."""
    import asyncio

    from gateway.app import build_app

    def settings(merged: bool) -> Any:
        data = unreachable_tiers(10).model_dump(mode="json")
        x, y = data["tiers"]
        top = {**y, "name": "top", "endpoints": ["http://127.0.0.1:11/v1"]}
        for tier in (x, y):
            tier["precision"], tier["max_inflight_per_endpoint"] = "nvfp4", 1
        x["name"], y["name"] = "x", "y"
        if merged:
            x["name"], x["endpoints"] = "z", x["endpoints"] + y["endpoints"]
        data["tiers"] = [x, top] if merged else [x, y, top]
        return parse_settings(data)

    async def main() -> None:
        app = build_app(settings(merged=False), environ={})
        x, y, _ = app.runtime.tiers
        engines = [x.endpoints[0], y.endpoints[0]]
        for engine in engines:
            engine.inflight = 1
        waiting = [asyncio.ensure_future(tier.wait_for_slot(5.0)) for tier in (x, y)]
        await asyncio.sleep(0.01)
        app.reload(settings(merged=True))
        for engine in engines:  # the requests the engines were running end
            engine.inflight = 0
            engine.slot_freed()
        got = await asyncio.wait_for(asyncio.gather(*waiting), 1.0)
        assert {id(state) for state in got} == {id(engine) for engine in engines}

    asyncio.run(main())


def test_a_tier_merged_two_reloads_after_a_request_queued_on_it_keeps_one_queue() -> None:
    """Tier y is reloaded unchanged (y1 takes y0's queue), then merged into z (z joins y1's
    queue). y0, still the tier of requests admitted before both reloads, kept the queue z
    had copied: a request queued there was in z's queue twice over, and once it left, z
    still counted it (tiergate_queue_depth at rest, a queue place taken); one queued there
    later was in no queue z hands slots to, and waited out queue_timeout_s for a 429."""
    from gateway.app import build_app

    def settings(merged: bool) -> Any:
        data = unreachable_tiers(10).model_dump(mode="json")
        x, y = data["tiers"]
        top = {**y, "name": "top", "endpoints": ["http://127.0.0.1:11/v1"]}
        for tier in (x, y):
            tier["precision"], tier["max_inflight_per_endpoint"] = "nvfp4", 1
        x["name"], y["name"] = "x", "y"
        if merged:
            x["name"], x["endpoints"] = "z", x["endpoints"] + y["endpoints"]
        data["tiers"] = [x, top] if merged else [x, y, top]
        return parse_settings(data)

    async def main() -> None:
        app = build_app(settings(merged=False), environ={})
        x0, y0, _ = app.runtime.tiers
        engine = y0.endpoints[0]
        x0.endpoints[0].inflight = engine.inflight = 1  # both engines busy
        left: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        leaving = asyncio.ensure_future(y0.wait_for_slot(30.0, left))
        await asyncio.sleep(0)  # queued
        app.reload(settings(merged=False))
        app.reload(settings(merged=True))
        z = app.runtime.tiers[0]
        assert z.queued == 1
        left.set_result(None)  # its client leaves
        assert await leaving is None
        assert z.queued == 0
        later = asyncio.ensure_future(y0.wait_for_slot(30.0))  # admitted before the reloads
        await asyncio.sleep(0)
        assert z.queued == 1
        engine.inflight = 0
        engine.slot_freed()
        assert await later is engine and z.queued == 0

    asyncio.run(main())


def test_a_reload_keeps_what_up_options_changed(tmp_path: Path) -> None:
    """`tiergate up --config FILE` prints an admin token it made up (the file has none) and
    applies --shadow-rate: a reload of the file keeps both. It used to drop them, so the
    printed token got a 403 (admin API disabled) after any edit of the file, or a touch."""
    from gateway.app import build_app
    from gateway.cli.serve_cmd import up_options

    path = write_settings(tmp_path / "tiergate.yaml", unreachable_tiers(10))
    with_options = up_options({"rate": 0.5}, "made-up-token", {})
    app = build_app(
        with_options(unreachable_tiers(10)),
        environ={},
        config_path=path,
        adjust_loaded=with_options,
    )
    assert app.try_reload() is None
    assert app.runtime.admin_token == "made-up-token"
    assert app.runtime.settings.shadow.rate == 0.5


def test_a_reload_of_an_unchanged_file_under_serve_port_warns_of_nothing(
    tmp_path: Path,
) -> None:
    """`serve --port` runs on a port the file does not name: every reload, even of the same
    file, logged that the server settings had changed and waited for a restart."""
    settings = unreachable_tiers(10, admin={"token": ADMIN})
    path = write_settings(tmp_path / "tiergate.yaml", settings)
    log = tmp_path / "gateway.log"
    with GatewayProcess(path, log_path=log) as gw:  # `serve --port`, a free port
        status, _ = post(f"{gw.url}/admin/reload", {}, ADMIN)
        assert status == 200
    text = log.read_text()
    assert "configuration reloaded" in text
    assert "server settings" not in text, text


def test_serve_host_and_workers_are_what_admin_config_shows_and_reloads_keep(
    tmp_path: Path,
) -> None:
    """`serve --host --workers 1` over a file naming another host and 3 workers: /admin/config
    showed the file's, not what ran (only --port was applied to the settings)."""
    settings = unreachable_tiers(
        10, admin={"token": ADMIN}, server={"host": "localhost", "workers": 3}
    )
    path = write_settings(tmp_path / "tiergate.yaml", settings)
    log = tmp_path / "gateway.log"
    gateway = GatewayProcess(path, log_path=log)
    gateway.argv_extra = ["--host", "127.0.0.1", "--workers", "1"]
    with gateway as gw:
        assert post(f"{gw.url}/admin/reload", {}, ADMIN)[0] == 200
        request = urllib.request.Request(f"{gw.url}/admin/config")
        request.add_header("authorization", f"Bearer {ADMIN}")
        shown = json.loads(urllib.request.urlopen(request, timeout=10).read())["server"]
    assert (shown["host"], shown["port"], shown["workers"]) == ("127.0.0.1", gw.port, 1)
    assert "server settings" not in log.read_text()  # the unchanged file warned of nothing


def test_the_file_watcher_outlives_a_reload_that_fails_unexpectedly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload failing with an error no invalid file explains (an unknown planner preset
    raised a KeyError) ended the watch task silently: no later edit was ever applied."""
    import asyncio
    import os

    from gateway.app import build_app
    from gateway.routing.policy import TopTierPolicy

    built: list[Settings] = []

    def policy(settings: Settings) -> TopTierPolicy:
        built.append(settings)
        if len(built) == 2:  # the first reload
            raise RuntimeError("a bug, not a bad file")
        return TopTierPolicy()

    path = write_settings(tmp_path / "tiergate.yaml", unreachable_tiers(10))
    app = build_app(unreachable_tiers(10), environ={}, policy_factory=policy, config_path=path)
    edits = iter([1_000.0, 2_000.0])

    async def one_edit_per_tick(_seconds: float) -> None:
        edited_at = next(edits, None)
        if edited_at is None:
            raise asyncio.CancelledError
        os.utime(path, (edited_at, edited_at))

    monkeypatch.setattr("gateway.app.asyncio.sleep", one_edit_per_tick)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(app._watch_config())
    assert len(built) == 3 and app.reloads == 1  # the second edit was applied


def test_a_failing_metrics_flush_stops_neither_the_timer_nor_the_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One flush that raised (an upstream's negative usage did) ended the flush timer for
    good, freezing --workers' load gauges, and made stop() re-raise before its cleanup."""
    import asyncio

    from gateway.app import build_app

    app = build_app(unreachable_tiers(10), environ={})
    flushes: list[int] = []

    def flush() -> None:
        flushes.append(1)
        if len(flushes) == 1:
            raise ValueError("Counters can only be incremented by non-negative amounts.")

    monkeypatch.setattr(app.metrics, "flush", flush)
    closed: list[bool] = []
    monkeypatch.setattr(app.shadow, "close", lambda: closed.append(True))
    real_sleep = asyncio.sleep

    async def no_wait(_seconds: float) -> None:
        await real_sleep(0)

    async def died() -> None:
        raise RuntimeError("a background task that failed")

    async def main() -> None:
        monkeypatch.setattr(asyncio, "sleep", no_wait)
        timer = asyncio.ensure_future(app._flush_metrics())
        for _ in range(100):
            await real_sleep(0)
        assert len(flushes) >= 3 and not timer.done()  # it went on after the failed flush
        app._tasks += [timer, asyncio.ensure_future(died())]
        await real_sleep(0)
        await app.stop()

    asyncio.run(main())
    assert closed == [True]  # stop() reached its cleanup


def test_the_file_watch_sees_a_file_replaced_with_the_same_mtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cp -p` then `mv` (or a build that pins mtimes) replaces the file and keeps its mtime:
    the watch compared the mtime alone, and never reloaded."""
    import asyncio
    import os

    from gateway.app import build_app

    path = write_settings(tmp_path / "tiergate.yaml", unreachable_tiers(10))
    app = build_app(unreachable_tiers(10), environ={}, config_path=path, watch_config=True)
    edited = unreachable_tiers(10).model_dump(mode="json")
    edited["resilience"]["queue_size"] = 7
    replacement = write_settings(tmp_path / "edited.yaml", parse_settings(edited))
    before = path.stat()
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    real_sleep = asyncio.sleep

    async def no_wait(_seconds: float) -> None:
        await real_sleep(0)

    async def main() -> None:
        monkeypatch.setattr(asyncio, "sleep", no_wait)
        watch = asyncio.ensure_future(app._watch_config())
        await real_sleep(0)
        os.replace(replacement, path)
        for _ in range(20):
            await real_sleep(0)
        watch.cancel()

    asyncio.run(main())
    assert app.reloads == 1 and app.runtime.settings.resilience.queue_size == 7


def test_a_reload_takes_the_removed_tiers_and_tenants_out_of_metrics_and_views() -> None:
    """A gauge keeps its last value for good: a tier (or tenant) a reload removed went on
    exporting its calibration ECE (so its alert kept firing), flags and regime, and stayed
    listed by /admin/shadow."""
    from gateway.app import build_app
    from gateway.shadow.monitor import Label

    def settings(tiers: list[str], tenants: list[str]) -> Settings:
        precisions = {"a": "nvfp4", "m": "w4a16", "b": "bf16"}
        return parse_settings(
            {
                "model": MODEL,
                "tiers": [
                    {"name": n, "precision": precisions[n], "endpoints": ["http://127.0.0.1:9/v1"]}
                    for n in tiers
                ],
                "tenants": [{"name": n, "api_keys": [f"sk-{n}"]} for n in tenants],
            }
        )

    app = build_app(settings(["a", "m", "b"], ["t", "u"]), environ={})
    for tenant, tier in (("t", "a"), ("t", "m"), ("u", "a")):
        for _ in range(app.shadow.monitor.min_labels):  # enough for an ECE
            label = Label(predicted=0.9, score=0.1, adequate=False, at=0)
            app.shadow.monitor.add(tenant, tier, label)
        app.shadow._export(tenant, tier)
    for tier in ("a", "m"):
        app.metrics.flag_drift.labels(tier, "prefix_caching").set(1)
        app.metrics.regime_concurrency.labels(tier, "mean").set(3)
    app.reload(settings(["a", "b"], ["t"]))
    exported = app.exposition()[0].decode()
    assert 'tiergate_calibration_ece{tenant="t",tier="a"}' in exported
    assert 'tiergate_flag_drift{flag="prefix_caching",tier="a"} 1.0' in exported
    assert 'tier="m"' not in exported and 'tenant="u"' not in exported
    assert app.shadow.view() == {"t": {"a": app.shadow.view()["t"]["a"]}}


def test_under_workers_a_removed_tiers_gauges_read_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Multiprocess files keep a series once written (prometheus_client cannot remove it
    there): the removed tier's gauges are set to 0 instead, so no alert stays firing."""
    from prometheus_client import generate_latest

    from gateway.app import build_app

    app = build_app(unreachable_tiers(9), environ={})
    app.metrics.calibration_ece.labels("t", "a").set(0.4)
    app.metrics.flag_drift.labels("a", "speculative_decoding").set(1)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    app.metrics.forget_removed(["b"], ["t"])
    exported = generate_latest(app.registry).decode()
    assert 'tiergate_calibration_ece{tenant="t",tier="a"} 0.0' in exported
    assert 'tiergate_flag_drift{flag="speculative_decoding",tier="a"} 0.0' in exported


def test_a_request_the_shutdown_limit_cuts_before_its_answer_gets_an_openai_503() -> None:
    """Past the graceful shutdown's 30 s uvicorn cancels what still runs, and answers a
    request left without a response by a plain-text 500 with no request id (review AV)."""
    from gateway.app import build_app

    async def main() -> list[dict[str, Any]]:
        held: list[asyncio.StreamWriter] = []

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"POST /v1/chat/completions"):
                    held.append(writer)  # the request: never answered
                    await asyncio.Event().wait()
                # health checks: healthy
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")

        engine = await asyncio.start_server(hold, "127.0.0.1", 0)
        port = engine.sockets[0].getsockname()[1]
        app = build_app(unreachable_tiers(port), environ={})
        lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await lifespan.put({"type": "lifespan.startup"})
        events: list[dict[str, Any]] = []

        async def lifespan_send(message: dict[str, Any]) -> None:
            events.append(message)

        life = asyncio.create_task(app({"type": "lifespan"}, lifespan.get, lifespan_send))
        while not events:
            await asyncio.sleep(0.01)
        body = json.dumps({"model": f"{MODEL}@b", "messages": [{"role": "user", "content": "hi"}]})
        sent: list[dict[str, Any]] = []
        delivered = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if not delivered.is_set():
                delivered.set()
                return {"type": "http.request", "body": body.encode(), "more_body": False}
            await asyncio.Event().wait()  # the client stays
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "headers": [(b"authorization", f"Bearer {API_KEY}".encode())],
        }
        request = asyncio.create_task(app(scope, receive, send))
        while not held:  # the tier has the request
            await asyncio.sleep(0.01)
        request.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        await request  # answered, not re-raised: uvicorn would log it as a crash
        await lifespan.put({"type": "lifespan.shutdown"})
        await life
        engine.close()
        return sent

    sent = asyncio.run(asyncio.wait_for(main(), 30))
    start, answer = sent
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"x-request-id"]
    assert headers[b"retry-after"] == b"1"
    assert json.loads(answer["body"])["error"]["code"] == "service_unavailable"


def shadowed(tiers: list[tuple[str, str]], tenants: list[str]) -> Settings:
    """Tiers (name, precision) on an address nobody answers, every request shadowed."""
    return parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": n, "precision": p, "endpoints": ["http://127.0.0.1:9/v1"]}
                for n, p in tiers
            ],
            "tenants": [{"name": n, "api_keys": [f"sk-{n}"]} for n in tenants],
            "shadow": {"rate": 1.0, "assume_deterministic": True},
        }
    )


def served_on_a(tenant: str) -> Any:
    """An exchange captured on tier "a", the first of its ladder, with its answer."""
    import orjson

    from gateway.stats import CompletedExchange

    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
    return CompletedExchange(
        tenant=tenant,
        kind="chat",
        tier="a",
        tier_index=0,
        request={"messages": [{"role": "user", "content": "hi"}]},
        body=orjson.dumps(answer),
        probability=0.9,
        probabilities=(0.9, 1.0),
        reason="router",
        score=0.5,
    )


TWO_TIERS = [("a", "nvfp4"), ("b", "bf16")]
FOUR_TIERS = [("n", "nvfp4"), ("q", "w4a16"), ("w", "fp8"), ("b", "bf16")]


def evaluated_across_a_shrinking_reload(app: Any, exchange: Any) -> list[str]:
    """/metrics after `exchange` is evaluated while a reload to two tiers lands during its
    replay, which is lost."""

    async def replay_lost(*_: Any) -> None:
        app.reload(shadowed([("n", "nvfp4"), ("b", "bf16")], ["t"]))

    app.shadow._replay = replay_lost
    asyncio.run(app.shadow._evaluate_logged(exchange))
    lines: list[str] = app.exposition()[0].decode().splitlines()
    return lines


def test_a_shadow_label_of_a_tenant_removed_while_it_was_judged_stays_out() -> None:
    """An exchange queued (or replaying) when a reload removed its tenant was still labelled
    afterwards: its calibration series came back into /metrics and /admin/shadow, where no
    later reload took them out again."""
    from gateway.app import build_app

    app = build_app(shadowed(TWO_TIERS, ["t", "u"]), environ={})

    async def replayed(*_: Any) -> str:
        app.reload(shadowed(TWO_TIERS, ["t"]))  # the reload lands while the replay is out
        return "no"

    app.shadow._fetch = replayed  # type: ignore[method-assign,assignment]
    refits: list[str] = []  # what the online recalibrator would be fed

    class Spy:
        def label(self, tenant: str, *_: Any) -> None:
            refits.append(tenant)

    app.shadow.sinks.append(Spy())
    asyncio.run(app.shadow.evaluate(served_on_a("u")))
    exported = app.exposition()[0].decode().splitlines()
    calibration = [line for line in exported if line.startswith("tiergate_calibration_")]
    assert 'tiergate_shadow_labels_total{adequate="false",tenant="u",tier="a"} 1.0' in exported
    assert not [line for line in calibration if 'tenant="u"' in line]
    assert "u" not in app.shadow.view()
    assert refits == []  # no model refitted for a tenant that no longer exists


def test_an_exchange_captured_before_a_reload_that_moved_its_tier_is_not_labelled() -> None:
    """Its tier index and probabilities are of the old ladder: judged after a reload that
    put another tier at that index, its label went to that tier (or, past the new ladder's
    end, failed with an IndexError)."""
    from gateway.app import build_app

    app = build_app(shadowed(TWO_TIERS, ["t"]), environ={})
    app.reload(shadowed([("n", "nvfp4"), ("a", "w4a16"), ("b", "bf16")], ["t"]))
    assert asyncio.run(app.shadow.evaluate(served_on_a("t"))) is None
    exported = app.exposition()[0].decode().splitlines()
    skipped = 'tiergate_shadow_requests_total{outcome="skipped_ladder_changed",tenant="t",tier="a"}'
    assert f"{skipped} 1.0" in exported
    assert not [line for line in exported if line.startswith("tiergate_shadow_labels_total{")]


def test_a_reload_that_moves_the_tier_while_its_replay_is_out_labels_nothing() -> None:
    """The ladder is checked when the evaluation starts, but the replay takes seconds: a
    reload landing meanwhile that put another tier at the exchange's index gave that tier
    the label (and the recalibrator an index of the old ladder)."""
    from gateway.app import build_app

    app = build_app(shadowed(TWO_TIERS, ["t"]), environ={})
    exchange = served_on_a("t")

    async def replayed(*_: Any) -> str:
        app.reload(shadowed([("n", "nvfp4"), ("a", "w4a16"), ("b", "bf16")], ["t"]))  # mid-replay
        return "no"

    app.shadow._fetch = replayed  # type: ignore[method-assign,assignment]
    fed: list[int] = []  # what the online recalibrator would be fed

    class Spy:
        def label(self, tenant: str, tier: int, *_: Any) -> None:
            fed.append(tier)

    app.shadow.sinks.append(Spy())
    assert asyncio.run(app.shadow.evaluate(exchange)) is None
    exported = app.exposition()[0].decode().splitlines()
    skipped = 'tiergate_shadow_requests_total{outcome="skipped_ladder_changed",tenant="t",tier="a"}'
    assert f"{skipped} 1.0" in exported
    assert not [line for line in exported if line.startswith("tiergate_shadow_labels_total{")]
    assert fed == []


def test_a_replay_that_fails_after_a_reload_shrank_the_ladder_is_counted_under_its_tier(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed replay is counted under the served tier: named by its index on the ladder
    of now, which a reload while the replay was out had shortened, it raised an IndexError
    (logged as a crash of the evaluation, counted as failed under the served tier's name)."""
    import dataclasses

    from gateway.app import build_app

    app = build_app(shadowed(FOUR_TIERS, ["t"]), environ={})
    exchange = dataclasses.replace(
        served_on_a("t"), tier="w", tier_index=2, probabilities=(0.7, 0.8, 0.9, 1.0)
    )

    exported = evaluated_across_a_shrinking_reload(app, exchange)
    assert "shadow evaluation failed" not in caplog.text
    failed = 'tiergate_shadow_requests_total{outcome="failed",tenant="t",tier="w"} 1.0'
    assert failed in exported


def test_an_exchange_whose_ladder_a_reload_renamed_below_or_above_it_is_not_labelled() -> None:
    """Its own tier kept its place, but a tier it explores or is judged against is another:
    an explored tier would be labelled with the old tier's prediction (its position in the
    captured probabilities). The ladder at capture is compared whole."""
    import dataclasses

    from gateway.app import build_app

    app = build_app(shadowed(TWO_TIERS, ["t"]), environ={})
    exchange = dataclasses.replace(served_on_a("t"), ladder=("a", "b"))
    app.reload(shadowed([("a", "nvfp4"), ("c", "bf16")], ["t"]))
    assert asyncio.run(app.shadow.evaluate(exchange)) is None
    exported = app.exposition()[0].decode().splitlines()
    skipped = 'tiergate_shadow_requests_total{outcome="skipped_ladder_changed",tenant="t",tier="a"}'
    assert f"{skipped} 1.0" in exported


def test_a_reload_while_the_reference_is_out_explores_no_further() -> None:
    """The served tier's label was skipped when a reload moved the ladder during the
    reference replay, but the exploration went on: one more replay, on a tier of the old
    ladder, only to be skipped in its turn and counted a second time under the served tier."""
    import dataclasses

    from gateway.app import build_app

    def exploring(names: str) -> Any:
        settings = shadowed(list(zip(names, ("nvfp4", "w4a16", "bf16"), strict=True)), ["t"])
        shadow = settings.shadow.model_copy(update={"explore_rate": 1.0})
        return settings.model_copy(update={"shadow": shadow})

    app = build_app(exploring("nab"), environ={})
    exchange = dataclasses.replace(
        served_on_a("t"), tier_index=1, probabilities=(0.8, 0.9, 1.0), ladder=("n", "a", "b")
    )
    fetched: list[int] = []

    async def replayed(_target: Any, _exchange: Any, labelled: int, _det: bool) -> str:
        fetched.append(labelled)
        app.reload(exploring("mab"))  # renames the tier it would explore
        return "no"

    app.shadow._fetch = replayed  # type: ignore[method-assign,assignment]
    assert asyncio.run(app.shadow.evaluate(exchange)) is None
    assert fetched == [1]  # the reference only
    exported = app.exposition()[0].decode().splitlines()
    skipped = 'tiergate_shadow_requests_total{outcome="skipped_ladder_changed",tenant="t",tier="a"}'
    assert f"{skipped} 1.0" in exported


def test_an_explored_replay_that_fails_after_a_reload_is_counted_under_its_tier(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A top-tier answer explores a cheaper tier; a reload while that replay was out shrank
    the ladder, and the failure, named by the explored tier's index on the ladder of now,
    raised an IndexError (logged as a crash, counted failed under the served tier)."""
    import dataclasses

    from gateway.app import build_app

    app = build_app(shadowed(FOUR_TIERS, ["t"]), environ={})
    app.shadow.rng = lambda: 0.9  # explores "w", the last tier below the top
    exchange = dataclasses.replace(
        served_on_a("t"),
        tier="b",
        tier_index=3,
        probabilities=(0.7, 0.8, 0.9, 1.0),
        ladder=("n", "q", "w", "b"),
    )

    exported = evaluated_across_a_shrinking_reload(app, exchange)
    assert "shadow evaluation failed" not in caplog.text
    failed = 'tiergate_shadow_requests_total{outcome="failed",tenant="t",tier="w"} 1.0'
    assert failed in exported
