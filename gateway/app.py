"""The composition root: `build_app(settings)` creates every long-lived object.

Nothing here runs at import time. Objects derived from the configuration live in a
`GatewayRuntime`, which a reload replaces as one reference swap; requests in flight keep
the runtime they started with. Long-lived state that must survive a reload (metrics,
tenant limiters, warm connection pools, circuit state) lives on the `Gateway` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.api import admin, routes
from gateway.api.openai import GenerationHandler
from gateway.backends.health import HealthChecker
from gateway.backends.tier import TierBackend, build_tiers, endpoints_by_url
from gateway.config import (
    ConfigError,
    Settings,
    load_settings,
    resolve_metrics_token,
    resolve_secret,
)
from gateway.errors import InvalidRequestError, MethodNotAllowedError, NotFoundError
from gateway.file_stamp import FileStamp, file_stamp
from gateway.live.observer import LiveObserver
from gateway.metrics import BackendCollector, GatewayMetrics, RoutingCollector, WorkerLoad
from gateway.periods import sleep_period
from gateway.protocol import EndpointKind
from gateway.proxy.channel import Receive, Send
from gateway.proxy.events import ExchangeListener
from gateway.proxy.service import ProxyService
from gateway.request_ids import HEADER as REQUEST_ID_HEADER
from gateway.request_ids import RequestIds
from gateway.routing.policy import RoutingPolicy, TopTierPolicy
from gateway.routing.router import RouterPolicy
from gateway.shadow.labels import LabelLog, check_label_log_path
from gateway.shadow.recalibrate import Recalibrator
from gateway.shadow.sampler import ShadowSampler
from gateway.stats import EndpointSample, Ladder, TierSample
from gateway.tenants.admission import Admission
from gateway.tenants.registry import TenantRegistry
from router_models import router_build
from router_models.errors import RouterError
from router_models.features import named_dense_features

log = logging.getLogger("tiergate")

PolicyFactory = Callable[[Settings], RoutingPolicy]
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONFIG_ENV = "TIERGATE_CONFIG"
WORKERS_ENV = "TIERGATE_WORKERS"  # set by `serve --workers N` for its workers
# A copy of the last configuration the `serve --workers` supervisor found valid.
LAST_VALID_CONFIG_ENV = "TIERGATE_LAST_VALID_CONFIG"
# What an invalid configuration can raise while a runtime is built from it: the settings
# themselves, the tenants' keys, the router model directory, files that cannot be read.
RELOAD_ERRORS: tuple[type[Exception], ...] = (ConfigError, ValueError, OSError, RouterError)
_GENERATION_ROUTES: tuple[tuple[str, EndpointKind], ...] = (
    ("/v1/chat/completions", "chat"),
    ("/v1/completions", "completions"),
    ("/v1/responses", "responses"),
)


@dataclass(slots=True)
class GatewayRuntime:
    """Everything derived from one configuration."""

    settings: Settings
    tenants: TenantRegistry
    tiers: list[TierBackend]
    service: ProxyService
    hot_routes: dict[str, GenerationHandler]
    admin_token: str
    metrics_token: str
    policy: RoutingPolicy
    label_log: LabelLog | None


class Gateway:
    """The ASGI application: hot generation routes on raw ASGI, the rest on Starlette."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        environ: Mapping[str, str] | None = None,
        policy_factory: PolicyFactory | None = None,
        config_path: Path | None = None,
        watch_config: bool = False,
        adjust_loaded: Callable[[Settings], Settings] | None = None,
    ) -> None:
        # `_created` series double every counter's cardinality and no dashboard reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.policy_factory: PolicyFactory = policy_factory or (lambda _settings: TopTierPolicy())
        self.config_path = config_path
        self.watch_config = watch_config
        # What the command line changes in the file's settings (`tiergate up`'s options): a
        # reload applies it too, or it would drop what the start-up applied.
        self.adjust_loaded = adjust_loaded or (lambda loaded: loaded)
        # Which build of the router's hot path serves (setup.py: mypyc or the Python source).
        self.metrics = GatewayMetrics(self.registry, {"router_build": router_build()})
        self.registry.register(BackendCollector(self._backend_samples))
        self.registry.register(RoutingCollector(self._routing_verdicts))
        # Several workers: each writes its load for the others' scrapes to sum.
        self.worker_load = WorkerLoad() if os.environ.get(MULTIPROC_ENV) else None
        self.admission = Admission(
            _redis_client(settings, self.environ),
            prefix=settings.shared_limits.key_prefix,
            max_request_s=settings.timeouts.total_s,
        )
        self.observer = LiveObserver(
            settings,
            self.metrics,
            lambda: self.runtime.tiers,
            workers=int(self.environ.get(WORKERS_ENV) or 1),
        )
        self.shadow = ShadowSampler(
            settings, self.metrics, lambda: self.runtime.tiers, features=named_dense_features
        )
        self.listeners: list[ExchangeListener] = [self.observer, self.shadow]
        self.request_ids = RequestIds()  # kept across reloads: ids stay unique
        self.draining = False
        self.reloads = 0
        # Sections the file changes that only a restart applies (the sockets: `server`).
        self.restart_needed: tuple[str, ...] = ()
        # Until then a SIGHUP is the supervisor's echo of this worker's own admin reload.
        self._reload_echo_until = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        # Its interval is the installed configuration's (`_install`): a reload changes it.
        self.health = HealthChecker(lambda: self.runtime.tiers)
        self._config_stamp = _file_stamp(config_path)
        self._installed = False
        self.recalibrator: Recalibrator | None = None
        self.runtime = self._build_runtime(settings, previous=None)
        self._install(self.runtime)
        self._fallback = self._build_fallback()

    # -- construction ---------------------------------------------------------------------
    def _build_runtime(self, settings: Settings, previous: GatewayRuntime | None) -> GatewayRuntime:
        """Builds every config-derived object; raises on anything invalid, changing nothing."""
        if previous is not None:
            _refuse_restart_only_changes(previous.settings, settings)
            settings = _with_running_server(previous.settings, settings)
        tenants = TenantRegistry(settings, self.environ)
        tiers = build_tiers(
            settings, endpoints_by_url(previous.tiers) if previous else None, self.environ
        )
        policy = self.policy_factory(settings)
        service = ProxyService(
            settings.model,
            tiers,
            policy,
            timeouts=settings.timeouts,
            resilience=settings.resilience,
            listeners=self.listeners,
        )
        ladder = Ladder(
            tuple(tier.name for tier in settings.tiers),
            tuple(tier.relative_cost for tier in settings.tiers),
            _savings_baselines(settings, tenants, policy),
        )
        handlers = {
            path: GenerationHandler(
                kind,
                tenants=tenants,
                admission=self.admission,
                service=service,
                limits=settings.limits,
                metrics=self.metrics,
                ladder=ladder,
                request_ids=self.request_ids,
            )
            for path, kind in _GENERATION_ROUTES
        }
        admin_token = resolve_secret(settings.admin.token, settings.admin.token_env, self.environ)
        metrics_token = resolve_metrics_token(settings.metrics, self.environ)
        # Last: it may create a file, so nothing that can still fail comes after it.
        label_log = self.shadow.label_log_for(settings)
        return GatewayRuntime(
            settings,
            tenants,
            tiers,
            service,
            handlers,
            admin_token,
            metrics_token,
            policy,
            label_log,
        )

    def _install(self, runtime: GatewayRuntime) -> None:
        """Swaps `runtime` in. Never raises: whatever can fail happened in `_build_runtime`,
        so a refused reload has changed nothing."""
        old = self.runtime if self._installed else None
        self._installed = True
        # Limiters built from here on hold a shared slot for at most one whole request.
        self.admission.max_request_s = runtime.settings.timeouts.total_s
        self.admission.configure(runtime.tenants.tenants)
        self.metrics.tenant_top_tier = {
            name: runtime.tiers[tenant.top_tier].name
            for name, tenant in runtime.tenants.tenants.items()
        }
        replaced = _replaced_tiers(old.tiers, runtime.tiers) if old is not None else {}
        taken: list[TierBackend] = []
        for tier in runtime.tiers:
            tier.adopt_endpoints()
            if tier.name in replaced:
                taken.append(replaced[tier.name])
                tier.take_queue(replaced[tier.name])
                tier.hand_out_free_slots()
        if old is not None:
            _merge_unreplaced_queues(old.tiers, taken)
        self.runtime = runtime
        self.health.interval_s = runtime.settings.resilience.health_interval_s
        self.observer.configure(runtime.settings)
        self.shadow.configure(runtime.settings, runtime.label_log)
        self.metrics.forget_removed(
            [tier.name for tier in runtime.tiers], runtime.tenants.tenants.keys()
        )
        self._install_router(runtime)
        if old is not None:
            kept = {id(state) for tier in runtime.tiers for state in tier.endpoints}
            for tier in old.tiers:
                for state in tier.endpoints:
                    if id(state) not in kept:
                        state.pool.close()

    def _install_router(self, runtime: GatewayRuntime) -> None:
        """Exports each tenant's routing facts and keeps online recalibration attached."""
        policy = runtime.policy
        if not isinstance(policy, RouterPolicy):
            return
        self.metrics.uniform_floor_tier.clear()
        for name, routing in policy.routing.items():
            if routing.uniform_floor_tier is not None:
                self.metrics.uniform_floor_tier[name] = runtime.tiers[
                    routing.uniform_floor_tier
                ].name
        shadow = runtime.settings.shadow
        if self.recalibrator is None:
            self.recalibrator = Recalibrator(
                policy,
                self.metrics,
                window=shadow.window,
                min_labels=shadow.min_labels,
                prior_weight=shadow.prior_weight,
            )
            self.shadow.sinks.append(self.recalibrator)
        else:
            self.recalibrator.attach(
                policy,
                window=shadow.window,
                min_labels=shadow.min_labels,
                prior_weight=shadow.prior_weight,
            )

    async def _recalibrate(self) -> None:
        while True:
            await sleep_period(lambda: self.runtime.settings.shadow.recalibrate_interval_s)
            if self.recalibrator is not None:
                self.recalibrator.recalibrate_all()

    def _build_fallback(self) -> Starlette:
        app = Starlette(
            routes=[
                Route("/v1/models", routes.list_models, methods=["GET"]),
                Route("/v1/models/{model:path}", routes.retrieve_model, methods=["GET"]),
                Route("/health", routes.health, methods=["GET"]),
                Route("/ready", routes.ready, methods=["GET"]),
                Route("/metrics", routes.metrics, methods=["GET"]),
                Route("/openapi.json", routes.openapi, methods=["GET"]),
                # POSTs to these never get here (`__call__` serves them); the routes exist so
                # that another method gets 405 with `Allow: POST`, not 404.
                *(
                    Route(path, _HotRouteFallback(self), methods=["POST"])
                    for path, _ in _GENERATION_ROUTES
                ),
                *admin.routes(),
            ],
            exception_handlers={HTTPException: _http_exception},
            lifespan=self._lifespan,
        )
        # A path with a trailing slash gets the 404 that names it, not Starlette's redirect,
        # whose Location is built from the client's Host header.
        app.router.redirect_slashes = False
        app.state.gateway = self
        return app

    # -- reload -----------------------------------------------------------------------------
    def reload(self, settings: Settings | None = None) -> None:
        """Swaps in a new configuration (from `settings` or the config file).

        Raises ConfigError (or ValueError) and keeps the running configuration when the new
        one is invalid. Requests in flight finish on the runtime they started with.
        """
        if settings is None:
            if self.config_path is None:
                raise ConfigError("this gateway was not started from a config file")
            settings = self.adjust_loaded(load_settings(self.config_path))
        runtime = self._build_runtime(settings, previous=self.runtime)
        self._install(runtime)
        self.reloads += 1
        self.restart_needed = ("server",) if settings.server != runtime.settings.server else ()
        log.warning(
            "configuration reloaded (%d tiers, %d tenants)",
            len(settings.tiers),
            len(settings.tenants),
        )

    def try_reload(self) -> str | None:
        """Reloads from the config file; on an invalid configuration logs why and returns it,
        keeping the running one. Every trigger (file watch, SIGHUP, the admin call) goes
        through here, so none can die on a bad file or miss the log line."""
        try:
            self.reload()
        except RELOAD_ERRORS as exc:
            log.error("configuration reload refused, the running one stays: %s", exc)
            return str(exc)
        return None

    def expect_reload_echo(self, within_s: float = 5.0) -> None:
        """This worker has just reloaded and asked the supervisor to reload every worker
        (`serve --workers N`): the SIGHUP it forwards back here is skipped once, or every
        admin reload would run twice in the worker that took it."""
        self._reload_echo_until = time.monotonic() + within_s

    def on_sighup(self) -> None:
        if time.monotonic() < self._reload_echo_until:
            self._reload_echo_until = 0.0
            return
        self.try_reload()

    async def _watch_config(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            stamp = _file_stamp(self.config_path)
            if stamp != self._config_stamp:
                self._config_stamp = stamp
                try:
                    self.try_reload()
                except Exception:
                    # A failure no invalid file explains (a bug) is logged and the watch goes
                    # on: ending it would leave every later edit of the file unnoticed.
                    log.exception("configuration reload failed; the file is still watched")

    # -- ASGI -----------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.runtime.hot_routes.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            send = _with_request_id(send, self.request_ids.new())
        await self._fallback(scope, receive, send)  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await self.health.check_once()
        self._tasks.append(loop.create_task(self.health.run()))
        self._tasks.extend(self.observer.start())
        self._tasks.extend(self.shadow.start())
        self._tasks.append(loop.create_task(self._recalibrate()))
        self._tasks.append(loop.create_task(self._flush_metrics()))
        if self.admission.redis is not None:
            self._tasks.append(loop.create_task(self.admission.keep_leases()))
        if self.watch_config and self.config_path is not None:
            self._tasks.append(loop.create_task(self._watch_config()))
        if self.config_path is not None and threading.current_thread() is threading.main_thread():
            loop.add_signal_handler(signal.SIGHUP, self.on_sighup)

    async def stop(self) -> None:
        self.draining = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:  # a background task that died must not skip the cleanup below
                log.exception("a background task had failed before shutdown")
        self._tasks.clear()
        await self.admission.settle()  # the cut requests' shared slots, before the loop closes
        self.shadow.close()
        self.metrics.flush()
        for tier in self.runtime.tiers:
            tier.close()

    async def _flush_metrics(self) -> None:
        # Scrapes flush too; the timer keeps multiprocess files (other workers' scrapes)
        # at most a second behind.
        while True:
            await asyncio.sleep(1.0)
            try:
                self.metrics.flush()
                self._publish_load()
            except Exception:  # one bad flush must not stop the next ones (nor --workers' gauges)
                log.exception("flushing metrics failed")

    def _publish_load(self) -> None:
        if self.worker_load is not None:
            self.worker_load.publish(*self._backend_samples())

    def _backend_samples(self) -> tuple[list[EndpointSample], list[TierSample]]:
        tiers = self.runtime.tiers
        endpoints = [
            EndpointSample(
                state.tier, state.url, state.healthy, int(state.circuit_state), state.inflight
            )
            for tier in tiers
            for state in tier.endpoints
        ]
        return endpoints, [TierSample(tier.name, tier.queued) for tier in tiers]

    def _routing_verdicts(self) -> dict[str, bool]:
        policy = self.runtime.policy
        if not isinstance(policy, RouterPolicy):
            return {}
        return {
            name: routing.routing_pays
            for name, routing in policy.routing.items()
            if routing.routing_pays is not None
        }

    def exposition(self) -> tuple[bytes, str]:
        self.metrics.flush()
        directory = os.environ.get(MULTIPROC_ENV)
        if not directory:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        # Several worker processes: counters, histograms and the workers' load live in files
        # shared by all workers; this worker's view of the backends is added from its state.
        self._publish_load()
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, directory)  # type: ignore[no-untyped-call]
        merged.register(BackendCollector(self._backend_samples, load=self.worker_load is None))
        merged.register(RoutingCollector(self._routing_verdicts))
        return generate_latest(merged), CONTENT_TYPE_LATEST


def _redis_client(settings: Settings, environ: Mapping[str, str]) -> Any:
    """A Redis client when shared limits are configured (the `redis` extra), else None."""
    shared = settings.shared_limits
    secret = shared.redis_url.get_secret_value() if shared.redis_url else None
    url = resolve_secret(secret, shared.redis_url_env, environ)
    if not url:
        return None
    try:
        import redis.asyncio
    except ImportError:
        raise ConfigError(
            "shared_limits: a Redis URL is set (shared_limits.redis_url or $"
            f"{shared.redis_url_env}) but the redis package is not installed: "
            "pip install 'tiergate[redis]'"
        ) from None

    # Short timeouts: a slow Redis must cost a request little before the local fallback.
    return redis.asyncio.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def _replaced_tiers(old: list[TierBackend], new: list[TierBackend]) -> dict[str, TierBackend]:
    """Which running tier each new one replaces: the one of its name, or a renamed one whose
    endpoints it kept (build_tiers). Read before the new tiers adopt those endpoints: the
    requests queued on a renamed tier are woken by its endpoints' freed slots, which from
    then on go to the new tier, so it must take their queue."""
    replaced = {tier.name: tier for tier in old}
    names = {tier.name for tier in new}
    renamed: dict[str, TierBackend] = {}
    taken: set[str] = set()
    for tier in new:
        if tier.name in replaced:
            continue
        for state in tier.endpoints:
            owner = state.owner
            if owner is not None and owner.name not in names and owner.name not in taken:
                taken.add(owner.name)
                renamed[tier.name] = owner
                break
    return replaced | renamed


def _merge_unreplaced_queues(old: list[TierBackend], replaced: Iterable[TierBackend]) -> None:
    """An old tier that no new one replaced, but whose endpoints a new tier kept (two tiers
    merged into one, renamed or not): those endpoints' freed slots now wake the new tier's
    queue, so the requests queued on the old one join it; they waited out queue_timeout_s.
    Called after the new tiers adopted their endpoints."""
    taken = {id(tier) for tier in replaced}
    for tier in old:
        if id(tier) in taken:
            continue
        heir = next((s.owner for s in tier.endpoints if s.owner not in (None, tier)), None)
        if heir is not None:
            heir.join_queue(tier)
            heir.hand_out_free_slots()


def _savings_baselines(
    settings: Settings, tenants: TenantRegistry, policy: RoutingPolicy
) -> dict[str, tuple[str, str | None]]:
    """Each tenant's savings baselines under this configuration, by tier name: the best tier
    it may use, and the uniform tier its alpha's floor names (None without alpha). They go
    with the configuration's Ladder onto every request it routes, so a request in flight
    (or not yet flushed) across a reload is credited against the floor it was routed
    under: crediting it against the new floor showed overspend routing never made."""
    names = [tier.name for tier in settings.tiers]
    routing = policy.routing if isinstance(policy, RouterPolicy) else {}
    baselines: dict[str, tuple[str, str | None]] = {}
    for name, tenant in tenants.tenants.items():
        floor = routing[name].uniform_floor_tier if name in routing else None
        baselines[name] = (names[tenant.top_tier], None if floor is None else names[floor])
    return baselines


def _file_stamp(path: Path | None) -> FileStamp | None:
    if path is None:
        return None
    try:
        return file_stamp(path)
    except OSError:
        return None


class _HotRouteFallback:
    """The generation handler for a POST that reached Starlette (an ASGI app, not a
    request/response function, so Starlette passes the raw scope through)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await self.gateway.runtime.hot_routes[scope["path"]](scope, receive, send)


def _with_request_id(send: Send, request_id: bytes) -> Send:
    """`send` with the request's `x-request-id` added to the response's headers (the OpenAI
    API's other routes carry one too). A POST to a generation path never comes this way:
    `Gateway.__call__` hands it to its handler, which adds its own."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", ()), (REQUEST_ID_HEADER, request_id)]
            message = {**message, "headers": headers}
        await send(message)

    return sending


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error: InvalidRequestError
    if exc.status_code == 405:
        error = MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}.")
    elif exc.status_code == 404:
        error = NotFoundError(f"No route for {request.url.path}.")
    else:
        error = InvalidRequestError(exc.detail)
    response = routes.error_response(error)
    if exc.headers and "Allow" in exc.headers:
        response.headers["Allow"] = exc.headers["Allow"]
    return response


def _refuse_restart_only_changes(running: Settings, new: Settings) -> None:
    """Settings a running gateway cannot swap (its limit store is built once): a reload that
    changes them is refused, not half-applied."""
    if new.shared_limits != running.shared_limits:
        raise ConfigError(
            "shared_limits cannot change on a reload (the limit store is set up at start); "
            "restart the gateway to apply it"
        )


def _with_running_server(running: Settings, new: Settings) -> Settings:
    """The new settings with the running `server` block: the sockets are bound at start, so
    host, port and workers change only on a restart (and /admin/config shows what runs)."""
    if new.server == running.server:
        return new
    log.warning(
        "server settings (host, port, workers) apply at start; the running ones stay until "
        "a restart"
    )
    return new.model_copy(update={"server": running.server})


def check_settings(
    settings: Settings,
    policy_factory: PolicyFactory,
    environ: Mapping[str, str] | None = None,
    *,
    running: Settings | None = None,
) -> None:
    """Raises one of RELOAD_ERRORS for what pydantic cannot see in a configuration: keys shared
    between tenants, a router model that does not load, a label log that cannot be written, a
    Redis URL without the redis package; with `running`, a change a reload of that
    configuration would refuse. `serve --workers` runs it before starting any worker, so a bad
    file fails once instead of crash-looping every worker, and on every edit, so the copy a
    replacement worker starts from is one its siblings accepted too."""
    if running is not None:
        _refuse_restart_only_changes(running, settings)
    env = dict(os.environ) if environ is None else environ
    TenantRegistry(settings, env)
    build_tiers(settings, environ=env)  # the tiers' keys and TLS files
    # Both refuse a token of whitespace alone, as the gateway's start and reload do.
    resolve_secret(settings.admin.token, settings.admin.token_env, env)
    resolve_metrics_token(settings.metrics, env)
    policy_factory(settings)
    _redis_client(settings, env)
    if settings.shadow.label_log is not None:
        # What every worker's sampler will open, checked without creating it (`check` must
        # leave no file behind).
        try:
            check_label_log_path(Path(settings.shadow.label_log))
        except OSError as exc:  # in the words of a refused start or reload
            raise ConfigError(f"shadow.label_log: {exc}") from None


def create_app_from_env(host: str | None = None, port: int | None = None) -> Gateway:
    """The factory each worker process calls (`tiergate serve --workers N`): the config
    path comes from $TIERGATE_CONFIG, set by the parent. `host`, `port` (the socket the
    worker serves on) and $TIERGATE_WORKERS replace the file's server settings, at start and
    on every reload, as `serve`'s options do for one process: they are what runs.

    A worker that replaces a dead one while the file holds what its siblings refused to
    reload (they keep serving) starts on the last valid configuration the supervisor kept
    ($TIERGATE_LAST_VALID_CONFIG), and keeps watching the file. That is a file that cannot
    serve, and also one that changes what only a restart applies (`shared_limits`): valid on
    its own, it would split the workers."""
    from gateway.routing.factory import build_policy

    path = Path(os.environ[CONFIG_ENV])
    kept = os.environ.get(LAST_VALID_CONFIG_ENV)
    workers = os.environ.get(WORKERS_ENV)

    def running(settings: Settings) -> Settings:
        given = {"host": host, "port": port, "workers": int(workers) if workers else None}
        update = {key: value for key, value in given.items() if value is not None}
        server = settings.server.model_copy(update=update)
        return settings.model_copy(update={"server": server})

    def app_from(settings: Settings) -> Gateway:
        return build_app(
            running(settings),
            policy_factory=build_policy,
            config_path=path,
            watch_config=True,
            adjust_loaded=running,
        )

    try:
        settings = load_settings(path)
        if kept and Path(kept).exists():  # what the running workers run
            _refuse_restart_only_changes(load_settings(Path(kept)), settings)
        return app_from(settings)
    except RELOAD_ERRORS as exc:  # any reason the file cannot serve, as a reload would see it
        if not kept:
            raise
        log.error("%s; starting on the last valid configuration", exc)
        return app_from(load_settings(Path(kept)))


def build_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    environ: Mapping[str, str] | None = None,
    policy_factory: PolicyFactory | None = None,
    config_path: Path | None = None,
    watch_config: bool = False,
    adjust_loaded: Callable[[Settings], Settings] | None = None,
) -> Gateway:
    """The one place every long-lived object is created."""
    return Gateway(
        settings,
        registry=registry,
        environ=environ,
        policy_factory=policy_factory,
        config_path=config_path,
        watch_config=watch_config,
        adjust_loaded=adjust_loaded,
    )


__all__ = ["Gateway", "GatewayRuntime", "build_app", "create_app_from_env"]
