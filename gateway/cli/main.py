"""The `tiergate` command: one Typer app; every sub-command lives in its own module.

Sub-command modules import their heavy dependencies inside the command functions so that
`tiergate sim` does not pay for scikit-learn and `tiergate serve` does not pay for matplotlib.
"""

from __future__ import annotations

import typer

from gateway.cli import check_cmd, plan_cmd, regime_cmd, router_cmd, serve_cmd

app = typer.Typer(
    name="tiergate",
    help="Precision-tier routing gateway for LLM serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
serve_cmd.register(app)
check_cmd.register(app)
app.add_typer(router_cmd.app, name="router")
app.add_typer(plan_cmd.app, name="plan")
regime_cmd.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
