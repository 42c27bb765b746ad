"""`tiergate up`, `tiergate serve` and `tiergate sim`."""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import math
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gateway.precision import Precision

if TYPE_CHECKING:
    from gateway.config import Settings


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Runs on uvloop (asyncio.run would silently use the slower default loop)."""
    import uvloop

    uvloop.run(main)


class LogLevel(enum.StrEnum):
    """uvicorn's log levels (it raises a KeyError on any other)."""

    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"
    trace = "trace"


ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML configuration (default: $TIERGATE_CONFIG)."),
]


def given_config_path(config: Path | None) -> Path | None:
    if config is not None:
        return config
    return Path(os.environ["TIERGATE_CONFIG"]) if os.environ.get("TIERGATE_CONFIG") else None


def _settings(config: Path | None, port: int | None, sim_base_port: int = 9001):  # type: ignore[no-untyped-def]
    from gateway.config import ConfigError, default_settings, load_settings

    source = given_config_path(config)
    ports = (sim_base_port, sim_base_port + 1, sim_base_port + 2)
    try:
        settings = load_settings(source) if source else default_settings(sim_ports=ports)
    except ConfigError as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None
    return port_override(port)(settings)


def port_override(
    port: int | None, *, host: str | None = None, workers: int | None = None
) -> Callable[[Settings], Settings]:
    """What the command line changes in a configuration's server block (--port; serve's --host
    and --workers). Applied to every reload of the file too: the file's own values would
    otherwise differ from the running ones, and each reload, even of an unchanged file, would
    warn that the server settings wait for a restart (and /admin/config would show the file's
    host, not the one served on)."""
    given = {"port": port, "host": host, "workers": workers}
    update = {key: value for key, value in given.items() if value is not None}

    def apply(settings: Settings) -> Settings:
        if not update:
            return settings
        server = settings.server.model_copy(update=update)
        return settings.model_copy(update={"server": server})

    return apply


@contextlib.contextmanager
def config_errors_exit() -> Iterator[None]:
    """What pydantic cannot see in a config (a key shared by tenants, a router model that does
    not load) ends the command in one line with exit 2, never a traceback."""
    from gateway.app import RELOAD_ERRORS

    try:
        yield
    except RELOAD_ERRORS as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None


def _refuse_busy_ports(host: str, port: int, sim_ports: list[int], config: Path | None) -> None:
    """Fails before starting anything when a port is taken, naming the option that moves it."""
    from gateway.launcher import ports_in_use

    if ports_in_use(host, [port]):
        typer.echo(f"tiergate: port {port} is in use; choose another with --port", err=True)
        raise typer.Exit(2)
    busy = ports_in_use(host, sim_ports)
    if busy:
        move = "--sim-base-port" if config is None else "the tier endpoints in the config"
        typer.echo(
            f"tiergate: port(s) {', '.join(map(str, busy))} for the simulated tiers are in use; "
            f"choose others with {move}",
            err=True,
        )
        raise typer.Exit(2)


def up_options(
    shadow: Mapping[str, Any], admin_token: str, environ: Mapping[str, str]
) -> Callable[[Settings], Settings]:
    """What `up`'s options change in a configuration: `shadow` fields, and `admin_token` where
    the configuration gives no admin token. Applied at start and to every reload of the file,
    which has none of them: a reload would otherwise turn off the admin API whose token `up`
    printed, and the shadow evaluation its options asked for."""
    from gateway.config import resolve_secret

    def apply(settings: Settings) -> Settings:
        if shadow:
            shadowed = settings.shadow.model_copy(update=dict(shadow))
            settings = settings.model_copy(update={"shadow": shadowed})
        admin = settings.admin
        if not resolve_secret(admin.token, admin.token_env, environ):
            keyed = admin.model_copy(update={"token": admin_token})
            settings = settings.model_copy(update={"admin": keyed})
        return settings

    return apply


def _positive_finite(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter("must be a finite number above 0")
    return value


def up(
    *,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Gateway port (default: the config's, else 8000)."),
    ] = None,
    config: ConfigOption = None,
    sim_time_scale: Annotated[
        float, typer.Option(help="Simulator clock multiplier.", callback=_positive_finite)
    ] = 1.0,
    sim_base_port: Annotated[
        int,
        typer.Option(
            min=1, max=65533, help="First of three ports for the embedded tiers (no --config)."
        ),
    ] = 9001,
    shadow_rate: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Share of cheaper-tier requests replayed on the top tier to label them (and "
            "of top-tier requests replayed on a cheaper tier); turns on online recalibration.",
        ),
    ] = 0.0,
    label_log: Annotated[
        Path | None, typer.Option(help="Append the shadow labels to this JSONL file (rotated).")
    ] = None,
) -> None:
    """Start three simulated vLLM tiers and the gateway in one command (the embedded default)."""
    import secrets

    from gateway.app import build_app
    from gateway.config import resolve_secret
    from gateway.launcher import (
        banner,
        clear_multiprocess_dir,
        exit_on_sigterm,
        freeze_startup_heap,
        local_sim_specs,
        running_sims,
    )
    from gateway.routing.factory import build_policy

    settings = _settings(config, port, sim_base_port)
    shadow: dict[str, Any] = {}
    if shadow_rate > 0 or label_log is not None:
        # The simulated tiers decode deterministically whatever the temperature.
        shadow["assume_deterministic"] = True
        if shadow_rate > 0:
            shadow |= {"rate": shadow_rate, "explore_rate": shadow_rate}
        if label_log is not None:
            shadow["label_log"] = label_log
        if config is None:
            # The embedded demo's log keeps the text so that `router train` reads it; a
            # config file's own keep_text (a privacy choice) is never overridden.
            shadow["keep_text"] = True
    with_options = up_options(shadow, secrets.token_urlsafe(18), os.environ)
    with config_errors_exit():
        settings = with_options(settings)
        # As the gateway resolves it: the file's token before its variable's.
        admin_token = resolve_secret(settings.admin.token, settings.admin.token_env, os.environ)
    if settings.server.workers > 1:
        # The demo's admin token and shadow settings live in this process only.
        typer.echo(
            f"tiergate: up runs one gateway process; server.workers "
            f"({settings.server.workers}) is for `tiergate serve`",
            err=True,
        )
    exit_on_sigterm()
    with config_errors_exit():
        specs = local_sim_specs(settings, ("--time-scale", str(sim_time_scale)))
    host = settings.server.host
    _refuse_busy_ports(host, settings.server.port, [spec.port for spec in specs], config)
    # As `serve` does: with $PROMETHEUS_MULTIPROC_DIR exported, the last run's files would
    # count as this run's (its counters, and a dead process's in-flight gauges).
    clear_multiprocess_dir()
    try:
        with running_sims(specs):
            with config_errors_exit():
                app = build_app(
                    settings,
                    policy_factory=build_policy,
                    config_path=given_config_path(config),
                    watch_config=True,
                    adjust_loaded=lambda loaded: with_options(port_override(port)(loaded)),
                )
            keys = [k.get_secret_value() for t in settings.tenants for k in t.api_keys]
            key = next((k for k in keys if not k.startswith("sha256:")), "<your key>")
            typer.echo(
                banner(
                    f"http://{host}:{settings.server.port}",
                    key,
                    settings.model,
                    [t.name for t in settings.tiers],
                    admin_token=admin_token,
                    python=sys.executable,
                    has_sdk=importlib.util.find_spec("openai") is not None,
                )
            )
            freeze_startup_heap()
            run_event_loop(_serve(app, host, settings.server.port))
    except typer.Exit:  # a RuntimeError too (click's Exit), and _serve has said why
        raise
    except RuntimeError as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(1) from None


def serve(
    *,
    config: ConfigOption = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Override server.port.")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Override server.host.")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=256, help="Processes (one per core); overrides server.workers."),
    ] = None,
) -> None:
    """Run the gateway alone, in front of the tiers named in the configuration."""
    # A SIGHUP before the reload handler is installed would end the process (the default
    # action); the configuration read below is the current one anyway.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from gateway.app import build_app, check_settings
    from gateway.launcher import (
        clear_multiprocess_dir,
        exit_on_sigterm,
        freeze_startup_heap,
        serve_workers,
    )
    from gateway.routing.factory import build_policy

    settings = _settings(config, port)
    count = workers or settings.server.workers
    path = given_config_path(config)
    if count > 1:
        if path is None:
            typer.echo("tiergate: --workers needs a --config file (each worker reads it)", err=True)
            raise typer.Exit(2)
        with config_errors_exit():
            check_settings(settings, build_policy)
        try:
            serve_workers(path, host or settings.server.host, settings.server.port, count)
        except OSError as error:  # the address is taken or not ours to bind
            typer.echo(f"tiergate: cannot listen: {error}", err=True)
            raise typer.Exit(1) from error
        except RuntimeError as error:  # workers that cannot start
            typer.echo(f"tiergate: {error}", err=True)
            raise typer.Exit(1) from error
        return
    exit_on_sigterm()
    clear_multiprocess_dir()
    running = port_override(port, host=host, workers=workers)  # what runs: as given
    with config_errors_exit():
        app = build_app(
            running(settings),
            policy_factory=build_policy,
            config_path=path,
            watch_config=True,
            adjust_loaded=running,
        )
    freeze_startup_heap()
    run_event_loop(_serve(app, host or settings.server.host, settings.server.port))


async def _serve(app: object, host: str, port: int) -> None:
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from gateway.launcher import gateway_config

    try:
        await uvicorn.Server(gateway_config(app, host, port)).serve()
    except SystemExit as stop:
        if stop.code != STARTUP_FAILURE:
            raise
        # uvicorn has logged why (the address is taken or not ours); its exit code 3 is none
        # of ours, and `serve --workers N` says the same with exit 1.
        typer.echo(f"tiergate: cannot listen on {host}:{port} (see the error above)", err=True)
        raise typer.Exit(1) from None


def sim(
    *,
    precision: Annotated[str, typer.Option(help="bf16, fp16, fp8, w4a16 or nvfp4.")] = "bf16",
    port: Annotated[int, typer.Option(min=0, max=65535)] = 9001,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    served_model_name: Annotated[
        str | None, typer.Option(help="Model id the server answers to.")
    ] = None,
    hardware: Annotated[
        str, typer.Option(help="Cost-model hardware preset: h200 or b200.")
    ] = "h200",
    model_preset: Annotated[str, typer.Option(help="Cost-model model preset.")] = "qwen3-30b-a3b",
    time_scale: Annotated[
        float,
        typer.Option(help="Multiplies every simulated duration.", callback=_positive_finite),
    ] = 1.0,
    spec_decode: Annotated[
        bool, typer.Option("--spec-decode", help="n-gram speculative decoding.")
    ] = False,
    num_speculative_tokens: Annotated[int, typer.Option(min=1)] = 4,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching")] = False,
    max_num_seqs: Annotated[
        int | None, typer.Option(min=1, help="Batch cap (default: the knee K(p)).")
    ] = None,
    max_model_len: Annotated[int, typer.Option(min=1)] = 32_768,
    error_rate: Annotated[float, typer.Option(help="Share of requests answered HTTP 500.")] = 0.0,
    added_latency_ms: Annotated[float, typer.Option(help="Delay before each response.")] = 0.0,
    drop_mid_stream: Annotated[float, typer.Option(help="Share of streams cut short.")] = 0.0,
    refuse_connections: Annotated[bool, typer.Option("--refuse-connections")] = False,
    max_waiting: Annotated[
        int | None, typer.Option(help="503 when this many requests wait.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds fault injection.")] = 0,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="TIERGATE_SIM_API_KEY",  # launcher.SIM_API_KEY_ENV, set by `tiergate up`
            help="As vLLM's --api-key: /v1 calls need 'Authorization: Bearer KEY'.",
        ),
    ] = None,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False)] = LogLevel.warning,
) -> None:
    """Run a vLLM-compatible simulated tier whose timing follows the cost model."""
    from gateway.launcher import die_with_parent

    die_with_parent()
    from typing import get_args

    from gateway.planner.costmodel import CostModel
    from gateway.sim.engine import EngineConfig, SpecConfig
    from gateway.sim.faults import Faults
    from gateway.sim.run import serve as serve_sim
    from gateway.sim.server import SimServer

    if precision not in get_args(Precision):
        typer.echo(f"tiergate: --precision must be one of {get_args(Precision)}", err=True)
        raise typer.Exit(2)
    try:
        cost_model = CostModel.preset(hardware, model_preset)
        faults = Faults(
            error_rate=error_rate,
            added_latency_s=added_latency_ms / 1000.0,
            drop_mid_stream=drop_mid_stream,
            refuse_connections=refuse_connections,
            max_waiting=max_waiting,
        )
    except (KeyError, ValueError) as exc:
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None
    config = EngineConfig(
        precision=precision,  # type: ignore[arg-type]
        cost_model=cost_model,
        time_scale=time_scale,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        speculation=SpecConfig(num_speculative_tokens=num_speculative_tokens)
        if spec_decode
        else None,
        prefix_caching=prefix_caching,
    )
    server = SimServer(
        config, served_model_name or f"sim-{precision}", faults, seed=seed, api_key=api_key
    )
    run_event_loop(serve_sim(server, host, port, log_level=log_level.value))


def register(app: typer.Typer) -> None:
    """Adds `up`, `serve` and `sim` to the root app."""
    app.command("up")(up)
    app.command("serve")(serve)
    app.command("sim")(sim)
