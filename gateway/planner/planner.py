"""The operator decision procedure of COST_MODEL.md b.1: precision, then toggles, then act.

`plan_tier` is a pure function of the regime and the settings. `Planner` wraps it with the
b.1 state (current configuration, last switch, pending candidate) and is driven by a caller
that passes the time in; it never reads a clock.

Tie-breaks. W4A16 and NVFP4 have the same nominal bytes, hence the same knee and decode cost.
b.1 breaks such ties by higher eta, then higher Q, then native compute. eta only matters when
speculation is on, so ties are broken first by CPT with the toggles recomputed at each tied
tier (which is "higher eta" exactly when a tied tier speculates, and a no-op otherwise), then
by Q, then native compute (NVFP4 on SM100 computes in FP4; on SM90 it is emulated through
Marlin, so W4A16 is preferred there), then eta. With the placeholder Q (NVFP4 0.980 > W4A16 0.975) a
non-speculating regime therefore picks NVFP4 and a speculating one picks W4A16 (eta 0.75).

Why FP8 wins for a coding agent. In P0 FP8 never has the lowest decode cost: it has twice
the bytes of the 4-bit tiers and a smaller knee. It is chosen when the quality floor rules the
4-bit tiers out (Q_min in (0.980, 0.995], typical for code, where errors are visible). The
paper's "not NVFP4, to keep eta high" is this filter: CPT alone would keep NVFP4 unless
eta(NVFP4) fell below about 0.5 (r = 0.9, C = 32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final, Literal

from gateway.planner.costmodel import CostModel
from gateway.planner.params import Settings
from gateway.planner.vllm_args import precision_notes, vllm_serve_args
from gateway.precision import Precision

__all__ = [
    "DEFAULT_CANDIDATES",
    "PAPER_CANDIDATES",
    "Planner",
    "PlannerStep",
    "PlanningError",
    "Regime",
    "TierConfig",
    "TierPlan",
    "fixed_precision_settings",
    "plan_tier",
]

# The ladder one BF16 checkpoint is served at; the paper's own set omits W4A16.
DEFAULT_CANDIDATES: Final[tuple[Precision, ...]] = ("bf16", "fp8", "w4a16", "nvfp4")
PAPER_CANDIDATES: Final[tuple[Precision, ...]] = ("fp16", "fp8", "nvfp4")
_TIE_RTOL: Final = 1e-9

Action = Literal["initial", "hold", "pending", "switch"]


class PlanningError(ValueError):
    """No candidate precision is feasible (quality floor, hardware, weights that do not fit),
    or the regime is invalid."""


# Below this the cost per token (which rises as 1/C) overflows; no real window measures less.
MIN_CONCURRENCY = 1e-9
# Likewise for the mean lengths: below it c_pre * L_in underflows to 0 (rho* divides by it).
MIN_LENGTH = 1e-9


@dataclass(frozen=True)
class Regime:
    """Observed traffic: concurrency C, prefix share rho, i.i.d.-equivalent acceptance r.

    `l_in`/`l_out` override the configured mean lengths when the observer measured them.
    `rho_known`/`r_known` are False while nothing measured that quantity yet: its value is
    then a stand-in, and the flag it decides is kept as in the current configuration (when
    there is one).
    """

    concurrency: float
    rho: float
    r: float
    l_in: float | None = None
    l_out: float | None = None
    rho_known: bool = True
    r_known: bool = True

    def __post_init__(self) -> None:
        # Bounds written as `not a < x < b` so that NaN fails them too.
        if not MIN_CONCURRENCY <= self.concurrency < math.inf:
            raise PlanningError(
                f"concurrency must be finite and at least {MIN_CONCURRENCY:g}, "
                f"got {self.concurrency}"
            )
        if not 0.0 <= self.rho <= 1.0:
            raise PlanningError(f"rho must be in [0, 1], got {self.rho}")
        if not 0.0 <= self.r <= 1.0:
            raise PlanningError(f"r must be in [0, 1], got {self.r}")
        # rho* divides by L_in: a regime without prompt tokens has no prefix to cache.
        if self.l_in is not None and not MIN_LENGTH <= self.l_in < math.inf:
            raise PlanningError(
                f"L_in must be a length > 0 (at least {MIN_LENGTH:g}), got {self.l_in}"
            )
        if self.l_out is not None and not MIN_LENGTH <= self.l_out < math.inf:
            raise PlanningError(
                f"L_out must be a length > 0 (at least {MIN_LENGTH:g}), got {self.l_out}"
            )


@dataclass(frozen=True)
class TierConfig:
    """What a tier runs with: the three startup decisions (p, s, k)."""

    precision: Precision
    speculative: bool
    prefix_caching: bool

    def describe(self) -> str:
        return f"{self.precision} s={int(self.speculative)} k={int(self.prefix_caching)}"


@dataclass(frozen=True)
class TierPlan:
    """The recommendation for one tier. `expected_cpt` is price units (GPU-s at pi = 1) per
    output token; `vllm_args` is the argv after `vllm serve`."""

    precision: Precision
    speculative: bool
    prefix_caching: bool
    reasons: list[str]
    expected_cpt: float
    vllm_args: list[str]
    knee: int
    b_eff: float
    rho_star: float
    r_star: float
    decode_seconds_per_token: float
    alternatives: dict[str, float] = field(default_factory=dict)

    @property
    def config(self) -> TierConfig:
        return TierConfig(self.precision, self.speculative, self.prefix_caching)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; an infinite r* (speculation can never pay) becomes None."""
        out = asdict(self)
        out["r_star"] = None if math.isinf(self.r_star) else self.r_star
        return out


@dataclass(frozen=True)
class _Evaluation:
    """One regime under one cost model, with the mean lengths resolved."""

    model: CostModel
    regime: Regime
    l_in: float
    l_out: float

    @property
    def ctx(self) -> float:
        return self.l_in + self.l_out / 2.0

    def cpt(self, p: Precision, s: bool, k: bool) -> float:
        g = self.regime
        cost = self.model.cpt(g.concurrency, g.rho, g.r, p, s, k, l_in=self.l_in, l_out=self.l_out)
        if not math.isfinite(cost):  # a plan carries it as JSON, which has no infinity
            raise PlanningError(
                f"CPT overflows at L_in {self.l_in:g}, L_out {self.l_out:g}: no plan"
            )
        return cost

    def decode(self, p: Precision) -> float:
        return self.model.decode_seconds_per_token(self.regime.concurrency, p, self.ctx)

    def toggles(self, p: Precision) -> tuple[bool, bool, float, float]:
        # Computed fresh for p: rho* moves with B_eff(p), r* with eta(p) and t0/t_w(p).
        c = self.regime.concurrency
        rho_star = self.model.rho_star(p, c, self.l_in)
        r_star = self.model.r_star(p, c, self.ctx)
        return self.regime.r > r_star, self.regime.rho > rho_star, rho_star, r_star


def _feasible(
    settings: Settings, model: CostModel, candidates: Sequence[Precision], q_min: float
) -> tuple[list[Precision], list[str]]:
    kept: list[Precision] = []
    dropped: list[str] = []
    for p in dict.fromkeys(candidates):
        q = model.quality(p)
        if p not in settings.model.checkpoints:
            # Nothing to serve it from: its `vllm serve` line cannot be written.
            dropped.append(f"{p} (no checkpoint in model.checkpoints)")
        elif not model.fits(p):
            dropped.append(f"{p} (weights do not fit: {model.fit_problem(p)})")
        elif q < q_min:
            dropped.append(f"{p} (Q {q:.3f} < Q_min {q_min:.3f})")
        elif settings.policy.require_native_compute and not model.native_compute(p):
            dropped.append(f"{p} (no native compute on {settings.hardware.name})")
        else:
            kept.append(p)
    return kept, dropped


def _choose(ev: _Evaluation, feasible: list[Precision]) -> tuple[Precision, list[Precision]]:
    """argmin decode cost; ties by CPT with fresh toggles, then Q, then native compute (the
    low-precision tensor-core speed-up, then a format the GPU does not emulate), then eta,
    then candidate order."""
    decode = {p: ev.decode(p) for p in feasible}
    best = min(decode.values())
    tied = [p for p in feasible if decode[p] <= best * (1.0 + _TIE_RTOL)]
    m = ev.model

    def tie_key(p: Precision) -> tuple[float, float, float, int, float, int]:
        s, k, _, _ = ev.toggles(p)
        emulated = 0 if m.native_compute(p) else 1
        return (
            ev.cpt(p, s, k),
            -m.quality(p),
            -m.compute_speedup(p),
            emulated,
            -m.eta(p),
            feasible.index(p),
        )

    return min(tied, key=tie_key), tied


def _inheritance_note(
    ev: _Evaluation, chosen: Precision, fresh: TierConfig, old: TierConfig
) -> str:
    inherited = ev.cpt(chosen, old.speculative, old.prefix_caching)
    expected = ev.cpt(chosen, fresh.speculative, fresh.prefix_caching)
    text = (
        f"toggles recomputed for {chosen}, not inherited from {old.describe()}: "
        f"inheriting would cost {100.0 * (inherited / expected - 1.0):+.1f}% CPT"
    )
    if old.speculative != fresh.speculative:
        # Speculation acts on decode only; say what it does there (b.1 notes: +15 %).
        c = ev.regime.concurrency
        plain = ev.decode(chosen)
        spec = ev.model.spec_decode_seconds_per_token(c, chosen, ev.regime.r, ev.ctx)
        kept, right = (spec, plain) if old.speculative else (plain, spec)
        text += f", {100.0 * (kept / right - 1.0):+.1f}% decode"
    return text


def _toggle_reason(
    flag: str,
    on: bool,
    *,
    symbol: str,
    value: float,
    star: float,
    known: bool,
    current: TierConfig | None,
    detail: str,
) -> str:
    state = "on" if on else "off"
    if not known:
        basis = "kept as in the current configuration" if current else f"{symbol} taken as 0"
        return f"{flag} {state}: {symbol} not measured yet, no evidence ({basis})"
    star_text = "inf" if math.isinf(star) else f"{star:.4f}"
    relation = ">" if value > star else "<="
    comparison = f"{symbol} {value:.3f} {relation} {symbol}* {star_text}{detail}"
    if on != (value > star):  # a held plan: the switch waits (the first reason says why)
        wanted = "on" if value > star else "off"
        return f"{flag} {state} as it runs: {comparison} would turn it {wanted} here; held"
    return f"{flag} {state}: {comparison}"


def _explain(
    ev: _Evaluation,
    cfg: Settings,
    *,
    feasible: list[Precision],
    dropped: list[str],
    tied: list[Precision],
    plan: TierConfig,
    current: TierConfig | None,
) -> list[str]:
    m, g, p = ev.model, ev.regime, plan.precision
    _, _, rho_star, r_star = ev.toggles(p)
    b_eff = m.b_eff(g.concurrency, p)
    reasons = [
        f"candidates {', '.join(feasible)}" + (f"; dropped {', '.join(dropped)}" if dropped else "")
    ]
    ranking = ", ".join(f"{q} {ev.decode(q) * 1e6:.3f}" for q in sorted(feasible, key=ev.decode))
    reasons.append(
        f"precision {p}: lowest decode cost t_w/B_eff at C={g.concurrency:g} "
        f"(B_eff={b_eff:g}, K={m.knee(p)}); us/token: {ranking}"
    )
    if len(tied) > 1:
        others = ", ".join(q for q in tied if q != p)
        reasons.append(
            f"{p} ties {others} on decode cost; broken by CPT with recomputed toggles, "
            f"then Q ({m.quality(p):.3f}), native compute, eta ({m.eta(p):.3f})"
        )
    spec_detail = f" (eta {m.eta(p):.3f}, R {m.spec_step_inflation(p, b_eff, None, ev.ctx):.4f})"
    toggles = (
        (
            "prefix caching",
            plan.prefix_caching,
            "rho",
            g.rho,
            rho_star,
            g.rho_known,
            f" at B_eff {b_eff:g}, L_in {ev.l_in:g}",
        ),
        ("speculation", plan.speculative, "r", g.r, r_star, g.r_known, spec_detail),
    )
    for flag, on, symbol, value, star, known, detail in toggles:
        reasons.append(
            _toggle_reason(
                flag,
                on,
                symbol=symbol,
                value=value,
                star=star,
                known=known,
                current=current,
                detail=detail,
            )
        )
    if (
        current is not None
        and g.rho_known
        and g.r_known  # else a toggle was kept, not recomputed: nothing to compare
        and current.precision != p
        and (
            (current.speculative, current.prefix_caching) != (plan.speculative, plan.prefix_caching)
        )
    ):
        reasons.append(_inheritance_note(ev, p, plan, current))
    reasons += precision_notes(p, cfg.hardware)
    if ev.l_in + ev.l_out > cfg.cost.l_ctx:
        reasons.append(
            f"warning: L_in + L_out = {ev.l_in + ev.l_out:g} exceeds the reserved L_ctx "
            f"{cfg.cost.l_ctx}; raise cost.l_ctx (`plan --params FILE` with "
            "`cost: {l_ctx: ...}`), which --max-model-len follows"
        )
    return reasons


def fixed_precision_settings(settings: Settings) -> Settings:
    """Settings for planning only the toggles of a tier whose precision is fixed (by the
    routing ladder): the precision filters, quality floor and native compute, do not apply.
    A precision whose weights do not fit stays infeasible: that is physics, not policy."""
    return settings.model_copy(
        update={
            "cost": settings.cost.model_copy(update={"q_min": 0.0}),
            "policy": settings.policy.model_copy(update={"require_native_compute": False}),
        }
    )


def with_engine_kv_capacity(
    settings: Settings, precision: Precision, tokens: float | None
) -> Settings:
    """Settings whose K(precision) comes from the KV tokens the engine reports (b.2 item 4),
    unless the configuration already sets that precision's capacity (the operator's word
    wins) or nothing was reported."""
    known = settings.cost.kv_capacity_tokens
    if tokens is None or tokens <= 0 or precision in known:
        return settings
    cost = settings.cost.model_copy(update={"kv_capacity_tokens": {**known, precision: tokens}})
    return settings.model_copy(update={"cost": cost})


def plan_tier(
    regime: Regime,
    settings: Settings | None = None,
    candidates: Sequence[Precision] = DEFAULT_CANDIDATES,
    current: TierConfig | None = None,
    *,
    q_min: float | None = None,
    hold: bool = False,
) -> TierPlan:
    """b.1 steps 2 and 3 for one tier: filter by Q(p) >= Q_min and hardware, take the
    precision with the lowest decode cost t_w(p) / B_eff, then decide prefix caching from
    rho*(p*, B_eff) and speculation from r*(p*, B_eff). Toggles are not inherited from
    `current` (when it differs, the reasons say what inheriting would cost), except a toggle
    whose evidence is missing (`Regime.rho_known`, `r_known`): that one stays as `current`.

    `hold=True` describes `current` itself under this regime (the advice while hysteresis,
    dwell or confirmations keep a better candidate waiting)."""
    cfg = settings or Settings()
    model = CostModel.from_settings(cfg)
    ev = _Evaluation(
        model,
        regime,
        cfg.cost.l_in if regime.l_in is None else regime.l_in,
        cfg.cost.l_out if regime.l_out is None else regime.l_out,
    )
    floor = cfg.cost.q_min if q_min is None else q_min
    if not 0.0 <= floor <= 1.0:  # also rejects NaN, under which every Q would pass
        raise PlanningError(f"Q_min must be in [0, 1], got {floor}")
    feasible, dropped = _feasible(cfg, model, candidates, floor)
    if not feasible:
        raise PlanningError(f"no feasible precision among {list(candidates)}: {dropped}")

    if hold:
        if current is None or not _feasible(cfg, model, [current.precision], floor)[0]:
            raise PlanningError(f"cannot hold {current}: not a feasible configuration")
        chosen, tied = current.precision, [current.precision]
        _, _, rho_star, r_star = ev.toggles(chosen)
        spec, cache = current.speculative, current.prefix_caching
    else:
        chosen, tied = _choose(ev, feasible)
        spec, cache, rho_star, r_star = ev.toggles(chosen)
        if current is not None:
            spec = spec if regime.r_known else current.speculative
            cache = cache if regime.rho_known else current.prefix_caching
    plan = TierConfig(chosen, spec, cache)
    batch_ranges: list[tuple[int, int, bool]] | None = None
    if spec and cfg.serve.batch_dependent_speculation and regime.r_known:  # no r, no cutoff
        ranges = _speculation_batch_ranges(model, chosen, regime.r, ev.ctx)
        # A held speculating tier whose r pays at no batch keeps running as it is: a table
        # of k = 0 everywhere would switch speculation off past the hysteresis.
        batch_ranges = ranges if any(on for _, _, on in ranges) else None
    args = vllm_serve_args(
        chosen,
        speculative=spec,
        prefix_caching=cache,
        model=cfg.model,
        cost=cfg.cost,
        serve=cfg.serve,
        spec_batch_ranges=batch_ranges,
    )
    return TierPlan(
        precision=chosen,
        speculative=spec,
        prefix_caching=cache,
        reasons=_explain(
            ev, cfg, feasible=feasible, dropped=dropped, tied=tied, plan=plan, current=current
        ),
        expected_cpt=ev.cpt(chosen, spec, cache),
        vllm_args=args,
        knee=model.knee(chosen),
        b_eff=model.b_eff(regime.concurrency, chosen),
        rho_star=rho_star,
        r_star=r_star,
        decode_seconds_per_token=ev.decode(chosen),
        alternatives={
            f"{p} s={int(s)} k={int(k)}": ev.cpt(p, s, k)
            for p in feasible
            for s in (False, True)
            for k in (False, True)
        },
    )


def _speculation_batch_ranges(
    model: CostModel, p: Precision, r: float, ctx: float
) -> list[tuple[int, int, bool]]:
    """Inclusive (first, last, speculate) runs over every batch vLLM may run (1 to
    max_num_seqs; K assumes a full L_ctx per request, so a real batch can exceed it): on
    where r beats r*(p, B) (d.5 per-batch k). Scanned, not bisected: under X1 r* is not
    monotone in B (verify tokens widen the expert union most at small batches).

    r > r*(B) = A^-1(R(B)) / eta is tested as A(eta r) > R(B), A being increasing: the same
    answer without a bisection per batch (16 ms a plan at 1,024 batches, on the event loop).
    """
    k = model.params.num_speculative_tokens
    accepted = model.accepted_per_round(min(model.eta(p) * r, 1.0), k)
    runs: list[tuple[int, int, bool]] = []
    for b in range(1, model.params.max_num_seqs + 1):
        pays = accepted > model.spec_step_inflation(p, b, k, ctx)
        if runs and runs[-1][2] == pays:
            runs[-1] = (runs[-1][0], b, pays)
        else:
            runs.append((b, b, pays))
    return runs


@dataclass(frozen=True)
class PlannerStep:
    """One evaluation of the b.1 loop: the fresh plan and what was done about it.

    `advice` is what the tier should run now: the fresh plan once it passed hysteresis,
    dwell and confirmations, else the current configuration (described under this regime).
    """

    now: float
    plan: TierPlan
    action: Action
    current: TierConfig
    current_cpt: float
    pending: TierConfig | None
    pending_count: int
    note: str
    advice: TierPlan


class Planner:
    """b.1 with hysteresis h, dwell time and N confirmations; time is passed in.

    A candidate replaces the current configuration only when it differs, its CPT is below
    (1 - h) times the current one's under the same regime, the last switch is more than the
    dwell ago, and the same candidate won N consecutive evaluations.

    By default the planner applies its own switches (the current configuration is its last
    advice). A caller that observes what the tier really runs calls `follow` before each
    step instead: the current configuration is then the running one, a switch is advice that
    stands for as long as the candidate keeps winning, and the dwell counts from the last
    observed change.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        candidates: Sequence[Precision] = DEFAULT_CANDIDATES,
        current: TierConfig | None = None,
        last_switch: float | None = None,
        *,
        q_min: float | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.candidates = tuple(candidates)
        self.q_min = q_min
        self._model = CostModel.from_settings(self.settings)
        self._current = current
        self._last_switch = last_switch
        self._pending: TierConfig | None = None
        self._pending_count = 0
        self._following = False

    @property
    def current(self) -> TierConfig | None:
        return self._current

    @property
    def last_switch(self) -> float | None:
        return self._last_switch

    def reconfigure(self, settings: Settings) -> None:
        """New settings (a reload); the current configuration and its dwell carry over,
        confirmations counted under the old costs do not."""
        self.settings = settings
        self._model = CostModel.from_settings(settings)
        self._reset_pending()

    def follow(self, running: TierConfig, now: float) -> None:
        """The configuration the tier is observed running with at `now`."""
        if not self._following:
            # Deployed before we watched: no dwell to honour, and no confirmations counted
            # against what the planner assumed before it saw the tier.
            self._last_switch = None
            self._reset_pending()
        elif running != self._current:
            self._last_switch = now  # the operator applied a change
            self._reset_pending()
        self._following = True
        self._current = running

    def step(self, now: float, regime: Regime) -> PlannerStep:
        """Evaluate once (the live observer calls it every `observer.plan_interval_s` with the
        regime over `observer.window_s`)."""
        plan = plan_tier(regime, self.settings, self.candidates, self._current, q_min=self.q_min)
        if self._current is None:
            self._switch(plan.config, now)
            return self._record(
                now, plan, "initial", plan.expected_cpt, note="first deployment", regime=regime
            )
        cur_cpt = self._current_cpt(regime)
        action, note = self._verdict(now, plan, cur_cpt)
        if action == "switch" and not self._following:
            self._switch(plan.config, now)
        return self._record(now, plan, action, cur_cpt, note=note, regime=regime)

    def _current_cpt(self, regime: Regime) -> float:
        """CPT of the current configuration; infinite when its weights do not fit (_verdict
        then switches away from it at once)."""
        cur = self._current
        assert cur is not None
        if not self._model.fits(cur.precision):
            return math.inf
        return self._model.cpt(
            regime.concurrency,
            regime.rho,
            regime.r,
            cur.precision,
            cur.speculative,
            cur.prefix_caching,
            l_in=regime.l_in,
            l_out=regime.l_out,
        )

    def _verdict(self, now: float, plan: TierPlan, cur_cpt: float) -> tuple[Action, str]:
        pol = self.settings.policy
        cand, cur = plan.config, self._current
        assert cur is not None
        change = f"{cur.describe()} -> {cand.describe()}"
        if cand == cur:
            self._reset_pending()
            return "hold", "current configuration is the plan"
        floor = self.settings.cost.q_min if self.q_min is None else self.q_min
        if not _feasible(self.settings, self._model, [cur.precision], floor)[0]:
            # Quality floor and hardware are constraints, not costs: no hysteresis for them.
            self._reset_pending()
            return "switch", f"{cur.precision} is not feasible here: switch {change}"
        standing = self._pending == cand and self._pending_count >= pol.confirmations
        if self._following and standing:
            # Confirmed advice stands while it stays the plan: hysteresis guards the move to
            # a candidate, not each evaluation after it (a gain dipping under h would drop it).
            return "switch", f"switch {change} (confirmed, not applied)"
        held = self._held_by(now, plan.expected_cpt, cur_cpt)
        if held is not None:
            self._reset_pending()
            return "hold", held
        self._pending_count = self._pending_count + 1 if self._pending == cand else 1
        self._pending = cand
        if self._pending_count < pol.confirmations:
            return "pending", (
                f"confirmation {self._pending_count}/{pol.confirmations} for {cand.describe()}"
            )
        # Following, a switch is advice: it stands until the tier runs it or the plan moves.
        applied = "switch {} (confirmed, not applied)" if self._following else "switched {}"
        return "switch", applied.format(change)

    def _held_by(self, now: float, cand_cpt: float, cur_cpt: float) -> str | None:
        """Why a better candidate may not move yet: hysteresis or dwell; None when it may."""
        pol = self.settings.policy
        if cand_cpt >= (1.0 - pol.hysteresis) * cur_cpt:
            gain = 100.0 * (1.0 - cand_cpt / cur_cpt)
            return f"gain {gain:.1f}% below hysteresis {100 * pol.hysteresis:.0f}%"
        if self._last_switch is not None and now - self._last_switch <= pol.dwell_s:
            waited = now - self._last_switch
            return f"dwell: {waited:.0f}s since last switch <= {pol.dwell_s:.0f}s"
        return None

    def _switch(self, cand: TierConfig, now: float) -> None:
        self._current = cand
        self._last_switch = now
        self._reset_pending()

    def _reset_pending(self) -> None:
        self._pending = None
        self._pending_count = 0

    def _record(
        self,
        now: float,
        plan: TierPlan,
        action: Action,
        current_cpt: float,
        *,
        note: str,
        regime: Regime,
    ) -> PlannerStep:
        assert self._current is not None
        advice = plan
        if plan.config != self._current and action != "switch":
            # Never infeasible here: _verdict switches away from an infeasible current.
            held = plan_tier(
                regime, self.settings, self.candidates, self._current, q_min=self.q_min, hold=True
            )
            advice = replace(held, reasons=[f"held: {note}", *held.reasons])
        return PlannerStep(
            now=now,
            plan=plan,
            action=action,
            current=self._current,
            current_cpt=current_cpt,
            pending=self._pending,
            pending_count=self._pending_count,
            note=note,
            advice=advice,
        )
