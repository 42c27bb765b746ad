"""`tiergate router`: train, evaluate and tune the difficulty router (router_models).

```
tiergate router train    --data FILE [--data FILE ...] --tiers a,b,c --out DIR [--scorer S]
tiergate router evaluate (--model DIR | --cv K) --data FILE --tiers a,b[,c] [--json] [--plot PNG]
tiergate router tune     --model DIR --data FILE --alpha 0.95 [--budget B] [--json] [--plot PNG]
```
Label files are JSON lines, plain or `.gz` (shared/data/MANIFEST.md). Any malformed input is a
one-line `error:` on stderr naming the file and line, exit code 2. Progress bars go to stderr,
so `--json` output on stdout stays clean. scikit-learn, numpy and matplotlib are imported inside
the commands, so other `tiergate` commands do not pay for them.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from router_models.json_out import dumps as strict_dumps

if TYPE_CHECKING:
    from router_models.data import LabelSet
    from router_models.frontier import Frontier
    from router_models.model import RouterModel

__all__ = ["app"]

app = typer.Typer(
    no_args_is_help=True,
    help="Train, evaluate and tune the difficulty router.",
)

DataOpt = Annotated[
    list[Path],
    typer.Option("--data", help="Label file (.jsonl or .jsonl.gz); repeat for several."),
]
TiersOpt = Annotated[
    str | None,
    typer.Option("--tiers", help="Ladder, cheapest first: a,b,c (default: the file's order)."),
]
CostsOpt = Annotated[
    str | None,
    typer.Option(
        "--costs",
        help="Relative tier costs a=0.25,b=0.5,c=1 (default: from precision names).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _png_path(path: Path | None) -> Path | None:
    # matplotlib appends ".png" to a name without one: `--plot out` wrote out.png, and a
    # directory's name gave a PNG beside it, with exit 0 either way.
    if path is not None and (path.suffix.lower() != ".png" or path.is_dir()):
        raise typer.BadParameter("must name a .png file")
    return path


PlotOpt = Annotated[
    Path | None,
    typer.Option("--plot", help="Write a PNG of the cost-quality frontiers.", callback=_png_path),
]
AlphaOpt = Annotated[
    float,
    typer.Option(
        "--alpha",
        help="Accuracy floor as a fraction of the top tier's quality.",
    ),
]
AbsoluteOpt = Annotated[
    bool, typer.Option("--absolute-alpha", help="Read --alpha as an absolute quality floor.")
]
LabelOpt = Annotated[
    str, typer.Option("--label", help="relative (tier >= top tier) or absolute (correctness).")
]
ScorerOpt = Annotated[str, typer.Option("--scorer", help="linear (default) or gbdt.")]
ScoreDataOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--score-data",
        help="Extra label file(s) used only to train the scorer; --data then only calibrates.",
    ),
]
ScoreTiersOpt = Annotated[
    str | None, typer.Option("--score-tiers", help="Ladder of --score-data (default: its order).")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of every split.")]
CalibrationOpt = Annotated[
    str,
    typer.Option(
        "--calibration",
        help="holdout (a held-out share of the rows calibrate) or crossfit (out-of-fold "
        "scores of every row calibrate, then the scorer is refitted on all rows).",
    ),
]


@app.command()
def train(
    ctx: typer.Context,
    *,
    data: DataOpt,
    out: Annotated[Path, typer.Option("--out", help="Model directory to write.")],
    tiers: TiersOpt = None,
    scorer: ScorerOpt = "linear",
    label: LabelOpt = "relative",
    score_data: ScoreDataOpt = None,
    score_tiers: ScoreTiersOpt = None,
    calibration: CalibrationOpt = "holdout",
    calibration_fraction: Annotated[
        float,
        typer.Option(
            "--calibration-fraction", help="Rows held out for calibration (not with --score-data)."
        ),
    ] = 0.25,
    cv: Annotated[
        int, typer.Option("--cv", help="Also cross-validate K folds for the card (0: skip).")
    ] = 0,
    costs: CostsOpt = None,
    alpha: AlphaOpt = 0.95,
    seed: SeedOpt = 0,
    title: Annotated[str | None, typer.Option("--title", help="Model card title.")] = None,
    notes: Annotated[
        Path | None,
        typer.Option(
            "--notes", exists=True, dir_okay=False, help="Markdown file appended to the model card."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Train a router and write a model directory, its model card and a report."""
    with _errors():
        _refuse_ignored_split(ctx, bool(score_data), calibration)
        # Read before anything is written, so a bad --notes leaves no half-written model.
        notes_text = _read_notes(notes) if notes else ""
        from router_models.card import CardFacts, render_card
        from router_models.training import TrainConfig, cross_validate, fit_router

        config = TrainConfig(
            scorer=scorer,
            label=_label(label),
            calibration=_calibration(calibration),
            calibration_fraction=calibration_fraction,
            seed=seed,
        )
        _check_scorer(scorer)
        _check_fraction("--alpha", alpha)
        _check_out(out)
        labels = _load(data, tiers)
        ladder_costs, cost_source = _costs(labels.tiers, costs)
        scorer_labels = _load(score_data, score_tiers) if score_data else None
        with _progress() as step:
            feats = _featurize(step, labels, config)
            if scorer_labels is not None:
                step("training the scorer on --score-data", None)
            model = fit_router(
                labels, config, features=feats, scorer_labels=scorer_labels, progress=None
            )
            held_out = None
            result_proba = None
            if cv:
                task = step(f"cross-validating {cv} folds", cv)
                result = cross_validate(
                    labels,
                    config,
                    cv,
                    features=feats,
                    scorer_labels=scorer_labels,
                    on_fold=lambda _: task(1),
                )
                result_proba = result.proba
                held_out = _evaluate_doc(
                    result.proba,
                    labels=labels,
                    costs=ladder_costs,
                    cost_source=cost_source,
                    label=config.label,
                    alpha=alpha,
                )
        for tier, count in zip(labels.tiers, model.calibration.n_labelled_, strict=False):
            if count < 2:
                typer.echo(
                    f"note: tier {tier} has {count} label(s) in the calibration split; it "
                    "gets the next cheaper tier's probabilities (a lower bound), or 0 when it "
                    "is the cheapest",
                    err=True,
                )
        data_facts = [_data_facts("calibration" if scorer_labels else "training", labels)]
        if scorer_labels is not None:
            from router_models.training import unseen_rows

            used = len(unseen_rows(scorer_labels, labels))
            role = (
                f"scorer training ({len(scorer_labels) - used} requests that also occur in the "
                "calibration data removed)"
            )
            data_facts.insert(0, _data_facts(role, scorer_labels, used))
        report = {
            "config": config.as_dict(),
            "tiers": list(labels.tiers),
            "costs": dict(zip(labels.tiers, ladder_costs, strict=True)),
            "costs_source": str(cost_source),
            "data": [_facts_dict(d) for d in data_facts],
            "model": dict(model.metadata),
            "cross_validation": held_out,
        }
        model = model.with_metadata(
            costs=report["costs"],
            costs_source=str(cost_source),
            data=report["data"],
            cross_validation=_summary(held_out),
        )
        card = render_card(
            CardFacts(
                title=title or f"tiergate router: {scorer} over {', '.join(labels.tiers)}",
                tiers=labels.tiers,
                costs=ladder_costs,
                cost_source=str(cost_source),
                label=config.label,
                scorer=scorer,
                scorer_params=model.scorer.get_params(deep=False),
                data=data_facts,
                metrics=held_out,
                metrics_note=_cv_note(cv, scorer_labels is not None),
                notes=notes_text,
                extra=_validation_note(len(labels)) if cv else {},
            )
        )
        with _staged(out) as stage:
            model.save(stage)
            if result_proba is not None:
                from router_models.model_io import save_validation

                save_validation(stage, result_proba, labels.correct)
            (stage / "MODEL_CARD.md").write_text(card)
            (stage / "report.json").write_text(strict_dumps(report) + "\n")
        summary = {
            "out": str(out),
            "tiers": list(labels.tiers),
            "rows": len(labels),
            "cross_validation": _summary(held_out),
        }
        _emit(
            summary, json_out, f"wrote {out} ({len(labels)} rows, tiers {', '.join(labels.tiers)})"
        )


@app.command()
def evaluate(
    ctx: typer.Context,
    *,
    data: DataOpt,
    model: Annotated[Path | None, typer.Option("--model", help="Model directory.")] = None,
    cv: Annotated[int | None, typer.Option("--cv", help="Train and test by K-fold.")] = None,
    tiers: TiersOpt = None,
    scorer: ScorerOpt = "linear",
    label: LabelOpt = "relative",
    score_data: ScoreDataOpt = None,
    score_tiers: ScoreTiersOpt = None,
    calibration: CalibrationOpt = "holdout",
    costs: CostsOpt = None,
    alpha: AlphaOpt = 0.95,
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    plot: PlotOpt = None,
) -> None:
    """Held-out calibration and routing quality: AUC/ECE/Brier, APGR, CPT, frontiers, pre-test."""
    with _errors():
        if (model is None) == (cv is None):
            _fail("give exactly one of --model DIR or --cv K")
        if model is not None:
            _refuse_given(
                ctx,
                ("scorer", "label", "score_data", "score_tiers", "calibration", "seed"),
                "those options set how --cv trains; --model DIR is evaluated as it was trained",
            )
        else:
            _refuse_ignored_split(ctx, bool(score_data), calibration)
        labels = _load(data, tiers)
        ladder_costs, cost_source = _costs(labels.tiers, costs)
        if model is not None:
            router = _load_model(model, labels.tiers)
            with _progress() as step:
                feats = _featurize(step, labels, None, router)
            proba = router.calibration.predict_proba(router.scorer.score(feats))
            used_label = router.label
        else:
            from router_models.training import TrainConfig, cross_validate

            assert cv is not None
            _check_scorer(scorer)
            config = TrainConfig(
                scorer=scorer,
                label=_label(label),
                calibration=_calibration(calibration),
                seed=seed,
            )
            scorer_labels = _load(score_data, score_tiers) if score_data else None
            with _progress() as step:
                feats = _featurize(step, labels, config)
                task = step(f"cross-validating {cv} folds", cv)
                proba = cross_validate(
                    labels,
                    config,
                    cv,
                    features=feats,
                    scorer_labels=scorer_labels,
                    on_fold=lambda _: task(1),
                ).proba
            used_label = config.label
        doc = _evaluate_doc(
            proba,
            labels=labels,
            costs=ladder_costs,
            cost_source=cost_source,
            label=used_label,
            alpha=alpha,
        )
        if plot is not None:
            if "note" in doc:  # no frontier to draw
                typer.echo(f"note: --plot {plot} not written: {doc['note']}", err=True)
            else:
                _plot_from_doc(doc, plot)
        _emit(doc, json_out, _evaluate_text(doc))


@app.command()
def tune(
    *,
    model: Annotated[Path, typer.Option("--model", help="Model directory.")],
    data: DataOpt,
    alpha: Annotated[
        float | None, typer.Option("--alpha", help="Floor as a fraction of the top tier's quality.")
    ] = None,
    budget: Annotated[
        float | None, typer.Option("--budget", help="Mean relative cost per request at most B.")
    ] = None,
    absolute_alpha: AbsoluteOpt = False,
    tiers: TiersOpt = None,
    costs: CostsOpt = None,
    min_saving: Annotated[
        float,
        typer.Option(
            "--min-saving",
            help="Least gain to route: a share of the baseline's cost, or with --budget alone "
            "a share of the cheapest-to-top quality gap.",
        ),
    ] = 0.02,
    json_out: JsonOpt = False,
    plot: PlotOpt = None,
) -> None:
    """Thresholds for an accuracy floor (and/or budget) on validation labels, with frontiers."""
    with _errors():
        from router_models.frontier import routed_frontier, static_frontier, thin, uniform_points
        from router_models.thresholds import tune as tune_thresholds

        if alpha is None and budget is None:
            _fail("give --alpha, --budget or both")
        if absolute_alpha and alpha is None:  # it would be dropped without a word
            _fail("--absolute-alpha would be ignored here: it says how to read --alpha; give both")
        if budget is not None and not 0.0 < budget < math.inf:
            _fail(f"--budget is a mean relative cost per request, > 0; got {budget}")
        if not 0.0 <= min_saving < 1.0:  # a negative one would accept a costlier policy
            _fail(f"--min-saving is a share in [0, 1), got {min_saving}")
        if alpha is not None:
            _check_fraction("--alpha", alpha)
        labels = _load(data, tiers)
        ladder_costs, cost_source = _costs(labels.tiers, costs)
        router = _load_model(model, labels.tiers)
        complete = ~_any_nan(labels.correct)
        if not complete.any():
            _fail(
                f"none of the {len(labels)} rows has a score for every tier "
                f"({', '.join(labels.tiers)}): tune compares them all on each row"
            )
        with _progress() as step:
            feats = _featurize(step, labels, None, router)
        proba = router.routing_proba(router.scorer.score(feats))
        p, c = proba[complete], labels.correct[complete]
        result = tune_thresholds(
            p,
            c,
            ladder_costs,
            alpha=alpha,
            budget=budget,
            relative=not absolute_alpha,
            min_saving=min_saving,
        )
        front = routed_frontier(p, c, ladder_costs)
        static = static_frontier(c, ladder_costs)
        doc = {
            "n": int(complete.sum()),
            "tiers": list(labels.tiers),
            "model_tiers": list(router.tiers),
            "costs": dict(zip(labels.tiers, ladder_costs, strict=True)),
            "costs_source": str(cost_source),
            "alpha": alpha,
            "absolute_alpha": absolute_alpha,
            **result.as_dict(labels.tiers),
            "frontier": thin(front).points(),
            "static_frontier": static.points(),
            "uniform": [
                {"tier": labels.tiers[u.tier], "quality": u.quality, "cost": u.cost}
                for u in uniform_points(c, ladder_costs)
            ],
        }
        if plot is not None:
            _plot(plot, front, static, doc, labels.tiers)
        _emit(doc, json_out, _tune_text(doc))


# -- helpers ---------------------------------------------------------------------------------


@contextmanager
def _errors() -> Iterator[None]:
    """Known failures become one `error:` line and exit code 2, never a traceback."""
    from router_models.errors import RouterError

    try:
        yield
    except (RouterError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


# What `train` writes into a model directory; anything else there is not ours to replace.
_MODEL_DIR_FILES = ("model.json", "arrays.npz", "validation.npz", "MODEL_CARD.md", "report.json")


def _check_out(out: Path) -> None:
    """Refuses an --out that is a file, or a directory holding other files that is not a
    model directory already (one that is, such as the shipped model with its licences,
    is retrained in place: only the model's own files are replaced)."""
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file; give a directory")
    if out.is_dir() and not (out / "model.json").exists():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in _MODEL_DIR_FILES)
        if foreign:
            _fail(
                f"--out {out} holds files that are not a router model's "
                f"({', '.join(foreign[:5])}); give a new or empty directory, or an earlier "
                "model's"
            )


@contextmanager
def _staged(out: Path) -> Iterator[Path]:
    """A scratch directory beside `out` that the model is written into, moved into place
    file by file only once all of it is written: a failure leaves `out` as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with _errors_naming(out):
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            yield stage
            out.mkdir(exist_ok=True)
            written = {p.name for p in stage.iterdir()}
            for name in _MODEL_DIR_FILES:  # an earlier model's file this one has not
                if name not in written:
                    (out / name).unlink(missing_ok=True)
            # model.json last: it holds the arrays' checksum, so a reader in between sees the
            # old model or a checksum mismatch it refuses, never a new model on old arrays.
            for name in sorted(written, key=lambda n: n == "model.json"):
                os.replace(stage / name, out / name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def _errors_naming(out: Path) -> Iterator[None]:
    """OS errors about the scratch directory beside `out` name the path in `out` instead:
    the user gave `out` and never sees the scratch directory, which is gone by then."""
    try:
        yield
    except OSError as exc:
        given, given2 = _as_given(exc.filename, out), _as_given(exc.filename2, out)
        if (given, given2) == (exc.filename, exc.filename2):
            raise
        if given2 == given:  # a move from the scratch directory to the same path in `out`
            given2 = None
        raise type(exc)(exc.errno, exc.strerror, given, None, given2) from None


def _as_given(path: Any, out: Path) -> Any:
    """`path`, read as the same path in `out` when it lies in a scratch directory of `out`'s
    (`.{out.name}.` and a random suffix, beside it)."""
    if not isinstance(path, str | os.PathLike):
        return path
    try:  # both absolute: from Python 3.12 mkdtemp returns an absolute path for a relative dir
        parts = Path(path).absolute().relative_to(out.parent.absolute()).parts
    except ValueError:
        return path
    if not parts or not parts[0].startswith(f".{out.name}."):
        return path
    return str(out.joinpath(*parts[1:]))


def _read_notes(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:  # its own message names no file
        _fail(f"--notes {path}: not UTF-8 text ({exc.reason})")


def _check_fraction(option: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        _fail(f"{option} must be a number in [0, 1], got {value}")


def _refuse_ignored_split(ctx: typer.Context, score_data: bool, calibration: str) -> None:
    """--calibration and --calibration-fraction choose how --data is shared between scorer
    and calibrators; --score-tiers describes --score-data. Refuses those that do nothing."""
    if score_data:
        _refuse_given(
            ctx,
            ("calibration", "calibration_fraction"),
            "with --score-data the scorer trains on that set and every --data row "
            "calibrates it; there is no split of --data to choose",
        )
        return
    _refuse_given(ctx, ("score_tiers",), "it names the ladder of --score-data; give both")
    if calibration == "crossfit":
        _refuse_given(
            ctx,
            ("calibration_fraction",),
            "--calibration crossfit calibrates on out-of-fold scores of every row",
        )


def _refuse_given(ctx: typer.Context, names: Sequence[str], why: str) -> None:
    """Fails when the user typed any of the options `names` (parameter names) that this
    combination would ignore; defaults left alone are not the user's doing."""
    typed = [
        param.opts[0]
        for param in ctx.command.params
        if param.name in names and _typed(ctx, param.name)
    ]
    if typed:
        _fail(f"{', '.join(typed)} would be ignored here: {why}")


def _typed(ctx: typer.Context, name: str) -> bool:
    # By name: Typer bundles its own click, whose ParameterSource is not click's.
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _label(text: str) -> Any:
    from router_models.labels import LABELS

    if text not in LABELS:
        _fail(f"--label must be one of {', '.join(LABELS)}, got {text!r}")
    return text


def _calibration(text: str) -> Any:
    if text not in ("holdout", "crossfit"):
        _fail(f"--calibration must be holdout or crossfit, got {text!r}")
    return text


def _check_scorer(name: str) -> None:
    from router_models.scorers import SCORERS

    if name not in SCORERS:
        _fail(f"--scorer must be one of {', '.join(SCORERS)}, got {name!r}")


def _load(paths: Sequence[Path] | None, tiers: str | None) -> LabelSet:
    from router_models.data import load_labels, parse_tiers

    if not paths:
        _fail("give at least one --data FILE")
    ladder = parse_tiers(tiers) if tiers else None
    labels = load_labels(paths, ladder)
    if labels.skipped_without_text:
        typer.echo(
            f"note: skipped {labels.skipped_without_text} row(s) that carry features but no "
            "request text (shadow.keep_text or the tenant's shadow_keep_text keeps it)",
            err=True,
        )
    return labels


def _costs(tiers: Sequence[str], text: str | None) -> tuple[tuple[float, ...], str]:
    from router_models.costs import CostSource, resolve_costs

    costs, source = resolve_costs(tiers, text)
    if source is CostSource.LADDER_DEFAULT:
        typer.echo(
            f"note: tier names {', '.join(tiers)} are not precisions; using the ladder default "
            f"costs {', '.join(f'{c:g}' for c in costs)} (pass --costs to set them)",
            err=True,
        )
    return costs, str(source)


def _load_model(path: Path, tiers: Sequence[str]) -> RouterModel:
    from router_models.errors import TierError
    from router_models.model import RouterModel

    router = RouterModel.load(path)
    if len(router.tiers) != len(tiers):
        raise TierError(
            f"model {path} has {len(router.tiers)} tiers ({', '.join(router.tiers)}), "
            f"the data ladder has {len(tiers)} ({', '.join(tiers)})"
        )
    if tuple(router.tiers) != tuple(tiers):
        typer.echo(
            f"note: model tiers {', '.join(router.tiers)} are matched to data tiers "
            f"{', '.join(tiers)} by position",
            err=True,
        )
    return router


@contextmanager
def _progress() -> Iterator[Callable[[str, int | None], Callable[[int], None]]]:
    """`step(description, total)` adds a task and returns its `advance(k)` callback."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as progress:

        def step(description: str, total: int | None) -> Callable[[int], None]:
            task = progress.add_task(description, total=total)
            return lambda k: progress.advance(task, k)

        yield step


def _featurize(
    step: Callable[[str, int | None], Callable[[int], None]],
    labels: LabelSet,
    config: Any,
    router: RouterModel | None = None,
) -> Any:
    from router_models.vectorize import featurize

    advance = step("features", len(labels))
    spec = router.spec if router is not None else config.spec
    return featurize(labels.requests, spec, advance)


def _any_nan(array: Any) -> Any:
    import numpy as np

    return np.isnan(array).any(axis=1)


def _evaluate_doc(
    proba: Any,
    *,
    labels: LabelSet,
    costs: Sequence[float],
    cost_source: str,
    label: Any,
    alpha: float,
) -> dict[str, Any]:
    from router_models.evaluation import evaluate as evaluate_proba

    doc = evaluate_proba(
        proba,
        labels.correct,
        labels.tiers,
        costs,
        label=label,
        alpha=alpha,
        cost_source=cost_source,
    )
    doc["data"] = {
        "files": _rows_by_file_name(labels),
        "sources": dict(labels.sources),
    }
    return doc


def _validation_note(rows: int) -> dict[str, str]:
    return {
        "Validation set": (
            f"`validation.npz` holds the out-of-fold probabilities (n, K) and per-tier scores "
            f"of the {rows} rows above, from the cross-validation: what a gateway tunes tenant "
            "thresholds on from an accuracy floor (`router_models.model_io.load_validation`)."
        )
    }


def _cv_note(folds: int, separate_scorer: bool) -> str:
    if not folds:
        return ""
    if separate_scorer:
        return (
            f"{folds}-fold cross-validation over the calibration rows: the scorer, trained on "
            "the separate set, is fixed; each fold's calibrators never saw its rows."
        )
    return f"{folds}-fold cross-validation of the whole recipe on the training data."


def _summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if doc is None:
        return None
    keys = (
        "n",
        "apgr",
        "apgr_static",
        "cpt50",
        "cpt80",
        "per_tier",
        "uniform_baseline",
        "pretest",
    )
    return {k: doc.get(k) for k in keys}


def _rows_by_file_name(labels: LabelSet) -> dict[str, int]:
    """Rows per file, by name only (no local paths); files of one name in different
    directories add up, where the last one's count stood for all of them."""
    rows: dict[str, int] = {}
    for name, count in labels.files.items():
        rows[Path(name).name] = rows.get(Path(name).name, 0) + count
    return rows


def _data_facts(role: str, labels: LabelSet, used: int | None = None) -> Any:
    """What the card says about a data set; files by name only (no local paths)."""
    from router_models.card import DataFacts

    files = _rows_by_file_name(labels)
    rows = len(labels) if used is None else used
    return DataFacts(role, files, dict(labels.sources), labels.tiers, rows)


def _facts_dict(facts: Any) -> dict[str, Any]:
    return {
        "role": facts.role,
        "files": dict(facts.files),
        "sources": dict(facts.sources),
        "tiers": list(facts.tiers),
        "rows": facts.rows_used,
    }


def _emit(doc: dict[str, Any], json_out: bool, text: str) -> None:
    if json_out:
        sys.stdout.write(strict_dumps(doc) + "\n")
    else:
        typer.echo(text)


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _evaluate_text(doc: dict[str, Any]) -> str:
    lines = [f"rows {doc['n']}, tiers {', '.join(doc['tiers'])} (costs {doc['costs_source']})"]
    for tier, m in doc["per_tier"].items():
        lines.append(
            f"  {tier}: auc {_fmt(m['auc'])}  ece {_fmt(m['ece'])}  brier {_fmt(m['brier'])}"
        )
    if "note" in doc:
        lines.append(doc["note"])
        return "\n".join(lines)
    lines.append(
        f"APGR {_fmt(doc['apgr'])}  CPT(50%) {_fmt(doc['cpt50'])}  CPT(80%) {_fmt(doc['cpt80'])}"
    )
    base = doc["uniform_baseline"]
    lines.append(
        f"uniform baseline at alpha={doc['alpha']}: {base['tier']} "
        f"(quality {_fmt(base['quality'])}, cost {_fmt(base['cost'])})"
    )
    lines.append(f"pre-test: {doc['pretest']['message']}")
    return "\n".join(lines)


def _tune_text(doc: dict[str, Any]) -> str:
    thresholds = ", ".join(f"{t}={v:.4f}" for t, v in doc["thresholds"].items())
    return "\n".join(
        [
            f"thresholds: {thresholds}",
            f"expected cost {_fmt(doc['expected_cost'])}, quality {_fmt(doc['expected_quality'])}",
            doc["message"],
        ]
    )


def _plot_from_doc(doc: dict[str, Any], path: Path) -> None:
    import numpy as np

    from router_models.frontier import Frontier

    def frontier(points: list[dict[str, float]]) -> Frontier:
        cost = np.array([p["cost"] for p in points])
        quality = np.array([p["quality"] for p in points])
        return Frontier(cost, quality, np.full(cost.shape, np.nan))

    _plot(path, frontier(doc["frontier"]), frontier(doc["static_frontier"]), doc, doc["tiers"])


def _plot(
    path: Path, routed: Frontier, static: Frontier, doc: dict[str, Any], tiers: Sequence[str]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(routed.cost, routed.quality, label="routed (one multiplier)", lw=1.6)
    ax.plot(static.cost, static.quality, "--", label="static random split", lw=1.2)
    uniform = doc.get("uniform") or []
    if uniform:
        ax.scatter(
            [u["cost"] for u in uniform],
            [u["quality"] for u in uniform],
            color="k",
            zorder=3,
            label="uniform tiers",
        )
        for u in uniform:
            ax.annotate(
                u["tier"],
                (u["cost"], u["quality"]),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=8,
            )
    floor = doc.get("quality_floor")
    if floor is not None:
        ax.axhline(floor, color="grey", lw=0.8, ls=":", label="quality floor")
    if "expected_cost" in doc:
        ax.scatter(
            [doc["expected_cost"]],
            [doc["expected_quality"]],
            marker="*",
            s=140,
            color="tab:red",
            zorder=4,
            label="tuned thresholds",
        )
    ax.set_xlabel("mean relative cost per request")
    ax.set_ylabel("quality (mean score)")
    ax.set_title(f"cost-quality frontiers: {', '.join(tiers)}")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
