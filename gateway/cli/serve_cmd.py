"""Placeholder: `up`, `serve` and `sim` land with the foundation."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Adds `up`, `serve` and `sim` to the root app."""
