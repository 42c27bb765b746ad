"""`tiergate check`: is this configuration one `serve` would start on, and, with `--probe`,
do its engines answer as the gateway expects. For a deployment pipeline: exit 0 when all
is well, 2 for a configuration `serve` would refuse, 1 for an engine that does not answer
as configured."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from gateway.cli.serve_cmd import ConfigOption, given_config_path, run_event_loop


def check(
    config: ConfigOption = None,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe",
            help="Also ask every endpoint for /health and /v1/models, with the tier's key.",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds per probe call.")] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Check a configuration the way `serve` would, without serving."""
    from gateway.app import RELOAD_ERRORS, check_settings
    from gateway.backends.tier import build_tiers
    from gateway.config import load_settings
    from gateway.preflight import EndpointReport, probe_tiers
    from gateway.routing.factory import build_policy

    path = given_config_path(config)
    if path is None:
        typer.echo("tiergate: check needs --config FILE (or $TIERGATE_CONFIG)", err=True)
        raise typer.Exit(2)
    try:
        settings = load_settings(path)
        check_settings(settings, build_policy)
        tiers = build_tiers(settings)
    except RELOAD_ERRORS as exc:
        if as_json:  # a pipeline reading stdout gets the verdict too
            refused = {"config": str(path), "valid": False, "error": str(exc), "ok": False}
            typer.echo(json.dumps(refused, indent=2))
        typer.echo(f"tiergate: {exc}", err=True)
        raise typer.Exit(2) from None
    reports: list[EndpointReport] = []
    if probe:

        async def run() -> None:
            reports.extend(await probe_tiers(tiers, timeout))
            for tier in tiers:
                tier.close()

        run_event_loop(run())
    ok = all(report.ok for report in reports)
    if as_json:
        document = {
            "config": str(path),
            "valid": True,
            "probed": probe,
            "ok": ok,
            "endpoints": [report.as_dict() for report in reports],
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        typer.echo(f"{path}: a valid configuration ({len(settings.tiers)} tiers)")
        for report in reports:
            state = "ok" if report.ok else "PROBLEM"
            typer.echo(f"  {report.tier:<12} {report.endpoint}  {state}")
            for problem in report.problems:
                typer.echo(f"      {problem}")
    if not ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("check")(check)
