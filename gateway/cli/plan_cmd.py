"""`tiergate plan`: per-tier precision, speculation and prefix-caching recommendations.

`tiergate plan breakeven --json` prints the paper's breakeven table. `tiergate plan` takes the
regime from exactly one of `--regime C=..,rho=..,r=..`, `--trace FILE` or `--from-gateway URL`
and prints the plan; `--write DIR` also writes the vLLM arguments per tier as a deploy overlay.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from router_models.json_out import one_line

if TYPE_CHECKING:
    from pydantic import ValidationError

    from gateway.planner.params import Settings
    from gateway.planner.planner import Regime, TierConfig, TierPlan
    from gateway.precision import Precision

__all__ = [
    "GatewayError",
    "GatewayTier",
    "app",
    "fetch_gateway_regime",
    "parse_regime",
    "tier_regimes_from_gateway",
]

app = typer.Typer(
    invoke_without_command=True,
    no_args_is_help=False,
    help="Recommend precision, n-gram speculation and prefix caching per tier.",
)

ADMIN_TOKEN_ENV: Final = "TIERGATE_ADMIN_TOKEN"
_REGIME_KEYS: Final[dict[str, str]] = {
    "c": "concurrency",
    "concurrency": "concurrency",
    "rho": "rho",
    "r": "r",
    "l_in": "l_in",
    "lin": "l_in",
    "l_out": "l_out",
    "lout": "l_out",
}


class GatewayError(RuntimeError):
    """The gateway could not be reached or answered something unusable."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _precision(name: str) -> Precision:
    from gateway.precision import PRECISIONS

    value = name.strip().lower()
    if value not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
    return value


def parse_regime(text: str) -> Regime:
    """`C=256,rho=0.3,r=0.3[,L_in=2048,L_out=512]` -> Regime."""
    from gateway.planner.planner import Regime

    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        name = _REGIME_KEYS.get(key.strip().lower())
        if not sep or name is None:
            raise ValueError(f"bad regime item {part!r}; expected C=..,rho=..,r=..")
        if name in values:  # the last would win silently: C=32,...,C=64 is a typo to show
            raise ValueError(f"regime item {key.strip()!r} is given twice")
        values[name] = float(raw)
    missing = {"concurrency", "rho", "r"} - values.keys()
    if missing:
        raise ValueError(f"regime lacks {', '.join(sorted(missing))}")
    return Regime(
        concurrency=values["concurrency"],
        rho=values["rho"],
        r=values["r"],
        l_in=values.get("l_in"),
        l_out=values.get("l_out"),
    )


def fetch_gateway_regime(url: str, token: str | None, timeout_s: float = 10.0) -> dict[str, Any]:
    """GET `url/admin/regime` with the admin bearer token."""
    import urllib.error
    import urllib.request

    target = url.rstrip("/") + "/admin/regime"
    request = urllib.request.Request(target, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        hint = (
            ": set $TIERGATE_ADMIN_TOKEN to the gateway's admin token (`tiergate up` prints it)"
            if exc.code in (401, 403)
            else ""
        )
        raise GatewayError(f"{target} answered HTTP {exc.code} {exc.reason}{hint}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise GatewayError(f"cannot reach {target}: {exc}") from exc
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise GatewayError(f"{target} did not return JSON") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("tiers"), dict):
        raise GatewayError(f"{target} returned no 'tiers' mapping")
    return doc


def _first(*values: Any) -> float | None:
    """The first finite number among `values` (what a JSON document says, or None)."""
    for v in values:
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


@dataclass(frozen=True)
class GatewayTier:
    """One tier of `/admin/regime`, ready to plan."""

    precision: Precision | None
    regime: Regime | None  # None: no traffic in the window
    source: str
    current: TierConfig | None = None
    kv_capacity_tokens: float | None = None  # what the tier's engines hold (b.2 item 4)


def tier_regimes_from_gateway(
    doc: dict[str, Any], *, engine_r_usable: bool = True
) -> dict[str, GatewayTier]:
    """Per tier: its precision, the regime to plan for and where rho and r came from. rho
    prefers the engine counters (exact, APC on), then the LRU replay; r prefers the live
    spec-decode counters (speculation on), then the replayed r corrected to reference
    precision (r_reference = r_iid / eta). `engine_r_usable` is False under a per-batch
    speculation table, as in the live planner: rounds at a k = 0 batch draft nothing, so the
    engine's acceptance understates r. An optional
    `"current": {"speculative", "prefix_caching"}` tells what the tier runs with now."""
    from gateway.observer.regime import per_engine_concurrency
    from gateway.planner.planner import MIN_CONCURRENCY, Regime, TierConfig

    out: dict[str, GatewayTier] = {}
    for name, tier in doc["tiers"].items():
        if not isinstance(tier, dict):
            continue
        raw_precision = tier.get("precision")
        precision = _precision(raw_precision) if isinstance(raw_precision, str) else None
        flags = tier.get("current")
        current = None
        if precision is not None and isinstance(flags, dict):
            current = TierConfig(
                precision, bool(flags.get("speculative")), bool(flags.get("prefix_caching"))
            )
        conc = tier.get("concurrency") or {}
        rho = tier.get("rho") or {}
        r = tier.get("r") or {}
        lengths = tier.get("lengths") or {}
        # The live planner's rule: in-flight requests per engine, gateway or engine view.
        endpoints = _first(conc.get("endpoints"))
        c = per_engine_concurrency(
            _first(conc.get("mean")),
            _first(conc.get("engine_mean")),
            1 if endpoints is None else max(1, int(endpoints)),
        )
        if c is None or c < MIN_CONCURRENCY:  # the live planner's rule: no traffic
            out[str(name)] = GatewayTier(precision, None, "no traffic in the window", current)
            continue
        rho_v = _first(rho.get("engine"), rho.get("lru"), rho.get("unbounded"))
        # r_reference: the replay corrected for the tier's erosion; r_iid from gateways
        # that predate it (an underestimate by eta on a non-reference tier).
        r_engine = _first(r.get("r_engine")) if engine_r_usable else None
        r_v = _first(r_engine, r.get("r_reference"), r.get("r_iid"))
        if rho_v is None or r_v is None:
            # Planning on a default of 0 would turn prefix caching or speculation off on no
            # evidence at all: such a tier waits until its sampled requests say something.
            unknown = " and ".join(n for n, v in (("rho", rho_v), ("r", r_v)) if v is None)
            note = f"{unknown} not measured yet (no sampled requests in the window)"
            out[str(name)] = GatewayTier(precision, None, note, current)
            continue
        sampled = _first(rho.get("sampled_tokens"))
        rounds = _first(r.get("rounds"))
        source = (
            f"rho from {'engine' if _first(rho.get('engine')) is not None else 'replay'}"
            f" ({rho_v:.3f}"
            f"{'' if sampled is None else f', {int(sampled):,} sampled prompt tokens'}), r from "
            f"{'engine' if r_engine is not None else 'replay'}"
            f" ({r_v:.3f}{'' if rounds is None else f', {int(rounds):,} sampled rounds'})"
        )
        regime = Regime(
            concurrency=c,
            rho=min(max(rho_v or 0.0, 0.0), 1.0),
            r=min(max(r_v or 0.0, 0.0), 1.0),
            # A length of 0 (no completed request) is unmeasured, as in the live planner.
            l_in=_first(lengths.get("l_in")) or None,
            l_out=_first(lengths.get("l_out")) or None,
        )
        # The live planner's (a gateway's configured value, else its engines'); older
        # gateways name the engines' only.
        capacity = _first(tier.get("kv_capacity_tokens"), tier.get("engine_kv_capacity_tokens"))
        out[str(name)] = GatewayTier(precision, regime, source, current, capacity)
    return out


def _one_line(exc: ValidationError, source: Path | None) -> str:
    """pydantic's multi-line report as one line: each bad field with its message."""
    problems = "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
        for error in exc.errors()
    )
    return f"{source or 'settings'}: invalid {problems}"


def _settings(params: Path | None, hardware: str | None, model: str | None) -> Settings:
    from pydantic import ValidationError

    from gateway.planner.params import settings_from_mapping
    from gateway.planner.presets import hardware_preset, model_preset

    data: dict[str, Any] = {}
    if params is not None:
        import yaml

        try:
            loaded = yaml.safe_load(params.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:  # its own message names no file
            raise ValueError(f"{params}: not UTF-8 text ({exc.reason})") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"{params}: not valid YAML: {' '.join(str(exc).split())}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{params} is not a YAML mapping")
        data = dict(loaded or {})
    try:
        settings = settings_from_mapping(data)
    except ValidationError as exc:
        raise ValueError(_one_line(exc, params)) from None
    update: dict[str, Any] = {}
    if hardware is not None:
        update["hardware"] = hardware_preset(hardware)
    if model is not None:
        update["model"] = model_preset(model)
    return settings.model_copy(update=update) if update else settings


def _trace_regime(
    trace: Path, settings: Settings, candidates: list[Precision], concurrency: float | None
) -> tuple[Regime, str]:
    from gateway.cli.regime_cmd import compute_trace_regime
    from gateway.planner.costmodel import CostModel
    from gateway.planner.planner import Regime

    # The LRU bound is the KV capacity of the highest-byte candidate, the smallest cache:
    # a conservative rho for every tier.
    model = CostModel.from_settings(settings)
    biggest = max(candidates, key=model.bytes_per_param)
    capacity_tokens = model.kv_capacity_tokens(biggest)
    # r is measured with the n-gram settings the tier serves with (c.1), rho with its block
    # size (chat logs; a Mooncake trace keeps its own hash-block size).
    doc = compute_trace_regime(
        trace,
        capacity_tokens=capacity_tokens,
        replay_block_tokens=settings.serve.block_size,
        ngram_min=settings.serve.prompt_lookup_min,
        ngram_max=settings.serve.prompt_lookup_max,
        num_spec_tokens=settings.cost.num_speculative_tokens,
    )
    c = concurrency if concurrency is not None else doc["concurrency"].get("mean")
    if c is None:
        raise ValueError(f"{trace} has no timing ({doc['format']}); pass --concurrency")
    rho = doc["rho"].get("lru")
    r = (doc.get("r") or {}).get("r_iid")
    unknown = [name for name, value in (("rho", rho), ("r", r)) if value is None]
    if unknown:
        # A length-only trace cannot show prefix sharing or repetition: say what 0 means here.
        typer.echo(
            f"note: {trace.name} cannot measure {' or '.join(unknown)} ({doc['format']} "
            f"trace); its flag stays as --current when given, else it is planned as 0 (not "
            "recommended on this evidence). Give --regime with measured values to plan it.",
            err=True,
        )
    source = (
        f"trace {trace.name} ({doc['format']}): C mean {c:.2f}, "
        f"rho {'not measured' if rho is None else f'lru {rho:.3f} at {biggest} capacity'}, "
        f"r {'not measured' if r is None else f'r_iid {r:.3f}'}"
    )
    lengths = doc["lengths"]
    regime = Regime(
        concurrency=float(c),
        rho=float(rho or 0.0),
        r=float(r or 0.0),
        # A mean length of 0 (a trace of empty prompts) measures nothing: the model's own.
        l_in=(lengths.get("l_in") or None) if doc["format"] != "chat" else None,
        l_out=(lengths.get("l_out") or None) if doc["format"] != "chat" else None,
        rho_known=rho is not None,
        r_known=r is not None,
    )
    return regime, source


def _current(text: str | None) -> TierConfig | None:
    """`nvfp4,s=1,k=0` -> TierConfig; an omitted flag is vLLM's default (no speculation,
    prefix caching on)."""
    from gateway.planner.planner import TierConfig

    if text is None:
        return None
    head, *rest = [p.strip() for p in text.split(",")]
    flags = {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in rest if p)}
    unknown = sorted(set(flags) - {"s", "k"})
    if unknown:
        raise ValueError(f"--current: unknown flag {', '.join(unknown)}; expected s=.., k=..")
    return TierConfig(
        precision=_precision(head),
        speculative=_flag(flags, "s", default=False),
        prefix_caching=_flag(flags, "k", default=True),
    )


_ON: Final = frozenset({"1", "true", "on"})
_OFF: Final = frozenset({"0", "false", "off"})


def _flag(flags: dict[str, str], name: str, *, default: bool) -> bool:
    # A typo (`s=yes`, a bare `s`) must not read as "off": it would plan against the wrong
    # running configuration and report a wrong cost of inheriting it.
    value = flags.get(name)
    if value is None:
        return default
    if value.lower() in _ON | _OFF:
        return value.lower() in _ON
    raise ValueError(f"--current: {name}={value!r} is not one of 1/0, true/false, on/off")


def _plan_doc(name: str, regime: Regime, plan: TierPlan, source: str) -> dict[str, Any]:
    from dataclasses import asdict

    return {**plan.to_dict(), "regime": asdict(regime), "regime_source": source, "tier": name}


def _write_overlay(
    directory: Path, tiers: dict[str, dict[str, Any]], settings: Settings
) -> list[Path]:
    import yaml

    from gateway.planner.vllm_args import serve_command

    directory.mkdir(parents=True, exist_ok=True)
    planned = {
        name: {
            "precision": doc["precision"],
            "speculative": doc["speculative"],
            "prefix_caching": doc["prefix_caching"],
            "vllm_args": doc["vllm_args"],
            "command": serve_command(doc["vllm_args"]),
        }
        for name, doc in tiers.items()
    }
    kept = _unplanned_tiers(directory / "overlay.yaml", settings, planned)
    for name in kept:
        typer.echo(f"kept tier {name} from the earlier overlay (not planned now)", err=True)
    overlay = {
        # What the plan assumed: an overlay planned for one GPU is wrong on another.
        "hardware": settings.hardware.name,
        "model": settings.model.name,
        "tiers": {**planned, **kept},
    }
    written = [directory / "overlay.yaml"]
    header = "# Written by `tiergate plan --write`: recommended `vllm serve` args per tier.\n"
    written[0].write_text(header + yaml.safe_dump(overlay, sort_keys=False), encoding="utf-8")
    for name, doc in tiers.items():
        path = directory / f"{name}.args.json"
        path.write_text(json.dumps(doc["vllm_args"], indent=1) + "\n", encoding="utf-8")
        written.append(path)
    return written


def _unplanned_tiers(path: Path, settings: Settings, planned: dict[str, Any]) -> dict[str, Any]:
    """The tiers of an earlier overlay (same hardware and model) that this plan does not
    cover, such as those a gateway has not sampled yet: a partial plan would drop them, and
    leave their args files behind, out of step with the overlay."""
    import yaml

    try:
        earlier = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(earlier, dict) or (earlier.get("hardware"), earlier.get("model")) != (
        settings.hardware.name,
        settings.model.name,
    ):
        return {}
    tiers = earlier.get("tiers")
    if not isinstance(tiers, dict):
        return {}
    return {name: tier for name, tier in tiers.items() if name not in planned}


def _write_and_report(
    directory: Path, tiers: dict[str, dict[str, Any]], settings: Settings
) -> None:
    try:
        written = _write_overlay(directory, tiers, settings)
    except OSError as exc:
        raise _fail(f"--write {directory}: {exc}") from exc
    for path in written:
        typer.echo(f"wrote {path}", err=True)


def _print_plans(settings: Settings, tiers: dict[str, dict[str, Any]]) -> None:
    from rich.console import Console

    from gateway.planner.vllm_args import serve_command

    console = Console()
    console.print(f"[bold]{settings.model.name} on {settings.hardware.name}[/bold]")
    for name, doc in tiers.items():
        console.print(
            f"\n[bold]{name}[/bold]: {doc['precision']}  speculation "
            f"{'on' if doc['speculative'] else 'off'}  prefix caching "
            f"{'on' if doc['prefix_caching'] else 'off'}  "
            f"CPT {doc['expected_cpt'] * 1e6:.3f} GPU-us/token"
        )
        console.print(f"  regime: {doc['regime_source']}", highlight=False)
        for reason in doc["reasons"]:
            console.print(f"  - {reason}", highlight=False)
        console.print(f"  {serve_command(doc['vllm_args'])}", highlight=False, soft_wrap=True)


def _gateway_plans(
    url: str,
    settings: Settings,
    *,
    candidates: list[Precision],
    current: TierConfig | None,
    q_min: float | None,
    reselect: bool,
) -> dict[str, dict[str, Any]]:
    from gateway.planner.planner import (
        fixed_precision_settings,
        plan_tier,
        with_engine_kv_capacity,
    )

    doc = fetch_gateway_regime(url, os.environ.get(ADMIN_TOKEN_ENV))
    measured_on = doc.get("hardware")
    # The engines' KV capacities hold on their GPU only: planning for another GPU keeps its
    # memory estimate (the regime itself carries over).
    same_gpu = not isinstance(measured_on, str) or measured_on == settings.hardware.name
    if not same_gpu:
        typer.echo(
            f"note: the gateway's engines run on {measured_on}, not {settings.hardware.name}: "
            "K comes from the memory estimate, not their KV capacity",
            err=True,
        )
    tiers: dict[str, dict[str, Any]] = {}
    per_batch_table = settings.serve.batch_dependent_speculation
    for name, tier in tier_regimes_from_gateway(doc, engine_r_usable=not per_batch_table).items():
        reg, precision = tier.regime, tier.precision
        if reg is None:
            typer.echo(f"note: tier {name}: {tier.source}; skipped", err=True)
            continue
        now = tier.current or current
        # K of the tier's precision from its engines, as the live planner takes it; not when
        # reselecting: the other candidates have only the memory estimate, which ignores
        # activations, and a measured K beside estimated ones would bias the choice.
        known = (
            settings
            if precision is None or not same_gpu or reselect
            else with_engine_kv_capacity(settings, precision, tier.kv_capacity_tokens)
        )
        if precision is not None and not reselect:
            # A tier's precision is fixed by the routing ladder: only its toggles are planned,
            # so the precision filters (quality floor, native compute) do not apply.
            result = plan_tier(reg, fixed_precision_settings(known), [precision], now)
        else:
            result = plan_tier(reg, known, candidates, now, q_min=q_min)
        tiers[name] = _plan_doc(name, reg, result, tier.source)
    return tiers


@app.callback()
def plan(
    ctx: typer.Context,
    *,
    regime: Annotated[str | None, typer.Option(help="C=..,rho=..,r=..[,L_in=..,L_out=..]")] = None,
    trace: Annotated[
        Path | None, typer.Option(help="plan from a trace file (see `tiergate regime`)")
    ] = None,
    from_gateway: Annotated[
        str | None, typer.Option(help=f"gateway URL; GET /admin/regime with ${ADMIN_TOKEN_ENV}")
    ] = None,
    hardware: Annotated[str | None, typer.Option(help="h200 | b200 (default b200)")] = None,
    model: Annotated[str | None, typer.Option(help="qwen3-30b-a3b | qwen3-coder-30b-a3b")] = None,
    params: Annotated[Path | None, typer.Option(help="YAML overrides (planner settings)")] = None,
    candidates: Annotated[
        str | None, typer.Option(help="comma-separated precisions (default bf16,fp8,w4a16,nvfp4)")
    ] = None,
    q_min: Annotated[float | None, typer.Option(help="quality floor Q_min")] = None,
    current: Annotated[
        str | None,
        typer.Option(
            help="what the tier runs now, e.g. fp16,s=1,k=0 (s, k default to vLLM's 0, 1)"
        ),
    ] = None,
    concurrency: Annotated[float | None, typer.Option(help="C for traces without timing")] = None,
    reselect_precision: Annotated[
        bool,
        typer.Option(help="with --from-gateway: also re-choose each tier's precision"),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    write: Annotated[Path | None, typer.Option(help="write a deploy overlay here")] = None,
) -> None:
    """Plan one tier from a regime or a trace, or every tier of a running gateway."""
    if ctx.invoked_subcommand is not None:
        return
    from gateway.planner.planner import DEFAULT_CANDIDATES, PlanningError, plan_tier

    sources = [x for x in (regime, trace, from_gateway) if x is not None]
    if len(sources) != 1:
        raise _fail("give exactly one of --regime, --trace, --from-gateway")
    try:
        settings = _settings(params, hardware, model)
        cands = (
            [_precision(c) for c in candidates.split(",") if c.strip()]
            if candidates
            else list(DEFAULT_CANDIDATES)
        )
        cur = _current(current)
        if from_gateway is not None:
            tiers = _gateway_plans(
                from_gateway,
                settings,
                candidates=cands,
                current=cur,
                q_min=q_min,
                reselect=reselect_precision,
            )
            if not tiers:
                # An empty plan written over an earlier overlay would drop what it planned.
                raise _fail(
                    f"{from_gateway}: no tier could be planned yet (see the notes above); "
                    "send traffic through the gateway first. Nothing was written."
                )
        else:
            if regime is not None:
                reg, source = parse_regime(regime), "given"
            else:
                assert trace is not None
                reg, source = _trace_regime(trace, settings, cands, concurrency)
            result = plan_tier(reg, settings, cands, cur, q_min=q_min)
            tiers = {"default": _plan_doc("default", reg, result, source)}
    except GatewayError as exc:
        raise _fail(str(exc)) from exc
    except (PlanningError, KeyError, ValueError, OSError, ArithmeticError) as exc:
        # ArithmeticError: a settings integer too large for the float maths (l_ctx: 10**400)
        raise _fail(str(exc)) from exc

    if write is not None:
        _write_and_report(write, tiers, settings)
    if json_out:
        out = {"hardware": settings.hardware.name, "model": settings.model.name, "tiers": tiers}
        typer.echo(one_line(out))
    else:
        _print_plans(settings, tiers)


@app.command("breakeven")
def breakeven(
    *,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    hardware: Annotated[str | None, typer.Option(help="h200 | b200 (default b200)")] = None,
    model: Annotated[str | None, typer.Option(help="model preset")] = None,
    params: Annotated[Path | None, typer.Option(help="YAML overrides")] = None,
    concurrency: Annotated[
        str, typer.Option(help="comma-separated C (= B_eff below the knees)")
    ] = "32,256",
    digits: Annotated[int, typer.Option(help="decimals", min=0, max=12)] = 4,
) -> None:
    """The breakeven table of COST_MODEL.md a.3: rho*, r*, precision ratio, knees."""
    from gateway.planner.breakeven import breakeven_table
    from gateway.planner.costmodel import CostModel

    try:
        settings = _settings(params, hardware, model)
        points = [int(c) for c in concurrency.split(",") if c.strip()]
        table = breakeven_table(CostModel.from_settings(settings), points, digits=digits)
    except (KeyError, ValueError, OSError, ArithmeticError) as exc:
        raise _fail(str(exc)) from exc
    if json_out:
        typer.echo(one_line(table))
        return
    from rich.console import Console
    from rich.table import Table

    grid = Table(title=f"breakevens, {settings.model.name} on {settings.hardware.name}")
    grid.add_column("precision")
    grid.add_column("knee K")
    for c in points:
        grid.add_column(f"r* C={c}")
    for c in points:
        grid.add_column(f"rho* C={c}")
    for p, row in table["r_star"].items():
        rho = table["rho_star"][p]
        grid.add_row(
            p,
            str(table["knees"][p]),
            *(str(row[str(c)]) for c in points),
            *(str(rho[str(c)]) for c in points),
        )
    console = Console()
    console.print(grid)
    console.print(f"precision ratio nvfp4/fp16: {table['precision_ratio']}")
