"""Draw the traffic-regime paper's three figures from the P0 cost model (COST_MODEL.md a).

1. r*(p, C): the speculation breakeven by precision against concurrency.
2. rho*(B_eff): the prefix-caching breakeven against realised batch, for three mean prompts.
3. The NVFP4/FP16 decode-cost ratio against C, both knees marked (P0, and X1 + X2 dashed).

Usage: python benchmarks/costmodel_figures.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gateway.planner.costmodel import CostModel
from gateway.planner.params import CostParams, Extensions
from gateway.precision import Precision

TIERS: tuple[Precision, ...] = ("fp16", "fp8", "w4a16", "nvfp4")
CONCURRENCY = [float(c) for c in range(1, 1025)]


def r_star_figure(model: CostModel, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in TIERS:
        ax.plot(CONCURRENCY, [model.r_star(p, c) for c in CONCURRENCY], label=p)
        for c in (32, 256):
            ax.plot([c], [model.r_star(p, c)], "o", color=ax.lines[-1].get_color(), ms=4)
    for c, targets in ((32, (0.06, 0.14)), (256, (0.29, 0.45))):
        ax.plot([c, c], targets, "x", color="black", label="paper" if c == 32 else None)
    ax.set_xscale("log")
    ax.set_xlabel("concurrency C (requests in flight)")
    ax.set_ylabel("r* (speculation pays above)")
    ax.set_title("n-gram speculation breakeven r*(p, C), P0 on B200")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path = out / "costmodel_r_star.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def rho_star_figure(model: CostModel, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    batches = [float(b) for b in range(1, 439)]
    for l_in in (1024, 2048, 4096):
        ax.plot(
            batches,
            [model.rho_star_at_batch(b, "fp16", l_in) for b in batches],
            label=f"L_in = {l_in}",
        )
    ax.plot([32, 256], [0.064, 0.512], "x", color="black", label="paper (L_in 2048)")
    ax.axhline(0.4, color="grey", ls=":", label="a 40 % sharing workload")
    ax.set_ylim(0, 1)
    ax.set_xlabel("realised batch B_eff")
    ax.set_ylabel("rho* (prefix caching pays above)")
    ax.set_title("prefix-caching breakeven rho* = 0.002 B_eff (2048 / L_in)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = out / "costmodel_rho_star.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def ratio_figure(model: CostModel, out: Path) -> Path:
    realistic = CostModel(
        model.hardware,
        model.model,
        CostParams(extensions=Extensions(expert_union=True, kv_read=True)),
    )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(CONCURRENCY, [model.precision_ratio(c) for c in CONCURRENCY], label="P0")
    ax.plot(
        CONCURRENCY,
        [realistic.precision_ratio(c) for c in CONCURRENCY],
        ls="--",
        label="X1 expert union + X2 KV read",
    )
    for p in ("fp16", "nvfp4"):
        k = model.knee(p)
        ax.axvline(k, color="grey", ls=":")
        ax.text(k, 0.02, f" K_{p} = {k}", rotation=90, va="bottom")
    plateau = model.precision_ratio(1024)
    ax.annotate(
        f"plateau {plateau:.4f}",
        (700, plateau),
        (600, plateau + 0.08),
        arrowprops={"arrowstyle": "->"},
    )
    ax.set_ylim(0, 0.7)
    ax.set_xlabel("concurrency C")
    ax.set_ylabel("decode cost NVFP4 / FP16")
    ax.set_title("precision gain: 0.25 below both knees, plateau above both")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center right")
    path = out / "costmodel_precision_ratio.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = CostModel.p0()
    for path in (
        r_star_figure(model, args.out),
        rho_star_figure(model, args.out),
        ratio_figure(model, args.out),
    ):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
