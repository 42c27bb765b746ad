"""The model card: a markdown page that says what a model directory holds and how good it is.

Built from plain data (`CardFacts`), so it is testable and written by the CLI only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CardFacts", "DataFacts", "render_card"]


@dataclass(frozen=True)
class DataFacts:
    """One data set the model learned from."""

    role: str  # what it was used for
    files: Mapping[str, int]  # file -> rows
    sources: Mapping[str, int]  # the rows' `source` strings (they name licences) -> rows
    tiers: Sequence[str]
    rows_used: int


@dataclass(frozen=True)
class CardFacts:
    title: str
    tiers: Sequence[str]
    costs: Sequence[float]
    cost_source: str
    label: str
    scorer: str
    scorer_params: Mapping[str, Any]
    data: Sequence[DataFacts]
    metrics: Mapping[str, Any] | None = None  # an evaluate document (held-out)
    metrics_note: str = ""
    notes: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)


def render_card(facts: CardFacts) -> str:
    lines = [f"# {facts.title}", ""]
    lines += [
        "A difficulty router for tiergate: it reads an OpenAI request and returns, for every tier "
        "of the ladder, the calibrated probability that the tier is adequate for it "
        f"(label: **{facts.label}**"
        + (
            ", i.e. the tier scores at least as well as the top tier"
            if facts.label == "relative"
            else ", i.e. the tier's own correctness"
        )
        + ").",
        "",
        "## Ladder (positions, cheapest first)",
        "",
        "| position | tier | relative cost |",
        "|---|---|---|",
    ]
    for i, (tier, cost) in enumerate(zip(facts.tiers, facts.costs, strict=True)):
        lines.append(f"| {i} | {tier} | {cost:g} |")
    lines += ["", f"Costs: {facts.cost_source}.", ""]
    lines += [
        "APGR and CPT are RouteLLM's, with the share of top-tier calls generalised to the "
        "normalised cost (cost - c_cheapest) / (c_top - c_cheapest); `apgr_static` is what a "
        "blind random split between tiers scores on the same axis (0.5 for two tiers), so a "
        "router is only as good as its margin over it.",
        "",
    ]
    lines += ["## Model", "", f"- scorer: `{facts.scorer}` {dict(facts.scorer_params)}"]
    calibrated = "non-top tier" if facts.label == "relative" else "tier, the top tier included"
    lines += [f"- calibration: one isotonic regression per {calibrated}, monotone along the ladder"]
    lines += ["", "## Data", ""]
    for d in facts.data:
        lines.append(f"### {d.role}")
        lines.append("")
        lines.append(f"Tiers: {', '.join(d.tiers)}; rows used: {d.rows_used}.")
        lines.append("")
        for name, rows in d.files.items():
            lines.append(f"- file `{name}`: {rows} rows")
        for source, rows in d.sources.items():
            lines.append(f"- source: {source} ({rows} rows)")
        lines.append("")
    if facts.metrics:
        lines += (
            ["## Metrics", "", facts.metrics_note, ""]
            if facts.metrics_note
            else [
                "## Metrics",
                "",
            ]
        )
        lines += _metrics_table(facts.metrics)
    for heading, body in facts.extra.items():
        lines += [f"## {heading}", "", body.strip(), ""]
    if facts.notes:
        lines += [facts.notes.strip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def _metrics_table(m: Mapping[str, Any]) -> list[str]:
    lines = ["| metric | value |", "|---|---|"]
    lines.append(f"| rows | {m.get('n')} |")
    for key in ("apgr", "apgr_static", "cpt50", "cpt80"):
        lines.append(f"| {key} | {_fmt(m.get(key))} |")
    for tier, row in (m.get("per_tier") or {}).items():
        for key in ("auc", "ece", "brier", "base_rate"):
            lines.append(f"| {tier} {key} | {_fmt(row.get(key))} |")
    base = m.get("uniform_baseline") or {}
    if base:
        lines.append(
            f"| uniform baseline at alpha={m.get('alpha')} | {base.get('tier')} "
            f"(quality {_fmt(base.get('quality'))}, cost {_fmt(base.get('cost'))}) |"
        )
    pre = m.get("pretest") or {}
    if pre:
        lines.append(f"| pre-test | {pre.get('message', '')} |")
    lines.append("")
    if m.get("note"):  # why some figures are n/a (rows without every tier's score)
        lines += [f"Note: {m['note']}.", ""]
    return lines


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "n/a" if value is None else str(value)
