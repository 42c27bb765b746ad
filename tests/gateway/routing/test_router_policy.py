"""The difficulty router as the gateway's policy, on the shipped default model."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from gateway.config import parse_settings
from gateway.protocol import EndpointKind
from gateway.routing.factory import build_policy
from gateway.routing.router import RouterPolicy, Validation, ladder_positions, tune_on
from gateway.stats import RequestRecord
from gateway.tenants.registry import TenantRegistry
from router_models.pretest import pretest
from tests.helpers import API_KEY, MODEL, GatewayThread, Ladder, send


def test_ladder_positions() -> None:
    assert ladder_positions(("q4", "q8", "fp16"), ["nvfp4", "w4a16", "bf16"]) == (0, 1, 2)
    assert ladder_positions(("a", "b"), ["x", "y", "z"]) == (0, 0, 1)  # 0.5 rounds to even
    assert ladder_positions(("q4", "q8", "fp16"), ["cheap", "top"]) == (0, 2)
    assert ladder_positions(("nvfp4", "w4a16", "bf16"), ["nvfp4", "bf16"]) == (0, 2)  # by name
    # Only the gateway's top stands on the model's top (whose probability is 1).
    five = ["nvfp4", "w4a16", "fp8", "fp16", "bf16"]
    assert ladder_positions(("q4", "q8", "fp16"), five) == (0, 0, 1, 1, 2)
    assert ladder_positions(("q4", "fp16"), five[:4]) == (0, 0, 0, 1)
    # The same names in another order: one ladder is not cheapest first.
    with pytest.raises(ValueError, match="in another order"):
        ladder_positions(("nvfp4", "w4a16", "bf16"), ["w4a16", "nvfp4", "bf16"])


def test_a_longer_gateway_ladder_still_reaches_its_top_tier() -> None:
    """The shipped 3-tier model on 5 gateway tiers: thresholds of 1.0 send everything to the
    top tier, 0.0 everything to the cheapest."""
    tiers = [
        {"name": name, "precision": precision, "endpoints": [f"http://127.0.0.1:{9000 + i}/v1"]}
        for i, (name, precision) in enumerate(
            [
                ("nvfp4", "nvfp4"),
                ("w4a16", "w4a16"),
                ("fp8", "fp8"),
                ("fp16", "fp16"),
                ("bf16", "bf16"),
            ]
        )
    ]
    for threshold, expected in ((1.0, 4), (0.0, 0)):
        thresholds = {t["name"]: threshold for t in tiers[:-1]}
        config = parse_settings(
            {
                "model": MODEL,
                "tiers": tiers,
                "tenants": [{"name": "t", "api_keys": ["k"], "thresholds": thresholds}],
            }
        )
        policy = build_policy(config)
        tenant = TenantRegistry(config, {}).tenants["t"]
        for question in QUESTIONS:
            request = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
            assert policy.decide(request, "chat", tenant).tier == expected


def settings(ladder: Ladder, tenants: list[dict[str, Any]]) -> Any:
    data = ladder.settings().model_dump(mode="json")
    data["tenants"] = tenants
    return parse_settings(data)


QUESTIONS = [
    "hi",
    "Translate 'good morning' to French.",
    "Prove that there are infinitely many primes, then refactor this proof into a lemma.",
    "def quicksort(xs):\n    return xs\n# fix the bug and explain the complexity",
]


@pytest.mark.parametrize(("threshold", "tier"), [(0.0, "nvfp4"), (1.0, "bf16")])
def test_extreme_thresholds_through_the_gateway(
    ladder: Ladder, threshold: float, tier: str
) -> None:
    config = settings(
        ladder,
        [
            {
                "name": "t",
                "api_keys": [API_KEY],
                "thresholds": {"nvfp4": threshold, "w4a16": threshold},
            }
        ],
    )
    with GatewayThread(config, policy_factory=build_policy) as gw:
        for question in QUESTIONS:
            reply = send(
                "POST",
                f"{gw.url}/v1/chat/completions",
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": 4,
                },
            )
            assert reply.status == 200
            assert reply.headers["x-tiergate-tier"] == tier
            p = float(reply.headers["x-tiergate-p"])
            assert 0.0 <= p <= 1.0
            if tier == "bf16":
                assert p == 1.0  # the top tier is the reference under the relative label


def test_decision_is_monotone_in_the_threshold(ladder: Ladder) -> None:
    config = settings(ladder, [{"name": "t", "api_keys": ["k"]}])
    policy = build_policy(config)
    assert isinstance(policy, RouterPolicy)
    tenant = TenantRegistry(config, {}).tenants["t"]
    request = {"model": MODEL, "messages": [{"role": "user", "content": QUESTIONS[2]}]}
    decision = policy.decide(request, "chat", tenant)
    assert decision.reason == "router" and decision.probabilities is not None
    probabilities = decision.probabilities
    assert list(probabilities) == sorted(probabilities) and probabilities[-1] == 1.0
    tiers = []
    for threshold in (0.0, 0.5, 0.9, 0.99, 1.0):
        policy.routing["t"] = type(policy.routing["t"])((threshold, threshold), "explicit")
        tiers.append(policy.decide(request, "chat", tenant).tier)
    assert tiers == sorted(tiers)  # a stricter threshold never picks a cheaper tier


def test_restricted_tenant_stays_on_its_tiers(ladder: Ladder) -> None:
    config = settings(
        ladder,
        [
            {
                "name": "t",
                "api_keys": ["k"],
                "allowed_tiers": ["w4a16", "bf16"],
                "thresholds": {"nvfp4": 0.0, "w4a16": 1.0},
            }
        ],
    )
    policy = build_policy(config)
    tenant = TenantRegistry(config, {}).tenants["t"]
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert policy.decide(request, "chat", tenant).tier == 2  # nvfp4 is not allowed; w4a16 needs 1.0


def test_alpha_tenant_is_tuned_and_never_worse_than_uniform(ladder: Ladder) -> None:
    config = settings(ladder, [{"name": "floor", "api_keys": ["k"], "alpha": 0.97}])
    policy = build_policy(config)
    assert isinstance(policy, RouterPolicy)
    routing = policy.routing["floor"]
    assert routing.source == "alpha" and routing.routing_pays is not None
    assert routing.uniform_floor_tier is not None
    if not routing.routing_pays:
        # The honest fallback: thresholds equivalent to the cheapest uniform tier meeting alpha.
        floor = routing.uniform_floor_tier
        tenant = TenantRegistry(config, {}).tenants["floor"]
        for question in QUESTIONS:
            request = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
            assert policy.decide(request, "chat", tenant).tier == floor


def test_alpha_exports_routing_pays_and_the_floor_baseline(ladder: Ladder) -> None:
    config = settings(ladder, [{"name": "floor", "api_keys": [API_KEY], "alpha": 0.97}])
    with GatewayThread(config, policy_factory=build_policy) as gw:
        routing = gw.app.runtime.policy.routing["floor"]  # type: ignore[attr-defined]
        assert gw.metric("tiergate_routing_pays", {"tenant": "floor"}) == float(
            routing.routing_pays
        )
        floor_name = config.tiers[routing.uniform_floor_tier].name
        assert gw.app.metrics.uniform_floor_tier["floor"] == floor_name
        reply = send(
            "POST",
            f"{gw.url}/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert reply.status == 200
        served = reply.headers["x-tiergate-tier"]
        gw.metric_at_least(
            "tiergate_requests_total",
            {"tenant": "floor", "tier": served, "endpoint": "chat", "status": "200"},
            1,
        )
        probability = {"tenant": "floor", "tier": served}  # per tenant, for the dashboards
        assert gw.metric("tiergate_routing_probability_count", probability) == 1
        saved = gw.metric(
            "tiergate_estimated_savings_total", {"tenant": "floor", "baseline": "uniform_floor"}
        )
        over = gw.metric(
            "tiergate_estimated_overspend_total", {"tenant": "floor", "baseline": "uniform_floor"}
        )
        cost = {tier.name: tier.relative_cost for tier in config.tiers}
        floor_cost = config.tiers[routing.uniform_floor_tier].relative_cost
        if cost[served] < floor_cost:
            assert saved > 0 and over == 0
        elif cost[served] > floor_cost:
            assert over > 0 and saved == 0
        else:
            assert saved == 0 and over == 0


def test_pinned_requests_cost_but_are_not_routing_savings(ladder: Ladder) -> None:
    config = settings(ladder, [{"name": "floor", "api_keys": [API_KEY], "alpha": 0.97}])
    with GatewayThread(config, policy_factory=build_policy) as gw:
        cheapest, top = config.tiers[0].name, config.tiers[-1].name

        def totals() -> tuple[float, ...]:
            return tuple(
                gw.metric(f"tiergate_estimated_{kind}_total", {"tenant": "floor", "baseline": b})
                for kind in ("savings", "overspend")
                for b in ("uniform_floor", "top_tier")
            )

        before = totals()
        for tier in (cheapest, top):  # below and above any floor: both would count if routed
            reply = send(
                "POST",
                f"{gw.url}/v1/chat/completions",
                {"model": f"{MODEL}@{tier}", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert reply.status == 200 and reply.headers["x-tiergate-tier"] == tier
            gw.metric_at_least(
                "tiergate_estimated_cost_total", {"tenant": "floor", "tier": tier}, 1
            )
        assert totals() == before  # the client chose: routing saved and overspent nothing


def test_a_reload_that_drops_alpha_drops_the_routing_verdict(ladder: Ladder) -> None:
    with_alpha = settings(ladder, [{"name": "floor", "api_keys": [API_KEY], "alpha": 0.97}])
    explicit = settings(
        ladder, [{"name": "floor", "api_keys": [API_KEY], "thresholds": {"nvfp4": 0.9}}]
    )
    with GatewayThread(with_alpha, policy_factory=build_policy) as gw:
        verdict = gw.app.registry.get_sample_value("tiergate_routing_pays", {"tenant": "floor"})
        assert verdict in (0.0, 1.0)
        gw.app.reload(explicit)
        assert (
            gw.app.registry.get_sample_value("tiergate_routing_pays", {"tenant": "floor"}) is None
        )
        assert "floor" not in gw.app.metrics.uniform_floor_tier


def test_admin_tenants_shows_each_tenants_routing(ladder: Ladder) -> None:
    data = ladder.settings().model_dump(mode="json")
    data["tenants"] = [
        {"name": "floor", "api_keys": ["k1"], "alpha": 0.97},
        {"name": "fixed", "api_keys": ["k2"], "thresholds": {"nvfp4": 0.9, "w4a16": 0.5}},
    ]
    data["admin"] = {"token": "adm"}
    config = parse_settings(data)
    with GatewayThread(config, policy_factory=build_policy) as gw:
        reply = send("GET", f"{gw.url}/admin/tenants", None, key="adm")
        assert reply.status == 200
        view = reply.json()
        routing = gw.app.runtime.policy.routing["floor"]  # type: ignore[attr-defined]
        assert view["floor"]["routing"]["source"] == "alpha"
        assert view["floor"]["routing"]["routing_pays"] == routing.routing_pays
        assert view["floor"]["routing"]["uniform_floor_tier"] == (
            config.tiers[routing.uniform_floor_tier].name
        )
        assert view["fixed"]["routing"] == {
            "thresholds": {"nvfp4": 0.9, "w4a16": 0.5},
            "source": "explicit",
            "routing_pays": None,
            "uniform_floor_tier": None,
            "pretest": None,
            "recalibrated": False,
        }
        reported = view["floor"]["routing"]["pretest"]
        assert reported["routing_pays"] == routing.pretest_pays
        assert reported["message"].startswith("routing")


def test_a_restricted_tenants_floor_and_baseline_are_tiers_it_may_use(ladder: Ladder) -> None:
    """alpha is tuned on the tenant's own tiers: its uniform baseline (what savings are
    counted against) is never a tier it may not use."""
    config = settings(
        ladder,
        [{"name": "c", "api_keys": ["k"], "allowed_tiers": ["w4a16", "bf16"], "alpha": 0.97}],
    )
    policy = build_policy(config)
    assert isinstance(policy, RouterPolicy)
    routing = policy.routing["c"]
    assert routing.source == "alpha" and routing.uniform_floor_tier in (1, 2)
    assert routing.thresholds[0] == 1.0  # nvfp4: not its tier
    only = settings(
        ladder, [{"name": "c", "api_keys": ["k"], "allowed_tiers": ["w4a16"], "alpha": 0.97}]
    )
    alone = build_policy(only)
    assert isinstance(alone, RouterPolicy)
    assert alone.routing["c"].uniform_floor_tier == 1 and alone.routing["c"].routing_pays is False


def test_top_tier_savings_count_against_the_best_tier_the_tenant_may_use(ladder: Ladder) -> None:
    config = settings(
        ladder,
        [
            {
                "name": "c",
                "api_keys": [API_KEY],
                "allowed_tiers": ["nvfp4", "w4a16"],
                "thresholds": {"nvfp4": 0.0},
            }
        ],
    )
    cost = {tier.name: tier.relative_cost for tier in config.tiers}
    with GatewayThread(config, policy_factory=build_policy) as gw:
        reply = send(
            "POST",
            f"{gw.url}/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert reply.status == 200 and reply.headers["x-tiergate-tier"] == "nvfp4"
        usage = reply.json()["usage"]
        tokens = usage["prompt_tokens"] + usage["completion_tokens"]
        spent = gw.settled_metric(
            "tiergate_estimated_cost_total",
            {"tenant": "c", "tier": "nvfp4"},
            tokens * cost["nvfp4"],
        )
        assert spent == tokens * cost["nvfp4"]
        saved = gw.metric(
            "tiergate_estimated_savings_total", {"tenant": "c", "baseline": "top_tier"}
        )
        assert saved == pytest.approx(tokens * (cost["w4a16"] - cost["nvfp4"]))


def test_alpha_tenants_carry_paper_as_pretest_beside_tunes_verdict() -> None:
    """On two tiers at alpha 0.99 the shipped validation set lets `tune` route (its paired
    check passes), while the two-type pre-test finds no saving it can trust: both verdicts
    are kept, so the pre-test the docs promise is the one reported."""
    tiers = [
        {"name": "nvfp4", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:9001/v1"]},
        {"name": "bf16", "precision": "bf16", "endpoints": ["http://127.0.0.1:9002/v1"]},
    ]
    tenants = [{"name": "t", "api_keys": ["k"], "alpha": 0.99}]
    config = parse_settings({"model": MODEL, "tiers": tiers, "tenants": tenants})
    policy = build_policy(config)
    assert isinstance(policy, RouterPolicy) and policy.validation is not None
    routing = policy.routing["t"]
    columns = list(policy.positions)
    expected = pretest(
        policy.validation.proba[:, columns],
        policy.validation.correct[:, columns],
        [tier.relative_cost for tier in config.tiers],
    )
    assert routing.routing_pays is True
    assert routing.pretest_pays is expected.routing_pays is False
    assert routing.pretest == expected.message


def test_a_reload_of_the_same_model_reuses_its_pre_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload runs on the event loop: the pre-test (a bootstrap, about a second on 14,000
    rows) is computed once per model, columns and costs, not again for every reload or
    tenant with the same tiers."""
    import router_models.pretest

    calls: list[int] = []
    real = router_models.pretest.pretest

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(router_models.pretest, "pretest", counted)
    monkeypatch.setattr("gateway.routing.router._PRETESTS", {})
    tiers = [
        {"name": "nvfp4", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:9001/v1"]},
        {"name": "bf16", "precision": "bf16", "endpoints": ["http://127.0.0.1:9002/v1"]},
    ]
    tenants = [{"name": n, "api_keys": [n], "alpha": a} for n, a in (("a", 0.9), ("b", 0.99))]
    config = parse_settings({"model": MODEL, "tiers": tiers, "tenants": tenants})
    first = build_policy(config)
    again = build_policy(config)  # a reload
    assert isinstance(first, RouterPolicy) and isinstance(again, RouterPolicy)
    assert len(calls) == 1
    assert again.routing["b"].pretest == first.routing["b"].pretest != ""


def _router_policy(thresholds: dict[str, float]) -> tuple[RouterPolicy, Any]:
    """The shipped model on the three-tier ladder, without upstreams (decide is pure)."""
    tiers = [
        {"name": name, "precision": name, "endpoints": [f"http://127.0.0.1:{9000 + i}/v1"]}
        for i, name in enumerate(("nvfp4", "w4a16", "bf16"))
    ]
    config = parse_settings(
        {
            "model": MODEL,
            "tiers": tiers,
            "tenants": [{"name": "t", "api_keys": ["k"], "thresholds": thresholds}],
        }
    )
    policy = build_policy(config)
    assert isinstance(policy, RouterPolicy)
    return policy, TenantRegistry(config, {}).tenants["t"]


def test_a_probability_equal_to_its_threshold_clears_it() -> None:
    """Thresholds tuned on validation are probabilities the router produced (and 0.0 is
    'every request'): a tier whose probability equals its threshold is accepted, as in
    router_models.policy.decide."""
    policy, tenant = _router_policy({"nvfp4": 1.0, "w4a16": 1.0})
    request = {"model": MODEL, "messages": [{"role": "user", "content": QUESTIONS[1]}]}
    probabilities = policy.decide(request, "chat", tenant).probabilities
    assert probabilities is not None and 0.0 < probabilities[0] < 1.0
    policy.routing["t"] = type(policy.routing["t"])((probabilities[0], 1.0), "explicit")
    assert policy.decide(request, "chat", tenant).tier == 0
    policy.routing["t"] = type(policy.routing["t"])((1.0, probabilities[1]), "explicit")
    assert policy.decide(request, "chat", tenant).tier == 1


def test_the_decision_reports_the_chosen_tiers_probability() -> None:
    """x-tiergate-p and the probability histogram carry P(chosen tier adequate), not the
    top tier's (which is always 1)."""
    policy, tenant = _router_policy({"nvfp4": 0.0, "w4a16": 0.0})
    for question in QUESTIONS:
        request = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
        decision = policy.decide(request, "chat", tenant)
        assert decision.tier == 0 and decision.probabilities is not None
        assert decision.probability == decision.probabilities[0] < 1.0


def test_a_messages_field_on_other_endpoints_does_not_decide_the_tier() -> None:
    """vLLM ignores `messages` on completions and responses; the router read any body with
    one as a chat, so `"messages": []` made a hard prompt score as an empty request."""
    policy, tenant = _router_policy({"nvfp4": 0.0, "w4a16": 0.0})
    kinds: tuple[tuple[EndpointKind, str], ...] = (
        ("completions", "prompt"),
        ("responses", "input"),
    )
    for kind, field in kinds:
        for question in QUESTIONS:
            request = {"model": MODEL, field: question}
            decision = policy.decide(request, kind, tenant)
            for extra in ([], [{"role": "user", "content": "hi"}]):
                assert policy.decide({**request, "messages": extra}, kind, tenant) == decision


def test_a_tier_missing_from_explicit_thresholds_gets_the_default_threshold() -> None:
    policy, _ = _router_policy({"nvfp4": 0.3})
    assert policy.routing["t"].thresholds == (0.3, policy.default_threshold)
    assert policy.default_threshold == 0.8  # the configured default, not a guess


def test_a_recalibrated_model_is_read_on_its_own_ladder() -> None:
    """Shadow recalibration fits calibrators on the gateway's own tiers: the tenant's new
    model is read by name, not at the shipped 3-tier model's positions."""
    import numpy as np

    from router_models.isotonic_maps import IsotonicMaps

    tiers = [
        {"name": name, "precision": name, "endpoints": [f"http://127.0.0.1:{9000 + i}/v1"]}
        for i, name in enumerate(("nvfp4", "bf16"))
    ]
    config = parse_settings(
        {
            "model": MODEL,
            "tiers": tiers,
            "tenants": [{"name": "t", "api_keys": ["k"], "thresholds": {"nvfp4": 0.6}}],
        }
    )
    policy = build_policy(config)
    assert isinstance(policy, RouterPolicy) and policy.positions == (0, 2)
    flat = IsotonicMaps.from_thresholds([np.array([0.0])], [np.array([0.7])])
    policy.set_tenant_model("t", policy.model.with_calibration(flat, tiers=("nvfp4", "bf16")))
    tenant = TenantRegistry(config, {}).tenants["t"]
    request = {"model": MODEL, "messages": [{"role": "user", "content": QUESTIONS[2]}]}
    decision = policy.decide(request, "chat", tenant)
    assert decision.probabilities == (0.7, 1.0)
    assert decision.tier == 0 and decision.probability == 0.7


def test_a_tenant_without_the_top_tier_falls_back_to_its_own_best_tier() -> None:
    """No allowed tier clears its threshold: the request goes to the best tier the tenant
    may use (w4a16), never to the gateway's top tier it is not allowed."""
    tiers = [
        {"name": name, "precision": name, "endpoints": [f"http://127.0.0.1:{9000 + i}/v1"]}
        for i, name in enumerate(("nvfp4", "w4a16", "bf16"))
    ]
    tenant = {
        "name": "t",
        "api_keys": ["k"],
        "allowed_tiers": ["nvfp4", "w4a16"],
        "thresholds": {"nvfp4": 1.0, "w4a16": 1.0},
    }
    config = parse_settings({"model": MODEL, "tiers": tiers, "tenants": [tenant]})
    policy = build_policy(config)
    restricted = TenantRegistry(config, {}).tenants["t"]
    for question in QUESTIONS:
        request = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
        assert policy.decide(request, "chat", restricted).tier == 1


def test_a_reload_with_new_tier_costs_recomputes_the_pre_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kept pre-test is keyed by the costs too: a reload that reprices a tier must not
    report the verdict computed at the old prices."""
    monkeypatch.setattr("gateway.routing.router._PRETESTS", {})
    tenants = [{"name": "t", "api_keys": ["k"], "alpha": 0.99}]
    verdicts = []
    for cheap_cost in (0.25, 0.95):
        tiers = [
            {
                "name": "nvfp4",
                "precision": "nvfp4",
                "cost": cheap_cost,
                "endpoints": ["http://127.0.0.1:9001/v1"],
            },
            {"name": "bf16", "precision": "bf16", "endpoints": ["http://127.0.0.1:9002/v1"]},
        ]
        config = parse_settings({"model": MODEL, "tiers": tiers, "tenants": tenants})
        policy = build_policy(config)
        assert isinstance(policy, RouterPolicy) and policy.validation is not None
        columns = list(policy.positions)
        expected = pretest(
            policy.validation.proba[:, columns],
            policy.validation.correct[:, columns],
            [tier.relative_cost for tier in config.tiers],
        )
        assert policy.routing["t"].pretest == expected.message
        verdicts.append(expected.message)
    assert verdicts[0] != verdicts[1]


def test_the_kept_pre_tests_are_bounded_and_the_oldest_goes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each reload with new costs keys a new pre-test: the cache stays at its bound,
    dropping the oldest, and a kept key is not computed again."""
    from gateway.routing import router

    kept: dict[tuple[object, ...], Any] = {}
    monkeypatch.setattr(router, "_PRETESTS", kept)
    computed: list[int] = []
    kept_pretest: Any = router._kept_pretest  # stand-in verdicts: strings

    def compute(i: int) -> Any:
        computed.append(i)
        return f"pre-test {i}"

    for i in range(router._MAX_PRETESTS + 3):
        assert kept_pretest((i,), partial(compute, i)) == f"pre-test {i}"
    assert len(kept) == router._MAX_PRETESTS
    assert (0,) not in kept and (2,) not in kept and (3,) in kept
    assert kept_pretest((3,), partial(compute, -1)) == "pre-test 3"
    assert -1 not in computed


def test_alpha_tunes_on_the_validation_rows_that_score_every_tier() -> None:
    """A model trained with --cv on shadow labels carries a validation set in which each row
    scores one cheaper tier (the others NaN): `tune` raised on the NaN and the gateway
    refused to start. Rows that score every tier are tuned on; with none, the tenant gets the
    default threshold, as for a model without a validation set."""
    config = parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": name, "precision": name, "endpoints": [f"http://127.0.0.1:{port}/v1"]}
                for name, port in (("nvfp4", 9001), ("w4a16", 9002), ("bf16", 9003))
            ],
            "tenants": [{"name": "t", "api_keys": ["k"], "alpha": 0.97}],
        }
    )
    shipped = build_policy(config)
    assert isinstance(shipped, RouterPolicy) and shipped.validation is not None
    proba, correct = shipped.validation.proba, shipped.validation.correct.copy()
    correct[1::2, 1] = float("nan")  # every other row lost its middle tier's label
    half = RouterPolicy(shipped.model, config, Validation(proba, correct))
    expected = tune_on(proba[::2], correct[::2], 0.97, config, shipped.positions)
    assert half.routing["t"] == expected and expected.source == "alpha"
    correct[:, 1] = float("nan")  # shadow labels: no row scores every tier
    none = RouterPolicy(shipped.model, config, Validation(proba, correct))
    assert none.routing["t"].source == "default"
    assert none.routing["t"].thresholds == (1.0, 0.8)  # nvfp4 costs what w4a16 does


def default_ladder(*tenants: dict[str, Any]) -> Any:
    """nvfp4, w4a16 and bf16 at their default costs (0.25, 0.25, 1.0), nobody listening."""
    return parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {"name": n, "precision": n, "endpoints": ["http://127.0.0.1:9/v1"]}
                for n in ("nvfp4", "w4a16", "bf16")
            ],
            "tenants": list(tenants),
        }
    )


def test_default_thresholds_never_take_a_tier_the_next_one_matches_in_cost() -> None:
    """nvfp4 and w4a16 cost the same on the default ladder: a tenant on default_threshold
    was sent to nvfp4 whenever its probability cleared it, though w4a16's is at least as
    high at the same cost. Explicit thresholds stay as the operator set them, and a tenant
    that may not use w4a16 still routes to nvfp4 (its next tier up is bf16)."""
    config = default_ladder(
        {"name": "plain", "api_keys": ["a"]},
        {"name": "no-w4a16", "api_keys": ["b"], "allowed_tiers": ["nvfp4", "bf16"]},
        {"name": "explicit", "api_keys": ["c"], "thresholds": {"nvfp4": 0.5}},
    )
    assert [tier.relative_cost for tier in config.tiers] == [0.25, 0.25, 1.0]
    policy = build_policy(config)
    assert isinstance(policy, RouterPolicy)
    default = config.router.default_threshold
    assert policy.routing["plain"].thresholds == (1.0, default)
    assert policy.routing["no-w4a16"].thresholds[0] == default
    assert policy.routing["explicit"].thresholds == (0.5, default)
    tenants = TenantRegistry(config, {}).tenants
    for question in QUESTIONS:
        request = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
        assert policy.decide(request, "chat", tenants["plain"]).tier != 0


def test_a_tier_explicit_thresholds_leave_out_takes_the_equal_cost_rule() -> None:
    """`thresholds: {w4a16: 0.6}` left nvfp4 at default_threshold, and nvfp4, tried first,
    took every request the shipped model scores above 0.8: all of them, though w4a16 costs
    the same. A threshold the operator wrote stays as written."""
    config = default_ladder(
        {"name": "w", "api_keys": ["a"], "thresholds": {"w4a16": 0.6}},
        {"name": "both", "api_keys": ["b"], "thresholds": {"nvfp4": 0.7, "w4a16": 0.6}},
    )
    policy = build_policy(config)
    assert isinstance(policy, RouterPolicy)
    assert policy.routing["w"].thresholds == (1.0, 0.6)
    assert policy.routing["both"].thresholds == (0.7, 0.6)
    tenant = TenantRegistry(config, {}).tenants["w"]
    for question in QUESTIONS:
        request = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
        assert policy.decide(request, "chat", tenant).tier != 0


def test_a_request_routed_before_a_reload_is_credited_against_the_floor_it_was_routed_under(
    ladder: Ladder,
) -> None:
    """At costs 0.1 / 0.3 / 1.0 the shipped model's floor is w4a16 at alpha 0.999 and nvfp4
    at 0.97. A request routed to w4a16 under 0.999 (its floor: no saving, no overspend) that
    finishes after a reload to 0.97 was credited against nvfp4, an overspend routing never
    made (in flight across the reload, or only waiting for the next flush)."""
    data = ladder.settings().model_dump(mode="json")
    for tier, cost in zip(data["tiers"], (0.1, 0.3, 1.0), strict=True):
        tier["cost"] = cost

    def with_alpha(alpha: float) -> Any:
        return parse_settings(
            {**data, "tenants": [{"name": "t", "api_keys": [API_KEY], "alpha": alpha}]}
        )

    with GatewayThread(with_alpha(0.999), policy_factory=build_policy) as gw:
        assert gw.app.metrics.uniform_floor_tier["t"] == "w4a16"
        record = RequestRecord(
            tenant="t",
            kind="chat",
            ladder=gw.app.runtime.hot_routes["/v1/chat/completions"].ladder,
            status=200,
            decided_tier=1,
            served_tier=1,
            reason="router",
            prompt_tokens=6,
            completion_tokens=4,
        )
        gw.app.reload(with_alpha(0.97))
        assert gw.app.metrics.uniform_floor_tier["t"] == "nvfp4"
        gw.app.metrics.record(record)
        floor = {"tenant": "t", "baseline": "uniform_floor"}
        assert gw.metric("tiergate_estimated_overspend_total", floor) == 0
        assert gw.metric("tiergate_estimated_baseline_cost_total", floor) == pytest.approx(3.0)
