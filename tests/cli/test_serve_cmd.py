"""`tiergate serve` and `up` when the gateway cannot listen."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import uvicorn

from gateway.cli.serve_cmd import _serve, run_event_loop


def test_a_gateway_that_cannot_listen_exits_1_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """uvicorn exits with its own code 3 when the bind fails (a port in use, a host that is
    not ours); single-process serve passed it on, where `serve --workers N` says 'cannot
    listen' with exit 1."""

    async def bind_fails(self: uvicorn.Server) -> None:
        raise SystemExit(3)  # what uvicorn's startup does after logging the OSError

    monkeypatch.setattr(uvicorn.Server, "serve", bind_fails)
    with pytest.raises(typer.Exit) as stopped:
        run_event_loop(_serve(object(), "127.0.0.1", 30999))
    assert stopped.value.exit_code == 1
    assert "cannot listen on 127.0.0.1:30999" in capsys.readouterr().err


def test_other_exits_of_uvicorn_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    async def stops(self: uvicorn.Server) -> None:
        raise SystemExit(0)

    monkeypatch.setattr(uvicorn.Server, "serve", stops)
    with pytest.raises(SystemExit) as stopped:
        run_event_loop(_serve(object(), "127.0.0.1", 30999))
    assert stopped.value.code == 0


@pytest.mark.parametrize(
    "option",
    [
        ["sim", "--time-scale", "nan"],
        ["sim", "--time-scale", "-1"],
        ["sim", "--max-num-seqs", "0"],
        ["sim", "--num-speculative-tokens", "-1"],
        ["sim", "--max-model-len", "0"],
        ["up", "--sim-time-scale", "0"],
    ],
)
def test_a_simulator_option_out_of_range_is_a_usage_error(option: list[str]) -> None:
    """These started a simulator anyway, which served as if the value were not there (or,
    at --max-model-len 0, refused every request)."""
    from typer.testing import CliRunner

    from gateway.cli.main import app

    result = CliRunner().invoke(app, option)
    assert result.exit_code == 2 and "Invalid value" in result.output


def test_up_that_cannot_listen_says_so_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`up` reported the failed bind, then its handler of a simulator's RuntimeError caught
    the typer.Exit (click's Exit is a RuntimeError) and printed 'tiergate: 1' after it."""
    from typer.testing import CliRunner

    import gateway.launcher
    from gateway.cli.main import app

    async def bind_fails(self: uvicorn.Server) -> None:
        raise SystemExit(3)

    monkeypatch.setattr(uvicorn.Server, "serve", bind_fails)
    monkeypatch.setattr(gateway.launcher, "exit_on_sigterm", lambda: None)
    monkeypatch.setattr(gateway.launcher, "freeze_startup_heap", lambda: None)
    config = tmp_path / "c.yaml"
    config.write_text(  # tiers elsewhere: no simulator to start
        "model: m\nserver: {host: 127.0.0.1, port: 32150}\ntiers:\n"
        "  - {name: a, precision: nvfp4, endpoints: ['http://192.0.2.1:9/v1']}\n"
        "  - {name: b, precision: bf16, endpoints: ['http://192.0.2.1:10/v1']}\n"
        "tenants: [{name: t, api_keys: ['sk-test-1234567890']}]\n"
    )
    result = CliRunner().invoke(app, ["up", "--config", str(config)])
    assert result.exit_code == 1
    assert result.output.rstrip().endswith("cannot listen on 127.0.0.1:32150 (see the error above)")
