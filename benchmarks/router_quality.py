"""Router quality on the shared data: held-out calibration, APGR/CPT and tuned thresholds.

1. MMLU, Mixtral-8x7B vs GPT-4 (14,042 prompts), 5-fold cross-validation of the whole recipe
   (scorer, calibration) for each scorer variant, beside the plain hashed-n-gram logistic
   baseline of ANCHORS.md. Targets: APGR >= 0.70, CPT(50%) <= 25%, ECE <= 0.03.
2. Llama-3.1-8B at q4_k_m / q8_0 / fp16 (499 prompts): for alpha = 95, 97, 99% of the top
   tier's accuracy, thresholds are tuned on out-of-fold probabilities of a training part and
   applied to a held-out part (5 folds x several seeds); the held-out quality and cost are
   compared with the uniform tier chosen on the same training part (paired bootstrap interval
   on the quality difference, Wilson intervals on each quality). Two routers: one trained on
   the Llama rows alone, and the shipped recipe (scorer trained on the Mixtral-vs-GPT-4 set
   minus every Llama prompt, calibrated on Llama rows). The two-type pre-test says whether
   routing pays.

Usage: python benchmarks/router_quality.py [--data-dir ../shared/data/labels]
           [--out benchmarks/results] [--variants linear,linear-crossfit,gbdt] [--seeds 4]
Writes router_quality.json, router_quality.md and router_quality.png.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from numpy.typing import NDArray
from sklearn.feature_extraction.text import HashingVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold

from router_models.costs import default_costs
from router_models.data import LabelSet, load_labels
from router_models.evaluation import apgr_cpt, calibration_metrics, evaluate
from router_models.frontier import routed_frontier, static_frontier
from router_models.policy import decide
from router_models.pretest import pretest
from router_models.request import view_request
from router_models.scorers import Scorer
from router_models.thresholds import quality_floor, tune
from router_models.training import (
    TrainConfig,
    calibrate,
    cross_validate,
    fit_router,
    fit_scorer_elsewhere,
    request_folds,
)
from router_models.vectorize import FeatureMatrix, featurize

REPO = Path(__file__).resolve().parents[1]
MMLU = "mmlu_mixtral_vs_gpt4.jsonl.gz"
LLAMA = "mmlu_llama31_8b_precision.jsonl"
TARGETS = {"apgr": 0.70, "cpt50": 0.25, "ece": 0.03}
VARIANTS: dict[str, TrainConfig] = {
    "linear": TrainConfig(scorer="linear"),
    "linear-crossfit": TrainConfig(scorer="linear", calibration="crossfit"),
    "gbdt": TrainConfig(scorer="gbdt"),
    "gbdt-crossfit": TrainConfig(scorer="gbdt", calibration="crossfit"),
}
ALPHAS = (0.95, 0.97, 0.99)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- MMLU: cross-validated APGR / CPT / ECE ---------------------------------------------------


def mmlu_section(
    labels: LabelSet, variants: Sequence[str], folds: int, seeds: int
) -> dict[str, Any]:
    costs, source = default_costs(labels.tiers)
    out: dict[str, Any] = {
        "data": MMLU,
        "n": len(labels),
        "tiers": list(labels.tiers),
        "costs": list(costs),
        "uniform_quality": labels.correct.mean(axis=0).tolist(),
        "folds": folds,
        "split_seeds": seeds,
        "variants": {},
    }
    log("MMLU: plain hashed n-gram logistic baseline")
    out["baseline_logistic_ngrams"] = _baseline(labels, costs, folds)
    feats = featurize(labels.requests, TrainConfig().spec)
    for name in variants:
        runs = []
        for seed in range(seeds):
            config = replace(VARIANTS[name], seed=seed)
            log(f"MMLU: {name}, {folds}-fold cross-validation, split seed {seed}")
            runs.append(
                _mmlu_run(labels, feats, config, folds=folds, costs=costs, source=str(source))
            )
        summary = {**runs[0], "seed_runs": [_headline(r) for r in runs]}
        for key in ("apgr", "cpt50", "cpt80", "ece", "auc"):
            values = [r[key] for r in runs]
            summary[f"{key}_seed_mean"] = float(np.mean(values))
            summary[f"{key}_seed_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        summary["targets_met_seed_mean"] = {
            "apgr": summary["apgr_seed_mean"] >= TARGETS["apgr"],
            "cpt50": summary["cpt50_seed_mean"] <= TARGETS["cpt50"],
            "ece": summary["ece_seed_mean"] <= TARGETS["ece"],
        }
        out["variants"][name] = summary
        log(
            f"  APGR {summary['apgr_seed_mean']:.4f} +- {summary['apgr_seed_sd']:.4f}  "
            f"CPT50 {summary['cpt50_seed_mean']:.4f}  ECE {summary['ece_seed_mean']:.4f}"
        )
    return out


def _headline(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("apgr", "apgr_raw_score", "cpt50", "cpt80", "auc", "ece", "brier", "seconds")
    return {k: run[k] for k in keys} | {"seed": run["config"]["seed"]}


def _mmlu_run(
    labels: LabelSet,
    feats: FeatureMatrix,
    config: TrainConfig,
    *,
    folds: int,
    costs: Sequence[float],
    source: str,
) -> dict[str, Any]:
    started = time.perf_counter()
    cv = cross_validate(labels, config, folds, features=feats)
    doc = evaluate(cv.proba, labels.correct, labels.tiers, costs, cost_source=source)
    per_fold = [
        apgr_cpt(cv.proba[cv.fold == f], labels.correct[cv.fold == f], costs)[0]
        for f in range(folds)
    ]
    tier = labels.tiers[0]
    run = {
        "apgr": doc["apgr"],
        "apgr_fold_mean": float(np.mean(per_fold)),
        "apgr_fold_std": float(np.std(per_fold, ddof=1)),
        "apgr_raw_score": apgr_cpt(_risk_as_proba(cv.score), labels.correct, costs)[0],
        "cpt50": doc["cpt50"],
        "cpt80": doc["cpt80"],
        "auc": doc["per_tier"][tier]["auc"],
        "ece": doc["per_tier"][tier]["ece"],
        "brier": doc["per_tier"][tier]["brier"],
        "pretest": doc["pretest"],
        "seconds": round(time.perf_counter() - started, 1),
        "config": config.as_dict(),
        "frontier": doc["frontier"],
    }
    run["targets_met"] = {
        "apgr": run["apgr"] >= TARGETS["apgr"],
        "cpt50": run["cpt50"] <= TARGETS["cpt50"],
        "ece": run["ece"] <= TARGETS["ece"],
    }
    return run


def _baseline(labels: LabelSet, costs: Sequence[float], folds: int) -> dict[str, Any]:
    """Hashed word 1-2 grams, logistic regression on "the strong model wins", no calibration."""
    texts = [view_request(r).text for r in labels.requests]
    x = HashingVectorizer(n_features=2**20, ngram_range=(1, 2), alternate_sign=False).transform(
        texts
    )
    wins = (labels.correct[:, -1] > labels.correct[:, 0]).astype(int)
    score = np.empty(len(labels))
    # Folds over requests, as the routers' cross-validation has them: a duplicated prompt
    # (the set has some) on both sides would let the test fold see its own label.
    for train, test in request_folds(labels, folds, 0):
        model = LogisticRegression(C=1.0, max_iter=2000).fit(x[train], wins[train])
        score[test] = model.decision_function(x[test])
    apgr, (cpt50, cpt80) = apgr_cpt(_risk_as_proba(score), labels.correct, costs)
    return {"apgr": apgr, "cpt50": cpt50, "cpt80": cpt80, "ranked_by": "raw score"}


def _risk_as_proba(score: NDArray[np.float64]) -> NDArray[np.float64]:
    """A monotone map of a raw score into the (p_cheap, 1) layout the frontier reads."""
    lo, hi = float(score.min()), float(score.max())
    scaled = (score - lo) / (hi - lo) if hi > lo else np.zeros_like(score)
    return np.column_stack([1.0 - scaled, np.ones_like(scaled)])


# -- Llama precision set: tuned thresholds against the uniform baseline -------------------------


def llama_section(
    labels: LabelSet, mixtral: LabelSet, seeds: int, folds: int, n_boot: int
) -> dict[str, Any]:
    costs, source = default_costs(labels.tiers)
    config = TrainConfig(scorer="linear")
    feats = featurize(labels.requests, config.spec)
    log("Llama: scorer of the shipped recipe (Mixtral-vs-GPT-4 rows minus Llama prompts)")
    shared = fit_scorer_elsewhere(mixtral, labels, config)
    routers: dict[str, Scorer | None] = {"llama-only linear": None, "shipped recipe": shared}
    out: dict[str, Any] = {
        "data": LLAMA,
        "n": len(labels),
        "tiers": list(labels.tiers),
        "costs": list(costs),
        "costs_source": str(source),
        "uniform_quality": labels.correct.mean(axis=0).tolist(),
        "seeds": seeds,
        "folds": folds,
        "routers": {},
    }
    for name, scorer in routers.items():
        log(f"Llama: {name}")
        cv = cross_validate(labels, config, folds, features=feats, scorer=scorer)
        doc = evaluate(cv.proba, labels.correct, labels.tiers, costs, cost_source=source)
        entry: dict[str, Any] = {
            "oof": {
                "per_tier": calibration_metrics(cv.proba, labels.correct, labels.tiers, "relative"),
                "apgr": doc["apgr"],
                "apgr_static": doc["apgr_static"],
                "pretest": pretest(cv.proba, labels.correct, costs).as_dict(),
            },
            "alphas": {},
        }
        held = _held_out_runs(
            labels, feats, config=config, scorer=scorer, seeds=seeds, folds=folds, costs=costs
        )
        for alpha in ALPHAS:
            entry["alphas"][str(alpha)] = _alpha_summary(labels, held, alpha, costs, n_boot)
        out["routers"][name] = entry
    out["oof_frontier"] = _llama_frontier(
        labels, feats, config=config, scorer=shared, folds=folds, costs=costs
    )
    return out


def _held_out_runs(
    labels: LabelSet,
    feats: FeatureMatrix,
    *,
    config: TrainConfig,
    scorer: Scorer | None,
    seeds: int,
    folds: int,
    costs: Sequence[float],
) -> list[dict[str, Any]]:
    """Per (seed, fold): test rows, their held-out probabilities, and tuned decisions per alpha."""
    runs = []
    for seed in range(seeds):
        splitter = KFold(folds, shuffle=True, random_state=100 + seed)
        for train, test in splitter.split(np.arange(len(labels))):
            part = labels.subset(train)
            part_feats = FeatureMatrix(feats.dense[train], feats.grams[train])
            inner = cross_validate(part, config, 5, features=part_feats, scorer=scorer)
            if scorer is None:
                model = fit_router(part, config, features=part_feats)
            else:
                model = calibrate(scorer, part, config, part_feats)
            test_feats = FeatureMatrix(feats.dense[test], feats.grams[test])
            proba = model.calibration.predict_proba(model.scorer.score(test_feats))
            decisions = {}
            for alpha in ALPHAS:
                tuned = tune(inner.proba, part.correct, costs, alpha=alpha)
                chosen = np.array([decide(p, tuned.thresholds) for p in proba])
                decisions[alpha] = {
                    "chosen": chosen,
                    "uniform": tuned.baseline.tier,
                    "claimed": tuned.routing_pays,
                }
            runs.append({"seed": seed, "test": test, "decisions": decisions})
    return runs


def _alpha_summary(
    labels: LabelSet,
    runs: list[dict[str, Any]],
    alpha: float,
    costs: Sequence[float],
    n_boot: int,
) -> dict[str, Any]:
    c = labels.correct
    cost = np.asarray(costs)
    tuned_q, tuned_c, base_q, base_c = [], [], [], []
    claimed = 0
    for run in runs:
        d = run["decisions"][alpha]
        test = run["test"]
        tuned_q.append(c[test, d["chosen"]])
        tuned_c.append(cost[d["chosen"]])
        base_q.append(c[test, d["uniform"]])
        base_c.append(np.full(len(test), cost[d["uniform"]]))
        claimed += bool(d["claimed"])
    tq, tc = np.concatenate(tuned_q), np.concatenate(tuned_c)
    bq, bc = np.concatenate(base_q), np.concatenate(base_c)
    diff = tq - bq
    low, high = _paired_bootstrap(_per_prompt_means(diff, runs), n_boot)
    floor = quality_floor(c, alpha)
    return {
        "quality_floor": floor,
        "tuned": {
            "quality": float(tq.mean()),
            "cost": float(tc.mean()),
            "quality_wilson95": _wilson(_per_prompt_means(tq, runs)),
        },
        "uniform": {
            "quality": float(bq.mean()),
            "cost": float(bc.mean()),
            "quality_wilson95": _wilson(_per_prompt_means(bq, runs)),
        },
        "quality_difference": float(diff.mean()),
        "quality_difference_ci95": [low, high],
        "cost_saving": float(bc.mean() - tc.mean()),
        "folds_where_routing_claimed_to_pay": f"{claimed}/{len(runs)}",
        "tuned_not_worse_than_uniform": bool(high >= 0.0),
        "tuned_meets_floor": bool(tq.mean() >= floor),
    }


def _per_prompt_means(
    values: NDArray[np.float64], runs: list[dict[str, Any]]
) -> NDArray[np.float64]:
    """Each prompt's mean of `values` (pooled over `runs`, in their order) across seeds.

    Every seed's split tests each prompt once, but in its own fold order, so the rows are
    matched to prompts by the runs' test indices, not by position.
    """
    prompts = np.concatenate([run["test"] for run in runs])
    counts = np.bincount(prompts)
    seen = counts > 0
    return np.bincount(prompts, weights=values)[seen] / counts[seen]


def _paired_bootstrap(per_prompt: NDArray[np.float64], n_boot: int) -> tuple[float, float]:
    """95% interval of the mean difference, resampling prompts: the seeds repeat the same
    prompts, so they are not independent samples."""
    rng = np.random.default_rng(0)
    idx = rng.integers(0, per_prompt.size, size=(n_boot, per_prompt.size))
    means = per_prompt[idx].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _wilson(per_prompt: NDArray[np.float64], z: float = 1.96) -> list[float]:
    """Wilson 95% interval of an accuracy over the prompts, not over the pooled seed runs
    (each seed repeats every prompt, which would count each answer `seeds` times)."""
    n = per_prompt.size
    p = float(per_prompt.mean())
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


def _llama_frontier(
    labels: LabelSet,
    feats: FeatureMatrix,
    *,
    config: TrainConfig,
    scorer: Scorer,
    folds: int,
    costs: Sequence[float],
) -> dict[str, Any]:
    cv = cross_validate(labels, config, folds, features=feats, scorer=scorer)
    front = routed_frontier(cv.proba, labels.correct, costs)
    static = static_frontier(labels.correct, costs)
    return {
        "routed": {"cost": front.cost.tolist(), "quality": front.quality.tolist()},
        "static": {"cost": static.cost.tolist(), "quality": static.quality.tolist()},
    }


# -- output --------------------------------------------------------------------------------------


def write_markdown(doc: dict[str, Any], path: Path) -> None:
    m = doc["mmlu"]
    lines = [
        "# Router quality (benchmarks/router_quality.py)",
        "",
        f"Machine: {doc['machine']}; run {doc['finished']}; {doc['seconds']:.0f} s.",
        "",
        f"## MMLU, Mixtral-8x7B vs GPT-4 ({m['n']} prompts, {m['folds']}-fold CV)",
        "",
        "Targets: APGR >= 0.70, CPT(50%) <= 25%, ECE <= 0.03. Random routing: APGR 0.50, "
        "CPT(50%) 50%.",
        "",
        "| router | APGR (mean +- sd over split seeds) | CPT(50%) | CPT(80%) | AUC | ECE | "
        "targets met (on the means) |",
        "|---|---|---|---|---|---|---|",
    ]
    b = m["baseline_logistic_ngrams"]
    lines.append(
        f"| hashed 1-2-gram logistic baseline (raw score, seed 0) | {b['apgr']:.3f} | "
        f"{b['cpt50']:.1%} | {b['cpt80']:.1%} | | | |"
    )
    for name, v in m["variants"].items():
        met = ", ".join(k for k, ok in v["targets_met_seed_mean"].items() if ok) or "none"
        lines.append(
            f"| {name} | {v['apgr_seed_mean']:.3f} +- {v['apgr_seed_sd']:.3f} | "
            f"{v['cpt50_seed_mean']:.1%} | {v['cpt80_seed_mean']:.1%} | "
            f"{v['auc_seed_mean']:.3f} | {v['ece_seed_mean']:.4f} | {met} |"
        )
    lines += [
        "",
        "APGR and CPT rank by the calibrated probability (what thresholds can use); "
        "`apgr_raw_score` in the JSON ranks by the raw score. Each seed is a different "
        "5-fold split; per-seed figures are in the JSON.",
        "",
    ]
    ll = doc["llama"]
    lines += [
        f"## Llama-3.1-8B precision ladder ({ll['n']} prompts; tiers {', '.join(ll['tiers'])}; "
        f"costs {', '.join(f'{c:g}' for c in ll['costs'])})",
        "",
        "Uniform accuracy: "
        + ", ".join(f"{t} {q:.3f}" for t, q in zip(ll["tiers"], ll["uniform_quality"], strict=True))
        + f". Thresholds tuned on out-of-fold probabilities of a training part, applied to the "
        f"held-out part; {ll['folds']} folds x {ll['seeds']} seeds, pooled.",
        "",
        "| router | alpha | floor | tuned quality [Wilson 95%] | tuned cost | uniform quality | "
        "uniform cost | difference [paired bootstrap 95%] | routing claimed to pay |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in ll["routers"].items():
        for alpha, a in r["alphas"].items():
            t, u = a["tuned"], a["uniform"]
            lo, hi = a["quality_difference_ci95"]
            w = t["quality_wilson95"]
            lines.append(
                f"| {name} | {alpha} | {a['quality_floor']:.4f} | {t['quality']:.4f} "
                f"[{w[0]:.3f}, {w[1]:.3f}] | {t['cost']:.3f} | {u['quality']:.4f} | "
                f"{u['cost']:.3f} | {a['quality_difference']:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
                f"{a['folds_where_routing_claimed_to_pay']} |"
            )
    lines += ["", "Out-of-fold calibration and the two-type pre-test:", ""]
    for name, r in ll["routers"].items():
        o = r["oof"]
        aucs = ", ".join(
            f"{t} AUC {_fmt(v['auc'])} ECE {_fmt(v['ece'])}" for t, v in o["per_tier"].items()
        )
        lines.append(
            f"- {name}: {aucs}; APGR {_fmt(o['apgr'])} (static split "
            f"{_fmt(o['apgr_static'])}); pre-test: {o['pretest']['message']}"
        )
    lines.append("")
    path.write_text("\n".join(lines))


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def write_plot(doc: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    m = doc["mmlu"]
    ax = axes[0]
    for name, v in m["variants"].items():
        pts = v["frontier"]
        ax.plot([p["cost"] for p in pts], [p["quality"] for p in pts], label=name)
    c0, c1 = m["costs"]
    q0, q1 = m["uniform_quality"]
    ax.plot([c0, c1], [q0, q1], "--", color="grey", label="static split")
    ax.set_title("MMLU Mixtral vs GPT-4 (5-fold CV)")
    ax.set_xlabel("mean relative cost (ladder default 0.5 / 1.0)")
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8)
    ax = axes[1]
    f = doc["llama"]["oof_frontier"]
    ax.plot(f["routed"]["cost"], f["routed"]["quality"], label="routed (shipped recipe, OOF)")
    ax.plot(f["static"]["cost"], f["static"]["quality"], "--", color="grey", label="static split")
    ll = doc["llama"]
    ax.scatter(ll["costs"], ll["uniform_quality"], color="k", zorder=3, label="uniform tiers")
    for t, cst, q in zip(ll["tiers"], ll["costs"], ll["uniform_quality"], strict=True):
        ax.annotate(t, (cst, q), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_title("Llama-3.1-8B precision ladder")
    ax.set_xlabel("mean relative cost (precision bytes)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=REPO.parent / "shared/data/labels")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results")
    parser.add_argument("--variants", default="linear,linear-crossfit,gbdt")
    parser.add_argument("--split-seeds", type=int, default=3, help="MMLU fold splits per variant")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--boot", type=int, default=2000)
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {sorted(VARIANTS)}")
    started = time.perf_counter()
    mixtral = load_labels([args.data_dir / MMLU])
    llama = load_labels([args.data_dir / LLAMA], ("q4_k_m", "q8_0", "fp16"))
    doc: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.processor() or ''} "
        f"Python {platform.python_version()}".strip(),
    }
    doc["mmlu"] = mmlu_section(mixtral, variants, args.folds, args.split_seeds)
    doc["llama"] = llama_section(llama, mixtral, args.seeds, args.folds, args.boot)
    doc["seconds"] = time.perf_counter() - started
    doc["finished"] = time.strftime("%Y-%m-%d %H:%M")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "router_quality.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_markdown(doc, args.out / "router_quality.md")
    write_plot(doc, args.out / "router_quality.png")
    log(f"wrote {args.out}/router_quality.{{json,md,png}}")


if __name__ == "__main__":
    main()
