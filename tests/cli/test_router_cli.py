"""`tiergate router train|evaluate|tune`: outputs, clean --json, one-line errors with exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gateway.cli.main import app
from router_models.errors import ModelFormatError
from router_models.model import RouterModel
from router_models.model_io import load_validation
from tests.router_models.synthetic import two_type_labels, write_jsonl

runner = CliRunner()
TIERS = "nvfp4,w4a16,bf16"


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    labels, _ = two_type_labels(600, 0.6, 0.03, 0.5, tiers=("nvfp4", "w4a16", "bf16"), seed=7)
    return write_jsonl(tmp_path_factory.mktemp("data") / "labels.jsonl", labels)


@pytest.fixture(scope="module")
def model_dir(data_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model") / "m"
    result = runner.invoke(
        app,
        [
            "router",
            "train",
            "--data",
            str(data_file),
            "--tiers",
            TIERS,
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.stderr
    json.loads(result.stdout)
    return out


def test_train_writes_model_card_and_report(model_dir: Path) -> None:
    assert {"model.json", "arrays.npz", "MODEL_CARD.md", "report.json"} <= {
        p.name for p in model_dir.iterdir()
    }
    card = (model_dir / "MODEL_CARD.md").read_text()
    assert "synthetic (tests)" in card and "| 0 | nvfp4 | 0.25 |" in card
    assert RouterModel.load(model_dir).tiers == ("nvfp4", "w4a16", "bf16")


def test_evaluate_with_model_json(model_dir: Path, data_file: Path, tmp_path: Path) -> None:
    plot = tmp_path / "f.png"
    result = runner.invoke(
        app,
        [
            "router",
            "evaluate",
            "--model",
            str(model_dir),
            "--data",
            str(data_file),
            "--tiers",
            TIERS,
            "--json",
            "--plot",
            str(plot),
        ],
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["n"] == 600 and doc["tiers"] == ["nvfp4", "w4a16", "bf16"]
    assert set(doc["per_tier"]) == {"nvfp4", "w4a16"}
    assert doc["apgr"] is not None and plot.stat().st_size > 1000


def test_evaluate_cv(data_file: Path) -> None:
    result = runner.invoke(
        app,
        ["router", "evaluate", "--cv", "3", "--data", str(data_file), "--tiers", TIERS, "--json"],
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["per_tier"]["nvfp4"]["auc"] > 0.7  # the words give the type away


def strict_json(text: str) -> Any:
    """Parses like jq or JavaScript would: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_undefined_figures_are_null_in_json(tmp_path: Path) -> None:
    """Every tier right on every row: the top tier is no better than the cheapest, so the
    measured saving is undefined; --json, model.json and report.json stay strict JSON."""
    labels, _ = two_type_labels(60, 0.5, 0.0, 0.0, tiers=("nvfp4", "bf16"), seed=3)
    labels.correct[:] = 1.0
    data = write_jsonl(tmp_path / "same.jsonl", labels)
    out = tmp_path / "m"
    argv = ["router", "train", "--data", str(data), "--tiers", "nvfp4,bf16", "--out", str(out),
            "--cv", "3", "--json"]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.stderr
    strict_json(result.stdout)
    strict_json((out / "model.json").read_text())
    strict_json((out / "report.json").read_text())
    result = runner.invoke(
        app, ["router", "evaluate", "--model", str(out), "--data", str(data), "--json"]
    )
    assert result.exit_code == 0, result.stderr
    assert strict_json(result.stdout)["pretest"]["measured_saving"] is None


@pytest.mark.parametrize("name", ["frontiers", "a-folder", "plot.svg"])
def test_a_plot_path_that_is_no_png_file_is_a_usage_error(
    model_dir: Path, data_file: Path, tmp_path: Path, name: str
) -> None:
    """matplotlib appended .png to a name without it (or beside a folder's name), exit 0."""
    (tmp_path / "a-folder.png").mkdir()
    target = tmp_path / ("a-folder.png" if name == "a-folder" else name)
    args = ["router", "tune", "--model", str(model_dir), "--data", str(data_file)]
    result = runner.invoke(app, [*args, "--alpha", "0.97", "--plot", str(target)])
    assert result.exit_code == 2 and "must name a .png file" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-folder.png"]


def test_tune_json_and_plot(model_dir: Path, data_file: Path, tmp_path: Path) -> None:
    plot = tmp_path / "t.png"
    result = runner.invoke(
        app,
        [
            "router",
            "tune",
            "--model",
            str(model_dir),
            "--data",
            str(data_file),
            "--alpha",
            "0.97",
            "--json",
            "--plot",
            str(plot),
        ],
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc["thresholds"]) == {"nvfp4", "w4a16"}
    assert doc["expected_quality"] >= doc["quality_floor"] - 1e-12
    assert plot.stat().st_size > 1000


def bad_file(tmp_path: Path, body: str, name: str = "bad.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


GOOD = '{"messages": [{"role": "user", "content": "x"}], "correct": {"a": 1, "b": 1}}'


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (GOOD + "\n{oops\n", "bad.jsonl:2: invalid JSON"),
        (GOOD + '\n{"prompt": "y", "correct": {"a": 1}}\n', "bad.jsonl:2: tier(s) b missing"),
        ('{"prompt": "y", "correct": {"a": 2, "b": 1}}\n', "bad.jsonl:1: score for tier 'a'"),
        ("", "bad.jsonl: no label rows (empty file)"),
    ],
)
@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_malformed_input_is_one_line_exit_2(
    tmp_path: Path, body: str, fragment: str, command: str
) -> None:
    path = bad_file(tmp_path, body)
    args = ["router", command, "--data", str(path), "--tiers", "a,b"]
    args += ["--out", str(tmp_path / "m")] if command == "train" else ["--cv", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_missing_file_wrong_tiers_and_bad_model(
    tmp_path: Path, model_dir: Path, data_file: Path
) -> None:
    missing = runner.invoke(
        app,
        [
            "router",
            "evaluate",
            "--cv",
            "2",
            "--data",
            str(tmp_path / "nope.jsonl"),
            "--tiers",
            "a,b",
        ],
    )
    assert missing.exit_code == 2 and "no such file" in missing.stderr
    wrong = runner.invoke(
        app, ["router", "evaluate", "--cv", "2", "--data", str(data_file), "--tiers", "nvfp4,fp8"]
    )
    assert wrong.exit_code == 2 and "tier(s) fp8 missing" in wrong.stderr
    not_model = runner.invoke(
        app,
        ["router", "tune", "--model", str(tmp_path), "--data", str(data_file), "--alpha", "0.9"],
    )
    assert not_model.exit_code == 2 and "not a router model directory" in not_model.stderr
    both = runner.invoke(
        app,
        ["router", "evaluate", "--model", str(model_dir), "--cv", "2", "--data", str(data_file)],
    )
    assert both.exit_code == 2 and "exactly one of" in both.stderr
    k_mismatch = runner.invoke(
        app,
        [
            "router",
            "evaluate",
            "--model",
            str(model_dir),
            "--data",
            str(data_file),
            "--tiers",
            "nvfp4,bf16",
        ],
    )
    assert k_mismatch.exit_code == 2 and "has 3 tiers" in k_mismatch.stderr


def test_options_the_combination_would_ignore_are_refused(
    tmp_path: Path, model_dir: Path, data_file: Path
) -> None:
    """`train --score-data` ignored --calibration-fraction (every --data row calibrates) and
    `evaluate --model` ignored --label and --scorer (the model has its own): each is now a
    one-line error, exit 2, before any work; defaults the user did not type are not."""
    other, _ = two_type_labels(300, 0.5, 0.05, 0.6, tiers=("weak", "strong"), seed=11)
    score_file = write_jsonl(tmp_path / "score.jsonl", other)
    out = tmp_path / "m"
    train = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out)]
    evaluate = ["router", "evaluate", "--model", str(model_dir), "--data", str(data_file)]
    cases = [
        ([*train, "--score-data", str(score_file), "--calibration-fraction", "0.5"],
         "--calibration-fraction would be ignored"),
        ([*train, "--score-tiers", TIERS], "--score-tiers would be ignored"),
        ([*evaluate, "--label", "absolute", "--scorer", "gbdt"],
         "--scorer, --label would be ignored"),
        ([*evaluate, "--label", "relative"], "--label would be ignored"),
        ([*evaluate, "--seed", "3"], "--seed would be ignored"),
    ]  # fmt: skip
    for argv, says in cases:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.stderr)
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
    assert runner.invoke(app, [*evaluate, "--json"]).exit_code == 0


def test_train_with_crossfit_calibration(tmp_path: Path, data_file: Path) -> None:
    """docs/router.md's best recipe (crossfit) was reachable only from the Python API."""
    out = tmp_path / "m"
    train = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out)]
    result = runner.invoke(app, [*train, "--calibration", "crossfit", "--cv", "2", "--json"])
    assert result.exit_code == 0, result.stderr
    model = RouterModel.load(out)
    assert model.metadata["config"]["calibration"] == "crossfit"
    assert model.metadata["calibration_rows"] == 600  # every row, not a held-out quarter
    assert json.loads((out / "report.json").read_text())["config"]["calibration"] == "crossfit"
    refused = [
        ([*train, "--calibration", "bogus"], "--calibration must be holdout or crossfit"),
        ([*train, "--calibration", "crossfit", "--calibration-fraction", "0.3"],
         "--calibration-fraction would be ignored"),
        ([*train, "--score-data", str(data_file), "--calibration", "crossfit"],
         "--calibration would be ignored"),
    ]  # fmt: skip
    for argv, says in refused:
        failed = runner.invoke(app, argv)
        assert failed.exit_code == 2 and says in failed.stderr, failed.stderr
    evaluate = ["router", "evaluate", "--cv", "2", "--data", str(data_file), "--tiers", TIERS]
    result = runner.invoke(app, [*evaluate, "--calibration", "crossfit", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["n"] == 600


def test_train_with_a_separate_scorer_set(tmp_path: Path, data_file: Path) -> None:
    other, _ = two_type_labels(500, 0.5, 0.05, 0.6, tiers=("weak", "strong"), seed=11)
    score_file = write_jsonl(tmp_path / "score.jsonl", other)
    out = tmp_path / "m"
    result = runner.invoke(
        app,
        [
            "router",
            "train",
            "--data",
            str(data_file),
            "--tiers",
            TIERS,
            "--out",
            str(out),
            "--score-data",
            str(score_file),
            "--cv",
            "3",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["cross_validation"]["per_tier"]["nvfp4"]["auc"] > 0.6
    card = (out / "MODEL_CARD.md").read_text()
    assert "scorer training" in card and "rows used: 500" in card
    validation = load_validation(out)
    assert validation is not None
    proba, correct = validation
    assert proba.shape == correct.shape == (600, 3)
    assert load_validation(tmp_path) is None


def test_validation_set_stays_with_the_model_that_made_it(tmp_path: Path, data_file: Path) -> None:
    """Retraining into a directory drops the old validation.npz (tenant alphas are tuned on
    it), and one copied beside another model is refused with a clear error."""
    out = tmp_path / "m"
    train = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out)]
    assert runner.invoke(app, [*train, "--cv", "3"]).exit_code == 0
    with_cv = (out / "validation.npz").read_bytes()
    assert load_validation(out) is not None
    result = runner.invoke(app, [*train, "--scorer", "gbdt"])
    assert result.exit_code == 0, result.stderr
    assert load_validation(out) is None
    (out / "validation.npz").write_bytes(with_cv)
    with pytest.raises(ModelFormatError, match="belongs to another model"):
        load_validation(out)
    # A file from before the stamps is taken when its ladder fits the model's.
    import numpy as np

    proba = np.tile([0.5, 0.7, 1.0], (4, 1))
    np.savez_compressed(out / "validation.npz", proba=proba, correct=np.ones((4, 3)))
    unstamped = load_validation(out)
    assert unstamped is not None and unstamped[0].shape == (4, 3)
    np.savez_compressed(out / "validation.npz", proba=proba[:, :2], correct=np.ones((4, 2)))
    with pytest.raises(ModelFormatError, match="2 tiers, the model has 3"):
        load_validation(out)


def test_tune_with_budget_and_explicit_costs(model_dir: Path, data_file: Path) -> None:
    result = runner.invoke(
        app,
        [
            "router",
            "tune",
            "--model",
            str(model_dir),
            "--data",
            str(data_file),
            "--budget",
            "0.5",
            "--costs",
            "nvfp4=0.25,w4a16=0.3,bf16=1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["expected_cost"] <= 0.5 + 1e-12
    assert doc["costs"] == {"nvfp4": 0.25, "w4a16": 0.3, "bf16": 1.0}


def test_unknown_tier_names_get_the_ladder_default_with_a_note(tmp_path: Path) -> None:
    labels, _ = two_type_labels(300, 0.6, 0.05, 0.5, tiers=("small", "large"), seed=3)
    path = write_jsonl(tmp_path / "x.jsonl", labels)
    result = runner.invoke(app, ["router", "evaluate", "--cv", "2", "--data", str(path), "--json"])
    assert result.exit_code == 0, result.stderr
    assert "not precisions" in result.stderr
    assert json.loads(result.stdout)["costs"] == {"small": 0.5, "large": 1.0}


def test_train_on_shadow_log_lines(data_file: Path, tmp_path: Path) -> None:
    """Shadow labels score one cheaper tier per request (null elsewhere); privacy-mode lines
    carry features only. Training uses what is there and says what it could not."""
    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    shadow = tmp_path / "shadow.jsonl"
    with shadow.open("w") as handle:
        for i, row in enumerate(rows):
            correct = {"nvfp4": row["correct"]["nvfp4"], "w4a16": None, "bf16": 1.0}
            request = {k: row[k] for k in ("messages", "prompt") if k in row}
            line: dict[str, object] = {"id": str(i), "correct": correct, "source": "shadow:t"}
            line.update({"request": request} if i % 10 else {"features": {"n": 1}})
            handle.write(json.dumps(line) + "\n")
    out = tmp_path / "m"
    result = runner.invoke(
        app, ["router", "train", "--data", str(shadow), "--out", str(out), "--cv", "3"]
    )
    assert result.exit_code == 0, result.stderr
    assert "skipped 60 row(s)" in result.stderr
    assert "tier w4a16 has 0 label(s) in the calibration split" in result.stderr
    model = RouterModel.load(out)
    assert model.calibration.n_labelled_[0] > 100 and model.calibration.n_labelled_[1] == 0
    bodies = [
        r["request"] for r in map(json.loads, shadow.read_text().splitlines()) if "request" in r
    ]
    proba = model.predict_proba(bodies[:50])
    assert (proba[:, 1] == proba[:, 0]).all()  # the unlabelled tier inherits the cheaper map
    plot = tmp_path / "frontiers.png"
    result = runner.invoke(
        app,
        ["router", "evaluate", "--model", str(out), "--data", str(shadow), "--json",
         "--plot", str(plot)],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["n_complete"] == 0 and "need complete rows" in doc["note"]
    assert f"--plot {plot} not written" in result.stderr and not plot.exists()
    assert doc["per_tier"]["nvfp4"]["auc"] > 0.6


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--alpha", "0.9", "--budget", "-1"], "--budget"),  # was exit 0, "no routed policy fits"
        (["--alpha", "0.9", "--costs", "nvfp4=0.25,w4a16=0.5,bf16=inf"], "positive number"),
        (["--alpha", "0.9", "--costs", "nvfp4=0.25,w4a16=0.5,nvfp4=0.3,bf16=1"], "twice"),
        # A negative least saving would accept a policy costlier than the uniform tier.
        (["--alpha", "0.9", "--min-saving=-1"], "--min-saving"),
        (["--alpha", "0.9", "--min-saving", "nan"], "--min-saving"),
        (["--alpha", "nan"], "--alpha"),
        (["--alpha", "1.5"], "--alpha"),
        # Without --alpha it has nothing to read: a floor the user meant was silently dropped.
        (["--budget", "0.5", "--absolute-alpha"], "--absolute-alpha would be ignored"),
    ],
)
def test_tune_refuses_bad_budgets_and_costs(
    model_dir: Path, data_file: Path, extra: list[str], says: str
) -> None:
    argv = ["router", "tune", "--model", str(model_dir), "--data", str(data_file), *extra]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and says in result.stderr, result.stderr


def test_tune_says_why_when_no_row_has_every_tier(model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "gaps.jsonl"
    rows = [
        {
            "id": str(i),
            "messages": [{"role": "user", "content": f"question {i}"}],
            "correct": {"nvfp4": i % 2, "w4a16": None, "bf16": 1},  # the middle never labelled
        }
        for i in range(50)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["router", "tune", "--model", str(model_dir), "--data", str(data), "--alpha", "0.9"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and "none of the 50 rows" in result.stderr, result.stderr


def test_a_missing_notes_file_writes_no_model(data_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    argv = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out),
            "--notes", str(tmp_path / "none.md")]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert not out.exists()  # model.json and arrays.npz were written before the error


def test_notes_that_are_not_utf8_are_named_and_write_no_model(
    data_file: Path, tmp_path: Path
) -> None:
    """The error was the codec's own ('utf-8' codec can't decode byte ...), naming no file."""
    notes = tmp_path / "notes.md"
    notes.write_bytes(b"# notes \xff\n")
    out = tmp_path / "m"
    argv = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out),
            "--notes", str(notes)]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and "notes.md: not UTF-8 text" in result.stderr, result.output
    assert not out.exists()


def test_train_refuses_a_bad_alpha_before_any_work(data_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    argv = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out),
            "--alpha", "5"]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and "--alpha" in result.stderr, result.stderr
    assert not out.exists()


def test_train_writes_nothing_into_out_when_it_fails_late(
    data_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The card is written last; a failure there leaves no model without its card."""
    out = tmp_path / "m"
    train = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out)]

    def broken_card(*args: object, **kwargs: object) -> str:
        raise OSError("disk full")

    monkeypatch.setattr("router_models.card.render_card", broken_card)
    result = runner.invoke(app, train)
    assert result.exit_code == 2 and "disk full" in result.stderr, result.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []
    monkeypatch.undo()
    assert runner.invoke(app, train).exit_code == 0  # an earlier model's directory is reused
    assert runner.invoke(app, train).exit_code == 0
    assert {p.name for p in out.iterdir()} == {
        "model.json",
        "arrays.npz",
        "MODEL_CARD.md",
        "report.json",
    }


def test_train_retrains_a_model_directory_in_place_keeping_its_other_files(
    data_file: Path, tmp_path: Path
) -> None:
    """The shipped model's folder holds its licences beside the model: the documented
    rebuild trains into it (it was refused as holding files that are not a model's)."""
    out = tmp_path / "m"
    train = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out)]
    assert runner.invoke(app, train).exit_code == 0
    (out / "LICENSE-data").write_text("terms")
    result = runner.invoke(app, train)
    assert result.exit_code == 0, result.stderr
    assert (out / "LICENSE-data").read_text() == "terms"
    RouterModel.load(out)


@pytest.mark.parametrize("occupied", ["file", "foreign"])
def test_train_refuses_an_out_it_would_clobber(
    data_file: Path, tmp_path: Path, occupied: str
) -> None:
    out = tmp_path / "m"
    if occupied == "file":
        out.write_text("mine")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    argv = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out)]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and f"--out {out}" in result.stderr, result.stderr
    assert (out.read_text() if occupied == "file" else (out / "notes.txt").read_text()) == "mine"


def test_option_help_names_only_options_of_its_own_command() -> None:
    # Options share their help text across commands: evaluate has neither --absolute-alpha
    # (tune's) nor --calibration-fraction (train's).
    router = typer.main.get_command(app).commands["router"]  # type: ignore[attr-defined]
    for name, command in router.commands.items():
        options = {flag for param in command.params for flag in param.opts}
        for param in command.params:
            named = set(re.findall(r"--[a-z][a-z-]*", getattr(param, "help", None) or ""))
            assert named <= options, f"router {name} {param.opts[0]}: {named - options}"


def test_files_of_one_name_count_all_their_rows(
    model_dir: Path, data_file: Path, tmp_path: Path
) -> None:
    """Files are named without their directory; two `labels.jsonl` (or one file given twice)
    were listed with the last one's rows only: 60 of 260 in the report and the card."""
    lines = data_file.read_text().splitlines(keepends=True)
    for day, rows in (("day1", 200), ("day2", 60)):
        (tmp_path / day).mkdir()
        (tmp_path / day / "labels.jsonl").write_text("".join(lines[:rows]))
    data = ["--data", str(tmp_path / "day1" / "labels.jsonl")]
    data += ["--data", str(tmp_path / "day2" / "labels.jsonl")]
    evaluated = runner.invoke(
        app, ["router", "evaluate", "--model", str(model_dir), *data, "--json"]
    )
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["data"]["files"] == {"labels.jsonl": 260}
    out = tmp_path / "m"
    trained = runner.invoke(app, ["router", "train", *data, "--tiers", TIERS, "--out", str(out)])
    assert trained.exit_code == 0, trained.output
    assert json.loads((out / "report.json").read_text())["data"][0]["files"] == {
        "labels.jsonl": 260
    }
    assert "file `labels.jsonl`: 260 rows" in (out / "MODEL_CARD.md").read_text()
    twice = ["--data", str(data_file), "--data", str(data_file)]
    again = runner.invoke(app, ["router", "evaluate", "--model", str(model_dir), *twice, "--json"])
    assert json.loads(again.stdout)["data"]["files"] == {"labels.jsonl": 1200}


def test_a_write_that_fails_names_the_out_path_not_the_scratch_directory(
    data_file: Path, tmp_path: Path
) -> None:
    """The model is staged in a hidden directory beside --out; an error moving a file into
    place named that directory (`.m.x1y2/report.json`), which the user never gave."""
    out = tmp_path / "m"
    train = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", str(out)]
    assert runner.invoke(app, train).exit_code == 0
    (out / "report.json").unlink()
    (out / "report.json").mkdir()  # an earlier model's file is now a directory
    (out / "report.json" / "keep").write_text("x")
    result = runner.invoke(app, train)
    assert result.exit_code == 2, result.stderr
    assert f"'{out / 'report.json'}'" in result.stderr and "/.m." not in result.stderr


def test_a_relative_out_is_named_as_given_when_the_scratch_path_is_absolute(
    data_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From Python 3.12 `tempfile.mkdtemp` returns an absolute path whatever `dir` is: with a
    relative --out the scratch path then did not lie under `out.parent` as given, and the
    error named the scratch directory after all."""
    import os
    import tempfile

    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: os.path.abspath(mkdtemp(**kw)))
    monkeypatch.chdir(tmp_path)
    train = ["router", "train", "--data", str(data_file), "--tiers", TIERS, "--out", "m"]
    assert runner.invoke(app, train).exit_code == 0
    (tmp_path / "m" / "report.json").unlink()
    (tmp_path / "m" / "report.json").mkdir()  # an earlier model's file is now a directory
    (tmp_path / "m" / "report.json" / "keep").write_text("x")
    result = runner.invoke(app, train)
    assert result.exit_code == 2, result.stderr
    assert "'m/report.json'" in result.stderr and "/.m." not in result.stderr
