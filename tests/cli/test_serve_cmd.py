"""`tiergate serve` and `up` when the gateway cannot listen."""

from __future__ import annotations

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
