"""`tiergate regime`: the traffic regime (C, rho, r) of a trace file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer

from router_models.json_out import one_line

__all__ = ["compute_trace_regime", "default_capacity_blocks", "register"]


def default_capacity_blocks(hardware: str, precision: str, block_tokens: int) -> int:
    """KV capacity of one GPU at `precision` after the weights (P0 budget), in blocks."""
    from gateway.planner.costmodel import CostModel
    from gateway.precision import PRECISIONS

    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {list(PRECISIONS)}")
    model = CostModel.preset(hardware)
    return int(model.kv_capacity_tokens(precision)) // block_tokens


def compute_trace_regime(
    trace_path: Path,
    *,
    fmt: str | None = None,
    block_tokens: int | None = None,
    replay_block_tokens: int = 16,
    capacity_blocks: int | None = None,
    capacity_tokens: float | None = None,
    hardware: str = "b200",
    precision: str = "bf16",
    prefill_tps: float = 10_000.0,
    tpot_ms: float = 25.0,
    ngram_min: int = 2,
    ngram_max: int = 4,
    num_spec_tokens: int = 4,
) -> dict[str, Any]:
    """Reads the trace and returns the `tiergate regime --json` document. Blocks are
    `block_tokens`, else a Mooncake trace's 512-token hash blocks, else `replay_block_tokens`
    (the engine's block size). The LRU bound is `capacity_blocks`, else `capacity_tokens` in
    blocks, else the KV capacity of `hardware` at `precision`."""
    from gateway.observer.offline_regime import ServiceTimeModel, trace_regime
    from gateway.observer.traces import TraceFormat, read_trace

    if fmt not in (None, "auto", "mooncake", "azure", "chat"):
        raise ValueError(f"unknown format {fmt!r}; use auto, mooncake, azure or chat")
    kind = None if fmt in (None, "auto") else cast(TraceFormat, fmt)
    trace = read_trace(trace_path, kind)
    blocks = block_tokens or (512 if trace.format == "mooncake" else replay_block_tokens)
    capacity = capacity_blocks
    if capacity is None and capacity_tokens is not None:
        capacity = int(capacity_tokens) // blocks
    elif capacity is None and trace.format != "azure":
        capacity = default_capacity_blocks(hardware, precision, blocks)
    out = trace_regime(
        trace,
        block_tokens=blocks,
        capacity_blocks=capacity,
        service=ServiceTimeModel(prefill_tokens_per_s=prefill_tps, tpot_s=tpot_ms / 1000.0),
        min_n=ngram_min,
        max_n=ngram_max,
        k=num_spec_tokens,
    )
    out["source"] = str(trace_path)
    if capacity_blocks is None and capacity_tokens is None and capacity is not None:
        out["rho"]["capacity_from"] = f"{hardware} {precision} KV capacity after weights"
    return out


def _print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(x: Any) -> str:
        return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))

    table = Table(title=f"regime of {doc['source']} ({doc['format']}, {doc['requests']} requests)")
    table.add_column("quantity")
    table.add_column("value")
    for key in ("mean", "p50", "p95"):
        table.add_row(f"C {key}", fmt(doc["concurrency"].get(key)))
    table.add_row("rho unbounded", fmt(doc["rho"].get("unbounded")))
    table.add_row("rho lru", fmt(doc["rho"].get("lru")))
    r = doc.get("r") or {}
    for key in ("r_iid", "r_pos", "r_round", "A_sim"):
        table.add_row(key, fmt(r.get(key)))
    table.add_row("L_in / L_out", f"{fmt(doc['lengths']['l_in'])} / {fmt(doc['lengths']['l_out'])}")
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Adds `tiergate regime` to the root app."""

    @app.command("regime")
    def regime(
        *,
        trace: Annotated[Path, typer.Option("--trace", help="trace file", exists=True)],
        json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
        fmt: Annotated[
            str, typer.Option("--format", help="auto | mooncake | azure | chat")
        ] = "auto",
        block_tokens: Annotated[
            int | None,
            typer.Option(min=1, help="tokens per block: Mooncake hash block (512) or replay (16)"),
        ] = None,
        capacity_blocks: Annotated[
            int | None, typer.Option(min=1, help="LRU bound in blocks (default: KV capacity)")
        ] = None,
        hardware: Annotated[str, typer.Option(help="for the default capacity")] = "b200",
        precision: Annotated[str, typer.Option(help="for the default capacity")] = "bf16",
        prefill_tps: Annotated[
            float, typer.Option(help="service model: prefill tokens/s")
        ] = 10_000.0,
        tpot_ms: Annotated[float, typer.Option(help="service model: ms per output token")] = 25.0,
        ngram_min: Annotated[int, typer.Option(min=1, help="prompt_lookup_min")] = 2,
        ngram_max: Annotated[int, typer.Option(min=1, help="prompt_lookup_max")] = 4,
        num_spec_tokens: Annotated[int, typer.Option(min=1, help="num_speculative_tokens")] = 4,
    ) -> None:
        """Concurrency, prefix share and n-gram repetitiveness of a trace (Mooncake JSONL,
        Azure CSV, or chat logs with text)."""
        try:
            doc = compute_trace_regime(
                trace,
                fmt=fmt,
                block_tokens=block_tokens,
                capacity_blocks=capacity_blocks,
                hardware=hardware,
                precision=precision,
                prefill_tps=prefill_tps,
                tpot_ms=tpot_ms,
                ngram_min=ngram_min,
                ngram_max=ngram_max,
                num_spec_tokens=num_spec_tokens,
            )
        except (KeyError, ValueError, OSError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        if json_out:
            typer.echo(one_line(doc))
        else:
            _print_table(doc)
