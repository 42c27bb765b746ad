"""The six tiergate dashboards: what each panel asks Prometheus.

Metric names are the gateway's (`gateway/metrics.py`: counters end in `_total`, histograms in
`_bucket/_sum/_count`) and vLLM's (COST_MODEL.md c.2). vLLM series carry a `tier` target
label, set by the scrape configuration (compose) or the PodMonitor (Kubernetes).
"""

from __future__ import annotations

from typing import Final

from deploy.rendering.dashboard_model import TENANT, TIER, WINDOW, Dashboard, Panel, Query, Row

W = WINDOW


def _rate(metric: str, matchers: str = "") -> str:
    return f"rate({metric}{{{matchers}}}[{W}])"


def _sum(by: str, inner: str) -> str:
    return f"sum by ({by}) ({inner})"


def _quantile(q: float, metric: str, by: str, matchers: str) -> Query:
    expr = f"histogram_quantile({q}, {_sum(by + ', le', _rate(metric + '_bucket', matchers))})"
    legend = " ".join("{{" + label.strip() + "}}" for label in by.split(","))
    return Query(expr, f"{legend} p{round(q * 100)}")


def _ratio(numerator: str, denominator: str) -> str:
    return f"{numerator}\n/\n{denominator}"


def _net_savings(baseline: str, fn: str = "rate", window: str = W) -> str:
    # savings - overspend, where either counter may not exist yet for a tenant.
    def total(metric: str) -> str:
        return f'sum by (tenant) ({fn}({metric}{{{TENANT}, baseline="{baseline}"}}[{window}]))'

    saved, over = (
        total("tiergate_estimated_savings_total"),
        total("tiergate_estimated_overspend_total"),
    )
    return f"({saved} or 0 * {over})\n-\n({over} or 0 * {saved})"


def _net_savings_share(baseline: str) -> str:
    # Of the baseline's cost over the same (routed) requests: the cost counter also holds
    # pinned requests, which count in neither savings nor overspend.
    baseline_cost = _sum(
        "tenant",
        _rate("tiergate_estimated_baseline_cost_total", f'{TENANT}, baseline="{baseline}"'),
    )
    return _ratio(f"({_net_savings(baseline)})", baseline_cost)


_SERVED = f'{TENANT}, {TIER}, tier!="_none"'
# Answers a tier served: a request whose client left while an engine had it (499) or that
# an engine refused (400, 413, 422) carries that tier too, but no tier answered it.
_ANSWERED = f'{_SERVED}, status=~"2.."'
# Attempt outcomes that say nothing of the tier's health (as the circuit breaker reads them,
# but for saturated, which counts: it sends the ladder above plan).
NO_VERDICT = "client_gone|too_large|deadline"
# Means over the last hour of shadow labels that had a prediction, from sums that add up over
# workers and replicas (the window gauges are one process's view each).
_SCORED = _sum(
    "tenant, tier", f"increase(tiergate_shadow_scored_labels_total{{{TENANT}, {TIER}}}[1h])"
)
_AGREED = _sum(
    "tenant, tier",
    f'increase(tiergate_shadow_scored_labels_total{{{TENANT}, {TIER}, adequate="true"}}[1h])',
)
_PREDICTED = _ratio(
    _sum(
        "tenant, tier",
        f"increase(tiergate_shadow_predicted_adequacy_total{{{TENANT}, {TIER}}}[1h])",
    ),
    _SCORED,
)
_OBSERVED = _ratio(f"({_AGREED} or 0 * {_SCORED})", _SCORED)

TRAFFIC: Final = Dashboard(
    uid="tiergate-traffic",
    title="tiergate / Traffic and tier mix",
    description="Which tier serves each tenant's traffic, why, and how often it fails.",
    items=(
        Row("Traffic"),
        Panel(
            "Requests per second by serving tier",
            "Requests by the tier that served them, or began to: a 499 whose client left "
            "while an engine had it, or an engine's refusal (400, 413, 422), is that tier's; "
            "_none is refused, failed or left before any tier had it.",
            (
                Query(
                    _sum("tier", _rate("tiergate_requests_total", f"{TENANT}, {TIER}")), "{{tier}}"
                ),
            ),
            unit="reqps",
            stack=True,
        ),
        Panel(
            "Requests per second by tenant and status",
            "HTTP status as the client saw it.",
            (
                Query(
                    _sum("tenant, status", _rate("tiergate_requests_total", TENANT)),
                    "{{tenant}} {{status}}",
                ),
            ),
            unit="reqps",
        ),
        Row("Tier mix"),
        Panel(
            "Tier mix: $tenant",
            "Share of the tenant's answered requests (2xx) per serving tier, one panel per "
            "tenant; requests whose client left (499) or an engine refused are left out.",
            (
                Query(
                    _ratio(
                        _sum("tier", _rate("tiergate_requests_total", _ANSWERED)),
                        "ignoring (tier) group_left\n"
                        + f"sum ({_rate('tiergate_requests_total', _ANSWERED)})",
                    ),
                    "{{tier}}",
                ),
            ),
            unit="percentunit",
            stack=True,
            min=0,
            max=1,
            width=8,
            repeat="tenant",
        ),
        Panel(
            "Tier mix per tenant (share of requests)",
            "For each tenant, the share of its answered requests (2xx) that each tier "
            "served; requests whose client left (499) or an engine refused are left out.",
            (
                Query(
                    _ratio(
                        _sum("tenant, tier", _rate("tiergate_requests_total", _ANSWERED)),
                        "on (tenant) group_left\n"
                        + _sum("tenant", _rate("tiergate_requests_total", _ANSWERED)),
                    ),
                    "{{tenant}} → {{tier}}",
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "Tier mix per tenant (share of completion tokens)",
            "Tokens weigh long answers: the share of each tenant's completion tokens per tier.",
            (
                Query(
                    _ratio(
                        _sum("tenant, tier", _rate("tiergate_completion_tokens_total", _SERVED)),
                        "on (tenant) group_left\n"
                        + _sum("tenant", _rate("tiergate_completion_tokens_total", _SERVED)),
                    ),
                    "{{tenant}} → {{tier}}",
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "Tokens per second by tier",
            "Prompt and completion tokens from upstream usage (streams included).",
            (
                Query(
                    _sum("tier", _rate("tiergate_prompt_tokens_total", f"{TENANT}, {TIER}")),
                    "{{tier}} prompt",
                ),
                Query(
                    _sum("tier", _rate("tiergate_completion_tokens_total", f"{TENANT}, {TIER}")),
                    "{{tier}} completion",
                ),
            ),
            unit="short",
        ),
        Panel(
            "Routing decisions by decided tier and reason",
            "What routing chose before any failover: router, pinned, top-tier, ...",
            (
                Query(
                    _sum("tier, reason", _rate("tiergate_routing_decisions_total", TENANT)),
                    "{{tier}} {{reason}}",
                ),
            ),
            unit="reqps",
            stack=True,
        ),
        Panel(
            "Chosen-tier probability",
            "Distribution of the calibrated P(adequate) of the tier routing chose.",
            (
                Query(
                    _sum("le", _rate("tiergate_routing_probability_bucket", f"{TENANT}, {TIER}")),
                    "{{le}}",
                ),
            ),
            kind="heatmap",
        ),
        Panel(
            "Escalations (served by another tier than decided)",
            "Failover up the ladder (or a degrade under saturation), by from, to and reason.",
            (
                Query(
                    _sum(
                        "from_tier, to_tier, reason",
                        _rate("tiergate_escalations_total", TENANT),
                    ),
                    "{{from_tier}} → {{to_tier}} ({{reason}})",
                ),
            ),
            unit="reqps",
        ),
        Row("Errors"),
        Panel(
            "Server error ratio by tenant",
            "Share of each tenant's requests answered 5xx (after every failover).",
            (
                Query(
                    _ratio(
                        _sum(
                            "tenant", _rate("tiergate_requests_total", f'{TENANT}, status=~"5.."')
                        ),
                        _sum("tenant", _rate("tiergate_requests_total", TENANT)),
                    ),
                    "{{tenant}}",
                ),
            ),
            unit="percentunit",
            min=0,
        ),
        Panel(
            "Client errors by status",
            "4xx answers: bad requests, unknown models or tiers, missing keys, rate limits; "
            "499 is a client that left before its answer ended.",
            (
                Query(
                    _sum("status", _rate("tiergate_requests_total", f'{TENANT}, status=~"4.."')),
                    "{{status}}",
                ),
            ),
            unit="reqps",
        ),
        Panel(
            "Streams cut after the first byte, and client disconnects",
            "A stream that fails mid-way ends with an error event; a client that leaves "
            "aborts its upstream request.",
            (
                Query(
                    _sum("tier", _rate("tiergate_stream_errors_total", f"{TENANT}, {TIER}")),
                    "{{tier}} stream errors",
                ),
                Query(
                    _sum("tier", _rate("tiergate_client_disconnects_total", f"{TENANT}, {TIER}")),
                    "{{tier}} client disconnects",
                ),
            ),
            unit="reqps",
            width=24,
        ),
    ),
)

SAVINGS: Final = Dashboard(
    uid="tiergate-savings",
    title="tiergate / Savings",
    description="Estimated cost; what routing itself saved, against the cheapest uniform tier "
    "that meets the tenant's accuracy floor; and the cost below serving everything on the top "
    "tier, which a cheaper precision alone can give.",
    items=(
        Row("Savings"),
        Panel(
            "Saved by routing: net, against the uniform floor (share of its cost)",
            "(savings - overspend) / what the cheapest uniform tier meeting the tenant's floor "
            "would have cost for the same routed requests (pinned ones are left out). Below "
            "zero, routing costs more than that uniform tier.",
            (Query(_net_savings_share("uniform_floor"), "{{tenant}}"),),
            unit="percentunit",
        ),
        Panel(
            "Below the all-top-tier bill (precision and routing together)",
            "(savings - overspend) / what the best tier the tenant may use would have cost for "
            "the same routed requests (pinned ones are left out). Most of it can come from a "
            "cheaper precision alone: routing's own saving is the uniform-floor panel.",
            (Query(_net_savings_share("top_tier"), "{{tenant}}"),),
            unit="percentunit",
        ),
        Panel(
            "Saved by routing over the range (net, against the uniform floor)",
            "Savings minus overspend against the uniform-floor baseline over the time range.",
            (Query(_net_savings("uniform_floor", "increase", "$__range"), "{{tenant}}"),),
            kind="stat",
            width=8,
        ),
        Panel(
            "Below the all-top-tier bill over the range",
            "Cost (tokens x relative tier cost) not spent over the time range (precision and "
            "routing), net of overspend: shadow replays count against this baseline too.",
            (Query(_net_savings("top_tier", "increase", "$__range"), "{{tenant}}"),),
            kind="stat",
            width=8,
        ),
        Panel(
            "Routing pays (tuned on validation)",
            "1: routing beats the cheapest uniform tier on validation data; 0: the thresholds "
            "fall back to that uniform tier.",
            (Query(f"max by (tenant) (tiergate_routing_pays{{{TENANT}}})", "{{tenant}}"),),
            kind="stat",
            width=8,
            mappings=(("0", "uniform tier"), ("1", "routing pays")),
        ),
        Panel(
            "Savings and overspend rate by baseline",
            "Positive: saved; negative: spent above the baseline (requests routed above it, "
            "and the shadow replays of routed requests).",
            (
                Query(
                    _sum("tenant, baseline", _rate("tiergate_estimated_savings_total", TENANT)),
                    "{{tenant}} saved vs {{baseline}}",
                ),
                Query(
                    "-"
                    + _sum("tenant, baseline", _rate("tiergate_estimated_overspend_total", TENANT)),
                    "{{tenant}} overspent vs {{baseline}}",
                ),
            ),
        ),
        Panel(
            "Estimated cost by serving tier",
            "Tokens times the tier's relative cost (tiers[].cost; by default a 16-bit tier is "
            "1), per second; shadow replays "
            "(on the top tier, or a cheaper one when exploring; those of routed requests count "
            "as routing's overspend) on top.",
            (
                Query(
                    _sum("tier", _rate("tiergate_estimated_cost_total", f"{TENANT}, {TIER}")),
                    "{{tier}}",
                ),
                Query(_sum("", _rate("tiergate_shadow_cost_total", TENANT)), "shadow replays"),
            ),
            stack=True,
        ),
        Panel(
            "Answers without usage (in no cost or savings figure)",
            "Answers a tier began to serve whose usage never arrived (a stream cut after its "
            "first byte, a request its client left while an engine had it, stream or not): "
            "their tokens are missing from the panels "
            "above, so a large share here makes them understate.",
            (
                Query(
                    _sum("tier", _rate("tiergate_unmetered_requests_total", f"{TENANT}, {TIER}")),
                    "{{tier}}",
                ),
            ),
            unit="reqps",
        ),
    ),
)

LATENCY: Final = Dashboard(
    uid="tiergate-latency",
    title="tiergate / Latency and overhead",
    description="End-to-end latency and time to first token per tier, the gateway's own "
    "overhead, and the engines' view of the same requests.",
    items=(
        Row("Gateway"),
        Panel(
            "Request duration by tier",
            "Arrival to last byte, p50 and p95.",
            tuple(
                _quantile(q, "tiergate_request_duration_seconds", "tier", f"{TENANT}, {TIER}")
                for q in (0.5, 0.95)
            ),
            unit="s",
        ),
        Panel(
            "Time to first token by tier (streams)",
            "Arrival to the first relayed event, p50 and p95.",
            tuple(
                _quantile(q, "tiergate_time_to_first_token_seconds", "tier", f"{TENANT}, {TIER}")
                for q in (0.5, 0.95)
            ),
            unit="s",
        ),
        Panel(
            "Gateway overhead by endpoint",
            "Gateway time per request excluding the upstream wait, p50 and p99.",
            tuple(
                _quantile(q, "tiergate_gateway_overhead_seconds", "endpoint", "")
                for q in (0.5, 0.99)
            ),
            unit="s",
        ),
        Panel(
            "Mean gateway overhead by endpoint",
            "Sum over count of the overhead histogram.",
            (
                Query(
                    _ratio(
                        _sum("endpoint", _rate("tiergate_gateway_overhead_seconds_sum")),
                        _sum("endpoint", _rate("tiergate_gateway_overhead_seconds_count")),
                    ),
                    "{{endpoint}}",
                ),
            ),
            unit="s",
        ),
        Panel(
            "In flight and queued at the gateway",
            "Requests in flight per tier (summed over endpoints) and waiting for a tier slot.",
            (
                Query(_sum("tier", f"tiergate_inflight_requests{{{TIER}}}"), "{{tier}} in flight"),
                Query(_sum("tier", f"tiergate_queue_depth{{{TIER}}}"), "{{tier}} queued"),
            ),
            width=24,
        ),
        Row("Engines (vLLM)"),
        Panel(
            "Engine time to first token by tier",
            "vLLM's own TTFT, p50 and p95; the gap to the gateway's is queueing and network.",
            tuple(
                _quantile(q, "vllm:time_to_first_token_seconds", "tier", TIER) for q in (0.5, 0.95)
            ),
            unit="s",
        ),
        Panel(
            "Engine end-to-end latency by tier",
            "vLLM's request latency, p50 and p95.",
            tuple(
                _quantile(q, "vllm:e2e_request_latency_seconds", "tier", TIER) for q in (0.5, 0.95)
            ),
            unit="s",
        ),
    ),
)

CALIBRATION: Final = Dashboard(
    uid="tiergate-calibration",
    title="tiergate / Calibration",
    description="Does the router's predicted adequacy match what shadow replays on the top "
    "tier observe? Predicted against observed, calibration error, drift alarms.",
    items=(
        Row("Predicted against observed adequacy"),
        Panel(
            "Predicted and observed adequacy per tier",
            "Mean predicted P(adequate) of shadow-labelled requests, and the share the top "
            "tier agreed with, over the last hour (all workers and replicas).",
            (
                Query(_PREDICTED, "{{tenant}} {{tier}} predicted"),
                Query(_OBSERVED, "{{tenant}} {{tier}} observed"),
            ),
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "Observed minus predicted adequacy",
            "Below zero the router is over-confident for that tier.",
            (Query(f"({_OBSERVED})\n-\n({_PREDICTED})", "{{tenant}} {{tier}}"),),
            unit="percentunit",
        ),
        Panel(
            "Expected calibration error",
            "ECE of each tier's probabilities on recent shadow labels, once shadow.min_labels "
            "of them had a prediction (as for the drift alarm).",
            (
                Query(
                    f"max by (tenant, tier) (tiergate_calibration_ece{{{TENANT}, {TIER}}})",
                    "{{tenant}} {{tier}}",
                ),
            ),
            unit="percentunit",
            min=0,
        ),
        Panel(
            "Calibration drift alarm",
            "1 while observed adequacy is below predicted by more than the alarm margin.",
            (
                Query(
                    f"max by (tenant, tier) (tiergate_calibration_drift{{{TENANT}, {TIER}}})",
                    "{{tenant}} {{tier}}",
                ),
            ),
            min=0,
            max=1,
            mappings=(("0", "ok"), ("1", "drift")),
        ),
        Panel(
            "Mean routing probability by decided tier",
            "The router's own mean P(adequate) at decision time (all traffic, not only "
            "shadow-labelled requests).",
            (
                Query(
                    _ratio(
                        _sum(
                            "tier", _rate("tiergate_routing_probability_sum", f"{TENANT}, {TIER}")
                        ),
                        _sum(
                            "tier", _rate("tiergate_routing_probability_count", f"{TENANT}, {TIER}")
                        ),
                    ),
                    "{{tier}}",
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
        ),
        Row("Shadow evaluation"),
        Panel(
            "Shadow replays by outcome",
            "Replays on the top tier: labelled, skipped (saturated, budget), failed.",
            (
                Query(
                    _sum(
                        "tier, outcome",
                        _rate("tiergate_shadow_requests_total", f"{TENANT}, {TIER}"),
                    ),
                    "{{tier}} {{outcome}}",
                ),
            ),
            unit="reqps",
            stack=True,
        ),
        Panel(
            "Shadow labels by verdict",
            "Adequacy labels produced per tier.",
            (
                Query(
                    _sum(
                        "tier, adequate", _rate("tiergate_shadow_labels_total", f"{TENANT}, {TIER}")
                    ),
                    "{{tier}} adequate={{adequate}}",
                ),
            ),
            unit="reqps",
            stack=True,
        ),
        Panel(
            "Recalibrations over the range",
            "Online recalibrations swapped in, per tenant.",
            (
                Query(
                    _sum(
                        "tenant", f"increase(tiergate_recalibrations_total{{{TENANT}}}[$__range])"
                    ),
                    "{{tenant}}",
                ),
            ),
            kind="stat",
            width=24,
            height=5,
        ),
    ),
)

_ENGINE_C = (
    f"{_sum('tier', f'avg_over_time(vllm:num_requests_running{{{TIER}}}[{W}])')}\n+\n"
    f"{_sum('tier', f'avg_over_time(vllm:num_requests_waiting{{{TIER}}}[{W}])')}"
)

REGIME: Final = Dashboard(
    uid="tiergate-regime",
    title="tiergate / Regime and flags",
    description="The traffic regime per tier (concurrency C, prefix share rho, repetitiveness "
    "r) and the planner's recommended vLLM flags against the running ones.",
    variables=("tier",),
    items=(
        Row("Regime per tier"),
        Panel(
            "Concurrency C (gateway observer)",
            "Requests in flight per tier over the rolling window, summed over gateway replicas "
            "(each sees its share of the traffic): the mean exactly, p50 and p95 only roughly "
            "(a sum of the replicas' percentiles bounds the tier's neither way: at low load "
            "each replica's p95 can read 0 while the tier's is 1).",
            (
                Query(
                    # Summed, as the workers of one replica are (livesum): a maximum would
                    # show one replica's share of the tier's C.
                    f"sum by (tier, stat) (tiergate_regime_concurrency{{{TIER}}})",
                    "{{tier}} {{stat}}",
                ),
            ),
        ),
        Panel(
            "Concurrency at the engine (vLLM running + waiting)",
            "C as the engine sees it; waiting > 0 for long means the tier is past its knee.",
            (Query(_ENGINE_C, "{{tier}}"),),
        ),
        Panel(
            "Prefix share rho",
            "Observer replay (unbounded, LRU at the tier's KV capacity) and the engine's "
            "prefix-cache hit rate where prefix caching runs.",
            (
                Query(
                    f"max by (tier, source) (tiergate_regime_prefix_share{{{TIER}}})",
                    "{{tier}} {{source}}",
                ),
                Query(
                    _ratio(
                        _sum("tier", _rate("vllm:prefix_cache_hits_total", TIER)),
                        _sum("tier", _rate("vllm:prefix_cache_queries_total", TIER)),
                    ),
                    "{{tier}} engine",
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "Repetitiveness r",
            "Observer n-gram replay (i.i.d.-equivalent acceptance) and the engine's draft "
            "acceptance rate where speculation runs.",
            (
                Query(
                    f"max by (tier, source) (tiergate_regime_repetitiveness{{{TIER}}})",
                    "{{tier}} {{source}}",
                ),
                Query(
                    _ratio(
                        _sum("tier", _rate("vllm:spec_decode_num_accepted_tokens_total", TIER)),
                        _sum("tier", _rate("vllm:spec_decode_num_draft_tokens_total", TIER)),
                    ),
                    "{{tier}} engine acceptance",
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
        ),
        Panel(
            "Mean accepted length per draft round (vLLM)",
            "1 + accepted draft tokens per round with a draft.",
            (
                Query(
                    "1 + "
                    + _ratio(
                        _sum("tier", _rate("vllm:spec_decode_num_accepted_tokens_total", TIER)),
                        _sum("tier", _rate("vllm:spec_decode_num_drafts_total", TIER)),
                    ),
                    "{{tier}}",
                ),
            ),
        ),
        Panel(
            "Mean prompt and output lengths (vLLM)",
            "L_in and L_out per finished request, the cost model's length inputs.",
            (
                Query(
                    _ratio(
                        _sum("tier", _rate("vllm:prompt_tokens_total", TIER)),
                        _sum("tier", _rate("vllm:request_success_total", TIER)),
                    ),
                    "{{tier}} L_in",
                ),
                Query(
                    _ratio(
                        _sum("tier", _rate("vllm:generation_tokens_total", TIER)),
                        _sum("tier", _rate("vllm:request_success_total", TIER)),
                    ),
                    "{{tier}} L_out",
                ),
            ),
        ),
        Panel(
            "KV-cache usage (vLLM)",
            "Near 1 means the tier runs at its capacity knee.",
            (Query(f"max by (tier) (vllm:kv_cache_usage_perc{{{TIER}}})", "{{tier}} KV usage"),),
            unit="percentunit",
        ),
        Panel(
            "Preemptions (vLLM)",
            "Any preemption means the KV cache is full: the tier is past its capacity knee.",
            (
                Query(
                    _sum("tier", _rate("vllm:num_preemptions_total", TIER)),
                    "{{tier}} preemptions/s",
                ),
            ),
            unit="ops",
        ),
        Panel(
            "Engine scrapes by the gateway observer",
            "The observer's reads of each engine's /metrics by outcome. Anything but ok for long "
            "(failed, unparsable, no_model: no vLLM gauge for the tier's served model) leaves "
            "the regime without engine figures and the running flags unread.",
            (
                Query(
                    _sum("tier, outcome", _rate("tiergate_engine_scrapes_total", TIER)),
                    "{{tier}} {{outcome}}",
                ),
            ),
            unit="ops",
        ),
        Row("Recommended against running flags"),
        Panel(
            "Recommended and running flags",
            "Per tier and flag: the planner's recommendation, what the tier runs, and drift.",
            (
                Query(
                    f"max by (tier, flag) (tiergate_flag_recommended{{{TIER}}})",
                    "recommended",
                    table=True,
                ),
                Query(
                    f"max by (tier, flag) (tiergate_flag_running{{{TIER}}})", "running", table=True
                ),
                Query(f"max by (tier, flag) (tiergate_flag_drift{{{TIER}}})", "drift", table=True),
            ),
            kind="table",
        ),
        Panel(
            "Flags the engines report (vLLM cache_config_info)",
            "Prefix caching, block size and KV blocks as each engine started with them.",
            (
                Query(
                    "max by (tier, enable_prefix_caching, block_size, num_gpu_blocks, cache_dtype) "
                    f"(vllm:cache_config_info{{{TIER}}})",
                    table=True,
                ),
            ),
            kind="table",
        ),
        Panel(
            "Flag drift over time",
            "1 while a tier runs a flag other than the planner recommends.",
            (
                Query(
                    f"max by (tier, flag) (tiergate_flag_drift{{{TIER}}})",
                    "{{tier}} {{flag}}",
                ),
            ),
            min=0,
            max=1,
            mappings=(("0", "as recommended"), ("1", "drift")),
        ),
        Panel(
            "Expected cost per token: recommended against running",
            "The cost model's GPU-seconds per output token at both configurations; the gap "
            "is what a restart with the recommended flags would save.",
            (
                Query(
                    "max by (tier, config) "
                    f"(tiergate_planner_expected_cost_per_token_seconds{{{TIER}}})",
                    "{{tier}} {{config}}",
                ),
            ),
            unit="s",
        ),
    ),
)

BACKENDS: Final = Dashboard(
    uid="tiergate-backends",
    title="tiergate / Backends, circuits and rejections",
    description="Endpoint health and circuit state as the gateway sees them, upstream attempt "
    "outcomes, and requests refused at admission.",
    items=(
        Row("Endpoints"),
        Panel(
            "Endpoint health (gateway view)",
            "1: passes health checks. The minimum over gateway replicas.",
            (
                Query(
                    f"min by (tier, endpoint) (tiergate_backend_up{{{TIER}}})",
                    "{{tier}} {{endpoint}}",
                ),
            ),
            min=0,
            max=1,
            mappings=(("0", "down"), ("1", "up")),
        ),
        Panel(
            "Circuit state per endpoint",
            "0 closed, 1 half-open, 2 open (ejected). The maximum over gateway replicas.",
            (
                Query(
                    f"max by (tier, endpoint) (tiergate_circuit_state{{{TIER}}})",
                    "{{tier}} {{endpoint}}",
                ),
            ),
            min=0,
            max=2,
            mappings=(("0", "closed"), ("1", "half-open"), ("2", "open")),
        ),
        Panel(
            "Upstream attempts by outcome",
            "Every try against an endpoint: ok, connect_error, timeout, protocol_error, "
            "status_5xx, status_4xx, saturated, client_gone, too_large, deadline.",
            (
                Query(
                    _sum("tier, outcome", _rate("tiergate_upstream_attempts_total", TIER)),
                    "{{tier}} {{outcome}}",
                ),
            ),
            unit="reqps",
            stack=True,
        ),
        Panel(
            "Upstream failure ratio by tier",
            "Share of attempts that did not get an answer, leaving out those that say nothing "
            "of the tier: the client left first (client_gone), the answer was over the size "
            "limit (too_large), the request's total_s ran out (deadline).",
            (
                Query(
                    _ratio(
                        _sum(
                            "tier",
                            _rate(
                                "tiergate_upstream_attempts_total",
                                f'{TIER}, outcome!~"ok|{NO_VERDICT}"',
                            ),
                        ),
                        _sum(
                            "tier",
                            _rate(
                                "tiergate_upstream_attempts_total",
                                f'{TIER}, outcome!~"{NO_VERDICT}"',
                            ),
                        ),
                    ),
                    "{{tier}}",
                ),
            ),
            unit="percentunit",
            min=0,
        ),
        Row("Admission"),
        Panel(
            "Rejections by tenant and reason",
            "Refused before reaching a tier: rate_limit_exceeded, token_limit_exceeded, "
            "concurrency_limit_exceeded, tiers_saturated.",
            (
                Query(
                    _sum("tenant, reason", _rate("tiergate_rejections_total", TENANT)),
                    "{{tenant}} {{reason}}",
                ),
            ),
            unit="reqps",
            stack=True,
        ),
        Panel(
            "Gateway replicas by version",
            "Replicas exporting metrics, by version and router build (mypyc or python).",
            (
                Query(
                    "count by (version, router_build) (tiergate_build_info)",
                    "{{version}} {{router_build}}",
                ),
            ),
            kind="stat",
        ),
    ),
)

DASHBOARDS: Final = (TRAFFIC, SAVINGS, LATENCY, CALIBRATION, REGIME, BACKENDS)

__all__ = ["DASHBOARDS"]
