"""Placeholder: filled in by its issue."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Adds `tiergate regime` to the root app."""
